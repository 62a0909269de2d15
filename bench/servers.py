"""The servers and load tools the HTTP benchmarks start: eventlog, redis-server, nats-server,
wrk, redis-benchmark; and what the three HTTP benchmarks share (clients, CPU accounting).

Every server runs as a subprocess of the benchmark on 127.0.0.1, on a free port, with its data
in a scratch directory under the work dir (the filesystem being measured), and is stopped with
SIGTERM at the end (SIGKILL only if it does not exit within a minute). Its stdout and stderr go
to a file in the scratch dir (eventlog logs one access line per request at the default level),
whose tail is shown if it fails.

* eventlog: the real `eventlog serve --data-dir DIR --port P` (the console script of this venv),
  default settings and topic configs: flush.messages=1, so a produce is acknowledged once it is
  fdatasync'ed. With --engine-ref the extracted engine/ goes first on its PYTHONPATH; api/ and
  app/ always come from the working tree (their git state is recorded with the results).
* redis-server (Debian) with `appendonly yes`, `appendfsync everysec` (an acknowledged write is
  in the page cache; fsynced within about a second), no RDB snapshots, everything else default.
* nats-server -js (Debian) with file storage in the scratch dir, defaults otherwise (nats-server
  2.9 writes each message to its block file before the ack and fsyncs on its own schedule, not
  per message).

The Python clients run on one event loop in the benchmark process (uvloop when importable, for
all clients alike): httpx.AsyncClient with HTTP/1.1 keep-alive for eventlog, redis.asyncio for
Redis, nats-py for NATS. CPU time is accounted per process (/proc/PID/stat: all threads), so
each result says how much CPU the server and the client spent per record.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness import REPO, Context, git, package_versions

CLK_TCK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


# -- tools --------------------------------------------------------------------------------------


def which(name: str) -> str | None:
    """A Debian binary: PATH, then the sbin directories (nats-server lives in /usr/sbin)."""
    return shutil.which(name) or next(
        (
            str(p)
            for d in ("/usr/sbin", "/usr/local/sbin", "/sbin")
            if (p := Path(d) / name).exists()
        ),
        None,
    )


def require(name: str, package: str) -> str:
    path = which(name)
    if path is None:
        raise RuntimeError(f"{name} not found: apt-get install -y {package}")
    return path


def tool_version(*cmd: str) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[0] if text else None


def _negative_cache_sniffio() -> bool:
    """httpcore 1.0 does `import sniffio` up to four times per request to learn the async
    library; anyio >= 4 no longer installs sniffio, and a failed import is not cached, so each
    one searches sys.path again (about a quarter of httpx's client CPU per small request here).
    A None entry in sys.modules makes the import fail at once, which httpcore reads as
    "asyncio": what it would conclude anyway. Returns True when applied."""
    import importlib.util

    if "sniffio" in sys.modules or importlib.util.find_spec("sniffio") is not None:
        return False
    sys.modules["sniffio"] = None  # type: ignore[assignment]
    return True


SNIFFIO_NEGATIVE_CACHED = _negative_cache_sniffio()


def client_facts() -> dict[str, Any]:
    """Versions of the client libraries, and which event loop and Redis parser they use."""
    try:
        import hiredis  # noqa: F401

        parser = "hiredis"
    except ImportError:
        parser = "pure Python (redis-py's own; hiredis not installed)"
    return {
        "event_loop": "uvloop" if use_uvloop() else "asyncio",
        "redis_py_parser": parser,
        "httpx_sniffio": (
            "sniffio not installed: negative-cached in sys.modules (see servers._negative_cache_sniffio)"
            if SNIFFIO_NEGATIVE_CACHED
            else "sniffio installed"
        ),
        "packages": package_versions(
            "httpx",
            "httpcore",
            "anyio",
            "sniffio",
            "redis",
            "hiredis",
            "nats-py",
            "orjson",
            "uvloop",
        ),
    }


def use_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run_async(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """anyio.run on asyncio (redis.asyncio and nats-py need it), with uvloop when importable."""
    import anyio

    return anyio.run(fn, *args, backend="asyncio", backend_options={"use_uvloop": use_uvloop()})


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}:\n{tail(log)}")
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", port), timeout=0.5),
        ):
            return
        time.sleep(0.05)
    raise RuntimeError(
        f"{process.args[0]} did not listen on port {port} within {timeout:.0f} s:\n{tail(log)}"
    )


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- CPU accounting -----------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads, from /proc/PID/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def own_cpu_seconds() -> float:
    """This process's CPU time (the Python clients)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_seconds() -> float:
    """CPU time of waited-for children (wrk, redis-benchmark, redis-cli, dd)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class CpuMeter:
    """CPU seconds spent by a server process, this process (the Python clients) and the
    waited-for children (C load tools) between start() and stop()."""

    server_pid: int
    marks: dict[str, float] = field(default_factory=dict)

    def start(self) -> CpuMeter:
        self.marks = {
            "server": process_cpu_seconds(self.server_pid),
            "client": own_cpu_seconds(),
            "tools": children_cpu_seconds(),
            "wall": time.perf_counter(),
        }
        return self

    def stop(self, records: int | None = None) -> dict[str, float]:
        wall = time.perf_counter() - self.marks["wall"]
        server = process_cpu_seconds(self.server_pid) - self.marks["server"]
        client = own_cpu_seconds() - self.marks["client"]
        tools = children_cpu_seconds() - self.marks["tools"]
        out = {
            "server_cpu_s": round(server, 3),
            "python_client_cpu_s": round(client, 3),
            "tool_cpu_s": round(tools, 3),
            "server_cpu_share": round(server / wall, 3) if wall > 0 else None,
        }
        if records:
            out["server_cpu_us_per_record"] = round(server / records * 1e6, 3)
        return out


# -- servers ------------------------------------------------------------------------------------


class Server:
    """A server subprocess: started by a subclass, stopped with SIGTERM."""

    name = "server"

    def __init__(
        self, cmd: list[str], directory: Path, port: int, env: dict[str, str] | None = None
    ):
        self.cmd = cmd
        self.directory = directory
        self.port = port
        self.log_path = directory / f"{self.name}.out"
        self.env = env
        self.process: subprocess.Popen | None = None
        self.exit_status: int | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as out:
            self.process = subprocess.Popen(
                self.cmd,
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a Ctrl-C of the benchmark does not reach it first
            )
        wait_for_port(self.port, self.process, self.log_path, START_TIMEOUT_S)
        self.ready()

    def ready(self) -> None:
        """Wait until the server serves (after it listens)."""

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            self.exit_status = None if self.process is None else self.process.returncode
            return self.exit_status
        self.process.send_signal(signal.SIGTERM)
        try:
            self.exit_status = self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.exit_status = self.process.wait()
        return self.exit_status

    def facts(self) -> dict[str, Any]:
        return {"command": shlex.join(self.cmd), "port": self.port, "exit_status": self.exit_status}

    def check_alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"{self.name} is not running:\n{tail(self.log_path)}")


class EventlogServer(Server):
    name = "eventlog"

    def __init__(self, ctx: Context, directory: Path):
        script = Path(sys.executable).with_name("eventlog")
        base = [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]
        port = free_port()
        cmd = [*base, "serve", "--data-dir", str(directory / "data"), "--port", str(port)]
        env = dict(os.environ)
        # the benchmarks measure one process unless told otherwise (bench.http_shards and the
        # capacity run pass --processes themselves)
        env.setdefault("EVENTLOG_PROCESSES", "1")
        # no Kafka listener unless a benchmark asks for one (bench.kafka_small.KafkaServer): on
        # its default port 9092 a second server started beside the first could not bind
        env["EVENTLOG_KAFKA_PORT"] = "0"
        extracted = ctx.engine_source.get("extracted_to")
        if extracted:  # --engine-ref: the server imports that engine/
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [extracted, env.get("PYTHONPATH")]))
        super().__init__(cmd, directory, port, env)
        self.data_dir = directory / "data"
        self.url = f"http://127.0.0.1:{port}"

    def ready(self) -> None:
        import httpx

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(
            f"eventlog not ready within {START_TIMEOUT_S:.0f} s:\n{tail(self.log_path)}"
        )

    def facts(self) -> dict[str, Any]:
        return {**super().facts(), **server_source()}


class RedisServer(Server):
    name = "redis"

    def __init__(self, directory: Path):
        binary = require("redis-server", "redis-server")
        port = free_port()
        cmd = [
            binary,
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--dir", str(directory),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--protected-mode", "no",
            "--daemonize", "no",
        ]  # fmt: skip
        super().__init__(cmd, directory, port)

    def ready(self) -> None:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(
                redis.exceptions.BusyLoadingError, redis.exceptions.ConnectionError
            ):
                if client.ping():
                    client.close()
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server not ready:\n{tail(self.log_path)}")

    def info(self, section: str = "persistence") -> dict[str, Any]:
        import redis

        with contextlib.closing(redis.Redis(host="127.0.0.1", port=self.port)) as client:
            return client.info(section)

    def facts(self) -> dict[str, Any]:
        return {**super().facts(), "version": tool_version(self.cmd[0], "--version")}


class NatsServer(Server):
    name = "nats"

    def __init__(self, directory: Path):
        binary = require("nats-server", "nats-server")
        port = free_port()
        store = directory / "jetstream"
        cmd = [binary, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)]
        super().__init__(cmd, directory, port)
        self.url = f"nats://127.0.0.1:{port}"

    def facts(self) -> dict[str, Any]:
        return {**super().facts(), "version": tool_version(self.cmd[0], "--version")}


@contextlib.contextmanager
def running(*servers: Server) -> Iterator[tuple[Server, ...]]:
    """Start every server (in order), yield them, stop them all (in reverse order)."""
    started: list[Server] = []
    try:
        for server in servers:
            server.start()
            started.append(server)
        yield servers
    finally:
        for server in reversed(started):
            server.stop()


def server_source() -> dict[str, Any]:
    """What code the eventlog server runs: HEAD and whether engine/, api/ or app/ differ from it
    (other people edit api/ while benchmarks run; a dirty flag says the numbers are of the
    working tree, not of HEAD)."""
    out: dict[str, Any] = {"head_commit": git("rev-parse", "HEAD")}
    for part in ("engine", "api", "app"):
        dirty = git("status", "--porcelain", "--", part)
        out[f"{part}_dirty"] = bool(dirty) if dirty is not None else None
    out["repo"] = str(REPO)
    return out


# -- HTTP helpers -------------------------------------------------------------------------------


def http_client(base_url: str, connections: int) -> Any:
    """An httpx.AsyncClient with `connections` keep-alive connections and generous timeouts."""
    import httpx

    return httpx.AsyncClient(
        base_url=base_url,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        timeout=httpx.Timeout(120.0),
    )


async def create_topic(
    client: Any, name: str, partitions: int, configs: dict[str, Any] | None = None
) -> None:
    response = await client.post(
        "/v1/topics", json={"name": name, "partitions": partitions, "configs": configs or {}}
    )
    if response.status_code != 201:
        raise RuntimeError(f"create topic {name}: {response.status_code} {response.text}")


async def delete_topic(client: Any, name: str) -> None:
    response = await client.delete(f"/v1/topics/{name}")
    if response.status_code != 204:
        raise RuntimeError(f"delete topic {name}: {response.status_code} {response.text}")


class RawHttpClient:
    """A minimal HTTP/1.1 keep-alive client on one asyncio stream: GET only, responses with a
    Content-Length (all of eventlog's but streams). About the per-request cost of redis-py, so a
    latency comparison with Redis is not one of client libraries (httpx spends ~0.5 ms of CPU per
    request here)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._reader: Any = None
        self._writer: Any = None

    async def connect(self) -> RawHttpClient:
        import asyncio

        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def get(self, path: str, accept: str | None = None) -> tuple[int, bytes]:
        head = f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if accept:
            head += f"Accept: {accept}\r\n"
        self._writer.write(head.encode() + b"\r\n")
        response = await self._reader.readuntil(b"\r\n\r\n")
        status = int(response[9:12])
        length = None
        for line in response.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
                break
        if length is None:
            raise RuntimeError(f"GET {path}: no Content-Length in {response!r}")
        return status, await self._reader.readexactly(length)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()


def wrk_version() -> str | None:
    binary = which("wrk")
    if binary is None:
        return None
    # wrk prints its banner on stderr and exits 1 when given no URL
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0] if text else None


WRK_DONE_LUA = """
done = function(summary, latency, requests)
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "bytes": %d, "errors_status": %d, "errors_connect": %d, '
    .. '"errors_read": %d, "errors_write": %d, "errors_timeout": %d, "p50_us": %d, "p90_us": %d, '
    .. '"p99_us": %d, "p999_us": %d, "max_us": %d, "mean_us": %.1f}\\n',
    summary.requests, summary.duration, summary.bytes, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.timeout, latency:percentile(50),
    latency:percentile(90), latency:percentile(99), latency:percentile(99.9), latency.max, latency.mean))
end
"""


def run_wrk(
    script: Path, url: str, connections: int, seconds: int, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """wrk -t1 -cN -dSs with a Lua script whose done() prints one JSON line (WRK_DONE_LUA)."""
    import json

    binary = require("wrk", "wrk")
    cmd = [
        binary,
        "-t1",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        "60s",
        "-s",
        str(script),
        url,
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=True
    )
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{done.stdout}\n{done.stderr}")
    result = json.loads(line)
    result["command"] = shlex.join(cmd)
    errors = sum(v for k, v in result.items() if k.startswith("errors_"))
    if errors:
        raise RuntimeError(f"wrk saw {errors} errors (non-2xx or socket errors): {result}")
    return result


_COUNTERS = (
    "eventlog_fsync_seconds_count",
    "eventlog_fsync_seconds_sum",
    "eventlog_group_commit_requests_sum",
    "eventlog_group_commit_records_sum",
)


async def eventlog_counters(client: Any) -> dict[str, float]:
    """Group commits and fsyncs so far, from GET /metrics (Prometheus text)."""
    response = await client.get("/metrics")
    out = dict.fromkeys(_COUNTERS, 0.0)
    for line in response.text.splitlines():
        name, _, value = line.partition(" ")
        if name in out:
            out[name] = float(value)
    return out


def commit_stats(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """What the group commits of a run did: fsyncs, mean fdatasync time, appends per commit."""
    d = {k: after[k] - before[k] for k in before}
    fsyncs = d["eventlog_fsync_seconds_count"]
    return {
        "fsyncs": int(fsyncs),
        "mean_fsync_ms": round(d["eventlog_fsync_seconds_sum"] / fsyncs * 1000, 3)
        if fsyncs
        else None,
        "appends_per_commit": round(d["eventlog_group_commit_requests_sum"] / fsyncs, 2)
        if fsyncs
        else None,
        "records_per_commit": round(d["eventlog_group_commit_records_sum"] / fsyncs, 1)
        if fsyncs
        else None,
    }
