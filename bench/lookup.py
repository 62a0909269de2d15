"""Offset and time lookup latency on a 10 M-record partition, in-process.

What is measured. Two partitions of 10 M records with 100-byte values where record n has
timestamp T0 + n ms, so every answer can be checked:

* 100 records per batch (100,000 batches, ~11 KiB each): what Kafka producers send with the
  default batch.size of 16 KiB. The goal is judged here.
* 1,000 records per batch (10,000 batches, ~110 KiB each): informational. A time lookup must
  walk the records of the one batch holding the answer (varint-encoded, so only in order), and
  in Python that walk costs about 0.4 us per record.

With a warm page cache and warmed-up index mappings, each call is timed with
time.perf_counter_ns:

* offset lookup: reader.fetch_slice(view, offset, max_bytes=1) for a uniformly random offset,
  i.e. locate the batch holding it (segment bisect, offset index search, header scan) and
  cut a one-batch slice; nothing is read beyond headers.
* time lookup: reader.offset_for_timestamp(view, ts) for a uniformly random timestamp
  (Kafka's ListOffsets): segment by largest timestamp, time index, offset index, header scan,
  then the first record with timestamp >= ts inside the batch.
* floor: os.pread of one 61-byte batch header at a random batch position of a segment file,
  the least I/O a lookup can do.

Calls run on the event-loop thread with the writer idle and the garbage collector enabled, as
in the service. Goal: p99 <= 50 us for both lookups. Results: p50, p90, p99, p99.9, max in us.
"""

from __future__ import annotations

import gc
import os
import random
import time
from pathlib import Path
from typing import Any

import anyio

from engine import reader
from engine.log_manager import EngineConfig, open_engine

from . import data
from .harness import MB, Context, percentiles_us, pread_files, remove_tree, summary_row, time_each

NAME = "lookup"
TITLE = "offset and time lookup latency (p50/p99) on a 10 M-record partition"

RECORD_BYTES = 100
BATCH_SHAPES = (100, 1000)  # records per batch; the goal is judged on the first
GOAL_SHAPE = 100
APPEND_RECORDS = 100_000  # records per append while filling
GOAL_P99_US = 50.0
SEED = 20240611


def params(quick: bool) -> dict[str, Any]:
    return {
        "records": 1_000_000 if quick else 10_000_000,
        "records_per_batch": list(BATCH_SHAPES),
        "record_bytes": RECORD_BYTES,
        "samples": 2_000 if quick else 10_000,
        "warmup_samples": 2000,
        "fetch_max_bytes": 1,
        "topic_config": "defaults (segment.bytes=1 GiB, index.interval.bytes=4096)",
        "timestamps": "record n has T0 + n ms (T0 = 1700000000000)",
        "page_cache": "warm",
        "gc": "enabled; gc.freeze() after setup, as the service does after start-up",
        "seed": SEED,
    }


def run(ctx: Context) -> dict[str, Any]:
    return anyio.run(_run, ctx)


async def _run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    results: dict[str, Any] = {}
    rows = []
    for per_batch in BATCH_SHAPES:
        key = f"batch{per_batch}"
        results[key] = await _measure(ctx, p, per_batch)
        r = results[key]
        floor = r["header_pread_floor"]
        goal = per_batch == GOAL_SHAPE
        for lookup, label in (("offset_lookup", "offset lookup (fetch_slice)"), ("time_lookup", "time lookup (offset_for_timestamp)")):
            rows.append(
                summary_row(
                    f"{label} p99 (p50), {r['partition']['records'] / 1e6:g} M records, {per_batch} per batch",
                    f"{r[lookup]['p99_us']:.1f} us ({r[lookup]['p50_us']:.1f} us)",
                    f"goal 50 us; 61-byte pread p99 {floor['p99_us']:.1f} us",
                    r[lookup]["p99_us"] / GOAL_P99_US,
                    "p99 / 50 us <= 1" if goal else "(informational)",
                    r[lookup]["p99_us"] <= GOAL_P99_US if goal else None,
                )
            )
    results["goal_p99_us"] = GOAL_P99_US
    results["goal_records_per_batch"] = GOAL_SHAPE
    return {"params": p, "results": results, "summary": rows}


async def _measure(ctx: Context, p: dict[str, Any], per_batch: int) -> dict[str, Any]:
    work = ctx.scratch(f"{NAME}-{per_batch}")
    rng = random.Random(SEED + per_batch)
    batches = p["records"] // per_batch
    per_append = max(1, APPEND_RECORDS // per_batch)
    try:
        async with open_engine(EngineConfig(log_dirs=(work / "data",))) as engine:
            await engine.create_topic("bench", 1)
            log = engine.partition("bench", 0)
            template = data.encode_records_batch(RECORD_BYTES, per_batch, data.T0_MS)
            begin = time.perf_counter()

            def bodies():
                for first in range(0, batches, per_append):
                    last = min(first + per_append, batches)
                    yield b"".join(data.retimed(template, data.T0_MS + k * per_batch) for k in range(first, last))

            written = await data.fill(log, bodies(), producers=1)
            view = log.view
            records = view.high_watermark
            ctx.log(
                f"lookup: wrote {records:,} records ({per_batch} per batch), {written / MB:,.0f} MB in "
                f"{len(view.segments)} segment(s) ({time.perf_counter() - begin:.1f} s)"
            )

            def offset_lookup(offset: int) -> None:
                slice_ = reader.fetch_slice(view, offset, 1)
                assert slice_ is not None and slice_.first_batch_offset <= offset < slice_.next_offset

            def time_lookup(timestamp: int) -> None:
                found = reader.offset_for_timestamp(view, timestamp)
                assert found == (timestamp - data.T0_MS, timestamp), (timestamp, found)

            fds = [os.open(s.log_path, os.O_RDONLY) for s in view.segments]
            positions = [  # every batch start (all batches have the template's size)
                (fds[i], pos)
                for i in range(len(view.segments))
                for pos in range(0, view.end_position(i), len(template))
            ]

            def header_pread(target: tuple[int, int]) -> None:
                os.pread(target[0], 61, target[1])

            # Warm page cache and index mappings, as in a service that has been answering
            # lookups for a while: read every segment file once (the first read of a page
            # just written costs up to ~200 us on this kernel, measured), and fault in every
            # page of every index.
            pread_files([s.log_path for s in view.segments])
            for segment in view.segments:
                segment.offset_index.view().tobytes()
                segment.time_index.view().tobytes()
            results: dict[str, Any] = {}
            try:
                n, warm = p["samples"], p["warmup_samples"]
                offsets = [rng.randrange(records) for _ in range(n + warm)]
                stamps = [data.T0_MS + rng.randrange(records) for _ in range(n + warm)]
                targets = [rng.choice(positions) for _ in range(n + warm)]
                for key, fn, args in (
                    ("offset_lookup", offset_lookup, offsets),
                    ("time_lookup", time_lookup, stamps),
                    ("header_pread_floor", header_pread, targets),
                ):
                    time_each(fn, args[:warm])
                    gc.collect()
                    gc.freeze()  # as the service does after start-up (app/lifespan.py)
                    samples = time_each(fn, args[warm:])
                    results[key] = percentiles_us(samples)
                    ctx.log(
                        f"lookup {per_batch}/batch {key}: p50 {results[key]['p50_us']:.1f} us, "
                        f"p99 {results[key]['p99_us']:.1f} us, max {results[key]['max_us']:.0f} us"
                    )
            finally:
                gc.unfreeze()
                for fd in fds:
                    os.close(fd)
            segments = len(view.segments)
    finally:
        remove_tree(work)
    results["partition"] = {
        "records": records,
        "records_per_batch": per_batch,
        "batches": batches,
        "bytes": written,
        "segments": segments,
        "batch_bytes": len(template),
    }
    return results


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    results = report["results"]
    shapes = [k for k in results if k.startswith("batch")]
    series = [
        ("offset_lookup", "offset lookup\nfetch_slice(max_bytes=1)", "tab:blue"),
        ("time_lookup", "time lookup\noffset_for_timestamp", "tab:orange"),
        ("header_pread_floor", "floor: pread of\none 61-byte header", "grey"),
    ]
    stats = ["p50_us", "p90_us", "p99_us", "p999_us", "max_us"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(7 * len(shapes), 5.5), sharey=True, squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        r = results[shape]
        width = 0.26
        for i, (key, label, color) in enumerate(series):
            xs = [j + (i - 1) * width for j in range(len(stats))]
            values = [r[key][s] for s in stats]
            bars = ax.bar(xs, values, width, label=label, color=color)
            for bar, value in zip(bars, values):
                ax.annotate(
                    f"{value:.0f}" if value >= 10 else f"{value:.1f}",
                    (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=7,
                )
        ax.axhline(GOAL_P99_US, color="red", linestyle="--", label="goal: p99 <= 50 us")
        ax.set_yscale("log")
        ax.set_xticks(range(len(stats)))
        ax.set_xticklabels(["p50", "p90", "p99", "p99.9", "max"])
        part = r["partition"]
        judged = " (goal)" if part["records_per_batch"] == GOAL_SHAPE else " (informational)"
        ax.set_title(
            f"{part['records']:,} records, {part['records_per_batch']} per batch{judged}\n"
            f"{part['batches']:,} batches of {part['batch_bytes']:,} B, {part['segments']} segment(s); "
            f"{r['offset_lookup']['count']:,} samples each",
            fontsize=9,
        )
    axes[0][0].set_ylabel("latency, us (log scale)")
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(f"lookup, {report['mode']} run, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
