"""Raw Kafka batches over HTTP: produce MB/s against dd, fetch MB/s against os.pread.

What is measured, on the real `eventlog serve` (a subprocess, default topic configs:
flush.messages=1, every group commit fdatasync'ed before its producers hear back):

* produce: `POST /v1/topics/{t}/partitions/0/records` with Content-Type
  application/vnd.kafka.record-batch.v2 and one ~1 MiB batch per request (1,013 records of
  1 KiB = 1,048,388 bytes, encoded once with engine.records.encode_batch: the batch of the
  append benchmark), from 1, 4 and 16 clients (asyncio tasks sharing one httpx.AsyncClient,
  HTTP/1.1 keep-alive) until as many MiB as dd writes were acknowledged, each run on a fresh
  one-partition topic (deleted afterwards). MB/s counts acknowledged log bytes.
  Peer: `dd if=/dev/zero of=FILE bs=1M count=N conv=fdatasync` in the scratch dir (the same
  filesystem as the server's data dir), in a rotating order with the HTTP runs: the disk's
  bandwidth here changes within seconds, so medians of interleaved runs are compared.
  Goal: >= 0.8 of dd.
* fetch: a one-partition topic of ~16 KiB batches (15 records of 1 KiB, as in the read
  benchmark), filled over HTTP, is read start to end with `GET .../records?offset=N&
  max_bytes=1048576` and `Accept: application/vnd.kafka.record-batch.v2`, following the
  X-Next-Offset header: one client; and four clients each walking a quarter. Peer: the same
  segment files read with os.pread in 1 MiB chunks by this process.
  **Warm page cache for both**: every segment file is read once before timing (the data is a
  small fraction of RAM), so this compares CPU cost per byte, not the disk. Passes rotate
  (pread, 1 client, 4 clients) and medians are compared. Goal: 1 client >= 0.5 of pread.
  Informational: wrk (one thread, 4 connections) cycling through the same fetch URLs, to show
  the server's rate without a Python client; and the loopback TCP ceiling, the same bytes sent
  over one 127.0.0.1 connection in 1 MiB sendall()s and received with recv_into() by two
  threads of this process (no HTTP, no Python per byte): no HTTP fetch can beat it here.
  dd's CPU time (from getrusage of the waited child) and the server's are recorded per MB.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from engine.format import parse_header

from . import data
from .harness import MB, Context, MiB, dd_write, median, pread_files, remove_tree, summary_row
from .servers import (
    WRK_DONE_LUA,
    CpuMeter,
    EventlogServer,
    children_cpu_seconds,
    client_facts,
    commit_stats,
    create_topic,
    delete_topic,
    eventlog_counters,
    http_client,
    run_async,
    run_wrk,
    running,
    which,
    wrk_version,
)

NAME = "http_raw"
TITLE = "raw v2 batches over HTTP: produce MB/s vs dd conv=fdatasync, fetch MB/s vs os.pread (warm cache)"

RAW = "application/vnd.kafka.record-batch.v2"
CLIENTS = (1, 4, 16)
FETCH_CLIENTS = (1, 4)
FETCH_MAX_BYTES = MiB
FETCH_RECORDS_PER_BATCH = 15
FETCH_RECORD_BYTES = 1024
FILL_BATCHES_PER_REQUEST = 64
WRK_FETCH_CONNECTIONS = 4
FETCH_KEYS = ("1", "4")
FETCH_LABELS = {"pread": "os.pread", "tcp": "loopback TCP", "1": "1 client", "4": "4 clients"}
GOAL_PRODUCE_RATIO = 0.8
GOAL_FETCH_RATIO = 0.5


def params(quick: bool) -> dict[str, Any]:
    fetch_bytes = (256 if quick else 1024) * MiB
    return {
        "produce_clients": list(CLIENTS),
        "produce_batch": "~1 MiB: 1,013 records of 1 KiB (the append benchmark's batch)",
        "produce_mib_per_run": 128 if quick else 512,
        "produce_repeats": 2 if quick else 5,
        "fetch_data_bytes": fetch_bytes,
        "fetch_segment_bytes": fetch_bytes // 8,
        "fetch_batch": f"{FETCH_RECORDS_PER_BATCH} records of {FETCH_RECORD_BYTES} B (~16 KiB)",
        "fetch_max_bytes": FETCH_MAX_BYTES,
        "fetch_clients": list(FETCH_CLIENTS),
        "fetch_passes": 3 if quick else 7,
        "wrk_fetch_seconds": 1 if quick else 3,
        "wrk_fetch_connections": WRK_FETCH_CONNECTIONS,
        "pread_chunk_bytes": MiB,
        "page_cache": "warm for fetch and pread (every segment file read once before timing; data << RAM)",
        "topic_config": "defaults (flush.messages=1) for produce; segment.bytes = fetch_data_bytes / 8 for fetch",
    }


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    server = EventlogServer(ctx, work / "eventlog")
    try:
        with running(server):
            ctx.log(f"server: eventlog :{server.port}, data in {server.data_dir}")
            produce = run_async(_produce, ctx, p, server, work)
            fetch = run_async(_fetch, ctx, p, server)
            fetch["wrk"] = _wrk_fetch(ctx, p, server, work, fetch.pop("_paths"))
        facts = server.facts()
        if server.exit_status != 0:
            raise RuntimeError(f"eventlog exited with {server.exit_status}")
    finally:
        remove_tree(work)
    p["server"] = facts
    p["clients_facts"] = client_facts()
    p["tools"] = {"wrk": wrk_version()}
    results = {"produce": produce, "fetch": fetch}
    return {"params": p, "results": results, "summary": _summary(results)}


# -- produce ------------------------------------------------------------------------------------


async def _produce(
    ctx: Context, p: dict[str, Any], server: EventlogServer, work: Path
) -> dict[str, Any]:
    batch = bytes(data.largest_batch_under(MiB))
    per_batch = parse_header(batch, 0).records_count
    total = p["produce_mib_per_run"]
    dd_runs: list[dict[str, Any]] = []
    runs: dict[int, list[dict[str, Any]]] = {c: [] for c in CLIENTS}
    order: list[int | None] = [None, *CLIENTS]  # None = dd
    serial = 0
    for repeat in range(p["produce_repeats"]):
        shift = repeat % len(order)
        for clients in order[shift:] + order[:shift]:
            if clients is None:
                cpu_before = children_cpu_seconds()
                dd = await anyio.to_thread.run_sync(dd_write, work, total)
                dd["cpu_s"] = round(children_cpu_seconds() - cpu_before, 3)
                dd["cpu_ms_per_mb"] = round(dd["cpu_s"] / (dd["bytes"] / MB) * 1000, 3)
                dd["repeat"] = repeat
                dd_runs.append(dd)
                ctx.log(
                    f"dd {total} MiB conv=fdatasync (repeat {repeat + 1}): {dd['mb_per_s']:.1f} MB/s, "
                    f"CPU {dd['cpu_ms_per_mb']:.2f} ms/MB"
                )
                continue
            serial += 1
            cell = await _produce_run(server, f"raw-{serial}", batch, clients, total)
            cell.update(repeat=repeat, records_per_batch=per_batch)
            runs[clients].append(cell)
            ctx.log(
                f"raw produce ~1 MiB x {clients:>2} clients (repeat {repeat + 1}): {cell['mb_per_s']:7.1f} MB/s, "
                f"p50 {cell['latency_us']['p50_us'] / 1000:.1f} ms; {cell['commits']['appends_per_commit']} "
                f"appends/fsync, fsync {cell['commits']['mean_fsync_ms']} ms; server CPU {cell['server_cpu_share']:.0%}, "
                f"{cell['server_cpu_us_per_mb'] / 1000:.2f} ms/MB"
            )
    dd_median = median(d["mb_per_s"] for d in dd_runs)
    by_clients = []
    for clients, cells in runs.items():
        mb_s = median(c["mb_per_s"] for c in cells)
        by_clients.append(
            {
                "clients": clients,
                "median_mb_per_s": round(mb_s, 1),
                "ratio_to_dd": round(mb_s / dd_median, 3),
                "median_p50_us": median(c["latency_us"]["p50_us"] for c in cells),
                "median_p99_us": median(c["latency_us"]["p99_us"] for c in cells),
                "median_server_cpu_ms_per_mb": round(
                    median(c["server_cpu_us_per_mb"] for c in cells) / 1000, 3
                ),
                "median_server_cpu_share": median(c["server_cpu_share"] for c in cells),
                "runs": cells,
            }
        )
    return {
        "batch_bytes": len(batch),
        "records_per_batch": per_batch,
        "mib_per_run": total,
        "dd_runs": dd_runs,
        "dd_median_mb_per_s": round(dd_median, 1),
        "dd_median_cpu_ms_per_mb": round(median(d["cpu_ms_per_mb"] for d in dd_runs), 3),
        "by_clients": by_clients,
        "goal_ratio": GOAL_PRODUCE_RATIO,
    }


async def _produce_run(
    server: EventlogServer, topic: str, batch: bytes, clients: int, batches: int
) -> dict[str, Any]:
    from .harness import percentiles_us

    server.check_alive()
    path = f"/v1/topics/{topic}/partitions/0/records"
    async with http_client(server.url, clients + 1) as client:
        await create_topic(client, topic, 1)
        try:
            # open every connection before the clock starts (no data written)
            async with anyio.create_task_group() as tg:
                for _ in range(clients):
                    tg.start_soon(client.get, f"/v1/topics/{topic}")
            before = await eventlog_counters(client)
            started = acked = 0
            latencies: list[int] = []
            meter = CpuMeter(server.pid).start()
            begin = time.perf_counter()

            async def producer() -> None:
                nonlocal started, acked
                while started < batches:
                    started += 1
                    t0 = time.perf_counter_ns()
                    response = await client.post(path, content=batch, headers={"content-type": RAW})
                    latencies.append(time.perf_counter_ns() - t0)
                    if response.status_code != 200:
                        raise RuntimeError(
                            f"raw produce: {response.status_code} {response.text[:500]}"
                        )
                    acked += 1

            async with anyio.create_task_group() as tg:
                for _ in range(clients):
                    tg.start_soon(producer)
            elapsed = time.perf_counter() - begin
            cpu = meter.stop()
            commits = commit_stats(before, await eventlog_counters(client))
        finally:
            await delete_topic(client, topic)
    size = acked * len(batch)
    return {
        "clients": clients,
        "seconds": round(elapsed, 4),
        "batches": acked,
        "bytes": size,
        "mb_per_s": round(size / elapsed / MB, 2),
        "latency_us": percentiles_us(latencies),
        "commits": commits,
        **cpu,
        "server_cpu_us_per_mb": round(cpu["server_cpu_s"] / (size / MB) * 1e6, 1),
    }


# -- fetch --------------------------------------------------------------------------------------


async def _fetch(ctx: Context, p: dict[str, Any], server: EventlogServer) -> dict[str, Any]:
    topic = "fetch"
    batch = bytes(data.encode_records_batch(FETCH_RECORD_BYTES, FETCH_RECORDS_PER_BATCH))
    body = batch * FILL_BATCHES_PER_REQUEST
    requests = p["fetch_data_bytes"] // len(body)
    async with http_client(server.url, 8) as client:
        await create_topic(client, topic, 1, {"segment.bytes": p["fetch_segment_bytes"]})
        begin = time.perf_counter()
        sent = 0

        async def filler() -> None:
            nonlocal sent
            while sent < requests:
                sent += 1
                response = await client.post(
                    f"/v1/topics/{topic}/partitions/0/records",
                    content=body,
                    headers={"content-type": RAW},
                )
                if response.status_code != 200:
                    raise RuntimeError(f"fill: {response.status_code} {response.text[:500]}")

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(filler)
        described = (await client.get(f"/v1/topics/{topic}")).json()
        high_watermark = described["partitions"][0]["high_watermark"]
        files = sorted((server.data_dir / f"{topic}-0").glob("*.log"))
        file_bytes = sum(f.stat().st_size for f in files)
        ctx.log(
            f"fetch: wrote {file_bytes / MB:,.0f} MB in {len(files)} segments over HTTP "
            f"({time.perf_counter() - begin:.1f} s); high watermark {high_watermark:,}"
        )
        pread_files(files)  # warm the page cache
        paths: list[str] = []
        starts: list[int] = []
        _, fetches = await _walk(
            client, topic, 0, high_watermark, paths, starts
        )  # warm-up; URLs for wrk
        runs: dict[str, list[dict[str, Any]]] = {"pread": [], "tcp": [], "1": [], "4": []}
        for n in range(p["fetch_passes"]):
            order = list(runs)
            shift = n % len(order)
            for key in order[shift:] + order[:shift]:
                meter = CpuMeter(server.pid).start()
                begin = time.perf_counter()
                if key == "pread":
                    size = await anyio.to_thread.run_sync(pread_files, files)
                elif key == "tcp":
                    size = await anyio.to_thread.run_sync(loopback_tcp, file_bytes)
                else:
                    clients = int(key)
                    # each client walks a share of the fetches of one walk: the same byte ranges
                    bounds = [starts[len(starts) * i // clients] for i in range(clients)] + [
                        high_watermark
                    ]
                    sizes: list[int] = [0] * clients
                    async with anyio.create_task_group() as tg:
                        for i in range(clients):
                            tg.start_soon(
                                _walk_share, client, topic, bounds[i], bounds[i + 1], sizes, i
                            )
                    size = sum(sizes)
                elapsed = time.perf_counter() - begin
                cpu = meter.stop()
                if size != file_bytes:
                    raise AssertionError(
                        f"{key}: read {size} bytes, the segment files hold {file_bytes}"
                    )
                runs[key].append(
                    {
                        "pass": n,
                        "seconds": round(elapsed, 4),
                        "mb_per_s": round(size / elapsed / MB, 1),
                        **cpu,
                    }
                )
            ctx.log(
                "fetch pass: "
                + ", ".join(
                    f"{FETCH_LABELS[k]} {v[-1]['mb_per_s']:,.0f} MB/s" for k, v in runs.items()
                )
            )
    pread = median(r["mb_per_s"] for r in runs["pread"])
    medians = {k: round(median(r["mb_per_s"] for r in v), 1) for k, v in runs.items()}
    return {
        "bytes_per_pass": file_bytes,
        "segments": len(files),
        "batch_bytes": len(batch),
        "high_watermark": high_watermark,
        "fetches_per_walk": fetches,
        "mean_fetch_bytes": round(file_bytes / fetches),
        "runs": runs,
        "median_mb_per_s": medians,
        "ratio_to_pread": {k: round(v / pread, 3) for k, v in medians.items() if k != "pread"},
        "ratio_to_loopback_tcp": {
            k: round(v / medians["tcp"], 3) for k, v in medians.items() if k in FETCH_KEYS
        },
        "goal_ratio": GOAL_FETCH_RATIO,
        "_paths": paths,
    }


async def _walk_share(
    client: httpx.AsyncClient, topic: str, start: int, end: int, sizes: list[int], i: int
) -> None:
    sizes[i], _ = await _walk(client, topic, start, end)


def loopback_tcp(total: int) -> int:
    """`total` bytes sent over a 127.0.0.1 TCP connection in 1 MiB sendall()s by one thread and
    received with recv_into() by another: what the kernel's loopback copy allows one
    connection, the ceiling of any HTTP fetch here. Returns the bytes received."""
    chunk = memoryview(bytes(MiB))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def send() -> None:
            with socket.create_connection(listener.getsockname()) as out:
                sent = 0
                while sent < total:
                    piece = chunk[: min(MiB, total - sent)]
                    out.sendall(piece)
                    sent += len(piece)

        sender = threading.Thread(target=send)
        sender.start()
        conn, _ = listener.accept()
        buf = memoryview(bytearray(MiB))
        received = 0
        with conn:
            while n := conn.recv_into(buf):
                received += n
        sender.join()
    return received


async def _walk(
    client: httpx.AsyncClient,
    topic: str,
    start: int,
    end: int,
    paths: list[str] | None = None,
    starts: list[int] | None = None,
) -> tuple[int, int]:
    """Fetch raw batches from `start` until the next offset reaches `end`; (bytes, fetches).
    Appends each request's path and offset to `paths` and `starts` when given."""
    offset = start
    total = fetches = 0
    while offset < end:
        path = (
            f"/v1/topics/{topic}/partitions/0/records?offset={offset}&max_bytes={FETCH_MAX_BYTES}"
        )
        response = await client.get(path, headers={"accept": RAW})
        if response.status_code != 200:
            raise RuntimeError(f"fetch: {response.status_code} {response.text[:500]}")
        total += len(response.content)
        fetches += 1
        if paths is not None:
            paths.append(path)
        if starts is not None:
            starts.append(offset)
        offset = int(response.headers["x-next-offset"])
    return total, fetches


def _wrk_fetch(
    ctx: Context, p: dict[str, Any], server: EventlogServer, work: Path, paths: list[str]
) -> dict[str, Any]:
    """wrk cycling through the walk's fetch URLs: the server's fetch rate with a C client."""
    if which("wrk") is None:
        return {"skipped": "wrk not found: apt-get install -y wrk"}
    script = work / "fetch.lua"
    lines = ",\n".join(f'  "{path}"' for path in paths)
    script.write_text(
        f"local paths = {{\n{lines}\n}}\nlocal i = 0\n"
        'wrk.headers["Accept"] = "' + RAW + '"\n'
        'request = function()\n  i = i % #paths + 1\n  return wrk.format("GET", paths[i])\nend\n'
        + WRK_DONE_LUA
    )
    runs = []
    for n in range(max(1, p["fetch_passes"] // 3)):
        meter = CpuMeter(server.pid).start()
        out = run_wrk(script, server.url, WRK_FETCH_CONNECTIONS, p["wrk_fetch_seconds"])
        cpu = meter.stop()
        mb_s = out["bytes"] / (out["duration_us"] / 1e6) / MB
        runs.append({"mb_per_s": round(mb_s, 1), "wrk": out, **cpu})
        ctx.log(
            f"wrk fetch x {WRK_FETCH_CONNECTIONS} connections (run {n + 1}): {mb_s:,.0f} MB/s (response bytes incl. headers)"
        )
    return {
        "connections": WRK_FETCH_CONNECTIONS,
        "urls": len(paths),
        "runs": runs,
        "median_mb_per_s": round(median(r["mb_per_s"] for r in runs), 1),
    }


# -- summary ------------------------------------------------------------------------------------


def _summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    produce, fetch = results["produce"], results["fetch"]
    rows = []
    for entry in produce["by_clients"]:
        ratio = entry["ratio_to_dd"]
        rows.append(
            summary_row(
                f"raw produce, ~1 MiB batches, {entry['clients']} client(s), MB/s",
                f"{entry['median_mb_per_s']:.0f} MB/s",
                f"dd conv=fdatasync {produce['dd_median_mb_per_s']:.0f} MB/s",
                ratio,
                f">= {GOAL_PRODUCE_RATIO}",
                ratio >= GOAL_PRODUCE_RATIO,
            )
        )
    pread = fetch["median_mb_per_s"]["pread"]
    for key in ("1", "4"):
        ratio = fetch["ratio_to_pread"][key]
        goal = key == "1"
        rows.append(
            summary_row(
                f"raw fetch, 1 MiB max_bytes, {key} client(s), MB/s (warm cache)",
                f"{fetch['median_mb_per_s'][key]:,.0f} MB/s",
                f"os.pread 1 MiB chunks {pread:,.0f} MB/s",
                ratio,
                f">= {GOAL_FETCH_RATIO}" if goal else "(informational)",
                ratio >= GOAL_FETCH_RATIO if goal else None,
            )
        )
    tcp = fetch["median_mb_per_s"]["tcp"]
    rows.append(
        summary_row(
            "loopback TCP copy, 1 MiB sendall/recv_into, MB/s (the ceiling of any HTTP fetch here)",
            f"{tcp:,.0f} MB/s",
            f"os.pread 1 MiB chunks {pread:,.0f} MB/s",
            tcp / pread,
            "(informational)",
            None,
        )
    )
    wrk = fetch.get("wrk", {})
    if wrk.get("runs"):
        rows.append(
            summary_row(
                f"raw fetch from wrk, {wrk['connections']} connections, MB/s (warm cache)",
                f"{wrk['median_mb_per_s']:,.0f} MB/s",
                f"os.pread 1 MiB chunks {pread:,.0f} MB/s",
                wrk["median_mb_per_s"] / pread,
                "(informational)",
                None,
            )
        )
    return rows


# -- plot ---------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    r = report["results"]
    produce, fetch = r["produce"], r["fetch"]
    fig, axes = plt.subplots(1, 2, figsize=(16, 6.5))

    ax = axes[0]
    dd = produce["dd_median_mb_per_s"]
    entries = produce["by_clients"]
    labels = ["dd\nconv=fdatasync"] + [f"HTTP, {e['clients']} client(s)" for e in entries]
    values = [dd] + [e["median_mb_per_s"] for e in entries]
    colors = ["grey", "tab:blue", "tab:orange", "tab:green"]
    bars = ax.bar(labels, values, color=colors[: len(values)])
    dots = [[d["mb_per_s"] for d in produce["dd_runs"]]] + [
        [c["mb_per_s"] for c in e["runs"]] for e in entries
    ]
    top = max(max(d) for d in dots)
    for i, ys in enumerate(dots):
        ax.scatter([i] * len(ys), ys, color="black", s=12, zorder=3)
    for bar, e in zip(bars[1:], entries):
        ax.annotate(
            f"{e['ratio_to_dd']:.2f} x dd",
            (bar.get_x() + bar.get_width() / 2, top * 1.03),
            ha="center",
            va="bottom",
            fontsize=10,
            fontweight="bold",
        )
    ax.axhline(
        dd * GOAL_PRODUCE_RATIO,
        color="grey",
        linestyle="--",
        label=f"goal {GOAL_PRODUCE_RATIO} x dd",
    )
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("MB/s (median; dots = runs)")
    ax.set_title(
        f"raw produce: ~1 MiB batches ({produce['batch_bytes']:,} B), {produce['mib_per_run']} MiB per run, fsync per commit",
        fontsize=10,
    )
    ax.legend(loc="lower right")

    ax = axes[1]
    keys = ["pread", "tcp", "1", "4"]
    labels = [
        "os.pread\n1 MiB chunks",
        "loopback TCP\n(ceiling)",
        "HTTP GET (httpx)\n1 client",
        "HTTP GET (httpx)\n4 clients",
    ]
    values = [fetch["median_mb_per_s"][k] for k in keys]
    dots = [[x["mb_per_s"] for x in fetch["runs"][k]] for k in keys]
    wrk = fetch.get("wrk", {})
    if wrk.get("runs"):
        labels.append(f"HTTP GET (wrk)\n{wrk['connections']} connections")
        values.append(wrk["median_mb_per_s"])
        dots.append([x["mb_per_s"] for x in wrk["runs"]])
    bars = ax.bar(
        labels,
        values,
        color=["grey", "silver", "tab:blue", "tab:orange", "tab:purple"][: len(values)],
    )
    top = max(max(d) for d in dots)
    pread = fetch["median_mb_per_s"]["pread"]
    for i, ys in enumerate(dots):
        ax.scatter([i] * len(ys), ys, color="black", s=12, zorder=3)
        ax.annotate(
            f"{values[i]:,.0f} MB/s" + (f"\n{values[i] / pread:.3f} x pread" if i else ""),
            (bars[i].get_x() + bars[i].get_width() / 2, max(ys) * 1.15),
            ha="center",
            va="bottom",
            fontsize=10,
            fontweight="bold",
        )
    ax.axhline(
        pread * GOAL_FETCH_RATIO,
        color="grey",
        linestyle="--",
        label=f"goal {GOAL_FETCH_RATIO} x pread (1 client)",
    )
    ax.set_yscale("log")
    ax.set_ylim(min(min(d) for d in dots) / 3, top * 4)
    ax.set_ylabel("MB/s, log scale (median; dots = passes)")
    ax.set_title(
        f"raw fetch, warm page cache: {fetch['bytes_per_pass'] / MB:,.0f} MB in {fetch['segments']} segments, "
        f"~{fetch['batch_bytes'] / 1024:.0f} KiB batches, max_bytes 1 MiB",
        fontsize=10,
    )
    ax.legend(loc="upper right")
    fig.suptitle(f"http_raw, {report['mode']} run, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
