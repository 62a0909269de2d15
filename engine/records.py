"""Records inside a Kafka v2 batch: varint encoding, batch building and decoding.

Record grammar (after decompression), varint = zigzag + LEB128 (protobuf sint):

    record      := length:varint body            length = bytes in body
    body        := attributes:int8 timestampDelta:varlong offsetDelta:varint
                   keyLength:varint key valueLength:varint value
                   headerCount:varint header*
    header      := keyLength:varint key(UTF-8) valueLength:varint value
    a length of -1 means null (key, value, header value)

A record's timestamp is baseTimestamp + timestampDelta, except in LogAppendTime batches, where
every record reports the batch's maxTimestamp (as the Java client does). Its offset is
baseOffset + offsetDelta.

Three ways in: decode_records() builds Records (fetches); _walk() walks records without
building them, checking every field as it goes, for check_records_framing() (produce
validation: offset deltas must be 0..n-1, and compressed blocks are walked as they inflate),
split_records() (compaction's fields: stored batches, offset gaps allowed) and
find_record_at_or_after() (time lookups). Encoding: encode_batch(), and frame_batch() /
encode_record_tails() for batches re-formed from stored records.

encode_batch() builds the records with aiokafka's C DefaultRecordBatchBuilder when it is
installed and gives the very bytes the Python encoder gives (records whose first timestamp is
the smallest, no control or LogAppendTime batch: JSON produce's case), ~3 x faster; the Python
encoder is the reference (tests hold the two byte-identical) and the fallback.

Pure functions, safe from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from . import compression
from .errors import CorruptBatchError, InflatedTooLargeError, InflateLimitError
from .format import (
    COMPRESSION_MASK,
    CONTROL_BIT,
    HEADER_SIZE,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    pack_header,
    parse_header,
    set_base_offset,
    validate_batch,
)
from .format import max_timestamp as _max_timestamp_of

Header = tuple[str, "bytes | None"]

try:  # the C builder only: aiokafka's pure-Python fallback is slower than ours
    from aiokafka.record.default_records import DefaultRecordBatchBuilder as _CBuilder

    if not _CBuilder.__module__.startswith("aiokafka.record._crecords"):  # pragma: no cover
        _CBuilder = None
except ImportError:  # pragma: no cover - a dependency; the Python encoder does everything alone
    _CBuilder = None
_NO_SIZE_LIMIT = 2**31 - 1
_NO_HEADERS: list = []  # the builder takes lists only (and never changes them)


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class RecordInput:
    """One record to put in a batch; its offset is decided by position in the batch."""

    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Sequence[Header] = ()


# ---------------------------------------------------------------------------------------------
# varints


def _zigzag64(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def write_varint(out: bytearray, value: int) -> None:
    """Append the zigzag LEB128 encoding of a signed 64-bit `value`."""
    v = (value << 1) ^ (value >> 63)
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def read_varint(buf: bytes | bytearray | memoryview, position: int) -> tuple[int, int]:
    """Decode a zigzag varint at `position`: (value, next position)."""
    shift = 0
    result = 0
    try:
        while True:
            b = buf[position]
            position += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return (result >> 1) ^ -(result & 1), position
            shift += 7
            if shift > 63:
                raise CorruptBatchError("varint longer than 10 bytes")
    except IndexError:
        raise CorruptBatchError("varint runs past the end of the records") from None


def varint_size(value: int) -> int:
    v = _zigzag64(value)
    size = 1
    while v > 0x7F:
        v >>= 7
        size += 1
    return size


# ---------------------------------------------------------------------------------------------
# encoding


def varint_bytes(value: int) -> bytes:
    out = bytearray()
    write_varint(out, value)
    return bytes(out)


# zigzag varints of 0..16383 (1 byte below 64, 2 bytes below 8192, 3 above): record lengths,
# deltas and counts are nearly always in this range, so encoding is mostly a list lookup
_VARINT = [varint_bytes(n) for n in range(16384)]
_NULL = b"\x01"  # zigzag(-1): a null key, value or header value


def encode_records(
    records: Iterable[tuple[bytes | None, bytes | None, int, Sequence[Header]] | RecordInput],
    base_timestamp: int,
) -> tuple[bytearray, int, int]:
    """Encode records with offset deltas 0..n-1: (bytes, count, max timestamp).

    Timestamps must not be below `base_timestamp` (encode_batch passes the smallest).
    """
    out = bytearray()
    count = 0
    max_ts = -1
    V = _VARINT
    small = len(V)
    vb = varint_bytes
    for rec in records:
        if isinstance(rec, RecordInput):
            key, value, ts, headers = rec.key, rec.value, rec.timestamp, rec.headers
        else:
            key, value, ts, headers = rec
        if ts > max_ts:
            max_ts = ts
        delta = ts - base_timestamp
        body = bytearray(b"\x00")  # attributes
        body += V[delta] if delta < small else vb(delta)
        body += V[count] if count < small else vb(count)
        if key is None:
            body += _NULL
        else:
            n = len(key)
            body += V[n] if n < small else vb(n)
            body += key
        if value is None:
            body += _NULL
        else:
            n = len(value)
            body += V[n] if n < small else vb(n)
            body += value
        n = len(headers)
        body += V[n] if n < small else vb(n)
        for hkey, hvalue in headers:
            hk = hkey.encode("utf-8", "surrogateescape")
            body += V[len(hk)] if len(hk) < small else vb(len(hk))
            body += hk
            if hvalue is None:
                body += _NULL
            else:
                n = len(hvalue)
                body += V[n] if n < small else vb(n)
                body += hvalue
        n = len(body)
        out += V[n] if n < small else vb(n)
        out += body
        count += 1
    return out, count, max_ts


def encode_batch(
    base_offset: int,
    records: Sequence[tuple[bytes | None, bytes | None, int, Sequence[Header]] | RecordInput],
    *,
    compression_type: int = compression.NONE,
    log_append_time: int | None = None,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
    partition_leader_epoch: int = 0,
) -> bytearray:
    """Build one v2 batch holding `records` (key, value, timestamp ms, headers).

    Offsets inside are deltas 0..n-1 from `base_offset`. With `log_append_time`, the batch is
    marked LogAppendTime and maxTimestamp is that time. At least one record is required.
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    first = records[0]
    first_timestamp = base_timestamp = first.timestamp if isinstance(first, RecordInput) else first[2]
    for rec in records:
        ts = rec.timestamp if isinstance(rec, RecordInput) else rec[2]
        if ts < base_timestamp:
            base_timestamp = ts
    if (
        _CBuilder is not None and base_timestamp == first_timestamp and log_append_time is None
        and not transactional and not control
    ):
        batch = _encode_native(records, compression_type, producer_id, producer_epoch, base_sequence)
        if batch is not None:
            set_base_offset(batch, 0, base_offset, partition_leader_epoch)  # the builder wrote 0 and -1
            return batch
    body, count, max_ts = encode_records(records, base_timestamp)
    attributes = compression_type
    if log_append_time is not None:
        attributes |= TIMESTAMP_TYPE_BIT
        max_ts = log_append_time
    if transactional:
        attributes |= TRANSACTIONAL_BIT
    if control:
        attributes |= CONTROL_BIT
    return frame_batch(
        body, base_offset=base_offset, attributes=attributes, last_offset_delta=count - 1,
        base_timestamp=base_timestamp, max_timestamp=max_ts, records_count=count, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence, partition_leader_epoch=partition_leader_epoch,
    )


def _encode_native(
    records: Sequence[tuple[bytes | None, bytes | None, int, Sequence[Header]] | RecordInput],
    compression_type: int, producer_id: int, producer_epoch: int, base_sequence: int,
) -> bytearray | None:
    """encode_batch's bytes from the C builder (base offset 0; aiokafka writes partition leader
    epoch -1, which the caller sets; neither is under the CRC), or None where it cannot make
    them: a header key that is not UTF-8 (ours keeps the surrogate-escaped bytes), a type it
    does not take. The first record's timestamp must be the smallest (aiokafka's base)."""
    builder = _CBuilder(2, compression.NONE, 0, producer_id, producer_epoch, base_sequence, _NO_SIZE_LIMIT)
    append = builder.append
    try:
        if isinstance(records[0], RecordInput):
            for i, rec in enumerate(records):
                headers = rec.headers  # type: ignore[union-attr]
                append(i, rec.timestamp, rec.key, rec.value, headers if type(headers) is list else list(headers) if headers else _NO_HEADERS)  # type: ignore[union-attr]
        else:
            for i, (key, value, ts, headers) in enumerate(records):  # type: ignore[misc]
                append(i, ts, key, value, headers if type(headers) is list else list(headers) if headers else _NO_HEADERS)
    except (UnicodeError, TypeError, ValueError, OverflowError):
        return None
    batch = builder.build()
    if compression_type == compression.NONE:
        return batch
    # the same records, compressed by our codecs (their settings decide the bytes)
    count = len(records)
    return frame_batch(
        memoryview(batch)[HEADER_SIZE:], base_offset=0, attributes=compression_type, last_offset_delta=count - 1,
        base_timestamp=records[0].timestamp if isinstance(records[0], RecordInput) else records[0][2],
        max_timestamp=_max_timestamp_of(batch, 0), records_count=count, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence,
    )


def frame_batch(
    records_block: bytes | bytearray,
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
) -> bytearray:
    """One batch around an encoded records block, which is compressed with the codec that
    `attributes` names (bits 0-2)."""
    codec = attributes & COMPRESSION_MASK
    out = bytearray(HEADER_SIZE)
    out += compression.compress(codec, records_block) if codec != compression.NONE else records_block
    pack_header(
        out, 0, len(out), base_offset=base_offset, attributes=attributes, last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp, max_timestamp=max_timestamp, records_count=records_count,
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
        partition_leader_epoch=partition_leader_epoch,
    )
    return out


def encode_record_tails(records: Sequence[tuple[int, int, bytes]], base_offset: int, base_timestamp: int) -> bytes:
    """A records block from (offset, timestamp, tail) triples, where a tail is a record's bytes
    from its key length to its end (RecordFields.tails): each record is re-framed with its new
    length, timestamp delta and offset delta, its key, value and headers kept byte for byte."""
    V = _VARINT
    small = len(V)
    vb = varint_bytes
    parts: list[bytes] = []
    append = parts.append
    for offset, ts, tail in records:
        td = ts - base_timestamp
        od = offset - base_offset
        head = b"\x00" + (V[td] if 0 <= td < small else vb(td)) + (V[od] if 0 <= od < small else vb(od))
        n = len(head) + len(tail)
        append(V[n] if n < small else vb(n))
        append(head)
        append(tail)
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------
# decoding


def batch_records_bytes(
    buf: bytes | bytearray | memoryview, header: BatchHeader, at: int | None = None
) -> bytes | memoryview:
    """The (decompressed) records block of the batch that starts at `at` in `buf`.

    `at` defaults to header.position (right when `buf` is the whole file or the batch list).
    """
    if at is None:
        at = header.position
    start = at + HEADER_SIZE
    end = at + header.size
    raw = memoryview(buf)[start:end]
    if header.compression == compression.NONE:
        return raw
    return compression.decompress(header.compression, raw)


def decode_records(
    buf: bytes | bytearray | memoryview, header: BatchHeader, at: int | None = None
) -> list[Record]:
    """Decode every record of the batch at `at` (default header.position) in `buf`.

    The CRC is not re-checked here; validate_batch() does that.
    """
    data = batch_records_bytes(buf, header, at)
    try:
        return decode_block(data, header)
    finally:
        if isinstance(data, memoryview):
            data.release()


def decode_block(data: bytes | bytearray | memoryview, header: BatchHeader) -> list[Record]:
    """Decode the records of a batch from its records block (batch_records_bytes())."""
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    log_append = header.attributes & TIMESTAMP_TYPE_BIT
    max_ts = header.max_timestamp
    rv = read_varint
    out: list[Record] = []
    pos = 0
    end = len(data)
    for _ in range(header.records_count):
        length, pos = rv(data, pos)
        record_end = pos + length
        if length < 0 or record_end > end:
            raise CorruptBatchError("record length runs past the end of the batch", header.position)
        pos += 1  # attributes
        ts_delta, pos = rv(data, pos)
        offset_delta, pos = rv(data, pos)
        klen, pos = rv(data, pos)
        if klen < 0:
            key = None
        else:
            key = bytes(data[pos : pos + klen])
            pos += klen
        vlen, pos = rv(data, pos)
        if vlen < 0:
            value = None
        else:
            value = bytes(data[pos : pos + vlen])
            pos += vlen
        hcount, pos = rv(data, pos)
        headers: tuple[Header, ...] = ()
        if hcount > 0:
            hl = []
            for _h in range(hcount):
                hklen, pos = rv(data, pos)
                if hklen < 0:
                    raise CorruptBatchError("null header key", header.position)
                hkey = bytes(data[pos : pos + hklen]).decode("utf-8", "surrogateescape")
                pos += hklen
                hvlen, pos = rv(data, pos)
                if hvlen < 0:
                    hvalue = None
                else:
                    hvalue = bytes(data[pos : pos + hvlen])
                    pos += hvlen
                hl.append((hkey, hvalue))
            headers = tuple(hl)
        elif hcount < 0:
            raise CorruptBatchError("negative header count", header.position)
        if pos != record_end:
            raise CorruptBatchError("record length disagrees with its fields", header.position)
        out.append(
            Record(
                base_offset + offset_delta,
                max_ts if log_append else base_ts + ts_delta,
                key,
                value,
                headers,
            )
        )
    if pos != end:
        raise CorruptBatchError(
            f"{end - pos} bytes left after {header.records_count} records", header.position
        )
    return out


def decode_one(data: bytes | bytearray | memoryview, header: BatchHeader, offset_delta: int) -> Record | None:
    """The record with `offset_delta` from a batch's records block, skipping the others by
    their lengths (a per-key read wants one record of a batch); None when the batch has no
    such record (compaction removed it)."""
    rv = read_varint
    pos = 0
    end = len(data)
    for _ in range(header.records_count):
        start = pos
        length, pos = rv(data, pos)
        record_end = pos + length
        if length < 0 or record_end > end:
            raise CorruptBatchError("record length runs past the end of the batch", header.position)
        _ts, after_ts = rv(data, pos + 1)
        delta, _ = rv(data, after_ts)
        if delta == offset_delta:
            (record,) = decode_block(bytes(data[start:record_end]), header._replace(records_count=1))
            return record
        if delta > offset_delta:
            return None
        pos = record_end
    return None


def decode_batch(buf: bytes | bytearray | memoryview, position: int = 0, *, check_crc: bool = True) -> tuple[BatchHeader, list[Record]]:
    header = validate_batch(buf, position, check_crc=check_crc) if check_crc else parse_header(buf, position)
    return header, decode_records(buf, header)


_ZIGZAG1 = [(b >> 1) ^ -(b & 1) for b in range(128)]  # one-byte zigzag varints: -64..63
_VARINT_MAX = 10  # bytes of the longest varint
ANY_OFFSET_DELTA = -1
"""_walk()'s `next_delta` for stored batches: any offset deltas (compaction leaves gaps)."""

_GATHER_BYTES = 2 * compression.INFLATE_CHUNK_BYTES
"""While inflating, a record up to this long is gathered whole and walked in place; a longer
one is walked field by field as its bytes stream past (its key and value are never held)."""


class RecordFields:
    """What compaction and time lookups need of a batch's records, without building Records:
    each record's offset and timestamp (LogAppendTime applied), whether its value is null (a
    tombstone), and when asked its key and its tail (the record's bytes from its key length to
    its end: what encode_record_tails() re-frames with new deltas)."""

    __slots__ = ("base_offset", "base_timestamp", "keys", "log_append_time", "offsets", "tails", "timestamps", "tombstones")

    def __init__(self, header: BatchHeader, *, with_keys: bool, with_tails: bool) -> None:
        self.base_offset = header.base_offset
        self.base_timestamp = header.base_timestamp
        self.log_append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_BIT else None
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.tombstones: list[bool] = []
        self.keys: list[bytes | None] | None = [] if with_keys else None
        self.tails: list[bytes] | None = [] if with_tails else None


def _walk(
    data: bytes | bytearray, pos: int, stop: int, end: int, next_delta: int, where: int,
    fields: RecordFields | None = None,
) -> tuple[int, int, int]:
    """Walk the whole records of data[pos:end] that start before `stop`, checking each the way
    decode_records() reads it: a positive length within `end`, fields (varints, key, value,
    headers) that fill it exactly, no null header key, no negative header count. One- and
    two-byte varints (nearly every length and delta) are decoded inline, the rest by
    read_varint(). This is the one walker of records that are not decoded into Records.

    `next_delta` >= 0: the offsetDelta the first record must have, each next one 1 more (a
    produced batch numbers its records 0..n-1, as Kafka checks); ANY_OFFSET_DELTA: any (stored
    batches). With `fields`, each record's fields are collected there.

    Returns (position after the last record walked, next_delta after it, records whose key is
    null). Stops at the start of a record that runs past `end`: the caller either has more bytes
    coming (inflating) or finds the batch corrupt. Raises CorruptBatchError.
    """
    zz = _ZIGZAG1
    rv = read_varint
    nulls = 0
    if fields is not None:
        add_offset, add_timestamp, add_tombstone = fields.offsets.append, fields.timestamps.append, fields.tombstones.append
        add_key = fields.keys.append if fields.keys is not None else None
        add_tail = fields.tails.append if fields.tails is not None else None
        base_offset, base_timestamp, fixed_timestamp = fields.base_offset, fields.base_timestamp, fields.log_append_time
    try:
        while pos < stop:
            b = data[pos]  # length
            if b < 0x80:
                length = zz[b]
                p = pos + 1
            elif (b1 := data[pos + 1]) < 0x80:
                v = (b & 0x7F) | (b1 << 7)
                length = (v >> 1) ^ -(v & 1)
                p = pos + 2
            else:
                length, p = rv(data, pos)
            record_end = p + length
            if length <= 0:
                raise CorruptBatchError(f"record length {length}", where)
            if record_end > end:
                break
            b = data[p + 1]  # timestampDelta, after the attributes byte
            if b < 0x80:
                ts_delta = zz[b]
                p += 2
            elif (b1 := data[p + 2]) < 0x80:
                v = (b & 0x7F) | (b1 << 7)
                ts_delta = (v >> 1) ^ -(v & 1)
                p += 3
            else:
                ts_delta, p = rv(data, p + 1)
            b = data[p]  # offsetDelta
            if b < 0x80:
                offset_delta = zz[b]
                p += 1
            elif (b1 := data[p + 1]) < 0x80:
                v = (b & 0x7F) | (b1 << 7)
                offset_delta = (v >> 1) ^ -(v & 1)
                p += 2
            else:
                offset_delta, p = rv(data, p)
            if next_delta >= 0:
                if offset_delta != next_delta:
                    raise CorruptBatchError(
                        f"record {next_delta} has offsetDelta {offset_delta}, expected {next_delta}: "
                        "a batch's records are numbered 0..n-1",
                        where,
                    )
                next_delta += 1
            tail = p
            b = data[p]  # key length, key
            if b < 0x80:
                klen = zz[b]
                p += 1
            elif (b1 := data[p + 1]) < 0x80:
                v = (b & 0x7F) | (b1 << 7)
                klen = (v >> 1) ^ -(v & 1)
                p += 2
            else:
                klen, p = rv(data, p)
            key_at = p
            if klen > 0:
                p += klen
            elif klen < 0:
                nulls += 1
            b = data[p]  # value length, value
            if b < 0x80:
                vlen = zz[b]
                p += 1
            elif (b1 := data[p + 1]) < 0x80:
                v = (b & 0x7F) | (b1 << 7)
                vlen = (v >> 1) ^ -(v & 1)
                p += 2
            else:
                vlen, p = rv(data, p)
            if vlen > 0:
                p += vlen
            b = data[p]  # header count, headers
            if b < 0x80:
                n = zz[b]
                p += 1
            else:
                n, p = rv(data, p)
            if n:
                if n < 0:
                    raise CorruptBatchError("negative header count", where)
                for _ in range(n):
                    hklen, p = rv(data, p)
                    if hklen < 0:
                        raise CorruptBatchError("null header key", where)
                    hvlen, p = rv(data, p + hklen)
                    if hvlen > 0:
                        p += hvlen
                    if p > record_end:
                        break
            if p != record_end:
                raise CorruptBatchError("record length disagrees with its fields", where)
            if fields is not None:
                add_offset(base_offset + offset_delta)
                add_timestamp(base_timestamp + ts_delta if fixed_timestamp is None else fixed_timestamp)
                add_tombstone(vlen < 0)
                if add_key is not None:
                    add_key(None if klen < 0 else data[key_at : key_at + klen])
                if add_tail is not None:
                    add_tail(data[tail:record_end])
            pos = record_end
    except IndexError:
        raise CorruptBatchError("record runs past the end of the batch", where) from None
    return pos, next_delta, nulls


def _check_count(header: BatchHeader, count: int) -> None:
    if count != header.records_count:
        raise CorruptBatchError(f"batch says {header.records_count} records but holds {count}", header.position)


def check_records_framing(
    buf: bytes | bytearray | memoryview, header: BatchHeader, at: int | None = None,
    *, max_inflated_bytes: int | None = None,
) -> tuple[int, int]:
    """Structural check of a produced batch's records, as a Kafka broker validates them: record
    lengths add up to the block, the count matches, offset deltas run 0..n-1, and each record's
    fields fill it exactly, so that everything stored decodes. Nothing is built. The batch
    starts at `at` in `buf` (default header.position).

    A compressed batch is inflated as it is walked, compression.INFLATE_CHUNK_BYTES at a time
    (its CRC only proves the bytes arrived as sent, and a block that does not inflate would be
    stored and then refuse every read), so the check holds a piece of the block, never all of
    it. The block may inflate to compression.MAX_RECORDS_BYTES (past it, CorruptBatchError),
    and to `max_inflated_bytes` when that is less (past it, InflatedTooLargeError).

    Returns (bytes inflated, records whose key is null).
    """
    if at is None:
        at = header.position
    where = header.position
    if header.compression == compression.NONE:
        start = at + HEADER_SIZE
        end = at + header.size
        data = buf
        if not isinstance(buf, (bytes, bytearray)):
            data = bytes(memoryview(buf)[start:end])
            start, end = 0, end - start
        pos, count, nulls = _walk(data, start, end, end, 0, where)
        if pos != end:
            raise CorruptBatchError("record length runs past the end of the batch", where)
        _check_count(header, count)
        return 0, nulls
    limit = compression.MAX_RECORDS_BYTES
    if max_inflated_bytes is not None and max_inflated_bytes < limit:
        limit = max_inflated_bytes
    raw = memoryview(buf)[at + HEADER_SIZE : at + header.size]
    block = _Inflating(compression.inflate_chunks(header.compression, raw, limit), where)
    try:
        count, nulls = _walk_inflating(block, where)
    except InflateLimitError as exc:
        if limit != compression.MAX_RECORDS_BYTES and exc.limit == limit:
            raise InflatedTooLargeError(limit) from None
        raise CorruptBatchError(exc.reason, where) from None
    except CorruptBatchError as exc:
        if exc.position != where:  # the codec's errors do not know where the batch is
            raise CorruptBatchError(exc.reason, where) from exc
        raise
    finally:
        block.close()
    _check_count(header, count)
    return block.inflated, nulls


class _Inflating:
    """A records block being inflated: data[pos:] has come and is not walked yet; `base` is the
    block position of data[0]."""

    __slots__ = ("base", "chunks", "data", "inflated", "more", "pos", "where")

    def __init__(self, chunks: Iterator[bytes | bytearray], where: int) -> None:
        self.chunks = chunks
        self.where = where
        self.data: bytes | bytearray = b""
        self.pos = 0
        self.base = 0
        self.more = True
        self.inflated = 0

    def pull(self) -> bool:
        """Add the next piece after what is left; False at the end of the block."""
        piece = next(self.chunks, None)
        if piece is None:
            self.more = False
            return False
        self.inflated += len(piece)
        self.base += self.pos
        self.data = self.data[self.pos :] + piece if self.pos < len(self.data) else piece
        self.pos = 0
        return True

    def position(self) -> int:
        return self.base + self.pos

    def varint(self) -> int:
        while len(self.data) - self.pos < _VARINT_MAX and self.more:
            self.pull()
        value, self.pos = read_varint(self.data, self.pos)
        return value

    def skip(self, n: int, record_end: int) -> None:
        """Pass `n` bytes of the record ending at block position `record_end`."""
        if self.position() + n > record_end:
            raise CorruptBatchError("record length disagrees with its fields", self.where)
        while n > len(self.data) - self.pos:
            n -= len(self.data) - self.pos
            self.pos = len(self.data)
            if not self.pull():
                raise CorruptBatchError("record runs past the end of the batch", self.where)
        self.pos += n

    def close(self) -> None:
        self.chunks.close()  # type: ignore[attr-defined]


def _walk_inflating(block: _Inflating, where: int) -> tuple[int, int]:
    """_walk() over a block as it inflates: (records, records whose key is null)."""
    count = nulls = 0
    while True:
        data = block.data
        # a record starting in the last 10 bytes may not have its whole length varint yet
        stop = len(data) - _VARINT_MAX if block.more else len(data)
        block.pos, count, n = _walk(data, block.pos, stop, len(data), count, where)
        nulls += n
        if not block.more:
            if block.pos != len(data):
                raise CorruptBatchError("record length runs past the end of the batch", where)
            return count, nulls
        if len(data) - block.pos > _VARINT_MAX and read_varint(data, block.pos)[0] > _GATHER_BYTES:
            nulls += _walk_long_record(block, count, where)
            count += 1
        else:
            block.pull()


def _walk_long_record(block: _Inflating, offset_delta: int, where: int) -> int:
    """Walk one record longer than _GATHER_BYTES field by field, its key, value and headers
    passing as they inflate. Returns 1 if its key is null, else 0."""
    length = block.varint()
    record_end = block.position() + length
    block.skip(1, record_end)  # attributes
    block.varint()  # timestampDelta
    found = block.varint()
    if found != offset_delta:
        raise CorruptBatchError(
            f"record {offset_delta} has offsetDelta {found}, expected {offset_delta}: a batch's records are numbered 0..n-1",
            where,
        )
    key_length = block.varint()
    if key_length > 0:
        block.skip(key_length, record_end)
    value_length = block.varint()
    if value_length > 0:
        block.skip(value_length, record_end)
    headers = block.varint()
    if headers < 0:
        raise CorruptBatchError("negative header count", where)
    for _ in range(headers):
        header_key_length = block.varint()
        if header_key_length < 0:
            raise CorruptBatchError("null header key", where)
        block.skip(header_key_length, record_end)
        header_value_length = block.varint()
        if header_value_length > 0:
            block.skip(header_value_length, record_end)
        if block.position() > record_end:
            break
    if block.position() != record_end:
        raise CorruptBatchError("record length disagrees with its fields", where)
    return 1 if key_length < 0 else 0


def split_records(
    buf: bytes | bytearray | memoryview, header: BatchHeader, at: int | None = None,
    *, with_keys: bool = True, with_tails: bool = False,
) -> RecordFields:
    """Each record's offset, timestamp and tombstone flag (and key, and tail) for the batch at
    `at` (default header.position) in `buf`, a stored batch: offset deltas may have gaps. The
    whole batch is checked as check_records_framing() checks it. Raises CorruptBatchError."""
    if at is None:
        at = header.position
    fields = RecordFields(header, with_keys=with_keys, with_tails=with_tails)
    where = header.position
    if header.compression == compression.NONE and isinstance(buf, bytes):
        start, end = at + HEADER_SIZE, at + header.size  # in place: slices of bytes are bytes
    else:
        block = batch_records_bytes(buf, header, at)
        buf = block if isinstance(block, bytes) else bytes(block)  # indexing bytes is cheaper
        start, end = 0, len(buf)
    pos = _walk(buf, start, end, end, ANY_OFFSET_DELTA, where, fields)[0]
    if pos != end:
        raise CorruptBatchError("record length runs past the end of the batch", where)
    _check_count(header, len(fields.offsets))
    return fields


def find_record_at_or_after(
    buf: bytes | bytearray | memoryview,
    header: BatchHeader,
    timestamp: int,
    min_offset: int,
    at: int | None = None,
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of the batch with timestamp >= `timestamp` and
    offset >= `min_offset`, or None. The batch starts at `at` (default header.position).

    Time lookups land inside a batch; this walks its records (split_records, no keys or
    values built), so a 100-record batch costs some microseconds.
    """
    if header.attributes & TIMESTAMP_TYPE_BIT:
        if header.max_timestamp >= timestamp and header.last_offset >= min_offset:
            return max(header.base_offset, min_offset), header.max_timestamp
        return None
    fields = split_records(buf, header, at, with_keys=False)
    for offset, ts in zip(fields.offsets, fields.timestamps):
        if ts >= timestamp and offset >= min_offset:
            return offset, ts
    return None
