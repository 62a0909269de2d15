"""Costs that stay flat as the work grows (issue 28): start, stop and the first append after a
restart, against partitions and stored data, with each cost's slope on log-log axes.

What is measured, in-process on the engine (open_engine, as `eventlog serve` opens it):

* partitions: a data dir with N partitions (topics of up to 1,000 partitions, one record in
  every tenth), for N in 100, 500, 2,000 (--quick) or 100, 1,000, 5,000, 20,000 (full; the
  open-files limit caps one process, docs/OPERATIONS.md "Partition limits"). Timed: a clean
  start (open_engine until it yields) and a clean stop (until it returns). Goal: slope <= 1.1
  (linear in the partitions).
* stored data: one partition whose active segment holds S MB of 1 KB records (keyless and
  keyed), S in 64, 128, 256 MB (--quick) or 256, 1,024, 4,096 MB (--data-gb 16 adds 16 GB), closed
  cleanly. Timed: the first append after a clean restart, and after a restart whose active
  segment's key index file is gone (what a crash leaves): the key index of the active segment
  is loaded in the background, so the first append must not grow with S. Goal: <= 10 ms at
  every size, slope about 0.

* keys and groups, folded in from their own benchmarks (run from here, their reports kept
  whole under "keys" and "groups"): the per-key read p99 right after a compaction pass against
  before (bench keys_compaction: 200 k keys --quick, 1 M full; goal <= 2 x), and one group's
  offsets at 10 to 100,000 groups (bench groups: --quick stops at 10,000; goal <= 2 ms).
  EVENTLOG_BENCH_SCALE_FOLD=false leaves them out.

Slopes are least-squares fits of log(cost) on log(size). Not grown here yet: keys past one
count per run (1 M -> 10 M takes keys_compaction runs of their own), and partitions in a shard
family (50,000 in a family of 2: docs/PERFORMANCE.md says what was measured).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import anyio

from engine.key_index import key_index_file
from engine.log_manager import EngineConfig, open_engine
from engine.partition_log import prepare_batches
from engine.records import encode_batch

from .harness import Context, median, remove_tree, summary_row

NAME = "scale"
TITLE = "start, stop and first append after a restart against partitions and stored data (issue 28)"

PER_TOPIC = 1_000
GOAL_FIRST_APPEND_MS = 10.0
GOAL_SLOPE = 1.1
REPEATS = 3
TS = 1_700_000_000_000


def params(quick: bool) -> dict[str, Any]:
    data_gb = float(os.environ.get("EVENTLOG_BENCH_SCALE_DATA_GB", "4"))
    sizes_mb = [64, 128, 256] if quick else [256, 1024, 4096]
    if not quick and data_gb >= 16:
        sizes_mb.append(16 * 1024)
    return {
        "partitions": [100, 500, 2_000] if quick else [100, 1_000, 5_000, 20_000],
        "active_segment_mb": sizes_mb,
        "repeats": REPEATS,
        "records_per_partition": "one in every tenth partition",
    }


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) on log(x)."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    partitions = {}
    for n in p["partitions"]:
        partitions[str(n)] = _partitions(ctx, n)
        ctx.log(f"scale: {n:,} partitions: start {partitions[str(n)]['start_s']:.2f} s, "
                f"stop {partitions[str(n)]['stop_s']:.2f} s")
    data = {}
    for mb in p["active_segment_mb"]:
        for keyed in (False, True):
            key = f"{mb}{'-keyed' if keyed else ''}"
            data[key] = _first_append(ctx, mb, keyed)
            ctx.log(f"scale: {key} MB active segment: first append {data[key]}")
    start_slope = slope([(int(n), r["start_s"]) for n, r in partitions.items()])
    stop_slope = slope([(int(n), r["stop_s"]) for n, r in partitions.items()])
    worst = max(max(r["clean_ms"], r["crash_ms"]) for r in data.values())
    keyed = [(r["active_segment_mb"], r["crash_ms"]) for r in data.values() if r["keyed"]]
    first_slope = slope(keyed)
    top = str(p["partitions"][-1])
    rows = [
        summary_row(
            f"start / stop slope over {p['partitions'][0]:,}-{p['partitions'][-1]:,} partitions",
            f"{start_slope:.2f} / {stop_slope:.2f}",
            f"{partitions[top]['start_s']:.1f} s / {partitions[top]['stop_s']:.1f} s"
            f" at {int(top):,}",
            max(start_slope, stop_slope) / GOAL_SLOPE if start_slope and stop_slope else None,
            f"slopes <= {GOAL_SLOPE}",
            max(start_slope, stop_slope) <= GOAL_SLOPE if start_slope and stop_slope else None,
        ),
        summary_row(
            f"first append after a restart, active segment up to {p['active_segment_mb'][-1]:,} MB",
            f"{worst:.1f} ms worst"
            + (f" (slope {first_slope:.2f})" if first_slope is not None else ""),
            "before issue 28: 166-274 ms at 1 GB (a scan of the active segment)",
            worst / GOAL_FIRST_APPEND_MS,
            f"<= {GOAL_FIRST_APPEND_MS:.0f} ms at every size",
            worst <= GOAL_FIRST_APPEND_MS,
        ),
    ]
    folded: dict[str, Any] = {}
    if os.environ.get("EVENTLOG_BENCH_SCALE_FOLD", "true") != "false":
        from . import groups, keys_compaction

        for name, module in (("keys", keys_compaction), ("groups", groups)):
            ctx.log(f"scale: {name} (bench {module.NAME}) ...")
            folded[name] = module.run(ctx)
            rows += folded[name]["summary"]
    return {"params": p, "partitions": partitions, "first_append": data, **folded,
            "slopes": {
                "start": start_slope, "stop": stop_slope, "first_append_after_crash": first_slope
            },
            "summary": rows}


def _partitions(ctx: Context, n: int) -> dict[str, Any]:
    work = ctx.scratch(f"{NAME}-partitions-{n}")
    config = EngineConfig(log_dirs=(work,), max_partitions=10**7)
    try:
        begin = time.perf_counter()
        anyio.run(_make_partitions, config, n)
        made_s = time.perf_counter() - begin
        starts, stops = [], []
        for _ in range(REPEATS):
            start, stop = anyio.run(_start_stop, config)
            starts.append(start)
            stops.append(stop)
        return {"partitions": n, "start_s": median(starts), "stop_s": median(stops),
                "starts_s": starts, "stops_s": stops, "created_s": round(made_s, 1)}
    finally:
        remove_tree(work)


async def _make_partitions(config: EngineConfig, n: int) -> None:
    async with open_engine(config) as engine:
        for i in range(0, n, PER_TOPIC):
            await engine.create_topic(f"t{i // PER_TOPIC}", min(PER_TOPIC, n - i))
        batch = encode_batch(0, [(None, b"v", TS, ())])
        for name, state in list(engine.topics.items()):
            if name.startswith("t"):
                for p in range(0, len(state.partitions), 10):
                    log = state.partitions[p]
                    await log.append(prepare_batches(batch, log.config))


async def _start_stop(config: EngineConfig) -> tuple[float, float]:
    begin = time.perf_counter()
    async with open_engine(config):
        started = time.perf_counter()
        stopping = time.perf_counter()
    return started - begin, time.perf_counter() - stopping


def _first_append(ctx: Context, mb: int, keyed: bool) -> dict[str, Any]:
    work = ctx.scratch(f"{NAME}-data-{mb}")
    config = EngineConfig(log_dirs=(work,))
    try:
        anyio.run(_fill, config, mb, keyed)
        clean = [anyio.run(_time_first_append, config, keyed) for _ in range(REPEATS)]
        crash = []
        for _ in range(REPEATS):
            key_index_file(work / "t-0", 0).unlink(missing_ok=True)  # what a crash leaves
            crash.append(anyio.run(_time_first_append, config, keyed))
        return {"active_segment_mb": mb, "keyed": keyed,
                "clean_ms": median(clean), "crash_ms": median(crash),
                "clean_all_ms": clean, "crash_all_ms": crash}
    finally:
        remove_tree(work)


async def _fill(config: EngineConfig, mb: int, keyed: bool) -> None:
    value = b"x" * 1000
    async with open_engine(config) as engine:
        await engine.create_topic("t", 1, {"segment.bytes": 1 << 30 if mb < 1024 else 2**31 - 1})
        log = engine.partition("t", 0)
        n = 0
        while log.view.active_end < mb * 1024 * 1024:
            keys = [b"k%d" % ((n + i) % 1_000_000) if keyed else None for i in range(1000)]
            records = [(key, value, TS, ()) for key in keys]
            n += 1000
            await log.append(prepare_batches(encode_batch(0, records), log.config))


async def _time_first_append(config: EngineConfig, keyed: bool) -> float:
    async with open_engine(config) as engine:
        log = engine.partition("t", 0)
        record = (b"k1" if keyed else None, b"y", TS, ())
        batch = prepare_batches(encode_batch(0, [record]), log.config)
        begin = time.perf_counter()
        await log.append(batch)
        return round((time.perf_counter() - begin) * 1000, 2)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    groups = report.get("groups")
    fig, axes = plt.subplots(1, 3 if groups else 2, figsize=(16 if groups else 11, 4.5))
    left, right = axes[0], axes[1]
    if groups:
        _plot_groups(axes[2], groups)
    parts = report["partitions"]
    ns = [int(n) for n in parts]
    slopes = report["slopes"]
    for what in ("start", "stop"):
        label = f"{what} (slope {slopes[what]:.2f})"
        left.plot(ns, [parts[str(n)][f"{what}_s"] for n in ns], marker="o", label=label)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("partitions")
    left.set_ylabel("seconds (log)")
    left.legend(fontsize=8)
    data = report["first_append"]
    for keyed in (False, True):
        rows = [r for r in data.values() if r["keyed"] == keyed]
        sizes = [r["active_segment_mb"] for r in rows]
        what = "keyed" if keyed else "keyless"
        right.plot(sizes, [r["clean_ms"] for r in rows], marker="o", label=f"{what}, clean restart")
        right.plot(sizes, [r["crash_ms"] for r in rows], marker="x", linestyle="--",
                   label=f"{what}, no key index file (crash)")
    right.axhline(GOAL_FIRST_APPEND_MS, color="red", linestyle=":", label="goal 10 ms")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("active segment, MB")
    right.set_ylabel("first append after restart, ms (log)")
    right.legend(fontsize=7)
    keys = report.get("keys")
    if keys:
        ready = keys["results"]["ready"]
        fig.text(0.01, 0.01, f"keys ({keys['params']['keys']:,}): per-key read p99 after a pass "
                 f"{ready['after']['p99_ms']} ms, before {ready['before']['p99_ms']} ms "
                 f"({ready['ratio']:.2f} x, goal <= 2 x)", fontsize=8)
    fig.suptitle(TITLE, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_groups(ax: Any, groups: dict[str, Any]) -> None:
    """One group's offsets (HTTP p50 and the engine's) against the groups stored."""
    cells = groups["results"]
    ns = sorted(int(n) for n in cells)
    http = [cells[str(n)]["http_fetch"]["p50_us"] / 1000 for n in ns]
    engine = [cells[str(n)]["engine_fetch"]["p50_us"] / 1000 for n in ns]
    fitted = slope(list(zip(ns, http, strict=True))) or 0.0
    ax.plot(ns, http, marker="o", label=f"HTTP p50 (slope {fitted:.2f})")
    ax.plot(ns, engine, marker="x", label="engine fetch p50")
    ax.axhline(2.0, color="red", linestyle=":", label="goal 2 ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("consumer groups")
    ax.set_ylabel("one group's offsets, ms (log)")
    ax.legend(fontsize=7)
