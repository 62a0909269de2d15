"""Queues: records of a topic leased to any number of workers and acknowledged one by one, with
redelivery, delivery counts and dead letters (Kafka's share groups, KIP-932; SQS's visibility
timeout). The engine's side of issue 26; api/queues.py is the HTTP side.

A queue is a named consumer of one topic. Per partition it keeps a window (PartitionQueue):

    start_offset   the first offset not yet acknowledged or dead-lettered (Kafka's SPSO)
    next           where the next read from the log begins (Kafka's SPEO): records in
                   [start_offset, next) are in the window, each in one state:
                       available  leasable (a delivery count kept from earlier leases),
                                  at once or after a release's delay
                       leased     (lease nonce, deadline, delivery count)
                       acked / dead-lettered   done; dropped when start_offset passes them

Only the window is in memory, in arrays (about 31 bytes a record, 39 ordering by key, plus 16 a
lease: PartitionQueue), not an object per record: acknowledged prefixes move start_offset and
are forgotten, and a read from the log takes no more records than a lease wants (up to
MAX_WINDOW_RECORDS when ordering by key holds records back). Leasing reads records through the
partition's own read path (Partition.read_records: a written or a followed partition alike); a
record leased again is read again.

Leases are opaque strings (base64url of queue id, partition, offset, delivery count and a random
nonce): a lease whose record was since leased again, settled, or whose lock ran out is known as
`expired`, never mistaken for the current one; one that does not decode, or names another
queue, is `unknown`. Expiry is eager: Queues.run returns leases past their deadline to
`available` (delivery count kept; the next lease adds one) when they are due, dead-letters those
at max_deliveries and wakes long-polls; every call also does so first. A record whose delivery
count reached max_deliveries and whose lease expires or is released, or that is rejected, goes
to the dead-letter topic (the original key, value and headers, plus DLQ_HEADERS naming the
source topic, partition, offset, delivery count and reason), or without one is archived
(dead-lettered in place). `ordering: key`: a record is leased only while no earlier record of
its key is leased or waiting (records without a key are not ordered).

Definitions: a queue's settings, id, topic id and per-partition start offsets are events of
__metadata-0 (queue_created, queue_deleted: metadata.py), durable and applied by every shard of
a family before create or delete answers, as a topic change is; a topic's deletion deletes its
queues in the same event.

Durability of the windows (the compacted internal topic __queue_state, Kafka's
__share_group_state, a partition per shard of a family, shard k's being partition k: each
process appends to its own; created with the first window change to persist): every change
that must survive is appended, and fsynced, before the call that made it answers:

    key ["s", qid, partition]            {"start", "acked", "dead"}: start_offset and how many
                                         records below it were acknowledged / dead-lettered
    key ["o", qid, partition, offset]    {"n": delivery count, "s": 0 in flight, 2 acked,
                                         3 dead-lettered}; a tombstone once start passes it
    key ["r", qid, partition, first, last]   {"n": delivery count}: records in flight, leased
                                         together with that count, every window record from
                                         first to last (a lease's counts: one record, not one
                                         per record); a tombstone once start passes last

(Before definitions were metadata, __queue_state also held key ["q", topic, queue]: the settings,
id and topic id, null once deleted. Queues.load migrates such records once: each live one
becomes a queue_created event, then every "q" record is tombstoned; a crash in between does it
again, skipping a queue the metadata already names with that id.)

A lease persists its records' delivery counts before it answers, so a count never goes down
across a restart: after a restart (or SIGKILL) a record that was leased comes back available
with the count it had, and its next lease adds one (at least once). Leases themselves, and a
release's delay, are not persisted: they end with the process. An acknowledgement is durable
before its 200; the in-memory state changes first, so a failed append (a full disk) leaves a
record acknowledged in memory and not on disk: it is delivered again after a restart (at least
once, never lost). Dead-lettering appends to the dead-letter topic before it records "dead": a
crash in between dead-letters the record again later (a duplicate in the dead-letter topic).

Replay merges records in any order (start: the largest; a delivery count: the largest; an
offset's acked or dead state wins over in flight), so concurrent appends of one queue need no
ordering among themselves, and compaction, which keeps each key's latest record, keeps what the
replay needs: the settings, each partition's start, and each in-window offset's last state.

Retention that deletes records still in a window does not wait: they are counted as lost to
retention (lost_to_retention) and the window moves to the new log start.

Shards: a Queues holds the windows of the partitions its process owns (Queues._owns), and
persists them in its own partition of __queue_state; its start-up replays every partition of
__queue_state (its own, and the others' from their files), keeping its own windows' records:
a window's records are wherever its owner was when it wrote them (all in partition 0, written
before the layout per owner shard; another shard's, before the family's size changed), and
replay merges them (the largest start and count, settled over in flight). Every shard knows
every queue's definition (the metadata log it follows); shard_queues.ShardQueues answers for
a whole topic, asking the other owners over the channel.
"""

from __future__ import annotations

import binascii
import heapq
import inspect
import logging
import math
import os
import re
import secrets
import struct
from array import array
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import anyio
import orjson

from .config import LogConfig
from .errors import (
    EngineError,
    InvalidFieldError,
    InvalidRequestError,
    QueueExistsError,
    QueueNotFoundError,
    TopicExistsError,
)
from .metadata import QUEUE_STATE_TOPIC, QueueMeta
from .partition_log import prepare_batches, wall_clock_ms
from .partitioner import partition_for_key
from .records import Record, encode_batch

logger = logging.getLogger(__name__)

QUEUE_STATE_CONFIG = LogConfig(cleanup_policy="compact", segment_bytes=100 * 1024 * 1024)

AVAILABLE, LEASED, ACKED, DEAD = 0, 1, 2, 3
DYING = 4  # dead, its dead letter not yet durable: the window may not move past it
ORDERINGS = ("none", "key")
MAX_QUEUE_CHARS = 249
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
LOCK_MS_RANGE = (100, 12 * 3600 * 1000)  # SQS's visibility timeout goes to 12 hours
MAX_DELIVERIES_RANGE = (1, 1000)
MAX_DELAY_MS = 12 * 3600 * 1000
MAX_LEASE_RECORDS = 10_000
MAX_WAIT_MS = 30_000
# records read into one partition's window at most (ordering by key holds records back while
# an earlier record of their key is leased; beyond this the window waits for acknowledgements)
MAX_WINDOW_RECORDS = 1_000_000
READ_BYTES = 4 * 1024 * 1024  # one read from the log for a lease of many records
# a read for a lease takes whole batches, READ_AHEAD_BYTES of them (the first one whole whatever
# its size; READ_BYTES for a lease that wants more than READ_AHEAD_RECORDS): those not leased
# wait in the window, and their contents for the next leases, dropped after AHEAD_IDLE_S
# without a lease. (A read that stopped at a record count inside a batch had the reader decode
# the rest of the batch for nothing, and again for the next lease: twice the decoding.)
READ_AHEAD_RECORDS = 500
READ_AHEAD_BYTES = 256 * 1024
AHEAD_IDLE_S = 2.0
APPEND_RECORDS = 4000  # __queue_state records in one batch (each under 200 bytes)
# headers a dead-lettered record carries besides its own (the queue's name last: one topic's
# queues may share a dead-letter topic, and a worker of it must tell whose record it holds)
DLQ_HEADERS = (
    "eventlog.source.topic",
    "eventlog.source.partition",
    "eventlog.source.offset",
    "eventlog.delivery.count",
    "eventlog.dead.reason",
    "eventlog.source.queue",
)
REASON_MAX_DELIVERIES = "max_deliveries"
REASON_REJECTED = "rejected"
# lease statuses, as the HTTP contract names them
ACKED_S, RELEASED_S, REJECTED_S, RENEWED_S, EXPIRED_S, UNKNOWN_S = (
    "acked",
    "released",
    "rejected",
    "renewed",
    "expired",
    "unknown",
)
ACTIONS = {"ack": ACKED_S, "release": RELEASED_S, "reject": REJECTED_S, "renew": RENEWED_S}
_LEASE = struct.Struct(">8sIqIQ")  # queue id, partition, offset, delivery count, nonce
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_b2a_base64 = binascii.b2a_base64


# -- settings -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """What a queue is created with. `start`: "earliest", "latest", or a timestamp in ms (the
    first record at or after it; the end when none)."""

    lock_ms: int = 30_000
    max_deliveries: int = 5
    ordering: str = "none"
    start: str | int = "earliest"
    dead_letter_topic: str | None = None

    def validate(self) -> None:
        _in_range("lock_ms", self.lock_ms, *LOCK_MS_RANGE)
        _in_range("max_deliveries", self.max_deliveries, *MAX_DELIVERIES_RANGE)
        if self.ordering not in ORDERINGS:
            raise InvalidFieldError(f"ordering: one of {', '.join(ORDERINGS)}")
        if not (
            self.start in ("earliest", "latest") or (type(self.start) is int and self.start >= 0)
        ):
            raise InvalidFieldError('start: "earliest", "latest" or {"timestamp": ms}')

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _in_range(name: str, value: Any, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise InvalidFieldError(f"{name}: an integer in {low}..{high}")


def validate_queue_name(name: str) -> None:
    if not name or len(name) > MAX_QUEUE_CHARS or not _QUEUE_NAME.match(name):
        raise InvalidRequestError(
            f"invalid queue name {name!r}: 1..{MAX_QUEUE_CHARS} of letters, digits, '.', '_', '-'"
        )


# -- leases --------------------------------------------------------------------------------


class LeaseId(NamedTuple):
    """(A NamedTuple, not a frozen dataclass: one is made per lease decoded, and a frozen
    dataclass's __init__ sets each field through object.__setattr__.)"""

    qid: bytes
    partition: int
    offset: int
    count: int
    nonce: int

    def encode(self) -> str:
        return encode_lease(self.qid, self.partition, self.offset, self.count, self.nonce)

    @staticmethod
    def decode(text: str) -> LeaseId | None:
        """The lease a string names, or None for anything that is not one of ours."""
        if not isinstance(text, str) or len(text) != 43:
            return None
        try:  # (base64.urlsafe_b64decode's steps, without its checks of what it is given)
            raw = binascii.a2b_base64(text.encode("ascii").translate(_FROM_URLSAFE) + b"=")
        except (binascii.Error, ValueError):  # (UnicodeEncodeError is a ValueError)
            return None
        if len(raw) != _LEASE.size:
            return None
        return LeaseId(*_LEASE.unpack(raw))


def encode_lease(qid: bytes, partition: int, offset: int, count: int, nonce: int) -> str:
    """LeaseId(...).encode() without the tuple: base64url of the packed fields, unpadded (32
    bytes: 43 characters and one "=" cut). One per record leased; base64.urlsafe_b64encode and
    the NamedTuple made it 5 times as dear (~1.9 us against ~0.4 here)."""
    raw = _b2a_base64(_LEASE.pack(qid, partition, offset, count, nonce), newline=False)
    return raw[:43].translate(_TO_URLSAFE).decode("ascii")


# -- one partition's window: a pure state machine (no I/O, the time passed in) -------------------


class Entry(NamedTuple):
    """A record of a window as it was when asked (a copy: the window keeps its records in
    arrays, see PartitionQueue). Calls that take an entry use its offset."""

    offset: int
    state: int
    count: int  # deliveries so far
    nonce: int  # the current lease's (0: none)
    deadline: int  # the current lease's, ms


@dataclass(slots=True)
class Changes:
    """What a PartitionQueue's calls since the last take_changes() must persist."""

    offsets: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, count, state)
    start: tuple[int, int, int] | None = None  # (start, acked below, dead below)
    tombstones: list[int] = field(default_factory=list)
    # runs of records in flight leased together: (first offset, last offset, delivery count)
    runs: list[tuple[int, int, int]] = field(default_factory=list)
    run_tombstones: list[tuple[int, int]] = field(default_factory=list)  # (first, last)

    def __bool__(self) -> bool:
        return bool(
            self.offsets or self.start or self.tombstones or self.runs or self.run_tombstones
        )


# a record's flags beside its state (the low 3 bits of its state byte)
_STATE = 0x07
_STORED = 0x08  # __queue_state holds a record for this offset
_QUEUED = 0x10  # in the ready heap
_KEYED = 0x20  # ordered by its key (ordering: key and the record has one)
# per record: offset 8, state 1, delivery count 2, deadline / ready-at 8, nonce 4, timestamp 8;
# ordering by key adds the key's hash 4 and the link to its key's next record 4
_COMPACT_AT = 4096  # forgotten records at the arrays' front before they are cut off


class _Deadlines:
    """Lease deadlines of one lock length, in the order they were given: with one lock length
    (and a clock that does not go back) also the order they fall due, so a FIFO of two arrays
    does what a heap of tuples did at a fraction of the memory (16 bytes a lease). An item
    whose lease was settled or renewed since is stale: its record no longer has that deadline."""

    __slots__ = ("deadlines", "offsets", "head")

    def __init__(self) -> None:
        self.deadlines = array("q")
        self.offsets = array("q")
        self.head = 0

    def push(self, deadline: int, offset: int) -> None:
        self.deadlines.append(deadline)
        self.offsets.append(offset)

    def __len__(self) -> int:
        return len(self.offsets) - self.head

    def first(self) -> int:
        return self.deadlines[self.head]

    def pop(self) -> tuple[int, int]:
        i = self.head
        self.head = i + 1
        item = self.deadlines[i], self.offsets[i]
        if self.head >= _COMPACT_AT and self.head * 2 >= len(self.offsets):
            del self.deadlines[: self.head]
            del self.offsets[: self.head]
            self.head = 0
        return item


class _Entries:
    """The window's records by offset, as Entry copies (what tests and figures look at)."""

    __slots__ = ("pq",)

    def __init__(self, pq: PartitionQueue) -> None:
        self.pq = pq

    def get(self, offset: int) -> Entry | None:
        i = self.pq._index(offset)
        return None if i < 0 else self.pq._entry(i)

    def __len__(self) -> int:
        return len(self.pq.offsets) - self.pq.lo

    def __iter__(self) -> Iterator[int]:
        pq = self.pq
        return iter(pq.offsets[pq.lo :])

    def values(self) -> Iterator[Entry]:
        pq = self.pq
        return (pq._entry(i) for i in range(pq.lo, len(pq.offsets)))


class PartitionQueue:
    """One queue's window over one partition (see the module's doc). Every method is
    synchronous; the caller reads records and persists what take_changes() returns.

    Memory: the window's records live in parallel arrays (the array module), a record at index
    i in each, the window being indices [lo, len): about 31 bytes a record (39 ordering by key)
    plus 16 a lease in its deadline FIFO, instead of an object, a dict slot, a deque slot and heap
    tuples per record (~300 bytes): 1 M records in flight fit in 64 MB
    (tests/engine/test_queues.py measures it). Records never leased are found by a cursor
    walking the arrays; only records that come back (expired, released, a key's next) go
    through the `ready` heap. Ordering by key links each record to its key's next record in the
    window; `heads` holds, per key with records in the window, its first and last offset."""

    def __init__(
        self,
        partition: int,
        max_deliveries: int,
        by_key: bool,
        start: int,
        acked_below: int = 0,
        dead_below: int = 0,
        recovered: dict[int, tuple[int, int]] | None = None,
        recovered_runs: Iterable[tuple[int, int]] = (),
    ) -> None:
        self.partition = partition
        self.max_deliveries = max_deliveries
        self.by_key = by_key
        self.start = start
        self.next = start
        self.acked_below = acked_below
        self.dead_below = dead_below
        self.offsets = array("q")  # ascending (a compacted log's gaps are simply absent)
        self.states = bytearray()  # state | flags
        self.counts = array("H")  # delivery counts (max_deliveries <= 1000)
        self.when = array("q")  # leased: the deadline; available: ready-at (0: now), ms
        self.nonces = array("I")
        self.timestamps = array("q")  # the records' (oldest_unacked_age_ms)
        self.hashes = array("I")  # ordering by key: the key's hash
        self.links = array("I")  # ordering by key: index distance to the key's next (0: none)
        self.lo = 0  # the window's first index (before: forgotten, cut off from time to time)
        self.cursor = 0  # indices from here on: not yet looked at by take()
        self.ready: list[int] = []  # heap: offsets before the cursor that may be leased again
        self.delayed: list[tuple[int, int]] = []  # heap: (ready_at, offset)
        self.deadlines: dict[int, _Deadlines] = {}  # lock length -> its leases' deadlines
        self.heads: dict[int, list[int]] = {}  # key hash -> [first, last] unfinished offset
        self.entries = _Entries(self)
        # offset -> (delivery count, state) replayed from __queue_state, for offsets not read
        # into the window yet (at or past `next`)
        self.recovered: dict[int, tuple[int, int]] = dict(recovered or {})
        self.leased = 0
        self.acked_in_window = 0
        self.dead_in_window = 0
        self.redeliveries = 0
        self.lost_to_retention = 0
        # dying offsets whose dead letter could not be written (the dead-letter topic's shard
        # down, a full disk): (offset, reason), retried by the next call that settles or expires
        self.stalled: list[tuple[int, str]] = []
        # (start_offset, the timestamp of the first record at or past it) while the window has
        # not read that record (start == next), kept by Queues' expiry loop: what
        # oldest_unacked() says then; None: not read yet
        self.head: tuple[int, int] | None = None
        self._dirty: set[int] = set()
        self._start_dirty = False
        self._tombstones: list[int] = []
        # runs __queue_state holds (take_changes), heap of (last, first): tombstoned once the
        # window's start passes their last offset
        self.runs: list[tuple[int, int]] = [(last, first) for first, last in recovered_runs]
        heapq.heapify(self.runs)
        self._run_tombstones: list[tuple[int, int]] = []
        self._drop_runs()

    # -- what a lease does ----------------------------------------------------------------

    def due(self, now: int) -> list[Entry]:
        """Leases past their deadline become available again (or, at max_deliveries, dead:
        returned, to be dead-lettered); released records whose delay passed become leasable."""
        dying: list[Entry] = []
        states, when = self.states, self.when
        for lock_ms, fifo in list(self.deadlines.items()):
            while fifo and fifo.first() <= now:
                deadline, offset = fifo.pop()
                i = self._index(offset)
                if i < 0 or states[i] & _STATE != LEASED or when[i] != deadline:
                    continue  # settled, or renewed (its new deadline has its own item)
                self.leased -= 1
                if self.counts[i] >= self.max_deliveries:
                    dying.append(self._finish(i, DEAD))
                else:
                    self._available(i, now, 0)
            if not fifo:
                del self.deadlines[lock_ms]
        while self.delayed and self.delayed[0][0] <= now:
            ready_at, offset = heapq.heappop(self.delayed)
            i = self._index(offset)
            if i >= 0 and states[i] & _STATE == AVAILABLE and when[i] == ready_at:
                when[i] = 0
                self._queue(i)
        return dying

    def take(
        self, n: int, now: int, lock_ms: int, nonce: Callable[[], int]
    ) -> tuple[list[Entry], list[Entry]]:
        """Lease up to `n` leasable records of the window, lowest offsets first: (leased, and
        records found at max_deliveries, now dead, to be dead-lettered). Records that came back
        (the ready heap) lie before the cursor, so they go first."""
        leased: list[Entry] = []
        dying: list[Entry] = []
        states = self.states
        fifo = self.deadlines.get(lock_ms)
        if fifo is None:
            fifo = self.deadlines[lock_ms] = _Deadlines()
        end = len(self.offsets)
        while len(leased) < n:
            if self.ready:
                i = self._index(heapq.heappop(self.ready))
                if i < 0:
                    continue
                states[i] &= ~_QUEUED
            elif self.cursor < end:
                i = self.cursor
                self.cursor = i + 1
            else:
                break
            if states[i] & _STATE != AVAILABLE or self.when[i] or not self._eligible(i):
                continue  # (one that becomes leasable later goes through the ready heap)
            count = self.counts[i]
            if count >= self.max_deliveries:  # (a replayed count: its last lease expired unseen)
                dying.append(self._finish(i, DEAD))
                continue
            self.counts[i] = count = count + 1
            if count > 1:
                self.redeliveries += 1
            states[i] = (states[i] & ~_STATE) | LEASED
            offset = self.offsets[i]
            self.nonces[i] = lease_nonce = nonce()
            self.when[i] = deadline = now + lock_ms
            fifo.push(deadline, offset)
            self.leased += 1
            self._dirty.add(offset)
            leased.append(Entry(offset, LEASED, count, lease_nonce, deadline))
        if not fifo:
            del self.deadlines[lock_ms]
        return leased, dying

    def wants_read(self, high_watermark: int) -> bool:
        """Whether the log holds records past the window that the window may take."""
        return self.next < high_watermark and len(self.entries) < MAX_WINDOW_RECORDS

    def admit(self, records: Iterable[tuple[Any, ...]], next_offset: int) -> None:
        """Records read from the log at `next` on, (offset, key[, timestamp]) each, into the
        window; the window's end moves to `next_offset` (offsets without records are skipped)."""
        for offset, key, *ts in records:
            if offset < self.next:
                continue
            count, state = 0, AVAILABLE
            replayed = self.recovered.pop(offset, None) if self.recovered else None
            if replayed is not None:
                count, state = replayed
                if state == ACKED:
                    self.acked_in_window += 1
                elif state == DEAD:
                    self.dead_in_window += 1
                else:
                    state = AVAILABLE
                state |= _STORED
            i = len(self.offsets)
            self.offsets.append(offset)
            self.counts.append(count)
            self.when.append(0)
            self.nonces.append(0)
            self.timestamps.append(ts[0] if ts else 0)
            if self.by_key:
                self.hashes.append(hash(key) & 0xFFFFFFFF if key is not None else 0)
                self.links.append(0)
                if key is not None and state & _STATE == AVAILABLE:
                    state |= _KEYED
                    self._link(i, self.hashes[i], offset)
            self.states.append(state)
            self.next = offset + 1
        self.next = max(self.next, next_offset)
        if self.recovered:
            for offset in [o for o in self.recovered if o < self.next]:
                del self.recovered[offset]  # no record there any more (compacted, deleted)
        self._advance()

    # -- settling a lease -------------------------------------------------------------------

    def current(self, lease: LeaseId, now: int) -> Entry | None:
        """The entry `lease` still holds, or None (expired, settled, leased again)."""
        i = self._index(lease.offset)
        if (
            i < 0
            or self.states[i] & _STATE != LEASED
            or self.nonces[i] != lease.nonce
            or self.counts[i] != lease.count
            or self.when[i] <= now
        ):
            return None
        return self._entry(i)

    def ack(self, e: Entry, advance: bool = True) -> None:
        """`advance=False`: the caller calls advance() after a run of acks (once, not per
        record)."""
        self.leased -= 1
        self._acked(self._index(e.offset))
        if advance:
            self._advance()

    def advance(self) -> None:
        self._advance()

    def release(self, e: Entry, now: int, delay_ms: int) -> Entry | None:
        """Back to available (after `delay_ms`); at max_deliveries dead instead (returned)."""
        self.leased -= 1
        i = self._index(e.offset)
        if self.counts[i] >= self.max_deliveries:
            return self._finish(i, DEAD)
        self._available(i, now, delay_ms)
        return None

    def reject(self, e: Entry) -> Entry:
        self.leased -= 1
        return self._finish(self._index(e.offset), DEAD)

    def renew(self, e: Entry, now: int, lock_ms: int) -> None:
        i = self._index(e.offset)
        self.when[i] = deadline = now + lock_ms
        fifo = self.deadlines.get(lock_ms)
        if fifo is None:
            fifo = self.deadlines[lock_ms] = _Deadlines()
        fifo.push(deadline, e.offset)

    def stall(self, dying: Iterable[tuple[Entry, str]]) -> None:
        """Dying entries, (entry, reason), whose dead letters were not written: they stay dying
        (not leased, holding their keys, the window not moving past them) until take_stalled()
        hands them to a later call."""
        for e, reason in dying:
            i = self._index(e.offset)
            if i >= 0 and self.states[i] & _STATE == DYING:
                self.stalled.append((e.offset, reason))

    def take_stalled(self) -> list[tuple[Entry, str]]:
        stalled, self.stalled = self.stalled, []
        out = []
        for offset, reason in stalled:
            i = self._index(offset)
            if i >= 0 and self.states[i] & _STATE == DYING:
                out.append((self._entry(i), reason))
        return out

    def dead_done(self, entries: Iterable[Entry]) -> None:
        """Dying entries returned earlier were dead-lettered (or archived): they are dead now,
        to be persisted, and the window may move past them."""
        states = self.states
        for e in entries:
            i = self._index(e.offset)
            if i >= 0 and states[i] & _STATE == DYING:
                states[i] = (states[i] & ~_STATE) | DEAD
                self.dead_in_window += 1
                self._dirty.add(e.offset)
                if states[i] & _KEYED:
                    self._unhead(i)
        self._advance()

    # -- retention --------------------------------------------------------------------------

    def trim(self, log_start: int) -> None:
        """Retention (or delete-records) moved the log's start past part of the window: those
        records are lost to retention, counted, and the window starts at the log's start."""
        if log_start <= self.start:
            return
        states, end = self.states, len(self.offsets)
        while self.lo < end and self.offsets[self.lo] < log_start:
            i = self.lo
            state = states[i] & _STATE
            if not self._count_finished(state):
                self.lost_to_retention += 1
                if state == LEASED:
                    self.leased -= 1
                if states[i] & _KEYED:
                    self._unhead(i)
            self._forget(i)
        if self.next < log_start:
            self.lost_to_retention += log_start - self.next  # (offsets: the records never read)
            self.next = log_start
        self.start = self.offsets[self.lo] if self.lo < end else self.next
        self._start_dirty = True
        self._drop_runs()
        self._compact()

    # -- what the caller persists -------------------------------------------------------------

    def take_changes(self) -> Changes:
        """What to persist: settled records one by one (`offsets`), records in flight (their
        delivery counts) as runs of neighbours in the window with one count (`runs`: a lease of
        100 is one record of __queue_state, and one key of its key index, not 100)."""
        changes = Changes()
        states, counts = self.states, self.counts
        run: list[int] = []  # [first index, last index, count]
        for offset in sorted(self._dirty):
            i = self._index(offset)
            if i < 0:
                continue
            state = states[i] & _STATE
            if state in (ACKED, DEAD):
                states[i] |= _STORED
                changes.offsets.append((offset, counts[i], state))
            elif run and i == run[1] + 1 and counts[i] == run[2]:
                run[1] = i
            else:
                if run:
                    self._add_run(changes, *run)
                run = [i, i, counts[i]]
        if run:
            self._add_run(changes, *run)
        self._dirty.clear()
        if self._start_dirty:
            changes.start = (self.start, self.acked_below, self.dead_below)
            self._start_dirty = False
        changes.tombstones, self._tombstones = self._tombstones, []
        changes.run_tombstones, self._run_tombstones = self._run_tombstones, []
        return changes

    def _add_run(self, changes: Changes, first: int, last: int, count: int) -> None:
        first_offset, last_offset = self.offsets[first], self.offsets[last]
        changes.runs.append((first_offset, last_offset, count))
        heapq.heappush(self.runs, (last_offset, first_offset))

    def _drop_runs(self) -> None:
        """Runs wholly before the window's start: to be tombstoned."""
        while self.runs and self.runs[0][0] < self.start:
            last, first = heapq.heappop(self.runs)
            self._run_tombstones.append((first, last))

    def stored_runs(self) -> list[tuple[int, int]]:
        """(first, last) of the runs __queue_state holds (what deleting the queue tombstones)."""
        return [(first, last) for last, first in self.runs]

    def stored_offsets(self) -> list[int]:
        """Offsets __queue_state holds a record for (what deleting the queue tombstones)."""
        states = self.states
        in_window = [
            self.offsets[i] for i in range(self.lo, len(self.offsets)) if states[i] & _STORED
        ]
        return in_window + list(self.recovered)

    # -- figures ---------------------------------------------------------------------------------

    def next_due(self) -> int | None:
        """The earliest time (ms) a lease expires or a delay ends, if any."""
        times = [fifo.first() for fifo in self.deadlines.values() if fifo]
        if self.delayed:
            times.append(self.delayed[0][0])
        return min(times) if times else None

    def stats(self, high_watermark: int) -> dict[str, int]:
        """The window's figures (offsets stand for records: a compacted gap counts as one).
        Settled records replayed but not read into the window yet count as settled."""
        acked, dead = self.acked_in_window, self.dead_in_window
        for _n, s in self.recovered.values():
            if s == ACKED:
                acked += 1
            elif s == DEAD:
                dead += 1
        lag = max(0, high_watermark - self.start - acked - dead)
        return {
            "start_offset": self.start,
            "end_offset": high_watermark,
            "available": max(0, lag - self.leased),
            "leased": self.leased,
            "acked": self.acked_below + acked,
            "dead_lettered": self.dead_below + dead,
            "lag": lag,
            "redeliveries": self.redeliveries,
            "lost_to_retention": self.lost_to_retention,
        }

    def oldest_unacked(self, high_watermark: int) -> int | None:
        """The timestamp of the first record not yet settled (at start_offset), if any and
        known: from the window, or, when the window has not read it, head_timestamp."""
        if self.start >= high_watermark:
            return None
        if self.lo < len(self.offsets):  # (its first is unsettled: _advance forgets the rest)
            return self.timestamps[self.lo]
        if self.head is not None and self.head[0] == self.start:
            return self.head[1]
        return None

    # -- internals --------------------------------------------------------------------------

    def _index(self, offset: int) -> int:
        """The index of `offset`'s record in the window, or -1."""
        offsets, lo, end = self.offsets, self.lo, len(self.offsets)
        if lo >= end:
            return -1
        i = lo + offset - offsets[lo]  # (no gaps: where it is)
        if lo <= i < end and offsets[i] == offset:
            return i
        i = bisect_left(offsets, offset, lo, end)
        return i if i < end and offsets[i] == offset else -1

    def _entry(self, i: int) -> Entry:
        state = self.states[i] & _STATE
        return Entry(
            self.offsets[i],
            state,
            self.counts[i],
            self.nonces[i] if state == LEASED else 0,
            self.when[i] if state == LEASED else 0,
        )

    def _eligible(self, i: int) -> bool:
        if not self.states[i] & _KEYED:
            return True
        head = self.heads.get(self.hashes[i])
        return head is not None and head[0] == self.offsets[i]

    def _queue(self, i: int) -> None:
        """Record `i` may be leasable now: into the ready heap unless the cursor has yet to
        reach it."""
        if i < self.cursor and not self.states[i] & _QUEUED and not self.when[i]:
            if self._eligible(i):
                self.states[i] |= _QUEUED
                heapq.heappush(self.ready, self.offsets[i])

    def _available(self, i: int, now: int, delay_ms: int) -> None:
        self.states[i] = (self.states[i] & ~_STATE) | AVAILABLE
        self.nonces[i] = 0
        if delay_ms > 0:
            self.when[i] = ready_at = now + delay_ms
            heapq.heappush(self.delayed, (ready_at, self.offsets[i]))
        else:
            self.when[i] = 0
            self._queue(i)

    def _finish(self, i: int, state: int) -> Entry:
        """Record `i` is acknowledged, or (DEAD) dying: done once dead_done() says its dead
        letter is durable. A dying record still holds its key back: were its dead letter never
        written (a crash first), it would be delivered again, after its key's next record."""
        if state == ACKED:
            self._acked(i)
            return self._entry(i)
        self.nonces[i] = 0
        self.when[i] = 0
        self.states[i] = (self.states[i] & ~_STATE) | DYING
        return self._entry(i)

    def _acked(self, i: int) -> None:
        self.nonces[i] = 0
        self.when[i] = 0
        flags = self.states[i] & ~_STATE
        self.states[i] = flags | ACKED
        self.acked_in_window += 1
        self._dirty.add(self.offsets[i])
        if flags & _KEYED:
            self._unhead(i)

    def _link(self, i: int, key: int, offset: int) -> None:
        """Record `i` (at `offset`) joins its key's chain, last."""
        head = self.heads.get(key)
        if head is None:
            self.heads[key] = [offset, offset]
            return
        last = self._index(head[1])
        self.links[last] = i - last
        head[1] = offset

    def _unhead(self, i: int) -> None:
        """Record `i` no longer holds its key back: the key's next record may be leased."""
        key = self.hashes[i]
        self.states[i] &= ~_KEYED
        head = self.heads.get(key)
        if head is None:
            return
        link, self.links[i] = self.links[i], 0
        if head[0] != self.offsets[i]:
            # (not its key's first: never so today, kept right all the same) unlink it
            j = self._index(head[0])
            while j >= 0 and self.links[j] and j + self.links[j] != i:
                j += self.links[j]
            if j >= 0 and self.links[j]:
                self.links[j] = self.links[j] + link if link else 0
                if not link:
                    head[1] = self.offsets[j]
            return
        if not link:
            del self.heads[key]
            return
        nxt = i + link
        head[0] = self.offsets[nxt]
        if self.states[nxt] & _STATE == AVAILABLE:
            self._queue(nxt)

    def _forget(self, i: int) -> None:
        """Record `i`, the window's first, leaves it."""
        if self.states[i] & _STORED:
            self._tombstones.append(self.offsets[i])
        self._dirty.discard(self.offsets[i])
        self.lo = i + 1
        if self.cursor < self.lo:
            self.cursor = self.lo

    def _compact(self) -> None:
        """Cut the forgotten records off the arrays' front, once they are many."""
        lo = self.lo
        if lo < _COMPACT_AT or lo * 2 < len(self.offsets):
            return
        for column in (self.offsets, self.states, self.counts, self.when, self.nonces,
                       self.timestamps):
            del column[:lo]
        if self.by_key:
            del self.hashes[:lo]
            del self.links[:lo]
        self.cursor -= lo
        self.lo = 0

    def _count_finished(self, state: int) -> bool:
        """A record leaving the window's front: an acknowledged or dead-lettered one moves from
        the window's count to the count below it (True); any other is not finished (False)."""
        if state == ACKED:
            self.acked_in_window -= 1
            self.acked_below += 1
        elif state == DEAD:
            self.dead_in_window -= 1
            self.dead_below += 1
        else:
            return False
        return True

    def _advance(self) -> None:
        """Move start_offset past the finished prefix of the window, forgetting it."""
        moved = False
        states, end = self.states, len(self.offsets)
        while self.lo < end:
            i = self.lo
            if not self._count_finished(states[i] & _STATE):
                break
            self._forget(i)
            moved = True
        start = self.offsets[self.lo] if self.lo < end else self.next
        if start != self.start or moved:
            self.start = start
            self._start_dirty = True
            self._drop_runs()
        self._compact()


# -- a queue, and the queues of a server --------------------------------------------------------


class LeasedRecord(NamedTuple):
    """One record a lease answers (a NamedTuple: a lease of 100 makes 100)."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    delivery_count: int
    lease: str
    lease_expires_at: int


@dataclass(frozen=True, slots=True)
class QueueInfo:
    topic: str
    name: str
    settings: QueueSettings
    created_ms: int
    partitions: tuple[dict[str, int], ...] = ()


class _Pending:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None


class Queue:
    """One queue: its settings and a window per partition, made as a partition is first used."""

    def __init__(
        self,
        topic: str,
        name: str,
        qid: bytes,
        topic_id: str,
        settings: QueueSettings,
        created_ms: int,
    ) -> None:
        self.topic = topic
        self.name = name
        self.qid = qid
        self.topic_id = topic_id
        self.settings = settings
        self.created_ms = created_ms
        self.partitions: dict[int, PartitionQueue] = {}
        self.locks: dict[int, anyio.Lock] = {}
        self.changed = anyio.Event()  # set when a record became leasable other than by a produce
        self.turn = 0  # the partition a lease starts with (round robin)
        # partition -> the latest append of its changes in flight: a call whose changes another
        # call took with its own (take_changes takes all) waits for that append
        self.pending: dict[int, _Pending] = {}
        # partition -> records read into its window ahead of leases, by offset (Queues.
        # _keep_ahead), and when they were kept (anyio's clock): dropped when it idles
        self.ahead: dict[int, dict[int, Record]] = {}
        self.leased_at = 0.0
        # a family: shards whose long-polls asked this one for records and got none, until when
        # (anyio's clock); told when records come back (touched): family.ShardQueues
        self.watchers: dict[int, float] = {}
        self.on_back: Callable[[Queue], None] | None = None

    def lock(self, partition: int) -> anyio.Lock:
        lock = self.locks.get(partition)
        if lock is None:
            lock = self.locks[partition] = anyio.Lock()
        return lock

    def touched(self) -> None:
        self.wake_local()
        if self.watchers and self.on_back is not None:
            self.on_back(self)

    def wake_local(self) -> None:
        """This process's long-polls of the queue look again."""
        self.changed.set()
        self.changed = anyio.Event()


def _key(*parts: Any) -> bytes:
    return orjson.dumps(list(parts))


class Queues:
    """Every queue of a server, the windows this process owns (a shard of a family: those of
    its partitions), and its partition of __queue_state.

    `engine`: the log manager (topics, partitions, create_topic); `clock`: ms since the epoch."""

    def __init__(self, engine: Any, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.engine = engine
        self.clock = clock
        # (a family: records came back to a queue other shards' long-polls wait on)
        self.on_back: Callable[[Queue], None] | None = None
        self._queues: dict[tuple[str, str], Queue] = {}
        self._by_id: dict[bytes, Queue] = {}
        # (queue id, partition) -> (start, acked, dead, offsets replayed, runs replayed)
        self._replayed: dict[tuple[bytes, int], tuple[int, int, int, dict, set]] = {}
        self._create_lock = anyio.Lock()
        self._state_lock = anyio.Lock()  # (making __queue_state)
        self._wake = anyio.Event()  # set when a lease or a delayed release makes a new deadline
        # when (ms, the clock's) the expiry loop looks next: a lease whose lock ends later does
        # not wake it (every lease did: a pass over every queue's windows per lease)
        self._next_look = 0.0

    # -- start-up ---------------------------------------------------------------------------

    async def load(self) -> None:
        """The queues the metadata log defines, their windows replayed from __queue_state (if
        any was persisted), into memory before any request (migrating the old "q" records
        first: see the module's doc); then expire leases in the engine's task group (run)."""
        tg = getattr(self.engine, "_tg", None)
        if tg is not None:  # (the engine's own tasks: they end with it)
            tg.start_soon(self.run)
        settings: dict[tuple[str, str], dict[str, Any] | None] = {}
        starts: dict[tuple[bytes, int], tuple[int, int, int]] = {}
        offsets: dict[tuple[bytes, int], dict[int, tuple[int, int]]] = {}
        runs: dict[tuple[bytes, int], set[tuple[int, int]]] = {}
        state = self.engine.topics.get(QUEUE_STATE_TOPIC)
        if state is not None:
            # every partition, not only this shard's: a window's records are where its owner
            # was when it wrote them (partition 0 for all, before the layout per owner shard;
            # another shard's, before the family's size changed): replay merges them
            for log in state.partitions:
                if _online(log):
                    await self._replay(log, settings, starts, offsets, runs)
                else:
                    logger.error("queues: %s-%d is offline: the windows it holds start from "
                                 "what the other partitions hold", QUEUE_STATE_TOPIC,
                                 log.partition)
            if self.engine.is_controller:
                await self._migrate(self.engine.partition(QUEUE_STATE_TOPIC, 0), settings)
                await self._fit_state()
        for meta in self.engine.image.queues_of():
            self._define_new(meta)
        for (qid, p), (start, acked, dead) in starts.items():
            if self._mine(qid, p):
                start = max(start, self._replayed.get((qid, p), (start,))[0])
                kept = {o: s for o, s in offsets.get((qid, p), {}).items() if o >= start}
                self._replayed[(qid, p)] = (start, acked, dead, kept, runs.get((qid, p), set()))
        for (qid, p), kept in offsets.items():
            if self._mine(qid, p) and (qid, p) not in starts:
                start = self._replayed.get((qid, p), (-1,))[0]
                kept = {o: s for o, s in kept.items() if o >= start}
                self._replayed[(qid, p)] = (start, 0, 0, kept, runs.get((qid, p), set()))

    def _define(self, meta: QueueMeta) -> Queue:
        q = Queue(
            meta.topic, meta.name, bytes.fromhex(meta.queue_id), meta.topic_id,
            _settings_of(meta.settings), meta.created_ms,
        )
        q.on_back = self.on_back
        self._queues[(q.topic, q.name)] = q
        self._by_id[q.qid] = q
        return q

    def _define_new(self, meta: QueueMeta) -> Queue:
        """A queue as its queue_created event made it: its windows where the event started
        them (what __queue_state holds, if anything, is replayed over that)."""
        q = self._define(meta)
        for p, start in enumerate(meta.starts):
            if self._owns(q.topic, p):
                self._replayed[(q.qid, p)] = (start, 0, 0, {}, set())
        return q

    def _owns(self, topic: str, partition: int) -> bool:
        """Whether this process holds the window of `topic`'s `partition` (a lone process all;
        a shard of a family, those of the partitions it owns)."""
        return bool(self.engine.owns(topic, partition))

    def _mine(self, qid: bytes, partition: int) -> bool:
        q = self._by_id.get(qid)
        return q is not None and self._owns(q.topic, partition)

    async def _fit_state(self) -> None:
        """The controller, at start-up: __queue_state has a partition for each shard of the
        family (one, written before the layout per owner shard, or fewer shards before: grown;
        replay reads every partition, so nothing is copied)."""
        state = self.engine.topics.get(QUEUE_STATE_TOPIC)
        count = self.engine.shard_count
        if state is not None and len(state.partitions) < count:
            await self.engine.add_partitions(QUEUE_STATE_TOPIC, count, internal=True)
            logger.info("queues: %s grown to %d partitions, one per shard", QUEUE_STATE_TOPIC,
                        count)

    async def sync_definitions(self) -> None:
        """A shard of a family that follows the metadata log: the queues it now defines (made
        or deleted through shard 0, or gone with their topic), their windows here made or
        forgotten (tombstoned in this shard's state partition)."""
        live = {(m.topic, m.name): m for m in self.engine.image.queues_of()}
        doomed = [
            q for key, q in self._queues.items()
            if (m := live.get(key)) is None or m.queue_id != q.qid.hex()
        ]
        await self._forget(doomed)
        for key, meta in live.items():
            if key not in self._queues:
                self._define_new(meta)

    @staticmethod
    async def _replay(
        log: Any,
        settings: dict[tuple[str, str], dict[str, Any] | None],
        starts: dict[tuple[bytes, int], tuple[int, int, int]],
        offsets: dict[tuple[bytes, int], dict[int, tuple[int, int]]],
        runs: dict[tuple[bytes, int], set[tuple[int, int]]],
    ) -> None:
        """A partition of __queue_state (this shard's or another's, read from its files alike)
        into what replay keeps (_replay_one)."""
        def replay(records: list[Record]) -> None:
            for record in records:
                _replay_one(record, settings, starts, offsets, runs)

        offset = log.log_start_offset
        while offset < log.high_watermark:
            result = await log.read_records(offset, 10_000, 4 * 1024 * 1024)
            await anyio.to_thread.run_sync(replay, result.records)  # (off the loop)
            if result.next_offset <= offset:
                break
            offset = result.next_offset

    async def _migrate(
        self, log: Any, settings: dict[tuple[str, str], dict[str, Any] | None]
    ) -> None:
        """The definitions __queue_state held as "q" records (before they were metadata) as
        queue_created events (durable), then those records tombstoned: once, and again after a
        crash in between, a queue the metadata already names with its id skipped. A queue of a
        topic gone (or made again since) is not carried over."""
        if not settings:
            return
        image = self.engine.image
        events: list[tuple[str, str, str, dict[str, Any]]] = []
        for (topic, name), v in settings.items():
            if v is None or (topic, name) in image.queues:
                continue  # (deleted; or migrated before a crash: the metadata wins)
            meta = image.topics.get(topic)
            if meta is None or meta.topic_id != v["topic_id"]:
                continue
            fields = {"queue": name, "id": v["id"], "settings": _settings_of(v).as_json(),
                      "created_ms": v["created_ms"]}
            events.append(("queue_created", topic, v["topic_id"], fields))
        # (every shard of a family reads the metadata log before it serves: no sync needed)
        await self._record(events, sync=False)
        await _append(log, [(_key("q", t, n), None) for t, n in settings], self.clock())
        logger.info("queues: %d definition(s) moved from %s to the metadata log", len(events),
                    QUEUE_STATE_TOPIC)

    # -- eager expiry -------------------------------------------------------------------------

    async def run(self) -> None:
        """Leases whose lock ran out come back (or, at max_deliveries, are dead-lettered) and
        released records' delays end when they are due, not when a call next looks: long-polls
        wake, and the figures (metrics, describe) say so. Also keeps each idle window's head
        timestamp (oldest_unacked_age_ms). Runs until the engine stops."""
        while not self.engine.stopping:
            wake = self._wake = anyio.Event()  # (what a call sets from here on)
            self._next_look = math.inf  # (leases meanwhile: the dues below include them)
            try:
                await self.expire()
            except Exception:
                logger.exception("queue expiry pass failed")
            now = self.clock()
            dues = [
                d
                for q in self._queues.values()
                for pq in q.partitions.values()
                if (d := pq.next_due()) is not None
            ]
            # at least once a second: stalled dead letters, head timestamps
            timeout_s = min([1.0] + [max(0.0, (d - now) / 1000) for d in dues])
            self._next_look = now + timeout_s * 1000
            with anyio.move_on_after(max(0.001, timeout_s)):
                await wake.wait()

    async def expire(self) -> None:
        """One pass over every window (see run)."""
        for q in list(self._queues.values()):
            if self._queues.get((q.topic, q.name)) is not q:
                continue  # deleted meanwhile
            state = self.engine.topics.get(q.topic)
            if state is None:
                continue
            back = False
            if q.ahead and anyio.current_time() - q.leased_at > AHEAD_IDLE_S:
                q.ahead.clear()
            for p, pq in list(q.partitions.items()):
                log = state.partitions[p] if p < len(state.partitions) else None
                if log is None or not _online(log):
                    continue
                if self.engine.stopping:
                    return
                async with q.lock(p):  # (a lease of the partition comes after: it sees this)
                    now = self.clock()
                    due_before = pq.next_due()
                    dying = [(e, REASON_MAX_DELIVERIES) for e in pq.due(now)]
                    dying += pq.take_stalled()
                    back = back or (due_before is not None and due_before <= now)
                    if dying:
                        read = await _read_offsets(log, [e.offset for e, _r in dying])
                        await self._dead_letters(q, p, dying, read)
                        await self._persist(q, [p])
                    await self._read_head(pq, log)
            if back:
                q.touched()  # long-polls: records came back, or a key's next may be leased

    async def _read_head(self, pq: PartitionQueue, log: Any) -> None:
        """pq.head: the first record's timestamp at start_offset when the window has not read
        it (a window read at all has it: oldest_unacked)."""
        if len(pq.entries) or pq.start >= log.high_watermark:
            return
        if pq.head is not None and pq.head[0] == pq.start:
            return
        start = pq.start
        result = await log.read_records(start, 1, 64 * 1024)
        if result.records and pq.start == start:
            pq.head = (start, result.records[0].timestamp)

    # -- queues -----------------------------------------------------------------------------

    def _queue(self, topic: str, name: str) -> Queue:
        state = self.engine.topic(topic)  # TopicNotFoundError
        q = self._queues.get((topic, name))
        if q is None or q.topic_id != state.meta.topic_id:
            raise QueueNotFoundError(topic, name)
        return q

    async def create(
        self, topic: str, name: str, settings: QueueSettings
    ) -> tuple[QueueInfo, bool]:
        """Create the queue (True), or find it with the same settings (False); QueueExistsError
        when it exists with others. Durable before it returns."""
        validate_queue_name(name)
        settings.validate()
        state = self.engine.topic(topic)
        if settings.dead_letter_topic is not None:
            if settings.dead_letter_topic == topic:
                raise InvalidFieldError("dead_letter_topic: a topic other than the queue's")
            self.engine.topic(settings.dead_letter_topic)  # TopicNotFoundError
        async with self._create_lock:
            try:
                q = self._queue(topic, name)
            except QueueNotFoundError:
                pass
            else:
                if q.settings != settings:
                    raise QueueExistsError(topic, name)
                return self.describe(topic, name), False
            starts = [
                await _start_offset(log_p, settings.start) if _online(log_p) else 0
                for log_p in state.partitions
            ]
            meta = QueueMeta(topic, name, secrets.token_hex(8), state.meta.topic_id,
                             settings.as_json(), self.clock(), tuple(starts))
            fields = {"queue": name, "id": meta.queue_id, "settings": meta.settings,
                      "created_ms": meta.created_ms, "starts": starts}
            await self._record([("queue_created", topic, meta.topic_id, fields)])
            self._define_new(meta)
            return self.describe(topic, name), True

    async def _record(
        self, events: list[tuple[str, str, str, dict[str, Any]]], *, sync: bool = True
    ) -> None:
        """Queue definitions as events of __metadata-0, each (kind, topic, topic id, fields),
        written here (the controller, where queues live) as a topic change is, under the same
        lock: durable, and applied by every shard of a family, when it returns (`sync=False`: at
        start-up, before the other shards read the log)."""
        if not events:
            return
        engine = self.engine
        async with engine._topic_lock:
            for kind, topic, topic_id, fields in events:
                await engine._append_event(kind, topic, topic_id, **fields)
            if sync:
                await engine._sync_family()

    async def delete(self, topic: str, name: str) -> None:
        """queue_deleted (durable, every shard told), then its windows' records tombstoned."""
        async with self._create_lock:
            q = self._queue(topic, name)
            fields = {"queue": name, "id": q.qid.hex()}
            await self._record([("queue_deleted", topic, q.topic_id, fields)])
            await self._forget([q])

    async def forget_topic(self, topic: str) -> int:
        """The topic was deleted (its topic_deleted event deleted its queues' definitions): its
        queues' windows go too (as its group offsets do)."""
        doomed = [q for (t, _n), q in self._queues.items() if t == topic]
        await self._forget(doomed)
        return len(doomed)

    async def _forget(self, doomed: list[Queue]) -> None:
        if not doomed:
            return
        items: list[tuple[bytes, bytes | None]] = []
        for q in doomed:
            for p, pq in q.partitions.items():
                items.append((_key("s", q.qid.hex(), p), None))
                for offset in pq.stored_offsets():
                    items.append((_key("o", q.qid.hex(), p, offset), None))
                for first, last in pq.stored_runs():
                    items.append((_key("r", q.qid.hex(), p, first, last), None))
            for (qid, p), (_s, _a, _d, kept, runs) in list(self._replayed.items()):
                if qid == q.qid:
                    items.append((_key("s", q.qid.hex(), p), None))
                    items += [(_key("o", q.qid.hex(), p, o), None) for o in kept]
                    items += [(_key("r", q.qid.hex(), p, f, la), None) for f, la in runs]
                    del self._replayed[(qid, p)]
            del self._queues[(q.topic, q.name)]
            del self._by_id[q.qid]
            q.touched()
        if items and (log := self._own_state_log()) is not None:  # (else: nothing persisted)
            await _append(log, items, self.clock())

    def names(self, topic: str) -> list[str]:
        state = self.engine.topic(topic)
        return sorted(
            n
            for (t, n), q in self._queues.items()
            if t == topic and q.topic_id == state.meta.topic_id
        )

    def describe(self, topic: str, name: str) -> QueueInfo:
        q = self._queue(topic, name)
        state = self.engine.topic(topic)
        now = self.clock()
        parts = []
        for p, log in enumerate(state.partitions):
            if not _online(log) or not self._owns(topic, p):
                continue
            pq = self._window(q, p, log)
            # what expired is available; what is dying is dead-lettered by the next call
            pq.stall((e, REASON_MAX_DELIVERIES) for e in pq.due(now))
            oldest = pq.oldest_unacked(log.high_watermark)
            age = max(0, now - oldest) if oldest is not None else 0
            parts.append(
                {"partition": p, **pq.stats(log.high_watermark), "oldest_unacked_age_ms": age}
            )
        return QueueInfo(topic, name, q.settings, q.created_ms, tuple(parts))

    def figures(self) -> list[tuple[str, str, dict[str, int]]]:
        """(topic, queue, its partitions' figures summed) of every queue this process holds
        (in a family, of the partitions this shard owns): what /metrics shows per queue."""
        out = []
        for topic, name in sorted(self._queues):
            try:
                info = self.describe(topic, name)
            except EngineError:  # its topic is going, or offline
                continue
            totals: dict[str, int] = {}
            for part in info.partitions:
                for field_name, value in part.items():
                    if field_name == "oldest_unacked_age_ms":  # (the queue's: the oldest)
                        totals[field_name] = max(totals.get(field_name, 0), value)
                    elif field_name not in ("partition", "start_offset", "end_offset"):
                        totals[field_name] = totals.get(field_name, 0) + value
            out.append((topic, name, totals))
        return out

    def _window(self, q: Queue, p: int, log: Any) -> PartitionQueue:
        pq = q.partitions.get(p)
        if pq is None:
            start, acked, dead, kept, runs = self._replayed.pop(
                (q.qid, p), (-1, 0, 0, {}, set())
            )
            if start < 0:  # a partition added after the queue was made: from its beginning
                start = log.log_start_offset
            pq = q.partitions[p] = PartitionQueue(
                p, q.settings.max_deliveries, q.settings.ordering == "key", start, acked, dead,
                kept, sorted(runs),
            )
        pq.trim(log.log_start_offset)
        return pq

    def _own_state_log(self) -> Any:
        """This process's partition of __queue_state (shard k's is k), if made yet."""
        state = self.engine.topics.get(QUEUE_STATE_TOPIC)
        me = self.engine.shard_index
        return state.partitions[me] if state is not None and me < len(state.partitions) else None

    async def _state_log(self) -> Any:
        """This process's partition of __queue_state, the topic made (a partition per shard) by
        the first call with a window change to persist (one of many concurrent leases, maybe:
        the others wait for it)."""
        log = self._own_state_log()
        if log is not None:
            return log
        async with self._state_lock:
            if QUEUE_STATE_TOPIC not in self.engine.topics:
                try:
                    await self.engine.create_topic(
                        QUEUE_STATE_TOPIC,
                        self.engine.shard_count,
                        {
                            "cleanup.policy": QUEUE_STATE_CONFIG.cleanup_policy,
                            "segment.bytes": QUEUE_STATE_CONFIG.segment_bytes,
                        },
                        internal=True,
                    )
                except TopicExistsError:  # another shard's first change made it: caught up
                    family = getattr(self.engine, "family", None)
                    if family is not None:
                        await family.catch_up_metadata()
        return self.engine.partition(QUEUE_STATE_TOPIC, self.engine.shard_index)

    # -- leasing ----------------------------------------------------------------------------

    async def lease(
        self,
        topic: str,
        name: str,
        max_records: int,
        lock_ms: int | None = None,
        wait_ms: int = 0,
    ) -> list[LeasedRecord]:
        """Lease up to `max_records` records; with `wait_ms`, wait that long for one (woken by
        the partitions' appends and by records coming back to the queue)."""
        _in_range("max_records", max_records, 1, MAX_LEASE_RECORDS)
        _in_range("wait_ms", wait_ms, 0, MAX_WAIT_MS)
        q = self._queue(topic, name)
        lock = q.settings.lock_ms if lock_ms is None else lock_ms
        _in_range("lock_ms", lock, *LOCK_MS_RANGE)
        deadline = anyio.current_time() + wait_ms / 1000
        while True:
            got = await self._lease_once(q, max_records, lock)
            left = deadline - anyio.current_time()
            if got or left <= 0 or self.engine.stopping:
                return got
            await self._wait(q, left)
            q = self._queue(topic, name)  # (deleted meanwhile: 404)

    async def _lease_once(self, q: Queue, n: int, lock_ms: int) -> list[LeasedRecord]:
        state = self.engine.topic(q.topic)
        logs = [
            (p, log) for p, log in enumerate(state.partitions)
            if _online(log) and self._owns(q.topic, p)
        ]
        if not logs:
            return []
        q.turn = (q.turn + 1) % len(logs)
        out: list[LeasedRecord] = []
        for p, log in logs[q.turn :] + logs[: q.turn]:
            if len(out) >= n:
                break
            try:
                async with q.lock(p):
                    got = await self._lease_partition(q, p, log, n - len(out), lock_ms)
                # the delivery counts, before the answer
                await self._persist(q, [p])
            except Exception:
                if not out:
                    raise
                # records leased from earlier partitions are answered (their counts are
                # durable): failing the call would count deliveries no worker saw
                logger.warning("queue %s/%s: lease of partition %d failed", q.topic, q.name, p,
                               exc_info=True)
                break
            out += got
        if out and min(r.lease_expires_at for r in out) < self._next_look:
            self._wake.set()  # (a deadline before the expiry loop's next look)
        return out

    async def _lease_partition(
        self, q: Queue, p: int, log: Any, n: int, lock_ms: int
    ) -> list[LeasedRecord]:
        pq = self._window(q, p, log)
        now = self.clock()
        dying = [(e, REASON_MAX_DELIVERIES) for e in pq.due(now)] + pq.take_stalled()
        leased, more = pq.take(n, now, lock_ms, _nonce)
        dying += [(e, REASON_MAX_DELIVERIES) for e in more]
        ahead = q.ahead.pop(p, {})
        read: dict[int, Record] = {e.offset: ahead.pop(e.offset) for e in leased
                                   if e.offset in ahead}
        while len(leased) < n and pq.wants_read(log.high_watermark):
            budget = READ_AHEAD_BYTES if n - len(leased) <= READ_AHEAD_RECORDS else READ_BYTES
            result = await log.read_records(pq.next, MAX_LEASE_RECORDS, budget)
            for r in result.records:
                read[r.offset] = r
            pq.admit(((r.offset, r.key, r.timestamp) for r in result.records), result.next_offset)
            now = self.clock()  # (a lock counts from the take: calls settled during the read)
            got, more = pq.take(n - len(leased), now, lock_ms, _nonce)
            leased += got
            dying += [(e, REASON_MAX_DELIVERIES) for e in more]
            if not result.records and result.next_offset <= pq.next:
                break
        wanted = [e.offset for e in leased] + [e.offset for e, _r in dying]
        for o in wanted:
            if o not in read and o in ahead:
                read[o] = ahead.pop(o)
        read.update(await _read_offsets(log, [o for o in wanted if o not in read]))
        self._keep_ahead(q, p, pq, ahead, read, wanted)
        await self._dead_letters(q, p, dying, read)  # (one that fails is retried later)
        out = []
        for e in leased:
            r = read.get(e.offset)
            if r is None:  # (deleted by retention while we read: counted as lost)
                continue
            lease = encode_lease(q.qid, p, e.offset, e.count, e.nonce)
            out.append(
                LeasedRecord(
                    p, r.offset, r.timestamp, r.key, r.value, r.headers, e.count, lease, e.deadline
                )
            )
        return out

    @staticmethod
    def _keep_ahead(
        q: Queue,
        p: int,
        pq: PartitionQueue,
        ahead: dict[int, Record],
        read: dict[int, Record],
        taken: list[int],
    ) -> None:
        """Keep the records read into the window and not leased (a read takes whole batches)
        for the partition's next leases, which then need no read of their own (a thread hop,
        and a wait on the partition's lock for the others): all that this lease's reads
        brought (their budget bounds them: dropping some would read and decode their batch
        again), then what was kept before up to READ_AHEAD_BYTES, none before the window's
        start; dropped when the queue idles."""
        gone = set(taken)
        if all(o in gone for o in read):
            # nothing read but what this lease took: `ahead` stays, less those (popped already)
            if ahead:
                q.ahead[p] = ahead
                q.leased_at = anyio.current_time()
            return
        kept: dict[int, Record] = {}
        size = 0
        for source, limit in ((read, math.inf), (ahead, READ_AHEAD_BYTES)):
            for offset, r in source.items():
                if offset in gone or offset < pq.start or offset in kept:
                    continue
                size += len(r.value or b"") + len(r.key or b"") + 64
                if size > limit:
                    break
                kept[offset] = r
        if kept:
            q.ahead[p] = kept
            q.leased_at = anyio.current_time()

    async def _wait(self, q: Queue, timeout_s: float) -> None:
        """Until a partition of the queue's topic gets records, the queue changes, a lease
        expires or a delay ends, or `timeout_s`."""
        now = self.clock()
        dues = [d for pq in q.partitions.values() if (d := pq.next_due()) is not None]
        if dues:
            timeout_s = max(0.001, min(timeout_s, (min(dues) - now) / 1000))
        state = self.engine.topic(q.topic)
        changed = q.changed
        waits: list[Callable[[], Awaitable[Any]]] = [changed.wait]
        for p, log in enumerate(state.partitions):
            if not _online(log):
                continue
            pq = q.partitions.get(p)
            end = pq.next if pq is not None else log.high_watermark
            if log.high_watermark > end:
                return  # records to read already (held back by key order: changed wakes us)
            waits.append(lambda log=log, end=end: log.wait_for_data(end, timeout_s))
        with anyio.move_on_after(timeout_s):
            async with anyio.create_task_group() as tg:

                async def first(wait: Callable[[], Awaitable[Any]]) -> None:
                    await wait()
                    tg.cancel_scope.cancel()

                for wait in waits:
                    tg.start_soon(first, wait)

    # -- settling ---------------------------------------------------------------------------

    async def settle(
        self,
        topic: str,
        name: str,
        action: str,
        leases: Sequence[str],
        *,
        delay_ms: int = 0,
        lock_ms: int | None = None,
    ) -> list[tuple[str, str]]:
        """ack, release (after `delay_ms`), reject or renew (for `lock_ms`) each lease:
        [(lease, status)], durable before it returns."""
        if action not in ACTIONS:
            raise InvalidRequestError(f"unknown action {action!r}")
        _in_range("delay_ms", delay_ms, 0, MAX_DELAY_MS)
        q = self._queue(topic, name)
        lock = q.settings.lock_ms if lock_ms is None else lock_ms
        _in_range("lock_ms", lock, *LOCK_MS_RANGE)
        state = self.engine.topic(topic)
        now = self.clock()
        results: list[tuple[str, str]] = []
        dying: dict[int, list[tuple[Entry, str]]] = {}
        mine: set[tuple[int, int]] = set()  # (partition, offset): this call's own actions' dying
        touched: set[int] = set()
        windows: dict[int, PartitionQueue | None] = {}  # (None: offline)
        for text in leases:
            lease = LeaseId.decode(text)
            if (
                lease is None
                or lease.qid != q.qid
                or not 0 <= lease.partition < len(state.partitions)
            ):
                results.append((text, UNKNOWN_S))
                continue
            if lease.partition in windows:
                pq = windows[lease.partition]
            else:  # (once a call: expired leases back, stalled dead letters taken)
                pq = windows[lease.partition] = self._settle_window(q, state, lease.partition,
                                                                     now, dying)
            e = pq.current(lease, now) if pq is not None else None
            if pq is None or e is None:
                results.append((text, EXPIRED_S))
                continue
            touched.add(lease.partition)
            if action == "ack":
                pq.ack(e, advance=False)
            elif action == "renew":
                pq.renew(e, now, lock)
            elif action == "reject":
                mine.add((lease.partition, e.offset))
                dying.setdefault(lease.partition, []).append((pq.reject(e), REASON_REJECTED))
            else:
                dead = pq.release(e, now, delay_ms)
                if dead is not None:
                    mine.add((lease.partition, dead.offset))
                    dying.setdefault(lease.partition, []).append((dead, REASON_MAX_DELIVERIES))
            results.append((text, ACTIONS[action]))
        for p in touched:
            q.partitions[p].advance()  # (past the acknowledged prefix: once, not per record)
        failed = await self._dead_letter_partitions(q, state, dying, mine)
        # what the call changed is persisted also when a dead letter failed (an acknowledgement
        # beside it is durable); the call fails after that, where its own reject (or release at
        # max_deliveries) is what was not done: the record stays dying, dead-lettered later
        await self._persist(q, sorted(touched | set(dying)))
        if action != "renew" and touched:
            q.touched()  # released records, and the next record of a key, may be leased now
        if action == "release":
            self._wake.set()  # (a delay to end)
        if failed:
            raise failed[0]
        return results

    def _settle_window(
        self, q: Queue, state: Any, p: int, now: int, dying: dict[int, list[tuple[Entry, str]]]
    ) -> PartitionQueue | None:
        """Partition p's window for a settle call, its due leases expired and its stalled dead
        letters added to `dying`; None when the partition is offline."""
        log = state.partitions[p]
        if not _online(log):
            return None
        pq = self._window(q, p, log)
        due = [(e, REASON_MAX_DELIVERIES) for e in pq.due(now)] + pq.take_stalled()
        if due:
            dying.setdefault(p, []).extend(due)
        return pq

    async def _dead_letter_partitions(
        self, q: Queue, state: Any, dying: dict[int, list[tuple[Entry, str]]],
        mine: set[tuple[int, int]],
    ) -> list[BaseException]:
        """_dead_letters of each partition's dying records, read first (a read that fails
        stalls them as a failed append does)."""
        failed: list[BaseException] = []
        for p, entries in dying.items():
            try:
                read = await _read_offsets(state.partitions[p], [e.offset for e, _ in entries])
            except Exception as exc:
                q.partitions[p].stall(entries)
                if any((p, e.offset) in mine for e, _r in entries):
                    failed.append(exc)
                continue
            failed += await self._dead_letters(q, p, entries, read, mine)
        return failed

    async def _dead_letters(
        self,
        q: Queue,
        p: int,
        dying: list[tuple[Entry, str]],
        read: dict[int, Record],
        mine: set[tuple[int, int]] = frozenset(),  # type: ignore[assignment]
    ) -> list[BaseException]:
        """_dead_letter for each reason. A dead letter that cannot be written (the dead-letter
        topic's partition down, a full disk) leaves its records dying, retried by a later call
        (PartitionQueue.stall); the errors of records in `mine` ((partition, offset)) are
        returned, the others logged."""
        pq = q.partitions[p]
        errors: list[BaseException] = []
        for reason in (REASON_MAX_DELIVERIES, REASON_REJECTED):
            entries = [e for e, r in dying if r == reason]
            if not entries:
                continue
            try:
                await self._dead_letter(q, p, entries, read, reason)
            except Exception as exc:
                pq.stall((e, reason) for e in entries)
                if any((p, e.offset) in mine for e in entries):
                    errors.append(exc)
                else:
                    logger.warning("queue %s/%s: dead letters of partition %d wait: %s",
                                   q.topic, q.name, p, exc)
        return errors

    async def _dead_letter(
        self, q: Queue, p: int, dying: list[Entry], read: dict[int, Record], reason: str
    ) -> None:
        """Append the records to the dead-letter topic (durable) before they are recorded dead;
        without one they are archived (only recorded)."""
        if not dying:
            return
        topic = q.settings.dead_letter_topic
        if topic is not None:
            state = self.engine.topic(topic)
            by_partition: dict[int, list[tuple[bytes | None, bytes | None, int, list]]] = {}
            for e in dying:
                r = read.get(e.offset)
                if r is None:
                    continue
                headers = [
                    *r.headers,
                    (DLQ_HEADERS[0], q.topic.encode()),
                    (DLQ_HEADERS[1], str(p).encode()),
                    (DLQ_HEADERS[2], str(e.offset).encode()),
                    (DLQ_HEADERS[3], str(e.count).encode()),
                    (DLQ_HEADERS[4], reason.encode()),
                    (DLQ_HEADERS[5], q.name.encode()),
                ]
                count = len(state.partitions)
                target = partition_for_key(r.key, count) if r.key is not None else p % count
                by_partition.setdefault(target, []).append((r.key, r.value, r.timestamp, headers))
            for target, items in sorted(by_partition.items()):
                log = self.engine.partition(topic, target)
                batch = encode_batch(0, items)
                await log.append(prepare_batches(batch, log.config, check_records=False))
        q.partitions[p].dead_done(dying)

    async def _persist(self, q: Queue, partitions: Iterable[int]) -> None:
        """Append what the windows' calls changed, the partitions' changes in one append (one
        commit); return once it is durable (with another call's append that took this call's
        changes, if one did: the state's appends commit in order, so the latest covers it)."""
        changed: dict[int, Changes] = {}
        waits: list[_Pending] = []
        for p in partitions:
            changes = q.partitions[p].take_changes()
            if changes:
                changed[p] = changes
            elif (pending := q.pending.get(p)) is not None:
                waits.append(pending)
        if changed:
            mine = _Pending()
            for p in changed:
                q.pending[p] = mine
            try:
                await self._append_changes(q, changed)
            except BaseException as exc:
                mine.error = exc
                raise
            finally:
                mine.done.set()
                for p in changed:
                    if q.pending.get(p) is mine:
                        del q.pending[p]
        for pending in waits:
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error

    async def _append_changes(self, q: Queue, changed: dict[int, Changes]) -> None:
        items: list[tuple[bytes, bytes | None]] = []
        for p, changes in changed.items():
            items += self._change_items(q.qid.hex(), p, changes)
        await _append(await self._state_log(), items, self.clock())

    @staticmethod
    def _change_items(qid: str, p: int, changes: Changes) -> list[tuple[bytes, bytes | None]]:
        """__queue_state records of one partition's changes (its start after its offsets)."""
        # (what _key and orjson.dumps write, byte for byte: compaction keeps a key's latest)
        prefix = f'["o","{qid}",{p},'.encode()
        items: list[tuple[bytes, bytes | None]] = [
            (b"%s%d]" % (prefix, offset), b'{"n":%d,"s":%d}' % (count, state))
            for offset, count, state in changes.offsets
        ]
        items += [(_key("r", qid, p, first, last), b'{"n":%d}' % count)
                  for first, last, count in changes.runs]
        if changes.start is not None:
            start, acked, dead = changes.start
            items.append(
                (_key("s", qid, p), orjson.dumps({"start": start, "acked": acked, "dead": dead}))
            )
        items += [(_key("o", qid, p, offset), None) for offset in changes.tombstones]
        items += [(_key("r", qid, p, first, last), None) for first, last in changes.run_tombstones]
        return items


def _replay_one(
    record: Record,
    settings: dict[tuple[str, str], dict[str, Any] | None],
    starts: dict[tuple[bytes, int], tuple[int, int, int]],
    offsets: dict[tuple[bytes, int], dict[int, tuple[int, int]]],
    runs: dict[tuple[bytes, int], set[tuple[int, int]]],
) -> None:
    """One __queue_state record into what replay keeps: per offset the largest delivery count
    and state any record names (an `r` run names each offset of its range, in flight)."""
    if record.key is None:
        return
    key = orjson.loads(record.key)
    value = orjson.loads(record.value) if record.value is not None else None
    kind = key[0]
    if kind == "q":
        settings[(key[1], key[2])] = value
        return
    where = (bytes.fromhex(key[1]), key[2])
    if kind == "s":
        if value is None:
            starts.pop(where, None)
            offsets.pop(where, None)
            runs.pop(where, None)
            return
        old = starts.get(where)
        if old is None or value["start"] >= old[0]:  # a start never goes back (any order)
            starts[where] = (value["start"], value["acked"], value["dead"])
    elif kind == "o":
        kept = offsets.setdefault(where, {})
        if value is None:
            kept.pop(key[3], None)
            return
        old_count, old_state = kept.get(key[3], (0, 0))
        kept[key[3]] = (max(old_count, value["n"]), max(old_state, value["s"]))
    elif kind == "r":
        extent = (key[3], key[4])
        if value is None:  # (the window's start passed it: its offsets are dropped anyway)
            runs.get(where, set()).discard(extent)
            return
        runs.setdefault(where, set()).add(extent)
        kept = offsets.setdefault(where, {})
        count = value["n"]
        for offset in range(key[3], key[4] + 1):
            old_count, old_state = kept.get(offset, (0, 0))
            if count > old_count:
                kept[offset] = (count, old_state)


def _settings_of(v: dict[str, Any]) -> QueueSettings:
    return QueueSettings(
        v["lock_ms"], v["max_deliveries"], v["ordering"], v["start"], v["dead_letter_topic"]
    )


def _online(log: Any) -> bool:
    return hasattr(log, "read_records")


class _Nonces:
    """Lease nonces from the OS's random source, 256 a read (a read per record was a tenth of
    a lease's time); 0 is none (no lease), skipped. (offset, count) tell leases apart too."""

    def __init__(self) -> None:
        self._left: Iterator[int] = iter(())

    def __call__(self) -> int:
        while True:
            for value in self._left:
                if value:
                    return value
            self._left = iter(array("I", os.urandom(1024)))


_nonce = _Nonces()


async def _start_offset(log: Any, start: str | int) -> int:
    if start == "earliest":
        return int(log.log_start_offset)
    if start == "latest":
        return int(log.high_watermark)
    found = await log.offset_for_timestamp(int(start))
    return int(found[0]) if found is not None else int(log.high_watermark)


async def _read_offsets(log: Any, offsets: Iterable[int]) -> dict[int, Record]:
    """The records at `offsets` (those still in the log), read in runs."""
    wanted = sorted(set(offsets))
    found: dict[int, Record] = {}
    i = 0
    while i < len(wanted):
        first = max(wanted[i], log.log_start_offset)
        j = i
        while j + 1 < len(wanted) and wanted[j + 1] - wanted[j] <= 64:
            j += 1
        last = wanted[j]
        offset = first
        while offset <= last and offset < log.high_watermark:
            result = await log.read_records(offset, last - offset + 1, READ_BYTES)
            for r in result.records:
                found[r.offset] = r
            if result.next_offset <= offset:
                break
            offset = result.next_offset
        i = j + 1
    return {o: found[o] for o in wanted if o in found}


async def _append(log: Any, items: list[tuple[bytes, bytes | None]], now: int) -> None:
    """__queue_state records, durable when it returns: one batch (one fsync) of up to
    APPEND_RECORDS (under the topic's max.message.bytes); several in order past that, whose
    replay is right at any cut (a start record comes after its offsets' records)."""
    for i in range(0, len(items), APPEND_RECORDS):
        batch = encode_batch(0, [(k, v, now, ()) for k, v in items[i : i + APPEND_RECORDS]])
        await log.append(prepare_batches(batch, log.config, check_records=False))


async def ready(value: Any) -> Any:
    """A lone process's queues answer at once; a shard's may ask the others (awaitable)."""
    return await value if inspect.isawaitable(value) else value
