"""Small blocking file helpers shared by the engine (call from worker threads)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make renames and new files in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pread_exact(fd: int, size: int, position: int) -> bytes:
    """Read `size` bytes at `position`, or fewer only at end of file."""
    data = os.pread(fd, size, position)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, position + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def pwrite_all(fd: int, buffers: list, position: int) -> int:
    """Write every buffer at `position` with as few syscalls as possible; returns bytes written."""
    views = [memoryview(b) for b in buffers if len(b)]
    written = 0
    while views:
        n = os.pwritev(fd, views[:1024], position + written)  # 1024 = IOV_MAX
        written += n
        while n and views:
            head = views[0]
            if n >= len(head):
                n -= len(head)
                views.pop(0)
            else:
                views[0] = head[n:]
                n = 0
    return written


class FileHandle:
    """An open descriptor that closes when the last reference to it goes away.

    Segments hand these to readers, so a segment that is deleted or closed while a read is in
    flight cannot have its descriptor number reused under that read.
    """

    __slots__ = ("fd", "__weakref__")

    def __init__(self, path: Path | str, flags: int, mode: int = 0o644) -> None:
        self.fd = os.open(path, flags, mode)

    def fileno(self) -> int:
        return self.fd

    def __del__(self) -> None:
        fd = getattr(self, "fd", -1)  # -1 when os.open failed in __init__
        self.fd = -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
