"""One soak: start the server, create the topics, run the load, and every `kill_every` seconds
(jittered by the seed) SIGKILL the server, decode its files, start it again and verify.

With processes >= 2 (eventlog serve --processes N) every other cycle SIGKILLs one shard instead
of the supervisor (step 2), skips the decode (3) and waits for the supervisor's new family (4).

A cycle:
1. load runs for kill_every x U(0.75, 1.25) seconds (the seed's random stream); in cycles 1, 4,
   7, ... with a disk-full phase in the middle (ENOSPC on soak-full-0's writes or fsyncs, through
   the server's EVENTLOG_FAULTS_FILE), in cycles 2, 5, 8, ... with a slow-fsync phase
   (phases.py);
2. SIGKILL the server; its worker processes must die with it (reported otherwise);
3. decode every live segment file with kafka-python (new or changed files only; the newest
   segment of a partition may end in a torn batch, anything else is a failure);
4. start the server on the same data dir and port (clients retry meanwhile) and wait for /readyz;
5. hold the writers, let requests in flight finish, check the topics and the snapshot dir,
   delete leftover snapshots, read every partition through the API and judge it against the
   model (verify.py), then let the writers go on.
At the end: the exact writers answer their last request and stop; then the same API
verification (every exact writer's record must be there exactly once), a SIGTERM (exit status
0 expected), and a strict decode of every file on disk judged like the API's answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .load import Gate, Load, Stats, drain
from .model import AGGREGATES, FULL, LEDGER, MANY, PLAIN, RETAINED, TABLE, Model
from .phases import PHASES, fault_phase, write_rules
from .server import SERVER_ENV, SoakServer
from .verify import DiskCache, decode_files, verify_api, verify_disk_final

PARTITIONS = {PLAIN: 4, RETAINED: 2, TABLE: 2, FULL: 1, LEDGER: 1, MANY: 32, AGGREGATES: 3}
TOPIC_CONFIGS: dict[str, dict[str, Any]] = {
    PLAIN: {"segment.bytes": 256 * 1024},
    RETAINED: {
        "segment.bytes": 16 * 1024, "retention.bytes": 64 * 1024, "retention.ms": 20_000,
        "file.delete.delay.ms": 1_000,
    },
    TABLE: {
        "cleanup.policy": "compact", "segment.bytes": 8 * 1024, "min.cleanable.dirty.ratio": 0.01,
        "min.compaction.lag.ms": 0, "delete.retention.ms": 2_000, "file.delete.delay.ms": 1_000,
    },
    FULL: {"segment.bytes": 32 * 1024},  # rolls often, so some refused appends are a roll's
    LEDGER: {"segment.bytes": 64 * 1024},
    MANY: {"segment.bytes": 16 * 1024},  # small appends over many partitions, rolling as they go
    AGGREGATES: {"segment.bytes": 8 * 1024},  # rolls often: most of a key's history is in .keyindex files
}
LOST_KINDS = ("lost", "table_mismatch", "refused_written")
DUPLICATED_KINDS = ("duplicated",)
SETTLE_TIMEOUT_S = 90.0  # the exact writers' last requests, at the end


@dataclass
class SoakConfig:
    minutes: float
    kill_every: float
    seed: int = 1
    work_dir: Path = Path("bench/work/soak")
    min_restarts: int = 0  # keep going past `minutes` until this many restarts were survived
    processes: int = 1  # eventlog serve --processes; with 2 or more every other kill is one shard's
    log: Any = print


@dataclass
class Cycle:
    kill_at: float
    killed: str = "server"  # or "shard <i>": one shard SIGKILLed, the supervisor restarts the family
    orphans: list[int] = field(default_factory=list)
    disk: dict[str, int] = field(default_factory=dict)
    ready_seconds: float = 0.0
    verify_started: float = 0.0
    verify_seconds: float = 0.0
    verified: dict[str, int] = field(default_factory=dict)


async def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    work = cfg.work_dir.resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    data_dir = work / "data"
    faults_file = work / "faults.json"
    write_rules(faults_file, [])
    server = SoakServer(data_dir, work / "server.log", {"EVENTLOG_FAULTS_FILE": str(faults_file)}, cfg.processes)
    rng = random.Random(cfg.seed)
    stats, gate = Stats(), Gate()
    model = Model(clock=stats.now)
    await asyncio.to_thread(server.start)
    cfg.log(f"server on {server.url}, data in {data_dir}")
    client = httpx.AsyncClient(
        base_url=server.url,
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        timeout=httpx.Timeout(60.0, connect=5.0),
    )
    cycles: list[Cycle] = []
    disk_cache = DiskCache()
    tasks: list[asyncio.Task] = []
    final: dict[str, Any] = {}
    load: Load | None = None
    try:
        for topic, count in PARTITIONS.items():
            r = await client.post("/v1/topics", json={"name": topic, "partitions": count, "configs": TOPIC_CONFIGS[topic]})
            r.raise_for_status()
        load = Load(client, model, stats, gate, PARTITIONS, rng.randrange(1 << 32), data_dir)
        tasks = [asyncio.create_task(c) for c in load.tasks()]
        for task in tasks:
            task.add_done_callback(functools.partial(_note_crash, model, gate))
        deadline = stats.now() + cfg.minutes * 60
        while True:
            interval = cfg.kill_every * rng.uniform(0.75, 1.25)
            remaining = deadline - stats.now()
            done = len(cycles) >= cfg.min_restarts
            if done and interval >= remaining:
                await asyncio.sleep(max(0.0, remaining))
                break
            kind = PHASES[len(cycles) % len(PHASES)]
            if kind is None:
                await asyncio.sleep(interval)
            else:
                await fault_phase(kind, interval, load.faults, model, stats, faults_file, data_dir, rng, cfg.log)
            if cfg.processes > 1 and len(cycles) % 2 == 1:
                cycle = await _kill_shard(server, model, stats, rng)
            else:
                cycle = await _kill_and_restart(server, data_dir, model, stats, disk_cache)
            cycles.append(cycle)
            await gate.close()
            cycle.verify_started = stats.now()
            await _after_restart(client, model, data_dir)
            cycle.verified = dict(await verify_api(client, model, PARTITIONS, f"restart {len(cycles)}"))
            cycle.verify_seconds = stats.now() - cycle.verify_started
            gate.open()
            cfg.log(
                f"restart {len(cycles)} ({cycle.killed} killed) at {cycle.kill_at:.0f} s: ready in {cycle.ready_seconds:.1f} s, "
                f"verified in {cycle.verify_seconds:.1f} s: {cycle.verified.get('verified', 0)} records, "
                f"{model.counts['acked']} acked, {model.counts['in_doubt']} in doubt, "
                f"{len(model.failures)} failures"
            )
        if not await load.settle(SETTLE_TIMEOUT_S):
            model.fail("unresolved", f"exact writers still retrying {SETTLE_TIMEOUT_S:.0f} s after the load ended")
        await gate.close()
        final_started = stats.now()
        await _after_restart(client, model, data_dir)
        final["api"] = dict(await verify_api(client, model, PARTITIONS, "final"))
        x = load.exact
        if not x.records_answered == x.records == final["api"].get("exact_verified", 0):
            model.fail("unresolved", f"exact writers: {x.records} records sent, {x.records_answered} answered, "
                                     f"{final['api'].get('exact_verified', 0)} found exactly once at their offsets")
        final["verify_seconds"] = stats.now() - final_started
        final["load_seconds"] = final_started
        gate.stopping = True
        await drain(tasks)
        tasks = []
        if not server.alive():
            model.fail("server_died", f"the server exited with status {server.process.returncode} before the end")
        final["exit_status"] = await asyncio.to_thread(server.stop)
        if final["exit_status"] != 0:
            model.fail("shutdown", f"SIGTERM: exit status {final['exit_status']}")
        final["disk"] = dict(await asyncio.to_thread(verify_disk_final, data_dir, model, PARTITIONS))
        final["duration_seconds"] = stats.now()
    finally:
        gate.stopping = True
        try:
            await drain(tasks)
            await client.aclose()
        finally:  # never leave a server behind: it would write into the next run's data dir
            if server.alive():
                await asyncio.to_thread(server.kill)
    return _results(cfg, model, stats, cycles, final, server, load)


def _note_crash(model: Model, gate: Gate, task: asyncio.Task) -> None:
    """A load task that ended by an exception (or a cancellation the runner did not ask for)
    stopped with its request unanswered: a failure of the soak itself, recorded with the error
    so the report says what happened."""
    name = task.get_coro().__name__
    if task.cancelled():
        if not gate.stopping:
            model.fail("load_task_crashed", f"{name}: cancelled while the load ran")
    elif (exc := task.exception()) is not None:
        model.fail("load_task_crashed", f"{name}: {type(exc).__name__}: {exc}")


async def _kill_and_restart(server: SoakServer, data_dir: Path, model: Model, stats: Stats,
                            cache: DiskCache) -> Cycle:
    cycle = Cycle(kill_at=stats.now())
    if not server.alive():  # it died by itself (a crash): a finding, whatever the checks say
        model.fail("server_died", f"the server exited with status {server.process.returncode} before kill "
                                  f"{server.starts} (see server.log)")
    cycle.orphans = await asyncio.to_thread(server.kill)
    if cycle.orphans:
        model.fail("orphan_process", f"worker processes {cycle.orphans} outlived the SIGKILLed server")
    counts, _ = await asyncio.to_thread(decode_files, data_dir, model, cache, strict=False, label=f"kill at {cycle.kill_at:.0f} s")
    cycle.disk = dict(counts)
    cycle.ready_seconds = await asyncio.to_thread(server.start)
    return cycle


async def _kill_shard(server: SoakServer, model: Model, stats: Stats, rng: random.Random) -> Cycle:
    """SIGKILL one shard of the family; the supervisor must stop the others and start a new
    family on the same port (the files are decoded only after whole-server kills: here the new
    family may already be writing while they would be read)."""
    cycle = Cycle(kill_at=stats.now())
    if not server.alive():
        model.fail("server_died", f"the server exited with status {server.process.returncode} before kill "
                                  f"{server.starts} (see server.log)")
    stats.restarting = True
    try:
        index, cycle.ready_seconds = await asyncio.to_thread(server.kill_shard, rng)
    except RuntimeError as exc:
        model.fail("shard_restart", str(exc))
        raise
    finally:
        await asyncio.sleep(1.0)  # answers already on their way from the old family
        stats.restarting = False
    cycle.killed = f"shard {index}"
    return cycle


async def _after_restart(client: httpx.AsyncClient, model: Model, data_dir: Path) -> None:
    """The topics came back; the snapshot dir holds only finished snapshots; ours are deleted."""
    r = await client.get("/v1/topics")
    listed = {t["name"]: t["partitions"] for t in r.json()["topics"]}
    if listed != PARTITIONS:
        model.fail("metadata", f"topics after restart: {listed}")
    root = data_dir / "snapshots"
    if root.is_dir():
        for entry in os.scandir(root):
            if entry.is_dir() and not entry.name.startswith(".") and not Path(entry.path, "manifest.json").exists():
                model.fail("snapshot", f"unfinished snapshot {entry.name} left after the restart")
    r = await client.get("/v1/snapshots")
    for snapshot in r.json()["snapshots"]:
        with contextlib.suppress(httpx.TransportError):
            d = await client.delete(f"/v1/snapshots/{snapshot['id']}")
            if d.status_code != 204:
                model.fail("snapshot", f"delete leftover {snapshot['id']}: {d.status_code}")


def _log_problems(path: Path) -> list[str]:
    """Lines of the server's output that report errors (tracebacks, ERROR/CRITICAL logs)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    # the refusals of injected faults are logged as errors too; they are counted elsewhere
    return [line[:300] for line in lines
            if ("Traceback" in line or "ERROR" in line or "CRITICAL" in line) and "(injected)" not in line][:50]


def _results(cfg: SoakConfig, model: Model, stats: Stats, cycles: list[Cycle], final: dict[str, Any],
             server: SoakServer, load: Load | None) -> dict[str, Any]:
    failure_counts = {k.removeprefix("failure_"): v for k, v in model.counts.items() if k.startswith("failure_")}
    lost = sum(failure_counts.get(k, 0) for k in LOST_KINDS)
    duplicated = sum(failure_counts.get(k, 0) for k in DUPLICATED_KINDS)
    duration = final.get("duration_seconds", stats.now())
    load_seconds = final.get("load_seconds", duration)
    api = final.get("api", {})
    ops = {k: v for k, v in sorted(stats.ops.items())}
    # requests by kind; not requests: records counted, SSE events (one connection, many events)
    requests = {
        k: v for k, v in ops.items()
        if not k.startswith(("records_", "compaction_records", "retention_segments", "sse_event"))
    }
    horizon = int(duration) + 1
    timeline = [[t, dict(stats.timeline.get(t, {}))] for t in range(horizon)]
    return {
        "params": {
            "minutes": cfg.minutes, "kill_every_seconds": cfg.kill_every, "seed": cfg.seed,
            "min_restarts": cfg.min_restarts, "processes": cfg.processes, "partitions": PARTITIONS, "topic_configs": TOPIC_CONFIGS,
            "server_env": SERVER_ENV, "server_command": " ".join(server.command),
        },
        "results": {
            "passed": not model.failures and final.get("exit_status") == 0,
            "duration_seconds": round(duration, 1),
            "load_seconds": round(load_seconds, 1),
            "kills": len(cycles),
            "shard_kills": sum(1 for c in cycles if c.killed != "server"),
            "restarts_survived": len(cycles),
            "server_starts": server.starts,
            "seconds_to_ready_after_kill": [round(c.ready_seconds, 2) for c in cycles],
            "verify_seconds_after_restart": [round(c.verify_seconds, 2) for c in cycles],
            "operations": ops,
            "operations_per_second": {k: round(v / duration, 1) for k, v in requests.items()},
            "requests_per_second_total": round(sum(requests.values()) / duration, 1),
            "records_acknowledged_per_second": round(model.counts["acked"] / duration, 1),
            "sse_events_per_second": round(ops.get("sse_event", 0) / duration, 1),
            "records_acknowledged": model.counts["acked"],
            "records_verified": api.get("verified", 0),
            "records_verified_all_checks": sum(c.verified.get("verified", 0) for c in cycles) + api.get("verified", 0),
            "records_expired": api.get("expired", 0),
            # records whose fate was open at the end: in doubt and never resolved by a retry
            "records_in_doubt": model.counts["in_doubt"] - model.counts["in_doubt_resolved"],
            "records_in_doubt_present": api.get("in_doubt_present", 0),
            "records_in_doubt_resolved": model.counts["in_doubt_resolved"],
            "records_refused_507": model.counts["refused"],
            "exact": _exact_results(load, api),
            "fault_phases": _phase_results(load),
            "table_keys_equal": api.get("table_keys_equal", 0),
            "table_keys_in_doubt": api.get("table_keys_in_doubt", 0),
            "lost": lost,
            "duplicated": duplicated,
            "failure_counts": failure_counts,
            "failures": [f.__dict__ for f in model.failures],
            "client_errors": dict(sorted(stats.errors.items())),
            "client_events": dict(sorted(stats.events.items())),
            "final_api": api,
            "final_disk": final.get("disk", {}),
            "final_exit_status": final.get("exit_status"),
            "server_log_problems": _log_problems(server.log_path),
            "cycles": [c.__dict__ for c in cycles],
            "timeline": timeline,
        },
    }


def _exact_results(load: Load | None, api: dict[str, int]) -> dict[str, Any]:
    """The idempotent and conditional producers: requests, retries, replays, resolutions."""
    if load is None:
        return {}
    x = dict(load.exact.__dict__)
    x["records_verified_exactly_once"] = api.get("exact_verified", 0)
    x["sequenced_records"] = api.get("sequenced_records", 0)
    return x


def _phase_results(load: Load | None) -> dict[str, Any]:
    phases = load.faults.phases if load is not None else []
    full = [p for p in phases if p.kind == "disk_full"]
    slow = [p for p in phases if p.kind == "slow_fsync"]
    resumed = [p.resumed_after_seconds for p in full if p.resumed_after_seconds is not None]
    return {
        "disk_full_phases": len(full),
        "disk_full_seconds": round(sum(p.seconds for p in full), 1),
        "disk_full_produce_507": sum(p.produce_507 for p in full),
        "disk_full_accepted": sum(p.accepted for p in full),
        "disk_full_replayed": sum(p.replayed for p in full),
        "disk_full_reads_ok": sum(p.reads_ok for p in full),
        "disk_full_other_produce_ok": sum(p.produce_ok - p.replayed - p.accepted for p in full),
        "disk_full_resumed_after_seconds_max": round(max(resumed), 2) if resumed else None,
        "slow_fsync_phases": len(slow),
        "slow_fsync_seconds": round(sum(p.seconds for p in slow), 1),
        "slow_fsync_produce_ok": sum(p.produce_ok for p in slow),
        "phases": [
            {**{k: v for k, v in p.__dict__.items() if k not in ("started", "seconds", "resumed_after_seconds")},
             "started": round(p.started, 1), "seconds": round(p.seconds, 1),
             "resumed_after_seconds": None if p.resumed_after_seconds is None else round(p.resumed_after_seconds, 2)}
            for p in phases
        ],
    }
