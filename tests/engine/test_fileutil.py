"""The file layer's helpers on real files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from engine import fileutil
from engine.fileutil import make_dirs, pwrite_all


def test_pwrite_all_writes_many_small_buffers_in_linear_time(tmp_path: Path) -> None:
    """A raw produce of 900 000 one-record batches (62 MB) hands the group commit as many
    buffers; dropping each written one with list.pop(0) made the write quadratic: 56 s of the
    partition's writer (every other producer of it waiting). 600 000 buffers took 18 s that
    way; linear, well under a second. The bound is a liveness bound, many times the expected."""
    buffers = [bytes([i % 251]) * (1 + i % 7) for i in range(600_000)]
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        started = time.monotonic()
        written = pwrite_all(fd, buffers, 10)
        assert time.monotonic() - started < 5
    finally:
        os.close(fd)
    expected = b"".join(buffers)
    assert written == len(expected)
    assert path.read_bytes() == b"\0" * 10 + expected


def test_pwrite_all_resumes_inside_a_buffer_after_a_short_write(tmp_path: Path, monkeypatch) -> None:
    calls: list[int] = []
    real = os.pwritev

    def short(fd: int, views: list, position: int) -> int:  # at most 5 bytes per call
        calls.append(position)
        return real(fd, [bytes(b"".join(bytes(v) for v in views)[:5])], position)

    monkeypatch.setattr(os, "pwritev", short)
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert pwrite_all(fd, [b"abc", b"", b"defghij", memoryview(b"klm")], 0) == 13
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abcdefghijklm"
    assert calls == [0, 5, 10]


def test_make_dirs_fsyncs_the_parent_of_each_directory_it_creates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log dir `eventlog serve` creates is named durably in its parent (as Kafka's LogManager
    flushes the parent of a log dir it creates): without it a power cut took the whole dir
    away (tests/powercut/test_power_cut.py found it)."""
    synced: list[Path] = []
    real = fileutil.fsync_dir
    monkeypatch.setattr(fileutil, "fsync_dir", lambda d: (synced.append(d), real(d))[1])
    make_dirs(tmp_path / "a" / "b" / "c")
    assert (tmp_path / "a" / "b" / "c").is_dir()
    assert synced == [tmp_path, tmp_path / "a", tmp_path / "a" / "b"]
    synced.clear()
    make_dirs(tmp_path / "a" / "b" / "c")  # there already: nothing to make durable
    assert synced == []
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(OSError):
        make_dirs(tmp_path / "file")
