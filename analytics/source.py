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
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from .decoder import ARROW_SCHEMA, SPARK_DDL, decode_segment, decode_segment_keys

__all__ = [
    "CompactedPartition",
    "EventlogDataSource",
    "EventlogReader",
    "SegmentPartition",
    "latest_per_key",
    "plan_partitions",
]

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
EARLIEST = -2
LATEST = -1


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

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema) -> EventlogReader:
        return EventlogReader(dict(self.options), schema)


class EventlogReader(DataSourceReader):
    """Plans at construction (on the driver, so bad options fail early); the plan is not
    pickled with the reader (it would travel with every task)."""

    def __init__(self, options: dict[str, str], schema=None) -> None:
        if schema is not None:
            _check_schema(schema)
        options = {str(k).lower(): v for k, v in options.items()}
        path = options.get("path")
        if not path:
            raise ValueError("eventlog: give the snapshot directory: spark.read.format('eventlog').load(path)")
        self._partitions = plan_partitions(path, options)

    def partitions(self) -> list[InputPartition]:
        return list(self._partitions)

    def __getstate__(self) -> dict:
        # Spark pickles the reader into every task; each task gets its partition separately.
        state = dict(self.__dict__)
        state["_partitions"] = []
        return state

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SegmentPartition):
            yield from decode_segment(
                partition.path, partition.size_bytes, topic=partition.topic, partition=partition.partition,
                start_offset=partition.start_offset, end_offset=partition.end_offset,
                start_ts=partition.start_ts, end_ts=partition.end_ts,
            )
        elif isinstance(partition, CompactedPartition):
            yield from _read_compacted(partition)
        # anything else: Spark's stand-in InputPartition(None) when there is nothing to read


def _check_schema(schema) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    if not to_arrow_schema(schema, timezone="UTC").equals(ARROW_SCHEMA):
        raise ValueError(f"eventlog: the schema is fixed ({SPARK_DDL}); got {schema.simpleString()}")


# ---------------------------------------------------------------------------------------------
# planning (pure Python; the reader runs it on the driver)


def plan_partitions(snapshot_path: str, options: dict[str, str]) -> list[InputPartition]:
    """The input partitions of one read. `options` keys must be lower case."""
    snapshot_path = os.path.abspath(snapshot_path.removeprefix("file://"))
    with open(os.path.join(snapshot_path, MANIFEST), "rb") as f:
        manifest = json.load(f)
    if manifest.get("format_version") != FORMAT_VERSION:
        version = manifest.get("format_version")
        raise ValueError(f"eventlog: {snapshot_path}: manifest format_version {version!r}, expected {FORMAT_VERSION}")
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
                path = os.path.join(snapshot_path, part["dir"], seg["file"])
                segments.append((path, size, base, None if last is None else int(last)))
            if not segments:
                continue
            if compacted:
                out.append(CompactedPartition(name, number, tuple(segments), start, end, start_ts, end_ts))
            else:
                out.extend(SegmentPartition(path, name, number, size, start, end, start_ts, end_ts)
                           for path, size, _, _ in segments)
    return out


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
