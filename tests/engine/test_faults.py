"""Injected I/O faults (engine/faults.py's seam in the file layer): a full disk refuses appends
and leaves no trace, a failed read fails one request, a slow fsync only slows things down."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import anyio
import pytest

from engine import faults, reader
from engine.config import LogConfig
from engine.errors import StorageError, StorageFullError, TooManyOpenFilesError
from engine.partition_log import prepare_batches
from engine.records import encode_batch
from engine.segment import LogSegment

from .helpers import FakeClock, running_log
from .test_partition_log import check_files

T0 = 1_700_000_000_000


@pytest.fixture
def inject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """inject(rule, ...) replaces the rules; inject() lifts every fault."""
    path = tmp_path / "faults.json"
    monkeypatch.setattr(faults, "FAULTS_FILE", str(path))
    monkeypatch.setattr(faults, "_rules_version", None)
    version = [0]

    def set_rules(*rules: dict) -> None:
        version[0] += 1
        path.write_text(json.dumps({"rules": list(rules)}))
        os.utime(path, ns=(version[0] * 10**9, version[0] * 10**9))  # a new mtime every time

    set_rules()
    return set_rules


def records(tag: str, n: int = 5, size: int = 40) -> bytes:
    return encode_batch(0, [(b"k", f"{tag}-{i}-".encode() + b"x" * size, T0, []) for i in range(n)])


async def put(log, tag: str, n: int = 5, size: int = 40):
    return await log.append(prepare_batches(records(tag, n, size), log.config))


def values(log) -> list[bytes]:
    return [r.value for r in reader.read_records(log.view, log.log_start_offset, 10**6, 10**9).records]


@pytest.mark.parametrize("op", ["write", "fsync"])
async def test_a_full_disk_refuses_appends_and_leaves_nothing(tmp_path: Path, inject, op: str) -> None:
    data = tmp_path / "log"
    async with running_log(data, LogConfig(segment_bytes=2000, index_interval_bytes=100)) as log:
        for i in range(6):
            await put(log, f"a{i}")
        before = (log.high_watermark, sorted(p.name for p in data.iterdir()), values(log))
        sizes = {p.name: p.stat().st_size for p in data.glob("*.log")}

        inject({"op": op, "path": str(data), "errno": "ENOSPC"})
        for i in range(4):  # some of these would roll a new segment
            with pytest.raises(StorageFullError):
                await put(log, f"refused{i}", n=8)
        assert (log.high_watermark, sorted(p.name for p in data.iterdir()), values(log)) == before
        assert {p.name: p.stat().st_size for p in data.glob("*.log")} == sizes, "no partial batch on disk"
        assert log.failed is None, "a full disk does not take the partition offline"

        inject()  # space returns
        result = await put(log, "after")
        assert result.base_offset == before[0]
        for i in range(10):
            await put(log, f"more{i}", n=8)
        got = values(log)
        assert got[: len(before[2])] == before[2]
        assert not any(v.startswith(b"refused") for v in got)
    check_files(data)
    async with running_log(data, LogConfig(segment_bytes=2000, index_interval_bytes=100), clean_shutdown=False) as log:
        assert values(log) == got


async def test_a_full_disk_in_the_middle_of_a_group_commit(tmp_path: Path, inject) -> None:
    """Many producers queued together: every one of them is refused, none half-written."""
    data = tmp_path / "log"
    async with running_log(data, LogConfig(segment_bytes=4000)) as log:
        await put(log, "first")
        inject({"op": "write", "path": str(data), "errno": "ENOSPC", "times": 1})
        outcomes: list[str] = []

        async def producer(i: int) -> None:
            try:
                await put(log, f"p{i}", n=3)
                outcomes.append("ok")
            except StorageFullError:
                outcomes.append("full")

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(producer, i)
        assert "full" in outcomes
        assert log.high_watermark == 5 + 3 * outcomes.count("ok")
        assert len(values(log)) == log.high_watermark
    check_files(data)


async def test_no_descriptor_left_refuses_the_append_and_keeps_the_partition(tmp_path: Path, inject) -> None:
    """EMFILE (the process's open-files limit) is transient like a full disk: the append is
    undone and refused with TooManyOpenFilesError, the partition stays writable."""
    data = tmp_path / "log"
    async with running_log(data, LogConfig(segment_bytes=2000, index_interval_bytes=100)) as log:
        await put(log, "kept")
        inject({"op": "write", "path": str(data), "errno": "EMFILE"})
        for i in range(3):
            with pytest.raises(TooManyOpenFilesError):
                await put(log, f"refused{i}", n=8)
        assert log.failed is None and log.high_watermark == 5
        inject()
        assert (await put(log, "after")).base_offset == 5
        assert [v[:5] for v in values(log)] == [b"kept-"] * 5 + [b"after"] * 5
    check_files(data)


async def test_an_undo_that_meets_no_descriptor_fails_the_partition(
    tmp_path: Path, inject, monkeypatch
) -> None:
    """A transient failure is refused and the partition stays writable only because its undo
    worked: an undo that itself fails (EMFILE reopening the file) may leave the commit's bytes
    in the segment, so the partition is failed for writes, as after EIO."""
    data = tmp_path / "log"
    async with running_log(data, LogConfig(segment_bytes=2000, index_interval_bytes=100)) as log:
        await put(log, "kept")

        def no_descriptor(self, state):  # noqa: ANN001, ANN202
            raise TooManyOpenFilesError(str(self.log_path), "cannot reopen the segment: EMFILE")

        monkeypatch.setattr(LogSegment, "rollback", no_descriptor)
        inject({"op": "write", "path": str(data), "errno": "EMFILE"})
        with pytest.raises(StorageError) as exc:
            await put(log, "refused", n=8)
        assert not isinstance(exc.value, TooManyOpenFilesError)
        assert log.failed is not None
        inject()


async def test_eio_on_fsync_takes_the_partition_offline_for_writes_only(tmp_path: Path, inject) -> None:
    data = tmp_path / "log"
    async with running_log(data) as log:
        await put(log, "kept")
        inject({"op": "fsync", "path": str(data), "errno": "EIO"})
        with pytest.raises(StorageError) as exc:
            await put(log, "lost")
        assert not isinstance(exc.value, StorageFullError)
        assert log.failed is not None
        inject()
        with pytest.raises(StorageError):  # until a restart recovers the log
            await put(log, "again")
        assert len(values(log)) == 5, "reads go on"
    async with running_log(data, clean_shutdown=False) as log:
        assert values(log)[:5] == [f"kept-{i}-".encode() + b"x" * 40 for i in range(5)]
        await put(log, "after-restart")


async def test_eio_on_a_deferred_fsync_fails_the_partition_not_the_writer(tmp_path: Path, inject) -> None:
    """flush.messages > 1: the fsync that flush.ms brings runs in the writer's idle loop. Its
    failure used to end the writer task (and with it the whole engine's task group); now it
    fails the partition for writes, as a failed commit does, and the writer serves on."""
    data = tmp_path / "log"
    clock = FakeClock(T0)
    async with running_log(data, LogConfig(flush_messages=1000, flush_ms=1000), clock=clock) as log:
        await put(log, "kept")
        inject({"op": "fsync", "path": str(data), "errno": "EIO"})
        clock.now += 1000  # no tick: the writer's own timer finds flush.ms passed (within 1 s)
        with anyio.fail_after(10):
            while log.failed is None:
                await anyio.sleep(0.01)
        with pytest.raises(StorageError):
            await put(log, "refused")
        assert len(values(log)) == 5, "reads go on"
        inject()
    async with running_log(data, clean_shutdown=False) as log:
        assert len(values(log)) == 5


async def test_eio_on_read_fails_that_read_only(tmp_path: Path, inject) -> None:
    data = tmp_path / "log"
    async with running_log(data) as log:
        for i in range(3):
            await put(log, f"r{i}", size=30_000)  # large enough to be read in a thread
        inject({"op": "read", "path": str(data), "errno": "EIO", "times": 2})
        with pytest.raises(StorageError):
            await log.read_records(0, 100, 10**6)
        with pytest.raises(StorageError):
            log.fetch_slice(0, 10**6)
        slice_ = log.fetch_slice(0, 10**6)
        inject({"op": "read", "path": str(data), "errno": "EIO", "times": 1})
        with pytest.raises(StorageError):
            await log.read_slice(slice_)
        assert len((await log.read_records(0, 100, 10**6)).records) == 15
        await put(log, "writes-unaffected")


@pytest.mark.parametrize("code", ["EMFILE", "ENFILE", "ENOMEM"])
async def test_no_descriptor_left_on_a_read_refuses_that_read_and_keeps_the_partition(
    tmp_path: Path, inject, code: str
) -> None:
    """A read that meets EMFILE (or another transient errno) is refused as an append would be,
    TooManyOpenFilesError (503 with Retry-After), not a StorageError of a failing dir; every
    read path says so, and the partition stays online for reads and writes."""
    data = tmp_path / "log"
    async with running_log(data) as log:
        for i in range(3):
            await put(log, f"r{i}", size=30_000)  # large enough to be read in a thread
        inject({"op": "read", "path": str(data), "errno": code})
        with pytest.raises(TooManyOpenFilesError):
            await log.read_records(0, 100, 10**6)
        with pytest.raises(TooManyOpenFilesError):
            log.fetch_slice(0, 10**6)
        inject()
        slice_ = log.fetch_slice(0, 10**6)
        inject({"op": "read", "path": str(data), "errno": code})
        with pytest.raises(TooManyOpenFilesError):
            await log.read_slice(slice_)
        with pytest.raises(TooManyOpenFilesError):
            await log.read_key(b"k", -1, 100, 10**6)
        assert log.failed is None
        await put(log, "writes-unaffected")
        inject()
        assert len((await log.read_records(0, 100, 10**6)).records) == 20


async def test_no_descriptor_left_to_open_a_segment_for_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The descriptor budget took a closed segment's descriptor back and the process is out of
    descriptors when a read reopens it (EMFILE even after evicting): TooManyOpenFilesError,
    and the next read, with descriptors to spare, succeeds."""
    data = tmp_path / "log"
    async with running_log(data, LogConfig(segment_bytes=2000)) as log:
        for i in range(10):
            await put(log, f"s{i}")
        closed = log.view.segments[0]
        assert closed.base_offset == 0 and len(log.view.segments) > 1
        assert closed.release_descriptors()
        real_open = os.open

        def no_descriptor(path, *args, **kwargs):
            if str(path).endswith(".log"):
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", no_descriptor)
        with pytest.raises(TooManyOpenFilesError):
            log.fetch_slice(0, 10**6)
        with pytest.raises(TooManyOpenFilesError):
            await log.read_records(0, 100, 10**6)
        monkeypatch.setattr(os, "open", real_open)
        assert log.failed is None
        assert len((await log.read_records(0, 100, 10**6)).records) == 50


async def test_a_slow_fsync_loses_and_reorders_nothing(tmp_path: Path, inject) -> None:
    data = tmp_path / "log"
    inject({"op": "fsync", "path": str(data), "delay_ms": 30})
    async with running_log(data) as log:
        acked: list[tuple[int, str]] = []

        async def producer(p: int) -> None:
            for i in range(8):
                result = await put(log, f"p{p}.{i}", n=2)
                acked.append((result.base_offset, f"p{p}.{i}"))

        async with anyio.create_task_group() as tg:
            for p in range(6):
                tg.start_soon(producer, p)
        got = values(log)
        assert len(got) == 96
        for base, tag in acked:
            assert got[base].startswith(f"{tag}-0-".encode()) and got[base + 1].startswith(f"{tag}-1-".encode())
        for p in range(6):  # each producer's appends in its order
            mine = sorted(base for base, tag in acked if tag.startswith(f"p{p}."))
            assert [tag for base, tag in sorted(acked) if tag.startswith(f"p{p}.")] == [f"p{p}.{i}" for i in range(8)]
            assert len(mine) == 8
