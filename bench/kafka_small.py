"""Small events over Kafka's protocol: 256 B records to a 100-partition topic from librdkafka
producers (confluent-kafka: acks=all, linger.ms=5, enable.idempotence=true), against Redis
XADD with `appendfsync always` fed by redis-benchmark -P 16, and against our own HTTP
one-record path, all in the same run (issue 25).

What is measured. eventlog: `eventlog serve` at the default process count (one shard per core:
2 here) and, when that is not 1, `--processes 1`, each on a fresh data dir with HTTP and the
Kafka listener on free ports (EVENTLOG_KAFKA_PORT: shard i listens on port + i), default topic
configs (every group commit fdatasync'ed before its producers hear back; acks=all is answered
after the fsync). Each eventlog cell gets a fresh topic `t` of 100 partitions (deleted and
created over HTTP), so the disk holds one cell's records at a time. Each Kafka cell starts K
producer processes (multiprocessing, spawn), each with one confluent_kafka.Producer, so no
client's Python loop (~1-2 us per produce() call) is what bounds the rate; they connect, wait
at a common start, then call produce() with the same 256-byte value for `cell_seconds`,
cycling over the 100 partitions (partition given explicitly: what keyed records spread by a
hash look like to the broker), and flush. Only failed deliveries are reported back to Python
(delivery.report.only.error), so after flush() every message is either acknowledged or counted
as failed. Records/s = acknowledged / (the last producer's flush done - the common start): the
backlog a producer queued is drained inside the measured time.

The peers, same run, same machine, cells interleaved with the order rotating each repeat:
* Redis (bench.http_small.AlwaysRedis: appendonly yes, appendfsync always, so an fsync of the
  AOF before the replies of each event-loop pass) fed by `redis-benchmark -c 100 -r 100 -P 16
  XADD stream:__rand_int__ * f <256 B>` (100 streams, 16 commands in flight per connection);
  every XADD must be in the streams afterwards (bench.http_small._redis_cell);
* our HTTP one-record path on the default server: bench.http_small's wrk cell (one thread,
  100 connections, `{"records": [{"value": "<256 B>"}]}` POSTed to a random partition of t).

Every eventlog cell checks the topic's high watermarks afterwards: they must have grown by at
least the acknowledged records and by no more than the records sent (no loss; idempotent
producers do not duplicate). Per cell: records/s, the server's cores (its process tree's utime
+ stime, /proc), the producers' cores (their own getrusage, librdkafka's threads included), the
rest of the machine's, and from /metrics: fsyncs and records per fsync, Produce requests and
records per request, commits per commit job and the share of commits a shared syncfs made
durable (engine/commits.py: whether the 100 partitions' commits meet). Each cell starts once
the rest of the machine is quiet, or after quiet_wait_s (bench.http_shards.wait_for_quiet).

Goals (issue 25, this 2-core machine, where producers and server share the cores): the default
server >= 1.0 x Redis's XADDs/s, and >= 10 x our own HTTP one-record path.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from .harness import Context, median, package_versions, remove_tree, summary_row
from .http_shards import ShardedServer, machine_busy_seconds, tree_cpu_seconds, wait_for_quiet
from .http_small import AlwaysRedis, _eventlog_cell, _redis_cell, post_script
from .kafka_clients import PRODUCER_CONFIG, run_producers
from .servers import free_port, require, running, tail, tool_version, wrk_version

NAME = "kafka_small"
TITLE = (
    "256 B records to 100 partitions from librdkafka producers (acks=all), "
    "against Redis AOF always -P 16"
)

TOPIC = "t"
PARTITIONS = 100
VALUE_BYTES = 256
REDIS_PIPELINE = 16
GOAL_REDIS = 1.0
GOAL_HTTP = 10.0
REDIS_GUESS = 250_000  # XADDs/s at -P 16, for sizing redis-benchmark's -n before its first cell
DEFAULT_PROCESSES = os.cpu_count() or 1


def params(quick: bool) -> dict[str, Any]:
    return {
        "topic_partitions": PARTITIONS,
        "value_bytes": VALUE_BYTES,
        "producer_processes": [1, 2] if quick else [1, 2, 4],
        "producer_config": {k: v for k, v in PRODUCER_CONFIG.items()},
        "server_processes": sorted({DEFAULT_PROCESSES, 1}, reverse=True),
        "cell_seconds": 3 if quick else 6,
        # a cell starts once others used < 0.25 cores for 1 s, or after this long (the gate of
        # bench.http_shards, shorter: this machine's other sessions are rarely quiet for long)
        "quiet_wait_s": 10 if quick else 20,
        "repeats": 1 if quick else 3,
        "partitioning": "explicit, cycling over the 100 partitions (producers starting apart)",
        "redis": (
            "appendonly yes, appendfsync always; "
            f"redis-benchmark -c 100 -r 100 -P {REDIS_PIPELINE} "
            "XADD stream:__rand_int__ * f <256 B>"
        ),
        "http": "bench.http_small's cell: wrk -t1 -c100, one-record JSON POSTs, random partition",
        "topic_config": "defaults (flush.messages=1: acknowledged = fdatasync'ed)",
    }


# -- the servers --------------------------------------------------------------------------------


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports (a family's Kafka listeners use port + i)."""
    for _ in range(200):
        first = free_port()
        socks = []
        try:
            for i in range(1, count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", first + i))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


class KafkaServer(ShardedServer):
    """`eventlog serve --processes N` with the Kafka listener on free ports (broker i on
    kafka_port + i)."""

    def __init__(self, ctx: Context, directory: Path, processes: int):
        super().__init__(ctx, directory, processes, True)
        self.name = f"eventlog-p{processes}"
        self.log_path = directory / f"{self.name}.out"
        self.kafka_port = free_ports(processes)
        self.env["EVENTLOG_KAFKA_PORT"] = str(self.kafka_port)
        self.bootstrap = f"127.0.0.1:{self.kafka_port}"

    def create_topic(
        self, name: str, partitions: int, configs: dict[str, Any] | None = None
    ) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            made = client.post(
                "/v1/topics",
                json={"name": name, "partitions": partitions, "configs": configs or {}},
            )
            if made.status_code != 201:
                raise RuntimeError(f"create topic {name}: {made.status_code} {made.text}")

    def fresh_topic(self, name: str, partitions: int) -> None:
        """Topic `name` new and empty (deleted first if it exists): each cell writes to its own,
        so no cell appends behind another's segments and the disk holds one cell at a time."""
        with httpx.Client(base_url=self.url, timeout=60) as client:
            gone = client.delete(f"/v1/topics/{name}")
            if gone.status_code not in (204, 404):
                raise RuntimeError(f"delete topic {name}: {gone.status_code} {gone.text}")
        self.create_topic(name, partitions)

    def high_watermarks(self, topic: str) -> list[int]:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            return [
                p["high_watermark"] for p in client.get(f"/v1/topics/{topic}").json()["partitions"]
            ]

    def facts(self) -> dict[str, Any]:
        return {**super().facts(), "kafka_port": self.kafka_port}


_METRIC = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


_COUNTERS = {
    "eventlog_fsync_seconds_count": "fsyncs",  # group commits flushed (by fdatasync or syncfs)
    "eventlog_fsync_seconds_sum": "fsync_seconds",
    "eventlog_group_commit_records_sum": "commit_records",
    "eventlog_commit_jobs_total": "commit_jobs",  # hops to a commit thread (engine/commits.py)
    "eventlog_commit_job_commits_total": "job_commits",
    "eventlog_commit_shared_syncs_total": "shared_syncs",  # syncfs calls
    "eventlog_commit_shared_sync_flushes_total": "shared_sync_flushes",  # commits they covered
}


def metrics(url: str) -> dict[str, float]:
    """The counters a Kafka cell reports, summed over labels (and shards: the family's
    /metrics sums them): group commits, their fsyncs and how many one syncfs covered, commit
    jobs, and Produce and Fetch requests (eventlog_kafka_requests_total{api=...})."""
    out = dict.fromkeys([*_COUNTERS.values(), "produce_requests", "fetch_requests"], 0.0)
    text = httpx.get(f"{url}/metrics", timeout=60).text
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        name, labels, value = m["name"], m["labels"] or "", float(m["value"])
        if name in _COUNTERS:
            out[_COUNTERS[name]] += value
        elif name == "eventlog_kafka_requests_total" and 'api="Produce"' in labels:
            out["produce_requests"] += value
        elif name == "eventlog_kafka_requests_total" and 'api="Fetch"' in labels:
            out["fetch_requests"] += value
    return out


# -- the cells ----------------------------------------------------------------------------------


def _kafka_cell(server: KafkaServer, producers: int, seconds: float) -> dict[str, Any]:
    stored0 = sum(server.high_watermarks(TOPIC))
    before = metrics(server.url)
    marks: dict[str, Any] = {}

    def on_start() -> None:  # the producers are connected and about to start
        marks.update(
            cpu=tree_cpu_seconds(server.pid), busy=machine_busy_seconds(), wall=time.perf_counter()
        )

    out = run_producers(
        server.bootstrap, TOPIC, PARTITIONS, VALUE_BYTES, producers, seconds, on_start=on_start
    )
    cpu = tree_cpu_seconds(server.pid) - marks["cpu"]
    busy1, irq1 = machine_busy_seconds()
    wall = time.perf_counter() - marks["wall"]
    after = metrics(server.url)
    stored = sum(server.high_watermarks(TOPIC)) - stored0
    acked = out["acknowledged"]
    if not acked <= stored <= out["sent"]:
        raise RuntimeError(f"{acked} records acknowledged, {out['sent']} sent, {stored} stored")
    d = {k: after[k] - before[k] for k in before}
    busy0, irq0 = marks["busy"]
    others = max(0.0, (busy1 - busy0) - cpu - out["producer_cpu_seconds"])
    return {
        **{k: v for k, v in out.items() if k != "producers"},
        "stored": stored,
        "records_per_s": round(acked / out["seconds"], 1),
        "server_cores": round(cpu / wall, 3),
        "server_cpu_us_per_record": round(cpu / acked * 1e6, 2) if acked else None,
        "producer_cores": round(out["producer_cpu_seconds"] / wall, 3),
        "other_cores": round(others / wall, 3),
        "softirq_cores": round((irq1 - irq0) / wall, 3),
        "fsyncs": int(d["fsyncs"]),
        "records_per_fsync": round(d["commit_records"] / d["fsyncs"], 1) if d["fsyncs"] else None,
        "mean_fsync_ms": round(d["fsync_seconds"] / d["fsyncs"] * 1000, 3) if d["fsyncs"] else None,
        # how the partitions' group commits met: commits per hop to a commit thread, and the
        # share of them made durable by a shared syncfs rather than their own fdatasync
        "commits_per_job": (
            round(d["job_commits"] / d["commit_jobs"], 2) if d["commit_jobs"] else None
        ),
        "syncfs_share": round(d["shared_sync_flushes"] / d["fsyncs"], 3) if d["fsyncs"] else None,
        "produce_requests": int(d["produce_requests"]),
        "records_per_produce_request": round(stored / d["produce_requests"], 1)
        if d["produce_requests"]
        else None,
        "producers": out["producers"],
    }


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    import confluent_kafka

    work = ctx.scratch(NAME)
    redis_benchmark = require("redis-benchmark", "redis-tools")
    require("wrk", "wrk")
    script = post_script(work / "post.lua")
    value = "v" * VALUE_BYTES
    kafka = {f"kafka-p{n}": KafkaServer(ctx, work / f"p{n}", n) for n in p["server_processes"]}
    default = f"kafka-p{DEFAULT_PROCESSES}"
    redis = AlwaysRedis(work / "redis")
    kinds = [(name, k) for name in kafka for k in p["producer_processes"]] + [
        ("http", 0),
        ("redis", 0),
    ]
    cells: list[dict[str, Any]] = []
    redis_rate = float(REDIS_GUESS)
    try:
        with running(*kafka.values(), redis):
            pids = [s.pid for s in (*kafka.values(), redis)]
            for repeat in range(p["repeats"]):
                shift = repeat % len(kinds)
                for name, producers in kinds[shift:] + kinds[:shift]:
                    if name != "redis":
                        kafka[default if name == "http" else name].fresh_topic(TOPIC, PARTITIONS)
                    gate = wait_for_quiet(pids, p["quiet_wait_s"])
                    if name == "redis":
                        redis.check_alive()
                        cell = _redis_cell(
                            redis,
                            redis_benchmark,
                            value,
                            redis_rate,
                            p["cell_seconds"],
                            REDIS_PIPELINE,
                        )
                        redis_rate = cell["appends_per_s"]
                        cell["records_per_s"] = cell["appends_per_s"]
                    elif name == "http":
                        kafka[default].check_alive()
                        cell = _eventlog_cell(kafka[default], script, p["cell_seconds"])
                        cell["records_per_s"] = cell["appends_per_s"]
                    else:
                        kafka[name].check_alive()
                        cell = _kafka_cell(kafka[name], producers, p["cell_seconds"])
                    cell.update(
                        system=name, producer_processes=producers, repeat=repeat, start_gate=gate
                    )
                    cells.append(cell)
                    ctx.log(
                        f"{_label(name, producers):>22} (repeat {repeat + 1}): "
                        f"{cell['records_per_s']:>9,.0f} records/s; "
                        f"server {cell['server_cores']:.2f} cores, others {cell['other_cores']:.2f}"
                        + ("" if gate["quiet"] else " (NOT quiet)")
                    )
        facts = {name: s.facts() for name, s in {**kafka, "redis": redis}.items()}
        for name, s in {**kafka, "redis": redis}.items():
            if s.exit_status not in (0, None):
                raise RuntimeError(f"{name} exited with {s.exit_status}:\n{tail(s.log_path)}")
    finally:
        remove_tree(work)
    p["servers"] = facts
    p["tools"] = {
        "wrk": wrk_version(),
        "redis_benchmark": tool_version(redis_benchmark, "--version"),
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        **package_versions("confluent-kafka"),
    }
    results = _results(cells, list(kafka), default, p["producer_processes"])
    return {"params": p, "results": results, "summary": _summary(results)}


def _label(name: str, producers: int) -> str:
    if name == "redis":
        return f"redis -P {REDIS_PIPELINE}"
    if name == "http":
        return "HTTP one-record"
    return f"{name}, {producers} producer(s)"


# -- results ------------------------------------------------------------------------------------


def _results(
    cells: list[dict[str, Any]], servers: list[str], default: str, producers: list[int]
) -> dict[str, Any]:
    def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
        out = {
            "median_records_per_s": round(median(r["records_per_s"] for r in runs), 1),
            "records_per_s": [r["records_per_s"] for r in runs],
            "median_server_cores": round(median(r["server_cores"] for r in runs), 3),
            "median_other_cores": round(median(r["other_cores"] for r in runs), 3),
            "cells": len(runs),
        }
        if "producer_cores" in runs[0]:
            out["median_producer_cores"] = round(median(r["producer_cores"] for r in runs), 3)
            out["median_records_per_fsync"] = median(r["records_per_fsync"] or 0 for r in runs)
            out["median_records_per_produce_request"] = median(
                r["records_per_produce_request"] or 0 for r in runs
            )
            out["median_server_cpu_us_per_record"] = median(
                r["server_cpu_us_per_record"] or 0 for r in runs
            )
            if all(r.get("commits_per_job") is not None for r in runs):
                out["median_commits_per_job"] = median(r["commits_per_job"] for r in runs)
                out["median_syncfs_share"] = median(r["syncfs_share"] for r in runs)
            out["sent"] = sum(r["sent"] for r in runs)
            out["acknowledged"] = sum(r["acknowledged"] for r in runs)
            out["failed"] = sum(r["failed"] for r in runs)
            out["stored"] = sum(r["stored"] for r in runs)
        if "latency_us" in runs[0]:
            out["median_p50_us"] = median(r["latency_us"]["p50_us"] for r in runs)
            out["median_p99_us"] = median(r["latency_us"]["p99_us"] for r in runs)
        return out

    kafka = {
        name: {
            str(k): medians(
                [c for c in cells if c["system"] == name and c["producer_processes"] == k]
            )
            for k in producers
        }
        for name in servers
    }
    redis = medians([c for c in cells if c["system"] == "redis"])
    http = medians([c for c in cells if c["system"] == "http"])
    best = {
        name: max(by.items(), key=lambda kv: kv[1]["median_records_per_s"])
        for name, by in kafka.items()
    }
    return {
        "kafka": kafka,
        "redis": redis,
        "http_one_record": http,
        "default_server": default,
        "best": {name: {"producer_processes": int(k), **v} for name, (k, v) in best.items()},
        "ratio_to_redis": {
            name: round(v["median_records_per_s"] / redis["median_records_per_s"], 4)
            for name, (_, v) in best.items()
        },
        "ratio_to_http": {
            name: round(v["median_records_per_s"] / http["median_records_per_s"], 4)
            for name, (_, v) in best.items()
        },
        "goal": (
            f">= {GOAL_REDIS} x Redis XADD (AOF always, redis-benchmark -P {REDIS_PIPELINE}) "
            f"and >= {GOAL_HTTP} x "
            "HTTP one-record appends, at the default --processes (best producer count, medians)"
        ),
        "no_loss": all(
            c["acknowledged"] <= c["stored"] <= c["sent"]
            for c in cells
            if c["system"].startswith("kafka")
        ),
        "cells": cells,
    }


def _summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    redis, http = results["redis"], results["http_one_record"]
    rows = []
    for name, best in results["best"].items():
        goal = name == results["default_server"]
        producers = best["producer_processes"]
        measured = (
            f"{best['median_records_per_s']:,.0f}/s ({producers} producer "
            f"process{'es' if producers > 1 else ''}, server {best['median_server_cores']:.2f} "
            f"cores, {best['median_records_per_produce_request']:,.0f} records/Produce)"
        )
        ratio = results["ratio_to_redis"][name]
        rows.append(
            summary_row(
                "Kafka produce, 256 B records, 100 partitions, acks=all, linger.ms=5: "
                f"--processes {name[7:]} vs Redis",
                measured,
                f"Redis XADD AOF always, redis-benchmark -P {REDIS_PIPELINE}: "
                f"{redis['median_records_per_s']:,.0f}/s",
                ratio,
                f">= {GOAL_REDIS}" if goal else "(informational)",
                ratio >= GOAL_REDIS if goal else None,
            )
        )
        ratio = results["ratio_to_http"][name]
        rows.append(
            summary_row(
                f"Kafka produce (same cells): --processes {name[7:]} vs HTTP one-record appends",
                measured,
                "HTTP one-record POSTs from wrk (100 connections), default server: "
                f"{http['median_records_per_s']:,.0f}/s",
                ratio,
                f">= {GOAL_HTTP}" if goal else "(informational)",
                ratio >= GOAL_HTTP if goal else None,
            )
        )
    return rows


# -- plot ---------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    r = report["results"]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    ax = axes[0]
    labels, values, dots, colors = [], [], [], []
    palette = ["tab:orange", "tab:blue", "tab:green", "tab:purple"]
    for i, (name, by) in enumerate(r["kafka"].items()):
        for k, v in by.items():
            labels.append(f"{name}\n{k} prod.")
            values.append(v["median_records_per_s"])
            dots.append(v["records_per_s"])
            colors.append(palette[i % len(palette)])
    for label, v, color in (
        (f"Redis\n-P {REDIS_PIPELINE}", r["redis"], "tab:red"),
        ("HTTP\none-record", r["http_one_record"], "tab:gray"),
    ):
        labels.append(label)
        values.append(v["median_records_per_s"])
        dots.append(v["records_per_s"])
        colors.append(color)
    xs = range(len(labels))
    ax.bar(xs, values, color=colors)
    for x, ds in zip(xs, dots, strict=True):
        ax.scatter([x] * len(ds), ds, color="black", s=10, zorder=3)
    redis = r["redis"]["median_records_per_s"]
    http = r["http_one_record"]["median_records_per_s"]
    ax.axhline(redis * GOAL_REDIS, color="red", linestyle=":", label=f"goal: {GOAL_REDIS} x Redis")
    ax.axhline(
        http * GOAL_HTTP,
        color="gray",
        linestyle="--",
        label=f"goal: {GOAL_HTTP:.0f} x HTTP one-record",
    )
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / 1000:,.0f}k"))
    ax.set_ylabel("records/s (median; dots = repeats)")
    ax.set_title("256 B records, 100 partitions, acknowledged after fsync")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax = axes[1]
    width = 0.27
    cores: list[list[float]] = [[], [], []]
    for by in r["kafka"].values():
        for v in by.values():
            cores[0].append(v["median_server_cores"])
            cores[1].append(v.get("median_producer_cores", 0))
            cores[2].append(v["median_other_cores"])
    n = len(cores[0])
    for shift, values, label in (
        (-width, cores[0], "server (process tree)"),
        (0.0, cores[1], "producer processes"),
        (width, cores[2], "other processes (other sessions)"),
    ):
        ax.bar([x + shift for x in range(n)], values, width, label=label)
    ax.set_xticks(list(range(n)), labels[:n], fontsize=8)
    ax.set_ylabel("cores (median)")
    ax.set_title(f"CPU per Kafka cell ({report['machine']['cpu_count']} CPUs, shared)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{report['date'][:16]} — {report['command']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
