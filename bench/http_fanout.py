"""Fan-out: 1,000 SSE subscribers of one partition, a record produced every 10 ms, against
Redis pub/sub with the same subscribers and the same rate.

What is measured. eventlog: `eventlog serve` at the default --processes (2 here) on a fresh
data dir, a one-partition topic with default configs (each record fdatasync'ed before it is
acknowledged, and before any reader sees it). `bench/fanout/subscribers.c` (compiled with gcc
at the start; a Python client would need more CPU than the server) opens 1,000 connections to
`GET /v1/topics/t/partitions/0/records/stream` and waits until every one has its first bytes.
A producer then POSTs one record every 10 ms (`/v1/topics/t/partitions/0/records`, one
keep-alive connection) whose value carries its send time and sequence, "T=<ns>;S=<n>;".
The subscribers take each event's delivery latency (receive time - send time: the produce, its
fsync, the fan-out) and check that every connection sees every sequence once, in order.
Redis: redis-server (pub/sub keeps nothing, so no fsync), the same client SUBSCRIBEd 1,000
times, PUBLISH every 10 ms from one connection.

Memory per subscriber: the server's resident memory (its whole process tree, /proc VmRSS)
once the subscribers are connected and the stream has run a second, minus before they
connected, over the subscriber count.

Goals (issue 13): delivery p50 <= 5 ms, p99 <= 20 ms, <= 20 KB of server memory per
subscriber, every record delivered to every subscriber exactly once and in order.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from .fanout.client import HttpProducer, RedisPublisher, Subscribers, build, rss_bytes, run_stream
from .harness import Context, remove_tree, summary_row
from .http_shards import ShardedServer, serve_knows_processes, tree_cpu_seconds, tree_pids
from .servers import RedisServer, require, running, tail

NAME = "fanout"
TITLE = "SSE fan-out: 1,000 subscribers of one partition, a record every 10 ms, against Redis pub/sub"

SUBSCRIBERS = 1000
INTERVAL_S = 0.010
WARM_UP = 100  # records before memory is read (their deliveries count in the latencies too)
GOAL_P50_MS = 5.0
GOAL_P99_MS = 20.0
GOAL_KB_PER_SUBSCRIBER = 20.0
STREAM_PATH = "/v1/topics/t/partitions/0/records/stream"


def params(quick: bool) -> dict[str, Any]:
    return {
        "subscribers": SUBSCRIBERS,
        "interval_ms": INTERVAL_S * 1000,
        "records": 300 if quick else 1500,
        "processes": os.cpu_count() or 1,
        "client": "bench/fanout/subscribers.c (epoll, one thread), built with gcc -O2",
        "producer": "one keep-alive connection, a record every 10 ms on a fixed schedule",
        "topic_config": "defaults (flush.messages=1: a record is fdatasync'ed before anyone sees it)",
    }


def _build(work: Path) -> Path:
    return build(work / "subscribers", require("gcc", "gcc"))


def _eventlog_cell(server: ShardedServer, binary: Path, records: int) -> dict[str, Any]:
    pids = tree_pids(server.pid)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        made = client.post("/v1/topics", json={"name": "t", "partitions": 1})
        if made.status_code != 201:
            raise RuntimeError(f"create topic: {made.status_code} {made.text}")
    time.sleep(1)
    rss0 = rss_bytes(pids)
    subscribers = Subscribers(binary, "sse", server.port, STREAM_PATH, SUBSCRIBERS)
    subscribers.wait_ready()
    send = HttpProducer(server.port, "/v1/topics/t/partitions/0/records")
    try:
        return run_stream(subscribers, send, pids, lambda: tree_cpu_seconds(server.pid), records, WARM_UP, INTERVAL_S, rss0)
    finally:
        send.close()


def _redis_cell(server: RedisServer, binary: Path, records: int) -> dict[str, Any]:
    rss0 = rss_bytes([server.pid])
    subscribers = Subscribers(binary, "redis", server.port, "ch", SUBSCRIBERS)
    subscribers.wait_ready()
    send = RedisPublisher(server.port, "ch", SUBSCRIBERS)
    try:
        return run_stream(subscribers, send, [server.pid], lambda: tree_cpu_seconds(server.pid), records, WARM_UP,
                          INTERVAL_S, rss0)
    finally:
        send.close()


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    binary = _build(work)
    cells: dict[str, Any] = {}
    try:
        processes = p["processes"]
        eventlog = ShardedServer(ctx, work / "eventlog", processes, serve_knows_processes())
        with running(eventlog):
            cells["eventlog"] = _eventlog_cell(eventlog, binary, p["records"])
            if eventlog.exit_status not in (0, None):
                raise RuntimeError(f"eventlog exited with {eventlog.exit_status}:\n{tail(eventlog.log_path)}")
        redis = RedisServer(work / "redis")
        with running(redis):
            cells["redis-pubsub"] = _redis_cell(redis, binary, p["records"])
        for name, cell in cells.items():
            ctx.log(
                f"{name:>13}: p50 {cell['p50_us'] / 1000:6.2f} ms, p99 {cell['p99_us'] / 1000:6.2f} ms, "
                f"{cell['kb_per_subscriber']:.1f} KB/subscriber, {cell['server_cores']:.2f} cores, "
                f"exactly once in order: {cell['exactly_once_in_order']}"
            )
    finally:
        remove_tree(work)
    results = {"cells": cells, "goal": f"p50 <= {GOAL_P50_MS} ms, p99 <= {GOAL_P99_MS} ms, <= {GOAL_KB_PER_SUBSCRIBER} KB/subscriber, exactly once in order"}
    return {"params": p, "results": results, "summary": _summary(cells)}


def _summary(cells: dict[str, Any]) -> list[dict[str, Any]]:
    e, r = cells["eventlog"], cells["redis-pubsub"]
    p50, p99, kb = e["p50_us"] / 1000, e["p99_us"] / 1000, e["kb_per_subscriber"]
    return [
        summary_row(
            "SSE fan-out, 1,000 subscribers, a record every 10 ms: delivery latency (produce + fsync + fan-out)",
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms",
            f"Redis pub/sub (no fsync): p50 {r['p50_us'] / 1000:.2f} ms, p99 {r['p99_us'] / 1000:.2f} ms",
            round(r["p99_us"] / e["p99_us"], 3) if e["p99_us"] > 0 else None,
            f"p50 <= {GOAL_P50_MS:.0f} ms, p99 <= {GOAL_P99_MS:.0f} ms, exactly once",
            p50 <= GOAL_P50_MS and p99 <= GOAL_P99_MS and e["exactly_once_in_order"],
        ),
        summary_row(
            "SSE fan-out: server memory per subscriber",
            f"{kb:.1f} KB",
            f"Redis: {r['kb_per_subscriber']:.1f} KB",
            round(r["kb_per_subscriber"] / kb, 3) if kb > 0 else None,
            f"<= {GOAL_KB_PER_SUBSCRIBER:.0f} KB",
            kb <= GOAL_KB_PER_SUBSCRIBER,
        ),
    ]


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    cells = report["results"]["cells"]
    names = list(cells)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    width = 0.25
    for j, (key, label) in enumerate((("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9"))):
        ax.bar([i + (j - 1) * width for i in range(len(names))], [cells[n][key] / 1000 for n in names], width, label=label)
    ax.axhline(GOAL_P50_MS, color="green", linestyle=":", label=f"goal p50 {GOAL_P50_MS:.0f} ms")
    ax.axhline(GOAL_P99_MS, color="red", linestyle=":", label=f"goal p99 {GOAL_P99_MS:.0f} ms")
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("delivery latency, ms (log)")
    ax.set_title(f"{SUBSCRIBERS} subscribers, a record every {INTERVAL_S * 1000:.0f} ms")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax = axes[1]
    ax.bar(names, [cells[n]["kb_per_subscriber"] for n in names], color=["tab:orange", "tab:red"][: len(names)])
    ax.axhline(GOAL_KB_PER_SUBSCRIBER, color="red", linestyle=":", label=f"goal {GOAL_KB_PER_SUBSCRIBER:.0f} KB")
    ax.set_ylabel("server memory per subscriber, KB")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{report['date'][:16]} — {report['command']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
