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
        self._fd: int | None = None
        self._appendable = False
        self._loaded = False
        self._load_lock = threading.Lock()

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
            os.ftruncate(fd, length)
            self._mm = mmap.mmap(fd, length, access=mmap.ACCESS_WRITE)
        except OSError as exc:
            raise StorageError(self.path, f"cannot map index for appends: {exc}") from exc
        self._fd = fd
        self._appendable = True
        self._loaded = True

    def close_for_append(self) -> None:
        """Trim the file to its entries, fsync it, and switch to lazy read-only mode."""
        if not self._appendable:
            return
        assert self._fd is not None and self._mm is not None
        try:
            self._mm.flush()
            os.ftruncate(self._fd, self._entries * self.ENTRY_SIZE)
            os.fsync(self._fd)
            os.close(self._fd)
        except OSError as exc:
            raise StorageError(self.path, f"cannot trim index: {exc}") from exc
        self._fd = None
        self._appendable = False
        self._mm = None  # the old mapping lives on for any reader still holding it
        self._loaded = False

    def flush(self) -> None:
        if self._appendable and self._mm is not None:
            self._mm.flush()
            assert self._fd is not None
            os.fsync(self._fd)

    def release(self) -> None:
        """Forget the mapping (files are being deleted or renamed); lookups remap lazily."""
        if self._appendable and self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._appendable = False
        self._mm = None
        self._loaded = False

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

    def _buffer(self) -> mmap.mmap | None:
        """The current mapping, created on first use for read-only indexes; None when empty."""
        mm = self._mm
        if mm is not None or self._entries == 0:
            return mm
        with self._load_lock:
            if self._mm is None:
                try:
                    with open(self.path, "rb") as f:
                        self._mm = mmap.mmap(f.fileno(), self._entries * self.ENTRY_SIZE, access=mmap.ACCESS_READ)
                except (OSError, ValueError) as exc:
                    raise StorageError(self.path, f"cannot map index: {exc}") from exc
                self._loaded = True
            return self._mm

    def view(self) -> np.ndarray:
        """A numpy structured view of the valid entries (shares memory with the mapping)."""
        count = self._entries
        mm = self._buffer()
        if mm is None or count == 0:
            return np.zeros(0, dtype=self.DTYPE)
        return np.frombuffer(mm, dtype=self.DTYPE, count=count)

    def entry_bytes(self) -> bytes:
        count = self._entries
        mm = self._buffer()
        if mm is None:
            return b""
        return bytes(mm[: count * self.ENTRY_SIZE])

    # -- writing ------------------------------------------------------------------------------

    def _append_raw(self, packed: bytes) -> None:
        mm = self._mm
        assert self._appendable and mm is not None
        if self._entries >= self.max_entries:
            raise CorruptIndexError(self.path, f"index is full at {self._entries} entries")
        at = self._entries * self.ENTRY_SIZE
        mm[at : at + self.ENTRY_SIZE] = packed
        self._entries += 1  # publish after the bytes are in place

    def truncate_entries(self, entries: int) -> None:
        """Keep the first `entries` entries (recovery only; readers must not be active)."""
        if entries >= self._entries:
            return
        mm = self._buffer()
        if self._appendable and mm is not None:
            start = entries * self.ENTRY_SIZE
            end = self._entries * self.ENTRY_SIZE
            mm[start:end] = bytes(end - start)
        self._entries = entries

    # -- binary search ------------------------------------------------------------------------

    def _search(self, mm, key_at, target: int, count: int) -> int:
        """Index of the greatest entry whose key <= target, or -1. Searches the warm tail first."""
        if count == 0 or key_at(mm, 0) > target:
            return -1
        warm_entries = WARM_SECTION_BYTES // self.ENTRY_SIZE
        first_hot = max(0, count - 1 - warm_entries)
        if key_at(mm, first_hot) <= target:
            lo, hi = first_hot, count - 1
        else:
            lo, hi = 0, first_hot
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if key_at(mm, mid) <= target:
                lo = mid
            else:
                hi = mid - 1
        return lo
