"""holdfs (holdfs.py) keeps exactly what POSIX says is durable across a cut, and nothing more:
the model the power-cut test of the server rests on."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .mount import HoldMount


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, data: bytes, *, sync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _cut(mount: HoldMount) -> Path:
    mount.cut()
    mount.mount()
    return mount.mountpoint


def test_unsynced_files_and_entries_are_lost_synced_ones_kept(holdfs: HoldMount) -> None:
    m = holdfs.mountpoint
    (m / "d").mkdir()
    _write(m / "d" / "synced", b"a" * 10_000, sync=True)
    _write(m / "d" / "data-only", b"b" * 100, sync=True)  # its name never made durable
    _write(m / "d" / "unsynced", b"c" * 100)
    _fsync(m)  # names d
    _fsync(m / "d")  # names its three files
    _write(m / "d" / "late", b"d", sync=True)  # after the directory's fsync
    with open(m / "d" / "synced", "ab") as f:
        f.write(b"tail")  # never fsynced
    assert (m / "d" / "synced").stat().st_size == 10_004
    m = _cut(holdfs)
    assert sorted(os.listdir(m / "d")) == ["data-only", "synced", "unsynced"]
    assert (m / "d" / "synced").read_bytes() == b"a" * 10_000
    assert (m / "d" / "data-only").read_bytes() == b"b" * 100
    assert (m / "d" / "unsynced").read_bytes() == b""  # named, but no data was made durable


def test_a_directory_not_named_durably_is_lost_with_what_it_holds(holdfs: HoldMount) -> None:
    m = holdfs.mountpoint
    (m / "d").mkdir()
    _write(m / "d" / "f", b"x", sync=True)
    _fsync(m / "d")  # d's entries are durable, but nothing durable names d
    m = _cut(holdfs)
    assert os.listdir(m) == []


def test_sync_and_syncfs_flush_nothing(holdfs: HoldMount) -> None:
    """What a FUSE mount really does (issue 23): syncfs(2) and sync(2) return 0, and the daemon
    is asked for nothing."""
    m = holdfs.mountpoint
    _write(m / "f", b"durable", sync=True)
    _fsync(m)
    fd = os.open(m / "f", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b" lost")
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syncfs(fd) == 0
        os.sync()
    finally:
        os.close(fd)
    assert (m / "f").read_bytes() == b"durable lost"
    m = _cut(holdfs)
    assert (m / "f").read_bytes() == b"durable"


def test_replace_file_is_old_or_new_and_new_only_after_the_directory_fsync(holdfs: HoldMount) -> None:
    m = holdfs.mountpoint
    _write(m / "cfg", b"old", sync=True)
    _fsync(m)
    _write(m / "cfg.tmp", b"new", sync=True)
    os.replace(m / "cfg.tmp", m / "cfg")
    m = _cut(holdfs)
    assert os.listdir(m) == ["cfg"] and (m / "cfg").read_bytes() == b"old"
    _write(m / "cfg.tmp", b"new", sync=True)
    os.replace(m / "cfg.tmp", m / "cfg")
    _fsync(m)
    m = _cut(holdfs)
    assert os.listdir(m) == ["cfg"] and (m / "cfg").read_bytes() == b"new"


def test_truncation_and_unlink_are_undone_unless_made_durable(holdfs: HoldMount) -> None:
    m = holdfs.mountpoint
    _write(m / "log", bytes(range(256)) * 64, sync=True)
    _write(m / "gone", b"g", sync=True)
    _fsync(m)
    os.truncate(m / "log", 100)
    with open(m / "log", "r+b") as f:
        f.seek(8000)
        f.write(b"z")  # a hole from 100 to 8000 reads zeros
    assert (m / "log").read_bytes() == bytes(range(100)) + bytes(7900) + b"z"
    (m / "gone").unlink()
    m = _cut(holdfs)
    assert (m / "log").read_bytes() == bytes(range(256)) * 64
    assert (m / "gone").read_bytes() == b"g"
    os.truncate(m / "log", 100)
    with open(m / "log", "r+b") as f:
        f.seek(8000)
        f.write(b"z")
        f.flush()
        os.fsync(f.fileno())
    (m / "gone").unlink()
    _fsync(m)
    m = _cut(holdfs)
    assert (m / "log").read_bytes() == bytes(range(100)) + bytes(7900) + b"z"
    assert os.listdir(m) == ["log"]


def test_an_unlinked_open_file_still_reads_and_writes(holdfs: HoldMount) -> None:
    m = holdfs.mountpoint
    _write(m / "f", b"abc", sync=True)
    fd = os.open(m / "f", os.O_RDWR)
    try:
        (m / "f").unlink()
        assert os.pread(fd, 3, 0) == b"abc"
        os.pwrite(fd, b"def", 3)
        os.fsync(fd)
        assert os.pread(fd, 10, 0) == b"abcdef"
    finally:
        os.close(fd)
    assert os.listdir(m) == []
