"""Hangs and stalls (issue 11), against a real server subprocess, and the helpers of
api/records.py that keep big requests off the event loop.

A deleted or closing partition ends every stream and long-poll on it at once; DELETE answers;
shutdown always completes; no single request holds the event loop for long.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Self

import httpx
import orjson
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from engine import slicing

from ..conftest import REPO

# stalls and latency bounds under a quiet machine: make test runs these alone (serial)
pytestmark = pytest.mark.serial

# a stream that ends properly sends a few hundred bytes; the spinning one sent hundreds of MB
STREAM_CAP_BYTES = 1 << 20


class StreamReader(threading.Thread):
    """One SSE stream read in a thread: every byte it sends (up to a cap), its events."""

    def __init__(self, url: str, path: str, params: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.params = url, path, params or {}
        self.opened = threading.Event()
        self.data = bytearray()
        self.total = 0
        self.status: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=10) as c, c.stream("GET", self.path, params=self.params) as r:
                self.status = r.status_code
                for chunk in r.iter_raw():
                    self.total += len(chunk)
                    if len(self.data) < STREAM_CAP_BYTES:
                        self.data += chunk
                    if b"\n\n" in self.data:
                        self.opened.set()
                    if self.total > STREAM_CAP_BYTES:
                        break  # hundreds of MB of keep-alives: the fault
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc
        finally:
            self.opened.set()

    def events(self) -> list[dict[str, Any]]:
        out = []
        for block in bytes(self.data).split(b"\n\n"):
            event: dict[str, Any] = {}
            for line in block.decode().splitlines():
                if line.startswith(":"):
                    event.setdefault("comments", []).append(line[1:].strip())
                    continue
                name, _, value = line.partition(": ")
                event[name] = orjson.loads(value) if name == "data" else value
            if event:
                out.append(event)
        return out


class LongPoll(threading.Thread):
    def __init__(self, url: str, path: str, params: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.params = url, path, params
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self.waited_s = 0.0

    def run(self) -> None:
        started = time.monotonic()
        try:
            with httpx.Client(base_url=self.url, timeout=60) as c:
                self.response = c.get(self.path, params=self.params)
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc
        self.waited_s = time.monotonic() - started


def waiters(server, topic: str, partition: int) -> int:
    """Requests parked on a partition (the eventlog_partition_waiters gauge)."""
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    needle = f'eventlog_partition_waiters{{partition="{partition}",topic="{topic}"}} '
    for line in text.splitlines():
        if line.startswith(needle):
            return int(float(line[len(needle):]))
    return 0


def wait_for(condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def healthz_s(server) -> float:
    started = time.monotonic()
    assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
    return time.monotonic() - started


def stop_in_time(server, timeout: float = 15.0) -> None:
    """SIGTERM; the server must exit 0 well within the graceful wait (30 s)."""
    started = time.monotonic()
    try:
        code = server.stop(signal.SIGTERM, timeout=timeout)
    except Exception as exc:
        server.kill()
        raise AssertionError(f"SIGTERM did not stop the server within {timeout} s") from exc
    assert code == 0, server.log()[-3000:]
    assert time.monotonic() - started < timeout


def test_deleting_a_topic_ends_its_streams_and_answers(server_factory) -> None:
    """The fault: DELETE never answered, each stream on the topic sent keep-alives in a tight
    loop (hundreds of MB), the server stopped answering /healthz and ignored SIGTERM."""
    server = server_factory().start()
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "t", "partitions": 2}).status_code == 201
        c.post("/v1/topics/t/records", json={"records": [{"value": f"v{i}", "partition": 0} for i in range(3)]})
    streams = [
        StreamReader(server.url, "/v1/topics/t/partitions/0/records/stream", {"offset": 0}),
        StreamReader(server.url, "/v1/topics/t/partitions/1/records/stream"),
    ]
    for s in streams:
        s.start()
    for s in streams:
        assert s.opened.wait(10) and s.error is None
    wait_for(lambda: waiters(server, "t", 0) == 1 and waiters(server, "t", 1) == 1, what="the streams to wait")
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.delete("/v1/topics/t").status_code == 204
        for s in streams:
            s.join(10)
            assert not s.is_alive(), "the stream did not end"
            assert s.error is None, s.error
            assert s.total < 64 * 1024, f"the stream sent {s.total} bytes"
            last = s.events()[-1]
            assert last["event"] == "error"
            assert last["data"]["code"] == "topic_deleted"
        assert [e["data"]["value"] for e in streams[0].events() if e.get("event") == "record"] == ["v0", "v1", "v2"]
        assert healthz_s(server) < 5
        with httpx.Client(base_url=server.url, timeout=10) as c:  # the name is free again
            assert c.post("/v1/topics", json={"name": "t"}).status_code == 201
            assert c.get("/v1/topics/t/partitions/0/records").json()["records"] == []
    finally:
        stop_in_time(server)


def test_deleting_a_topic_answers_its_long_polls(server_factory) -> None:
    """A long-poll parked on a deleted topic answers at once with what a new request would get
    (404 topic_not_found), not after max_wait_ms."""
    server = server_factory().start()
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "t"}).status_code == 201
    path = "/v1/topics/t/partitions/0/records"
    polls = [LongPoll(server.url, path, {"offset": 0, "max_wait_ms": 120_000}) for _ in range(2)]
    for p in polls:
        p.start()
    wait_for(lambda: waiters(server, "t", 0) == 2, what="the long-polls to wait")
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.delete("/v1/topics/t").status_code == 204
        for p in polls:
            p.join(10)
            assert not p.is_alive() and p.error is None, p.error
            assert p.response is not None and p.response.status_code == 404
            assert p.response.json()["code"] == "topic_not_found"
            assert p.waited_s < 20
        assert healthz_s(server) < 5
    finally:
        stop_in_time(server)


def test_sigterm_ends_streams_and_long_polls_at_once(server_factory) -> None:
    """SIGTERM with streams and long-polls open: each ends at once (a stream with an error
    event `unavailable`, a long-poll with what it has: 200 and no records) and the server exits
    0 long before the long-polls' max_wait_ms or the 30 s grace."""
    server = server_factory().start()
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "t", "partitions": 2}).status_code == 201
    streams = [StreamReader(server.url, f"/v1/topics/t/partitions/{p}/records/stream") for p in (0, 1)]
    polls = [LongPoll(server.url, "/v1/topics/t/partitions/1/records", {"offset": 0, "max_wait_ms": 120_000})]
    for t in [*streams, *polls]:
        t.start()
    for s in streams:
        assert s.opened.wait(10) and s.error is None
    wait_for(lambda: waiters(server, "t", 0) == 1 and waiters(server, "t", 1) == 2, what="the requests to wait")
    stop_in_time(server, timeout=10)
    for s in streams:
        s.join(5)
        assert not s.is_alive() and s.error is None, s.error
        assert s.total < 64 * 1024
        last = s.events()[-1]
        assert last["event"] == "error" and last["data"]["code"] == "unavailable"
    for p in polls:
        p.join(5)
        assert not p.is_alive() and p.error is None, p.error
        assert p.response is not None and p.response.status_code == 200
        assert p.response.json()["records"] == []


@pytest.mark.parametrize("kind", ["stream", "long_poll"])
def test_a_request_on_a_topic_being_deleted_never_spins(server_factory, kind: str) -> None:
    """Streams and long-polls that arrive while the topic's logs are closing (between the
    metadata event and the end of DELETE) end too."""
    server = server_factory().start()
    try:
        with server.client() as c:
            for round_ in range(5):
                assert c.post("/v1/topics", json={"name": "t"}).status_code == 201
                if kind == "stream":
                    readers: list[Any] = [StreamReader(server.url, "/v1/topics/t/partitions/0/records/stream") for _ in range(3)]
                else:
                    readers = [LongPoll(server.url, "/v1/topics/t/partitions/0/records", {"max_wait_ms": 60_000}) for _ in range(3)]
                for r in readers:
                    r.start()
                assert c.delete("/v1/topics/t", timeout=10).status_code == 204
                for r in readers:
                    r.join(10)
                    assert not r.is_alive() and r.error is None, (round_, r.error)
                    if kind == "stream":
                        assert r.total < 64 * 1024
                        assert r.status == 404 or r.events()[-1]["data"]["code"] == "topic_deleted"
                    else:
                        assert r.response is not None and r.response.status_code == 404
        assert healthz_s(server) < 5
    finally:
        stop_in_time(server)


def test_a_writer_stuck_on_a_hung_disk_holds_neither_delete_nor_shutdown(server_factory, tmp_path) -> None:
    """A partition writer stuck in fsync (a hung disk: the injected fault sleeps 10 minutes, and
    no task can cancel a system call) used to hold DELETE and SIGTERM for as long. DELETE now
    answers after shutdown_timeout_ms, and a shutdown that cannot finish ends the process
    (status 1, a clear log line) 2 x shutdown_timeout_ms + 10 s after the signal."""
    faults = tmp_path / "faults.json"
    faults.write_text('{"rules": []}')
    server = server_factory(EVENTLOG_FAULTS_FILE=str(faults), EVENTLOG_SHUTDOWN_TIMEOUT_MS="1000").start()
    try:
        with httpx.Client(base_url=server.url, timeout=20) as c:
            assert c.post("/v1/topics", json={"name": "t"}).status_code == 201
            assert c.post("/v1/topics", json={"name": "kept"}).status_code == 201
            assert c.post("/v1/topics/t/records", json={"records": [{"value": "v"}]}).status_code == 200
            faults.write_text('{"rules": [{"op": "fsync", "path": "/t-0/", "delay_ms": 600000}]}')
            # an append whose fdatasync hangs (a close no longer fsyncs what is synced already:
            # the append is what puts the writer in the hung call); its client gives up
            with pytest.raises(httpx.ReadTimeout):
                c.post("/v1/topics/t/records", json={"records": [{"value": "w"}]}, timeout=2)
            started = time.monotonic()
            assert c.delete("/v1/topics/t").status_code == 204  # the writer is stuck in fsync
            assert time.monotonic() - started < 10
            assert c.get("/v1/topics/t").status_code == 404
            assert c.post("/v1/topics/kept/records", json={"records": [{"value": "k"}]}).status_code == 200
        assert healthz_s(server) < 5
        assert "did not stop within 1000 ms" in server.log()
        started = time.monotonic()
        code = server.stop(signal.SIGTERM, timeout=30)
        assert code == 1 and time.monotonic() - started < 30
        assert "shutdown did not finish within 12 s" in server.log()
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
    faults.write_text('{"rules": []}')
    again = server_factory(server.data_dir).start()
    try:
        with again.client() as c:
            assert c.get("/v1/topics/t").status_code == 404
            assert c.get("/v1/topics/kept/partitions/0/records").json()["records"][0]["value"] == "k"
    finally:
        stop_in_time(again)


_POLLER = """
import sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
worst, count = 0.0, 0
with httpx.Client(base_url=sys.argv[1], timeout=30) as c:
    while not stop.is_set():
        started = time.monotonic()
        assert c.get("/healthz").status_code == 200
        worst = max(worst, time.monotonic() - started)
        count += 1
        if count == 3:
            print("polling", flush=True)
        stop.wait(0.01)
print(worst, count)
"""


class HealthPoller:
    """GET /healthz every ~10 ms on one connection, from a process of its own (the test's own
    GIL-bound work, building and decoding big bodies, must not delay the polls); the worst
    latency seen is how long the server's event loop was held."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _POLLER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.worst_s = 0.0
        self.count = 0

    def __enter__(self) -> Self:
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "polling\n"
        return self

    def __exit__(self, *_exc: object) -> None:
        out, _ = self.proc.communicate("", timeout=60)
        assert self.proc.returncode == 0, out
        worst, count = out.split()
        self.worst_s, self.count = float(worst), int(count)


# How long a /healthz may wait while one big request is served. By design the loop is never
# held for more than a few tens of ms (big bodies are parsed, checked, encoded and written in
# worker threads, in slices, with the cyclic GC paused): the worst poll measured here was
# 30-50 ms on a loaded 2-core machine, against 4.7-6 s before the fix. 1 s leaves room for a
# loaded CI machine (the server's threads share the GIL and two cores with this test's client
# and poller processes) and is still a fifth of the stall it guards against.
LOOP_STALL_BOUND_S = 1.0
BIG_COUNT = 1_000_000


def fetch_all(c: httpx.Client, topic: str, count: int, **params: Any) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    while len(records) < count:
        got = c.get(f"/v1/topics/{topic}/partitions/0/records", params={
            "offset": len(records), "max_records": 100_000, "max_bytes": 64 * 1024 * 1024, **params,
        })
        assert got.status_code == 200, got.text
        page = got.json()
        assert page["records"] and page["records"][0]["offset"] == len(records)
        records += page["records"]
    return records


def test_a_big_json_produce_does_not_stall_the_loop(server) -> None:
    """One JSON produce of a million small records (13 MB in the issue, 19 MB here) held the
    event loop for 6 s (/healthz answered after 6.1 s). It must succeed, answer every offset in
    request order, every record be readable, and /healthz stay prompt meanwhile."""
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "big"}).status_code == 201
    body = orjson.dumps({"records": [{"value": str(i)} for i in range(BIG_COUNT)]})
    assert len(body) > 13_000_000
    with httpx.Client(base_url=server.url, timeout=120) as c:
        with HealthPoller(server.url) as poller:
            r = c.post("/v1/topics/big/records", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        assert poller.worst_s < LOOP_STALL_BOUND_S, f"/healthz waited {poller.worst_s:.2f} s"
        assert [o["offset"] for o in r.json()["offsets"]] == list(range(BIG_COUNT))
        values = [rec["value"] for rec in fetch_all(c, "big", BIG_COUNT)]
        assert values == [str(i) for i in range(BIG_COUNT)]


def test_a_big_json_fetch_does_not_stall_the_loop(server) -> None:
    """A JSON fetch of 100 000 records (each with a key and ten headers, as base64) decoded and
    wrote them on the event loop: /healthz waited 2 s."""
    count = 100_000
    records = [
        {"key": f"k{i}", "value": f"v{i}", "headers": [{"key": f"h{j}", "value": str(j)} for j in range(10)]}
        for i in range(count)
    ]
    with httpx.Client(base_url=server.url, timeout=120) as c:
        assert c.post("/v1/topics", json={"name": "wide"}).status_code == 201
        for start in range(0, count, 10_000):
            r = c.post("/v1/topics/wide/partitions/0/records", json={"records": records[start : start + 10_000]})
            assert r.status_code == 200 and r.json()["last_offset"] == start + 9_999, r.text
        with HealthPoller(server.url) as poller:
            got = fetch_all(c, "wide", count, key_format="base64", value_format="base64")
        assert poller.worst_s < LOOP_STALL_BOUND_S, f"fetch: /healthz waited {poller.worst_s:.2f} s"
    assert len(got) == count
    assert [base64.b64decode(rec["key"]) for rec in got] == [f"k{i}".encode() for i in range(count)]
    assert got[-1]["headers"] == [{"key": f"h{j}", "value": base64.b64encode(str(j).encode()).decode()} for j in range(10)]


# Thousands of long-polls and event streams opened at once, woken at once, timing out at once and
# leaving at once (issue 23): each of those was a single turn of the server's event loop that
# handled all of them, and /healthz waited behind it. Wake-ups, time-outs, the heads of such
# requests and the closes now go a few per turn (engine/wakeups.py, app/server.py). Measured here
# (one process, 2 cores, 2,500 + 2,500): the worst /healthz 35-65 ms (up to 170 ms with the
# machine loaded by other suites), against 320-560 ms before (docs/RELIABILITY.md). 250 ms leaves
# room for a loaded CI machine and still fails without the fix.
BURST_STALL_BOUND_S = 0.25
BURST_EACH = 2500  # long-polls, and as many event streams


def _raise_open_files(needed: int) -> tuple[int, int]:
    """This process's RLIMIT_NOFILE soft limit raised to `needed` (a server started afterwards
    inherits it); returns the limits to restore. Skips where the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} open files; the hard limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return soft, hard


async def _request(port: int, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {target} HTTP/1.1\r\nhost: test\r\n\r\n".encode())
    return reader, writer


async def _response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One whole response with a Content-Length: (head, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    fields = dict(line.lower().split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
    length = int(fields[b"content-length"])
    return head, await reader.readexactly(length)


async def _until(reader: asyncio.StreamReader, needle: bytes) -> bytes:
    """What `reader` sends until `needle` has come (the bytes so far)."""
    data = b""
    while needle not in data:
        chunk = await reader.read(65536)
        if not chunk:
            raise AssertionError(f"closed before {needle!r}: {data[-300:]!r}")
        data += chunk
    return data


async def _burst(url: str, port: int, count: int) -> None:
    """`count` long-polls and `count` event streams at the end of t/0, opened together; once all
    wait, one record wakes them all; the long-polls poll again on the same connections, with a
    short wait that ends for all of them together; then every client leaves at once."""
    server = SimpleNamespace(url=url)
    poll = "/v1/topics/t/partitions/0/records?offset=1&max_wait_ms=60000"
    stream = "/v1/topics/t/partitions/0/records/stream?offset=1"
    opened = await asyncio.gather(
        *(_request(port, poll if i % 2 else stream) for i in range(2 * count))
    )
    polls, streams = opened[1::2], opened[0::2]
    try:
        deadline = time.monotonic() + 60
        while await asyncio.to_thread(waiters, server, "t", 0) < 2 * count:
            waiting = await asyncio.to_thread(waiters, server, "t", 0)
            assert time.monotonic() < deadline, f"{waiting} of {2 * count} waiting"
            await asyncio.sleep(0.1)
        async with httpx.AsyncClient(base_url=server.url) as c:
            record = {"records": [{"value": "b"}]}
            r = await c.post("/v1/topics/t/partitions/0/records", json=record)
            assert r.status_code == 200 and r.json()["last_offset"] == 1, r.text
        events = await asyncio.wait_for(
            asyncio.gather(*(_until(r, b'"value":"b"') for r, _ in streams)), 60
        )
        assert all(e.startswith(b"HTTP/1.1 200 ") for e in events)
        answers = await asyncio.wait_for(asyncio.gather(*(_response(r) for r, _ in polls)), 60)
        for head, body in answers:
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert orjson.loads(body)["records"][0]["value"] == "b"
        # again, from offset 2: nothing comes, and all of them time out together
        again = "/v1/topics/t/partitions/0/records?offset=2&max_wait_ms=2000"
        for _, writer in polls:
            writer.write(f"GET {again} HTTP/1.1\r\nhost: test\r\n\r\n".encode())
        timed_out = await asyncio.wait_for(asyncio.gather(*(_response(r) for r, _ in polls)), 60)
        for _, body in timed_out:
            assert orjson.loads(body)["records"] == [] and orjson.loads(body)["next_offset"] == 2
    finally:
        for _, writer in opened:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for _, w in opened), return_exceptions=True)
    await asyncio.sleep(0.5)  # the server sees them all leave while /healthz is asked


def burst_main(url: str, port: int, count: int) -> None:
    """_burst in a process of its own, at a lower priority than the server's: the clients' work
    (thousands of sockets) must not take the CPU from the event loop whose turns are measured."""
    os.nice(10)
    asyncio.run(_burst(url, port, count))


@pytest.mark.slow
def test_thousands_of_long_polls_and_streams_keep_the_loop_responsive(server_factory) -> None:
    """Opening, waking, timing out and closing thousands of long-polls and event streams at once
    must leave /healthz prompt throughout: no turn of the server's event loop handles them all."""
    soft, hard = _raise_open_files(2 * BURST_EACH + 1024)
    try:
        server = server_factory()
        server.processes = 1  # one event loop takes them all (a shard of a family takes its share)
        server.start()
        with server.client() as c:
            assert c.post("/v1/topics", json={"name": "t"}).status_code == 201
            first = c.post("/v1/topics/t/partitions/0/records", json={"records": [{"value": "a"}]})
            assert first.status_code == 200
        with HealthPoller(server.url) as poller:
            clients = subprocess.run(
                [sys.executable, "-c", "from tests.api.test_hangs import burst_main; "
                 f"burst_main({server.url!r}, {server.port}, {BURST_EACH})"],
                cwd=REPO, capture_output=True, text=True, timeout=300,
            )
        assert clients.returncode == 0, clients.stderr[-3000:]
        assert poller.count > 50
        worst_ms = poller.worst_s * 1000
        assert poller.worst_s < BURST_STALL_BOUND_S, f"/healthz waited {worst_ms:.0f} ms"
        stop_in_time(server)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(alphabet='{}[],:" \\ab\n') | st.text(alphabet=',: "\\ab', max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet=':"ab', max_size=3) | st.text(alphabet='{}[],:"ab', max_size=3), inner, max_size=3),
    max_leaves=8,
)
bodies = st.fixed_dictionaries(
    {"records": st.lists(st.dictionaries(st.sampled_from(["key", "value", "headers", "x"]), json_values, max_size=3), max_size=12)},
    optional={"value_format": json_values, "records ": json_values, "z": json_values},
)


def _brackets_in_strings(value: Any) -> bool:
    if isinstance(value, str):
        return any(c in value for c in "{}[]")
    if isinstance(value, list):
        return any(_brackets_in_strings(v) for v in value)
    if isinstance(value, dict):
        return any(_brackets_in_strings(k) or _brackets_in_strings(v) for k, v in value.items())
    return False


@settings(max_examples=300, deadline=None)
@example(  # cut candidates inside a record's headers are passed over
    doc={"records": [{"key": "k", "headers": [{"key": "a", "value": "1"}, {"key": "b", "value": "2"}]}, {"value": "v"}] * 3},
    indent=False, slice_bytes=1, cut=0, junk=b"",
)
@given(doc=bodies, indent=st.booleans(), slice_bytes=st.integers(1, 64), cut=st.integers(0, 10**6), junk=st.sampled_from([b"", b"]", b"},{", b'"', b"\\"]))
def test_sliced_json_parse_is_the_whole_parse_or_declines(doc, indent, slice_bytes, cut, junk) -> None:
    """loads_in_slices (big produce bodies are parsed a slice of records at a time, so that
    orjson never holds the GIL for long) gives exactly orjson.loads(body), or None (the caller
    then parses the body whole), for any body, valid or not."""
    body = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)
    sliced = slicing.loads_in_slices(body, slice_bytes)
    rest = {k: v for k, v in doc.items() if k != "records"}
    if body.startswith(b'{"records":') and b"]" not in orjson.dumps(rest) and not _brackets_in_strings(doc):
        assert sliced == doc  # compact, records first, no "]" after them: the slicing applies
        event("sliced")
    else:
        assert sliced is None or sliced == doc
    damaged = body[: cut % (len(body) + 1)] + junk + body[cut % (len(body) + 1) :]
    sliced = slicing.loads_in_slices(damaged, slice_bytes)
    try:
        whole = orjson.loads(damaged)
    except orjson.JSONDecodeError:
        assert sliced is None
    else:
        assert sliced is None or sliced == whole


def test_the_gc_pause_is_counted_across_requests_and_restores_the_collector() -> None:
    assert gc.isenabled()
    with slicing.gc_paused():
        assert not gc.isenabled()
        with slicing.gc_paused():  # a second big request meanwhile
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()  # an operator's (or a test's) choice is kept
    try:
        with slicing.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_big_requests_back_to_back_do_not_pause_the_gc_for_ever(monkeypatch) -> None:
    monkeypatch.setattr(slicing, "GC_PAUSE_MAX_S", 0.0)
    with slicing.gc_paused():
        assert not gc.isenabled()
        with slicing.gc_paused():  # the pause has lasted too long: the collector runs again
            assert gc.isenabled()
    assert gc.isenabled()
