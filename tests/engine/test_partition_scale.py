"""Costs that stay flat as partitions grow (issue 28): a clean stop fsyncs only what changed
since the start (an untouched partition costs no fsync, so a stop with many partitions is not
tens of thousands of fsyncs), and whatever was written is still made durable on close."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine import index_file, segment
from engine.config import LogConfig

from .helpers import FakeClock, append_records, running_log


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every fsync and fdatasync the segment and index layers make, by whom."""
    calls: list[str] = []
    real_fsync, real_fdatasync = os.fsync, segment.fdatasync

    def fsync(fd: int) -> None:
        calls.append("index")
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        calls.append("log")
        real_fdatasync(fd)

    monkeypatch.setattr(index_file.os, "fsync", fsync)
    monkeypatch.setattr(segment, "fdatasync", fdatasync)
    return calls


async def test_closing_an_untouched_partition_syncs_nothing(
    tmp_path: Path, syncs: list[str]
) -> None:
    clock = FakeClock()
    config = LogConfig(index_interval_bytes=1)  # an index entry for every batch
    async with running_log(tmp_path, config, clock=clock) as log:
        for i in range(5):
            await append_records(log, [(None, b"v%d" % i, clock(), ())])
    assert "log" in syncs and "index" in syncs  # written: synced, and the indexes on close
    syncs.clear()
    async with running_log(tmp_path, config, clock=clock, clean_shutdown=True) as log:
        assert log.high_watermark == 5
    assert syncs == []  # nothing changed since the start: nothing to make durable
    async with running_log(tmp_path, config, clock=clock, clean_shutdown=True) as log:
        for value in (b"after", b"and after"):  # the second batch gets index entries
            clock.now += 1000
            await append_records(log, [(None, value, clock(), ())])
    assert syncs.count("log") >= 1 and syncs.count("index") == 2  # both indexes changed
    async with running_log(tmp_path, config, clock=clock, clean_shutdown=True) as log:
        assert log.high_watermark == 7
        got = await log.read_records(0, 100, 1 << 20)
        want = [b"v%d" % i for i in range(5)] + [b"after", b"and after"]
        assert [r.value for r in got.records] == want
