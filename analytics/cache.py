"""Segments as Parquet: reads at Parquet speed, through Spark's own Parquet reader.

A Python data source hands Spark its rows through a Python worker, and that hand-over, not the
decoding, bounds it: a source that only reads Parquet files with pyarrow and yields their
batches runs at 0.29 x `spark.read.parquet` of the same files here (0.40 x with three columns
instead of seven; docs/PERFORMANCE.md). So the fast path does not go through the source:

    df = analytics.load(spark, "/snapshots/<id>", cache="/warehouse/segments")

decodes each segment the snapshot holds once into a Parquet file under `cache` (skipped when
the file exists), and answers `spark.read.parquet(<those files>)` with the read's offset and
time bounds as a filter: the same rows and schema as `spark.read.format("eventlog")` with the
same options (tests hold them equal), and Spark prunes columns and pushes filters into them.

A segment's bytes [0, size_bytes) never change once a snapshot lists them (the log only
appends; compaction and retention write new files), so a cache file never goes stale. It is
named after what identifies those bytes: the topic id, the partition, the base offset, the
size, and a CRC-32C of the first and last 4 KiB:

    <cache>/<topic id>/<partition>/<base offset>-<size>-<digest>.parquet

A closed segment is decoded once for every snapshot that holds it; the newest segment of a
partition (still growing when the snapshot was taken) gets a new file for each new size.
`prune(cache, snapshot)` removes the files no segment of the snapshot names (the nightly job
runs it after each run). Files are written whole (a temporary name, then a rename).

The snapshot may be a URI (storage.py: s3://, hdfs://; an uploaded snapshot's segment objects
already carry the digest in their names, so planning reads no segment bytes); the cache is a
local path (on a cluster, one every executor mounts): Spark's own Parquet reader reads it.

Without `cache`, and with the options only the source has (`compacted`, typed values),
`load` is `spark.read.format("eventlog")`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from crc32c import crc32c

from . import storage
from .decoder import ARROW_SCHEMA, decode_segment

SAMPLE = 4096
_NAME = re.compile(r"^(\d{20})-(\d+)-([0-9a-f]{16})(?:\.|$)")
# options of the data source that change its rows' form or choice beyond offset and time bounds
_SOURCE_ONLY = {
    "compacted", "value_format", "value_schema", "key_format", "header_format", "mode",
    "columnnameofcorruptrecord", "value_sample_records",
}


@dataclass(frozen=True)
class CachedSegment:
    topic: str
    partition: int
    path: str  # the segment file in the snapshot
    size_bytes: int
    file: str  # its Parquet file in the cache
    base_offset: int = 0
    last_offset: int | None = None  # the manifest's (None: not given)


def segment_digest(path: str, size_bytes: int) -> str:
    """CRC-32C of the first and the last SAMPLE bytes of [0, size_bytes), as 16 hex digits
    (`path`: a local file or a URI, storage.py)."""
    with storage.open_input(path) as f:
        head = f.read(min(SAMPLE, size_bytes))
        f.seek(max(0, size_bytes - SAMPLE))
        tail = f.read(min(SAMPLE, size_bytes))
    return f"{crc32c(head):08x}{crc32c(tail):08x}"


def segment_name(base_offset: int, size_bytes: int, digest: str) -> str:
    """`<base offset, 20 digits>-<size>-<digest>`: a cache file's name and an uploaded segment
    object's (analytics/upload.py), less the suffix."""
    return f"{base_offset:020d}-{size_bytes}-{digest}"


def parse_segment_name(name: str) -> tuple[int, int, str] | None:
    """(base offset, size, digest) of a name segment_name made (any suffix), else None."""
    match = _NAME.match(name)
    return None if match is None else (int(match[1]), int(match[2]), match[3])


def _digest_of(path: str, size_bytes: int) -> str:
    """segment_digest, or the digest an uploaded object's name already holds (no read)."""
    named = parse_segment_name(storage.basename(path))
    if named is not None and named[1] == size_bytes:
        return named[2]
    return segment_digest(path, size_bytes)


def plan(snapshot: str | Path, cache: str | Path, options: dict[str, str]) -> tuple[list[CachedSegment], list[tuple]]:
    """The cache files a read of `snapshot` with `options` needs, and the (topic, partition,
    start, end) offset bounds of every partition it reads."""
    from .source import plan_partitions, read_manifest

    snapshot = storage.normalize(snapshot)
    manifest = read_manifest(snapshot)
    topic_ids = {t["name"]: t.get("topic_id") or t["name"] for t in manifest["topics"]}
    lasts = {
        (t["name"], int(p["partition"]), int(seg["base_offset"])): seg.get("last_offset")
        for t in manifest["topics"] for p in t["partitions"] for seg in p.get("segments", [])
    }
    options = {k.lower(): v for k, v in options.items()}
    segments, bounds = [], {}
    for part in plan_partitions(snapshot, options):
        base = int(re.match(r"\d+", storage.basename(part.path))[0])
        name = segment_name(base, part.size_bytes, _digest_of(part.path, part.size_bytes)) + ".parquet"
        file = os.path.join(str(cache), topic_ids[part.topic], str(part.partition), name)
        last = lasts.get((part.topic, part.partition, base))
        segments.append(CachedSegment(part.topic, part.partition, part.path, part.size_bytes, file, base,
                                       None if last is None else int(last)))
        bounds[(part.topic, part.partition)] = (part.start_offset, part.end_offset)
    return segments, [(t, p, s, e) for (t, p), (s, e) in sorted(bounds.items())]


def build(segment: CachedSegment) -> bool:
    """Decode one segment into its cache file unless it is there; True if it was written."""
    if os.path.exists(segment.file):
        return False
    os.makedirs(os.path.dirname(segment.file), exist_ok=True)
    temporary = f"{segment.file}.{os.getpid()}.tmp"
    try:
        with pq.ParquetWriter(temporary, ARROW_SCHEMA, compression="snappy") as writer:
            for batch in decode_segment(segment.path, segment.size_bytes, topic=segment.topic, partition=segment.partition):
                writer.write_batch(batch, row_group_size=1 << 20)
        os.replace(temporary, segment.file)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return True


def build_all(spark, segments: list[CachedSegment]) -> int:
    """Write the missing cache files, as Spark tasks (so on a cluster with the cache on shared
    storage, the executors do it); how many were written."""
    missing = [s for s in segments if not os.path.exists(s.file)]
    if not missing:
        return 0
    if spark is None or len(missing) == 1:
        return sum(build(s) for s in missing)
    slices = min(len(missing), spark.sparkContext.defaultParallelism * 4)
    return sum(spark.sparkContext.parallelize(missing, slices).map(build).collect())


def load(spark, snapshot: str | Path, *, cache: str | Path | None = None, **options: str):
    """The rows of `spark.read.format("eventlog").options(**options).load(snapshot)`; from
    Parquet files under `cache` when it is given (module docstring)."""
    if cache is not None and storage.is_uri(cache):
        raise ValueError(f"analytics.load: the segment cache must be a local path (on a cluster, one every executor "
                         f"mounts): Spark's Parquet reader reads it; got {storage.display(str(cache))}")
    if cache is None or _SOURCE_ONLY & {k.lower() for k in options}:
        from . import register

        register(spark)
        reader = spark.read.format("eventlog")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load(str(snapshot))
    from pyspark.sql import functions as F

    from .decoder import SPARK_DDL

    segments, bounds = plan(snapshot, cache, options)
    if not segments:
        return spark.createDataFrame([], SPARK_DDL)
    build_all(spark, segments)
    df = spark.read.schema(SPARK_DDL).parquet(*sorted({s.file for s in segments}))
    # the rows of each partition's range only, where a segment reaches past it
    cut = []
    for topic, partition, start, end in bounds:
        held = [s for s in segments if (s.topic, s.partition) == (topic, partition)]
        if any(s.last_offset is None for s in held) or min(s.base_offset for s in held) < start \
                or max(s.last_offset for s in held) >= end:
            cut.append((topic, partition, start, end))
    if cut:
        keep = F.lit(True)
        for topic, partition, start, end in cut:
            inside = (F.col("offset") >= start) & (F.col("offset") < end)
            keep = keep & (~((F.col("topic") == topic) & (F.col("partition") == partition)) | inside)
        df = df.where(keep)
    lowered = {k.lower(): v for k, v in options.items()}
    if lowered.get("startingtimestamp"):
        df = df.where(F.col("timestamp") >= F.timestamp_micros(F.lit(int(lowered["startingtimestamp"]) * 1000)))
    if lowered.get("endingtimestamp"):
        df = df.where(F.col("timestamp") < F.timestamp_micros(F.lit(int(lowered["endingtimestamp"]) * 1000)))
    return df


def prune(cache: str | Path, keep: Iterable[str]) -> int:
    """Remove the cache files (and temporary leftovers) not in `keep`; how many."""
    keep = {os.path.abspath(f) for f in keep}
    removed = 0
    for root, _dirs, files in os.walk(str(cache)):
        for name in files:
            path = os.path.abspath(os.path.join(root, name))
            if path not in keep and (name.endswith((".parquet", ".tmp"))):
                os.unlink(path)
                removed += 1
    return removed


__all__ = [
    "CachedSegment", "build", "build_all", "load", "parse_segment_name", "plan", "prune", "segment_digest",
    "segment_name",
]
