"""Sequential read of raw batches through the engine, against os.pread of the same files.

What is measured. A partition of Kafka-producer-sized batches (15 records of 1 KiB, about
16 KiB each, Kafka's default batch.size) is read from the log start to the high watermark
in fetches of max_bytes = 1 MiB, the raw batch bytes being what a consumer fetch returns:

* engine (sync): reader.fetch_slice(view, offset, 1 MiB) + FetchSlice.read(), following
  next_offset, in one thread: the engine's own cost.
* engine (async): PartitionLog.fetch_slice + await read_slice, the path the HTTP API takes
  (reads above 64 KiB hop to a worker thread).
* peer: the same segment files read start to end with os.pread in 1 MiB chunks.

All three read with a warm page cache: every file is read once before timing, and the data
fits in memory many times over, so this measures CPU cost per byte, not the disk. Passes
alternate (pread, sync, async, repeat) and medians are compared. Goal: engine >= 0.5 of pread.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio

from engine import reader
from engine.log_manager import EngineConfig, open_engine
from engine.partition_log import PartitionLog

from . import data
from .harness import MB, Context, MiB, median, pread_files, remove_tree, summary_row

NAME = "read"
TITLE = "sequential fetch of raw batches (1 MiB max_bytes) vs os.pread, warm page cache"

FETCH_MAX_BYTES = MiB
RECORDS_PER_BATCH = 15
RECORD_BYTES = 1024
BATCHES_PER_APPEND = 64
GOAL_RATIO = 0.5


def params(quick: bool) -> dict[str, Any]:
    total = (512 if quick else 2048) * MiB
    return {
        "data_bytes": total,
        "segment_bytes": total // 8,
        "record_bytes": RECORD_BYTES,
        "records_per_batch": RECORDS_PER_BATCH,
        "fetch_max_bytes": FETCH_MAX_BYTES,
        "pread_chunk_bytes": MiB,
        "passes": 10 if quick else 15,
        "page_cache": "warm (each file read once before timing; data << RAM)",
    }


def run(ctx: Context) -> dict[str, Any]:
    return anyio.run(_run, ctx)


async def _run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    try:
        async with open_engine(EngineConfig(log_dirs=(work / "data",))) as engine:
            await engine.create_topic("bench", 1, {"segment.bytes": p["segment_bytes"]})
            log = engine.partition("bench", 0)
            batch = data.encode_records_batch(RECORD_BYTES, RECORDS_PER_BATCH)
            body = bytes(batch) * BATCHES_PER_APPEND
            appends = p["data_bytes"] // len(body)
            begin = time.perf_counter()
            await data.fill(log, (body for _ in range(appends)), producers=2)
            ctx.log(
                f"read: wrote {appends * len(body) / MB:,.0f} MB in {len(log.view.segments)} segments "
                f"({time.perf_counter() - begin:.1f} s)"
            )
            files = [s.log_path for s in log.view.segments]
            file_bytes = sum(f.stat().st_size for f in files)
            pread_files(files)  # warm the page cache
            _engine_sync(log)
            runs: dict[str, list[float]] = {"pread": [], "engine_sync": [], "engine_async": []}
            for _ in range(p["passes"]):
                for name, rates in runs.items():
                    begin = time.perf_counter()
                    if name == "pread":
                        size = pread_files(files)
                    elif name == "engine_sync":
                        size, fetches = _engine_sync(log)
                    else:
                        size, fetches = await _engine_async(log)
                    elapsed = time.perf_counter() - begin
                    if size != file_bytes:
                        raise AssertionError(
                            f"{name} read {size} bytes, the files hold {file_bytes}"
                        )
                    rates.append(size / elapsed / MB)
                ctx.log(
                    "read pass: " + ", ".join(f"{k} {v[-1]:,.0f} MB/s" for k, v in runs.items())
                )
            segments = len(files)
            batches = log.high_watermark // RECORDS_PER_BATCH
    finally:
        remove_tree(work)
    pread_mb_s = median(runs["pread"])
    results: dict[str, Any] = {
        "bytes_read_per_pass": file_bytes,
        "segments": segments,
        "batches": batches,
        "batch_bytes": len(batch),
        "fetches_per_pass": fetches,
        "mean_fetch_bytes": round(file_bytes / fetches),
        "mb_per_s": {k: [round(x, 1) for x in v] for k, v in runs.items()},
        "median_mb_per_s": {k: round(median(v), 1) for k, v in runs.items()},
        "ratio_to_pread": {
            k: round(median(v) / pread_mb_s, 3) for k, v in runs.items() if k != "pread"
        },
        "goal_ratio": GOAL_RATIO,
    }
    rows = [
        summary_row(
            f"sequential read, {label}, MB/s (warm cache)",
            f"{results['median_mb_per_s'][key]:,.0f} MB/s",
            f"os.pread 1 MiB chunks {pread_mb_s:,.0f} MB/s",
            results["ratio_to_pread"][key],
            f">= {GOAL_RATIO}",
            results["ratio_to_pread"][key] >= GOAL_RATIO,
        )
        for key, label in (
            ("engine_sync", "reader.fetch_slice + read"),
            ("engine_async", "PartitionLog.fetch_slice + read_slice"),
        )
    ]
    return {"params": p, "results": results, "summary": rows}


def _engine_sync(log: PartitionLog) -> tuple[int, int]:
    """Walk the whole log with reader.fetch_slice + FetchSlice.read; (bytes, fetches)."""
    view = log.view
    offset = view.log_start_offset
    end = view.high_watermark
    total = fetches = 0
    while offset < end:
        slice_ = reader.fetch_slice(view, offset, FETCH_MAX_BYTES)
        assert slice_ is not None
        total += len(slice_.read())
        fetches += 1
        offset = slice_.next_offset
    return total, fetches


async def _engine_async(log: PartitionLog) -> tuple[int, int]:
    """The same walk through PartitionLog, as the HTTP fetch handler does it."""
    offset = log.log_start_offset
    end = log.high_watermark
    total = fetches = 0
    while offset < end:
        slice_ = log.fetch_slice(offset, FETCH_MAX_BYTES)
        assert slice_ is not None
        total += len(await log.read_slice(slice_))
        fetches += 1
        offset = slice_.next_offset
    return total, fetches


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    r = report["results"]
    labels = {
        "pread": "os.pread\n1 MiB chunks",
        "engine_sync": "reader.fetch_slice\n+ read (sync)",
        "engine_async": "PartitionLog.fetch_slice\n+ read_slice (async)",
    }
    keys = list(labels)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    values = [r["median_mb_per_s"][k] for k in keys]
    bars = ax.bar([labels[k] for k in keys], values, color=["grey", "tab:blue", "tab:orange"])
    for i, k in enumerate(keys):
        ax.scatter([i] * len(r["mb_per_s"][k]), r["mb_per_s"][k], color="black", s=12, zorder=3)
        if k != "pread":
            ax.annotate(
                f"{r['ratio_to_pread'][k]:.2f} x pread",
                (bars[i].get_x() + bars[i].get_width() / 2, max(r["mb_per_s"][k]) * 1.02),
                ha="center",
                va="bottom",
                fontsize=10,
                fontweight="bold",
            )
    ax.axhline(
        r["median_mb_per_s"]["pread"] * GOAL_RATIO,
        color="grey",
        linestyle="--",
        label=f"goal {GOAL_RATIO} x pread",
    )
    ax.set_ylabel("MB/s (median; dots = passes)")
    ax.set_title(
        f"sequential read, warm page cache: {r['bytes_read_per_pass'] / MB:,.0f} MB, {r['segments']} segments, "
        f"~{r['batch_bytes'] / 1024:.0f} KiB batches",
        fontsize=10,
    )
    ax.legend()
    fig.suptitle(f"read, {report['mode']} run, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
