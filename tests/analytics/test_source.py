"""The eventlog data source: planning and reading in plain Python, then through a real Spark."""

from __future__ import annotations

import json
import pickle
import shutil
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

pytest.importorskip("pyspark")

from analytics.decoder import ARROW_SCHEMA, SPARK_DDL
from analytics.source import (
    CompactedPartition,
    EventlogDataSource,
    EventlogReader,
    SegmentPartition,
    latest_per_key,
    plan_partitions,
)

from .conftest import T0, Row, Snapshot


def order(rows) -> list[Row]:
    return sorted(rows, key=lambda r: (r.topic, r.partition, r.offset))


def read_direct(snapshot: Snapshot, **options) -> list[Row]:
    """What the reader returns, without Spark: plan, pickle each partition, read it."""
    reader = EventlogReader({"path": str(snapshot.path), **options})
    rows = []
    for partition in reader.partitions():
        partition = pickle.loads(pickle.dumps(partition))
        for batch in reader.read(partition):
            assert batch.schema.equals(ARROW_SCHEMA)
            d = batch.to_pydict()
            ts = batch.column("timestamp").cast("int64").to_pylist()
            for i in range(batch.num_rows):
                rows.append(Row(d["topic"][i], d["partition"][i], d["offset"][i], ts[i] // 1000, d["key"][i],
                                d["value"][i], tuple((h["key"], h["value"]) for h in d["headers"][i])))
    return rows


def compacted_model(rows) -> list[Row]:
    latest = {}
    for r in order(rows):
        if r.key is not None:
            latest[(r.topic, r.partition, r.key)] = r
    return order(r for r in latest.values() if r.value is not None)


def filtered_model(snapshot: Snapshot) -> list[Row]:
    """The model of FILTERED_OPTIONS."""
    return order(
        r for r in snapshot.rows
        if r.topic == "orders"
        and ((r.partition == 0 and r.offset >= 40) or (r.partition == 1 and r.offset >= 0))
        and r.offset < 200 and T0 + 3_000 <= r.timestamp < T0 + 30_000
    )


FILTERED_OPTIONS = {
    "topics": "orders",
    "startingOffsets": json.dumps({"orders": {"0": 40, "1": -2}}),
    "endingOffsets": "200",
    "startingTimestamp": str(T0 + 3_000),
    "endingTimestamp": str(T0 + 30_000),
}


# ---------------------------------------------------------------------------------------------
# plain Python: planning and reading as the Spark workers do


def test_snapshot_fixture_covers_the_cases(snapshot: Snapshot) -> None:
    orders = next(t for t in snapshot.manifest["topics"] if t["name"] == "orders")
    assert all(len(p["segments"]) >= 2 for p in orders["partitions"])
    assert any(r.key is None for r in snapshot.rows) and any(r.value is None for r in snapshot.rows)
    assert any(r.headers for r in snapshot.rows)
    assert min(r.offset for r in snapshot.rows if r.topic == "orders" and r.partition == 0) == 7


def test_full_read_matches_the_model(snapshot: Snapshot) -> None:
    assert order(read_direct(snapshot)) == order(snapshot.rows)


def test_one_partition_per_segment_and_picklable(snapshot: Snapshot) -> None:
    reader = EventlogDataSource({"path": str(snapshot.path)}).reader(None)
    parts = reader.partitions()
    expected = sum(len(p["segments"]) for t in snapshot.manifest["topics"] if not t["internal"] for p in t["partitions"])
    assert len(parts) == expected
    assert all(isinstance(p, SegmentPartition) for p in parts)
    assert pickle.loads(pickle.dumps(parts[0])) == parts[0]
    assert len(pickle.dumps(parts[0])) < 400


def test_segments_outside_the_offsets_are_not_planned(snapshot: Snapshot) -> None:
    reader = EventlogReader({"path": str(snapshot.path), "topics": "orders", "startingOffsets": "150"})
    parts = reader.partitions()
    assert parts and all(p.start_offset == 150 for p in parts)
    all_parts = EventlogReader({"path": str(snapshot.path), "topics": "orders"}).partitions()
    assert len(parts) < len(all_parts)


def test_options_filter_like_the_model(snapshot: Snapshot) -> None:
    assert order(read_direct(snapshot, **FILTERED_OPTIONS)) == filtered_model(snapshot)
    # case-insensitive option names, latest/earliest words, an internal topic when named
    got = read_direct(snapshot, TOPICS="__metadata , events", STARTINGOFFSETS="earliest", endingoffsets="latest")
    assert order(got) == order(snapshot.internal_rows + [r for r in snapshot.rows if r.topic == "events"])
    assert read_direct(snapshot, startingOffsets="latest") == []


def test_compacted_view_matches_the_model(snapshot: Snapshot) -> None:
    reader = EventlogReader({"path": str(snapshot.path), "compacted": "TRUE"})
    assert all(isinstance(p, CompactedPartition) for p in reader.partitions())
    expected = compacted_model(snapshot.rows)
    assert any(r.topic == "orders" for r in expected)
    assert order(read_direct(snapshot, compacted="true")) == expected
    bounded = read_direct(snapshot, compacted="true", endingOffsets="100")
    assert order(bounded) == compacted_model(r for r in snapshot.rows if r.offset < 100)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": "nope"}, "not in the snapshot"),
        ({"startingOffsets": "{not json"}, "must be earliest, latest"),
        ({"startingOffsets": '{"orders": {"9": 1}}'}, "orders-9"),
        ({"endingOffsets": "-3"}, "not an offset"),
        ({"compacted": "yes"}, "true or false"),
        ({"startingTimestamp": "yesterday"}, "milliseconds"),
    ],
)
def test_bad_options_are_clear_errors(snapshot: Snapshot, options, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EventlogReader({"path": str(snapshot.path), **options})


def test_manifest_version_and_schema_are_checked(snapshot: Snapshot, tmp_path: Path) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    with pytest.raises(ValueError, match="schema is fixed"):
        EventlogReader({"path": str(snapshot.path)}, StructType([StructField("offset", LongType())]))
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 2, "topics": []}))
    with pytest.raises(ValueError, match="format_version"):
        EventlogReader({"path": str(tmp_path)})
    assert EventlogDataSource.name() == "eventlog"
    assert EventlogDataSource({}).schema() == SPARK_DDL


@pytest.mark.parametrize("where", [
    {"dir": "../../etc"}, {"file": "../../../outside.log"}, {"object": "/etc/passwd"},
    {"object": "../../../../elsewhere/segments/x.log"}, {"object": "s3://other-bucket/segments/x.log"},
])
def test_a_manifest_names_no_file_outside_the_snapshot(snapshot: Snapshot, tmp_path: Path, where: dict) -> None:
    """A manifest from a shared bucket is data: it may not send the reader to any other file
    (a local path, another bucket), only to its snapshot's files or its upload root's objects."""
    copy = tmp_path / "snap"
    shutil.copytree(snapshot.path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    partition = manifest["topics"][0]["partitions"][0]
    if "dir" in where:
        partition["dir"] = where["dir"]
    else:
        partition["segments"][0].update(where)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="outside the snapshot"):
        plan_partitions(str(copy), {})


# ---------------------------------------------------------------------------------------------
# Spark (one session for the run; each query costs ~2 s)


def spark_rows(df) -> list[Row]:
    out = []
    for r in df.selectExpr("topic", "partition", "offset", "unix_millis(timestamp) AS ms", "key", "value", "headers").collect():
        headers = tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"])
        out.append(Row(r["topic"], r["partition"], r["offset"], r["ms"], None if r["key"] is None else bytes(r["key"]),
                       None if r["value"] is None else bytes(r["value"]), headers))
    return out


@pytest.mark.spark
@pytest.mark.slow
def test_spark_reads_the_snapshot(spark, snapshot: Snapshot) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    df = spark.read.format("eventlog").load(str(snapshot.path))
    assert to_arrow_schema(df.schema, timezone="UTC").equals(ARROW_SCHEMA)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema] == [
        ("topic", "string"), ("partition", "int"), ("offset", "bigint"), ("timestamp", "timestamp"),
        ("key", "binary"), ("value", "binary"), ("headers", "array<struct<key:string,value:binary>>"),
    ]
    expected = order(snapshot.rows)
    # every column of every row, and instants independent of the session time zone
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        rows = df.withColumn("local", F.date_format("timestamp", "yyyy-MM-dd HH:mm:ss.SSS"))
        got = rows.select("local", "offset", "topic", "partition").collect()
        assert order(spark_rows(df)) == expected
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    by_key = {(r.topic, r.partition, r.offset): r.timestamp for r in expected}
    for r in got:
        ms = by_key[(r["topic"], r["partition"], r["offset"])]
        local = datetime.fromtimestamp(ms / 1000, UTC).astimezone(ZoneInfo("America/New_York"))
        assert r["local"] == local.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"
    # a full aggregation
    agg = df.agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("bytes")).first()
    assert agg["n"] == len(expected)
    assert agg["bytes"] == sum(len(r.value) for r in expected if r.value is not None)


@pytest.mark.spark
@pytest.mark.slow
def test_spark_options_and_compacted_view(spark, snapshot: Snapshot) -> None:
    reader = spark.read.format("eventlog")
    for name, value in FILTERED_OPTIONS.items():
        reader = reader.option(name, value)
    assert order(spark_rows(reader.load(str(snapshot.path)))) == filtered_model(snapshot)

    expected = compacted_model(snapshot.rows)
    compacted = spark.read.format("eventlog").option("compacted", "true").load(str(snapshot.path))
    assert order(spark_rows(compacted)) == expected
    everything = spark.read.format("eventlog").load(str(snapshot.path))
    assert order(spark_rows(latest_per_key(everything))) == expected


@pytest.mark.spark
@pytest.mark.slow
def test_spark_fails_clearly_on_a_corrupt_segment(spark, snapshot: Snapshot, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(snapshot.path, broken)
    segment = broken / "events-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    data[200] ^= 0xFF
    segment.write_bytes(bytes(data))
    df = spark.read.format("eventlog").option("topics", "events").load(str(broken))
    with pytest.raises(Exception, match="corrupt or torn segment"):
        df.count()
