"""One log segment: a .log file of Kafka v2 batches with its .index and .timeindex.

Files (see docs/FORMAT.md): <base>.log, <base>.index, <base>.timeindex, where <base> is the
offset of the segment's first record, 20 digits. Every batch in the .log passed validation
when appended; batches are stored exactly as appended, back to back, offsets increasing.

Life cycle:
    create() -> active: the writer appends (append()), fsyncs (flush()); the indexes' entries
    are held in memory and written with pwrite along with the batches (index_file.py).
    close_for_append() (on roll and clean shutdown) adds the final time index entry, trims the
    indexes and makes the segment read-only.
    open_existing() -> a closed segment: nothing is opened or mapped until first use.
    open_for_append() makes the last segment of a loaded log active again, lazily: its .log is
    opened for writing by the first write.

Descriptors. A segment opens its .log (and an active one its index files) on first use and
keeps the handles until closed, or until the engine's descriptor budget takes them back from
the least recently used segments (release_descriptors(), descriptors.py): a read or a write in
flight keeps its handle, and the next use opens a new one.

An active segment with unflushed writes gives its .log's descriptor back too, so an idle
partition holds no descriptor whatever its flush settings (issue 28: 25,000 partitions under an
open-files limit of 20,000). Its next flush() opens the .log again and fdatasyncs that
descriptor, which is exact on Linux: fdatasync writes back every dirty page of the file, however
it was written, and a write-back error that no descriptor has reported yet is reported to one
opened after it (errseq "always report a writeback error once", Linux 4.17 and the stable
kernels it went back to; the engine's other descriptors of a .log never fsync, so nothing else
reports it first). What remains is the kernel's own caveat: an error can be lost if the inode
is evicted from memory while no descriptor holds it (memory pressure between the release and the
flush, after its pages failed write-back). `_dirty` (written since the last fdatasync) says a
flush is owed; `_unsynced` is only the descriptor to use while it is still held.

Index placement (Kafka >= 3.7, per batch): before counting a batch, if more than
index.interval.bytes were appended since the last entry, add (batch last offset, batch start
position) to the offset index and (largest timestamp so far, its batch's last offset) to the
time index if that timestamp grew.

Mutating methods belong to the partition's writer (run in its worker thread). Reads
(read_bytes, find_batch, headers, find_timestamp, ...) are safe from any task or thread; they
never read past the end position the caller passes, which for the active segment is the
published high watermark's position.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from . import filenames, repair
from .descriptors import BUDGET
from .errors import CorruptBatchError, CorruptIndexError, CorruptSegmentError, StorageError
from .fileutil import (
    DISK_FULL_ERRNOS,
    FileHandle,
    fdatasync,
    io_errors,
    pread_exact,
    pwrite_all,
    storage_error,
)
from .format import HEADER_SIZE, NO_TIMESTAMP, BatchHeader, parse_header
from .index_builder import IndexBuilder
from .offset_index import OffsetIndex
from .records import find_record_at_or_after
from .scan import BatchScanner, scan_headers
from .time_index import TimeIndex

INT32_MAX = 2**31 - 1

logger = logging.getLogger("eventlog.engine")


@dataclass(frozen=True, slots=True)
class AppendBatch:
    """A batch ready to append: its bytes (offsets already assigned) and header facts."""

    data: bytes | bytearray | memoryview
    base_offset: int
    last_offset: int
    max_timestamp: int
    size: int


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    valid_bytes: int  # the segment's size after recovery
    truncated_bytes: int  # bytes dropped, at the tail and in between
    next_offset: int | None  # None when the segment holds no batch
    batches: int
    error: str | None  # why the first dropped bytes were dropped
    damaged: tuple[repair.DamagedRange, ...] = ()  # every dropped range, in file order


class LogSegment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        size: int,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        created_ms: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.size = size
        self._offset_index = offset_index
        self._time_index = time_index
        self._indexes_verified = offset_index.appendable
        self.index_interval_bytes = 4096  # what a lazy index rebuild uses; the loader sets it
        self.created_ms = created_ms
        self.suffix = ""
        self._file: FileHandle | None = None
        self._fd_writable = False  # _file was opened for writing
        self._appendable = False  # the active segment: appends allowed
        # the handle the last unsynced write went through, while the budget leaves it to us:
        # flush() fsyncs that very descriptor, else one opened anew (module docstring)
        self._unsynced: FileHandle | None = None
        self._dirty = False  # written (or truncated) since the last fdatasync, by any descriptor
        self._fd_lock = threading.Lock()
        self._index_lock = threading.Lock()
        self._max_timestamp: int | None = None  # None = not loaded yet
        self._offset_of_max_timestamp: int | None = None
        self._first_timestamp: int | None = None
        self._next_offset: int | None = None  # None = not loaded yet
        self._bytes_since_last_index_entry = 0
        self._staged: list = []
        self._staged_bytes = 0
        self.closed = False

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, *, max_index_bytes: int, now_ms: int, suffix: str = ""
    ) -> LogSegment:
        """Create empty files for a new active segment. The caller fsyncs the directory."""
        log_path, index_path, time_path = filenames.segment_files(directory, base_offset, suffix)
        with io_errors(log_path, "cannot create segment"):
            handle = FileHandle(log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        segment = cls(
            directory,
            base_offset,
            0,
            OffsetIndex.create_appendable(index_path, base_offset, max_index_bytes),
            TimeIndex.create_appendable(time_path, base_offset, max_index_bytes),
            now_ms,
        )
        segment.suffix = suffix
        segment._file = handle
        segment._fd_writable = True
        segment._appendable = True
        BUDGET.touch(segment)
        segment._max_timestamp = NO_TIMESTAMP
        segment._offset_of_max_timestamp = base_offset
        segment._next_offset = base_offset
        return segment

    @classmethod
    def open_existing(
        cls, directory: Path, base_offset: int, *, max_index_bytes: int, suffix: str = ""
    ) -> LogSegment:
        """A closed segment; only stats its files. Raises CorruptIndexError for a bad index size."""
        log_path, index_path, time_path = filenames.segment_files(directory, base_offset, suffix)
        with io_errors(log_path, "cannot open segment"):
            st = os.stat(log_path)
        index_size = _size_or_none(index_path)
        time_size = _size_or_none(time_path)
        if index_size is None or time_size is None:
            raise CorruptIndexError(index_path if index_size is None else time_path, "index file is missing")
        segment = cls(
            directory,
            base_offset,
            st.st_size,
            OffsetIndex.open_read_only(index_path, base_offset, max_index_bytes, index_size),
            TimeIndex.open_read_only(time_path, base_offset, max_index_bytes, time_size),
            int(st.st_mtime * 1000),
        )
        segment.suffix = suffix
        return segment

    # -- indexes ------------------------------------------------------------------------------

    @property
    def offset_index(self) -> OffsetIndex:
        if not self._indexes_verified:
            self._verify_indexes()
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        if not self._indexes_verified:
            self._verify_indexes()
        return self._time_index

    def _verify_indexes(self) -> None:
        """First use of a closed segment's indexes: sanity-check them (Kafka does the same
        lazily); if they fail, rebuild both from the .log and swap them in."""
        with self._index_lock:
            if self._indexes_verified:
                return
            try:
                self.sanity_check()
            except CorruptIndexError as exc:
                logger.warning("%s: %s; rebuilding its indexes", self.directory.name, exc)
                self._rebuild_indexes()
            self._indexes_verified = True

    def _rebuild_indexes(self) -> None:
        """Recompute both indexes from the batch headers and replace the files atomically
        (temp file, fsync, rename). Readers holding the old objects keep their mappings."""
        max_bytes = self._offset_index.max_entries * OffsetIndex.ENTRY_SIZE
        builder = IndexBuilder(self.base_offset, self.index_interval_bytes, max_bytes)
        for header in self.headers(0, self.size):
            if header.base_offset < self.base_offset or not self.can_hold(header.last_offset):
                raise CorruptSegmentError(
                    self.log_path, f"at byte {header.position}: offset {header.last_offset} does not fit the segment"
                )
            builder.add(header.last_offset, header.position, header.size, header.max_timestamp)
        self._offset_index, self._time_index = builder.write_closed(
            self._offset_index.path, self._time_index.path, max_bytes, in_memory_if_full=True
        )
        self._max_timestamp, self._offset_of_max_timestamp = builder.max_timestamp, builder.offset_of_max_timestamp

    # -- paths --------------------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return filenames.log_file(self.directory, self.base_offset, self.suffix)

    @property
    def name(self) -> str:
        return self.log_path.name

    def open_handle(self) -> FileHandle:
        """The .log's descriptor, opened on first use. Hold the returned handle for as long as
        its descriptor is in use (pread, sendfile): it closes when the last holder drops it."""
        BUDGET.touch(self)
        handle = self._file
        if handle is not None:
            return handle
        with self._fd_lock:
            if self._file is None:
                with io_errors(self.log_path, "cannot open segment"):
                    self._file = FileHandle(self.log_path, os.O_RDONLY)
                self._fd_writable = False
            return self._file

    def _writable_handle(self) -> FileHandle:
        """The .log opened for writing (active segment only), reopened if the descriptor
        budget took it back. Hold the returned handle for the whole write."""
        BUDGET.touch(self)
        handle = self._file
        if handle is not None and self._fd_writable:
            return handle
        with self._fd_lock:
            if self._file is None or not self._fd_writable:
                with io_errors(self.log_path, "cannot open segment for appends"):
                    self._file = FileHandle(self.log_path, os.O_RDWR)
                self._fd_writable = True
            return self._file

    def release_descriptors(self) -> bool:
        """Let go of this segment's descriptors (the descriptor budget is spent); in-flight
        reads and writes keep theirs, the next use reopens. False if the segment is busy
        opening one right now, or is leaving the log (its handles are pinned for readers).

        Unflushed writes do not pin the .log's descriptor: `_dirty` remembers that a flush is
        owed, and flush() opens the file again (module docstring: why that is exact)."""
        if self.suffix == filenames.DELETED_SUFFIX or not self._fd_lock.acquire(blocking=False):
            return False
        try:
            self._file = None
            self._fd_writable = False
            self._unsynced = None  # a flush in flight holds its own reference
        finally:
            self._fd_lock.release()
        self._offset_index.release_handle()
        self._time_index.release_handle()
        return True

    # -- facts --------------------------------------------------------------------------------

    @property
    def max_timestamp(self) -> int:
        """Largest timestamp in the segment (NO_TIMESTAMP if none). A closed segment reads it
        from its time index's last entry with one small read (no mapping, no verification:
        a lookup that then uses this segment's indexes verifies them first)."""
        if self._max_timestamp is None:
            if self._indexes_verified:
                ts, offset = self._time_index.last_entry()
            else:
                last = self._time_index.last_entry_from_file()
                ts, offset = (NO_TIMESTAMP, self.base_offset) if last is None else (last[0], last[1] + self.base_offset)
            self._offset_of_max_timestamp = offset
            self._max_timestamp = ts
        return self._max_timestamp

    @property
    def offset_of_max_timestamp(self) -> int:
        if self._max_timestamp is None:
            self.max_timestamp  # noqa: B018 (loads both)
        assert self._offset_of_max_timestamp is not None
        return self._offset_of_max_timestamp

    def first_timestamp(self, end_position: int | None = None) -> int:
        """maxTimestamp of the first batch (Kafka's roll base), NO_TIMESTAMP if empty."""
        if self._first_timestamp is None:
            end = self.size if end_position is None else end_position
            if end < HEADER_SIZE:
                return NO_TIMESTAMP
            handle = self.open_handle()  # held while its descriptor is in use
            header = parse_header(pread_exact(handle.fd, HEADER_SIZE, 0), 0)
            self._first_timestamp = header.max_timestamp
        return self._first_timestamp

    @property
    def next_offset(self) -> int:
        """One past the last offset in the segment (base_offset when empty)."""
        if self._next_offset is None:
            last = None
            _, position = self.offset_index.last_entry()
            for header in self._headers_from_index(position, self.size):
                last = header
            self._next_offset = self.base_offset if last is None else last.next_offset
        return self._next_offset

    # -- appending (writer only) --------------------------------------------------------------

    def open_for_append(self) -> None:
        """Make this (last) segment active again: its index entries read into memory for
        appends. The .log is opened for writing by the first write, not now, so a log that is
        only read holds no writable descriptor."""
        if self._appendable:
            return
        # load lazily computed facts from the read-only files before switching the indexes
        self.max_timestamp  # noqa: B018
        self.next_offset  # noqa: B018
        self._offset_index.open_for_append()
        self._time_index.open_for_append()
        self._indexes_verified = True
        self._appendable = True

    @property
    def active(self) -> bool:
        """Open for appends (the log's last segment)."""
        return self._appendable

    def can_hold(self, batch_last_offset: int) -> bool:
        return batch_last_offset - self.base_offset <= INT32_MAX

    def stage(self, batch: AppendBatch, index_interval_bytes: int) -> None:
        """Place `batch` at the end of the segment: index entries now, bytes at write_staged().

        `size` grows at once (roll decisions need it); readers never look past the published
        end position, and index entries for unpublished data point above it, so staging is
        invisible to them.
        """
        position = self.size
        if position == 0:
            self._first_timestamp = batch.max_timestamp
        if batch.max_timestamp > self.max_timestamp:
            self._max_timestamp = batch.max_timestamp
            self._offset_of_max_timestamp = batch.last_offset
        if self._bytes_since_last_index_entry > index_interval_bytes:
            self._offset_index.append(batch.last_offset, position)
            self._time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += batch.size
        self._staged.append(batch.data)
        self._staged_bytes += batch.size
        self.size = position + batch.size
        self._next_offset = batch.last_offset + 1

    def write_staged(self) -> None:
        """Write every staged batch with one pwritev (more only past IOV_MAX buffers), then the
        index entries they added. Raises StorageError (StorageFullError, TooManyOpenFilesError:
        the caller undoes the append with rollback())."""
        if not self._staged:
            return
        assert self._appendable
        position = self.size - self._staged_bytes
        try:
            handle = self._writable_handle()  # held while its descriptor is in use
            self._unsynced = handle
            self._dirty = True
            pwrite_all(handle.fd, self._staged, position)
        except OSError as exc:
            raise storage_error(exc, self.log_path, "append failed") from exc
        self._staged = []
        self._staged_bytes = 0
        self._offset_index.write_pending()
        self._time_index.write_pending()

    def append_state(self) -> tuple:
        """What rollback() needs to undo appends made after this call (active segment only)."""
        return (
            self.size, self.max_timestamp, self.offset_of_max_timestamp, self._first_timestamp,
            self.next_offset, self._bytes_since_last_index_entry,
            self._offset_index.entries, self._time_index.entries,
        )

    def rollback(self, state: tuple) -> None:
        """Undo everything appended since append_state() returned `state`: drop staged batches,
        truncate the .log, forget later index entries. For an append that failed (a full disk):
        none of it was published or acknowledged. The segment may have been closed for append
        by a roll in between; it is made active again."""
        (size, max_ts, offset_of_max_ts, first_ts, next_offset, since_entry, offset_entries, time_entries) = state
        self._staged = []
        self._staged_bytes = 0
        if not self._appendable:
            self.open_for_append()
        with io_errors(self.log_path, "cannot undo a failed append"):
            handle = self._unsynced or self._writable_handle()
            self._dirty = True
            os.ftruncate(handle.fd, size)
        try:
            fdatasync(handle.fd)
            self._unsynced = None
            self._dirty = False
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                # never transient (not storage_error): an undo that fails must fail the partition
                raise StorageError(self.log_path, f"cannot undo a failed append: {exc}") from exc
            # still full: the next append's fdatasync makes the shorter size durable before
            # anything is acknowledged
            logger.warning("%s: fsync after undoing an append failed: %s", self.log_path, exc)
        self._offset_index.truncate_entries(offset_entries)
        self._time_index.truncate_entries(time_entries)
        self.size = size
        self._max_timestamp = max_ts
        self._offset_of_max_timestamp = offset_of_max_ts
        self._first_timestamp = first_ts
        self._next_offset = next_offset
        self._bytes_since_last_index_entry = since_entry

    def append(self, batches: list[AppendBatch], index_interval_bytes: int) -> None:
        """stage() each batch, then write them all."""
        for batch in batches:
            self.stage(batch, index_interval_bytes)
        self.write_staged()

    def flush(self) -> None:
        """fdatasync the .log (indexes are rebuilt by recovery, so they are synced on close),
        through the descriptor the unsynced writes went through while it is held, else through
        one opened now (the budget took it back: exact on Linux, see the module docstring)."""
        if self._appendable:
            try:
                handle = self._unsynced or self._writable_handle()  # held while in use
                fdatasync(handle.fd)
                self._unsynced = None
                self._dirty = False
            except OSError as exc:
                raise storage_error(exc, self.log_path, "fsync failed") from exc

    def sync_fd(self) -> int:
        """The descriptor flush() would fdatasync (the one the unsynced writes went through)."""
        return (self._unsynced or self._writable_handle()).fd

    def mark_synced(self) -> None:
        """What flush() leaves, for a .log a syncfs of its filesystem made durable (its writes
        were made before that syncfs began, and it reported no error)."""
        self._unsynced = None
        self._dirty = False

    def close_for_append(self) -> None:
        """Roll or clean shutdown: final time index entry, fsync, trim indexes, read-only."""
        if not self._appendable:
            return
        self.write_staged()
        if self.max_timestamp != NO_TIMESTAMP:
            self._time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        if self._dirty:  # else nothing was written since the last fdatasync
            self.flush()
        self._offset_index.close_for_append()
        self._time_index.close_for_append()
        # keep the descriptor for readers; it no longer needs write access but that is harmless
        self._appendable = False

    # -- reading (any task or thread) ---------------------------------------------------------

    def read_bytes(self, position: int, size: int) -> bytes:
        handle = self.open_handle()
        return pread_exact(handle.fd, size, position)

    def headers(self, start: int, end: int) -> Iterator[BatchHeader]:
        """Headers of the batches in [start, end), which must begin on a batch boundary.

        Raises CorruptSegmentError if the bytes there are not a run of batch headers (an index
        that points into the middle of a batch, or a damaged closed segment).
        """
        handle = self.open_handle()  # held while the generator runs
        try:
            yield from scan_headers(handle.fd, start, end)
        except CorruptBatchError as exc:
            raise CorruptSegmentError(self.log_path, f"at byte {exc.position}: {exc.reason}") from None

    def _headers_from_index(self, start: int, end: int) -> Iterator[BatchHeader]:
        """headers() from an index-given position. If the index led astray (the bytes there
        are not a batch), rebuild the indexes and continue with a scan from the segment start,
        so that no record is ever skipped."""
        yielded_end = start
        try:
            for header in self.headers(start, end):
                yield header
                yielded_end = header.position + header.size
            return
        except CorruptSegmentError:
            if start == 0:
                raise
            logger.warning(
                "%s/%s: index position %d is not a batch boundary; rebuilding indexes",
                self.directory.name, self.name, start,
            )
            if not self._offset_index.appendable:
                with self._index_lock:
                    self._rebuild_indexes()
        for header in self.headers(0, end):
            if header.position >= yielded_end:
                yield header

    def find_batch(self, offset: int, end_position: int) -> BatchHeader | None:
        """The first batch whose last offset >= `offset`, within [0, end_position); None if none."""
        _, start = self.offset_index.lookup(offset)
        if start >= end_position:
            start = 0
        for header in self._headers_from_index(start, end_position):
            if header.last_offset >= offset:
                return header
        return None

    def batch_end_within(self, first: BatchHeader, limit: int, end_position: int) -> tuple[int, int]:
        """Extend a read that starts with batch `first` by whole batches up to byte `limit`:
        (end position, next offset).

        The run always holds `first`, whatever its size, and otherwise only batches that end
        at or before `limit` (and `end_position`). The offset index lets the scan jump to the
        last indexed batch starting before `limit`, so a cut costs one lookup and a scan of
        about index.interval.bytes, not a read of everything in between.
        """
        end, next_offset = first.position + first.size, first.next_offset
        limit = min(limit, end_position)
        if end >= limit:
            return end, next_offset
        # an entry starting before `limit` lies inside the caller's view (limit <= end_position)
        _, skip_to = self.offset_index.lookup_position(limit - 1)
        scan_from = max(skip_to, end)
        for header in self._headers_from_index(scan_from, end_position):
            batch_end = header.position + header.size
            if batch_end > limit:
                if header.position > end:  # jumped ahead, and the batch there does not fit
                    end, next_offset = header.position, header.base_offset
                break
            end, next_offset = batch_end, header.next_offset
            if batch_end >= limit:
                break
        return end, next_offset

    def read_batch(self, header: BatchHeader) -> bytes:
        return self.read_bytes(header.position, header.size)

    def find_timestamp(self, timestamp: int, start_offset: int, end_position: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with offset >= start_offset and timestamp >=
        `timestamp` in this segment (Kafka's ListOffsets); None if no record qualifies."""
        _, from_offset = self.time_index.lookup_before(timestamp)
        _, start = self.offset_index.lookup(max(from_offset, start_offset))
        if start >= end_position:
            start = 0
        for header in self._headers_from_index(start, end_position):
            if header.last_offset < start_offset or header.max_timestamp < timestamp:
                continue
            found = find_record_at_or_after(self.read_batch(header), header, timestamp, start_offset, 0)
            if found is not None:
                return found
        return None

    # -- recovery (writer / loader only, no concurrent readers) ------------------------------

    def recover(
        self, index_interval_bytes: int, *, active: bool, max_index_bytes: int, next_base_offset: int | None = None,
    ) -> RecoveryResult:
        """Scan the whole .log: check every batch, drop damaged bytes, rebuild both indexes.

        A batch that fails framing, magic or CRC, whose offsets go backwards, or whose last
        offset does not fit the segment (int32 relative offsets, below `next_base_offset`) is
        damage. Where a whole valid batch starts again after it (repair.find_next_batch), only
        the bytes in between are dropped and the file is rewritten without them; where nothing
        valid follows, the file is truncated at the damage (a torn tail). Dropped bytes that
        may have held acknowledged records are kept aside (repair.save_aside). `active` leaves
        the indexes preallocated for appends. Raises StorageError if the files cannot be
        changed (a read-only file, an I/O error).
        """
        handle = self.open_handle()
        fd = handle.fd
        size = os.fstat(fd).st_size
        limit = self.base_offset + INT32_MAX + 1
        if next_base_offset is not None:
            limit = min(limit, max(next_base_offset, self.base_offset))
        builder = IndexBuilder(self.base_offset, index_interval_bytes, max_index_bytes)
        damaged: list[repair.DamagedRange] = []
        runs: list[tuple[int, int]] = []  # [start, end) of the kept bytes, in file order
        next_offset: int | None = None
        batches = 0
        start = 0
        dropped = 0  # bytes dropped before the current run: kept batches move down by this much
        try:
            while True:
                scanner = BatchScanner(handle, start, size, with_data=True, check_crc=True)
                position = start
                error: str | None = None
                for header, _data in scanner:
                    floor = self.base_offset if next_offset is None else next_offset
                    if header.base_offset < floor:
                        error = f"offset {header.base_offset} goes backwards (expected at least {floor})"
                        break
                    if header.last_offset >= limit:
                        error = f"offset {header.last_offset} does not belong to the segment (limit {limit})"
                        break
                    builder.add(header.last_offset, position - dropped, header.size, header.max_timestamp)
                    position += header.size
                    next_offset = header.next_offset
                    batches += 1
                if error is None:
                    error = scanner.error
                runs.append((start, position))
                if error is None or position >= size:
                    break
                floor = self.base_offset if next_offset is None else next_offset
                resume = repair.find_next_batch(fd, position + 1, size, floor, limit)
                end = size if resume is None else resume
                claimed = repair.claimed_offsets(fd, position, end, floor, limit)
                damaged.append(repair.DamagedRange(
                    position, end - position, error,
                    None if claimed is None else claimed[0], None if claimed is None else claimed[1],
                    repair.is_framed(fd, position, size), resume is None,
                    floor, None if resume is None else repair.base_offset_at(fd, resume),
                ))
                if resume is None:
                    break
                dropped += resume - position
                start = resume
            for d in damaged:
                if d.keep_aside:
                    repair.save_aside(self.log_path, fd, d)
            kept = sum(end - begin for begin, end in runs)
            if damaged and not damaged[0].tail:
                repair.rewrite(self.log_path, fd, [r for r in runs if r[1] > r[0]])
                with self._fd_lock:
                    self._file = None  # the old file, renamed over; a fresh handle opens the new one
            elif damaged:
                self._truncate_file(kept)
            else:
                os.fsync(fd)  # what survived a process crash in the page cache
        except OSError as exc:
            raise storage_error(exc, self.log_path, "recovery cannot read or change the segment") from exc
        self.size = kept
        self._next_offset = self.base_offset if next_offset is None else next_offset
        self._max_timestamp = builder.max_timestamp
        self._offset_of_max_timestamp = builder.offset_of_max_timestamp
        self._first_timestamp = builder.first_timestamp
        self._bytes_since_last_index_entry = builder.bytes_since_last_entry
        index_path, time_path = self._offset_index.path, self._time_index.path
        self._offset_index.release()
        self._time_index.release()
        if active:
            self._offset_index, self._time_index = builder.write_active(index_path, time_path, max_index_bytes)
            self._appendable = False
            self.open_for_append()
        else:
            self._offset_index, self._time_index = builder.write_closed(
                index_path, time_path, max_index_bytes, in_memory_if_full=True
            )
        self._indexes_verified = True
        truncated = size - kept
        first_error = damaged[0].reason if damaged else None
        return RecoveryResult(kept, truncated, next_offset, batches, first_error, tuple(damaged))

    def _truncate_file(self, size: int) -> None:
        with io_errors(self.log_path, "cannot truncate"):
            fd = os.open(self.log_path, os.O_RDWR)
            try:
                os.ftruncate(fd, size)
                os.fsync(fd)
            finally:
                os.close(fd)

    def sanity_check(self) -> None:
        """Raise CorruptIndexError if an index disagrees with the log or with itself.

        Whole-index checks (sizes, order, range) plus a spot check that a few offset index
        entries (first, last, and up to six between) name a batch that starts at their
        position and ends at their offset: about ten small reads per segment.
        """
        self._offset_index.sanity_check(self.size)
        self._time_index.sanity_check()
        entries = self._offset_index.entries
        if not entries:
            return
        picks = sorted({0, entries - 1, *range(0, entries, max(1, entries // 6))})
        handle = self.open_handle()  # held while its descriptor is in use
        fd = handle.fd
        for i in picks:
            offset, position = self._offset_index.entry(i)
            header = None
            if position + HEADER_SIZE <= self.size:
                header = parse_header(pread_exact(fd, HEADER_SIZE, position), 0)
            if header is None or header.last_offset != offset or header.size + position > self.size:
                raise CorruptIndexError(
                    self._offset_index.path, f"entry {i} ({offset}, {position}) does not match the batch there"
                )

    # -- files --------------------------------------------------------------------------------

    def change_suffix(self, old: str, new: str) -> None:
        """Rename the three files from suffix `old` to `new` (e.g. '.cleaned' -> '.swap'), and
        the segment's key index when there is one by that suffix (the cleaner writes a
        `.keyindex.cleaned` with each segment it makes: key_index.py), last.

        A live segment leaving the log (-> '.deleted') is pinned first: its .log descriptor
        opened and its indexes mapped, so readers still holding a view that lists it never
        open a file by a name that has just gone away (rename now, unlink later)."""
        assert self.suffix == old
        if new == filenames.DELETED_SUFFIX:
            self._pin_files()
        for kind in _FILE_KINDS:
            src = kind(self.directory, self.base_offset, old)
            if src.exists():
                os.replace(src, kind(self.directory, self.base_offset, new))
        self.suffix = new
        self._offset_index.path = filenames.index_file(self.directory, self.base_offset, new)
        self._time_index.path = filenames.time_index_file(self.directory, self.base_offset, new)

    def _pin_files(self) -> None:
        try:  # best effort: a damaged index must not stop its segment's deletion
            self.open_handle()
            self._offset_index.pin()
            self._time_index.pin()
        except StorageError as exc:
            logger.warning("%s/%s: not pinned before deletion: %s", self.directory.name, self.name, exc)

    def close(self) -> None:
        """Release descriptors and mappings (readers holding them keep working until GC). A
        deleted segment keeps them instead, for views that still list it: they go with the
        last reference to this object."""
        if self.suffix == filenames.DELETED_SUFFIX:
            self._appendable = False
            self.closed = True
            return
        self._offset_index.release()
        self._time_index.release()
        with self._fd_lock:
            self._file = None  # closes once no reader holds the handle
            self._fd_writable = False
        self._appendable = False
        self.closed = True
        BUDGET.forget(self)

    def delete_files(self) -> None:
        for kind in _FILE_KINDS:
            try:
                os.unlink(kind(self.directory, self.base_offset, self.suffix))
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return f"LogSegment({self.directory.name}/{self.name}, size={self.size})"


# a segment's files, by suffix: its key index last (it may be missing: derived data)
_FILE_KINDS = (
    filenames.log_file, filenames.index_file, filenames.time_index_file, filenames.key_index_file
)


def _size_or_none(path: Path) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


__all__ = ["AppendBatch", "LogSegment", "RecoveryResult"]
