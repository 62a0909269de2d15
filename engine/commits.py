"""Group commits of many partitions carried out together: one hop to a commit thread per
event-loop turn, their fdatasyncs issued in parallel.

Every partition's writer makes its own group commits (partition_log.py). Under many small
appends over many partitions, each commit was its own thread hop (an executor future, a
call_soon_threadsafe back, the writer task's wake-up) and its own GIL hand-over, for one record.
The writers that start a commit in the same event-loop turn now hand it here; at the end of the
turn all of them go to a commit thread as one job:

    1. each partition's write phase, one after the other (the batches staged and written, the
       offsets assigned: PartitionLog._commit_write); it returns what is left to do, the
       flush and what follows it, when the commit is due a flush (a PendingFlush);
    2. those flushes: where two or more are on one filesystem, one syncfs(2) of it makes them
       all durable at once (the shared durable point); otherwise each partition's fdatasync,
       in parallel (one in the commit thread, the others in the flush threads);
    3. one call back to the event loop, which answers every commit of the job: each
       commit's `done` callback (PartitionLog._complete: publish the new end, answer its
       requests) runs in that turn, so a request's waiter resumes in the next one (issue 26:
       a future for the writer to wake on, then that writer's turn, cost two more turns, each
       ~0.5-1 ms behind whatever else a loaded loop had queued).

The small key-index work of a commit (PendingFlush.index: the keys of a few records) runs in the
commit thread after the syncs; only a job with INDEX_IN_FLUSH_THREAD keys or more hands it to a
flush thread to run while the syncs wait for the disk. Every commit of a topic with a key index
has that work, even one keyless record; the hand-off (a thread's wake-up and its turn at the
GIL, which a busy loop holds up to the 5 ms switch interval) cost more than the work.

Measured on this machine (a virtual disk; bench http_small's load, 11 commits a job): 30
files take 2.9 ms to fdatasync one after the other, 1.3 ms in parallel, 0.33 ms with one
syncfs; under one-record appends over 100 partitions the syncfs took the server from ~5,600 to
~7,300 appends/s, the fdatasyncs' kernel time being most of the commit threads' CPU.

Where a syncfs is as safe as the fdatasyncs it replaces: only on the filesystems known to make
every file's dirty data durable in it, ext2/3/4, xfs and btrfs (fileutil.SYNCFS_FLUSHES_FILES),
decided per filesystem by its statfs type when register() first sees it. Elsewhere each file
gets its own fdatasync, whatever EVENTLOG_SHARED_SYNC says: on a FUSE mount syncfs(2) returns 0
and asks the daemon for nothing (the kernel sends no FUSE_FSYNC; only virtiofs gets a
FUSE_SYNCFS), so acknowledged records were lost in a power cut and their offsets handed out
again (issue 23; tests/powercut/ holds the test); NFS, overlayfs, tmpfs and any filesystem not
named are treated the same way. Start-up says which a log dir gets (one log line per log dir).

On those filesystems: a syncfs writes and flushes every dirty page and inode of the
filesystem, so each .log's appended bytes (written before it began) and its size are durable
when it returns 0. Errors: since Linux 5.8 a syncfs reports any write-back error met on the
filesystem since the descriptor it is called on last reported one. That descriptor is opened
once per filesystem (register()), before any partition on it writes, so no error after its
opening goes unseen. A syncfs that fails says nothing of which file lost data, so the job's
flushes on that filesystem fall back to each partition's own fdatasync (whose descriptor was
open when the error happened, and reports it), and that filesystem is synced file by file from
then on, for the life of the process. A kernel older than 5.8, and EVENTLOG_SHARED_SYNC=false,
never use it. What it costs: a syncfs waits for whatever else is dirty on the filesystem; on a
filesystem shared with heavy writers, set EVENTLOG_SHARED_SYNC=false (docs/OPERATIONS.md).

A failure stays with its own partition (each commit has its own outcome). A partition has at
most one commit in flight, so no two jobs touch one partition; jobs of later turns run in other
commit threads meanwhile. Fault rules (faults.py) that target a file's fsync make that file
sync on its own, where they act.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

from . import faults
from .fileutil import filesystem_magic, filesystem_name, syncfs, syncfs_flushes_files

logger = logging.getLogger("eventlog.engine")

SHARED_SYNC_MIN = 2  # flushes on one filesystem in a job that a syncfs covers instead
# keys in a job's index work from which it runs in a flush thread during the syncs (below: in the
# commit thread after them; hashing and adding a key costs about a microsecond)
INDEX_IN_FLUSH_THREAD = 512


class PendingFlush:
    """What completes a commit due a flush: call it with None to fdatasync the partition's
    active segment, or with the seconds a syncfs of its filesystem took (already durable).
    `index`, if any, is work of the commit that may run while the flush does (the key index's
    entries: partition_log.py), and must be done before the commit is answered."""

    __slots__ = ("complete", "segment", "device", "index", "index_keys")

    def __init__(
        self, complete: Callable[[float | None], None], segment: Any, device: int, index: Callable[[], None] | None = None,
        index_keys: int = 0,
    ) -> None:
        self.complete = complete
        self.segment = segment
        self.device = device
        self.index = index
        self.index_keys = index_keys  # how many keys `index` adds: where it runs (commits.py)

    def __call__(self, shared_s: float | None = None) -> None:
        self.complete(shared_s)


# the write phase of a commit: None when it is complete, else the flush that completes it
WritePhase = Callable[[], PendingFlush | None]
# called on the loop with the commit's outcome (None, or its error) as soon as it is known
Done = Callable[[BaseException | None], None]
# a commit in a job: its write phase, the future its writer waits on, its `done` callback
_Entry = tuple[WritePhase, "asyncio.Future[None]", Done | None]


def kernel_reports_syncfs_errors() -> bool:
    """syncfs(2) reports write-back errors from Linux 5.8 on."""
    try:
        major, minor = (int(x) for x in platform.release().split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 8)



# Jobs run in these threads (a job holds one partition's commit at most once, so the pool bounds
# how many jobs run at once); their flushes beyond the first in the flush threads.
COMMIT_THREADS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="eventlog-commit")
FLUSH_THREADS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="eventlog-flush")


class CommitBatcher:
    """The commits of one event loop's partitions (see the module's docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, shared_sync: bool | None = None) -> None:
        self.loop = loop
        self._pending: list[_Entry] = []
        self.jobs = 0  # jobs sent to a commit thread, and commits in them: the batching achieved
        self.commits = 0
        self.shared_syncs = 0  # syncfs calls made, and the flushes they covered
        self.shared_flushes = 0
        # set by open_engine from EVENTLOG_SHARED_SYNC (default on, where the kernel allows)
        self.shared_sync = kernel_reports_syncfs_errors() if shared_sync is None else shared_sync
        self._sync_fds: dict[int, int] = {}  # st_dev -> a descriptor on that filesystem (syncfs)
        self._sync_failed: set[int] = set()  # filesystems synced file by file after a failed syncfs
        # st_dev -> (the filesystem's name, whether a syncfs makes its files durable: its statfs type)
        self._filesystems: dict[int, tuple[str, bool]] = {}
        # log dirs whose sync was logged, as strings: a Path's hash computes its parts anew for
        # every new Path object (a start with 20,000 partitions spent a second here)
        self._described: set[str] = set()
        self._lock = threading.Lock()

    def register(self, directory: Path) -> int:
        """A partition in `directory` is about to write: its filesystem's st_dev. The first
        partition on a filesystem decides whether a syncfs may stand for its files' fdatasyncs
        (its statfs type: filesystem_sync()) and, where it may, opens the descriptor its syncfs
        calls go through (before any of them writes, so it sees every write-back error from
        then on). The first partition of a log dir (`directory`'s parent) logs which sync the
        dir gets."""
        device = os.stat(directory).st_dev
        if device not in self._filesystems or (
            self.shared_sync and self._filesystems[device][1] and device not in self._sync_fds
        ):
            with self._lock:
                if device not in self._filesystems:
                    magic = filesystem_magic(directory)
                    self._filesystems[device] = (filesystem_name(magic), syncfs_flushes_files(magic))
                if self.shared_sync and self._filesystems[device][1] and device not in self._sync_fds:
                    self._sync_fds[device] = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        log_dir = os.path.dirname(directory)
        if log_dir not in self._described:
            self._described.add(log_dir)
            logger.info("log dir %s %s", log_dir, self.filesystem_sync(device))
        return device

    def filesystem_sync(self, device: int) -> str:
        """How the commits on a registered filesystem are made durable, in words: "on ext4:
        one syncfs ..." or "on fuse: fdatasync per file (why)"."""
        name, flushes_files = self._filesystems[device]
        if not flushes_files:
            why = "syncfs is not known to flush files there"
            if self.shared_sync:
                why += "; EVENTLOG_SHARED_SYNC=true does not change that"
            return f"on {name}: fdatasync per file ({why})"
        if device in self._sync_fds and self.shared_sync:
            if device in self._sync_failed:
                return f"on {name}: fdatasync per file (a syncfs failed there)"
            return f"on {name}: one syncfs for the commits of many partitions at once (shared sync)"
        if not kernel_reports_syncfs_errors():
            return f"on {name}: fdatasync per file (Linux < 5.8: its syncfs reports no write-back errors)"
        return f"on {name}: fdatasync per file (EVENTLOG_SHARED_SYNC=false)"

    def filesystems(self) -> dict[int, tuple[str, bool]]:
        """Every registered filesystem: st_dev -> (its name, whether one syncfs makes its
        commits durable now)."""
        return {
            device: (name, flushes and self.shared_sync and device in self._sync_fds and device not in self._sync_failed)
            for device, (name, flushes) in list(self._filesystems.items())
        }

    def submit(self, write: WritePhase, done: Done | None = None) -> asyncio.Future[None]:
        """Carry out `write` (and the flush it returns) in this turn's job. Without `done`, the
        future is done (or failed with the commit's error) once the commit is complete. With
        it, `done(None)` or `done(error)` is called on the loop in the turn the job's outcome
        arrives in, and the future is done after it (failed only with the callback's own
        error): the writer's requests are answered without waiting for the writer to wake."""
        future = self.loop.create_future()
        if not self._pending:
            self.loop.call_soon(self._dispatch)
        self._pending.append((write, future, done))
        return future

    def _dispatch(self) -> None:
        job, self._pending = self._pending, []
        self.jobs += 1
        self.commits += len(job)
        try:
            COMMIT_THREADS.submit(self._run, job)
        except RuntimeError as exc:  # the pool is shut down (interpreter exit)
            self._finish(job, [exc] * len(job))

    def _run(self, job: list[_Entry]) -> None:
        """In a commit thread."""
        outcomes: list[BaseException | None] = [None] * len(job)
        flushes: list[tuple[int, PendingFlush]] = []
        for i, (write, _future, _done) in enumerate(job):
            try:
                flush = write()
            except Exception as exc:
                outcomes[i] = exc
                continue
            if flush is not None:
                flushes.append((i, flush))
        if flushes:
            # the commits' other work: in a flush thread while the syncs wait for the disk when
            # there is much of it, else here after them (a hand-off costs more than a few keys)
            works = [flush.index for _i, flush in flushes if flush.index is not None]
            meanwhile = None
            if works and sum(flush.index_keys for _i, flush in flushes) >= INDEX_IN_FLUSH_THREAD:
                meanwhile, works = FLUSH_THREADS.submit(_run_each, works), []
            if self.shared_sync:
                flushes = self._sync_shared(flushes, outcomes)
            self._sync_each(flushes, outcomes)
            if meanwhile is not None:
                meanwhile.result()
            _run_each(works)
        try:
            self.loop.call_soon_threadsafe(self._finish, job, outcomes)
        except RuntimeError:  # the loop is closed: nobody is left to answer
            pass

    def _sync_shared(
        self, flushes: list[tuple[int, PendingFlush]], outcomes: list[BaseException | None]
    ) -> list[tuple[int, PendingFlush]]:
        """One syncfs per filesystem holding SHARED_SYNC_MIN or more of the flushes; returns
        the flushes left to sync one by one."""
        by_device: dict[int, list[tuple[int, PendingFlush]]] = {}
        left: list[tuple[int, PendingFlush]] = []
        for item in flushes:
            flush = item[1]
            fd = self._sync_fds.get(flush.device)
            if (
                fd is None or flush.device in self._sync_failed
                or (faults.FAULTS_FILE is not None and faults.fault_pending("fsync", flush.segment.sync_fd()))
            ):
                left.append(item)
            else:
                by_device.setdefault(flush.device, []).append(item)
        for device, items in by_device.items():
            if len(items) < SHARED_SYNC_MIN:
                left += items
                continue
            started = time.perf_counter()
            try:
                syncfs(self._sync_fds[device])
            except OSError as exc:
                # which file lost data? each one's own fdatasync will say
                self._sync_failed.add(device)
                logger.error(
                    "syncfs failed (%s): syncing each partition on this filesystem on its own from now on", exc
                )
                left += items
                continue
            seconds = time.perf_counter() - started
            self.shared_syncs += 1
            self.shared_flushes += len(items)
            for i, flush in items:
                try:
                    flush(seconds)
                except Exception as exc:
                    outcomes[i] = exc
        return left

    @staticmethod
    def _sync_each(flushes: list[tuple[int, PendingFlush]], outcomes: list[BaseException | None]) -> None:
        """Each flush's own fdatasync, in parallel."""
        if not flushes:
            return
        others = [(i, FLUSH_THREADS.submit(flush)) for i, flush in flushes[1:]]
        i, flush = flushes[0]
        try:
            flush()
        except Exception as exc:
            outcomes[i] = exc
        wait([f for _i, f in others])
        for i, f in others:
            outcomes[i] = f.exception()

    @staticmethod
    def _finish(job: list[_Entry], outcomes: list[Any]) -> None:
        for (_write, future, done), outcome in zip(job, outcomes):
            if done is not None:  # (the commit's requests are answered whatever its waiter does)
                try:
                    done(outcome)
                except BaseException as exc:  # the writer's to raise (as when it did this itself)
                    outcome = exc
                else:
                    outcome = None
            if future.done():
                continue
            if outcome is None:
                future.set_result(None)
            else:
                future.set_exception(outcome)


def _run_each(works: list[Callable[[], None]]) -> None:
    for work in works:
        work()  # (each handles its own failure)


_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CommitBatcher] = weakref.WeakKeyDictionary()


def batcher_for(loop: asyncio.AbstractEventLoop) -> CommitBatcher:
    """The loop's batcher (one per event loop: in a shard family, one per shard)."""
    batcher = _batchers.get(loop)
    if batcher is None:
        batcher = _batchers[loop] = CommitBatcher(loop)
    return batcher
