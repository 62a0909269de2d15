"""Offsets of a partition: ListOffsets by spec or time, delete-records, segments."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import anyio
from fastapi import APIRouter, Query, Request

from engine import reader
from engine.errors import LogClosedError
from engine.metadata import refuse_internal
from engine.shards import owner_of

from .auth import Admin, Describer, Reader
from .deps import Engine
from .errors import ApiError
from .policy import PolicyRoute
from .schemas import (
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    OffsetSpec,
    PartitionMaintenance,
    PartitionOffsets,
    Problem,
    SegmentInfo,
    SegmentList,
)

router = APIRouter(prefix="/v1/topics/{topic}/partitions/{partition}", tags=["offsets"], route_class=PolicyRoute)

_problems: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "unauthorized"},
    403: {"model": Problem, "description": "forbidden"},
    404: {"model": Problem, "description": "topic_not_found, partition_not_found"},
    422: {"model": Problem, "description": "validation_error"},
}


@router.get(
    "/offsets",
    operation_id="listOffsets",
    response_model=PartitionOffsets,
    responses=_problems,
    summary="Log start, high watermark, and Kafka's ListOffsets by timestamp or spec",
    description=(
        "Without parameters: the partition's offsets. With `timestamp=T`: `offset` and `timestamp` of the "
        "earliest record whose timestamp is at least T, or both null. With `spec`: `earliest` (log start "
        "offset), `latest` (high watermark), or `max_timestamp` (the first record with the largest timestamp)."
    ),
)
async def list_offsets(
    topic: str,
    partition: int,
    engine: Engine,
    _principal: Reader,
    timestamp: int | None = Query(None, ge=0, description="ms since the epoch"),
    spec: OffsetSpec | None = None,
) -> PartitionOffsets:
    log = engine.partition(topic, partition)
    if timestamp is not None and spec is not None:
        raise ApiError(422, "validation_error", "give either timestamp or spec, not both")
    offset = ts = None
    if timestamp is not None:
        found = await log.offset_for_timestamp(timestamp)
        if found is not None:
            offset, ts = found
    elif spec is OffsetSpec.earliest:
        offset = log.log_start_offset
    elif spec is OffsetSpec.latest:
        offset = log.high_watermark
    elif spec is OffsetSpec.max_timestamp:
        found = await log.max_timestamp_offset()
        if found is not None:
            offset, ts = found
    view = log.view
    return PartitionOffsets(
        log_start_offset=view.log_start_offset,
        high_watermark=view.high_watermark,
        log_end_offset=view.log_end_offset,
        offset=offset,
        timestamp=ts,
    )


@router.post(
    "/delete-records",
    operation_id="deleteRecords",
    response_model=DeleteRecordsResponse,
    responses={
        400: {"model": Problem, "description": "invalid_json, invalid_request (an internal topic)"},
        **_problems,
        416: {"model": Problem, "description": "offset_out_of_range: above the high watermark"},
    },
    summary="Move the log start offset forward (Kafka's DeleteRecords)",
)
async def delete_records(
    topic: str, partition: int, body: DeleteRecordsRequest, engine: Engine, _principal: Admin
) -> DeleteRecordsResponse:
    refuse_internal(topic)
    log = engine.partition(topic, partition)
    return DeleteRecordsResponse(log_start_offset=await log.delete_records(body.before_offset))


@router.get(
    "/segments",
    operation_id="listSegments",
    response_model=SegmentList,
    responses=_problems,
    summary="The partition's segments: offsets, sizes, timestamps, index entries",
)
async def list_segments(topic: str, partition: int, engine: Engine, _principal: Reader) -> SegmentList:
    log = engine.partition(topic, partition)
    infos = await anyio.to_thread.run_sync(reader.segment_infos, log.view)
    return SegmentList(segments=[SegmentInfo(**asdict(info)) for info in infos])


@router.get(
    "/maintenance",
    operation_id="describeMaintenance",
    response_model=PartitionMaintenance,
    responses=_problems,
    summary="The partition's cleanup state: the compactor's checkpoint and the latest retention and compaction passes",
    description=(
        "Passes are remembered from the server's start (by the shard that owns the partition); "
        "`POST /v1/admin/retention/run` and `/compaction/run` with `topic` and `partition` run one now."
    ),
)
async def describe_maintenance(
    topic: str, partition: int, request: Request, engine: Engine, _principal: Describer
) -> PartitionMaintenance:
    log = engine.partition(topic, partition)
    owner = owner_of(topic, partition, engine.shard_count)
    if owner == engine.shard_index:
        workers = request.app.state.workers
        if workers is None:
            raise LogClosedError("workers")
        state = workers.maintenance(topic, partition)
    else:  # another shard's partition: a family, which has a channel
        channel = engine.channel
        assert channel is not None
        state = await channel.call(owner, "maintenance", topic, partition)
    return PartitionMaintenance(
        topic=topic, partition=partition, cleanup_policy=log.config.cleanup_policy, owner_shard=owner, **state
    )
