"""OffsetCommit, OffsetFetch and OffsetDelete: consumer-group offsets, the same ones HTTP's
/v1/groups/{group}/offsets commits and reads (engine/groups.py, the compacted
__consumer_offsets on shard 0): an offset a Kafka consumer commits shows in GET /v1/groups and
the console, and an HTTP commit is what OffsetFetch returns.

These requests go to the group's coordinator (FindCoordinator names shard 0; any other broker
answers NOT_COORDINATOR, and the client asks again). A commit with a generation and member id
is checked against the group's membership by the coordinator (broker/coordinator.py, Kafka's
rules: ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID);
generation -1 with no member id is a "simple" commit (a consumer that assigns partitions
itself), allowed while the group has no members. A commit is durable before it is answered.

Leader epochs of committed offsets are not kept (eventlog's epoch is always 0): OffsetFetch
answers -1, which clients read as "unknown" and skip the epoch check for.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from engine.errors import LogClosedError
from engine.groups import MAX_GROUP_CHARS
from engine.interface import Groups, ready

from .coordinator import GroupState
from .errors import KafkaError, error_code
from .listener import Call
from .protocol import has, make, ms, nested, serves

NO_OFFSET = -1


def offsets_of(call: Call) -> Groups:
    """The engine's group offsets (GroupOffsets on shard 0, RemoteGroups elsewhere). They are
    loaded before the engine opens, so this raises only what Broker.engine raises."""
    groups = call.broker.engine.groups
    if groups is None:
        raise LogClosedError("groups")
    return groups



def _group_error(call: Call, group: str) -> ErrorCode | None:
    """Why `group`'s offsets may not be used here, or None."""
    principal = call.principal
    if not group or len(group) > MAX_GROUP_CHARS:
        return ErrorCode.invalid_group_id
    if not (principal.allows("group", group=group)):
        return ErrorCode.group_authorization_failed
    if call.broker.node_id != call.broker.coordinator_id:
        return ErrorCode.not_coordinator
    return None


@serves(8, "OffsetCommit", 2, 9)
async def offset_commit(call: Call, request: Any) -> Any:
    cls = call.response
    topic_cls = nested(cls, "OffsetCommitResponseTopic")
    part_cls = nested(cls, "OffsetCommitResponsePartition")
    group = request.group_id
    code = _group_error(call, group)
    if code is None:
        try:
            engine = call.broker.engine
            code = _membership(call, request)
        except Exception as exc:
            code = error_code(exc, "OffsetCommit")
    principal = call.principal
    errors: dict[tuple[str, int], ErrorCode] = {}
    wanted = []
    for t in request.topics:
        for p in t.partitions:
            key = (t.name, p.partition_index)
            if code is not None:
                errors[key] = code
            elif not principal.covers_topic(t.name):
                errors[key] = ErrorCode.topic_authorization_failed
            else:
                try:
                    engine.partition(t.name, p.partition_index)
                    metadata = p.committed_metadata or ""
                    wanted.append((t.name, p.partition_index, p.committed_offset, metadata))
                except Exception as exc:
                    errors[key] = error_code(exc, "OffsetCommit")
    if wanted:
        try:
            await offsets_of(call).commit(group, wanted)
        except Exception as exc:
            failed = error_code(exc, "OffsetCommit")
            errors.update({(t, p): failed for t, p, _o, _m in wanted})
    topics = tuple(
        topic_cls(name=t.name, partitions=tuple(
            part_cls(
                partition_index=p.partition_index,
                error_code=errors.get((t.name, p.partition_index), ErrorCode.none),
            )
            for p in t.partitions
        ))
        for t in request.topics
    )
    call.error = next(iter(errors.values()), 0)
    return make(cls, throttle_time=ms(0), topics=topics)


def _membership(call: Call, request: Any) -> ErrorCode | None:
    """The coordinator's verdict on a commit's generation and member (None: accepted)."""
    coordinator = call.broker.coordinator
    generation = request.generation_id_or_member_epoch
    member = request.member_id or ""
    instance = getattr(request, "group_instance_id", None)
    if coordinator is None:
        raise KafkaError(ErrorCode.coordinator_not_available)
    verdict = coordinator.validate_commit(
        request.group_id, generation, member, instance, api_version=call.version
    )
    return None if verdict in (None, ErrorCode.none, 0) else ErrorCode(verdict)


@serves(9, "OffsetFetch", 1, 9)
async def offset_fetch(call: Call, request: Any) -> Any:
    cls = call.response
    if has(cls, "groups"):  # v8+: many groups in one request
        group_cls = nested(cls, "OffsetFetchResponseGroup")
        groups = []
        for g in request.groups:
            code, topics = await _fetch_group(
                call, g.group_id, g.topics,
                "OffsetFetchResponseTopics", "OffsetFetchResponsePartitions",
            )
            groups.append(group_cls(group_id=g.group_id, topics=topics, error_code=code))
        return make(cls, throttle_time=ms(0), groups=tuple(groups))
    code, topics = await _fetch_group(
        call, request.group_id, request.topics,
        "OffsetFetchResponseTopic", "OffsetFetchResponsePartition",
    )
    return make(cls, throttle_time=ms(0), topics=topics, error_code=code)


async def _fetch_group(
    call: Call, group: str, wanted: Any, topic_name: str, part_name: str
) -> tuple[ErrorCode, tuple[Any, ...]]:
    """(the group's error, its topics' answers): the offsets asked for (every partition asked
    answers, -1 when nothing is committed), or every committed one (topics null)."""
    topic_cls = nested(call.response, topic_name)
    part_cls = nested(call.response, part_name)
    code = _group_error(call, group)
    if code is not None:
        call.error = code
        return code, ()
    try:
        committed = await ready(offsets_of(call).fetch(group))
    except Exception as exc:
        call.error = error_code(exc, "OffsetFetch")
        return call.error, ()
    principal = call.principal
    found = {(c.topic, c.partition): c for c in committed if principal.covers_topic(c.topic)}

    def part(topic: str, index: int) -> Any:
        c = found.get((topic, index))
        covered = principal.covers_topic(topic)
        error = ErrorCode.none if covered else ErrorCode.topic_authorization_failed
        return make(
            part_cls, partition_index=index, committed_offset=c.offset if c else NO_OFFSET,
            committed_leader_epoch=-1, metadata=c.metadata if c else "", error_code=error,
        )

    if wanted is None:
        by_topic: dict[str, list[int]] = {}
        for topic, index in sorted(found):
            by_topic.setdefault(topic, []).append(index)
        pairs = list(by_topic.items())
    else:
        pairs = [(t.name, list(t.partition_indexes)) for t in wanted]
    topics = tuple(
        topic_cls(name=name, partitions=tuple(part(name, i) for i in indexes))
        for name, indexes in pairs
    )
    return ErrorCode.none, topics


@serves(47, "OffsetDelete", 0, 0)
async def offset_delete(call: Call, request: Any) -> Any:
    """Forget a group's committed offsets of some partitions. Kafka refuses this for a
    partition the group's members are subscribed to (GROUP_SUBSCRIBED_TO_TOPIC); eventlog
    refuses it while the group has members at all (the subscriptions are the members'
    opaque metadata). A group with neither members nor offsets does not exist:
    GROUP_ID_NOT_FOUND, as Kafka answers (OffsetMetadataManager.deleteOffsets)."""
    cls = call.response
    topic_cls = nested(cls, "OffsetDeleteResponseTopic")
    part_cls = nested(cls, "OffsetDeleteResponsePartition")
    group = request.group_id
    code = _group_error(call, group)
    coordinator = call.broker.coordinator
    part_code = ErrorCode.none
    if code is None and coordinator is not None:
        (described,) = await coordinator.describe_groups([group])
        if described.members:
            part_code = ErrorCode.group_subscribed_to_topic
        elif described.state == GroupState.DEAD.value:  # unknown to the coordinator
            try:
                if not await ready(offsets_of(call).fetch(group)):
                    code = ErrorCode.group_id_not_found
            except Exception as exc:
                code = error_code(exc, "OffsetDelete")
    principal = call.principal
    if code is None and part_code == ErrorCode.none:
        doomed = [
            (t.name, p.partition_index) for t in request.topics for p in t.partitions
            if principal.covers_topic(t.name)
        ]
        try:
            await offsets_of(call).delete_partitions(group, doomed)
        except Exception as exc:
            code = error_code(exc, "OffsetDelete")

    def result(topic: str) -> ErrorCode:
        if part_code != ErrorCode.none:
            return part_code
        covered = principal.covers_topic(topic)
        return ErrorCode.none if covered else ErrorCode.topic_authorization_failed

    topics = tuple(
        topic_cls(name=t.name, partitions=tuple(
            part_cls(partition_index=p.partition_index, error_code=result(t.name))
            for p in t.partitions
        ))
        for t in request.topics
    ) if code is None else ()
    call.error = code or 0
    return make(cls, error_code=code or ErrorCode.none, throttle_time=ms(0), topics=topics)
