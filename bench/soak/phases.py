"""Fault phases of the soak: injected disk faults between kills, through the server's
EVENTLOG_FAULTS_FILE (engine/faults.py re-reads the rules file whenever its mtime changes).

A phase starts a quarter into a load period and lasts 40 % of it (at most PHASE_MAX_S); no kill
lands inside one:
* disk_full: ENOSPC on every write (and, in the next such phase, every fsync) of the
  soak-full topic's partition directory. Each produce to that topic that starts and ends inside
  the phase must be answered 507 storage_full (or be a replay, which writes nothing); reads of
  it must go on; after the lift a fresh append must succeed within RESUME_TIMEOUT_S. A 507 from
  any other topic, or outside the window around a phase, is a failure.
* slow_fsync: every fsync of the data dir delayed 20-50 ms; judged by the soak's usual checks
  (nothing lost, duplicated or reordered).

FaultState is shared by the runner (which opens and closes phases) and the load (whose clients
judge each produce answer by it: judge()).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .model import FULL, Model

if TYPE_CHECKING:
    from .load import Stats

PHASES = ("disk_full", "slow_fsync", None)  # by cycle number, in turn
PHASE_MAX_S = 5.0
RESUME_TIMEOUT_S = 30.0


@dataclass
class Phase:
    """One fault phase (between two kills): what the clients saw while the rule was in force."""

    kind: str  # "disk_full" | "slow_fsync"
    rule: dict[str, Any]
    started: float
    seconds: float = 0.0
    produce_507: int = 0  # disk-full topic produce requests answered 507 inside the phase
    accepted: int = 0  # ... answered 2xx by a fresh write inside it: a failure
    replayed: int = 0  # ... answered 2xx as a replay (nothing written): allowed
    reads_ok: int = 0  # fetches of the disk-full topic answered 200 inside the phase
    produce_ok: int = 0  # produce requests of any topic answered 2xx inside the phase
    resumed_after_seconds: float | None = None  # from the lift to the first fresh append that started after it


class FaultState:
    """What the runner is doing to the disk, as the clients judge their answers by it.

    window: from just before the rules file is written to just after it is emptied again
    (a 507 may come while it is open, or to a request spanning it: generation changed);
    phase: from just after the rule is written to just before the lift (strict: a disk-full
    topic produce that starts and ends inside it must be refused)."""

    def __init__(self) -> None:
        self.window = False
        self.generation = 0
        self.phase: Phase | None = None
        self.phases: list[Phase] = []
        self.fresh_full_append_started = -1.0  # start time of the latest 2xx fresh write to FULL

    def mark(self) -> tuple[Phase | None, int, bool]:
        return self.phase, self.generation, self.window

    def open_window(self) -> None:
        self.window = True
        self.generation += 1

    def close_window(self) -> None:
        self.window = False
        self.generation += 1

    def judge(self, mark: tuple[Phase | None, int, bool], topic: str, status: int, replayed: bool,
              started: float, model: Model, stats: Stats) -> None:
        """A produce answer against the fault phases (mark: mark() at its start, `started` its
        start time)."""
        phase, generation, window = mark
        inside = phase is not None and phase is self.phase  # started and ended in the same phase
        if status == 507:
            stats.event("storage_full_507")
            if topic != FULL or not (window or self.window or generation != self.generation):
                model.fail("unexpected_507", f"produce to {topic}: 507 storage_full with no disk-full rule on it")
            elif inside and phase.kind == "disk_full":
                phase.produce_507 += 1
            return
        if status != 200:
            return
        if inside:
            phase.produce_ok += 1
        if topic != FULL:
            return
        if inside and phase.kind == "disk_full":
            if replayed:
                phase.replayed += 1
            else:
                phase.accepted += 1
                model.fail("accepted_while_full", f"produce to {topic} answered 200 during the disk-full phase "
                                                  f"at {phase.started:.1f} s (rule {phase.rule})")
        elif not replayed:
            self.fresh_full_append_started = max(self.fresh_full_append_started, started)


def write_rules(path: Path, rules: list[dict[str, Any]]) -> None:
    """Replace the fault rules file whole and give it a new mtime (the engine caches the rules
    by mtime_ns, so a rewrite within one timestamp tick must still be seen)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rules": rules}))
    previous = path.stat().st_mtime_ns if path.exists() else 0
    os.replace(tmp, path)
    stamp = max(time.time_ns(), previous + 1_000_000)
    os.utime(path, ns=(stamp, stamp))


async def fault_phase(kind: str, interval: float, faults: FaultState, model: Model, stats: Stats,
                      faults_file: Path, data_dir: Path, rng: random.Random, log: Callable[[str], None]) -> None:
    """`interval` seconds of load with a `kind` phase in the middle (see the module doc)."""
    began = stats.now()
    await asyncio.sleep(interval * 0.25)
    if kind == "disk_full":
        # the writes, or the fsyncs, of the disk-full topic's partition, in turn
        op = ("write", "fsync")[sum(1 for p in faults.phases if p.kind == kind) % 2]
        rule: dict[str, Any] = {"op": op, "path": f"{data_dir}/{FULL}-0/", "errno": "ENOSPC"}
    else:
        rule = {"op": "fsync", "path": f"{data_dir}/", "delay_ms": rng.randint(20, 50)}
    faults.open_window()
    write_rules(faults_file, [rule])
    phase = Phase(kind=kind, rule=rule, started=stats.now())
    faults.phase = phase
    faults.phases.append(phase)
    await asyncio.sleep(min(PHASE_MAX_S, interval * 0.4))
    faults.phase = None
    phase.seconds = stats.now() - phase.started
    write_rules(faults_file, [])
    faults.close_window()
    lifted = stats.now()
    if kind == "disk_full":
        if phase.produce_507 == 0 or phase.reads_ok == 0:
            model.fail("disk_full_unseen", f"disk-full phase at {phase.started:.1f} s ({rule}): {phase.produce_507} "
                                           f"produce requests answered 507, {phase.reads_ok} reads answered (want both > 0)")
        while faults.fresh_full_append_started < lifted and stats.now() - lifted < RESUME_TIMEOUT_S:
            await asyncio.sleep(0.05)
        if faults.fresh_full_append_started >= lifted:
            phase.resumed_after_seconds = faults.fresh_full_append_started - lifted
        else:
            model.fail("not_resumed", f"no append to {FULL} succeeded within {RESUME_TIMEOUT_S:.0f} s of lifting "
                                      f"the disk-full rule {rule}")
    log(f"{kind} phase at {phase.started:.0f} s for {phase.seconds:.1f} s ({rule['op']}): "
        f"{phase.produce_507} produce requests answered 507, {phase.reads_ok} reads of {FULL} answered, "
        f"{phase.produce_ok} produce requests acknowledged")
    await asyncio.sleep(max(0.0, interval - (stats.now() - began)))
