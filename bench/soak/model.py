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
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

PLAIN = "soak-plain"  # delete policy, default retention: nothing may ever be missing
RETAINED = "soak-retained"  # small retention.bytes / retention.ms: old segments go
TABLE = "soak-table"  # compacted, small key space, tombstones

TABLE_KEYS = 48
TOMBSTONE_PER_256 = 38  # ~15 % of the table topic's writes are tombstones

# what each topic may legitimately lose at the front, and whether its offsets may have gaps
EXPIRES = {PLAIN: False, RETAINED: True, TABLE: True}
GAPS = {PLAIN: False, RETAINED: False, TABLE: True}


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
