"""The descriptor budget: segments open their files lazily, and the least recently used ones
give their descriptors back when the budget is spent; nothing is lost by it."""

from __future__ import annotations

import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Iterator

import anyio
import pytest

from engine import reader
from engine.config import LogConfig
from engine.descriptors import BUDGET, MIN_RESERVE, budget_for

from .helpers import running_log
from .test_faults import put, values


@pytest.fixture
def small_budget() -> Iterator[int]:
    """A budget of 12 descriptors for the engine (restored afterwards)."""
    limit = BUDGET.limit
    BUDGET.configure(MIN_RESERVE + 12)
    assert BUDGET.budget == 12
    try:
        yield BUDGET.budget
    finally:
        BUDGET.configure(limit)


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_budget_keeps_a_reserve() -> None:
    assert budget_for(1024) == 768 and budget_for(4096) == 3072 and budget_for(1 << 20) == 786_432
    assert budget_for(100) == 3  # never below one partition


async def test_reads_across_many_segments_stay_within_the_budget(tmp_path: Path, small_budget: int) -> None:
    config = LogConfig(segment_bytes=300, index_interval_bytes=100)
    async with running_log(tmp_path / "t-0", config) as log:
        for i in range(60):
            await put(log, f"b{i}", n=3)
        assert len(log.view.segments) > 4 * small_budget
        before = open_descriptors()
        for _round in range(2):
            got = values(log)
            assert len(got) == 180 and got[0].startswith(b"b0-0-") and got[-1].startswith(b"b59-2-")
            # the engine's own handles stay within the budget; readers' local ones come and go
            assert BUDGET.open <= small_budget
            assert open_descriptors() <= before + small_budget
        for offset in (0, 55, 179):
            assert reader.read_records(log.view, offset, 1, 10**6).records[0].offset == offset
        assert BUDGET.evictions > 0


async def test_an_active_segment_that_gave_its_descriptors_back_appends_again(tmp_path: Path, small_budget: int) -> None:
    """Eight partitions need 24 descriptors to be active at once; with 12 they take turns."""
    async with AsyncExitStack() as stack:
        logs = [
            await stack.enter_async_context(running_log(tmp_path / f"t-{p}", LogConfig(index_interval_bytes=100)))
            for p in range(8)
        ]
        for round_ in range(3):
            async with anyio.create_task_group() as writers:
                for log in logs:
                    writers.start_soon(put, log, f"r{round_}", 4)
            assert BUDGET.open <= small_budget + 3  # one commit in flight may hold its own
        for log in logs:
            assert [v[:3] for v in values(log)] == [b"r0-"] * 4 + [b"r1-"] * 4 + [b"r2-"] * 4
