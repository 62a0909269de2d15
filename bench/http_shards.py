"""JSON produce from wrk against `eventlog serve --processes 1` and `--processes 2`, same run.

What is measured. Two real servers run side by side for the whole benchmark, each on a fresh
data dir and a free port: `eventlog serve --processes 1` (one process, as before issue 12) and
`eventlog serve --processes 2` (a supervisor and two shard processes sharing the port). wrk
(one thread, a Lua script POSTing a fixed body) sends `POST /v1/topics/{t}/records` with 500
records of 100-byte values (http_produce's moonshot body: the same 500 keys every time, so the
key-hash cache always hits) to a fresh 4-partition topic per cell, at 4, 16 and 64 connections.
Default topic configs: every group commit fdatasync'ed before its producers hear back.

Cells alternate between the two servers (the order rotates each repeat), so a slow minute of
this shared machine hits both alike; medians of the repeats are compared. Other sessions share
these 2 CPUs, and their load is not noise here: it takes the core a second shard needs. So a
cell starts only once the rest of the machine used less than QUIET_CORES over a second (waiting
at most QUIET_WAIT_S), every cell records what other processes used while it ran, and the
medians are taken over the cells during which they used less than QUIET_CORES (over all cells
where none was quiet, and the results say so); up to 3 more repeats run while a cell kind has
fewer than 2 quiet cells. Goal: records/s with
two shards >= 1.4 x one process at 16 and 64 connections, where the server has requests queued.
At 4 connections each shard holds 2 requests, and a request waits for its fdatasync (and the
other shard's) with nothing else to do meanwhile; that cell is reported without a goal.

The ceiling, same run: two independent `--processes 1` servers (own data dirs, own ports), each
loaded by its own wrk with half the connections, summed: what two processes on this machine do
when they never talk to each other. The family's share of it says what the hand-off and the
shared work cost.

Per cell: records/s (wrk's completed requests x 500 / wrk's duration), latency percentiles, the
server's CPU use in cores (utime + stime of the supervisor and every process under it, read
from /proc before and after the cell: see tree_cpu_seconds), wrk's own CPU, what the rest of
the machine used (other sessions share these 2 CPUs), and group commits
from /metrics (the family's sum once the shards aggregate it). After each cell the topic's high
watermarks must account for every acknowledged record (more is fine: requests in flight when
wrk stops are appended but not counted). A server that does not know `--processes` yet (before
the supervisor lands) is measured at N = 1 without the flag and N > 1 is skipped, so saying.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from . import http_produce
from .harness import Context, median, remove_tree, summary_row
from .servers import (
    CLK_TCK,
    WRK_DONE_LUA,
    EventlogServer,
    children_cpu_seconds,
    run_wrk,
    running,
    tail,
    wrk_version,
)

NAME = "shards"
TITLE = "JSON produce from wrk (500 x 100 B records/request): --processes 2 vs --processes 1"

PROCESSES = (1, 2)
CONNECTIONS = (4, 16, 64)
RECORDS_PER_REQUEST = http_produce.RECORDS_PER_REQUEST
PARTITIONS = 4
GOAL_RATIO = 1.4
GOAL_CONNECTIONS = (16, 64)  # where the server, not fdatasync latency, bounds the rate
PAIR = "pair"  # two independent --processes 1 servers, each with half the connections
QUIET_CORES = 0.25  # others' CPU use (cores) below which a cell may start
QUIET_WAIT_S = 60.0
COLORS = {4: "tab:blue", 16: "tab:orange", 64: "tab:green"}


def params(quick: bool) -> dict[str, Any]:
    return {
        "processes": list(PROCESSES),
        "connections": list(CONNECTIONS),
        "records_per_request": RECORDS_PER_REQUEST,
        "value_bytes": http_produce.VALUE_BYTES,
        "body": "http_produce's wrk body: 500 records, keys key-0000000 .. key-0000499 every time",
        "partitions": PARTITIONS,
        "cell_seconds": 2 if quick else 5,
        "repeats": 1 if quick else 3,
        # more repeats (at most this many) while a (N, connections) has fewer quiet cells than wanted
        "extra_repeats": 0 if quick else 3,
        "quiet_cells_wanted": 1 if quick else 2,
        "wrk": "one thread (-t1), -cN, a Lua script POSTing the fixed body",
        "topic_config": "defaults (flush.messages=1: acknowledged = fdatasync'ed)",
        "server_cores": "utime+stime of the supervisor and all processes under it (/proc), per wall second",
        "start_gate": (
            f"a cell starts once other processes used < {QUIET_CORES} cores for 1 s (waiting at most "
            f"{QUIET_WAIT_S:.0f} s): on 2 CPUs another session's load takes the second shard's core"
        ),
    }


# -- the servers --------------------------------------------------------------------------------


def serve_knows_processes() -> bool:
    """Whether this working tree's `eventlog serve` takes --processes (the supervisor)."""
    script = Path(sys.executable).with_name("eventlog")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]
    done = subprocess.run(
        [*base, "serve", "--help"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    return "--processes" in done.stdout


class ShardedServer(EventlogServer):
    """`eventlog serve --processes N` (without the flag when `flag` is False: N = 1 only)."""

    def __init__(self, ctx: Context, directory: Path, processes: int, flag: bool):
        super().__init__(ctx, directory)
        self.name = f"eventlog-p{processes}"
        self.log_path = directory / f"{self.name}.out"
        self.processes = processes
        if flag:
            self.cmd = [*self.cmd, "--processes", str(processes)]
        elif processes != 1:
            raise ValueError("N > 1 needs eventlog serve --processes")

    def facts(self) -> dict[str, Any]:
        return {**super().facts(), "processes": self.processes, "tree_pids": tree_pids(self.pid)}


def tree_pids(root: int) -> list[int]:
    """`root` and every live process under it (children of children too), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, ()))
    return sorted(out)


def machine_busy_seconds() -> tuple[float, float]:
    """CPU seconds the whole machine spent so far in processes (/proc/stat: user, nice,
    system) and in interrupts (irq, softirq: loopback TCP is largely softirq, charged to no
    process). Sessions in other containers share this kernel and show up here."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system) / CLK_TCK, (irq + softirq) / CLK_TCK


def wait_for_quiet(pids: list[int], wait_s: float = QUIET_WAIT_S) -> dict[str, Any]:
    """Wait (at most `wait_s`) until the machine's processes other than `pids` (the idle
    servers) used less than QUIET_CORES over one second: on 2 CPUs, another session's test run
    takes the core a second shard needs, which biases the comparison against N = 2 rather than
    adding noise. Returns the seconds waited and whether it got quiet."""
    start = time.monotonic()
    while True:
        own0, (busy0, _) = sum(tree_cpu_seconds(p) for p in pids), machine_busy_seconds()
        time.sleep(1.0)
        own1, (busy1, _) = sum(tree_cpu_seconds(p) for p in pids), machine_busy_seconds()
        others = max(0.0, (busy1 - busy0) - (own1 - own0))
        waited = time.monotonic() - start
        if others < QUIET_CORES or waited > wait_s:
            return {"waited_s": round(waited, 1), "quiet": others < QUIET_CORES, "others_cores_before": round(others, 2)}


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of a process tree: for every live process under `root` (itself included)
    utime + stime + cutime + cstime. A descendant that exited and was reaped is in its parent's
    cutime/cstime, and no longer live, so each process counts once; a live shard's threads are
    in its own utime/stime. (A process reaped during a cell brings its whole life's CPU time
    with it; shards live as long as the server.)"""
    total = 0
    for pid in tree_pids(root):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(x) for x in fields[11:15])
    return total / CLK_TCK


# -- the cells ----------------------------------------------------------------------------------


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    flag = serve_knows_processes()
    measured = PROCESSES if flag else (1,)
    if not flag:
        ctx.log("eventlog serve has no --processes yet: N = 1 only (without the flag), N = 2 skipped")
    p["serve_has_processes_flag"] = flag
    body_file = work / "body.json"
    body_file.write_bytes(
        orjson.dumps({"records": [{"key": k, "value": v} for k, v in http_produce.records()]})
    )
    script = work / "post.lua"
    script.write_text(
        'local f = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))\n'
        'wrk.method = "POST"\nwrk.body = f:read("*a")\nf:close()\n'
        'wrk.headers["Content-Type"] = "application/json"\n' + WRK_DONE_LUA
    )
    servers = {n: ShardedServer(ctx, work / f"p{n}", n, flag) for n in measured}
    twin = ShardedServer(ctx, work / "p1-twin", 1, flag)
    twin.name = "eventlog-p1-twin"
    twin.log_path = work / "p1-twin" / f"{twin.name}.out"
    systems: tuple[int | str, ...] = (*measured, PAIR)
    everything = [*servers.values(), twin]
    cells: list[dict[str, Any]] = []
    try:
        with running(*everything):
            ctx.log(", ".join(f"--processes {n} on :{s.port} (pids {tree_pids(s.pid)})" for n, s in servers.items()))
            serial = 0
            for repeat in range(p["repeats"] + p["extra_repeats"]):
                if repeat >= p["repeats"] and _enough_quiet(cells, systems, p["quiet_cells_wanted"]):
                    break
                for index, connections in enumerate(CONNECTIONS):
                    shift = (repeat + index) % len(systems)
                    for n in systems[shift:] + systems[:shift]:
                        serial += 1
                        gate = wait_for_quiet([s.pid for s in everything])
                        if n == PAIR:
                            cell = _pair_cell((servers[1], twin), script, body_file, connections, p["cell_seconds"], f"shards-{serial}")
                        else:
                            cell = _cell(servers[n], script, body_file, connections, p["cell_seconds"], f"shards-{serial}")
                        cell.update(processes=n, repeat=repeat, start_gate=gate)
                        cells.append(cell)
                        ctx.log(
                            f"{_label(n)} x {connections:>2} connections (repeat {repeat + 1}): "
                            f"{cell['records_per_s']:>9,.0f} rec/s, p50 {cell['latency_us']['p50_us'] / 1000:6.1f} ms, "
                            f"p99 {cell['latency_us']['p99_us'] / 1000:6.1f} ms; server {cell['server_cores']:.2f} cores "
                            f"({cell['server_processes']} processes), wrk {cell['wrk_cores']:.2f}, "
                            f"others {cell['other_cores']:.2f}, irq {cell['irq_cores']:.2f}"
                            + (f" (waited {gate['waited_s']:.0f} s for a quiet machine)" if gate["waited_s"] > 1.5 else "")
                            + ("" if gate["quiet"] else " (NOT quiet)")
                        )
        facts = {str(n): s.facts() for n, s in servers.items()}
        facts["1-twin"] = twin.facts()
        for s in everything:
            if s.exit_status != 0:
                raise RuntimeError(f"{s.name} exited with {s.exit_status}:\n{tail(s.log_path)}")
    finally:
        remove_tree(work)
    p["servers"] = facts
    p["tools"] = {"wrk": wrk_version()}
    results = _results(cells, systems, flag)
    return {"params": p, "results": results, "summary": _summary(results)}


def _label(n: int | str) -> str:
    return "2 x --processes 1 (ceiling)" if n == PAIR else f"--processes {n}"


def _pair_cell(
    pair: tuple[ShardedServer, ShardedServer], script: Path, body_file: Path, connections: int, seconds: int, topic: str
) -> dict[str, Any]:
    """The ceiling: both single-process servers at once, each with its own wrk and half the
    connections; records/s summed, CPU of both trees."""
    from concurrent.futures import ThreadPoolExecutor

    clients = [httpx.Client(base_url=s.url, timeout=60) for s in pair]
    try:
        for server, client in zip(pair, clients, strict=True):
            server.check_alive()
            made = client.post("/v1/topics", json={"name": topic, "partitions": PARTITIONS})
            if made.status_code != 201:
                raise RuntimeError(f"create topic: {made.status_code} {made.text}")
        cpu0 = sum(tree_cpu_seconds(s.pid) for s in pair)
        tools0, (busy0, irq0) = children_cpu_seconds(), machine_busy_seconds()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(
                lambda s: run_wrk(script, f"{s.url}/v1/topics/{topic}/records", connections // 2, seconds,
                                  env={"BENCH_BODY_FILE": str(body_file)}),
                pair,
            ))
        wall = time.perf_counter() - t0
        cpu = sum(tree_cpu_seconds(s.pid) for s in pair) - cpu0
        tools = children_cpu_seconds() - tools0
        busy1, irq1 = machine_busy_seconds()
        for client in clients:
            client.delete(f"/v1/topics/{topic}")
    finally:
        for client in clients:
            client.close()
    acknowledged = sum(o["requests"] for o in outs) * RECORDS_PER_REQUEST
    rate = sum(o["requests"] * RECORDS_PER_REQUEST / (o["duration_us"] / 1e6) for o in outs)
    return {
        "connections": connections,
        "seconds": max(o["duration_us"] for o in outs) / 1e6,
        "records": acknowledged,
        "records_per_s": round(rate, 1),
        # the slower server's percentiles: a client of the pair waits as long as that
        "latency_us": {k: max(o[k] for o in outs) for k in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us")},
        "server_cpu_s": round(cpu, 3),
        "server_cores": round(cpu / wall, 3),
        "server_cpu_us_per_record": round(cpu / acknowledged * 1e6, 3) if acknowledged else None,
        "server_processes": 2,
        "wrk_cores": round(tools / wall, 3),
        "other_cores": round(max(0.0, (busy1 - busy0) - cpu - tools) / wall, 3),
        "irq_cores": round((irq1 - irq0) / wall, 3),
        "wrk": outs,
    }


def _enough_quiet(cells: list[dict[str, Any]], measured: tuple[int | str, ...], wanted: int) -> bool:
    return all(
        sum(1 for x in cells if x["processes"] == n and x["connections"] == c and x["other_cores"] < QUIET_CORES) >= wanted
        for n in measured
        for c in CONNECTIONS
    )


def _cell(
    server: ShardedServer, script: Path, body_file: Path, connections: int, seconds: int, topic: str
) -> dict[str, Any]:
    server.check_alive()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        made = client.post("/v1/topics", json={"name": topic, "partitions": PARTITIONS})
        if made.status_code != 201:
            raise RuntimeError(f"create topic: {made.status_code} {made.text}")
        before_metrics = _counters(client)
        pids = tree_pids(server.pid)
        cpu0, tools0, (busy0, irq0) = tree_cpu_seconds(server.pid), children_cpu_seconds(), machine_busy_seconds()
        t0 = time.perf_counter()
        out = run_wrk(
            script,
            f"{server.url}/v1/topics/{topic}/records",
            connections,
            seconds,
            env={"BENCH_BODY_FILE": str(body_file)},
        )
        wall = time.perf_counter() - t0
        cpu = tree_cpu_seconds(server.pid) - cpu0
        tools = children_cpu_seconds() - tools0
        busy1, irq1 = machine_busy_seconds()
        busy, irq = busy1 - busy0, irq1 - irq0
        commits = _commit_stats(before_metrics, _counters(client))
        detail = client.get(f"/v1/topics/{topic}").json()
        stored = sum(part["high_watermark"] for part in detail["partitions"])
        acknowledged = out["requests"] * RECORDS_PER_REQUEST
        if stored < acknowledged:
            raise RuntimeError(f"{topic}: {acknowledged} records acknowledged, {stored} stored")
        deleted = client.delete(f"/v1/topics/{topic}")
        if deleted.status_code != 204:
            raise RuntimeError(f"delete topic: {deleted.status_code} {deleted.text}")
    duration = out["duration_us"] / 1e6
    return {
        "connections": connections,
        "seconds": duration,
        "records": acknowledged,
        "records_stored": stored,
        "records_per_s": round(acknowledged / duration, 1),
        "latency_us": {k: out[k] for k in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us")},
        "server_cpu_s": round(cpu, 3),
        "server_cores": round(cpu / wall, 3),
        "server_cpu_us_per_record": round(cpu / acknowledged * 1e6, 3) if acknowledged else None,
        "server_processes": len(pids),
        "wrk_cores": round(tools / wall, 3),
        # every other process on the machine (the other server idles; other sessions may not)
        "other_cores": round(max(0.0, busy - cpu - tools) / wall, 3),
        "irq_cores": round(irq / wall, 3),
        "commits": commits,
        "wrk": out,
    }


_COUNTERS = (
    "eventlog_fsync_seconds_count",
    "eventlog_fsync_seconds_sum",
    "eventlog_group_commit_records_sum",
)


def _counters(client: httpx.Client) -> dict[str, float]:
    out = dict.fromkeys(_COUNTERS, 0.0)
    for line in client.get("/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in out:
            out[name] = float(value)
    return out


def _commit_stats(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    d = {k: after[k] - before[k] for k in before}
    fsyncs = d["eventlog_fsync_seconds_count"]
    return {
        "fsyncs": int(fsyncs),
        "mean_fsync_ms": round(d["eventlog_fsync_seconds_sum"] / fsyncs * 1000, 3) if fsyncs else None,
        "records_per_fsync": round(d["eventlog_group_commit_records_sum"] / fsyncs, 1) if fsyncs else None,
    }


# -- results ------------------------------------------------------------------------------------


def _results(cells: list[dict[str, Any]], measured: tuple[int | str, ...], flag: bool) -> dict[str, Any]:
    """Medians per (N, connections) over the quiet cells (others used < QUIET_CORES while the
    cell ran); over every cell where none was quiet (said in `cells_used`)."""
    by: dict[str, dict[str, Any]] = {}
    for n in measured:
        by[str(n)] = {}
        for c in CONNECTIONS:
            every = [x for x in cells if x["processes"] == n and x["connections"] == c]
            quiet = [x for x in every if x["other_cores"] < QUIET_CORES]
            runs = quiet or every
            by[str(n)][str(c)] = {
                "cells_used": f"{len(quiet)} quiet of {len(every)}" if quiet else f"all {len(every)} (none quiet)",
                "median_records_per_s": round(median(r["records_per_s"] for r in runs), 1),
                "records_per_s": [r["records_per_s"] for r in runs],
                "median_records_per_s_every_cell": round(median(r["records_per_s"] for r in every), 1),
                "median_server_cores": round(median(r["server_cores"] for r in runs), 3),
                "server_cores": [r["server_cores"] for r in runs],
                "median_server_cpu_us_per_record": round(median(r["server_cpu_us_per_record"] for r in runs), 3),
                "median_p50_us": median(r["latency_us"]["p50_us"] for r in runs),
                "median_p99_us": median(r["latency_us"]["p99_us"] for r in runs),
                "median_wrk_cores": round(median(r["wrk_cores"] for r in runs), 3),
                "median_other_cores": round(median(r["other_cores"] for r in runs), 3),
                "other_cores_every_cell": [r["other_cores"] for r in every],
            }
    ratio = ceiling = None
    if 2 in measured:
        ratio = {
            str(c): round(by["2"][str(c)]["median_records_per_s"] / by["1"][str(c)]["median_records_per_s"], 3)
            for c in CONNECTIONS
        }
        ceiling = {
            str(c): round(by["2"][str(c)]["median_records_per_s"] / by[PAIR][str(c)]["median_records_per_s"], 3)
            for c in CONNECTIONS
        }
    return {
        "by_processes": by,
        "ratio_n2_to_n1": ratio,
        "ratio_n2_to_ceiling": ceiling,
        "ceiling": "two independent --processes 1 servers at once, half the connections each, summed",
        "goal_ratio": GOAL_RATIO,
        "goal_connections": list(GOAL_CONNECTIONS),
        "skipped": None if flag else "eventlog serve has no --processes option in this tree: N = 2 not measured",
        "cells": cells,
    }


def _summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    by = results["by_processes"]
    ratio = results["ratio_n2_to_n1"]
    rows = []
    for c in CONNECTIONS:
        one = by["1"][str(c)]
        if ratio is None:
            rows.append(
                summary_row(
                    f"JSON produce from wrk, {c} connections, records/s, --processes 2 vs 1",
                    "not measured (no --processes yet)",
                    f"--processes 1: {one['median_records_per_s']:,.0f}/s at {one['median_server_cores']:.2f} cores",
                    None,
                    f">= {GOAL_RATIO}",
                    None,
                )
            )
            continue
        two = by["2"][str(c)]
        goal = c in GOAL_CONNECTIONS
        rows.append(
            summary_row(
                f"JSON produce from wrk, {c} connections, records/s, --processes 2 vs 1",
                f"{two['median_records_per_s']:,.0f}/s at {two['median_server_cores']:.2f} cores "
                f"({two['cells_used']} cells)",
                f"--processes 1: {one['median_records_per_s']:,.0f}/s at {one['median_server_cores']:.2f} cores "
                f"({one['cells_used']} cells)",
                ratio[str(c)],
                f">= {GOAL_RATIO}" if goal else "none (bound by fdatasync waits)",
                ratio[str(c)] >= GOAL_RATIO if goal else None,
            )
        )
    ceiling = results.get("ratio_n2_to_ceiling")
    if ceiling is not None:
        for c in CONNECTIONS:
            two, pair = by["2"][str(c)], by[PAIR][str(c)]
            rows.append(
                summary_row(
                    f"JSON produce from wrk, {c} connections, records/s, --processes 2 vs two independent servers",
                    f"{two['median_records_per_s']:,.0f}/s",
                    f"2 x --processes 1 (ceiling): {pair['median_records_per_s']:,.0f}/s at "
                    f"{pair['median_server_cores']:.2f} cores ({pair['cells_used']} cells)",
                    ceiling[str(c)],
                    "none (what the family's hand-off costs)",
                    None,
                )
            )
    return rows


# -- plot ---------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    r = report["results"]
    by = r["by_processes"]
    ns = sorted(int(n) for n in by if n != PAIR)
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    ax = axes[0]
    for c in CONNECTIONS:
        ax.plot(ns, [by[str(n)][str(c)]["median_records_per_s"] for n in ns], "-o", color=COLORS[c], label=f"{c} connections")
        for n in ns:
            dots = by[str(n)][str(c)]["records_per_s"]
            ax.scatter([n] * len(dots), dots, color=COLORS[c], s=10, alpha=0.5, zorder=3)
        if PAIR in by and len(ns) > 1:
            ax.scatter([ns[-1]], [by[PAIR][str(c)]["median_records_per_s"]], marker="_", s=400, color=COLORS[c], zorder=4,
                       label="ceiling (dash): 2 independent --processes 1, half the connections each" if c == CONNECTIONS[0] else None)
    if len(ns) > 1:
        base = max(by["1"][str(c)]["median_records_per_s"] for c in CONNECTIONS)
        ax.plot([1, ns[-1]], [base, base * GOAL_RATIO], ":", color="red",
                label=f"goal: {GOAL_RATIO} x at N = 2 ({' and '.join(map(str, GOAL_CONNECTIONS))} connections)")
        for c in CONNECTIONS:
            ax.annotate(
                f"{r['ratio_n2_to_n1'][str(c)]:.2f} x",
                (ns[-1], by[str(ns[-1])][str(c)]["median_records_per_s"]),
                textcoords="offset points", xytext=(8, 0), va="center", color=COLORS[c], fontweight="bold",
            )
    ax.set_xticks(ns)
    ax.set_xlim(0.7, max(ns) + 0.5)
    ax.set_ylim(0, None)
    ax.set_xlabel("--processes N")
    ax.set_ylabel("records/s (median; dots = repeats)")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / 1000:,.0f}k"))
    ax.set_title("JSON produce from wrk, 500 x 100 B records/request, 4 partitions")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    if r.get("skipped"):
        ax.text(0.5, 0.05, r["skipped"], transform=ax.transAxes, ha="center", fontsize=8, color="red")

    ax = axes[1]
    for c in CONNECTIONS:
        ax.plot(ns, [by[str(n)][str(c)]["median_server_cores"] for n in ns], "-o", color=COLORS[c], label=f"{c} connections")
        for n in ns:
            dots = by[str(n)][str(c)]["server_cores"]
            ax.scatter([n] * len(dots), dots, color=COLORS[c], s=10, alpha=0.5, zorder=3)
    ax.plot(ns, ns, ":", color="grey", label="N cores")
    ax.set_xticks(ns)
    ax.set_xlim(0.7, max(ns) + 0.5)
    ax.set_ylim(0, max(ns) + 0.3)
    ax.set_xlabel("--processes N")
    ax.set_ylabel("server CPU, cores (supervisor + shards)")
    ax.set_title(f"server cores used ({report['machine']['cpu_count']} CPUs here, wrk on the same ones)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    fig.suptitle(f"shards, {report['mode']} run, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
