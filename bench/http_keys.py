"""Per-key event streams (issue 14): reading one key's history from a big partition against
SQLite, conditional per-key appends against plain produce, and what the key index costs.

What is measured. `eventlog serve` at the default --processes, on a fresh data dir.

1. History: a one-partition topic (segment.bytes 64 MiB, so most of it is closed segments with
   their .keyindex files) holding RECORDS records (10 M; 200 k with --quick) of KEYS keys (1 M;
   20 k), filled with raw batches of 10 records (1,000 of them a request), as producers of a few
   events at a time write them. 100 of the keys have exactly 100 records
   each, spread evenly over the partition; the rest share the other records. Then READS GETs
   of `/v1/topics/history/keys/<one of the 100>/records?max_records=100` from one keep-alive
   httpx connection (each must return its 100 records), after 20 unmeasured ones: latency p50 and
   p99 through HTTP. Peer: SQLite (WAL, a table of (offset primary key, key, value) with an index
   on key, the same rows) answering `SELECT offset, key, value FROM records WHERE key = ? ORDER BY
   offset LIMIT 100` in this process, the same keys in the same order. Also the server's resident
   memory after the reads, and the key index's bytes on disk per record.
2. Conditional appends: CLIENTS client processes (http.client, one keep-alive connection each)
   append one record at a time to keys drawn at random from 10,000, on a 4-partition topic (a new
   one for each repeat, so the keys are new at its start), for CELL_SECONDS: each keeps the versions it learnt (the ETag of its last success, or the
   `current_offset` of a 412) and sends `If-Match` (or `If-None-Match: *` for a key it has never
   seen); against the same processes sending plain one-record produces with keys to the topic
   endpoint. Afterwards every key's history (read through the partitions) must be exactly the
   chain of successes: each success's version was the record before it (0 lost updates).
3. Cost of the index: wrk (one thread, 16 connections) POSTing 500 keyed records of 100 B to a
   4-partition topic with `eventlog.key.index` true and false, cells alternating, medians.

Goals (issue 14): history p99 <= 5 ms (ratio: SQLite's p99 / ours); conditional appends >= 0.5 x
plain produce records/s with 0 lost updates; index on >= 0.85 x off.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import os
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from . import http_produce
from .fanout.client import rss_bytes
from .harness import Context, median, remove_tree, summary_row
from .http_shards import ShardedServer, serve_knows_processes, tree_pids
from .servers import WRK_DONE_LUA, run_wrk, running, tail

NAME = "keys"
TITLE = "Per-key streams: one key's history (vs SQLite), conditional appends (vs plain produce), the index's cost"

HOT_KEYS = 100
HOT_RECORDS = 100
BATCH_RECORDS = 10  # a batch as a producer of a few events at a time makes one
BATCHES_PER_REQUEST = 1_000
COND_KEYS = 10_000
RAW = "application/vnd.kafka.record-batch.v2"
GOAL_P99_MS = 5.0
GOAL_COND_RATIO = 0.5
GOAL_COST_RATIO = 0.85


def params(quick: bool) -> dict[str, Any]:
    return {
        "records": 200_000 if quick else 10_000_000,
        "keys": 20_000 if quick else 1_000_000,
        "hot_keys": HOT_KEYS,
        "records_per_hot_key": HOT_RECORDS,
        "reads": 200 if quick else 1000,
        "clients": 4,
        "cond_keys": COND_KEYS,
        "cell_seconds": 3 if quick else 8,
        "repeats": 1 if quick else 3,
        "processes": os.cpu_count() or 1,
        "history_topic": "1 partition, segment.bytes 64 MiB, 32-byte values",
    }


def _hot_key(i: int) -> bytes:
    return b"hot-%03d" % i


def _rows(records: int, keys: int):
    """(offset, key, value) of the history partition, in offset order."""
    stride = records // HOT_RECORDS
    others = keys - HOT_KEYS
    for i in range(records):
        slot = i % stride
        key = _hot_key(slot) if slot < HOT_KEYS else b"k%08d" % (i % others)
        yield i, key, b"v%031d" % i


# -- 1. history ----------------------------------------------------------------------------------


def _fill(server: ShardedServer, records: int, keys: int) -> float:
    from engine.records import encode_batch

    with httpx.Client(base_url=server.url, timeout=300) as client:
        made = client.post("/v1/topics", json={"name": "history", "partitions": 1, "configs": {"segment.bytes": 64 << 20}})
        if made.status_code != 201:
            raise RuntimeError(f"create topic: {made.status_code} {made.text}")
        t0 = time.perf_counter()
        batch: list = []
        body: list[bytes] = []
        now = int(time.time() * 1000)
        for _offset, key, value in _rows(records, keys):
            batch.append((key, value, now, ()))
            if len(batch) == BATCH_RECORDS:
                body.append(bytes(encode_batch(0, batch)))
                batch = []
                if len(body) == BATCHES_PER_REQUEST:
                    _post_raw(client, b"".join(body))
                    body = []
        if batch:
            body.append(bytes(encode_batch(0, batch)))
        if body:
            _post_raw(client, b"".join(body))
        return time.perf_counter() - t0


def _post_raw(client: httpx.Client, data: bytes) -> None:
    r = client.post("/v1/topics/history/partitions/0/records", content=bytes(data), headers={"content-type": RAW})
    if r.status_code != 200:
        raise RuntimeError(f"fill: {r.status_code} {r.text[:300]}")


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"p50_ms": round(pick(0.50), 3), "p99_ms": round(pick(0.99), 3), "max_ms": round(ordered[-1] * 1000, 3)}


def _history_reads(server: ShardedServer, order: list[int]) -> dict[str, Any]:
    took = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for n, i in enumerate([*order[:20], *order]):
            t0 = time.perf_counter()
            r = client.get(f"/v1/topics/history/keys/{_hot_key(i).decode()}/records", params={"max_records": HOT_RECORDS})
            elapsed = time.perf_counter() - t0
            if r.status_code != 200 or len(r.json()["records"]) != HOT_RECORDS:
                raise RuntimeError(f"history of {_hot_key(i)!r}: {r.status_code} {r.text[:300]}")
            if n >= 20:
                took.append(elapsed)
    return _percentiles(took)


def _sqlite(path: Path, records: int, keys: int, order: list[int]) -> dict[str, Any]:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE records (offset INTEGER PRIMARY KEY, key BLOB NOT NULL, value BLOB)")
    t0 = time.perf_counter()
    db.executemany("INSERT INTO records VALUES (?, ?, ?)", _rows(records, keys))
    db.execute("CREATE INDEX records_key ON records (key)")
    db.commit()
    built = time.perf_counter() - t0
    query = "SELECT offset, key, value FROM records WHERE key = ? ORDER BY offset LIMIT 100"
    took = []
    for n, i in enumerate([*order[:20], *order]):
        t0 = time.perf_counter()
        rows = db.execute(query, (_hot_key(i),)).fetchall()
        elapsed = time.perf_counter() - t0
        if len(rows) != HOT_RECORDS:
            raise RuntimeError(f"sqlite: {len(rows)} rows for {_hot_key(i)!r}")
        if n >= 20:
            took.append(elapsed)
    db.close()
    return {**_percentiles(took), "build_s": round(built, 1), "bytes": sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))}


def _key_index_bytes(data_dir: Path) -> tuple[int, int]:
    files = list(data_dir.glob("history-0/*.keyindex"))
    return sum(f.stat().st_size for f in files), len(files)


def _active_memory(entries: int) -> dict[str, Any]:
    """The memory of an active segment's key entries for `entries` distinct keys, in this
    process: resident memory before and after, and the index's own count."""
    from engine.key_index import ActiveKeys, key_hash

    rss0 = rss_bytes([os.getpid()])
    active = ActiveKeys(0)
    t0 = time.perf_counter()
    batch = 500
    for start in range(0, entries, batch):
        keys = [b"key-%09d" % i for i in range(start, min(entries, start + batch))]
        active.add_many(list(map(key_hash, keys)), range(start, start + len(keys)), start * 40)
    took = time.perf_counter() - t0
    rss1 = rss_bytes([os.getpid()])
    return {"active_entries": entries, "memory_bytes": active.memory_bytes(), "rss_growth_bytes": rss1 - rss0,
            "bytes_per_key": round((rss1 - rss0) / entries, 1), "add_s": round(took, 2), "runs": len(active.state[0])}


# -- 2. conditional appends --------------------------------------------------------------------


def _cond_client(port: int, seed: int, seconds: float, conditional: bool, start: float, out: Any, topic: str) -> None:
    rng = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    versions: dict[int, int] = {}
    wins: list[tuple[int, int, int]] = []  # (key, version before, offset written)
    conflicts = sent = 0
    time.sleep(max(0.0, start - time.time()))
    end = time.time() + seconds
    while time.time() < end:
        k = rng.randrange(COND_KEYS)
        key = f"acct-{k:05d}"
        if conditional:
            version = versions.get(k, -1)
            headers = {"content-type": "application/json"}
            headers["If-Match" if version >= 0 else "If-None-Match"] = f'"{version}"' if version >= 0 else "*"
            body = orjson.dumps({"records": [{"value": f"event from {seed}"}]})
            conn.request("POST", f"/v1/topics/{topic}/keys/{key}/records", body, headers)
        else:
            body = orjson.dumps({"records": [{"key": key, "value": f"event from {seed}"}]})
            conn.request("POST", "/v1/topics/plain/records", body, {"content-type": "application/json"})
        answer = conn.getresponse()
        data = answer.read()
        sent += 1
        if answer.status == 200:
            if conditional:
                written = json.loads(data)["last_offset"]
                wins.append((k, versions.get(k, -1), written))
                versions[k] = written
        elif answer.status == 412 and conditional:
            conflicts += 1
            versions[k] = json.loads(data)["current_offset"]
        else:
            out.put(("error", f"{answer.status} {data[:300]!r}"))
            return
    out.put(("ok", sent, conflicts, wins))


def _cond_cell(server: ShardedServer, clients: int, seconds: float, conditional: bool, topic: str = "plain") -> dict[str, Any]:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start = time.time() + 1.0
    procs = [ctx.Process(target=_cond_client, args=(server.port, i + (1000 if conditional else 0), seconds, conditional, start, out, topic))
             for i in range(clients)]
    for p in procs:
        p.start()
    got = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    errors = [g[1] for g in got if g[0] == "error"]
    if errors:
        raise RuntimeError(f"clients failed: {errors[:3]}")
    sent = sum(g[1] for g in got)
    conflicts = sum(g[2] for g in got)
    wins = [w for g in got for w in g[3]]
    appended = sent - conflicts
    return {"topic": topic, "requests": sent, "appended": appended, "conflicts": conflicts,
            "records_per_s": round(appended / seconds, 1), "wins": wins}


def _lost_updates(server: ShardedServer, topic: str, wins: list[tuple[int, int, int]]) -> dict[str, Any]:
    """Every key's records (read through its partition) against the chain of successes."""
    by_key: dict[str, list[int]] = {}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        partitions = len(client.get(f"/v1/topics/{topic}").json()["partitions"])
        for p in range(partitions):
            offset = 0
            while True:
                r = client.get(f"/v1/topics/{topic}/partitions/{p}/records", params={"offset": offset, "max_records": 10_000}).json()
                for rec in r["records"]:
                    by_key.setdefault(rec["key"], []).append(rec["offset"])
                if not r["records"]:
                    break
                offset = r["next_offset"]
    violations = 0
    chains: dict[str, list[tuple[int, int]]] = {}
    for k, before, written in wins:
        chains.setdefault(f"acct-{k:05d}", []).append((written, before))
    for key, chain in chains.items():
        chain.sort()
        offsets = by_key.get(key, [])
        if [w for w, _ in chain] != offsets:
            violations += 1
            continue
        previous = -1
        for written, before in chain:
            if before != previous:
                violations += 1
            previous = written
    unexpected = sum(1 for key in by_key if key not in chains)
    return {"topic": topic, "keys_written": len(chains), "violations": violations + unexpected}


# -- 3. the index's cost ------------------------------------------------------------------------


def _cost_cell(server: ShardedServer, script: Path, body: Path, topic: str, seconds: int) -> dict[str, Any]:
    out = run_wrk(script, f"{server.url}/v1/topics/{topic}/records", 16, seconds, env={"BENCH_BODY_FILE": str(body)})
    return {"records_per_s": round(out["requests"] * 500 / (out["duration_us"] / 1e6), 1), "p99_us": out["p99_us"]}


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    rng = random.Random(14)
    order = [rng.randrange(HOT_KEYS) for _ in range(p["reads"])]
    results: dict[str, Any] = {}
    try:
        server = ShardedServer(ctx, work / "eventlog", p["processes"], serve_knows_processes())
        with running(server):
            ctx.log(f"filling {p['records']:,} records of {p['keys']:,} keys ...")
            fill_s = _fill(server, p["records"], p["keys"])
            reads = _history_reads(server, order)
            rss = rss_bytes(tree_pids(server.pid))
            index_bytes, index_files = _key_index_bytes(work / "eventlog" / "data")
            results["history"] = {"eventlog": {**reads, "fill_s": round(fill_s, 1), "server_rss_bytes": rss,
                                               "key_index_bytes": index_bytes, "key_index_files": index_files}}
            ctx.log(f"history: eventlog p50 {reads['p50_ms']} ms, p99 {reads['p99_ms']} ms")
            with httpx.Client(base_url=server.url, timeout=60) as client:
                conds = [(f"cond-{i}", {}) for i in range(p["repeats"])]
                for name, configs in (*conds, ("plain", {}), ("on", {}), ("off", {"eventlog.key.index": "false"})):
                    r = client.post("/v1/topics", json={"name": name, "partitions": 4, "configs": configs})
                    if r.status_code != 201:
                        raise RuntimeError(f"create {name}: {r.status_code} {r.text}")
            cond_cells, plain_cells, checks = [], [], []
            for i in range(p["repeats"]):  # each conditional cell on a topic of its own: keys new at its start
                plain_cells.append(_cond_cell(server, p["clients"], p["cell_seconds"], conditional=False))
                cell = _cond_cell(server, p["clients"], p["cell_seconds"], conditional=True, topic=f"cond-{i}")
                checks.append(_lost_updates(server, cell["topic"], cell.pop("wins")))
                cond_cells.append(cell)
            for c in plain_cells:
                c.pop("wins")
            lost = {"keys_written": sum(c["keys_written"] for c in checks), "violations": sum(c["violations"] for c in checks),
                    "topics": checks}
            results["conditional"] = {"conditional": cond_cells, "plain": plain_cells, "check": lost}
            body = work / "body.json"
            body.write_bytes(orjson.dumps({"records": [{"key": k, "value": v} for k, v in http_produce.records()]}))
            script = work / "post.lua"
            script.write_text('local f = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))\nwrk.method = "POST"\n'
                              'wrk.body = f:read("*a")\nf:close()\nwrk.headers["Content-Type"] = "application/json"\n' + WRK_DONE_LUA)
            on, off = [], []
            for i in range(p["repeats"] * 2):
                first, second = ("on", "off") if i % 2 == 0 else ("off", "on")
                for topic in (first, second):
                    (on if topic == "on" else off).append(_cost_cell(server, script, body, topic, p["cell_seconds"]))
            results["cost"] = {"on": on, "off": off}
            if server.exit_status not in (0, None):
                raise RuntimeError(f"eventlog exited with {server.exit_status}:\n{tail(server.log_path)}")
        ctx.log("sqlite: building the same rows ...")
        results["history"]["sqlite"] = _sqlite(work / "peer.db", p["records"], p["keys"], order)
        results["memory"] = _active_memory(p["keys"] * 10)
    finally:
        remove_tree(work)
    return {"params": p, "results": results, "summary": _summary(p, results)}


def _summary(p: dict[str, Any], r: dict[str, Any]) -> list[dict[str, Any]]:
    ours, peer = r["history"]["eventlog"], r["history"]["sqlite"]
    cond = median(c["records_per_s"] for c in r["conditional"]["conditional"])
    plain = median(c["records_per_s"] for c in r["conditional"]["plain"])
    lost = r["conditional"]["check"]["violations"]
    on = median(c["records_per_s"] for c in r["cost"]["on"])
    off = median(c["records_per_s"] for c in r["cost"]["off"])
    per_record = ours["key_index_bytes"] / p["records"] if ours["key_index_files"] else None
    memory = r["memory"]
    return [
        summary_row(f"one key's {HOT_RECORDS} records from a {p['records']:,}-record partition of {p['keys']:,} keys, through HTTP",
                    f"p50 {ours['p50_ms']} ms, p99 {ours['p99_ms']} ms",
                    f"SQLite (WAL, index on key) in-process: p50 {peer['p50_ms']} ms, p99 {peer['p99_ms']} ms",
                    peer["p99_ms"] / ours["p99_ms"] if ours["p99_ms"] else None, f"p99 <= {GOAL_P99_MS:.0f} ms",
                    ours["p99_ms"] <= GOAL_P99_MS),
        summary_row(f"conditional per-key appends, {p['clients']} clients over {COND_KEYS:,} keys, records/s",
                    f"{cond:,.0f}/s, {lost} lost updates", f"plain one-record produce: {plain:,.0f}/s",
                    cond / plain if plain else None, f">= {GOAL_COND_RATIO} x, 0 lost updates",
                    cond >= GOAL_COND_RATIO * plain and lost == 0),
        summary_row("JSON produce (500 keyed records a request, wrk 16 connections) with the key index on",
                    f"{on:,.0f} records/s" + (f"; {per_record:.1f} index bytes on disk per record" if per_record else ""),
                    f"index off: {off:,.0f} records/s", on / off if off else None, f">= {GOAL_COST_RATIO} x",
                    on >= GOAL_COST_RATIO * off),
        summary_row(f"key index memory of an active segment holding {memory['active_entries']:,} distinct keys",
                    f"{memory['rss_growth_bytes'] / 1e6:,.0f} MB resident ({memory['bytes_per_key']} bytes a key)",
                    "a dict of them: ~100 bytes a key", None, "bounded, reported", None),
    ]


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    r = report["results"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ours, peer = r["history"]["eventlog"], r["history"]["sqlite"]
    ax = axes[0]
    ax.bar(["eventlog p50", "eventlog p99", "SQLite p50", "SQLite p99"],
           [ours["p50_ms"], ours["p99_ms"], peer["p50_ms"], peer["p99_ms"]], color=["tab:blue", "tab:blue", "tab:gray", "tab:gray"])
    ax.axhline(GOAL_P99_MS, color="tab:red", linestyle=":", label=f"goal: p99 <= {GOAL_P99_MS:.0f} ms")
    ax.set_ylabel("ms")
    ax.set_title("one key's 100 records")
    ax.legend()
    ax = axes[1]
    cond = [c["records_per_s"] for c in r["conditional"]["conditional"]]
    plain = [c["records_per_s"] for c in r["conditional"]["plain"]]
    ax.bar(["conditional (If-Match)", "plain produce"], [median(cond), median(plain)], color=["tab:blue", "tab:gray"])
    ax.set_ylabel("records/s")
    ax.set_title(f"{report['params']['clients']} clients, one record per request")
    ax = axes[2]
    on = [c["records_per_s"] for c in r["cost"]["on"]]
    off = [c["records_per_s"] for c in r["cost"]["off"]]
    ax.bar(["key index on", "key index off"], [median(on), median(off)], color=["tab:blue", "tab:gray"])
    ax.set_ylabel("records/s")
    ax.set_title("JSON produce, 500 keyed records a request")
    fig.suptitle(TITLE, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

