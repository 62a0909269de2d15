"""`python -m bench.profile_server`: where the server's time goes on the hot HTTP paths (py-spy).

For each scenario, a fresh `eventlog serve` (default settings, as the HTTP benchmarks run it)
is loaded by wrk (C, one thread, so the client costs the server's two cores little) while
`py-spy record --idle --threads --native` samples the server process (blocking
samples: py-spy pauses the process briefly for each, so the server runs a little slower):

    json_produce  POST /v1/topics/j/records, 500 records of 100-byte values with keys, cycling
                  over 64 prepared bodies (32,000 distinct keys), 4 connections, topic of 4
                  partitions (http_produce's request)
    raw_produce   POST /v1/topics/r/partitions/0/records, the ~1 MiB v2 batch of http_raw
                  (1,013 records of 1 KiB), 4 connections
    raw_fetch     GET /v1/topics/f/partitions/0/records?offset=N&max_bytes=1048576 with
                  Accept: application/vnd.kafka.record-batch.v2, cycling through a walk of a
                  256 MiB partition of 16 KiB batches (warm page cache), 1 connection

Each sample is attributed to one category (`categorize`: a logging frame on the stack; else
what the native frames below the innermost Python frame do, NATIVE; else that frame's package,
PYTHON), separately for the event-loop thread and for the other threads (anyio's worker
threads, where the writer's file I/O and fdatasync run); shares are of the samples in which
the thread was not idle. INCLUSIVE lists functions whose inclusive share is reported too.
Writes bench/results/profile.json (shares per thread kind, the top innermost frames, the wrk
figures, the commands) and the raw collapsed stacks next to it (profile-<scenario>.txt.gz,
for flame graph tools such as inferno or speedscope); docs/PERFORMANCE.md summarises them.

Needs py-spy (the `bench` extra) and the permission to ptrace the server (root, or
kernel.yama.ptrace_scope = 0 for a child process).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .harness import git

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
RAW = "application/vnd.kafka.record-batch.v2"

_PY = re.compile(r"\((?P<path>[^()]*\.py):\d+\)$")
# syscalls and C code below the innermost Python frame: (category, pattern on a native frame)
NATIVE: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in [
        ("idle: waiting for events (epoll)", r"epoll_(p)?wait"),
        ("fdatasync / fsync", r"fdatasync|\bfsync"),
        ("file writes (pwritev)", r"pwritev|pwrite"),
        ("file reads (pread)", r"\bpread|preadv"),
        ("sendfile", r"sendfile"),
        ("socket write/send", r"^(__libc_)?write |^writev |\bsend(msg|to)? |uv__write|uv_try_write"),
        ("socket read/recv", r"^(__libc_)?read |\brecv|uv__read"),
        ("getpid syscall (asyncio.get_running_loop)", r"getpid"),
        ("thread hand-off (futex, semaphores)", r"futex|sem_post|sem_wait|sem_trywait|sem_timedwait|sem_clockwait|pthread_cond"),
        ("orjson (JSON parse/serialise)", r"orjson"),
        ("crc32c", r"crc32c"),
        ("httptools (llhttp parser)", r"httptools|llhttp"),
        ("memory copies (memcpy)", r"memcpy|memmove"),
        ("libc, symbol unresolved (memcpy of bodies, futex wake-ups)", r"^0x[0-9a-f]+ \(libc"),
    ]
]
# the innermost Python frame's file: (category, pattern on its path)
PYTHON: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in [
        ("produce service: JSON records parse, placement, batching, answer", r"^engine/(produce|slicing)\.py$"),
        ("encode_batch (records -> v2 batch)", r"^engine/records\.py$"),
        ("murmur2 key hash (partitioner)", r"^engine/partitioner\.py$"),
        ("engine: validation, append, index, read", r"^engine/"),
        ("eventlog api/ (JSON records parse, handlers)", r"^api/|^app/"),
        ("pydantic", r"^pydantic"),
        ("fastapi: dependencies, params, responses", r"^fastapi/"),
        ("starlette: routing, middleware, request/response", r"^starlette/"),
        ("uvicorn: HTTP protocol", r"^uvicorn/|^httptools/|^h11/"),
        ("anyio: to_thread hop, cancel scopes", r"^anyio/|^concurrent/|^sniffio/"),
        ("asyncio / uvloop event loop", r"^asyncio/|^uvloop/"),
        ("prometheus_client metrics", r"^prometheus_client/"),
        ("logging", r"^logging/"),
    ]
]
OTHER = "other (interpreter, GC, unresolved native frames)"
# CPython 3.11 waits for the GIL in take_gil() with pthread_cond_timedwait (locks and queues
# use semaphores): a thread there is runnable but another thread holds the interpreter
GIL = "waiting for the GIL (another thread holds it)"
_GIL = re.compile(r"pthread_cond_timedwait|take_gil")
_UNRESOLVED = re.compile(r"^0x[0-9a-f]+ \(libc")
# for an unresolved libc frame: (category, pattern on the innermost Python frame)
HINTS: list[tuple[str, re.Pattern[str]]] = [
    ("fdatasync / fsync", re.compile(r"^LogSegment\.flush \(engine/segment\.py|fsync")),
    ("file writes (pwritev)", re.compile(r"^(pwrite_all|LogSegment\.write_staged) \(engine/")),
    ("file reads (pread)", re.compile(r"^read_if_cached \(engine/|^FetchSlice\.read")),
    ("memory copies (memcpy)", re.compile(r"on_body \(uvicorn/|_read_body \(api/")),
]
_WAITING = re.compile(r"^(\w+\.)?(get|wait|_wait_for_tstate_lock) \((queue|threading)\.py:")
LOGGING = "access log (logging, incl. its write)"
# share of samples whose stack holds a frame containing each of these (inclusive time)
INCLUSIVE = (
    "RequestResponseCycle.run_asgi",
    "HttpToolsProtocol.data_received",
    "Router.__call__",
    "solve_dependencies",
    "serialize_response",
    "parse_records",
    "encode_batches",
    "encode_records",
    "_encode_native",
    "partition_for_key",
    "partitions_for_keys",
    "ProduceService._append_all",
    "_fast_produce",
    "_fast_fetch",
    "PartitionLog.append",
    "prepare_batches",
    "run_sync (anyio/to_thread.py",
    "PartitionLog._commit",
    "read_slice",
    "fetch_slice",
    "access",
    "logging/__init__.py",
)


def categorize(frames: list[str]) -> str:
    """The category of one sample (frames root first, as py-spy's collapsed format lists them):
    the access log if a logging frame is on the stack; else what the native frames below the
    innermost Python frame are doing (a syscall, orjson, crc32c, ...); else that Python frame's
    package."""
    if any("(logging/" in f for f in frames):
        return LOGGING
    innermost = len(frames)
    for i in range(len(frames) - 1, -1, -1):
        if _PY.search(frames[i]):
            innermost = i
            break
    if innermost < len(frames) and _WAITING.search(frames[innermost]):
        return "idle: worker thread waiting for work"
    below = frames[innermost + 1 :]
    if any(_GIL.search(f) for f in below):
        return GIL
    if below and _UNRESOLVED.search(below[-1]) and innermost < len(frames):
        # a libc symbol py-spy could not name: what the Python frame above it was calling
        for name, pattern in HINTS:
            if pattern.search(frames[innermost]):
                return name
    for name, pattern in NATIVE:
        if any(pattern.search(frame) for frame in below):
            return name
    if innermost < len(frames):
        path = _PY.search(frames[innermost]).group("path")
        for name, pattern in PYTHON:
            if pattern.search(path):
                return name
    return OTHER


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


class Server:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(directory / "server.log", "wb")  # noqa: SIM115 -- open while the server runs; stop() closes it
        exe = Path(sys.executable).with_name("eventlog")
        self.cmd = [str(exe), "serve", "--data-dir", str(directory / "data"), "--port", str(self.port)]
        env = {**os.environ, "EVENTLOG_PROCESSES": os.environ.get("EVENTLOG_PROCESSES", "1")}  # one process, profiled
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if _http("GET", self.url + "/readyz")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def _create(server: Server, name: str, partitions: int) -> None:
    status, _, body = _http(
        "POST", server.url + "/v1/topics", json.dumps({"name": name, "partitions": partitions}).encode(),
        {"content-type": "application/json"},
    )
    if status != 201:
        raise RuntimeError(f"create {name}: {status} {body[:300]!r}")


def _wrk_script(directory: Path, lines_file: Path, method: str, path_prefix: str, headers: dict[str, str]) -> Path:
    """A wrk script cycling through lines_file: request bodies (POST) or paths (GET)."""
    hdr = ", ".join(f'["{k}"] = "{v}"' for k, v in headers.items())
    script = directory / "load.lua"
    script.write_text(
        f"""
local items = {{}}
for line in io.lines("{lines_file}") do items[#items + 1] = line end
local i = 0
local headers = {{{hdr}}}
request = function()
  i = i % #items + 1
  if "{method}" == "POST" then
    return wrk.format("POST", "{path_prefix}", headers, items[i])
  end
  return wrk.format("GET", items[i], headers, nil)
end
response = function(status, headers, body)
  if status ~= 200 then io.write("status " .. status .. "\\n") end
end
"""
    )
    return script


def _wrk_script_file_body(directory: Path, body_file: Path, path: str, headers: dict[str, str]) -> Path:
    hdr = ", ".join(f'["{k}"] = "{v}"' for k, v in headers.items())
    script = directory / "load.lua"
    script.write_text(
        f"""
local f = io.open("{body_file}", "rb")
local body = f:read("*a")
f:close()
local headers = {{{hdr}}}
request = function() return wrk.format("POST", "{path}", headers, body) end
"""
    )
    return script


def _prepare(scenario: str, server: Server, work: Path) -> tuple[Path, int]:
    """Topics and data for a scenario; returns the wrk script and the connection count."""
    import random

    import orjson

    sys.path.insert(0, str(REPO))
    from engine.records import encode_batch

    if scenario == "json_produce":
        _create(server, "j", 4)
        rng = random.Random(1)
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        value = "".join(rng.choices(alphabet, k=100))
        bodies = work / "bodies.txt"
        with open(bodies, "wb") as f:
            for b in range(64):
                records = [{"key": f"key-{b * 500 + i:07d}", "value": value} for i in range(500)]
                f.write(orjson.dumps({"records": records}) + b"\n")
        return _wrk_script(work, bodies, "POST", "/v1/topics/j/records", {"Content-Type": "application/json"}), 4
    if scenario == "raw_produce":
        _create(server, "r", 1)
        pool = random.Random(2).randbytes(1024 + 4096)
        records = [(None, pool[(i * 61) % 4096 :][:1024], 1_700_000_000_000 + i, ()) for i in range(1013)]
        body = work / "batch.bin"
        body.write_bytes(bytes(encode_batch(0, records)))
        return _wrk_script_file_body(work, body, "/v1/topics/r/partitions/0/records", {"Content-Type": RAW}), 4
    if scenario == "raw_fetch":
        _create(server, "f", 1)
        pool = random.Random(3).randbytes(1024 + 4096)
        batches = []
        for n in range(64):
            records = [(None, pool[((n * 15 + i) * 61) % 4096 :][:1024], 1_700_000_000_000 + i, ()) for i in range(15)]
            batches.append(bytes(encode_batch(0, records)))
        chunk = b"".join(batches)
        total = 0
        while total < 256 * 2**20:
            status, _, text = _http("POST", server.url + "/v1/topics/f/partitions/0/records", chunk, {"Content-Type": RAW})
            if status != 200:
                raise RuntimeError(f"fill: {status} {text[:300]!r}")
            total += len(chunk)
        paths, offset = [], 0
        while True:
            path = f"/v1/topics/f/partitions/0/records?offset={offset}&max_bytes=1048576"
            status, headers, body = _http("GET", server.url + path, None, {"Accept": RAW})
            if status != 200 or not body:
                break
            paths.append(path)
            offset = int({k.lower(): v for k, v in headers.items()}["x-next-offset"])
        lines = work / "paths.txt"
        lines.write_text("\n".join(paths) + "\n")
        for segment in (server.directory / "data").rglob("*.log"):  # warm page cache
            with open(segment, "rb") as f:
                while f.read(1 << 20):
                    pass
        return _wrk_script(work, lines, "GET", "", {"Accept": RAW}), 1
    raise ValueError(scenario)


def _parse_collapsed(path: Path) -> list[tuple[str, list[str], int]]:
    """py-spy's raw format with --threads: 'thread (0x..);frame;frame count' per line."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        out.append((frames[0], frames[1:], int(count)))
    return out


def summarize(samples: list[tuple[str, list[str], int]]) -> dict[str, Any]:
    """Shares per category for the event-loop thread and for the other threads, and the
    innermost frames that took the most samples."""
    loop_thread = None
    by_thread = Counter()
    for thread, frames, count in samples:
        by_thread[thread] += count
        if any("uvicorn" in f or "asyncio/base_events.py" in f or "uvloop" in f for f in frames):
            loop_thread = loop_thread or thread
    kinds: dict[str, Counter] = defaultdict(Counter)
    leaves: dict[str, Counter] = defaultdict(Counter)
    inclusive: dict[str, Counter] = defaultdict(Counter)
    for thread, frames, count in samples:
        kind = "event loop thread" if thread == loop_thread else "other threads"
        category = categorize(frames)
        kinds[kind][category] += count
        if category.startswith("idle"):
            continue
        leaf = frames[-1] if frames else "?"
        leaves[kind][re.sub(r":\d+\)$", ")", leaf)] += count
        for name in INCLUSIVE:
            if any(name in f for f in frames):
                inclusive[kind][name] += count
    out: dict[str, Any] = {"threads": len(by_thread)}
    for kind, counter in kinds.items():
        total = sum(counter.values())
        busy = total - sum(v for k, v in counter.items() if k.startswith("idle"))
        out[kind] = {
            "samples": total,
            "busy_share": round(busy / total, 3) if total else 0.0,
            "share_of_samples": {k: round(v / total, 4) for k, v in counter.most_common()},
            "share_of_busy": {
                k: round(v / busy, 4) for k, v in counter.most_common() if not k.startswith("idle") and busy
            },
            "top_innermost_frames_of_busy": [
                {"frame": frame, "share": round(v / busy, 4)} for frame, v in leaves[kind].most_common(15)
            ] if busy else [],
            "inclusive_share_of_busy": {
                k: round(inclusive[kind][k] / busy, 4) for k in INCLUSIVE if busy and inclusive[kind][k]
            },
        }
    return out


def run_scenario(scenario: str, seconds: int, rate: int, out_dir: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"profile-{scenario}-", dir=REPO / "bench" / "work"))
    server = Server(work)
    try:
        script, connections = _prepare(scenario, server, work)
        wrk_cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds + 6}s", "--timeout", "60s", "-s", str(script), server.url]
        wrk = subprocess.Popen(wrk_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(3)  # warm up
        raw = out_dir / f"profile-{scenario}.txt"
        spy_cmd = [
            str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(server.proc.pid), "--duration",
            str(seconds), "--rate", str(rate), "--idle", "--threads", "--native", "--format", "raw",
            "-o", str(raw),
        ]
        spy = subprocess.run(spy_cmd, capture_output=True, text=True, check=False)
        wrk_out, _ = wrk.communicate(timeout=seconds + 60)
        if spy.returncode != 0:
            raise RuntimeError(f"py-spy failed: {spy.stderr[-2000:]}")
        summary = summarize(_parse_collapsed(raw))
        with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        summary.update(
            scenario=scenario,
            wrk_command=shlex.join(wrk_cmd),
            py_spy_command=shlex.join(spy_cmd),
            server_command=shlex.join(server.cmd),
            wrk_output=wrk_out[-1500:],
            connections=connections,
        )
        return summary
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_server", description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="json_produce,raw_produce,raw_fetch")
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=RESULTS / "profile.json")
    args = parser.parse_args(argv)
    (REPO / "bench" / "work").mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "command": shlex.join([Path(sys.executable).name, "-m", "bench.profile_server", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "head_commit": git("rev-parse", "HEAD"),
        "tree_dirty": bool(git("status", "--porcelain", "--", "engine", "api", "app")),
        "scenarios": {},
    }
    for scenario in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
        print(f"profiling {scenario} ...", file=sys.stderr, flush=True)
        report["scenarios"][scenario] = run_scenario(scenario, args.seconds, args.rate, args.out.parent)
        s = report["scenarios"][scenario]
        loop = s.get("event loop thread", {})
        print(f"  event loop busy {loop.get('busy_share')}: {json.dumps(loop.get('share_of_busy'))[:600]}", file=sys.stderr)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"-> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
