"""Compaction: one cleaner pass's throughput and memory, and produce latency while a pass runs.

What is measured.

1. Throughput of `workers.cleaner.clean(request)`, the whole pass the server runs in its worker
   process (build the offset map over the dirty range, recopy every closed segment into
   `.cleaned` segments with their indexes, fsync them), for 100-byte and 1 KiB values with
   1 %, 10 % and 90 % of the records live. A partition is written with the real engine
   (open_engine, a compacted topic, segment.bytes = 64 MiB, then rolled so every record is in
   a closed segment), keys `key-%012d` (16 bytes) drawn so that N records use N x live
   distinct keys, each key about 1 / live times, in shuffled order: exactly N x live records
   are the latest of their key (the pass must keep exactly those: checked). The request is
   the one the server builds (compactor.dirty_stats + build_request), with the server's
   default map budget (log.cleaner.dedupe.buffer.size = 128 MiB). Each pass runs in a fresh
   Python process that imports only workers.cleaner, so its peak RSS (ru_maxrss) is the
   pass's own; an idle process with the same imports gives the baseline. The page cache is
   warm (every segment is read once first; the data is a small fraction of RAM). MB/s counts
   the partition's log bytes cleaned per second of clean() (the input once, as Kafka's cleaner
   reports "MB of log processed"; the pass itself reads the dirty range twice: map, then
   recopy), records/s the records in them.

   Peer, same files, same run: a plain copy with the cleaner's kind of I/O: every segment read
   sequentially in 1 MiB chunks (os.readv into one buffer) and written to a new file, fsynced
   at its end. It writes every byte, more than the cleaner writes at any live fraction, so
   cleaner MB/s / copy MB/s says how far the pass is from I/O. Passes and copies alternate in
   a rotating order; medians are compared. Goal: >= 100 MB/s of 1 KiB records (the pass is
   one process: one core).

2. Produce latency while a pass runs: the real `eventlog serve` (defaults, background cleaner
   off: EVENTLOG_CLEANER_ENABLED=false, so passes run only when asked), one client on one
   keep-alive connection producing JSON (100 records of 100-byte values with keys per
   request) at a fixed rate to a compacted topic with 4 MiB segments. Latency is measured
   from each request's scheduled send time (so a stalled request also delays the ones behind
   it, as for a real producer) and, separately, from its actual send. Idle windows alternate
   with passes: `POST /v1/admin/compaction/run {"topic": "big-i"}` on a compacted topic
   filled beforehand with raw 1 KiB-record batches (10 % live keys, 32 MiB segments,
   file.delete.delay.ms = 0 so the old segments go inside the pass), run by the server in its
   worker process (a warm-up pass on a small topic first starts that process). Requests
   scheduled during a pass are the "pass" samples, the others the "idle" ones; goal: p99(pass)
   <= 1.2 x p99(idle).

3. The same produce-latency run on a fresh server with the cleaner's I/O limit
   (EVENTLOG_CLEANER_IO_MAX_BYTES_PER_SEC, Kafka's log.cleaner.io.max.bytes.per.second) set to
   a fraction of dd's write rate measured just before, and to a fraction of the I/O rate the
   unlimited passes of part 2 reached (IO_LIMITS); idle and pass windows only. Same goal.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import orjson

from .harness import MB, REPO, Context, MiB, git, median, percentiles_us, remove_tree, summary_row
from .servers import (
    EventlogServer,
    client_facts,
    commit_stats,
    create_topic,
    eventlog_counters,
    http_client,
    process_cpu_seconds,
    run_async,
    running,
)

NAME = "compaction"
TITLE = "Compaction pass MB/s and records/s vs a read+write copy; produce p99 during a pass"

RECORD_BYTES = (100, 1024)
LIVE_FRACTIONS = (0.01, 0.10, 0.90)
RECORDS_PER_BATCH = {100: 1000, 1024: 100}  # ~100 KiB batches either way
KEY_FORMAT = b"key-%012d"  # 16-byte keys
SEGMENT_BYTES = 64 * MiB
MAP_BUDGET = 128 * MiB  # the server's default log.cleaner.dedupe.buffer.size
GOAL_MB_S = 100.0  # of 1 KiB records
GOAL_P99_RATIO = 1.2
# EVENTLOG_CLEANER_IO_MAX_BYTES_PER_SEC for the limited runs: a fraction of dd's MB/s, or of the
# I/O rate of the unlimited passes (read twice + written: ~2 x the topic + the live part)
IO_LIMITS = (("dd", 0.5), ("pass", 0.5))
T0_MS = 1_700_000_000_000

# the produce-latency part
PRODUCE_RECORDS = 100
PRODUCE_VALUE_BYTES = 100
PRODUCE_KEYS = 10_000
PRODUCE_SEGMENT_BYTES = 4 * MiB
BIG_LIVE = 0.10
BIG_RECORDS_PER_BATCH = 500  # ~0.5 MiB raw batches of 1 KiB records
RAW = {"content-type": "application/vnd.kafka.record-batch.v2"}

# What runs in the fresh process: only the cleaner's imports, the pickled request on stdin,
# one JSON line out. request None = the idle baseline.
CHILD = r"""
import json, pickle, re, resource, sys, time
from dataclasses import asdict
from workers.cleaner import clean

def status():
    # VmHWM, not ru_maxrss: on Linux ru_maxrss survives exec, so a process spawned by a big
    # one (this benchmark, or the server spawning its worker) reports its parent's peak
    text = open("/proc/self/status").read()
    return {k: int(re.search(k + r":\s+(\d+) kB", text).group(1)) * 1024 for k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}

request = pickle.loads(sys.stdin.buffer.read())
out = {"rss_after_imports_bytes": status()["VmHWM"]}
if request is not None:
    u0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    outcome = clean(request)
    wall = time.perf_counter() - t0
    u1 = resource.getrusage(resource.RUSAGE_SELF)
    end = status()
    out.update(
        wall_seconds=wall,
        cpu_user_seconds=u1.ru_utime - u0.ru_utime,
        cpu_system_seconds=u1.ru_stime - u0.ru_stime,
        peak_rss_bytes=end["VmHWM"],
        rss_at_end=end,
        ru_maxrss_bytes=u1.ru_maxrss * 1024,
        outcome=asdict(outcome),
    )
print(json.dumps(out))
"""


def params(quick: bool) -> dict[str, Any]:
    return {
        "record_bytes": list(RECORD_BYTES),
        "live_fractions": list(LIVE_FRACTIONS),
        "partition_mb": {"100": 16, "1024": 48} if quick else {"100": 128, "1024": 256},
        "records_per_batch": {str(k): v for k, v in RECORDS_PER_BATCH.items()},
        "keys": "16-byte keys key-%012d; N records over round(N x live) keys, each used ~1/live times, shuffled",
        "segment_bytes": SEGMENT_BYTES,
        "map_budget_bytes": MAP_BUDGET,
        "repeats": 1 if quick else 2,
        "budget_sweep_mib": [16, 1024] if not quick else [],
        "budget_sweep_cell": {"record_bytes": 1024, "live": 0.9},
        "goal_mb_per_s_1kib": GOAL_MB_S,
        "produce": {
            "rate_per_s": 100,
            "records_per_request": PRODUCE_RECORDS,
            "value_bytes": PRODUCE_VALUE_BYTES,
            "key_space": PRODUCE_KEYS,
            "topic_config": {"cleanup.policy": "compact", "segment.bytes": PRODUCE_SEGMENT_BYTES},
            "idle_window_s": 2.0 if quick else 3.0,
            "passes": 2 if quick else 4,
            "big_topic_mb": 48 if quick else 192,
            "big_topic_config": {
                "cleanup.policy": "compact",
                # several closed segments (the active one is not cleaned)
                "segment.bytes": (8 if quick else 32) * MiB,
                "file.delete.delay.ms": 0,
            },
            "big_live_fraction": BIG_LIVE,
            "big_records_per_batch": BIG_RECORDS_PER_BATCH,
            "server_env": {
                "EVENTLOG_CLEANER_ENABLED": "false",
                "EVENTLOG_CLEANER_DEDUPE_BUFFER_SIZE": str(MAP_BUDGET),
            },
            # the same run again on a server with EVENTLOG_CLEANER_IO_MAX_BYTES_PER_SEC set to
            # a fraction of dd's write rate (measured just before), and to a fraction of the I/O
            # rate the unlimited passes reached (idle and pass windows only)
            "io_limits": [{"of": of, "fraction": f} for of, f in IO_LIMITS],
            "dd_mib": 128 if quick else 256,
            "dd_repeats": 3,
        },
        "goal_p99_ratio": GOAL_P99_RATIO,
    }


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    work = ctx.scratch(NAME)
    try:
        baseline = _child(ctx, None)["rss_after_imports_bytes"]
        ctx.log(f"idle python importing workers.cleaner: VmHWM {baseline / MiB:.1f} MiB")
        cells = [
            _cell(ctx, work, p, record_bytes, live)
            for record_bytes in RECORD_BYTES
            for live in LIVE_FRACTIONS
        ]
        sweep = _budget_sweep(ctx, work, p)
        produce = _produce_latency(ctx, work / "server", p)
        limited = _produce_limited(ctx, work, p, produce)
    finally:
        remove_tree(work)
    results = {
        "idle_rss_bytes": baseline,
        "cells": cells,
        "budget_sweep": sweep,
        "produce": produce,
        "produce_io_limited": limited,
        "goal_mb_per_s_1kib": GOAL_MB_S,
        "goal_p99_ratio": GOAL_P99_RATIO,
    }
    p["clients_facts"] = client_facts()
    # the pass is workers/ code: which one was measured (the engine's state is in "engine")
    workers_dirty = git("status", "--porcelain", "--", "workers")
    p["workers_source"] = {
        "head_commit": git("rev-parse", "HEAD"),
        "workers_dirty": bool(workers_dirty) if workers_dirty is not None else None,
    }
    return {"params": p, "results": results, "summary": _summary(results)}


# -- data -----------------------------------------------------------------------------------------


def _key_ids(records: int, live: float, seed: int) -> tuple[np.ndarray, int]:
    """Key number of each record: `records` records over round(records x live) keys, each key
    used about 1/live times, in shuffled order."""
    keys = max(1, round(records * live))
    ids = np.arange(records, dtype=np.int64) % keys
    np.random.default_rng(seed).shuffle(ids)
    return ids, keys


def _encode(record_bytes: int, ids: np.ndarray, per_batch: int, seed: int) -> list[bytearray]:
    """Uncompressed batches of `per_batch` records (key = KEY_FORMAT % id, `record_bytes` of
    incompressible value, record i at T0 + i ms)."""
    from engine.records import encode_batch

    pool = random.Random(seed).randbytes(record_bytes + 4096)
    id_list = ids.tolist()
    batches = []
    for start in range(0, len(id_list), per_batch):
        records = []
        for i in range(start, min(len(id_list), start + per_batch)):
            at = (i * 61) % 4096
            records.append((KEY_FORMAT % id_list[i], pool[at : at + record_bytes], T0_MS + i, ()))
        batches.append(encode_batch(0, records))
    return batches


def _record_count(record_bytes: int, total_bytes: int, per_batch: int) -> int:
    from engine.records import encode_batch

    one = encode_batch(0, [(KEY_FORMAT % 0, bytes(record_bytes), T0_MS, ())] * per_batch)
    return max(per_batch, total_bytes * per_batch // len(one))


async def _write_partition(data_dir: Path, batches: list[bytearray], map_budget: int) -> Any:
    """Append `batches` to a fresh compacted one-partition topic, roll, and return the clean
    request the server would build for it (the log is closed on return: files are static)."""
    from engine.log_manager import EngineConfig, open_engine
    from engine.partition_log import prepare_batches
    from workers.compactor import build_request, dirty_stats

    async with open_engine(EngineConfig(log_dirs=(data_dir,))) as engine:
        await engine.create_topic(
            "c", 1, {"cleanup.policy": "compact", "segment.bytes": SEGMENT_BYTES}
        )
        log = engine.partition("c", 0)
        for batch in batches:
            await log.append(prepare_batches(batch, log.config, check_records=False))
        await log.roll()
        view = log.view
        now = log.clock()
        stats = await anyio.to_thread.run_sync(dirty_stats, view, log.config, None, now)
        return build_request(log, view, stats, now, map_budget)


def _segment_paths(request: Any) -> list[Path]:
    from engine import filenames

    return [filenames.log_file(Path(request.directory), s.base_offset) for s in request.segments]


def _remove_cleaned(request: Any) -> None:
    from engine import filenames

    for path in Path(request.directory).iterdir():
        if path.name.endswith(filenames.CLEANED_SUFFIX):
            path.unlink()


# -- the pass in a fresh process ----------------------------------------------------------------


def _child(ctx: Context, request: Any) -> dict[str, Any]:
    env = dict(os.environ)
    path = [str(REPO)]
    if ctx.engine_source.get("extracted_to"):  # --engine-ref: that engine/ first
        path.insert(0, ctx.engine_source["extracted_to"])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*path, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=pickle.dumps(request),
        capture_output=True,
        cwd=REPO,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"clean() in a child process failed:\n{done.stderr.decode()[-3000:]}")
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _copy_peer(paths: list[Path], out_dir: Path) -> dict[str, Any]:
    """Read each segment in 1 MiB chunks into one buffer and write it to a new file, fsynced."""
    out_dir.mkdir(parents=True, exist_ok=True)
    buffer = bytearray(MiB)
    view = memoryview(buffer)
    total = 0
    begin = time.perf_counter()
    for path in paths:
        src = os.open(path, os.O_RDONLY)
        dst = os.open(out_dir / path.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while n := os.readv(src, [buffer]):
                os.write(dst, view[:n])
                total += n
            os.fsync(dst)
        finally:
            os.close(src)
            os.close(dst)
    elapsed = time.perf_counter() - begin
    remove_tree(out_dir)
    return {
        "bytes": total,
        "seconds": round(elapsed, 4),
        "mb_per_s": round(total / elapsed / MB, 1),
    }


def _timed_pass(ctx: Context, request: Any) -> dict[str, Any]:
    out = _child(ctx, request)
    _remove_cleaned(request)  # the next pass starts from the same files
    o = out["outcome"]
    wall = out["wall_seconds"]
    log_bytes = sum(s.size for s in request.segments)
    return {
        "seconds": round(wall, 4),
        "log_bytes": log_bytes,
        "mb_per_s": round(log_bytes / wall / MB, 2),
        "records_per_s": round(o["records_read"] / wall, 1),
        "cpu_seconds": round(out["cpu_user_seconds"] + out["cpu_system_seconds"], 3),
        "cpu_system_seconds": round(out["cpu_system_seconds"], 3),
        "cpu_share": round((out["cpu_user_seconds"] + out["cpu_system_seconds"]) / wall, 3),
        "map_seconds": round(o["map_seconds"], 4),
        "peak_rss_bytes": out["peak_rss_bytes"],  # VmHWM of the child
        "rss_after_imports_bytes": out["rss_after_imports_bytes"],
        "rss_at_end": out["rss_at_end"],
        # what the cleaner's own outcome.peak_rss_bytes reports (ru_maxrss: inherited, see CHILD)
        "ru_maxrss_bytes": out["ru_maxrss_bytes"],
        "outcome": {k: v for k, v in o.items() if k != "groups"} | {"groups": len(o["groups"])},
    }


def _cell(
    ctx: Context, work: Path, p: dict[str, Any], record_bytes: int, live: float
) -> dict[str, Any]:
    per_batch = RECORDS_PER_BATCH[record_bytes]
    total = p["partition_mb"][str(record_bytes)] * MB
    records = _record_count(record_bytes, total, per_batch)
    seed = record_bytes * 1000 + round(live * 100)
    ids, keys = _key_ids(records, live, seed)
    t0 = time.perf_counter()
    batches = _encode(record_bytes, ids, per_batch, seed)
    encode_s = time.perf_counter() - t0
    data_dir = work / f"cell-{record_bytes}-{live}"
    t0 = time.perf_counter()
    request = anyio.run(_write_partition, data_dir, batches, MAP_BUDGET)
    write_s = time.perf_counter() - t0
    del batches
    paths = _segment_paths(request)
    from .harness import pread_files

    pread_files(paths)  # warm: the first read of a page just written is slow on this kernel
    log_bytes = sum(s.size for s in request.segments)
    ctx.log(
        f"{record_bytes:>4} B, {live:.0%} live: {records:,} records over {keys:,} keys, "
        f"{log_bytes / MB:.0f} MB in {len(request.segments)} segments (encoded {encode_s:.1f} s, written {write_s:.1f} s)"
    )
    passes, copies = [], []
    for repeat in range(p["repeats"]):
        order = ("pass", "copy") if repeat % 2 == 0 else ("copy", "pass")
        for what in order:
            if what == "copy":
                copies.append(_copy_peer(paths, work / "copy"))
                continue
            run = _timed_pass(ctx, request)
            kept = run["outcome"]["records_kept"]
            if kept != keys or run["outcome"]["records_read"] != records:
                raise RuntimeError(
                    f"pass kept {kept} of {run['outcome']['records_read']} records; expected {keys} of {records}"
                )
            passes.append(run)
    remove_tree(data_dir)
    mb_s = median(r["mb_per_s"] for r in passes)
    rec_s = median(r["records_per_s"] for r in passes)
    copy_mb_s = median(c["mb_per_s"] for c in copies)
    peak = max(r["peak_rss_bytes"] for r in passes)
    last = passes[-1]
    ctx.log(
        f"  clean(): {mb_s:.1f} MB/s, {rec_s:,.0f} records/s (map {last['map_seconds']:.2f} of {last['seconds']:.2f} s, "
        f"CPU {last['cpu_share']:.0%}); copy {copy_mb_s:.0f} MB/s -> {mb_s / copy_mb_s:.3f} x; "
        f"peak RSS {peak / MiB:.0f} MiB, wrote {last['outcome']['bytes_written'] / MB:.1f} MB"
    )
    return {
        "record_bytes": record_bytes,
        "live_fraction": live,
        "records": records,
        "keys": keys,
        "records_per_batch": per_batch,
        "log_bytes": log_bytes,
        "segments": len(request.segments),
        "encode_seconds": round(encode_s, 2),
        "write_seconds": round(write_s, 2),
        "median_mb_per_s": round(mb_s, 2),
        "median_records_per_s": round(rec_s, 1),
        "copy_median_mb_per_s": round(copy_mb_s, 1),
        "ratio_to_copy": round(mb_s / copy_mb_s, 4),
        "peak_rss_bytes": peak,
        "map_budget_bytes": MAP_BUDGET,
        "passes": passes,
        "copies": copies,
    }


def _budget_sweep(ctx: Context, work: Path, p: dict[str, Any]) -> list[dict[str, Any]]:
    """One cell again with other map budgets: does the pass's memory follow the budget?"""
    budgets = p["budget_sweep_mib"]
    if not budgets:
        return []
    cell = p["budget_sweep_cell"]
    record_bytes, live = cell["record_bytes"], cell["live"]
    per_batch = RECORDS_PER_BATCH[record_bytes]
    records = _record_count(record_bytes, p["partition_mb"][str(record_bytes)] * MB, per_batch)
    seed = record_bytes * 1000 + round(live * 100)
    ids, keys = _key_ids(records, live, seed)
    batches = _encode(record_bytes, ids, per_batch, seed)
    data_dir = work / "sweep"
    request = anyio.run(_write_partition, data_dir, batches, MAP_BUDGET)
    del batches
    from dataclasses import replace

    from .harness import pread_files

    pread_files(_segment_paths(request))
    out = []
    for mib in budgets:
        run = _timed_pass(ctx, replace(request, map_budget_bytes=mib * MiB))
        run.update(
            map_budget_bytes=mib * MiB, record_bytes=record_bytes, live_fraction=live, keys=keys
        )
        out.append(run)
        ctx.log(
            f"  budget {mib} MiB ({record_bytes} B, {live:.0%} live, {keys:,} keys): peak RSS "
            f"{run['peak_rss_bytes'] / MiB:.0f} MiB, {run['mb_per_s']:.1f} MB/s, map full: {run['outcome']['map_full']}"
        )
    remove_tree(data_dir)
    return out


# -- produce latency during a pass ----------------------------------------------------------------


class _Poster:
    """A minimal HTTP/1.1 keep-alive POST client on one asyncio stream (httpx would spend ~0.5 ms
    of CPU per request in this process, on a machine whose two cores the server and the pass
    already share)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._reader: Any = None
        self._writer: Any = None

    async def connect(self) -> _Poster:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self._writer.write(head.encode() + body)
        response = await self._reader.readuntil(b"\r\n\r\n")
        status = int(response[9:12])
        length = 0
        for line in response.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
                break
        return status, await self._reader.readexactly(length)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _produce_bodies() -> list[bytes]:
    """Request bodies cycling over PRODUCE_KEYS keys, 100 records each, 100-byte ASCII values."""
    rng = random.Random(100)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    bodies = []
    for first in range(0, PRODUCE_KEYS, PRODUCE_RECORDS):
        records = [
            {"key": f"user-{k:06d}", "value": "".join(rng.choices(alphabet, k=PRODUCE_VALUE_BYTES))}
            for k in range(first, first + PRODUCE_RECORDS)
        ]
        bodies.append(orjson.dumps({"records": records}))
    return bodies


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out.extend(int(x) for x in task.read_text().split())
        except OSError:
            pass
    return out


def _produce_latency(
    ctx: Context, directory: Path, p: dict[str, Any], io_limit_bytes_per_s: float | None = None
) -> dict[str, Any]:
    """The produce-latency run on a fresh server; with an I/O limit, the cleaner is throttled
    and the busy-loop windows are left out (they do not depend on the limit)."""
    q = p["produce"]
    server = EventlogServer(ctx, directory)
    assert server.env is not None
    server.env.update(q["server_env"])
    limit = ""
    if io_limit_bytes_per_s is not None:
        server.env["EVENTLOG_CLEANER_IO_MAX_BYTES_PER_SEC"] = str(round(io_limit_bytes_per_s))
        limit = f", EVENTLOG_CLEANER_IO_MAX_BYTES_PER_SEC={round(io_limit_bytes_per_s)}"
    with running(server):
        ctx.log(f"eventlog :{server.port} (cleaner loop off, map budget {MAP_BUDGET // MiB} MiB{limit})")
        result = run_async(_produce_run, ctx, server, q, io_limit_bytes_per_s is None)
    if server.exit_status != 0:
        raise RuntimeError(f"eventlog exited with {server.exit_status}")
    result["server"] = server.facts()
    return result


def _pass_io_rate(produce: dict[str, Any]) -> float:
    """Bytes/s of I/O the unlimited passes did, as the throttler counts it: the map and the
    recopy each read the topic's closed segments, the recopy writes the live part (an estimate
    from the replies: topic bytes x 2 + topic bytes - bytes reclaimed, over the pass's seconds;
    somewhat high, as the topic's active segment, which a pass does not read, is counted)."""
    rates = []
    for w in produce["windows"]:
        if w["kind"] != "pass" or not w["reply"]["partitions"]:
            continue
        part = w["reply"]["partitions"][0]
        topic = produce["big_topic_bytes"]
        rates.append((3 * topic - part["bytes_reclaimed"]) / part["seconds"])
    return median(rates)


def _produce_limited(ctx: Context, work: Path, p: dict[str, Any], produce: dict[str, Any]) -> list[dict[str, Any]]:
    """dd's write rate in the scratch dir (median of a few runs), then the produce-latency run
    once per limit: EVENTLOG_CLEANER_IO_MAX_BYTES_PER_SEC = fraction x dd's rate, or fraction x
    the I/O rate of the unlimited passes."""
    from .harness import dd_write

    q = p["produce"]
    dd = [dd_write(work, q["dd_mib"]) for _ in range(q["dd_repeats"])]
    dd_mb_s = median(d["mb_per_s"] for d in dd)
    pass_rate = _pass_io_rate(produce)
    ctx.log(
        f"dd conv=fdatasync in the scratch dir: {dd_mb_s:.0f} MB/s (median of {len(dd)}); "
        f"the unlimited passes did ~{pass_rate / MB:.0f} MB/s of I/O"
    )
    out = []
    for item in q["io_limits"]:
        of, fraction = item["of"], item["fraction"]
        limit = fraction * (dd_mb_s * MB if of == "dd" else pass_rate)
        label = f"{fraction} x {'dd' if of == 'dd' else 'the unlimited pass'}"
        result = _produce_latency(ctx, work / f"server-limit-{of}-{fraction}", p, limit)
        passes = [w for w in result["windows"] if w["kind"] == "pass"]
        throttled = [w["reply"]["partitions"][0].get("throttled_seconds", 0.0) for w in passes if w["reply"]["partitions"]]
        result.update(
            io_limit_of=of,
            io_limit_fraction=fraction,
            io_limit_label=label,
            io_limit_bytes_per_s=round(limit),
            dd_mb_per_s=dd_mb_s,
            dd_runs=dd,
            unlimited_pass_io_bytes_per_s=round(pass_rate),
            pass_seconds=[w["seconds"] for w in passes],
            throttled_seconds=throttled,
        )
        ctx.log(
            f"  with the limit at {label} ({limit / MB:.0f} MB/s): passes of "
            f"{', '.join(f'{x:.2f}' for x in result['pass_seconds'])} s, throttled "
            f"{', '.join(f'{x:.2f}' for x in throttled)} s"
        )
        out.append(result)
    return out


async def _produce_run(
    ctx: Context, server: EventlogServer, q: dict[str, Any], with_cpu_hog: bool = True
) -> dict[str, Any]:
    passes = q["passes"]
    async with http_client(server.url, 4) as client:
        # the big compacted topics, one per pass, filled with the same raw batches
        records = _record_count(1024, q["big_topic_mb"] * MB, BIG_RECORDS_PER_BATCH)
        ids, keys = _key_ids(records, BIG_LIVE, 4242)
        batches = [bytes(b) for b in _encode(1024, ids, BIG_RECORDS_PER_BATCH, 4242)]
        fill_begin = time.perf_counter()
        for i in range(passes):
            await create_topic(client, f"big-{i}", 1, q["big_topic_config"])

            async def send(chunk: list[bytes], topic: str = f"big-{i}") -> None:
                for body in chunk:
                    r = await client.post(
                        f"/v1/topics/{topic}/partitions/0/records", content=body, headers=RAW
                    )
                    if r.status_code != 200:
                        raise RuntimeError(f"raw produce to {topic}: {r.status_code} {r.text}")

            async with anyio.create_task_group() as tg:
                for c in range(4):
                    tg.start_soon(send, batches[c::4])
        fill_s = time.perf_counter() - fill_begin
        big_topic_bytes = sum(map(len, batches))
        ctx.log(
            f"filled {passes} compacted topics with {records:,} records of 1 KiB over {keys:,} keys "
            f"({sum(map(len, batches)) * passes / MB:.0f} MB, {fill_s:.1f} s)"
        )
        del batches
        # warm-up: a pass on a small topic starts the server's worker process
        await create_topic(client, "warm", 1, {"cleanup.policy": "compact", "segment.bytes": 65536})
        warm_body = _produce_bodies()[0]
        for _ in range(20):
            r = await client.post(
                "/v1/topics/warm/records",
                content=warm_body,
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 200, r.text
        t0 = time.perf_counter()
        r = await client.post("/v1/admin/compaction/run", json={"topic": "warm"})
        warm = {
            "status": r.status_code,
            "seconds": round(time.perf_counter() - t0, 3),
            "reply": r.json(),
        }
        ctx.log(f"warm-up pass (starts the worker process): {warm['seconds']:.2f} s")
        await create_topic(client, "produce", 1, q["topic_config"])

        bodies = _produce_bodies()
        poster = await _Poster("127.0.0.1", server.port).connect()
        interval = 1.0 / q["rate_per_s"]
        samples: list[tuple[float, float, float, int]] = []  # (scheduled, sent, done, status)
        stop = anyio.Event()
        reanchor = False

        async def producer() -> None:
            nonlocal reanchor
            scheduled = time.perf_counter()
            n = 0
            while not stop.is_set():
                if reanchor:  # measuring starts: drop any backlog of the warm-up second
                    scheduled, reanchor = max(scheduled, time.perf_counter()), False
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await anyio.sleep(delay)
                sent = time.perf_counter()
                status, _ = await poster.post("/v1/topics/produce/records", bodies[n % len(bodies)])
                samples.append((scheduled, sent, time.perf_counter(), status))
                n += 1
                scheduled += interval

        windows: list[dict[str, Any]] = []
        worker_pids: list[int] = []
        idle_s = q["idle_window_s"]
        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await anyio.sleep(1.0)  # warm-up of the load, not counted
            reanchor = True
            begin = time.perf_counter()

            async def idle() -> None:
                counters = await eventlog_counters(client)
                start = time.perf_counter()
                cpu0 = process_cpu_seconds(server.pid)
                await anyio.sleep(idle_s)
                windows.append(
                    {
                        "kind": "idle",
                        "start": start,
                        "end": time.perf_counter(),
                        "server_cpu_s": round(process_cpu_seconds(server.pid) - cpu0, 3),
                        "group_commits": commit_stats(counters, await eventlog_counters(client)),
                    }
                )

            for i in range(passes):
                await idle()
                worker_pids = worker_pids or _children(server.pid)
                wcpu0 = {w: process_cpu_seconds(w) for w in worker_pids}
                counters = await eventlog_counters(client)
                cpu0 = process_cpu_seconds(server.pid)
                start = time.perf_counter()
                r = await client.post("/v1/admin/compaction/run", json={"topic": f"big-{i}"})
                end = time.perf_counter()
                commits = commit_stats(counters, await eventlog_counters(client))
                if r.status_code != 200:
                    raise RuntimeError(f"compaction run: {r.status_code} {r.text}")
                reply = r.json()
                part = reply["partitions"][0] if reply["partitions"] else {}
                windows.append(
                    {
                        "kind": "pass",
                        "start": start,
                        "end": end,
                        "topic": f"big-{i}",
                        "server_cpu_s": round(process_cpu_seconds(server.pid) - cpu0, 3),
                        "worker_cpu_s": round(
                            sum(process_cpu_seconds(w) - c for w, c in wcpu0.items()), 3
                        ),
                        "group_commits": commits,
                        "reply": reply,
                    }
                )
                ctx.log(
                    f"pass on big-{i}: {end - start:.2f} s ({part.get('records_read', 0):,} records read, "
                    f"{part.get('records_kept', 0):,} kept, {reply['bytes_reclaimed'] / MB:.0f} MB reclaimed); "
                    f"produce fdatasync {commits['mean_fsync_ms']} ms vs {windows[-2]['group_commits']['mean_fsync_ms']} ms "
                    f"in the idle window before"
                )
                # the peer: any one-core job for as long as the pass took (a Python busy loop)
                pass_seconds = end - start
                if not with_cpu_hog:
                    continue
                await idle()
                counters = await eventlog_counters(client)
                cpu0 = process_cpu_seconds(server.pid)
                start = time.perf_counter()
                await anyio.run_process(
                    [
                        sys.executable,
                        "-c",
                        f"import time\nend = time.perf_counter() + {pass_seconds:.3f}\nwhile time.perf_counter() < end: pass",
                    ]
                )
                windows.append(
                    {
                        "kind": "cpu_hog",
                        "start": start,
                        "end": time.perf_counter(),
                        "server_cpu_s": round(process_cpu_seconds(server.pid) - cpu0, 3),
                        "group_commits": commit_stats(counters, await eventlog_counters(client)),
                    }
                )
            await idle()
            stop.set()
        await poster.close()

    bad = [s for s in samples if s[3] != 200]
    if bad:
        raise RuntimeError(f"{len(bad)} produce requests failed (status {bad[0][3]})")
    by_kind: dict[str, list[tuple[float, float, float, int]]] = {
        "idle": [],
        "pass": [],
        "cpu_hog": [],
    }
    per_window = []
    for w in windows:
        inside = [s for s in samples if w["start"] <= s[0] < w["end"]]
        by_kind[w["kind"]].extend(inside)
        seconds = w["end"] - w["start"]
        w_out = {k: v for k, v in w.items() if k not in ("start", "end")}
        w_out.update(
            start_s=round(w["start"] - begin, 3),
            seconds=round(seconds, 3),
            requests=len(inside),
            server_cpu_share=round(w["server_cpu_s"] / seconds, 3),
            round_trip_us=percentiles_us([round((s[2] - s[1]) * 1e9) for s in inside])
            if inside
            else None,
            from_schedule_us=percentiles_us([round((s[2] - s[0]) * 1e9) for s in inside])
            if inside
            else None,
        )
        per_window.append(w_out)
    out: dict[str, Any] = {
        "warm_up_pass": warm,
        "worker_pids": worker_pids,
        "windows": per_window,
        "rate_per_s": q["rate_per_s"],
        "fill_seconds": round(fill_s, 2),
        "big_topic_records": records,
        "big_topic_keys": keys,
        "big_topic_bytes": big_topic_bytes,
    }
    for kind, inside in by_kind.items():
        if not inside:
            continue
        out[kind] = {
            "requests": len(inside),
            "round_trip_us": percentiles_us([round((s[2] - s[1]) * 1e9) for s in inside]),
            "from_schedule_us": percentiles_us([round((s[2] - s[0]) * 1e9) for s in inside]),
        }
        fsyncs = [w["group_commits"] for w in windows if w["kind"] == kind]
        count = sum(f["fsyncs"] for f in fsyncs)
        out[kind]["mean_fsync_ms"] = (
            round(sum(f["fsyncs"] * (f["mean_fsync_ms"] or 0) for f in fsyncs) / count, 3)
            if count
            else None
        )
    for key in ("round_trip_us", "from_schedule_us"):
        for q_ in ("p50", "p99"):
            out[f"{key[:-3]}_{q_}_ratio"] = round(
                out["pass"][key][f"{q_}_us"] / out["idle"][key][f"{q_}_us"], 3
            )
    out["p99_ratio"] = out["round_trip_p99_ratio"]  # the goal's figure
    if "cpu_hog" in out:
        out["cpu_hog_round_trip_p99_ratio"] = round(
            out["cpu_hog"]["round_trip_us"]["p99_us"] / out["idle"]["round_trip_us"]["p99_us"], 3
        )
    # every request: ms since the first window, round trip us, us from its scheduled send
    out["samples"] = [
        [round((s[0] - begin) * 1000, 1), round((s[2] - s[1]) * 1e6), round((s[2] - s[0]) * 1e6)]
        for s in samples
        if s[0] >= begin and s[0] < windows[-1]["end"]
    ]
    pas, idl = out["pass"], out["idle"]
    ctx.log(
        f"produce round trip p99 {pas['round_trip_us']['p99_us'] / 1000:.2f} ms during passes vs "
        f"{idl['round_trip_us']['p99_us'] / 1000:.2f} ms idle -> {out['p99_ratio']:.2f} x "
        f"(p50 {pas['round_trip_us']['p50_us'] / 1000:.2f} vs {idl['round_trip_us']['p50_us'] / 1000:.2f} ms; "
        f"from the schedule p99 {pas['from_schedule_us']['p99_us'] / 1000:.1f} vs "
        f"{idl['from_schedule_us']['p99_us'] / 1000:.1f} ms; fdatasync {pas['mean_fsync_ms']} vs {idl['mean_fsync_ms']} ms)"
        + (
            f"; with a busy loop instead of the pass: p99 {out['cpu_hog']['round_trip_us']['p99_us'] / 1000:.2f} ms "
            f"({out['cpu_hog_round_trip_p99_ratio']:.2f} x), fdatasync {out['cpu_hog']['mean_fsync_ms']} ms"
            if "cpu_hog" in out
            else ""
        )
    )
    return out


# -- summary --------------------------------------------------------------------------------------


def _label(record_bytes: int) -> str:
    return "1 KiB" if record_bytes == 1024 else f"{record_bytes} B"


def _summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for cell in results["cells"]:
        mb_s = cell["median_mb_per_s"]
        measured = f"{mb_s:.1f} MB/s ({cell['median_records_per_s']:,.0f} records/s)"
        copy = f"read+write copy, fsync: {cell['copy_median_mb_per_s']:,.0f} MB/s"
        metric = (
            f"compaction pass, {_label(cell['record_bytes'])} records, {cell['live_fraction']:.0%} live, "
            f"MB/s of log (records/s)"
        )
        if cell["record_bytes"] == 1024:
            rows.append(
                summary_row(
                    metric,
                    measured,
                    f"goal {GOAL_MB_S:.0f} MB/s; {copy} ({cell['ratio_to_copy']:.3f} x)",
                    mb_s / GOAL_MB_S,
                    f"MB/s / {GOAL_MB_S:.0f} >= 1",
                    mb_s >= GOAL_MB_S,
                )
            )
        else:
            rows.append(
                summary_row(metric, measured, copy, cell["ratio_to_copy"], "(informational)", None)
            )
    idle = results["idle_rss_bytes"]
    top = max(results["cells"], key=lambda c: c["peak_rss_bytes"])
    rows.append(
        summary_row(
            f"peak RSS of a pass (largest: {_label(top['record_bytes'])}, {top['live_fraction']:.0%} live, "
            f"{top['keys']:,} keys); ratio = (peak - idle) / budget",
            f"{top['peak_rss_bytes'] / MiB:.0f} MiB",
            f"map budget {top['map_budget_bytes'] / MiB:.0f} MiB; idle python with the same imports {idle / MiB:.0f} MiB",
            (top["peak_rss_bytes"] - idle) / top["map_budget_bytes"],
            "(informational)",
            None,
        )
    )
    for sweep in results.get("budget_sweep", []):
        rows.append(
            summary_row(
                f"peak RSS of a pass with a {sweep['map_budget_bytes'] / MiB:.0f} MiB map budget "
                f"({_label(sweep['record_bytes'])}, {sweep['live_fraction']:.0%} live, {sweep['keys']:,} keys)",
                f"{sweep['peak_rss_bytes'] / MiB:.0f} MiB ({sweep['mb_per_s']:.1f} MB/s)",
                f"map budget {sweep['map_budget_bytes'] / MiB:.0f} MiB; idle python {idle / MiB:.0f} MiB",
                (sweep["peak_rss_bytes"] - idle) / sweep["map_budget_bytes"],
                "(informational)",
                None,
            )
        )
    prod = results["produce"]
    pas, idl = prod["pass"], prod["idle"]
    rate = f"{PRODUCE_RECORDS} records/request at {prod.get('rate_per_s', 100)}/s"
    rows.append(
        summary_row(
            f"JSON produce round trip p99 (p50) during compaction passes, {rate}, {pas['requests']} requests",
            f"{pas['round_trip_us']['p99_us'] / 1000:.2f} ms ({pas['round_trip_us']['p50_us'] / 1000:.2f} ms)",
            f"idle windows {idl['round_trip_us']['p99_us'] / 1000:.2f} ms ({idl['round_trip_us']['p50_us'] / 1000:.2f} ms), "
            f"{idl['requests']} requests; fdatasync {pas['mean_fsync_ms']} vs {idl['mean_fsync_ms']} ms",
            prod["p99_ratio"],
            f"<= {GOAL_P99_RATIO}",
            prod["p99_ratio"] <= GOAL_P99_RATIO,
        )
    )
    for lim in results.get("produce_io_limited", []):
        lpas, lidl = lim["pass"], lim["idle"]
        rows.append(
            summary_row(
                f"JSON produce round trip p99 (p50) during passes with EVENTLOG_CLEANER_IO_MAX_BYTES_PER_SEC = "
                f"{lim['io_limit_label']} ({lim['io_limit_bytes_per_s'] / MB:.0f} MB/s), {rate}, "
                f"{lpas['requests']} requests",
                f"{lpas['round_trip_us']['p99_us'] / 1000:.2f} ms ({lpas['round_trip_us']['p50_us'] / 1000:.2f} ms)",
                f"idle windows {lidl['round_trip_us']['p99_us'] / 1000:.2f} ms ({lidl['round_trip_us']['p50_us'] / 1000:.2f} ms); "
                f"passes {median(lim['pass_seconds']):.2f} s (median), {median(lim['throttled_seconds']):.2f} s of it throttled; "
                f"fdatasync {lpas['mean_fsync_ms']} vs {lidl['mean_fsync_ms']} ms",
                lim["p99_ratio"],
                f"<= {GOAL_P99_RATIO}",
                lim["p99_ratio"] <= GOAL_P99_RATIO,
            )
        )
    hog = prod["cpu_hog"]
    rows.append(
        summary_row(
            "JSON produce round trip p99 (p50) while a Python busy loop runs as long as a pass (the peer: any one-core job)",
            f"{hog['round_trip_us']['p99_us'] / 1000:.2f} ms ({hog['round_trip_us']['p50_us'] / 1000:.2f} ms)",
            f"idle windows {idl['round_trip_us']['p99_us'] / 1000:.2f} ms; fdatasync {hog['mean_fsync_ms']} vs {idl['mean_fsync_ms']} ms",
            prod["cpu_hog_round_trip_p99_ratio"],
            "(informational)",
            None,
        )
    )
    rows.append(
        summary_row(
            "JSON produce latency from the scheduled send p99 (p50) during passes (queueing included)",
            f"{pas['from_schedule_us']['p99_us'] / 1000:.1f} ms ({pas['from_schedule_us']['p50_us'] / 1000:.1f} ms)",
            f"idle windows {idl['from_schedule_us']['p99_us'] / 1000:.1f} ms ({idl['from_schedule_us']['p50_us'] / 1000:.1f} ms)",
            prod["from_schedule_p99_ratio"],
            "(informational)",
            None,
        )
    )
    return rows


# -- plot -----------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    r = report["results"]
    cells = r["cells"]
    limited = r.get("produce_io_limited", [])
    fig, axes = plt.subplots(3 if limited else 2, 2, figsize=(16, 16.5 if limited else 11))
    width = 0.38
    labels = [f"{_label(c['record_bytes'])}\n{c['live_fraction']:.0%} live" for c in cells]
    xs = list(range(len(cells)))

    ax = axes[0][0]
    ax.bar(
        [x - width / 2 for x in xs],
        [c["median_mb_per_s"] for c in cells],
        width,
        color="tab:blue",
        label="clean() pass",
    )
    ax.bar(
        [x + width / 2 for x in xs],
        [c["copy_median_mb_per_s"] for c in cells],
        width,
        color="tab:gray",
        alpha=0.6,
        label="read+write copy, fsync",
    )
    for x, c in zip(xs, cells):
        ax.scatter(
            [x - width / 2] * len(c["passes"]),
            [p["mb_per_s"] for p in c["passes"]],
            color="black",
            s=10,
            zorder=3,
        )
        ax.scatter(
            [x + width / 2] * len(c["copies"]),
            [p["mb_per_s"] for p in c["copies"]],
            color="black",
            s=10,
            zorder=3,
        )
        ax.annotate(
            f"{c['median_mb_per_s']:.0f}\n{c['ratio_to_copy']:.2f} x",
            (x - width / 2, c["median_mb_per_s"]),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.axhline(
        r["goal_mb_per_s_1kib"],
        color="red",
        linestyle="--",
        label=f"goal {r['goal_mb_per_s_1kib']:.0f} MB/s (1 KiB records)",
    )
    ax.set_yscale("log")
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel("MB/s of log cleaned (median; dots = runs)")
    ax.set_title("one compaction pass (map + recopy + fsync), warm page cache")
    ax.legend(fontsize=8, loc="center left")
    ax.grid(True, axis="y", which="both", alpha=0.3)

    ax = axes[0][1]
    bars = ax.bar(xs, [c["median_records_per_s"] for c in cells], 0.6, color="tab:blue")
    for bar, c in zip(bars, cells):
        last = c["passes"][-1]
        share = last["map_seconds"] / last["seconds"]
        ax.annotate(
            f"{c['median_records_per_s'] / 1000:,.0f}k/s\nmap {share:.0%}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel("records/s (median)")
    ax.set_title("records/s; label: share of the pass spent building the offset map")
    ax.grid(True, axis="y", alpha=0.3)

    ax = axes[1][0]
    runs = [
        (
            f"{lab}\n{c['map_budget_bytes'] / MiB:.0f} MiB",
            c["peak_rss_bytes"],
            c["map_budget_bytes"],
        )
        for lab, c in zip(labels, cells)
    ]
    for s in r.get("budget_sweep", []):
        runs.append(
            (
                f"{_label(s['record_bytes'])}\n{s['live_fraction']:.0%} live\n{s['map_budget_bytes'] / MiB:.0f} MiB",
                s["peak_rss_bytes"],
                s["map_budget_bytes"],
            )
        )
    rx = list(range(len(runs)))
    idle_mib = r["idle_rss_bytes"] / MiB
    ax.bar(
        rx,
        [x[1] / MiB for x in runs],
        0.6,
        color="tab:purple",
        label="peak RSS of the pass process (VmHWM)",
    )
    ax.scatter(
        rx,
        [idle_mib + x[2] / MiB for x in runs],
        marker="_",
        s=600,
        color="red",
        zorder=3,
        label="idle python + map budget",
    )
    for x_, run_ in zip(rx, runs):
        ax.annotate(
            f"{run_[1] / MiB:.0f}", (x_, run_[1] / MiB), ha="center", va="bottom", fontsize=8
        )
    ax.axhline(
        r["idle_rss_bytes"] / MiB, color="black", linestyle=":", label="idle python, same imports"
    )
    ax.set_xticks(rx, [x[0] for x in runs], fontsize=7)
    ax.set_ylabel("MiB")
    ax.set_title(
        "memory of one pass against the offset map budget (log.cleaner.dedupe.buffer.size)"
    )
    ax.legend(fontsize=8, loc="upper left", framealpha=0.9)
    ax.grid(True, axis="y", which="both", alpha=0.3)

    ax = axes[1][1]
    prod = r["produce"]
    samples = prod["samples"]
    ax.scatter(
        [x[0] / 1000 for x in samples],
        [x[2] / 1000 for x in samples],
        s=2,
        color="tab:gray",
        alpha=0.5,
        label="from the scheduled send",
    )
    ax.scatter(
        [x[0] / 1000 for x in samples],
        [x[1] / 1000 for x in samples],
        s=2,
        color="tab:blue",
        label="round trip",
    )
    for w in prod["windows"]:
        if w["kind"] != "idle":
            ax.axvspan(
                w["start_s"],
                w["start_s"] + w["seconds"],
                alpha=0.25,
                color="tab:orange" if w["kind"] == "pass" else "tab:green",
            )
    idle99 = prod["idle"]["round_trip_us"]["p99_us"] / 1000
    pass99 = prod["pass"]["round_trip_us"]["p99_us"] / 1000
    ax.axhline(
        idle99, color="black", linestyle=":", label=f"round trip p99, idle windows {idle99:.1f} ms"
    )
    ax.axhline(
        pass99,
        color="tab:orange",
        linestyle="--",
        label=f"round trip p99 during passes {pass99:.1f} ms ({prod['p99_ratio']:.2f} x)",
    )
    ax.axhline(
        idle99 * r["goal_p99_ratio"],
        color="red",
        linestyle="--",
        alpha=0.6,
        label=f"goal {r['goal_p99_ratio']} x idle p99",
    )
    ax.set_yscale("log")
    ax.set_xlabel(
        "s; orange: a compaction pass of another topic; green: a busy loop as long as the pass"
    )
    ax.set_ylabel("produce latency, ms")
    ax.set_title(f"JSON produce, {PRODUCE_RECORDS} records/request at a fixed rate, one connection")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)

    if limited:
        _plot_limited(axes[2], r, limited)

    fig.suptitle(f"compaction, {report['mode']} run, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_limited(axes: Any, r: dict[str, Any], limited: list[dict[str, Any]]) -> None:
    """Produce latency over time with the cleaner's I/O limit, and the p99 ratios side by side."""
    lim = limited[-1]
    ax = axes[0]
    samples = lim["samples"]
    ax.scatter([x[0] / 1000 for x in samples], [x[1] / 1000 for x in samples], s=2, color="tab:blue", label="round trip")
    for w in lim["windows"]:
        if w["kind"] == "pass":
            ax.axvspan(w["start_s"], w["start_s"] + w["seconds"], alpha=0.25, color="tab:orange")
    idle99 = lim["idle"]["round_trip_us"]["p99_us"] / 1000
    pass99 = lim["pass"]["round_trip_us"]["p99_us"] / 1000
    ax.axhline(idle99, color="black", linestyle=":", label=f"round trip p99, idle windows {idle99:.1f} ms")
    ax.axhline(pass99, color="tab:orange", linestyle="--", label=f"p99 during passes {pass99:.1f} ms ({lim['p99_ratio']:.2f} x)")
    ax.axhline(idle99 * r["goal_p99_ratio"], color="red", linestyle="--", alpha=0.6, label=f"goal {r['goal_p99_ratio']} x idle p99")
    ax.set_yscale("log")
    ax.set_xlabel("s; orange: a throttled compaction pass")
    ax.set_ylabel("produce latency, ms")
    ax.set_title(
        f"the same with EVENTLOG_CLEANER_IO_MAX_BYTES_PER_SEC = {lim['io_limit_label']} "
        f"({lim['io_limit_bytes_per_s'] / MB:.0f} MB/s)"
    )
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)

    ax = axes[1]
    prod = r["produce"]
    bars = [("unlimited pass", prod["p99_ratio"], "tab:orange")]
    bars += [(f"pass, limit {x['io_limit_label']}", x["p99_ratio"], "tab:purple") for x in limited]
    bars.append(("busy loop (peer)", prod["cpu_hog_round_trip_p99_ratio"], "tab:green"))
    xs = list(range(len(bars)))
    ax.bar(xs, [b[1] for b in bars], 0.6, color=[b[2] for b in bars])
    for x, b in zip(xs, bars):
        ax.annotate(f"{b[1]:.2f} x", (x, b[1]), ha="center", va="bottom", fontsize=9)
    ax.axhline(r["goal_p99_ratio"], color="red", linestyle="--", label=f"goal {r['goal_p99_ratio']} x")
    ax.axhline(1.0, color="black", linestyle=":", alpha=0.6)
    ax.set_xticks(xs, [b[0] for b in bars], fontsize=8)
    ax.set_ylabel("produce round trip p99 / idle p99 (same server)")
    ax.set_title("p99 during a pass over idle p99")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
