"""Maintenance on demand: one retention or compaction pass now (workers/manager.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Body, Request

from engine.errors import LogClosedError

from .auth import Admin
from .deps import Engine
from .errors import ApiError
from .policy import PolicyRoute
from .schemas import (
    CompactionPartition,
    CompactionRun,
    MaintenanceRequest,
    Problem,
    RetentionPartition,
    RetentionRun,
)

if TYPE_CHECKING:
    from workers.manager import Workers

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=PolicyRoute)

_problems: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "invalid_json"},
    401: {"model": Problem, "description": "unauthorized"},
    403: {"model": Problem, "description": "forbidden: admin only"},
    404: {"model": Problem, "description": "topic_not_found, partition_not_found"},
    422: {"model": Problem, "description": "validation_error"},
}


def _workers(request: Request) -> Workers:
    workers: Workers | None = request.app.state.workers
    if workers is None:
        raise LogClosedError("workers")
    return workers


async def _on_every_shard(request: Request, what: str, body: MaintenanceRequest | None) -> list[Any]:
    """The workers' pass on this process's partitions, and in a shard family on every other
    shard's too (each shard cleans the partitions it owns)."""
    topic = body.topic if body else None
    partition = body.partition if body else None
    engine: Engine = request.app.state.engine
    if partition is not None:
        if topic is None:
            raise ApiError(422, "validation_error", "`partition` needs `topic`")
        engine.partition(topic, partition)  # 404 for an unknown partition
    elif topic is not None:
        engine.topic(topic)  # 404 for an unknown topic
    results = list(await getattr(_workers(request), what)(topic, partition))
    channel = getattr(engine, "channel", None)
    if channel is not None:
        for shard in range(engine.shard_count):
            if shard != engine.shard_index:
                # a shard that is down answers 503 (ShardUnavailableError): the pass ran
                # on the others, and runs on its partitions once it is back
                results += await channel.call(shard, what, topic, partition)
    return sorted(results, key=lambda r: (r.topic, r.partition))


@router.post(
    "/retention/run",
    operation_id="runRetention",
    response_model=RetentionRun,
    responses=_problems,
    summary="Run the retention deleter now",
    description=(
        "One pass over every partition (or the topic's): closed segments past `retention.ms`, beyond "
        "`retention.bytes`, or wholly below the log start offset are deleted (files removed after "
        "`file.delete.delay.ms`). The active segment is never deleted."
    ),
)
async def run_retention(
    request: Request,
    engine: Engine,
    _principal: Admin,
    body: MaintenanceRequest | None = Body(None),
) -> RetentionRun:
    results = await _on_every_shard(request, "run_retention", body)
    partitions = [
        RetentionPartition(
            topic=r.topic, partition=r.partition, segments_deleted=r.segments_deleted,
            bytes_reclaimed=r.bytes_reclaimed, reasons=r.reasons, log_start_offset=r.log_start_offset,
        )
        for r in results
        if r.segments_deleted
    ]
    return RetentionRun(
        segments_deleted=sum(p.segments_deleted for p in partitions),
        bytes_reclaimed=sum(p.bytes_reclaimed for p in partitions),
        partitions=partitions,
    )


@router.post(
    "/compaction/run",
    operation_id="runCompaction",
    response_model=CompactionRun,
    responses=_problems,
    summary="Run the compactor now",
    description=(
        "Cleans every partition of every compacted topic (or of the topic given) that has dirty "
        "records, whatever its dirty ratio, keeping the latest record per key; tombstones go once "
        "their delete horizon (`delete.retention.ms` after the pass that first kept them) has passed. "
        "Records younger than `min.compaction.lag.ms` and the active segment are not cleaned."
    ),
)
async def run_compaction(
    request: Request,
    engine: Engine,
    _principal: Admin,
    body: MaintenanceRequest | None = Body(None),
) -> CompactionRun:
    results = await _on_every_shard(request, "run_compaction", body)
    partitions = [
        CompactionPartition(
            topic=r.topic, partition=r.partition, cleaned=r.cleaned, first_dirty_offset=r.first_dirty_offset,
            end_offset=r.end_offset, dirty_ratio=round(r.dirty_ratio, 6), segments_before=r.segments_before,
            segments_after=r.segments_after, bytes_reclaimed=r.bytes_reclaimed, records_read=r.records_read,
            records_kept=r.records_kept, records_removed=r.records_removed,
            tombstones_removed=r.tombstones_removed, map_full=r.map_full, seconds=round(r.seconds, 6),
            throttled_seconds=round(r.throttled_seconds, 6), note=r.note,
        )
        for r in results
    ]
    return CompactionRun(
        bytes_reclaimed=sum(p.bytes_reclaimed for p in partitions),
        records_removed=sum(p.records_removed for p in partitions),
        partitions=partitions,
    )
