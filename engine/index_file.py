"""Memory-mapped file of fixed-size, big-endian index entries: the base of both indexes.

An index is in one of two modes:

* appendable (the active segment's): the file is preallocated to max_index_bytes rounded
  down to a whole entry, mapped read-write; entries [0, entries) are valid, the rest zeros.
* read-only (closed segments'): the file holds exactly `entries` entries and is mapped lazily,
  on the first lookup, so opening a data dir after a clean shutdown maps nothing.

close_for_append() trims the file to its entries. The old read-write mapping is not unmapped:
a reader may still hold it, and every entry a reader can reach lies below the new file size,
so the mapping stays safe until the garbage collector drops it. Entries are never rewritten in
place, so a reader that loads `entries` and then reads below it always sees complete entries.

Writer task only (through its worker thread), except the lookups and the entry views, which
are safe from any task or thread.
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import numpy as np

from .errors import CorruptIndexError, StorageError

# Kafka searches the last 8 KiB of an index first: those pages are hot in the page cache.
WARM_SECTION_BYTES = 8192


class IndexFile:
    ENTRY_SIZE: int = 0
    DTYPE: np.dtype

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(max_index_bytes // self.ENTRY_SIZE, 1)
        self._entries = 0
        self._mm: mmap.mmap | None = None
        self._array: np.ndarray | None = None  # structured view of the whole mapping
        self._columns: tuple[np.ndarray, ...] = ()  # one view per field, for binary search
        self._appendable = False
        self._loaded = False
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
    def create_appendable(cls, path: Path, base_offset: int, max_index_bytes: int, entries: bytes = b""):
        """Create (or overwrite) the file with `entries`, preallocated for appends."""
        index = cls(path, base_offset, max_index_bytes)
        if len(entries) % cls.ENTRY_SIZE:
            raise ValueError("partial entry")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if entries:
                    os.pwrite(fd, entries, 0)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(path, f"cannot create index: {exc}") from exc
        index._entries = len(entries) // cls.ENTRY_SIZE
        index.open_for_append()
        return index

    def open_for_append(self) -> None:
        """Preallocate the file to its maximum size and map it read-write."""
        if self._appendable:
            return
        length = self.max_entries * self.ENTRY_SIZE
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, length)
                # the mapping keeps its own duplicate of the descriptor: ours closes now, so an
                # active partition costs one descriptor per index, not two
                self._set_mapping(mmap.mmap(fd, length, access=mmap.ACCESS_WRITE))
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(self.path, f"cannot map index for appends: {exc}") from exc
        self._appendable = True
        self._loaded = True

    def close_for_append(self) -> None:
        """Trim the file to its entries, fsync it, and switch to lazy read-only mode."""
        if not self._appendable:
            return
        assert self._mm is not None
        try:
            self._mm.flush()
            fd = os.open(self.path, os.O_RDWR)
            try:
                os.ftruncate(fd, self._entries * self.ENTRY_SIZE)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(self.path, f"cannot trim index: {exc}") from exc
        self._appendable = False
        self._set_mapping(None)  # the old mapping lives on for any reader still holding it
        self._loaded = False

    def flush(self) -> None:
        """msync the mapped entries (the file's size does not change until it is trimmed)."""
        if self._appendable and self._mm is not None:
            self._mm.flush()

    def release(self) -> None:
        """Forget the mapping (files are being deleted or renamed); lookups remap lazily."""
        self._appendable = False
        self._set_mapping(None)
        self._loaded = False

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

    def _set_mapping(self, mm: mmap.mmap | None) -> None:
        if mm is None:
            self._mm, self._array, self._columns = None, None, ()
            return
        array = np.frombuffer(mm, dtype=self.DTYPE)
        columns = tuple(array[name] for name in self.DTYPE.names or ())
        # publish the columns last: readers take `_columns` and then read below `entries`
        self._mm, self._array, self._columns = mm, array, columns

    def _mapped_columns(self) -> tuple[np.ndarray, ...]:
        """Field views of the mapping, created on first use for read-only indexes; () when
        the index is empty. Readers hold the returned views, which keep the mapping alive."""
        columns = self._columns
        if columns or self._entries == 0:
            return columns
        with self._load_lock:
            if not self._columns:
                try:
                    with open(self.path, "rb") as f:
                        mm = mmap.mmap(f.fileno(), self._entries * self.ENTRY_SIZE, access=mmap.ACCESS_READ)
                except (OSError, ValueError) as exc:
                    raise StorageError(self.path, f"cannot map index: {exc}") from exc
                self._set_mapping(mm)
                self._loaded = True
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
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                data = os.pread(fd, self.ENTRY_SIZE, (self._entries - 1) * self.ENTRY_SIZE)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(self.path, f"cannot read index: {exc}") from exc
        if len(data) < self.ENTRY_SIZE:
            raise CorruptIndexError(self.path, "index file is shorter than its entries")
        first, second = np.frombuffer(data, dtype=self.DTYPE)[0].tolist()
        return int(first), int(second)

    def _entry(self, i: int) -> tuple[int, int]:
        first, second = self._mapped_columns()
        return int(first[i]), int(second[i])

    # -- writing ------------------------------------------------------------------------------

    def truncate_entries(self, count: int) -> None:
        """Forget the entries from `count` on (an undone append); the mapping stays. Readers
        only use entries that point below the published end, which these never did."""
        assert self._appendable and 0 <= count <= self._entries
        self._entries = count

    def _append_raw(self, packed: bytes) -> None:
        mm = self._mm
        assert self._appendable and mm is not None
        if self._entries >= self.max_entries:
            raise CorruptIndexError(self.path, f"index is full at {self._entries} entries")
        at = self._entries * self.ENTRY_SIZE
        mm[at : at + self.ENTRY_SIZE] = packed
        self._entries += 1  # publish after the bytes are in place

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
