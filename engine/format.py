"""Kafka v2 RecordBatch framing: the 61-byte header, CRC-32C, and in-place rewrites.

Layout (big-endian), offsets in bytes from the batch start:

    0  baseOffset            int64   first offset of the batch      (not covered by the CRC)
    8  batchLength           int32   bytes after this field; batch size = batchLength + 12
   12  partitionLeaderEpoch  int32                                    (not covered by the CRC)
   16  magic                 int8    always 2
   17  crc                   uint32  CRC-32C (Castagnoli) of bytes [21, end)
   21  attributes            int16   bits 0-2 codec, 3 LogAppendTime, 4 transactional,
                                     5 control, 6 hasDeleteHorizonMs
   23  lastOffsetDelta       int32   last offset = baseOffset + lastOffsetDelta
   27  baseTimestamp         int64
   35  maxTimestamp          int64
   43  producerId            int64   -1 if none
   51  producerEpoch         int16   -1 if none
   53  baseSequence          int32   -1 if none
   57  recordsCount          int32
   61  records               (compressed as one block when the codec is not 0)

Invariants the engine relies on: a batch in a .log file passed validate_batch() when it was
appended; offsets are assigned by rewriting baseOffset (and partitionLeaderEpoch) only, which
the CRC does not cover, so no re-encoding happens on append. Setting LogAppendTime changes the
attributes and maxTimestamp, which the CRC covers, so that rewrite recomputes the CRC.

Two levels of checks. validate_batch() is what every reader of stored bytes applies (recovery,
the scanner, reads): framing, magic, CRC. Stored batches may legally have lastOffsetDelta past
their last record and gaps between their records' offsets (compaction keeps a batch's original
lastOffsetDelta, as Kafka's cleaner does), so nothing more is asked of them. check_produced()
adds what Kafka's LogValidator asks of a client's batch: at least one record, lastOffsetDelta =
recordsCount - 1, a sequence with a producer id, and (eventlog has no transaction coordinator)
no transactional bit. records.check_records_framing() then checks the records themselves.

The layouts live here and nowhere else (tests/test_layout.py checks): BATCH_HEADER and the
*_AT field offsets above, and Kafka's index entries, OFFSET_INDEX_ENTRY (.index: relative offset,
position) and TIME_INDEX_ENTRY (.timeindex: timestamp, relative offset), with their numpy dtypes.

Everything here is pure and thread-safe; it never touches files.
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

import numpy as np
from crc32c import crc32c

from .errors import CorruptBatchError, TransactionsUnsupportedError

MAGIC_V2 = 2
HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted by batchLength
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49: a batch with no records

# where each header field starts, in bytes from the batch start (the table above)
BASE_OFFSET_AT = 0
BATCH_LENGTH_AT = 8
LEADER_EPOCH_AT = 12
MAGIC_AT = 16
CRC_AT = 17
ATTRIBUTES_AT = 21
LAST_OFFSET_DELTA_AT = 23
BASE_TIMESTAMP_AT = 27
MAX_TIMESTAMP_AT = 35
PRODUCER_ID_AT = 43
PRODUCER_EPOCH_AT = 51
BASE_SEQUENCE_AT = 53
RECORDS_COUNT_AT = 57
CRC_START = ATTRIBUTES_AT  # the CRC covers [CRC_START, end of batch)

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1

# attribute bits
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40

CREATE_TIME = 0
LOG_APPEND_TIME = 1

# The one home of the wire layouts: every other module (engine, analytics) imports these.
# tests/test_layout.py fails if one of their format strings is spelled anywhere else.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")  # the 13 header fields, in BatchHeader's order
BATCH_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength: the LOG_OVERHEAD bytes
_BEFORE_CRC = struct.Struct(">qiib")  # baseOffset, batchLength, partitionLeaderEpoch, magic
_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. recordsCount: the start of the CRC's range
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")

assert BATCH_HEADER.size == HEADER_SIZE
assert BATCH_PREFIX.size == LOG_OVERHEAD
assert _BEFORE_CRC.format + "I" + _AFTER_CRC.format[1:] == BATCH_HEADER.format
assert _BEFORE_CRC.size == CRC_AT and CRC_AT + _U32.size == CRC_START

# Index entries (.index, .timeindex), Kafka's layouts, not checksummed. Offsets are relative to
# the segment's base offset. The numpy dtypes are the same bytes, for mapped and bulk reads.
OFFSET_INDEX_ENTRY = struct.Struct(">ii")  # relative offset of a batch's last offset, the batch's position
TIME_INDEX_ENTRY = struct.Struct(">qi")  # timestamp, relative offset
OFFSET_INDEX_DTYPE = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
TIME_INDEX_DTYPE = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])

assert OFFSET_INDEX_DTYPE.itemsize == OFFSET_INDEX_ENTRY.size == 8
assert TIME_INDEX_DTYPE.itemsize == TIME_INDEX_ENTRY.size == 12


class BatchHeader(NamedTuple):
    """The decoded 61-byte header of one batch, plus where it sits in its buffer or file.

    A NamedTuple: readers build one per batch they pass, and a tuple is several times cheaper
    to create than a frozen dataclass.
    """

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int = 0

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_BIT else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_BIT)


_make_header = BatchHeader._make


def parse_header(
    buf: bytes | bytearray | memoryview, position: int = 0, file_position: int | None = None
) -> BatchHeader:
    """Decode the header at `position`; the caller guarantees 61 bytes are there.

    The header records `file_position` (default `position`) as where the batch starts.
    """
    return _make_header((*BATCH_HEADER.unpack_from(buf, position), position if file_position is None else file_position))


def read_prefix(buf: bytes | bytearray | memoryview, position: int) -> tuple[int, int]:
    """(baseOffset, batchLength) at `position`; needs 12 bytes."""
    return BATCH_PREFIX.unpack_from(buf, position)


def last_offset_delta(buf: bytes | bytearray | memoryview, position: int) -> int:
    return _I32.unpack_from(buf, position + LAST_OFFSET_DELTA_AT)[0]


def max_timestamp(buf: bytes | bytearray | memoryview, position: int) -> int:
    return _I64.unpack_from(buf, position + MAX_TIMESTAMP_AT)[0]


def compute_crc(buf: bytes | bytearray | memoryview, position: int, size: int) -> int:
    view = memoryview(buf)[position + CRC_START : position + size]
    try:
        return crc32c(view)
    finally:
        view.release()


def validate_batch(
    buf: bytes | bytearray | memoryview,
    position: int = 0,
    *,
    limit: int | None = None,
    check_crc: bool = True,
    file_position: int | None = None,
) -> BatchHeader:
    """Check framing, magic and CRC of the batch at `position`; return its header.

    `limit` is the end of valid data (default len(buf)). Raises CorruptBatchError when fewer
    than 61 bytes remain, the length is below 49 or runs past `limit`, the magic is not 2, the
    lastOffsetDelta or record count is negative, or the CRC does not match.
    """
    end = len(buf) if limit is None else limit
    remaining = end - position
    where = position if file_position is None else file_position
    if remaining < HEADER_SIZE:
        raise CorruptBatchError(f"{remaining} bytes left, a batch header needs {HEADER_SIZE}", where)
    header = parse_header(buf, position, where)
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptBatchError(f"batchLength {header.batch_length} < {MIN_BATCH_LENGTH}", where)
    if header.size > remaining:
        raise CorruptBatchError(
            f"batch of {header.size} bytes runs past the end ({remaining} bytes left)", where
        )
    if header.magic != MAGIC_V2:
        raise CorruptBatchError(f"magic {header.magic}, only v2 (magic 2) batches are supported", where)
    if header.last_offset_delta < 0 or header.records_count < 0:
        raise CorruptBatchError(
            f"lastOffsetDelta {header.last_offset_delta} / recordsCount {header.records_count} "
            "must not be negative",
            where,
        )
    if check_crc:
        actual = compute_crc(buf, position, header.size)
        if actual != header.crc:
            raise CorruptBatchError(
                f"CRC mismatch: header says {header.crc:#010x}, bytes give {actual:#010x}", where
            )
    return header


def check_produced(header: BatchHeader) -> None:
    """Kafka's LogValidator checks on a v2 batch from a client, after validate_batch(): the
    record count is positive and lastOffsetDelta is recordsCount - 1 (so one batch cannot claim
    more offsets than it has records), a producer id comes with a sequence, and the batch is
    not transactional. Raises CorruptBatchError, or TransactionsUnsupportedError.

    Never applied to stored batches: see the module docstring.
    """
    count = header.records_count
    if count <= 0:
        raise CorruptBatchError(f"Invalid reported count for record batch: {count}", header.position)
    if header.last_offset_delta != count - 1:
        raise CorruptBatchError(
            f"Inconsistent batch offset range [{header.base_offset}, {header.last_offset}] and count of "
            f"records {count}",
            header.position,
        )
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise CorruptBatchError(
            f"Invalid sequence number {header.base_sequence} in record batch with producerId {header.producer_id}",
            header.position,
        )
    if header.attributes & TRANSACTIONAL_BIT:
        raise TransactionsUnsupportedError(header.producer_id, header.position)


def iter_batches(
    buf: bytes | bytearray | memoryview, *, check_crc: bool = True
) -> Iterator[BatchHeader]:
    """Validate and yield every batch in `buf`, which must hold whole batches only."""
    position = 0
    end = len(buf)
    if end == 0:
        raise CorruptBatchError("empty body: at least one record batch is required")
    while position < end:
        header = validate_batch(buf, position, limit=end, check_crc=check_crc)
        yield header
        position += header.size


def scan_valid_prefix(buf: bytes | bytearray | memoryview, *, check_crc: bool = True) -> tuple[list[BatchHeader], int, str | None]:
    """Walk batches until the first invalid one: (headers, valid_bytes, reason or None)."""
    headers: list[BatchHeader] = []
    position = 0
    end = len(buf)
    while position < end:
        try:
            header = validate_batch(buf, position, limit=end, check_crc=check_crc)
        except CorruptBatchError as exc:
            return headers, position, exc.reason
        headers.append(header)
        position += header.size
    return headers, position, None


def pack_header(
    buf: bytearray,
    position: int,
    size: int,
    *,
    base_offset: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    records_count: int,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = 0,
) -> None:
    """Write the header of the `size`-byte batch at `position` of `buf`, whose records block is
    already in place after the 61 header bytes, and its CRC."""
    _BEFORE_CRC.pack_into(buf, position, base_offset, size - LOG_OVERHEAD, partition_leader_epoch, MAGIC_V2)
    _AFTER_CRC.pack_into(
        buf, position + CRC_START, attributes, last_offset_delta, base_timestamp, max_timestamp,
        producer_id, producer_epoch, base_sequence, records_count,
    )
    _U32.pack_into(buf, position + CRC_AT, compute_crc(buf, position, size))


def set_last_offset_delta(buf: bytearray | memoryview, position: int, size: int, delta: int) -> None:
    """Make the batch claim the offsets up to baseOffset + `delta` (what Kafka's cleaner does to
    a segment's last batch), then recompute the CRC."""
    _I32.pack_into(buf, position + LAST_OFFSET_DELTA_AT, delta)
    _U32.pack_into(buf, position + CRC_AT, compute_crc(buf, position, size))


def set_base_offset(buf: bytearray | memoryview, position: int, base_offset: int, leader_epoch: int = 0) -> None:
    """Rewrite baseOffset and partitionLeaderEpoch in place (neither is in the CRC)."""
    _I64.pack_into(buf, position + BASE_OFFSET_AT, base_offset)
    _I32.pack_into(buf, position + LEADER_EPOCH_AT, leader_epoch)


def set_log_append_time(buf: bytearray | memoryview, position: int, size: int, timestamp_ms: int) -> None:
    """Mark the batch LogAppendTime with maxTimestamp = `timestamp_ms`, then recompute the CRC.

    As in Kafka, records keep their deltas; readers report every record's timestamp as the
    batch's maxTimestamp when the LogAppendTime bit is set.
    """
    attributes = _I16.unpack_from(buf, position + ATTRIBUTES_AT)[0]
    _I16.pack_into(buf, position + ATTRIBUTES_AT, attributes | TIMESTAMP_TYPE_BIT)
    _I64.pack_into(buf, position + MAX_TIMESTAMP_AT, timestamp_ms)
    _U32.pack_into(buf, position + CRC_AT, compute_crc(buf, position, size))


def set_producer(buf: bytearray | memoryview, position: int, size: int, producer_id: int, epoch: int, base_sequence: int) -> None:
    """Stamp producerId, producerEpoch and baseSequence (an idempotent write), then recompute
    the CRC."""
    _I64.pack_into(buf, position + PRODUCER_ID_AT, producer_id)
    _I16.pack_into(buf, position + PRODUCER_EPOCH_AT, epoch)
    _I32.pack_into(buf, position + BASE_SEQUENCE_AT, base_sequence)
    _U32.pack_into(buf, position + CRC_AT, compute_crc(buf, position, size))


def describe_attributes(attributes: int) -> str:
    parts = [CODEC_NAMES.get(attributes & COMPRESSION_MASK, f"codec{attributes & COMPRESSION_MASK}")]
    parts.append("LogAppendTime" if attributes & TIMESTAMP_TYPE_BIT else "CreateTime")
    if attributes & TRANSACTIONAL_BIT:
        parts.append("transactional")
    if attributes & CONTROL_BIT:
        parts.append("control")
    if attributes & DELETE_HORIZON_BIT:
        parts.append("deleteHorizon")
    return ",".join(parts)


CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
