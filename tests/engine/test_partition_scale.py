"""Costs that stay flat as partitions grow (issue 28): a clean stop fsyncs only what changed
since the start (an untouched partition costs no fsync, so a stop with many partitions is not
tens of thousands of fsyncs), and whatever was written is still made durable on close."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from engine import index_file, segment
from engine.config import LogConfig
from engine.errors import StorageError
from engine.log_manager import LOAD_CHUNK, EngineConfig, open_engine
from engine.partition_log import CLOSE_CHUNK, CLOSE_HOPS, closes_for

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


PARTITIONS = 150  # 3 topics of 50: more than two load chunks and two close chunks


async def _make_partitions(data: Path) -> None:
    async with open_engine(EngineConfig(log_dirs=(data,))) as engine:
        for t in range(PARTITIONS // 50):
            await engine.create_topic(f"t{t}", 50)
        log = engine.partition("t0", 7)
        await append_records(log, [(b"k", b"v", 1_700_000_000_000, ())])


async def test_a_clean_start_and_stop_do_a_constant_work_per_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not timed (issue 28: start and stop linear in the partitions, their speed
    measured by bench scale): after a clean shutdown each partition's directory is listed
    once and made no more (a start listed it five times and mkdir'ed it); the loads take a
    worker-thread hop per LOAD_CHUNK partitions and the final closes one per CLOSE_CHUNK (a
    stop took one hop per partition); nothing is fsynced at a stop of untouched partitions."""
    data = tmp_path / "data"
    await _make_partitions(data)

    listed: Counter[str] = Counter()
    made: list[str] = []
    hops: list[str] = []
    real_listdir, real_mkdir, real_run_sync = os.listdir, os.mkdir, anyio.to_thread.run_sync

    def listdir(path: Any = ".") -> list[str]:
        listed[os.path.basename(os.fspath(path))] += 1
        return real_listdir(path)

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        made.append(os.fspath(path))
        real_mkdir(path, *args, **kwargs)

    async def run_sync(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__qualname__", repr(fn)))
        return await real_run_sync(fn, *args, **kwargs)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(anyio.to_thread, "run_sync", run_sync)
    async with open_engine(EngineConfig(log_dirs=(data,))) as engine:
        started_hops = len(hops)
        assert len(engine.all_partitions()) == PARTITIONS + 2  # + __metadata, __consumer_offsets
        assert engine.partition("t0", 7).high_watermark == 1
        partition_dirs = [name for name in real_listdir(data) if name.startswith("t")]
        assert len(partition_dirs) == PARTITIONS
        assert {name: listed[name] for name in partition_dirs} == dict.fromkeys(partition_dirs, 1)
        assert made == []
        loads = -(-(PARTITIONS + 1) // LOAD_CHUNK)
        assert sum(1 for hop in hops if "load_chunk" in hop) == loads
        assert started_hops <= loads + 12  # the metadata log, checkpoints, markers: constant
        stop_from = len(hops)
    closes = [hop for hop in hops[stop_from:] if "_call_each" in hop]
    assert 1 <= len(closes) <= -(-(PARTITIONS + 2) // CLOSE_CHUNK) + CLOSE_HOPS
    assert len(hops) - stop_from <= len(closes) + 12  # not one hop per partition
    # and it was a clean stop: the next start finds every partition as it was
    async with open_engine(EngineConfig(log_dirs=(data,))) as engine:
        assert engine.partition("t0", 7).high_watermark == 1
        assert all(d.had_clean_shutdown for d in engine.dirs)


async def test_closes_queued_in_any_loop_turn_all_run() -> None:
    """The writers' final closes share worker-thread hops (partition_log._CloseBatches): a
    close queued in the loop turn a drain ends in, before its task is done, still runs (the
    drains were counted by their tasks' done callbacks, a turn late: such a close waited for
    ever, and a stop of 50,000 partitions left 35,000 writers unstopped)."""
    closer = closes_for(asyncio.get_running_loop())
    ran: list[int] = []
    errors: list[int] = []

    async def one(i: int) -> None:
        for _ in range(i % 7):
            await asyncio.sleep(0)

        def close() -> None:
            ran.append(i)
            if i % 50 == 0:
                raise StorageError(Path("x"), "a close that fails")

        try:
            await closer.call(close)
        except StorageError:
            errors.append(i)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(2_000):
                tg.start_soon(one, i)
                if i % 97 == 0:
                    await asyncio.sleep(0)
    assert sorted(ran) == list(range(2_000))
    assert sorted(errors) == list(range(0, 2_000, 50))  # each caller gets its own outcome
