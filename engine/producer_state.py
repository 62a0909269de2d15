"""Idempotent producers: per-partition producer state, duplicate detection, and its snapshots.

Kafka's rules (ProducerStateManager), for batches whose producerId is set (>= 0):

- The partition remembers, per producer id, its epoch and the metadata of its last
  MAX_BATCHES_PER_PRODUCER batches: first and last sequence, first and last offset, max
  timestamp.
- A batch whose epoch and sequence range equal a remembered batch is a duplicate (a retry of
  something already written): nothing is appended and the first write's offsets are returned.
- An epoch below the remembered one is fenced (ProducerFencedError).
- A new epoch must start at sequence 0 (unless the producer was unknown); within an epoch,
  the first sequence must follow the last one (int32 wrap-around included), otherwise
  OutOfOrderSequenceError. A producer the partition does not know may start anywhere (its
  state may have expired or been deleted with old segments).
- A producer expires producer_id_expiration_ms after its last append (wall clock; Kafka uses
  the batch's timestamp, which producers set and may set in the past).

Durability: the state is a function of the log, so recovery can always rebuild it by reading
the batch headers again. To bound that work the writer saves it at every segment roll and at
clean shutdown, in two files named by the offset below which every batch is covered:

* `<20-digit offset>.snapshot`: Kafka's ProducerStateManager snapshot, byte for byte, so that
  a Kafka broker (or kafka-dump-log.sh) reading the directory finds what it expects. Per
  producer only the last batch; transactions never exist here. Big-endian:

      version    int16   1
      crc        uint32  CRC-32C of everything after this field
      count      int32   producers
      count x:   producer_id int64, epoch int16, last_sequence int32, last_offset int64,
                 offset_delta int32 (last offset - first offset of that batch),
                 timestamp int64 (its max timestamp), coordinator_epoch int32 (-1),
                 current_txn_first_offset int64 (-1)

* `<20-digit offset>.producers`: eventlog's own, richer state (the last
  MAX_BATCHES_PER_PRODUCER batches and the wall-clock time of the last append, which is what
  expiry and the Idempotency-Key windows need). Big-endian:

      version    int16   1
      crc        uint32  CRC-32C of everything after this field
      count      int32   producers
      count x:   producer_id int64, epoch int16, last_append_ms int64, batches int8,
                 batches x (first_seq int32, last_seq int32, first_offset int64,
                            last_offset int64, max_timestamp int64)

  (Data dirs written before the split hold this layout under the `.snapshot` name; loading
  still reads it there. The two cannot be confused: this one has at least one 32-byte batch per
  19-byte producer, Kafka's exactly 46 bytes per producer.)

Each file is written to "<name>.tmp", fsynced, renamed, directory fsynced (`.producers`
first, then `.snapshot`); the two newest of each kind are kept. Loading takes the newest
readable `.producers` file at or below the log end; only without one (a directory imported
from Kafka) the newest readable `.snapshot`. The batch headers after the loaded offset are then
replayed. A crash at any point leaves whole files only: between the two renames, a
`.producers` without its `.snapshot`, which eventlog loads (a Kafka broker would load the older
`.snapshot` and replay from there).
Mutations happen on the partition's writer thread only; nothing here is used by readers.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import crc32c

from .errors import OutOfOrderSequenceError, ProducerFencedError, StorageError
from .fileutil import replace_file
from .format import BatchHeader

logger = logging.getLogger("eventlog.engine")

SNAPSHOT_SUFFIX = ".snapshot"  # Kafka's layout
STATE_SUFFIX = ".producers"  # eventlog's own
MAX_BATCHES_PER_PRODUCER = 5
INT32_MAX = 2**31 - 1
NO_PRODUCER_ID = -1
KEEP_SNAPSHOTS = 2
DEFAULT_EXPIRATION_MS = 86_400_000  # Kafka's producer.id.expiration.ms

_VERSION = 1
_HEAD = struct.Struct(">hI")
_COUNT = struct.Struct(">i")
_PRODUCER = struct.Struct(">qhqb")
_BATCH = struct.Struct(">iiqqq")
_KAFKA_ENTRY = struct.Struct(">qhiqiqiq")
NO_COORDINATOR_EPOCH = -1
NO_TXN_OFFSET = -1


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record (sequences wrap from INT32_MAX to 0)."""
    if base_sequence > INT32_MAX - last_offset_delta:
        return last_offset_delta - (INT32_MAX - base_sequence) - 1
    return base_sequence + last_offset_delta


def first_sequence(last_seq: int, offset_delta: int) -> int:
    """The sequence of a batch's first record, from its last one (the inverse of last_sequence)."""
    if last_seq < offset_delta:
        return INT32_MAX - (offset_delta - last_seq) + 1
    return last_seq - offset_delta


def _in_sequence(last_seq: int, next_first: int) -> bool:
    return next_first == last_seq + 1 or (last_seq == INT32_MAX and next_first == 0)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    last_timestamp: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=MAX_BATCHES_PER_PRODUCER))

    def find(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    @property
    def last_seq(self) -> int | None:
        return self.batches[-1].last_seq if self.batches else None


def snapshot_name(offset: int, suffix: str = SNAPSHOT_SUFFIX) -> str:
    return f"{offset:020d}{suffix}"


def parse_snapshot_name(name: str, suffix: str = SNAPSHOT_SUFFIX) -> int | None:
    if len(name) == 20 + len(suffix) and name.endswith(suffix) and name[:20].isdigit():
        return int(name[:20])
    return None


class ProducerStateManager:
    """The producer state of one partition (writer thread only)."""

    def __init__(self, directory: Path, expiration_ms: int) -> None:
        self.directory = directory
        self.expiration_ms = expiration_ms
        self.producers: dict[int, ProducerEntry] = {}
        self.snapshot_offset = -1  # offset of the newest snapshot written or loaded

    def __len__(self) -> int:
        return len(self.producers)

    # -- checks and updates -------------------------------------------------------------------

    def _live_entry(self, producer_id: int, now_ms: int) -> ProducerEntry | None:
        entry = self.producers.get(producer_id)
        if entry is not None and now_ms - entry.last_timestamp >= self.expiration_ms:
            del self.producers[producer_id]
            return None
        return entry

    def check(
        self, header: BatchHeader, now_ms: int, pending: dict[int, ProducerEntry] | None = None
    ) -> BatchMetadata | None:
        """The remembered batch this one duplicates, or None if it may be appended.

        Raises ProducerFencedError or OutOfOrderSequenceError. `pending` holds the entries a
        group commit has already updated (checked first), so several batches of one producer in
        one commit are checked against each other.
        """
        pid = header.producer_id
        if pid < 0:
            return None
        entry = pending.get(pid) if pending else None
        if entry is None:
            entry = self._live_entry(pid, now_ms)
        if entry is None:
            return None
        epoch = header.producer_epoch
        first = header.base_sequence
        last = last_sequence(first, header.last_offset_delta)
        duplicate = entry.find(epoch, first, last)
        if duplicate is not None:
            return duplicate
        if epoch < entry.epoch:
            raise ProducerFencedError(pid, epoch, entry.epoch)
        if epoch > entry.epoch:
            if first != 0:
                raise OutOfOrderSequenceError(pid, epoch, first, None)
            return None
        last_seq = entry.last_seq
        if last_seq is not None and not _in_sequence(last_seq, first):
            raise OutOfOrderSequenceError(pid, epoch, first, last_seq)
        return None

    def updated_entry(
        self, header: BatchHeader, first_offset: int, max_timestamp: int, pending: dict[int, ProducerEntry], now_ms: int
    ) -> None:
        """Record an appended batch into `pending` (a copy of the entry, applied by commit()).

        The expiration clock runs from the append's wall-clock time, not the batch's own
        timestamps (which producers choose, and which may be old)."""
        pid = header.producer_id
        if pid < 0:
            return
        entry = pending.get(pid)
        if entry is None:
            current = self.producers.get(pid)
            entry = ProducerEntry(header.producer_epoch, now_ms)
            if current is not None and current.epoch == header.producer_epoch:
                entry.batches.extend(current.batches)
            pending[pid] = entry
        elif entry.epoch != header.producer_epoch:
            entry.epoch = header.producer_epoch
            entry.batches.clear()
        first = header.base_sequence
        entry.batches.append(BatchMetadata(
            first, last_sequence(first, header.last_offset_delta),
            first_offset, first_offset + header.last_offset_delta, max_timestamp,
        ))
        entry.last_timestamp = max(entry.last_timestamp, now_ms)

    def commit(self, pending: dict[int, ProducerEntry]) -> None:
        self.producers.update(pending)

    def replay(self, headers: Iterable[BatchHeader], now_ms: int) -> int:
        """Apply batches read back from the log (recovery). Their append times are not in the
        log, so replayed producers count as active at `now_ms`. Returns how many batches had a
        producer."""
        applied = 0
        for header in headers:
            if header.producer_id < 0:
                continue
            pending: dict[int, ProducerEntry] = {}
            self.updated_entry(header, header.base_offset, header.max_timestamp, pending, now_ms)
            self.producers.update(pending)
            applied += 1
        return applied

    def remove_expired(self, now_ms: int) -> int:
        expired = [pid for pid, e in self.producers.items() if now_ms - e.last_timestamp >= self.expiration_ms]
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot_offsets(
        self, suffix: str = SNAPSHOT_SUFFIX, names: list[str] | None = None
    ) -> list[int]:
        """Offsets of the snapshot files with `suffix`, oldest first (`names`: the directory's
        listing, when the caller has it)."""
        if names is None:
            try:
                names = os.listdir(self.directory)
            except FileNotFoundError:
                return []
        return sorted(o for n in names if (o := parse_snapshot_name(n, suffix)) is not None)

    def encode(self) -> bytes:
        """eventlog's own file (`.producers`)."""
        parts = [_COUNT.pack(len(self.producers))]
        for pid, e in self.producers.items():
            parts.append(_PRODUCER.pack(pid, e.epoch, e.last_timestamp, len(e.batches)))
            for b in e.batches:
                parts.append(_BATCH.pack(b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.max_timestamp))
        return _framed(parts)

    def encode_kafka(self) -> bytes:
        """Kafka's `.snapshot`: per producer its last batch; no transactions."""
        parts = [_COUNT.pack(len(self.producers))]
        for pid, e in self.producers.items():
            if e.batches:
                b = e.batches[-1]
                parts.append(_KAFKA_ENTRY.pack(
                    pid, e.epoch, b.last_seq, b.last_offset, b.last_offset - b.first_offset, b.max_timestamp,
                    NO_COORDINATOR_EPOCH, NO_TXN_OFFSET,
                ))
            else:  # known only by its epoch (loaded from a Kafka snapshot without batch metadata)
                parts.append(_KAFKA_ENTRY.pack(pid, e.epoch, -1, -1, 0, e.last_timestamp, NO_COORDINATOR_EPOCH, NO_TXN_OFFSET))
        return _framed(parts)

    @staticmethod
    def decode(data: bytes, path: Path | str = "?") -> dict[int, ProducerEntry]:
        """Parse eventlog's own file's bytes; StorageError if it is not a whole, valid one."""
        body = _unframed(data, path)
        (count,) = _COUNT.unpack_from(body, 0)
        pos = _COUNT.size
        producers: dict[int, ProducerEntry] = {}
        try:
            for _ in range(count):
                pid, epoch, last_ts, n = _PRODUCER.unpack_from(body, pos)
                pos += _PRODUCER.size
                if n < 0 or n > MAX_BATCHES_PER_PRODUCER:
                    raise StorageError(path, f"producer {pid} has {n} batches")
                entry = ProducerEntry(epoch, last_ts)
                for _ in range(n):
                    entry.batches.append(BatchMetadata(*_BATCH.unpack_from(body, pos)))
                    pos += _BATCH.size
                producers[pid] = entry
        except struct.error as exc:
            raise StorageError(path, f"producer snapshot is truncated: {exc}") from None
        if pos != len(body):
            raise StorageError(path, f"producer snapshot has {len(body) - pos} trailing bytes")
        return producers

    @staticmethod
    def decode_kafka(data: bytes, now_ms: int, path: Path | str = "?") -> dict[int, ProducerEntry]:
        """Parse a Kafka `.snapshot`; StorageError if it is not a whole, valid one. Kafka's file
        holds no append times: its producers count as active at `now_ms`, as replayed batches
        do. Open transactions and coordinator epochs are not kept (eventlog has none)."""
        body = _unframed(data, path)
        (count,) = _COUNT.unpack_from(body, 0)
        if count < 0 or len(body) != _COUNT.size + count * _KAFKA_ENTRY.size:
            raise StorageError(path, f"not a Kafka producer snapshot: {len(body)} bytes for {count} producers")
        producers: dict[int, ProducerEntry] = {}
        for i in range(count):
            pid, epoch, last_seq, last_offset, delta, ts, _coordinator, _txn = _KAFKA_ENTRY.unpack_from(
                body, _COUNT.size + i * _KAFKA_ENTRY.size
            )
            if pid < 0 or delta < 0:
                raise StorageError(path, f"not a Kafka producer snapshot: producer {pid}, offset delta {delta}")
            entry = ProducerEntry(epoch, now_ms)
            if last_offset >= 0:
                entry.batches.append(BatchMetadata(
                    first_sequence(last_seq, delta), last_seq, last_offset - delta, last_offset, ts,
                ))
            producers[pid] = entry
        return producers

    def write_snapshot(self, offset: int, now_ms: int) -> None:
        """Save the state (covering every batch below `offset`): eventlog's `.producers`,
        then Kafka's `.snapshot`; keep the two newest of each."""
        self.remove_expired(now_ms)
        path = self.directory / snapshot_name(offset, STATE_SUFFIX)
        try:
            replace_file(path, self.encode())
            path = self.directory / snapshot_name(offset)
            replace_file(path, self.encode_kafka())
            # an old one that a crash brings back is harmless: loading takes the newest
            for suffix in (SNAPSHOT_SUFFIX, STATE_SUFFIX):
                for old in self.snapshot_offsets(suffix)[:-KEEP_SNAPSHOTS]:
                    (self.directory / snapshot_name(old, suffix)).unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(path, f"cannot write producer snapshot: {exc}") from exc
        self.snapshot_offset = offset

    def load(self, log_end_offset: int, now_ms: int, names: list[str] | None = None) -> int:
        """Load the newest valid `.producers` file at or below `log_end_offset`, or without
        one the newest valid `.snapshot` (Kafka's layout, or eventlog's own in data dirs written
        before the split); returns its offset, or -1 if there is none. Files past the log end
        (a crash lost their data) and unreadable ones are deleted."""
        self.producers = {}
        self.snapshot_offset = -1
        if names is None:  # listed once: what is deleted below is never looked for again
            names = os.listdir(self.directory)
        for name in names:
            if name.endswith((SNAPSHOT_SUFFIX + ".tmp", STATE_SUFFIX + ".tmp")):
                (self.directory / name).unlink(missing_ok=True)
        for suffix in (STATE_SUFFIX, SNAPSHOT_SUFFIX):
            for offset in reversed(self.snapshot_offsets(suffix, names)):
                path = self.directory / snapshot_name(offset, suffix)
                if offset > log_end_offset:
                    logger.warning("%s: deleting %s, which is past the log end %d", self.directory.name, path.name, log_end_offset)
                    path.unlink(missing_ok=True)
                    continue
                if self.snapshot_offset >= 0:
                    continue  # loaded already; this pass only drops files past the end
                try:
                    self.producers = self._read(path, suffix, now_ms)
                except (StorageError, OSError) as exc:
                    logger.warning("%s: ignoring unreadable producer snapshot %s: %s", self.directory.name, path.name, exc)
                    path.unlink(missing_ok=True)
                    continue
                self.snapshot_offset = offset
        self.remove_expired(now_ms)
        return self.snapshot_offset

    def _read(self, path: Path, suffix: str, now_ms: int) -> dict[int, ProducerEntry]:
        data = path.read_bytes()
        if suffix == STATE_SUFFIX:
            return self.decode(data, path)
        try:
            return self.decode_kafka(data, now_ms, path)
        except StorageError as kafka_error:
            try:
                return self.decode(data, path)  # written by eventlog before the split
            except StorageError:
                raise kafka_error from None


def _framed(parts: list[bytes]) -> bytes:
    body = b"".join(parts)
    return _HEAD.pack(_VERSION, crc32c.crc32c(body)) + body


def _unframed(data: bytes, path: Path | str) -> memoryview:
    """The body after version and CRC, both checked."""
    if len(data) < _HEAD.size + _COUNT.size:
        raise StorageError(path, "producer snapshot is too short")
    version, crc = _HEAD.unpack_from(data, 0)
    if version != _VERSION:
        raise StorageError(path, f"unsupported producer snapshot version {version}")
    body = memoryview(data)[_HEAD.size :]
    if crc32c.crc32c(body) != crc:
        raise StorageError(path, "producer snapshot CRC mismatch")
    return body


def rebuild(
    state: ProducerStateManager, segments: Sequence, log_end_offset: int, now_ms: int,
    names: list[str] | None = None,
) -> int:
    """Recovery: load the newest snapshot, then replay the batch headers after it (all of the
    last two segments when there is no snapshot). Returns the batches replayed. Blocking.
    `names`: the partition directory's listing, when the caller has it."""
    start = state.load(log_end_offset, now_ms, names)
    if start < 0:
        start = segments[-2].base_offset if len(segments) > 1 else segments[0].base_offset
    replayed = 0
    for segment in segments:
        if segment.size == 0 or segment.next_offset <= start:
            continue
        position = 0
        if segment.base_offset < start:
            header = segment.find_batch(start, segment.size)
            if header is None:
                continue
            position = header.position
        replayed += state.replay(segment.headers(position, segment.size), now_ms)
    state.remove_expired(now_ms)
    return replayed
