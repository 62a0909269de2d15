"""Read-only memory maps of files that hold no file descriptor.

Python's mmap keeps a duplicate of the descriptor it maps for as long as the map lives, so a
thousand mapped index files would hold a thousand descriptors. The kernel needs none: a mapping
stays valid after its descriptor is closed (as Java's MappedByteBuffer does). map_read_only()
maps with libc's mmap through ctypes, closes the descriptor at once, and returns a numpy uint8
array over the pages; the pages are unmapped when the last array viewing them is collected.

Only ever mapped read-only (PROT_READ, MAP_SHARED): reading a mapped page never allocates disk
space, so a full disk cannot raise SIGBUS here (writes go through pwrite, index_file.py). A
file must not shrink below a mapping that a reader may still touch; the engine only replaces
index files by rename, never truncates one that was mapped read-only.

Where libc's mmap cannot be called (not Linux/glibc), Python's mmap is used instead, descriptor
and all.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _mmap = _libc.mmap
    _mmap.restype = ctypes.c_void_p
    _mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    _munmap = _libc.munmap
    _munmap.restype = ctypes.c_int
    _munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
except (OSError, AttributeError):  # pragma: no cover - not glibc
    _mmap = None

_MAP_FAILED = ctypes.c_void_p(-1).value


class _Pages:
    """Owns one mapping; numpy arrays made from it keep it alive through their `base`."""

    def __init__(self, address: int, length: int) -> None:
        self.address = address
        self.length = length
        self.__array_interface__ = {"shape": (length,), "typestr": "|u1", "data": (address, True), "version": 3}

    def __del__(self) -> None:
        address = self.__dict__.pop("address", None)
        if address:
            _munmap(address, self.length)


def map_read_only(path: Path | str, length: int) -> np.ndarray:
    """The first `length` bytes of `path` (which must be at least that long, and > 0) as a
    read-only uint8 array backed by the page cache. Raises OSError, or ValueError when the
    file is shorter than `length` (pages past its end would raise SIGBUS when read)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < length or length <= 0:
            raise ValueError(f"cannot map {length} bytes of a {size}-byte file")
        if _mmap is None:  # pragma: no cover
            return np.frombuffer(mmap.mmap(fd, length, access=mmap.ACCESS_READ), dtype=np.uint8)
        address = _mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(path))
    finally:
        os.close(fd)
    return np.asarray(_Pages(address, length))
