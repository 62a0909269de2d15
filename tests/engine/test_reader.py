"""Reads of damaged stored batches: every batch's CRC-32C is checked before it is decoded."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from engine import reader
from engine.config import LogConfig
from engine.dump import read_time_index
from engine.errors import CorruptDataError

from .helpers import append_records, running_log

T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=100)


async def _fill(directory: Path) -> list[tuple[int, bytes]]:
    """30 batches of 2 records over several segments."""
    written = []
    async with running_log(directory, CONFIG) as log:
        for i in range(30):
            values = [b"value-%03d-%d" % (i, j) + b"x" * 30 for j in range(2)]
            result = await append_records(log, [(b"k", v, T0 + i, []) for v in values])
            written += [(result.base_offset + j, v) for j, v in enumerate(values)]
    return written


def _damage_batch(directory: Path, segment_index: int, batch_index: int) -> tuple[int, int]:
    """Flip a byte inside a stored batch's records; returns its (first, last) offsets."""
    path = sorted(directory.glob("*.log"))[segment_index]
    data = bytearray(path.read_bytes())
    position = 0
    for _ in range(batch_index):
        position += int.from_bytes(data[position + 8 : position + 12], "big") + 12
    base = int.from_bytes(data[position : position + 8], "big")
    last = base + int.from_bytes(data[position + 23 : position + 27], "big")
    data[position + 75] ^= 0x20
    path.write_bytes(bytes(data))
    return base, last


@pytest.mark.parametrize("cached_only", [False, True])
async def test_a_damaged_batch_is_refused_not_decoded(tmp_path: Path, cached_only: bool) -> None:
    """Issue 11: after a clean restart (nothing scanned) a fetch served the altered value."""
    directory = tmp_path / "t-0"
    written = await _fill(directory)
    first, last = _damage_batch(directory, 1, 2)
    async with running_log(directory, CONFIG, clean_shutdown=True, recovery_point=len(written)) as log:
        assert log.load_stats.scanned_segments == 0
        with pytest.raises(CorruptDataError) as caught:
            reader.read_records(log.view, first + 1, 10, 10**6, cached_only=cached_only)
        assert (caught.value.first_offset, caught.value.last_offset) == (first, last)
        assert f"offsets {first}-{last}" in str(caught.value) and "CRC" in str(caught.value)
        # a read that starts before the damage returns the records up to it
        result = reader.read_records(log.view, 0, 10**6, 10**8, cached_only=cached_only)
        assert [(r.offset, r.value) for r in result.records] == written[:first]
        assert result.next_offset == first
        # and the records after it stay readable
        result = reader.read_records(log.view, last + 1, 10**6, 10**8, cached_only=cached_only)
        assert [(r.offset, r.value) for r in result.records] == written[last + 1 :]


async def test_partition_reads_count_the_damaged_batches_they_refuse(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    written = await _fill(directory)
    first, _last = _damage_batch(directory, 0, 1)
    async with running_log(directory, CONFIG, clean_shutdown=True, recovery_point=len(written)) as log:
        for _ in range(2):
            with pytest.raises(CorruptDataError):
                await log.read_records(first, 10, 10**6)
        assert log.corrupt_batches == {"recovery": 0, "read": 2}
        assert [r.offset for r in (await log.read_records(0, 100, 10**6)).records] == list(range(first))
        # raw slices are the Kafka client's to check, as in Kafka
        assert log.fetch_slice(first, 10**6).first_batch_offset == first


async def test_a_gap_at_the_end_of_the_log_moves_readers_to_the_high_watermark(tmp_path: Path) -> None:
    """Damage at the end leaves offsets no batch holds below the high watermark: a read there
    must not answer next_offset = offset for ever."""
    directory = tmp_path / "t-0"
    written = await _fill(directory)
    last_log = sorted(directory.glob("*.log"))[-1]
    data = bytearray(last_log.read_bytes())
    data[-10] ^= 0x01  # the last batch: whole frame, wrong CRC
    last_log.write_bytes(bytes(data))
    async with running_log(directory, CONFIG, recovery_point=0) as log:
        hw = log.high_watermark
        assert hw == len(written) and log.load_stats.corrupt_batches == 1
        result = reader.read_records(log.view, hw - 1, 10, 10**6)
        assert result.records == [] and result.next_offset == hw


# -- time index entries: which offset an entry names ------------------------------------------

# Four produced batches, index.interval.bytes 1 (every batch after the first gets entries):
# the largest timestamp of batch 1-3 is its first record's (offset 1), batch 4 ties it, and
# batch 5-7's largest is carried by offsets 6 and 7.
_TIME_BATCHES = [
    [(None, b"a", T0 + 1, [])],
    [(None, b"b", T0 + 9, []), (None, b"c", T0 + 5, []), (None, b"d", T0 + 2, [])],
    [(None, b"e", T0 + 9, [])],
    [(None, b"f", T0 + 3, []), (None, b"g", T0 + 12, []), (None, b"h", T0 + 12, [])],
]
_TIME_CONFIG = LogConfig(index_interval_bytes=1)


def _first_at_or_after(target: int) -> tuple[int, int] | None:
    stamps = [r[2] for batch in _TIME_BATCHES for r in batch]
    return next(((o, ts) for o, ts in enumerate(stamps) if ts >= target), None)


async def test_time_index_entries_name_the_last_offset_of_the_batch_with_the_max_timestamp(
    tmp_path: Path,
) -> None:
    """Kafka's rule since KAFKA-16310 (Kafka 3.8) and KAFKA-806: an entry names the last offset
    of the first batch that carried the largest timestamp so far, what a follower and a recovery
    scan find from the batch headers alone; older brokers named the record inside the batch on a
    leader's uncompressed appends (docs/FORMAT.md, "Time index"). The entries are the same at
    append and after a rebuild, and lookups by time still answer the record, not the batch's end."""
    directory = tmp_path / "t-0"
    async with running_log(directory, _TIME_CONFIG) as log:
        for batch in _TIME_BATCHES:
            await append_records(log, batch)
    tidx = directory / "00000000000000000000.timeindex"
    appended = read_time_index(tidx)
    # Kafka 2.x would have written (T0 + 9, 1), (T0 + 12, 6)
    assert appended == [(T0 + 9, 3), (T0 + 12, 7)]
    tidx.unlink()  # rebuilt by the recovery scan, from the batch headers
    async with running_log(directory, _TIME_CONFIG, recovery_point=0) as log:
        assert log.load_stats.scanned_segments == 1
        assert read_time_index(tidx) == appended
        for target in range(T0, T0 + 14):
            found = reader.offset_for_timestamp(log.view, target)
            assert found == _first_at_or_after(target), target
        assert reader.max_timestamp_offset(log.view) == (6, T0 + 12)
    assert read_time_index(tidx) == appended  # closing adds no entry: the largest is held already


async def test_time_lookups_use_a_kafka_2_time_index_that_names_records_inside_batches(
    tmp_path: Path,
) -> None:
    """A dir a Kafka 2.x broker closed cleanly keeps its indexes (no scan): entries that name
    the record carrying the timestamp, inside its batch, answer every lookup as ours do."""
    directory = tmp_path / "t-0"
    async with running_log(directory, _TIME_CONFIG) as log:
        for batch in _TIME_BATCHES:
            await append_records(log, batch)
    tidx = directory / "00000000000000000000.timeindex"
    kafka_2 = [(T0 + 9, 1), (T0 + 12, 6)]
    tidx.write_bytes(b"".join(struct.pack(">qi", ts, offset) for ts, offset in kafka_2))
    async with running_log(directory, _TIME_CONFIG, clean_shutdown=True, recovery_point=8) as log:
        segment = log.view.segments[-1]
        kept = [segment.time_index.entry(i) for i in range(segment.time_index.entries)]
        assert kept == kafka_2  # as found: no rebuild
        for target in range(T0, T0 + 14):
            found = reader.offset_for_timestamp(log.view, target)
            assert found == _first_at_or_after(target), target
        assert reader.max_timestamp_offset(log.view) == (6, T0 + 12)
        # appends go on after Kafka's entries
        await append_records(log, [(None, b"i", T0 + 20, [])])
        assert reader.offset_for_timestamp(log.view, T0 + 13) == (8, T0 + 20)
