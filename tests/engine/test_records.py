from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import compression
from engine.errors import CorruptBatchError
from engine.format import validate_batch
from engine import records as records_module
from engine.records import RecordInput, check_records_framing, decode_batch, encode_batch, read_varint, varint_size, write_varint

from ..kafka_oracle import build_batch, decode_all

CODEC_IDS = [0, 1, 2, 3, 4]

maybe_bytes = st.one_of(st.none(), st.binary(max_size=300))
header = st.tuples(st.text(max_size=20), maybe_bytes)
record = st.tuples(maybe_bytes, maybe_bytes, st.integers(0, 2**41), st.lists(header, max_size=4))


@given(st.integers(-(2**63), 2**63 - 1))
def test_varint_round_trip(value: int) -> None:
    out = bytearray()
    write_varint(out, value)
    assert len(out) == varint_size(value)
    assert read_varint(out, 0) == (value, len(out))


@pytest.mark.parametrize(("value", "encoded"), [(0, b"\x00"), (-1, b"\x01"), (1, b"\x02"), (63, b"\x7e"), (-64, b"\x7f"), (64, b"\x80\x01")])
def test_varint_known_encodings(value: int, encoded: bytes) -> None:
    out = bytearray()
    write_varint(out, value)
    assert bytes(out) == encoded


def test_truncated_varint_is_corrupt() -> None:
    with pytest.raises(CorruptBatchError):
        read_varint(b"\x80\x80", 0)


@settings(max_examples=150, deadline=None)
@given(st.lists(record, min_size=1, max_size=20), st.sampled_from(CODEC_IDS), st.integers(0, 2**40))
def test_encode_decode_round_trip_and_kafka_python_agrees(records, codec: int, base_offset: int) -> None:
    batch = encode_batch(base_offset, records, compression_type=codec)
    header, decoded = decode_batch(batch)
    assert header.records_count == len(records)
    assert header.compression == codec
    expected = [(base_offset + i, ts, k, v, tuple(h)) for i, (k, v, ts, h) in enumerate(records)]
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded] == expected
    check_records_framing(batch, header)
    # the independent decoder reads the same thing, with a valid CRC
    _, oracle = decode_all(bytes(batch))
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in oracle] == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(record, min_size=1, max_size=20), st.sampled_from(CODEC_IDS))
def test_batches_built_by_kafka_python_decode_equal(records, codec: int) -> None:
    records = [(k, v, ts, [(hk, hv) for hk, hv in h]) for k, v, ts, h in records]
    data = build_batch(records, codec=codec, base_offset=42)
    header = validate_batch(data)
    _, decoded = decode_batch(data)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded] == [
        (42 + i, ts, k, v, tuple(h)) for i, (k, v, ts, h) in enumerate(records)
    ]
    assert header.compression in (codec, 0)  # kafka-python falls back to none when not smaller


@pytest.mark.parametrize("codec", CODEC_IDS)
def test_each_codec_really_compresses_and_kafka_python_reads_it(codec: int) -> None:
    records = [(b"k%d" % i, b"value " * 50, 1_700_000_000_000 + i, [("h", None)]) for i in range(100)]
    batch = encode_batch(0, records, compression_type=codec)
    assert validate_batch(batch).compression == codec
    if codec:
        assert len(batch) < 100 * 300 / 4
    _, oracle = decode_all(bytes(batch))
    assert len(oracle) == 100 and oracle[7].value == b"value " * 50 and oracle[7].headers == (("h", None),)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_kafka_python_compressed_batches_decode(codec: int) -> None:
    records = [(None if i % 3 == 0 else b"k", None if i % 5 == 0 else b"x" * 200, 1_700_000_000_000, [("a", None), ("b", b"")]) for i in range(50)]
    data = build_batch(records, codec=codec)
    assert validate_batch(data).compression == codec
    _, decoded = decode_batch(data)
    assert [(r.key, r.value, r.headers) for r in decoded] == [(k, v, tuple(h)) for k, v, _ts, h in records]


def test_log_append_time_batch_from_kafka_python() -> None:
    data = build_batch([(b"k", b"v", 5, []), (b"k2", b"v2", 6, [])], log_append_time=1_800_000_000_000)
    _, decoded = decode_batch(data)
    assert [r.timestamp for r in decoded] == [1_800_000_000_000] * 2
    _, oracle = decode_all(data)
    assert [r.timestamp for r in oracle] == [1_800_000_000_000] * 2


def test_snappy_raw_block_without_xerial_header_decodes() -> None:
    import cramjam

    raw = bytes(cramjam.snappy.compress_raw(b"hello world" * 10))
    assert compression.decompress(compression.SNAPPY, raw) == b"hello world" * 10


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_garbage_compressed_payload_is_corrupt(codec: int) -> None:
    with pytest.raises(CorruptBatchError):
        compression.decompress(codec, b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x09garbage!!" if codec == 2 else b"not compressed data at all")


def test_record_framing_check_catches_a_lying_count() -> None:
    batch = encode_batch(0, [(b"a", b"1", 1, []), (b"b", b"2", 2, [])])
    batch[57:61] = (3).to_bytes(4, "big")
    from engine.format import parse_header

    with pytest.raises(CorruptBatchError, match="holds 2"):
        check_records_framing(batch, parse_header(batch))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(maybe_bytes, maybe_bytes, st.integers(0, 2**20), st.lists(header, max_size=2)), min_size=1, max_size=30),
    st.sampled_from(CODEC_IDS),
    st.integers(-5, 2**20 + 5),
    st.integers(0, 40),
    st.booleans(),
)
def test_find_record_at_or_after_agrees_with_full_decode(records, codec, target, min_delta, append_time) -> None:
    from engine.records import find_record_at_or_after

    batch = encode_batch(1000, records, compression_type=codec, log_append_time=2**19 if append_time else None)
    header, decoded = decode_batch(batch)
    expected = next(((r.offset, r.timestamp) for r in decoded if r.timestamp >= target and r.offset >= 1000 + min_delta), None)
    assert find_record_at_or_after(batch, header, target, 1000 + min_delta) == expected


@pytest.mark.parametrize("codec", [compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD])
def test_codecs_are_safe_from_several_threads(codec: int) -> None:
    """Reads and validation inflate in worker threads. A zstd decompressor shared between
    threads (the soak found it) returned wrong bytes and crashed the process."""
    import os
    import threading

    data = b"".join(b"v%d-%s" % (i, os.urandom(8).hex().encode()) for i in range(2000))
    block = compression.compress(codec, data)
    failures: list[str] = []

    def work() -> None:
        for _ in range(150):
            if compression.compress(codec, data) and compression.decompress(codec, block) != data:
                failures.append("wrong output")
                return

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def _python_encoded(*args, **kwargs) -> bytearray:
    """encode_batch's bytes from the Python encoder alone (the reference)."""
    native = records_module._CBuilder
    records_module._CBuilder = None
    try:
        return encode_batch(*args, **kwargs)
    finally:
        records_module._CBuilder = native


def test_the_c_builder_is_installed_and_takes_what_produce_gives_it() -> None:
    # aiokafka is a dependency: without its C builder JSON produce silently runs ~3 x slower
    assert records_module._CBuilder is not None
    for records in (
        [(b"k", b"v", 5, ()), (None, None, 6, []), (b"", b"x", 5, [("h", b"1"), ("g", None)])],
        [RecordInput(b"k", b"v", 5), RecordInput(None, b"v", 7, (("h", None),))],
    ):
        for codec in CODEC_IDS:
            assert records_module._encode_native(records, codec, -1, -1, -1) is not None
            assert encode_batch(0, records, compression_type=codec) == _python_encoded(0, records, compression_type=codec)


surrogate_header = st.tuples(st.sampled_from(["\udcff", "k\udc80"]), maybe_bytes)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(maybe_bytes, maybe_bytes, st.integers(0, 2**41), st.lists(st.one_of(header, surrogate_header), max_size=3)), min_size=1, max_size=30),
    st.sampled_from(CODEC_IDS), st.integers(0, 2**40),
    st.sampled_from([(-1, -1, -1), (5, 0, 0), (2**62 + 7, 3, 2**31 - 10)]),
    st.booleans(), st.integers(-1, 9),
)
def test_batches_are_byte_identical_to_the_python_encoder(records, codec, base_offset, producer, in_order, epoch) -> None:
    if in_order:  # the C builder's case: the first timestamp is the smallest
        first = min(ts for _k, _v, ts, _h in records)
        records = [(records[0][0], records[0][1], first, records[0][3]), *records[1:]]
    producer_id, producer_epoch, base_sequence = producer
    kwargs = dict(compression_type=codec, producer_id=producer_id, producer_epoch=producer_epoch,
                  base_sequence=base_sequence, partition_leader_epoch=epoch)
    assert encode_batch(base_offset, records, **kwargs) == _python_encoded(base_offset, records, **kwargs)
    as_inputs = [RecordInput(k, v, ts, h) for k, v, ts, h in records]
    assert encode_batch(base_offset, as_inputs, **kwargs) == _python_encoded(base_offset, records, **kwargs)
