"""The record of offsets recovery dropped (engine/dropped.py): its format, what recovery writes
to it, how a damaged one is rebuilt, and that every shard of a family reads it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from engine import dropped
from engine.checkpoints import RECOVERY_POINT, read_checkpoint, write_checkpoint
from engine.follower import FollowedPartition
from engine.log_dirs import CLEAN_SHUTDOWN_FILE
from engine.partition_log import PartitionLog
from engine.recovery import load_log
from engine.shards import owner_of

from .helpers import append_records, running_log
from .test_recovery import CONFIG, T0, _fill, _flip, _logs, _spans, _values
from .test_shards import family, produce


def test_ranges_merge_cross_and_round_trip() -> None:
    assert dropped.merge([(5, 7), (1, 2)], [(3, 4), (10, 12), (11, 11)]) == ((1, 7), (10, 12))
    assert dropped.merge([(1, 2), (4, 5)]) == ((1, 2), (4, 5))
    ranges = ((120, 130), (200, 201))
    assert dropped.crossing(ranges, 0, 119) == ()
    assert dropped.crossing(ranges, 0, 1000) == ranges
    assert dropped.crossing(ranges, 125, 200) == ((125, 130), (200, 200))
    assert dropped.describe(ranges) == "120-130, 200-201"
    assert dropped.format_ranges(ranges) == b"0\n2\n120 130\n200 201\n"
    assert dropped.parse(dropped.format_ranges(ranges)) == ranges
    assert dropped.parse(b"0\n0\n") == ()
    for bad in (b"", b"0\n", b"0\n2\n1 2\n", b"1\n0\n", b"0\n1\n5 4\n", b"0\n2\n5 9\n1 2\n", b"0\n1\n1 2", b"\xff\n"):
        with pytest.raises(ValueError):
            dropped.parse(bad)


async def test_recovery_records_a_dropped_batch_and_keeps_it_across_restarts(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    written = await _fill(directory)
    victim = _logs(directory)[1]
    position, _size = _spans(victim)[1]
    lost = int(victim.name[:20]) + 1
    _flip(victim, position + 70)
    async with running_log(directory, CONFIG, recovery_point=0) as log:
        assert log.load_stats.dropped_offsets == ((lost, lost),)
        assert log.dropped_offsets == ((lost, lost),)
        assert log.dropped_in(0, log.high_watermark - 1) == ((lost, lost),)
        assert log.dropped_in(lost + 1, log.high_watermark - 1) == ()
        assert _values(log) == [w for w in written if w[0] != lost]
    assert (directory / dropped.DROPPED_OFFSETS).read_bytes() == b"0\n1\n%d %d\n" % (lost, lost)
    async with running_log(directory, CONFIG, recovery_point=0) as log:  # nothing new: the record stays
        assert log.load_stats.dropped_offsets == () and log.dropped_offsets == ((lost, lost),)
    async with running_log(directory, CONFIG, clean_shutdown=True, recovery_point=len(written)) as log:
        assert log.dropped_offsets == ((lost, lost),)
        await log.delete_records(lost + 1)  # the log start passes it: reads say nothing of it
        assert log.dropped_in(0, log.high_watermark - 1) == ()
    async with running_log(directory, CONFIG, clean_shutdown=True, recovery_point=len(written), log_start_offset=lost + 1) as log:
        assert log.dropped_offsets == ()  # and the next load leaves it out of the file
    assert (directory / dropped.DROPPED_OFFSETS).read_bytes() == b"0\n0\n"


async def test_a_batch_whose_header_is_destroyed_is_recorded_from_its_neighbours(tmp_path: Path) -> None:
    """Its header says nothing (the length is gone): the offsets between the valid batches
    around it are what it took."""
    directory = tmp_path / "t-0"
    written = await _fill(directory)
    victim = _logs(directory)[2]
    position, _size = _spans(victim)[1]
    data = bytearray(victim.read_bytes())
    data[position + 8 : position + 12] = b"\x7f\xff\xff\xff"
    victim.write_bytes(bytes(data))
    lost = int(victim.name[:20]) + 1
    async with running_log(directory, CONFIG, recovery_point=0) as log:
        assert _values(log) == [w for w in written if w[0] != lost]
        assert log.dropped_offsets == ((lost, lost),)


async def test_the_gap_below_the_recovery_point_is_recorded(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    written = await _fill(directory)
    last = _logs(directory)[-1]
    data = bytearray(last.read_bytes())
    position = _spans(last)[-1][0]
    data[position + 8 : position + 12] = b"\x7f\xff\xff\xff"  # nothing valid after it: a tail
    last.write_bytes(bytes(data))
    async with running_log(directory, CONFIG, recovery_point=len(written)) as log:
        assert log.dropped_offsets == ((len(written) - 1, len(written) - 1),)
        assert (await append_records(log, [(b"k", b"after", T0, [])])).base_offset == len(written)
        assert log.dropped_in(0, log.high_watermark - 1) == ((len(written) - 1, len(written) - 1),)


async def test_a_torn_tail_that_was_never_acknowledged_is_not_recorded(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    await _fill(directory)
    last = _logs(directory)[-1]
    with open(last, "r+b") as f:
        f.truncate(last.stat().st_size - 7)
    async with running_log(directory, CONFIG, recovery_point=0) as log:
        assert log.load_stats.truncated_bytes > 0 and log.dropped_offsets == ()
    assert not (directory / dropped.DROPPED_OFFSETS).exists()


@pytest.mark.parametrize("damage", ["garbage", "empty", "missing"])
async def test_a_damaged_or_missing_record_is_rebuilt_from_the_damaged_files(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture,
) -> None:
    directory = tmp_path / "t-0"
    written = await _fill(directory)
    victims = _logs(directory)[1:3]
    lost = []
    for victim in victims:
        position, _size = _spans(victim)[1]
        _flip(victim, position + 70)
        lost.append(int(victim.name[:20]) + 1)
    async with running_log(directory, CONFIG, recovery_point=0) as log:
        assert log.dropped_offsets == tuple((o, o) for o in lost)
    path = directory / dropped.DROPPED_OFFSETS
    if damage == "garbage":
        path.write_bytes(b"0\n3\n1 x\n")
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
    caplog.set_level(logging.WARNING, "eventlog.recovery")
    async with running_log(directory, CONFIG, clean_shutdown=True, recovery_point=len(written)) as log:  # starts
        assert log.dropped_offsets == tuple((o, o) for o in lost)
        assert _values(log) == [w for w in written if w[0] not in lost]
    assert dropped.read(directory) == tuple((o, o) for o in lost)
    if damage != "missing":
        assert f"{dropped.DROPPED_OFFSETS} is damaged" in caplog.text
    # without the .damaged files there is nothing to rebuild from: no ranges, still a start
    for aside in directory.glob("*.damaged"):
        aside.unlink()
    path.write_bytes(b"\x00" * 5)
    loaded = load_log(directory, CONFIG, clean_shutdown=True, recovery_point=len(written), log_start_offset=0, now_ms=T0)
    assert loaded.dropped_offsets == () and dropped.read(directory) == ()
    for s in loaded.segments:
        s.close()


async def test_a_crash_between_the_repair_and_the_record_loses_no_range(tmp_path: Path) -> None:
    """The segment was repaired (its .damaged file kept) but the record not yet written: the
    next start, which finds nothing to drop, takes the range from the .damaged file newer than
    the record."""
    directory = tmp_path / "t-0"
    written = await _fill(directory)
    dropped.write(directory, ((2, 2),))  # recorded by an earlier recovery
    os.utime(directory / dropped.DROPPED_OFFSETS, ns=(10**18, 10**18))
    victim = _logs(directory)[1]
    position, _size = _spans(victim)[1]
    _flip(victim, position + 70)
    lost = int(victim.name[:20]) + 1
    async with running_log(directory, CONFIG, recovery_point=0) as log:
        assert log.dropped_offsets == ((2, 2), (lost, lost))
    dropped.write(directory, ((2, 2),))  # as if the crash came before this write
    os.utime(directory / dropped.DROPPED_OFFSETS, ns=(10**18, 10**18))  # older than the .damaged file
    async with running_log(directory, CONFIG, clean_shutdown=True, recovery_point=len(written)) as log:
        assert log.load_stats.dropped_offsets == () and log.dropped_offsets == ((2, 2), (lost, lost))
    assert dropped.read(directory) == ((2, 2), (lost, lost))


def _crashed(data: Path, topic: str, partition: int) -> None:
    """As after a crash before any checkpoint of `topic`-`partition`: no clean-shutdown marker,
    its recovery point 0 (recovery scans all of it)."""
    (data / CLEAN_SHUTDOWN_FILE).unlink()
    path = data / RECOVERY_POINT
    entries = read_checkpoint(path)
    entries[(topic, partition)] = 0
    write_checkpoint(path, entries)


async def test_every_shard_of_a_family_says_which_offsets_recovery_dropped(tmp_path: Path) -> None:
    async with family(tmp_path) as (s0, s1):
        await s0.create_topic("d", 2, {"segment.bytes": 400})
        owner = owner_of("d", 0, 2)
        for i in range(20):
            await produce((s0, s1)[owner], "d", 0, [b"value-%03d" % i + b"x" * 40])
    directory = tmp_path / "d-0"
    victim = _logs(directory)[1]
    position, _size = _spans(victim)[1]
    _flip(victim, position + 70)
    lost = int(victim.name[:20]) + 1
    _crashed(tmp_path, "d", 0)
    async with family(tmp_path) as shards:
        mine, other = shards[owner], shards[1 - owner]
        log, followed = mine.partition("d", 0), other.partition("d", 0)
        assert isinstance(log, PartitionLog) and isinstance(followed, FollowedPartition)
        assert log.dropped_offsets == ((lost, lost),)
        assert followed.dropped_in(0, followed.high_watermark - 1) == ((lost, lost),)
        assert followed.dropped_in(lost + 1, followed.high_watermark - 1) == ()
        assert mine.partition("d", 1).dropped_offsets == () and other.partition("d", 1).dropped_offsets == ()
