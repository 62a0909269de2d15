"""Offset and time indexes against a model: a sorted list and bisect."""

from __future__ import annotations

import bisect
import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import CorruptIndexError
from engine.format import NO_TIMESTAMP
from engine.index_file import WARM_SECTION_BYTES
from engine.offset_index import OffsetIndex
from engine.time_index import TimeIndex

BASE = 1_000


def _offset_entries(draw_gaps: list[int]) -> list[tuple[int, int]]:
    entries, offset, position = [], BASE, 0
    for gap in draw_gaps:
        offset += gap
        position += gap * 10 + 1
        entries.append((offset, position))
    return entries


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), max_size=3000), st.lists(st.integers(BASE - 5, BASE + 200_000), max_size=50))
def test_offset_index_lookup_matches_bisect(tmp_path_factory, gaps, targets) -> None:
    path = tmp_path_factory.mktemp("idx") / "00000000000000001000.index"
    index = OffsetIndex.create_appendable(path, BASE, 64 * 1024)
    entries = _offset_entries(gaps)[: index.max_entries]
    for offset, position in entries:
        index.append(offset, position)
    offsets = [o for o, _ in entries]
    for check in (index,):
        for target in targets + offsets[:5] + offsets[-5:]:
            i = bisect.bisect_right(offsets, target) - 1
            expected = entries[i] if i >= 0 else (BASE, 0)
            assert check.lookup(target) == expected
    # trimmed to exactly its entries, then looked up again through a fresh read-only mapping
    index.close_for_append()
    assert path.stat().st_size == len(entries) * 8
    reopened = OffsetIndex.open_read_only(path, BASE, 64 * 1024, path.stat().st_size)
    positions = [p for _, p in entries]
    for target in targets:
        i = bisect.bisect_right(offsets, target) - 1
        assert reopened.lookup(target) == (entries[i] if i >= 0 else (BASE, 0))
        j = bisect.bisect_right(positions, target) - 1
        assert reopened.lookup_position(target) == (entries[j] if j >= 0 else (BASE, 0))
    reopened.sanity_check(log_size=positions[-1] + 1 if positions else 0)


def test_warm_section_and_cold_section_both_answer(tmp_path: Path) -> None:
    index = OffsetIndex.create_appendable(tmp_path / "0.index", 0, 1024 * 1024)
    n = 10 * WARM_SECTION_BYTES // 8
    for i in range(1, n + 1):
        index.append(i * 3, i * 100)
    assert index.lookup(5) == (3, 100)  # cold
    assert index.lookup(n * 3 - 1) == ((n - 1) * 3, (n - 1) * 100)  # warm
    assert index.lookup(n * 3 + 50) == (n * 3, n * 100)  # past the end: last entry
    assert index.lookup(2) == (0, 0)  # below the first entry: segment start


def test_empty_index_lookups(tmp_path: Path) -> None:
    index = OffsetIndex.create_appendable(tmp_path / "0.index", 7, 1024)
    assert index.lookup(100) == (7, 0)
    assert index.lookup_position(100) == (7, 0)
    index.close_for_append()
    assert (tmp_path / "0.index").stat().st_size == 0
    ro = OffsetIndex.open_read_only(tmp_path / "0.index", 7, 1024, 0)
    assert ro.lookup(100) == (7, 0)
    assert len(ro.view()) == 0


def test_offsets_must_increase(tmp_path: Path) -> None:
    index = OffsetIndex.create_appendable(tmp_path / "0.index", 0, 1024)
    index.append(10, 100)
    with pytest.raises(CorruptIndexError):
        index.append(10, 200)


def test_full_index_and_no_preallocation(tmp_path: Path) -> None:
    """The active index is never a sparse preallocated file (a full disk made writes through
    its mapping raise SIGBUS): the file holds exactly the entries written so far."""
    path = tmp_path / "0.index"
    index = OffsetIndex.create_appendable(path, 0, 80)
    assert path.stat().st_size == 0
    for i in range(1, 10):
        index.append(i, i * 10)
    assert path.stat().st_size == 0 and index.pending_entries == 9  # written with the batches
    index.write_pending()
    assert path.stat().st_size == 72 and index.pending_entries == 0
    assert not index.is_full  # one entry short of full
    index.append(10, 100)
    assert index.is_full
    with pytest.raises(CorruptIndexError, match="full"):
        index.append(11, 110)
    index.close_for_append()
    assert path.read_bytes() == b"".join(struct.pack(">ii", i, i * 10) for i in range(1, 11))


def test_an_undone_append_is_overwritten_and_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "0.index"
    index = OffsetIndex.create_appendable(path, 0, 1024)
    for i in range(1, 6):
        index.append(i, i * 10)
    index.write_pending()
    index.truncate_entries(3)  # an undone group commit: entries 4 and 5 were never published
    index.append(7, 70)
    index.write_pending()
    assert index.lookup(100) == (7, 70)
    index.close_for_append()
    assert path.read_bytes() == b"".join(struct.pack(">ii", o, o * 10) for o in (1, 2, 3, 7))


def test_reopened_for_append_reads_entries_back_and_ignores_a_zero_tail(tmp_path: Path) -> None:
    """A preallocated file (an older eventlog's or Kafka's active index) ends at the first
    all-zero entry after the first."""
    path = tmp_path / "0.index"
    path.write_bytes(struct.pack(">ii", 0, 0) + struct.pack(">ii", 4, 4100) + bytes(8 * 50))
    index = OffsetIndex.open_read_only(path, 0, 1024, path.stat().st_size)
    index.open_for_append()
    assert index.entries == 2 and index.lookup(9) == (4, 4100)
    index.append(9, 9000)
    index.close_for_append()
    assert path.stat().st_size == 24


def test_a_mapped_read_only_index_holds_no_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "0.index"
    index = OffsetIndex.create_appendable(path, 0, 4096)
    for i in range(1, 200):
        index.append(i, i * 10)
    index.close_for_append()
    before = len(os.listdir("/proc/self/fd"))
    readers = [OffsetIndex.open_read_only(path, 0, 4096, path.stat().st_size) for _ in range(50)]
    assert all(r.lookup(150) == (150, 1500) for r in readers)
    assert len(os.listdir("/proc/self/fd")) == before


def test_time_index_keeps_a_slot_for_the_final_entry(tmp_path: Path) -> None:
    index = TimeIndex.create_appendable(tmp_path / "0.timeindex", 0, 36)  # 3 entries
    assert index.maybe_append(100, 1)
    assert not index.is_full
    assert index.maybe_append(200, 2)
    assert index.is_full  # entries >= max - 1
    assert index.maybe_append(300, 3, skip_full_check=True)
    assert index.entries == 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 20)), max_size=2000), st.lists(st.integers(-5, 1_200_000), max_size=40))
def test_time_index_lookup_before_matches_model(tmp_path_factory, steps, targets) -> None:
    path = tmp_path_factory.mktemp("tidx") / "0.timeindex"
    index = TimeIndex.create_appendable(path, 0, 12 * 5000)
    model: list[tuple[int, int]] = []
    ts, offset = 0, 0
    for dts, doff in steps:
        ts += dts
        offset += doff
        if index.maybe_append(ts, offset):
            model.append((ts, offset))
        else:
            assert dts == 0 or (model and ts <= model[-1][0])
    stamps = [t for t, _ in model]
    for target in targets:
        i = bisect.bisect_left(stamps, target) - 1  # greatest entry with timestamp < target
        assert index.lookup_before(target) == (model[i] if i >= 0 else (NO_TIMESTAMP, 0))
    assert index.last_entry() == (model[-1] if model else (NO_TIMESTAMP, 0))
    index.sanity_check()


def test_sanity_checks_catch_corruption(tmp_path: Path) -> None:
    path = tmp_path / "0.index"
    index = OffsetIndex.create_appendable(path, 0, 1024)
    index.append(5, 100)
    index.append(9, 200)
    index.close_for_append()
    data = bytearray(path.read_bytes())
    data[12:16] = (50).to_bytes(4, "big")  # second position below the first
    path.write_bytes(bytes(data))
    ro = OffsetIndex.open_read_only(path, 0, 1024, len(data))
    with pytest.raises(CorruptIndexError):
        ro.sanity_check(log_size=1000)
    good = OffsetIndex.create_appendable(tmp_path / "1.index", 0, 1024)
    good.append(5, 100)
    with pytest.raises(CorruptIndexError, match="past the log size"):
        good.sanity_check(log_size=50)
    with pytest.raises(CorruptIndexError, match="multiple"):
        OffsetIndex.open_read_only(path, 0, 1024, 13)


def test_entries_read_from_file_bytes_preallocated_or_trimmed(tmp_path: Path) -> None:
    """dump-log reads loose index files through the index classes' own entry layouts."""
    offsets = OffsetIndex.create_appendable(tmp_path / "0.index", BASE, 800)
    times = TimeIndex.create_appendable(tmp_path / "0.timeindex", BASE, 840)
    for i in range(1, 6):
        offsets.append(BASE + 10 * i, 100 * i)
        assert times.maybe_append(5_000 + i, BASE + 10 * i)
    offsets.flush()
    times.flush()
    want_offsets = [(BASE + 10 * i, 100 * i) for i in range(1, 6)]
    want_times = [(5_000 + i, BASE + 10 * i) for i in range(1, 6)]
    # preallocated (a crashed broker's active segment): the zero tail is not entries
    index_bytes = (tmp_path / "0.index").read_bytes()
    time_bytes = (tmp_path / "0.timeindex").read_bytes()
    assert OffsetIndex.read_entries(index_bytes + bytes(800 - len(index_bytes)), BASE) == want_offsets
    assert TimeIndex.read_entries(time_bytes + bytes(840 - len(time_bytes)), BASE) == want_times
    offsets.close_for_append()
    times.close_for_append()
    data = (tmp_path / "0.index").read_bytes()
    assert len(data) == 40
    assert OffsetIndex.read_entries(data, BASE) == want_offsets
    assert OffsetIndex.read_entries(data + b"\x01\x02\x03", BASE) == want_offsets  # a partial entry
    assert TimeIndex.read_entries((tmp_path / "0.timeindex").read_bytes(), BASE) == want_times
    assert OffsetIndex.read_entries(b"", BASE) == []
