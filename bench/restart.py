"""Start-up time of a 10 GB, 1,000-segment data dir after a clean and an unclean shutdown.

What is measured. One partition is filled with ~1 MiB batches into 10 MiB segments
(segment.bytes = 10485760: ten batches per segment), rolled so the active segment is empty,
and closed cleanly. Then the time for `open_engine(EngineConfig(log_dirs=(dir,)))` to yield
(lock, metadata replay, load every partition, start the writers) is measured:

* clean: the .kafka_cleanshutdown marker exists, nothing is scanned. Goal: <= 1 s.
* unclean: the marker is deleted and the partition's entry in
  recovery-point-offset-checkpoint is set to the base offset of the segment `tail` segments
  before the end, for tail = 0, 1, 10, 100 segments. Recovery scans (CRC-checks, re-indexes,
  fsyncs) exactly those segments plus the empty active one, so the time should grow with the
  tail bytes only: the 10 GB before the recovery point must not matter.

After each clean start, the first two time lookups (reader.offset_for_timestamp) for a
timestamp above every record are timed too: such a lookup visits every segment, so the first
one pays for whatever start-up left lazy.

Each point runs warm (the files in the page cache, read first if needed) and cold (every file
of the data dir evicted with posix_fadvise(DONTNEED): /proc/sys/vm/drop_caches needs more
privilege than a container has; inodes and dentries stay cached, and the virtual disk's host
may cache too). Peer: os.pread of the largest tail's files in 1 MiB chunks, warm and cold,
against recovery's scan rate (the slope of time over scanned bytes).

--quick uses 1 GB in 100 segments (the 100-segment tail is then the whole log).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio

from engine import reader
from engine.checkpoints import RECOVERY_POINT, read_checkpoint, write_checkpoint
from engine.log_dirs import CLEAN_SHUTDOWN_FILE
from engine.log_manager import EngineConfig, open_engine

from . import data
from .harness import (
    MB,
    Context,
    MiB,
    evict_page_cache,
    median,
    pread_files,
    remove_tree,
    summary_row,
)

NAME = "restart"
TITLE = "engine start-up after clean and unclean shutdown, 10 GB in 1,000 segments"

SEGMENT_BYTES = 10 * MiB
BATCHES_PER_SEGMENT = 10
BATCHES_PER_APPEND = 4
TAILS = (0, 1, 10, 100)
GOAL_CLEAN_S = 1.0
TOPIC = "t"
FUTURE_MS = data.T0_MS + 10**12  # above every record's timestamp


def params(quick: bool) -> dict[str, Any]:
    return {
        "segments": 100 if quick else 1_000,
        "segment_bytes": SEGMENT_BYTES,
        "batches_per_segment": BATCHES_PER_SEGMENT,
        "tails_segments": list(TAILS),
        "clean_repeats": {"warm": 3 if quick else 5, "cold": 2 if quick else 5},
        "unclean_repeats": {"warm": 2 if quick else 3, "cold": 1 if quick else 3},
        "producers": 4,
        "cold_means": "posix_fadvise(DONTNEED) on every file of the data dir (guest page cache only)",
        "recovery_threads": EngineConfig(log_dirs=()).recovery_threads,
    }


def run(ctx: Context) -> dict[str, Any]:
    return anyio.run(_run, ctx)


async def _run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    data_dir = work / "data"
    try:
        build = await _build(ctx, data_dir, p["segments"])
        bases = build.pop("segment_base_offsets")
        partition_dir = data_dir / f"{TOPIC}-0"
        clean: dict[str, list[dict[str, Any]]] = {"warm": [], "cold": []}
        for mode, runs in clean.items():
            for _ in range(p["clean_repeats"][mode]):
                if mode == "cold":
                    evict_page_cache([data_dir])
                runs.append(await _open_once(data_dir, probe_time_lookup=True))
            ctx.log(
                f"restart clean ({mode}): median {median(r['open_s'] for r in runs) * 1000:.0f} ms; "
                f"then a time lookup visiting every segment: first "
                f"{median(r['first_time_lookup_s'] for r in runs) * 1000:.0f} ms, second "
                f"{median(r['second_time_lookup_s'] for r in runs) * 1000:.2f} ms"
            )

        unclean: list[dict[str, Any]] = []
        for tail in TAILS:
            if tail > len(bases) - 1:
                continue
            recovery_point = bases[len(bases) - 1 - tail]
            tail_files = sorted(partition_dir.glob("*.log"))[len(bases) - 1 - tail :]
            for mode in ("warm", "cold"):
                runs = []
                for _ in range(p["unclean_repeats"][mode]):
                    if mode == "warm":
                        pread_files(tail_files)
                    _make_unclean(data_dir, recovery_point)
                    if mode == "cold":
                        evict_page_cache([data_dir])
                    runs.append(await _open_once(data_dir))
                point = {
                    "tail_segments": tail,
                    "recovery_point": recovery_point,
                    "mode": mode,
                    "scanned_segments": runs[0]["scanned_segments"],
                    "scanned_bytes": runs[0]["scanned_bytes"],
                    "median_open_s": round(median(r["open_s"] for r in runs), 4),
                    "runs": runs,
                }
                expected = tail + 1  # the tail, plus the empty active segment holding the point
                if point["scanned_segments"] != expected:
                    raise AssertionError(
                        f"tail {tail}: recovery scanned {point['scanned_segments']}, expected {expected}"
                    )
                unclean.append(point)
                ctx.log(
                    f"restart unclean ({mode}), tail {tail:>3} segments ({point['scanned_bytes'] / MB:,.0f} MB "
                    f"scanned): {point['median_open_s'] * 1000:,.0f} ms"
                )

        largest = max(point["tail_segments"] for point in unclean)
        peer_files = sorted(partition_dir.glob("*.log"))[len(bases) - 1 - largest :]
        peer = {}
        for mode in ("warm", "cold"):
            if mode == "cold":
                evict_page_cache(peer_files)
            else:
                pread_files(peer_files)
            begin = time.perf_counter()
            size = pread_files(peer_files)
            elapsed = time.perf_counter() - begin
            peer[mode] = {
                "bytes": size,
                "seconds": round(elapsed, 4),
                "mb_per_s": round(size / elapsed / MB, 1),
            }
        ctx.log(
            f"restart peer: pread of the {largest}-segment tail: warm {peer['warm']['mb_per_s']:,.0f} MB/s, cold {peer['cold']['mb_per_s']:,.0f} MB/s"
        )
    finally:
        remove_tree(work)

    fits = {mode: _fit([u for u in unclean if u["mode"] == mode]) for mode in ("warm", "cold")}
    for mode, fit in fits.items():
        fit["pread_mb_per_s"] = peer[mode]["mb_per_s"]
        fit["ratio_to_pread"] = (
            round(fit["scan_mb_per_s"] / peer[mode]["mb_per_s"], 3)
            if fit["scan_mb_per_s"]
            else None
        )
    results = {
        "build": build,
        "clean": {
            mode: {
                "median_open_s": round(median(r["open_s"] for r in runs), 4),
                "median_first_time_lookup_s": round(
                    median(r["first_time_lookup_s"] for r in runs), 6
                ),
                "median_second_time_lookup_s": round(
                    median(r["second_time_lookup_s"] for r in runs), 6
                ),
                "runs": runs,
            }
            for mode, runs in clean.items()
        },
        "unclean": unclean,
        "fit_open_s_vs_scanned_bytes": fits,
        "pread_tail_peer": peer,
        "goal_clean_s": GOAL_CLEAN_S,
    }
    return {"params": p, "results": results, "summary": _summary(results, build)}


async def _build(ctx: Context, data_dir: Path, segments: int) -> dict[str, Any]:
    """Fill one partition with `segments` full 10 MiB segments, roll, close cleanly."""
    batch = bytes(data.largest_batch_under(SEGMENT_BYTES // BATCHES_PER_SEGMENT))
    bodies_needed = segments * BATCHES_PER_SEGMENT // BATCHES_PER_APPEND
    body = batch * BATCHES_PER_APPEND
    begin = time.perf_counter()
    async with open_engine(EngineConfig(log_dirs=(data_dir,))) as engine:
        await engine.create_topic(TOPIC, 1, {"segment.bytes": SEGMENT_BYTES})
        log = engine.partition(TOPIC, 0)
        written = await data.fill(log, (body for _ in range(bodies_needed)), producers=4)
        await log.roll()
        bases = [s.base_offset for s in log.view.segments]
        size = log.view.size_bytes
    elapsed = time.perf_counter() - begin
    if len(bases) != segments + 1:
        raise AssertionError(
            f"expected {segments} full segments and an empty active one, got {len(bases)}"
        )
    ctx.log(
        f"restart: wrote {written / MB:,.0f} MB in {len(bases) - 1} segments ({elapsed:.1f} s, {written / elapsed / MB:,.0f} MB/s)"
    )
    return {
        "batch_bytes": len(batch),
        "bytes": size,
        "full_segments": len(bases) - 1,
        "seconds": round(elapsed, 2),
        "segment_base_offsets": bases,
    }


def _make_unclean(data_dir: Path, recovery_point: int) -> None:
    """What a crash leaves: no clean-shutdown marker, and the partition's recovery point at
    `recovery_point` (the checkpoint is rewritten the same way the engine writes it)."""
    (data_dir / CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)
    path = data_dir / RECOVERY_POINT
    entries = read_checkpoint(path)
    entries[(TOPIC, 0)] = recovery_point
    write_checkpoint(path, entries)


async def _open_once(data_dir: Path, *, probe_time_lookup: bool = False) -> dict[str, Any]:
    """Time open_engine until it yields; the clean close that follows is timed apart.

    With `probe_time_lookup`, also time the first two ListOffsets-by-time calls after the
    start for a timestamp above every record: the lookup visits every segment's largest
    timestamp, so the first call pays for whatever start-up left lazy (index mapping and
    verification); the second shows the steady state.
    """
    begin = time.perf_counter()
    async with open_engine(EngineConfig(log_dirs=(data_dir,))) as engine:
        opened = time.perf_counter() - begin
        stats = engine.load_stats[f"{TOPIC}-0"]
        probe = {}
        if probe_time_lookup:
            view = engine.partition(TOPIC, 0).view
            for name in ("first_time_lookup_s", "second_time_lookup_s"):
                start = time.perf_counter()
                found = reader.offset_for_timestamp(view, FUTURE_MS)
                probe[name] = round(time.perf_counter() - start, 6)
                assert found is None, found
        closing = time.perf_counter()
    return {
        "open_s": round(opened, 4),
        "close_s": round(time.perf_counter() - closing, 4),
        "scanned_segments": stats.scanned_segments,
        "scanned_bytes": stats.scanned_bytes,
        "segments": stats.segments,
        **probe,
    }


def _fit(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Least squares open_s = a + b * scanned_bytes; scan rate = 1 / b."""
    xs = [pt["scanned_bytes"] for pt in points]
    ys = [pt["median_open_s"] for pt in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx if sxx else 0.0
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    return {
        "intercept_s": round(intercept, 4),
        "seconds_per_gb": round(slope * 1e9, 4),
        "scan_mb_per_s": round(1 / slope / MB, 1) if slope > 0 else None,
        "r_squared": round(1 - ss_res / ss_tot, 4) if ss_tot else None,
    }


def _summary(results: dict[str, Any], build: dict[str, Any]) -> list[dict[str, Any]]:
    size = f"{build['bytes'] / 1e9:.1f} GB / {build['full_segments']} segments"
    rows = []
    for mode in ("warm", "cold"):
        t = results["clean"][mode]["median_open_s"]
        rows.append(
            summary_row(
                f"clean restart ({mode}), {size}",
                f"{t * 1000:,.0f} ms",
                "goal 1 s",
                t / GOAL_CLEAN_S,
                "<= 1",
                t <= GOAL_CLEAN_S,
            )
        )
    for mode in ("warm", "cold"):
        clean = results["clean"][mode]
        first, second = clean["median_first_time_lookup_s"], clean["median_second_time_lookup_s"]
        rows.append(
            summary_row(
                f"first time lookup after a clean restart ({mode}), visiting all {build['full_segments'] + 1} segments",
                f"{first * 1000:,.0f} ms",
                f"the same lookup again {second * 1000:,.2f} ms",
                first / second if second else None,
                "(informational)",
                None,
            )
        )
    for mode in ("warm", "cold"):
        points = {u["tail_segments"]: u for u in results["unclean"] if u["mode"] == mode}
        t0 = points[0]["median_open_s"]
        clean = results["clean"][mode]["median_open_s"]
        rows.append(
            summary_row(
                f"unclean restart ({mode}), tail 0 segments",
                f"{t0 * 1000:,.0f} ms",
                f"clean restart {clean * 1000:,.0f} ms",
                t0 / clean if clean else None,
                "<= 1 s: nothing before the recovery point is read",
                t0 <= GOAL_CLEAN_S,
            )
        )
        fit = results["fit_open_s_vs_scanned_bytes"][mode]
        largest = max(points)
        rows.append(
            summary_row(
                f"unclean restart ({mode}), tail {largest} segments; scan rate (fit, R^2 {fit['r_squared']})",
                f"{points[largest]['median_open_s'] * 1000:,.0f} ms; {fit['scan_mb_per_s']:,.0f} MB/s",
                f"os.pread of the tail {fit['pread_mb_per_s']:,.0f} MB/s",
                fit["ratio_to_pread"],
                "(informational)",
                None,
            )
        )
    return rows


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    r = report["results"]
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.5))
    colors = {"warm": "tab:red", "cold": "tab:blue"}
    for ax, log_scale in zip(axes, (False, True)):
        for mode in ("warm", "cold"):
            points = [
                u
                for u in r["unclean"]
                if u["mode"] == mode and (u["scanned_bytes"] > 0 or not log_scale)
            ]
            xs = [u["scanned_bytes"] / 1e9 for u in points]
            ax.plot(
                xs,
                [u["median_open_s"] for u in points],
                "o-",
                color=colors[mode],
                label=f"unclean, {mode} (median)",
            )
            for u in points:
                x = u["scanned_bytes"] / 1e9
                ax.scatter(
                    [x] * len(u["runs"]),
                    [run["open_s"] for run in u["runs"]],
                    color=colors[mode],
                    s=10,
                    alpha=0.5,
                )
                if log_scale or u["tail_segments"] in (0, max(p["tail_segments"] for p in points)):
                    ax.annotate(
                        f"tail {u['tail_segments']}",
                        (x, u["median_open_s"]),
                        textcoords="offset points",
                        xytext=(5, 6 if mode == "warm" else -12),
                        fontsize=8,
                        color=colors[mode],
                    )
            clean = r["clean"][mode]["median_open_s"]
            ax.axhline(
                clean,
                color=colors[mode],
                linestyle=":",
                label=f"clean, {mode}: {clean * 1000:.0f} ms",
            )
        ax.axhline(
            GOAL_CLEAN_S, color="grey", linestyle="--", label="goal for a clean restart: 1 s"
        )
        ax.set_xlabel(
            "bytes scanned by recovery (the tail after the recovery point), GB"
            + (", log" if log_scale else "")
        )
        ax.set_ylabel("open_engine until ready, s" + (", log" if log_scale else ""))
        if log_scale:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(
                "the same, log-log, tails >= 1 segment (slope 1 = linear in the tail)", fontsize=10
            )
        else:
            build = r["build"]
            ax.set_title(
                f"{build['bytes'] / 1e9:.1f} GB in {build['full_segments']} segments of 10 MiB, one partition; "
                "tail 0 = nothing after the recovery point",
                fontsize=10,
            )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"restart, {report['mode']} run, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
