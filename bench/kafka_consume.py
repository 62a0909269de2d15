"""Consuming over Kafka's protocol: librdkafka reading 1 GB from the beginning, against `cat` of
the same segment files to /dev/null, warm page cache for both (issue 25).

What is measured. `eventlog serve` at the default process count (one shard per core: 2 here)
with the Kafka listener on free ports, default settings. A topic of 4 partitions (so every
shard of a small family serves some) is filled over HTTP with raw v2 batches (the fastest
way in: POST .../partitions/p/records with Content-Type application/vnd.kafka.record-batch.v2,
64 batches of 15 records of 1 KiB per request: the shape of `read` and `http_raw`'s fetch,
~16 KiB batches as Kafka's default batch.size makes them), 1 GB in all (quick: 256 MB); the
high watermarks must count every record sent. The segment files are then read once (warm).

Passes, in a rotating order, repeated (medians compared):
* cat: `cat <every .log segment file of the topic> > /dev/null` (GNU cat: read/write of 128 KiB
  chunks), the page cache's read rate through one process;
* kcat (librdkafka in C, no Python): `kcat -C -b <broker 0> -t <topic> -o beginning -e -q -c
  <records>`, fetch.max.bytes 64 MiB, max.partition.fetch.bytes 4 MiB, each value written to
  /dev/null; it exits at the last message (-c: without it, -e waits for an empty fetch at the
  high watermark, which the broker holds for fetch.wait.max.ms). A first, untimed pass prints
  each message's size instead, and the count and bytes must match the topic;
* confluent-kafka: a Consumer (the same settings, plus queued.min.messages 1,000,000 and
  fetch.queue.backoff.ms 10, without which librdkafka pauses a partition's fetching for a
  second whenever 100,000 messages are queued) that looks the topic up, assign()s every
  partition at the beginning and calls consume(10,000) until it has every record, len(value())
  of each summed (every message materialised in Python, as an application sees it; checked
  against the topic each pass). bench.kafka_clients.consume_all says why each setting.

Throughput = bytes of the segment files / seconds, so ratio = cat's seconds / the consumer's.
Per pass the server's cores (process tree, /proc) and the client's CPU are recorded. The
Fetch requests the server answered per pass come from /metrics.

Goal (issue 25): librdkafka >= 0.3 x cat (judged on kcat when it is installed, which is
librdkafka without Python costs; the Python consumer is reported beside it).
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from . import data
from .harness import MB, Context, median, package_versions, pread_files, remove_tree, summary_row
from .http_shards import tree_cpu_seconds
from .kafka_clients import CONSUMER_CONFIG, consume_all, kcat_binary, kcat_consume
from .kafka_small import DEFAULT_PROCESSES, KafkaServer, metrics
from .servers import running, tail, tool_version

NAME = "kafka_consume"
TITLE = (
    "librdkafka (kcat, confluent-kafka) reading 1 GB from the start, against cat of the segments"
)

TOPIC = "c"
PARTITIONS = 4
RECORD_BYTES = 1024
RECORDS_PER_BATCH = 15
BATCHES_PER_REQUEST = 64
FILL_THREADS = 4
RAW = "application/vnd.kafka.record-batch.v2"
GOAL_RATIO = 0.3
KINDS = ("cat", "kcat", "python")
LABELS = {"cat": "cat > /dev/null", "kcat": "kcat (librdkafka, C)", "python": "confluent-kafka"}


def params(quick: bool) -> dict[str, Any]:
    return {
        "data_bytes": (256 if quick else 1000) * MB,
        "partitions": PARTITIONS,
        "record_bytes": RECORD_BYTES,
        "records_per_batch": RECORDS_PER_BATCH,
        "batches_per_fill_request": BATCHES_PER_REQUEST,
        "server_processes": DEFAULT_PROCESSES,
        "passes": 3 if quick else 5,
        "consumer_config": dict(CONSUMER_CONFIG),
        "page_cache": "warm for all (every segment file read once before timing; data << RAM)",
        "topic_config": "defaults (segment.bytes 1 GiB: one segment per partition)",
    }


def _fill(server: KafkaServer, p: dict[str, Any]) -> tuple[int, int]:
    """Raw batches over HTTP until `data_bytes`, spread over the partitions; returns (records
    sent, request bodies' bytes)."""
    batch = bytes(data.encode_records_batch(RECORD_BYTES, RECORDS_PER_BATCH))
    body = batch * BATCHES_PER_REQUEST
    requests = max(PARTITIONS, p["data_bytes"] // len(body))

    def post(i: int, client: httpx.Client) -> None:
        response = client.post(
            f"/v1/topics/{TOPIC}/partitions/{i % PARTITIONS}/records",
            content=body,
            headers={"content-type": RAW},
        )
        if response.status_code != 200:
            raise RuntimeError(f"fill: {response.status_code} {response.text[:500]}")

    clients = [httpx.Client(base_url=server.url, timeout=120) for _ in range(FILL_THREADS)]
    try:
        with concurrent.futures.ThreadPoolExecutor(FILL_THREADS) as pool:
            jobs = [pool.submit(post, i, clients[i % FILL_THREADS]) for i in range(requests)]
            for job in jobs:
                job.result()
    finally:
        for client in clients:
            client.close()
    return requests * BATCHES_PER_REQUEST * RECORDS_PER_BATCH, requests * len(body)


def _cat(files: list[Path]) -> dict[str, Any]:
    t0 = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return {"seconds": round(time.perf_counter() - t0, 4)}


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    import confluent_kafka

    work = ctx.scratch(NAME)
    server = KafkaServer(ctx, work / "server", DEFAULT_PROCESSES)
    kcat = kcat_binary()
    kinds = [k for k in KINDS if k != "kcat" or kcat]
    passes: list[dict[str, Any]] = []
    try:
        with running(server):
            server.create_topic(TOPIC, PARTITIONS)
            begin = time.perf_counter()
            records, body_bytes = _fill(server, p)
            fill_s = time.perf_counter() - begin
            stored = sum(server.high_watermarks(TOPIC))
            if stored != records:
                raise RuntimeError(
                    f"fill: {records} records sent, the high watermarks count {stored}"
                )
            files = sorted(
                f
                for i in range(PARTITIONS)
                for f in (server.data_dir / f"{TOPIC}-{i}").glob("*.log")
            )
            file_bytes = sum(f.stat().st_size for f in files)
            ctx.log(
                f"filled {file_bytes / MB:,.0f} MB ({records:,} records) in {len(files)} "
                "segments over "
                f"HTTP in {fill_s:.1f} s"
            )
            pread_files(files)  # warm
            value_bytes = records * RECORD_BYTES
            check: dict[str, Any] = {}
            if kcat:
                check["kcat"] = kcat_consume(server.bootstrap, TOPIC, records, check=True)
                if check["kcat"]["value_bytes"] != value_bytes:
                    raise RuntimeError(
                        f"kcat read {check['kcat']['value_bytes']} value bytes of {value_bytes}"
                    )
            for n in range(p["passes"]):
                shift = n % len(kinds)
                for kind in kinds[shift:] + kinds[:shift]:
                    server.check_alive()
                    before = metrics(server.url)
                    cpu0 = tree_cpu_seconds(server.pid)
                    if kind == "cat":
                        out = _cat(files)
                    elif kind == "kcat":
                        out = kcat_consume(server.bootstrap, TOPIC, records)
                    else:
                        out = consume_all(server.bootstrap, TOPIC, PARTITIONS, records)
                        if (out["messages"], out["value_bytes"]) != (records, value_bytes):
                            raise RuntimeError(
                                f"confluent-kafka read {out['messages']} messages / "
                                f"{out['value_bytes']} "
                                f"bytes, the topic holds {records} / {value_bytes}"
                            )
                    cpu = tree_cpu_seconds(server.pid) - cpu0  # (cat: clock-tick noise only)
                    fetches = metrics(server.url)["fetch_requests"] - before["fetch_requests"]
                    out.update(
                        kind=kind,
                        repeat=n,
                        mb_per_s=round(file_bytes / out["seconds"] / MB, 1),
                        server_cores=round(cpu / out["seconds"], 3),
                        fetch_requests=int(fetches),
                    )
                    passes.append(out)
                    ctx.log(
                        f"{LABELS[kind]:>22} (pass {n + 1}): {out['seconds']:7.3f} s, "
                        f"{out['mb_per_s']:>8,.0f} MB/s; server {out['server_cores']:.2f} cores"
                    )
        facts = server.facts()
        if server.exit_status not in (0, None):
            raise RuntimeError(
                f"eventlog exited with {server.exit_status}:\n{tail(server.log_path)}"
            )
    finally:
        remove_tree(work)
    p["server"] = facts
    p["tools"] = {
        "kcat": tool_version(kcat, "-V") if kcat else "not installed (apt-get install -y kcat)",
        "cat": tool_version("cat", "--version"),
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        **package_versions("confluent-kafka"),
    }
    p["data"] = {
        "records": records,
        "file_bytes": file_bytes,
        "segments": len(files),
        "value_bytes": value_bytes,
        "fill_request_bytes": body_bytes,
        "fill_seconds": round(fill_s, 2),
        "kcat_check": check.get("kcat"),
    }
    results = _results(passes, kinds)
    return {"params": p, "results": results, "summary": _summary(results, file_bytes)}


def _results(passes: list[dict[str, Any]], kinds: list[str]) -> dict[str, Any]:
    by: dict[str, Any] = {}
    for kind in kinds:
        runs = [r for r in passes if r["kind"] == kind]
        by[kind] = {
            "median_seconds": median(r["seconds"] for r in runs),
            "median_mb_per_s": round(median(r["mb_per_s"] for r in runs), 1),
            "mb_per_s": [r["mb_per_s"] for r in runs],
        }
        if kind != "cat":
            by[kind]["median_server_cores"] = round(median(r["server_cores"] for r in runs), 3)
            by[kind]["median_client_cpu_seconds"] = median(r["client_cpu_seconds"] for r in runs)
            by[kind]["median_fetch_requests"] = median(r["fetch_requests"] for r in runs)
    cat = by["cat"]["median_seconds"]
    return {
        "by_kind": by,
        "ratio_to_cat": {k: round(cat / by[k]["median_seconds"], 4) for k in kinds if k != "cat"},
        "judged_on": "kcat" if "kcat" in by else "python",
        "goal": f">= {GOAL_RATIO} x cat of the segment files (cat's seconds / the consumer's)",
        "passes": passes,
    }


def _summary(results: dict[str, Any], file_bytes: int) -> list[dict[str, Any]]:
    by = results["by_kind"]
    cat = by["cat"]
    rows = []
    for kind, ratio in results["ratio_to_cat"].items():
        goal = kind == results["judged_on"]
        rows.append(
            summary_row(
                f"Kafka consume of {file_bytes / MB:,.0f} MB from the start, {LABELS[kind]}, MB/s "
                "(warm page cache)",
                f"{by[kind]['median_mb_per_s']:,.0f} MB/s "
                f"(server {by[kind]['median_server_cores']:.2f} cores)",
                f"cat of the segment files > /dev/null: {cat['median_mb_per_s']:,.0f} MB/s",
                ratio,
                f">= {GOAL_RATIO}" if goal else "(informational)",
                ratio >= GOAL_RATIO if goal else None,
            )
        )
    return rows


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    r = report["results"]
    by = r["by_kind"]
    kinds = list(by)
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    ax = axes[0]
    colors = {"cat": "tab:gray", "kcat": "tab:orange", "python": "tab:blue"}
    xs = range(len(kinds))
    ax.bar(xs, [by[k]["median_mb_per_s"] for k in kinds], color=[colors[k] for k in kinds])
    for x, k in zip(xs, kinds, strict=True):
        ax.scatter([x] * len(by[k]["mb_per_s"]), by[k]["mb_per_s"], color="black", s=10, zorder=3)
    cat = by["cat"]["median_mb_per_s"]
    ax.axhline(cat * GOAL_RATIO, color="red", linestyle=":", label=f"goal: {GOAL_RATIO} x cat")
    ax.set_xticks(list(xs), [LABELS[k] for k in kinds], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("MB/s of segment files (log; median, dots = passes)")
    data_mb = report["params"]["data"]["file_bytes"] / MB
    ax.set_title(f"reading {data_mb:,.0f} MB from the start, warm page cache")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax = axes[1]
    consumers = [k for k in kinds if k != "cat"]
    width = 0.38
    cx = range(len(consumers))
    ax.bar(
        [x - width / 2 for x in cx],
        [by[k]["median_server_cores"] for k in consumers],
        width,
        label="server (process tree)",
    )
    ax.bar(
        [x + width / 2 for x in cx],
        [by[k]["median_client_cpu_seconds"] / by[k]["median_seconds"] for k in consumers],
        width,
        label="consumer",
    )
    ax.set_xticks(list(cx), [LABELS[k] for k in consumers], fontsize=8)
    ax.set_ylabel("cores during the pass (median)")
    ax.set_title("CPU")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{report['date'][:16]} — {report['command']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
