"""What the soak's clients know: every acknowledged record, every write in doubt, every record a
reader has seen, and the failures found so far.

Each record the soak writes has an integer id (writer number << 40 | sequence) carried in its
`id` header; its key, value and tombstone flag are functions of the id (`content`), so the
model keeps one int per acknowledged offset and the verifier recomputes what must be there.

* acked[(topic, partition)][offset] = id, filled from 2xx produce responses. Two acks naming
  the same offset are a failure at once ("duplicate_ack").
* in_doubt[topic]: ids of produce requests whose connection died (the server was killed while they
  were in flight) or that got a 5xx: they may or may not be in the log, and either is allowed.
* seen[(topic, partition)][offset] = id for records a reader saw before their producer's ack
  was processed (once acked, the ack covers them). Readers only see records below the high
  watermark, which are durable, so after any number of kills the same id must still be at that
  offset (unless retention or compaction removed it).
* refused[topic]: ids of produce requests answered 507 storage_full: definitely not written, so
  any of them in the log is a failure ("refused_written").
* Exact writers (idempotent and conditional producers) retry a request in doubt with its
  Idempotency-Key until it is answered: its ids are in doubt only until then (resolve), after
  which the answer's offsets are acknowledged like any other. exact_writers holds their writer
  numbers; sequenced[(topic, partition)] the conditional ones, whose records must appear in
  their sequence order with no gap and no repeat (verify.check_sequences).
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

PLAIN = "soak-plain"  # delete policy, default retention: nothing may ever be missing
RETAINED = "soak-retained"  # small retention.bytes / retention.ms: old segments go
TABLE = "soak-table"  # compacted, small key space, tombstones
FULL = "soak-full"  # one partition; its directory gets ENOSPC injected in disk-full phases
LEDGER = "soak-ledger"  # one partition; only conditional (If-Match) producers write it
MANY = "soak-many"  # many partitions; one-record appends from many producers at once (issue 13)
AGGREGATES = "soak-aggregates"  # per-key conditional appends (issue 14): a key is an aggregate

TABLE_KEYS = 48
AGGREGATE_KEYS = 12  # every key writer writes all of them: they contend
TOMBSTONE_PER_256 = 38  # ~15 % of the table topic's writes are tombstones

# what each topic may legitimately lose at the front, and whether its offsets may have gaps
EXPIRES = {PLAIN: False, RETAINED: True, TABLE: True, FULL: False, LEDGER: False, MANY: False, AGGREGATES: False}
GAPS = {PLAIN: False, RETAINED: False, TABLE: True, FULL: False, LEDGER: False, MANY: False, AGGREGATES: False}


def record_id(writer: int, seq: int) -> int:
    return writer << 40 | seq


def content(topic: str, rid: int) -> tuple[bytes | None, bytes | None]:
    """(key, value) of record `rid` written to `topic`; value None is a tombstone."""
    h = hashlib.blake2b(rid.to_bytes(8, "big"), digest_size=16).digest()
    pad = h.hex()[: h[4] % 32]
    if topic == TABLE:
        key = b"key-%d" % (int.from_bytes(h[:2], "big") % TABLE_KEYS)
        value = None if h[1] < TOMBSTONE_PER_256 else f"v{rid}-{pad}".encode()
        return key, value
    if topic == AGGREGATES:  # the key of a writer's n-th record: n % AGGREGATE_KEYS
        return b"agg-%d" % ((rid & ((1 << 40) - 1)) % AGGREGATE_KEYS), f"v{rid}-{pad}".encode()
    key = None if h[0] % 3 == 0 else b"user-%d" % (int.from_bytes(h[2:4], "big") % 500)
    return key, f"v{rid}-{pad}".encode()


def id_header(rid: int) -> tuple[str, bytes]:
    return ("id", str(rid).encode())


@dataclass
class Failure:
    kind: str  # lost, duplicated, phantom, corrupt, inconsistent_read, gap, table_mismatch, ...
    detail: str
    at_seconds: float  # since the soak started


@dataclass
class Model:
    acked: dict[tuple[str, int], dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    in_doubt: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    seen: dict[tuple[str, int], dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    acked_ids: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    refused: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    exact_writers: set[int] = field(default_factory=set)
    sequenced: dict[tuple[str, int], set[int]] = field(default_factory=lambda: defaultdict(set))
    failures: list[Failure] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    clock: Callable[[], float] = lambda: 0.0

    def fail(self, kind: str, detail: str) -> None:
        self.counts[f"failure_{kind}"] += 1
        if sum(1 for f in self.failures if f.kind == kind) < 50:  # keep the report readable
            self.failures.append(Failure(kind, detail, round(self.clock(), 1)))

    def ack(self, topic: str, partition: int, offset: int, rid: int) -> None:
        log = self.acked[(topic, partition)]
        other = log.get(offset)
        if other is not None and other != rid:
            self.fail(
                "duplicated",
                f"{topic}/{partition} offset {offset} acknowledged twice: id {other}, then id {rid}",
            )
            return
        log[offset] = rid
        self.acked_ids[rid] = (topic, partition, offset)
        self.counts["acked"] += 1
        seen = self.seen.get((topic, partition))
        if seen is not None and offset in seen and seen.pop(offset) != rid:
            self.fail(
                "inconsistent_read",
                f"{topic}/{partition} offset {offset}: a reader saw another id than {rid}, acknowledged there",
            )

    def doubt(self, topic: str, ids: list[int]) -> None:
        self.in_doubt[topic].update(ids)
        self.counts["in_doubt"] += len(ids)

    def resolve(self, topic: str, ids: list[int]) -> None:
        """A request in doubt was answered at last (a retry with its Idempotency-Key): its ids
        are no longer in doubt; the caller acknowledges them at the answer's offsets."""
        doubted = self.in_doubt[topic]
        for rid in ids:
            if rid in doubted:
                doubted.discard(rid)
                self.counts["in_doubt_resolved"] += 1

    def refuse(self, topic: str, ids: list[int]) -> None:
        """A 507 storage_full: these ids were not written and never may be."""
        self.refused[topic].update(ids)
        self.counts["refused"] += len(ids)

    def observe(self, topic: str, partition: int, offset: int, rid: int | None, reader: str) -> None:
        """A reader saw `rid` at `offset` (rid None: a record without the soak's id header)."""
        if rid is None:
            self.fail("phantom", f"{reader} read {topic}/{partition} offset {offset}: no id header")
            return
        acked = self.acked.get((topic, partition), {}).get(offset)
        if acked is not None:
            if acked != rid:
                self.fail(
                    "inconsistent_read",
                    f"{reader} read id {rid} at {topic}/{partition} offset {offset}, acknowledged id {acked}",
                )
            return
        placed = self.acked_ids.get(rid)
        if placed is not None:  # acknowledged somewhere else
            self.fail(
                "inconsistent_read",
                f"{reader} read id {rid} at {topic}/{partition} offset {offset}, acknowledged at {placed}",
            )
            return
        seen = self.seen[(topic, partition)]
        earlier = seen.setdefault(offset, rid)
        if earlier != rid:
            self.fail(
                "inconsistent_read",
                f"{topic}/{partition} offset {offset}: readers saw id {earlier} and id {rid}",
            )
