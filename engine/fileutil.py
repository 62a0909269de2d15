"""Small blocking file helpers shared by the engine (call from worker threads).

The one place where OSError becomes the engine's storage errors (as Kafka's
maybeHandleIOException, with LogDirFailureChannel's decision of what a failure means):
storage_error() decides, io_errors() wraps a block in it; every read and write path of a
partition (log_reads.py, reader.py through segment.py, follower.py's opens, partition_log.py,
segment.py, index_file.py, this module's callers) raises what they make:

* transient, the kernel is short of something that comes back by itself (EMFILE, ENFILE,
  ENOMEM, EAGAIN, ENOBUFS): TooManyOpenFilesError, 503 too_many_open_files with Retry-After;
* disk full (ENOSPC, EDQUOT): StorageFullError, 507 storage_full;
* anything else (EIO, EROFS, ENOENT of a file that must be there, ...): StorageError, 500
  storage_error, the dir failing: a write that meets it takes the partition offline for writes
  until a restart recovers it (PartitionLog._commit), a read fails that request only.

A transient error or a full disk undoes what it interrupted (an append, a topic change, a
snapshot) and leaves the partition usable; a read that meets one is answered the same way and
leaves the partition online.

`except OSError` sites left outside it, on purpose:
* best-effort cleanup and probes whose failure changes nothing: unlinking a temp file
  (replace_file), closing a descriptor (FileHandle.__del__), libc lookups (filesystem_magic,
  mapping.py), preadv2(RWF_NOWAIT) support (read_if_cached), /proc readlink and the rules file
  (faults.py), the descriptor limit (descriptors.py), the lock file's pid and identity
  (log_dirs.py), a directory listing probe and an fsync after removing partitions
  (log_manager.py), damaged bytes kept aside (repair.py), unreadable producer snapshots
  dropped (producer_state.py), damaged-file listings (dropped.py), snapshot cleanup
  (snapshots.py);
* where an errno is an answer, not a failure: FileHandle's EMFILE retry after giving
  descriptors back, os.link/copy_file_range falling back to a copy (snapshots.py), a syncfs
  failure handed to each file's own fdatasync (commits.py), a partition file of an existing
  partition rewritten at start-up (log_manager.py);
* where the failure is never transient whatever its errno: undoing a failed append
  (LogSegment.rollback's fsync: an undo that fails must fail the partition);
* start-up and data-dir errors, which are DataDirError (log_dirs.py), and codec errors
  (compression.py).
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .descriptors import BUDGET
from .errors import StorageError, StorageFullError, TooManyOpenFilesError
from .faults import io_fault

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
NO_DESCRIPTOR_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
# the kernel is out of something that comes back by itself: descriptors, memory, buffers
TRANSIENT_ERRNOS = NO_DESCRIPTOR_ERRNOS | {errno.ENOMEM, errno.EAGAIN, errno.ENOBUFS}


def storage_error(exc: OSError, path: Path | str | None, what: str) -> StorageError:
    """The engine's error for `exc`, met while doing `what` (e.g. "cannot create segment"):
    StorageFullError, TooManyOpenFilesError (TRANSIENT_ERRNOS) or StorageError."""
    where = path if path is not None else (exc.filename or "?")
    reason = f"{what}: {exc.strerror or exc}"
    code = exc.errno
    if code in DISK_FULL_ERRNOS:
        return StorageFullError(where, reason)
    if code in TRANSIENT_ERRNOS:
        return TooManyOpenFilesError(where, reason)
    return StorageError(where, reason)


@contextmanager
def io_errors(path: Path | str | None, what: str) -> Iterator[None]:
    """Translate OSError raised inside the block with storage_error() (cold paths: hot ones
    catch OSError themselves and call storage_error())."""
    try:
        yield
    except OSError as exc:
        raise storage_error(exc, path, what) from exc


def fsync_dir(directory: Path) -> None:
    """Make renames and new files in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path) -> None:
    """mkdir -p whose new directories are durable: the parent of each one it creates is
    fsynced (as Kafka's LogManager does after creating a log dir), so a power cut cannot take a
    directory, and all that was made durable inside it, back out of existence. Raises OSError."""
    missing = []
    path = directory
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise
            continue  # made meanwhile by another process: its maker fsyncs the parent
        fsync_dir(path.parent)


def replace_file(path: Path, data: bytes | bytearray | memoryview, *, sync_dir: bool = True) -> None:
    """Atomically replace `path` with `data`: "<name>.tmp" written and fsynced, renamed over
    `path`, directory fsynced (unless the caller fsyncs it once for several files). After a
    crash the file is the old one or the new one; if writing fails (a full disk), the temp file
    is removed and `path` is untouched. The engine's one atomic file writer. Raises OSError."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync_dir:
        fsync_dir(path.parent)


def fdatasync(fd: int) -> None:
    """os.fdatasync through the fault-injection seam."""
    io_fault("fsync", fd)
    os.fdatasync(fd)


_libc: Any = None


def syncfs(fd: int) -> None:
    """syncfs(2) of the filesystem holding `fd`, through the fault-injection seam: every dirty
    page and inode of that filesystem written and flushed to the device. Since Linux 5.8 it
    reports a write-back error met on that filesystem since `fd` last reported one (the
    filesystem's error sequence as `fd` saw it when opened). Raises OSError."""
    global _libc
    io_fault("syncfs", fd)
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)  # a CDLL call releases the GIL
        _libc.syncfs.argtypes = [ctypes.c_int]
    if _libc.syncfs(fd) != 0:
        import ctypes

        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


# statfs(2)'s f_type of the filesystems eventlog names (linux/magic.h); others show as hex
FILESYSTEM_NAMES = {
    0xEF53: "ext4",  # ext2, ext3 and ext4 share the magic
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x65735546: "fuse",
    0x6969: "nfs",
    0x794C7630: "overlayfs",
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    0x2FC12FC1: "zfs",
    0xF2F52010: "f2fs",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x01021997: "9p",
    0x00C36400: "ceph",
    0x5346544E: "ntfs",
    0x4D44: "vfat",
}
# where a syncfs(2) is known to write and flush every file's dirty data and size, as an
# fdatasync of each would (commits.py): ext2/3/4, xfs, btrfs. Not on FUSE (the kernel asks the
# daemon nothing: syncfs returns 0 and the files stay in its hands), NFS, overlayfs (syncs the
# upper layer only from Linux 5.8 on, and nothing of a FUSE or NFS upper), tmpfs, nor anything
# unknown: there each file gets its own fdatasync.
SYNCFS_FLUSHES_FILES = frozenset({0xEF53, 0x58465342, 0x9123683E})


def filesystem_name(magic: int | None) -> str:
    """A filesystem's name from its statfs magic: "ext4", "fuse", ..., or "0x..." (None: "unknown")."""
    if magic is None:
        return "unknown"
    return FILESYSTEM_NAMES.get(magic, f"0x{magic:x}")


def syncfs_flushes_files(magic: int | None) -> bool:
    """Whether a syncfs of a filesystem of this statfs magic makes its files durable."""
    return magic in SYNCFS_FLUSHES_FILES


_statfs: Any = None


def filesystem_magic(path: Path | str) -> int | None:
    """statfs(2)'s f_type of the filesystem holding `path` (os.statvfs has no f_type), through
    libc; None where it cannot be had (no such call, or it failed)."""
    global _statfs
    import ctypes

    if _statfs is None:
        try:
            _statfs = ctypes.CDLL(None, use_errno=True).statfs
        except (OSError, AttributeError):
            _statfs = False
        else:
            _statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
            _statfs.restype = ctypes.c_int
    if not _statfs:
        return None
    # struct statfs begins with f_type, a long (__fsword_t) on every 64-bit Linux eventlog runs
    # on (an unsigned int on s390x, whose magic the low 32 bits hold too); 256 bytes hold the
    # whole struct (120 on x86-64 and arm64)
    buf = ctypes.create_string_buffer(256)
    if _statfs(os.fsencode(path), buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def pread(fd: int, size: int, position: int) -> bytes:
    """os.pread through the fault-injection seam."""
    io_fault("read", fd)
    return os.pread(fd, size, position)


def preadv(fd: int, buffers: list, position: int) -> int:
    """os.preadv through the fault-injection seam."""
    io_fault("read", fd)
    return os.preadv(fd, buffers, position)


def pread_exact(fd: int, size: int, position: int) -> bytes:
    """Read `size` bytes at `position`, or fewer only at end of file."""
    io_fault("read", fd)
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


_NOWAIT = getattr(os, "RWF_NOWAIT", None)
_nowait_supported = _NOWAIT is not None


def read_if_cached(fd: int, size: int, position: int) -> memoryview | bytes | None:
    """Read `size` bytes at `position` only if no disk I/O is needed; else None.

    Uses preadv2(RWF_NOWAIT), which fails with EAGAIN (or reads short) instead of waiting for
    the disk. Where the flag is unsupported the first call finds out and later calls return
    None at once.
    """
    global _nowait_supported
    if not _nowait_supported or size <= 0:
        return b"" if size == 0 else None
    io_fault("read", fd)
    buf = bytearray(size)
    try:
        n = os.preadv(fd, [buf], position, _NOWAIT)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            _nowait_supported = False
            return None
        raise
    if n != size:
        return None
    return memoryview(buf)  # no second copy: callers send or slice it


def pwrite_all(fd: int, buffers: list, position: int) -> int:
    """Write every buffer at `position` with as few syscalls as possible; returns bytes written."""
    io_fault("write", fd)
    views = [memoryview(b) for b in buffers if len(b)]
    written = 0
    first = 0  # views before it are written (an index: pop(0) made a write of many batches quadratic)
    while first < len(views):
        n = os.pwritev(fd, views[first : first + 1024], position + written)  # 1024 = IOV_MAX
        written += n
        while n and first < len(views):
            head = views[first]
            if n >= len(head):
                n -= len(head)
                first += 1
            else:
                views[first] = head[n:]
                n = 0
    return written


class FileHandle:
    """An open descriptor that closes when the last reference to it goes away.

    Segments hand these to readers, so a segment that is deleted or closed while a read is in
    flight cannot have its descriptor number reused under that read. Open handles count
    against the engine's descriptor budget (descriptors.py); opening one when the budget is
    spent, or when the process is out of descriptors (EMFILE), first closes the least recently
    used segments' handles. Raises OSError.
    """

    __slots__ = ("fd", "__weakref__")

    def __init__(self, path: Path | str, flags: int, mode: int = 0o644) -> None:
        self.fd = -1
        BUDGET.opening()
        try:
            fd = os.open(path, flags, mode)
        except OSError as exc:
            if exc.errno not in NO_DESCRIPTOR_ERRNOS or not BUDGET.evict(16):
                raise
            fd = os.open(path, flags, mode)  # once more, with some descriptors given back
        BUDGET.opened()
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def __del__(self) -> None:
        fd = getattr(self, "fd", -1)  # -1 when os.open failed in __init__
        self.fd = -1
        if fd >= 0:
            BUDGET.closed()
            try:
                os.close(fd)
            except OSError:
                pass
