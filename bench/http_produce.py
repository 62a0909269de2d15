"""JSON produce over HTTP, against Redis Streams and NATS JetStream fed the same records.

What is measured. The real `eventlog serve` (a subprocess, default topic configs: every group
commit fdatasync'ed before its producers hear back) takes `POST /v1/topics/{t}/records` with
{"records": [{"key": ..., "value": ...}] x 500}: 500 records per request with distinct 100-byte
ASCII values and 500 new keys each time (key-0000000 .. key-0999999, cycling: murmur2-partitioned
over a 4-partition topic by the server, and never found in its cache of recent key hashes). 1, 4 and 16 clients are asyncio tasks sharing one
httpx.AsyncClient (HTTP/1.1 keep-alive, one connection per client). Each client builds its body
(orjson.dumps), posts it, and parses the reply (500 offsets); the request latency is that whole
round trip. Each cell runs for a fixed time on a fresh topic (deleted afterwards).

Peers, the same records, in the same run, from the same event loop:
* Redis Streams (redis-server, appendonly yes, appendfsync everysec): one redis-py pipeline
  (transaction=False) of 500 `XADD events-<p> * key <key> value <value>` per "request", p
  being the key's number mod 4; one pooled connection per client.
* NATS JetStream (nats-server -js, file storage): 500 `js.publish_async("events.<p>.<key>",
  value)` per "request", then awaiting the 500 acks; one connection per client.

Cells are interleaved (each repeat runs every client count, the three systems in a rotating
order) and medians of the repeats are compared. Goal: eventlog >= 2 x Redis records/s with
Python clients; the NATS ratio is reported.

Moonshot, to see the servers without Python clients: wrk (one thread, N connections) POSTing a
fixed body of 500 records (the same 500 keys every time, so the server's key-hash cache always
hits), against redis-benchmark (its C client) pipelining 500
`XADD mystream * field <100-byte value>` per connection round trip (-P 500), interleaved.

Every cell also records the CPU seconds the server process spent (all threads), so each result
says whether the server or the client was the bottleneck, and for eventlog the group commits
(fsyncs, records per fsync) from /metrics.
"""

from __future__ import annotations

import asyncio
import base64
import csv
import io
import random
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import orjson

from .harness import Context, median, percentiles_us, remove_tree, summary_row
from .servers import (
    WRK_DONE_LUA,
    CpuMeter,
    EventlogServer,
    NatsServer,
    RedisServer,
    client_facts,
    commit_stats,
    create_topic,
    delete_topic,
    eventlog_counters,
    http_client,
    require,
    run_async,
    run_wrk,
    running,
    tool_version,
    wrk_version,
)

NAME = "http_produce"
TITLE = (
    "JSON produce over HTTP (500 x 100 B records/request) vs Redis Streams XADD and NATS JetStream"
)

RECORDS_PER_REQUEST = 500
VALUE_BYTES = 100
PARTITIONS = 4
CLIENTS = (1, 4, 16)
SYSTEMS = ("eventlog", "redis", "nats")
MOONSHOT = ("wrk_eventlog", "redis_benchmark")
KEY_SPACE = 1_000_000
GOAL_REDIS_RATIO = 2.0
REDIS_BENCHMARK_GUESS = 400_000  # XADD/s, the first -n; later runs use the rate measured last
JSON = {"content-type": "application/json"}

LABELS = {
    "eventlog": "eventlog (httpx)",
    "redis": "Redis XADD (redis-py pipeline)",
    "nats": "NATS JetStream (nats-py publish_async)",
    "wrk_eventlog": "eventlog (wrk, Lua POST)",
    "redis_benchmark": "Redis XADD (redis-benchmark -P 500)",
}
COLORS = {
    "eventlog": "tab:blue",
    "redis": "tab:red",
    "nats": "tab:green",
    "wrk_eventlog": "tab:blue",
    "redis_benchmark": "tab:red",
}


def params(quick: bool) -> dict[str, Any]:
    return {
        "records_per_request": RECORDS_PER_REQUEST,
        "value_bytes": VALUE_BYTES,
        "keys": (
            f"500 new keys per request from key-0000000 .. key-{KEY_SPACE - 1:07d}, cycling (never in the "
            "server's 65,536-entry hash cache); wrk's fixed body repeats key-0000000 .. key-0000499"
        ),
        "peer_streams": "Redis streams events-0..3 and NATS subjects events.<0..3>.<key> by key number % 4",
        "partitions": PARTITIONS,
        "clients": list(CLIENTS),
        "cell_seconds": 0.75 if quick else 3.0,
        "repeats": 2 if quick else 3,
        "moonshot_seconds": 1 if quick else 3,
        "moonshot_repeats": 1 if quick else 3,
        "eventlog_topic_config": "defaults (flush.messages=1: acknowledged = fdatasync'ed)",
        "redis_config": "appendonly yes, appendfsync everysec, save '' (acknowledged = written to the AOF, fsynced within ~1 s)",
        "nats_config": "-js, file storage, stream defaults (acknowledged = stored; fsync on nats-server's own schedule)",
        "latency": "per request, as the client sees it: build the body / pipeline, send, await and parse the reply",
    }


def values() -> list[str]:
    """The 500 values of every request: distinct 100-byte ASCII strings."""
    rng = random.Random(500)
    return [
        base64.b64encode(rng.randbytes(VALUE_BYTES * 3 // 4)).decode()[:VALUE_BYTES]
        for _ in range(RECORDS_PER_REQUEST)
    ]


def records() -> list[tuple[str, str]]:
    """(key, value) of the fixed body the C load generator (wrk) repeats: keys key-0000000 ..
    key-0000499."""
    return [(f"key-{i:07d}", v) for i, v in enumerate(values())]


class Keys:
    """The keys of the next request: 500 new ones each time from a space of KEY_SPACE, shared
    by every client of a cell (and the same sequence for each system). A key comes back only
    after KEY_SPACE / 500 requests, so the server's cache of key hashes (65,536 entries) never
    holds it: every record pays for murmur2, as with a producer of many distinct keys."""

    def __init__(self) -> None:
        self.next = 0

    def take(self) -> list[tuple[int, str]]:
        first = self.next
        self.next = (first + RECORDS_PER_REQUEST) % KEY_SPACE
        return [(n, f"key-{n:07d}") for n in range(first, first + RECORDS_PER_REQUEST)]


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    eventlog = EventlogServer(ctx, work / "eventlog")
    redis_server = RedisServer(work / "redis")
    nats_server = NatsServer(work / "nats")
    try:
        with running(eventlog, redis_server, nats_server):
            ctx.log(
                f"servers: eventlog :{eventlog.port}, redis-server :{redis_server.port}, "
                f"nats-server :{nats_server.port}"
            )
            cells = run_async(_python_clients, ctx, p, eventlog, redis_server, nats_server)
            moonshot = _moonshot(ctx, p, work, eventlog, redis_server)
        facts = {s.name: s.facts() for s in (eventlog, redis_server, nats_server)}
        if eventlog.exit_status != 0:
            raise RuntimeError(f"eventlog exited with {eventlog.exit_status}")
    finally:
        remove_tree(work)
    results = _results(cells, moonshot)
    p["servers"] = facts
    p["clients_facts"] = client_facts()
    results["redis_py_parser"] = p["clients_facts"]["redis_py_parser"].split(" (")[0]
    p["tools"] = {
        "wrk": wrk_version(),
        "redis-benchmark": tool_version("redis-benchmark", "--version"),
    }
    return {"params": p, "results": results, "summary": _summary(results)}


# -- Python clients -----------------------------------------------------------------------------


async def _drive(
    request: Callable[[int], Awaitable[None]], clients: int, seconds: float, server_pid: int
) -> dict[str, Any]:
    """Every client sends one request (warm-up, not timed), then all loop until `seconds` have
    passed; the clock stops when the last reply arrives."""
    async with anyio.create_task_group() as tg:
        for i in range(clients):
            tg.start_soon(request, i)
    latencies: list[int] = []
    meter = CpuMeter(server_pid).start()
    begin = time.perf_counter()
    deadline = begin + seconds

    async def client(i: int) -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter_ns()
            await request(i)
            latencies.append(time.perf_counter_ns() - start)

    async with anyio.create_task_group() as tg:
        for i in range(clients):
            tg.start_soon(client, i)
    elapsed = time.perf_counter() - begin
    count = len(latencies) * RECORDS_PER_REQUEST
    return {
        "clients": clients,
        "seconds": round(elapsed, 4),
        "requests": len(latencies),
        "records": count,
        "records_per_s": round(count / elapsed, 1),
        "latency_us": percentiles_us(latencies),
        **meter.stop(count),
    }


async def _python_clients(
    ctx: Context,
    p: dict[str, Any],
    eventlog: EventlogServer,
    redis_server: RedisServer,
    nats_server: NatsServer,
) -> list[dict[str, Any]]:
    recs = values()
    cells: list[dict[str, Any]] = []
    serial = 0
    for repeat in range(p["repeats"]):
        for index, clients in enumerate(CLIENTS):
            shift = (repeat + index) % len(SYSTEMS)  # rotate: no system always follows the same one
            for system in SYSTEMS[shift:] + SYSTEMS[:shift]:
                serial += 1
                if system == "eventlog":
                    cell = await _eventlog_cell(
                        eventlog, clients, p["cell_seconds"], recs, f"produce-{serial}"
                    )
                elif system == "redis":
                    cell = await _redis_cell(redis_server, clients, p["cell_seconds"], recs)
                else:
                    cell = await _nats_cell(nats_server, clients, p["cell_seconds"], recs)
                cell.update(system=system, repeat=repeat)
                cells.append(cell)
                lat = cell["latency_us"]
                ctx.log(
                    f"{system:>8} x {clients:>2} clients (repeat {repeat + 1}): {cell['records_per_s']:>9,.0f} rec/s, "
                    f"p50 {lat['p50_us'] / 1000:6.1f} ms, p99 {lat['p99_us'] / 1000:6.1f} ms; server CPU "
                    f"{cell['server_cpu_share']:.0%}, {cell['server_cpu_us_per_record']:.2f} us/record"
                    + (
                        f"; {cell['commits']['records_per_commit']} rec/fsync"
                        if "commits" in cell
                        else ""
                    )
                )
    return cells


async def _eventlog_cell(
    server: EventlogServer, clients: int, seconds: float, recs: list[str], topic: str
) -> dict[str, Any]:
    server.check_alive()
    keys = Keys()
    path = f"/v1/topics/{topic}/records"
    async with http_client(server.url, clients + 1) as client:
        await create_topic(client, topic, PARTITIONS)
        try:

            async def request(_i: int) -> None:
                payload = [{"key": k, "value": v} for (_n, k), v in zip(keys.take(), recs)]
                response = await client.post(
                    path, content=orjson.dumps({"records": payload}), headers=JSON
                )
                if response.status_code != 200:
                    raise RuntimeError(f"produce: {response.status_code} {response.text[:500]}")
                if len(orjson.loads(response.content)["offsets"]) != RECORDS_PER_REQUEST:
                    raise RuntimeError("produce: wrong number of offsets")

            before = await eventlog_counters(client)
            cell = await _drive(request, clients, seconds, server.pid)
            cell["commits"] = commit_stats(before, await eventlog_counters(client))
        finally:
            await delete_topic(client, topic)
    return cell


async def _redis_cell(
    server: RedisServer, clients: int, seconds: float, recs: list[str]
) -> dict[str, Any]:
    import redis.asyncio as aredis

    server.check_alive()
    keys = Keys()
    encoded = [v.encode() for v in recs]
    streams = [f"events-{p}" for p in range(PARTITIONS)]
    client = aredis.Redis(host="127.0.0.1", port=server.port, max_connections=clients + 1)
    try:
        info_before = await client.info("persistence")

        async def request(_i: int) -> None:
            pipe = client.pipeline(transaction=False)
            for (n, key), value in zip(keys.take(), encoded):
                pipe.xadd(streams[n % PARTITIONS], {b"key": key.encode(), b"value": value})
            replies = await pipe.execute()
            if len(replies) != RECORDS_PER_REQUEST:
                raise RuntimeError("redis: wrong number of replies")

        cell = await _drive(request, clients, seconds, server.pid)
        info_after = await client.info("persistence")
        cell["aof_rewrites_during_cell"] = info_after.get("aof_rewrites", 0) - info_before.get(
            "aof_rewrites", 0
        )
        await client.delete(*streams)
    finally:
        await client.aclose()
    return cell


async def _nats_cell(
    server: NatsServer, clients: int, seconds: float, recs: list[str]
) -> dict[str, Any]:
    import nats
    from nats.js.api import StorageType, StreamConfig

    server.check_alive()
    keys = Keys()
    encoded = [v.encode() for v in recs]
    connections = [await nats.connect(server.url) for _ in range(clients)]
    try:
        streams = [
            nc.jetstream(publish_async_max_pending=2 * RECORDS_PER_REQUEST) for nc in connections
        ]
        await streams[0].add_stream(
            StreamConfig(name="EVENTS", subjects=["events.>"], storage=StorageType.FILE)
        )
        try:

            async def request(i: int) -> None:
                js = streams[i]
                futures = [
                    await js.publish_async(f"events.{n % PARTITIONS}.{key}", value)
                    for (n, key), value in zip(keys.take(), encoded)
                ]
                acks = await asyncio.gather(*futures)
                if len(acks) != RECORDS_PER_REQUEST:
                    raise RuntimeError("nats: wrong number of acks")

            cell = await _drive(request, clients, seconds, server.pid)
        finally:
            await streams[0].delete_stream("EVENTS")
    finally:
        for nc in connections:
            await nc.close()
    return cell


# -- moonshot: C clients ------------------------------------------------------------------------


def _moonshot(
    ctx: Context, p: dict[str, Any], work: Path, eventlog: EventlogServer, redis_server: RedisServer
) -> dict[str, Any]:
    """wrk POSTing a fixed 500-record body to eventlog, and redis-benchmark pipelining 500 XADDs,
    interleaved; skipped (with the reason recorded) when wrk or redis-benchmark is missing."""
    import httpx

    try:
        require("wrk", "wrk")
        redis_benchmark = require("redis-benchmark", "redis-tools")
    except RuntimeError as exc:
        ctx.log(f"moonshot skipped: {exc}")
        return {"skipped": str(exc), "runs": []}
    recs = records()
    body_file = work / "body.json"
    body_file.write_bytes(orjson.dumps({"records": [{"key": k, "value": v} for k, v in recs]}))
    script = work / "post.lua"
    script.write_text(
        'local f = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))\n'
        'wrk.method = "POST"\nwrk.body = f:read("*a")\nf:close()\n'
        'wrk.headers["Content-Type"] = "application/json"\n' + WRK_DONE_LUA
    )
    value = recs[0][1]
    rate = REDIS_BENCHMARK_GUESS
    seconds = p["moonshot_seconds"]
    runs: list[dict[str, Any]] = []
    serial = 0
    for repeat in range(p["moonshot_repeats"]):
        for index, clients in enumerate(CLIENTS):
            order = MOONSHOT if (repeat + index) % 2 == 0 else MOONSHOT[::-1]
            for system in order:
                serial += 1
                if system == "wrk_eventlog":
                    eventlog.check_alive()
                    topic = f"wrk-{serial}"
                    with httpx.Client(base_url=eventlog.url, timeout=60) as client:
                        made = client.post(
                            "/v1/topics", json={"name": topic, "partitions": PARTITIONS}
                        )
                        if made.status_code != 201:
                            raise RuntimeError(f"create topic: {made.status_code} {made.text}")
                        meter = CpuMeter(eventlog.pid).start()
                        out = run_wrk(
                            script,
                            f"{eventlog.url}/v1/topics/{topic}/records",
                            clients,
                            seconds,
                            env={"BENCH_BODY_FILE": str(body_file)},
                        )
                        count = out["requests"] * RECORDS_PER_REQUEST
                        cpu = meter.stop(count)
                        client.delete(f"/v1/topics/{topic}")
                    run = {
                        "records": count,
                        "seconds": out["duration_us"] / 1e6,
                        "records_per_s": round(count / (out["duration_us"] / 1e6), 1),
                        "latency_us": {
                            k: out[k]
                            for k in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us")
                        },
                        "wrk": out,
                        **cpu,
                    }
                else:
                    redis_server.check_alive()
                    per_round = clients * RECORDS_PER_REQUEST
                    n = max(4 * per_round, round(rate * seconds / per_round) * per_round)
                    cmd = [
                        redis_benchmark, "-h", "127.0.0.1", "-p", str(redis_server.port),
                        "-c", str(clients), "-n", str(n), "-P", str(RECORDS_PER_REQUEST), "--csv",
                        "XADD", "mystream", "*", "field", value,
                    ]  # fmt: skip
                    meter = CpuMeter(redis_server.pid).start()
                    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                    cpu = meter.stop(n)
                    row = _redis_benchmark_csv(done.stdout)
                    stored = _redis_cli(redis_server.port, "XLEN", "mystream")
                    _redis_cli(redis_server.port, "DEL", "mystream")
                    if int(stored) != n:
                        raise RuntimeError(
                            f"redis-benchmark: {n} XADDs sent, {stored} entries stored"
                        )
                    rate = float(row["rps"])
                    run = {
                        "records": n,
                        "seconds": round(n / rate, 4),
                        "records_per_s": round(rate, 1),
                        "latency_us": {
                            "p50_us": float(row["p50_latency_ms"]) * 1000,
                            "p99_us": float(row["p99_latency_ms"]) * 1000,
                            "max_us": float(row["max_latency_ms"]) * 1000,
                            "mean_us": float(row["avg_latency_ms"]) * 1000,
                        },
                        "redis_benchmark": {
                            **row,
                            "command": " ".join(cmd[:-1]) + " <100-byte value>",
                        },
                        **cpu,
                    }
                run.update(system=system, clients=clients, repeat=repeat)
                runs.append(run)
                ctx.log(
                    f"moonshot {system:>15} x {clients:>2} connections (repeat {repeat + 1}): "
                    f"{run['records_per_s']:>10,.0f} rec/s, p50 {run['latency_us']['p50_us'] / 1000:.2f} ms; "
                    f"server CPU {run['server_cpu_share']:.0%}"
                )
    return {"runs": runs, "seconds": seconds}


def _redis_benchmark_csv(text: str) -> dict[str, str]:
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise RuntimeError(f"redis-benchmark printed no CSV:\n{text}")
    row = rows[-1]
    return {
        k: row[k]
        for k in (
            "rps",
            "avg_latency_ms",
            "p50_latency_ms",
            "p95_latency_ms",
            "p99_latency_ms",
            "max_latency_ms",
        )
    }


def _redis_cli(port: int, *args: str) -> str:
    import redis

    with redis.Redis(host="127.0.0.1", port=port) as client:
        return str(client.execute_command(*args))


# -- results ------------------------------------------------------------------------------------


def _results(cells: list[dict[str, Any]], moonshot: dict[str, Any]) -> dict[str, Any]:
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for system in SYSTEMS:
        by[system] = {}
        for clients in CLIENTS:
            runs = [c for c in cells if c["system"] == system and c["clients"] == clients]
            by[system][clients] = _medians(runs)
    ratios = {
        peer: {
            str(c): round(
                by["eventlog"][c]["median_records_per_s"] / by[peer][c]["median_records_per_s"], 3
            )
            for c in CLIENTS
        }
        for peer in ("redis", "nats")
    }
    moon: dict[str, Any] = {"skipped": moonshot.get("skipped"), "seconds": moonshot.get("seconds")}
    if moonshot["runs"]:
        moon["by_system"] = {
            system: {
                str(c): _medians(
                    [r for r in moonshot["runs"] if r["system"] == system and r["clients"] == c]
                )
                for c in CLIENTS
            }
            for system in MOONSHOT
        }
        moon["ratio_wrk_eventlog_to_redis_benchmark"] = {
            str(c): round(
                moon["by_system"]["wrk_eventlog"][str(c)]["median_records_per_s"]
                / moon["by_system"]["redis_benchmark"][str(c)]["median_records_per_s"],
                3,
            )
            for c in CLIENTS
        }
        moon["runs"] = moonshot["runs"]
    return {
        "by_system": {s: {str(c): v for c, v in d.items()} for s, d in by.items()},
        "ratio_eventlog_to": ratios,
        "goal_redis_ratio": GOAL_REDIS_RATIO,
        "cells": cells,
        "moonshot": moon,
    }


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str, sub: str | None = None) -> float | None:
        values = [(r[key][sub] if sub else r[key]) for r in runs]
        values = [v for v in values if v is not None]
        return round(median(values), 3) if values else None

    return {
        "median_records_per_s": med("records_per_s"),
        "records_per_s": [r["records_per_s"] for r in runs],
        "median_p50_us": med("latency_us", "p50_us"),
        "median_p99_us": med("latency_us", "p99_us"),
        "median_server_cpu_us_per_record": med("server_cpu_us_per_record"),
        "median_server_cpu_share": med("server_cpu_share"),
        "median_python_client_cpu_s_per_s": round(
            median(r["python_client_cpu_s"] / r["seconds"] for r in runs), 3
        ),
    }


def _summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    by = results["by_system"]
    rows = []
    for c in CLIENTS:
        e, r = by["eventlog"][str(c)], by["redis"][str(c)]
        ratio = results["ratio_eventlog_to"]["redis"][str(c)]
        rows.append(
            summary_row(
                f"JSON produce, 500 x 100 B records/request, {c} client(s), records/s (Python clients)",
                f"{e['median_records_per_s']:,.0f}/s",
                f"Redis XADD, redis-py pipelines of 500 ({results.get('redis_py_parser', '?')} parser): "
                f"{r['median_records_per_s']:,.0f}/s",
                ratio,
                f">= {GOAL_REDIS_RATIO}",
                ratio >= GOAL_REDIS_RATIO,
            )
        )
    for c in CLIENTS:
        e, n = by["eventlog"][str(c)], by["nats"][str(c)]
        rows.append(
            summary_row(
                f"JSON produce, {c} client(s), records/s vs NATS",
                f"{e['median_records_per_s']:,.0f}/s",
                f"NATS JetStream, nats-py publish_async x 500: {n['median_records_per_s']:,.0f}/s",
                results["ratio_eventlog_to"]["nats"][str(c)],
                "(informational)",
                None,
            )
        )
    for c in (CLIENTS[0], CLIENTS[-1]):
        e, r, n = (by[s][str(c)] for s in SYSTEMS)
        rows.append(
            summary_row(
                f"JSON produce request latency p50 (p99), {c} client(s)",
                f"{e['median_p50_us'] / 1000:.1f} ms ({e['median_p99_us'] / 1000:.1f} ms)",
                f"Redis {r['median_p50_us'] / 1000:.1f} ms ({r['median_p99_us'] / 1000:.1f} ms); "
                f"NATS {n['median_p50_us'] / 1000:.1f} ms ({n['median_p99_us'] / 1000:.1f} ms)",
                e["median_p99_us"] / r["median_p99_us"],
                "(informational: p99 / Redis p99)",
                None,
            )
        )
    moon = results["moonshot"]
    if moon.get("by_system"):
        for c in CLIENTS:
            w = moon["by_system"]["wrk_eventlog"][str(c)]
            b = moon["by_system"]["redis_benchmark"][str(c)]
            rows.append(
                summary_row(
                    f"moonshot: JSON produce from wrk, {c} connection(s), records/s",
                    f"{w['median_records_per_s']:,.0f}/s",
                    f"redis-benchmark XADD -P 500: {b['median_records_per_s']:,.0f}/s",
                    moon["ratio_wrk_eventlog_to_redis_benchmark"][str(c)],
                    "(informational)",
                    None,
                )
            )
    return rows


# -- plot ---------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    thousands = FuncFormatter(lambda v, _pos: f"{v / 1000:,.0f}k")
    r = report["results"]
    by = r["by_system"]
    moon = r["moonshot"]
    fig, axes = plt.subplots(2, 2, figsize=(16, 11))
    width = 0.27
    xs = range(len(CLIENTS))

    ax = axes[0][0]
    top = max(v for s in SYSTEMS for c in CLIENTS for v in by[s][str(c)]["records_per_s"])
    for k, system in enumerate(SYSTEMS):
        for i, c in enumerate(CLIENTS):
            entry = by[system][str(c)]
            x = i + (k - 1) * width
            ax.bar(
                x,
                entry["median_records_per_s"],
                width,
                color=COLORS[system],
                label=LABELS[system] if i == 0 else None,
            )
            ax.scatter(
                [x] * len(entry["records_per_s"]),
                entry["records_per_s"],
                color="black",
                s=10,
                zorder=3,
            )
    for i, c in enumerate(CLIENTS):
        ax.annotate(
            f"{r['ratio_eventlog_to']['redis'][str(c)]:.2f} x Redis\n{r['ratio_eventlog_to']['nats'][str(c)]:.2f} x NATS",
            (i, top * 1.04),
            ha="center",
            va="bottom",
            fontsize=10,
            fontweight="bold",
        )
    ax.set_ylim(0, top * 1.3)
    ax.set_xticks(list(xs), [f"{c} client(s)" for c in CLIENTS])
    ax.set_ylabel("records/s (median; dots = repeats)")
    ax.set_title(
        f"Python clients, {RECORDS_PER_REQUEST} x {VALUE_BYTES} B records per request (goal: >= {r['goal_redis_ratio']:g} x Redis)"
    )
    ax.yaxis.set_major_formatter(thousands)
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=3)
    ax.grid(True, axis="y", alpha=0.3)

    ax = axes[0][1]
    for k, system in enumerate(SYSTEMS):
        p50 = [by[system][str(c)]["median_p50_us"] / 1000 for c in CLIENTS]
        p99 = [by[system][str(c)]["median_p99_us"] / 1000 for c in CLIENTS]
        ax.plot(list(CLIENTS), p50, "-o", color=COLORS[system], label=f"{LABELS[system]} p50")
        ax.plot(list(CLIENTS), p99, "--^", color=COLORS[system], label=f"{LABELS[system]} p99")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(CLIENTS), [str(c) for c in CLIENTS])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("request latency, ms (median of repeats)")
    ax.set_title(f"latency of one {RECORDS_PER_REQUEST}-record request (build, send, reply parsed)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)

    ax = axes[1][0]
    for k, system in enumerate(SYSTEMS):
        values = [by[system][str(c)]["median_server_cpu_us_per_record"] for c in CLIENTS]
        shares = [by[system][str(c)]["median_server_cpu_share"] for c in CLIENTS]
        bars = ax.bar(
            [i + (k - 1) * width for i in xs],
            values,
            width,
            color=COLORS[system],
            label=LABELS[system],
        )
        for bar, share in zip(bars, shares):
            ax.annotate(
                f"{share:.0%}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(list(xs), [f"{c} client(s)" for c in CLIENTS])
    ax.set_ylabel("server CPU per record, us (all threads)")
    ax.set_title("server CPU per record; label = server CPU use (1 core = 100%)")
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=3)
    ax.grid(True, axis="y", alpha=0.3)

    ax = axes[1][1]
    if moon.get("by_system"):
        mtop = max(
            v
            for s in MOONSHOT
            for c in CLIENTS
            for v in moon["by_system"][s][str(c)]["records_per_s"]
        )
        for k, system in enumerate(MOONSHOT):
            for i, c in enumerate(CLIENTS):
                entry = moon["by_system"][system][str(c)]
                x = i + (k - 0.5) * 0.38
                ax.bar(
                    x,
                    entry["median_records_per_s"],
                    0.38,
                    color=COLORS[system],
                    alpha=0.6 if k else 1.0,
                    label=LABELS[system] if i == 0 else None,
                )
                ax.scatter(
                    [x] * len(entry["records_per_s"]),
                    entry["records_per_s"],
                    color="black",
                    s=10,
                    zorder=3,
                )
        for i, c in enumerate(CLIENTS):
            ax.annotate(
                f"{moon['ratio_wrk_eventlog_to_redis_benchmark'][str(c)]:.2f} x",
                (i, mtop * 1.03),
                ha="center",
                va="bottom",
                fontsize=10,
                fontweight="bold",
            )
        ax.set_ylim(0, mtop * 1.2)
        ax.set_xticks(list(xs), [f"{c} connection(s)" for c in CLIENTS])
        ax.set_ylabel("records/s (median; dots = repeats)")
        ax.set_title("moonshot, C load generators: wrk -> eventlog vs redis-benchmark -> Redis")
        ax.yaxis.set_major_formatter(thousands)
        ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=2)
        ax.grid(True, axis="y", alpha=0.3)
    else:
        ax.text(
            0.5,
            0.5,
            f"moonshot skipped: {moon.get('skipped')}",
            ha="center",
            va="center",
            wrap=True,
        )
        ax.set_axis_off()
    fig.suptitle(f"http_produce, {report['mode']} run, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
