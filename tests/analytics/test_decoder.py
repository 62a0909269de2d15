"""analytics.decoder against engine.records.decode_records (the reference) and kafka-python."""

from __future__ import annotations

import pickle
import random
import struct
import tempfile
from contextlib import contextmanager
from pathlib import Path

import anyio
import pyarrow as pa
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics import decoder
from analytics.decoder import (
    ARROW_SCHEMA,
    SnapshotCorruptError,
    decode_segment,
    decode_segment_keys,
    decode_segment_rows,
)
from engine.config import LogConfig
from engine.format import iter_batches
from engine.records import decode_records, encode_batch

from ..engine.helpers import FakeClock, append_records, running_log
from ..kafka_oracle import build_batch, decode_all

T0 = 1_700_000_000_000
CODECS = [0, 1, 2, 3, 4]
METHODS = ["auto", "lockstep", "candidates", "walk"]


def reference_rows(data: bytes, **bounds) -> list[tuple]:
    """Every record of every non-control batch, by engine.records, then the bounds applied."""
    rows = []
    if data:
        for header in iter_batches(data):
            if header.is_control:
                continue
            for r in decode_records(data, header):
                rows.append((r.offset, r.timestamp, r.key, r.value, tuple(r.headers)))
    lo, hi = bounds.get("start_offset"), bounds.get("end_offset")
    t_lo, t_hi = bounds.get("start_ts"), bounds.get("end_ts")
    return [
        r for r in rows
        if (lo is None or r[0] >= lo) and (hi is None or r[0] < hi)
        and (t_lo is None or r[1] >= t_lo) and (t_hi is None or r[1] < t_hi)
    ]


@contextmanager
def forced(method: str, window_bytes: int | None = None, *, strict: bool = False):
    """Make the decoder use one way of finding record starts (and optionally a small window).

    strict: the chosen vectorised method must succeed (the Python walk fails the test).
    """
    saved = {name: getattr(decoder, name) for name in
             ("_LOCKSTEP_STEP_S", "_LOCKSTEP_RECORD_S", "_CANDIDATE_BYTE_S", "_WALK_RECORD_S", "_WINDOW_BYTES",
              "_starts_walk")}
    huge = 1e9
    if method == "lockstep":
        decoder._CANDIDATE_BYTE_S = decoder._WALK_RECORD_S = huge
        decoder._LOCKSTEP_STEP_S = decoder._LOCKSTEP_RECORD_S = 0.0
    elif method == "candidates":
        decoder._LOCKSTEP_STEP_S = decoder._WALK_RECORD_S = huge
        decoder._CANDIDATE_BYTE_S = 0.0
    elif method == "walk":
        decoder._LOCKSTEP_STEP_S = decoder._CANDIDATE_BYTE_S = huge
    if window_bytes is not None:
        decoder._WINDOW_BYTES = window_bytes
    if strict and method in ("lockstep", "candidates"):
        def walk(*args):
            raise AssertionError(f"{method} fell back to the walk")
        decoder._starts_walk = walk
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(decoder, name, value)


def write_segment(directory: Path, batches: list[bytes | bytearray], name: str = "00000000000000000000.log") -> tuple[Path, bytes]:
    data = b"".join(bytes(b) for b in batches)
    path = directory / name
    path.write_bytes(data)
    return path, data


def mixed_batches(seed: int = 7, n_batches: int = 40) -> list[bytearray]:
    """Batches of every codec, null keys and values, headers (null values too), LogAppendTime,
    offset gaps, a control batch, an empty value and long values."""
    rng = random.Random(seed)
    out = []
    offset = 0
    for b in range(n_batches):
        records = []
        for _ in range(rng.randint(1, 30)):
            key = None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 20))
            value = None if rng.random() < 0.15 else rng.randbytes(rng.choice([0, 1, 4, 12, 13, 100, 300]))
            headers = [(f"h{j}é", None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 15)))
                       for j in range(rng.choice([0, 0, 0, 1, 2, 5]))]
            records.append((key, value, T0 + rng.randint(-5000, 5000), headers))
        append_time = T0 + 99_999 if b % 7 == 3 else None
        out.append(encode_batch(offset, records, compression_type=CODECS[b % 5], log_append_time=append_time))
        offset += len(records) + rng.choice([0, 0, 2])
        if b == 10:
            out.append(encode_batch(offset, [(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", T0, [])], control=True, transactional=True))
            offset += 1
    return out


# ---------------------------------------------------------------------------------------------
# schema


def test_arrow_schema_is_what_pyspark_expects() -> None:
    types = pytest.importorskip("pyspark.sql.types")
    to_arrow_schema = pytest.importorskip("pyspark.sql.pandas.types").to_arrow_schema
    spark_schema = types.StructType([
        types.StructField("topic", types.StringType()),
        types.StructField("partition", types.IntegerType()),
        types.StructField("offset", types.LongType()),
        types.StructField("timestamp", types.TimestampType()),
        types.StructField("key", types.BinaryType()),
        types.StructField("value", types.BinaryType()),
        types.StructField("headers", types.ArrayType(types.StructType([
            types.StructField("key", types.StringType()),
            types.StructField("value", types.BinaryType()),
        ]))),
    ])
    expected = to_arrow_schema(spark_schema, timezone="UTC")
    assert expected.equals(ARROW_SCHEMA)
    assert [f.nullable for f in ARROW_SCHEMA] == [True] * 7


# ---------------------------------------------------------------------------------------------
# equality with the reference decoder


@pytest.mark.parametrize("method", METHODS)
def test_mixed_segment_equals_reference(tmp_path: Path, method: str) -> None:
    path, data = write_segment(tmp_path, mixed_batches())
    with forced(method, strict=True):
        got = decode_segment_rows(path, len(data))
    expected = reference_rows(data)
    assert len(expected) > 300
    assert got == expected


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_every_codec(tmp_path: Path, codec: int) -> None:
    rng = random.Random(codec)
    batches = []
    offset = 1000
    for b in range(6):
        records = [
            (None if i % 5 == 0 else b"k%d" % i, None if i % 7 == 3 else rng.randbytes(50 + i),
             T0 + 10 * i, [("trace", b"abc"), ("empty", None)] if i % 3 == 0 else [])
            for i in range(40)
        ]
        batches.append(build_batch(records, codec=codec, base_offset=offset,
                                   log_append_time=T0 + 5 if b == 4 else None))
        offset += 40
    path, data = write_segment(tmp_path, batches)
    _, oracle = decode_all(data)
    assert any(struct.unpack_from(">h", b, 21)[0] & 7 == codec for b in batches)  # really compressed
    expected = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in oracle]
    assert decode_segment_rows(path, len(data)) == expected == reference_rows(data)


def test_segments_written_by_the_engine(tmp_path: Path) -> None:
    """Real segments (rolled at 4 KiB, LogAppendTime topic) decode like the reference."""
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=4096, message_timestamp_type="LogAppendTime")

    async def main() -> None:
        async with running_log(directory, config, clock=FakeClock(T0 + 10**6)) as log:
            for i in range(60):
                records = [(b"key-%d" % (j % 4), None if j == 2 else b"v" * (i + j), T0 + i, [("n", b"%d" % j)])
                           for j in range(5)]
                await append_records(log, records, compression_type=CODECS[i % 5])

    anyio.run(main)
    segments = sorted(directory.glob("*.log"))
    assert len(segments) >= 3
    total = 0
    for segment in segments:
        data = segment.read_bytes()
        rows = decode_segment_rows(segment, len(data))
        assert rows == reference_rows(data)
        assert {ts for _, ts, *_ in rows} == {T0 + 10**6}  # the log's clock, not the producer's
        total += len(rows)
    assert total == 300


def test_batches_have_the_schema_and_the_topic(tmp_path: Path) -> None:
    path, data = write_segment(tmp_path, mixed_batches(n_batches=10))
    batches = list(decode_segment(path, len(data), topic="orders", partition=7, max_rows_per_batch=50))
    assert len(batches) > 1
    for batch in batches:
        assert batch.schema.equals(ARROW_SCHEMA)
        assert batch.num_rows > 0
        assert set(batch.column("topic").to_pylist()) == {"orders"}
        assert set(batch.column("partition").to_pylist()) == {7}
        batch.validate(full=True)
    first = batches[0]
    assert first.column("timestamp").type == pa.timestamp("us", tz="UTC")
    ref = reference_rows(data)
    assert first.column("timestamp")[0].value == ref[0][1] * 1000


def test_keys_pass_matches_rows(tmp_path: Path) -> None:
    path, data = write_segment(tmp_path, mixed_batches())
    rows = reference_rows(data, start_offset=50)
    keys, offsets, tombstones = [], [], []
    for k, o, t in decode_segment_keys(path, len(data), start_offset=50, max_rows_per_batch=100):
        keys += k.to_pylist()
        offsets += o.tolist()
        tombstones += t.tolist()
    assert keys == [r[2] for r in rows]
    assert offsets == [r[0] for r in rows]
    assert tombstones == [r[3] is None for r in rows]


@pytest.mark.parametrize("method", METHODS)
def test_large_records_and_long_varints(tmp_path: Path, method: str) -> None:
    """Values past 8 KiB (3-byte lengths), negative and huge timestamp deltas, big offsets."""
    records = [(b"k", bytes([i % 256]) * (9000 + i), T0 + (-1) ** i * 10**9 * i, []) for i in range(6)]
    records.append((None, b"tail", T0, [("h" * 300, b"x" * 70_000)]))
    batches = [encode_batch(2**40, records), encode_batch(2**40 + 10, records[:2], compression_type=4)]
    path, data = write_segment(tmp_path, batches)
    with forced(method):
        assert decode_segment_rows(path, len(data)) == reference_rows(data)


@pytest.mark.parametrize("method", METHODS)
def test_values_that_look_like_records(tmp_path: Path, method: str) -> None:
    """Values holding encoded records and zero runs: many false record-start candidates."""
    inner = bytes(encode_batch(0, [(b"a", b"b" * 20, T0, [])] * 8))[61:]
    records = [(b"k%d" % i, inner * (i % 3 + 1), T0, []) for i in range(50)]
    records += [(b"z", bytes(200), T0, []), (bytes(3), bytes([0, 14, 0, 0, 0, 2]) * 30, T0, [])]
    path, data = write_segment(tmp_path, [encode_batch(0, records), encode_batch(60, records[::-1], compression_type=1)])
    with forced(method, strict=True):
        assert decode_segment_rows(path, len(data)) == reference_rows(data)


def test_non_zero_record_attributes_still_decode(tmp_path: Path) -> None:
    """A producer that sets the unused record attributes byte: decoded like the reference."""
    batch = encode_batch(0, [(b"k", b"v" * 30, T0, [])] * 20)
    assert batch[61] < 0x80  # a one-byte length, so the attributes byte follows at 62
    batch[62] = 0x7F
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    path, data = write_segment(tmp_path, [batch])
    for method in METHODS:
        with forced(method):
            assert decode_segment_rows(path, len(data)) == reference_rows(data)


@pytest.mark.parametrize("window", [200, 1000, 5000])
def test_small_read_windows(tmp_path: Path, window: int) -> None:
    """Batches crossing read windows, and batches larger than a window."""
    path, data = write_segment(tmp_path, mixed_batches(seed=3))
    with forced("auto", window_bytes=window):
        assert decode_segment_rows(path, len(data)) == reference_rows(data)


def test_empty_segment_and_control_only(tmp_path: Path) -> None:
    path, data = write_segment(tmp_path, [])
    assert list(decode_segment(path, 0, topic="t", partition=0)) == []
    control = encode_batch(5, [(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", T0, [])], control=True)
    path, data = write_segment(tmp_path, [control], name="c.log")
    assert list(decode_segment(path, len(data), topic="t", partition=0)) == []


# ---------------------------------------------------------------------------------------------
# filters


def test_offset_and_time_filters(tmp_path: Path) -> None:
    path, data = write_segment(tmp_path, mixed_batches())
    all_rows = reference_rows(data)
    offsets = [r[0] for r in all_rows]
    cases = [
        {"start_offset": offsets[100]},
        {"end_offset": offsets[100]},
        {"start_offset": offsets[10] + 1, "end_offset": offsets[200]},
        {"start_offset": offsets[-1] + 1},
        {"end_offset": 0},
        {"start_ts": T0},
        {"end_ts": T0 - 1000},
        {"start_ts": T0 + 99_999, "end_ts": T0 + 100_000},  # the LogAppendTime batches only
        {"start_offset": offsets[50], "end_offset": offsets[400], "start_ts": T0 - 2000, "end_ts": T0 + 2000},
    ]
    for bounds in cases:
        expected = reference_rows(data, **bounds)
        assert decode_segment_rows(path, len(data), **bounds) == expected, bounds
    assert reference_rows(data, start_ts=T0 + 99_999, end_ts=T0 + 100_000)  # the case is not empty


def test_end_offset_stops_reading(tmp_path: Path) -> None:
    """Nothing after end_offset is read: a corrupt tail there goes unnoticed."""
    batches = [encode_batch(i * 10, [(b"k", b"v", T0, [])] * 10) for i in range(5)]
    path, data = write_segment(tmp_path, batches)
    path.write_bytes(data + b"\xff" * 100)
    assert [r[0] for r in decode_segment_rows(path, len(data) + 100, end_offset=20)] == list(range(20))
    with pytest.raises(SnapshotCorruptError):
        decode_segment_rows(path, len(data) + 100)


# ---------------------------------------------------------------------------------------------
# torn and corrupt segments


def test_garbage_after_size_bytes_is_ignored(tmp_path: Path) -> None:
    path, data = write_segment(tmp_path, mixed_batches(n_batches=8))
    path.write_bytes(data + b"\x00\x01garbage" * 5)
    assert decode_segment_rows(path, len(data)) == reference_rows(data)


def test_size_bytes_cutting_a_batch_is_an_error(tmp_path: Path) -> None:
    batches = mixed_batches(n_batches=8)
    path, data = write_segment(tmp_path, batches)
    last_start = len(data) - len(batches[-1])
    for cut in (len(data) - 1, last_start + 30, last_start + 61, last_start + 5):
        with pytest.raises(SnapshotCorruptError) as info:
            list(decode_segment(path, cut, topic="t", partition=0))
        assert info.value.position == last_start
        assert str(path) in str(info.value)


def test_garbage_inside_size_bytes_is_an_error(tmp_path: Path) -> None:
    path, data = write_segment(tmp_path, mixed_batches(n_batches=8))
    for garbage in (b"\x00" * 30, b"\xff" * 70, bytes(encode_batch(10**6, [(b"k", b"v", T0, [])]))[:-1]):
        path.write_bytes(data + garbage)
        with pytest.raises(SnapshotCorruptError) as info:
            decode_segment_rows(path, len(data) + len(garbage))
        assert info.value.position == len(data)


def test_file_shorter_than_size_bytes(tmp_path: Path) -> None:
    path, data = write_segment(tmp_path, mixed_batches(n_batches=4))
    with pytest.raises(SnapshotCorruptError, match="file ends"):
        decode_segment_rows(path, len(data) + 10)


@pytest.mark.parametrize("where", ["crc", "magic", "length", "records"])
def test_corrupt_batches(tmp_path: Path, where: str) -> None:
    batches = [encode_batch(i * 20, [(b"k%d" % j, b"value" * j, T0 + j, []) for j in range(20)]) for i in range(3)]
    bad = batches[1]
    if where == "crc":
        bad[100] ^= 0x01
    elif where == "magic":
        bad[16] = 1
    elif where == "length":
        struct.pack_into(">i", bad, 8, 20)
    else:  # record framing broken under a valid CRC: the count says one more record
        struct.pack_into(">i", bad, 57, 21)
        struct.pack_into(">I", bad, 17, crc32c(bytes(bad[21:])))
    path, data = write_segment(tmp_path, batches)
    for method in METHODS:
        with forced(method), pytest.raises(SnapshotCorruptError) as info:
            decode_segment_rows(path, len(data))
        assert info.value.position == len(batches[0]), method


def test_offsets_going_backwards_is_corrupt(tmp_path: Path) -> None:
    batches = [encode_batch(10, [(b"k", b"v", T0, [])] * 5), encode_batch(12, [(b"k", b"v", T0, [])])]
    path, data = write_segment(tmp_path, batches)
    with pytest.raises(SnapshotCorruptError, match="below the previous"):
        decode_segment_rows(path, len(data))


def test_error_pickles() -> None:
    exc = pickle.loads(pickle.dumps(SnapshotCorruptError("/x/0.log", 77, "CRC mismatch")))
    assert (exc.path, exc.position, exc.reason) == ("/x/0.log", 77, "CRC mismatch")
    assert "byte 77" in str(exc)


# ---------------------------------------------------------------------------------------------
# property: any segment, any bounds, any method == the reference decoder

maybe_bytes = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=100, max_size=200))
record = st.tuples(
    maybe_bytes,
    maybe_bytes,
    st.integers(-(2**20), 2**20),
    st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=10))), max_size=3),
)
batch = st.tuples(st.lists(record, min_size=1, max_size=25), st.sampled_from(CODECS), st.booleans(), st.integers(0, 3))
maybe_bound = st.one_of(st.none(), st.integers(-5, 200))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(batch, min_size=1, max_size=12),
    st.sampled_from(METHODS),
    st.sampled_from([None, 300, 4096]),
    st.tuples(maybe_bound, maybe_bound),
    st.tuples(maybe_bound, maybe_bound),
    st.integers(1, 100),
)
def test_any_segment_decodes_like_the_reference(batches, method, window, offsets, times, max_rows) -> None:
    encoded = []
    offset = 0
    for records, codec, append_time, gap in batches:
        records = [(k, v, T0 + ts, h) for k, v, ts, h in records]
        encoded.append(encode_batch(offset, records, compression_type=codec, log_append_time=T0 + 7 if append_time else None))
        offset += len(records) + gap
    bounds = {"start_offset": offsets[0], "end_offset": offsets[1]}
    if times[0] is not None:
        bounds["start_ts"] = T0 + (times[0] - 100) * 10_000
    if times[1] is not None:
        bounds["end_ts"] = T0 + (times[1] - 100) * 10_000
    with tempfile.TemporaryDirectory() as tmp:
        path, data = write_segment(Path(tmp), encoded)
        with forced(method, window_bytes=window, strict=True):
            got = decode_segment_rows(path, len(data), max_rows_per_batch=max_rows, **bounds)
    assert got == reference_rows(data, **bounds)
