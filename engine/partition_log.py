"""One partition's log: its segments, its single writer task, and lock-free reads.

Writes. Every mutation goes through one writer task (run()), fed by a bounded queue, so
producers feel backpressure when it fills. The writer takes an append request, drains every
other append already waiting, and makes one group commit of them all in a commit thread
(together with the commits other partitions start in the same event-loop turn: commits.py):
assign offsets by rewriting each batch's baseOffset, stamp LogAppendTime if the topic
wants it, roll segments where needed, write the batches with one pwritev per segment, update
the indexes, and fdatasync once. Only then is the new high watermark published and are the
producers acknowledged. With flush.messages > 1 the fsync is deferred (see LogConfig).

Reads. Readers take `view` (a LogView) and never wait for the writer: closed segments are
immutable, and the last segment is read only up to the published end position, which always
falls on a batch boundary below the high watermark.

Crash behaviour. An acknowledged batch has been fsynced (by default). A crash during a group
commit can leave a torn batch at the end of the active segment: recovery truncates it, and
those producers were never acknowledged.

Segment replacement for the workers (delete_segments, replace_segments) runs through the same
writer, in the numbered steps documented on each method; recovery.py completes or undoes
whatever a crash interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Sequence

import anyio
import numpy as np
from anyio.abc import TaskStatus

from . import filenames, key_reads
from .commits import CommitBatcher, PendingFlush, batcher_for
from .config import LogConfig
from .errors import (
    CorruptBatchError,
    EngineError,
    InflatedTooLargeError,
    KeyIndexDisabledError,
    KeyRequiredError,
    KeyVersionMismatchError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    StorageError,
    StorageFullError,
    TransientStorageError,
)
from .faults import crash_point
from .fileutil import fsync_dir
from .format import (
    CONTROL_BIT,
    BatchHeader,
    check_produced,
    iter_batches,
    set_base_offset,
    set_log_append_time,
)
from .key_index import KeyIndex, key_hash, remove_key_index
from .log_reads import LogReads
from .producer_state import DEFAULT_EXPIRATION_MS, ProducerEntry, ProducerStateManager
from .records import check_records_framing, split_records
from .segment import AppendBatch, LogSegment
from .segments import LogView
from .wakeups import PacedEvent

logger = logging.getLogger("eventlog.engine")

Clock = Callable[[], int]

QUEUE_DEPTH = 1024
MAX_GROUP_BYTES = 32 * 1024 * 1024


async def _uncancelled(future: asyncio.Future[Any]) -> Any:
    """The result of `future` (work in a thread); like anyio's to_thread, a cancelled caller
    still waits for the work to finish (the log's state must not change behind its writer's
    back)."""
    try:
        return await asyncio.shield(future)
    except BaseException:  # the work's own error (the future is done), or our cancellation
        if not future.done():
            with anyio.CancelScope(shield=True):
                await asyncio.wait({future})
        raise


def _wake_up(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


CLOSE_CHUNK = 32  # writers' final closes per worker-thread hop (_CloseBatches)
CLOSE_HOPS = 16  # hops of them at once: closes that fsync wait on the disk side by side


class _CloseBatches:
    """The final closes of many writers at once (a shutdown closes every partition): their
    blocking _close_sync calls run CLOSE_CHUNK per worker-thread hop, CLOSE_HOPS hops at once,
    instead of one hop each: at 20,000 partitions the hops, their wake-ups and 40 threads
    taking turns at the GIL cost more than the closes, most of which touch no file (issue 28);
    closes that do fsync still wait on the disk CLOSE_HOPS at a time.
    Each caller gets its own call's outcome; a lone close is one hop, as before. One per
    event loop (closes_for)."""

    def __init__(self) -> None:
        self._pending: deque[tuple[Callable[[], None], asyncio.Future[None]]] = deque()
        # drains running: counted down by a drain itself, in the same loop turn as it saw the
        # queue empty (a task's done callback comes a turn later: a close queued in between
        # found every drain still counted and waited for ever)
        self._hops = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def call(self, fn: Callable[[], None]) -> None:
        """Run fn in a worker thread with others queued meanwhile; its error is raised here.
        The caller (the writer's last step, in a shielded scope) waits for it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((fn, future))
        if self._hops < CLOSE_HOPS:
            self._hops += 1
            task = loop.create_task(self._drain())
            self._tasks.add(task)  # (the loop holds tasks weakly)
            task.add_done_callback(self._tasks.discard)
        await future

    async def _drain(self) -> None:
        chunk: list[tuple[Callable[[], None], asyncio.Future[None]]] = []
        try:
            while self._pending:
                count = min(CLOSE_CHUNK, len(self._pending))
                chunk = [self._pending.popleft() for _ in range(count)]
                errors = await anyio.to_thread.run_sync(_call_each, [fn for fn, _ in chunk])
                for (_fn, future), error in zip(chunk, errors, strict=True):
                    if future.done():
                        continue
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(error)
                chunk = []
        except BaseException as exc:  # the loop is going away: nobody may wait for ever
            for _fn, future in [*chunk, *self._pending]:
                if not future.done():
                    future.set_exception(RuntimeError(f"close not run: {exc!r}"))
            self._pending.clear()
            raise
        finally:
            self._hops -= 1


def _call_each(fns: list[Callable[[], None]]) -> list[Exception | None]:
    errors: list[Exception | None] = []
    for fn in fns:
        try:
            fn()
        except Exception as exc:
            errors.append(exc)
        else:
            errors.append(None)
    return errors


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a start-up's loads or a shutdown's closes (then
    as it was). They make hundreds of thousands of long-lived objects (a partition's log,
    segments, indexes, events, its writer task), and each full collection meanwhile walks all
    of those made so far: at 20,000 partitions a start took ~1.4 x and a stop ~2.5 x as long
    with it on (issue 28). Nothing they make is cyclic garbage worth collecting early; the
    first collection after walks them once."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


LOOP_SLICE = 512  # start-up work per partition done on the loop between two of its turns


async def loop_turn(done: int) -> None:
    """After every LOOP_SLICE partitions' worth of start-up work on the event loop, give the
    loop a turn: a shard's heartbeat beats from it, and its supervisor kills a shard whose
    loop is silent for 5 s (25,000 partitions' writers, follows and slots in one turn were
    more than that)."""
    if done % LOOP_SLICE == LOOP_SLICE - 1:
        await asyncio.sleep(0)


async def start_writers(tg: Any, logs: Sequence[PartitionLog]) -> None:
    """Start-up: the writers of the loaded partitions (`tg`: the engine's task group), started
    without waiting for each to begin (tg.start took one loop turn per partition, in turn:
    25,000 at a start), LOOP_SLICE per loop turn. A request queued before a writer's first
    turn waits in its queue, as behind a busy writer."""
    for i, log in enumerate(logs):
        tg.start_soon(log.run, name=f"writer {log.name}")
        await loop_turn(i)


_closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _CloseBatches] = (
    weakref.WeakKeyDictionary()
)


def closes_for(loop: asyncio.AbstractEventLoop) -> _CloseBatches:
    closer = _closers.get(loop)
    if closer is None:
        closer = _closers[loop] = _CloseBatches()
    return closer


def _delete_now(_log: "PartitionLog", segments: list[LogSegment]) -> None:
    """Default when no log manager schedules deletions: unlink at once."""
    for segment in segments:
        segment.close()
        segment.delete_files()


@dataclass(slots=True)
class PreparedBatch:
    """A validated batch waiting for its offsets: a writable view of its bytes and header."""

    data: memoryview
    header: BatchHeader
    # the key of each of its records (None: no key), in offset order, when whoever encoded it
    # knew them (the key index's input; else the writer reads them from the batch)
    keys: list[bytes | None] | None = None

    @property
    def record_count(self) -> int:
        return self.header.last_offset_delta + 1


def prepare_batches(
    body: bytes | bytearray | memoryview,
    config: LogConfig,
    *,
    check_records: bool = True,
    allow_control: bool = False,
    topic: str | None = None,
    max_inflated_bytes: int | None = None,
) -> list[PreparedBatch]:
    """Validate one or more concatenated v2 batches for appending; nothing is written.

    Every batch gets Kafka's checks of a client's batch (format.check_produced: a record count
    that matches lastOffsetDelta, no transactions) and, with `check_records`, of its records
    (records.check_records_framing: framing, offset deltas 0..n-1, keys on a compacted topic).
    Compressed batches are inflated while their records are walked, at most
    `max_inflated_bytes` for all of them together (default: only the per-batch cap).
    check_records=False is for batches the server encodes itself.

    Raises CorruptBatchError (framing, magic, CRC, offsets, record framing, no records, control
    batches from a client), TransactionsUnsupportedError, RecordTooLargeError (a batch above
    max.message.bytes or segment.bytes), InflatedTooLargeError, or, on a compacted topic,
    KeyRequiredError (a record without a key). The returned views share one writable copy of
    `body`.
    """
    buf = body if isinstance(body, bytearray) else bytearray(body)
    view = memoryview(buf)
    limit = config.max_batch_bytes
    inflate_left = max_inflated_bytes
    out = []
    for header in iter_batches(buf):
        if header.size > limit:
            what = "max.message.bytes" if limit == config.max_message_bytes else "segment.bytes"
            raise RecordTooLargeError(header.size, limit, what)
        if header.attributes & CONTROL_BIT and not allow_control:
            raise CorruptBatchError("control batches are written by the log, not by producers", header.position)
        check_produced(header)
        keys = None
        if check_records:
            try:
                inflated, keyless = check_records_framing(buf, header, max_inflated_bytes=inflate_left)
            except InflatedTooLargeError:
                raise InflatedTooLargeError(max_inflated_bytes or 0) from None  # the request's limit, not what was left
            if inflate_left is not None:
                inflate_left -= inflated
            if keyless and config.compact and not header.attributes & CONTROL_BIT:
                raise KeyRequiredError(topic or "?", header.position)
            if keyless == header.records_count:
                # no record has a key: the writer need not walk the records again to find
                # none (a quarter of a commit thread's time under small keyless Kafka batches)
                keys = [None] * keyless
        data = view[header.position : header.position + header.size]
        out.append(PreparedBatch(data, header, keys))
    return out


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    batch_base_offsets: tuple[int, ...]
    # a retry of batches already in the log (idempotent producer): nothing was written, and
    # these are the first write's offsets; batch_max_timestamps are the stored batches' own
    duplicate: bool = False
    batch_max_timestamps: tuple[int, ...] = ()


# ---------------------------------------------------------------------------------------------
# writer operations


@dataclass(eq=False)
class _Op:
    result: Any = None
    error: BaseException | None = None
    # called as the op finishes, in the writer's step (append_soon's callers): no task wakes
    callback: Callable[["_Op"], None] | None = None
    finished: bool = False
    _waiter: asyncio.Future[None] | None = None  # made only if someone waits before the end

    def finish(self) -> None:
        self.finished = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.callback is not None:
            callback, self.callback = self.callback, None
            try:
                callback(self)
            except Exception:
                logger.exception("append callback failed")

    async def wait(self) -> Any:
        if not self.finished:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        if self.error is not None:
            raise self.error
        return self.result


@dataclass(eq=False)
class _Append(_Op):
    batches: Sequence[PreparedBatch] = ()
    size: int = 0
    expected_offset: int | None = None
    # (key, the offset its latest record must have, or -1: it must have none)
    key_condition: tuple[bytes, int] | None = None


@dataclass(eq=False)
class _Call(_Op):
    """Run `fn(log)` in the writer's worker thread, then `after(log, result)` on the loop."""

    fn: Callable[["PartitionLog"], Any] | None = None
    after: Callable[["PartitionLog", Any], Awaitable[Any]] | None = None


# a key index entry of a commit still to add: (the active segment's entries, key hashes (None:
# hashed when added), keys, offsets, the batch's position, its end)
_KeyAdd = tuple[Any, list[int] | None, list[bytes], Sequence[int], int, int]

# the log before a commit, what undoing it restores: its next offset, segments, the active
# segment's append_state() and recovery point
_Before = tuple[int, tuple[LogSegment, ...], tuple, int]


class _GroupCommit:
    """One group commit's state from its requests' admission to its flush (commit thread)."""

    __slots__ = (
        "now", "append_time", "next_offset", "keys_on", "group_keys", "pending", "batches",
        "messages", "batch_keys", "reads",
    )

    def __init__(
        self, now: int, append_time: int, next_offset: int, keys_on: bool,
        group_keys: dict[int, list[tuple[int, bytes]]] | None,
    ) -> None:
        self.now = now
        self.append_time = append_time  # -1 unless the topic uses LogAppendTime
        self.next_offset = next_offset  # the next request's first offset
        self.keys_on = keys_on  # the topic keeps a key index
        # this commit's keyed records so far, hash -> (offset, key): for per-key conditions only
        self.group_keys = group_keys
        # the producer state the commit applies when complete
        self.pending: dict[int, ProducerEntry] = {}
        self.batches: list[AppendBatch] = []  # what it writes, in offset order
        self.messages = 0
        # per batch (keys_on): its key hashes (None: hashed later), keys, offsets
        self.batch_keys: list[tuple[list[int] | None, list[bytes], Sequence[int]]] = []
        self.reads: key_reads.BatchCache | None = None  # made by the first per-key lookup

    def add_keys(self, batch: PreparedBatch, base_offset: int) -> None:
        """Note the keys of `batch`, written from `base_offset`, for the key index (and the
        per-key conditions of the requests after it)."""
        keys = _record_keys(batch)
        if None in keys:
            keyed = [(i, k) for i, k in enumerate(keys) if k is not None]
            offsets: Sequence[int] = [base_offset + i for i, _k in keyed]
            keys = [k for _i, k in keyed]
        else:
            offsets = range(base_offset, base_offset + len(keys))
        group_keys = self.group_keys
        if group_keys is None:  # the common case: no conditions to check
            self.batch_keys.append((None, keys, offsets))
        else:
            hashes = list(map(key_hash, keys))
            self.batch_keys.append((hashes, keys, offsets))
            for h, offset, key in zip(hashes, offsets, keys):
                group_keys.setdefault(h, []).append((offset, key))


class PartitionLog(LogReads):
    def __init__(
        self,
        topic: str,
        partition: int,
        directory: Path,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        recovery_point: int,
        clock: Clock = wall_clock_ms,
        on_log_start_change: Callable[[PartitionLog, int], Awaitable[None]] | None = None,
        on_commit: Callable[[PartitionLog, int, int, int], None] | None = None,
        schedule_delete: Callable[[PartitionLog, list[LogSegment]], None] | None = None,
        on_fsync: Callable[[PartitionLog, float], None] | None = None,
        producer_state: ProducerStateManager | None = None,
        dropped_offsets: tuple[tuple[int, int], ...] = (),
        leader_epoch: int = 0,
    ) -> None:
        assert segments, "a log always has an active segment"
        self.topic = topic
        self.partition = partition
        self.directory = directory
        self.config = config
        self.clock = clock
        self._segments = tuple(segments)
        active = segments[-1]
        self._next_offset = active.next_offset
        self._log_start_offset = max(log_start_offset, segments[0].base_offset)
        self.recovery_point = min(recovery_point, self._next_offset)
        self._unflushed_messages = 0
        self._last_flush_ms = clock()
        self._on_log_start_change = on_log_start_change
        self._on_commit = on_commit
        self._on_fsync = on_fsync
        # the writer's queue: at most QUEUE_DEPTH ops; senders beyond wait for room, in order
        self._ops: deque[_Op] = deque()
        self._ops_closed = False
        self._wake: asyncio.Future[None] | None = None  # the writer's wait for an op
        self._room: deque[asyncio.Future[None]] = deque()  # senders' waits for room
        self._senders: set[asyncio.Task] = set()  # append_soon's waits for room in a full queue
        self._commits: CommitBatcher | None = None
        self._device = -1  # the filesystem of the log's directory (st_dev), once running
        self._data_event = PacedEvent()
        self._closed = False
        self._deleted = False
        self._stop_waiting = False
        self.waiters = 0  # requests parked in wait_for_data (a gauge for operators)
        self._running = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failed: StorageError | None = None
        self._schedule_delete = schedule_delete or _delete_now
        self.producer_state = producer_state if producer_state is not None else ProducerStateManager(directory, DEFAULT_EXPIRATION_MS)
        self.stopped = anyio.Event()
        # held while segment files are renamed away (retention, compaction) or linked into a
        # snapshot, so a snapshot never links a file that is leaving; appends never take it
        self.files_lock = anyio.Lock()
        # damaged batches met (eventlog_corrupt_batches_total): dropped by recovery at start-up,
        # refused by reads since
        self.corrupt_batches = {"recovery": 0, "read": 0}
        # offset ranges recovery dropped (recovery.LoadedLog.dropped_offsets): set at load, never
        # changed after (reads filter by the log start offset): an immutable tuple
        self.dropped_offsets = dropped_offsets
        # the partitionLeaderEpoch every batch is written with: the latest epoch of the
        # partition's leader-epoch-checkpoint (0 unless imported from Kafka: checkpoints.py),
        # so that the epochs of its batches never go backwards
        self.leader_epoch = leader_epoch
        self.view = LogView.build(self._segments, self._log_start_offset, self._next_offset, active.size)
        self.key_index = KeyIndex(directory)
        # for the other shards of a family (LogManager._publish_slot): bumped whenever the
        # segment list changes; files_changing while segment files are being renamed
        self.generation = 1
        self._published_segments = self._segments
        self.files_changing = False
        self.on_publish: Callable[[PartitionLog], None] | None = None

    @property
    def name(self) -> str:
        return filenames.partition_dir_name(self.topic, self.partition)

    def __repr__(self) -> str:
        return f"PartitionLog({self.name})"

    # -- the writer task ----------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The writer: started once per partition by the log manager; ends after close()."""
        if self._running:
            raise RuntimeError(f"{self.name} already has a writer task")
        self._running = True
        self._loop = asyncio.get_running_loop()
        self._commits = batcher_for(self._loop)
        self._device = self._commits.register(self.directory)
        task_status.started()
        carry: _Op | None = None
        try:
            while True:
                op = carry
                carry = None
                if op is None:
                    op = await self._next_op()
                    if op is None:
                        break
                if isinstance(op, _Append):
                    group = [op]
                    size = op.size
                    while size < MAX_GROUP_BYTES:
                        nxt = self._take()
                        if nxt is None:
                            break
                        if isinstance(nxt, _Append):
                            group.append(nxt)
                            size += nxt.size
                        else:
                            carry = nxt
                            break
                    await self._commit(group)
                else:
                    await self._call(op)  # type: ignore[arg-type]
        finally:
            with anyio.CancelScope(shield=True):
                await self._shutdown()

    async def _next_op(self) -> _Op | None:
        """Wait for the next request; flush deferred writes when flush.ms has passed by the
        log's clock. The wait for that is real time (what is left of flush.ms by the clock),
        after which the clock decides again: an injected clock that has not moved by then does
        not flush, and one moved past flush.ms flushes when tick() wakes the writer."""
        while True:
            due_in = self._flush_due_in()
            if due_in == 0:
                await self._deferred_flush()
                continue
            op = self._take()
            if op is not None:
                return op
            if self._ops_closed:
                return None
            loop = self._loop
            assert loop is not None
            wake = self._wake = loop.create_future()
            timer = None if due_in is None else loop.call_later(due_in / 1000, _wake_up, wake)
            try:
                await wake
            finally:
                self._wake = None
                if timer is not None:
                    timer.cancel()

    # -- the queue ----------------------------------------------------------------------------

    def _take(self) -> _Op | None:
        """The next queued op, if any; lets the first sender waiting for room in."""
        if not self._ops:
            return None
        op = self._ops.popleft()
        if self._room:
            self._pass_room()
        return op

    def _put_nowait(self, op: _Op) -> bool:
        """Queue `op` unless the queue is full or others wait for room (False then); raises
        the closed log's error once the queue is closed."""
        if self._ops_closed:
            raise self._closed_error()
        if len(self._ops) >= QUEUE_DEPTH or self._room:
            return False
        self._enqueue(op)
        return True

    def _enqueue(self, op: _Op) -> None:
        self._ops.append(op)
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _put(self, op: _Op) -> None:
        """Queue `op`, waiting for room in a full queue (after those that waited first). The
        writer's every take hands the room it made to the first sender waiting, who goes in
        ahead of those still waiting."""
        if self._put_nowait(op):
            return
        while True:
            waiter = asyncio.get_running_loop().create_future()
            self._room.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._pass_room()  # the room we were given goes to the next in line
                raise
            if self._ops_closed:
                raise self._closed_error()
            if len(self._ops) < QUEUE_DEPTH:  # (a sender that never waited may have taken it)
                self._enqueue(op)
                return

    def _pass_room(self) -> None:
        while self._room:
            waiter = self._room.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _close_queue(self) -> None:
        """No more ops; the writer ends once it has taken those queued, and senders waiting for
        room get the closed log's error."""
        self._ops_closed = True
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)
        while self._room:
            waiter = self._room.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _flush_due_in(self) -> int | None:
        """Milliseconds until flush.ms passes by the clock; None when nothing waits for it (or
        the partition failed: a restart's recovery takes over)."""
        if self._unflushed_messages == 0 or self.config.flush_ms >= 2**62 or self._failed is not None:
            return None
        now = self.clock()
        if now < self._last_flush_ms:  # the clock went back: flush.ms counts from now
            self._last_flush_ms = now
        return max(0, self._last_flush_ms + self.config.flush_ms - now)

    async def tick(self) -> None:
        """The log's clock moved (an injected one, in tests; the wall clock needs no tick): the
        writer looks at its flush timer now, in order with the requests before, and flushes if
        flush.ms has passed by the clock. Returns once it has."""

        async def check(log: PartitionLog, _result: None) -> None:
            if log._flush_due_in() == 0:
                await log._deferred_flush()

        await self.call_in_writer(None, check)

    async def _deferred_flush(self) -> None:
        """The fsync flush.ms brings (writer task only). If it fails, what it covered may not be
        durable: the partition refuses writes until a restart recovers the log, as after a
        failed commit; the writer itself serves on (reads, close)."""
        try:
            await anyio.to_thread.run_sync(self._flush_sync)
        except EngineError as exc:
            self._failed = exc if isinstance(exc, StorageError) else StorageError(self.directory, str(exc))
            logger.error("partition %s failed, refusing writes until restart: %s", self.name, exc)

    async def _commit(self, group: list[_Append]) -> None:
        """One group commit: its requests are answered by _complete, called by the commit
        batcher in the loop turn the commit's outcome arrives in; the writer waits for that
        before it takes the next group (one commit in flight per partition)."""
        if self._failed is not None:
            self._complete(group, self._failed)
            return
        assert self._commits is not None
        done = self._commits.submit(
            functools.partial(self._commit_write, group), functools.partial(self._complete, group)
        )
        # raises only what _complete raised, or the writer's own cancellation (after the
        # commit, which goes on and is answered: the log's state must not change behind it)
        await _uncancelled(done)

    def _complete(self, group: list[_Append], exc: BaseException | None) -> None:
        """A group commit's outcome (on the loop): publish what it made durable and answer its
        requests; or, if it failed, answer them with its error (one that is no full disk or
        lack of descriptors fails the partition until a restart)."""
        if exc is None:
            self._publish()
            for op in group:
                op.finish()
            return
        error = exc if isinstance(exc, EngineError) else StorageError(self.directory, f"append failed: {exc!r}")
        if isinstance(error, StorageError) and not isinstance(error, TransientStorageError):
            self._failed = error
            logger.error("partition %s failed, refusing writes until restart: %s", self.name, error)
        for op in group:
            # a refused request keeps its own error; a retry answered from the producer
            # state wrote nothing, so it stands
            if op.error is None and not (isinstance(op.result, AppendResult) and op.result.duplicate):
                op.error = error
            op.finish()

    async def _call(self, op: _Call) -> None:
        try:
            if self._failed is not None:
                raise self._failed
            result = await anyio.to_thread.run_sync(op.fn, self) if op.fn else None
            self._publish()
            if op.after is not None:
                result = await op.after(self, result)
            op.result = result
        except Exception as exc:
            op.error = exc
        finally:
            op.finish()

    def _publish(self) -> None:
        active = self._segments[-1]
        self.view = LogView.build(self._segments, self._log_start_offset, self._next_offset, active.size)
        if self._segments is not self._published_segments:
            self._published_segments = self._segments
            self.generation += 1
        if self.on_publish is not None:
            self.on_publish(self)
        self._wake_waiters()

    def _files_changing(self, changing: bool) -> None:
        """Segment files are about to be renamed (True) or are done (False): other shards
        keep reading their previous segment list meanwhile."""
        self.files_changing = changing
        if self.on_publish is not None:
            self.on_publish(self)

    # -- group commit (worker thread) ---------------------------------------------------------
    #
    # As Kafka's UnifiedLog.append (analyzeAndValidateProducerState, LogValidator, maybeRoll,
    # LocalLog.append), in three steps each with one job: _admit decides whether a request is
    # written (its refusal named in op.error, a retry answered from the producer state), _assign
    # gives an admitted request's batches their offsets, _stage rolls, writes and decides the
    # flush, undoing the whole commit if the file system refuses it (_refuse_commit). The
    # commit's state lives in one _GroupCommit; nothing is allocated per batch that was not
    # before the split.

    def _commit_write(self, group: list[_Append]) -> PendingFlush | None:
        """One group commit up to its flush: returns None when it is complete, else the flush
        (fdatasync) that completes it, to be called next (commits.py calls the flushes of many
        partitions' commits in parallel). Each request is checked first (expected offset, idempotent
        producer sequences) in queue order against the state the requests before it leave: a
        refused request gets its own error and takes no offsets, a retry of batches already in
        the log gets their offsets back and writes nothing. The rest are written together. If
        the disk is full, everything this commit wrote is undone and every request in it fails
        with StorageFullError."""
        commit = self._begin_commit(group)
        for op in group:
            if self._admit(commit, op):
                self._assign(commit, op)
        if not commit.batches:
            return None
        return self._stage(commit, len(group))

    def _begin_commit(self, group: list[_Append]) -> _GroupCommit:
        """The commit's state, with the key index's active entries ready for this commit's
        (after a start, pending: their prefix loads in the background, key_index.py; a per-key
        condition waited for it before its request was queued: append)."""
        config = self.config
        now = self.clock()
        keys_on = config.key_index
        index = self.key_index
        if keys_on:
            index.active_for_append(self._segments[-1])
        elif index.active is not None:
            index.forget_active()
        # this commit's keyed records: only when a request has a per-key condition to check
        group_keys: dict[int, list[tuple[int, bytes]]] | None = (
            {} if keys_on and any(op.key_condition is not None for op in group) else None
        )
        append_time = now if config.log_append_time else -1
        return _GroupCommit(now, append_time, self._next_offset, keys_on, group_keys)

    def _admit(self, commit: _GroupCommit, op: _Append) -> bool:
        """Whether `op`'s batches are to be written (Kafka's analyzeAndValidateProducerState,
        then the request's conditions), against the log and the requests before it in this
        commit. If not, `op` is answered already: op.error names the refusal
        (ProducerFencedError or OutOfOrderSequenceError from the producer state,
        OffsetMismatchError, KeyIndexDisabledError, KeyVersionMismatchError, or
        OutOfOrderSequenceError for a retry that changed some of its batches), or op.result is
        a retry's first offsets (every batch already in the log: nothing written, its
        conditions held when it was)."""
        try:
            check, now, pending = self.producer_state.check, commit.now, commit.pending
            duplicates = [check(b.header, now, pending) for b in op.batches]
        except EngineError as exc:
            op.error = exc
            return False
        retry = all(duplicates)  # op.batches is never empty (append refuses that)
        if not retry:
            refused = None
            if op.expected_offset is not None or op.key_condition is not None:
                refused = self._failed_condition(commit, op)
            if refused is None and duplicates.count(None) != len(duplicates):
                # some of its batches are in the log, not all: part of a retried request changed
                first = next(b.header for b, d in zip(op.batches, duplicates) if d is None)
                refused = OutOfOrderSequenceError(
                    first.producer_id, first.producer_epoch, first.base_sequence, None
                )
            if refused is not None:
                op.error = refused
                return False
            return True
        op.result = AppendResult(
            duplicates[0].first_offset, duplicates[-1].last_offset, -1,
            tuple(d.first_offset for d in duplicates), duplicate=True,
            batch_max_timestamps=tuple(d.max_timestamp for d in duplicates),
        )
        return False

    def _failed_condition(self, commit: _GroupCommit, op: _Append) -> EngineError | None:
        """The refusal of `op`'s conditions, None when they hold: its expected offset against
        the commit's next offset (OffsetMismatchError), its key's latest record against the
        log and this commit's records so far (KeyIndexDisabledError, KeyVersionMismatchError)."""
        if op.expected_offset is not None and op.expected_offset != commit.next_offset:
            return OffsetMismatchError(op.expected_offset, commit.next_offset)
        if op.key_condition is None:
            return None
        if not commit.keys_on:
            return KeyIndexDisabledError(self.topic)
        key, expected = op.key_condition
        h = key_hash(key)
        assert commit.group_keys is not None
        current = next((o for o, k in reversed(commit.group_keys.get(h, ())) if k == key), None)
        if current is None:
            if commit.reads is None:
                commit.reads = key_reads.BatchCache()
            current = key_reads.latest_of(self.view, self.key_index, key, h, commit.reads)
        if not key_reads.condition_holds(expected, current):
            return KeyVersionMismatchError(key, expected, current)
        return None

    def _assign(self, commit: _GroupCommit, op: _Append) -> None:
        """Give an admitted request's batches the commit's next offsets (baseOffset and the
        partition's leader epoch rewritten in place, outside the CRC; LogAppendTime stamped if
        the topic wants it), record them in the commit's
        producer state and key lists, and answer op.result (published only once the commit is)."""
        updated_entry = self.producer_state.updated_entry
        pending, now, append_time = commit.pending, commit.now, commit.append_time
        write, keys_on = commit.batches.append, commit.keys_on
        next_offset = first = commit.next_offset
        epoch = self.leader_epoch
        messages = 0
        bases = []
        for batch in op.batches:
            header = batch.header
            set_base_offset(batch.data, 0, next_offset, epoch)
            max_ts = header.max_timestamp
            if append_time >= 0:
                set_log_append_time(batch.data, 0, header.size, append_time)
                max_ts = append_time
            updated_entry(header, next_offset, max_ts, pending, now)
            bases.append(next_offset)
            last = next_offset + header.last_offset_delta
            write(AppendBatch(batch.data, next_offset, last, max_ts, header.size))
            if keys_on:
                commit.add_keys(batch, next_offset)
            messages += header.records_count
            next_offset = last + 1
        commit.next_offset = next_offset
        commit.messages += messages
        op.result = AppendResult(first, next_offset - 1, append_time, tuple(bases))

    def _stage(self, commit: _GroupCommit, requests: int) -> PendingFlush | None:
        """Write the commit's batches (rolling where Kafka's rules say: _should_roll), advance
        the log's end, and decide the flush: None when the commit is complete (no flush due),
        else the flush that completes it. A TransientStorageError (full disk, no descriptor)
        while writing or flushing undoes the whole commit (_refuse_commit) and fails every
        request written in it; any other StorageError fails the partition (_commit)."""
        config = self.config
        now = commit.now
        # what undoing the commit restores (_refuse_commit)
        segments = self._segments
        before = (self._next_offset, segments, segments[-1].append_state(), self.recovery_point)
        try:
            index_adds, rolled = self._write_batches(commit)
            self._next_offset = commit.next_offset
            unflushed = self._unflushed_messages + commit.messages
            due = unflushed >= config.flush_messages or now - self._last_flush_ms >= config.flush_ms
            if not due:
                self._unflushed_messages = unflushed
        except TransientStorageError as exc:
            self._refuse_commit(exc, before)

        def complete() -> None:
            self.producer_state.commit(commit.pending)
            if rolled:
                self._snapshot_producers(commit.next_offset, now)
            if self._on_commit is not None:
                written = sum(b.size for b in commit.batches)
                self._on_commit(self, requests, commit.messages, written)

        if not due:
            self._add_keys(index_adds)
            complete()
            return None

        def flush(shared_s: float | None = None) -> None:
            try:
                self._flush_sync(shared_s)
            except TransientStorageError as exc:
                self._refuse_commit(exc, before)
            complete()

        index_work = functools.partial(self._add_keys, index_adds) if index_adds else None
        index_keys = sum(len(add[2]) for add in index_adds)
        return PendingFlush(flush, self._segments[-1], self._device, index_work, index_keys)

    def _write_batches(self, commit: _GroupCommit) -> tuple[list[_KeyAdd], bool]:
        """Stage each batch in the active segment, rolling first where it must (Kafka's
        maybeRoll), and write them (one pwritev per segment). Returns the key index entries
        still to add (those of segments it rolled away from are added before they close) and
        whether it rolled. Raises StorageError."""
        config = self.config
        index = self.key_index
        keys_on = commit.keys_on
        batch_keys = commit.batch_keys
        # key index entries to add (_KeyAdd): while the commit's fsync runs when there is one
        # (commits.py), else now
        index_adds: list[_KeyAdd] = []
        segment = self._segments[-1]
        rolled = False
        for i, batch in enumerate(commit.batches):
            if self._should_roll(segment, batch, commit.now):
                self._add_keys(index_adds)  # the segment's entries are complete before it closes
                index_adds = []
                segment.write_staged()
                segment = self._roll_sync(batch.base_offset, commit.now)
                rolled = True
            position = segment.size  # where the batch goes
            segment.stage(batch, config.index_interval_bytes)
            if keys_on:
                active = index.active
                assert active is not None and active.base_offset == segment.base_offset
                index_adds.append((active, *batch_keys[i], position, segment.size))
        segment.write_staged()
        return index_adds, rolled

    def _add_keys(self, adds: list[_KeyAdd]) -> None:
        """Add a commit's key index entries (commit thread; or a flush thread while its fsync
        runs: before the commit is published, and before the partition's next commit). A
        failure leaves the active segment's entries to be rebuilt from its records."""
        try:
            for active, hashes, keys, offsets, position, end in adds:
                if hashes is None:
                    hashes = np.fromiter(map(key_hash, keys), np.uint64, len(keys))
                active.add_many(hashes, offsets, position)
                active.scanned_to = max(active.scanned_to, end)
        except Exception:
            logger.exception("%s: key index entries not added; rebuilt from the segment on next use", self.name)
            self.key_index.forget_active()

    def _refuse_commit(self, exc: TransientStorageError, before: _Before) -> None:
        """A full disk or no descriptor left: undo the commit, refuse it, stay writable."""
        next_offset, segments_before, state_before, recovery_point = before
        self._next_offset = next_offset
        try:
            self._undo_commit(segments_before, state_before, recovery_point, exc)
        except TransientStorageError as undo:
            # the undo itself failed (no descriptor to reopen the file, say): what the commit
            # wrote may still be there, so the partition must not stay writable
            why = f"a failed append could not be undone: {undo.reason}"
            raise StorageError(undo.path, why) from undo
        what = "disk full" if isinstance(exc, StorageFullError) else "no file descriptor left"
        raise type(exc)(exc.path, f"{what}, append refused: {exc.reason}") from exc

    def _snapshot_producers(self, offset: int, now: int) -> None:
        """Save the producer state after every batch below `offset` (on roll and close), if
        there is any. Only an optimisation of recovery, which can always replay the log: a
        failure is logged, and the data already written stands."""
        state = self.producer_state
        if not state.producers and state.snapshot_offset < 0:
            return
        try:
            state.write_snapshot(offset, now)
        except StorageError as exc:
            logger.warning("%s: producer snapshot not written: %s", self.name, exc)

    def _undo_commit(
        self, segments_before: tuple[LogSegment, ...], state_before: tuple, recovery_point: int, cause: StorageError
    ) -> None:
        """Remove what a failed commit wrote: segments it rolled to, and its bytes and index
        entries in the segment that was active. Nothing of it was published. If even this
        fails, the caller's StorageError marks the partition failed."""
        self.key_index.forget_active()  # rebuilt from the segment on next use
        for segment in self._segments[len(segments_before):]:
            segment.close()
            segment.delete_files()
            remove_key_index(self.directory, segment.base_offset)
        if len(self._segments) > len(segments_before):
            self._segments = segments_before
            remove_key_index(self.directory, segments_before[-1].base_offset)  # active again
            fsync_dir(self.directory)
        segments_before[-1].rollback(state_before)
        self.recovery_point = recovery_point
        logger.warning("%s: a group commit was undone: %s", self.name, cause.reason)

    def _flush_sync(self, shared_s: float | None = None) -> None:
        """fdatasync the active segment; with `shared_s`, a syncfs of its filesystem that took
        that long has made it durable already (commits.py)."""
        started = time.perf_counter()
        if shared_s is None:
            self._segments[-1].flush()
        else:
            self._segments[-1].mark_synced()
        if self._on_fsync is not None:
            self._on_fsync(self, time.perf_counter() - started if shared_s is None else shared_s)
        self._unflushed_messages = 0
        self._last_flush_ms = self.clock()
        self.recovery_point = self._next_offset

    def _should_roll(self, segment: LogSegment, batch: AppendBatch, now: int) -> bool:
        """Kafka's rules: segment.bytes, segment.ms, a full index, or a relative offset that
        would not fit in int32. An empty segment never rolls."""
        if segment.size == 0:
            return False
        config = self.config
        if segment.size > config.segment_bytes - batch.size:
            return True
        if segment.offset_index.is_full or segment.time_index.is_full:
            return True
        if not segment.can_hold(batch.last_offset):
            return True
        first_ts = segment.first_timestamp()
        waited = batch.max_timestamp - first_ts if first_ts >= 0 else now - segment.created_ms
        return waited > config.segment_ms

    def _roll_sync(self, base_offset: int, now: int) -> LogSegment:
        """Close the active segment (fsync, final time index entry, trim) and start a new one
        whose files are durable before anything is written to them."""
        old = self._segments[-1]
        old.close_for_append()
        new = LogSegment.create(
            self.directory, base_offset, max_index_bytes=self.config.segment_index_bytes, now_ms=now
        )
        fsync_dir(self.directory)
        self._segments = self._segments + (new,)
        if self.config.key_index:
            self.key_index.rolled(old, base_offset)
        else:
            self.key_index.forget_active()
        if self.config.durable_acks or self._unflushed_messages == 0:
            self.recovery_point = base_offset
        logger.debug("rolled %s at offset %d", self.name, base_offset)
        return new

    # -- public writes ------------------------------------------------------------------------

    async def _submit(self, op: _Op) -> Any:
        self.check_open()
        await self._put(op)
        return await op.wait()

    async def append(
        self, batches: Sequence[PreparedBatch], *, expected_offset: int | None = None, size: int | None = None,
        key_condition: tuple[bytes, int] | None = None,
    ) -> AppendResult:
        """Append validated batches (see prepare_batches) as one unit; returns once durable.

        The batches of one call get consecutive offsets and are never interleaved with other
        producers' batches. With `expected_offset`, they are appended only if the log's next
        offset equals it (OffsetMismatchError otherwise, nothing written). Batches carrying a
        producer id are checked as Kafka's idempotent producer: a retry of batches already
        written returns their offsets (result.duplicate); a sequence gap or an old epoch raises.
        A full disk raises StorageFullError and leaves the log as it was. `size`, the batches'
        total bytes, may be given by a caller that counted them off the event loop (a million
        small batches take a while to add up). With `key_condition` (key, offset), they are
        appended only if that key's latest record is at that offset (-1: the key has no
        records), else KeyVersionMismatchError and nothing written (key_index.py).
        """
        if not batches:
            raise CorruptBatchError("nothing to append")
        if size is None:
            size = sum(b.header.size for b in batches)
        if key_condition is not None:
            await self._keys_ready()
        return await self._submit(
            _Append(batches=batches, size=size, expected_offset=expected_offset, key_condition=key_condition)
        )

    async def _keys_ready(self) -> None:
        """Before a request with a per-key condition is queued: the key index's active entries
        loaded (after a start their prefix may be pending: key_index.py), waited for in a worker
        thread, so that the commit thread, which every partition's appends share, never waits
        for a scan. (If they are dropped again before its commit, that commit loads them.)"""
        if not self.config.key_index or self.key_index.active_ready():
            return
        self.check_open()
        try:
            view = self.view
            load = self.key_index.load_active
            await anyio.to_thread.run_sync(load, view.segments[-1], view.active_end)
        except OSError as exc:
            raise self._read_error(exc) from exc

    def append_soon(
        self, batches: Sequence[PreparedBatch], callback: Callable[[AppendResult | None, BaseException | None], None],
        *, expected_offset: int | None = None, size: int | None = None, key_condition: tuple[bytes, int] | None = None,
    ) -> None:
        """append() for callers that would rather be called back than wait: queues the append
        now and calls `callback(result, None)` or `callback(None, error)` from the writer's
        step as it finishes (no task of the caller's wakes in between: a produce spanning
        partitions, or another shard's append, gets its answer loop turns sooner). Raises
        at once what append() would raise before queueing."""
        self.check_open()
        if not batches:
            raise CorruptBatchError("nothing to append")
        if size is None:
            size = sum(b.header.size for b in batches)

        def done(op: _Op) -> None:
            callback(None, op.error) if op.error is not None else callback(op.result, None)

        op = _Append(batches=batches, size=size, expected_offset=expected_offset, key_condition=key_condition, callback=done)
        # others wait for room already (after them, in order), or the queue is full: wait for
        # room as append() would; a per-key condition waits for the key index first (append)
        keys_on = self.config.key_index
        keys_wait = key_condition is not None and keys_on and not self.key_index.active_ready()
        if keys_wait or self._senders or not self._put_nowait(op):
            task = asyncio.ensure_future(self._send_later(op))
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)

    async def _send_later(self, op: _Op) -> None:
        try:
            if isinstance(op, _Append) and op.key_condition is not None:
                await self._keys_ready()
            await self._put(op)
        except EngineError as exc:
            op.error = exc
            op.finish()

    async def call_in_writer(
        self,
        fn: Callable[[PartitionLog], Any] | None,
        after: Callable[[PartitionLog, Any], Awaitable[Any]] | None = None,
    ) -> Any:
        """Run `fn(self)` in the writer's thread, in order with appends, then publish."""
        return await self._submit(_Call(fn=fn, after=after))

    async def roll(self) -> int:
        """Close the active segment now (if it holds anything); returns the new base offset."""

        def do(log: PartitionLog) -> int:
            if log._segments[-1].size > 0:
                log._roll_sync(log._next_offset, log.clock())
            return log._segments[-1].base_offset

        return await self.call_in_writer(do)

    async def flush(self) -> None:
        await self.call_in_writer(lambda log: log._flush_sync())

    async def delete_records(self, before_offset: int) -> int:
        """Move the log start offset up to `before_offset` (Kafka's DeleteRecords).

        -1 means the high watermark. Offsets above the high watermark raise
        OffsetOutOfRangeError; offsets below the current start change nothing. The new start is
        in log-start-offset-checkpoint before any reader sees it: if that write fails (a full
        disk: StorageFullError), nothing changed. Segments wholly below it are left for the
        retention worker to delete.
        """

        def do(log: PartitionLog) -> int | None:
            target = log._next_offset if before_offset == -1 else before_offset
            if target < 0 or target > log._next_offset:
                raise OffsetOutOfRangeError(before_offset, log._log_start_offset, log._next_offset)
            return target if target > log._log_start_offset else None

        async def after(log: PartitionLog, target: int | None) -> int:
            if target is not None:
                if log._on_log_start_change is not None:
                    await log._on_log_start_change(log, target)  # durable first
                log._log_start_offset = target
                log._publish()
            return log._log_start_offset

        return await self.call_in_writer(do, after)

    async def delete_segments(self, segments: Sequence[LogSegment], *, reason: str = "") -> int:
        """Remove closed segments from the log (retention). Returns bytes removed.

        1. Drop them from the segment list (new view; readers holding the old one keep their
           open descriptors).
        2. Rename their files to *.deleted and fsync the directory. A crash from here on:
           recovery deletes *.deleted files.
        3. Raise the log start offset to the first remaining segment's base offset.
        4. After file.delete.delay.ms, unlink the files and release descriptors.
        The active segment is never deleted; if asked to, the log first rolls.
        """
        targets = {id(s) for s in segments}

        def do(log: PartitionLog) -> tuple[list[LogSegment], bool]:
            if id(log._segments[-1]) in targets and log._segments[-1].size > 0:
                log._roll_sync(log._next_offset, log.clock())
            doomed = [s for s in log._segments[:-1] if id(s) in targets]
            if not doomed:
                return [], False
            doomed_ids = {id(s) for s in doomed}  # never the active segment, even an empty one
            log._segments = tuple(s for s in log._segments if id(s) not in doomed_ids)
            for s in doomed:
                remove_key_index(log.directory, s.base_offset)  # derived: goes first
                s.change_suffix(s.suffix, filenames.DELETED_SUFFIX)
            fsync_dir(log.directory)
            crash_point("delete.after_deleted_rename")
            changed = False
            first = log._segments[0].base_offset
            if first > log._log_start_offset:
                log._log_start_offset = first
                changed = True
            logger.info("%s: deleted segments %s (%s)", log.name, ", ".join(s.name for s in doomed), reason or "requested")
            return doomed, changed

        async def after(log: PartitionLog, result: tuple[list[LogSegment], bool]) -> int:
            doomed, changed = result
            if doomed:
                log._schedule_delete(log, doomed)
            if changed and log._on_log_start_change is not None:
                try:
                    await log._on_log_start_change(log, log._log_start_offset)
                except EngineError as exc:
                    # the segments are gone either way: start-up takes the log start from the
                    # first segment left, so a stale checkpoint loses nothing
                    logger.warning("%s: log start offset not checkpointed: %s", log.name, exc)
            return sum(s.size for s in doomed)

        async with self.files_lock:
            self._files_changing(True)
            try:
                return await self.call_in_writer(do, after)
            finally:
                self._files_changing(False)

    async def replace_segments(self, new_segments: Sequence[LogSegment], old_segments: Sequence[LogSegment]) -> None:
        """Swap compacted segments in for the closed ones they were built from.

        `new_segments` were written by the caller with suffix .cleaned, closed and fsynced.
        1. Rename each new segment .cleaned -> .swap, highest base offset first, and fsync the
           directory. A crash mid-way leaves some .cleaned files: recovery deletes every
           .cleaned file and every .swap at or above the lowest .cleaned base (undo).
        2. Rename the old segments to .deleted; fsync. A crash here: recovery deletes .deleted
           files and the old segment files the .swap files cover, then renames .swap (redo).
        3. Rename .swap -> live names; fsync; publish the new segment list.
        4. After file.delete.delay.ms, unlink the .deleted files.
        """
        new_sorted = sorted(new_segments, key=lambda s: s.base_offset)
        old_ids = {id(s) for s in old_segments}

        def do(log: PartitionLog) -> None:
            live = log._segments
            if id(live[-1]) in old_ids:
                raise ValueError("the active segment cannot be replaced")
            if any(id(s) not in {id(x) for x in live} for s in old_segments):
                raise ValueError("a segment to replace is no longer part of the log")
            for s in old_segments:  # derived, and the new ones' may share their base offsets
                remove_key_index(log.directory, s.base_offset)
            for s in reversed(new_sorted):
                s.change_suffix(filenames.CLEANED_SUFFIX, filenames.SWAP_SUFFIX)
            fsync_dir(log.directory)
            crash_point("swap.after_swap_rename")
            for s in old_segments:
                s.change_suffix(s.suffix, filenames.DELETED_SUFFIX)
            fsync_dir(log.directory)
            crash_point("swap.after_deleted_rename")
            for s in new_sorted:
                s.change_suffix(filenames.SWAP_SUFFIX, "")
            fsync_dir(log.directory)
            crash_point("swap.after_live_rename")
            kept = [s for s in live if id(s) not in old_ids]
            log._segments = tuple(sorted(kept + new_sorted, key=lambda s: s.base_offset))

        async def after(log: PartitionLog, _result: None) -> None:
            log._schedule_delete(log, list(old_segments))

        async with self.files_lock:
            self._files_changing(True)
            try:
                await self.call_in_writer(do, after)
            finally:
                self._files_changing(False)

    # -- reads (any task) ---------------------------------------------------------------------

    async def read_key(self, key: bytes, after_offset: int, max_records: int, max_bytes: int) -> key_reads.KeyRecords:
        """`key`'s records above `after_offset` (key_reads.read_key), in a worker thread."""
        self.check_open()
        if not self.config.key_index:
            raise KeyIndexDisabledError(self.topic)
        try:
            return await anyio.to_thread.run_sync(
                key_reads.read_key, self.view, self.key_index, key, key_hash(key), after_offset, max_records, max_bytes
            )
        except OSError as exc:
            raise self._read_error(exc) from exc

    async def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Wait until the high watermark passes `offset` (woken by the writer's publish, not by
        polling). True if data is there; False after `timeout_s`, or at once once shutdown has
        begun (stop_waiting). Raises LogClosedError (TopicDeletedError after a topic deletion)
        when the log is closed, before or during the wait: a caller looping on this method
        can never spin on a closed log."""
        if self.view.high_watermark > offset:
            return True
        self.check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.waiters += 1
        try:
            # the timeout is the event's (a timer, released through the loop's pacer like the
            # wake-up: wakeups.py), not a cancel scope per waiter
            while self.view.high_watermark <= offset and not (self._closed or self._stop_waiting):
                left = deadline - loop.time()
                if left <= 0 or not await self._data_event.wait(left):
                    break
        finally:
            self.waiters -= 1
        if self.view.high_watermark > offset:
            return True
        self.check_open()
        return False

    # -- closing ------------------------------------------------------------------------------

    async def close(self, *, deleted: bool = False) -> None:
        """Stop accepting requests; the writer finishes what is queued, then shuts down.
        Waiters (long-polls, streams) are released at once with LogClosedError, or
        TopicDeletedError when `deleted` (the topic is being deleted)."""
        self._deleted = self._deleted or deleted
        self._closed = True
        self._wake_waiters()
        self._close_queue()

    async def _shutdown(self) -> None:
        self._closed = True
        self._close_queue()
        # fail anything still queued (only after a cancellation)
        while (op := self._take()) is not None:
            op.error = self._closed_error()
            op.finish()
        if self._failed is None:
            try:
                await closes_for(asyncio.get_running_loop()).call(self._close_sync)
            except EngineError as exc:
                logger.error("closing %s: %s", self.name, exc)
                if isinstance(exc, StorageError):
                    self._failed = exc  # not closed cleanly: the next start recovers it
        self._publish()  # wake long-pollers
        self.stopped.set()

    def _close_sync(self) -> None:
        active = self._segments[-1]
        active.close_for_append()
        self._unflushed_messages = 0
        self.recovery_point = self._next_offset
        self._snapshot_producers(self._next_offset, self.clock())
        if self.config.key_index:  # the next start loads the active entries, not a scan
            self.key_index.write_active(active)

    @property
    def failed(self) -> StorageError | None:
        return self._failed

    def fail(self, error: StorageError) -> None:
        """Refuse writes from now on (reads go on) until a restart recovers the log."""
        if self._failed is None:
            self._failed = error


def _record_keys(batch: PreparedBatch) -> list[bytes | None]:
    """The key of each record of the batch (None: no key), in offset order: as its encoder left
    them, else read from the batch (a producer's batch numbers its records 0..n-1; a control
    batch's records have no key of the log's)."""
    if batch.keys is not None:
        return batch.keys
    header = batch.header
    if header.attributes & CONTROL_BIT:
        return [None] * header.records_count
    fields = split_records(batch.data, header, 0, with_keys=True)
    assert fields.keys is not None
    return fields.keys
