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
from engine.descriptors import (
    BUDGET,
    MIN_RESERVE,
    budget_for,
    limit_for,
    max_partitions_for,
    reserve_for,
)

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
    # a quarter of the limit, at least 64 and at most 16,384 (issue 23: it was at least 256,
    # which left a limit of 256 one partition; and a quarter of 1 << 20 without a bound)
    assert [reserve_for(n) for n in (100, 256, 1024, 65_536, 1 << 20)] == [64, 64, 256, 16_384, 16_384]
    assert budget_for(256) == 192 and budget_for(1024) == 768 and budget_for(4096) == 3072
    assert budget_for(1 << 20) == (1 << 20) - 16_384
    assert budget_for(60) == 3  # never below one partition in use


def test_a_process_serves_a_partition_per_descriptor_of_its_budget() -> None:
    """One descriptor each that unflushed writes keep, and one append's three left free; the
    other descriptors of idle partitions are taken back (issue 23: it was three each)."""
    assert max_partitions_for(256) == 189 and max_partitions_for(1024) == 765
    assert max_partitions_for(67) == 0 and max_partitions_for(68) == 1
    for partitions in (1, 189, 190, 4098, 100_000):
        limit = limit_for(partitions)
        assert max_partitions_for(limit) >= partitions > max_partitions_for(limit - 1)


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
