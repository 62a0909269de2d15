"""Group commits of many partitions carried out together (engine/commits.py): one job per
event-loop turn, one syncfs for the flushes of a job on one filesystem (or their fdatasyncs in
parallel), each commit with its own outcome."""

from __future__ import annotations

import asyncio
import threading
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from engine import commits, segment
from engine.errors import StorageError
from engine.fileutil import filesystem_magic, filesystem_name, syncfs_flushes_files
from engine.partition_log import prepare_batches

from .helpers import running_log
from .test_faults import inject, put, records, values  # noqa: F401 -- inject is a fixture

PARTITIONS = 8


async def _logs(stack: AsyncExitStack, tmp_path: Path, n: int = PARTITIONS) -> list:
    return [await stack.enter_async_context(running_log(tmp_path / f"p{i}")) for i in range(n)]


async def test_commits_due_together_go_in_one_job_and_each_is_durable(tmp_path: Path) -> None:
    batcher = commits.batcher_for(asyncio.get_running_loop())
    async with AsyncExitStack() as stack:
        logs = await _logs(stack, tmp_path)
        jobs0, commits0 = batcher.jobs, batcher.commits
        for round_ in range(5):
            results = await asyncio.gather(*(put(log, f"r{round_}p{i}", n=2) for i, log in enumerate(logs)))
            assert [r.base_offset for r in results] == [2 * round_] * PARTITIONS
        jobs, done = batcher.jobs - jobs0, batcher.commits - commits0
        assert done == 5 * PARTITIONS
        assert jobs < done, f"{done} commits took {jobs} jobs: none went together"
        for i, log in enumerate(logs):
            assert log.recovery_point == 10  # flushed: what was acknowledged is durable
            assert [v.split(b"-")[0] for v in values(log)] == [f"r{r}p{i}".encode() for r in range(5) for _ in range(2)]


async def test_the_flushes_of_a_job_run_at_the_same_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = threading.Lock()
    inside = [0]
    most = [0]
    release = threading.Event()
    flush = segment.LogSegment.flush

    def counting_flush(self) -> None:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            if inside[0] >= 3:
                release.set()
        release.wait(5)  # hold each flush until three are inside at once (or give up)
        try:
            flush(self)
        finally:
            with lock:
                inside[0] -= 1

    commits.batcher_for(asyncio.get_running_loop()).shared_sync = False  # each its own fdatasync
    async with AsyncExitStack() as stack:
        logs = await _logs(stack, tmp_path, 4)
        monkeypatch.setattr(segment.LogSegment, "flush", counting_flush)
        # queued in one turn: one job, whose four flushes run in parallel
        results = await asyncio.gather(*(put(log, f"p{i}") for i, log in enumerate(logs)))
        monkeypatch.setattr(segment.LogSegment, "flush", flush)
    assert [r.base_offset for r in results] == [0] * 4
    assert most[0] >= 3, f"at most {most[0]} flush(es) at once"


async def test_a_failed_fsync_in_a_job_fails_its_own_partition_only(tmp_path: Path, inject) -> None:  # noqa: F811
    async with AsyncExitStack() as stack:
        logs = await _logs(stack, tmp_path, 4)
        inject({"op": "fsync", "path": str(tmp_path / "p2"), "errno": "EIO"})
        results = await asyncio.gather(*(put(log, f"p{i}") for i, log in enumerate(logs)), return_exceptions=True)
        inject()
        assert isinstance(results[2], StorageError)
        assert [r.base_offset for i, r in enumerate(results) if i != 2] == [0, 0, 0]
        assert logs[2].failed is not None and all(log.failed is None for i, log in enumerate(logs) if i != 2)
        more = await asyncio.gather(*(put(log, "again") for i, log in enumerate(logs) if i != 2))
        assert [r.base_offset for r in more] == [5, 5, 5]


async def test_a_full_disk_in_a_job_undoes_that_commit_only(tmp_path: Path, inject) -> None:  # noqa: F811
    async with AsyncExitStack() as stack:
        logs = await _logs(stack, tmp_path, 3)
        await asyncio.gather(*(put(log, "first") for log in logs))
        inject({"op": "fsync", "path": str(tmp_path / "p1"), "errno": "ENOSPC", "times": 1})
        results = await asyncio.gather(*(put(log, "second") for log in logs), return_exceptions=True)
        assert [type(r).__name__ for r in results] == ["AppendResult", "StorageFullError", "AppendResult"]
        assert logs[1].failed is None, "a full disk refuses the commit and leaves the partition writable"
        assert (await logs[1].append(prepare_batches(records("third"), logs[1].config))).base_offset == 5
        assert [v[:5] for v in values(logs[1])] == [b"first"] * 5 + [b"third"] * 5


def _skip_without_shared_sync(batcher: commits.CommitBatcher, directory: Path) -> None:
    if not batcher.shared_sync:
        pytest.skip("this kernel's syncfs does not report write-back errors (Linux < 5.8)")
    magic = filesystem_magic(directory)
    if not syncfs_flushes_files(magic):
        pytest.skip(f"{directory} is on {filesystem_name(magic)}, where syncfs is not used (not known to flush files)")


async def test_flushes_on_one_filesystem_share_one_syncfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batcher = commits.batcher_for(asyncio.get_running_loop())
    _skip_without_shared_sync(batcher, tmp_path)
    fdatasyncs = []
    flush = segment.LogSegment.flush
    monkeypatch.setattr(segment.LogSegment, "flush", lambda self: (fdatasyncs.append(self), flush(self))[1])
    async with AsyncExitStack() as stack:
        logs = await _logs(stack, tmp_path, 6)
        syncs0, covered0 = batcher.shared_syncs, batcher.shared_flushes
        results = await asyncio.gather(*(put(log, f"p{i}") for i, log in enumerate(logs)))
        assert [r.base_offset for r in results] == [0] * 6
        assert batcher.shared_syncs - syncs0 >= 1 and batcher.shared_flushes - covered0 == 6
        assert fdatasyncs == [], "a partition the syncfs covered was fdatasync'ed too"
        assert all(log.recovery_point == 5 for log in logs)


async def test_a_failed_syncfs_leaves_each_partition_to_its_own_fdatasync(tmp_path: Path, inject) -> None:  # noqa: F811
    batcher = commits.batcher_for(asyncio.get_running_loop())
    _skip_without_shared_sync(batcher, tmp_path)
    async with AsyncExitStack() as stack:
        logs = await _logs(stack, tmp_path, 4)
        # the syncfs fails (it cannot say which file lost data); p2's own fdatasync fails too
        inject({"op": "syncfs", "errno": "EIO"}, {"op": "fsync", "path": str(tmp_path / "p2"), "errno": "EIO"})
        syncs0 = batcher.shared_syncs
        results = await asyncio.gather(*(put(log, f"p{i}") for i, log in enumerate(logs)), return_exceptions=True)
        assert isinstance(results[2], StorageError)
        assert [r.base_offset for i, r in enumerate(results) if i != 2] == [0, 0, 0]
        inject()
        # the filesystem is synced file by file from now on
        more = await asyncio.gather(*(put(log, "again") for i, log in enumerate(logs) if i != 2))
        assert [r.base_offset for r in more] == [5, 5, 5]
        assert batcher.shared_syncs == syncs0
        assert all(log.recovery_point == 10 for i, log in enumerate(logs) if i != 2)


@pytest.mark.parametrize("soon", [False, True])
async def test_a_full_queue_makes_producers_wait_and_lets_every_one_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inject, soon: bool  # noqa: F811
) -> None:
    """Backpressure: with room for 2 ops, 40 producers wait their turn, none is lost or stuck."""
    from engine import partition_log

    monkeypatch.setattr(partition_log, "QUEUE_DEPTH", 2)
    inject({"op": "fsync", "path": str(tmp_path), "delay_ms": 5})
    async with running_log(tmp_path / "p0") as log:
        loop = asyncio.get_running_loop()

        async def one(i: int):
            batches = prepare_batches(records(f"r{i}", 1), log.config)
            if not soon:
                return await log.append(batches)
            done = loop.create_future()
            log.append_soon(batches, lambda r, e: done.set_exception(e) if e else done.set_result(r))
            return await done

        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(40))), 30)
        assert sorted(r.base_offset for r in results) == list(range(40))
        assert sorted(v.split(b"-")[0] for v in values(log)) == sorted(f"r{i}".encode() for i in range(40))


async def test_a_commit_is_answered_in_the_loop_turn_its_outcome_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inject  # noqa: F811
) -> None:
    """The batcher's call back to the loop answers the commit's requests itself (issue 26): no
    future for the writer to wake on and no writer turn in between, each a loop turn that a
    loaded loop fills with other work (the hops cost more than a lone append's fsync). The
    error path too: a failed fsync is answered in that same call."""
    finishing = [False]
    finish = commits.CommitBatcher._finish

    def marked_finish(job, outcomes) -> None:
        finishing[0] = True
        try:
            finish(job, outcomes)
        finally:
            finishing[0] = False

    monkeypatch.setattr(commits.CommitBatcher, "_finish", staticmethod(marked_finish))
    async with running_log(tmp_path / "p0") as log:
        loop = asyncio.get_running_loop()
        for fail in (False, True):
            if fail:
                inject({"op": "fsync", "path": str(tmp_path / "p0"), "errno": "EIO"})
            answered = loop.create_future()

            def callback(result, error, answered=answered) -> None:
                answered.set_result((finishing[0], result, error))

            log.append_soon(prepare_batches(records(f"lone{fail}", 1), log.config), callback)
            in_finish, result, error = await asyncio.wait_for(answered, 10)
            assert in_finish, "answered in a loop turn after the one its commit's outcome came in"
            if fail:
                assert result is None and isinstance(error, StorageError)
                assert log.failed is not None  # as before: a failed fsync fails the partition
            else:
                assert error is None and result.base_offset == 0 and log.recovery_point == 1
                assert values(log)[0].startswith(b"lone")  # published before it was answered
        inject()


async def test_a_small_commits_key_index_work_takes_no_other_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit's key index entries are added in its commit thread after the fsync unless the
    job has many keys: a hand-off to a flush thread (its wake-up, its turn at the GIL) cost a
    one-record commit more than the work. A job with INDEX_IN_FLUSH_THREAD keys or more still
    adds them in a flush thread while the fsync runs. Either way the keys are indexed before
    the append is answered."""
    handed = []

    class Counting:
        def __init__(self, pool) -> None:
            self.pool = pool

        def submit(self, fn, *args):
            handed.append(fn)
            return self.pool.submit(fn, *args)

    monkeypatch.setattr(commits, "FLUSH_THREADS", Counting(commits.FLUSH_THREADS))
    monkeypatch.setattr(commits, "INDEX_IN_FLUSH_THREAD", 50)
    # one partition: its fsync needs no flush thread
    async with running_log(tmp_path / "p0") as log:
        assert log.config.key_index
        await put(log, "small", n=3)
        assert handed == [], "a commit of 3 keys handed its index work to another thread"
        assert log.key_index.active.scanned_to == log.view.active_end
        await put(log, "large", n=60)
        assert handed == [commits._run_each], "a commit of 60 keys added them in the commit thread"
        assert log.key_index.active.scanned_to == log.view.active_end
