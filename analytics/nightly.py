"""The nightly job: a snapshot in, Parquet out.

For each compacted topic in the snapshot, the table view — the latest record per key,
tombstones removed — as Parquet in `<out>/tables/<topic>/`; for every topic read, the records
and bytes (key + value + header values) per UTC day in `<out>/daily/` (columns topic, date,
records, bytes); and `<out>/_SUMMARY.json`, written last, saying what the run produced from
which snapshot. Outputs are replaced, so a run can be repeated.

Run it with `eventlog nightly --snapshot PATH --out DIR` (a local Spark session, with a progress
display), or on a cluster with spark-submit (the eventlog package installed on the executors,
see docs/ANALYTICS.md):

    spark-submit analytics/nightly.py --snapshot /snapshots/<id> --out /warehouse/eventlog
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analytics import register


@dataclass
class TopicOutput:
    topic: str
    compacted: bool
    table_rows: int | None  # rows of the table view (compacted topics)
    table_path: str | None


@dataclass
class NightlyResult:
    snapshot_id: str
    snapshot_path: str
    out: str
    topics: list[TopicOutput] = field(default_factory=list)
    daily_rows: int = 0
    seconds: float = 0.0


def resolve_snapshot(path: str | Path) -> Path:
    """A snapshot directory, or a directory of snapshots: then the newest finished one (ids sort
    by creation time)."""
    path = Path(path)
    if (path / "manifest.json").exists():
        return path
    finished = sorted(p for p in path.iterdir() if p.is_dir() and (p / "manifest.json").exists()) if path.is_dir() else []
    if not finished:
        raise FileNotFoundError(f"{path} is neither a snapshot (no manifest.json) nor a directory of snapshots")
    return finished[-1]


def snapshot_topics(snapshot: Path, wanted: list[str] | None = None) -> list[dict[str, Any]]:
    """The manifest's topics to process: the named ones, or every non-internal topic."""
    manifest = json.loads((snapshot / "manifest.json").read_text())
    topics = manifest["topics"]
    if wanted is not None:
        known = {t["name"] for t in topics}
        missing = [t for t in wanted if t not in known]
        if missing:
            raise ValueError(f"not in snapshot {manifest['snapshot_id']}: {', '.join(missing)}")
        return [t for t in topics if t["name"] in wanted]
    return [t for t in topics if not t.get("internal")]


def run_nightly(
    spark,
    snapshot: str | Path,
    out: str | Path,
    *,
    topics: list[str] | None = None,
    step: Callable[[str], None] | None = None,
) -> NightlyResult:
    """Run the job; `step(description)` is called as each step starts (for a progress display)."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    snapshot = resolve_snapshot(snapshot)
    out = Path(out)
    manifest = json.loads((snapshot / "manifest.json").read_text())
    chosen = snapshot_topics(snapshot, topics)
    result = NightlyResult(manifest["snapshot_id"], str(snapshot), str(out))
    step = step or (lambda _d: None)
    register(spark)

    def reader():  # a fresh reader per load: options set on a DataFrameReader stay set
        return spark.read.format("eventlog")

    for topic in chosen:
        name = topic["name"]
        compacted = "compact" in topic["cleanup_policy"].split(",")
        if not compacted:
            result.topics.append(TopicOutput(name, False, None, None))
            continue
        step(f"table view of {name}")
        table = reader().option("topics", name).option("compacted", "true").load(str(snapshot))
        path = out / "tables" / name
        table.drop("topic").write.mode("overwrite").parquet(str(path))
        rows = spark.read.parquet(str(path)).count()
        result.topics.append(TopicOutput(name, True, rows, str(path)))
    if chosen:
        step("daily counts and bytes")
        names = ",".join(t["name"] for t in chosen)
        records = reader().option("topics", names).load(str(snapshot))
        header_bytes = F.aggregate(
            F.col("headers"), F.lit(0).cast("long"),
            lambda acc, h: acc + F.coalesce(F.length(h["value"]), F.lit(0)) + F.length(h["key"]),
        )
        daily = (
            records.withColumn("date", F.to_date(F.col("timestamp")))
            .withColumn(
                "size",
                F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0)) + header_bytes,
            )
            .groupBy("topic", "date")
            .agg(F.count(F.lit(1)).alias("records"), F.sum("size").cast("long").alias("bytes"))
            .orderBy("topic", "date")
        )
        daily_path = out / "daily"
        daily.coalesce(1).write.mode("overwrite").parquet(str(daily_path))
        result.daily_rows = spark.read.parquet(str(daily_path)).count()
    result.seconds = round(time.perf_counter() - started, 3)
    out.mkdir(parents=True, exist_ok=True)
    (out / "_SUMMARY.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: the session comes from spark-submit's configuration."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", required=True, help="a snapshot directory, or a directory of them (the newest is read)")
    parser.add_argument("--out", required=True, help="output directory (Parquet)")
    parser.add_argument("--topics", help="comma-separated topics (default: every user topic)")
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("eventlog-nightly").getOrCreate()
    wanted = [t.strip() for t in args.topics.split(",") if t.strip()] if args.topics else None
    result = run_nightly(spark, args.snapshot, args.out, topics=wanted, step=lambda d: print(f"nightly: {d}", flush=True))
    print(json.dumps(asdict(result), indent=2))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
