"""The server under test: `eventlog serve` as a subprocess on one data dir and one port for the
whole soak, SIGKILLed and started again.

With --processes N (N >= 2) the server is a supervisor and N shard processes; some cycles then
SIGKILL one shard instead of the supervisor, and the supervisor must bring a new family up.

The server runs in its own session (process group = its pid), so a Ctrl-C of the soak does not
reach it and its worker processes (the compactor's) can be found by group. After a SIGKILL only
the server itself is signalled, as when the OOM killer picks it; its workers must die with it
(PR_SET_PDEATHSIG). A worker still alive a few seconds later is reported, then killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from ..servers import free_port, tail

START_TIMEOUT_S = 180.0  # recovery of a busy data dir on a loaded 2-core machine
STOP_TIMEOUT_S = 60.0
ORPHAN_GRACE_S = 5.0

# Workers run often so that kills land in the middle of their passes; access logs are off
# because the soak makes thousands of requests a second and the log would only cost CPU.
SERVER_ENV = {
    "EVENTLOG_ACCESS_LOG": "false",
    "EVENTLOG_LOG_LEVEL": "warning",
    "EVENTLOG_RETENTION_CHECK_INTERVAL_MS": "2000",
    "EVENTLOG_CLEANER_BACKOFF_MS": "1000",
    "EVENTLOG_CHECKPOINT_INTERVAL_MS": "3000",
}


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
        """SIGKILL the server process (only it); return the pids of workers that outlived it."""
        assert self.process is not None
        pid = self.process.pid
        if self.process.poll() is None:
            os.kill(pid, signal.SIGKILL)
        self.process.wait()
        orphans = _group_members(pid)
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while orphans and time.monotonic() < deadline:
            time.sleep(0.05)
            orphans = _group_members(pid)
        if orphans:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
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

    def kill_shard(self, rng: Any) -> tuple[int, float]:
        """SIGKILL one shard (the supervisor stays); return (its index in the family, seconds
        until the supervisor's new family answered /readyz)."""
        before = sorted(self.shard_pids())
        if not before:
            raise RuntimeError("no shard processes to kill")
        index = rng.randrange(len(before))
        begin = time.monotonic()
        os.kill(before[index], signal.SIGKILL)
        deadline = begin + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"the supervisor exited ({self.process.returncode}) after a shard was killed:\n"
                                   f"{tail(self.log_path, 60)}")
            now = self.shard_pids()
            if len(now) == self.processes and not set(now) & set(before):
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                        return index, time.monotonic() - begin
            time.sleep(0.05)
        raise RuntimeError(f"the family did not come back within {START_TIMEOUT_S:.0f} s:\n{tail(self.log_path, 60)}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (zombies excluded), from /proc."""
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
        if group == pgid and state != "Z":
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
