"""Topics: create, list, describe, alter configs, add partitions, delete."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field, StrictInt
from starlette.responses import Response

from engine.config import is_internal
from engine import interface
from engine.log_manager import OfflinePartition
from engine.metadata import INTERNAL_TOPICS

from .auth import Admin, Describer, principal_of
from .deps import Engine
from .policy import PolicyRoute
from .schemas import ConfigValue, PartitionInfo, Problem, Topic, TopicCreate, TopicDetail, TopicList, TopicSummary

router = APIRouter(prefix="/v1/topics", tags=["topics"], route_class=PolicyRoute)

_problems: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "invalid_request (an internal topic)"},
    401: {"model": Problem, "description": "unauthorized"},
    403: {"model": Problem, "description": "forbidden"},
    404: {"model": Problem, "description": "topic_not_found"},
    422: {"model": Problem, "description": "invalid_topic_name, invalid_config, invalid_partitions, validation_error"},
}
# topic changes create files: all or nothing (engine/log_manager.py)
_change_problems: dict[int | str, dict[str, Any]] = {
    **_problems,
    503: {"model": Problem, "description": "too_many_open_files (Retry-After): nothing was created; unavailable: shutting down"},
    507: {"model": Problem, "description": "storage_full, open_files_limit: nothing was created"},
}


def topic_model(state: interface.Topic) -> Topic:
    return Topic(
        name=state.name,
        partitions=len(state.partitions),
        configs=state.config.to_kafka(),
        overrides=dict(state.meta.overrides),
        topic_id=state.meta.topic_id,
        internal=state.name in INTERNAL_TOPICS,
    )


def topic_detail(state: interface.Topic) -> TopicDetail:
    partitions = []
    for log in state.partitions:
        if isinstance(log, OfflinePartition):
            partitions.append(PartitionInfo(partition=log.partition, offline=True, error=log.reason))
            continue
        view = log.view
        partitions.append(
            PartitionInfo(
                partition=log.partition,
                log_start_offset=view.log_start_offset,
                high_watermark=view.high_watermark,
                log_end_offset=view.log_end_offset,
                segments=len(view.segments),
                size_bytes=view.size_bytes,
            )
        )
    return TopicDetail(
        name=state.name,
        topic_id=state.meta.topic_id,
        internal=state.name in INTERNAL_TOPICS,
        configs=state.config.to_kafka(),
        overrides=dict(state.meta.overrides),
        partitions=partitions,
    )


@router.post(
    "",
    operation_id="createTopic",
    status_code=201,
    response_model=Topic,
    responses={409: {"model": Problem, "description": "topic_exists"}, **_change_problems},
    summary="Create a topic",
)
async def create_topic(body: TopicCreate, engine: Engine, _principal: Admin) -> Topic:
    state = await engine.create_topic(body.name, body.partitions, body.configs)
    return topic_model(state)


@router.get(
    "",
    operation_id="listTopics",
    response_model=TopicList,
    responses={401: _problems[401], 403: _problems[403]},
    summary="List topics (those the caller's token covers)",
)
async def list_topics(
    request: Request, engine: Engine, _principal: Describer,
    internal: bool = Query(False, description="include internal topics (__*)"),
) -> TopicList:
    principal = principal_of(request)
    topics = [
        TopicSummary(name=name, partitions=len(state.partitions), internal=is_internal(name))
        for name, state in sorted(engine.topics.items())
        if (internal or not is_internal(name)) and principal.covers_topic(name)
    ]
    return TopicList(topics=topics)


@router.get(
    "/{topic}",
    operation_id="describeTopic",
    response_model=TopicDetail,
    response_model_exclude_none=True,
    responses={401: _problems[401], 403: _problems[403], 404: _problems[404]},
    summary="Describe a topic: configs and per-partition offsets and sizes",
)
async def describe_topic(topic: str, engine: Engine, _principal: Describer) -> TopicDetail:
    return topic_detail(engine.topic(topic))


class ConfigsPatch(BaseModel):
    configs: dict[str, ConfigValue | None] = Field(
        description="configs to set; null removes an override (back to the default)"
    )


@router.patch(
    "/{topic}/configs",
    operation_id="alterTopicConfigs",
    response_model=Topic,
    responses=_problems,
    summary="Change topic configs",
)
async def alter_configs(topic: str, body: ConfigsPatch, engine: Engine, _principal: Admin) -> Topic:
    return topic_model(await engine.alter_topic_configs(topic, body.configs))


class PartitionsIncrease(BaseModel):
    count: StrictInt = Field(ge=1, le=10_000, description="the new total number of partitions")


@router.post(
    "/{topic}/partitions",
    operation_id="addPartitions",
    response_model=Topic,
    responses=_change_problems,
    summary="Grow a topic's partition count",
)
async def add_partitions(topic: str, body: PartitionsIncrease, engine: Engine, _principal: Admin) -> Topic:
    return topic_model(await engine.add_partitions(topic, body.count))


@router.delete(
    "/{topic}",
    operation_id="deleteTopic",
    status_code=204,
    response_class=Response,
    responses={400: _problems[400], 401: _problems[401], 403: _problems[403], 404: _problems[404]},
    summary="Delete a topic and its data (and its committed group offsets)",
)
async def delete_topic(topic: str, engine: Engine, _principal: Admin) -> Response:
    await engine.delete_topic(topic)
    return Response(status_code=204)
