"""The server under test: `eventlog serve` as a subprocess on one data dir and one port for the
whole soak, SIGKILLed and started again.

With --processes N (N >= 2) the server is a supervisor and N shard processes; some cycles then
hit one shard instead of the supervisor (fault_shard): a SIGKILL, or a SIGSTOP held until the
supervisor kills the shard at its heartbeat deadline (EVENTLOG_SHARD_HEARTBEAT_TIMEOUT_MS, 4 s
here), or a SIGSTOP undone by a SIGCONT once the supervisor has marked the shard silent. The
supervisor must restart that shard alone (its "shard I (pid P) is back after restart K" line)
or, after a SIGCONT, see it answer again ("answers again"); the other shards must keep their
pids throughout (a family restart is a failure).

The server runs in its own session (process group = its pid), so a Ctrl-C of the soak does not
reach it and its worker processes (the compactor's) can be found by group. After a SIGKILL only
the server itself is signalled, as when the OOM killer picks it; its workers must die with it
(PR_SET_PDEATHSIG). A worker still alive a few seconds later is reported, then killed. Shards run
in process groups of their own (the supervisor's children), so their groups are searched too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..servers import free_port, tail

START_TIMEOUT_S = 180.0  # recovery of a busy data dir on a loaded 2-core machine
STOP_TIMEOUT_S = 60.0
ORPHAN_GRACE_S = 5.0

# Workers run often so that kills land in the middle of their passes; access logs are off
# because the soak makes thousands of requests a second and the log would only cost CPU.
SERVER_ENV = {
    "EVENTLOG_KAFKA_PORT": "0",  # HTTP load only: no Kafka listener on the machine's one 9092
    "EVENTLOG_ACCESS_LOG": "false",
    "EVENTLOG_LOG_LEVEL": "warning",
    "EVENTLOG_RETENTION_CHECK_INTERVAL_MS": "2000",
    "EVENTLOG_CLEANER_BACKOFF_MS": "1000",
    "EVENTLOG_CHECKPOINT_INTERVAL_MS": "3000",
    # a SIGSTOPped shard is marked silent after 2 s and killed at this deadline (--processes >= 2)
    "EVENTLOG_SHARD_HEARTBEAT_TIMEOUT_MS": "4000",
}
SHARD_FAULT_TIMEOUT_S = 120.0  # from the signal to the shard's return (restart or SIGCONT)


@dataclass
class ShardFault:
    """One shard hit while the others serve on: what the supervisor logged about it, and when
    (seconds after the signal), and the pids of the family before and after."""

    kind: str  # "kill": SIGKILL; "stop": SIGSTOP held; "stop_cont": SIGSTOP, SIGCONT once silent
    index: int
    pid: int
    pids_before: dict[int, int]
    pids_after: dict[int, int] = field(default_factory=dict)
    outcome: str = ""  # "restarted alone", "resumed", "killed before the SIGCONT, restarted alone"
    death_logged_s: float | None = None  # "... restarting it alone"
    silent_s: float | None = None  # "is not answering"
    killed_s: float | None = None  # "gave no heartbeat for ... killing it"
    cont_s: float | None = None  # our SIGCONT
    resumed_s: float | None = None  # "answers again"
    back_s: float | None = None  # "is back after restart K"
    restart: int | None = None  # K
    new_pid: int | None = None
    problems: list[str] = field(default_factory=list)


class SoakServer:
    def __init__(self, data_dir: Path, log_path: Path, extra_env: dict[str, str] | None = None, processes: int = 1):
        self.processes = processes
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_env = dict(extra_env or {})  # e.g. EVENTLOG_FAULTS_FILE
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        script = Path(sys.executable).with_name("eventlog")
        base = [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]
        return [*base, "serve", "--data-dir", str(self.data_dir), "--port", str(self.port), "--processes", str(self.processes)]

    def start(self) -> float:
        """Start on the same port and data dir; return the seconds until /readyz said 200."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLOG_")}
        env.update(SERVER_ENV)
        env.update(self.extra_env)
        begin = time.monotonic()
        with open(self.log_path, "ab") as out:
            out.write(f"\n=== start {self.starts + 1}: {' '.join(self.command)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = begin + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"eventlog exited with status {self.process.returncode} at start "
                    f"{self.starts + 1}:\n{tail(self.log_path, 60)}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    self.starts += 1
                    return time.monotonic() - begin
            time.sleep(0.05)
        self.process.kill()
        self.process.wait()
        raise RuntimeError(f"eventlog not ready within {START_TIMEOUT_S:.0f} s:\n{tail(self.log_path, 60)}")

    def kill(self) -> list[int]:
        """SIGKILL the server process (only it); return the pids of workers (and shards, and
        their workers) that outlived it."""
        assert self.process is not None
        pid = self.process.pid
        groups = [pid, *self.shard_pids()]  # each shard leads a process group of its own
        if self.process.poll() is None:
            os.kill(pid, signal.SIGKILL)
        self.process.wait()
        orphans = _group_members(groups)
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while orphans and time.monotonic() < deadline:
            time.sleep(0.05)
            orphans = _group_members(groups)
        if orphans:
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
        return orphans

    def stop(self) -> int:
        """SIGTERM: a clean shutdown; returns the exit status (0 expected)."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -9

    def shard_pids(self) -> list[int]:
        """The live shard processes of the family (children of the supervisor running app.shard)."""
        if self.process is None:
            return []
        return [pid for pid in _children(self.process.pid) if b"app.shard" in _cmdline(pid)]

    def shards_by_index(self) -> dict[int, int]:
        """{index in the family: pid} of the live shards (from their EVENTLOG_SHARD identity)."""
        out = {}
        for pid in self.shard_pids():
            index = _shard_index(pid)
            if index is not None:
                out[index] = pid
        return out

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def fault_shard(self, kind: str, index: int) -> ShardFault:
        """Hit shard `index` (kind: see ShardFault) and wait until the supervisor has restarted it
        alone, or (stop_cont) it answers again; every problem seen goes into the result, which
        the runner turns into failures. A stopped shard is never left stopped."""
        before = self.shards_by_index()
        if sorted(before) != list(range(self.processes)):
            raise RuntimeError(f"shards by index before a shard fault: {before}; expected {self.processes}")
        pid = before[index]
        fault = ShardFault(kind=kind, index=index, pid=pid, pids_before=before)
        others = {i: p for i, p in before.items() if i != index}
        mark = self.log_size()
        begin = time.monotonic()
        os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        me = rf"shard {index} \(pid {pid}\)"
        try:
            while True:
                now = time.monotonic() - begin
                if not self.alive():
                    fault.problems.append(f"the supervisor exited ({self.process.returncode}) during a shard {kind}")
                    break
                text = self._log_since(mark)
                if fault.death_logged_s is None and re.search(rf"{me} .*restarting it alone", text):
                    fault.death_logged_s = now
                if fault.silent_s is None and re.search(rf"{me} is not answering", text):
                    fault.silent_s = now
                if fault.killed_s is None and re.search(rf"{me} gave no heartbeat for", text):
                    fault.killed_s = now
                if kind == "stop_cont" and fault.silent_s is not None and fault.cont_s is None:
                    os.kill(pid, signal.SIGCONT)  # a stopped process that was killed meanwhile: a zombie takes it
                    fault.cont_s = time.monotonic() - begin
                if fault.resumed_s is None and re.search(rf"{me} answers again after", text):
                    fault.resumed_s = now
                back = re.search(rf"shard {index} \(pid (\d+)\) is back after restart (\d+)", text)
                if back and fault.back_s is None:
                    fault.back_s, fault.new_pid, fault.restart = now, int(back[1]), int(back[2])
                current = self.shards_by_index()
                if any(current.get(i) != p for i, p in others.items()):
                    break  # the others were restarted (or died) too: the runner fails it (pids_after)
                if fault.back_s is not None or (kind == "stop_cont" and fault.resumed_s is not None):
                    break
                if now > SHARD_FAULT_TIMEOUT_S:
                    fault.problems.append(f"shard {kind} of shard {index} (pid {pid}): not back within "
                                          f"{SHARD_FAULT_TIMEOUT_S:.0f} s:\n{tail(self.log_path, 30)}")
                    break
                time.sleep(0.05)
        finally:
            if kind != "kill":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        fault.pids_after = self.shards_by_index()
        if fault.back_s is not None:
            fault.outcome = "restarted alone" if fault.cont_s is None else "killed before the SIGCONT, restarted alone"
            if fault.pids_after.get(index) != fault.new_pid:
                fault.problems.append(f"shard {index} is back as pid {fault.new_pid}, but runs as {fault.pids_after.get(index)}")
        elif fault.resumed_s is not None:
            fault.outcome = "resumed"
            if fault.pids_after.get(index) != pid:
                fault.problems.append(f"shard {index} (pid {pid}) answers again, but runs as {fault.pids_after.get(index)}")
        if kind == "kill" and fault.back_s is not None and fault.death_logged_s is None:
            fault.problems.append(f"shard {index} (pid {pid}) was restarted, but its death was not logged")
        if kind == "stop" and fault.back_s is not None and (fault.silent_s is None or fault.killed_s is None):
            fault.problems.append(f"shard {index} (pid {pid}) was restarted after a SIGSTOP without being marked silent "
                                  f"and killed for its silence (silent: {fault.silent_s}, killed: {fault.killed_s})")
        return fault

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _group_members(pgids: list[int]) -> list[int]:
    """Live processes of the process groups `pgids` (zombies excluded), from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, group = fields[0], int(fields[2])
        if group in pgids and state != "Z":
            members.append(int(entry.name))
    return members


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            out += [int(x) for x in task.read_text().split()]
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _shard_index(pid: int) -> int | None:
    """A shard's index in its family, from the EVENTLOG_SHARD identity in its environment."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name == b"EVENTLOG_SHARD":
            with contextlib.suppress(ValueError, KeyError, TypeError):
                return int(json.loads(value)["index"])
    return None
