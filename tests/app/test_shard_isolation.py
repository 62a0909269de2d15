"""One shard down is one shard down: a family of 3 through a SIGKILL and a SIGSTOP of one shard.

Real processes (`eventlog serve --processes 3`), real connections. While shard 2 is dead or
stopped, the probes count every failure of a request that does not need it (appends to the
live shards' partitions, reads of every partition, /healthz), each on a new connection; and
every answer to an append that needs it (503 `unavailable` with Retry-After, in bounded time,
never a 500 or a hang). Requests already in flight on the shard when it is hit are not
counted: a connection it holds is the one thing that waits (the probes pause around the
signal itself). Afterwards every acknowledged record is read back at its offset, once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest

from engine.shards import owner_of

from ..conftest import ServerProcess, wait_until
from .test_supervisor import _identity

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # heartbeats under load: alone in make test

PARTITIONS = 9
VICTIM = 2
HEARTBEAT_TIMEOUT_MS = 5000


def _pids_by_index(server: ServerProcess) -> dict[int, int]:
    return {_identity(pid)["index"]: pid for pid in server.shard_pids()}


@dataclass
class Probes:
    """Requests in threads, each on a new connection, until stopped; paused around faults."""

    url: str
    live: list[int]
    victim: list[int]
    failures: list[str] = field(default_factory=list)  # requests that must not fail
    victim_answers: Counter = field(default_factory=Counter)
    victim_slowest_s: float = 0.0
    healthz_slowest_s: float = 0.0
    acked: list[tuple[int, int, str]] = field(default_factory=list)  # (partition, offset, value)
    bad_victim_answers: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _run: threading.Event = field(default_factory=threading.Event)
    _idle: list[threading.Event] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _n: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._run.set()
        for target in (self._live_loop, self._victim_loop, self._read_loop):
            idle = threading.Event()
            self._idle.append(idle)
            thread = threading.Thread(target=target, args=(idle,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def pause(self) -> None:
        """Return once no probe has a request in flight."""
        self._run.clear()
        for idle in self._idle:
            assert idle.wait(30), "a probe did not come back"

    def resume(self) -> None:
        self._run.set()

    def stop(self) -> None:
        self._stop.set()
        self._run.set()
        for thread in self._threads:
            thread.join(60)

    def _gate(self, idle: threading.Event) -> bool:
        if not self._run.is_set():
            idle.set()
            self._run.wait()
        idle.clear()
        return not self._stop.is_set()

    def _value(self) -> str:
        with self._lock:
            self._n += 1
            return f"v{self._n}"

    def _live_loop(self, idle: threading.Event) -> None:
        i = 0
        while self._gate(idle):
            p = self.live[i % len(self.live)]
            i += 1
            value = self._value()
            try:
                r = httpx.post(f"{self.url}/v1/topics/t/partitions/{p}/records", json={"records": [{"value": value}]}, timeout=10)
            except httpx.HTTPError as exc:
                self.failures.append(f"append to live partition {p}: {exc!r}")
                continue
            if r.status_code != 200:
                self.failures.append(f"append to live partition {p}: {r.status_code} {r.text}")
                continue
            self.acked.append((p, r.json()["base_offset"], value))
            started = time.monotonic()
            try:
                h = httpx.get(f"{self.url}/healthz", timeout=10)
                if h.status_code != 200:
                    self.failures.append(f"/healthz: {h.status_code}")
            except httpx.HTTPError as exc:
                self.failures.append(f"/healthz: {exc!r}")
            self.healthz_slowest_s = max(self.healthz_slowest_s, time.monotonic() - started)

    def _victim_loop(self, idle: threading.Event) -> None:
        i = 0
        while self._gate(idle):
            p = self.victim[i % len(self.victim)]
            i += 1
            value = self._value()
            started = time.monotonic()
            try:
                r = httpx.post(f"{self.url}/v1/topics/t/partitions/{p}/records", json={"records": [{"value": value}]}, timeout=20)
            except httpx.HTTPError as exc:
                self.bad_victim_answers.append(f"append to partition {p} of the victim: {exc!r}")
                continue
            self.victim_slowest_s = max(self.victim_slowest_s, time.monotonic() - started)
            self.victim_answers[r.status_code] += 1
            if r.status_code == 200:
                self.acked.append((p, r.json()["base_offset"], value))
            elif r.status_code == 503 and r.json()["code"] == "unavailable" and r.headers.get("retry-after") == "1":
                time.sleep(0.05)
            else:
                self.bad_victim_answers.append(f"append to partition {p} of the victim: {r.status_code} {r.text}")

    def _read_loop(self, idle: threading.Event) -> None:
        i = 0
        while self._gate(idle):
            p = i % PARTITIONS  # every partition, the victim's too: reads need no owner
            i += 1
            try:
                r = httpx.get(f"{self.url}/v1/topics/t/partitions/{p}/records?offset=0&max_records=5", timeout=10)
            except httpx.HTTPError as exc:
                self.failures.append(f"read of partition {p}: {exc!r}")
                continue
            if r.status_code != 200:
                self.failures.append(f"read of partition {p}: {r.status_code} {r.text}")


def _family(server_factory, **env: str) -> ServerProcess:
    server = server_factory(EVENTLOG_SHARD_HEARTBEAT_TIMEOUT_MS=str(HEARTBEAT_TIMEOUT_MS), **env)
    server.processes = 3
    server.start(timeout=60)
    return server


def _check_acknowledged(server: ServerProcess, acked: list[tuple[int, int, str]]) -> None:
    by_partition: dict[int, dict[int, str]] = {}
    for p, offset, value in acked:
        assert offset not in by_partition.setdefault(p, {}), f"offset {offset} of partition {p} acknowledged twice"
        by_partition[p][offset] = value
    with server.client() as client:
        for p, expected in by_partition.items():
            got: dict[int, str] = {}
            offset = 0
            while True:
                page = client.get(f"/v1/topics/t/partitions/{p}/records", params={"offset": offset, "max_records": 1000}).json()
                for record in page["records"]:
                    got[record["offset"]] = record["value"]
                if not page["records"]:
                    break
                offset = page["records"][-1]["offset"] + 1
            missing = {o: v for o, v in expected.items() if got.get(o) != v}
            assert not missing, f"partition {p}: acknowledged records missing or changed: {sorted(missing.items())[:5]}"
            assert sorted(got.values()) == sorted(set(got.values())), f"partition {p}: a record twice"


def test_a_family_of_3_serves_the_live_shards_through_a_sigkill_and_a_sigstop_of_the_third(server_factory) -> None:
    server = _family(server_factory)
    with server.client() as client:
        # before any fault: a shard starved of CPU may miss its beats a moment (503, retried)
        wait_until(
            lambda: client.post("/v1/topics", json={"name": "t", "partitions": PARTITIONS}).status_code
            in (201, 409),
            timeout=30, interval=0.5, what="topic t created",
        )
    live = [p for p in range(PARTITIONS) if owner_of("t", p, 3) != VICTIM]
    victim = [p for p in range(PARTITIONS) if owner_of("t", p, 3) == VICTIM]
    assert live and victim
    before = _pids_by_index(server)
    probes = Probes(server.url, live, victim)
    probes.start()
    try:
        time.sleep(1)
        # -- SIGKILL: the shard is started again alone; the others never stop ------------------
        probes.pause()
        os.kill(before[VICTIM], signal.SIGKILL)
        probes.resume()
        wait_until(lambda: "is back after restart 1" in server.log(), timeout=60, what="the victim's restart")
        time.sleep(1)
        assert probes.victim_answers[503] > 0, f"no append met the dead shard: {probes.victim_answers} {probes.bad_victim_answers[:3]}"
        after_kill = _pids_by_index(server)
        assert after_kill[0] == before[0] and after_kill[1] == before[1], "a live shard was restarted"
        # -- SIGSTOP: found silent, handed nothing, killed at the deadline, started again ---------
        served_503 = probes.victim_answers[503]
        probes.pause()
        os.kill(after_kill[VICTIM], signal.SIGSTOP)
        probes.resume()
        wait_until(lambda: "is back after restart 2" in server.log(), timeout=60, what="the stopped shard's replacement")
        time.sleep(1)
        assert probes.victim_answers[503] > served_503, f"no append met the stopped shard: {probes.victim_answers} {probes.bad_victim_answers[:3]}"
    finally:
        probes.stop()
    log = server.log()
    assert f"shard 2 (pid {after_kill[VICTIM]}) is not answering" in log
    assert f"shard 2 (pid {after_kill[VICTIM]}) gave no heartbeat for" in log
    assert _pids_by_index(server)[0] == before[0] and _pids_by_index(server)[1] == before[1]
    assert probes.failures == [], probes.failures[:10]
    assert probes.bad_victim_answers == [], probes.bad_victim_answers[:10]
    # a forwarded append to a stopped owner answers within the silence threshold and a sweep
    assert probes.victim_slowest_s < HEARTBEAT_TIMEOUT_MS / 1000, probes.victim_slowest_s
    assert probes.healthz_slowest_s < 2.0, probes.healthz_slowest_s
    _check_acknowledged(server, probes.acked)
    assert "Traceback" not in log
    assert server.stop() == 0


def test_topic_changes_while_a_shard_is_down_answer_503_or_succeed(server_factory) -> None:
    """Delete and alter need no live shard but the controller (the others replay the metadata
    log when they start again); create and add partitions need every owner: 503 while one is
    down. Never a 500, and a deleted topic's partitions on the dead shard are gone after it is
    back."""
    server = _family(server_factory)
    # a new connection per request: one held by the stopped shard would wait with it
    with httpx.Client(base_url=server.url, timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for name in ("a", "b"):
            # before any fault: a shard starved of CPU on a loaded machine may miss its beats
            # for a moment (503, retried), never a failure
            made = wait_until(
                lambda name=name: client.post("/v1/topics", json={"name": name, "partitions": PARTITIONS}).status_code
                in (201, 409),
                timeout=30, interval=0.5, what=f"topic {name} created",
            )
            assert made
            assert client.post(f"/v1/topics/{name}/records", json={"records": [{"value": "x"}] * 20}).status_code == 200
        pids = _pids_by_index(server)
        os.kill(pids[VICTIM], signal.SIGSTOP)  # stopped, then killed at the deadline: "down" the whole time
        try:
            seen = Counter()
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                r = client.post("/v1/topics", json={"name": "c", "partitions": PARTITIONS})
                seen[r.status_code] += 1
                if r.status_code == 201:
                    break
            assert seen[201] == 0 and set(seen) <= {503}, seen
            r = client.post("/v1/topics/b/partitions", json={"count": PARTITIONS + 3})
            assert r.status_code == 503, r.text
            r = client.patch("/v1/topics/b/configs", json={"configs": {"retention.ms": 3600000}})
            assert r.status_code in (200, 503), r.text
            r = client.delete("/v1/topics/a")
            assert r.status_code in (204, 503), r.text
            deleted = r.status_code == 204
            assert "gave no heartbeat" not in server.log(), "the changes took longer than the heartbeat timeout"
            wait_until(lambda: "is back after restart 1" in server.log(), timeout=60, what="the victim's restart")
        finally:
            try:
                os.kill(pids[VICTIM], signal.SIGCONT)  # if it was not killed yet (the test failed)
            except ProcessLookupError:
                pass
        if not deleted:
            assert client.delete("/v1/topics/a").status_code == 204
        assert client.get("/v1/topics/a").status_code == 404
        data = server.data_dir
        wait_until(lambda: not any(d.name.startswith("a-") for d in data.iterdir()), timeout=30, what="a's directories to go")
        assert client.post("/v1/topics", json={"name": "c", "partitions": PARTITIONS}).status_code == 201
    assert " 500 " not in server.log() and "internal_error" not in server.log()
    assert server.stop() == 0


def test_a_shard_killed_while_it_restarts_is_started_again(server_factory) -> None:
    """The supervisor never gives up on a shard that can still start: a SIGKILL while the shard
    starts again is one more death."""
    server = _family(server_factory)
    pids = _pids_by_index(server)
    os.kill(pids[1], signal.SIGKILL)
    wait_until(lambda: "shard 1 started (pid" in server.log() and "restart 1" in server.log(), what="the restart to begin")
    new = _pids_by_index(server).get(1)
    assert new is not None and new != pids[1]
    os.kill(new, signal.SIGKILL)  # before it is ready (it takes seconds to import and recover)
    wait_until(lambda: "is back after restart 2" in server.log(), timeout=60, what="the second restart")
    assert "giving up" not in server.log()
    assert server.proc.poll() is None
    with server.client() as client:
        assert client.get("/readyz").status_code == 200
    assert server.stop() == 0
