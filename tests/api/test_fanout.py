"""Event streams at fan-out (api/tail.py): every subscriber gets every record once and in
order, each chunk is read and encoded once for all the subscribers at its position, a slow
subscriber holds nobody up and misses nothing, and subscribers that leave end their streams."""

from __future__ import annotations

import socket
import time

import httpx
import orjson
import pytest

from .test_hangs import wait_for, waiters

PATH = "/v1/topics/t/partitions/0/records/stream"


class Subscriber:
    """One SSE stream on a raw socket (so a test can leave it unread)."""

    def __init__(self, port: int, path: str = PATH, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n".encode())
        self.data = bytearray()

    def read_until(self, records: int, timeout: float = 20) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.records()) < records:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{len(self.records())} of {records} records arrived")
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise AssertionError("the server closed the stream")
            self.data += chunk
        return self.records()

    def records(self) -> list[dict]:
        out = []
        for line in bytes(self.data).split(b"\n")[:-1]:  # complete lines only
            if line.startswith(b"data: "):
                out.append(orjson.loads(line[6:]))
        return out

    def close(self) -> None:
        self.sock.close()


def _metric(server, name: str) -> float:
    total = 0.0
    for line in httpx.get(f"{server.url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            total += float(line.split()[-1])
    return total


@pytest.mark.parametrize("processes", ["1", "2"])
def test_every_subscriber_gets_every_record_once_in_order_encoded_once(server_factory, processes: str) -> None:
    server = server_factory(EVENTLOG_PROCESSES=processes).start()
    try:
        with server.client() as c:
            assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
            subs = [Subscriber(server.port) for _ in range(20)]
            wait_for(lambda: waiters(server, "t", 0) == 20, what="20 parked subscribers")
            encoded0 = _metric(server, "eventlog_stream_chunks_encoded_total")
            for i in range(30):
                assert c.post("/v1/topics/t/partitions/0/records", json={"records": [{"value": f"v{i}"}]}).status_code == 200
            for sub in subs:
                got = sub.read_until(30)
                assert [r["offset"] for r in got] == list(range(30))
                assert [r["value"] for r in got] == [f"v{i}" for i in range(30)]
            time.sleep(0.3)
            assert [len(sub.records()) for sub in subs] == [30] * 20, "a record came twice"
            encoded = _metric(server, "eventlog_stream_chunks_encoded_total") - encoded0
            # once per chunk and shard (a shard serves its own connections), not per subscriber
            assert 0 < encoded <= 30 * int(processes), encoded
            assert _metric(server, "eventlog_stream_chunks_pushed_total") > 0
            for sub in subs:
                sub.close()
            wait_for(lambda: waiters(server, "t", 0) == 0, what="the streams to end")
    finally:
        server.stop()


def test_a_slow_subscriber_holds_nobody_up_and_misses_nothing(server_factory) -> None:
    server = server_factory().start()
    try:
        with server.client() as c:
            assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
            slow = Subscriber(server.port, rcvbuf=4096)  # reads nothing until the end
            fast = Subscriber(server.port)
            wait_for(lambda: waiters(server, "t", 0) == 2, what="2 parked subscribers")
            value = "x" * 30_000
            for i in range(40):  # ~1.2 MB: more than the slow one's socket and the parked limit
                r = c.post("/v1/topics/t/partitions/0/records", json={"records": [{"key": str(i), "value": value}]})
                assert r.status_code == 200
            got = fast.read_until(40)
            assert [r["key"] for r in got] == [str(i) for i in range(40)]
            assert len(slow.data) == 0
            for i in range(40, 45):  # the fast one is still served while the slow one lags
                c.post("/v1/topics/t/partitions/0/records", json={"records": [{"key": str(i), "value": "y"}]})
            assert [r["key"] for r in fast.read_until(45)] == [str(i) for i in range(45)]
            got = slow.read_until(45, timeout=30)
            assert [r["key"] for r in got] == [str(i) for i in range(45)]
            assert [r["value"] for r in got] == [value] * 40 + ["y"] * 5
            slow.close()
            fast.close()
            wait_for(lambda: waiters(server, "t", 0) == 0, what="the streams to end")
            in_flight = _metric(server, "eventlog_http_requests_in_flight")
            assert in_flight == 1, in_flight  # the /metrics request itself
    finally:
        server.stop()


def test_long_polls_woken_by_one_record_share_one_answer(server_factory) -> None:
    from .test_hangs import LongPoll

    server = server_factory(EVENTLOG_PROCESSES="1").start()
    try:
        with server.client() as c:
            assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
            path = "/v1/topics/t/partitions/0/records"
            assert c.get(path, params={"offset": 0}).json()["records"] == []
            polls = [LongPoll(server.url, path, {"offset": 0, "max_wait_ms": 30_000}) for _ in range(10)]
            for poll in polls:
                poll.start()
            wait_for(lambda: waiters(server, "t", 0) == 10, what="10 long-polls waiting")
            reused0 = _metric(server, "eventlog_fetch_answers_reused_total")
            assert c.post(path, json={"records": [{"value": "v0"}]}).status_code == 200
            for poll in polls:
                poll.join(10)
                assert poll.response is not None and poll.response.status_code == 200, poll.error
                assert [r["value"] for r in poll.response.json()["records"]] == ["v0"]
            # one read and encoding, given to the others as it was
            assert _metric(server, "eventlog_fetch_answers_reused_total") - reused0 >= 8
            # a later write is seen at once: an answer is only given again while the log is unchanged
            assert c.post(path, json={"records": [{"value": "v1"}]}).status_code == 200
            assert [r["value"] for r in c.get(path, params={"offset": 0}).json()["records"]] == ["v0", "v1"]
    finally:
        server.stop()
