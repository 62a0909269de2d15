"""Costs that stay flat as the work grows (issue 28): start, stop and the first append after a
restart, against partitions and stored data, with each cost's slope on log-log axes.

What is measured, in-process on the engine (open_engine, as `eventlog serve` opens it):

* partitions: a data dir with N partitions (topics of up to 1,000 partitions, one record in
  every tenth), for N in 100, 500, 2,000 (--quick) or 100, 1,000, 5,000, 20,000, 50,000 (full;
  docs/OPERATIONS.md "Partition limits"). Timed: a clean start (open_engine until it yields)
  and a clean stop (until it returns), in process. Goal: slope <= 1.1 (linear in the
  partitions). On the same data dir, for N in FAMILY_PARTITIONS (2,000 --quick; 5,000 and
  50,000 full), a family of 2 (`eventlog serve --processes 2`, EVENTLOG_MAX_PARTITIONS raised
  to fit): start from the command to /readyz answering 200 (so Python's imports and the
  supervisor's start are in it: the empty-dir start is timed too, as the floor), stop from
  SIGTERM to the supervisor's exit. Goal: start and stop <= 30 s at 50,000.
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
count per run (1 M -> 10 M takes keys_compaction runs of their own).

EVENTLOG_BENCH_SCALE_ONLY=partitions (a comma-separated subset of partitions, data, keys,
groups) runs only those dimensions (the full partitions dimension alone takes ~25 minutes
here, most of it creating 76,000 partitions); the report says which ran.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio

from engine.key_index import key_index_file
from engine.log_manager import EngineConfig, open_engine
from engine.partition_log import prepare_batches
from engine.records import encode_batch

from .harness import Context, median, remove_tree, summary_row
from .servers import EventlogServer

NAME = "scale"
TITLE = "start, stop and first append after a restart against partitions and stored data (issue 28)"

PER_TOPIC = 1_000
GOAL_FIRST_APPEND_MS = 10.0
GOAL_SLOPE = 1.1
REPEATS = 3
TS = 1_700_000_000_000
FAMILY_PROCESSES = 2
GOAL_FAMILY_S = 30.0
DIMENSIONS = ("partitions", "data", "keys", "groups")


def dimensions() -> tuple[str, ...]:
    """The dimensions this run grows (EVENTLOG_BENCH_SCALE_ONLY, else all; the older
    EVENTLOG_BENCH_SCALE_FOLD=false leaves keys and groups out)."""
    only = os.environ.get("EVENTLOG_BENCH_SCALE_ONLY")
    dims = tuple(d for d in DIMENSIONS if only is None or d in only.split(","))
    if os.environ.get("EVENTLOG_BENCH_SCALE_FOLD", "true") == "false":
        dims = tuple(d for d in dims if d not in ("keys", "groups"))
    return dims


def params(quick: bool) -> dict[str, Any]:
    data_gb = float(os.environ.get("EVENTLOG_BENCH_SCALE_DATA_GB", "4"))
    sizes_mb = [64, 128, 256] if quick else [256, 1024, 4096]
    if not quick and data_gb >= 16:
        sizes_mb.append(16 * 1024)
    return {
        "dimensions": list(dimensions()),
        "partitions": [100, 500, 2_000] if quick else [100, 1_000, 5_000, 20_000, 50_000],
        "family_partitions": [2_000] if quick else [5_000, 50_000],
        "family_processes": FAMILY_PROCESSES,
        "active_segment_mb": sizes_mb,
        "repeats": REPEATS,
        "records_per_partition": "one in every tenth partition",
        "open_files_limit": _open_files_limit(),
    }


def _open_files_limit() -> list[int]:
    import resource

    return list(resource.getrlimit(resource.RLIMIT_NOFILE))


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
    dims = p["dimensions"]
    partitions: dict[str, Any] = {}
    family: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    slopes: dict[str, float | None] = {}
    if "partitions" in dims:
        if p["family_partitions"]:
            family["0"] = _family_start_stop(ctx, ctx.scratch(f"{NAME}-family-empty"), 0)
        for n in p["partitions"]:
            fam = family if n in p["family_partitions"] else None
            partitions[str(n)] = _partitions(ctx, n, fam)
            ctx.log(f"scale: {n:,} partitions: start {partitions[str(n)]['start_s']:.2f} s, "
                    f"stop {partitions[str(n)]['stop_s']:.2f} s")
        slopes["start"] = slope([(int(n), r["start_s"]) for n, r in partitions.items()])
        slopes["stop"] = slope([(int(n), r["stop_s"]) for n, r in partitions.items()])
        # the fit over the whole range can hide a steeper top: the slope of the last two points
        top = list(partitions.items())[-2:]
        slopes["start_top"] = slope([(int(n), r["start_s"]) for n, r in top])
        slopes["stop_top"] = slope([(int(n), r["stop_s"]) for n, r in top])
        rows += _partition_rows(p, partitions, family, slopes)
    data = {}
    if "data" in dims:
        for mb in p["active_segment_mb"]:
            for keyed in (False, True):
                key = f"{mb}{'-keyed' if keyed else ''}"
                data[key] = _first_append(ctx, mb, keyed)
                ctx.log(f"scale: {key} MB active segment: first append {data[key]}")
        worst = max(max(r["clean_ms"], r["crash_ms"]) for r in data.values())
        keyed = [(r["active_segment_mb"], r["crash_ms"]) for r in data.values() if r["keyed"]]
        first_slope = slopes["first_append_after_crash"] = slope(keyed)
        rows.append(summary_row(
            f"first append after a restart, active segment up to {p['active_segment_mb'][-1]:,} MB",
            f"{worst:.1f} ms worst"
            + (f" (slope {first_slope:.2f})" if first_slope is not None else ""),
            "before issue 28: 166-274 ms at 1 GB (a scan of the active segment)",
            worst / GOAL_FIRST_APPEND_MS,
            f"<= {GOAL_FIRST_APPEND_MS:.0f} ms at every size",
            worst <= GOAL_FIRST_APPEND_MS,
        ))
    folded: dict[str, Any] = {}
    if "keys" in dims or "groups" in dims:
        from . import groups, keys_compaction

        for name, module in (("keys", keys_compaction), ("groups", groups)):
            if name in dims:
                ctx.log(f"scale: {name} (bench {module.NAME}) ...")
                folded[name] = module.run(ctx)
                rows += folded[name]["summary"]
    return {"params": p, "partitions": partitions, "family": family, "first_append": data,
            **folded, "slopes": slopes, "summary": rows}


def _partition_rows(
    p: dict[str, Any], partitions: dict[str, Any], family: dict[str, Any],
    slopes: dict[str, float | None],
) -> list[dict[str, Any]]:
    start_slope, stop_slope = slopes["start"], slopes["stop"]
    top = str(p["partitions"][-1])
    rows = [
        summary_row(
            f"start / stop slope over {p['partitions'][0]:,}-{p['partitions'][-1]:,} partitions",
            f"{start_slope:.2f} / {stop_slope:.2f} (top two points "
            f"{slopes['start_top']:.2f} / {slopes['stop_top']:.2f})",
            f"{partitions[top]['start_s']:.1f} s / {partitions[top]['stop_s']:.1f} s"
            f" at {int(top):,}",
            max(start_slope, stop_slope) / GOAL_SLOPE if start_slope and stop_slope else None,
            f"slopes <= {GOAL_SLOPE}",
            max(start_slope, stop_slope) <= GOAL_SLOPE if start_slope and stop_slope else None,
        )
    ]
    sizes = [n for n in p["family_partitions"] if str(n) in family]
    if sizes:
        n = str(sizes[-1])
        worst = max(family[n]["start_s"], family[n]["stop_s"])
        rows.append(summary_row(
            f"{int(n):,} partitions, eventlog serve --processes {FAMILY_PROCESSES}: start / stop",
            f"{family[n]['start_s']:.1f} s / {family[n]['stop_s']:.1f} s",
            f"empty data dir: {family['0']['start_s']:.1f} s / {family['0']['stop_s']:.1f} s",
            worst / GOAL_FAMILY_S,
            f"<= {GOAL_FAMILY_S:.0f} s each",
            worst <= GOAL_FAMILY_S,
        ))
    return rows


def _partitions(ctx: Context, n: int, family: dict[str, Any] | None) -> dict[str, Any]:
    """Start and stop `n` partitions in process; with `family`, a family of 2 too (on the same
    data dir, its results put there)."""
    root = ctx.scratch(f"{NAME}-partitions-{n}")
    work = root / "data"
    config = EngineConfig(log_dirs=(work,), max_partitions=max(n, 4096))
    try:
        begin = time.perf_counter()
        anyio.run(_make_partitions, config, n)
        made_s = time.perf_counter() - begin
        ctx.log(f"scale: {n:,} partitions made in {made_s:.0f} s")
        # one start and stop not counted: the stop after making them fsyncs every new
        # partition's files and may pass the writers' stop timeout (those are then recovered
        # as after a crash at the next start); the counted starts are all clean ones
        anyio.run(_start_stop, config)
        starts, stops = [], []
        for _ in range(REPEATS):
            start, stop = anyio.run(_start_stop, config)
            starts.append(start)
            stops.append(stop)
        if family is not None:
            family[str(n)] = _family_start_stop(ctx, root, n)
        return {"partitions": n, "start_s": median(starts), "stop_s": median(stops),
                "starts_s": starts, "stops_s": stops, "created_s": round(made_s, 1)}
    finally:
        remove_tree(root)


def _family_start_stop(ctx: Context, root: Path, n: int) -> dict[str, Any]:
    """`eventlog serve --processes 2` on root/data, started and stopped REPEATS times: start
    from the command to /readyz 200, stop from SIGTERM to the supervisor's exit (exit status
    and the start-up lines kept: a clean stop is part of what is measured)."""
    starts, stops, statuses = [], [], []
    for _ in range(REPEATS):
        server = EventlogServer(ctx, root)
        assert server.env is not None
        server.env["EVENTLOG_PROCESSES"] = str(FAMILY_PROCESSES)
        server.env["EVENTLOG_MAX_PARTITIONS"] = str(max(n, 4096))
        begin = time.perf_counter()
        server.start()
        starts.append(time.perf_counter() - begin)
        assert server.process is not None
        begin = time.perf_counter()
        server.process.send_signal(signal.SIGTERM)
        try:
            statuses.append(server.process.wait(600))
        except subprocess.TimeoutExpired:
            server.process.kill()
            statuses.append(server.process.wait())
        stops.append(time.perf_counter() - begin)
    words = (" ready", "open-files", "raise", "not answering")
    lines = [line for line in server.log_path.read_text(errors="replace").splitlines()
             if "eventlog.access" not in line and any(word in line for word in words)][-8:]
    result = {"partitions": n, "processes": FAMILY_PROCESSES, "start_s": median(starts),
              "stop_s": median(stops), "starts_s": starts, "stops_s": stops,
              "exit_statuses": statuses, "server_lines": lines}
    ctx.log(f"scale: family of {FAMILY_PROCESSES}, {n:,} partitions: start "
            f"{result['start_s']:.1f} s, stop {result['stop_s']:.1f} s, exit {statuses}")
    return result


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
    data = report.get("first_append")
    panels = [report.get("partitions"), data, groups]
    count = sum(1 for panel in panels if panel)
    fig, axes = plt.subplots(1, count, figsize=(5.5 * count, 4.5), squeeze=False)
    free = list(axes[0])
    if report.get("partitions"):
        _plot_partitions(free.pop(0), report)
    if data:
        _plot_first_append(free.pop(0), data)
    if groups:
        _plot_groups(free.pop(0), groups)
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


def _plot_partitions(left: Any, report: dict[str, Any]) -> None:
    """Start and stop against partitions, in process and (x markers) in a family of 2."""
    parts = report["partitions"]
    ns = [int(n) for n in parts]
    slopes = report["slopes"]
    for what in ("start", "stop"):
        label = f"in process: {what} (slope {slopes[what]:.2f})"
        left.plot(ns, [parts[str(n)][f"{what}_s"] for n in ns], marker="o", label=label)
    family = {int(n): r for n, r in (report.get("family") or {}).items() if int(n) > 0}
    if family:
        fns = sorted(family)
        for what in ("start", "stop"):
            left.plot(fns, [family[n][f"{what}_s"] for n in fns], marker="x", linestyle="--",
                      label=f"--processes {FAMILY_PROCESSES}: {what} (from the command)")
        left.axhline(GOAL_FAMILY_S, color="red", linestyle=":", label="goal 30 s at 50,000")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("partitions")
    left.set_ylabel("seconds (log)")
    left.legend(fontsize=7)


def _plot_first_append(right: Any, data: dict[str, Any]) -> None:
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
