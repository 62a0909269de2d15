"""The soak's queue workers (issue 26): a queue on the aggregates topic, leased through the
soak's faults, drained at the end and judged against what the workers were told.

The queue (QUEUE on AGGREGATES: `ordering: key`, a short lock, MAX_DELIVERIES, dead letters to
DEAD_TOPIC) takes every record the key writers append: twelve keys, all contended, so the key
order is exercised on every lease. QUEUE_WORKERS tasks lease a few records at a time and,
per batch, abandon it (a worker dying: the records come back when their lock runs out) or, per
record, acknowledge (most), release or reject. Their requests go through Load._request like the
writers': held while the runner verifies; a refused connection or a 503 (a shard down) is
tried again while the lease holds; a lost answer or another 5xx leaves the settle *in doubt*
(it may or may not have happened) and is tried again too -- an answer at last decides it,
exactly as the exact writers resolve a write in doubt. A lease whose answer was lost may have
handed out records no worker saw: their delivery counts were spent unseen (`unseen_slots`).

At the end (after the last fault, once the key writers are settled) the workers stop, a drain
acknowledges everything left until the queue's window is empty, and check() judges:
* every acknowledged record of the topic is finally acknowledged once or dead-lettered once
  (an acknowledgement in doubt counts as one): else `queue_lost`;
* no record answered `acked` twice (`queue_double_ack`), nor leased again at a later delivery
  after its `acked` answer (`queue_redelivered_after_ack`), nor acknowledged and dead-lettered
  (`queue_acked_and_dead`), nor dead-lettered twice (`queue_dead_twice`);
* a record's delivery counts never repeat, and grow by one per lease: the counts missing from
  what the workers saw are at most the slots of the leases whose answers were lost
  (`queue_delivery_count`); a dead letter names the source record and a count no lower than
  the last one seen, MAX_DELIVERIES when that was its reason;
* the key order, on the server's clock (a lease began at lease_expires_at less the lock): once
  a record was first leased, no earlier record of its key was leased again, and each lease of
  one had ended by then -- its lock ran out, a settle of it was sent, or a fault hit the server
  (`queue_order`), as tests/api/test_queue_kills.py judges it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from .model import AGGREGATES, Model

QUEUE = "soak-work"
DEAD_TOPIC = "soak-dead"
DEAD_PARTITIONS = 1
QUEUE_URL = f"/v1/topics/{AGGREGATES}/queues/{QUEUE}"
LOCK_MS = 1500
MAX_DELIVERIES = 4
QUEUE_WORKERS = 3
QUEUE_SETTINGS = {
    "lock_ms": LOCK_MS,
    "max_deliveries": MAX_DELIVERIES,
    "ordering": "key",
    "dead_letter_topic": DEAD_TOPIC,
}
ABANDON, REJECT, RELEASE = 0.06, 0.03, 0.08  # per batch; per record (else ack)
DRAIN_TIMEOUT_S = 60.0
RETRY_PAUSE_S = 0.2

Request = Callable[..., Awaitable["httpx.Response | str"]]


@dataclass
class Lease:
    """One delivery a worker saw (server times, ms)."""

    count: int
    start: int  # lease_expires_at - the lock
    expires: int
    ended: float = float("inf")  # when a settle of it was sent (client clock, ms)


@dataclass
class Seen:
    """What the workers were told of one record."""

    partition: int
    offset: int
    key: str | None
    leases: list[Lease] = field(default_factory=list)
    acked_at: list[int] = field(default_factory=list)  # delivery counts answered `acked`
    in_doubt: set[str] = field(default_factory=set)  # settles ("ack", "reject") never answered


@dataclass
class QueueModel:
    seen: dict[int, Seen] = field(default_factory=dict)  # by record id
    faults_ms: list[float] = field(default_factory=list)  # when a fault hit the server (ms)
    unseen_slots: int = 0  # records leases whose answers were lost may have handed out
    counts: Counter = field(default_factory=Counter)

    def leased(self, model: Model, records: list[dict[str, Any]]) -> None:
        for r in records:
            rid = _rid(r)
            if rid is None:
                model.fail("phantom", f"queue lease: {r['partition']}/{r['offset']}: no id header")
                continue
            s = self.seen.setdefault(rid, Seen(r["partition"], r["offset"], r["key"]))
            if (s.partition, s.offset) != (r["partition"], r["offset"]):
                model.fail(
                    "queue_lease",
                    f"id {rid} leased at {r['partition']}/{r['offset']}, "
                    f"before at {s.partition}/{s.offset}",
                )
            expires = r["lease_expires_at"]
            s.leases.append(Lease(r["delivery_count"], expires - LOCK_MS, expires))
            self.counts["leased"] += 1

    def settled(
        self,
        model: Model,
        action: str,
        records: list[dict[str, Any]],
        results: list[dict[str, Any]] | None,
        sent: float,
    ) -> None:
        """A settle's answer (results None: in doubt, it may or may not have happened)."""
        for i, r in enumerate(records):
            rid = _rid(r)
            s = self.seen.get(rid) if rid is not None else None
            if s is None:
                continue
            for lease in s.leases:
                if lease.count == r["delivery_count"]:
                    lease.ended = min(lease.ended, sent)
            if results is None:
                s.in_doubt.add(action)
                continue
            status = results[i]["status"]
            self.counts[f"{action}_{status}"] += 1
            if status == "acked":
                if s.acked_at:
                    model.fail(
                        "queue_double_ack",
                        f"id {rid} ({s.partition}/{s.offset}) answered "
                        f"acked at deliveries {s.acked_at} and {r['delivery_count']}",
                    )
                s.acked_at.append(r["delivery_count"])
            elif status not in ("released", "rejected", "expired"):
                model.fail("queue_settle", f"{action} of id {rid}: {results[i]}")


def _rid(record: dict[str, Any]) -> int | None:
    ids = [h["value"] for h in record["headers"] if h["key"] == "id"]
    return int(ids[0]) if ids else None


class QueueWorkers:
    """The workers' tasks and the drain; `request` is Load._request (gated, classified)."""

    def __init__(self, request: Request, model: Model, stats: Any, seed: int) -> None:
        self.request = request
        self.model = model
        self.stats = stats
        self.rng = random.Random(seed)
        self.q = QueueModel()
        self.stopping = False
        self.running = 0

    def tasks(self) -> list[Awaitable[None]]:
        return [self._worker(random.Random(self.rng.random())) for _ in range(QUEUE_WORKERS)]

    async def stop(self, timeout: float) -> bool:
        """Let each worker finish the batch at hand; True when all did within `timeout`."""
        self.stopping = True
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.running == 0

    async def _lease(self, body: dict[str, Any]) -> list[dict[str, Any]] | None:
        """One lease call: its records, or None (nothing leased that a worker saw)."""
        outcome = await self.request("queue_lease", "POST", f"{QUEUE_URL}/lease", json=body)
        if isinstance(outcome, httpx.Response) and outcome.status_code == 200:
            records: list[dict[str, Any]] = outcome.json()["records"]
            self.q.leased(self.model, records)
            self.stats.op("queue_lease")
            return records
        if isinstance(outcome, httpx.Response) and outcome.status_code < 500:
            self.model.fail(
                "unexpected_status", f"queue lease: {outcome.status_code} {outcome.text[:300]}"
            )
        elif outcome != "refused":  # lost, 5xx, 503: counts may have been spent unseen
            self.q.unseen_slots += body["max_records"]
        await asyncio.sleep(RETRY_PAUSE_S)
        return None

    async def _settle(self, action: str, records: list[dict[str, Any]]) -> None:
        """Settle the leases, tried again through faults while they can still hold."""
        body = {"leases": [r["lease"] for r in records]}
        until = min(r["lease_expires_at"] for r in records)
        while True:
            sent = time.time() * 1000
            outcome = await self.request(
                f"queue_{action}", "POST", f"{QUEUE_URL}/{action}", json=body
            )
            if isinstance(outcome, httpx.Response) and outcome.status_code == 200:
                results = outcome.json()["results"]
                if [x["lease"] for x in results] != body["leases"]:
                    self.model.fail("queue_settle", f"{action}: answered {results}")
                    return
                self.q.settled(self.model, action, records, results, sent)
                self.stats.op(f"queue_{action}")
                return
            if isinstance(outcome, httpx.Response) and outcome.status_code < 500:
                self.model.fail(
                    "unexpected_status",
                    f"queue {action}: {outcome.status_code} {outcome.text[:300]}",
                )
                return
            if (
                outcome != "refused"
            ):  # lost, 5xx, 503 (of a family, a part may have been done): in doubt
                self.q.settled(self.model, action, records, None, sent)
                self.q.counts[f"{action}_in_doubt"] += len(records)
            if time.time() * 1000 >= until:
                return  # no lease left to settle: the records come back
            await asyncio.sleep(RETRY_PAUSE_S)

    async def _worker(self, rng: random.Random) -> None:
        self.running += 1
        try:
            while not self.stopping:
                records = await self._lease({"max_records": rng.randint(1, 4), "wait_ms": 200})
                if not records:
                    continue
                if rng.random() < ABANDON:  # the worker dies holding its leases
                    self.q.counts["abandoned"] += len(records)
                    continue
                by_action: dict[str, list[dict[str, Any]]] = defaultdict(list)
                for r in records:
                    x = rng.random()
                    by_action[
                        "reject" if x < REJECT else "release" if x < REJECT + RELEASE else "ack"
                    ].append(r)
                for action, batch in by_action.items():
                    await self._settle(action, batch)
        finally:
            self.running -= 1

    async def drain(self, client: httpx.AsyncClient) -> float:
        """Acknowledge everything left until the queue's window is empty; the seconds it took
        (a failure, `queue_undrained`, after DRAIN_TIMEOUT_S)."""
        started = time.monotonic()
        while time.monotonic() - started < DRAIN_TIMEOUT_S:
            records = await self._lease({"max_records": 100, "wait_ms": 100})
            if records:
                await self._settle("ack", records)
                continue
            if records is not None and await _window_empty(client):
                return time.monotonic() - started
        self.model.fail(
            "queue_undrained",
            f"{QUEUE}: records still unsettled {DRAIN_TIMEOUT_S:.0f} s after the load ended",
        )
        return time.monotonic() - started


async def _window_empty(client: httpx.AsyncClient) -> bool:
    try:
        r = await client.get(QUEUE_URL)
    except httpx.TransportError:
        return False
    if r.status_code != 200:
        return False
    return all(
        p["start_offset"] == p["end_offset"] and p["lag"] == 0 for p in r.json()["partitions"]
    )


async def read_dead_letters(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """Every record of the dead-letter topic, headers as a dict."""
    out: list[dict[str, Any]] = []
    for p in range(DEAD_PARTITIONS):
        offset = 0
        while True:
            params = {"offset": offset, "max_records": 5000}
            r = await client.get(f"/v1/topics/{DEAD_TOPIC}/partitions/{p}/records", params=params)
            r.raise_for_status()
            page = r.json()["records"]
            if not page:
                break
            offset = page[-1]["offset"] + 1
            out += [
                {**rec, "headers": {h["key"]: h["value"] for h in rec["headers"]}} for rec in page
            ]
    return out


def check(model: Model, q: QueueModel, dead: list[dict[str, Any]]) -> dict[str, int]:
    """Judge the drained queue (see the module doc); returns the counts for the results."""
    c: Counter = Counter()
    letters: dict[int, list[dict[str, str]]] = defaultdict(list)
    for d in dead:
        h = d["headers"]
        if "id" not in h or h.get("eventlog.source.topic") != AGGREGATES:
            model.fail("queue_dead_letter", f"a dead letter not of {AGGREGATES}'s records: {d}")
            continue
        letters[int(h["id"])].append(h)
    produced = {
        rid: (p, o)
        for (t, p), log in model.acked.items()
        if t == AGGREGATES
        for o, rid in log.items()
    }
    for rid in set(letters) - set(produced) - model.in_doubt[AGGREGATES]:
        model.fail("queue_dead_letter", f"dead letter of id {rid}, never written to {AGGREGATES}")
    for rid, (p, o) in produced.items():
        s = q.seen.get(rid)
        _check_record(model, rid, p, o, s, letters.get(rid, []), c)
    _check_counts(model, q, c)
    c["order_checked_keys"] = _check_order(model, q)
    c["records"] = len(produced)
    return dict(c)


def _check_record(
    model: Model,
    rid: int,
    p: int,
    o: int,
    s: Seen | None,
    letters: list[dict[str, str]],
    c: Counter,
) -> None:
    where = f"queue: id {rid} ({AGGREGATES}/{p} offset {o})"
    acked = s.acked_at if s is not None else []
    if len(letters) > 1:
        model.fail("queue_dead_twice", f"{where}: dead-lettered {len(letters)} times")
    if acked and letters:
        model.fail(
            "queue_acked_and_dead",
            f"{where}: answered acked at delivery {acked[0]}, and dead-lettered",
        )
    if letters:
        h = letters[0]
        seen_max = max((lease.count for lease in s.leases), default=0) if s is not None else 0
        count = int(h.get("eventlog.delivery.count", "0"))
        reason = h.get("eventlog.dead.reason")
        if (
            (h.get("eventlog.source.partition"), h.get("eventlog.source.offset"))
            != (str(p), str(o))
            or not (seen_max <= count <= MAX_DELIVERIES)
            or reason not in ("rejected", "max_deliveries")
            or (reason == "max_deliveries" and count != MAX_DELIVERIES)
        ):
            model.fail(
                "queue_dead_letter", f"{where}: dead letter {h}, last delivery seen {seen_max}"
            )
        c["dead_lettered"] += 1
        c[f"dead_lettered_{reason}"] += 1
    elif acked:
        c["acked"] += 1
    elif s is not None and "ack" in s.in_doubt:
        c["acked"] += 1
        c["acked_in_doubt"] += 1  # its acknowledgement's answer was lost; nothing came back since
    else:
        model.fail(
            "queue_lost",
            f"{where}: neither acknowledged nor dead-lettered after the drain "
            f"({s.leases if s is not None else 'never leased'})",
        )
        c["lost"] += 1
    if s is None:
        return
    if acked and any(lease.count > acked[0] for lease in s.leases):
        model.fail(
            "queue_redelivered_after_ack",
            f"{where}: answered acked at delivery {acked[0]}, leased "
            f"again at {[lease.count for lease in s.leases]}",
        )
    if len(s.leases) > 1:
        c["redelivered"] += 1


def _check_counts(model: Model, q: QueueModel, c: Counter) -> None:
    """Counts never repeat; those missing are no more than the unseen slots."""
    missing = 0
    for rid, s in q.seen.items():
        counts = sorted(lease.count for lease in s.leases)
        if len(set(counts)) != len(counts) or counts[0] < 1:
            model.fail("queue_delivery_count", f"queue: id {rid}: delivery counts {counts}")
        missing += counts[-1] - len(set(counts))
    c["delivery_counts_unseen"] = missing
    c["unseen_lease_slots"] = q.unseen_slots
    if missing > q.unseen_slots:
        model.fail(
            "queue_delivery_count",
            f"queue: {missing} delivery counts never seen by a worker, but "
            f"only {q.unseen_slots} records' leases had their answers lost",
        )


def _check_order(model: Model, q: QueueModel) -> int:
    """`ordering: key` on the server's clock (the module doc); returns the keys checked."""
    by_key: dict[tuple[int, str], list[Seen]] = defaultdict(list)
    for s in q.seen.values():
        if s.key is not None:
            by_key[(s.partition, s.key)].append(s)
    bad = 0
    for (p, key), records in by_key.items():
        records.sort(key=lambda s: s.offset)
        latest_start: tuple[float, Seen | None, Lease | None] = (float("-inf"), None, None)
        latest_end: tuple[float, Seen | None, Lease | None] = (float("-inf"), None, None)
        for later in records:  # against the latest start and end of every earlier record's leases
            first = min(lease.start for lease in later.leases)
            # an earlier record's lease began, or ended (1 ms of rounding), after this one's first
            for (when, earlier, culprit), slack in ((latest_start, 0), (latest_end, 1)):
                if earlier is not None and when > first + slack and bad < 20:
                    bad += 1
                    model.fail(
                        "queue_order",
                        f"{AGGREGATES}/{p} key {key}: offset {earlier.offset} {culprit} "
                        f"while offset {later.offset} was leased from {first}",
                    )
            for lease in later.leases:
                fault = next((f for f in q.faults_ms if f > lease.start), float("inf"))
                end = min(lease.expires, lease.ended, fault)
                if lease.start > latest_start[0]:
                    latest_start = (lease.start, later, lease)
                if end > latest_end[0]:
                    latest_end = (end, later, lease)
    return len(by_key)
