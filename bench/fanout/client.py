"""Drives bench/fanout/subscribers.c and judges what it saw: standard library only.

`Subscribers` runs the C client (N connections, epoll, one thread) and reads its JSON findings;
`paced` sends a value every `interval` seconds on a fixed schedule ("T=<ns>;S=<n>;": its send
time and sequence, from which the client takes each delivery's latency); `judge` adds
exactly-once-in-order and memory per subscriber to the findings.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).parent / "subscribers.c"


def build(binary: Path, gcc: str = "gcc") -> Path:
    """Compile subscribers.c to `binary` (gcc -O2)."""
    subprocess.run([gcc, "-O2", "-Wall", "-o", str(binary), str(SOURCE)], check=True, capture_output=True, text=True)
    return binary


def rss_bytes(pids: list[int]) -> int:
    """Resident memory of `pids` together (/proc VmRSS; a pid gone meanwhile counts 0)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class Subscribers:
    """`binary sse|redis 127.0.0.1 PORT PATH|CHANNEL N`, optionally under a command prefix
    (taskset)."""

    def __init__(self, binary: Path, mode: str, port: int, target: str, n: int, prefix: list[str] | None = None) -> None:
        self.n = n
        self.process = subprocess.Popen(
            [*(prefix or []), str(binary), mode, "127.0.0.1", str(port), target, str(n)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def wait_ready(self) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # blocks until "ready" (or the client ends)
        if line.strip() != "ready":
            self.process.kill()
            raise RuntimeError(f"subscribers not ready: {line!r} {self.process.stderr.read() if self.process.stderr else ''}")

    def finish(self) -> dict[str, Any]:
        out, err = self.process.communicate("stop\n", timeout=60)
        if self.process.returncode != 0:
            raise RuntimeError(f"subscribers failed ({self.process.returncode}): {err}")
        return json.loads(out.strip().splitlines()[-1])


def paced(first: int, records: int, interval: float, send: Callable[[str], None]) -> float:
    """send(value) for sequences first.. every `interval` seconds on a fixed schedule; returns
    the seconds it took."""
    start = time.perf_counter()
    for i in range(records):
        due = start + i * interval
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(f"T={time.time_ns()};S={first + i};")
    return time.perf_counter() - start


def judge(got: dict[str, Any], n: int, sent: int, rss_delta: int, cores: float) -> dict[str, Any]:
    """The client's findings plus: did every one of `n` subscribers get all `sent` records,
    once each, in order; server memory per subscriber; server cores while sending."""
    exact = (
        got["started"] == n and got["closed"] == 0 and got["gaps"] == 0 and got["repeats"] == 0
        and got["unparsed"] == 0 and got["min_per_connection"] == sent and got["max_per_connection"] == sent
    )
    return {
        **got,
        "records_sent": sent,
        "exactly_once_in_order": exact,
        "kb_per_subscriber": round(rss_delta / n / 1024, 2),
        "server_cores": round(cores, 3),
    }


class HttpProducer:
    """One keep-alive connection POSTing one-record JSON bodies to `path`; send(value) raises
    unless the answer is 200."""

    def __init__(self, port: int, path: str) -> None:
        import http.client

        self.path = path
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def __call__(self, value: str) -> None:
        body = json.dumps({"records": [{"value": value}]}).encode()
        self.conn.request("POST", self.path, body, {"Content-Type": "application/json"})
        answer = self.conn.getresponse()
        text = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"produce: {answer.status} {text[:300]!r}")

    def close(self) -> None:
        self.conn.close()


class RedisPublisher:
    """One connection PUBLISHing to `channel`; send(value) raises unless all `n` subscribers
    got it."""

    def __init__(self, port: int, channel: str, n: int) -> None:
        import socket

        self.channel, self.n = channel.encode(), n
        self.conn = socket.create_connection(("127.0.0.1", port))
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.conn.makefile("rb")

    def __call__(self, value: str) -> None:
        data = value.encode()
        self.conn.sendall(b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(self.channel), self.channel, len(data), data))
        reply = self.reader.readline()
        if int(reply[1:]) != self.n:
            raise RuntimeError(f"PUBLISH reached {reply!r} subscribers, not {self.n}")

    def close(self) -> None:
        self.reader.close()
        self.conn.close()


def run_stream(
    subscribers: Subscribers, send: Callable[[str], None], pids: list[int], cpu_seconds: Callable[[], float],
    records: int, warm_up: int, interval: float, rss0: int,
) -> dict[str, Any]:
    """The warm-up (then the server's memory, `pids`, is read), the measured records (the
    server's CPU meanwhile, from `cpu_seconds`), a second for the last deliveries, and the
    subscribers' findings judged."""
    paced(0, warm_up, interval, send)
    rss1 = rss_bytes(pids)
    cpu0 = cpu_seconds()
    seconds = paced(warm_up, records, interval, send)
    cpu = cpu_seconds() - cpu0
    time.sleep(1)
    return judge(subscribers.finish(), subscribers.n, records + warm_up, rss1 - rss0, cpu / seconds)
