"""Fuzzing the readers of on-disk files: the batch scanner, both indexes, segment recovery and
the loader, checkpoint files and snapshot manifests. Damaged files give the project's own
errors (engine/errors.py) or are repaired by recovery (truncated at the first invalid batch),
never another exception, a hang or a huge allocation."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from engine import filenames
from engine.checkpoints import format_checkpoint, read_checkpoint
from engine.config import LogConfig
from engine.errors import (
    CorruptBatchError,
    CorruptIndexError,
    CorruptSegmentError,
    EngineError,
    StorageError,
)
from engine.format import scan_valid_prefix
from engine.offset_index import OffsetIndex
from engine.records import encode_batch
from engine.recovery import load_log
from engine.scan import BatchScanner, scan_headers
from engine.segment import LogSegment
from engine.snapshots import list_snapshots, read_manifest, summary
from engine.time_index import TimeIndex

from .support import fuzz_settings, mutated, only, valid_batches

MAX_INDEX_BYTES = 4096


@contextmanager
def scratch_dir() -> Iterator[Path]:
    """A fresh directory per example (Hypothesis runs many examples in one test call)."""
    path = Path(tempfile.mkdtemp(prefix="eventlog-fuzz-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _file_bytes(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


index_bytes = st.one_of(
    st.binary(max_size=200),
    st.lists(
        st.tuples(
            st.integers(-(2**31), 2**31 - 1) | st.sampled_from([0, 1, 2, 61, 100, 4096]),
            st.integers(-(2**31), 2**31 - 1) | st.sampled_from([0, 1, 61, 122, 4096]),
        ),
        max_size=20,
    ).map(lambda entries: b"".join(struct.pack(">ii", a, b) for a, b in sorted(entries))),
)
time_index_bytes = st.one_of(
    st.binary(max_size=240),
    st.lists(
        st.tuples(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 2**41), st.integers(-(2**31), 2**31 - 1) | st.integers(0, 100)),
        max_size=20,
    ).map(lambda entries: b"".join(struct.pack(">qi", a, b) for a, b in sorted(entries))),
)


# -- the batch scanner -------------------------------------------------------------------------


@fuzz_settings(150)
@given(
    log=mutated(valid_batches()),
    chunk_bytes=st.sampled_from([None, 61, 100, 333, 4096]),
    with_data=st.booleans(),
)
def test_batch_scanner_stops_at_the_first_invalid_batch(log, chunk_bytes, with_data):
    with scratch_dir() as d:
        path = d / "garbage.log"
        path.write_bytes(log)
        fd = os.open(path, os.O_RDONLY)
        try:
            scanner = BatchScanner(fd, with_data=with_data, chunk_bytes=chunk_bytes)
            headers, _ = only((), lambda: ([h for h, _ in scanner], None))[0]
            only(CorruptBatchError, lambda: list(scan_headers(fd, 0, len(log), chunk_bytes or 8192)))
        finally:
            os.close(fd)
    assert 0 <= scanner.valid_end <= len(log)
    assert (scanner.error is None) == (scanner.valid_end == len(log))
    if with_data:  # the torn-tail rule: the valid prefix is exactly what format.py accepts
        prefix_headers, valid, _ = scan_valid_prefix(log)
        assert valid == scanner.valid_end
        assert [h.position for h in prefix_headers] == [h.position for h in headers]


# -- the indexes -------------------------------------------------------------------------------


@fuzz_settings(120)
@given(
    data=index_bytes,
    size_delta=st.sampled_from([0, 0, 0, 8, -8, 3]),
    base=st.integers(0, 2**40),
    target=st.integers(-(2**63), 2**63 - 1) | st.integers(0, 5000),
    log_size=st.integers(0, 2**31),
)
def test_offset_index_over_garbage(data, size_delta, base, target, log_size):
    """Lookups answer (they trust the entries; sanity_check is the gate), sanity_check raises
    CorruptIndexError, and a size that disagrees with the file is a StorageError."""
    with scratch_dir() as d:
        path = d / "00000000000000000000.index"
        path.write_bytes(data)
        index, _ = only(CorruptIndexError, OffsetIndex.open_read_only, path, base, MAX_INDEX_BYTES, max(len(data) + size_delta, 0))
        if index is None:
            return
        for call in (index.lookup, index.lookup_position):
            only(StorageError, call, target)
        only(StorageError, index.last_entry_from_file)
        only(StorageError, index.last_entry)
        _, error = only(StorageError, index.sanity_check, log_size)
        if error is None and index.entries and size_delta == 0:
            offsets = [index.entry(i)[0] for i in range(index.entries)]
            assert offsets == sorted(set(offsets))
        index.release()


@fuzz_settings(120)
@given(
    data=time_index_bytes,
    size_delta=st.sampled_from([0, 0, 0, 12, -12, 5]),
    target=st.integers(-(2**63), 2**63 - 1),
    next_offset=st.none() | st.integers(0, 2**31),
)
def test_time_index_over_garbage(data, size_delta, target, next_offset):
    with scratch_dir() as d:
        path = d / "00000000000000000000.timeindex"
        path.write_bytes(data)
        index, _ = only(CorruptIndexError, TimeIndex.open_read_only, path, 0, MAX_INDEX_BYTES, max(len(data) + size_delta, 0))
        if index is None:
            return
        only(StorageError, index.lookup_before, target)
        only(StorageError, index.last_entry_from_file)
        only(StorageError, index.sanity_check, next_offset)
        index.release()


# -- segments: reads, recovery and the loader --------------------------------------------------


def _write_segment(d: Path, base: int, log: bytes, index: bytes | None, time_index: bytes | None) -> None:
    log_path, index_path, time_path = filenames.segment_files(d, base)
    log_path.write_bytes(log)
    if index is not None:
        index_path.write_bytes(index)
    if time_index is not None:
        time_path.write_bytes(time_index)


def _assert_recovered(d: Path, segment: LogSegment) -> None:
    """After recovery the .log holds only whole, valid batches and the indexes pass."""
    data = _file_bytes(segment.log_path)
    headers, valid, reason = scan_valid_prefix(data)
    assert (valid, reason) == (len(data), None)
    assert segment.size == len(data)
    offsets = [h.base_offset for h in headers]
    assert offsets == sorted(offsets)
    segment.sanity_check()


@fuzz_settings(80)
@given(
    log=mutated(valid_batches()),
    index=st.none() | index_bytes,
    time_index=st.none() | time_index_bytes,
    offset=st.integers(0, 2000),
    timestamp=st.integers(-1, 2**41),
)
def test_closed_segment_reads_over_garbage(log, index, time_index, offset, timestamp):
    """A damaged closed segment: reads raise EngineError subclasses (CorruptSegmentError and
    friends) or answer; they never crash or loop."""
    with scratch_dir() as d:
        _write_segment(d, 0, log, index, time_index)
        segment, _ = only(CorruptIndexError, LogSegment.open_existing, d, 0, max_index_bytes=MAX_INDEX_BYTES)
        if segment is None:
            return
        segment.index_interval_bytes = 64
        only(EngineError, segment.find_batch, offset, segment.size)
        only(EngineError, segment.find_timestamp, timestamp, offset, segment.size)
        first, _ = only(EngineError, segment.find_batch, 0, segment.size)
        if first is not None:
            only(EngineError, segment.batch_end_within, first, segment.size // 2, segment.size)
        only(EngineError, lambda: segment.max_timestamp)
        segment.close()


@pytest.mark.parametrize(("segment_base", "batch_base"), [(0, 2**40), (0, 2**31), (1000, 10)])
def test_rebuilding_the_indexes_of_a_segment_whose_offsets_do_not_fit(segment_base, batch_base):
    """Found by a long run: the lazy index rebuild of a closed segment packed a relative offset
    outside int32 (a struct.error) when a batch's offsets did not belong to the segment."""
    with scratch_dir() as d:
        log = encode_batch(batch_base, [(b"k", b"v", 1_000, [])])
        _write_segment(d, segment_base, bytes(log), bytes(8), b"")  # an entry that fails sanity_check
        segment = LogSegment.open_existing(d, segment_base, max_index_bytes=MAX_INDEX_BYTES)
        _, error = only(EngineError, segment.find_batch, segment_base, segment.size)
        assert isinstance(error, CorruptSegmentError), error
        segment.close()


@fuzz_settings(80)
@given(
    log=mutated(valid_batches()),
    index=st.none() | index_bytes,
    time_index=st.none() | time_index_bytes,
    active=st.booleans(),
)
def test_segment_recovery_truncates_garbage(log, index, time_index, active):
    with scratch_dir() as d:
        _write_segment(d, 0, log, b"" if index is None else index, b"" if time_index is None else time_index)
        segment, _ = only(CorruptIndexError, LogSegment.open_existing, d, 0, max_index_bytes=MAX_INDEX_BYTES)
        if segment is None:  # an index of an impossible size: the loader empties it first
            for path in filenames.segment_files(d, 0)[1:]:
                path.write_bytes(b"")
            segment = LogSegment.open_existing(d, 0, max_index_bytes=MAX_INDEX_BYTES)
        result, _ = only((), segment.recover, 64, active=active, max_index_bytes=MAX_INDEX_BYTES)
        assert result.valid_bytes + result.truncated_bytes == len(log)
        assert (result.error is None) == (result.truncated_bytes == 0)
        _assert_recovered(d, segment)
        again = segment.recover(64, active=active, max_index_bytes=MAX_INDEX_BYTES)
        assert again.truncated_bytes == 0 and again.valid_bytes == result.valid_bytes
        segment.close()


@fuzz_settings(40)
@given(
    logs=st.lists(mutated(valid_batches(), max_mutations=2), min_size=1, max_size=3),
    clean_shutdown=st.booleans(),
    recovery_point=st.integers(0, 3000),
)
def test_loading_a_damaged_partition_dir(logs, clean_shutdown, recovery_point):
    """Segments of mutated batches, at base offsets 0, 1000, 2000: the loader keeps a valid
    prefix and leaves a usable active segment, or raises an EngineError."""
    with scratch_dir() as d:
        for i, log in enumerate(logs):
            _write_segment(d, i * 1000, log, b"", b"")
        loaded, _ = only(
            EngineError, load_log, d, LogConfig(index_interval_bytes=64, segment_index_bytes=MAX_INDEX_BYTES),
            clean_shutdown=clean_shutdown, recovery_point=recovery_point, log_start_offset=0, now_ms=0,
        )
        if loaded is None:
            return
        assert loaded.segments and loaded.segments[-1].offset_index.appendable
        assert loaded.log_start_offset <= loaded.next_offset
        if not clean_shutdown:  # every scanned segment was repaired
            for segment in loaded.segments:
                if segment.base_offset >= recovery_point - 1000:
                    data = _file_bytes(segment.log_path)
                    assert scan_valid_prefix(data)[1:] == (len(data), None)
        for segment in loaded.segments:
            segment.close()


# -- checkpoints -------------------------------------------------------------------------------

checkpoint_text = st.dictionaries(
    st.tuples(st.from_regex(r"[a-z._-]{1,12}", fullmatch=True), st.integers(0, 100)),
    st.integers(-1, 2**63 - 1),
    max_size=5,
).map(lambda entries: format_checkpoint(entries).encode("utf-8"))


@fuzz_settings(150)
@given(data=mutated(checkpoint_text) | st.binary(max_size=100))
@example(data=b"0\n1\nt\xff 0 5\n")  # not UTF-8: was a UnicodeDecodeError
@example(data=b"0\n99999999999999999999\n")
@example(data=b"0\n-3\n")
def test_checkpoint_files_read_or_raise_storage_error(data):
    with scratch_dir() as d:
        path = d / "recovery-point-offset-checkpoint"
        path.write_bytes(data)
        entries, _ = only(StorageError, read_checkpoint, path)
    if entries is not None:
        assert all(isinstance(t, str) and isinstance(p, int) and isinstance(o, int) for (t, p), o in entries.items())


# -- snapshot manifests ------------------------------------------------------------------------

SNAPSHOT_ID = "20260101T000000000Z-00a0f1"


MANIFEST = orjson.dumps({
    "format_version": 1,
    "snapshot_id": SNAPSHOT_ID,
    "created_at": "2026-01-01T00:00:00Z",
    "topics": [{"name": "orders", "partitions": [{"partition": 0, "log_start_offset": 0,
                                                  "high_watermark": 3, "segments": [{"size_bytes": 10}]}]}],
})


@fuzz_settings(100)
@given(data=mutated(st.just(MANIFEST)) | st.binary(max_size=64))
@example(data=b"{")
@example(data=b"[]")
@example(data=b"\xff")
def test_garbage_manifest_is_a_storage_error(data):
    with scratch_dir() as root:
        (root / SNAPSHOT_ID).mkdir()
        (root / SNAPSHOT_ID / "manifest.json").write_bytes(data)
        manifest, _ = only(StorageError, read_manifest, root, SNAPSHOT_ID)
        if manifest is not None:
            summary(manifest, root)  # what GET /v1/snapshots/{id} does with it
        only(StorageError, list_snapshots, root)


def test_a_written_manifest_reads_back(tmp_path):
    """The check above must not refuse what this module writes (the mutations start from it)."""
    (tmp_path / SNAPSHOT_ID).mkdir()
    (tmp_path / SNAPSHOT_ID / "manifest.json").write_bytes(MANIFEST)
    assert summary(read_manifest(tmp_path, SNAPSHOT_ID), tmp_path)["id"] == SNAPSHOT_ID
