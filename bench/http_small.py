"""Many small appends: one-record produces of 256 B from 100 wrk connections spread over a
100-partition topic, against Redis Streams with `appendfsync always` fed the same shape.

What is measured. eventlog: `eventlog serve --processes 1` and `--processes 2` (the default on
this 2-core machine), each on a fresh data dir and free port, default topic configs (every
group commit fdatasync'ed before its producers hear back). wrk (one thread, 100 connections)
POSTs `{"records": [{"value": "<256 B>"}]}` to `/v1/topics/t/partitions/<p>/records`, p drawn
at random per request from 0..99 by the Lua script. Redis: redis-server with `appendonly yes,
appendfsync always` (an fsync of the AOF before each reply), fed by redis-benchmark `-c 100 -r
100` with `XADD stream:__rand_int__ * f <256 B>` (100 streams, no pipelining), as the issue's
measurement did. Cells alternate between the three (the order rotating each repeat); medians of
the repeats are compared.

Per cell: appends/s, latency percentiles (wrk's; redis-benchmark's), the server's CPU in cores
(the process tree's utime + stime from /proc), fsyncs per second and appends per fsync from
/metrics. After each eventlog cell the topic's high watermarks must account for every
acknowledged append.

Goal (issue 13, on this 2-core machine where wrk and Redis share the cores): the default server
(--processes 2 here) >= 0.25 x Redis's appends/s, with p99 <= 20 ms.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from .harness import Context, median, remove_tree, summary_row
from .http_produce import _redis_benchmark_csv, _redis_cli
from .http_shards import (
    ShardedServer,
    _counters,
    machine_busy_seconds,
    serve_knows_processes,
    tree_cpu_seconds,
    wait_for_quiet,
)
from .servers import (
    WRK_DONE_LUA,
    RedisServer,
    children_cpu_seconds,
    require,
    run_wrk,
    running,
    tail,
    wrk_version,
)

NAME = "small"
TITLE = "One-record appends (256 B) over 100 partitions from 100 connections, against Redis AOF always"

PARTITIONS = 100
CONNECTIONS = 100
VALUE_BYTES = 256
GOAL_RATIO = 0.25
GOAL_P99_MS = 20.0
SYSTEMS = ("eventlog-p1", "eventlog-p2", "redis-always")
DEFAULT_SYSTEM = "eventlog-p2"  # --processes defaults to the number of cores: 2 here
COLORS = {"eventlog-p1": "tab:blue", "eventlog-p2": "tab:orange", "redis-always": "tab:red"}
REDIS_GUESS = 40_000  # appends/s, for sizing redis-benchmark's -n before its first cell


def params(quick: bool) -> dict[str, Any]:
    return {
        "partitions": PARTITIONS,
        "connections": CONNECTIONS,
        "value_bytes": VALUE_BYTES,
        "cell_seconds": 3 if quick else 8,
        "repeats": 1 if quick else 3,
        "wrk": "one thread, 100 connections, a Lua script drawing the partition of each request",
        "redis": "appendonly yes, appendfsync always; redis-benchmark -c 100 -r 100 XADD stream:__rand_int__ * f <256 B>",
        "topic_config": "defaults (flush.messages=1: acknowledged = fdatasync'ed)",
    }


class AlwaysRedis(RedisServer):
    """redis-server with an fsync of its append-only file before every reply."""

    name = "redis-always"

    def __init__(self, directory: Path):
        super().__init__(directory)
        self.cmd[self.cmd.index("everysec")] = "always"
        self.log_path = directory / f"{self.name}.out"


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    if not serve_knows_processes():
        raise RuntimeError("eventlog serve has no --processes option in this tree")
    redis_benchmark = require("redis-benchmark", "redis-tools")
    value = "v" * VALUE_BYTES
    script = post_script(work / "post.lua")
    servers: dict[str, Any] = {
        "eventlog-p1": ShardedServer(ctx, work / "p1", 1, True),
        "eventlog-p2": ShardedServer(ctx, work / "p2", 2, True),
        "redis-always": AlwaysRedis(work / "redis"),
    }
    cells: list[dict[str, Any]] = []
    redis_rate = float(REDIS_GUESS)
    try:
        with running(*servers.values()):
            for name in ("eventlog-p1", "eventlog-p2"):
                with httpx.Client(base_url=servers[name].url, timeout=60) as client:
                    made = client.post("/v1/topics", json={"name": "t", "partitions": PARTITIONS})
                    if made.status_code != 201:
                        raise RuntimeError(f"create topic: {made.status_code} {made.text}")
            for repeat in range(p["repeats"]):
                shift = repeat % len(SYSTEMS)
                for name in SYSTEMS[shift:] + SYSTEMS[:shift]:
                    gate = wait_for_quiet([s.pid for s in servers.values()])
                    server = servers[name]
                    server.check_alive()
                    if name == "redis-always":
                        cell = _redis_cell(server, redis_benchmark, value, redis_rate, p["cell_seconds"])
                        redis_rate = cell["appends_per_s"]
                    else:
                        cell = _eventlog_cell(server, script, p["cell_seconds"])
                    cell.update(system=name, repeat=repeat, start_gate=gate)
                    cells.append(cell)
                    ctx.log(
                        f"{name:>13} (repeat {repeat + 1}): {cell['appends_per_s']:>9,.0f} appends/s, "
                        f"p50 {cell['latency_us']['p50_us'] / 1000:7.2f} ms, p99 {cell['latency_us']['p99_us'] / 1000:7.2f} ms; "
                        f"server {cell['server_cores']:.2f} cores, others {cell['other_cores']:.2f}"
                        + ("" if gate["quiet"] else " (NOT quiet)")
                    )
        facts = {name: s.facts() for name, s in servers.items()}
        for name, s in servers.items():
            if s.exit_status not in (0, None):
                raise RuntimeError(f"{name} exited with {s.exit_status}:\n{tail(s.log_path)}")
    finally:
        remove_tree(work)
    p["servers"] = facts
    p["tools"] = {"wrk": wrk_version()}
    results = _results(cells)
    return {"params": p, "results": results, "summary": _summary(results)}


def post_script(path: Path) -> Path:
    """wrk's Lua script: one-record POSTs of the 256 B value to a partition of topic t drawn at
    random per request (bench.kafka_small measures the same HTTP path next to Kafka's)."""
    value = "v" * VALUE_BYTES
    path.write_text(
        'local body = \'{"records": [{"value": "' + value + '"}]}\'\n'
        'local headers = {["Content-Type"] = "application/json"}\n'
        "math.randomseed(os.time())\n"
        "request = function()\n"
        f"  return wrk.format('POST', '/v1/topics/t/partitions/' .. math.random(0, {PARTITIONS - 1}) .. '/records', headers, body)\n"
        "end\n" + WRK_DONE_LUA
    )
    return path


def _stored(client: httpx.Client) -> int:
    return sum(part["high_watermark"] for part in client.get("/v1/topics/t").json()["partitions"])


def _eventlog_cell(server: ShardedServer, script: Path, seconds: int) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        stored0 = _stored(client)
        before = _counters(client)
        cpu0, tools0, (busy0, _) = tree_cpu_seconds(server.pid), children_cpu_seconds(), machine_busy_seconds()
        t0 = time.perf_counter()
        out = run_wrk(script, f"{server.url}/v1/topics/t/partitions/0/records", CONNECTIONS, seconds)
        wall = time.perf_counter() - t0
        cpu = tree_cpu_seconds(server.pid) - cpu0
        tools = children_cpu_seconds() - tools0
        busy1, _ = machine_busy_seconds()
        after = _counters(client)
        stored = _stored(client) - stored0
    acknowledged = out["requests"]
    if stored < acknowledged:
        raise RuntimeError(f"{acknowledged} appends acknowledged, {stored} stored")
    duration = out["duration_us"] / 1e6
    fsyncs = after["eventlog_fsync_seconds_count"] - before["eventlog_fsync_seconds_count"]
    return {
        "appends": acknowledged,
        "appends_stored": stored,
        "seconds": duration,
        "appends_per_s": round(acknowledged / duration, 1),
        "latency_us": {k: out[k] for k in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us")},
        "server_cores": round(cpu / wall, 3),
        "server_cpu_us_per_append": round(cpu / acknowledged * 1e6, 1) if acknowledged else None,
        "wrk_cores": round(tools / wall, 3),
        "other_cores": round(max(0.0, (busy1 - busy0) - cpu - tools) / wall, 3),
        "fsyncs_per_s": round(fsyncs / wall, 1),
        "appends_per_fsync": round(stored / fsyncs, 2) if fsyncs else None,
        "mean_fsync_ms": round(
            (after["eventlog_fsync_seconds_sum"] - before["eventlog_fsync_seconds_sum"]) / fsyncs * 1000, 3
        ) if fsyncs else None,
        "wrk": out,
    }


def _redis_cell(
    server: AlwaysRedis, redis_benchmark: str, value: str, rate: float, seconds: int, pipeline: int = 1
) -> dict[str, Any]:
    """redis-benchmark's XADDs to 100 streams for about `seconds` at the last `rate`; `pipeline`
    > 1 adds -P (bench.kafka_small's peer: -P 16)."""
    n = max(10 * CONNECTIONS * pipeline, int(rate * seconds))
    if pipeline > 1:  # redis-benchmark -P sends whole pipelines: -n a multiple, or it overshoots
        n -= n % (CONNECTIONS * pipeline)
    cmd = [
        redis_benchmark, "-h", "127.0.0.1", "-p", str(server.port), "-c", str(CONNECTIONS), "-r", "100",
        *(["-P", str(pipeline)] if pipeline > 1 else []),
        "-n", str(n), "--csv", "XADD", "stream:__rand_int__", "*", "f", value,
    ]  # fmt: skip
    cpu0, tools0, (busy0, _) = tree_cpu_seconds(server.pid), children_cpu_seconds(), machine_busy_seconds()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    cpu = tree_cpu_seconds(server.pid) - cpu0
    tools = children_cpu_seconds() - tools0
    busy1, _ = machine_busy_seconds()
    row = _redis_benchmark_csv(done.stdout)
    stored = sum(int(_redis_cli(server.port, "XLEN", f"stream:{i:012d}")) for i in range(100))
    _redis_cli(server.port, "FLUSHALL")
    if stored != n:
        raise RuntimeError(f"redis-benchmark: {n} XADDs sent, {stored} entries stored")
    per_s = float(row["rps"])
    return {
        "appends": n,
        "seconds": round(n / per_s, 3),
        "appends_per_s": round(per_s, 1),
        "latency_us": {
            "p50_us": float(row["p50_latency_ms"]) * 1000,
            "p99_us": float(row["p99_latency_ms"]) * 1000,
            "max_us": float(row["max_latency_ms"]) * 1000,
            "mean_us": float(row["avg_latency_ms"]) * 1000,
        },
        "server_cores": round(cpu / wall, 3),
        "server_cpu_us_per_append": round(cpu / n * 1e6, 1),
        "wrk_cores": round(tools / wall, 3),
        "other_cores": round(max(0.0, (busy1 - busy0) - cpu - tools) / wall, 3),
        "redis_benchmark": {**row, "command": " ".join(cmd[:-1]) + f" <{VALUE_BYTES}-byte value>"},
    }



# -- results ------------------------------------------------------------------------------------


def _results(cells: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, dict[str, Any]] = {}
    for name in SYSTEMS:
        runs = [c for c in cells if c["system"] == name]
        by[name] = {
            "median_appends_per_s": round(median(r["appends_per_s"] for r in runs), 1),
            "appends_per_s": [r["appends_per_s"] for r in runs],
            "median_p50_us": median(r["latency_us"]["p50_us"] for r in runs),
            "median_p99_us": median(r["latency_us"]["p99_us"] for r in runs),
            "median_server_cores": round(median(r["server_cores"] for r in runs), 3),
            "median_server_cpu_us_per_append": round(median(r["server_cpu_us_per_append"] for r in runs), 1),
            "median_other_cores": round(median(r["other_cores"] for r in runs), 3),
        }
        if name != "redis-always":
            by[name]["median_appends_per_fsync"] = median(r["appends_per_fsync"] or 0 for r in runs)
            by[name]["median_fsyncs_per_s"] = median(r["fsyncs_per_s"] for r in runs)
    redis = by["redis-always"]["median_appends_per_s"]
    return {
        "by_system": by,
        "ratio_to_redis": {name: round(by[name]["median_appends_per_s"] / redis, 4) for name in SYSTEMS if name != "redis-always"},
        "goal": f">= {GOAL_RATIO} x Redis (AOF always) with p99 <= {GOAL_P99_MS:.0f} ms, at the default --processes",
        "cells": cells,
    }


def _summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    by = results["by_system"]
    redis = by["redis-always"]
    rows = []
    for name in ("eventlog-p2", "eventlog-p1"):
        e = by[name]
        ratio = results["ratio_to_redis"][name]
        p99_ms = e["median_p99_us"] / 1000
        goal = name == DEFAULT_SYSTEM
        rows.append(
            summary_row(
                f"one-record appends, 100 partitions, 100 connections: --processes {name[-1]} vs Redis AOF always",
                f"{e['median_appends_per_s']:,.0f}/s, p99 {p99_ms:.1f} ms, {e['median_server_cores']:.2f} cores",
                f"Redis: {redis['median_appends_per_s']:,.0f}/s, p99 {redis['median_p99_us'] / 1000:.1f} ms",
                ratio,
                f">= {GOAL_RATIO} (and p99 <= {GOAL_P99_MS:.0f} ms)" if goal else "(informational)",
                (ratio >= GOAL_RATIO and p99_ms <= GOAL_P99_MS) if goal else None,
            )
        )
    return rows


# -- plot ---------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    by = report["results"]["by_system"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    names = list(SYSTEMS)
    ax = axes[0]
    ax.bar(names, [by[n]["median_appends_per_s"] for n in names], color=[COLORS[n] for n in names])
    for i, n in enumerate(names):
        ax.scatter([i] * len(by[n]["appends_per_s"]), by[n]["appends_per_s"], color="black", s=10, zorder=3)
    redis = by["redis-always"]["median_appends_per_s"]
    ax.axhline(redis * GOAL_RATIO, color="red", linestyle=":", label=f"goal: {GOAL_RATIO} x Redis")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / 1000:,.1f}k"))
    ax.set_ylabel("appends/s (median; dots = repeats)")
    ax.set_title("one-record appends, 256 B, 100 partitions, 100 connections")
    ax.legend(fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax = axes[1]
    width = 0.38
    xs = range(len(names))
    ax.bar([x - width / 2 for x in xs], [by[n]["median_p50_us"] / 1000 for n in names], width, label="p50")
    ax.bar([x + width / 2 for x in xs], [by[n]["median_p99_us"] / 1000 for n in names], width, label="p99")
    ax.axhline(GOAL_P99_MS, color="red", linestyle=":", label=f"goal: p99 <= {GOAL_P99_MS:.0f} ms")
    ax.set_xticks(list(xs), names)
    ax.set_yscale("log")
    ax.set_ylabel("latency, ms (log)")
    ax.set_title("latency")
    ax.legend(fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{report['date'][:16]} — {report['command']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

