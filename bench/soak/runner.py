"""One soak: start the server, create the topics, run the load, and every `kill_every` seconds
(jittered by the seed) SIGKILL the server, decode its files, start it again and verify.

With processes >= 2 (eventlog serve --processes N) the cycles rotate through three faults:
SIGKILL of the supervisor (the whole server, steps 2-4 as below), SIGKILL of one shard, and
SIGSTOP of one shard. A single-shard fault replaces steps 2-4: the shard (drawn by the seed) is
hit while the load runs on against the others, and the supervisor must restart it alone -- its
"is back after restart K" line -- while the other shards keep their pids (a family restart is a
failure, `family_restart`). A SIGSTOP is held until the supervisor marks the shard silent and
kills it at its heartbeat deadline (EVENTLOG_SHARD_HEARTBEAT_TIMEOUT_MS, server.py); every
other SIGSTOP cycle instead sends SIGCONT as soon as the shard is marked silent, and the shard
must answer again under its old pid. Meanwhile requests that need the shard answer 503
`unavailable`: writers put them in doubt and retry (as around a restart), readers retry; they
are counted per cycle. A shard that dies or is restarted outside these faults is a failure
(`shard_died`). The files are decoded only after whole-server kills (a live family may be
writing them). Step 5 follows every fault.

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
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from engine.snapshots import default_root

from .load import Gate, Load, Stats, drain
from .model import AGGREGATES, FULL, LEDGER, MANY, PLAIN, RETAINED, TABLE, Model
from .phases import PHASES, fault_phase, write_rules
from .queue import DEAD_PARTITIONS, DEAD_TOPIC, QUEUE_SETTINGS, QUEUE_URL, read_dead_letters
from .queue import check as check_queue
from .server import SERVER_ENV, ShardFault, SoakServer
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
LOST_KINDS = ("lost", "table_mismatch", "refused_written", "queue_lost")
DUPLICATED_KINDS = ("duplicated", "queue_double_ack")
SETTLE_TIMEOUT_S = 90.0  # the exact writers' last requests, at the end
# with processes >= 2, cycle n's fault is FAULT_ROTATION[n % 3]; every other shard_stop is a
# shard_stop_cont (SIGCONT once the supervisor marked the shard silent)
FAULT_ROTATION = ("server_kill", "shard_kill", "shard_stop")
SHARD_SIGNALS = {"shard_kill": "kill", "shard_stop": "stop", "shard_stop_cont": "stop_cont"}
SHARD_FAULT_GRACE_S = 1.0  # 503s already on their way when the shard came back still count as the fault's
FAMILY_TIMEOUT_S = 60.0  # a family found short of a shard gets this long to be whole again


@dataclass
class SoakConfig:
    minutes: float
    kill_every: float
    seed: int = 1
    work_dir: Path = Path("bench/work/soak")
    min_restarts: int = 0  # keep going past `minutes` until this many fault cycles were survived
    processes: int = 1  # eventlog serve --processes; with 2 or more the faults rotate (FAULT_ROTATION)
    log: Any = print


@dataclass
class Cycle:
    kill_at: float  # when the fault began (the signal)
    fault: str = "server_kill"  # or "shard_kill", "shard_stop" (held), "shard_stop_cont"
    killed: str = "server"  # what the signal hit: "server" or "shard <i>"
    outcome: str = ""  # a single-shard fault: "restarted alone", "resumed", ... (ShardFault.outcome)
    shard: dict[str, Any] = field(default_factory=dict)  # a single-shard fault: pids and timings
    answered_503: int = 0  # requests answered 503 during a single-shard fault
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
    family = server.shards_by_index()  # {index: pid}; {} with one process
    faulted_pids: set[int] = set()  # the shards the soak hit: their supervisor lines are expected
    tasks: list[asyncio.Task] = []
    final: dict[str, Any] = {}
    load: Load | None = None
    try:
        for topic, count in PARTITIONS.items():
            r = await client.post("/v1/topics", json={"name": topic, "partitions": count, "configs": TOPIC_CONFIGS[topic]})
            r.raise_for_status()
        # the queue workers' queue on the aggregates topic, and its dead-letter topic (queue.py)
        dead = {"name": DEAD_TOPIC, "partitions": DEAD_PARTITIONS}
        (await client.post("/v1/topics", json=dead)).raise_for_status()
        (await client.put(QUEUE_URL, json=QUEUE_SETTINGS)).raise_for_status()
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
            fault = _fault_kind(cfg.processes, len(cycles))
            family = await _check_family(server, family, model, f"before fault {len(cycles) + 1}")
            load.queue.q.faults_ms.append(time.time() * 1000)  # (any fault may end the leases)
            if fault == "server_kill":
                cycle = await _kill_and_restart(server, data_dir, model, stats, disk_cache)
                family = server.shards_by_index()
            else:
                cycle, family = await _shard_fault(server, model, stats, rng, fault, family)
                faulted_pids.add(cycle.shard["pid"])
            cycles.append(cycle)
            await gate.close()
            cycle.verify_started = stats.now()
            await _after_restart(client, model, data_dir)
            cycle.verified = dict(await verify_api(client, model, PARTITIONS, f"restart {len(cycles)}"))
            cycle.verify_seconds = stats.now() - cycle.verify_started
            gate.open()
            what = "" if cycle.fault == "server_kill" else f", {cycle.outcome}, {cycle.answered_503} answered 503"
            cfg.log(
                f"fault {len(cycles)} ({cycle.fault} of {cycle.killed}{what}) at {cycle.kill_at:.0f} s: "
                f"ready in {cycle.ready_seconds:.1f} s, "
                f"verified in {cycle.verify_seconds:.1f} s: {cycle.verified.get('verified', 0)} records, "
                f"{model.counts['acked']} acked, {model.counts['in_doubt']} in doubt, "
                f"{len(model.failures)} failures"
            )
        if not await load.settle(SETTLE_TIMEOUT_S):
            model.fail("unresolved", f"exact writers still retrying {SETTLE_TIMEOUT_S:.0f} s after the load ended")
        await _finish_queue(client, model, load, final)
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
        family = await _check_family(server, family, model, "at the end")
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
    return _results(cfg, model, stats, cycles, final, server, load, faulted_pids)


async def _finish_queue(client: httpx.AsyncClient, model: Model, load: Load,
                        final: dict[str, Any]) -> None:
    """After the last fault, the key writers settled: stop the queue workers, drain the
    queue, judge it (queue.check)."""
    if not await load.queue.stop(SETTLE_TIMEOUT_S):
        model.fail("unresolved", f"queue workers still settling {SETTLE_TIMEOUT_S:.0f} s "
                                 "after the load ended")
    final["queue_drain_seconds"] = await load.queue.drain(client)
    try:
        dead = await read_dead_letters(client)
    except httpx.HTTPError as exc:
        model.fail("unexpected_status", f"reading {DEAD_TOPIC}: {exc!r}")
        return
    final["queue"] = check_queue(model, load.queue.q, dead)


def _fault_kind(processes: int, n: int) -> str:
    if processes < 2:
        return "server_kill"
    kind = FAULT_ROTATION[n % len(FAULT_ROTATION)]
    if kind == "shard_stop" and (n // len(FAULT_ROTATION)) % 2 == 1:
        return "shard_stop_cont"
    return kind


async def _check_family(server: SoakServer, known: dict[int, int], model: Model, when: str) -> dict[int, int]:
    """The shards still run under the pids the soak last saw (only its own faults replace one);
    a family found short of a shard is given FAMILY_TIMEOUT_S to be whole again. Returns it."""
    if server.processes < 2 or not server.alive():
        return known
    current = await asyncio.to_thread(server.shards_by_index)
    if current == known:
        return current
    model.fail("shard_died", f"{when}: shards by index {known} -> {current}: a shard died or was restarted "
                             "outside the soak's faults (see server.log)")
    deadline = asyncio.get_running_loop().time() + FAMILY_TIMEOUT_S
    while len(current) < server.processes and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.2)
        current = await asyncio.to_thread(server.shards_by_index)
    return current


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


async def _shard_fault(server: SoakServer, model: Model, stats: Stats, rng: random.Random, fault: str,
                       family: dict[int, int]) -> tuple[Cycle, dict[int, int]]:
    """SIGKILL or SIGSTOP one shard while the load runs on (server.fault_shard); the supervisor
    must bring it back alone (or see it resume after a SIGCONT), the others keeping their pids.
    Returns the cycle and the family as it is afterwards."""
    cycle = Cycle(kill_at=stats.now(), fault=fault)
    if not server.alive():
        model.fail("server_died", f"the server exited with status {server.process.returncode} before fault "
                                  f"{server.starts} (see server.log)")
    index = rng.randrange(server.processes)
    cycle.killed = f"shard {index}"
    answered_503 = sum(stats.answered_503.values())
    stats.shard_fault = True
    try:
        result: ShardFault = await asyncio.to_thread(server.fault_shard, SHARD_SIGNALS[fault], index)
    except RuntimeError as exc:
        model.fail("shard_restart", str(exc))
        raise
    finally:
        await asyncio.sleep(SHARD_FAULT_GRACE_S)  # answers already on their way
        stats.shard_fault = False
    cycle.answered_503 = sum(stats.answered_503.values()) - answered_503
    for problem in result.problems:
        model.fail("shard_restart", problem)
    after = await asyncio.to_thread(server.shards_by_index)
    others = {i: p for i, p in result.pids_before.items() if i != index}
    for label, seen in (("when the shard was back", result.pids_after), (f"{SHARD_FAULT_GRACE_S:.0f} s later", after)):
        changed = {i: seen.get(i) for i, p in others.items() if seen.get(i) != p}
        if changed:
            model.fail("family_restart", f"{fault} of shard {index}: the other shards' pids changed ({label}): "
                                         f"{ {i: others[i] for i in changed} } -> {changed}")
    if result.back_s is None and result.resumed_s is None:
        model.fail("shard_restart", f"{fault} of shard {index} (pid {result.pid}): it neither came back nor resumed")
    cycle.outcome = result.outcome or "not back"
    cycle.ready_seconds = result.back_s if result.back_s is not None else (result.resumed_s or 0.0)
    cycle.shard = {
        k: (round(v, 2) if isinstance(v, float) else v)
        for k, v in result.__dict__.items() if k not in ("kind", "index", "outcome", "problems")
    }
    return cycle, after


async def _after_restart(client: httpx.AsyncClient, model: Model, data_dir: Path) -> None:
    """The topics came back; the snapshot dir holds only finished snapshots; ours are deleted."""
    r = await client.get("/v1/topics")
    listed = {t["name"]: t["partitions"] for t in r.json()["topics"]}
    if listed != {**PARTITIONS, DEAD_TOPIC: DEAD_PARTITIONS}:
        model.fail("metadata", f"topics after restart: {listed}")
    root = default_root(data_dir)
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


def _log_problems(path: Path, faulted_pids: set[int]) -> list[str]:
    """Lines of the server's output that report errors (tracebacks, ERROR/CRITICAL logs), but
    for the refusals of injected faults (counted elsewhere), the supervisor's lines about the
    shards the soak itself killed or stopped (their deaths, silence, kills), and the shards'
    503 `unavailable` answers naming a shard down (counted as answered_503)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    expected = re.compile(r"shard \d+ \(pid (\d+)\) (.*restarting it alone|is not answering|gave no heartbeat for)")
    out = []
    for line in lines:
        if not ("Traceback" in line or "ERROR" in line or "CRITICAL" in line) or "(injected)" in line:
            continue
        if "eventlog.api: unavailable: shard " in line:
            continue
        m = expected.search(line)
        if m and int(m[1]) in faulted_pids:
            continue
        out.append(line[:300])
    return out[:50]


def _results(cfg: SoakConfig, model: Model, stats: Stats, cycles: list[Cycle], final: dict[str, Any],
             server: SoakServer, load: Load | None, faulted_pids: set[int]) -> dict[str, Any]:
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
            "faults": len(cycles),
            "faults_by_kind": dict(Counter(c.fault for c in cycles)),
            # a process SIGKILLed: by the soak (the server, a shard), or by the supervisor (a stopped shard)
            "kills": sum(1 for c in cycles if c.outcome != "resumed"),
            "shard_kills": sum(1 for c in cycles if c.fault == "shard_kill"),
            "shard_stops": sum(1 for c in cycles if c.fault.startswith("shard_stop")),
            "shard_stops_resumed": sum(1 for c in cycles if c.outcome == "resumed"),
            "shards_restarted_alone": sum(1 for c in cycles if c.outcome.endswith("restarted alone")),
            "restarts_survived": sum(1 for c in cycles if c.outcome != "resumed"),
            "answered_503_during_shard_faults": sum(stats.answered_503.values()),
            "answered_503_during_shard_faults_by_kind": dict(sorted(stats.answered_503.items())),
            "answered_503_otherwise": dict(sorted(stats.answered_503_otherwise.items())),
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
            **_queue_results(load, final),
            "lost": lost,
            "duplicated": duplicated,
            "failure_counts": failure_counts,
            "failures": [f.__dict__ for f in model.failures],
            "client_errors": dict(sorted(stats.errors.items())),
            "client_events": dict(sorted(stats.events.items())),
            "final_api": api,
            "final_disk": final.get("disk", {}),
            "final_exit_status": final.get("exit_status"),
            "server_log_problems": _log_problems(server.log_path, faulted_pids),
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


def _queue_results(load: Load | None, final: dict[str, Any]) -> dict[str, Any]:
    """The queue workers (queue.py): records settled at the end, and what the workers did."""
    judged = final.get("queue", {})
    return {
        "queue_acked": judged.get("acked", 0),  # of them, acks in doubt: queue.acked_in_doubt
        "queue_dead_lettered": judged.get("dead_lettered", 0),
        "queue_redelivered": judged.get("redelivered", 0),  # records leased more than once
        "queue_lost": judged.get("lost", 0),
        "queue_records": judged.get("records", 0),
        "queue_drain_seconds": round(final.get("queue_drain_seconds", 0.0), 2),
        "queue": {**judged, **(dict(load.queue.q.counts) if load is not None else {})},
    }


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
