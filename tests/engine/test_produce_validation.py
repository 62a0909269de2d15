"""What produce validation (prepare_batches) refuses, as Kafka's LogValidator does for a client's
batch, and what the readers of stored data must keep accepting (Kafka-written and compacted
batches). Decompression while validating is bounded: a compression bomb is walked in chunks,
never inflated whole."""

from __future__ import annotations

import struct
import tracemalloc
import zlib
from pathlib import Path

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from engine import compression, errors, reader
from engine.config import LogConfig
from engine.errors import CorruptBatchError, KeyRequiredError
from engine.format import HEADER_SIZE, parse_header
from engine.partition_log import prepare_batches
from engine.records import check_records_framing, encode_batch, varint_bytes

from .helpers import patch_last_offset_delta, running_log

T0 = 1_700_000_000_000
INT32_MAX = 2**31 - 1


def _kafka_batch(offsets: list[int], *, codec: int = 0, keys: bool = True) -> bytearray:
    """A batch written by kafka-python's builder, records at these offset deltas (gaps allowed:
    the shape compaction leaves)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 30,
    )
    for offset in offsets:
        builder.append(offset, timestamp=T0, key=b"k%d" % offset if keys else None, value=b"v", headers=[])
    return bytearray(builder.build())


# -- offsets: Kafka's "Inconsistent batch offset range" -------------------------------------------


def test_one_record_claiming_2_31_offsets_is_refused() -> None:
    """The issue's case: one request could move the log's offsets by 2^31."""
    batch = patch_last_offset_delta(encode_batch(0, [(b"k", b"v", T0, [])]), INT32_MAX)
    with pytest.raises(CorruptBatchError, match=r"Inconsistent batch offset range \[0, 2147483647\] and count of records 1"):
        prepare_batches(batch, LogConfig())


@pytest.mark.parametrize("delta", [0, 1, 3, 100])
def test_last_offset_delta_must_be_count_minus_one(delta: int) -> None:
    batch = patch_last_offset_delta(encode_batch(0, [(b"k", b"v", T0, [])] * 3), delta)
    if delta == 2:
        prepare_batches(batch, LogConfig())
        return
    with pytest.raises(CorruptBatchError, match="Inconsistent batch offset range"):
        prepare_batches(batch, LogConfig())


@pytest.mark.parametrize("codec", [0, compression.GZIP, compression.LZ4, compression.ZSTD, compression.SNAPPY])
def test_records_must_number_themselves_0_to_n_minus_1(codec: int) -> None:
    """A batch whose header is consistent (3 records, lastOffsetDelta 2) but whose records'
    offset deltas run 0, 2, 2: Kafka checks the inner offsets of a client's batch."""
    batch = _kafka_batch([0, 2, 2], codec=codec)
    batch[57:61] = (3).to_bytes(4, "big")
    patch_last_offset_delta(batch, 2)
    with pytest.raises(CorruptBatchError, match="offsetDelta 2.*expected 1"):
        prepare_batches(batch, LogConfig())
    prepare_batches(_kafka_batch([0, 1, 2], codec=codec), LogConfig())  # the same, numbered right


def test_transactional_batches_are_refused_with_their_own_error() -> None:
    batch = encode_batch(0, [(b"k", b"v", T0, [])], transactional=True, producer_id=7, producer_epoch=0, base_sequence=0)
    with pytest.raises(errors.TransactionsUnsupportedError, match="transactions are not supported"):
        prepare_batches(batch, LogConfig())


def test_a_refused_batch_after_good_ones_refuses_the_whole_body() -> None:
    good = encode_batch(0, [(b"k", b"v", T0, [])])
    bad = patch_last_offset_delta(encode_batch(0, [(b"k", b"v", T0, [])]), 5)
    with pytest.raises(CorruptBatchError) as info:
        prepare_batches(good + bad, LogConfig())
    assert info.value.position == len(good)


async def test_stored_compacted_and_kafka_shaped_batches_stay_readable(tmp_path: Path) -> None:
    """The new checks are produce validation only: a segment holding what compaction leaves
    (offset gaps inside a batch, lastOffsetDelta past the last record) loads and reads."""
    directory = tmp_path / "t-0"
    directory.mkdir()
    gappy = _kafka_batch([0, 3, 7])  # three records at deltas 0, 3, 7
    patch_last_offset_delta(gappy, 9)  # the cleaner kept the original last offset
    (directory / "00000000000000000000.log").write_bytes(gappy)
    async with running_log(directory) as log:
        assert log.high_watermark == 10
        records = reader.read_records(log.view, 0, 100, 1 << 20).records
        assert [r.offset for r in records] == [0, 3, 7]
        result = await log.append(prepare_batches(encode_batch(0, [(b"n", b"v", T0, [])]), log.config))
        assert result.base_offset == 10


# -- compacted topics: keys are checked by the same walk ------------------------------------------


@pytest.mark.parametrize("codec", [0, compression.ZSTD])
def test_a_keyless_record_is_refused_on_a_compacted_topic(codec: int) -> None:
    config = LogConfig(cleanup_policy="compact")
    batch = encode_batch(0, [(b"k", b"v", T0, []), (None, b"v", T0, [])], compression_type=codec)
    with pytest.raises(KeyRequiredError):
        prepare_batches(batch, config, topic="c")
    prepare_batches(batch, LogConfig())


# -- compression bombs ----------------------------------------------------------------------------


def _gzip_of_zeros(prefix: bytes, zeros: int) -> bytes:
    """gzip of `prefix` followed by `zeros` zero bytes, compressed piecewise (nothing that size is
    ever held)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [z.compress(prefix)]
    piece = bytes(1 << 20)
    for _ in range(zeros >> 20):
        out.append(z.compress(piece))
    out.append(z.compress(bytes(zeros & ((1 << 20) - 1))))
    out.append(z.flush())
    return b"".join(out)


def _framed(payload: bytes, *, codec: int, count: int = 1) -> bytearray:
    """One batch around an already compressed records block (written here by hand, so that
    the test does not lean on the encoder under test)."""
    out = bytearray(HEADER_SIZE) + payload
    struct.pack_into(">qiib", out, 0, 0, len(out) - 12, 0, 2)
    struct.pack_into(">hiqqqhii", out, 21, codec, count - 1, T0, T0, -1, -1, -1, count)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return out


def _one_huge_record(value_bytes: int) -> bytes:
    """The start of one valid record whose value is `value_bytes` long (the zeros follow)."""
    body = b"\x00" + varint_bytes(0) + varint_bytes(0) + varint_bytes(1) + b"k" + varint_bytes(value_bytes)
    return varint_bytes(len(body) + value_bytes + 1) + body  # + the header count (zero) after the value


def _peak_python_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("shape", ["zeros", "one_huge_record"])
def test_a_gzip_bomb_is_walked_in_chunks_not_inflated_whole(shape: str) -> None:
    """A 1 MiB batch whose records inflate to 1 GiB: refused while holding a few MiB at most."""
    size = 1 << 30
    prefix = b"" if shape == "zeros" else _one_huge_record(size)
    batch = _framed(_gzip_of_zeros(prefix, size), codec=compression.GZIP)
    header = parse_header(batch)

    def check() -> None:
        with pytest.raises(CorruptBatchError):
            check_records_framing(batch, header)

    peak = _peak_python_bytes(check)
    assert peak < 16 << 20, f"peak {peak >> 20} MiB of Python objects while checking a gzip bomb"


def test_the_inflated_bytes_of_one_request_are_capped() -> None:
    """A valid record too big for the request's budget: the 413 error, after at most the budget."""
    size = 64 << 20
    # the zeros are the value, then one more: the record's header count
    batch = _framed(_gzip_of_zeros(_one_huge_record(size), size + 1), codec=compression.GZIP)
    check_records_framing(batch, parse_header(batch))  # valid: 64 MiB inflate, walked in chunks
    with pytest.raises(errors.InflatedTooLargeError, match="inflate past 16777216 bytes"):
        prepare_batches(batch, LogConfig(), max_inflated_bytes=16 << 20)
    with pytest.raises(errors.InflatedTooLargeError):  # two batches of 48 MiB share the request's 64 MiB
        half = _framed(_gzip_of_zeros(_one_huge_record(48 << 20), (48 << 20) + 1), codec=compression.GZIP)
        prepare_batches(half + half, LogConfig(), max_inflated_bytes=64 << 20)
    prepare_batches(batch, LogConfig(), max_inflated_bytes=128 << 20)


@pytest.mark.parametrize("codec", [compression.LZ4, compression.ZSTD, compression.SNAPPY])
def test_other_codecs_are_walked_in_chunks_too(codec: int) -> None:
    size = 64 << 20
    records = _one_huge_record(size) + bytes(size + 1)
    batch = _framed(compression.compress(codec, records), codec=codec)
    del records
    header = parse_header(batch)
    peak = _peak_python_bytes(lambda: check_records_framing(batch, header))
    assert peak < 16 << 20, f"peak {peak >> 20} MiB of Python objects while checking 64 MiB of records"
    with pytest.raises(errors.InflatedTooLargeError):  # (snappy: 3 MiB, over the default max.message.bytes)
        prepare_batches(batch, LogConfig(max_message_bytes=8 << 20), max_inflated_bytes=8 << 20)


# -- reads ----------------------------------------------------------------------------------------


async def test_a_read_inflates_one_big_batch_at_a_time(tmp_path: Path) -> None:
    """Three small gzip batches of 8 MiB records each fit in a 1 MiB read; decoded, they would be
    24 MiB. A read stops after the batch whose records reach max_bytes; the next goes on."""
    async with running_log(tmp_path / "t-0") as log:
        for i in range(3):
            batch = encode_batch(0, [(b"k%d" % i, bytes(8 << 20), T0, [])], compression_type=compression.GZIP)
            assert len(batch) < 16 << 10
            await log.append(prepare_batches(batch, log.config))
        first = reader.read_records(log.view, 0, 100, 1 << 20)
        assert [r.key for r in first.records] == [b"k0"] and first.next_offset == 1
        rest = reader.read_records(log.view, 1, 100, 1 << 20)
        assert [r.key for r in rest.records] == [b"k1"] and rest.next_offset == 2
        everything = reader.read_records(log.view, 0, 100, 64 << 20)
        assert [r.key for r in everything.records] == [b"k0", b"k1", b"k2"] and everything.next_offset == 3
