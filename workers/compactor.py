"""The compactor's side in the server: which partition to clean, and swapping the result in.

`dirty_stats` says how much of a partition is dirty (Kafka's LogCleanerManager): the clean
part is the closed segments wholly below the first dirty offset (cleaner-offset-checkpoint, or
the log start offset); the dirty part runs from there to the first uncleanable offset, which is
the active segment's base offset or the base of the first segment holding a record younger
than min.compaction.lag.ms, whichever is lower. dirty ratio = dirty bytes / (clean + dirty).
A partition is due when its ratio is at least min.cleanable.dirty.ratio, or when its oldest
dirty record is older than max.compaction.lag.ms.

`compact_partition` runs cleaner.clean() in a worker process (the CPU work never shares the
event loop's GIL), then swaps each new segment in with PartitionLog.replace_segments — one
atomic swap per group, lowest first — and returns what it did. The caller records the new
first dirty offset. If retention or delete-records removed a segment meanwhile, the swap is
refused, the pass's files are removed, and the next pass starts over.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import anyio
import anyio.to_process

from engine import filenames
from engine.config import LONG_MAX
from engine.errors import CompactionFailedError, EngineError
from engine.format import NO_TIMESTAMP
from engine.partition_log import PartitionLog
from engine.segment import LogSegment
from engine.segments import LogView

from .cleaner import CleanOutcome, CleanRequest, SegmentRef, clean

logger = logging.getLogger("eventlog.workers")

RunIn = Literal["process", "thread"]


@dataclass(frozen=True, slots=True)
class DirtyStats:
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    dirty_bytes: int
    max_lag_exceeded: bool

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0

    def due(self, min_ratio: float) -> bool:
        return self.dirty_bytes > 0 and (self.ratio >= min_ratio or self.max_lag_exceeded)


@dataclass(slots=True)
class CompactionResult:
    topic: str
    partition: int
    cleaned: bool
    first_dirty_offset: int
    end_offset: int
    dirty_ratio: float
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    records_read: int = 0
    records_kept: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    map_full: bool = False
    next_horizon_ms: int | None = None
    seconds: float = 0.0
    throttled_seconds: float = 0.0  # of `seconds`, slept to keep to the I/O rate limit
    note: str = ""
    outcome: dict[str, Any] = field(default_factory=dict)

    @property
    def bytes_reclaimed(self) -> int:
        return max(self.bytes_before - self.bytes_after, 0)


def dirty_stats(view: LogView, config, cleaner_checkpoint: int | None, now_ms: int) -> DirtyStats:
    """Blocking: a closed segment's timestamps may be read from its files. Run in a thread."""
    segments = view.segments
    closed = segments[:-1]
    if cleaner_checkpoint is not None and cleaner_checkpoint > view.high_watermark:
        cleaner_checkpoint = None  # left by an earlier topic of this name, or a truncated log
    first_dirty = max(cleaner_checkpoint or 0, view.log_start_offset, segments[0].base_offset)
    uncleanable = len(closed)
    if config.min_compaction_lag_ms > 0:
        horizon = now_ms - config.min_compaction_lag_ms
        for i, segment in enumerate(closed):
            if segment.next_offset > first_dirty and segment.max_timestamp > horizon:
                uncleanable = i
                break
    first_uncleanable = segments[uncleanable].base_offset
    clean_bytes = dirty_bytes = 0
    first_dirty_segment = None
    for i, segment in enumerate(closed[:uncleanable]):
        end = segments[i + 1].base_offset
        if end <= first_dirty:
            clean_bytes += segment.size
        else:
            dirty_bytes += segment.size
            if first_dirty_segment is None:
                first_dirty_segment = segment
    lag_exceeded = False
    if first_dirty_segment is not None and config.max_compaction_lag_ms < LONG_MAX:
        first_ts = first_dirty_segment.first_timestamp()
        lag_exceeded = first_ts != NO_TIMESTAMP and first_ts < now_ms - config.max_compaction_lag_ms
    return DirtyStats(first_dirty, max(first_uncleanable, first_dirty), clean_bytes, dirty_bytes, lag_exceeded)


def build_request(
    log: PartitionLog,
    view: LogView,
    stats: DirtyStats,
    now_ms: int,
    map_budget_bytes: int,
    *,
    sweep: bool = False,
    io_max_bytes_per_s: float = math.inf,
) -> CleanRequest:
    segments = view.segments
    refs = tuple(
        SegmentRef(s.base_offset, s.size) for s in segments[:-1] if s.base_offset < stats.first_uncleanable_offset
    )
    config = log.config
    return CleanRequest(
        directory=str(log.directory),
        segments=refs,
        end_limit=stats.first_uncleanable_offset,
        first_dirty_offset=stats.first_dirty_offset,
        now_ms=now_ms,
        delete_retention_ms=config.delete_retention_ms,
        segment_bytes=config.segment_bytes,
        max_index_bytes=config.segment_index_bytes,
        index_interval_bytes=config.index_interval_bytes,
        map_budget_bytes=map_budget_bytes,
        sweep=sweep,
        io_max_bytes_per_s=io_max_bytes_per_s,
        key_index=config.key_index,
    )


async def compact_partition(
    log: PartitionLog,
    *,
    cleaner_checkpoint: int | None,
    map_budget_bytes: int,
    now_ms: int | None = None,
    run_in: RunIn = "process",
    stats: DirtyStats | None = None,
    sweep: bool = False,
    io_max_bytes_per_s: float = math.inf,
) -> CompactionResult:
    """One pass over `log` (whatever its dirty ratio). With `sweep`, the clean segments are
    recopied even when nothing is dirty, which drops tombstones whose delete horizon passed.
    `io_max_bytes_per_s` limits the pass's bytes read + written per second (the throttler
    sleeps in the pass). See the module docstring."""
    started = time.perf_counter()
    now = log.clock() if now_ms is None else now_ms
    view = log.view
    if stats is None:
        stats = await anyio.to_thread.run_sync(dirty_stats, view, log.config, cleaner_checkpoint, now)
    closed_bytes = sum(s.size for s in view.segments[:-1])
    result = CompactionResult(
        log.topic, log.partition, False, stats.first_dirty_offset, stats.first_dirty_offset, stats.ratio,
        len(view.segments), len(view.segments), closed_bytes, closed_bytes,
    )
    if stats.dirty_bytes == 0 and not (sweep and stats.clean_bytes):
        result.note = "nothing to clean"
        return result
    request = build_request(log, view, stats, now, map_budget_bytes, sweep=sweep, io_max_bytes_per_s=io_max_bytes_per_s)
    try:
        if run_in == "process":
            request = dataclasses.replace(request, in_worker_process=True, server_pid=os.getpid())
            outcome: CleanOutcome = await anyio.to_process.run_sync(clean, request, cancellable=True)
        else:
            outcome = await anyio.to_thread.run_sync(clean, request, abandon_on_cancel=False)
    except BaseException as exc:
        # a failed or cancelled pass (its process killed): remove what it wrote
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_remove_all_cleaned, log)
        if isinstance(exc, Exception) and not isinstance(exc, EngineError):
            raise CompactionFailedError(log.name, f"{type(exc).__name__}: {exc}") from exc
        raise
    result.outcome = asdict(outcome)
    result.map_full = outcome.map_full
    result.records_read = outcome.records_read
    result.records_kept = outcome.records_kept
    result.records_removed = outcome.records_removed
    result.tombstones_removed = outcome.tombstones_removed
    result.next_horizon_ms = outcome.next_horizon_ms
    result.throttled_seconds = outcome.throttled_seconds
    try:
        await _swap_in(log, view, outcome)
    except Exception:
        await anyio.to_thread.run_sync(_remove_all_cleaned, log)
        raise
    result.cleaned = True
    result.end_offset = outcome.end_offset
    after = log.view
    result.segments_after = len(after.segments)
    result.bytes_after = sum(s.size for s in after.segments[:-1])
    result.seconds = time.perf_counter() - started
    logger.info(
        "%s: compacted [%d, %d): %d of %d records kept, %d bytes reclaimed, %.3f s",
        log.name, stats.first_dirty_offset, outcome.end_offset, outcome.records_kept, outcome.records_read,
        result.bytes_reclaimed, result.seconds,
    )
    return result


class SegmentsChanged(Exception):
    """The segments a pass read are no longer the log's (retention or delete-records ran)."""


async def _swap_in(log: PartitionLog, view: LogView, outcome: CleanOutcome) -> None:
    by_base = {s.base_offset: s for s in view.segments[:-1]}
    for group in outcome.groups:
        old = [by_base[b] for b in group.old_bases]
        if group.new_base is None:
            await log.delete_segments(old, reason="compaction left no record")
            continue
        new = await anyio.to_thread.run_sync(_open_cleaned, log, group.new_base)
        try:
            await log.replace_segments([new], old)
        except ValueError as exc:
            new.close()  # its files and the later groups' are still .cleaned: the caller removes them
            raise SegmentsChanged(str(exc)) from None


def _open_cleaned(log: PartitionLog, base: int) -> LogSegment:
    segment = LogSegment.open_existing(
        log.directory, base, max_index_bytes=log.config.segment_index_bytes, suffix=filenames.CLEANED_SUFFIX
    )
    segment.index_interval_bytes = log.config.index_interval_bytes
    return segment


def _remove_all_cleaned(log: PartitionLog) -> None:
    """Every .cleaned file of the partition: only a pass writes them, and one runs at a time."""
    for path in log.directory.iterdir():
        if path.name.endswith(filenames.CLEANED_SUFFIX):
            path.unlink(missing_ok=True)
