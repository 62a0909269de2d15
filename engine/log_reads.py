"""The read side of a partition, shared by the log this process writes (partition_log.PartitionLog)
and a partition another shard owns (follower.FollowedPartition): fetch slices, decoded records,
time lookups, each on the event loop when small and cached, in a worker thread otherwise; and
the state its waiters (long-polls, streams) look at: closed, deleted, stop_waiting.

A class using it provides `view` (the LogView reads work from), `name`, `topic`, `directory`,
`corrupt_batches`, `waiters`, `dropped_offsets` and the flags `_closed`, `_deleted`, `_stop_waiting` with
`_data_event` (a wakeups.PacedEvent replaced at each wake-up that finds waiters); a follower
also overrides `_on_view` to read again on a fresh view when a file went away under the one it
had.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import anyio

from . import checkpoints, dropped, reader
from .errors import (
    CorruptDataError,
    LogClosedError,
    StorageError,
    TopicDeletedError,
    TransientStorageError,
)
from .fileutil import storage_error
from .reader import FetchSlice
from .segments import LogView
from .wakeups import PacedEvent

logger = logging.getLogger("eventlog.engine")

LARGE_READ_BYTES = 64 * 1024
# read_records decodes on the event loop only up to these (fetch's defaults, an SSE chunk)
INLINE_READ_RECORDS = 1000
INLINE_READ_BYTES = 1024 * 1024


class LogReads:
    view: LogView
    name: str
    topic: str
    directory: Path
    corrupt_batches: dict[str, int]
    # offset ranges recovery dropped (dropped.py), ascending: an immutable tuple, () nearly always
    dropped_offsets: dropped.Ranges = ()
    _closed: bool
    _deleted: bool
    _stop_waiting: bool
    _data_event: PacedEvent

    _epochs: checkpoints.LeaderEpochs | None = None

    @property
    def leader_epochs(self) -> checkpoints.LeaderEpochs:
        """The partition's leader-epoch history, (epoch, start offset) ascending: what Kafka's
        OffsetForLeaderEpoch answers from. Read once from its leader-epoch-checkpoint (an
        imported partition keeps Kafka's; one eventlog made has [(0, start)]): a partition's
        epoch never moves after it is made (one replica, no elections)."""
        epochs = self._epochs
        if epochs is None:
            try:
                epochs = checkpoints.read_leader_epoch_checkpoint(self.directory) or []
            except (OSError, StorageError):
                epochs = []
            self._epochs = epochs = epochs or [(0, 0)]
        return epochs

    @property
    def current_leader_epoch(self) -> int:
        """The epoch this partition's batches are written in: its history's latest."""
        return self.leader_epochs[-1][0]

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's LeaderEpochFileCache.endOffsetFor: (the largest epoch <= `epoch`, the offset
        where the next epoch starts, or the log end for the latest); (-1, -1) for an epoch
        past the latest, or before the first with nothing to say."""
        epochs = self.leader_epochs
        latest = epochs[-1][0]
        if epoch == latest:
            return latest, self.view.high_watermark
        if epoch > latest or epoch < 0:
            return -1, -1
        floor = None
        for entry_epoch, start in epochs:
            if entry_epoch > epoch:
                return (floor if floor is not None else epoch), start
            floor = entry_epoch
        return -1, -1

    def _on_view(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(view, *args) on the current view."""
        return fn(self.view, *args)

    async def _on_view_async(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await fn(self.view, *args)

    async def settle(self) -> LogView:
        """The view, once records may be read from it: an owned log's at once; a followed
        one's may first wait for its owner to finish renaming files (follower.py)."""
        return self.view

    @property
    def high_watermark(self) -> int:
        return self.view.high_watermark

    @property
    def log_start_offset(self) -> int:
        return self.view.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.view.high_watermark

    def dropped_in(self, first: int, last: int) -> dropped.Ranges:
        """The offsets in [first, last] that recovery dropped (at or above the log start
        offset): what a read that covered them must say it could not answer."""
        ranges = self.dropped_offsets
        if not ranges:
            return ()
        return dropped.crossing(ranges, max(first, self.log_start_offset), last)

    def check_offset(self, offset: int, view: LogView | None = None) -> LogView:
        return reader.check_offset(view or self.view, offset)

    def fetch_slice(self, offset: int, max_bytes: int) -> FetchSlice | None:
        try:
            return self._on_view(reader.fetch_slice, offset, max_bytes)
        except OSError as exc:
            raise self._read_error(exc) from exc

    async def read_slice(self, slice_: FetchSlice) -> bytes | memoryview:
        """The bytes of a slice: on the event loop when small or already in the page cache,
        otherwise in a worker thread, so a read that must wait for the disk never blocks it."""
        try:
            if slice_.size <= LARGE_READ_BYTES:
                return slice_.read()
            data = slice_.read_if_cached()
            if data is not None:
                return data
            return await anyio.to_thread.run_sync(slice_.read)
        except OSError as exc:
            raise self._read_error(exc) from exc

    async def read_records(self, offset: int, max_records: int, max_bytes: int) -> reader.RecordsResult:
        """Decoded records from `offset` on (at most `max_records`, about `max_bytes` of batches):
        on the event loop when the read is small (INLINE_READ_RECORDS, INLINE_READ_BYTES) and
        the page cache holds the data, else in a worker thread (decoding costs about 1 us a
        record: 100 000 of them inline would stop the loop for a tenth of a second)."""
        try:
            return await self._on_view_async(_read_records, offset, max_records, max_bytes)
        except OSError as exc:
            raise self._read_error(exc) from exc
        except CorruptDataError as exc:
            self.corrupt_batches["read"] += 1
            logger.error("%s: read refused: %s", self.name, exc)
            raise

    def _read_error(self, exc: OSError) -> StorageError:
        """A failed read fails that request only, and the log stays usable: EIO (a bad sector)
        is a StorageError, EMFILE and the other transient errnos a TooManyOpenFilesError (503
        with Retry-After), as fileutil.storage_error decides for every path."""
        error = storage_error(exc, exc.filename or self.directory, "read failed")
        if isinstance(error, TransientStorageError):
            logger.warning("%s: read refused: %s", self.name, error.reason)
        else:
            logger.error("%s: read failed: %s", self.name, exc)
        return error

    async def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """Kafka's ListOffsets by time (a few index searches and small reads: inline)."""
        try:
            await self.settle()
            return self._on_view(reader.offset_for_timestamp, timestamp)
        except OSError as exc:
            raise self._read_error(exc) from exc

    async def max_timestamp_offset(self) -> tuple[int, int] | None:
        try:
            await self.settle()
            return self._on_view(reader.max_timestamp_offset)
        except OSError as exc:
            raise self._read_error(exc) from exc


    # -- waiters and the closed state --------------------------------------------------------

    def stop_waiting(self) -> None:
        """Release every long-poll now and make later ones return at once (shutdown begins:
        the HTTP server waits for open requests before the engine closes)."""
        self._stop_waiting = True
        self._wake_waiters()

    @property
    def waiting_stopped(self) -> bool:
        """stop_waiting() was called: waits return at once."""
        return self._stop_waiting

    def _wake_waiters(self, force: bool = False) -> None:
        if not (self.waiters or force):  # nobody waits on the event: it stays unset and in use
            return
        # its waiters are released a few per loop turn (wakeups.py): thousands of long-polls
        # woken by one publish never hold the loop together
        event, self._data_event = self._data_event, PacedEvent()
        event.set()

    def wake_waiters(self, force: bool = False) -> None:
        """Wake whoever waits on data_event() now, to look at the log again (with `force`,
        also a waiter that does not count itself in `waiters`)."""
        self._wake_waiters(force)

    def data_event(self) -> PacedEvent:
        """Set at the next publish (or close, shutdown, wake_waiters). Whoever waits on it
        counts itself in `waiters` meanwhile, or it may not be woken."""
        return self._data_event

    def check_open(self) -> None:
        """Raise LogClosedError (TopicDeletedError once the topic is deleted) if closed."""
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> LogClosedError:
        return TopicDeletedError(self.name, self.topic) if self._deleted else LogClosedError(self.name)

    @property
    def closed(self) -> bool:
        return self._closed


async def _read_records(view: LogView, offset: int, max_records: int, max_bytes: int) -> reader.RecordsResult:
    if max_records <= INLINE_READ_RECORDS and max_bytes <= INLINE_READ_BYTES:
        try:
            return reader.read_records(view, offset, max_records, max_bytes, cached_only=True)
        except reader.NotCached:
            pass
    return await anyio.to_thread.run_sync(reader.read_records, view, offset, max_records, max_bytes)
