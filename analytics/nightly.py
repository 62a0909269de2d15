"""The nightly job: snapshots in, Parquet out, incrementally.

Each run reads only what is new since the last run: per topic partition, the offsets from the
watermark the last run kept (`<out>/_STATE.json`) up to the snapshot's high watermark. It then

* upserts the **table view** of each compacted topic, `<out>/tables/<topic>/`: the latest
  record per (partition, key); a newer record replaces a key's row, a tombstone deletes it
  (the first run, or a topic whose table must be rebuilt, reads the topic's whole compacted
  view instead);
* adds to the **daily counts**, `<out>/daily/` (topic, date, records, bytes, produced,
  compacted): `records` and `bytes` are the records the run read; `produced` counts the
  offsets those records stand for, so a record whose predecessors were removed by compaction
  before the run saw them stands for them too (their day is taken to be its day: compaction
  removes only records older than the one kept), and `compacted` says that the day lost some
  records to compaction before they were counted (produced > records). A job that runs
  before `min.compaction.lag.ms` passes counts every record produced;
* writes `<out>/_SUMMARY.json` (this run: snapshot, offsets read per topic, offsets lost to
  retention, outputs, seconds) and the new watermarks.

A run with nothing new reads nothing and finishes in well under a second once Spark is up.
Offsets a snapshot no longer holds (retention deleted them since the last run) are skipped
and reported as lost; the run still converges. A topic deleted and made again (another
topic id), or a snapshot behind the watermarks, rebuilds that topic's table. `full=True`
(`--full`) forgets every watermark and rebuilds everything.

Typed tables: `schemas={topic: value schema}` (`--schema accounts=accounts.json`, a Spark DDL
string or a DDL or JSON Schema file, analytics.schemas.load_value_schema) makes that topic's
table hold its values as typed columns (the data source's `value_schema` option, PERMISSIVE: a
value that does not fit is null with its bytes in `_corrupt_record`, and does not delete its
key). A topic whose schema changed since the last run gets its table rebuilt.

Commit: the outputs of a run are written next to the current ones (`<name>.next`), then
`_STATE.json.next`, and then moved into place, `_STATE.json` last. A run that died before
`_STATE.json.next` was complete left only `.next` directories, which the next run removes; one
that died while moving finishes the move first. So readers see a whole run's outputs or the
previous run's, except for the moment of the moves, and no record is counted twice.

Input and output: the snapshot may be on any pyarrow filesystem (`--snapshot
s3://bucket/prefix/snapshots`, a snapshot uploaded by `eventlog snapshot --to`: storage.py,
upload.py); the output, with its segment cache, is a local directory or a mount of shared
storage (the commit renames; Spark's Parquet reader reads the cache): a URI is refused.

Run it with `eventlog nightly --snapshot PATH --out DIR` (a local Spark session, with a progress
display), or on a cluster with spark-submit (the eventlog package installed on the executors,
see docs/ANALYTICS.md):

    spark-submit analytics/nightly.py --snapshot /snapshots --out /warehouse/eventlog
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analytics import register, storage
from analytics.cache import build_all, prune
from analytics.cache import plan as plan_cache

STATE = "_STATE.json"
STATE_VERSION = 1
NEXT = ".next"


@dataclass
class TopicOutput:
    topic: str
    compacted: bool
    table_rows: int | None  # rows of the table view (compacted topics)
    table_path: str | None
    offsets_read: int = 0  # offsets this run covered (high watermark - watermark, summed)
    offsets_lost: int = 0  # offsets past the watermark the snapshot no longer held (retention)
    rebuilt: bool = False  # the table was made from the topic's whole compacted view


@dataclass
class NightlyResult:
    snapshot_id: str
    snapshot_path: str
    out: str
    topics: list[TopicOutput] = field(default_factory=list)
    daily_rows: int = 0
    run: int = 0  # runs into this output so far, this one included
    incremental: bool = False  # there were watermarks to start from
    seconds: float = 0.0


def resolve_snapshot(path: str | Path) -> Path | str:
    """A snapshot directory, or a directory of snapshots: then the newest finished one (ids sort
    by creation time). A URI (s3://bucket/prefix/snapshots, analytics/storage.py) stays a str."""
    if storage.is_uri(path):
        path = str(path)
        if storage.exists(storage.join(path, "manifest.json")):
            return path
        for name in reversed(storage.list_dirs(path)):
            if not name.startswith(".") and storage.exists(storage.join(path, name, "manifest.json")):
                return storage.join(path, name)
        raise FileNotFoundError(f"{storage.display(path)} is neither a snapshot (no manifest.json) nor a directory of snapshots")
    path = Path(path)
    if (path / "manifest.json").exists():
        return path
    finished = sorted(p for p in path.iterdir() if p.is_dir() and (p / "manifest.json").exists()) if path.is_dir() else []
    if not finished:
        raise FileNotFoundError(f"{path} is neither a snapshot (no manifest.json) nor a directory of snapshots")
    return finished[-1]


def read_manifest(snapshot: Path | str) -> dict[str, Any]:
    return json.loads(storage.read_bytes(storage.join(str(snapshot), "manifest.json")))


def check_out(out: str | Path) -> None:
    """The output must be a local directory (or a mount of shared storage): the commit renames
    files and directories, which object stores cannot do whole. ValueError otherwise."""
    if storage.is_uri(out):
        raise ValueError(
            f"--out {storage.display(str(out))}: the nightly job's output must be a local directory, or shared "
            "storage mounted as one (NFS, a FUSE mount): its commit renames directories, which an object store "
            "cannot do atomically. The snapshot may be a URI."
        )


def snapshot_topics(snapshot: Path | str, wanted: list[str] | None = None) -> list[dict[str, Any]]:
    """The manifest's topics to process: the named ones, or every non-internal topic."""
    manifest = read_manifest(snapshot)
    topics = manifest["topics"]
    if wanted is not None:
        known = {t["name"] for t in topics}
        missing = [t for t in wanted if t not in known]
        if missing:
            raise ValueError(f"not in snapshot {manifest['snapshot_id']}: {', '.join(missing)}")
        return [t for t in topics if t["name"] in wanted]
    return [t for t in topics if not t.get("internal")]


# -- state and commit (plain files; pure Python) ---------------------------------------------


def load_state(out: Path) -> dict[str, Any]:
    """The last committed run's state (after finishing or undoing an interrupted commit)."""
    recover(out)
    try:
        state = json.loads((out / STATE).read_text())
    except FileNotFoundError:
        return {"format_version": STATE_VERSION, "runs": 0, "topics": {}}
    if state.get("format_version") != STATE_VERSION:
        raise ValueError(f"{out / STATE}: format_version {state.get('format_version')!r}, expected {STATE_VERSION}")
    return state


def recover(out: Path) -> None:
    """Finish the commit a run died in (its `_STATE.json.next` is whole), or remove what a run
    that died before it left (`.next` outputs)."""
    staged = out / (STATE + NEXT)
    if staged.exists():
        try:
            moves = json.loads(staged.read_text())["moves"]
        except (ValueError, KeyError):  # torn: the run died while writing it, before any move
            staged.unlink()
        else:
            _move_into_place(out, moves)
            os.replace(staged, out / STATE)
            _fsync_dir(out)
            return
    for leftover in list(out.glob("*" + NEXT)) + list(out.glob("tables/*" + NEXT)):
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()


def _move_into_place(out: Path, moves: list[str]) -> None:
    """Each `<name>.next` replaces `<name>` (both relative to out); idempotent."""
    for name in moves:
        staged, final, old = out / (name + NEXT), out / name, out / (name + ".old")
        if not staged.exists():  # moved already (a commit finished again after a crash)
            continue
        if staged.is_file():
            os.replace(staged, final)
        elif final.exists():
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
            os.replace(staged, final)
            shutil.rmtree(old)
        else:  # the first output of its name, or a crash came between the two replaces
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, final)
            if old.exists():
                shutil.rmtree(old)


def _commit(out: Path, state: dict[str, Any], moves: list[str]) -> None:
    staged = out / (STATE + NEXT)
    data = json.dumps({**state, "moves": moves}, indent=2) + "\n"
    with open(staged, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(out)
    recover(out)  # the same code a crashed run's successor runs


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- planning: what each partition needs read ------------------------------------------------


@dataclass(frozen=True)
class PartitionRange:
    partition: int
    start: int  # first offset to read
    end: int  # high watermark: offsets below it
    lost: int  # offsets between the watermark and the log start (retention took them)


def plan_topic(
    topic: dict[str, Any], kept: dict[str, Any] | None, full: bool
) -> tuple[list[PartitionRange], list[PartitionRange], bool]:
    """What to read of one topic (from the manifest): the ranges for its table view, those for
    the daily counts, and whether the table restarts from nothing (first run, --full, another
    topic id, or a snapshot behind the watermarks). The daily counts never count an offset twice:
    behind the watermarks they take only what is past them."""
    marks = {} if kept is None or full else {int(p): int(o) for p, o in kept.get("partitions", {}).items()}
    new_topic = kept is None or full or kept.get("topic_id") != topic.get("topic_id")
    behind = not new_topic and any(marks.get(int(p["partition"]), 0) > int(p["high_watermark"]) for p in topic["partitions"])
    table, daily = [], []
    for p in sorted(topic["partitions"], key=lambda p: int(p["partition"])):
        number, log_start, high = int(p["partition"]), int(p["log_start_offset"]), int(p["high_watermark"])
        mark = log_start if new_topic else marks.get(number, log_start)  # a new partition: from its start
        lost = max(0, log_start - mark)
        counted = PartitionRange(number, min(max(mark, log_start), high), high, lost)
        daily.append(counted)
        table.append(PartitionRange(number, log_start, high, 0) if behind else counted)
    return table, daily, new_topic or behind


# -- the run -------------------------------------------------------------------------------


def run_nightly(
    spark,
    snapshot: str | Path,
    out: str | Path,
    *,
    topics: list[str] | None = None,
    step: Callable[[str], None] | None = None,
    full: bool = False,
    schemas: dict[str, str] | None = None,
) -> NightlyResult:
    """Run the job; `step(description)` is called as each step starts (for a progress display).

    Its Parquet timestamps are written as INT64 microseconds marked as UTC instants
    (`spark.sql.parquet.outputTimestampType` TIMESTAMP_MICROS, for this run only): Spark's
    default, INT96, reads back in pyarrow, pandas or DuckDB as a time with no zone."""
    conf = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(conf, None)
    spark.conf.set(conf, "TIMESTAMP_MICROS")
    try:
        return _run_nightly(
            spark, snapshot, out, topics=topics, step=step, full=full, schemas=schemas
        )
    finally:
        if before is None:
            spark.conf.unset(conf)
        else:
            spark.conf.set(conf, before)


def _run_nightly(
    spark,
    snapshot: str | Path,
    out: str | Path,
    *,
    topics: list[str] | None,
    step: Callable[[str], None] | None,
    full: bool,
    schemas: dict[str, str] | None,
) -> NightlyResult:
    started = time.perf_counter()
    check_out(out)
    snapshot = resolve_snapshot(snapshot)
    out = Path(str(out).removeprefix("file://"))
    out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(snapshot)
    chosen = snapshot_topics(snapshot, topics)
    schemas = dict(schemas or {})
    unknown = sorted(set(schemas) - {t["name"] for t in chosen})
    if unknown:
        raise ValueError(f"a value schema names topics this run does not read: {', '.join(unknown)}")
    fingerprints = {name: _fingerprint(text) for name, text in schemas.items()}
    state = load_state(out)
    result = NightlyResult(manifest["snapshot_id"], str(snapshot), str(out), run=state["runs"] + 1)
    result.incremental = bool(state["topics"]) and not full
    step = step or (lambda _d: None)
    register(spark)

    # every segment of the topics read, as Parquet (analytics/cache.py): decoded once, read by
    # this run and by analysts' analytics.load(spark, snapshot, cache=<out>/segments)
    segments = out / "segments"
    cached, _ = plan_cache(snapshot, segments, {"topics": ",".join(t["name"] for t in chosen)}) if chosen else ([], [])
    if any(not os.path.exists(c.file) for c in cached):
        step("segment cache")
        build_all(spark, cached)
    moves: list[str] = []
    new_marks: dict[str, Any] = dict(state["topics"])
    deltas = []  # (topic, ranges) with something to count
    for topic in chosen:
        name = topic["name"]
        compacted = "compact" in topic["cleanup_policy"].split(",")
        kept = state["topics"].get(name)
        ranges, counted, rebuild = plan_topic(topic, kept, full)
        if kept is not None and kept.get("value_schema") != fingerprints.get(name):
            ranges, rebuild = [PartitionRange(r.partition, log_start, r.end, 0) for r, log_start in
                               zip(ranges, _log_starts(topic), strict=True)], True  # the table is rebuilt
        read = sum(r.end - r.start for r in counted)
        output = TopicOutput(name, compacted, None, None, offsets_read=read, offsets_lost=sum(r.lost for r in counted),
                             rebuilt=compacted and rebuild)
        table_dir = out / "tables" / name
        if compacted:
            current = table_dir
            if read or rebuild or not table_dir.exists():
                step(f"table view of {name}")
                current = _write_table(spark, snapshot, name, ranges, table_dir, rebuild, segments, schemas.get(name))
                moves.append(f"tables/{name}")
            output.table_path, output.table_rows = str(table_dir), _rows(current)
        if read:
            deltas.append((name, counted))
        new_marks[name] = {"topic_id": topic.get("topic_id"), "partitions": {str(r.partition): r.end for r in counted},
                           "value_schema": fingerprints.get(name)}
        result.topics.append(output)
    daily_dir = out / "daily"
    current = daily_dir
    if deltas or (chosen and not daily_dir.exists()) or full:
        step("daily counts and bytes")
        forget = [t["name"] for t in chosen] if full else []
        current = _write_daily(spark, snapshot, deltas, daily_dir, forget, segments)
        moves.append("daily")
    result.daily_rows = _rows(current)
    result.seconds = round(time.perf_counter() - started, 3)
    (out / ("_SUMMARY.json" + NEXT)).write_text(json.dumps(asdict(result), indent=2) + "\n")
    moves.append("_SUMMARY.json")
    _commit(out, {
        "format_version": STATE_VERSION, "runs": result.run, "snapshot_id": result.snapshot_id,
        "committed_ms": int(time.time() * 1000), "topics": new_marks,
    }, moves)
    if topics is None:  # the cache files of segments this snapshot no longer holds
        prune(segments, [c.file for c in cached])
    return result


def _fingerprint(schema_source: str) -> str:
    """The value schema as Spark's JSON form: the same schema however it was written."""
    from .schemas import load_value_schema

    path = Path(schema_source)
    return load_value_schema(path if path.is_file() else schema_source).json()


def _log_starts(topic: dict[str, Any]) -> list[int]:
    return [int(p["log_start_offset"]) for p in sorted(topic["partitions"], key=lambda p: int(p["partition"]))]


def _rows(path: Path) -> int:
    import pyarrow.dataset as ds

    return ds.dataset(str(path), format="parquet").count_rows() if path.exists() else 0


def _offsets(name: str, ranges: list[PartitionRange], which: str) -> str:
    return json.dumps({name: {str(r.partition): getattr(r, which) for r in ranges}})


def _read(spark, snapshot: Path | str, name: str, ranges: list[PartitionRange], segments: Path | None = None, **options: str):
    """The topic's records in `ranges`: from the segment cache when given (analytics/cache.py),
    else (and for the options only the data source has) through the data source."""
    from .cache import load

    return load(spark, snapshot, cache=segments, topics=name, startingOffsets=_offsets(name, ranges, "start"),
                endingOffsets=_offsets(name, ranges, "end"), **options)


def _write_table(
    spark, snapshot: Path | str, name: str, ranges: list[PartitionRange], table_dir: Path, rebuild: bool, segments: Path,
    value_schema: str | None = None,
) -> Path:
    """The topic's table view, upserted with the records in `ranges`, written to (and returned)
    `<table_dir>.next`; values typed by `value_schema` when given. Each row has its `key`
    (the bytes) and `key_string`, after it (with_key_string)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from .source import CORRUPT_COLUMN

    typed = {"value_schema": value_schema} if value_schema else {}
    staged = str(table_dir) + NEXT
    if rebuild or not table_dir.exists():
        table = _read(spark, snapshot, name, ranges, compacted="true", **typed).drop("topic")
        with_key_string(table).write.mode("overwrite").parquet(staged)
        return Path(staged)
    new = _read(spark, snapshot, name, ranges, segments, **typed).drop("topic").where(F.col("key").isNotNull())
    latest = (
        new.withColumn("_n", F.row_number().over(Window.partitionBy("partition", "key").orderBy(F.col("offset").desc())))
        .where(F.col("_n") == 1).drop("_n")
    )
    old = spark.read.parquet(str(table_dir)).drop("key_string")  # made again below
    kept = old.join(latest.select("partition", "key"), ["partition", "key"], "left_anti")
    alive = F.col("value").isNotNull()
    if typed:  # a value that did not fit its schema is null but is no tombstone
        alive = alive | F.col(CORRUPT_COLUMN).isNotNull()
    table = kept.unionByName(latest.where(alive))
    with_key_string(table).write.mode("overwrite").parquet(staged)
    return Path(staged)


def with_key_string(df):
    """`df` with `key_string` after `key`: the key as text where its bytes are valid UTF-8
    (what almost every producer sends), else null (the bytes stay in `key`). Kafka keys are
    bytes, so `key` stays binary: a reader filters or joins on `key_string` without decoding."""
    from pyspark.sql import functions as F

    text = F.col("key").cast("string")
    columns = []
    for name in df.columns:
        columns.append(F.col(f"`{name}`"))
        if name == "key":
            columns.append(F.when(F.is_valid_utf8(text), text).alias("key_string"))
    return df.select(*columns)


def _write_daily(
    spark, snapshot: Path | str, deltas: list[tuple[str, list[PartitionRange]]], daily_dir: Path, forget: list[str], segments: Path
) -> Path:
    """The daily counts so far (less those of the topics in `forget`) plus those of the new
    records, written to (and returned) `<daily_dir>.next`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("topic", T.StringType()), T.StructField("date", T.DateType()),
        T.StructField("records", T.LongType()), T.StructField("bytes", T.LongType()),
        T.StructField("produced", T.LongType()), T.StructField("compacted", T.BooleanType()),
    ])
    parts = []
    for name, ranges in deltas:
        records = _read(spark, snapshot, name, ranges, segments)
        # the offset before each partition's first record read: its range's start - 1
        starts = spark.createDataFrame([(r.partition, r.start - 1) for r in ranges], "partition INT, _before LONG")
        header_bytes = F.aggregate(
            F.col("headers"), F.lit(0).cast("long"),
            lambda acc, h: acc + F.coalesce(F.length(h["value"]), F.lit(0)) + F.length(h["key"]),
        )
        previous = F.lag("offset").over(Window.partitionBy("partition").orderBy("offset"))
        parts.append(
            records.join(F.broadcast(starts), "partition")
            .withColumn("produced", F.col("offset") - F.coalesce(previous, F.col("_before")))
            .withColumn("date", F.to_date(F.col("timestamp")))
            .withColumn(
                "size",
                F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0)) + header_bytes,
            )
            .groupBy("topic", "date")
            .agg(F.count(F.lit(1)).alias("records"), F.sum("size").cast("long").alias("bytes"),
                 F.sum("produced").cast("long").alias("produced"))
        )
    new = parts[0] if parts else spark.createDataFrame([], schema).drop("compacted")
    for part in parts[1:]:
        new = new.unionByName(part)
    if daily_dir.exists():
        old = spark.read.parquet(str(daily_dir)).drop("compacted").where(~F.col("topic").isin(forget))
        if "produced" not in old.columns:  # an output from before incremental runs
            old = old.withColumn("produced", F.col("records"))
        new = old.unionByName(new)
    daily = (
        new.groupBy("topic", "date")
        .agg(F.sum("records").cast("long").alias("records"), F.sum("bytes").cast("long").alias("bytes"),
             F.sum("produced").cast("long").alias("produced"))
        .withColumn("compacted", F.col("produced") > F.col("records"))
        .orderBy("topic", "date")
    )
    staged = Path(str(daily_dir) + NEXT)
    daily.coalesce(1).write.mode("overwrite").parquet(str(staged))
    return staged


def parse_schemas(items: list[str]) -> dict[str, str]:
    """`TOPIC=SCHEMA` arguments as a dict; ValueError for one without `=` or a topic twice."""
    out: dict[str, str] = {}
    for item in items:
        topic, sep, schema = item.partition("=")
        if not sep or not topic.strip() or not schema.strip():
            raise ValueError(f"--schema {item!r}: expected TOPIC=SCHEMA (Spark DDL, or a DDL or JSON Schema file)")
        if topic.strip() in out:
            raise ValueError(f"--schema: topic {topic.strip()!r} given twice")
        out[topic.strip()] = schema.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: the session comes from spark-submit's configuration."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", required=True, help="a snapshot directory, or a directory of them (the newest is read)")
    parser.add_argument("--out", required=True, help="output directory (Parquet)")
    parser.add_argument("--topics", help="comma-separated topics (default: every user topic)")
    parser.add_argument("--full", action="store_true", help="forget the watermarks: rebuild every output")
    parser.add_argument("--schema", action="append", default=[], metavar="TOPIC=SCHEMA",
                        help="a topic's value schema (Spark DDL, or a DDL or JSON Schema file): typed table columns")
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("eventlog-nightly").getOrCreate()
    wanted = [t.strip() for t in args.topics.split(",") if t.strip()] if args.topics else None
    result = run_nightly(spark, args.snapshot, args.out, topics=wanted, full=args.full, schemas=parse_schemas(args.schema),
                         step=lambda d: print(f"nightly: {d}", flush=True))
    print(json.dumps(asdict(result), indent=2))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
