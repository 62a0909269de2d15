"""Consumer-group offsets: commit, fetch, delete, list groups."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from engine.errors import LogClosedError
from engine.groups import MAX_GROUP_CHARS, CommittedOffset
from engine.interface import Groups, ready

from .auth import Describer, GroupMember, principal_of
from .deps import Engine
from .errors import ApiError
from .policy import PolicyRoute
from .schemas import CommittedGroupOffset, GroupList, GroupOffsets, GroupOffsetsCommit, Problem

DEFAULT_GROUPS_PAGE = 1000
MAX_GROUPS_PAGE = 10_000

router = APIRouter(prefix="/v1/groups", tags=["groups"], route_class=PolicyRoute)

_problems: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "invalid_request (group id)"},
    401: {"model": Problem, "description": "unauthorized"},
    403: {"model": Problem, "description": "forbidden"},
    404: {"model": Problem, "description": "topic_not_found, partition_not_found"},
    422: {"model": Problem, "description": "validation_error"},
}


def _model(group: str, committed: Sequence[CommittedOffset]) -> GroupOffsets:
    return GroupOffsets(
        group=group,
        offsets=[
            CommittedGroupOffset(topic=c.topic, partition=c.partition, offset=c.offset, metadata=c.metadata, commit_timestamp=c.commit_timestamp)
            for c in committed
        ],
    )


@router.post(
    "/{group}/offsets",
    operation_id="commitGroupOffsets",
    response_model=GroupOffsets,
    responses=_problems,
    summary="Commit a consumer group's offsets (stored in __consumer_offsets, durable on return)",
)
async def commit_offsets(group: str, body: GroupOffsetsCommit, request: Request, engine: Engine, _principal: GroupMember) -> GroupOffsets:
    principal = principal_of(request)
    for item in body.offsets:
        engine.partition(item.topic, item.partition)  # 404 for an unknown topic or partition
        if not principal.covers_topic(item.topic):
            raise ApiError(403, "forbidden", f"{principal.name!r} has no access to topic {item.topic!r}")
    committed = await _groups(engine).commit(group, [(o.topic, o.partition, o.offset, o.metadata) for o in body.offsets])
    return _model(group, committed)


@router.get(
    "/{group}/offsets",
    operation_id="fetchGroupOffsets",
    response_model=GroupOffsets,
    responses=_problems,
    summary="A consumer group's committed offsets (an unknown group has none)",
)
async def fetch_offsets(
    group: str, request: Request, engine: Engine, _principal: GroupMember,
    topic: str | None = Query(None, description="only this topic's offsets"),
) -> GroupOffsets:
    principal = principal_of(request)
    committed = [c for c in await ready(_groups(engine).fetch(group, topic)) if principal.covers_topic(c.topic)]
    return _model(group, committed)


@router.delete(
    "/{group}/offsets",
    operation_id="deleteGroupOffsets",
    status_code=204,
    response_class=Response,
    responses=_problems,
    summary="Forget a consumer group's committed offsets (all, or one topic's)",
)
async def delete_offsets(
    group: str, request: Request, engine: Engine, _principal: GroupMember, topic: str | None = Query(None)
) -> Response:
    principal = principal_of(request)
    topics = {c.topic for c in await ready(_groups(engine).fetch(group, topic))}
    for t in sorted(topics):
        if principal.covers_topic(t):
            await _groups(engine).delete(group, t)
    return Response(status_code=204)


@router.get(
    "",
    operation_id="listGroups",
    response_model=GroupList,
    responses={401: _problems[401], 403: _problems[403], 422: _problems[422]},
    summary="Consumer groups with committed offsets, by name, a page at a time",
    description=(
        "An admin sees every group. Any other token sees the groups its group prefixes cover that "
        "have offsets committed on at least one topic its topic prefixes cover. At most `limit` "
        "groups, sorted by name, after `after`; `next_after` is what to pass as `after` for the "
        "next page, null on the last."
    ),
)
async def list_groups(
    request: Request, engine: Engine, _principal: Describer,
    limit: int = Query(
        DEFAULT_GROUPS_PAGE, ge=1, le=MAX_GROUPS_PAGE, description="the most groups answered"
    ),
    after: str | None = Query(
        None, min_length=1, max_length=MAX_GROUP_CHARS,
        description="only groups named after this one (the previous page's `next_after`)",
    ),
) -> GroupList:
    principal = principal_of(request)
    accept = None
    if principal.role != "admin":
        def accept(group: str, topics: Iterable[str]) -> bool:
            return principal.covers_group(group) and any(map(principal.covers_topic, topics))
    groups, next_after = await ready(_groups(engine).groups_page(limit, after, accept))
    return GroupList(groups=groups, next_after=next_after)


def _groups(engine: Engine) -> Groups:
    """The engine's group offsets: loaded before an engine is open, so there once it serves."""
    groups = engine.groups
    if groups is None:
        raise LogClosedError("groups")
    return groups

