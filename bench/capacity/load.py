"""Capacity of one machine: `eventlog serve --processes N` for N in a list, loaded from other
cores by wrk and by Python client processes, next to Redis Streams fed the same records and to
dd; one JSON line per measurement.

usage (from the repository root; run.sh sets the environment up):
    python bench/capacity/load.py --work DIR --out FILE.jsonl [--processes 1,2,4,8,16]
        [--cell-seconds 10] [--client-cpus K] [--no-peers]
        [--only json,python,raw,fetch,small,fanout,kafka,consume]

Standard library only, plus the project itself on sys.path (for the ~1 MiB Kafka batch, encoded
with bench.data as the append and http_raw benchmarks do) and redis-py for the Python Redis
clients (skipped, with the reason recorded, when it is missing), and confluent-kafka for the
Kafka cells (bench/kafka_clients.py; skipped likewise). wrk, redis-server, redis-benchmark and
kcat come from PATH.

Cores. With 4 CPUs or more, the last K CPUs (--client-cpus, default a quarter, at least 2) run
the load generators and the rest run the server under test (its supervisor and shards, or
redis-server): servers and C tools start under `taskset -c`, Python client processes call
sched_setaffinity, so clients never take the server's cores. With fewer CPUs nothing is pinned (the
development machine: clients and server share its 2 CPUs, and the record says so). N is capped
at the CPU count.

Cells, for every N (each server on a fresh data dir, stopped with SIGTERM afterwards; each cell
on a fresh topic, deleted afterwards):
* json-wrk: POST /v1/topics/{t}/records, one fixed body of 500 records with 100-byte values,
  from wrk (threads = min(connections, client CPUs)) at 4, 16 and 64 connections, on a 4- and
  a 16-partition topic; after the cell the high watermarks must hold every acknowledged record;
* json-python: 4 and 12 client processes, each on one keep-alive http.client connection,
  cycling through 64 pre-built bodies of 500 records with keys of their own;
* raw-produce: the ~1 MiB batch (1,013 records of 1 KiB) POSTed as
  application/vnd.kafka.record-batch.v2 by wrk, cycling over 16 partitions, 4 and 16 connections;
* raw-fetch: GET .../records?offset=0&max_bytes=1048576 with Accept record-batch.v2 by wrk,
  cycling over 16 partitions that hold 8 such batches each (warm page cache), 16 and 64
  connections;
* small-wrk: one-record POSTs (a 256-byte value) to a random partition of 100, from wrk at 100
  and 400 connections; the high watermarks must hold every acknowledged record;
* fanout-sse: 1,000 SSE subscribers of one partition (bench/fanout/subscribers.c: prepare.sh
  builds it into .device/, else gcc here), a one-record produce every 10 ms: delivery latency,
  exactly once in order, server memory per subscriber;
* kafka-produce (issue 25, the cells of bench/kafka_small.py): 256 B records to a 100-partition
  topic over the Kafka listener (EVENTLOG_KAFKA_PORT; broker i on port + i) from 2 and 4
  confluent-kafka producer processes (acks=all, linger.ms=5, idempotent) pinned to the client
  CPUs; the high watermarks must hold every acknowledged record;
* kafka-consume (issue 25, bench/kafka_consume.py's): 1 GB of 16 KiB batches of 1 KiB records
  in 16 partitions, filled over HTTP, read from the beginning by kcat (when it runs here) and
  by a confluent-kafka consumer process, both on the client CPUs, against `cat` of the segment
  files to /dev/null in the same cell (warm page cache).
Peers (unless --no-peers): redis-server (appendonly yes, appendfsync everysec, then always; no
RDB), pinned like the server, fed by `redis-benchmark -P 500 XADD mystream * field <100 B>` at
4, 16 and 64 connections (the stream's length is checked) and by 4 and 12 redis-py processes
pipelining 500 XADDs (key and value fields) per round trip; `redis-benchmark -r 100 XADD
stream:__rand_int__ * f <256 B>` at 100 and 400 connections without pipelining (small), and with
-P 16 at 100 connections against AOF always (kafka: issue 25's peer); the same
subscribers SUBSCRIBEd to Redis pub/sub with a PUBLISH every 10 ms (fanout, once); dd if=/dev/zero bs=1M
conv=fdatasync (1 GiB, before and after the eventlog cells) and dd of a warm 1 GiB file to
/dev/null (the page cache's read rate).

Every cell records the server's CPU in cores (utime + stime + cutime + cstime of the server
process and every live process under it, from /proc, before and after, per wall second), the
load generators' cores, the whole machine's busy cores (/proc/stat) and what was left of them
(other work, interrupts). A cell starts once everything but the idle server used less than 0.25
cores for a second (at most 60 s of waiting; the cell says how long and whether it got quiet):
on a dedicated machine that passes at once, on a shared one it keeps other sessions' load from
taking the server's cores.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import io
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.fanout import client as fanout  # noqa: E402 -- standard library only, like this file

TICK = os.sysconf("SC_CLK_TCK")
RECORDS_PER_REQUEST = 500
VALUE = "v" * 100
RAW = "application/vnd.kafka.record-batch.v2"
JSON_PARTITIONS = (4, 16)
JSON_CONNECTIONS = (4, 16, 64)
PYTHON_PROCESSES = (4, 12)
RAW_PARTITIONS = 16
RAW_CONNECTIONS = (4, 16)
FETCH_CONNECTIONS = (16, 64)
FETCH_BATCHES_PER_PARTITION = 8
REDIS_CONNECTIONS = (4, 16, 64)
REDIS_GUESS = {"everysec": 400_000, "always": 200_000}  # XADD/s: the first -n; then the last rate
# one-record appends (issue 13): 256 B values over 100 partitions, no pipelining, both sides
SMALL_PARTITIONS = 100
SMALL_CONNECTIONS = (100, 400)
SMALL_VALUE = "v" * 256
FANOUT_SUBSCRIBERS = 1000
FANOUT_INTERVAL_S = 0.010
FANOUT_WARM_UP = 100
FANOUT_RECORDS = 500
SMALL_GUESS = 50_000  # XADD/s without pipelining: the first -n; then the last rate
# Kafka (issue 25): bench/kafka_small.py's and bench/kafka_consume.py's cells
KAFKA_PRODUCERS = (2, 4)  # confluent-kafka producer processes (on the client CPUs)
KAFKA_PIPELINE = 16  # the Redis peer: redis-benchmark -P 16, AOF always
KAFKA_GUESS = 250_000  # XADD/s at -P 16: the first -n
CONSUME_PARTITIONS = 16
CONSUME_BYTES = 1_000_000_000
CONSUME_RECORD_BYTES = 1024
CONSUME_RECORDS_PER_BATCH = 15  # ~16 KiB batches, Kafka's default batch.size
CONSUME_BATCHES_PER_REQUEST = 64

LUA_DONE = """
done = function(summary, latency, requests)
  io.write(string.format('{"requests": %d, "duration_us": %d, "bytes": %d, "non2xx": %d, '
    .. '"socket_errors": %d, "p50_us": %d, "p99_us": %d, "max_us": %d}\\n', summary.requests,
    summary.duration, summary.bytes, summary.errors.status, summary.errors.connect
    + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


# -- output -------------------------------------------------------------------------------------


class Output:
    """Appends one JSON object per line to the results file and echoes it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "w")  # noqa: SIM115 -- open for the whole run

    def emit(self, **record: object) -> None:
        line = json.dumps(record)
        self.file.write(line + "\n")
        self.file.flush()
        print(line, flush=True)


# -- CPUs ---------------------------------------------------------------------------------------


class Cpus:
    """Which CPUs the server under test gets and which the load generators get."""

    def __init__(self, client_cpus: int | None) -> None:
        every = sorted(os.sched_getaffinity(0))
        self.count = len(every)
        if self.count >= 4:
            k = client_cpus or max(2, self.count // 4)
            self.client, self.server = every[-k:], every[:-k]
            self.pinned = True
        else:
            self.client = self.server = every
            self.pinned = False

    def facts(self) -> dict[str, object]:
        return {
            "cpus": self.count,
            "pinned": self.pinned,
            "server_cpus": self.server,
            "client_cpus": self.client,
            "how": "taskset -c for servers and C tools, sched_setaffinity in Python client processes"
            if self.pinned
            else "not pinned: fewer than 4 CPUs, clients and server share them",
        }

    def taskset(self, cpus: list[int]) -> list[str]:
        """The command prefix that pins a program to `cpus` (nothing when not pinning)."""
        return ["taskset", "-c", ",".join(map(str, cpus))] if self.pinned else []


def tree_pids(root: int) -> list[int]:
    """`root` and every live process under it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_cpu_s(root: int) -> float:
    """utime + stime + cutime + cstime of every live process under `root`, itself included: a
    reaped descendant is in its parent's cutime/cstime and no longer live, so each counts once."""
    ticks = 0
    for pid in tree_pids(root):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        ticks += sum(int(x) for x in stat[stat.rindex(")") + 2 :].split()[11:15])
    return ticks / TICK


def machine_busy_s() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, _steal = fields
    return (user + nice + system + irq + softirq) / TICK


class Meter:
    """Cores used between start and stop by a server's process tree, by this process's waited
    children (wrk, redis-benchmark, client processes) and by the whole machine."""

    def __init__(self, server_pid: int, gate: dict[str, object] | None = None) -> None:
        self.pid = server_pid
        self.gate = quiet_gate(server_pid) if gate is None else gate
        self.t0 = time.perf_counter()
        self.server0 = tree_cpu_s(server_pid)
        self.clients0 = _children_cpu_s()
        self.busy0 = machine_busy_s()

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self.t0
        server = (tree_cpu_s(self.pid) - self.server0) / wall
        clients = (_children_cpu_s() - self.clients0) / wall
        machine = (machine_busy_s() - self.busy0) / wall
        return {
            "wall_s": round(wall, 3),
            "server_cores": round(server, 2),
            "client_cores": round(clients, 2),
            "machine_cores": round(machine, 2),
            # other sessions (and interrupts): on a shared machine they take the server's cores
            "other_cores": round(max(0.0, machine - server - clients), 2),
            "start_gate": self.gate,
        }


QUIET_CORES = 0.25
QUIET_WAIT_S = 60.0


def quiet_gate(server_pid: int) -> dict[str, object]:
    """Wait (at most QUIET_WAIT_S) until everything but the idle server used less than
    QUIET_CORES over a second: a machine shared with other work (the development machine)
    would otherwise lend the server fewer cores than it has. Passes at once on a dedicated one."""
    start = time.monotonic()
    while True:
        own0, busy0 = tree_cpu_s(server_pid), machine_busy_s()
        time.sleep(1.0)
        others = max(0.0, (machine_busy_s() - busy0) - (tree_cpu_s(server_pid) - own0))
        waited = time.monotonic() - start
        if others < QUIET_CORES or waited > QUIET_WAIT_S:
            return {"waited_s": round(waited, 1), "quiet": others < QUIET_CORES}


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- eventlog -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_knows_processes() -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--help"], capture_output=True, text=True,
        cwd=REPO, env={**os.environ, "COLUMNS": "200"}, check=False,
    )
    return "--processes" in done.stdout


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports (a family's Kafka listeners: port + i)."""
    for _ in range(200):
        first, taken = free_port(), []
        try:
            for i in range(1, count):
                s = socket.socket()
                taken.append(s)
                s.bind(("127.0.0.1", first + i))
            return first
        except OSError:
            continue
        finally:
            for s in taken:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


class Eventlog:
    def __init__(
        self, work: Path, processes: int, flag: bool, cpus: Cpus, kafka: bool = False
    ) -> None:
        self.dir = work / f"eventlog-p{processes}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.port = free_port()
        # the Kafka listener only for the Kafka cells, on free ports (shard i on kafka_port + i)
        self.kafka_port = free_ports(processes) if kafka else 0
        env = {**os.environ, "EVENTLOG_KAFKA_PORT": str(self.kafka_port)}
        self.cmd = [sys.executable, "-m", "app.cli", "serve", "--data-dir", str(self.dir / "data"),
                    "--host", "127.0.0.1", "--port", str(self.port)]
        if flag:
            self.cmd += ["--processes", str(processes)]
        self.log = self.dir / "server.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [*cpus.taskset(cpus.server), *self.cmd], cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, env=env,
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"eventlog exited with {self.process.returncode}:\n{self.tail()}")
            try:
                if self.call("GET", "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"eventlog not ready in 120 s:\n{self.tail()}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def call(self, method: str, path: str, body: bytes | None = None, ctype: str = "application/json",
             accept: str | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body, method=method)
        request.add_header("Content-Type", ctype)
        if accept:
            request.add_header("Accept", accept)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def create_topic(self, name: str, partitions: int) -> None:
        status, text = self.call("POST", "/v1/topics", json.dumps({"name": name, "partitions": partitions}).encode())
        if status != 201:
            raise RuntimeError(f"create topic {name}: {status} {text[:300]!r}")

    def delete_topic(self, name: str) -> None:
        status, text = self.call("DELETE", f"/v1/topics/{name}")
        if status != 204:
            raise RuntimeError(f"delete topic {name}: {status} {text[:300]!r}")

    def stored(self, topic: str) -> int:
        return sum(p["high_watermark"] for p in json.loads(self.call("GET", f"/v1/topics/{topic}")[1])["partitions"])

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the shards too
                self.process.wait()
        return self.process.returncode


def run_wrk(cpus: Cpus, work: Path, lua: str, url: str, connections: int, seconds: int,
            env: dict[str, str] | None = None) -> dict[str, object]:
    script = work / "cell.lua"
    script.write_text(lua + LUA_DONE)
    threads = max(1, min(connections, len(cpus.client)))
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "60s", "-s", str(script), url]
    done = subprocess.run([*cpus.taskset(cpus.client), *cmd], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, check=False)
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    out = json.loads(line)
    out["command"] = " ".join(cmd[:-1] + [url])
    out["threads"] = threads
    return out


def json_body(first_key: int) -> bytes:
    return json.dumps({"records": [{"key": f"key-{first_key + i:07d}", "value": VALUE}
                                   for i in range(RECORDS_PER_REQUEST)]}).encode()


def _eventlog_client(port: int, index: int, start: float, seconds: float, cpus: list[int] | None,
                     results: mp.Queue) -> None:
    """One Python client process: 64 bodies with keys of its own, POSTed in turn on one
    keep-alive connection from `start` for `seconds`; puts (records acknowledged, requests)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    bodies = [json_body((index * 64 + k) * RECORDS_PER_REQUEST) for k in range(64)]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    time.sleep(max(0.0, start - time.time()))
    acknowledged = requests = 0
    end = start + seconds
    while time.time() < end:
        conn.request("POST", "/v1/topics/py/records", bodies[requests % 64], headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            results.put(("error", f"status {response.status}"))
            return
        acknowledged += RECORDS_PER_REQUEST
        requests += 1
    results.put((acknowledged, requests))


def _redis_client(port: int, index: int, start: float, seconds: float, cpus: list[int] | None,
                  results: mp.Queue) -> None:
    """One redis-py process: pipelines of 500 XADD events-<key % 4> * key <key> value <value>."""
    import redis

    if cpus:
        os.sched_setaffinity(0, cpus)
    client = redis.Redis(port=port)
    time.sleep(max(0.0, start - time.time()))
    acknowledged = requests = 0
    end = start + seconds
    while time.time() < end:
        pipe = client.pipeline(transaction=False)
        first = (index * 64 + requests % 64) * RECORDS_PER_REQUEST
        for n in range(first, first + RECORDS_PER_REQUEST):
            pipe.xadd(f"events-{n % 4}", {"key": f"key-{n:07d}", "value": VALUE})
        pipe.execute()
        acknowledged += RECORDS_PER_REQUEST
        requests += 1
    results.put((acknowledged, requests))


def client_processes(
    target: object, port: int, count: int, seconds: int, cpus: Cpus, server_pid: int
) -> dict[str, object]:
    """`count` client processes started together; records/s over the cell."""
    gate = quiet_gate(server_pid)
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    start = time.time() + 1.0  # all of them forked and connected first
    procs = [ctx.Process(target=target, args=(port, i, start, seconds, cpus.client if cpus.pinned else None, results))
             for i in range(count)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start - time.time()))
    meter = Meter(server_pid, gate)
    got = [results.get(timeout=seconds + 180) for _ in procs]
    for p in procs:
        p.join()
    cpu = meter.stop()
    errors = [g[1] for g in got if g[0] == "error"]
    if errors:
        raise RuntimeError(f"client processes failed: {errors[:3]}")
    records = sum(g[0] for g in got)
    return {"records": records, "requests": sum(g[1] for g in got),
            "records_per_s": round(records / cpu["wall_s"]), **cpu}


def eventlog_cells(out: Output, args: argparse.Namespace, cpus: Cpus, n: int, flag: bool) -> None:
    work = args.work
    server = Eventlog(work, n, flag, cpus, kafka=bool({"kafka", "consume"} & args.only))
    base = {"system": "eventlog", "processes": n, "server_pids": len(tree_pids(server.pid))}
    secs = args.cell_seconds
    url = f"http://127.0.0.1:{server.port}"
    serial = 0
    try:
        if "fanout" in args.only:  # first: its memory per subscriber needs a fresh server's heap
            fanout_cell(out, base, server, cpus, args.work)
        if "json" in args.only:
            body = work / "body.json"
            body.write_bytes(json_body(0))
            lua = ('local f = assert(io.open(os.getenv("CAPACITY_BODY"), "rb"))\nwrk.method = "POST"\n'
                   'wrk.body = f:read("*a")\nf:close()\nwrk.headers["Content-Type"] = "application/json"\n')
            for partitions in JSON_PARTITIONS:
                for connections in JSON_CONNECTIONS:
                    serial += 1
                    topic = f"json-{serial}"
                    server.create_topic(topic, partitions)
                    meter = Meter(server.pid)
                    r = run_wrk(cpus, work, lua, f"{url}/v1/topics/{topic}/records", connections, secs,
                                {"CAPACITY_BODY": str(body)})
                    cpu = meter.stop()
                    acknowledged = r["requests"] * RECORDS_PER_REQUEST
                    stored = server.stored(topic)
                    server.delete_topic(topic)
                    out.emit(**base, cell="json-wrk", partitions=partitions, connections=connections,
                             threads=r["threads"], records_per_s=round(acknowledged / (r["duration_us"] / 1e6)),
                             p50_ms=r["p50_us"] / 1000, p99_ms=r["p99_us"] / 1000, non2xx=r["non2xx"],
                             socket_errors=r["socket_errors"], acknowledged=acknowledged, stored=stored,
                             lost=max(0, acknowledged - stored), **cpu, command=r["command"])
        if "small" in args.only:
            lua = ('local body = \'{"records": [{"value": "' + SMALL_VALUE + '"}]}\'\n'
                   'local headers = {["Content-Type"] = "application/json"}\n'
                   'math.randomseed(os.time())\nrequest = function()\n'
                   '  return wrk.format("POST", "/v1/topics/" .. os.getenv("CAPACITY_TOPIC") .. "/partitions/" '
                   f'.. math.random(0, {SMALL_PARTITIONS - 1}) .. "/records", headers, body)\nend\n')
            for connections in SMALL_CONNECTIONS:
                serial += 1
                topic = f"small-{serial}"
                server.create_topic(topic, SMALL_PARTITIONS)
                meter = Meter(server.pid)
                r = run_wrk(cpus, work, lua, f"{url}/", connections, secs, {"CAPACITY_TOPIC": topic})
                cpu = meter.stop()
                acknowledged = r["requests"]
                stored = server.stored(topic)
                server.delete_topic(topic)
                out.emit(**base, cell="small-wrk", partitions=SMALL_PARTITIONS, connections=connections,
                         threads=r["threads"], appends_per_s=round(acknowledged / (r["duration_us"] / 1e6)),
                         p50_ms=r["p50_us"] / 1000, p99_ms=r["p99_us"] / 1000, non2xx=r["non2xx"],
                         socket_errors=r["socket_errors"], acknowledged=acknowledged, stored=stored,
                         lost=max(0, acknowledged - stored), **cpu, command=r["command"])
        if "python" in args.only:
            for procs in PYTHON_PROCESSES:
                server.create_topic("py", 4)
                r = client_processes(_eventlog_client, server.port, procs, secs, cpus, server.pid)
                stored = server.stored("py")
                server.delete_topic("py")
                out.emit(**base, cell="json-python", partitions=4, client_processes=procs, **r, stored=stored,
                         lost=max(0, r["records"] - stored))
        if "raw" in args.only or "fetch" in args.only:
            from bench.data import largest_batch_under

            batch = work / "batch.bin"
            batch.write_bytes(largest_batch_under(1 << 20))
            batch_bytes = batch.stat().st_size
        if "raw" in args.only:
            lua = ('local f = assert(io.open(os.getenv("CAPACITY_BODY"), "rb"))\nwrk.method = "POST"\n'
                   f'wrk.body = f:read("*a")\nf:close()\nwrk.headers["Content-Type"] = "{RAW}"\n'
                   'local n = 0\nrequest = function()\n  n = n + 1\n  return wrk.format(nil, '
                   f'"/v1/topics/" .. os.getenv("CAPACITY_TOPIC") .. "/partitions/" .. (n % {RAW_PARTITIONS}) .. "/records")\nend\n')
            for connections in RAW_CONNECTIONS:
                serial += 1
                topic = f"raw-{serial}"
                server.create_topic(topic, RAW_PARTITIONS)
                meter = Meter(server.pid)
                r = run_wrk(cpus, work, lua, f"{url}/", connections, secs,
                            {"CAPACITY_BODY": str(batch), "CAPACITY_TOPIC": topic})
                cpu = meter.stop()
                server.delete_topic(topic)
                out.emit(**base, cell="raw-produce", partitions=RAW_PARTITIONS, connections=connections,
                         threads=r["threads"], batch_bytes=batch_bytes,
                         mb_per_s=round(r["requests"] * batch_bytes / (r["duration_us"] / 1e6) / 1e6, 1),
                         p50_ms=r["p50_us"] / 1000, p99_ms=r["p99_us"] / 1000, non2xx=r["non2xx"],
                         socket_errors=r["socket_errors"], **cpu, command=r["command"])
        if "fetch" in args.only:
            server.create_topic("fetch", RAW_PARTITIONS)
            data = batch.read_bytes()
            for p in range(RAW_PARTITIONS):
                for _ in range(FETCH_BATCHES_PER_PARTITION):
                    status, text = server.call("POST", f"/v1/topics/fetch/partitions/{p}/records", data, RAW)
                    if status != 200:
                        raise RuntimeError(f"fill: {status} {text[:300]!r}")
            status, first = server.call("GET", "/v1/topics/fetch/partitions/0/records?offset=0&max_bytes=1048576", accept=RAW)
            if status != 200 or len(first) != batch_bytes:
                raise RuntimeError(f"fetch of one batch: {status}, {len(first)} bytes, not {batch_bytes}")
            lua = (f'wrk.headers["Accept"] = "{RAW}"\nlocal n = 0\nrequest = function()\n  n = n + 1\n'
                   f'  return wrk.format("GET", "/v1/topics/fetch/partitions/" .. (n % {RAW_PARTITIONS}) '
                   '.. "/records?offset=0&max_bytes=1048576")\nend\n')
            run_wrk(cpus, work, lua, f"{url}/", 4, 1)  # warm the page cache and the server's caches
            for connections in FETCH_CONNECTIONS:
                meter = Meter(server.pid)
                r = run_wrk(cpus, work, lua, f"{url}/", connections, secs)
                cpu = meter.stop()
                out.emit(**base, cell="raw-fetch", partitions=RAW_PARTITIONS, connections=connections,
                         threads=r["threads"], response_bytes=len(first),
                         mb_per_s=round(r["bytes"] / (r["duration_us"] / 1e6) / 1e6, 1),
                         p50_ms=r["p50_us"] / 1000, p99_ms=r["p99_us"] / 1000, non2xx=r["non2xx"],
                         socket_errors=r["socket_errors"], **cpu, command=r["command"])
        if "kafka" in args.only:
            kafka_produce_cells(out, base, server, cpus, secs)
        if "consume" in args.only:
            kafka_consume_cell(out, base, server, cpus, work)
    finally:
        status = server.stop()
        out.emit(**base, cell="server-exit", exit_status=status, command=" ".join(server.cmd),
                 log_tail=server.tail(5) if status else "")
        shutil.rmtree(server.dir, ignore_errors=True)


def subscribers_binary(work: Path) -> Path:
    """bench/fanout/subscribers.c compiled: .device/subscribers (prepare.sh builds it; the
    device machine has no compiler), else built here with gcc."""
    prepared = REPO / ".device" / "subscribers"
    if prepared.exists():
        return prepared
    return fanout.build(work / "subscribers")


def fanout_cell(out: Output, base: dict[str, object], server: Eventlog, cpus: Cpus, work: Path) -> None:
    """1,000 SSE subscribers of one partition (the C client, on the client CPUs), a one-record
    produce every 10 ms from one keep-alive connection: delivery latency, exactly once in order,
    server memory per subscriber."""
    binary = subscribers_binary(work)
    server.create_topic("fan", 1)
    time.sleep(1)
    pids = tree_pids(server.pid)
    rss0 = fanout.rss_bytes(pids)
    subscribers = fanout.Subscribers(binary, "sse", server.port, "/v1/topics/fan/partitions/0/records/stream",
                                     FANOUT_SUBSCRIBERS, cpus.taskset(cpus.client))
    subscribers.wait_ready()
    send = fanout.HttpProducer(server.port, "/v1/topics/fan/partitions/0/records")
    try:
        got = fanout.run_stream(subscribers, send, pids, lambda: tree_cpu_s(server.pid), FANOUT_RECORDS, FANOUT_WARM_UP,
                                FANOUT_INTERVAL_S, rss0)
    finally:
        send.close()
    server.delete_topic("fan")
    out.emit(**base, cell="fanout-sse", subscribers=FANOUT_SUBSCRIBERS, interval_ms=FANOUT_INTERVAL_S * 1000, **got)


# -- peers --------------------------------------------------------------------------------------


def _kafka_clients() -> tuple[object | None, str | None]:
    """bench/kafka_clients.py, or why it cannot run here (no confluent-kafka wheel)."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError as exc:
        return None, f"confluent-kafka not importable: {exc}"
    from bench import kafka_clients

    return kafka_clients, None


def kafka_produce_cells(
    out: Output, base: dict[str, object], server: Eventlog, cpus: Cpus, secs: int
) -> None:
    """bench/kafka_small.py's cell: 256 B records to 100 partitions from librdkafka producer
    processes on the client CPUs (acks=all, linger.ms=5, idempotent), every acknowledged record
    checked against the high watermarks."""
    clients, why = _kafka_clients()
    if clients is None:
        out.emit(**base, cell="kafka-produce", skipped=why)
        return
    bootstrap = f"127.0.0.1:{server.kafka_port}"
    for producers in KAFKA_PRODUCERS:
        topic = f"kafka-{producers}"
        server.create_topic(topic, SMALL_PARTITIONS)
        meters: dict[str, Meter] = {}

        def start(meters: dict[str, Meter] = meters) -> None:  # the producers are connected
            meters["cell"] = Meter(server.pid)  # (after its quiet gate)

        r = clients.run_producers(
            bootstrap,
            topic,
            SMALL_PARTITIONS,
            len(SMALL_VALUE),
            producers,
            secs,
            on_start=start,
            cpus=cpus.client if cpus.pinned else None,
        )
        cpu = meters["cell"].stop()
        stored = server.stored(topic)
        server.delete_topic(topic)
        acknowledged = r["acknowledged"]
        out.emit(
            **base,
            cell="kafka-produce",
            partitions=SMALL_PARTITIONS,
            producer_processes=producers,
            value_bytes=len(SMALL_VALUE),
            records_per_s=round(acknowledged / r["seconds"]),
            seconds=r["seconds"],
            sent=r["sent"],
            acknowledged=acknowledged,
            failed=r["failed"],
            unflushed=r["unflushed"],
            stored=stored,
            lost=max(0, acknowledged - stored),
            producer_cpu_s=r["producer_cpu_seconds"],
            config=clients.PRODUCER_CONFIG,
            **cpu,
        )


def kafka_consume_cell(
    out: Output, base: dict[str, object], server: Eventlog, cpus: Cpus, work: Path
) -> None:
    """bench/kafka_consume.py's cell: 1 GB of ~16 KiB batches over 16 partitions, filled over HTTP,
    read from the beginning by kcat and by a confluent-kafka consumer process (both on the
    client CPUs), against cat of the segment files, warm page cache; two passes of each."""
    clients, why = _kafka_clients()
    if clients is None:
        out.emit(**base, cell="kafka-consume", skipped=why)
        return
    from concurrent.futures import ThreadPoolExecutor

    from bench.data import encode_records_batch

    topic = "consume"
    server.create_topic(topic, CONSUME_PARTITIONS)
    batch = bytes(encode_records_batch(CONSUME_RECORD_BYTES, CONSUME_RECORDS_PER_BATCH))
    body = batch * CONSUME_BATCHES_PER_REQUEST
    requests = CONSUME_BYTES // len(body)

    def post(i: int) -> None:
        status, text = server.call(
            "POST", f"/v1/topics/{topic}/partitions/{i % CONSUME_PARTITIONS}/records", body, RAW
        )
        if status != 200:
            raise RuntimeError(f"fill: {status} {text[:300]!r}")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(post, range(requests)))
    fill_s = time.perf_counter() - t0
    records = requests * CONSUME_BATCHES_PER_REQUEST * CONSUME_RECORDS_PER_BATCH
    stored = server.stored(topic)
    if stored != records:
        raise RuntimeError(f"fill: {records} records sent, the high watermarks count {stored}")
    files = sorted(
        str(f)
        for p in range(CONSUME_PARTITIONS)
        for f in (server.dir / "data" / f"{topic}-{p}").glob("*.log")
    )
    file_bytes = sum(Path(f).stat().st_size for f in files)
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # warm
    bootstrap = f"127.0.0.1:{server.kafka_port}"
    client_cpus = cpus.client if cpus.pinned else None
    readers = ["cat", "python"]
    try:
        check = clients.kcat_consume(
            bootstrap, topic, records, check=True, taskset=cpus.taskset(cpus.client)
        )
        if check["value_bytes"] != records * CONSUME_RECORD_BYTES:
            raise RuntimeError(
                f"kcat read {check['value_bytes']} value bytes of {records * CONSUME_RECORD_BYTES}"
            )
        readers.insert(1, "kcat")
    except (OSError, RuntimeError) as exc:  # not installed, or its libraries missing here
        out.emit(**base, cell="kafka-consume", reader="kcat", skipped=repr(exc)[:500])
    cell = {
        **base,
        "cell": "kafka-consume",
        "partitions": CONSUME_PARTITIONS,
        "records": records,
        "file_bytes": file_bytes,
        "segments": len(files),
        "fill_s": round(fill_s, 2),
    }
    for repeat in range(2):
        for reader in readers:
            meter = Meter(server.pid)
            if reader == "cat":
                t1 = time.perf_counter()
                subprocess.run(
                    [*cpus.taskset(cpus.client), "cat", *files],
                    stdout=subprocess.DEVNULL,
                    check=True,
                )
                r: dict[str, object] = {"seconds": round(time.perf_counter() - t1, 4)}
            elif reader == "kcat":
                r = clients.kcat_consume(
                    bootstrap, topic, records, taskset=cpus.taskset(cpus.client)
                )
            else:
                r = clients.consume_in_process(
                    bootstrap, topic, CONSUME_PARTITIONS, records, cpus=client_cpus
                )
                if r["messages"] != records or r["value_bytes"] != records * CONSUME_RECORD_BYTES:
                    raise RuntimeError(
                        f"confluent-kafka read {r['messages']} of {records} messages"
                    )
            cpu = meter.stop()
            out.emit(
                **cell,
                reader=reader,
                repeat=repeat,
                mb_per_s=round(file_bytes / float(r["seconds"]) / 1e6, 1),
                **r,
                **cpu,
            )
    server.delete_topic(topic)


def redis_cells(out: Output, args: argparse.Namespace, cpus: Cpus, fsync: str) -> None:
    directory = args.work / f"redis-{fsync}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    port = free_port()
    cmd = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory), "--appendonly", "yes",
           "--appendfsync", fsync, "--save", "", "--protected-mode", "no"]
    server = subprocess.Popen([*cpus.taskset(cpus.server), *cmd], stdout=open(directory / "redis.log", "wb"),  # noqa: SIM115
                              stderr=subprocess.STDOUT, start_new_session=True)

    def cli(*words: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(port), *words], capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        for _ in range(300):
            try:
                if cli("PING") == "PONG":
                    break
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.1)
        base = {"system": "redis", "aof": fsync, "version": cli("INFO", "server").split("redis_version:")[1].split()[0]}
        rate = REDIS_GUESS[fsync]
        for connections in REDIS_CONNECTIONS:
            per_round = connections * RECORDS_PER_REQUEST
            n = max(4 * per_round, round(rate * args.cell_seconds / per_round) * per_round)
            threads = max(1, min(connections, len(cpus.client)))
            bench = ["redis-benchmark", "-p", str(port), "-c", str(connections), "--threads", str(threads), "-n", str(n),
                     "-P", str(RECORDS_PER_REQUEST), "--csv", "XADD", "mystream", "*", "field", VALUE]
            meter = Meter(server.pid)
            done = subprocess.run([*cpus.taskset(cpus.client), *bench], capture_output=True, text=True, check=True)
            cpu = meter.stop()
            row = [line for line in done.stdout.splitlines() if line.startswith('"XADD')]
            stored = int(cli("XLEN", "mystream"))
            cli("DEL", "mystream")
            rate = n / cpu["wall_s"]
            out.emit(**base, cell="xadd-redis-benchmark", connections=connections, threads=threads, records=n,
                     stored=stored, records_per_s=round(n / cpu["wall_s"]),
                     redis_benchmark_rps=float(row[-1].split(",")[1].strip('"')) if row else None, **cpu,
                     command=" ".join(bench[:-1]) + " <100-byte value>")
        if "small" in args.only:
            small_rate = SMALL_GUESS
            for connections in SMALL_CONNECTIONS:
                n = max(10 * connections, round(small_rate * args.cell_seconds))
                threads = max(1, min(connections, len(cpus.client)))
                bench = ["redis-benchmark", "-p", str(port), "-c", str(connections), "--threads", str(threads), "-n", str(n),
                         "-r", str(SMALL_PARTITIONS), "--csv", "XADD", "stream:__rand_int__", "*", "f", SMALL_VALUE]
                meter = Meter(server.pid)
                done = subprocess.run([*cpus.taskset(cpus.client), *bench], capture_output=True, text=True, check=True)
                cpu = meter.stop()
                rows = list(csv.DictReader(io.StringIO(done.stdout)))
                small_rate = n / cpu["wall_s"]
                cli("FLUSHALL")
                p50 = float(rows[-1]["p50_latency_ms"]) if rows else None
                p99 = float(rows[-1]["p99_latency_ms"]) if rows else None
                out.emit(**base, cell="small-redis-benchmark", connections=connections, threads=threads, appends=n,
                         appends_per_s=round(n / cpu["wall_s"]), p50_ms=p50, p99_ms=p99, **cpu,
                         command=" ".join(bench[:-1]) + " <256-byte value>")
        if "kafka" in args.only and fsync == "always":  # issue 25's peer: -P 16, 100 streams
            # whole pipelines per connection (redis-benchmark -P overshoots -n otherwise)
            whole = SMALL_CONNECTIONS[0] * KAFKA_PIPELINE
            n = KAFKA_GUESS * args.cell_seconds // whole * whole
            threads = max(1, min(SMALL_CONNECTIONS[0], len(cpus.client)))
            bench = ["redis-benchmark", "-p", str(port), "-c", str(SMALL_CONNECTIONS[0]),
                     "--threads", str(threads), "-n", str(n), "-P", str(KAFKA_PIPELINE),
                     "-r", str(SMALL_PARTITIONS), "--csv", "XADD", "stream:__rand_int__", "*", "f",
                     SMALL_VALUE]
            meter = Meter(server.pid)
            done = subprocess.run([*cpus.taskset(cpus.client), *bench], capture_output=True,
                                  text=True, check=True)
            cpu = meter.stop()
            rows = list(csv.DictReader(io.StringIO(done.stdout)))
            stored = sum(int(cli("XLEN", f"stream:{i:012d}")) for i in range(SMALL_PARTITIONS))
            cli("FLUSHALL")
            out.emit(**base, cell="kafka-redis-benchmark", connections=SMALL_CONNECTIONS[0],
                     pipeline=KAFKA_PIPELINE, threads=threads, appends=n, stored=stored,
                     appends_per_s=round(n / cpu["wall_s"]),
                     p50_ms=float(rows[-1]["p50_latency_ms"]) if rows else None,
                     p99_ms=float(rows[-1]["p99_latency_ms"]) if rows else None, **cpu,
                     command=" ".join(bench[:-1]) + " <256-byte value>")
        if "fanout" in args.only and fsync == "always":  # pub/sub keeps nothing: once is enough
            binary = subscribers_binary(args.work)
            rss0 = fanout.rss_bytes([server.pid])
            subscribers = fanout.Subscribers(binary, "redis", port, "ch", FANOUT_SUBSCRIBERS, cpus.taskset(cpus.client))
            subscribers.wait_ready()
            send = fanout.RedisPublisher(port, "ch", FANOUT_SUBSCRIBERS)
            try:
                got = fanout.run_stream(subscribers, send, [server.pid], lambda: tree_cpu_s(server.pid), FANOUT_RECORDS,
                                        FANOUT_WARM_UP, FANOUT_INTERVAL_S, rss0)
            finally:
                send.close()
            out.emit(**base, cell="fanout-redis-pubsub", subscribers=FANOUT_SUBSCRIBERS, **got)
        if "python" in args.only:
            try:
                import redis  # noqa: F401
            except ImportError as exc:
                out.emit(**base, cell="xadd-python", skipped=f"redis-py not importable: {exc}")
            else:
                for procs in PYTHON_PROCESSES:
                    r = client_processes(_redis_client, port, procs, args.cell_seconds, cpus, server.pid)
                    stored = sum(int(cli("XLEN", f"events-{p}")) for p in range(4))
                    cli("DEL", *[f"events-{p}" for p in range(4)])
                    out.emit(**base, cell="xadd-python", client_processes=procs, **r, stored=stored)
    finally:
        server.terminate()
        server.wait(60)
        shutil.rmtree(directory, ignore_errors=True)


def dd_cells(out: Output, work: Path, when: str) -> None:
    """dd's write bandwidth with one fdatasync at the end, and a warm file read to /dev/null."""
    path = work / "dd.bin"
    env = {**os.environ, "LC_ALL": "C"}
    write = ["dd", "if=/dev/zero", f"of={path}", "bs=1M", "count=1024", "conv=fdatasync"]
    done = subprocess.run(write, capture_output=True, text=True, env=env, check=True)
    out.emit(system="dd", cell="dd-write", when=when, mb_per_s=_dd_rate(done.stderr), command=" ".join(write))
    read = ["dd", f"if={path}", "of=/dev/null", "bs=1M"]
    subprocess.run(read, capture_output=True, env=env, check=True)  # into the page cache
    done = subprocess.run(read, capture_output=True, text=True, env=env, check=True)
    out.emit(system="dd", cell="page-cache-read", when=when, mb_per_s=_dd_rate(done.stderr), command=" ".join(read))
    path.unlink()


def _dd_rate(stderr: str) -> float:
    """MB/s from dd's last line: 'N bytes (...) copied, S s, ...'."""
    line = [x for x in stderr.splitlines() if "copied" in x][-1]
    size, seconds = int(line.split()[0]), float(line.split("copied, ")[1].split()[0])
    return round(size / seconds / 1e6, 1)


# -- main ---------------------------------------------------------------------------------------


def machine(args: argparse.Namespace, cpus: Cpus, flag: bool) -> dict[str, object]:
    model = next((x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                  if x.startswith("model name")), None)
    mem = next((int(x.split()[1]) * 1024 for x in Path("/proc/meminfo").read_text().splitlines()
                if x.startswith("MemTotal:")), None)
    mounts = [x.split() for x in Path("/proc/mounts").read_text().splitlines()]
    target = str(args.work.resolve())
    fs = max((m for m in mounts if target == m[1] or target.startswith(m[1].rstrip("/") + "/")),
             key=lambda m: len(m[1]), default=None)
    tools = {}
    tools_asked = (("wrk", "-v"), ("redis-server", "--version"),
                   ("redis-benchmark", "--version"), ("kcat", "-V"))
    for tool, flag_ in tools_asked:
        try:
            done = subprocess.run([tool, flag_], capture_output=True, text=True, check=False)
            tools[tool] = ((done.stdout or done.stderr).strip().splitlines() or [None])[0]
        except OSError:
            tools[tool] = None
    source = REPO / ".device" / "SOURCE"
    return {
        "host": os.environ.get("HOST_LABEL") or platform.node(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([sys.executable, *sys.argv]),
        "cpu_model": model, "memory_bytes": mem, "kernel": platform.release(), "python": platform.python_version(),
        "filesystem": {"mount_point": fs[1], "device": fs[0], "type": fs[2], "options": fs[3]} if fs else None,
        "cpus": cpus.facts(), "serve_has_processes_flag": flag, "cell_seconds": args.cell_seconds,
        "tools": tools, "source": source.read_text().strip() if source.exists() else _git_head(),
    }


def _git_head() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "engine", "api", "app", "workers"], cwd=REPO,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + (" +uncommitted" if dirty.stdout.strip() else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="scratch dir on the disk to measure")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines file (written anew)")
    parser.add_argument("--processes", default="1,2,4,8,16", help="server shard counts (capped at the CPU count)")
    parser.add_argument("--cell-seconds", type=int, default=int(os.environ.get("CELL_SECONDS", "10")))
    parser.add_argument("--client-cpus", type=int, default=None, help="CPUs for the load generators")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="skip Redis and dd")
    parser.add_argument("--only", default="json,python,raw,fetch,small,fanout,kafka,consume",
                        help="eventlog cells to run")
    args = parser.parse_args()
    args.only = set(args.only.split(","))
    args.work.mkdir(parents=True, exist_ok=True)
    cpus = Cpus(args.client_cpus)
    flag = serve_knows_processes()
    wanted = [int(x) for x in args.processes.split(",") if x.strip()]
    counts = sorted({min(n, cpus.count) for n in wanted} if flag else {1})
    out = Output(args.out)
    out.emit(cell="machine", processes_measured=counts, processes_asked=wanted, **machine(args, cpus, flag))
    if not flag and wanted != [1]:
        out.emit(cell="skipped", processes=[n for n in wanted if n != 1],
                 reason="eventlog serve has no --processes option in this tree: only N = 1 (without the flag)")
    if args.peers:
        dd_cells(out, args.work, "before")
    failed = 0
    for n in counts:
        failed += _guarded(out, eventlog_cells, out, args, cpus, n, flag)
    if args.peers:
        dd_cells(out, args.work, "after")
        for fsync in ("everysec", "always"):
            failed += _guarded(out, redis_cells, out, args, cpus, fsync)
    out.emit(cell="done", failed=failed)
    return 1 if failed else 0


def _guarded(out: Output, fn: object, *args: object) -> int:
    """Run one group of cells; a failure is recorded (and the next group runs): 1, else 0."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 -- recorded, and the run goes on
        import traceback

        traceback.print_exc()
        out.emit(cell="error", group=fn.__name__, args=[str(a) for a in args[2:]], error=repr(exc)[:2000])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
