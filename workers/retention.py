"""The retention deleter: which old segments of a partition go, and one pass that drops them.

Kafka's UnifiedLog.deleteOldSegments. Three rules, run one after another; each deletes closed
segments from the front of what the rules before it left, oldest first, and stops at the first
segment that does not qualify:

    log_start_offset  the segment ends at or below the log start offset (next_offset <= it),
                      as delete-records leaves it; applies whatever cleanup.policy says
    retention_bytes   cleanup.policy has delete and retention.bytes >= 0: without the segment
                      the partition (active segment included) still holds >= retention.bytes
    retention_ms      cleanup.policy has delete and retention.ms >= 0: the segment's largest
                      timestamp (the .log file's mtime when no record has one) is below
                      now - retention.ms

The order is Kafka's (log start offset, size, time); it matters, since a later rule starts past
segments an earlier one took even where it would itself have stopped. Each deleted segment is
credited to the rule that took it. Unlike Kafka, which rolls and then deletes an expired active
segment, the active segment is never deleted (docs/OPERATIONS.md, "Retention and compaction").

plan_retention is pure. run_retention gathers the facts in a worker thread, plans, and hands
the segments to PartitionLog.delete_segments, whose numbered steps (rename to .deleted, raise
the log start offset to the first remaining base offset, unlink after file.delete.delay.ms)
say what recovery does after a crash. One pass per call; scheduling is the caller's.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from engine.errors import EngineError
from engine.partition_log import PartitionLog
from engine.segment import LogSegment
from engine.segments import LogView

LOG_START_OFFSET = "log_start_offset"
RETENTION_BYTES = "retention_bytes"
RETENTION_MS = "retention_ms"
REASONS = (LOG_START_OFFSET, RETENTION_BYTES, RETENTION_MS)  # Kafka's order

_GATHER_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class SegmentFacts:
    """What retention needs to know about one segment."""

    base_offset: int
    next_offset: int  # one past the last offset; base_offset when empty
    size: int  # bytes of the .log
    max_timestamp: int  # NO_TIMESTAMP when no record carries one
    last_modified_ms: int  # the .log file's mtime

    @property
    def largest_timestamp(self) -> int:
        """Kafka's LogSegment.largestTimestamp: max_timestamp, or the mtime when that is
        negative (NO_TIMESTAMP)."""
        return self.max_timestamp if self.max_timestamp >= 0 else self.last_modified_ms


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """The segments to delete: indexes 0 .. len(causes) - 1, and the rule that claimed each."""

    causes: tuple[str, ...]

    @property
    def indexes(self) -> tuple[int, ...]:
        return tuple(range(len(self.causes)))

    @property
    def reasons(self) -> dict[str, int]:
        """Segments per rule; every key of REASONS is present."""
        return _count(self.causes)


@dataclass(frozen=True, slots=True)
class RetentionResult:
    topic: str
    partition: int
    segments_deleted: int
    bytes_reclaimed: int
    reasons: dict[str, int]  # segments deleted per rule; every key of REASONS is present
    log_start_offset: int  # after the pass


def plan_retention(
    segments: Sequence[SegmentFacts],
    *,
    log_start_offset: int,
    retention_ms: int,
    retention_bytes: int,
    delete_policy: bool,
    now_ms: int,
) -> RetentionPlan:
    """The prefix of `segments` (oldest first; the last is the active segment) to delete.

    -1 for retention_ms or retention_bytes turns that rule off; delete_policy False leaves only
    the log start offset rule. The active segment is never chosen, so a list of one segment
    (or none) gives an empty plan.
    """
    closed = segments[:-1]
    causes: list[str] = []

    def take(qualifies, reason: str) -> None:
        while len(causes) < len(closed) and qualifies(closed[len(causes)]):
            causes.append(reason)

    take(lambda s: s.next_offset <= log_start_offset, LOG_START_OFFSET)
    if delete_policy and retention_bytes >= 0:
        excess = sum(s.size for s in segments[len(causes):]) - retention_bytes

        def too_much(s: SegmentFacts) -> bool:
            nonlocal excess
            if s.size > excess:
                return False
            excess -= s.size
            return True

        take(too_much, RETENTION_BYTES)
    if delete_policy and retention_ms >= 0:
        cutoff = now_ms - retention_ms
        take(lambda s: s.largest_timestamp < cutoff, RETENTION_MS)
    return RetentionPlan(tuple(causes))


async def run_retention(log: PartitionLog, *, now_ms: int | None = None) -> RetentionResult:
    """One retention pass over `log` with its current config; `now_ms` defaults to its clock.

    Segments that left the log while the pass ran (a concurrent pass, a compaction swap) are
    skipped, and so is everything after the first of them that was replaced rather than
    deleted: only a prefix of the live segment list is ever handed to delete_segments. Raises
    what delete_segments raises (LogClosedError, StorageError).
    """
    now = log.clock() if now_ms is None else now_ms
    config = log.config
    view, facts = await _gather(log)
    plan = plan_retention(
        facts,
        log_start_offset=view.log_start_offset,
        retention_ms=config.retention_ms,
        retention_bytes=config.retention_bytes,
        delete_policy=config.delete,
        now_ms=now,
    )
    chosen = [view.segments[i] for i in plan.indexes]
    doomed, causes = _still_a_prefix(chosen, plan.causes, log.view.segments)
    removed = 0
    if doomed:
        summary = ", ".join(f"{k}={v}" for k, v in _count(causes).items() if v)
        removed = await log.delete_segments(doomed, reason=f"retention: {summary}")
    live = {id(s) for s in log.view.segments}
    deleted = [c for s, c in zip(doomed, causes) if id(s) not in live]
    return RetentionResult(
        log.topic, log.partition, len(deleted), removed, _count(deleted), log.log_start_offset
    )


async def _gather(log: PartitionLog) -> tuple[LogView, list[SegmentFacts]]:
    """A view and the facts of its segments, read in a worker thread. A read that fails
    because a segment left the log meanwhile is retried on the new view."""
    for attempt in range(_GATHER_ATTEMPTS):
        view = log.view
        try:
            return view, await anyio.to_thread.run_sync(_facts, view)
        except (OSError, EngineError):
            live = {id(s) for s in log.view.segments}
            left = any(id(s) not in live for s in view.segments[:-1])
            if not left or attempt == _GATHER_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _facts(view: LogView) -> list[SegmentFacts]:
    """Worker thread. A closed segment's max timestamp costs one small read, once. Its exact
    next offset (a header scan that opens the .log and maps its indexes) is read only for the
    segment that straddles the log start offset; for the others the next segment's base
    offset stands in, which may only be higher across a compaction gap and decides the log
    start offset rule the same way. The active segment counts up to the high watermark."""
    segments = view.segments
    last = len(segments) - 1
    start = view.log_start_offset
    out = []
    for i, s in enumerate(segments):
        if i == last:
            size, next_offset = view.active_end, view.high_watermark
        else:
            size, next_offset = s.size, segments[i + 1].base_offset
            if s.base_offset <= start < next_offset:
                next_offset = s.next_offset
        mtime_ms = os.stat(s.log_path).st_mtime_ns // 1_000_000
        out.append(SegmentFacts(s.base_offset, next_offset, size, s.max_timestamp, mtime_ms))
    return out


def _still_a_prefix(
    chosen: list[LogSegment], causes: tuple[str, ...], current: tuple[LogSegment, ...]
) -> tuple[list[LogSegment], list[str]]:
    """The chosen segments that are still the oldest closed segments of `current`, with their
    causes. Chosen segments already gone are dropped; the run ends at the first one that is
    still there but no longer at the front (something replaced an older one), so that the
    deletion can never leave a hole in the offsets."""
    closed = current[:-1]
    present = {id(s) for s in current}
    doomed: list[LogSegment] = []
    kept_causes: list[str] = []
    for segment, cause in zip(chosen, causes):
        if len(doomed) < len(closed) and closed[len(doomed)] is segment:
            doomed.append(segment)
            kept_causes.append(cause)
        elif id(segment) in present:
            break
    return doomed, kept_causes


def _count(causes: Sequence[str]) -> dict[str, int]:
    counts = Counter(causes)
    return {reason: counts[reason] for reason in REASONS}


__all__ = [
    "REASONS",
    "RetentionPlan",
    "RetentionResult",
    "SegmentFacts",
    "plan_retention",
    "run_retention",
]
