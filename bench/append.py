"""Append throughput with fsync group commit, against dd and a raw pwrite+fdatasync loop.

What is measured. PartitionLog.append on a topic with the default config: flush.messages=1,
so every group commit is fdatasync'ed before any of its producers is acknowledged. Each
producer is an anyio task looping `await log.append(prepare_batches(copy, log.config))` on
one pre-encoded batch (a fresh bytearray copy each time: the writer rewrites baseOffset in
place). Validation (prepare_batches: framing, CRC, record framing) is included, as it is on the
service's produce path; encoding is not. Matrix: record size 100 B and 1 KiB x 1, 10, 100,
1000 records per batch x 1, 4, 16 concurrent producers, each cell for a fixed time on a fresh
data dir. records/s and MB/s count acknowledged appends only; MB/s counts log bytes (batch
headers and record framing included), MB = 10**6 bytes.

Peers, measured in the same run on the same filesystem (a scratch dir under bench/work/):
* dd if=/dev/zero bs=1M count=N conv=fdatasync: sequential write bandwidth with one sync at
  the end, the physical limit for large batches.
* a raw loop of os.pwrite(batch) + os.fdatasync in one thread, per batch size, run just
  before and just after that batch size's cells (their mean is the reference): the cost of
  one durable write of that size with no engine around it, the limit for one producer with
  small batches (with several producers group commit may beat it).

Goal: pre-encoded ~1 MiB batches (1 KiB records, just under max.message.bytes) reach
>= 0.8 of dd's MB/s. Those runs write the same number of MiB as dd and alternate with dd
runs in a rotating order, because this (virtual) disk's bandwidth drifts from run to run
(seen: 250 MB/s and 1.2 GB/s for the same dd a second apart); medians are compared.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio

from engine.format import parse_header
from engine.log_manager import EngineConfig, open_engine
from engine.partition_log import PartitionLog, prepare_batches

from . import data
from .harness import MB, Context, MiB, dd_write, median, remove_tree, summary_row

NAME = "append"
TITLE = "PartitionLog.append with fsync group commit vs dd and a raw fdatasync loop"

RECORD_BYTES = (100, 1024)
RECORDS_PER_BATCH = (1, 10, 100, 1000)
PRODUCERS = (1, 4, 16)
BIG_PRODUCERS = (1, 4, 16)
BIG_BATCH_LIMIT = MiB  # the "1 MiB" batch: as many 1 KiB records as fit in 1 MiB
GOAL_BIG_RATIO = 0.8


def params(quick: bool) -> dict[str, Any]:
    return {
        "record_bytes": list(RECORD_BYTES),
        "records_per_batch": list(RECORDS_PER_BATCH),
        "producers": list(PRODUCERS),
        "cell_seconds": 0.75 if quick else 3.0,
        "big_batch_producers": list(BIG_PRODUCERS),
        "big_batch_total_mib": 256 if quick else 512,
        "big_batch_repeats": 3 if quick else 7,
        "topic_config": "defaults (flush.messages=1, segment.bytes=1 GiB, max.message.bytes=1048588)",
    }


def run(ctx: Context) -> dict[str, Any]:
    return anyio.run(_run, ctx)


async def _run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    try:
        raw, matrix = await _matrix(ctx, work, p["cell_seconds"])
        big = await _big_batches(ctx, work, p)
    finally:
        remove_tree(work)
    dd_mb_s = big["dd_median_mb_per_s"]
    for cell in matrix:
        cell["ratio_to_dd"] = round(cell["mb_per_s"] / dd_mb_s, 4)
    results = {"raw_fdatasync_loop": raw, "matrix": matrix, "big_batches": big}
    return {"params": p, "results": results, "summary": _summary(results)}


# -- the matrix ---------------------------------------------------------------------------------


async def _matrix(
    ctx: Context, work: Path, seconds: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every cell, each batch size's cells bracketed by a raw loop before and after: this
    disk's fsync latency drifts within seconds, so a peer measured minutes apart misleads."""
    raws, cells = [], []
    for record_bytes in RECORD_BYTES:
        for per_batch in RECORDS_PER_BATCH:
            batch = bytes(data.encode_records_batch(record_bytes, per_batch))
            before = _raw_loop(work, batch, seconds)
            group = [
                await _measure(work, batch, per_batch, producers, seconds=seconds)
                for producers in PRODUCERS
            ]
            after = _raw_loop(work, batch, seconds)
            writes = before["writes"] + after["writes"]
            elapsed = before["seconds"] + after["seconds"]
            raw = {
                "record_bytes": record_bytes,
                "records_per_batch": per_batch,
                "batch_bytes": len(batch),
                "records_per_s": round(writes * per_batch / elapsed, 1),
                "mb_per_s": round(writes * len(batch) / elapsed / MB, 2),
                "mean_write_sync_us": round(elapsed / writes * 1e6, 1),
                "before": before,
                "after": after,
            }
            raws.append(raw)
            ctx.log(
                f"raw pwrite+fdatasync {record_bytes:>4} B x {per_batch:>4}: {raw['records_per_s']:>10,.0f} rec/s "
                f"{raw['mb_per_s']:>7.1f} MB/s ({before['mean_write_sync_us']:.0f} us before, "
                f"{after['mean_write_sync_us']:.0f} us after, per durable write)"
            )
            for cell in group:
                cell.update(record_bytes=record_bytes)
                cell["ratio_to_raw_loop"] = round(cell["records_per_s"] / raw["records_per_s"], 3)
                ctx.log(
                    f"append {record_bytes:>4} B x {per_batch:>4}/batch x {cell['producers']:>2} producers: "
                    f"{cell['records_per_s']:>10,.0f} rec/s {cell['mb_per_s']:>7.1f} MB/s "
                    f"({cell['records_per_commit']:.1f} rec/commit, {cell['ratio_to_raw_loop']:.2f}x raw loop)"
                )
                cells.append(cell)
    return raws, cells


async def _measure(
    work: Path,
    batch: bytes,
    records_per_batch: int,
    producers: int,
    *,
    seconds: float | None = None,
    batches: int | None = None,
) -> dict[str, Any]:
    """Run `producers` tasks appending `batch` on a fresh engine until `seconds` have passed
    or `batches` appends were started; the clock stops when the last acknowledgement arrives."""
    data_dir = work / "engine"
    remove_tree(data_dir)
    commits = {"count": 0, "records": 0, "bytes": 0}

    def on_commit(log: PartitionLog, _requests: int, records: int, size: int) -> None:
        if log.topic == "bench":
            commits["count"] += 1
            commits["records"] += records
            commits["bytes"] += size

    try:
        async with open_engine(EngineConfig(log_dirs=(data_dir,))) as engine:
            await engine.create_topic("bench", 1)
            log = engine.partition("bench", 0)
            config = log.config
            await log.append(prepare_batches(bytearray(batch), config))  # warm: threads, files
            engine.commit_hooks.append(on_commit)
            started = acked = 0
            begin = time.perf_counter()
            deadline = begin + seconds if seconds is not None else float("inf")
            limit = batches if batches is not None else 1 << 62

            async def producer() -> None:
                nonlocal started, acked
                while started < limit and time.perf_counter() < deadline:
                    started += 1
                    await log.append(prepare_batches(bytearray(batch), config))
                    acked += 1

            async with anyio.create_task_group() as tg:
                for _ in range(producers):
                    tg.start_soon(producer)
            elapsed = time.perf_counter() - begin
    finally:
        remove_tree(data_dir)
    records = acked * records_per_batch
    size = acked * len(batch)
    return {
        "records_per_batch": records_per_batch,
        "batch_bytes": len(batch),
        "producers": producers,
        "seconds": round(elapsed, 4),
        "batches": acked,
        "records": records,
        "bytes": size,
        "records_per_s": round(records / elapsed, 1),
        "mb_per_s": round(size / elapsed / MB, 2),
        "group_commits": commits["count"],
        "records_per_commit": round(commits["records"] / max(commits["count"], 1), 2),
        "mean_commit_bytes": round(commits["bytes"] / max(commits["count"], 1)),
    }


# -- peers --------------------------------------------------------------------------------------


def _raw_loop(work: Path, batch: bytes, seconds: float) -> dict[str, Any]:
    """os.pwrite + os.fdatasync of `batch` in a loop for `seconds`, appending to a new file."""
    path = work / "raw.bin"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        writes = position = 0
        begin = time.perf_counter()
        deadline = begin + seconds
        while time.perf_counter() < deadline:
            os.pwrite(fd, batch, position)
            os.fdatasync(fd)
            position += len(batch)
            writes += 1
        elapsed = time.perf_counter() - begin
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {
        "seconds": round(elapsed, 4),
        "writes": writes,
        "mean_write_sync_us": round(elapsed / writes * 1e6, 1),
    }


async def _big_batches(ctx: Context, work: Path, p: dict[str, Any]) -> dict[str, Any]:
    """~1 MiB batches, the same MiB count as dd, alternating with dd runs."""
    batch = bytes(data.largest_batch_under(BIG_BATCH_LIMIT))
    per_batch = parse_header(batch, 0).records_count
    total_mib = p["big_batch_total_mib"]
    dd_runs: list[dict[str, Any]] = []
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in BIG_PRODUCERS}
    order: list[int | None] = [None, *BIG_PRODUCERS]  # None = dd
    for repeat in range(p["big_batch_repeats"]):
        shift = repeat % len(order)  # rotate, so no run always follows the same neighbour
        for producers in order[shift:] + order[:shift]:
            if producers is None:
                dd = await anyio.to_thread.run_sync(dd_write, work, total_mib)
                dd["repeat"] = repeat
                dd_runs.append(dd)
                ctx.log(
                    f"dd {total_mib} MiB conv=fdatasync (repeat {repeat + 1}): {dd['mb_per_s']:.1f} MB/s"
                )
                continue
            cell = await _measure(work, batch, per_batch, producers, batches=total_mib)
            cell["repeat"] = repeat
            runs[producers].append(cell)
            ctx.log(
                f"append ~1 MiB batches x {producers:>2} producers (repeat {repeat + 1}): {cell['mb_per_s']:.1f} MB/s "
                f"({cell['mean_commit_bytes'] / MiB:.1f} MiB/commit)"
            )
    dd_median = median(d["mb_per_s"] for d in dd_runs)
    by_producers = []
    for producers, cells in runs.items():
        mb_s = median(c["mb_per_s"] for c in cells)
        by_producers.append(
            {
                "producers": producers,
                "median_mb_per_s": round(mb_s, 1),
                "ratio_to_dd": round(mb_s / dd_median, 3),
                "runs": cells,
            }
        )
    return {
        "batch_bytes": len(batch),
        "records_per_batch": per_batch,
        "record_bytes": 1024,
        "total_mib_per_run": total_mib,
        "dd_runs": dd_runs,
        "dd_median_mb_per_s": round(dd_median, 1),
        "by_producers": by_producers,
        "goal_ratio": GOAL_BIG_RATIO,
    }


# -- summary ------------------------------------------------------------------------------------


def _summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    big = results["big_batches"]
    rows = []
    for entry in big["by_producers"]:
        ratio = entry["ratio_to_dd"]
        rows.append(
            summary_row(
                f"~1 MiB batches, {entry['producers']} producer(s), MB/s",
                f"{entry['median_mb_per_s']:.0f} MB/s",
                f"dd conv=fdatasync {big['dd_median_mb_per_s']:.0f} MB/s",
                ratio,
                f">= {GOAL_BIG_RATIO}",
                ratio >= GOAL_BIG_RATIO,
            )
        )
    raw = {(r["record_bytes"], r["records_per_batch"]): r for r in results["raw_fdatasync_loop"]}
    for cell in results["matrix"]:
        if (
            cell["record_bytes"] == 100
            and cell["records_per_batch"] == 1
            and cell["producers"] in (1, 16)
        ):
            loop = raw[(100, 1)]
            rows.append(
                summary_row(
                    f"100 B x 1 record/batch, {cell['producers']} producer(s), records/s",
                    f"{cell['records_per_s']:,.0f}/s",
                    f"raw pwrite+fdatasync loop {loop['records_per_s']:,.0f}/s",
                    cell["ratio_to_raw_loop"],
                    "(informational)",
                    None,
                )
            )
    return rows


# -- plot ---------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    results = report["results"]
    matrix = results["matrix"]
    big = results["big_batches"]
    dd = big["dd_median_mb_per_s"]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
    colors = {1: "tab:blue", 4: "tab:orange", 16: "tab:green"}
    styles = {100: "-", 1024: "--"}

    ax = axes[0]
    for record_bytes in RECORD_BYTES:
        for producers in PRODUCERS:
            cells = [
                c
                for c in matrix
                if c["record_bytes"] == record_bytes and c["producers"] == producers
            ]
            ax.plot(
                [c["records_per_batch"] for c in cells],
                [c["records_per_s"] for c in cells],
                styles[record_bytes],
                marker="o",
                color=colors[producers],
                label=f"{record_bytes} B, {producers} producer(s)",
            )
        loop = [r for r in results["raw_fdatasync_loop"] if r["record_bytes"] == record_bytes]
        ax.plot(
            [r["records_per_batch"] for r in loop],
            [r["records_per_s"] for r in loop],
            styles[record_bytes],
            color="black",
            alpha=0.5,
            label=f"{record_bytes} B, raw pwrite+fdatasync loop",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("records per batch")
    ax.set_ylabel("acknowledged records/s")
    ax.set_title("records/s (every group commit fsynced)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)

    ax = axes[1]
    for record_bytes in RECORD_BYTES:
        for producers in PRODUCERS:
            cells = [
                c
                for c in matrix
                if c["record_bytes"] == record_bytes and c["producers"] == producers
            ]
            ax.plot(
                [c["records_per_batch"] for c in cells],
                [c["mb_per_s"] for c in cells],
                styles[record_bytes],
                marker="o",
                color=colors[producers],
                label=f"{record_bytes} B, {producers} producer(s)",
            )
    ax.axhline(dd, color="red", linestyle=":", label=f"dd conv=fdatasync {dd:.0f} MB/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("records per batch")
    ax.set_ylabel("MB/s of log written (MB = 10^6 B)")
    ax.set_title("MB/s vs dd")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)

    ax = axes[2]
    labels = ["dd"] + [f"{e['producers']} producer(s)" for e in big["by_producers"]]
    values = [dd] + [e["median_mb_per_s"] for e in big["by_producers"]]
    bars = ax.bar(
        labels,
        values,
        color=["red"] + [colors.get(e["producers"], "grey") for e in big["by_producers"]],
    )
    top = max(
        [
            dd,
            *(r["mb_per_s"] for e in big["by_producers"] for r in e["runs"]),
            *(d["mb_per_s"] for d in big["dd_runs"]),
        ]
    )
    for bar, entry in zip(bars[1:], big["by_producers"]):
        ax.annotate(
            f"{entry['ratio_to_dd']:.2f} x dd",
            (bar.get_x() + bar.get_width() / 2, top * 1.03),
            ha="center",
            va="bottom",
            fontsize=10,
            fontweight="bold",
        )
    ax.set_ylim(0, top * 1.15)
    for entry_index, entry in enumerate(big["by_producers"], start=1):
        ax.scatter(
            [entry_index] * len(entry["runs"]),
            [r["mb_per_s"] for r in entry["runs"]],
            color="black",
            s=12,
            zorder=3,
        )
    ax.scatter(
        [0] * len(big["dd_runs"]),
        [d["mb_per_s"] for d in big["dd_runs"]],
        color="black",
        s=12,
        zorder=3,
    )
    ax.axhline(
        dd * GOAL_BIG_RATIO, color="grey", linestyle="--", label=f"goal {GOAL_BIG_RATIO} x dd"
    )
    ax.set_ylabel("MB/s (median; dots = runs)")
    ax.set_title(
        f"~1 MiB batches ({big['batch_bytes']:,} B), {big['total_mib_per_run']} MiB per run"
    )
    ax.legend(fontsize=8)
    fig.suptitle(f"append, {report['mode']} run, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
