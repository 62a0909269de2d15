"""Snapshot time for 1,000 segments, against linking and copying the same files with cp.

What is measured. One partition of 1,000 closed segments plus an active one, written through
the engine, in two sizes: small segments (64 KiB each; quick: 16 KiB) and large ones (1 MiB;
quick: 256 KiB), the same number of files, so that the ratio of the two shows whether the
cost follows segments or bytes. For each, engine.snapshots.take_snapshot (what POST
/v1/snapshots runs: capture the view under the files lock, hard-link 3 files per closed
segment, copy the active segment's prefix and index it, fsync, write manifest.json) is timed
several times, next to the same run's peers on the same directory:

* `cp -al` of the partition directory: hard-linking the same files, the floor of any
  link-based snapshot;
* `cp -r` of it: copying the bytes, what a snapshot that copied would cost.

Goal: a snapshot of 1,000 segments in < 1 s.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio

from engine import snapshots
from engine.log_manager import EngineConfig, open_engine

from . import data
from .harness import MB, Context, median, remove_tree, summary_row

KiB = 1024

NAME = "snapshot"
TITLE = "snapshot of 1,000 segments vs cp -al (links) and cp -r (copies) of the same files"

SEGMENTS = 1000
GOAL_SECONDS = 1.0
RECORD_BYTES = 1024
RECORDS_PER_BATCH = 15


def params(quick: bool) -> dict[str, Any]:
    return {
        "segments": SEGMENTS,
        "segment_bytes": {"small": (16 if quick else 64) * KiB, "large": (256 if quick else 1024) * KiB},
        "repeats": 3 if quick else 5,
        "record_bytes": RECORD_BYTES,
        "records_per_batch": RECORDS_PER_BATCH,
    }


def run(ctx: Context) -> dict[str, Any]:
    return anyio.run(_run, ctx)


async def _run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    results: dict[str, Any] = {}
    batch = data.encode_records_batch(RECORD_BYTES, RECORDS_PER_BATCH)
    for label, segment_bytes in p["segment_bytes"].items():
        work = ctx.scratch(f"{NAME}-{label}")
        try:
            results[label] = await _measure(ctx, work, segment_bytes, bytes(batch), p["repeats"])
        finally:
            remove_tree(work)
        r = results[label]
        ctx.log(
            f"snapshot {label}: {r['segments']} segments, {r['bytes'] / MB:,.0f} MB: snapshot "
            f"{r['median_snapshot_s'] * 1000:,.0f} ms, cp -al {r['median_cp_al_s'] * 1000:,.0f} ms, "
            f"cp -r {r['median_cp_r_s'] * 1000:,.0f} ms"
        )
    small, large = results["small"], results["large"]
    rows = []
    for label, r in results.items():
        rows.append(summary_row(
            f"snapshot of {r['segments']} segments ({r['bytes'] / MB:,.0f} MB, {label} segments), seconds",
            f"{r['median_snapshot_s']:.3f} s",
            f"cp -al {r['median_cp_al_s']:.3f} s; cp -r {r['median_cp_r_s']:.3f} s",
            r["median_snapshot_s"] / GOAL_SECONDS,
            f"<= 1 (goal {GOAL_SECONDS:.0f} s)",
            r["median_snapshot_s"] <= GOAL_SECONDS,
        ))
    growth = large["median_snapshot_s"] / small["median_snapshot_s"]
    rows.append(summary_row(
        f"snapshot time, {large['bytes'] / small['bytes']:.0f} x the bytes in as many segments",
        f"{growth:.2f} x",
        f"cp -r {large['median_cp_r_s'] / small['median_cp_r_s']:.2f} x; cp -al "
        f"{large['median_cp_al_s'] / small['median_cp_al_s']:.2f} x",
        growth,
        "(informational: ~1 when cost follows segments)",
        None,
    ))
    return {"params": p, "results": results, "summary": rows}


async def _measure(ctx: Context, work: Path, segment_bytes: int, batch: bytes, repeats: int) -> dict[str, Any]:
    per_segment = max(1, segment_bytes // len(batch))
    async with open_engine(EngineConfig(log_dirs=(work / "data",))) as engine:
        await engine.create_topic("bench", 1, {"segment.bytes": segment_bytes, "retention.ms": -1})
        log = engine.partition("bench", 0)
        body = batch * per_segment
        begin = time.perf_counter()
        await data.fill(log, (body for _ in range(SEGMENTS + 1)), producers=1)
        segments = len(log.view.segments) - 1
        size = log.view.size_bytes
        ctx.log(f"snapshot: wrote {size / MB:,.0f} MB in {segments} closed segments ({time.perf_counter() - begin:.1f} s)")
        state = engine.topic("bench")
        info = snapshots.TopicInfo("bench", state.meta.topic_id, False, state.config.to_kafka(), list(state.partitions))
        root = work / "snapshots"
        source = log.directory
        times: dict[str, list[float]] = {"snapshot": [], "cp_al": [], "cp_r": []}
        for i in range(repeats):
            begin = time.perf_counter()
            manifest = await snapshots.take_snapshot(root, [info], engine.clock())
            times["snapshot"].append(time.perf_counter() - begin)
            assert len(manifest["topics"][0]["partitions"][0]["segments"]) >= segments
            shutil.rmtree(root / manifest["snapshot_id"])
            for tool, flag in (("cp_al", "-al"), ("cp_r", "-r")):
                target = work / f"{tool}-{i}"
                begin = time.perf_counter()
                subprocess.run(["cp", flag, str(source), str(target)], check=True)
                if tool == "cp_r":
                    subprocess.run(["sync", "-f", str(target)], check=True)  # the snapshot fsyncs too
                times[tool].append(time.perf_counter() - begin)
                shutil.rmtree(target)
    return {
        "segment_bytes": segment_bytes,
        "segments": segments,
        "bytes": size,
        "seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "median_snapshot_s": round(median(times["snapshot"]), 4),
        "median_cp_al_s": round(median(times["cp_al"]), 4),
        "median_cp_r_s": round(median(times["cp_r"]), 4),
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    r = report["results"]
    labels = list(r)
    fig, ax = plt.subplots(figsize=(8, 5))
    width = 0.25
    for j, (key, name, color) in enumerate((
        ("median_snapshot_s", "eventlog snapshot", "tab:blue"),
        ("median_cp_al_s", "cp -al (links)", "grey"),
        ("median_cp_r_s", "cp -r + sync (copies)", "tab:orange"),
    )):
        xs = [i + (j - 1) * width for i in range(len(labels))]
        ax.bar(xs, [r[label][key] for label in labels], width, label=name, color=color)
    ax.axhline(GOAL_SECONDS, color="red", linestyle="--", label="goal 1 s")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([f"{r[label]['segments']} segments\n{r[label]['bytes'] / MB:,.0f} MB" for label in labels])
    ax.set_ylabel("seconds (median)")
    ax.set_yscale("log")
    ax.set_title("snapshot of one partition of 1,000 segments", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
