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

Pure functions, safe from any thread.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

from crc32c import crc32c

from . import compression
from .errors import CorruptBatchError
from .format import (
    CONTROL_BIT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    parse_header,
    validate_batch,
)

Header = tuple[str, "bytes | None"]

_HEADER_AFTER_CRC = struct.Struct(">hiqqqhii")
_HEADER_BEFORE_CRC = struct.Struct(">qiib")
_U32 = struct.Struct(">I")


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
    base_timestamp = first.timestamp if isinstance(first, RecordInput) else first[2]
    for rec in records:
        ts = rec.timestamp if isinstance(rec, RecordInput) else rec[2]
        if ts < base_timestamp:
            base_timestamp = ts
    body, count, max_ts = encode_records(records, base_timestamp)
    attributes = compression_type
    if log_append_time is not None:
        attributes |= TIMESTAMP_TYPE_BIT
        max_ts = log_append_time
    if transactional:
        attributes |= TRANSACTIONAL_BIT
    if control:
        attributes |= CONTROL_BIT
    if compression_type != compression.NONE:
        payload = compression.compress(compression_type, body)
    else:
        payload = body
    out = bytearray(HEADER_SIZE)
    out += payload
    batch_length = len(out) - LOG_OVERHEAD
    _HEADER_BEFORE_CRC.pack_into(out, 0, base_offset, batch_length, partition_leader_epoch, MAGIC_V2)
    _HEADER_AFTER_CRC.pack_into(
        out,
        21,
        attributes,
        count - 1,
        base_timestamp,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    _U32.pack_into(out, 17, crc32c(memoryview(out)[21:]))
    return out


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
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    log_append = header.attributes & TIMESTAMP_TYPE_BIT
    max_ts = header.max_timestamp
    rv = read_varint
    out: list[Record] = []
    pos = 0
    end = len(data)
    try:
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
    finally:
        if isinstance(data, memoryview):
            data.release()
    if pos != end:
        raise CorruptBatchError(
            f"{end - pos} bytes left after {header.records_count} records", header.position
        )
    return out


def decode_batch(buf: bytes | bytearray | memoryview, position: int = 0, *, check_crc: bool = True) -> tuple[BatchHeader, list[Record]]:
    header = validate_batch(buf, position, check_crc=check_crc) if check_crc else parse_header(buf, position)
    return header, decode_records(buf, header)


_TWICE = (0, 1)


def check_records_framing(
    buf: bytes | bytearray | memoryview, header: BatchHeader, at: int | None = None
) -> None:
    """Structural check of a batch's records, as a Kafka broker validates a produced batch:
    record lengths add up, the count matches, and each record's fields (varints, key, value,
    headers) fill it exactly, so that everything stored decodes. Nothing is built.

    A compressed batch is inflated first (bounded by compression.MAX_RECORDS_BYTES): its CRC
    only proves the bytes arrived as sent, and a block that does not inflate would be stored
    and then refuse every read.
    """
    if at is None:
        at = header.position
    if header.compression != compression.NONE:
        data = batch_records_bytes(buf, header, at)
        pos, end = 0, len(data)
    else:
        pos = at + HEADER_SIZE
        end = at + header.size
        data = buf if isinstance(buf, (bytes, bytearray)) else bytes(memoryview(buf)[at:end])
        if data is not buf:
            pos, end = HEADER_SIZE, header.size
    count = 0
    try:
        while pos < end:
            b = data[pos]  # record length: one- and two-byte varints inline
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif (b1 := data[pos + 1]) < 0x80:
                v = (b & 0x7F) | (b1 << 7)
                length = (v >> 1) ^ -(v & 1)
                pos += 2
            else:
                length, pos = read_varint(data, pos)
            record_end = pos + length
            if length <= 0 or record_end > end:
                raise CorruptBatchError("record length runs past the end of the batch", header.position)
            # the fields, as decode_records() reads them, without building anything
            p = pos + 1  # attributes
            for _ in _TWICE:  # timestampDelta, offsetDelta: skipped (at most 10 bytes each)
                q = p
                while data[p] >= 0x80:
                    p += 1
                p += 1
                if p - q > 10:
                    raise CorruptBatchError("varint longer than 10 bytes", header.position)
            for _ in _TWICE:  # key, value: a length (negative = null), then the bytes
                b = data[p]
                if b < 0x80:  # one- and two-byte lengths inline
                    n = (b >> 1) ^ -(b & 1)
                    p += 1
                elif (b1 := data[p + 1]) < 0x80:
                    v = (b & 0x7F) | (b1 << 7)
                    n = (v >> 1) ^ -(v & 1)
                    p += 2
                else:
                    n, p = read_varint(data, p)
                if n > 0:
                    p += n
            b = data[p]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                n, p = read_varint(data, p)
            if n < 0:
                raise CorruptBatchError("negative header count", header.position)
            for _ in range(n):
                klen, p = read_varint(data, p)
                if klen < 0:
                    raise CorruptBatchError("null header key", header.position)
                vlen, p = read_varint(data, p + klen)
                if vlen > 0:
                    p += vlen
                if p > record_end:
                    break
            if p != record_end:
                raise CorruptBatchError("record length disagrees with its fields", header.position)
            pos = record_end
            count += 1
    except IndexError:
        raise CorruptBatchError("record length runs past the end of the batch", header.position) from None
    if count != header.records_count:
        raise CorruptBatchError(
            f"batch says {header.records_count} records but holds {count}", header.position
        )


def find_record_at_or_after(
    buf: bytes | bytearray | memoryview,
    header: BatchHeader,
    timestamp: int,
    min_offset: int,
    at: int | None = None,
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of the batch with timestamp >= `timestamp` and
    offset >= `min_offset`, or None. The batch starts at `at` (default header.position).

    Time lookups land inside a batch; this walks its records reading only each record's
    length, timestamp delta and offset delta (one-byte varints inline), never building keys,
    values or headers, so a 100-record batch costs a few microseconds.
    """
    if header.attributes & TIMESTAMP_TYPE_BIT:
        if header.max_timestamp >= timestamp and header.last_offset >= min_offset:
            return max(header.base_offset, min_offset), header.max_timestamp
        return None
    data = bytes(batch_records_bytes(buf, header, at))  # bytes index faster than a memoryview
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    rv = read_varint
    pos = 0
    end = len(data)
    try:
        for _ in range(header.records_count):
            # record length: one- and two-byte varints inline (records under 8 KiB)
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif (b1 := data[pos + 1]) < 0x80:
                v = (b & 0x7F) | (b1 << 7)
                length = (v >> 1) ^ -(v & 1)
                pos += 2
            else:
                length, pos = rv(data, pos)
            record_end = pos + length
            if length < 0 or record_end > end:
                raise CorruptBatchError("record length runs past the end of the batch", header.position)
            # timestamp delta, after the attributes byte: one and two bytes inline (< 8 s)
            b = data[pos + 1]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                p = pos + 2
            elif (b1 := data[pos + 2]) < 0x80:
                v = (b & 0x7F) | (b1 << 7)
                ts_delta = (v >> 1) ^ -(v & 1)
                p = pos + 3
            else:
                ts_delta, p = rv(data, pos + 1)
            if base_ts + ts_delta >= timestamp:
                offset_delta = rv(data, p)[0]
                if base_offset + offset_delta >= min_offset:
                    return base_offset + offset_delta, base_ts + ts_delta
            pos = record_end
    except IndexError:
        raise CorruptBatchError("record runs past the end of the batch", header.position) from None
    return None
