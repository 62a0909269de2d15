"""Helpers for engine tests: a running PartitionLog without a log manager, and a model."""

from __future__ import annotations

import struct
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

import anyio
from crc32c import crc32c

from engine.config import LogConfig
from engine.partition_log import PartitionLog, prepare_batches
from engine.producer_state import DEFAULT_EXPIRATION_MS, ProducerStateManager, rebuild
from engine.records import Record, encode_batch
from engine.recovery import load_log


class FakeClock:
    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@asynccontextmanager
async def running_log(
    directory: Path,
    config: LogConfig | None = None,
    *,
    clock=None,
    clean_shutdown: bool = False,
    recovery_point: int = 0,
    log_start_offset: int = 0,
    schedule_delete=None,
    producer_id_expiration_ms: int = DEFAULT_EXPIRATION_MS,
    on_fsync=None,
) -> AsyncIterator[PartitionLog]:
    """Load (recovering as asked, producer state included, as the log manager does) and run a
    partition log; close it cleanly on exit."""
    config = config or LogConfig()
    clock = clock or FakeClock()
    loaded = load_log(
        directory, config, clean_shutdown=clean_shutdown, recovery_point=recovery_point,
        log_start_offset=log_start_offset, now_ms=clock(),
    )
    producers = ProducerStateManager(directory, producer_id_expiration_ms)
    rebuild(producers, loaded.segments, loaded.next_offset, clock())
    log = PartitionLog(
        "t", 0, directory, config, loaded.segments, log_start_offset=loaded.log_start_offset,
        recovery_point=loaded.recovery_point, clock=clock, schedule_delete=schedule_delete,
        producer_state=producers, on_fsync=on_fsync, dropped_offsets=loaded.dropped_offsets,
    )
    log.load_stats = loaded.stats  # type: ignore[attr-defined]
    async with anyio.create_task_group() as tg:
        await tg.start(log.run)
        try:
            yield log
        finally:
            await log.close()
            await log.stopped.wait()


async def append_records(log: PartitionLog, records, **encode_kwargs):
    batch = encode_batch(0, records, **encode_kwargs)
    return await log.append(prepare_batches(batch, log.config))


def patch_last_offset_delta(batch: bytearray, delta: int) -> bytearray:
    """Make a batch claim offsets up to base + delta (as compaction leaves them); fix the CRC."""
    struct.pack_into(">i", batch, 23, delta)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return batch


@dataclass
class LogModel:
    """What the log should hold: records in offset order."""

    records: list[Record] = field(default_factory=list)

    def add(self, base_offset: int, items, append_time: int | None = None) -> None:
        for i, (key, value, ts, headers) in enumerate(items):
            self.records.append(Record(base_offset + i, append_time if append_time is not None else ts, key, value, tuple(headers)))

    def from_offset(self, offset: int, n: int) -> list[Record]:
        return [r for r in self.records if r.offset >= offset][:n]

    def first_at_or_after(self, timestamp: int, start: int = 0) -> tuple[int, int] | None:
        for r in self.records:
            if r.offset >= start and r.timestamp >= timestamp:
                return r.offset, r.timestamp
        return None

    def max_timestamp(self, start: int = 0) -> tuple[int, int] | None:
        best = None
        for r in self.records:
            if r.offset >= start and (best is None or r.timestamp > best[1]):
                best = (r.offset, r.timestamp)
        return best
