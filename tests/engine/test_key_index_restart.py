"""A restart costs O(1) per partition, not O(active segment) (issue 28): the key index of a big
active segment is loaded in the background (from the file a clean shutdown wrote, else by a
scan), the first appends after the start never wait for it, and what needs it (per-key reads,
per-key conditions) is right whether it came from the file, from a scan after a crash (a real
SIGKILL), or is still loading. Structural, not timed: a gate holds the background scan, and the
appends must finish while it is held."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest

from engine import key_index
from engine.config import LogConfig
from engine.errors import KeyVersionMismatchError
from engine.key_index import KEY_INDEX_SUFFIX, key_index_file

from .helpers import FakeClock, running_log
from .test_key_index import append_for, check_keys

ROOT = Path(__file__).resolve().parents[2]
CONFIG = LogConfig(segment_bytes=256 * 1024 * 1024)  # everything stays in the active segment
KEYS = [b"acct-%d" % i for i in range(400)]
CHECKED = KEYS[:: 40] + [b"never-written"]
VALUE = b"x" * 900


async def fill(log, clock, batches: int = 12, per_batch: int = 400) -> None:
    """About batches * per_batch KB of keyed records (some keyless) in the active segment."""
    for b in range(batches):
        values = [VALUE + b"%d-%d" % (b, i) for i in range(per_batch)]
        for key in (KEYS[b % len(KEYS)], KEYS[(b * 7 + 3) % len(KEYS)], None):
            await append_for(log, key, values[: per_batch // 3], clock)
        # many keys in one batch too
        await log.append(_many_keys(log, b, clock))


def _many_keys(log, b: int, clock):
    from engine.partition_log import prepare_batches
    from engine.records import encode_batch

    records = [(KEYS[(b + i) % len(KEYS)], b"v%d-%d" % (b, i), clock(), ()) for i in range(300)]
    return prepare_batches(encode_batch(0, records), log.config)


class Gate:
    """Holds key_index._scan_into on the background loader's thread until opened, and notes
    every scan and the thread it ran on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.calls: list[tuple[str, int, int]] = []  # (thread, from, to)
        real = key_index._scan_into

        def scan(active, segment, end_position, **kw):
            name = threading.current_thread().name
            self.calls.append((name, active.scanned_to, end_position))
            if name == "eventlog-keyindex-load":
                assert kw == {"yield_gil": True}  # the loader's scan hands the GIL on per batch
                self.entered.set()
                assert self.open.wait(20), "the gate was never opened"
            return real(active, segment, end_position, **kw)

        monkeypatch.setattr(key_index, "_scan_into", scan)


async def test_first_appends_after_a_crash_do_not_wait_for_the_rebuild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    async with running_log(tmp_path, CONFIG, clock=clock) as log:
        await fill(log, clock)
        size_before = log.view.active_end
        latest_2 = (await log.read_key(KEYS[2], -1, 1, 1)).latest
    assert size_before > 4 * 1024 * 1024
    key_index_file(tmp_path, 0).unlink()  # as a crash leaves it: no file for the active segment
    gate = Gate(monkeypatch)
    try:
        async with running_log(tmp_path, CONFIG, clock=clock, clean_shutdown=False) as log:
            with anyio.fail_after(10):  # (a bound on a hang, not a timing assertion)
                first = await append_for(log, None, [b"keyless, first after the start"], clock)
                keyed = await append_for(log, KEYS[1], [b"keyed, second"], clock)
                await log.append(_many_keys(log, 99, clock))
                await anyio.to_thread.run_sync(gate.entered.wait, 10)
            # the three appends are durable and answered while the rebuild is held mid-scan
            assert first.base_offset > 0 and keyed.base_offset == first.base_offset + 1
            active = log.key_index.active
            assert active is not None and not active.prefix_ready.is_set()
            assert active.prefix_end == size_before
            assert [c[0] for c in gate.calls] == ["eventlog-keyindex-load"], gate.calls
            # a per-key read, and a conditional append, wait for it (only they do)
            results: dict[str, object] = {}

            async def read() -> None:
                results["read"] = await log.read_key(KEYS[1], -1, 10_000, 1 << 26)

            async def conditional() -> None:
                try:
                    await append_for(log, KEYS[2], [b"if new"], clock, (KEYS[2], -1))
                except KeyVersionMismatchError as exc:
                    results["cond"] = exc.current

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                tg.start_soon(conditional)
                await anyio.sleep(0.2)
                assert results == {}
                plain = await append_for(log, KEYS[3], [b"meanwhile"], clock)  # not held up
                assert plain.base_offset > keyed.base_offset
                gate.open.set()
            got = results["read"]
            assert got.latest == keyed.base_offset  # type: ignore[attr-defined]
            assert results["cond"] == latest_2  # refused: the key had records before the start
            assert active.prefix_source == "scan"
            await check_keys(log, CHECKED + [KEYS[1], KEYS[2], KEYS[3]])
    finally:
        gate.open.set()


async def test_a_conditional_append_during_the_rebuild_sees_the_records_before_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    async with running_log(tmp_path, CONFIG, clock=clock) as log:
        await fill(log, clock, batches=6)
        latest = (await log.read_key(KEYS[2], -1, 1, 1)).latest
    key_index_file(tmp_path, 0).unlink()
    gate = Gate(monkeypatch)
    try:
        async with running_log(tmp_path, CONFIG, clock=clock, clean_shutdown=False) as log:
            await append_for(log, None, [b"first"], clock)  # starts the background rebuild
            await anyio.to_thread.run_sync(gate.entered.wait, 10)

            async def release() -> None:
                await anyio.sleep(0.2)
                gate.open.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(release)
                with pytest.raises(KeyVersionMismatchError) as refused:
                    await append_for(log, KEYS[2], [b"if new"], clock, (KEYS[2], -1))
            assert refused.value.current == latest
            done = await append_for(log, KEYS[2], [b"if unchanged"], clock, (KEYS[2], latest))
            assert (await log.read_key(KEYS[2], -1, 1, 1)).latest == done.base_offset
    finally:
        gate.open.set()


async def test_a_clean_restart_loads_the_active_entries_from_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    async with running_log(tmp_path, CONFIG, clock=clock) as log:
        await fill(log, clock, batches=4)
    path = key_index_file(tmp_path, 0)
    assert path.exists()  # the clean shutdown wrote the active segment's entries
    written = path.stat().st_mtime_ns
    gate = Gate(monkeypatch)
    gate.open.set()
    async with running_log(tmp_path, CONFIG, clock=clock, clean_shutdown=True) as log:
        await append_for(log, None, [b"first"], clock)
        active = log.key_index.active
        await anyio.to_thread.run_sync(active.prefix_ready.wait, 10)
        assert active.prefix_source == "file" and gate.calls == []
        await check_keys(log, CHECKED)
        after = await append_for(log, KEYS[0], [b"after the start"], clock)
    assert gate.calls == []  # no scan at all, not even at the shutdown
    assert path.stat().st_mtime_ns != written  # written again: it now covers the new record
    async with running_log(tmp_path, CONFIG, clock=clock, clean_shutdown=True) as log:
        assert (await log.read_key(KEYS[0], -1, 1, 1)).latest == after.base_offset
        assert log.key_index.active.prefix_source == "file" and gate.calls == []
    # a restart with nothing appended leaves the file as it is (nothing to write at shutdown)
    written = path.stat().st_mtime_ns
    async with running_log(tmp_path, CONFIG, clock=clock, clean_shutdown=True) as log:
        pass
    assert path.stat().st_mtime_ns == written


async def test_a_stale_file_is_never_used_for_the_active_segment(tmp_path: Path) -> None:
    """A clean shutdown's file, then appends after the start and a crash: the file no longer
    matches the segment (size, next offset), so the entries come from a scan; and a segment
    that recovery had to repair loses its file."""
    clock = FakeClock()
    async with running_log(tmp_path, CONFIG, clock=clock) as log:
        await fill(log, clock, batches=3)
    stale = key_index_file(tmp_path, 0).read_bytes()
    async with running_log(tmp_path, CONFIG, clock=clock, clean_shutdown=True) as log:
        await append_for(log, KEYS[5], [b"after"], clock)
    # as if the crash came before the shutdown; through a new inode, as the engine writes the
    # file: the last run's background load may still have the old one mapped, and a mapped file
    # truncated in place (write_bytes) kills the reading process with SIGBUS
    path = key_index_file(tmp_path, 0)
    path.with_name("stale.tmp").write_bytes(stale)
    os.replace(path.with_name("stale.tmp"), path)
    async with running_log(tmp_path, CONFIG, clock=clock, clean_shutdown=False) as log:
        await append_for(log, None, [b"first"], clock)
        active = log.key_index.active
        await anyio.to_thread.run_sync(active.prefix_ready.wait, 10)
        assert active.prefix_source == "scan"
        await check_keys(log, CHECKED + [KEYS[5]])


CHILD = r"""
import sys
import anyio
from pathlib import Path
from engine.config import LogConfig
from tests.engine.helpers import FakeClock, running_log
from tests.engine.test_key_index import append_for

async def main(directory, clean):
    clock = FakeClock(1_700_000_100_000)
    async with running_log(directory, LogConfig(segment_bytes=256 * 1024 * 1024), clock=clock,
                           clean_shutdown=clean) as log:
        for i in range(30):
            r = await append_for(log, b"acct-%d" % (i % 7), [b"crash %d" % i], clock)
            print("ACK", r.base_offset, flush=True)
        if sys.argv[3] == "wait-for-rebuild":
            await anyio.to_thread.run_sync(log.key_index.active.prefix_ready.wait, 20)
        print("DONE", flush=True)
        await anyio.sleep(60)

anyio.run(main, Path(sys.argv[1]), sys.argv[2] == "clean")
"""


def run_and_kill(directory: Path, clean: bool, mode: str) -> int:
    """Run the child until it has said DONE, then SIGKILL it; returns its last acked offset."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), "clean" if clean else "crash", mode],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    last = -1
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("ACK"):
                last = int(line.split()[1])
            if line.startswith("DONE"):
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert last >= 0
    return last


@pytest.mark.parametrize("mode", ["kill-while-loading", "wait-for-rebuild"])
async def test_per_key_reads_after_a_sigkill(tmp_path: Path, mode: str) -> None:
    clock = FakeClock()
    async with running_log(tmp_path, CONFIG, clock=clock) as log:
        await fill(log, clock, batches=4)
    # a clean start (file loaded in the background), appends, SIGKILL; then a crash start
    # (the stale file never used), appends, SIGKILL
    last = await anyio.to_thread.run_sync(run_and_kill, tmp_path, True, mode)
    last = await anyio.to_thread.run_sync(run_and_kill, tmp_path, False, mode)
    async with running_log(tmp_path, CONFIG, clock=clock, clean_shutdown=False) as log:
        assert log.view.high_watermark > last  # everything acknowledged is there
        keys = CHECKED + [b"acct-%d" % i for i in range(7)]
        await check_keys(log, keys)  # the first reads: the reader loads the entries itself
        latest = (await log.read_key(b"acct-3", -1, 1, 1)).latest
        done = await append_for(log, b"acct-3", [b"next"], clock, (b"acct-3", latest))
        await check_keys(log, keys)
    async with running_log(tmp_path, CONFIG, clock=clock, clean_shutdown=True) as log:
        assert (await log.read_key(b"acct-3", -1, 1, 1)).latest == done.base_offset
        await check_keys(log, keys)
    files = sorted(p.name for p in tmp_path.glob("*" + KEY_INDEX_SUFFIX))
    assert files == [key_index_file(tmp_path, 0).name]
