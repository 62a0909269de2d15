"""Shared fixtures: a clean environment, the service in this process or in a real server, small
real filesystems.

Which server: `app_server` / `app_factory` (tests/inprocess.py) run the very app `eventlog
serve` runs, lifespan and engine included, in this process: a tenth of a second to start. Use
`server` / `server_factory` (`eventlog serve` in a subprocess, on a free port) where the process
or the socket matters: kills and signals, slow clients, head timeouts, TLS, keep-alive, uvicorn's
limits, the CLI, curl, EVENTLOG_CRASH_AT / EVENTLOG_FAULTS_FILE (read at import).
`any_server_factory` runs a test with both. They share an interface: factory(data_dir=None,
**EVENTLOG_settings), then start(), client(token=None), url, data_dir, stop(), log().
"""

from __future__ import annotations

import asyncio
import inspect
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from app.loopwatch import BLOCKED as LOOP_BLOCKED

from .inprocess import InProcessServer

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# EVENTLOG_TEST_PROCESSES=N: every ServerProcess that names no `processes` runs
# `eventlog serve --processes N` (the suite at N = 1 and N = 2); unset: --processes 1.
# Read at import: _clean_env removes EVENTLOG_* from each test's environment.
TEST_PROCESSES: int | None = int(os.environ["EVENTLOG_TEST_PROCESSES"]) if os.environ.get("EVENTLOG_TEST_PROCESSES") else None


# The Kafka listener's default port (9092) is one port for the whole machine: servers that
# tests start have no Kafka listener unless a test asks for one on ports of its own
# (tests/broker/). Set at import, for session fixtures too.
KAFKA_OFF = {"EVENTLOG_KAFKA_PORT": "0"}
# Every server a test starts watches its event loop (app/loopwatch.py) and logs a wake-up this
# late; ServerProcess.stop() fails the test that saw such a line (issue 24: nothing may block
# the loop). Generous: a 2-core CI machine under the suite's load deschedules processes too.
LOOP_WATCH = {"EVENTLOG_LOOP_BLOCK_WARN_MS": "1500"}
KEPT_ENV = {**KAFKA_OFF, **LOOP_WATCH}
os.environ.update(KEPT_ENV)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No EVENTLOG_* setting from the developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("EVENTLOG_") and name not in KEPT_ENV:
            monkeypatch.delenv(name)
    for name, value in KEPT_ENV.items():
        monkeypatch.setenv(name, value)


# The in-process check: every callback of an asyncio loop in this process is timed; one that
# runs longer than SLOW_CALLBACK_S fails the async test that ran it (the engine, the workers and
# the app on the test's own loop), naming it (asyncio's debug mode does the same, at a far higher
# cost per callback). Sync tests are not judged: Playwright's sync API parks its loop in a
# callback while the test runs, and an app in process runs on uvloop (its own watch logs a block,
# app/loopwatch.py, as a server's does).
SLOW_CALLBACK_S = 1.0
_slow_callbacks: list[tuple[float, str]] = []
_handle_run = asyncio.events.Handle._run


def _timed_run(self: asyncio.events.Handle) -> None:
    started = time.perf_counter()
    try:
        _handle_run(self)
    finally:
        took = time.perf_counter() - started
        if took > SLOW_CALLBACK_S:
            _slow_callbacks.append((took, repr(self)[:300]))


asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _loop_not_blocked(request: pytest.FixtureRequest):
    """Fails a test during which an event loop callback in this process ran too long."""
    _slow_callbacks.clear()
    yield
    function = getattr(request.node, "function", None)
    if not inspect.iscoroutinefunction(function):
        _slow_callbacks.clear()
        return
    if _slow_callbacks and not request.node.get_closest_marker("blocks_loop"):
        worst = sorted(_slow_callbacks, reverse=True)[:3]
        _slow_callbacks.clear()
        blocked = "; ".join(f"{t:.2f} s by {h}" for t, h in worst)
        pytest.fail(f"the event loop was blocked: {blocked}")


def wait_until(condition, timeout: float = 30.0, what: str = "the condition", interval: float = 0.01):
    """Poll `condition()` until it returns something true (returned), failing the test after
    `timeout` seconds. For states nothing signals (a request parked in a long-poll, a line in a
    server's log); the pause between polls only spares the CPU, and `timeout` is a liveness
    bound, many times what the state normally takes."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout} s")
        time.sleep(interval)


@dataclass
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


def run_eventlog(*args: str, env: dict[str, str] | None = None) -> CommandResult:
    """The eventlog command run in this process (typer's CliRunner, on top of this process's
    environment): for what the command does before it serves, such as refusing bad settings
    (a `serve` that gets as far as serving fails the test). Anything that serves, or needs the
    installed script or a process, runs VENV_BIN/eventlog."""
    from typer.testing import CliRunner

    from app import cli
    from app.server import Server  # imported by `serve` only when it runs: patched here

    def serving(_server: object) -> None:
        raise AssertionError("eventlog serve got as far as serving")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Server, "run", serving)
        result = CliRunner().invoke(cli.cli, list(args), env=env, catch_exceptions=False)
    return CommandResult(result.exit_code, result.stdout, result.stderr)


# make test runs the suite in worker processes (pytest-xdist): each takes its ports from a
# range of its own below the kernel's ephemeral range (32768-60999), so no worker's server is
# handed a port another worker just probed, nor one a client's connection holds. Alone (no
# worker), the kernel picks.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
PORT_RANGE = 3000
_next_port = [0]


def free_port(count: int = 1) -> int:
    """A port free on 127.0.0.1, the first of `count` in a row (a family's Kafka listeners
    take base + shard index)."""
    if not XDIST_WORKER.startswith("gw"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    low = 12000 + int(XDIST_WORKER[2:]) % 6 * PORT_RANGE
    for _ in range(PORT_RANGE):
        # round robin from where the last one left off (a port a server just closed lingers),
        # past the whole run handed out, so the next call never gives one of it
        base = low + _next_port[0] % (PORT_RANGE - count)
        _next_port[0] += count
        if _all_free(range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} free ports in a row in {low}..{low + PORT_RANGE - 1}")


def _all_free(ports: range) -> bool:
    held = []
    try:
        for port in ports:
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in held:
            s.close()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The groups `--dist loadgroup` keeps on one worker: a test file's tests (its module
    fixtures start once), and tests/analytics/ whole (one Spark session)."""
    tests = Path(__file__).resolve().parent
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        path = item.path.relative_to(tests)
        group = "analytics" if path.parts[0] == "analytics" else path.as_posix()
        item.add_marker(pytest.mark.xdist_group(group))


@dataclass
class ServerProcess:
    """`eventlog serve` in a subprocess, on a free port."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    # RLIMIT_NOFILE (soft and hard) of the server process; None: inherited
    open_files_limit: int | None = None
    # where the server's log goes; None: next to the data dir (not on a small filesystem!)
    log_dir: Path | None = None
    # --processes N; None: EVENTLOG_TEST_PROCESSES, else 1 (unless env names EVENTLOG_PROCESSES)
    processes: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0, token: str | None = None) -> "ServerProcess":
        """Start and wait for /readyz (asked with `token` when the server has an auth file);
        a shard family also for its supervisor's "ready:" line (every shard serving)."""
        self.log_path = (self.log_dir or self.data_dir.parent) / f"server-{self.port}.log"
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**os.environ, **self.env}
        self._log = open(self.log_path, "ab")
        limit = self.open_files_limit
        processes = self.processes if self.processes is not None else TEST_PROCESSES
        if processes is None and "EVENTLOG_PROCESSES" not in self.env:
            # one process where the test names no shape: `eventlog serve` alone runs one shard
            # per core (app/cli.py: SHARDS_BY_DEFAULT), three interpreters to start on this
            # 2-core machine; the family shape is the third pass's (EVENTLOG_TEST_PROCESSES=2)
            processes = 1
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "eventlog"), "serve", "--data-dir", str(self.data_dir), "--port", str(self.port),
             *(["--processes", str(processes)] if processes is not None else [])],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=None if limit is None else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)),
        )
        deadline = time.monotonic() + timeout
        shape = processes if processes is not None else int(self.env.get("EVENTLOG_PROCESSES", "1"))
        family = shape > 1
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.close()
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                headers = {"authorization": f"Bearer {token}"} if token else {}
                answered = httpx.get(f"{self.url}/readyz", headers=headers, timeout=1).status_code == 200
                if answered and (not family or b" eventlog.supervisor: ready: " in self._log_since_start()):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server did not become ready:\n{self.log()}")

    def _log_since_start(self) -> bytes:
        assert self.log_path is not None
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            return f.read()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self._log.close()
        blocked = [line for line in self.log().splitlines() if LOOP_BLOCKED in line]
        assert not blocked or self.env.get("EVENTLOG_LOOP_BLOCK_WARN_MS") == "0", (
            "the server's event loop was blocked (app/loopwatch.py):\n" + "\n".join(blocked[:5])
        )
        return code

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)

    def shard_pids(self) -> list[int]:
        """The pids of the server's shard processes (the children of `eventlog serve` when it
        supervises a family), lowest first; [] for a single process or once it has exited."""
        assert self.proc is not None
        return child_pids(self.proc.pid)

    def client(self, token: str | None = None) -> httpx.Client:
        """A client of this server; with `token`, it sends it as a bearer token."""
        return httpx.Client(base_url=self.url, headers=_bearer(token), timeout=30)


def child_pids(pid: int) -> list[int]:
    """The live children of process `pid`, from /proc (every process's parent pid: the kernel
    here may lack /proc/<pid>/task/<tid>/children); [] once it is gone."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(stat.parent.name))
    return sorted(children)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _bearer(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator:
    started: list[ServerProcess] = []

    def make(data_dir: Path | None = None, **env: str) -> ServerProcess:
        # the log beside the test's files, never on a small filesystem a test fills and measures
        server = ServerProcess(data_dir or tmp_path / "data", env=env, log_dir=tmp_path)
        started.append(server)
        return server

    yield make
    for server in started:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


@pytest.fixture
def server(server_factory) -> Iterator[ServerProcess]:
    s = server_factory().start()
    yield s
    s.stop()


# -- the service in this process ---------------------------------------------------------------


@pytest.fixture
def app_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator:
    """app_factory(data_dir=None, **EVENTLOG_settings) -> InProcessServer, not started; the
    same arguments as server_factory. Whatever is still running at the end is stopped.

    With EVENTLOG_TEST_PROCESSES=N (N >= 2) it makes `eventlog serve --processes N` instead, so
    the API tests written against the service in this process run against a shard family
    (tests that need this process's app say so with @pytest.mark.in_process_only)."""
    if TEST_PROCESSES is not None and TEST_PROCESSES > 1:
        if request.node.get_closest_marker("in_process_only") is not None:
            pytest.skip(f"looks inside the app in this process; EVENTLOG_TEST_PROCESSES={TEST_PROCESSES} runs a shard family")
        yield request.getfixturevalue("server_factory")  # ServerProcess, at TEST_PROCESSES
        return
    started: list[InProcessServer] = []

    def make(data_dir: Path | None = None, **env: str) -> InProcessServer:
        server = InProcessServer(data_dir or tmp_path / "data", env=env)
        started.append(server)
        return server

    yield make
    for server in started:
        if server.running:
            server.stop()


@pytest.fixture
def app_server(app_factory) -> Iterator[InProcessServer]:
    """The service in this process, started on tmp_path/"data"."""
    s = app_factory().start()
    yield s
    s.stop()


@pytest.fixture(params=["in-process", "subprocess"])
def any_server_factory(request: pytest.FixtureRequest, app_factory, server_factory):
    """Runs the test twice: with app_factory, then with server_factory (for the tests where
    the HTTP server's own handling of a request matters as much as the app's)."""
    return app_factory if request.param == "in-process" else server_factory


# -- small real filesystems (a full disk) ------------------------------------------------------


@dataclass
class SmallFs:
    """A tmpfs of a fixed size, mounted by the test (root only)."""

    path: Path
    size_bytes: int

    def fill(self, leave_bytes: int = 0) -> Path:
        """Take every free byte but `leave_bytes` with a filler file; returns its path."""
        filler = self.path / "filler"
        st = os.statvfs(self.path)
        free = st.f_bavail * st.f_frsize
        with open(filler, "ab") as f:
            chunk = b"\0" * (1 << 20)
            remaining = max(free - leave_bytes, 0)
            while remaining > 0:
                try:
                    remaining -= f.write(chunk[: min(len(chunk), remaining)])
                    f.flush()
                except OSError:
                    break
        return filler

    def free(self) -> None:
        """Give the filler's space back."""
        (self.path / "filler").unlink(missing_ok=True)

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


def _can_mount() -> str | None:
    """None when this process may mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "mounting a small filesystem needs root (CI runs as root)"
    return None


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator:
    """small_fs(size_bytes) -> SmallFs: a real tmpfs of that size under tmp_path, unmounted
    afterwards. Skips with a clear reason where this process cannot mount."""
    reason = _can_mount()
    if reason is not None:
        pytest.skip(reason)
    mounted: list[Path] = []

    def make(size_bytes: int) -> SmallFs:
        path = tmp_path / f"smallfs-{len(mounted)}"
        path.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(path)],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(path)
        return SmallFs(path, size_bytes)

    yield make
    for path in reversed(mounted):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
