"""Which filesystems get the shared sync (engine/commits.py): one syncfs stands for many
fdatasyncs only where it is known to make files durable (ext2/3/4, xfs, btrfs, by statfs's
f_type); everywhere else each file gets its own fdatasync, whatever EVENTLOG_SHARED_SYNC says.
Issue 23: on a FUSE mount syncfs returns 0 and flushes nothing of the files (tests/powercut/)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from engine import commits, segment
from engine.fileutil import filesystem_magic, filesystem_name, syncfs_flushes_files

from .helpers import running_log
from .test_faults import put

EXT4, XFS, BTRFS = 0xEF53, 0x58465342, 0x9123683E
FUSE, NFS, OVERLAYFS, TMPFS = 0x65735546, 0x6969, 0x794C7630, 0x01021994


@pytest.mark.parametrize(
    ("magic", "name", "shared"),
    [
        (EXT4, "ext4", True),
        (XFS, "xfs", True),
        (BTRFS, "btrfs", True),
        (FUSE, "fuse", False),
        (NFS, "nfs", False),
        (OVERLAYFS, "overlayfs", False),
        (TMPFS, "tmpfs", False),
        (0x2FC12FC1, "zfs", False),
        (0x12345678, "0x12345678", False),  # unknown: never trusted
        (None, "unknown", False),  # statfs could not say
    ],
)
def test_only_filesystems_known_to_flush_files_get_the_shared_sync(magic, name: str, shared: bool) -> None:
    assert syncfs_flushes_files(magic) is shared
    assert filesystem_name(magic) == name


def test_the_statfs_type_is_the_kernels(tmp_path: Path) -> None:
    """filesystem_magic (ctypes statfs(2)) against coreutils' `stat -f` (the same f_type)."""
    if shutil.which("stat") is None:
        pytest.skip("no stat(1) to compare with")
    for path in (tmp_path, Path("/proc"), Path("/")):
        out = subprocess.run(["stat", "-f", "-c", "%t", str(path)], capture_output=True, text=True, check=True).stdout
        assert filesystem_magic(path) == int(out.strip(), 16), path
    assert filesystem_magic(tmp_path / "missing") is None


async def _run_logs(batcher: commits.CommitBatcher, root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Four partitions under `root` commit in one job: (syncfs calls made, fdatasyncs made)."""
    fdatasyncs = []
    flush = segment.LogSegment.flush
    monkeypatch.setattr(segment.LogSegment, "flush", lambda self: (fdatasyncs.append(self), flush(self))[1])
    async with AsyncExitStack() as stack:
        logs = [await stack.enter_async_context(running_log(root / f"p{i}")) for i in range(4)]
        syncs0 = batcher.shared_syncs
        fdatasyncs.clear()
        results = await asyncio.gather(*(put(log, f"p{i}") for i, log in enumerate(logs)))
        assert [r.base_offset for r in results] == [0] * 4
        assert all(log.recovery_point == 5 for log in logs)  # durable, one way or the other
        return batcher.shared_syncs - syncs0, len(fdatasyncs)


async def test_the_data_dir_gets_what_its_filesystem_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever the test's own dir is on (ext4 here; overlayfs or tmpfs in many containers)."""
    batcher = commits.batcher_for(asyncio.get_running_loop())
    batcher.shared_sync = commits.kernel_reports_syncfs_errors()
    magic = filesystem_magic(tmp_path)
    name = filesystem_name(magic)
    with caplog.at_level(logging.INFO, logger="eventlog.engine"):
        syncs, fdatasyncs = await _run_logs(batcher, tmp_path, monkeypatch)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"log dir {tmp_path} ")]
    assert len(lines) == 1, lines  # once per log dir, not once per partition
    if syncfs_flushes_files(magic) and batcher.shared_sync:
        assert (syncs, fdatasyncs) == (1, 0)
        assert lines[0] == f"log dir {tmp_path} on {name}: one syncfs for the commits of many partitions at once (shared sync)"
    else:
        assert (syncs, fdatasyncs) == (0, 4)
        assert lines[0].startswith(f"log dir {tmp_path} on {name}: fdatasync per file (")
    device = (tmp_path / "p0").stat().st_dev
    assert batcher.filesystems()[device] == (name, syncfs_flushes_files(magic) and batcher.shared_sync)


async def test_a_tmpfs_gets_an_fdatasync_per_file_even_with_shared_sync_on(
    small_fs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """EVENTLOG_SHARED_SYNC=true never forces the syncfs onto a filesystem not known to flush
    files; the log says so."""
    fs = small_fs(64 << 20)
    assert filesystem_magic(fs.path) == TMPFS
    batcher = commits.batcher_for(asyncio.get_running_loop())
    batcher.shared_sync = True
    with caplog.at_level(logging.INFO, logger="eventlog.engine"):
        syncs, fdatasyncs = await _run_logs(batcher, fs.path, monkeypatch)
    assert (syncs, fdatasyncs) == (0, 4)
    device = (fs.path / "p0").stat().st_dev
    assert device not in batcher._sync_fds  # no descriptor opened for a syncfs it will never make
    assert batcher.filesystems()[device] == ("tmpfs", False)
    assert f"log dir {fs.path} on tmpfs: fdatasync per file (syncfs is not known to flush files there; " \
        "EVENTLOG_SHARED_SYNC=true does not change that)" in caplog.messages


async def test_shared_sync_off_is_off_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    batcher = commits.batcher_for(asyncio.get_running_loop())
    batcher.shared_sync = False
    with caplog.at_level(logging.INFO, logger="eventlog.engine"):
        syncs, fdatasyncs = await _run_logs(batcher, tmp_path, monkeypatch)
    assert (syncs, fdatasyncs) == (0, 4)
    name = filesystem_name(filesystem_magic(tmp_path))
    assert any(m.startswith(f"log dir {tmp_path} on {name}: fdatasync per file (") for m in caplog.messages)
