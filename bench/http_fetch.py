"""JSON fetch and time lookups over HTTP, against Redis Streams XRANGE.

What is measured, on the real `eventlog serve` (a subprocess, default settings):

* JSON fetch: a one-partition topic of N records (1 M; 200 k quick) with 100-byte ASCII
  values and 7-byte keys, 100 records per batch, record n stamped T0 + n ms (appended in order
  as raw batches over HTTP, so offset n has timestamp T0 + n). Clients walk it with
  `GET .../records?offset=N&max_records=500`, following next_offset, and parse every reply
  (orjson): 1 client, and 4 clients each walking its own window. Each pass walks W records
  (100 k; 25 k quick), shared by the clients, each window starting at a random batch boundary.
  Peer: a Redis stream holding the same N records (`key`, `value` fields) with IDs
  `<T0 + n>-0`, walked with redis-py `XRANGE events <start> + COUNT 500`, the next start being
  the exclusive `(<last id>`.
* time lookup: `GET .../offsets?timestamp=T` for uniformly random T in [T0, T0 + N), one client,
  request after request, each answer checked (offset = T - T0).
  Peer: `XRANGE events <T>-0 + COUNT 1` (stream IDs are millisecond timestamps, so this is the
  same question), each answer checked.
  Both eventlog lookups are timed with httpx and with a minimal HTTP/1.1 client on one asyncio
  stream (servers.RawHttpClient, about redis-py's cost per request: httpx alone spends ~0.5 ms
  of CPU per request here). Floors, to show what the transport and the clients cost alone:
  `GET /healthz` and Redis `PING`.
* C clients, one connection, to see the servers without Python clients: wrk GETting random
  offsets (JSON fetch of 500) and random timestamps (time lookup), next to redis-benchmark
  repeating `XRANGE events <id> + COUNT 500` and `XRANGE events <T>-0 + COUNT 1` (its arguments
  are fixed; a stream range lookup costs the same anywhere in the stream).

Warm: after filling, every segment file is read once (the page cache holds the data, a small
fraction of RAM), and Redis keeps its data in memory anyway. Passes and lookup blocks rotate
between the systems; medians of the fetch passes are compared, and latency percentiles are
over all samples of a kind. Redis runs with appendonly yes / appendfsync everysec as in
http_produce; it is filled with `redis-cli --pipe`.
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import orjson

from engine.records import encode_batch

from . import data
from .harness import Context, median, percentiles_us, pread_files, remove_tree, summary_row
from .servers import (
    WRK_DONE_LUA,
    CpuMeter,
    EventlogServer,
    RawHttpClient,
    RedisServer,
    client_facts,
    create_topic,
    http_client,
    require,
    run_async,
    run_wrk,
    running,
    which,
)

NAME = "http_fetch"
TITLE = "JSON fetch (500 records/request) and time lookups over HTTP vs Redis XRANGE"

RAW = "application/vnd.kafka.record-batch.v2"
TOPIC = "fetch"
STREAM = "events"
VALUE_BYTES = 100
RECORDS_PER_BATCH = 100
BATCHES_PER_REQUEST = 100  # while filling: 10,000 records per POST
MAX_RECORDS = 500
FETCH_CLIENTS = (1, 4)
LOOKUP_BLOCK = 250
SEED = 20240611
T0 = data.T0_MS


def params(quick: bool) -> dict[str, Any]:
    return {
        "records": 200_000 if quick else 1_000_000,
        "records_per_batch": RECORDS_PER_BATCH,
        "value_bytes": VALUE_BYTES,
        "keys": "key-000 .. key-099 by position in the batch (7 bytes)",
        "timestamps": f"record n has T0 + n ms (T0 = {T0}); Redis IDs <T0 + n>-0",
        "max_records": MAX_RECORDS,
        "fetch_clients": list(FETCH_CLIENTS),
        "walk_records_per_pass": 25_000 if quick else 100_000,
        "fetch_passes": 3 if quick else 7,
        "lookup_samples": 1_000 if quick else 5_000,
        "lookup_block": LOOKUP_BLOCK,
        "lookup_clients": "httpx.AsyncClient, and a minimal HTTP/1.1 client on one asyncio stream (servers.RawHttpClient)",
        "c_client_seconds": 1 if quick else 3,
        "c_client_repeats": 1 if quick else 3,
        "page_cache": "warm (segment files read once after filling; Redis is in memory)",
        "redis_config": "appendonly yes, appendfsync everysec, save ''",
        "seed": SEED,
    }


def _template() -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The batch every batch is a retimed copy of, and its (key, value) pairs."""
    rng = random.Random(SEED)
    alphabet = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    pairs = [
        (f"key-{i:03d}".encode(), bytes(rng.choice(alphabet) for _ in range(VALUE_BYTES)))
        for i in range(RECORDS_PER_BATCH)
    ]
    batch = encode_batch(0, [(k, v, T0 + i, ()) for i, (k, v) in enumerate(pairs)])
    return bytes(batch), pairs


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    eventlog = EventlogServer(ctx, work / "eventlog")
    redis_server = RedisServer(work / "redis")
    try:
        with running(eventlog, redis_server):
            ctx.log(f"servers: eventlog :{eventlog.port}, redis-server :{redis_server.port}")
            template, pairs = _template()
            _fill_redis(ctx, redis_server, work, pairs, p["records"])
            results = run_async(_measure, ctx, p, eventlog, redis_server, template)
            results["c_clients"] = _c_clients(ctx, p, work, eventlog, redis_server)
            results["redis_memory_bytes"] = redis_server.info("memory").get("used_memory")
        facts = {s.name: s.facts() for s in (eventlog, redis_server)}
        if eventlog.exit_status != 0:
            raise RuntimeError(f"eventlog exited with {eventlog.exit_status}")
    finally:
        remove_tree(work)
    p["servers"] = facts
    p["clients_facts"] = client_facts()
    results["redis_py_parser"] = p["clients_facts"]["redis_py_parser"].split(" (")[0]
    return {"params": p, "results": results, "summary": _summary(results)}


# -- filling ------------------------------------------------------------------------------------


def _fill_redis(
    ctx: Context, server: RedisServer, work: Path, pairs: list[tuple[bytes, bytes]], records: int
) -> None:
    """XADD events <T0+n>-0 key <key> value <value> for every record, with redis-cli --pipe."""
    cli = require("redis-cli", "redis-tools")
    begin = time.perf_counter()
    chunks = []
    for n in range(records):
        key, value = pairs[n % RECORDS_PER_BATCH]
        entry_id = f"{T0 + n}-0".encode()
        chunks.append(
            b"*7\r\n$4\r\nXADD\r\n$6\r\nevents\r\n$%d\r\n%s\r\n$3\r\nkey\r\n$%d\r\n%s\r\n$5\r\nvalue\r\n$%d\r\n%s\r\n"
            % (len(entry_id), entry_id, len(key), key, len(value), value)
        )
    protocol = work / "fill.resp"
    protocol.write_bytes(b"".join(chunks))
    with open(protocol, "rb") as source:
        done = subprocess.run(
            [cli, "-h", "127.0.0.1", "-p", str(server.port), "--pipe"],
            stdin=source,
            capture_output=True,
            text=True,
            check=True,
        )
    protocol.unlink()
    if "errors: 0" not in done.stdout:
        raise RuntimeError(f"redis-cli --pipe: {done.stdout}{done.stderr}")
    import redis

    with redis.Redis(host="127.0.0.1", port=server.port) as client:
        if client.xlen(STREAM) != records:
            raise RuntimeError(f"redis: {client.xlen(STREAM)} entries, expected {records}")
    ctx.log(
        f"redis: {records:,} entries added with redis-cli --pipe ({time.perf_counter() - begin:.1f} s)"
    )


async def _fill_eventlog(ctx: Context, client: Any, template: bytes, records: int) -> None:
    """Raw batches, in order (one producer), so offset n has timestamp T0 + n."""
    begin = time.perf_counter()
    batches = records // RECORDS_PER_BATCH
    path = f"/v1/topics/{TOPIC}/partitions/0/records"
    for first in range(0, batches, BATCHES_PER_REQUEST):
        body = b"".join(
            bytes(data.retimed(template, T0 + b * RECORDS_PER_BATCH))
            for b in range(first, min(batches, first + BATCHES_PER_REQUEST))
        )
        response = await client.post(path, content=body, headers={"content-type": RAW})
        if response.status_code != 200:
            raise RuntimeError(f"fill: {response.status_code} {response.text[:500]}")
    ctx.log(
        f"eventlog: {records:,} records appended over HTTP ({time.perf_counter() - begin:.1f} s)"
    )


# -- measuring ----------------------------------------------------------------------------------


async def _measure(
    ctx: Context,
    p: dict[str, Any],
    eventlog: EventlogServer,
    redis_server: RedisServer,
    template: bytes,
) -> dict[str, Any]:
    import redis.asyncio as aredis

    records = p["records"]
    rng = random.Random(SEED)
    async with http_client(eventlog.url, max(FETCH_CLIENTS) + 1) as client:
        await create_topic(client, TOPIC, 1)
        await _fill_eventlog(ctx, client, template, records)
        files = sorted((eventlog.data_dir / f"{TOPIC}-0").glob("*.log"))
        pread_files(files)  # warm the page cache
        r = aredis.Redis(
            host="127.0.0.1", port=redis_server.port, max_connections=max(FETCH_CLIENTS) + 1
        )
        try:
            # warm-up: a short walk and a few lookups each, connections opened
            await _walk_eventlog(client, 0, 5_000, [])
            await _walk_redis(r, 0, 5_000, [])
            for _ in range(50):
                await _lookup_eventlog(client, T0 + rng.randrange(records))
                await _lookup_redis(r, T0 + rng.randrange(records))
            fetch = await _fetch_passes(ctx, p, client, r, eventlog, redis_server, rng)
            raw = await RawHttpClient("127.0.0.1", eventlog.port).connect()
            try:
                for _ in range(50):
                    await raw.get("/healthz")
                lookups = await _lookups(ctx, p, client, raw, r, rng)
            finally:
                await raw.close()
        finally:
            await r.aclose()
    return {
        "fetch": fetch,
        "lookups": lookups,
        "segment_bytes": sum(f.stat().st_size for f in files),
    }


async def _walk_eventlog(client: Any, start: int, count: int, latencies: list[int]) -> int:
    """Fetch `count` records from offset `start`, 500 per request; returns records seen."""
    offset, end, seen = start, start + count, 0
    while offset < end:
        t0 = time.perf_counter_ns()
        response = await client.get(
            f"/v1/topics/{TOPIC}/partitions/0/records?offset={offset}&max_records={MAX_RECORDS}"
        )
        body = orjson.loads(response.content)
        latencies.append(time.perf_counter_ns() - t0)
        if response.status_code != 200:
            raise RuntimeError(f"fetch: {response.status_code} {response.text[:500]}")
        got = body["records"]
        if not got or got[0]["offset"] > offset:
            raise RuntimeError(
                f"fetch at {offset}: {len(got)} records, first {got[0]['offset'] if got else None}"
            )
        seen += sum(1 for rec in got if rec["offset"] >= offset)
        offset = body["next_offset"]
    return seen


async def _walk_redis(r: Any, start: int, count: int, latencies: list[int]) -> int:
    """XRANGE `count` entries from ID <T0+start>-0, 500 per call; returns entries seen."""
    lower, seen = f"{T0 + start}-0", 0
    while seen < count:
        t0 = time.perf_counter_ns()
        entries = await r.xrange(STREAM, min=lower, max="+", count=MAX_RECORDS)
        latencies.append(time.perf_counter_ns() - t0)
        if not entries:
            raise RuntimeError(f"redis: no entries from {lower}")
        seen += len(entries)
        lower = b"(" + entries[-1][0]
    return seen


async def _walker(
    system: str,
    client: Any,
    r: Any,
    i: int,
    start: int,
    window: int,
    seen: list[int],
    latencies: list[int],
) -> None:
    """One client of a fetch pass: walk `window` records from `start`; seen[i] = records seen."""
    if system == "eventlog":
        seen[i] = await _walk_eventlog(client, start, window, latencies)
    else:
        seen[i] = await _walk_redis(r, start, window, latencies)


async def _fetch_passes(
    ctx: Context,
    p: dict[str, Any],
    client: Any,
    r: Any,
    eventlog: EventlogServer,
    redis_server: RedisServer,
    rng: random.Random,
) -> dict[str, Any]:
    records, per_pass = p["records"], p["walk_records_per_pass"]
    runs: list[dict[str, Any]] = []
    systems = ("eventlog", "redis")
    for n in range(p["fetch_passes"]):
        for clients in FETCH_CLIENTS:
            order = systems if (n + clients) % 2 == 0 else systems[::-1]
            for system in order:
                # the clients share the pass's records; windows start at a batch boundary (whole
                # batches), so eventlog and Redis return exactly `window` records each
                window = per_pass // clients // MAX_RECORDS * MAX_RECORDS
                starts = [
                    rng.randrange(0, (records - window) // RECORDS_PER_BATCH) * RECORDS_PER_BATCH
                    for _ in range(clients)
                ]
                latencies: list[int] = []
                seen = [0] * clients
                meter = CpuMeter(eventlog.pid if system == "eventlog" else redis_server.pid).start()
                begin = time.perf_counter()

                async with anyio.create_task_group() as tg:
                    for i in range(clients):
                        tg.start_soon(
                            _walker, system, client, r, i, starts[i], window, seen, latencies
                        )
                elapsed = time.perf_counter() - begin
                total = sum(seen)
                run = {
                    "system": system,
                    "clients": clients,
                    "pass": n,
                    "records": total,
                    "seconds": round(elapsed, 4),
                    "records_per_s": round(total / elapsed, 1),
                    "requests": len(latencies),
                    "latency_us": percentiles_us(latencies),
                    **meter.stop(total),
                }
                runs.append(run)
                ctx.log(
                    f"fetch {system:>8} x {clients} client(s) (pass {n + 1}): {run['records_per_s']:>9,.0f} rec/s, "
                    f"p50 {run['latency_us']['p50_us'] / 1000:.2f} ms per {MAX_RECORDS}; server CPU {run['server_cpu_share']:.0%}"
                )
    by: dict[str, dict[str, Any]] = {}
    for system in systems:
        by[system] = {}
        for clients in FETCH_CLIENTS:
            mine = [x for x in runs if x["system"] == system and x["clients"] == clients]
            by[system][str(clients)] = {
                "median_records_per_s": round(median(x["records_per_s"] for x in mine), 1),
                "records_per_s": [x["records_per_s"] for x in mine],
                "median_p50_us": median(x["latency_us"]["p50_us"] for x in mine),
                "median_p99_us": median(x["latency_us"]["p99_us"] for x in mine),
                "median_server_cpu_us_per_record": round(
                    median(x["server_cpu_us_per_record"] for x in mine), 3
                ),
                "median_server_cpu_share": round(median(x["server_cpu_share"] for x in mine), 3),
            }
    ratio = {
        str(c): round(
            by["eventlog"][str(c)]["median_records_per_s"]
            / by["redis"][str(c)]["median_records_per_s"],
            3,
        )
        for c in FETCH_CLIENTS
    }
    return {"runs": runs, "by_system": by, "ratio_eventlog_to_redis": ratio}


async def _lookup_eventlog(client: Any, ts: int) -> None:
    response = await client.get(f"/v1/topics/{TOPIC}/partitions/0/offsets?timestamp={ts}")
    body = orjson.loads(response.content)
    if response.status_code != 200 or body["offset"] != ts - T0 or body["timestamp"] != ts:
        raise RuntimeError(f"lookup {ts}: {response.status_code} {body}")


async def _lookup_redis(r: Any, ts: int) -> None:
    entries = await r.xrange(STREAM, min=f"{ts}-0", max="+", count=1)
    if len(entries) != 1 or entries[0][0] != f"{ts}-0".encode():
        raise RuntimeError(f"redis lookup {ts}: {entries}")


LOOKUP_KINDS = {
    "eventlog_time_lookup_httpx": ("eventlog GET offsets?timestamp=T (httpx)", "tab:blue", "-o"),
    "eventlog_time_lookup_raw": (
        "eventlog GET offsets?timestamp=T (minimal client)",
        "tab:cyan",
        "-o",
    ),
    "redis_xrange_by_id": ("Redis XRANGE events <T>-0 + COUNT 1 (redis-py)", "tab:red", "-o"),
    "eventlog_healthz_httpx": ("floor: eventlog GET /healthz (httpx)", "tab:blue", ":s"),
    "eventlog_healthz_raw": ("floor: eventlog GET /healthz (minimal client)", "tab:cyan", ":s"),
    "redis_ping": ("floor: Redis PING (redis-py)", "tab:red", ":s"),
}


async def _lookups(
    ctx: Context, p: dict[str, Any], client: Any, raw: RawHttpClient, r: Any, rng: random.Random
) -> dict[str, Any]:
    records = p["records"]
    lookup_path = f"/v1/topics/{TOPIC}/partitions/0/offsets?timestamp="

    async def time_lookup_httpx(ts: int) -> None:
        await _lookup_eventlog(client, ts)

    async def time_lookup_raw(ts: int) -> None:
        status, body = await raw.get(f"{lookup_path}{ts}")
        answer = orjson.loads(body)
        if status != 200 or answer["offset"] != ts - T0 or answer["timestamp"] != ts:
            raise RuntimeError(f"lookup {ts}: {status} {answer}")

    async def xrange_by_id(ts: int) -> None:
        await _lookup_redis(r, ts)

    async def healthz_httpx(_ts: int) -> None:
        response = await client.get("/healthz")
        if response.status_code != 200:
            raise RuntimeError(f"healthz: {response.status_code}")

    async def healthz_raw(_ts: int) -> None:
        status, _ = await raw.get("/healthz")
        if status != 200:
            raise RuntimeError(f"healthz: {status}")

    async def ping(_ts: int) -> None:
        if not await r.ping():
            raise RuntimeError("PING failed")

    kinds = {
        "eventlog_time_lookup_httpx": time_lookup_httpx,
        "eventlog_time_lookup_raw": time_lookup_raw,
        "redis_xrange_by_id": xrange_by_id,
        "eventlog_healthz_httpx": healthz_httpx,
        "eventlog_healthz_raw": healthz_raw,
        "redis_ping": ping,
    }
    samples: dict[str, list[int]] = {k: [] for k in kinds}
    names = list(kinds)
    blocks = p["lookup_samples"] // LOOKUP_BLOCK
    begin = time.perf_counter()
    for block in range(blocks):
        shift = block % len(names)
        for name in names[shift:] + names[:shift]:
            call = kinds[name]
            out = samples[name]
            for _ in range(LOOKUP_BLOCK):
                ts = T0 + rng.randrange(records)
                t0 = time.perf_counter_ns()
                await call(ts)
                out.append(time.perf_counter_ns() - t0)
    stats = {k: percentiles_us(v) for k, v in samples.items()}
    for k, v in stats.items():
        ctx.log(f"lookup {k:>27}: p50 {v['p50_us']:6.0f} us, p99 {v['p99_us']:6.0f} us")
    ctx.log(f"lookups done ({time.perf_counter() - begin:.1f} s)")
    return {"samples_per_kind": p["lookup_samples"], "stats": stats}


# -- C clients: wrk and redis-benchmark ---------------------------------------------------------


def _c_clients(
    ctx: Context, p: dict[str, Any], work: Path, eventlog: EventlogServer, redis_server: RedisServer
) -> dict[str, Any]:
    """One connection each: wrk GETting random offsets / timestamps (Lua), redis-benchmark
    repeating one XRANGE (its arguments are fixed; a stream lookup costs the same anywhere)."""
    if which("wrk") is None or which("redis-benchmark") is None:
        return {"skipped": "wrk or redis-benchmark not found: apt-get install -y wrk redis-tools"}
    records, seconds = p["records"], p["c_client_seconds"]
    mid = records // 2
    scripts = {}
    for kind, path in (
        ("fetch", f"/v1/topics/{TOPIC}/partitions/0/records?max_records={MAX_RECORDS}&offset="),
        ("lookup", f"/v1/topics/{TOPIC}/partitions/0/offsets?timestamp="),
    ):
        script = work / f"{kind}.lua"
        base, span = (0, records - MAX_RECORDS) if kind == "fetch" else (T0, records)
        script.write_text(
            f"math.randomseed({SEED})\n"
            f'request = function()\n  return wrk.format("GET", "{path}" .. ({base} + math.random(0, {span - 1})))\nend\n'
            + WRK_DONE_LUA
        )
        scripts[kind] = script
    redis_args = {
        "fetch": ["XRANGE", STREAM, f"{T0 + mid}-0", "+", "COUNT", str(MAX_RECORDS)],
        "lookup": ["XRANGE", STREAM, f"{T0 + mid}-0", "+", "COUNT", "1"],
    }
    runs: list[dict[str, Any]] = []
    for repeat in range(p["c_client_repeats"]):
        for kind in ("fetch", "lookup"):
            order = ("wrk", "redis-benchmark") if repeat % 2 == 0 else ("redis-benchmark", "wrk")
            for tool in order:
                if tool == "wrk":
                    meter = CpuMeter(eventlog.pid).start()
                    out = run_wrk(scripts[kind], eventlog.url, 1, seconds)
                    cpu = meter.stop()
                    rate = out["requests"] / (out["duration_us"] / 1e6)
                    latency = {
                        k: out[k]
                        for k in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us")
                    }
                    detail = {"wrk": out}
                else:
                    meter = CpuMeter(redis_server.pid).start()
                    out = _redis_benchmark(redis_server.port, redis_args[kind], seconds)
                    cpu = meter.stop()
                    rate = float(out["rps"])
                    latency = {
                        "p50_us": float(out["p50_latency_ms"]) * 1000,
                        "p99_us": float(out["p99_latency_ms"]) * 1000,
                        "max_us": float(out["max_latency_ms"]) * 1000,
                        "mean_us": float(out["avg_latency_ms"]) * 1000,
                    }
                    detail = {"redis_benchmark": out}
                per_request = MAX_RECORDS if kind == "fetch" else 1
                run = {
                    "kind": kind,
                    "tool": tool,
                    "repeat": repeat,
                    "requests_per_s": round(rate, 1),
                    "records_per_s": round(rate * per_request, 1),
                    "latency_us": latency,
                    **cpu,
                    **detail,
                }
                runs.append(run)
                ctx.log(
                    f"C client {tool:>15} {kind:>6} (repeat {repeat + 1}): {rate:>9,.0f} requests/s, "
                    f"p50 {latency['p50_us']:.0f} us, p99 {latency['p99_us']:.0f} us; server CPU {cpu['server_cpu_share']:.0%}"
                )
    by: dict[str, dict[str, Any]] = {}
    for kind in ("fetch", "lookup"):
        by[kind] = {}
        for tool in ("wrk", "redis-benchmark"):
            mine = [x for x in runs if x["kind"] == kind and x["tool"] == tool]
            by[kind][tool] = {
                "median_records_per_s": round(median(x["records_per_s"] for x in mine), 1),
                "median_p50_us": median(x["latency_us"]["p50_us"] for x in mine),
                "median_p99_us": median(x["latency_us"]["p99_us"] for x in mine),
            }
    return {
        "seconds": seconds,
        "connections": 1,
        "runs": runs,
        "by_kind": by,
        "redis_args": redis_args,
    }


def _redis_benchmark(port: int, args: list[str], seconds: float) -> dict[str, str]:
    """redis-benchmark -c 1 of one command, sized from a short probe to last about `seconds`."""
    import csv
    import io

    def once(n: int) -> dict[str, str]:
        cmd = [
            which("redis-benchmark") or "redis-benchmark",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-c",
            "1",
            "-n",
            str(n),
            "--csv",
            *args,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows = list(csv.DictReader(io.StringIO(done.stdout)))
        if not rows:
            raise RuntimeError(f"redis-benchmark printed no CSV: {done.stdout}{done.stderr}")
        return {**rows[-1], "n": str(n), "command": " ".join(cmd)}

    probe = once(1000)
    return once(max(1000, int(float(probe["rps"]) * seconds)))


# -- summary ------------------------------------------------------------------------------------


def _summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    fetch, stats = results["fetch"], results["lookups"]["stats"]
    rows = []
    for c in FETCH_CLIENTS:
        e = fetch["by_system"]["eventlog"][str(c)]
        r = fetch["by_system"]["redis"][str(c)]
        rows.append(
            summary_row(
                f"JSON fetch, {MAX_RECORDS} records/request, {c} client(s), records/s (Python clients)",
                f"{e['median_records_per_s']:,.0f}/s",
                f"Redis XRANGE COUNT {MAX_RECORDS} (redis-py, {results.get('redis_py_parser', '?')} parser) "
                f"{r['median_records_per_s']:,.0f}/s",
                fetch["ratio_eventlog_to_redis"][str(c)],
                "(informational)",
                None,
            )
        )
    r = stats["redis_xrange_by_id"]
    for key, client in (
        ("eventlog_time_lookup_httpx", "httpx"),
        ("eventlog_time_lookup_raw", "minimal client"),
    ):
        e = stats[key]
        rows.append(
            summary_row(
                f"time lookup round trip (GET offsets?timestamp=T, {client}) p99 (p50)",
                f"{e['p99_us']:,.0f} us ({e['p50_us']:,.0f} us)",
                f"Redis XRANGE <T>-0 + COUNT 1 (redis-py) {r['p99_us']:,.0f} us ({r['p50_us']:,.0f} us)",
                e["p99_us"] / r["p99_us"],
                "(informational: p99 / Redis p99)",
                None,
            )
        )
    h, g = stats["eventlog_healthz_raw"], stats["redis_ping"]
    rows.append(
        summary_row(
            "floor: GET /healthz round trip (minimal client) p99 (p50)",
            f"{h['p99_us']:,.0f} us ({h['p50_us']:,.0f} us)",
            f"Redis PING (redis-py) {g['p99_us']:,.0f} us ({g['p50_us']:,.0f} us)",
            h["p99_us"] / g["p99_us"],
            "(informational)",
            None,
        )
    )
    c_clients = results.get("c_clients", {})
    if c_clients.get("by_kind"):
        f, l = c_clients["by_kind"]["fetch"], c_clients["by_kind"]["lookup"]
        rows.append(
            summary_row(
                f"JSON fetch from wrk, 1 connection, {MAX_RECORDS} records/request, records/s",
                f"{f['wrk']['median_records_per_s']:,.0f}/s",
                f"redis-benchmark XRANGE COUNT {MAX_RECORDS} {f['redis-benchmark']['median_records_per_s']:,.0f}/s",
                f["wrk"]["median_records_per_s"] / f["redis-benchmark"]["median_records_per_s"],
                "(informational)",
                None,
            )
        )
        rows.append(
            summary_row(
                "time lookup from wrk, 1 connection, p99 (p50)",
                f"{l['wrk']['median_p99_us']:,.0f} us ({l['wrk']['median_p50_us']:,.0f} us)",
                f"redis-benchmark XRANGE <T>-0 + COUNT 1 {l['redis-benchmark']['median_p99_us']:,.0f} us "
                f"({l['redis-benchmark']['median_p50_us']:,.0f} us)",
                l["wrk"]["median_p99_us"] / l["redis-benchmark"]["median_p99_us"],
                "(informational: p99 / Redis p99)",
                None,
            )
        )
    return rows


# -- plot ---------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    res = report["results"]
    fetch, stats = res["fetch"], res["lookups"]["stats"]
    c_clients = res.get("c_clients", {})
    fig, axes = plt.subplots(1, 3, figsize=(21, 6.8), gridspec_kw={"width_ratios": [1.1, 1, 1.3]})
    thousands = FuncFormatter(lambda v, _pos: f"{v / 1000:,.0f}k")
    colors = {"eventlog": "tab:blue", "redis": "tab:red"}

    ax = axes[0]
    labels = {
        "eventlog": "eventlog GET records (httpx + orjson)",
        "redis": "Redis XRANGE (redis-py)",
    }
    width = 0.38
    top = max(
        v for s in fetch["by_system"].values() for e in s.values() for v in e["records_per_s"]
    )
    for k, system in enumerate(("eventlog", "redis")):
        for i, c in enumerate(FETCH_CLIENTS):
            entry = fetch["by_system"][system][str(c)]
            x = i + (k - 0.5) * width
            ax.bar(
                x,
                entry["median_records_per_s"],
                width,
                color=colors[system],
                label=labels[system] if i == 0 else None,
            )
            ax.scatter(
                [x] * len(entry["records_per_s"]),
                entry["records_per_s"],
                color="black",
                s=10,
                zorder=3,
            )
            ax.annotate(
                f"p50\n{entry['median_p50_us'] / 1000:.1f} ms\nper\nrequest",
                (x, entry["median_records_per_s"] / 2),
                ha="center",
                va="center",
                fontsize=8,
                color="white",
            )
    for i, c in enumerate(FETCH_CLIENTS):
        ax.annotate(
            f"{fetch['ratio_eventlog_to_redis'][str(c)]:.2f} x Redis",
            (i, top * 1.03),
            ha="center",
            va="bottom",
            fontsize=10,
            fontweight="bold",
        )
    ax.set_ylim(0, top * 1.18)
    ax.set_xticks(range(len(FETCH_CLIENTS)), [f"{c} client(s)" for c in FETCH_CLIENTS])
    ax.yaxis.set_major_formatter(thousands)
    ax.set_ylabel("records/s (median; dots = passes)")
    ax.set_title(
        f"Python clients: sequential fetch, {MAX_RECORDS} records/request,\n{VALUE_BYTES} B values, "
        f"{report['params']['records']:,} records, warm",
        fontsize=10,
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=1, fontsize=9)

    ax = axes[1]
    if c_clients.get("by_kind"):
        f = c_clients["by_kind"]["fetch"]
        tools = [("wrk", "eventlog GET records\n(wrk, random offsets)", "tab:blue"),
                 ("redis-benchmark", "Redis XRANGE COUNT 500\n(redis-benchmark)", "tab:red")]  # fmt: skip
        values = [f[t]["median_records_per_s"] for t, _, _ in tools]
        bars = ax.bar([lab for _, lab, _ in tools], values, color=[c for _, _, c in tools])
        for bar, (t, _, _) in zip(bars, tools):
            ax.annotate(
                f"{f[t]['median_records_per_s']:,.0f}/s\np50 {f[t]['median_p50_us'] / 1000:.2f} ms",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=9,
            )
        ax.set_ylim(0, max(values) * 1.2)
        ax.yaxis.set_major_formatter(thousands)
        ax.set_ylabel("records/s (median of repeats)")
        ax.set_title("C clients, one connection: fetch of 500 records", fontsize=10)
    else:
        ax.text(
            0.5,
            0.5,
            f"C clients skipped: {c_clients.get('skipped')}",
            ha="center",
            va="center",
            wrap=True,
        )
        ax.set_axis_off()

    ax = axes[2]
    points = ["p50_us", "p90_us", "p99_us", "p999_us", "max_us"]
    for key, (label, color, style) in LOOKUP_KINDS.items():
        ax.plot(
            range(len(points)), [stats[key][q] for q in points], style, color=color, label=label
        )
    if c_clients.get("by_kind"):
        lk = c_clients["by_kind"]["lookup"]
        ax.scatter(
            [0, 2],
            [lk["wrk"]["median_p50_us"], lk["wrk"]["median_p99_us"]],
            marker="*",
            s=160,
            color="navy",
            zorder=4,
            label="eventlog time lookup (wrk, C client)",
        )
        ax.scatter([0, 2], [lk["redis-benchmark"]["median_p50_us"], lk["redis-benchmark"]["median_p99_us"]], marker="*",
                   s=160, color="darkred", zorder=4, label="Redis XRANGE COUNT 1 (redis-benchmark)")  # fmt: skip
    ax.set_xticks(range(len(points)), ["p50", "p90", "p99", "p99.9", "max"])
    ax.set_yscale("log")
    ax.set_ylabel("round trip, us (log scale)")
    ax.set_title(
        f"time lookup round trip, one client, {res['lookups']['samples_per_kind']:,} samples each (interleaved)",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=2)
    fig.suptitle(f"http_fetch, {report['mode']} run, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=95)
    plt.close(fig)
