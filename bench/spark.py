"""spark: rows/s of spark.read.format("eventlog") next to spark.read.parquet of the same rows.

A topic of 2 partitions in several segments is written with the engine (keyed records, 100-byte
values, 200 records per batch, keys drawn from ~N/10 distinct keys, 1% tombstones, one header
per record), snapshotted with engine.snapshots.take_snapshot, then read in ONE local
SparkSession (local[2], 2g): the snapshot is written to Parquet by Spark itself
(spark.read.format("eventlog").load(snap).write.parquet(...)), so both sides hold exactly the
same rows, and these queries are timed in alternation (the order swaps every repeat):

* full: df.agg(count(*), sum(length(value)), max(offset), sum(size(headers))): every column
  decoded and handed to the JVM;
* value: df.agg(sum(length(value))): one column (Parquet prunes the others; eventlog cannot);
* compacted: spark.read.format("eventlog").option("compacted", "true").load(snap).count()
  next to analytics.latest_per_key(spark.read.parquet(...)).count() (a Window row_number over
  (topic, partition, key) ordered by offset desc, rn == 1 and value not null);
* compacted (DataFrame layer): analytics.latest_per_key(eventlog df).count(), the same Window
  on the eventlog source, next to the same Parquet figure;
* full and value (cached): the same two queries on analytics.load(spark, snap, cache=...), which
  reads the segments' Parquet cache files with Spark's own reader (analytics/cache.py; the
  cache is written once before the timed runs, and that time is reported as cache_build_s);
* full (floor): the full scan through a Python data source that only reads those Parquet files
  with pyarrow and yields their batches (bench/spark_floor.py): how fast any Python data source
  can hand rows to Spark here, decoding aside. Reported, not a goal.

Rows/s = rows of the snapshot (the rows each query scans) / median seconds; the ratio is the
median of eventlog over the median of Parquet. Goal: >= 1.0 of Parquet.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import anyio

from engine import snapshots
from engine.log_manager import EngineConfig, open_engine
from engine.records import encode_batch

from . import data
from .harness import MB, Context, median, remove_tree, summary_row

NAME = "spark"
TITLE = 'spark.read.format("eventlog") vs spark.read.parquet of the same rows (scan and compacted view)'

GOAL_RATIO = 1.0
PARTITIONS = 2
VALUE_BYTES = 100
RECORDS_PER_BATCH = 200
BATCHES_PER_APPEND = 50  # one fsync per 10,000 records while filling
TOMBSTONE_FRACTION = 0.01
TOPIC = "events"

QUERIES = ("full", "value", "compacted", "compacted_df", "full_cached", "value_cached", "full_floor")
GOALS = ("full", "value", "compacted", "compacted_df", "full_cached", "value_cached")  # the floor is a bound, not a goal
QUERY_LABELS = {
    "full_cached": "analytics.load(cache=...) full scan",
    "value_cached": "analytics.load(cache=...) sum(length(value)) only",
    "full_floor": "full scan through a Python data source yielding the cache's Parquet batches (the floor)",
    "full": "full scan: count, sum(length(value)), max(offset), sum(size(headers))",
    "value": "sum(length(value)) only",
    "compacted": 'compacted view: option("compacted", "true").count() vs Parquet Window',
    "compacted_df": "latest_per_key(eventlog df).count() vs Parquet Window",
}


def params(quick: bool) -> dict[str, Any]:
    records = 200_000 if quick else 1_000_000
    return {
        "records": records,
        "partitions": PARTITIONS,
        "distinct_keys": records // 10,
        "value_bytes": VALUE_BYTES,
        "records_per_batch": RECORDS_PER_BATCH,
        "tombstone_fraction": TOMBSTONE_FRACTION,
        "headers_per_record": 1,
        "segment_bytes": (4 if quick else 16) * (1 << 20),
        "repeats": 3,  # after one warm-up run of each side
        "master": "local[2]",
        "driver_memory": "2g",
    }


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    try:
        begin = time.perf_counter()
        snap, written = anyio.run(_write_snapshot, ctx, work, p)
        ctx.log(
            f"spark: wrote {p['records']:,} records ({written['log_bytes'] / MB:,.0f} MB in "
            f"{written['segments']} segments) and took a snapshot in {time.perf_counter() - begin:.1f} s"
        )
        results = _measure(ctx, work, snap, p)
        results["written"] = written
    finally:
        remove_tree(work)
    rows = []
    for q in GOALS:
        r = results["queries"][q]
        rows.append(summary_row(
            f"{QUERY_LABELS[q]}, rows/s ({p['records']:,} rows)",
            f"{r['eventlog_rows_per_s']:,.0f} rows/s",
            f"Parquet {r['parquet_rows_per_s']:,.0f} rows/s",
            r["ratio"],
            f">= {GOAL_RATIO:.1f}",
            r["ratio"] >= GOAL_RATIO,
        ))
    return {"params": p, "results": results, "summary": rows}


async def _write_snapshot(ctx: Context, work: Path, p: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    rng = random.Random(42)
    records_per_partition = p["records"] // PARTITIONS
    batches_per_partition = records_per_partition // RECORDS_PER_BATCH
    async with open_engine(EngineConfig(log_dirs=(work / "data",))) as engine:
        await engine.create_topic(TOPIC, PARTITIONS, {"segment.bytes": p["segment_bytes"], "retention.ms": -1})
        written = 0
        segments = 0
        ts = data.T0_MS
        for partition in range(PARTITIONS):
            log = engine.partition(TOPIC, partition)

            def bodies():
                nonlocal ts
                body = bytearray()
                for b in range(batches_per_partition):
                    recs = []
                    for _ in range(RECORDS_PER_BATCH):
                        key = b"key-%08d" % rng.randrange(p["distinct_keys"])
                        if rng.random() < TOMBSTONE_FRACTION:
                            value = None
                        else:
                            value = rng.randbytes(VALUE_BYTES)  # incompressible, as in data.value_bytes
                        recs.append((key, value, ts, (("source", b"bench"),)))
                        ts += 1
                    body += encode_batch(0, recs)
                    if (b + 1) % BATCHES_PER_APPEND == 0:
                        yield bytes(body)
                        body = bytearray()
                if body:
                    yield bytes(body)

            written += await data.fill(log, bodies(), producers=1)
            segments += len(log.view.segments)
        state = engine.topic(TOPIC)
        info = snapshots.TopicInfo(TOPIC, state.meta.topic_id, False, state.config.to_kafka(), list(state.partitions))
        manifest = await snapshots.take_snapshot(work / "snapshots", [info], engine.clock())
    return work / "snapshots" / manifest["snapshot_id"], {"log_bytes": written, "segments": segments}


def _measure(ctx: Context, work: Path, snap: Path, p: dict[str, Any]) -> dict[str, Any]:
    import os

    from pyspark import __version__ as pyspark_version
    from pyspark.sql import functions as F

    from analytics import cache, latest_per_key
    from analytics.session import local_session

    # the Python workers import bench.spark_floor (the floor source) from the repository
    repo = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    begin = time.perf_counter()
    spark = local_session("bench-spark", master=p["master"], memory=p["driver_memory"])
    session_s = time.perf_counter() - begin
    from .spark_floor import ParquetFloorSource

    spark.dataSource.register(ParquetFloorSource)
    try:
        parquet_dir = work / "parquet"
        begin = time.perf_counter()
        spark.read.format("eventlog").load(str(snap)).write.parquet(str(parquet_dir))
        parquet_write_s = time.perf_counter() - begin
        parquet_bytes = sum(f.stat().st_size for f in parquet_dir.rglob("*.parquet"))
        ctx.log(f"spark: session in {session_s:.1f} s; wrote Parquet ({parquet_bytes / MB:,.0f} MB) in {parquet_write_s:.1f} s")

        segments = work / "segments"
        begin = time.perf_counter()
        cache.load(spark, snap, cache=segments)
        cache_build_s = time.perf_counter() - begin
        ctx.log(f"spark: segment cache ({sum(f.stat().st_size for f in segments.rglob('*.parquet')) / MB:,.0f} MB) built in {cache_build_s:.1f} s")

        def ev():
            return spark.read.format("eventlog").load(str(snap))

        def cached():
            return cache.load(spark, snap, cache=segments)

        def floor():
            return spark.read.format("parquet-floor").load(str(segments))

        def pq():
            return spark.read.parquet(str(parquet_dir))

        def full(df):
            return df.agg(
                F.count(F.lit(1)), F.sum(F.length("value")), F.max("offset"), F.sum(F.size("headers"))
            ).collect()[0]

        def value(df):
            return df.agg(F.sum(F.length("value"))).collect()[0]

        queries = {
            "full": (lambda: tuple(full(ev())), lambda: tuple(full(pq()))),
            "value": (lambda: tuple(value(ev())), lambda: tuple(value(pq()))),
            "compacted": (
                lambda: spark.read.format("eventlog").option("compacted", "true").load(str(snap)).count(),
                lambda: latest_per_key(pq()).count(),
            ),
            "compacted_df": (
                lambda: latest_per_key(ev()).count(),
                lambda: latest_per_key(pq()).count(),
            ),
            "full_cached": (lambda: tuple(full(cached())), lambda: tuple(full(pq()))),
            "value_cached": (lambda: tuple(value(cached())), lambda: tuple(value(pq()))),
            "full_floor": (lambda: tuple(full(floor())), lambda: tuple(full(pq()))),
        }
        out: dict[str, Any] = {}
        for q, (ev_fn, pq_fn) in queries.items():
            # warm-up of both (JIT, Python workers), and the answers must agree
            a, b = ev_fn(), pq_fn()
            assert a == b, (q, a, b)
            times: dict[str, list[float]] = {"eventlog": [], "parquet": []}
            for i in range(p["repeats"]):
                order = (("eventlog", ev_fn), ("parquet", pq_fn))
                for label, fn in order if i % 2 == 0 else order[::-1]:
                    begin = time.perf_counter()
                    fn()
                    times[label].append(time.perf_counter() - begin)
            ev_s, pq_s = median(times["eventlog"]), median(times["parquet"])
            out[q] = {
                "answer": list(a) if isinstance(a, tuple) else a,
                "seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
                "median_eventlog_s": round(ev_s, 4),
                "median_parquet_s": round(pq_s, 4),
                "best_eventlog_s": round(min(times["eventlog"]), 4),
                "best_parquet_s": round(min(times["parquet"]), 4),
                "eventlog_rows_per_s": round(p["records"] / ev_s),
                "parquet_rows_per_s": round(p["records"] / pq_s),
                "ratio": round(pq_s / ev_s, 3),
            }
            ctx.log(
                f"spark {q}: eventlog {ev_s:.2f} s ({p['records'] / ev_s:,.0f} rows/s), parquet {pq_s:.2f} s "
                f"({p['records'] / pq_s:,.0f} rows/s): {pq_s / ev_s:.2f} x Parquet; answer {out[q]['answer']}"
            )
    finally:
        spark.stop()
    return {
        "pyspark": pyspark_version,
        "session_start_s": round(session_s, 2),
        "parquet_write_s": round(parquet_write_s, 2),
        "cache_build_s": round(cache_build_s, 2),
        "parquet_bytes": parquet_bytes,
        "queries": out,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    p = report["params"]
    r = report["results"]["queries"]
    names = [q for q in QUERIES if q in r]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.38
    xs = range(len(names))
    for j, (key, label, color) in enumerate((
        ("eventlog", 'format("eventlog")', "tab:blue"),
        ("parquet", "read.parquet", "grey"),
    )):
        pos = [x + (j - 0.5) * width for x in xs]
        ax.bar(pos, [r[q][f"{key}_rows_per_s"] for q in names], width, label=label, color=color)
        for x, q in zip(pos, names, strict=True):  # every run as a dot
            ax.scatter([x] * len(r[q]["seconds"][key]), [p["records"] / s for s in r[q]["seconds"][key]],
                       color="black", s=8, zorder=3)
    short = {"full": "full scan\n(all columns)", "value": "sum(length(value))", "compacted": "compacted view\n(option)",
             "compacted_df": "latest_per_key\n(eventlog df)", "full_cached": "load(cache)\nfull scan",
             "value_cached": "load(cache)\nvalue", "full_floor": "floor: DS of\nParquet batches"}
    ax.set_xticks(list(xs))
    ax.set_xticklabels([short[q] for q in names], fontsize=8)
    ax.set_ylabel("rows/s (median; dots = runs)")
    ax.set_title(f"{p['records']:,} rows, one local[2] session", fontsize=10)
    ax.legend(fontsize=8)
    ax2.bar(list(xs), [r[q]["ratio"] for q in names], color="tab:blue")
    ax2.axhline(GOAL_RATIO, color="red", linestyle="--", label="goal 1.0")
    ax2.set_xticks(list(xs))
    ax2.set_xticklabels([short[q] for q in names], fontsize=7)
    ax2.set_ylabel("eventlog / Parquet (rows/s)")
    ax2.legend(fontsize=8)
    fig.suptitle("spark.read.format(\"eventlog\") vs spark.read.parquet of the same rows", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
