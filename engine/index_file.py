"""File of fixed-size, big-endian index entries: the base of both indexes.

An index is in one of two modes:

* appendable (the active segment's): the entries live in memory (a numpy buffer that grows by
  doubling, up to max_index_bytes), and new ones reach the file with pwrite when the segment's
  batches are written (write_pending(), called by the writer with its data write). The file
  holds exactly the entries written so far, no preallocated tail: nothing is ever written
  through a memory map, so a full disk is an ENOSPC from pwrite (the append is undone), never a
  SIGBUS. Its descriptor is opened on the first write and may be closed under descriptor
  pressure (release_handle(); the next write reopens it).
* read-only (closed segments'): the file holds exactly `entries` entries and is mapped lazily,
  on the first lookup, with a map that holds no descriptor (mapping.py), so opening a data dir
  after a clean shutdown maps nothing and a thousand mapped indexes cost no descriptors. An
  index whose file could not be written (a full disk during recovery) stays in memory instead.

close_for_append() writes what is pending, trims the file to its entries, fsyncs it and
switches to read-only mode. Readers that took the appendable buffer keep it; entries are never
rewritten in place, so a reader that loads `entries` and then the columns always sees complete
entries below that count (the buffer is replaced, never resized in place, when it grows).

Writer task only (through its worker thread), except the lookups and the entry views, which
are safe from any task or thread.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np

from .errors import CorruptIndexError, StorageError
from .fileutil import FileHandle, io_errors, pwrite_all, storage_error
from .mapping import map_read_only

logger = logging.getLogger("eventlog.engine")

# Kafka searches the last 8 KiB of an index first: those pages are hot in the page cache.
WARM_SECTION_BYTES = 8192
_FIRST_CAPACITY = 64  # entries of a new appendable buffer


class IndexFile:
    ENTRY_SIZE: int = 0
    DTYPE: np.dtype

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(max_index_bytes // self.ENTRY_SIZE, 1)
        self._entries = 0
        self._array: np.ndarray | None = None  # structured view: the buffer, the mapping, or the in-memory entries
        self._columns: tuple[np.ndarray, ...] = ()  # one view per field, for binary search
        self._appendable = False
        self._buffer: np.ndarray | None = None  # appendable: uint8 bytes of the buffer
        self._written = 0  # appendable: entries already on the file
        # appendable: the file may differ from what a clean close leaves (entries written or
        # dropped since it was trimmed and fsynced): False only for a file opened for appends
        # that held exactly its entries, untouched since (close then has nothing to do)
        self._changed = True
        self._handle: FileHandle | None = None  # appendable: for pwrite, opened on first write
        self._in_memory: np.ndarray | None = None  # read-only entries whose file could not be written
        self._load_lock = threading.Lock()

    @classmethod
    def decode_entries(cls, data: bytes) -> np.ndarray:
        """The entries in an index file's bytes (DTYPE records), written by eventlog or Kafka,
        trimmed or preallocated: whole entries up to the first all-zero entry after the first
        (the unused tail of a preallocated file); a partial entry at the end is ignored. For
        inspecting loose files (dump-log); an open index never reads itself this way."""
        count = len(data) // cls.ENTRY_SIZE
        entries = np.frombuffer(data, dtype=cls.DTYPE, count=count)
        if count > 1:
            raw = np.frombuffer(data, dtype=np.uint8, count=count * cls.ENTRY_SIZE).reshape(count, cls.ENTRY_SIZE)
            unused = ~raw[1:].any(axis=1)
            if unused.any():
                count = 1 + int(np.argmax(unused))
        return entries[:count]

    # -- opening and closing ------------------------------------------------------------------

    @classmethod
    def open_read_only(cls, path: Path, base_offset: int, max_index_bytes: int, size: int):
        """A closed segment's index of `size` bytes, mapped on first use."""
        index = cls(path, base_offset, max_index_bytes)
        if size % cls.ENTRY_SIZE:
            raise CorruptIndexError(path, f"size {size} is not a multiple of {cls.ENTRY_SIZE}")
        index._entries = size // cls.ENTRY_SIZE
        return index

    @classmethod
    def in_memory(cls, path: Path, base_offset: int, max_index_bytes: int, entries: bytes | bytearray):
        """A read-only index of `entries` held in memory: its file could not be written (a full
        disk during recovery). Lookups work as usual; the next recovery writes the file."""
        index = cls(path, base_offset, max_index_bytes)
        index._in_memory = np.frombuffer(bytes(entries), dtype=cls.DTYPE)
        index._entries = len(index._in_memory)
        index._set_array(index._in_memory)
        return index

    @classmethod
    def create_appendable(cls, path: Path, base_offset: int, max_index_bytes: int, entries: bytes = b""):
        """Create (or overwrite) the file and hold `entries` for appends. On a full disk the
        entries stay pending in memory and are written with the next append."""
        index = cls(path, base_offset, max_index_bytes)
        if len(entries) % cls.ENTRY_SIZE:
            raise ValueError("partial entry")
        with io_errors(path, "cannot create index"):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        index._load_buffer(entries, written=0)
        index._appendable = True
        if entries:
            try:
                index.write_pending()
            except StorageError as exc:  # the entries stay pending; the next append writes them
                logger.warning("%s: index entries not written yet: %s", path.name, exc.reason)
        return index

    def open_for_append(self) -> None:
        """Read the file's entries into memory for appends (a read-only index becoming active
        again). A tail past the valid entries (a preallocated file, a partial entry) is
        overwritten by later appends and trimmed on close."""
        if self._appendable:
            return
        with io_errors(self.path, "cannot open index for appends"):
            with open(self.path, "rb") as f:
                data = f.read()
        count = self._valid_entries(data)
        self._load_buffer(data[: count * self.ENTRY_SIZE], written=count)
        self._appendable = True
        # trimmed already: as a clean close, or recovery's rebuild, left it (both fsynced it)
        self._changed = len(data) != count * self.ENTRY_SIZE

    def close_for_append(self) -> None:
        """Write what is pending, trim the file to its entries, fsync it, and switch to lazy
        read-only mode."""
        if not self._appendable:
            return
        self.write_pending()
        if self._changed:  # (an index untouched since it was opened is trimmed and durable)
            with io_errors(self.path, "cannot trim index"):
                handle = self._writable_handle()
                os.ftruncate(handle.fd, self._entries * self.ENTRY_SIZE)
                os.fsync(handle.fd)
        self._appendable = False
        self._handle = None
        self._buffer = None
        self._set_array(None)  # readers holding the buffer keep it

    def flush(self) -> None:
        """Write pending entries (not fsynced: recovery rebuilds an index after a crash)."""
        self.write_pending()

    def release_handle(self) -> bool:
        """Let go of the write descriptor (descriptor pressure); the next write reopens it.
        True if one was held."""
        held = self._handle is not None
        self._handle = None
        return held

    def release(self) -> None:
        """Forget the buffer or mapping and the descriptor (files are being deleted or renamed,
        or rebuilt); lookups map the file again lazily. Pending entries are dropped."""
        self._appendable = False
        self._handle = None
        self._buffer = None
        self._in_memory = None
        self._set_array(None)

    def pin(self) -> None:
        """Map the file now (a read-only index maps lazily), so that lookups no longer need
        its name: the file is about to be renamed or deleted."""
        self._mapped_columns()

    def rename(self, path: Path) -> None:
        os.replace(self.path, path)
        self.path = path

    # -- state --------------------------------------------------------------------------------

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    @property
    def size_bytes(self) -> int:
        return self._entries * self.ENTRY_SIZE

    @property
    def appendable(self) -> bool:
        return self._appendable

    @property
    def pending_entries(self) -> int:
        """Entries in memory that the file does not hold yet (appendable only)."""
        return self._entries - self._written if self._appendable else 0

    def _valid_entries(self, data: bytes) -> int:
        """Entries of `data` before the first all-zero entry after entry 0 (Kafka's rule for a
        preallocated index), ignoring a partial entry at the end."""
        return len(self.decode_entries(data))

    def _load_buffer(self, entries: bytes | bytearray, written: int) -> None:
        count = len(entries) // self.ENTRY_SIZE
        capacity = min(max(_FIRST_CAPACITY, count * 2), max(self.max_entries, count))
        buffer = np.zeros(capacity * self.ENTRY_SIZE, dtype=np.uint8)
        buffer[: len(entries)] = np.frombuffer(bytes(entries), dtype=np.uint8)
        self._buffer = buffer
        self._set_array(buffer.view(self.DTYPE))
        self._entries = count
        self._written = written

    def _grow(self) -> None:
        """A buffer twice as large with the same entries, published before any entry lands in
        it; readers holding the old one keep reading it."""
        assert self._buffer is not None
        old = self._buffer
        capacity = min(2 * len(old) // self.ENTRY_SIZE, self.max_entries)
        buffer = np.zeros(capacity * self.ENTRY_SIZE, dtype=np.uint8)
        buffer[: len(old)] = old
        self._buffer = buffer
        self._set_array(buffer.view(self.DTYPE))

    def _set_array(self, array: np.ndarray | None) -> None:
        if array is None:
            self._array, self._columns = None, ()
            return
        columns = tuple(array[name] for name in self.DTYPE.names or ())
        # publish the columns last: readers take `entries` first, then `_columns`
        self._array, self._columns = array, columns

    def _mapped_columns(self) -> tuple[np.ndarray, ...]:
        """Field views of the entries (the buffer, the in-memory entries, or a mapping made on
        first use for read-only indexes); () when the index is empty. Readers hold the
        returned views, which keep a mapping alive."""
        columns = self._columns
        if columns or self._entries == 0:
            return columns
        with self._load_lock:
            if not self._columns:
                try:
                    pages = map_read_only(self.path, self._entries * self.ENTRY_SIZE)
                except OSError as exc:  # ENOMEM (no address space left) is transient
                    raise storage_error(exc, self.path, "cannot map index") from exc
                except ValueError as exc:
                    raise StorageError(self.path, f"cannot map index: {exc}") from exc
                self._set_array(pages.view(self.DTYPE))
            return self._columns

    def view(self) -> np.ndarray:
        """A numpy structured view of the valid entries (shares memory with the mapping)."""
        count = self._entries
        self._mapped_columns()
        array = self._array
        if array is None or count == 0:
            return np.zeros(0, dtype=self.DTYPE)
        return array[:count]

    def last_entry_from_file(self) -> tuple[int, int] | None:
        """The last entry's raw fields read with one pread, without mapping the file; None when
        empty. For facts needed from every closed segment (a segment's largest timestamp), so
        that touching 1,000 segments costs 1,000 small reads, not 1,000 mappings."""
        if self._entries == 0:
            return None
        if self._columns:
            return self._entry(self._entries - 1)
        with io_errors(self.path, "cannot read index"):
            fd = os.open(self.path, os.O_RDONLY)
            try:
                data = os.pread(fd, self.ENTRY_SIZE, (self._entries - 1) * self.ENTRY_SIZE)
            finally:
                os.close(fd)
        if len(data) < self.ENTRY_SIZE:
            raise CorruptIndexError(self.path, "index file is shorter than its entries")
        first, second = np.frombuffer(data, dtype=self.DTYPE)[0].tolist()
        return int(first), int(second)

    def _entry(self, i: int) -> tuple[int, int]:
        first, second = self._mapped_columns()
        return int(first[i]), int(second[i])

    # -- writing ------------------------------------------------------------------------------

    def truncate_entries(self, count: int) -> None:
        """Forget the entries from `count` on (an undone append). Readers only use entries that
        point below the published end, which these never did. Entries already on the file are
        overwritten by the next writes, and trimmed on close (the file never shrinks under a
        reader)."""
        assert self._appendable and 0 <= count <= self._entries
        self._entries = count
        self._written = min(self._written, count)
        self._changed = True

    def _append_raw(self, packed: bytes) -> None:
        assert self._appendable and self._buffer is not None
        if self._entries >= self.max_entries:
            raise CorruptIndexError(self.path, f"index is full at {self._entries} entries")
        at = self._entries * self.ENTRY_SIZE
        if at + self.ENTRY_SIZE > len(self._buffer):
            self._grow()
        self._buffer[at : at + self.ENTRY_SIZE] = np.frombuffer(packed, dtype=np.uint8)
        self._entries += 1  # publish after the bytes are in place

    def write_pending(self) -> None:
        """pwrite the entries the file does not hold yet (the writer's data write does this for
        every group commit). Raises StorageError (StorageFullError on a full disk: the caller
        undoes its append, which truncates these entries too)."""
        written, count = self._written, self._entries
        if not self._appendable or written >= count:
            return
        assert self._buffer is not None
        view = memoryview(self._buffer)[written * self.ENTRY_SIZE : count * self.ENTRY_SIZE]
        try:
            handle = self._writable_handle()  # held for the call: the budget may drop ours
            pwrite_all(handle.fd, [view], written * self.ENTRY_SIZE)
        except OSError as exc:
            raise storage_error(exc, self.path, "cannot write index entries") from exc
        self._written = count
        self._changed = True

    def _writable_handle(self) -> FileHandle:
        handle = self._handle
        if handle is None:
            handle = self._handle = FileHandle(self.path, os.O_RDWR | os.O_CREAT)
        return handle

    # -- binary search ------------------------------------------------------------------------

    def _search(self, keys: np.ndarray, target: int, count: int) -> int:
        """Index of the greatest of keys[:count] that is <= target, or -1.

        A binary search over a numpy view of the mapped file, hot tail first as in Kafka: the
        last 8 KiB of entries are searched alone when the target lies among them, so lookups
        near the end touch only pages that are already in memory. (numpy's searchsorted would
        copy and byte-swap the whole big-endian column on every call: 130 µs against 4 µs for
        250,000 entries.)
        """
        if count == 0 or keys[0] > target:
            return -1
        warm_entries = WARM_SECTION_BYTES // self.ENTRY_SIZE
        first_hot = max(0, count - 1 - warm_entries)
        if keys[first_hot] <= target:
            lo, hi = first_hot, count - 1
        else:
            lo, hi = 0, first_hot
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if keys[mid] <= target:
                lo = mid
            else:
                hi = mid - 1
        return lo
