"""The `eventlog` PySpark data source: batch reads of a snapshot directory.

    analytics.register(spark)            # spark.dataSource.register(EventlogDataSource)
    df = spark.read.format("eventlog").option("topics", "orders").load("/snapshots/2026-11-23")

Schema: `SPARK_DDL` (topic, partition, offset, timestamp, key, value, headers); `read()` yields
Arrow record batches from analytics.decoder, whose schema is exactly what Spark expects.

A snapshot is `<path>/manifest.json` plus `<path>/<partition dir>/<segment file>`:

    {"format_version": 1, "snapshot_id": ..., "created_ms": ...,
     "topics": [{"name": "orders", "internal": false, "cleanup_policy": "compact", ...,
       "partitions": [{"partition": 0, "dir": "orders-0", "log_start_offset": 0,
                       "high_watermark": 1234,
         "segments": [{"file": "00000000000000000000.log", "base_offset": 0,
                       "last_offset": 999, "size_bytes": 123456, ...}]}]}]}

The path is a local directory or a URI of any pyarrow filesystem (`s3://bucket/prefix/
snapshots/<id>`, s3a:// alike, hdfs://; storage.py: credentials and endpoint). A segment with
an `object` field (a snapshot uploaded by `eventlog snapshot --to`, analytics/upload.py) is read
from that path, relative to the snapshot directory, instead of `<dir>/<file>`. Executors open
the files themselves: the input partitions carry locations (strings), not filesystems.

Each segment is read up to its `size_bytes` only; a torn or corrupt batch inside that size fails
the query with SnapshotCorruptError (never wrong rows). Rows below a partition's
log_start_offset or at/above its high_watermark are never returned.

Options (names case-insensitive, values strings):

* `topics`: comma-separated names; default every topic whose `internal` is false. Naming a
  topic the snapshot lacks is an error.
* `startingOffsets` (inclusive, default "earliest") / `endingOffsets` (exclusive, default
  "latest"): "earliest", "latest", one number for every partition, or JSON as in Spark's Kafka
  source, `{"orders": {"0": 23, "1": -2}}`, where -2 = earliest (log_start_offset) and -1 =
  latest (high_watermark); partitions the JSON leaves out get the default. Offsets are clamped
  to [log_start_offset, high_watermark).
* `startingTimestamp` (inclusive) / `endingTimestamp` (exclusive), ms since the epoch: a filter
  on each record's timestamp. (Spark's Kafka source instead turns startingTimestamp into a
  starting offset per partition; in a snapshot an exact filter is cheaper and clearer.)
* `compacted` = "true": the table a consumer of a compacted topic converges to: the latest
  record per (topic, partition, key) among the selected records (offset and time bounds apply
  first); a key whose latest record is a tombstone (null value) is absent, and records with a
  null key are dropped, as Kafka's log cleaner drops them and Kafka Streams' KTable ignores
  them. (eventlog's own compactor keeps keyless records written before a topic became compact.)

Typed columns (values.py decodes, schemas.py makes the types; docs/ANALYTICS.md, Typed values):

* `key_format` / `header_format` = "string": keys / header values as STRING (default
  "binary"). Bytes that are not UTF-8 are a malformed record (see `mode`); in PERMISSIVE mode
  that key or header value is null.
* `value_format` = "binary" (default), "string" (UTF-8 text) or "json": a typed value column
  whose type comes from, first to last: the user's `.schema(...)`; option `value_schema` (a
  Spark DDL string such as "id INT, status STRING", or a JSON Schema as text or the path of a
  JSON Schema or DDL file: schemas.load_value_schema); else inference from a sample of the
  read's values (`value_sample_records`, default 1000 per topic, spread over its partitions,
  half from each partition's first selected records and half from its last; widening rules in
  schemas.py). `value_schema` alone implies "json". A tombstone stays a null value.
* `mode` (typed reads only; Spark's JSON reader's modes): PERMISSIVE (default) gives a null
  value and the raw value bytes in the corrupt-record column (`columnNameOfCorruptRecord`,
  default "_corrupt_record", binary, added after `headers` for JSON values); DROPMALFORMED
  drops the record; FAILFAST fails the query with MalformedRecordError (topic, partition,
  offset, reason). What counts as malformed: values.py. A `mode` of auto, live or snapshots is
  readStream's old name for its option `input` (stream.py) and never a typing mode
  (typing_options drops it).

The stream (stream.py) types its rows with these same functions: row_format checks its schema,
typed_batches converts its micro-batches. Inference differs, and schema() cannot tell a stream
from a batch read: (1) with option schemaInference true (readStream's; batch reads refuse it),
or for a path that is not a snapshot (a directory of snapshots, a live data dir: only a stream
reads those), it calls stream.infer_stream_value_type, which refuses unless schemaInference is
true; (2) for a snapshot directory otherwise it infers as for a batch read and notes on the
instance that it did: Spark pickles the instance after schema() and calls streamReader on that
copy, which then refuses the inferred schema.

A user schema (`.schema(...)`) must hold the seven columns of SPARK_DDL, by name in any order
(no partial schemas: Spark gets every column of every row; give `value_schema` to type only
the value), with SPARK_DDL's types except: key STRING, header values STRING, value STRING or
any type JSON can fill (structs, arrays, numbers, strings, booleans, decimals, dates,
timestamps; not maps or binary), nested NOT NULL fields (a record lacking one is malformed),
and optionally the corrupt-record column (BINARY or STRING). A typed value column implies
value_format "json" (a STRING value column: "string" unless value_format says "json"). The
options, if given too, must agree with it. Typing is applied to what the offset and time bounds
select, and with `compacted` to the surviving records only (the first pass reads keys only).

Partitions. One InputPartition per segment file (a `SegmentPartition`: path, size, bounds),
skipping segments outside the offset range. With `compacted`, one `CompactedPartition` per
topic partition instead: latest-per-key needs every segment of a partition, and doing it in the
task avoids a shuffle. The task makes two passes over its segments: (1) keys and offsets only
(no values, no headers), reduced after each segment with a pyarrow hash group-by to one row per
key (max of offset * 2 + tombstone bit, so one aggregate tells the latest offset and whether
it is a tombstone); memory is the distinct keys of the partition, as in Kafka's cleaner
offset map, never the values; (2) the segments holding a surviving offset are decoded again
and their rows filtered to the survivors with a sorted-array lookup. `latest_per_key(df)` does
the same in the DataFrame layer (a Window over (topic, partition, key)) for any DataFrame of
this schema, at the cost of a shuffle.

Filter pushdown is not implemented: overriding pushFilters breaks reads while
spark.sql.python.filterPushdown.enabled is false (its default).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from . import storage
from .decoder import ARROW_SCHEMA, SPARK_DDL, decode_segment, decode_segment_keys
from .values import MODES, PERMISSIVE, RowFormat

__all__ = [
    "CORRUPT_COLUMN",
    "STREAM_INPUTS",
    "CompactedPartition",
    "EventlogDataSource",
    "EventlogReader",
    "SegmentPartition",
    "infer_sampled",
    "latest_per_key",
    "plan_partitions",
    "read_schema",
    "row_format",
    "typed_batches",
    "typing_options",
]

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
EARLIEST = -2
LATEST = -1
CORRUPT_COLUMN = "_corrupt_record"
DEFAULT_SAMPLE_RECORDS = 1000
STREAM_INPUTS = ("auto", "live", "snapshots")  # readStream's option `input`, once named `mode`


@dataclass(frozen=True)
class SegmentPartition(InputPartition):
    """One segment file, read up to size_bytes; rows in [start_offset, end_offset) and
    [start_ts, end_ts) (None = unbounded)."""

    path: str
    topic: str
    partition: int
    size_bytes: int
    start_offset: int
    end_offset: int
    start_ts: int | None = None
    end_ts: int | None = None


@dataclass(frozen=True)
class CompactedPartition(InputPartition):
    """Every selected segment of one topic partition: (path, size_bytes, base_offset, last_offset)."""

    topic: str
    partition: int
    segments: tuple[tuple[str, int, int, int | None], ...]
    start_offset: int
    end_offset: int
    start_ts: int | None = None
    end_ts: int | None = None


class EventlogDataSource(DataSource):
    """spark.read.format("eventlog").load(snapshot_path); options in the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "eventlog"

    def schema(self):
        """The schema when the user gave none (Spark calls it for spark.read and readStream
        alike): read_schema of the options; records whether it inferred the value type."""
        self.inferred = False
        return read_schema(typing_options(_lower(self.options)), infer=self._infer)

    def _infer(self, options: dict[str, str], records: int):
        path = options.get("path")
        if not path:
            raise ValueError("eventlog: give a path: spark.read.format('eventlog').load(path)")
        self.inferred = True
        stream = str(options.get("schemainference", "")).strip().lower() == "true"  # a stream's option
        if not stream and storage.exists(storage.join(storage.normalize(path), MANIFEST)):
            return _infer_value_type(options, records)  # a snapshot: a batch read, or a stream over it
        from .stream import infer_stream_value_type  # else only a stream reads this

        return infer_stream_value_type(options, records)

    def reader(self, schema) -> EventlogReader:
        return EventlogReader(dict(self.options), schema)

    def streamReader(self, schema):
        """spark.readStream.format("eventlog").load(path): analytics/stream.py. `schema` is the
        user's, or schema()'s from this same instance (then `inferred` says how it was made)."""
        from .stream import EventlogStreamReader

        return EventlogStreamReader(dict(self.options), schema, inferred=getattr(self, "inferred", False))


class EventlogReader(DataSourceReader):
    """Plans at construction (on the driver, so bad options fail early); the plan is not
    pickled with the reader (it would travel with every task)."""

    def __init__(self, options: dict[str, str], schema=None) -> None:
        options = _lower(options)
        path = options.get("path")
        if not path:
            raise ValueError("eventlog: give the snapshot directory: spark.read.format('eventlog').load(path)")
        if str(options.get("schemainference", "false")).strip().lower() != "false":
            raise ValueError("eventlog: option schemaInference is for readStream only (a batch read infers the "
                             "value type whenever it has none)")
        self._format = row_format(options, schema)  # None: the decoder's batches as they are
        self._partitions = plan_partitions(path, options)

    def partitions(self) -> list[InputPartition]:
        return list(self._partitions)

    def __getstate__(self) -> dict:
        # Spark pickles the reader into every task; each task gets its partition separately.
        state = dict(self.__dict__)
        state["_partitions"] = []
        return state

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return typed_batches(_read_raw(partition), self._format)


def typed_batches(batches: Iterator[pa.RecordBatch], fmt: RowFormat | None) -> Iterator[pa.RecordBatch]:
    """Decoder batches (ARROW_SCHEMA) in a read's schema: each converted by `fmt` (row_format;
    None: they already are it), batches left empty (DROPMALFORMED) not yielded. The batch
    reader and the stream's micro-batches both read through it."""
    if fmt is None:
        yield from batches
        return
    for batch in batches:
        typed = fmt.convert(batch)
        if typed is not None and typed.num_rows:
            yield typed


def _read_raw(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Decoder batches (ARROW_SCHEMA) of one input partition."""
    if isinstance(partition, SegmentPartition):
        yield from decode_segment(
            partition.path, partition.size_bytes, topic=partition.topic, partition=partition.partition,
            start_offset=partition.start_offset, end_offset=partition.end_offset,
            start_ts=partition.start_ts, end_ts=partition.end_ts,
        )
    elif isinstance(partition, CompactedPartition):
        yield from _read_compacted(partition)
    # anything else: Spark's stand-in InputPartition(None) when there is nothing to read


def _lower(options) -> dict[str, str]:
    return {str(k).lower(): v for k, v in dict(options).items()}


# ---------------------------------------------------------------------------------------------
# planning (pure Python; the reader runs it on the driver)


def plan_partitions(snapshot_path: str, options: dict[str, str]) -> list[InputPartition]:
    """The input partitions of one read. `options` keys must be lower case."""
    snapshot_path = storage.normalize(snapshot_path)
    manifest = read_manifest(snapshot_path)
    topics = {t["name"]: t for t in manifest.get("topics", [])}
    wanted = options.get("topics")
    if wanted is not None and wanted.strip():
        names = [n.strip() for n in wanted.split(",") if n.strip()]
        missing = [n for n in names if n not in topics]
        if missing:
            raise ValueError(
                f"eventlog: topics not in the snapshot: {', '.join(missing)} (it has {', '.join(sorted(topics))})"
            )
    else:
        names = sorted(n for n, t in topics.items() if not t.get("internal", False))
    partitions_of = {n: {int(p["partition"]): p for p in topics[n].get("partitions", [])} for n in names}
    starting = _parse_offsets(options.get("startingoffsets"), "startingOffsets", EARLIEST, partitions_of)
    ending = _parse_offsets(options.get("endingoffsets"), "endingOffsets", LATEST, partitions_of)
    start_ts = _parse_ms(options.get("startingtimestamp"), "startingTimestamp")
    end_ts = _parse_ms(options.get("endingtimestamp"), "endingTimestamp")
    compacted = _parse_bool(options.get("compacted", "false"), "compacted")

    out: list[InputPartition] = []
    for name in names:
        for number, part in sorted(partitions_of[name].items()):
            log_start = int(part["log_start_offset"])
            high_watermark = int(part["high_watermark"])
            start = _resolve(starting(name, number), log_start, high_watermark)
            end = _resolve(ending(name, number), log_start, high_watermark)
            start, end = max(start, log_start), min(end, high_watermark)
            if start >= end:
                continue
            segments = []
            listed = sorted(part.get("segments", []), key=lambda s: int(s["base_offset"]))
            for i, seg in enumerate(listed):
                base = int(seg["base_offset"])
                last = seg.get("last_offset")
                if last is None and i + 1 < len(listed):
                    last = int(listed[i + 1]["base_offset"]) - 1
                size = int(seg["size_bytes"])
                if size == 0 or base >= end or (last is not None and int(last) < start):
                    continue
                path = segment_location(snapshot_path, part, seg)
                segments.append((path, size, base, None if last is None else int(last)))
            if not segments:
                continue
            if compacted:
                out.append(CompactedPartition(name, number, tuple(segments), start, end, start_ts, end_ts))
            else:
                out.extend(SegmentPartition(path, name, number, size, start, end, start_ts, end_ts)
                           for path, size, _, _ in segments)
    return out


def read_manifest(snapshot_path: str) -> dict:
    """The manifest of a snapshot (a local path or a URI: storage.py); ValueError for another
    format_version."""
    manifest = json.loads(storage.read_bytes(storage.join(snapshot_path, MANIFEST)))
    if manifest.get("format_version") != FORMAT_VERSION:
        version = manifest.get("format_version")
        where = storage.display(snapshot_path)
        raise ValueError(f"eventlog: {where}: manifest format_version {version!r}, expected {FORMAT_VERSION}")
    return manifest


def segment_location(snapshot_path: str, part: dict, seg: dict) -> str:
    """Where a manifest's segment is: its `object` (a path relative to the snapshot directory:
    an uploaded snapshot's content-addressed segment, analytics/upload.py) if it has one, else
    `<snapshot>/<partition dir>/<file>`."""
    if seg.get("object"):
        # objects are shared by the snapshots of one upload root (<root>/snapshots/<id>): a
        # manifest may name nothing outside that root (an absolute path, another bucket, ..)
        location, root = storage.join(snapshot_path, str(seg["object"])), storage.join(snapshot_path, "..", "..")
    else:
        location, root = storage.join(snapshot_path, str(part["dir"]), str(seg["file"])), snapshot_path
    if str(seg.get("object") or "").startswith("/") or "://" in str(seg.get("object") or "") \
            or not storage.inside(location, root):
        raise ValueError(
            f"eventlog: {storage.display(snapshot_path)}: the manifest names a segment outside the snapshot "
            f"({seg.get('object') or str(part['dir']) + '/' + str(seg['file'])})"
        )
    return location


def _parse_offsets(text, option: str, default: int, partitions_of):
    """A function (topic, partition) -> offset, EARLIEST or LATEST."""
    if text is None or not str(text).strip():
        return lambda topic, partition: default
    text = str(text).strip()
    if text.lower() in ("earliest", "latest"):
        value = EARLIEST if text.lower() == "earliest" else LATEST
        return lambda topic, partition: value
    try:
        value = int(text)
    except ValueError:
        pass
    else:
        _check_offset(value, option)
        return lambda topic, partition: value
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"eventlog: {option} must be earliest, latest, a number or JSON like "
                         f'{{"orders": {{"0": 23, "1": -2}}}}; got {text!r}') from None
    if not isinstance(spec, dict) or not all(isinstance(v, dict) for v in spec.values()):
        raise ValueError(f'eventlog: {option} JSON must map topics to {{"partition": offset}}; got {text!r}')
    table = {}
    for topic, per_partition in spec.items():
        for partition, offset in per_partition.items():
            if topic not in partitions_of or not str(partition).isdigit() or int(partition) not in partitions_of[topic]:
                raise ValueError(f"eventlog: {option} names {topic}-{partition}, which this read does not include")
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise ValueError(f"eventlog: {option}: offset for {topic}-{partition} must be an integer")
            _check_offset(offset, option)
            table[(topic, int(partition))] = offset
    return lambda topic, partition: table.get((topic, partition), default)


def _check_offset(value: int, option: str) -> None:
    if value < EARLIEST:
        raise ValueError(f"eventlog: {option}: {value} is not an offset (-2 = earliest, -1 = latest)")


def _resolve(value: int, log_start: int, high_watermark: int) -> int:
    if value == EARLIEST:
        return log_start
    if value == LATEST:
        return high_watermark
    return value


def _parse_ms(text, option: str) -> int | None:
    if text is None or not str(text).strip():
        return None
    try:
        return int(str(text).strip())
    except ValueError:
        raise ValueError(f"eventlog: {option} must be milliseconds since the epoch; got {text!r}") from None


def _parse_bool(text, option: str) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"eventlog: {option} must be true or false; got {text!r}")
    return value == "true"


# ---------------------------------------------------------------------------------------------
# typed columns: the read's schema and how batches become it


@dataclass(frozen=True)
class _Formats:
    """The typing options of one read (None = not given)."""

    key: str | None
    value: str | None
    headers: str | None
    value_schema: str | None
    mode: str
    corrupt_column: str
    sample_records: int

    @classmethod
    def parse(cls, options: dict[str, str]) -> _Formats:
        def choice(name: str, allowed: tuple[str, ...]) -> str | None:
            text = options.get(name)
            if text is None or not str(text).strip():
                return None
            value = str(text).strip().lower()
            if value not in allowed:
                raise ValueError(f"eventlog: {name} must be one of {', '.join(allowed)}; got {text!r}")
            return value

        typing = [n for n in ("key_format", "value_format", "header_format", "value_schema") if options.get(n)]
        mode = str(options.get("mode") or PERMISSIVE).strip().upper()
        if mode not in MODES:
            if typing:
                raise ValueError(f"eventlog: mode must be one of {', '.join(MODES)}; got {options.get('mode')!r}")
            mode = PERMISSIVE  # an untyped read decodes nothing that could fail
        records = str(options.get("value_sample_records") or DEFAULT_SAMPLE_RECORDS).strip()
        if not records.isdigit() or int(records) < 1:
            raise ValueError(f"eventlog: value_sample_records must be a positive number; got {records!r}")
        value_schema = options.get("value_schema")
        formats = cls(
            key=choice("key_format", ("binary", "string")),
            value=choice("value_format", ("binary", "string", "json")),
            headers=choice("header_format", ("binary", "string")),
            value_schema=value_schema if value_schema and str(value_schema).strip() else None,
            mode=mode,
            corrupt_column=str(options.get("columnnameofcorruptrecord") or CORRUPT_COLUMN),
            sample_records=int(records),
        )
        if formats.value_schema is not None and formats.value not in (None, "json"):
            raise ValueError(f"eventlog: value_schema needs value_format json, not {formats.value}")
        if formats.corrupt_column.lower() in ("topic", "partition", "offset", "timestamp", "key", "value", "headers"):
            raise ValueError(f"eventlog: columnNameOfCorruptRecord {formats.corrupt_column!r} names a column of the schema")
        return formats


def typing_options(options: dict[str, str]) -> dict[str, str]:
    """The options (lower case) as typing reads them: without a `mode` of auto, live or
    snapshots, readStream's old name for its option `input` (stream.py), so that `mode` only
    ever means Spark's JSON modes. Other values are left for _Formats.parse to judge."""
    mode = options.get("mode")
    if mode is not None and str(mode).strip().lower() in STREAM_INPUTS:
        return {k: v for k, v in options.items() if k != "mode"}
    return options


def read_schema(options: dict[str, str], infer=None):
    """The schema of a read without a user schema (options lower case): SPARK_DDL, with key,
    value and header values typed as the options say, and the corrupt-record column (binary)
    after them for JSON values in PERMISSIVE mode. When value_format is json and no
    value_schema is given, the value type is `infer(options, value_sample_records)` (default:
    from a sample of the snapshot's selected values, _infer_value_type)."""
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

    from .schemas import check_json_type, parse_ddl, parse_value_type

    formats = _Formats.parse(options)
    value = "json" if formats.value_schema is not None else (formats.value or "binary")
    if formats.key in (None, "binary") and value == "binary" and formats.headers in (None, "binary"):
        return SPARK_DDL
    fields = []
    for field in parse_ddl(SPARK_DDL).fields:
        if field.name == "key" and formats.key == "string":
            field = StructField("key", StringType())
        elif field.name == "value" and value == "string":
            field = StructField("value", StringType())
        elif field.name == "value" and value == "json":
            if formats.value_schema is not None:
                value_type = parse_value_type(formats.value_schema)
            else:
                value_type = (infer or _infer_value_type)(options, formats.sample_records)
            check_json_type(value_type)
            field = StructField("value", value_type)
        elif field.name == "headers" and formats.headers == "string":
            header = StructType([StructField("key", StringType()), StructField("value", StringType())])
            field = StructField("headers", ArrayType(header))
        fields.append(field)
    if value == "json" and formats.mode == PERMISSIVE:
        fields.append(StructField(formats.corrupt_column, BinaryType()))
    return StructType(fields)


def row_format(options: dict[str, str], schema=None) -> RowFormat | None:
    """How the reader turns decoder batches into `schema` (Spark's StructType, a DDL string, or
    None for read_schema(options)); None when they already are it. Checks the schema: the seven
    columns of SPARK_DDL by name (any order, any case), each with its type, except that key may
    be string, header values string, and value anything JSON can fill (value_format json), plus
    an optional corrupt-record column (binary or string). ValueError otherwise."""
    from pyspark.sql.types import BinaryType, StringType, StructType

    from .schemas import arrow_schema, check_json_type, parse_ddl, parse_value_type

    formats = _Formats.parse(options)
    if schema is None:
        schema = read_schema(options)
    if isinstance(schema, str):
        schema = parse_ddl(schema)
    if not isinstance(schema, StructType):
        raise ValueError(f"eventlog: the schema must be a struct; got {schema!r}")
    plain = {f.name: f for f in parse_ddl(SPARK_DDL).fields}
    expected = (
        f"the schema is fixed: {SPARK_DDL}, in any order; key may be string, header values "
        f"string, value any type JSON can fill (option value_format json); plus an optional "
        f"{formats.corrupt_column} (binary or string) column"
    )
    sources: list[str] = []
    value_format = "binary"
    for field in schema.fields:
        name = field.name.lower()
        if name == formats.corrupt_column.lower():
            source = "corrupt"
            ok = isinstance(field.dataType, BinaryType | StringType) and field.nullable
        elif name in plain:
            source = name
            if name in ("topic", "partition", "offset", "timestamp"):
                ok = field.dataType == plain[name].dataType
            elif name == "key":
                ok = field.nullable and _agrees(formats.key, field.dataType, "key_format")
            elif name == "headers":
                element = getattr(field.dataType, "elementType", None)
                typed = arrow_schema(StructType([field]))[0].type
                text = arrow_schema(parse_ddl("h array<struct<key: string, value: string>>"))[0].type
                headers = {ARROW_SCHEMA.field("headers").type: "binary", text: "string"}
                ok = field.nullable and typed in headers and element is not None
                if ok:
                    _agrees(formats.headers, StringType() if headers[typed] == "string" else BinaryType(),
                            "header_format")
            else:  # value
                value_format = _value_format(formats, field.dataType)
                if value_format == "json":
                    check_json_type(field.dataType)
                    if formats.value_schema is not None and _arrow_type(parse_value_type(formats.value_schema)) \
                            != _arrow_type(field.dataType):
                        raise ValueError(f"eventlog: the schema's value type {field.dataType.simpleString()} and "
                                         f"option value_schema disagree; give one of them")
                ok = field.nullable
        else:
            ok = False
        if not ok or source in sources:
            raise ValueError(f"eventlog: {expected}; got {schema.simpleString()} (column {field.name!r})")
        sources.append(source)
    missing = [name for name in plain if name not in sources]
    if missing:
        raise ValueError(f"eventlog: {expected}; got {schema.simpleString()} (no {', '.join(missing)})")
    result = RowFormat(arrow_schema(schema), tuple(sources), value_format, formats.mode)
    return None if result.is_identity(ARROW_SCHEMA) else result


def _arrow_type(data_type) -> pa.DataType:
    """Names, types and NOT NULL flags; not metadata (comments), which Spark may rewrite."""
    from pyspark.sql.types import StructField, StructType

    from .schemas import arrow_schema

    return arrow_schema(StructType([StructField("v", data_type)]))[0].type


def _agrees(option: str | None, data_type, name: str) -> bool:
    """A key or header column's type: binary or string, and what the option says if given."""
    from pyspark.sql.types import BinaryType, StringType

    kind = "string" if isinstance(data_type, StringType) else "binary" if isinstance(data_type, BinaryType) else None
    if kind is None:
        return False
    if option is not None and option != kind:
        raise ValueError(f"eventlog: option {name} {option} and the schema's {kind} column disagree")
    return True


def _value_format(formats: _Formats, data_type) -> str:
    """binary -> raw bytes, string -> raw text unless value_format json, anything else JSON."""
    from pyspark.sql.types import BinaryType, StringType

    if isinstance(data_type, BinaryType):
        wanted, natural = ("binary",), "binary"
    elif isinstance(data_type, StringType):
        wanted, natural = ("string", "json"), "string"
    else:
        wanted, natural = ("json",), "json"
    if formats.value_schema is not None and formats.value is None:
        given = "json"
    else:
        given = formats.value
    if given is None:
        return natural
    if given not in wanted:
        raise ValueError(f"eventlog: option value_format {given} cannot fill a value column of type "
                         f"{data_type.simpleString()}")
    return given


def _infer_value_type(options: dict[str, str], records: int):
    """The JSON type of a sample of the read's selected values (infer_sampled)."""
    plan = plan_partitions(options["path"], {**options, "compacted": "false"})
    by_partition: dict[tuple[str, int], list[SegmentPartition]] = {}
    for part in plan:
        by_partition.setdefault((part.topic, part.partition), []).append(part)

    def sample(tp: tuple[str, int], head: int, tail: int) -> Iterable[bytes]:
        taken = dict(_sample(by_partition[tp], head, last=False))
        taken.update(_sample(by_partition[tp], tail, last=True))
        return taken.values()

    return infer_sampled(list(by_partition), records, sample)


def infer_sampled(partitions: list[tuple[str, int]], records: int, sample):
    """The JSON type of a sample: for each topic, up to `records` values spread over its
    `partitions` ((topic, partition) pairs), half from each partition's first records and half
    from its last (the newest fields are seen): `sample(tp, head, tail)` gives the non-null
    values of the first `head` and the last `tail` records of one partition, each record once.
    ValueError, asking for a schema, when the sample holds no JSON value (or is empty)."""
    from .schemas import infer_value_type

    partitions_of: dict[str, int] = {}
    for topic, _ in partitions:
        partitions_of[topic] = partitions_of.get(topic, 0) + 1
    values: list[bytes] = []
    for tp in partitions:
        quota = -(-records // partitions_of[tp[0]])
        head = -(-quota // 2)
        values.extend(sample(tp, head, quota - head))
    value_type = infer_value_type(values)
    if value_type is None:
        topics = ", ".join(sorted(partitions_of)) or "none"
        raise ValueError(
            f"eventlog: value_format json: no JSON value to infer the value type from in {len(values)} sampled "
            f"records (topics: {topics}); give .schema(...) or option value_schema"
        )
    return value_type


def _sample(segments: list[SegmentPartition], count: int, *, last: bool) -> Iterator[tuple[int, bytes]]:
    """(offset, value) of up to `count` non-null values from the first segments, or from the
    last `count` offsets of the last segment."""

    def batches() -> Iterator[pa.RecordBatch]:
        for seg in segments[-1:] if last else segments:
            start = max(seg.start_offset, seg.end_offset - count) if last else seg.start_offset
            yield from decode_segment(seg.path, seg.size_bytes, topic=seg.topic, partition=seg.partition,
                                      start_offset=start, end_offset=seg.end_offset, start_ts=seg.start_ts,
                                      end_ts=seg.end_ts, max_rows_per_batch=max(count, 1))

    yield from non_null_values(batches(), count)


def non_null_values(batches: Iterable[pa.RecordBatch], count: int) -> Iterator[tuple[int, bytes]]:
    """(offset, value) of the first `count` records of `batches` whose value is not null (a
    sample for schema inference; the stream's too)."""
    if count <= 0:
        return
    taken = 0
    for batch in batches:
        present = batch.filter(batch.column("value").is_valid())
        for offset, value in zip(present.column("offset").to_pylist(), present.column("value").to_pylist()):
            yield offset, value
            taken += 1
            if taken == count:
                return


# ---------------------------------------------------------------------------------------------
# compacted view


def _read_compacted(p: CompactedPartition) -> Iterator[pa.RecordBatch]:
    bounds = {"start_offset": p.start_offset, "end_offset": p.end_offset,
              "start_ts": p.start_ts, "end_ts": p.end_ts}
    # pass 1: the latest (offset, tombstone) per key, reduced segment by segment
    latest: pa.Table | None = None
    for path, size, _, _ in p.segments:
        pieces = [] if latest is None else [latest]
        for keys, offsets, tombstones in decode_segment_keys(path, size, **bounds):
            keyed = keys.is_valid()
            if not pc.any(keyed).as_py():
                continue
            tagged = offsets * 2 + tombstones
            pieces.append(pa.table({"key": keys, "tag": tagged}).filter(keyed))
        if pieces:
            latest = _latest_tags(pa.concat_tables(pieces))
    if latest is None or latest.num_rows == 0:
        return
    tags = latest.column("tag").to_numpy()
    survivors = np.sort(tags[(tags & 1) == 0] >> 1)
    if survivors.size == 0:
        return
    # pass 2: decode again the segments holding survivors, keep only those rows
    first, last = int(survivors[0]), int(survivors[-1])
    bounds["start_offset"] = max(p.start_offset, first)
    bounds["end_offset"] = min(p.end_offset, last + 1)
    for path, size, base, seg_last in p.segments:
        lo = np.searchsorted(survivors, base)
        if lo == survivors.size or (seg_last is not None and survivors[lo] > seg_last):
            continue
        for batch in decode_segment(path, size, topic=p.topic, partition=p.partition, **bounds):
            offsets = batch.column("offset").to_numpy()
            at = np.minimum(np.searchsorted(survivors, offsets), survivors.size - 1)
            keep = survivors[at] == offsets
            if keep.all():
                yield batch
            elif keep.any():
                yield batch.filter(pa.array(keep))


def _latest_tags(table: pa.Table) -> pa.Table:
    """One row per key: the largest tag (offset * 2 + tombstone)."""
    grouped = table.group_by("key").aggregate([("tag", "max")])
    return pa.table({"key": grouped.column("key"), "tag": grouped.column("tag_max")})


def latest_per_key(df):
    """The compacted view of any DataFrame with this schema, in the DataFrame layer: the row
    with the highest offset per (topic, partition, key), without null keys or tombstones."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy("topic", "partition", "key").orderBy(F.col("offset").desc())
    return (
        df.where(F.col("key").isNotNull())
        .withColumn("_latest", F.row_number().over(window))
        .where((F.col("_latest") == 1) & F.col("value").isNotNull())
        .drop("_latest")
    )
