"""A partition another shard owns, as this shard sees it: reads from the files, writes
through the owner.

Reads. The owner publishes the partition's offsets and segment-list generation in the
family's partition table (shards.PartitionTable). A FollowedPartition builds a LogView from
the partition directory's segment files and that slot: every closed segment as it is on
disk, the active one read only up to the published end (`active_end`, a batch boundary below
the high watermark), with its index entries read from the file and held in memory, only
those below that end. The view is rebuilt when the slot changes: the segments are listed
again when the generation moves (a roll, retention, compaction), otherwise only the offsets
move. While the owner renames files (retention, a compaction swap) its slot says CHANGING
and the previous view serves; the segments are listed again once the flag clears, whatever
generation the slot showed meanwhile (the owner publishes the new one first). A segment file
that went away under a reader is found under its .deleted name (the owner unlinks those
only after file.delete.delay.ms).

A listing made while the flag is up may be torn: between a swap's rename of the old segments
to .deleted and of the new ones to their live names, neither is listed, and a view built on
it would skip their records (a compacted log's offsets may have gaps, so nothing would say
so). Such a view is held `torn`: it answers offsets (the slot's), never records. Reads wait
for the owner to finish its renames (`settle`, polling the slot) and list again; a read
that cannot wait (`fetch_slice`, synchronous) is told the owner is unavailable (503, or
Kafka's retriable NOT_LEADER_OR_FOLLOWER).

Nothing here writes a file: an index that fails its sanity check is rebuilt in memory. The
offset ranges recovery dropped (reads say when they cross one) come from the owner's
dropped-offsets-checkpoint (dropped.py), read on first use after each listing.

Writes (appends, delete-records, rolls) are calls to the owner over the shard channel;
wait_for_data is woken by the owner's notes (LogManager._on_wake).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import anyio

from . import dropped, filenames
from .config import LogConfig
from .descriptors import BUDGET
from .errors import (
    CorruptIndexError,
    EngineError,
    LogClosedError,
    PartitionOfflineError,
    ShardUnavailableError,
    StorageError,
    TopicDeletedError,
)
from .fileutil import FileHandle, storage_error
from .index_builder import IndexBuilder
from .log_reads import LogReads
from .offset_index import OffsetIndex
from .segment import LogSegment
from .segments import LogView
from .shards import CHANGING, SlotState, slot_key
from .time_index import TimeIndex
from .wakeups import PacedEvent

if TYPE_CHECKING:
    from .partition_log import AppendResult, PreparedBatch

logger = logging.getLogger("eventlog.engine")

# the active segment's index entries are read again once this much more has been published
ACTIVE_REFRESH_BYTES = 1024 * 1024
# a read that finds its view torn looks at the slot again this often, for at most this long
# (the owner's renames and their directory fsyncs take milliseconds; a stuck owner is called
# silent by its heartbeat long before)
SETTLE_POLL_S = 0.002
SETTLE_PATIENCE_S = 10.0


class FollowerSegment(LogSegment):
    """A segment of a partition this shard does not own: read-only, writes nothing."""

    def _rebuild_indexes(self) -> None:
        max_bytes = self._offset_index.max_entries * OffsetIndex.ENTRY_SIZE
        builder = IndexBuilder(self.base_offset, self.index_interval_bytes, max_bytes)
        for header in self.headers(0, self.size):
            builder.add(header.last_offset, header.position, header.size, header.max_timestamp)
        builder.finish_closed()
        self._offset_index = OffsetIndex.in_memory(self._offset_index.path, self.base_offset, max_bytes, builder.offset_entries)
        self._time_index = TimeIndex.in_memory(self._time_index.path, self.base_offset, max_bytes, builder.time_entries)
        self._max_timestamp, self._offset_of_max_timestamp = builder.max_timestamp, builder.offset_of_max_timestamp

    inode: int | None = None  # of the .log this segment was listed as (closed segments)
    _file_offsets: Any = None  # the active segment's index entries read from its files so far
    _file_times: Any = None
    index_inodes: dict[str, int] = {}  # of its .index and .timeindex, as listed

    def _verify_indexes(self) -> None:
        """First use of a closed segment's indexes: read the index files this segment was
        listed with into memory (by name, checked to still be those files, or under .deleted),
        then sanity-check them as the owner does; rebuild them in memory from the .log when a
        file is gone or fails. Mapping them by name could map a compaction's new files."""
        if self.inode is None:
            return super()._verify_indexes()
        with self._index_lock:
            if self._indexes_verified:
                return
            max_bytes = self._offset_index.max_entries * OffsetIndex.ENTRY_SIZE
            offsets = self._read_listed(filenames.INDEX_SUFFIX, OffsetIndex)
            times = self._read_listed(filenames.TIME_INDEX_SUFFIX, TimeIndex)
            if offsets is None or times is None:
                self._rebuild_indexes()
            else:
                self._offset_index = OffsetIndex.in_memory(self._offset_index.path, self.base_offset, max_bytes, offsets)
                self._time_index = TimeIndex.in_memory(self._time_index.path, self.base_offset, max_bytes, times)
                try:
                    self.sanity_check()
                except CorruptIndexError:
                    self._rebuild_indexes()
            self._indexes_verified = True

    def _read_listed(self, suffix: str, kind: type) -> bytes | None:
        inode = self.index_inodes.get(suffix)
        if inode is None:
            return None
        name = f"{self.base_offset:020d}{suffix}"
        for path in (self.directory / name, self.directory / (name + filenames.DELETED_SUFFIX)):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                st = os.fstat(fd)
                if st.st_ino != inode:
                    continue
                data = os.pread(fd, st.st_size, 0)
            finally:
                os.close(fd)
            return data[: len(data) - len(data) % kind.ENTRY_SIZE]
        return None

    @property
    def max_timestamp(self) -> int:
        if self._max_timestamp is None and self.inode is not None:
            self._verify_indexes()  # from the listed files, not by name
        return LogSegment.max_timestamp.fget(self)  # type: ignore[attr-defined]

    def open_handle(self) -> FileHandle:
        """The .log's descriptor, opened by name on first use: the name is checked to still be
        the file this segment was listed as. A compaction swap puts a new file under the same
        name, and the listed one is then found under its .deleted name (the owner unlinks those
        only after file.delete.delay.ms); when neither is it, the caller's view is stale
        (StorageError caused by FileNotFoundError: FollowedPartition lists again)."""
        handle = self._file
        if handle is not None:
            BUDGET.touch(self)
            return handle
        if self.inode is None:
            return super().open_handle()
        BUDGET.touch(self)
        with self._fd_lock:
            if self._file is None:
                for path in (self.log_path, filenames.log_file(self.directory, self.base_offset, filenames.DELETED_SUFFIX)):
                    try:
                        candidate = FileHandle(path, os.O_RDONLY)
                    except FileNotFoundError:
                        continue
                    except OSError as exc:
                        raise storage_error(exc, path, "cannot open segment") from exc
                    if os.fstat(candidate.fd).st_ino == self.inode:
                        self._file = candidate
                        break
                else:
                    gone = FileNotFoundError(2, "the listed segment file is gone", str(self.log_path))
                    raise StorageError(self.log_path, "the listed segment file is gone") from gone
                self._fd_writable = False
            return self._file

    @classmethod
    def active_view(cls, directory: Path, base_offset: int, end: int, high_watermark: int, config: LogConfig) -> FollowerSegment:
        """The owner's active segment, readable up to `end`, with the index entries its files
        hold below that (entries are written with the batches; a partial one is ignored)."""
        _log_path, index_path, time_path = filenames.segment_files(directory, base_offset, "")
        max_bytes = config.segment_index_bytes
        segment = cls(
            directory, base_offset, end,
            OffsetIndex.in_memory(index_path, base_offset, max_bytes, b""),
            TimeIndex.in_memory(time_path, base_offset, max_bytes, b""),
            0,
        )
        segment.index_interval_bytes = config.index_interval_bytes
        segment.refresh_active(end, high_watermark)
        return segment

    def refresh_active(self, end: int, high_watermark: int) -> None:
        """Read the active segment's new index entries, those below `end` (and the high
        watermark): the same segment object, so its open descriptor stays in use. Entries below
        the published end never change, so only the file's bytes past those held are read."""
        max_bytes = self._offset_index.max_entries * OffsetIndex.ENTRY_SIZE
        self._file_offsets = offsets = _more_entries(self._offset_index.path, OffsetIndex, self._file_offsets)
        if len(offsets):
            offsets = offsets[: _prefix(offsets["position"] < end)]
        self._file_times = times = _more_entries(self._time_index.path, TimeIndex, self._file_times)
        if len(times):
            times = times[: _prefix(times["relative_offset"].astype("i8") + self.base_offset < high_watermark)]
        self._offset_index = OffsetIndex.in_memory(self._offset_index.path, self.base_offset, max_bytes, offsets.tobytes())
        self._time_index = TimeIndex.in_memory(self._time_index.path, self.base_offset, max_bytes, times.tobytes())
        self._indexes_verified = True
        self._max_timestamp = self._next_offset = None  # facts of a growing segment: computed again
        self.size = max(self.size, end)


def _gone(exc: BaseException) -> bool:
    """A file that is no longer where the view found it."""
    while exc is not None:
        if isinstance(exc, FileNotFoundError):
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


def _more_entries(path: Path, kind: type, held: Any) -> Any:
    """`held` (the entries of the file at `path` read before, or None), then those the file
    holds after them."""
    import numpy as np

    if held is None:
        held = np.zeros(0, dtype=kind.DTYPE)
    try:
        with open(path, "rb") as f:
            f.seek(len(held) * kind.ENTRY_SIZE)
            data = f.read()
    except FileNotFoundError:
        data = b""
    more = np.frombuffer(data, dtype=kind.DTYPE, count=len(data) // kind.ENTRY_SIZE)
    return np.concatenate([held, more]) if len(held) else more


def _prefix(mask: Any) -> int:
    """Length of the leading run of True in a boolean array."""
    import numpy as np

    bad = np.flatnonzero(~mask)
    return int(bad[0]) if len(bad) else len(mask)


class FollowedPartition(LogReads):
    """A partition owned by another shard (see the module's doc)."""

    def __init__(
        self, manager: Any, topic: str, topic_id: str, partition: int, directory: Path, config: LogConfig, owner: int,
    ) -> None:
        self._manager = manager
        self.topic = topic
        self.topic_id = topic_id
        self.partition = partition
        self.directory = directory
        self.config = config
        self.owner = owner
        self.key = slot_key(topic, topic_id, partition)
        self._slot_index: int | None = None
        self._state: SlotState | None = None
        self._view: LogView | None = None
        self._listed_generation: int | None = None  # the generation _view's segments were listed at
        self._torn = False  # _view was listed while the owner renamed files: offsets only
        self._dropped: dropped.Ranges | None = None  # the owner's dropped-offsets-checkpoint, once read
        self._active_built_end = -1
        self._closed = False
        self._deleted = False
        self._stop_waiting = False
        self._data_event = PacedEvent()
        self.waiters = 0
        self.corrupt_batches = {"recovery": 0, "read": 0}
        self.failed = None
        self.recovery_point = 0
        self.files_lock = anyio.Lock()

    @property
    def name(self) -> str:
        return filenames.partition_dir_name(self.topic, self.partition)

    def __repr__(self) -> str:
        return f"FollowedPartition({self.name}, owner shard {self.owner})"

    @property
    def dropped_offsets(self) -> dropped.Ranges:  # type: ignore[override]
        """The offsets recovery dropped, from the owner's dropped-offsets-checkpoint: read on
        first use after each segment listing (the owner writes it only while it loads the
        partition, before it publishes the partition's slot)."""
        ranges = self._dropped
        if ranges is None:
            ranges = self._dropped = dropped.read_quietly(self.directory)
        return ranges

    # -- the view -----------------------------------------------------------------------------

    def _slot(self) -> SlotState:
        table = self._manager.table
        if self._slot_index is None:
            self._slot_index = table.find(self.owner, self.key)
            if self._slot_index is None:
                raise PartitionOfflineError(self.topic, self.partition, self.directory, f"shard {self.owner} has not opened it")
        state = table.read(self.owner, self._slot_index, self.key)
        if state is None or state.deleted:
            raise self._gone_error()
        if not state.live:
            raise PartitionOfflineError(self.topic, self.partition, self.directory, f"shard {self.owner} does not serve it")
        return state

    def _gone_error(self) -> EngineError:
        """The slot or the directory says the partition is gone. Only the metadata log says a
        topic was deleted: while this shard's image still holds the topic under the same id,
        the owner is between processes or files (seen once in the soak, a controller shard
        starting again), and the request may be retried (503), never told the topic is gone."""
        manager = self._manager
        meta = manager.image.topics.get(self.topic)
        if meta is not None and meta.topic_id == self.topic_id and not manager.stopping:
            logger.warning("%s: its owner's slot or directory is gone, its topic is not", self.name)
            why = f"{self.name} is being republished by its owner"
            return ShardUnavailableError(self.owner, why)
        return TopicDeletedError(self.name, self.topic)

    @property
    def view(self) -> LogView:
        if self._closed:
            raise self._closed_error()
        state = self._slot()
        if state == self._state and self._view is not None and not self._torn:
            return self._view
        old = None if self._torn else self._view
        listed = state.generation == self._listed_generation
        if old is not None and old.active.base_offset == state.active_base and (listed or state.flags & CHANGING):
            # only the offsets moved, or files are being renamed: the previous list still reads.
            # The owner publishes a change's new generation before it clears CHANGING, so the
            # generation in a slot read meanwhile is not the one this list was made at: compare
            # with _listed_generation, never with the last slot read, or the list of before
            # the change would serve until the next one.
            active = old.segments[-1]
            if state.active_end - self._active_built_end >= ACTIVE_REFRESH_BYTES and isinstance(active, FollowerSegment):
                active.refresh_active(state.active_end, state.high_watermark)
                self._active_built_end = state.active_end
            else:
                active.size = max(active.size, state.active_end)
            segments = old.segments[:-1] + (active,)
            view = LogView.build(segments, max(state.log_start_offset, segments[0].base_offset), state.high_watermark, state.active_end)
        else:
            view = self._list(state, old)
            state = self._state  # what the listing matched
        self._state, self._view = state, view
        return view

    def _active(self, state: SlotState) -> FollowerSegment:
        self._active_built_end = state.active_end
        return FollowerSegment.active_view(self.directory, state.active_base, state.active_end, state.high_watermark, self.config)

    def _list(self, state: SlotState, old: LogView | None) -> LogView:
        """Segments from the directory listing: closed ones up to the active base (reusing
        those already open), the active one as the slot says."""
        for _ in range(20):
            bases = []
            index_inodes: dict[int, dict[str, int]] = {}
            try:
                with os.scandir(self.directory) as entries:
                    for entry in entries:
                        parsed = filenames.parse_segment_file(entry.name)
                        if parsed is None or parsed[2] != "":
                            continue
                        # the inode stat() gives, which fstat() of the opened file is compared
                        # with: a listing's d_ino (entry.inode()) is not the file's inode on
                        # every filesystem (FUSE's high-level API without use_ino makes its own)
                        try:
                            inode = entry.stat(follow_symlinks=False).st_ino
                        except FileNotFoundError:
                            continue  # renamed away since the listing
                        if parsed[1] == filenames.LOG_SUFFIX:
                            bases.append((parsed[0], inode))
                        else:
                            index_inodes.setdefault(parsed[0], {})[parsed[1]] = inode
            except FileNotFoundError:
                raise self._gone_error() from None
            bases.sort()
            # a closed segment already open is kept only if it is the same file (a compaction
            # swap puts a new file under the same base offset)
            known = {(s.base_offset, s.inode): s for s in (old.segments[:-1] if old is not None else ())}  # type: ignore[attr-defined]
            segments: list[LogSegment] = []
            for base, inode in bases:
                if base >= state.active_base:
                    break
                seg = known.get((base, inode))
                if seg is None:
                    try:
                        seg = FollowerSegment.open_existing(self.directory, base, max_index_bytes=self.config.segment_index_bytes)
                    except CorruptIndexError:
                        seg = None  # its owner rebuilds it at its next start; scan meanwhile
                    except StorageError:
                        continue  # renamed away since the listing
                    if seg is not None:
                        seg.index_interval_bytes = self.config.index_interval_bytes
                        seg.inode = inode
                        seg.index_inodes = index_inodes.get(base, {})
                if seg is not None:
                    segments.append(seg)
            # the slot again, after the files were stat()ed by name (open_existing takes the
            # size of what the name holds now: a rename between the listing's stat and that one
            # would pair one file's inode with another's size)
            again = self._slot()
            moved = again.generation != state.generation or again.active_base != state.active_base
            if moved or state.active_base not in {b for b, _ in bases}:
                state = again
                reused = {id(seg) for seg in known.values()}
                for seg in segments:
                    if id(seg) not in reused:
                        seg.release_descriptors()
                continue
            # renames only happen under CHANGING, and a change's new generation is published
            # before the flag clears: clear before and after with one generation, nothing moved
            torn = bool((state.flags | again.flags) & CHANGING)
            state = again
            segments.append(self._active(state))
            if old is not None:  # let go of files the owner removed (their space comes back)
                kept = {id(seg) for seg in segments}
                for seg in old.segments:
                    if id(seg) not in kept:
                        seg.release_descriptors()
            self._state = state
            self._dropped = None  # read again on next use
            # a listing made while the owner renames files may miss some: list again after
            self._torn = torn
            self._listed_generation = None if torn else state.generation
            return LogView.build(tuple(segments), max(state.log_start_offset, segments[0].base_offset), state.high_watermark, state.active_end)
        raise StorageError(self.directory, "the segment list kept changing while it was read")

    # -- reads (log_reads.LogReads, once more on a fresh listing) -----------------------------

    def _readable_view(self) -> LogView:
        """The view, for a read that cannot wait: refused while it is torn."""
        view = self.view
        if self._torn:
            why = f"{self.name}'s segment files are being renamed by its owner"
            raise ShardUnavailableError(self.owner, why)
        return view

    async def settle(self) -> LogView:
        """The view, once it is not torn: waits (polling the slot) while the owner renames
        files under a listing this shard had to make meanwhile."""
        view = self.view
        if not self._torn:
            return view
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_PATIENCE_S
        while self._torn:
            if loop.time() > deadline:
                return self._readable_view()
            await asyncio.sleep(SETTLE_POLL_S)
            view = self.view
        return view

    def _on_view(self, fn: Any, *args: Any) -> Any:
        """fn(view, *args); once more on a fresh listing if a file went away under the view
        (retention or a compaction swap renamed it while this shard's view listed it)."""
        try:
            return fn(self._readable_view(), *args)
        except (OSError, StorageError) as exc:
            if not _gone(exc):
                raise
            self._state = self._view = None
            return fn(self._readable_view(), *args)

    async def _on_view_async(self, fn: Any, *args: Any) -> Any:
        try:
            return await fn(await self.settle(), *args)
        except (OSError, StorageError) as exc:
            if not _gone(exc):
                raise
            self._state = self._view = None
            return await fn(await self.settle(), *args)

    # -- waiting for data ---------------------------------------------------------------------

    async def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        if self.view.high_watermark > offset:
            return True
        self.check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.waiters += 1
        try:
            while not (self._closed or self._stop_waiting):
                if self.view.high_watermark > offset:
                    break
                left = deadline - loop.time()
                if left <= 0:
                    break
                # a note can be lost while the channel reconnects: look again now and then (the
                # event's own timer, released through the loop's pacer: wakeups.py)
                await self._data_event.wait(min(left, 1.0))
        finally:
            self.waiters -= 1
        if not self._closed and self.view.high_watermark > offset:
            return True
        self.check_open()
        return False

    async def close(self, *, deleted: bool = False) -> None:
        self._deleted = self._deleted or deleted
        self._closed = True
        self._wake_waiters()
        if self._view is not None:
            for seg in self._view.segments:
                seg.release_descriptors()

    # -- writes: the owner's ------------------------------------------------------------------

    async def append(
        self, batches: Sequence[PreparedBatch], *, expected_offset: int | None = None, size: int | None = None,
        key_condition: tuple[bytes, int] | None = None,
    ) -> AppendResult:
        future = asyncio.get_running_loop().create_future()

        def answered(result: AppendResult | None, error: BaseException | None) -> None:
            if not future.done():
                future.set_result(result) if error is None else future.set_exception(error)

        self.append_soon(batches, answered, expected_offset=expected_offset, size=size, key_condition=key_condition)
        return await future

    def append_soon(
        self, batches: Sequence[PreparedBatch], callback: Callable[[AppendResult | None, BaseException | None], None],
        *, expected_offset: int | None = None, size: int | None = None, key_condition: tuple[bytes, int] | None = None,
    ) -> None:
        """PartitionLog.append_soon, on the owner: the request goes now, the callback runs as
        the owner's answer is read."""
        self.check_open()
        data = b"".join(batches_bytes(batches))
        headers = [b.header for b in batches]
        # the keys an encoder left on the batches travel with them: the owner's key index would
        # otherwise read them back from the records
        batch_keys = [b.keys for b in batches] if any(b.keys is not None for b in batches) else None
        manager = self._manager

        def answered(ok: bool, value: Any) -> None:
            if ok:
                callback(value, None)
            elif isinstance(value, ShardUnavailableError) and manager.stopping:
                callback(None, LogClosedError(self.name))
            else:
                callback(None, value)

        manager.channel.call_soon(
            self.owner, "partition_append", answered, self.topic, self.topic_id, self.partition,
            data, headers, expected_offset, size, key_condition, batch_keys,
        )

    async def delete_records(self, before_offset: int) -> int:
        return await self._call("delete_records", before_offset)

    async def read_key(self, key: bytes, after_offset: int, max_records: int, max_bytes: int) -> Any:
        """PartitionLog.read_key, by the owner (the key index lives there)."""
        return await self._call("read_key", key, after_offset, max_records, max_bytes)

    async def roll(self) -> int:
        return await self._call("roll")

    async def flush(self) -> None:
        await self._call("flush")

    async def _call(self, what: str, *args: Any) -> Any:
        self.check_open()
        try:
            return await self._manager.channel.call(self.owner, "partition", what, self.topic, self.topic_id, self.partition, *args)
        except ShardUnavailableError:
            if self._manager.stopping:
                raise LogClosedError(self.name) from None
            raise


def batches_bytes(batches: Sequence[PreparedBatch]) -> list[bytes | memoryview]:
    return [b.data for b in batches]
