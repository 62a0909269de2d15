"""The retention deleter: the planner against Kafka's rules run step by step, then real logs."""

from __future__ import annotations

import os
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import filenames, reader
from engine.checkpoints import read_checkpoint
from engine.config import LogConfig
from engine.errors import OffsetOutOfRangeError
from engine.format import NO_TIMESTAMP
from engine.log_manager import EngineConfig, open_engine
from engine.partition_log import PartitionLog
from engine.records import decode_batch
from engine.segment import LogSegment
from workers.retention import (
    LOG_START_OFFSET,
    REASONS,
    RETENTION_BYTES,
    RETENTION_MS,
    SegmentFacts,
    _still_a_prefix,
    plan_retention,
    run_retention,
)

from ..engine.helpers import FakeClock, append_records, running_log

T0 = 1_700_000_000_000  # FakeClock's now
DAY = 86_400_000
VALUE = b"v" * 50  # with segment.bytes=200, every batch of one or two records rolls a segment
SMALL = LogConfig(segment_bytes=200, retention_ms=-1, retention_bytes=-1)


# ---------------------------------------------------------------------------------------------
# the planner


def kafka_model(
    segments: list[SegmentFacts], lso: int, retention_ms: int, retention_bytes: int, delete: bool, now: int
) -> list[str]:
    """UnifiedLog.deleteOldSegments as written: each rule deletes from the front of what the
    previous rules left, never the last segment, sizes summed afresh every step."""
    remaining = list(segments)
    causes: list[str] = []

    def take(qualifies, reason: str) -> None:
        while len(remaining) > 1 and qualifies(remaining[0]):
            causes.append(reason)
            remaining.pop(0)

    def largest(s: SegmentFacts) -> int:
        return s.last_modified_ms if s.max_timestamp == NO_TIMESTAMP else s.max_timestamp

    take(lambda s: s.next_offset <= lso, LOG_START_OFFSET)
    if delete and retention_bytes >= 0:
        take(lambda s: sum(x.size for x in remaining) - s.size >= retention_bytes, RETENTION_BYTES)
    if delete and retention_ms >= 0:
        take(lambda s: now - largest(s) > retention_ms, RETENTION_MS)
    return causes


@st.composite
def segment_lists(draw) -> list[SegmentFacts]:
    base = draw(st.integers(0, 5))
    out = []
    for _ in range(draw(st.integers(1, 8))):
        records = draw(st.integers(0, 4))
        size = draw(st.integers(1, 60)) if records else 0
        out.append(
            SegmentFacts(
                base,
                base + records,
                size,
                draw(st.one_of(st.just(NO_TIMESTAMP), st.integers(0, 1000))),
                draw(st.integers(0, 1000)),
            )
        )
        base += records + (draw(st.integers(0, 2)) if records else 0)  # a compaction gap
    return out


@st.composite
def plan_inputs(draw) -> dict:
    segments = draw(segment_lists())
    total = sum(s.size for s in segments)
    return {
        "segments": segments,
        "log_start_offset": draw(
            st.one_of(st.just(segments[0].base_offset), st.integers(segments[0].base_offset, segments[-1].next_offset))
        ),
        "retention_ms": draw(st.one_of(st.just(-1), st.integers(0, 1200))),
        "retention_bytes": draw(st.one_of(st.just(-1), st.integers(0, total + 20))),
        "delete_policy": draw(st.sampled_from([True, True, False])),
        "now_ms": draw(st.integers(500, 2000)),
    }


@settings(max_examples=500, deadline=None)
@given(plan_inputs())
def test_plan_is_kafkas_step_by_step_deletion(inputs: dict) -> None:
    segments = inputs["segments"]
    plan = plan_retention(**inputs)
    expected = kafka_model(
        segments, inputs["log_start_offset"], inputs["retention_ms"], inputs["retention_bytes"],
        inputs["delete_policy"], inputs["now_ms"],
    )
    assert list(plan.causes) == expected
    assert plan.indexes == tuple(range(len(expected)))  # a prefix, oldest first
    assert len(segments) - 1 not in plan.indexes  # never the active segment
    assert set(plan.reasons) == set(REASONS) and sum(plan.reasons.values()) == len(expected)
    if not inputs["delete_policy"]:
        assert set(plan.causes) <= {LOG_START_OFFSET}
    by_size = plan.reasons[RETENTION_BYTES]
    if by_size:
        # the size rule never takes the partition below retention.bytes ...
        through_size = plan.reasons[LOG_START_OFFSET] + by_size
        assert sum(s.size for s in segments[through_size:]) >= inputs["retention_bytes"]
        if not plan.reasons[RETENTION_MS]:
            assert sum(s.size for s in segments[len(expected):]) >= inputs["retention_bytes"]


@settings(max_examples=300, deadline=None)
@given(plan_inputs())
def test_next_base_offset_stands_in_for_next_offset_except_at_the_log_start(inputs: dict) -> None:
    """What run_retention's fact gathering relies on to avoid reading every segment's end."""
    segments, lso = inputs["segments"], inputs["log_start_offset"]
    stand_in = [
        s if not_straddling is None else replace(s, next_offset=not_straddling)
        for s, not_straddling in zip(
            segments,
            [
                nxt.base_offset if not s.base_offset <= lso < nxt.base_offset else None
                for s, nxt in pairwise(segments)
            ] + [None],
        )
    ]
    assert plan_retention(**{**inputs, "segments": stand_in}) == plan_retention(**inputs)


def facts(*specs: tuple[int, int], base: int = 0) -> list[SegmentFacts]:
    """Segments of one record each from (size, max_timestamp) pairs; mtime 0."""
    return [SegmentFacts(base + i, base + i + 1, size, ts, 0) for i, (size, ts) in enumerate(specs)]


def plan(segments: list[SegmentFacts], **kw):
    args = {"log_start_offset": 0, "retention_ms": -1, "retention_bytes": -1, "delete_policy": True}
    return plan_retention(segments, **{**args, "now_ms": T0, **kw})


def test_time_rule_is_strict_at_the_cutoff() -> None:
    segments = facts((10, T0 - DAY - 1), (10, T0 - DAY), (10, T0 - 5 * DAY), (10, T0))
    result = plan(segments, retention_ms=DAY)
    assert result.indexes == (0,)  # exactly retention.ms old stays, and so does all after it
    assert result.reasons == {LOG_START_OFFSET: 0, RETENTION_BYTES: 0, RETENTION_MS: 1}
    assert plan(segments, retention_ms=0).indexes == (0, 1, 2)
    assert plan(segments, retention_ms=-1).indexes == ()


def test_size_rule_deletes_down_to_exactly_retention_bytes() -> None:
    segments = facts((10, T0), (20, T0), (30, T0), (5, T0))  # 65 bytes
    assert plan(segments, retention_bytes=35).indexes == (0, 1)  # 35 left
    assert plan(segments, retention_bytes=36).indexes == (0,)  # 55 left; 35 would be too few
    assert plan(segments, retention_bytes=0).indexes == (0, 1, 2)  # the active one stays
    assert plan(segments, retention_bytes=65).indexes == ()
    assert plan(segments, retention_bytes=1000).indexes == ()


def test_segments_without_timestamps_age_by_file_mtime() -> None:
    segments = [
        SegmentFacts(0, 1, 10, NO_TIMESTAMP, T0 - 2 * DAY),
        SegmentFacts(1, 2, 10, NO_TIMESTAMP, T0),
        SegmentFacts(2, 3, 10, NO_TIMESTAMP, 0),
    ]
    assert segments[0].largest_timestamp == T0 - 2 * DAY
    assert plan(segments, retention_ms=DAY).indexes == (0,)


def test_reasons_follow_kafkas_order() -> None:
    segments = facts((10, T0 - 9 * DAY), (10, T0 - 9 * DAY), (10, T0 - 9 * DAY), (10, T0 - 9 * DAY), (10, T0))
    result = plan(segments, log_start_offset=1, retention_bytes=30, retention_ms=DAY)
    assert result.causes == (LOG_START_OFFSET, RETENTION_BYTES, RETENTION_MS, RETENTION_MS)


def test_a_later_rule_starts_where_the_one_before_stopped() -> None:
    """Not the union of three prefixes: the young first segment, taken by the log start offset
    rule, does not stop the time rule (nor a big one the size rule)."""
    segments = facts((10, T0), (10, T0 - 9 * DAY), (10, T0 - 9 * DAY), (10, T0))
    result = plan(segments, log_start_offset=1, retention_ms=DAY)
    assert result.causes == (LOG_START_OFFSET, RETENTION_MS, RETENTION_MS)
    segments = facts((100, T0), (10, T0), (10, T0), (10, T0))
    result = plan(segments, log_start_offset=1, retention_bytes=20)
    assert result.causes == (LOG_START_OFFSET, RETENTION_BYTES)


def test_compact_policy_plans_only_below_the_log_start_offset() -> None:
    segments = facts((10, 0), (10, 0), (10, 0), (10, 0))
    assert plan(segments, delete_policy=False, retention_ms=0, retention_bytes=0).indexes == ()
    result = plan(segments, delete_policy=False, retention_ms=0, retention_bytes=0, log_start_offset=2)
    assert result.indexes == (0, 1) and result.reasons[LOG_START_OFFSET] == 2


def test_log_start_rule_stops_at_the_segment_holding_it() -> None:
    segments = [SegmentFacts(0, 4, 10, T0, 0), SegmentFacts(4, 8, 10, T0, 0), SegmentFacts(8, 9, 10, T0, 0)]
    assert plan(segments, log_start_offset=5).indexes == (0,)
    assert plan(segments, log_start_offset=8).indexes == (0, 1)
    assert plan(segments, log_start_offset=9).indexes == (0, 1)  # the active one stays


def test_active_segment_alone_is_never_planned() -> None:
    only = facts((10, 0))
    assert plan(only, retention_ms=0, retention_bytes=0, log_start_offset=1).indexes == ()
    assert plan([], retention_ms=0, retention_bytes=0).indexes == ()


def test_a_changed_segment_list_only_ever_loses_a_prefix() -> None:
    a, b, c, d, active, x = (object() for _ in range(6))
    causes = (RETENTION_MS,) * 3
    assert _still_a_prefix([a, b, c], causes, (a, b, c, d, active)) == ([a, b, c], list(causes))
    # a concurrent pass deleted a: b and c are still the front
    assert _still_a_prefix([a, b, c], causes, (b, c, d, active))[0] == [b, c]
    # a compaction replaced b with x: deleting c would leave x, then a hole
    assert _still_a_prefix([a, b, c], causes, (a, x, c, d, active))[0] == [a]
    assert _still_a_prefix([a, b, c], causes, (x, c, d, active))[0] == []
    # c became the last segment: it is not handed over
    assert _still_a_prefix([a, b, c], causes, (a, b, c))[0] == [a, b]


# ---------------------------------------------------------------------------------------------
# real logs


async def fill(log: PartitionLog, timestamps: list[int], per_batch: int = 1) -> None:
    """One batch per timestamp; each lands in a segment of its own."""
    for ts in timestamps:
        await append_records(log, [(b"k", VALUE, ts, [])] * per_batch)
    assert len(log.view.segments) == len(timestamps)


def log_names(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if ".log" in n)


def offsets_from(log: PartitionLog, offset: int) -> list[int]:
    return [r.offset for r in reader.read_records(log.view, offset, 1000, 10**6).records]


async def test_expired_segments_go_and_reads_start_at_the_new_log_start(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    config = replace(SMALL, retention_ms=DAY)
    async with running_log(directory, config) as log:
        await fill(log, [T0 - 3 * DAY, T0 - 2 * DAY, T0 - DAY - 1, T0 - DAY, T0])
        sizes = [s.size for s in log.view.segments]
        result = await run_retention(log)  # the log's clock: T0
        assert (result.topic, result.partition) == ("t", 0)
        assert result.segments_deleted == 3 and result.bytes_reclaimed == sum(sizes[:3])
        assert result.reasons == {LOG_START_OFFSET: 0, RETENTION_BYTES: 0, RETENTION_MS: 3}
        assert result.log_start_offset == log.log_start_offset == 3
        assert [s.base_offset for s in log.view.segments] == [3, 4]
        assert log_names(directory) == [filenames.log_file(directory, b).name for b in (3, 4)]
        assert offsets_from(log, 3) == [3, 4]
        with pytest.raises(OffsetOutOfRangeError):
            reader.fetch_slice(log.view, 2, 100)
        again = await run_retention(log)
        assert again.segments_deleted == 0 and again.bytes_reclaimed == 0
        assert await run_retention(log, now_ms=T0 + 1) == replace(
            again, segments_deleted=1, bytes_reclaimed=sizes[3], reasons={**again.reasons, RETENTION_MS: 1},
            log_start_offset=4,
        )
        hw = log.high_watermark
    async with running_log(directory, config, clean_shutdown=True, recovery_point=hw, log_start_offset=4) as log:
        assert [s.base_offset for s in log.view.segments] == [4]
        assert offsets_from(log, 4) == [4]


async def test_the_active_segment_stays_however_old(tmp_path: Path) -> None:
    config = replace(SMALL, retention_ms=DAY, retention_bytes=0)
    async with running_log(tmp_path / "t-0", config) as log:
        await fill(log, [T0 - 10 * DAY] * 3)
        result = await run_retention(log)
        # the size rule comes before the time rule in Kafka's order, so it gets the credit
        assert result.reasons == {LOG_START_OFFSET: 0, RETENTION_BYTES: 2, RETENTION_MS: 0}
        assert [s.base_offset for s in log.view.segments] == [2] and log.log_start_offset == 2
        assert offsets_from(log, 2) == [2]
        assert (await run_retention(log, now_ms=T0 + 100 * DAY)).segments_deleted == 0
        await append_records(log, [(b"k", VALUE, T0, [])])  # and it still takes appends
        assert offsets_from(log, 2) == [2, 3]


async def test_size_retention_keeps_at_least_retention_bytes(tmp_path: Path) -> None:
    async with running_log(tmp_path / "t-0", SMALL) as log:
        await fill(log, [T0] * 5)
        sizes = [s.size for s in log.view.segments]
        keep = sum(sizes) - sizes[0] - sizes[1]
        log.config = replace(SMALL, retention_bytes=keep + 1)  # as alter_topic_configs does
        result = await run_retention(log)
        assert result.segments_deleted == 1 and result.reasons[RETENTION_BYTES] == 1
        assert log.view.size_bytes == keep + sizes[1]
        log.config = replace(SMALL, retention_bytes=keep)
        result = await run_retention(log)
        assert result.segments_deleted == 1 and result.bytes_reclaimed == sizes[1]
        assert log.view.size_bytes == keep  # exactly retention.bytes left
        assert log.log_start_offset == 2 and offsets_from(log, 2) == [2, 3, 4]


async def test_delete_records_then_retention_drops_segments_wholly_below(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    async with running_log(directory, SMALL) as log:
        await fill(log, [T0] * 5, per_batch=2)
        assert [s.base_offset for s in log.view.segments] == [0, 2, 4, 6, 8]
        assert (await run_retention(log)).segments_deleted == 0
        await log.delete_records(3)
        result = await run_retention(log)
        assert result.reasons == {LOG_START_OFFSET: 1, RETENTION_BYTES: 0, RETENTION_MS: 0}
        assert [s.base_offset for s in log.view.segments] == [2, 4, 6, 8]  # [2, 4) holds offset 3
        assert log.log_start_offset == 3 and offsets_from(log, 3) == list(range(3, 10))
        with pytest.raises(OffsetOutOfRangeError):
            reader.fetch_slice(log.view, 2, 100)
        await log.delete_records(-1)
        result = await run_retention(log)
        assert result.segments_deleted == 3 and result.log_start_offset == 10
        assert [s.base_offset for s in log.view.segments] == [8]  # below the start, but active
        assert reader.fetch_slice(log.view, 10, 100) is None
        assert log_names(directory) == [filenames.log_file(directory, 8).name]


async def test_compact_policy_deletes_only_below_the_log_start_offset(tmp_path: Path) -> None:
    config = replace(SMALL, cleanup_policy="compact", retention_ms=DAY, retention_bytes=0)
    async with running_log(tmp_path / "t-0", config) as log:
        await fill(log, [T0 - 10 * DAY] * 4)
        assert (await run_retention(log)).segments_deleted == 0
        await log.delete_records(2)
        result = await run_retention(log)
        assert result.reasons == {LOG_START_OFFSET: 2, RETENTION_BYTES: 0, RETENTION_MS: 0}
        assert [s.base_offset for s in log.view.segments] == [2, 3]
        assert offsets_from(log, 2) == [2, 3]


async def test_segments_without_timestamps_expire_by_file_mtime(tmp_path: Path) -> None:
    async with running_log(tmp_path / "t-0", replace(SMALL, retention_ms=DAY)) as log:
        await fill(log, [NO_TIMESTAMP] * 3)
        old_ns = (T0 - 2 * DAY) * 1_000_000
        os.utime(log.view.segments[0].log_path, ns=(old_ns, old_ns))
        result = await run_retention(log)  # segment 1 was written now, after T0
        assert result.reasons[RETENTION_MS] == 1
        assert [s.base_offset for s in log.view.segments] == [1, 2]


class DelayedDeletes:
    """A PartitionLog's schedule_delete that holds the files until fire(), as
    file.delete.delay.ms would."""

    def __init__(self) -> None:
        self.pending: list[LogSegment] = []

    def __call__(self, _log: PartitionLog, segments: list[LogSegment]) -> None:
        self.pending.extend(segments)

    def fire(self) -> None:
        for segment in self.pending:
            segment.close()
            segment.delete_files()
        self.pending.clear()


def running_log_with(directory: Path, config: LogConfig, deletes: DelayedDeletes):
    """A running log whose deleted segments wait for deletes.fire()."""
    return running_log(directory, config, schedule_delete=deletes)


async def test_a_reader_keeps_its_slice_through_the_deletion(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    deletes = DelayedDeletes()
    async with running_log_with(directory, replace(SMALL, retention_ms=DAY), deletes) as log:
        await fill(log, [T0 - 2 * DAY, T0 - 2 * DAY, T0])
        old_view = log.view
        held = reader.fetch_slice(old_view, 0, 100)
        assert (await run_retention(log)).segments_deleted == 2
        assert [s.base_offset for s in deletes.pending] == [0, 1]
        deleted = [filenames.log_file(directory, b, filenames.DELETED_SUFFIX).name for b in (0, 1)]
        assert set(deleted) <= set(os.listdir(directory))  # renamed, kept for the delay
        assert [r.offset for r in reader.read_records(old_view, 0, 10, 10**6).records] == [0, 1, 2]
        assert [r.offset for r in decode_batch(held.read())[1]] == [0]
        deletes.fire()  # file.delete.delay.ms has passed
        assert log_names(directory) == [filenames.log_file(directory, 2).name]
        assert [r.offset for r in decode_batch(held.read())[1]] == [0]  # its descriptor still reads
        assert offsets_from(log, 2) == [2]


async def test_through_the_log_manager_files_wait_and_recovery_finishes(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    engine_config = EngineConfig(log_dirs=(tmp_path,))
    async with open_engine(engine_config, FakeClock()) as engine:
        await engine.create_topic(
            "t", 1, {"segment.bytes": 200, "retention.ms": DAY, "file.delete.delay.ms": 60_000}
        )
        log = engine.partition("t", 0)
        await fill(log, [T0 - 3 * DAY, T0 - 2 * DAY, T0, T0])
        held = reader.fetch_slice(log.view, 0, 100)
        result = await run_retention(log)
        assert result.segments_deleted == 2 and result.log_start_offset == 2
        assert read_checkpoint(tmp_path / "log-start-offset-checkpoint")[("t", 0)] == 2
        assert filenames.log_file(directory, 0, filenames.DELETED_SUFFIX).exists()
        assert [r.offset for r in decode_batch(held.read())[1]] == [0]
    # closing cancelled the delayed unlink; the next start finishes it
    async with open_engine(engine_config, FakeClock()) as engine:
        log = engine.partition("t", 0)
        assert not [n for n in os.listdir(directory) if n.endswith(filenames.DELETED_SUFFIX)]
        assert log.log_start_offset == 2 and offsets_from(log, 2) == [2, 3]
