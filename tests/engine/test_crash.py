"""SIGKILL a process in the middle of a stream of appends; every acknowledged record survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from engine import reader
from engine.log_manager import EngineConfig, open_engine

from ..conftest import REPO
from .test_partition_log import check_files

pytestmark = pytest.mark.slow


def _run_and_kill(data_dir: Path, run_id: str, acks_before_kill: int) -> list[tuple[int, int, list[str]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.engine.crash_writer", str(data_dir), run_id],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    acked = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    try:
        for line in proc.stdout:
            if line.startswith("ACK "):
                _, partition, base, *values = line.split()
                acked.append((int(partition), int(base), values))
                if len(acked) >= acks_before_kill:
                    break
            assert time.monotonic() < deadline, "the writer is too slow"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        stderr = proc.stderr.read() if proc.stderr else ""
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert acked, stderr
    return acked


async def _read_everything(data_dir: Path) -> dict[int, dict[int, bytes]]:
    out: dict[int, dict[int, bytes]] = {}
    async with open_engine(EngineConfig(log_dirs=(data_dir,))) as engine:
        for p in range(3):
            log = engine.partition("crash", p)
            records = reader.read_records(log.view, 0, 10**7, 10**9).records
            out[p] = {r.offset: r.value for r in records}
            assert [r.offset for r in records] == list(range(log.high_watermark))  # no holes, no torn tail
    return out


def test_acknowledged_records_survive_repeated_sigkill(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    all_acked = []
    for run in range(3):
        all_acked += _run_and_kill(data_dir, f"r{run}", acks_before_kill=150 + 100 * run)
        assert not (data_dir / ".kafka_cleanshutdown").exists()
        stored = anyio.run(_read_everything, data_dir)
        for partition, base, values in all_acked:
            for j, value in enumerate(values):
                assert stored[partition].get(base + j) == value.encode(), (partition, base + j)
    for p in range(3):
        check_files(data_dir / f"crash-{p}")
    assert len(os.listdir(data_dir / "crash-0")) > 3  # rolled segments were part of the test
