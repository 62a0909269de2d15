"""Group commits of many partitions carried out together: one hop to a commit thread per
event-loop turn, their fdatasyncs issued in parallel.

Every partition's writer makes its own group commits (partition_log.py). Under many small
appends over many partitions, each commit was its own thread hop (an executor future, a
call_soon_threadsafe back, the writer task's wake-up) and its own GIL hand-over, for one record.
The writers that start a commit in the same event-loop turn now hand it here; at the end of the
turn all of them go to a commit thread as one job:

    1. each partition's write phase, one after the other (the batches staged and written, the
       offsets assigned: PartitionLog._commit_write); it returns what is left to do, the
       fdatasync and what follows it, when the commit is due a flush;
    2. those flushes, in parallel: one in the commit thread, the others in the flush threads
       (an fdatasync releases the GIL; on this machine 30 files take 2.9 ms one after the other,
       1.3 ms in parallel);
    3. one call back to the event loop, which answers every commit of the job.

A failure stays with its own partition (each commit has its own outcome). A partition has at
most one commit in flight, so no two jobs touch one partition; jobs of later turns run in other
commit threads meanwhile.

Measured and not chosen: one syncfs(2) of the filesystem in place of the fdatasyncs (30 files:
0.33 ms). It waits for every dirty page of the filesystem, a compaction's or a snapshot's
hundreds of megabytes included, and it does not say which file a write-back error hit: an
acknowledgement's latency would depend on other work, and an error would need every partition
re-synced to be placed (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable

logger = logging.getLogger("eventlog.engine")

# the write phase of a commit: None when it is complete, else the flush that completes it
WritePhase = Callable[[], Callable[[], None] | None]

# Jobs run in these threads (a job holds one partition's commit at most once, so the pool bounds
# how many jobs run at once); their flushes beyond the first in the flush threads.
COMMIT_THREADS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="eventlog-commit")
FLUSH_THREADS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="eventlog-flush")


class CommitBatcher:
    """The commits of one event loop's partitions (see the module's docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: list[tuple[WritePhase, asyncio.Future[None]]] = []
        self.jobs = 0  # jobs sent to a commit thread, and commits in them: the batching achieved
        self.commits = 0

    def submit(self, write: WritePhase) -> asyncio.Future[None]:
        """Carry out `write` (and the flush it returns) in this turn's job; the future is done
        (or failed with the commit's error) once the commit is complete."""
        future = self.loop.create_future()
        if not self._pending:
            self.loop.call_soon(self._dispatch)
        self._pending.append((write, future))
        return future

    def _dispatch(self) -> None:
        job, self._pending = self._pending, []
        self.jobs += 1
        self.commits += len(job)
        try:
            COMMIT_THREADS.submit(self._run, job)
        except RuntimeError as exc:  # the pool is shut down (interpreter exit)
            self._finish(job, [exc] * len(job))

    def _run(self, job: list[tuple[WritePhase, asyncio.Future[None]]]) -> None:
        """In a commit thread."""
        outcomes: list[BaseException | None] = [None] * len(job)
        flushes: list[tuple[int, Callable[[], None]]] = []
        for i, (write, _future) in enumerate(job):
            try:
                flush = write()
            except Exception as exc:
                outcomes[i] = exc
                continue
            if flush is not None:
                flushes.append((i, flush))
        if flushes:
            others = [(i, FLUSH_THREADS.submit(flush)) for i, flush in flushes[1:]]
            i, flush = flushes[0]
            try:
                flush()
            except Exception as exc:
                outcomes[i] = exc
            wait([f for _i, f in others])
            for i, f in others:
                outcomes[i] = f.exception()
        try:
            self.loop.call_soon_threadsafe(self._finish, job, outcomes)
        except RuntimeError:  # the loop is closed: nobody is left to answer
            pass

    @staticmethod
    def _finish(job: list[tuple[WritePhase, asyncio.Future[None]]], outcomes: list[Any]) -> None:
        for (_write, future), outcome in zip(job, outcomes):
            if future.done():
                continue
            if outcome is None:
                future.set_result(None)
            else:
                future.set_exception(outcome)


_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CommitBatcher] = weakref.WeakKeyDictionary()


def batcher_for(loop: asyncio.AbstractEventLoop) -> CommitBatcher:
    """The loop's batcher (one per event loop: in a shard family, one per shard)."""
    batcher = _batchers.get(loop)
    if batcher is None:
        batcher = _batchers[loop] = CommitBatcher(loop)
    return batcher
