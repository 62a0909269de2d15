"""Consumer-group offsets: commit, fetch, delete, reset, list groups."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
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
from .schemas import (
    CommittedGroupOffset,
    GroupList,
    GroupOffsets,
    GroupOffsetsCommit,
    GroupOffsetsReset,
    GroupOffsetsResetResult,
    Problem,
    ResetGroupOffset,
)

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


@router.post(
    "/{group}/offsets/reset",
    operation_id="resetGroupOffsets",
    response_model=GroupOffsetsResetResult,
    responses={
        **_problems,
        400: {
            "model": Problem,
            "description": "invalid_request (group id; shift_by without a committed offset)",
        },
        409: {"model": Problem, "description": "group_not_empty: the group has live Kafka members"},
    },
    summary="Reset a consumer group's offsets (Kafka's kafka-consumer-groups.sh --reset-offsets)",
    description=(
        "One scope: `topic` (all its partitions, or `partitions`) or `all_topics` (every topic "
        "the group has offsets on). One strategy: `to_earliest`, `to_latest`, `to_datetime`, "
        "`to_offset` or `shift_by`; a target outside [log start offset, high watermark] is moved "
        "into it, as Kafka's tool does. `dry_run: true` answers the plan and commits nothing. "
        "Refused with 409 `group_not_empty` while Kafka consumers are members of the group "
        "(Kafka's tool: the group must be inactive)."
    ),
)
async def reset_offsets(
    group: str, body: GroupOffsetsReset, request: Request, engine: Engine, _principal: GroupMember
) -> GroupOffsetsResetResult:
    principal = principal_of(request)
    groups = _groups(engine)
    if body.topic is not None and not principal.covers_topic(body.topic):
        raise ApiError(
            403, "forbidden", f"{principal.name!r} has no access to topic {body.topic!r}"
        )
    await refuse_live_members(request, group)
    committed = {
        (c.topic, c.partition): c.offset for c in await ready(groups.fetch(group, body.topic))
        if principal.covers_topic(c.topic)
    }
    if body.topic is not None:
        count = len(engine.topic(body.topic).partitions)  # 404 for an unknown topic
        chosen = [(body.topic, p) for p in (body.partitions or range(count))]
    else:
        chosen = sorted(committed)
    plan = [
        ResetGroupOffset(
            topic=t, partition=p, previous_offset=committed.get((t, p)),
            offset=await _target(engine, body, t, p, committed.get((t, p))),
        )
        for t, p in dict.fromkeys(chosen)
    ]
    if plan and not body.dry_run:
        await refuse_live_members(request, group)  # a member may have joined while we looked
        await groups.commit(group, [(o.topic, o.partition, o.offset, "") for o in plan])
    return GroupOffsetsResetResult(group=group, dry_run=body.dry_run, offsets=plan)


async def refuse_live_members(request: Request, group: str) -> None:
    """409 group_not_empty while the Kafka group coordinator holds live members of `group`:
    their next commits would overwrite the reset (Kafka's tool refuses a group that is not
    inactive; its broker answers NON_EMPTY_GROUP). app/lifespan.py sets `group_members`
    (shard 0's coordinator, asked through the channel on the other shards); None without a
    Kafka listener, where a group has no members to refuse for."""
    members_of = getattr(request.app.state, "group_members", None)
    if members_of is None:
        return
    state, members = await members_of(group)
    if members:
        raise ApiError(
            409, "group_not_empty",
            f"group {group!r} has {members} live member(s) (state {state}): offsets can be "
            "reset only while the group is inactive; stop its consumers first",
            members=members, group_state=state,
        )


async def _target(
    engine: Engine, body: GroupOffsetsReset, topic: str, partition: int, current: int | None
) -> int:
    """The new offset of one partition, by the request's strategy, within [log start offset,
    high watermark] (Kafka's ResetOffsets: checkOffsetsRange)."""
    log = engine.partition(topic, partition)  # 404 for an unknown partition
    start, end = log.log_start_offset, log.high_watermark
    if body.to_earliest:
        return start
    if body.to_latest:
        return end
    if body.to_datetime is not None:
        found = await log.offset_for_timestamp(_millis(body.to_datetime))
        return end if found is None else max(start, min(found[0], end))
    if body.to_offset is not None:
        return max(start, min(body.to_offset, end))
    assert body.shift_by is not None
    if current is None:
        raise ApiError(
            400, "invalid_request",
            f"cannot shift the offset of {topic}-{partition}: group has no committed offset there",
        )
    return max(start, min(current + body.shift_by, end))


def _millis(text: str) -> int:
    """ISO 8601 (a `Z` or an offset; none: UTC) as milliseconds since the epoch."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(
            422, "validation_error", f"to_datetime {text!r} is not an ISO 8601 time"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


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

