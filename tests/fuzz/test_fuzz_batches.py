"""Fuzzing the in-memory readers of batch bytes: engine/format.py, engine/records.py and
engine/compression.py. Only CorruptBatchError may come out of them, whatever the bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from engine import compression
from engine.errors import CorruptBatchError
from engine.format import (
    CRC_START,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    iter_batches,
    parse_header,
    read_prefix,
    scan_valid_prefix,
    validate_batch,
)
from engine.records import (
    check_records_framing,
    decode_batch,
    decode_records,
    find_record_at_or_after,
    read_varint,
    varint_bytes,
)

from .support import (
    CODECS,
    fix_crc,
    frame_batch,
    fuzz_settings,
    mutated,
    only,
    valid_batch,
    valid_batches,
    xxh32,
)


def _decode_all(buf: bytes | bytearray) -> list:
    """What a consumer does with stored bytes: every reader of batches and records, in turn."""
    out = []
    for header in iter_batches(buf):
        check_records_framing(buf, header)
        records = decode_records(buf, header)
        assert len(records) == header.records_count  # decode_records frames exactly
        find_record_at_or_after(buf, header, header.base_timestamp, header.base_offset)
        out.extend(records)
    return out


@fuzz_settings(100)
@given(batch=valid_batch())
def test_valid_batches_decode_to_their_records(batch):
    """The starting point of every mutation: the readers accept what encode_batch writes."""
    buf, records = batch
    decoded = _decode_all(buf)
    assert [(r.key, r.value) for r in decoded] == [(r.key, r.value) for r in records]


@fuzz_settings(200)
@given(buf=mutated(valid_batches()))
def test_mutated_batches_raise_only_corrupt_batch(buf):
    only(CorruptBatchError, _decode_all, buf)
    headers, valid, reason = only(CorruptBatchError, scan_valid_prefix, buf)[0]
    assert 0 <= valid <= len(buf)
    assert (reason is None) == (valid == len(buf))
    assert sum(h.size for h in headers) == valid


@fuzz_settings(250)
@given(buf=mutated(valid_batch().map(lambda b: b[0])), data=st.data())
def test_mutated_batches_with_a_fixed_crc_raise_only_corrupt_batch(buf, data):
    """With the CRC recomputed, the damage reaches the records decoders and decompressors."""
    fix_crc(buf)
    only(CorruptBatchError, _decode_all, buf)
    if len(buf) >= HEADER_SIZE:
        header = parse_header(buf, 0)
        timestamp = data.draw(st.integers(-(2**63), 2**63 - 1))
        only(CorruptBatchError, find_record_at_or_after, buf, header, timestamp, 0)
        only(CorruptBatchError, decode_records, buf, header)
        only(CorruptBatchError, check_records_framing, buf, header)


@fuzz_settings(300)
@given(batch=valid_batch(), position=st.integers(CRC_START, 10**6), bit=st.integers(0, 7))
def test_one_flipped_bit_under_the_crc_is_always_caught(batch, position, bit):
    buf, _ = batch
    buf[position % (len(buf) - CRC_START) + CRC_START] ^= 1 << bit
    with pytest.raises(CorruptBatchError):  # by the CRC, or before it (a negative count)
        validate_batch(buf)


@fuzz_settings(300)
@given(buf=st.binary(min_size=HEADER_SIZE, max_size=512))
def test_random_headers_parse_and_validate_cleanly(buf):
    header = parse_header(buf, 0)
    assert header.size == header.batch_length + 12
    assert read_prefix(buf, 0) == (header.base_offset, header.batch_length)
    only(CorruptBatchError, validate_batch, buf)
    only(CorruptBatchError, decode_batch, buf)
    only(CorruptBatchError, lambda: list(iter_batches(buf)))


@fuzz_settings(300)
@given(
    payload=st.binary(max_size=256),
    attributes=st.integers(0, 0x7F),
    count=st.sampled_from([0, 1, 2, 2**31 - 1]) | st.integers(0, 2**31 - 1),
)
@example(payload=b"\x0e" + b"\x00" * 6, attributes=0, count=2**31 - 1)  # a huge count, one record
def test_random_records_blocks_in_a_well_framed_batch(payload, attributes, count):
    """Any records block, any codec bits (5-7 are not codecs), any count, behind a valid CRC."""
    buf = frame_batch(payload, attributes=attributes, count=count)
    only(CorruptBatchError, _decode_all, buf)
    header = validate_batch(buf)
    only(CorruptBatchError, find_record_at_or_after, buf, header, 0, 0)


@fuzz_settings(200)
@given(buf=st.binary(max_size=32), position=st.integers(0, 40))
@example(buf=b"\xff" * 11, position=0)  # 11 continuation bytes: longer than a varint may be
def test_read_varint_raises_only_corrupt_batch(buf, position):
    value, end = only(CorruptBatchError, read_varint, buf, position)[0] or (None, None)
    if value is not None:
        assert position < end <= len(buf)
        assert -(2**63) <= value < 2**63
        assert read_varint(varint_bytes(value), 0) == (value, len(varint_bytes(value)))


# -- compression -------------------------------------------------------------------------------


@fuzz_settings(150)
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=2048))
def test_decompress_of_garbage_raises_only_corrupt_batch(codec, data):
    out, _ = only(CorruptBatchError, compression.decompress, codec, data)
    assert out is None or len(out) <= compression.MAX_RECORDS_BYTES


@fuzz_settings(300)
@given(
    codec=st.sampled_from(CODECS[1:]),
    block=mutated(st.binary(max_size=4096).flatmap(
        lambda raw: st.sampled_from(CODECS[1:]).map(lambda c: compression.compress(c, raw))
    )),
)
def test_decompress_of_mutated_blocks_raises_only_corrupt_batch(codec, block):
    """Blocks of every codec, mutated, offered to every codec (a wrong codec bit is garbage)."""
    only(CorruptBatchError, compression.decompress, codec, block)


@fuzz_settings(100)
@given(codec=st.sampled_from(CODECS[1:]), data=st.binary(max_size=2048), limit=st.integers(0, 4096))
def test_decompress_never_returns_more_than_its_limit(codec, data, limit):
    block = compression.compress(codec, data)
    out, error = only(CorruptBatchError, compression.decompress, codec, block, limit)
    if len(data) <= limit:
        assert out == data
    else:
        assert out is None and "inflate past" in error.reason


@pytest.mark.parametrize("claimed", [2**40, 2**31, 10**9])
def test_lz4_frame_claiming_a_huge_content_size(claimed):
    """Regression: lz4.frame.decompress() allocated the frame's declared content size first."""
    import lz4.frame

    frame = bytearray(lz4.frame.compress(b"record " * 100, store_size=True, block_linked=False))
    struct.pack_into("<Q", frame, 6, claimed)  # after magic, FLG, BD
    frame[14] = (xxh32(bytes(frame[4:14])) >> 8) & 0xFF  # the descriptor's header checksum
    _, error = only(CorruptBatchError, compression.decompress, compression.LZ4, bytes(frame))
    assert error is not None


@pytest.mark.parametrize(
    "block",
    [
        b"\xff\xff\xff\xff\x0f" + bytes(10),  # raw snappy claiming 4 GiB: cramjam aborted the process
        b"\xff\xff\xff\x7f" + bytes(10),
        b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, 15) + b"\xff\xff\xff\xff\x0f" + bytes(10),
        b"\x80" * 6,  # a preamble varint that never ends
    ],
)
def test_snappy_block_claiming_more_than_snappy_can_inflate(block):
    _, error = only(CorruptBatchError, compression.decompress, compression.SNAPPY, block)
    assert error is not None


@pytest.mark.parametrize("codec", CODECS[1:])
def test_a_decompression_bomb_is_corrupt_not_allocated(codec):
    """A few KiB that inflate past MAX_RECORDS_BYTES: refused while inflating."""
    import zstandard

    chunk = b"\x00" * (16 << 20)
    if codec == compression.ZSTD:
        cctx = zstandard.ZstdCompressor(level=1)
        frame = cctx.compress(chunk)
        block = frame * (compression.MAX_RECORDS_BYTES // len(chunk) + 1)
    elif codec == compression.GZIP:
        import gzip

        block = gzip.compress(chunk) * (compression.MAX_RECORDS_BYTES // len(chunk) + 1)
    else:  # lz4 and snappy cannot reach 256 MiB from a small block: use a small limit
        block = compression.compress(codec, chunk)
        _, error = only(CorruptBatchError, compression.decompress, codec, block, len(chunk) - 1)
        assert "inflate past" in error.reason
        return
    assert len(block) < 1 << 20
    _, error = only(CorruptBatchError, compression.decompress, codec, block)
    assert "inflate past" in error.reason


def test_a_compressed_bomb_batch_is_refused_by_decode_records():
    import zstandard

    frame = zstandard.ZstdCompressor(level=1).compress(b"\x00" * (16 << 20))
    buf = frame_batch(frame * 17, attributes=compression.ZSTD, count=1)
    header = validate_batch(buf)
    _, error = only(CorruptBatchError, decode_records, buf, header)
    assert "inflate past" in error.reason


def test_log_append_time_batch_lookup_ignores_garbage_records():
    """find_record_at_or_after answers a LogAppendTime batch from its header alone."""
    buf = frame_batch(b"\xff" * 10, attributes=TIMESTAMP_TYPE_BIT, count=3, base_offset=10, max_timestamp=50)
    header = validate_batch(buf)
    assert find_record_at_or_after(buf, header, 40, 0) == (10, 50)
    with pytest.raises(CorruptBatchError):
        decode_records(buf, header)
