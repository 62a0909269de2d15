"""Typed reads: JSON values, string keys and header values, value schemas (DDL, JSON Schema,
inferred), malformed records per mode; in plain Python first, then through a real Spark."""

from __future__ import annotations

import json
import pickle
import random
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from analytics.decoder import ARROW_SCHEMA, SPARK_DDL
from analytics.schemas import (
    arrow_schema,
    check_json_type,
    from_json_schema,
    infer_value_type,
    load_value_schema,
    parse_ddl,
    parse_value_type,
)
from analytics.source import EventlogDataSource, EventlogReader, read_schema, row_format
from analytics.values import MalformedRecordError, RowFormat, decode_json, decode_utf8
from engine.records import encode_batch

T0 = 1_700_000_000_000
PER_PARTITION = 60


# ---------------------------------------------------------------------------------------------
# a snapshot of JSON records: topic `orders` (2 partitions, 3 segments each), topic `clicks`


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    doc: dict | None  # the JSON object the value holds; None: tombstone or malformed
    malformed: bool


@dataclass(frozen=True)
class TypedSnapshot:
    path: Path
    records: list[Rec]


def _order(p: int, i: int) -> Rec:
    doc = {
        "id": 1000 * p + i,
        "status": ["new", "paid", "shipped"][i % 3],
        "total": i if i % 4 == 0 else i * 1.25,  # integers and fractions: inferred as double
        "customer": {"name": f"c{i % 7}", "vip": i % 5 == 0},
        "items": [{"sku": f"s{j}", "qty": j + 1} for j in range(i % 3)],
        "placed": f"2024-01-{i % 28 + 1:02d}",
    }
    if i >= 40:  # a field the newer records have
        doc["coupon"] = f"C{i}"
    value = json.dumps(doc, indent=2 if i == 3 else None).encode()  # one pretty-printed value
    malformed = True
    if i % 13 == 7:
        value, doc, malformed = None, None, False  # tombstone
    elif i == 5:
        value = b'{"id": 5, "status": "new"'  # cut short
    elif i == 11:
        value = b"not json"
    elif i == 23:
        value = json.dumps({**doc, "id": "abc"}).encode()  # a string where a number belongs
    elif i == 31 and p == 1:
        value = b'\xff\xfe{"id": 1}'  # not UTF-8
    elif i == 47:
        value = b"[1, 2]"  # JSON, but not an object
    else:
        malformed = False
    if malformed:
        doc = None
    key = None if i == 19 else b"\xffbad" if i == 17 and p == 0 else f"order-{i % 15}".encode()
    headers = {0: (("source", b"web"),), 1: (("source", b"app"), ("trace", None))}.get(i % 4, ())
    if i == 29:
        headers = (("bin", b"\x80\x81"),)  # not UTF-8
    return Rec("orders", p, i, T0 + i * 1000, key, value, headers, doc, malformed)


def _click(i: int) -> Rec:
    value = json.dumps([i, i + 1] if i % 2 else []).encode()
    return Rec("clicks", 0, i, T0 + i, None, value, (), None, False)


def _write_partition(root: Path, topic: str, partition: int, records: list[Rec], per_segment: int) -> dict:
    directory = root / f"{topic}-{partition}"
    directory.mkdir(parents=True)
    segments = []
    for first in range(0, len(records), per_segment):
        chunk = records[first : first + per_segment]
        data = b"".join(
            bytes(encode_batch(chunk[b].offset, [(r.key, r.value, r.timestamp, list(r.headers)) for r in chunk[b : b + 5]]))
            for b in range(0, len(chunk), 5)
        )
        name = f"{chunk[0].offset:020d}.log"
        (directory / name).write_bytes(data)
        segments.append({"file": name, "base_offset": chunk[0].offset, "last_offset": chunk[-1].offset,
                         "size_bytes": len(data)})
    return {"partition": partition, "dir": directory.name, "log_start_offset": 0,
            "high_watermark": records[-1].offset + 1, "segments": segments}


def build_typed_snapshot(root: Path) -> TypedSnapshot:
    orders = [[_order(p, i) for i in range(PER_PARTITION)] for p in range(2)]
    clicks = [_click(i) for i in range(20)]
    manifest = {
        "format_version": 1, "snapshot_id": "typed", "created_ms": T0,
        "topics": [
            {"name": "orders", "internal": False, "cleanup_policy": "compact",
             "partitions": [_write_partition(root, "orders", p, orders[p], per_segment=20) for p in range(2)]},
            {"name": "clicks", "internal": False, "cleanup_policy": "delete",
             "partitions": [_write_partition(root, "clicks", 0, clicks, per_segment=20)]},
        ],
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    return TypedSnapshot(root, orders[0] + orders[1] + clicks)


@pytest.fixture(scope="module")
def typed(tmp_path_factory) -> TypedSnapshot:
    return build_typed_snapshot(tmp_path_factory.mktemp("typed"))


INFERRED = (
    "struct<coupon:string,customer:struct<name:string,vip:boolean>,id:bigint,"
    "items:array<struct<qty:bigint,sku:string>>,placed:string,status:string,total:double>"
)
USER_VALUE_DDL = ("id INT NOT NULL, status STRING COMMENT 'new, paid or shipped', total DOUBLE, placed DATE, "
                  "items ARRAY<STRUCT<sku: STRING, qty: INT>>")
ORDERS_JSON_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "status": {"enum": ["new", "paid", "shipped"]},
        "customer": {"$ref": "#/$defs/customer"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer"}}, "required": ["sku"]}},
        "placed": {"type": "string", "format": "date"},
        "coupon": {"type": ["string", "null"]},
    },
    "required": ["id", "status"],
    "$defs": {"customer": {"type": "object", "properties": {"name": {"type": "string"}, "vip": {"type": "boolean"}}}},
}


def project(value, data_type: DataType):
    """What a typed column holds for a JSON value under `data_type` (the model)."""
    if value is None:
        return None
    if isinstance(data_type, StructType):
        return {f.name: project(value.get(f.name), f.dataType) for f in data_type.fields}
    if isinstance(data_type, ArrayType):
        return [project(v, data_type.elementType) for v in value]
    if isinstance(data_type, DoubleType):
        return float(value)
    if isinstance(data_type, DateType):
        return date.fromisoformat(value)
    return value


def _text(raw: bytes | None) -> str | None:
    try:
        return None if raw is None else raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def expected_rows(records, value_type: DataType, *, strings: bool, headers: bool | None = None,
                  corrupt: bool = True, drop: bool = False):
    """(topic, partition, offset, key, value, headers[, corrupt]) the typed read returns; keys as
    text if `strings`, header values as text if `headers` (default: `strings`)."""
    headers_text = strings if headers is None else headers
    rows = []
    for r in records:
        key = _text(r.key) if strings else r.key
        texts = tuple((k, _text(v) if headers_text else v) for k, v in r.headers)
        bad_text = (r.key is not None and key is None) or any(
            v is not None and t is None for (_, v), (_, t) in zip(r.headers, texts))
        if drop and (r.malformed or bad_text):
            continue
        row = (r.topic, r.partition, r.offset, key, project(r.doc, value_type), texts)
        if corrupt:
            row += (r.value if r.malformed else None,)
        rows.append(row)
    return sorted(rows, key=lambda row: row[:3])


def rows_of_batches(batches, corrupt_column: str | None = "_corrupt_record"):
    rows = []
    for batch in batches:
        for d in batch.to_pylist():
            headers = tuple((h["key"], h["value"]) for h in d["headers"])
            row = (d["topic"], d["partition"], d["offset"], d["key"], d["value"], headers)
            if corrupt_column:
                row += (d[corrupt_column],)
            rows.append(row)
    return sorted(rows, key=lambda row: row[:3])


def read_direct(path: Path, schema=None, **options):
    """Plan with the data source as Spark would (schema() unless given), read every partition."""
    source = EventlogDataSource({"path": str(path), **options})
    if schema is None:
        schema = source.schema()
    reader = source.reader(parse_ddl(schema) if isinstance(schema, str) else schema)
    expected = to_arrow_schema(parse_ddl(schema) if isinstance(schema, str) else schema, timezone="UTC")
    batches = []
    for partition in reader.partitions():
        for batch in pickle.loads(pickle.dumps(reader)).read(pickle.loads(pickle.dumps(partition))):
            assert batch.schema.equals(expected)  # what Spark's worker checks
            assert batch.num_rows > 0
            batches.append(batch)
    return schema, batches


def orders_of(typed: TypedSnapshot):
    return [r for r in typed.records if r.topic == "orders"]


def compacted(records):
    latest = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.key is not None:
            latest[(r.partition, r.key)] = r
    return [r for r in latest.values() if r.value is not None]


# ---------------------------------------------------------------------------------------------
# DDL and JSON Schema


@pytest.mark.parametrize(
    ("ddl", "expected"),
    [
        ("int", IntegerType()),
        ("  BIGINT ", LongType()),
        ("decimal(12, 3)", DecimalType(12, 3)),
        ("dec", DecimalType(10, 0)),
        ("varchar(20)", StringType()),
        ("array<struct<sku: string, qty: int NOT NULL>>",
         ArrayType(StructType([StructField("sku", StringType()), StructField("qty", IntegerType(), False)]))),
        ("id INT, status STRING, total DOUBLE",
         StructType([StructField("id", IntegerType()), StructField("status", StringType()),
                     StructField("total", DoubleType())])),
        ("`odd name` timestamp, `a``b`: date", StructType([StructField("odd name", TimestampType()),
                                                        StructField("a`b", DateType())])),
        ("date date, timestamp timestamp", StructType([StructField("date", DateType()),
                                                       StructField("timestamp", TimestampType())])),
        ("struct<>", StructType([])),
    ],
)
def test_parse_ddl(ddl: str, expected: DataType) -> None:
    assert parse_ddl(ddl) == expected


def test_parse_ddl_comment_lands_in_metadata() -> None:
    field = parse_ddl("n INT NOT NULL COMMENT 'how many \\'n\\', \"m\"'").fields[0]
    assert (field.nullable, field.metadata["comment"]) == (False, "how many 'n', \"m\"")


@pytest.mark.parametrize("ddl", ["", "id", "id INT,", "array<int", "map<string>", "id blob", "decimal(40, 2)",
                                 "id INT NOT", "a INT b INT", "x interval"])
def test_parse_ddl_errors(ddl: str) -> None:
    with pytest.raises(ValueError, match="DDL|empty"):
        parse_value_type(ddl)


def test_load_value_schema_from_ddl_json_schema_and_files(tmp_path: Path) -> None:
    ddl = tmp_path / "orders.ddl"
    ddl.write_text("-- the orders topic\nid INT NOT NULL,\nstatus STRING\n")
    assert load_value_schema(ddl) == load_value_schema(str(ddl)) == StructType(
        [StructField("id", IntegerType(), False), StructField("status", StringType())])
    schema = tmp_path / "orders.json"
    schema.write_text(json.dumps(ORDERS_JSON_SCHEMA))
    loaded = load_value_schema(str(schema))
    assert loaded == load_value_schema(ORDERS_JSON_SCHEMA) == load_value_schema(json.dumps(ORDERS_JSON_SCHEMA))
    assert loaded.simpleString() == (
        "struct<id:bigint,status:string,customer:struct<name:string,vip:boolean>,"
        "items:array<struct<sku:string,qty:bigint>>,placed:date,coupon:string>"
    )
    nullable = {f.name: f.nullable for f in loaded.fields}
    assert nullable == {"id": False, "status": False, "customer": True, "items": True, "placed": True, "coupon": True}
    assert loaded["items"].dataType.elementType["sku"].nullable is False
    # required, but the type allows null: nullable
    assert from_json_schema({"properties": {"a": {"type": ["integer", "null"]}}, "required": ["a"]}) == StructType(
        [StructField("a", LongType(), True)])
    assert from_json_schema({"type": "object", "properties": {"at": {"type": "string", "format": "date-time"},
                                                              "n": {"type": "number"}}}) == StructType(
        [StructField("at", TimestampType()), StructField("n", DoubleType())])
    with pytest.raises(ValueError, match="record"):
        load_value_schema("array<int>")
    assert parse_value_type("array<int>") == ArrayType(IntegerType())


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"type": "object"}, "properties"),
        ({"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}, "union"),
        ({"type": "object", "properties": {"a": {"oneOf": []}}}, "oneOf"),
        ({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}, "local"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"$ref": "#/$defs/a"}}},
         "recursive"),
        ({"type": "object", "properties": {"a": {"type": "array"}}}, "items"),
        ({"type": "object", "properties": {"a": {}}}, "no type"),
        ({"type": "object", "properties": {"a": {"type": "null"}}}, "union|not supported"),
    ],
)
def test_json_schema_errors(document: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_value_schema(document)


def test_check_json_type_rejects_what_json_cannot_fill() -> None:
    for ddl in ("a map<string, int>", "a binary", "a struct<>", "a array<map<string,int>>"):
        with pytest.raises(ValueError, match="JSON|map|field"):
            check_json_type(parse_ddl(ddl))
    check_json_type(parse_ddl(USER_VALUE_DDL))


# ---------------------------------------------------------------------------------------------
# inference


def test_infer_value_type_widens_like_spark_and_takes_the_majority_kind() -> None:
    values = [b'{"a": 1, "b": [1, 2.5], "c": null, "d": {}, "e": {"x": 1}}', b'{"a": 2, "b": [], "e": {"y": "s"}}',
              b'{"a": "x"}', b"not json", b"null", None, b'{"f": 99999999999999999999}', b'{"g": [[1], []]}']
    assert infer_value_type(values).simpleString() == (
        "struct<a:bigint,b:array<double>,c:string,e:struct<x:bigint,y:string>,f:double,g:array<array<bigint>>>")
    assert infer_value_type([b'{"a": "x"}', b'{"a": 1}']).simpleString() == "struct<a:string>"  # a tie: string
    assert infer_value_type([b"[]"]) == ArrayType(StringType())
    assert infer_value_type([b"1", b"2.5"]) == DoubleType()
    assert infer_value_type([b"{}", b"null", b"nope"]) is None


def test_inference_samples_each_partitions_first_and_last_records(typed: TypedSnapshot) -> None:
    # 8 records per topic: per partition the first 2 values and the values of the last 2 records
    schema = read_schema({"path": str(typed.path), "topics": "orders", "value_format": "json",
                          "value_sample_records": "8"})
    assert schema["value"].dataType.simpleString() == INFERRED  # coupon only in the newest records
    head_only = read_schema({"path": str(typed.path), "topics": "orders", "value_format": "json",
                             "value_sample_records": "8", "endingoffsets": "30"})
    assert "coupon" not in head_only["value"].dataType.fieldNames()
    clicks = read_schema({"path": str(typed.path), "topics": "clicks", "value_format": "json"})
    assert clicks["value"].dataType == ArrayType(LongType())
    with pytest.raises(ValueError, match="no JSON value"):
        read_schema({"path": str(typed.path), "topics": "orders", "value_format": "json", "startingoffsets": "latest"})


# ---------------------------------------------------------------------------------------------
# decoding


def test_decode_json_structs_arrays_and_scalars() -> None:
    target = arrow_schema(StructType([StructField("v", parse_ddl(
        "id INT NOT NULL, at TIMESTAMP, on DATE, price DECIMAL(8, 2), tags ARRAY<STRING>, "
        "nested STRUCT<x: DOUBLE, ys: ARRAY<STRUCT<y: BOOLEAN>>>"))]))[0].type
    values = pa.array([
        b'{"id": 1, "at": "2024-01-02T03:04:05.5Z", "on": "2024-02-29", "price": 12.5, "tags": ["a", null],'
        b' "nested": {"x": 1, "ys": [{"y": true}, {}]}, "ignored": {"deep": [1, {"z": 2}]}}',
        None,  # a tombstone
        b"  null ",  # JSON null
        b'{"id": 2}',
        b'{"id": 3,\r\n "tags":\n["b"]}',  # line breaks between tokens
        b'{"tags": []}',  # id is NOT NULL
        b'{"id": 4, "on": "2024-02-30"}',
        b'{"id": 5, "price": 1.234}',
        b'{"id": 6}{"id": 7}',
        b'{"id": 8, "at": 1700000000}',
    ], pa.binary())
    array, bad, reasons = decode_json(values, target)
    assert array.type == target
    got = array.to_pylist()
    assert got[0]["at"].isoformat() == "2024-01-02T03:04:05.500000+00:00"
    assert (got[0]["on"], str(got[0]["price"]), got[0]["tags"]) == (date(2024, 2, 29), "12.50", ["a", None])
    assert got[0]["nested"] == {"x": 1.0, "ys": [{"y": True}, {"y": None}]}
    assert got[1:5] == [None, None, {"id": 2, "at": None, "on": None, "price": None, "tags": None, "nested": None},
                        {"id": 3, "at": None, "on": None, "price": None, "tags": ["b"], "nested": None}]
    assert bad.tolist() == [False] * 5 + [True] * 5 and got[5:] == [None] * 5
    assert "NOT NULL" in reasons[5] and "date" in reasons[6] and "scale" in reasons[7]
    assert "more than one" in reasons[8] or "Extra data" in reasons[8]
    assert set(reasons) == {5, 6, 7, 8, 9}


def test_decode_json_non_struct_values() -> None:
    values = pa.array([b"[1, 2]", b"[]", b"null", b"[1, \"x\"]", b'[1], "v": [2]', b"3"], pa.binary())
    array, bad, _ = decode_json(values, pa.list_(pa.field("element", pa.int64())))
    assert array.to_pylist() == [[1, 2], [], None, None, None, None]
    assert bad.tolist() == [False, False, False, True, True, True]
    array, bad, _ = decode_json(pa.array([b'"text"', b"1", b'"a", "v": "b"', b"true"], pa.binary()), pa.string())
    assert array.to_pylist() == ["text", None, None, None] and bad.tolist() == [False, True, True, True]
    array, bad, _ = decode_json(pa.array([b"1", b"300", b"1.5", b"true"], pa.binary()), pa.int8())
    assert array.to_pylist() == [1, None, None, None] and bad.tolist() == [False, True, True, True]


def test_decode_json_rows_fail_exactly_as_single_reads() -> None:
    """The bulk read, the Python pre-check and the bisection agree with reading each row alone
    with pyarrow (the ground truth): same rows fail, same values for the others."""
    from analytics.values import _Reader

    rng = random.Random(7)
    target = pa.struct([pa.field("a", pa.int32()), pa.field("b", pa.list_(pa.field("element", pa.struct(
        [pa.field("c", pa.string(), nullable=False)])))), pa.field("d", pa.float64())])
    pieces = ['{"a": 1}', '{"a": 2147483648}', '{"a": 1.0}', '{"b": [{"c": "x"}, {"c": null}]}', '{"b": [{}]}',
              '{"a": 1, "a": 2}', '{"d": NaN}', '{"d": 1e400}', '{"d": "1"}', '{"a": 1}} ', '{"a": [1]}',
              '{"b": [{"c": "x", "e": {"f": [1, "g"]}}]}', '{"a": tru}', '{"a": 3,}', '{"a":\n4}', "{}", '{"a": "\\u00e9"}']
    values = [rng.choice(pieces).encode() for _ in range(300)] + [b'{"a": 7}'] * 50
    rng.shuffle(values)
    array, bad, reasons = decode_json(pa.array(values, pa.binary()), target)
    reader = _Reader(target, wrapped=False)
    single = pa.array(values, pa.binary())
    for i in range(len(values)):
        alone = reader.read(single, np.array([i]))
        if isinstance(alone, str):
            assert bad[i] and array[i].as_py() is None, values[i]
        else:
            assert not bad[i] and repr(array[i].as_py()) == repr(alone[0].as_py()), values[i]  # NaN
    assert set(np.flatnonzero(bad).tolist()) == set(reasons)


@pytest.mark.parametrize(
    ("ddl", "json_value", "expected"),
    [
        ("boolean", b"true", True),
        ("tinyint", b"-128", -128),
        ("smallint", b"32767", 32767),
        ("int", b"-7", -7),
        ("bigint", b"9223372036854775807", 9223372036854775807),
        ("float", b"0.5", 0.5),
        ("double", b"1e300", 1e300),
        ("decimal(5, 2)", b'"123.45"', "123.45"),
        ("string", b'"\\u00e9t\\u00e9"', "\u00e9t\u00e9"),
        ("date", b'"2024-02-29"', date(2024, 2, 29)),
        ("timestamp", b'"2024-02-29T12:00:00+01:00"', "2024-02-29T11:00:00+00:00"),
        ("timestamp_ntz", b'"2024-02-29T12:00:00"', "2024-02-29T12:00:00"),
        ("array<array<int>>", b"[[1], [], null]", [[1], [], None]),
        ("struct<a: array<struct<b: date NOT NULL>>>", b'{"a": [{"b": "2024-01-01"}]}', {"a": [{"b": date(2024, 1, 1)}]}),
    ],
)
def test_every_supported_type_decodes_to_sparks_arrow_type(ddl: str, json_value: bytes, expected) -> None:
    data_type = parse_ddl(ddl)
    check_json_type(data_type)
    target = to_arrow_schema(StructType([StructField("value", data_type)]), timezone="UTC")[0].type
    array, bad, _ = decode_json(pa.array([json_value, None], pa.binary()), target)
    assert array.type == target and not bad.any()
    got = array[0].as_py()
    if isinstance(got, datetime | Decimal):
        got = got.isoformat() if isinstance(got, datetime) else str(got)
    assert got == expected and array[1].as_py() is None


def test_decode_utf8() -> None:
    strings, bad = decode_utf8(pa.array([b"k\xc3\xa9", None, b"\xff"], pa.binary()))
    assert strings.to_pylist() == ["k\u00e9", None, None] and bad.tolist() == [False, False, True]
    assert decode_utf8(pa.array([b"a"], pa.binary()))[1] is None


def test_modes_per_row() -> None:
    typed = StructType([*parse_ddl(SPARK_DDL.replace("key binary", "key string")).fields[:5],
                        StructField("value", parse_ddl("id INT")),
                        parse_ddl(SPARK_DDL)["headers"], StructField("bad", StringType())])
    sources = ("topic", "partition", "offset", "timestamp", "key", "value", "headers", "corrupt")
    raw = pa.RecordBatch.from_arrays([
        pa.array(["t"] * 4), pa.array([3] * 4, pa.int32()), pa.array([10, 11, 12, 13], pa.int64()),
        pa.array([0] * 4, pa.timestamp("us", tz="UTC")), pa.array([b"k", b"\xfe", b"k", None]),
        pa.array([b'{"id": 1}', b'{"id": 2}', b'{"id": "x\xff"}', b'{"id": 4}']),
        pa.array([[]] * 4, ARROW_SCHEMA.field("headers").type)], schema=ARROW_SCHEMA)
    schema = arrow_schema(typed)

    permissive = RowFormat(schema, sources, "json", "PERMISSIVE").convert(raw)
    assert permissive.schema.equals(schema)
    assert permissive.column("key").to_pylist() == ["k", None, "k", None]
    assert permissive.column("value").to_pylist() == [{"id": 1}, {"id": 2}, None, {"id": 4}]
    assert permissive.column("bad").to_pylist() == [None, None, '{"id": "x\ufffd"}', None]

    dropped = RowFormat(schema, sources, "json", "DROPMALFORMED").convert(raw)
    assert dropped.column("offset").to_pylist() == [10, 13]

    with pytest.raises(MalformedRecordError) as info:
        RowFormat(schema, sources, "json", "FAILFAST").convert(raw)
    error = pickle.loads(pickle.dumps(info.value))
    assert (error.topic, error.partition, error.offset, error.column) == ("t", 3, 11, "key")
    assert "t-3 offset 11: key: not valid UTF-8" in str(error)
    with pytest.raises(MalformedRecordError, match="offset 12: value: not valid UTF-8"):
        RowFormat(schema, sources, "json", "FAILFAST").convert(raw.slice(2))


# ---------------------------------------------------------------------------------------------
# schemas of a read


def test_read_schema_follows_the_options(typed: TypedSnapshot) -> None:
    path = str(typed.path)
    assert read_schema({"path": path}) == SPARK_DDL == EventlogDataSource({"path": path}).schema()
    assert read_schema({"path": path, "key_format": "string", "header_format": "string"}).simpleString() == (
        "struct<topic:string,partition:int,offset:bigint,timestamp:timestamp,key:string,value:binary,"
        "headers:array<struct<key:string,value:string>>>")
    typed_schema = read_schema({"path": path, "value_schema": "id INT", "mode": "dropMalformed"})
    assert typed_schema["value"].dataType.simpleString() == "struct<id:int>"
    assert typed_schema.fieldNames()[-1] == "headers"  # no corrupt column unless PERMISSIVE
    renamed = read_schema({"path": path, "value_format": "json", "value_schema": "id INT",
                           "columnnameofcorruptrecord": "raw"})
    assert renamed.fieldNames()[-1] == "raw"
    assert read_schema({"path": path, "value_format": "string"})["value"].dataType == StringType()


def test_schemas_supported_give_batches_spark_accepts(typed: TypedSnapshot) -> None:
    """Every batch equals Spark's to_arrow_schema of the read's schema (read_direct asserts it),
    for each kind of value and key column."""
    base = "topic string, partition int, offset long, timestamp timestamp, key {key}, value {value}, " \
           "headers array<struct<key: string, value: {header}>>{extra}"
    cases = [
        dict(key="string", value="struct<id: bigint, total: decimal(10, 2), placed: date, customer: "
             "struct<vip: boolean>, items: array<struct<qty: smallint, sku: string>>>", header="string", extra=""),
        dict(key="binary", value="struct<id: int, status: string, placed: timestamp, total: float>",
             header="binary", extra=", _corrupt_record string"),
        dict(key="binary", value="string", header="binary", extra=""),  # raw text (value_format string)
        dict(key="binary", value="binary", header="string", extra=""),
    ]
    for case in cases:
        ddl = base.format(**case)
        schema, batches = read_direct(typed.path, ddl, topics="orders")
        assert sum(b.num_rows for b in batches) == len(orders_of(typed))
        fmt = row_format({"path": str(typed.path)}, parse_ddl(ddl))
        assert fmt is None or fmt.schema.equals(to_arrow_schema(parse_ddl(ddl), timezone="UTC"))
    # the plain schema needs no conversion
    assert row_format({}, SPARK_DDL) is None


@pytest.mark.parametrize(
    ("options", "schema", "message"),
    [
        ({}, "offset bigint", "schema is fixed"),
        ({}, SPARK_DDL + ", extra int", "schema is fixed"),
        ({}, SPARK_DDL.replace("key binary", "key int"), "schema is fixed"),
        ({}, SPARK_DDL.replace("key binary", "key binary NOT NULL"), "schema is fixed"),
        ({}, SPARK_DDL.replace("partition int", "partition bigint"), "schema is fixed"),
        ({}, SPARK_DDL.replace("value: binary>", "value: int>"), "schema is fixed"),
        ({}, SPARK_DDL.replace("value binary", "value map<string, int>"), "map"),
        ({"value_format": "binary"}, SPARK_DDL.replace("value binary", "value struct<a: int>"), "cannot fill"),
        ({"value_format": "json"}, SPARK_DDL, "cannot fill"),
        ({"key_format": "binary"}, SPARK_DDL.replace("key binary", "key string"), "disagree"),
        ({"value_schema": "a INT"}, SPARK_DDL.replace("value binary", "value struct<a: bigint>"), "disagree"),
        ({"mode": "lenient", "key_format": "string"}, None, "mode must be"),
        ({"value_format": "json", "columnNameOfCorruptRecord": "Value"}, None, "names a column"),
        ({"value_format": "avro"}, None, "value_format must be"),
        ({"value_format": "string", "value_schema": "a INT"}, None, "needs value_format json"),
        ({"value_sample_records": "0"}, None, "positive"),
    ],
)
def test_bad_schemas_and_options_are_clear_errors(typed: TypedSnapshot, options, schema, message) -> None:
    with pytest.raises(ValueError, match=message):
        EventlogReader({"path": str(typed.path), **options}, None if schema is None else parse_ddl(schema))


# ---------------------------------------------------------------------------------------------
# typed reads in plain Python


def test_typed_read_matches_the_model(typed: TypedSnapshot) -> None:
    options = dict(topics="orders", value_format="json", key_format="string", header_format="string")
    schema, batches = read_direct(typed.path, **options)
    assert schema["value"].dataType.simpleString() == INFERRED
    value_type = parse_ddl(INFERRED)
    assert rows_of_batches(batches) == expected_rows(orders_of(typed), value_type, strings=True)
    # offsets and timestamps bound what is typed, as they bound the plain read
    bounded = dict(options, startingOffsets='{"orders": {"0": 10}}', endingOffsets="50",
                   startingTimestamp=str(T0 + 12_000))
    _, batches = read_direct(typed.path, schema, **bounded)
    model = [r for r in orders_of(typed) if (r.partition == 1 or r.offset >= 10) and r.offset < 50
             and r.timestamp >= T0 + 12_000]
    assert rows_of_batches(batches) == expected_rows(model, value_type, strings=True)


def test_compacted_typed_read_matches_the_model(typed: TypedSnapshot, tmp_path: Path) -> None:
    schema_file = tmp_path / "orders.schema.json"
    schema_file.write_text(json.dumps(ORDERS_JSON_SCHEMA))
    schema, batches = read_direct(typed.path, topics="orders", compacted="true", value_schema=str(schema_file),
                                  key_format="string", mode="DROPMALFORMED")
    value_type = load_value_schema(ORDERS_JSON_SCHEMA)
    assert schema["value"].dataType == value_type
    model = compacted(orders_of(typed))
    assert any(r.malformed for r in model)  # a latest value that is malformed is dropped, not replaced
    expected = expected_rows(model, value_type, strings=True, headers=False, corrupt=False, drop=True)
    assert rows_of_batches(batches, corrupt_column=None) == expected


# ---------------------------------------------------------------------------------------------
# Spark (one session for the run; each query costs ~2 s)


def spark_rows(df, corrupt: bool = True):
    rows = []
    for r in df.collect():
        d = r.asDict(recursive=True)
        headers = tuple((h["key"], bytes(h["value"]) if isinstance(h["value"], bytearray) else h["value"])
                        for h in d["headers"])
        key = bytes(d["key"]) if isinstance(d["key"], bytearray) else d["key"]
        row = (d["topic"], d["partition"], d["offset"], key, d["value"], headers)
        if corrupt:
            row += (None if d["_corrupt_record"] is None else bytes(d["_corrupt_record"]),)
        rows.append(row)
    return sorted(rows, key=lambda row: row[:3])


@pytest.mark.spark
@pytest.mark.slow
def test_spark_inferred_typed_read(spark, typed: TypedSnapshot) -> None:
    df = (spark.read.format("eventlog").option("topics", "orders").option("value_format", "json")
          .option("key_format", "string").option("header_format", "string").load(str(typed.path)))
    assert df.schema["value"].dataType.simpleString() == INFERRED
    assert df.schema.simpleString().startswith("struct<topic:string,partition:int,offset:bigint,"
                                               "timestamp:timestamp,key:string,value:struct<")
    expected = expected_rows(orders_of(typed), parse_ddl(INFERRED), strings=True)
    assert spark_rows(df) == expected
    assert any(row[4] is None and row[6] is not None for row in expected)  # malformed: null + raw bytes
    assert any(row[4] is None and row[6] is None for row in expected)  # tombstones stay null


@pytest.mark.spark
@pytest.mark.slow
def test_spark_user_schema_ddl_option_and_modes(spark, typed: TypedSnapshot) -> None:
    from pyspark.sql import functions as F

    user = SPARK_DDL.replace("key binary", "key string").replace("value binary", f"value struct<{USER_VALUE_DDL}>") \
        .replace("value: binary>", "value: string>")
    df = (spark.read.format("eventlog").schema(user).option("topics", "orders").option("value_format", "json")
          .option("mode", "DROPMALFORMED").load(str(typed.path)))
    value_type = parse_ddl(USER_VALUE_DDL)
    expected = expected_rows(orders_of(typed), value_type, strings=True, corrupt=False, drop=True)
    assert spark_rows(df, corrupt=False) == expected
    assert isinstance(expected[1][4]["placed"], date)

    # the value's DDL as an option; FAILFAST stops at the first malformed record
    def failfast(ending: int):
        return (spark.read.format("eventlog").option("topics", "orders").option("value_schema", USER_VALUE_DDL)
                .option("mode", "FAILFAST").option("endingOffsets", str(ending)).load(str(typed.path)))

    clean = failfast(5)
    assert clean.schema["value"].dataType == value_type
    assert clean.select(F.sum("value.id")).first()[0] == sum(
        r.doc["id"] for r in orders_of(typed) if r.offset < 5 and r.doc)
    with pytest.raises(Exception, match=r"orders-\d offset 5: value: not valid JSON"):
        failfast(8).collect()


@pytest.mark.spark
@pytest.mark.slow
def test_spark_compacted_typed_read(spark, typed: TypedSnapshot, tmp_path: Path) -> None:
    schema_file = tmp_path / "orders.schema.json"
    schema_file.write_text(json.dumps(ORDERS_JSON_SCHEMA))
    df = (spark.read.format("eventlog").option("topics", "orders").option("compacted", "true")
          .option("value_schema", str(schema_file)).option("key_format", "string").load(str(typed.path)))
    value_type = load_value_schema(ORDERS_JSON_SCHEMA)
    expected = expected_rows(compacted(orders_of(typed)), value_type, strings=True, headers=False)
    assert spark_rows(df) == expected


@pytest.mark.spark
def test_ddl_parser_agrees_with_spark(spark) -> None:
    for ddl in [SPARK_DDL, USER_VALUE_DDL, INFERRED, "array<struct<sku: string, qty: int NOT NULL>>",
                "`odd name` timestamp, `a``b`: date COMMENT 'c', d decimal(12,3), e dec, f tinyint, g short",
                "a timestamp_ntz, b timestamp_ltz, c map<string, array<bigint>>, d binary, e real, f integer"]:
        assert parse_ddl(ddl) == DataType.fromDDL(ddl), ddl
