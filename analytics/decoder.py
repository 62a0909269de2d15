"""Vectorised decoding of Kafka v2 segment files into Arrow record batches (no Spark here).

Output: `ARROW_SCHEMA`, exactly what PySpark's `to_arrow_schema(timezone="UTC")` makes of
`SPARK_DDL` (binary, not large_binary; int32 partition; timestamp[us, UTC]; headers as
list<element: struct<key: string, value: binary>>; every field nullable). A Python data source
that yields Arrow must match it exactly (DATA_SOURCE_RETURN_SCHEMA_MISMATCH otherwise).

What `decode_segment(path, size_bytes, ...)` guarantees:

* `path` is a local file or a URI of a pyarrow filesystem (storage.py: s3://, hdfs://, ...;
  read in the same windows, as ranged reads). Only bytes [0, size_bytes) are read; whatever
  follows (a live segment kept growing after the snapshot) is ignored. A file shorter than
  size_bytes is an error.
* Every batch read is checked as recovery checks it (docs/FORMAT.md, torn-tail rule): 61
  header bytes, batchLength >= 49, inside size_bytes, magic 2, lastOffsetDelta and count >= 0,
  CRC-32C, baseOffset not below the previous batch's next offset. The records of every batch
  that is decoded must frame exactly (count, lengths, fields inside each record, nothing left
  over). Any failure raises `SnapshotCorruptError(path, position, reason)` with the batch's
  byte position: a torn or corrupt snapshot is a clear error, never wrong or missing rows. The
  walk stops early only at the first batch at or past `end_offset`; batches skipped by their
  header (below start_offset, control batches) are CRC-checked but their records not parsed.
* Control batches (attribute bit 0x20) and empty batches are skipped. Transactions are not
  filtered (read_uncommitted): no .txnindex is read, so aborted records are returned.
* Offsets = baseOffset + offsetDelta. Timestamps = baseTimestamp + timestampDelta (also in
  delete-horizon batches, bit 0x40, like engine.records), except in LogAppendTime batches
  (bit 0x08), where every record gets the batch's maxTimestamp. Kafka ms become Arrow us.
* Rows are filtered by start_offset <= offset < end_offset and start_ts <= timestamp < end_ts
  (None = unbounded). Whole batches are skipped by header when their offsets (or a
  LogAppendTime batch's one timestamp) lie outside; CreateTime batches are never skipped by
  maxTimestamp, which the producer sets and the log does not re-check.
* Null keys and values (length -1) are nulls; records without headers get an empty list.
  Header keys must be UTF-8 (Java strings always are); invalid bytes become U+FFFD.

How it is vectorised (numpy + pyarrow; no per-record Python in the common case):

1. Python walks batch headers only (struct + crc32c per batch) over 16 MiB windows read into
   a zero-padded bytearray. Batches are grouped within one window until a group holds at least
   max_rows_per_batch records (a batch is never split) or 32 MiB. An uncompressed group is decoded in place in the window; otherwise the group's
   record blocks (decompressed) are joined into one buffer. The zero pad lets every gather run a
   few bytes past a record without bounds checks; a later check rejects what ran too far.
2. Record starts (each record begins with its length varint), by the cheapest of three methods
   under a simple cost model, each verified, the next one tried on failure:
   a. lock-step: one numpy step per record index, advancing every batch of the group at once
      (`pos += ADVANCE[two bytes at pos]`, a 64 Ki-entry table of varint size + length for
      1- and 2-byte lengths, i.e. records under 8 KiB); cost ~ one numpy step per record
      of the largest batch plus a cache miss per record.
   b. candidates: a record start is a varint followed by the attributes byte, which is 0, so
      candidates come from the zero bytes (walking back over up to 5 varint bytes), each with
      its successor start + size + length. Record k of a batch is successor^k(its first
      record); jumps of 1, 2, 4, ... candidates are composed for all records at once
      (log2(recordsCount) numpy rounds), so false candidates inside values cost nothing more,
      even when a value holds encoded records. Cost ~ bytes scanned.
   c. a per-record Python walk over the length varints; it also names what is corrupt.
   Verification: each batch's first record starts its block, each record ends where the next
   starts, the last ends the block, every batch has exactly recordsCount records.
3. Fields: varints decoded for all records at once (two-byte table lookup; the rare longer
   ones continue byte by byte for those records only), then checked to end exactly where each
   record's length says.
4. Columns: keys and values become Arrow binary_view arrays pointing into the buffer (16-byte
   views built with numpy from unaligned 4-byte reads); one C++ cast to binary copies the
   bytes. Nulls come from validity bitmaps. Headers take one vectorised round per header index
   over the records that have that many; zero-header records cost nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from crc32c import crc32c

from engine import compression
from engine.errors import CorruptBatchError
from engine.format import (
    BATCH_HEADER,
    COMPRESSION_MASK,
    CONTROL_BIT,
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    TIMESTAMP_TYPE_BIT,
)

from .storage import open_input

__all__ = [
    "ARROW_SCHEMA",
    "DEFAULT_MAX_ROWS",
    "HEADERS_TYPE",
    "SPARK_DDL",
    "SnapshotCorruptError",
    "decode_segment",
    "decode_segment_keys",
    "decode_segment_rows",
]

SPARK_DDL = (
    "topic string, partition int, offset long, timestamp timestamp, key binary, value binary, "
    "headers array<struct<key: string, value: binary>>"
)
HEADER_STRUCT = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_STRUCT))
ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
    ]
)

DEFAULT_MAX_ROWS = 65536
_GROUP_BYTES = 32 << 20  # a group also ends at this many stored batch bytes
_WINDOW_BYTES = 16 << 20  # file read size (grown for a larger batch)
_BUFFER_LIMIT = (1 << 31) - 64  # binary_view offsets are int32
_PAD = 16  # zero bytes after every buffer
_MIN_RECORD_BODY = 6  # attributes, timestampDelta, offsetDelta, keyLength, valueLength, headerCount
# cost model for choosing how to find record starts (seconds, measured on a 2-core VM): a
# lock-step step has a fixed cost plus a cache miss per lane; candidates cost per byte scanned
_LOCKSTEP_STEP_S = 4e-6
_LOCKSTEP_RECORD_S = 5e-8
_CANDIDATE_BYTE_S = 3e-9
_WALK_RECORD_S = 5.5e-7

_MASKS = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF, 0xFFFFFFFF], dtype=np.uint32)


def _two_byte_tables():
    """Index = two bytes read little-endian at a varint: its value, size (0 = longer than 2
    bytes), and the record advance size + length (0 = not a plausible record length)."""
    w = np.arange(65536, dtype=np.int64)
    b0, b1 = w & 0xFF, w >> 8
    one = b0 < 0x80
    two = ~one & (b1 < 0x80)
    raw = np.where(one, b0, (b0 & 0x7F) | (b1 << 7))
    value = (raw >> 1) ^ -(raw & 1)
    size = np.where(one, 1, np.where(two, 2, 0)).astype(np.int64)
    advance = np.where((size > 0) & (value >= _MIN_RECORD_BODY), size + value, 0).astype(np.int64)
    return np.where(size > 0, value, 0), size, advance


_VALUE2, _SIZE2, _ADVANCE2 = _two_byte_tables()

assert sys.byteorder == "little", "binary views and two-byte tables assume a little-endian host"


class SnapshotCorruptError(Exception):
    """Raised when a snapshot's segment is torn or corrupt within its manifest size."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt or torn segment at byte {position}: {reason}")
        self.path = str(path)
        self.position = position
        self.reason = reason

    def __reduce__(self):  # picklable across Spark's worker boundary
        return (type(self), (self.path, self.position, self.reason))


@dataclass(frozen=True, slots=True)
class _Batch:
    position: int  # in the file
    base_offset: int
    attributes: int
    base_timestamp: int
    max_timestamp: int
    count: int
    start: int  # the records block (as stored) is window[start:end]
    end: int


class _TooLarge(Exception):
    """A group's decompressed records exceed what int32 Arrow offsets can address."""


class _RecordError(Exception):
    """A record-level problem inside a group: which record (or batch) and why."""

    def __init__(self, reason: str, record: int | None = None, batch: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.record = record
        self.batch = batch


# ---------------------------------------------------------------------------------------------
# public API


def decode_segment(
    path,
    size_bytes: int,
    *,
    topic: str,
    partition: int,
    start_offset: int | None = None,
    end_offset: int | None = None,
    start_ts: int | None = None,
    end_ts: int | None = None,
    max_rows_per_batch: int = DEFAULT_MAX_ROWS,
) -> Iterator[pa.RecordBatch]:
    """Yield the segment's rows in offset order as ARROW_SCHEMA batches (never an empty one).

    Bounds: start_offset/start_ts inclusive, end_offset/end_ts exclusive, timestamps in ms.
    Raises SnapshotCorruptError (see the module docstring) and OSError for unreadable files.
    """
    topic_bytes = topic.encode("utf-8")
    bounds = (start_offset, end_offset, start_ts, end_ts)
    for records in _iter_records(path, size_bytes, bounds, max_rows_per_batch):
        yield _to_record_batch(records, topic_bytes, partition)


def decode_segment_keys(
    path,
    size_bytes: int,
    *,
    start_offset: int | None = None,
    end_offset: int | None = None,
    start_ts: int | None = None,
    end_ts: int | None = None,
    max_rows_per_batch: int = DEFAULT_MAX_ROWS,
) -> Iterator[tuple[pa.Array, np.ndarray, np.ndarray]]:
    """Yield (keys: binary array, offsets: int64, tombstone: bool) for the rows decode_segment
    would return, without building values or headers (the compacted view's first pass)."""
    bounds = (start_offset, end_offset, start_ts, end_ts)
    for records in _iter_records(path, size_bytes, bounds, max_rows_per_batch):
        keys = _binary(records.u8, records.buffer, records.key_pos, records.key_len)
        yield keys, records.offsets, records.value_len < 0


def decode_segment_rows(path, size_bytes: int, **bounds) -> list[tuple]:
    """(offset, timestamp_ms, key, value, headers) tuples, for tests and small reads;
    headers is a tuple of (str, bytes | None), as in engine.records.Record."""
    rows = []
    for batch in decode_segment(path, size_bytes, topic="", partition=0, **bounds):
        cols = batch.to_pydict()
        ts = batch.column("timestamp").cast(pa.int64()).to_pylist()
        for offset, t, key, value, headers in zip(cols["offset"], ts, cols["key"], cols["value"], cols["headers"]):
            rows.append((offset, t // 1000, key, value, tuple((h["key"], h["value"]) for h in headers)))
    return rows


# ---------------------------------------------------------------------------------------------
# batch walk


def _iter_records(path, size_bytes, bounds, max_rows) -> Iterator[_Records]:
    path = str(path)
    for window, group in _iter_groups(path, size_bytes, bounds, max_rows):
        yield from _decode_groups(window, group, path, bounds)


def _decode_groups(window, group: list[_Batch], path: str, bounds) -> Iterator[_Records]:
    try:
        records = _decode_group(window, group, path, bounds)
    except _TooLarge:
        if len(group) == 1:
            reason = "records block over 2 GiB decompressed"
            raise SnapshotCorruptError(path, group[0].position, reason) from None
        half = len(group) // 2  # absurd compression ratios: decode the halves apart
        yield from _decode_groups(window, group[:half], path, bounds)
        yield from _decode_groups(window, group[half:], path, bounds)
        return
    if records is not None:
        yield records


def _iter_groups(path: str, size_bytes: int, bounds, max_rows) -> Iterator[tuple[bytearray, list[_Batch]]]:
    """Read windows, check every batch header, yield (window, batches that may hold rows)."""
    start_offset, end_offset, start_ts, end_ts = bounds
    max_rows = max(1, int(max_rows))
    previous_next_offset = None
    unpack = BATCH_HEADER.unpack_from
    pos = 0  # file position of the window
    window_size = _WINDOW_BYTES
    with open_input(path) as f:
        while pos < size_bytes:
            want = min(window_size, size_bytes - pos)
            window = bytearray(want + _PAD)
            f.seek(pos)
            got = f.readinto(memoryview(window)[:want])
            if got < want:
                reason = f"the file ends at byte {pos + got}, the snapshot says {size_bytes}"
                raise SnapshotCorruptError(path, pos + got, reason)
            at_end = pos + want == size_bytes
            view = memoryview(window)
            group: list[_Batch] = []
            rows = 0
            group_start = 0
            p = 0
            need = 0
            stop = False
            while p < want:
                where = pos + p
                if want - p < HEADER_SIZE:
                    if at_end:
                        reason = f"{want - p} bytes left, a batch header needs {HEADER_SIZE}"
                        raise SnapshotCorruptError(path, where, reason)
                    need = HEADER_SIZE
                    break
                (base_offset, batch_length, _epoch, magic, crc, attributes, last_delta,
                 base_ts, max_ts, _pid, _pepoch, _seq, count) = unpack(window, p)
                if batch_length < MIN_BATCH_LENGTH:
                    raise SnapshotCorruptError(path, where, f"batchLength {batch_length} < {MIN_BATCH_LENGTH}")
                size = batch_length + LOG_OVERHEAD
                if where + size > size_bytes:
                    raise SnapshotCorruptError(
                        path, where, f"batch of {size} bytes runs past the snapshot's size_bytes {size_bytes}"
                    )
                if p + size > want:
                    need = size
                    break
                if magic != MAGIC_V2:
                    reason = f"magic {magic}, only v2 (magic 2) batches are supported"
                    raise SnapshotCorruptError(path, where, reason)
                if last_delta < 0 or count < 0:
                    raise SnapshotCorruptError(
                        path, where, f"lastOffsetDelta {last_delta} / recordsCount {count} must not be negative"
                    )
                actual = crc32c(view[p + CRC_START : p + size])
                if actual != crc:
                    reason = f"CRC mismatch: header says {crc:#010x}, bytes give {actual:#010x}"
                    raise SnapshotCorruptError(path, where, reason)
                if previous_next_offset is not None and base_offset < previous_next_offset:
                    reason = (f"baseOffset {base_offset} is below the previous batch's next offset "
                              f"{previous_next_offset}")
                    raise SnapshotCorruptError(path, where, reason)
                previous_next_offset = base_offset + last_delta + 1
                if end_offset is not None and base_offset >= end_offset:
                    stop = True
                    break
                start = p
                p += size
                if count == 0 or attributes & CONTROL_BIT:
                    continue
                if start_offset is not None and base_offset + last_delta < start_offset:
                    continue
                if attributes & TIMESTAMP_TYPE_BIT and (
                    (start_ts is not None and max_ts < start_ts) or (end_ts is not None and max_ts >= end_ts)
                ):
                    continue
                if not group:
                    group_start = start
                batch = _Batch(where, base_offset, attributes, base_ts, max_ts, count, start + HEADER_SIZE, p)
                group.append(batch)
                rows += count
                if rows >= max_rows or p - group_start >= _GROUP_BYTES:
                    yield window, group
                    group, rows = [], 0
            view.release()
            if group:
                yield window, group
            if stop:
                return
            if p == 0:
                window_size = max(window_size, need)  # one batch larger than the window
                continue
            pos += p


# ---------------------------------------------------------------------------------------------
# one group: records blocks -> record positions -> fields


@dataclass
class _Records:
    """The selected rows of one group, as positions into `u8` (the buffer, zero-padded)."""

    u8: np.ndarray
    buffer: pa.Buffer
    offsets: np.ndarray  # int64
    timestamps_ms: np.ndarray  # int64
    key_pos: np.ndarray
    key_len: np.ndarray  # -1 = null
    value_pos: np.ndarray
    value_len: np.ndarray
    header_pos: np.ndarray  # first byte after headerCount
    header_count: np.ndarray
    record_end: np.ndarray
    batch_index: np.ndarray  # into the group, for error positions
    path: str
    batch_positions: np.ndarray  # file position of each batch of the group

    def error(self, exc: _RecordError) -> SnapshotCorruptError:
        b = exc.batch if exc.batch is not None else int(self.batch_index[exc.record])
        return SnapshotCorruptError(self.path, int(self.batch_positions[b]), exc.reason)


def _decode_group(window: bytearray, group: list[_Batch], path: str, bounds) -> _Records | None:
    nb = len(group)
    counts = np.fromiter((b.count for b in group), dtype=np.int64, count=nb)
    positions = np.fromiter((b.position for b in group), dtype=np.int64, count=nb)
    if all(b.attributes & COMPRESSION_MASK == compression.NONE for b in group):
        data = window  # decode in place: blocks separated by batch headers
        block_starts = np.fromiter((b.start for b in group), dtype=np.int64, count=nb)
        block_ends = np.fromiter((b.end for b in group), dtype=np.int64, count=nb)
    else:
        blocks = []
        total = 0
        for batch in group:
            raw = memoryview(window)[batch.start : batch.end]
            codec = batch.attributes & COMPRESSION_MASK
            if codec == compression.NONE:
                blocks.append(raw)
            else:
                try:
                    blocks.append(compression.decompress(codec, raw))
                except CorruptBatchError as exc:
                    raise SnapshotCorruptError(path, batch.position, exc.reason) from None
            total += len(blocks[-1])
            if total > _BUFFER_LIMIT:
                raise _TooLarge
        sizes = np.fromiter((len(b) for b in blocks), dtype=np.int64, count=nb)
        blocks.append(bytes(_PAD))
        data = b"".join(blocks)
        block_ends = np.cumsum(sizes)
        block_starts = block_ends - sizes
    # every record takes at least 1 + _MIN_RECORD_BODY bytes: a count beyond that is a lie, and
    # the arrays below are sized by counts, so it must not reach them
    too_many = counts * (1 + _MIN_RECORD_BODY) > block_ends - block_starts
    if too_many.any():
        b = _first_bad(too_many)
        size = int(block_ends[b] - block_starts[b])
        reason = f"recordsCount {int(counts[b])} does not fit a {size}-byte records block"
        raise SnapshotCorruptError(path, int(positions[b]), reason)
    u8 = np.frombuffer(data, dtype=np.uint8)
    try:
        _, bodies, ends = _record_positions(u8, data, block_starts, block_ends, counts)
        batch_index = np.repeat(np.arange(nb), counts)
        return _decode_fields(u8, data, group, batch_index, bodies, ends, bounds, path, positions)
    except _RecordError as exc:
        b = exc.batch if exc.batch is not None else int(np.repeat(np.arange(nb), counts)[exc.record])
        raise SnapshotCorruptError(path, int(positions[b]), exc.reason) from None


def _record_positions(u8, data, block_starts, block_ends, counts):
    """(starts, bodies, ends) of every record: its length varint, its attributes byte, its end."""
    records = int(counts.sum())
    nbytes = int((block_ends - block_starts).sum())
    lockstep = int(counts.max()) * _LOCKSTEP_STEP_S + records * _LOCKSTEP_RECORD_S
    candidates = nbytes * _CANDIDATE_BYTE_S
    walk = records * _WALK_RECORD_S
    found = None
    if lockstep <= min(candidates, walk):
        found = _starts_lockstep(u8, block_starts, block_ends, counts)
    if found is None and candidates <= walk:
        found = _starts_candidates(u8, block_starts, block_ends, counts)
    if found is None:
        found = _starts_walk(data, block_starts, block_ends, counts)
    return found


def _two_byte_words(u8: np.ndarray) -> np.ndarray:
    return np.ndarray((len(u8) - 1,), dtype="<u2", buffer=u8, strides=(1,))


def _starts_lockstep(u8, block_starts, block_ends, counts):
    """Method a (module docstring); None when some length needs 3+ bytes or framing is off."""
    words = _two_byte_words(u8)
    nb = len(counts)
    order = np.argsort(-counts, kind="stable")  # lanes: batches by count, descending
    by_count = counts[order]
    steps = int(by_count[0])
    # lanes still running after step k: count > k + 1
    running = np.searchsorted(-by_count, -np.arange(1, steps + 1), side="left").tolist()
    starts = np.empty(int(counts.sum()), dtype=np.int64)
    slot = (np.cumsum(counts) - counts)[order]  # where each lane's next start goes
    final = np.empty(nb, dtype=np.int64)
    advance = _ADVANCE2
    pos = block_starts[order]
    active = nb
    try:
        for k in range(steps):
            starts[slot] = pos
            pos = pos + advance[words[pos].astype(np.intp)]
            slot += 1
            if running[k] != active:
                final[order[running[k] : active]] = pos[running[k] :]
                active = running[k]
                pos, slot = pos[:active], slot[:active]
    except IndexError:  # a lane ran off the buffer: corrupt, or not what this method handles
        return None
    if not np.array_equal(final, block_ends):
        return None
    w = words[starts].astype(np.intp)
    adv = advance[w]
    if not adv.all():
        return None
    return starts, starts + _SIZE2[w], starts + adv


def _starts_candidates(u8, block_starts, block_ends, counts):
    """Method b (module docstring); None when the survivors are not a verified chain."""
    lo, hi = int(block_starts[0]), int(block_ends[-1])
    body = u8[lo:hi]  # positions below are relative to lo
    z = body == 0
    z[0] = False
    q = np.flatnonzero(z)  # possible attributes bytes, each preceded by a length varint
    last = body[q - 1]
    keep = last < 0x80
    q = q[keep]
    v = last[keep].astype(np.int64)
    found_s, found_b, found_e = [], [], []
    size = 1
    span = hi - lo
    while True:
        length = (v >> 1) ^ -(v & 1)
        e = q + length
        ok = (length >= _MIN_RECORD_BODY) & (e <= span)
        if ok.any():
            found_s.append(q[ok] - size)
            found_b.append(q[ok])
            found_e.append(e[ok])
        if size == 5:
            break
        before = q - (size + 1)
        inside = before >= 0
        if not inside.all():
            q, v, before = q[inside], v[inside], before[inside]
        b = body[before]
        more = b >= 0x80
        if not more.any():
            break
        q = q[more]
        v = (v[more] << 7) | (b[more] & 0x7F)
        size += 1
    if not found_s:
        return None
    if len(found_s) == 1:
        starts, bodies, ends = found_s[0], found_b[0], found_e[0]
    else:
        starts, bodies, ends = np.concatenate(found_s), np.concatenate(found_b), np.concatenate(found_e)
        order = np.argsort(starts, kind="stable")
        starts, bodies, ends = starts[order], bodies[order], ends[order]
    block_first = block_starts - lo
    first = np.searchsorted(starts, block_first)
    m = starts.size
    if first[-1] >= m or not np.array_equal(starts[first], block_first):
        return None
    # successor of each candidate, as an index; m = none (a dead end or past the group)
    successor = np.searchsorted(starts, ends)
    hit = successor < m
    hit[hit] = starts[successor[hit]] == ends[hit]
    jump = np.append(np.where(hit, successor, m), m)
    # record k of batch b is successor^k(first[b]): compose jumps of 1, 2, 4, ... candidates
    k = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    at = np.repeat(first, counts)
    bit = 1
    top = int(counts.max()) - 1
    while bit <= top:
        sel = np.flatnonzero(k & bit)
        at[sel] = jump[at[sel]]
        bit <<= 1
        if bit <= top:
            jump = jump[jump]
    if (at == m).any():
        return None
    starts, bodies, ends = starts[at] + lo, bodies[at] + lo, ends[at] + lo
    if not _is_chain(starts, ends, block_starts, block_ends, counts):
        return None
    return starts, bodies, ends


def _is_chain(starts, ends, block_starts, block_ends, counts) -> bool:
    """Records tile each batch's block exactly, recordsCount of them per batch."""
    if starts.size != int(counts.sum()):
        return False
    first = np.cumsum(counts) - counts
    if not np.array_equal(starts[first], block_starts):
        return False
    expected = np.empty_like(ends)
    expected[:-1] = starts[1:]
    expected[first + counts - 1] = block_ends
    return np.array_equal(ends, expected)


def _starts_walk(data, block_starts, block_ends, counts):
    """Method c: the per-record Python walk; raises _RecordError on bad framing."""
    starts: list[int] = []
    bodies: list[int] = []
    ends: list[int] = []
    for b, (pos, end, count) in enumerate(zip(block_starts.tolist(), block_ends.tolist(), counts.tolist())):
        for _ in range(count):
            start = pos
            shift = 0
            value = 0
            while True:
                if pos >= end:
                    raise _RecordError("record length runs past the end of the batch", batch=b)
                byte = data[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
                if shift > 63:
                    raise _RecordError("varint longer than 10 bytes", batch=b)
            length = (value >> 1) ^ -(value & 1)
            if length < _MIN_RECORD_BODY or pos + length > end:
                raise _RecordError(f"record length {length} does not fit the batch", batch=b)
            starts.append(start)
            bodies.append(pos)
            pos += length
            ends.append(pos)
        if pos != end:
            raise _RecordError(f"{end - pos} bytes left after {count} records", batch=b)
    as_array = lambda x: np.array(x, dtype=np.int64)
    return as_array(starts), as_array(bodies), as_array(ends)


def _varints(u8: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints at each of `pos` (each <= len(u8) - 16): (values, next positions)."""
    w = u8[pos + 1].astype(np.intp) << 8  # the two bytes at pos, little-endian
    w += u8[pos]
    value = _VALUE2[w]
    size = _SIZE2[w]
    longer = np.flatnonzero(size == 0)
    if longer.size:  # 3+ bytes: continue byte by byte for those only
        p = pos[longer]
        raw = (u8[p] & 0x7F).astype(np.uint64) | ((u8[p + 1] & 0x7F).astype(np.uint64) << np.uint64(7))
        end = p + 2
        more = np.arange(longer.size)
        shift = 14
        while more.size:
            if shift > 63:
                raise _RecordError("varint longer than 10 bytes", record=int(longer[more[0]]))
            bb = u8[end[more]]
            raw[more] |= (bb & 0x7F).astype(np.uint64) << np.uint64(shift)
            end[more] += 1
            more = more[bb >= 0x80]
            shift += 7
        one = np.uint64(1)
        value[longer] = (raw >> one).view(np.int64) ^ -((raw & one).view(np.int64))
        size[longer] = end - p
    return value, pos + size


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _decode_fields(u8, data, group, batch_index, bodies, ends, bounds, path, positions) -> _Records | None:
    ts_delta, pos = _varints(u8, bodies + 1)  # after the attributes byte
    offset_delta, pos = _varints(u8, pos)
    bad = pos > ends
    if bad.any():
        raise _RecordError("record fields run past its length", record=_first_bad(bad))
    key_len, key_pos = _varints(u8, pos)
    pos = key_pos + np.maximum(key_len, 0)
    bad = (key_len < -1) | (pos > ends)
    if bad.any():
        raise _RecordError("key length does not fit the record", record=_first_bad(bad))
    value_len, value_pos = _varints(u8, pos)
    pos = value_pos + np.maximum(value_len, 0)
    bad = (value_len < -1) | (pos > ends)
    if bad.any():
        raise _RecordError("value length does not fit the record", record=_first_bad(bad))
    header_count, pos = _varints(u8, pos)
    bad = (header_count < 0) | (pos > ends) | ((header_count == 0) & (pos != ends))
    bad |= header_count * 2 > ends - pos  # a header takes at least 2 bytes
    if bad.any():
        i = _first_bad(bad)
        reason = "negative header count" if header_count[i] < 0 else "record length disagrees with its fields"
        raise _RecordError(reason, record=i)

    nb = len(group)
    base_offsets = np.fromiter((b.base_offset for b in group), dtype=np.int64, count=nb)
    base_ts = np.fromiter((b.base_timestamp for b in group), dtype=np.int64, count=nb)
    offsets = base_offsets[batch_index] + offset_delta
    timestamps = base_ts[batch_index] + ts_delta
    append_time = np.fromiter((bool(b.attributes & TIMESTAMP_TYPE_BIT) for b in group), dtype=bool, count=nb)
    if append_time.any():
        max_ts = np.fromiter((b.max_timestamp for b in group), dtype=np.int64, count=nb)
        timestamps = np.where(append_time[batch_index], max_ts[batch_index], timestamps)

    start_offset, end_offset, start_ts, end_ts = bounds
    keep = None
    for bound, column, below in (
        (start_offset, offsets, False),
        (end_offset, offsets, True),
        (start_ts, timestamps, False),
        (end_ts, timestamps, True),
    ):
        if bound is not None:
            m = column < bound if below else column >= bound
            keep = m if keep is None else keep & m
    columns = [offsets, timestamps, key_pos, key_len, value_pos, value_len, pos, header_count, ends, batch_index]
    if keep is not None and not keep.all():
        if not keep.any():
            return None
        columns = [c[keep] for c in columns]
    return _Records(u8, pa.py_buffer(data), *columns, path, positions)


# ---------------------------------------------------------------------------------------------
# Arrow assembly


def _binary(u8: np.ndarray, buffer: pa.Buffer, pos: np.ndarray, length: np.ndarray) -> pa.Array:
    """A binary array of u8[pos:pos+length] (length -1 = null), via binary_view + cast."""
    n = len(pos)
    valid = length >= 0
    all_valid = bool(valid.all())
    size = length if all_valid else np.where(valid, length, 0)
    at = pos if all_valid else np.where(valid, pos, 0)
    words = np.ndarray((len(u8) - 3,), dtype="<u4", buffer=u8, strides=(1,))
    views = np.zeros((n, 4), dtype=np.uint32)
    views[:, 0] = size
    prefix = words[at]
    if int(size.min(initial=4)) < 4:
        prefix &= _MASKS[np.minimum(size, 4)]
    views[:, 1] = prefix
    short = size <= 12
    if not short.any():
        views[:, 3] = at  # buffer index 0, offset
    else:
        s = np.flatnonzero(short)
        ss, sa = size[s], at[s]
        views[s, 2] = words[sa + 4] & _MASKS[np.clip(ss - 4, 0, 4)]
        views[s, 3] = words[sa + 8] & _MASKS[np.clip(ss - 8, 0, 4)]
        if s.size != n:
            lg = np.flatnonzero(~short)
            views[lg, 3] = at[lg]
    validity = None if all_valid else pa.py_buffer(np.packbits(valid, bitorder="little"))
    array = pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(views), buffer])
    return array.cast(pa.binary())


def _headers(records: _Records) -> pa.Array:
    counts = records.header_count
    n = len(counts)
    list_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    total = int(list_offsets[-1])
    if total == 0:
        keys = pa.array([], pa.string())
        values = pa.array([], pa.binary())
    else:
        u8 = records.u8
        key_pos = np.empty(total, dtype=np.int64)
        key_len = np.empty(total, dtype=np.int64)
        value_pos = np.empty(total, dtype=np.int64)
        value_len = np.empty(total, dtype=np.int64)
        rows = np.flatnonzero(counts)
        at = records.header_pos[rows]
        index = 0
        while rows.size:  # round `index`: the index-th header of every record that has one
            ends = records.record_end[rows]
            bad = at >= ends
            if bad.any():
                raise _RecordError("header runs past the record", record=int(rows[_first_bad(bad)]))
            klen, kpos = _varints(u8, at)
            at = kpos + np.maximum(klen, 0)
            bad = (klen < 0) | (at >= ends)
            if bad.any():
                i = _first_bad(bad)
                reason = "null header key" if klen[i] < 0 else "header key does not fit the record"
                raise _RecordError(reason, record=int(rows[i]))
            vlen, vpos = _varints(u8, at)
            at = vpos + np.maximum(vlen, 0)
            bad = (vlen < -1) | (at > ends)
            if bad.any():
                raise _RecordError("header value does not fit the record", record=int(rows[_first_bad(bad)]))
            slot = list_offsets[rows] + index
            key_pos[slot], key_len[slot], value_pos[slot], value_len[slot] = kpos, klen, vpos, vlen
            index += 1
            more = counts[rows] > index
            bad = ~more & (at != ends)
            if bad.any():
                raise _RecordError("record length disagrees with its fields", record=int(rows[_first_bad(bad)]))
            rows, at = rows[more], at[more]
        raw_keys = _binary(u8, records.buffer, key_pos, key_len)
        try:
            keys = raw_keys.cast(pa.string())
        except pa.ArrowInvalid:
            keys = pa.array([k.decode("utf-8", "replace") for k in raw_keys.to_pylist()], pa.string())
        values = _binary(u8, records.buffer, value_pos, value_len)
    elements = pa.StructArray.from_arrays([keys, values], fields=list(HEADER_STRUCT))
    return pa.ListArray.from_arrays(pa.array(list_offsets, pa.int32()), elements, type=HEADERS_TYPE)


def _constant_string(value: bytes, n: int) -> pa.Array:
    offsets = np.arange(n + 1, dtype=np.int32) * len(value)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(value * n)])


def _to_record_batch(records: _Records, topic: bytes, partition: int) -> pa.RecordBatch:
    n = len(records.offsets)
    try:
        headers = _headers(records)
    except _RecordError as exc:
        raise records.error(exc) from None
    timestamps_us = pa.py_buffer(records.timestamps_ms * 1000)
    columns = [
        _constant_string(topic, n),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.full(n, partition, dtype=np.int32))]),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(records.offsets)]),
        pa.Array.from_buffers(ARROW_SCHEMA.field("timestamp").type, n, [None, timestamps_us]),
        _binary(records.u8, records.buffer, records.key_pos, records.key_len),
        _binary(records.u8, records.buffer, records.value_pos, records.value_len),
        headers,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
