"""The two cleanup workers as tasks of the server: scheduling, serialising, and their figures.

    retention   every log.retention.check.interval.ms (shorter when a topic's retention.ms is
                shorter, but not below 1 s), one run_retention pass over every partition.
    compaction  the cleaner loop: pick the compacted partition with the highest dirty ratio
                that is due (ratio >= min.cleanable.dirty.ratio, or max.compaction.lag.ms
                passed, or kept tombstones whose delete horizon passed), clean it, repeat;
                with nothing due, sleep log.cleaner.backoff.ms.

Both also run on demand (`run_retention`, `run_compaction`: the admin endpoints), which clean
every partition with any dirty data whatever its ratio. A partition is worked on by one of
them at a time (a lock per partition), so a retention pass never deletes a segment a
compaction pass is about to swap out, and vice versa (the swap would be refused anyway).

Figures for /metrics are kept here as plain numbers (api/observability.py exports them).
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import anyio

from engine.errors import EngineError
from engine.partition_log import PartitionLog

from .compactor import (
    CompactionResult,
    DirtyStats,
    RunIn,
    SegmentsChanged,
    compact_partition,
    dirty_stats,
)
from .retention import RetentionResult, run_retention

logger = logging.getLogger("eventlog.workers")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    retention_check_interval_ms: int = 300_000
    cleaner_enabled: bool = True
    cleaner_backoff_ms: int = 15_000
    dedupe_buffer_bytes: int = 128 * 1024 * 1024
    cleaner_run_in: RunIn = "process"
    cleaner_io_max_bytes_per_s: float = math.inf  # log.cleaner.io.max.bytes.per.second


@dataclass
class WorkerFigures:
    passes: dict[tuple[str, str], int] = field(default_factory=dict)  # (worker, outcome) -> n
    bytes_reclaimed: dict[str, int] = field(default_factory=dict)  # worker -> bytes
    segments_deleted: int = 0
    records_removed: int = 0
    last_duration_s: dict[str, float] = field(default_factory=dict)
    last_run_ms: dict[str, int] = field(default_factory=dict)
    dirty_ratio: dict[tuple[str, int], float] = field(default_factory=dict)

    def count(self, worker: str, outcome: str) -> None:
        self.passes[(worker, outcome)] = self.passes.get((worker, outcome), 0) + 1

    def reclaimed(self, worker: str, size: int) -> None:
        self.bytes_reclaimed[worker] = self.bytes_reclaimed.get(worker, 0) + size


@dataclass(frozen=True, slots=True)
class LastPass:
    """A partition's latest pass of one worker (the console's partition page shows it)."""

    at_ms: int  # when it ended, ms since the epoch
    outcome: str  # "ok", "abandoned" (the log changed under it) or "error"
    result: RetentionResult | CompactionResult | None  # None unless ok
    note: str = ""


class Workers:
    def __init__(self, engine: Any, settings: WorkerSettings | None = None) -> None:
        self.engine = engine
        self.settings = settings or WorkerSettings()
        self.figures = WorkerFigures()
        self._locks: dict[tuple[str, int], anyio.Lock] = {}
        self._horizons: dict[tuple[str, int], int] = {}  # earliest delete horizon of kept tombstones
        self._cleaned: set[tuple[str, int]] = set()  # partitions cleaned since start-up
        self._wake_cleaner = anyio.Event()
        # the latest pass of each worker over a partition log, since start-up; keyed by the log
        # itself, so a topic deleted and created again starts with none
        self._last: dict[str, weakref.WeakKeyDictionary[PartitionLog, LastPass]] = {
            "retention": weakref.WeakKeyDictionary(), "compaction": weakref.WeakKeyDictionary(),
        }

    def _ended(self, worker: str, log: PartitionLog, outcome: str, result: Any = None, note: str = "") -> None:
        self._last[worker][log] = LastPass(int(time.time() * 1000), outcome, result, note)

    def maintenance(self, topic: str, partition: int) -> dict[str, Any]:
        """What the workers know of a partition this process owns, as plain data (it crosses
        the shard channel): the compactor's checkpoint and dirty ratio, and the latest passes."""
        log = self.engine.partition(topic, partition)

        def plain(last: LastPass | None) -> dict[str, Any] | None:
            if last is None:
                return None
            result = None
            if last.result is not None:
                result = {f: getattr(last.result, f) for f in last.result.__dataclass_fields__ if f != "outcome"}
                result["bytes_reclaimed"] = last.result.bytes_reclaimed
            return {"at_ms": last.at_ms, "outcome": last.outcome, "note": last.note, "result": result}

        retention, compaction = self._last["retention"].get(log), self._last["compaction"].get(log)
        return {
            "cleaner_offset": self.engine.cleaner_offset(log),
            "dirty_ratio": self.figures.dirty_ratio.get((topic, partition)),
            "last_retention": plain(retention),
            "last_compaction": plain(compaction),
        }

    # -- partitions ----------------------------------------------------------------------------

    def _lock(self, log: PartitionLog) -> anyio.Lock:
        return self._locks.setdefault((log.topic, log.partition), anyio.Lock())

    def _partitions(self, topic: str | None, partition: int | None = None) -> list[PartitionLog]:
        if topic is not None:
            # an offline partition, or another shard's, is skipped
            owned = self.engine.topic(topic).owned_partitions
            return owned if partition is None else [log for log in owned if log.partition == partition]
        return [log for log in self.engine.all_partitions() if not log.closed]

    # -- the loops -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Both loops; returns when cancelled (the lifespan's task group ends them)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._retention_loop)
            if self.settings.cleaner_enabled:
                tg.start_soon(self._cleaner_loop)

    def _retention_interval_s(self) -> float:
        interval = self.settings.retention_check_interval_ms
        for state in self.engine.topics.values():
            if state.config.delete and state.config.retention_ms >= 0:
                interval = min(interval, state.config.retention_ms)
        return max(interval, 1000) / 1000

    async def _retention_loop(self) -> None:
        while True:
            await anyio.sleep(self._retention_interval_s())
            try:
                await self.run_retention()
            except Exception:
                logger.exception("retention pass failed")

    async def _cleaner_loop(self) -> None:
        while True:
            try:
                cleaned = await self._clean_filthiest()
            except Exception:
                logger.exception("compaction pass failed")
                cleaned = False
            if not cleaned:
                with anyio.move_on_after(self.settings.cleaner_backoff_ms / 1000):
                    await self._wake_cleaner.wait()
                self._wake_cleaner = anyio.Event()

    def wake_cleaner(self) -> None:
        self._wake_cleaner.set()

    # -- retention -----------------------------------------------------------------------------

    async def run_retention(self, topic: str | None = None, partition: int | None = None) -> list[RetentionResult]:
        """One retention pass over every partition (of `topic`, or only its `partition`);
        what each deleted."""
        started = time.perf_counter()
        results = []
        for log in self._partitions(topic, partition):
            async with self._lock(log):
                if log.closed:
                    continue
                try:
                    result = await run_retention(log)
                except EngineError as exc:
                    logger.warning("%s: retention pass failed: %s", log.name, exc)
                    self.figures.count("retention", "error")
                    self._ended("retention", log, "error", note=str(exc))
                    continue
            self._ended("retention", log, "ok", result)
            results.append(result)
            if result.segments_deleted:
                self.figures.reclaimed("retention", result.bytes_reclaimed)
                self.figures.segments_deleted += result.segments_deleted
        self.figures.count("retention", "ok")
        self.figures.last_duration_s["retention"] = time.perf_counter() - started
        self.figures.last_run_ms["retention"] = int(time.time() * 1000)
        return results

    # -- compaction ----------------------------------------------------------------------------

    async def _stats(self, log: PartitionLog) -> DirtyStats:
        stats = await anyio.to_thread.run_sync(
            dirty_stats, log.view, log.config, self.engine.cleaner_offset(log), log.clock()
        )
        self.figures.dirty_ratio[(log.topic, log.partition)] = stats.ratio
        return stats

    def _sweep_due(self, log: PartitionLog) -> bool:
        horizon = self._horizons.get((log.topic, log.partition))
        return horizon is not None and log.clock() >= horizon

    async def _clean_filthiest(self) -> bool:
        """Clean the most deserving partition, if any is due; True if one was cleaned."""
        best: tuple[float, PartitionLog, DirtyStats, bool] | None = None
        for log in self._partitions(None):
            if not log.config.compact:
                continue
            stats = await self._stats(log)
            sweep = self._sweep_due(log)
            if not (stats.due(log.config.min_cleanable_dirty_ratio) or sweep):
                continue
            score = stats.ratio if stats.dirty_bytes else 0.0
            if best is None or score > best[0]:
                best = (score, log, stats, sweep)
        if best is None:
            return False
        _score, log, stats, sweep = best
        result = await self._compact(log, sweep=sweep)
        return result is not None and result.cleaned

    async def _compact(self, log: PartitionLog, *, sweep: bool) -> CompactionResult | None:
        async with self._lock(log):
            if log.closed:
                return None
            stats = await self._stats(log)
            try:
                result = await compact_partition(
                    log,
                    cleaner_checkpoint=self.engine.cleaner_offset(log),
                    map_budget_bytes=self.settings.dedupe_buffer_bytes,
                    run_in=self.settings.cleaner_run_in,
                    stats=stats,
                    sweep=sweep,
                    io_max_bytes_per_s=self.settings.cleaner_io_max_bytes_per_s,
                )
            except SegmentsChanged as exc:
                logger.info("%s: compaction pass abandoned, the log changed under it: %s", log.name, exc)
                self.figures.count("compaction", "abandoned")
                self._ended("compaction", log, "abandoned", note=str(exc))
                return None
            except Exception as exc:
                self.figures.count("compaction", "error")
                self._ended("compaction", log, "error", note=str(exc))
                raise
            self._ended("compaction", log, "ok", result)
            if result.cleaned:
                await self.engine.set_cleaner_offset(log, result.end_offset)
                tp = (log.topic, log.partition)
                self._cleaned.add(tp)
                if result.next_horizon_ms is not None:
                    self._horizons[tp] = result.next_horizon_ms
                else:
                    self._horizons.pop(tp, None)
                self.figures.count("compaction", "ok")
                self.figures.reclaimed("compaction", result.bytes_reclaimed)
                self.figures.records_removed += result.records_removed
                self.figures.last_duration_s["compaction"] = result.seconds
                self.figures.last_run_ms["compaction"] = int(time.time() * 1000)
                await self._stats(log)
            return result

    async def run_compaction(self, topic: str | None = None, partition: int | None = None) -> list[CompactionResult]:
        """Clean every compacted partition (of `topic`, or only its `partition`) that has dirty
        data or kept tombstones, whatever its dirty ratio; passes repeat while the offset map
        filled up."""
        results = []
        for log in self._partitions(topic, partition):
            if not log.config.compact:
                continue
            # on demand, also drop tombstones whose horizon passed: known for partitions cleaned
            # since start-up, so a partition not cleaned yet is recopied once to find out
            sweep = self._sweep_due(log) or (log.topic, log.partition) not in self._cleaned
            while True:
                result = await self._compact(log, sweep=sweep)
                if result is None:
                    break
                results.append(result)
                if not (result.cleaned and result.map_full):
                    break
                sweep = False
        return results
