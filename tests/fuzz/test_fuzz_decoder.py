"""Fuzzing analytics/decoder.py, the vectorised segment decoder Spark reads snapshots with: a
damaged segment raises SnapshotCorruptError (its documented error), never another exception,
a hang, or an allocation sized by a lying count or length."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from analytics.decoder import (
    SnapshotCorruptError,
    decode_segment,
    decode_segment_keys,
    decode_segment_rows,
)
from engine import compression
from engine.errors import CorruptBatchError
from engine.format import iter_batches
from engine.records import decode_records

from .support import fix_crc, frame_batch, fuzz_settings, mutated, only, valid_batch, valid_batches


def _decode(data: bytes, size: int | None = None, **bounds) -> list:
    directory = Path(tempfile.mkdtemp(prefix="eventlog-fuzz-"))
    try:
        path = directory / "00000000000000000000.log"
        path.write_bytes(data)
        size = len(data) if size is None else size
        rows = []
        for batch in decode_segment(path, size, topic="t", partition=0, max_rows_per_batch=7, **bounds):
            assert batch.num_rows > 0
            rows.extend(batch.column("offset").to_pylist())
        keys = sum(len(k) for k, _, _ in decode_segment_keys(path, size, **bounds))
        assert keys == len(rows)
        return decode_segment_rows(path, size, **bounds)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _engine_rows(data: bytes) -> list[tuple]:
    """The same bytes through engine/records.py, the reference decoder. Header keys that are
    not UTF-8 become U+FFFD in Arrow strings (as documented), surrogate escapes in the engine."""
    rows = []
    for header in iter_batches(data):
        for r in decode_records(data, header):
            headers = tuple((k.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), v) for k, v in r.headers)
            rows.append((r.offset, r.timestamp, r.key, r.value, headers))
    return rows


@fuzz_settings(50)
@given(data=valid_batches())
def test_valid_segments_decode_as_the_engine_decodes_them(data):
    assert _decode(bytes(data)) == _engine_rows(bytes(data))


bounds = st.fixed_dictionaries(
    {},
    optional={
        "start_offset": st.integers(0, 2000),
        "end_offset": st.integers(0, 2000),
        "start_ts": st.integers(0, 2**41),
        "end_ts": st.integers(0, 2**41),
    },
)


@fuzz_settings(150)
@given(data=mutated(valid_batches()), bounds=bounds, size_delta=st.sampled_from([0, 0, 0, -1, 5]))
def test_damaged_segments_raise_only_snapshot_corrupt(data, bounds, size_delta):
    """size_delta: a manifest size below the file (a live segment grew) or above it (torn)."""
    only(SnapshotCorruptError, _decode, bytes(data), max(len(data) + size_delta, 0), **bounds)


@fuzz_settings(150)
@given(buf=mutated(valid_batch().map(lambda b: b[0])))
def test_damaged_records_behind_a_valid_crc_raise_only_snapshot_corrupt(buf):
    fix_crc(buf)
    rows, _ = only(SnapshotCorruptError, _decode, bytes(buf))
    if rows is not None:  # what the vectorised decoder accepts, the engine decodes the same way
        engine_rows, error = only(CorruptBatchError, _engine_rows, bytes(buf))
        if error is None:
            assert rows == engine_rows


@fuzz_settings(100)
@given(
    payload=st.binary(max_size=300),
    codec=st.sampled_from([0, 1, 2, 3, 4]),
    count=st.sampled_from([1, 2, 1000, 2**31 - 1]) | st.integers(1, 2**31 - 1),
)
@example(payload=b"\x0c" + bytes(6), codec=0, count=2**31 - 1)  # one record, a count of 2^31 - 1
@example(payload=b"\x0c" + bytes(6), codec=4, count=2**30)
@example(payload=b"", codec=0, count=1)  # an empty block: was an IndexError in _starts_candidates
def test_lying_record_counts_are_corrupt_not_allocated(payload, codec, count):
    """Regression: a tiny batch claiming 2^31 - 1 records made the decoder build index arrays
    of that many entries (16 GiB each) before checking a single record."""
    block = payload if codec == 0 else compression.compress(codec, payload)
    only(SnapshotCorruptError, _decode, bytes(frame_batch(block, attributes=codec, count=count)))
