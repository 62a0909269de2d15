"""The classic consumer-group protocol on the wire: JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
ListGroups, DescribeGroups, DeleteGroups, each translated to and from broker/coordinator.py's
GroupCoordinator, which holds the groups' membership in memory on the coordinator shard (shard
0; any other broker answers NOT_COORDINATOR and the client asks FindCoordinator again).

A group is also what its committed offsets are (engine/groups.py): a group that has offsets but
no members (a consumer that assigns partitions itself, an HTTP client, a group whose members have
all left, or whose coordinator restarted) is listed and described as Empty, and DeleteGroups
deletes its offsets, as Kafka's coordinator, which loads both from __consumer_offsets, does.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from engine.interface import ready

from .coordinator import GroupCoordinator
from .errors import KafkaError, error_code
from .group_offsets import offsets_of
from .listener import Call
from .protocol import has, make, ms, nested, serves

CLASSIC = "classic"
EMPTY = "Empty"
DEAD = "Dead"
AUTHORIZED_OPERATIONS_OMITTED = -2147483648



def _coordinator(call: Call, group: str) -> GroupCoordinator:
    """The coordinator for `group` if this broker is it and the principal may use the group;
    KafkaError otherwise."""
    principal = call.principal
    if not group:
        raise KafkaError(ErrorCode.invalid_group_id, "a group id must not be empty")
    if not (principal.allows("group", group=group)):
        raise KafkaError(ErrorCode.group_authorization_failed, f"no access to group {group!r}")
    broker = call.broker
    if broker.node_id != broker.coordinator_id:
        raise KafkaError(ErrorCode.not_coordinator)
    if broker.coordinator is None:
        raise KafkaError(ErrorCode.coordinator_not_available)
    return broker.coordinator


def _client_host(call: Call) -> str:
    peer = call.connection.peer
    return f"/{peer[0]}" if isinstance(peer, tuple) and peer else ""


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000)


@serves(11, "JoinGroup", 0, 9)
async def join_group(call: Call, request: Any) -> Any:
    cls = call.response
    try:
        coordinator = _coordinator(call, request.group_id)
        rebalance = getattr(request, "rebalance_timeout", None)
        result = await coordinator.join_group(
            request.group_id, request.member_id, version=call.version,
            client_id=call.client_id or "", client_host=_client_host(call),
            session_timeout_ms=_ms(request.session_timeout),
            rebalance_timeout_ms=_ms(rebalance) if rebalance is not None else -1,
            protocol_type=request.protocol_type,
            protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
            group_instance_id=getattr(request, "group_instance_id", None),
            reason=getattr(request, "reason", None),
        )
    except Exception as exc:
        code = error_code(exc, "JoinGroup")
        call.error = code
        return make(
            cls, throttle_time=ms(0), error_code=code, generation_id=-1, protocol_type=None,
            protocol_name="" if call.version < 7 else None, leader="", skip_assignment=False,
            member_id=request.member_id, members=(),
        )
    call.error = result.error
    member_cls = nested(cls, "JoinGroupResponseMember")
    members = tuple(
        make(
            member_cls, member_id=m.member_id, group_instance_id=m.group_instance_id,
            metadata=m.metadata,
        )
        for m in result.members
    )
    name = result.protocol_name
    return make(
        cls, throttle_time=ms(0), error_code=result.error, generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=name if name is not None or call.version >= 7 else "",
        leader=result.leader, skip_assignment=result.skip_assignment, member_id=result.member_id,
        members=members,
    )


@serves(14, "SyncGroup", 0, 5)
async def sync_group(call: Call, request: Any) -> Any:
    cls = call.response
    try:
        coordinator = _coordinator(call, request.group_id)
        result = await coordinator.sync_group(
            request.group_id, request.generation_id, request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            protocol_type=getattr(request, "protocol_type", None),
            protocol_name=getattr(request, "protocol_name", None),
            assignments=[(a.member_id, bytes(a.assignment)) for a in request.assignments],
        )
        code, assignment = result.error, result.assignment
        protocol_type, protocol_name = result.protocol_type, result.protocol_name
    except Exception as exc:
        code, assignment = error_code(exc, "SyncGroup"), b""
        protocol_type = protocol_name = None
    call.error = code
    return make(
        cls, throttle_time=ms(0), error_code=code, protocol_type=protocol_type,
        protocol_name=protocol_name, assignment=assignment,
    )


@serves(12, "Heartbeat", 0, 4)
async def heartbeat(call: Call, request: Any) -> Any:
    try:
        coordinator = _coordinator(call, request.group_id)
        code = await coordinator.heartbeat(
            request.group_id, request.generation_id, request.member_id,
            getattr(request, "group_instance_id", None),
        )
    except Exception as exc:
        code = error_code(exc, "Heartbeat")
    call.error = code
    return make(call.response, throttle_time=ms(0), error_code=code)


@serves(13, "LeaveGroup", 0, 5)
async def leave_group(call: Call, request: Any) -> Any:
    cls = call.response
    many = has(type(request), "members")
    if many:
        members = [(m.member_id, getattr(m, "group_instance_id", None)) for m in request.members]
        reason = next((m.reason for m in request.members if getattr(m, "reason", None)), None)
    else:
        members, reason = [(request.member_id, None)], None
    try:
        coordinator = _coordinator(call, request.group_id)
        result = await coordinator.leave_group(request.group_id, members, reason=reason)
    except Exception as exc:
        call.error = code = error_code(exc, "LeaveGroup")
        return make(cls, throttle_time=ms(0), error_code=code, members=())
    if not many:
        code = result.error
        if code == ErrorCode.none and result.members:
            code = result.members[0].error
        call.error = code
        return make(cls, throttle_time=ms(0), error_code=code)
    member_cls = nested(cls, "MemberResponse")
    call.error = result.error
    return make(
        cls, throttle_time=ms(0), error_code=result.error,
        members=tuple(
            member_cls(
                member_id=m.member_id, group_instance_id=m.group_instance_id, error_code=m.error
            )
            for m in result.members
        ),
    )


async def _offset_groups(call: Call) -> set[str]:
    """The groups that have committed offsets (on the coordinator shard only)."""
    return set(await ready(offsets_of(call).groups()))


async def _has_offsets(call: Call, group: str) -> bool:
    return bool(await ready(offsets_of(call).fetch(group)))


@serves(16, "ListGroups", 0, 5)
async def list_groups(call: Call, request: Any) -> Any:
    """The groups this broker coordinates (a client asks every broker and merges): with members,
    and those that have only committed offsets (Empty)."""
    cls = call.response
    listed_cls = nested(cls, "ListedGroup")
    broker = call.broker
    principal = call.principal
    if broker.node_id != broker.coordinator_id or broker.coordinator is None:
        return make(cls, throttle_time=ms(0), error_code=ErrorCode.none, groups=())
    states = tuple(getattr(request, "states_filter", ()) or ())
    types = tuple(getattr(request, "types_filter", ()) or ())
    result = await broker.coordinator.list_groups(states, types)
    listed = {g.group_id: g for g in result.groups}
    groups = [
        make(listed_cls, group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state,
             group_type=g.group_type)
        for g in result.groups
    ]
    wants_empty = not states or EMPTY.lower() in {s.lower() for s in states}
    wants_classic = not types or CLASSIC in {t.lower() for t in types}
    if wants_empty and wants_classic:
        try:
            for group in sorted(await _offset_groups(call) - set(listed)):
                groups.append(make(listed_cls, group_id=group, protocol_type="", group_state=EMPTY,
                                   group_type=CLASSIC))
        except Exception as exc:
            call.error = code = error_code(exc, "ListGroups")
            return make(cls, throttle_time=ms(0), error_code=code, groups=())
    visible = tuple(
        g for g in groups if principal.allows("group", group=g.group_id)
    )
    return make(cls, throttle_time=ms(0), error_code=result.error, groups=visible)


@serves(15, "DescribeGroups", 0, 5)
async def describe_groups(call: Call, request: Any) -> Any:
    cls = call.response
    group_cls = nested(cls, "DescribedGroup")
    member_cls = nested(cls, "DescribedGroupMember")
    described = []
    for group in request.groups:
        try:
            coordinator = _coordinator(call, group)
            (d,) = await coordinator.describe_groups([group])
            state, protocol_type = d.state, d.protocol_type
            if state == DEAD and await _has_offsets(call, group):
                state, protocol_type = EMPTY, ""
            members = tuple(
                make(
                    member_cls, member_id=m.member_id, group_instance_id=m.group_instance_id,
                    client_id=m.client_id, client_host=m.client_host, member_metadata=m.metadata,
                    member_assignment=m.assignment,
                )
                for m in d.members
            )
            described.append(make(
                group_cls, error_code=d.error, group_id=group, group_state=state,
                protocol_type=protocol_type, protocol_data=d.protocol_data, members=members,
                authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
            ))
        except Exception as exc:
            code = error_code(exc, "DescribeGroups")
            call.error = call.error or code
            described.append(make(
                group_cls, error_code=code, group_id=group, group_state="", protocol_type="",
                protocol_data="", members=(), authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
            ))
    return make(cls, throttle_time=ms(0), groups=tuple(described))


@serves(42, "DeleteGroups", 0, 2)
async def delete_groups(call: Call, request: Any) -> Any:
    """Only a group with no members may go (NON_EMPTY_GROUP); its committed offsets go with it
    (the same as DELETE /v1/groups/{group}/offsets)."""
    cls = call.response
    result_cls = nested(cls, "DeletableGroupResult")
    results = []
    for group in request.groups_names:
        try:
            coordinator = _coordinator(call, group)
            verdicts = await coordinator.delete_groups([group])
            code = verdicts.get(group, ErrorCode.group_id_not_found)
            if code in (ErrorCode.none, ErrorCode.group_id_not_found):
                removed = await offsets_of(call).delete(group)
                if removed:
                    code = ErrorCode.none
        except Exception as exc:
            code = error_code(exc, "DeleteGroups")
        call.error = call.error or code
        results.append(result_cls(group_id=group, error_code=code))
    return make(cls, throttle_time=ms(0), results=tuple(results))
