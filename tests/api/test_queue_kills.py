"""20 workers on one queue through SIGKILLs (issue 26's main test): every record ends
acknowledged exactly once or dead-lettered, none lost, delivery counts exact, a key's records
leased in order.

A real `eventlog serve` (one process, and a family of 2 shards) and 20 worker threads, each
with its own connection, on one `ordering: key` queue with a short lock and a dead-letter topic.
A worker leases a few records and, per batch, dies (drops its leases and its connection: the
records come back when their lock runs out), or per record acknowledges, releases or rejects.
Between bursts of work the server is SIGKILLed and started again (twice at N = 1, once at
N = 2), and at N = 2 each shard is first SIGKILLed alone (each holds the queue's windows of the
partitions it owns; shard 1 owns some partitions of the topic and of the dead-letter topic,
whose windows stop while it is down: dead letters wait, and a settle meeting them answers 503).
While shard 1 is down (its supervisor stopped, so that it is not started again meanwhile),
leases go on from shard 0's partitions.

The workers are paused around each signal (no request in flight when it lands), so every lease
the server answered was seen by a worker: the delivery counts a record was leased with must be
exactly 1, 2, 3, ... (a count persisted for a lease whose answer was lost would show as a gap).
Requests that meet a shard down (503, a refused connection) are retried. Key order is checked
after the run on the server's own clock (a lease's start is its lease_expires_at less the lock):
once a record was first leased, no earlier record of its key was leased again, and every lease
of one had ended by then (its lock ran out, a settle of it had been sent, or the queues'
process had been killed).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
import pytest

from engine.shards import owner_of

from ..conftest import ServerProcess, wait_until

pytestmark = pytest.mark.slow

WORKERS = 20
RECORDS = 240  # produced before the first kill; as many again after it
KEYS = 30
PARTITIONS = 3
DEAD_PARTITIONS = 2
LOCK_MS = 400
MAX_DELIVERIES = 3
Q = "/v1/topics/jobs/queues/work"


@dataclass
class Lease:
    """One delivery a worker saw, in the server's time (ms)."""

    count: int
    start: int  # when the server leased it: lease_expires_at - the lock
    expires: int
    ended: float = float("inf")  # when a settle of it was sent (it ended no later than that)


@dataclass
class Seen:
    """What the workers saw of one record."""

    partition: int
    offset: int
    key: str
    leases: list[Lease] = field(default_factory=list)
    acked: int = 0  # 'acked' answers
    rejected: bool = False
    unsure: bool = False  # a settle of it failed: what that try did is not known here

    def counts(self) -> list[int]:
        return sorted(lease.count for lease in self.leases)


class Pool:
    """The workers, their shared record of what they saw, and a gate that pauses them with no
    request in flight."""

    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.rng = random.Random(seed)
        self.lock = threading.Lock()  # what the workers saw, below
        self.seen: dict[str, Seen] = {}  # by value
        self.by_key: dict[tuple[int, str], list[int]] = defaultdict(list)  # offsets, ascending
        self.values: dict[tuple[int, int], str] = {}
        self.kills: list[float] = []  # when the process holding the queues' state was killed (ms)
        self.errors: list[str] = []
        self.retries = 0
        self._gate = threading.Condition()
        self._paused = False
        self._in_flight = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, args=(i,)) for i in range(WORKERS)]

    # -- the gate ---------------------------------------------------------------------------

    def pause(self) -> None:
        with self._gate:
            self._paused = True
            assert self._gate.wait_for(lambda: self._in_flight == 0, timeout=60), "stuck request"

    def resume(self) -> None:
        with self._gate:
            self._paused = False
            self._gate.notify_all()

    def _request(self, client: httpx.Client, path: str, body: dict) -> tuple[dict, int]:
        """POST, retried through a shard or server that is down (503, a refused or reset
        connection) until answered: (the answer, the failed tries); each try waits while the
        pool is paused."""
        failed = 0
        while not self._stop.is_set():
            with self._gate:
                self._gate.wait_for(lambda: not self._paused)
                self._in_flight += 1
            try:
                r = client.post(path, json=body)
            except httpx.TransportError:
                r = None
            finally:
                with self._gate:
                    self._in_flight -= 1
                    self._gate.notify_all()
            if r is not None and r.status_code == 200:
                return r.json(), failed
            if r is not None and r.status_code != 503:
                self.errors.append(f"{path}: {r.status_code} {r.text[:300]}")
            self.retries += 1
            failed += 1
            time.sleep(0.05)
        raise _Stopped

    # -- the workers ------------------------------------------------------------------------

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        self.resume()
        for t in self._threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads)

    def _work(self, i: int) -> None:
        rng = random.Random(i)
        client = httpx.Client(base_url=self.url, timeout=60)
        try:
            while not self._stop.is_set():
                body = {"max_records": rng.randint(1, 5), "wait_ms": 100}
                records = self._request(client, Q + "/lease", body)[0]["records"]
                if records:
                    self._leased(records)
                if rng.random() < 0.12:  # dies holding its leases; a new worker starts
                    client.close()
                    client = httpx.Client(base_url=self.url, timeout=60)
                    continue
                by_action: dict[str, list[str]] = defaultdict(list)
                for r in records:
                    x = rng.random()
                    action = "reject" if x < 0.04 else "release" if x < 0.1 else "ack"
                    if _poison(r["value"]):  # (always released: it meets max_deliveries)
                        action = "release"
                    by_action[action].append(r)
                for action, batch in by_action.items():
                    self._settle(client, action, batch)
        except _Stopped:
            pass
        except Exception as exc:  # noqa: BLE001 -- reported by the test
            self.errors.append(f"worker {i}: {exc!r}")
        finally:
            client.close()

    def _leased(self, records: list[dict]) -> None:
        with self.lock:
            for r in records:
                s = self.seen[r["value"]]
                assert (s.partition, s.offset) == (r["partition"], r["offset"])
                expires = r["lease_expires_at"]
                s.leases.append(Lease(r["delivery_count"], expires - LOCK_MS, expires))

    def _settle(self, client: httpx.Client, action: str, records: list[dict]) -> None:
        leases = [r["lease"] for r in records]
        body: dict = {"leases": leases}
        if action == "release":
            body["delay_ms"] = self.rng.choice((0, 50))
        sent = time.time() * 1000
        answer, failed = self._request(client, f"{Q}/{action}", body)
        results = answer["results"]
        assert [x["lease"] for x in results] == leases
        with self.lock:
            for r, x in zip(records, results, strict=True):
                s = self.seen[r["value"]]
                lease = next(x for x in s.leases if x.count == r["delivery_count"])
                lease.ended = min(lease.ended, sent)
                s.unsure = s.unsure or bool(failed)
                if x["status"] == "acked":
                    s.acked += 1
                elif x["status"] == "rejected":
                    s.rejected = True
                elif x["status"] not in ("released", "expired"):
                    self.errors.append(f"{action}: {x}")

    def order_violations(self) -> list[str]:
        """`ordering: key`, from the server's own times: once a record's first lease began,
        every earlier record of its key had had its last lease, and that lease had ended (its
        lock ran out, a settle of it was sent, or the queues' process was killed)."""
        out = []
        for (p, _key), offsets in self.by_key.items():
            for i, o2 in enumerate(offsets):
                later = self.seen[self.values[(p, o2)]]
                if not later.leases:
                    continue
                first = min(lease.start for lease in later.leases)
                for o1 in offsets[:i]:
                    for lease in self.seen[self.values[(p, o1)]].leases:
                        killed = next((k for k in self.kills if k > lease.start), float("inf"))
                        end = min(lease.expires, lease.ended, killed)
                        if lease.start > first or end > first + 1:  # (ms: 1 of rounding)
                            out.append(
                                f"partition {p}: {o1} {lease} while {o2} from {first} "
                                f"({self.seen[self.values[(p, o1)]]}, {later}, kills {self.kills})"
                            )
        return out


class _Stopped(Exception):
    pass


def _poison(value: str) -> bool:
    """A record no worker can do (one in 50): every worker releases it, so each run meets
    max_deliveries' dead letters, not only when chance lets a record fail three times (which,
    at ~480 records, it did not in about one run of ten)."""
    return int(value[1:]) % 50 == 7


def _produce(
    server: ServerProcess, pool: Pool, first: int, n: int, partitions: list[int] | None = None
) -> None:
    """`n` records "r<first>"...; keyed k0..k<KEYS - 1>, or with `partitions`, each its own key,
    to those partitions in turn."""
    records = [{"key": f"k{i % KEYS}", "value": f"r{i}"} for i in range(first, first + n)]
    if partitions is not None:
        records = [{**r, "key": f"x{i}", "partition": partitions[i % len(partitions)]}
                   for i, r in enumerate(records)]
    with server.client() as c:  # (a shard just restarted may still be 503 to the other)
        headers = {"idempotency-key": f"batch-{first}"}

        def produced() -> bool:
            nonlocal r
            r = c.post("/v1/topics/jobs/records", json={"records": records}, headers=headers)
            assert r.status_code in (200, 503), r.text
            return r.status_code == 200

        r = None
        wait_until(produced, timeout=30, interval=0.2, what="the records produced")
        assert r is not None
    with pool.lock:
        for rec, o in zip(records, r.json()["offsets"], strict=True):
            p, offset = o["partition"], o["offset"]
            pool.seen[rec["value"]] = Seen(p, offset, rec["key"])
            pool.by_key[(p, rec["key"])].append(offset)
            pool.values[(p, offset)] = rec["value"]


def _shard_pid(server: ServerProcess, index: int) -> int:
    from ..app.test_supervisor import _identity

    return next(pid for pid in server.shard_pids() if _identity(pid)["index"] == index)


def _lease_while_shard_1_is_down(server: ServerProcess, pool: Pool) -> None:
    """Shard 1 killed and not started again (its supervisor stopped): shard 0 alone accepts
    connections and leases the records of its own partitions (shard 1's windows wait for it).
    What it leases is the pool's to account for (the leases run out: the records come back)."""
    assert server.proc is not None
    mine = {p for p in range(PARTITIONS) if owner_of("jobs", p, 2) == 0}
    # (the workers may have settled every record of shard 0's partitions by now)
    _produce(server, pool, 10_000, 10, sorted(mine))
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        os.kill(_shard_pid(server, 1), signal.SIGKILL)
        got: list[dict] = []
        with httpx.Client(base_url=server.url, timeout=30) as c:
            for _try in range(50):
                r = c.post(Q + "/lease", json={"max_records": 5, "wait_ms": 200})
                assert r.status_code == 200, r.text  # (shard 1's partitions: not asked for)
                if got := r.json()["records"]:
                    break
        assert got, "no lease from shard 0's partitions while shard 1 was down"
        pool._leased(got)
        assert {r["partition"] for r in got} <= mine, got
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def _kill_shard(server: ServerProcess, pool: Pool, index: int, restarts: int) -> None:
    pool.pause()
    if index == 1:
        _lease_while_shard_1_is_down(server, pool)
    else:
        os.kill(_shard_pid(server, index), signal.SIGKILL)
    if index == 0:  # its partitions' windows: leases end with it; wait until it is back
        pool.kills.append(time.time() * 1000)
        wait_until(
            lambda: f"is back after restart {restarts}" in server.log(),
            timeout=60,
            what=f"shard {index}'s restart",
        )
    pool.resume()


def _kill_server(server: ServerProcess, pool: Pool) -> None:
    pool.pause()
    server.kill()
    pool.kills.append(time.time() * 1000)
    server.start(timeout=60)
    pool.resume()


def _settled_everything(server: ServerProcess) -> bool:
    with server.client() as c:
        r = c.get(Q)
    if r.status_code != 200:
        return False
    parts = r.json()["partitions"]
    return all(
        p["lag"] == 0 and p["start_offset"] == p["end_offset"] and not p.get("offline")
        for p in parts
    )


def _dead_letters(server: ServerProcess) -> list[dict]:
    out = []
    with server.client() as c:
        for p in range(DEAD_PARTITIONS):
            offset = 0
            while True:
                params = {"offset": offset, "max_records": 1000}
                r = c.get(f"/v1/topics/jobs.dead/partitions/{p}/records", params=params)
                assert r.status_code == 200, r.text
                page = r.json()["records"]
                if not page:
                    break
                offset = page[-1]["offset"] + 1
                out += [
                    {**rec, "headers": {h["key"]: h["value"] for h in rec["headers"]}}
                    for rec in page
                ]
    return out


@pytest.mark.parametrize("shards", [1, 2], ids=lambda n: f"N={n}")
def test_twenty_workers_through_sigkills_settle_every_record_once(server_factory, shards) -> None:
    server = server_factory(EVENTLOG_SHARD_HEARTBEAT_TIMEOUT_MS="5000")
    server.processes = shards
    server.start(timeout=60)
    with server.client() as c:
        for name, n in (("jobs", PARTITIONS), ("jobs.dead", DEAD_PARTITIONS)):
            assert c.post("/v1/topics", json={"name": name, "partitions": n}).status_code == 201
        settings = {
            "lock_ms": LOCK_MS,
            "max_deliveries": MAX_DELIVERIES,
            "ordering": "key",
            "dead_letter_topic": "jobs.dead",
        }
        assert c.put(Q, json=settings).status_code == 201
    if shards == 2:  # shard 1 owns a partition of each topic: its death reaches both
        assert {owner_of("jobs", p, 2) for p in range(PARTITIONS)} == {0, 1}
        assert {owner_of("jobs.dead", p, 2) for p in range(DEAD_PARTITIONS)} == {0, 1}
    pool = Pool(server.url, seed=shards)
    _produce(server, pool, 0, RECORDS)
    pool.start()
    try:
        time.sleep(1.5)
        if shards == 2:  # each shard alone, then (below) the whole family
            _kill_shard(server, pool, 1, 1)
            time.sleep(1.0)
            _kill_shard(server, pool, 0, 1)
        else:
            _kill_server(server, pool)
        pool.pause()
        _produce(server, pool, RECORDS, RECORDS)
        pool.resume()
        time.sleep(1.0)
        _kill_server(server, pool)
        wait_until(lambda: _settled_everything(server), timeout=90, what="every record settled")
    finally:
        pool.stop()
    assert pool.errors == [], pool.errors[:10]
    violations = pool.order_violations()
    assert violations == [], violations[:10]
    dead = _dead_letters(server)
    by_source: dict[str, list[dict]] = defaultdict(list)
    for d in dead:
        by_source[d["value"]].append(d)
    outcomes: dict[str, int] = defaultdict(int)
    for value, s in pool.seen.items():
        letters = by_source.get(value, [])
        # delivered at least once, each delivery counted: 1, 2, 3, ... with no gap or repeat
        counts = s.counts()
        assert counts == list(range(1, len(counts) + 1)), (value, s)
        assert len(counts) <= MAX_DELIVERIES, (value, s)
        assert not (s.acked and _poison(value)), (value, s)
        if s.acked:
            assert s.acked == 1 and not letters, (value, s, letters)
            outcomes["acked"] += 1
            continue
        assert len(letters) == 1, f"{value}: neither acknowledged nor dead-lettered once: {s}"
        h = letters[0]["headers"]
        assert (h["eventlog.source.topic"], h["eventlog.source.partition"]) == (
            "jobs",
            str(s.partition),
        )
        assert h["eventlog.source.offset"] == str(s.offset)
        assert h["eventlog.delivery.count"] == str(counts[-1]), (value, s, h)
        assert letters[0]["key"] == s.key
        if h["eventlog.dead.reason"] == "max_deliveries":
            assert counts[-1] == MAX_DELIVERIES, (value, s, h)
        else:
            assert h["eventlog.dead.reason"] == "rejected" and (s.rejected or s.unsure), (s, h)
            assert not _poison(value), (value, s, h)
        outcomes[h["eventlog.dead.reason"]] += 1
    assert set(by_source) <= set(pool.seen)
    with server.client() as c:
        parts = c.get(Q).json()["partitions"]
    assert sum(p["acked"] for p in parts) == outcomes["acked"]
    assert sum(p["dead_lettered"] for p in parts) == len(dead)
    # the run met every path: acknowledgements, both kinds of dead letter, redeliveries
    assert outcomes["acked"] and outcomes["rejected"] and outcomes["max_deliveries"], outcomes
    assert any(len(s.leases) > 1 for s in pool.seen.values())
    assert "Traceback" not in server.log()
    assert server.stop() == 0
