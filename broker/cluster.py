"""Where things are: ApiVersions, Metadata, DescribeCluster, FindCoordinator.

Each shard of a family is a broker (node id = shard index, port = base port + index); a
partition's leader is its owner shard, its only replica and in-sync replica, at the latest epoch
of its leader-epoch history (0 for a partition eventlog made; an imported one keeps Kafka's; it
never moves after: one replica, no elections). Shard 0 is the controller and the
coordinator of every group (it holds __consumer_offsets). Internal topics (__metadata,
__consumer_offsets) are not listed: their records are eventlog's own, not a client's to read.

Metadata may create a topic it is asked for, as Kafka does with auto.create.topics.enable
(eventlog's kafka_auto_create_topics, on by default as in Kafka), with the server's default
partitions and configs, for a principal that may administer topics; anyone else gets
UNKNOWN_TOPIC_OR_PARTITION, or TOPIC_AUTHORIZATION_FAILED for a topic it may not describe.
"""

from __future__ import annotations

import base64
import logging
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from engine.errors import EngineError, TopicExistsError
from engine.interface import Engine
from engine.metadata import INTERNAL_TOPICS
from engine.topic_state import OfflinePartition

from .errors import error_code
from .listener import Call
from .protocol import APIS, NO_THROTTLE, has, make, nested, response_class, serves

logger = logging.getLogger("eventlog.kafka")

NO_UUID = uuid.UUID(int=0)
CLUSTER_ACTION_OPS = -2147483648  # INT32_MIN: "authorized operations not requested"


def topic_uuid(topic_id: str) -> uuid.UUID:
    """A topic id in Kafka's text form (URL-safe base64, 22 chars) as the wire's UUID."""
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4)))
    except (ValueError, TypeError):
        return NO_UUID


# The lowest version advertised where it is not the lowest served, as Kafka 4 does
# (KAFKA-18659): librdkafka before 2.11.1 compresses a batch with gzip, snappy or lz4 only when
# the broker advertises Produce v0, and otherwise sends it uncompressed, silently. Produce v0-2
# stay unserved: such a request closes the connection (protocol.parse), as Kafka 4 refuses it;
# every client picks the highest version both sides have, so none sends them.
ADVERTISED_MIN_VERSION = {0: 0}


def api_versions_body(version: int, error: ErrorCode = ErrorCode.none) -> Any:
    """The ApiVersions response (at `version`) listing what this listener serves."""
    cls = response_class(18, version)
    entry = nested(cls, "ApiVersion")
    keys = tuple(
        entry(
            api_key=a.key, min_version=ADVERTISED_MIN_VERSION.get(a.key, a.min_version),
            max_version=a.max_version,
        )
        for a in sorted(APIS.values(), key=lambda a: a.key)
    )
    return make(
        cls, error_code=error, api_keys=keys, throttle_time=NO_THROTTLE, supported_features=(),
        finalized_features_epoch=-1, finalized_features=(), zk_migration_ready=False,
    )


@serves(18, "ApiVersions", 0, 4)
async def api_versions(call: Call, request: Any) -> Any:
    return api_versions_body(call.version)


@serves(3, "Metadata", 0, 12)
async def metadata(call: Call, request: Any) -> Any:
    broker = call.broker
    engine = broker.engine
    cls = call.response
    broker_cls = nested(cls, "MetadataResponseBroker")
    brokers = tuple(
        make(broker_cls, node_id=i, host=h, port=p, rack=None)  # (rack: v1+)
        for i, h, p in broker.brokers()
    )
    topics = []
    names = _requested(call, request, engine)
    auto_create = bool(getattr(request, "allow_auto_topic_creation", True))
    for name in names:
        topics.append(await _topic(call, engine, name, auto_create))
    return make(
        cls, throttle_time=NO_THROTTLE, brokers=brokers, cluster_id=broker.cluster_id,
        controller_id=0, topics=tuple(topics), cluster_authorized_operations=CLUSTER_ACTION_OPS,
    )


def _requested(call: Call, request: Any, engine: Engine) -> list[str]:
    """The topic names asked for: every topic the principal may describe when the request
    names none (v0: an empty list; v1+: null)."""
    wanted = request.topics
    if wanted is None or (call.version == 0 and not wanted):
        principal = call.principal
        return sorted(
            n for n in engine.topics
            if n not in INTERNAL_TOPICS and principal.allows("describe", topic=n)
        )
    names = []
    for t in wanted:
        name = t.name
        if name is None and getattr(t, "topic_id", None) is not None:
            name = _name_of_id(engine, t.topic_id)
        names.append(name if name is not None else "")
    return names


def _name_of_id(engine: Engine, topic_id: uuid.UUID) -> str | None:
    for name, state in engine.topics.items():
        if topic_uuid(state.meta.topic_id) == topic_id:
            return name
    return None


async def _topic(call: Call, engine: Engine, name: str, auto_create: bool) -> Any:
    cls = nested(call.response, "MetadataResponseTopic")
    principal = call.principal
    if name in INTERNAL_TOPICS or not name:
        return _topic_error(cls, name, ErrorCode.unknown_topic_or_partition)
    if not principal.allows("describe", topic=name):
        return _topic_error(cls, name, ErrorCode.topic_authorization_failed)
    state = engine.topics.get(name)
    if state is None:
        settings = call.broker.state.settings
        creates = auto_create and settings.kafka_auto_create_topics
        if not (creates and principal.allows("admin", topic=name)):
            return _topic_error(cls, name, ErrorCode.unknown_topic_or_partition)
        try:
            state = await engine.create_topic(name)
            logger.info("topic %r created by a Kafka client's metadata request", name)
        except TopicExistsError:
            state = engine.topics.get(name)
        except EngineError as exc:
            return _topic_error(cls, name, error_code(exc))
        if state is None:
            return _topic_error(cls, name, ErrorCode.leader_not_available)
    part_cls = nested(call.response, "MetadataResponsePartition")
    broker = call.broker
    partitions = []
    for index, log in enumerate(state.partitions):
        leader = broker.leader_of(name, index)
        offline = isinstance(log, OfflinePartition)
        partitions.append(make(
            part_cls,
            error_code=ErrorCode.kafka_storage_error if offline else ErrorCode.none,
            partition_index=index, leader_id=-1 if offline else leader,
            leader_epoch=-1 if isinstance(log, OfflinePartition) else log.current_leader_epoch,
            replica_nodes=(leader,), isr_nodes=() if offline else (leader,),
            offline_replicas=(leader,) if offline else (),
        ))
    return make(
        cls, error_code=ErrorCode.none, name=name, topic_id=topic_uuid(state.meta.topic_id),
        is_internal=False, partitions=tuple(partitions),
        topic_authorized_operations=CLUSTER_ACTION_OPS,
    )


def _topic_error(cls: Any, name: str, code: ErrorCode) -> Any:
    return make(
        cls, error_code=code, name=name, topic_id=NO_UUID, is_internal=False, partitions=(),
        topic_authorized_operations=CLUSTER_ACTION_OPS,
    )


@serves(60, "DescribeCluster", 0, 1)
async def describe_cluster(call: Call, request: Any) -> Any:
    broker = call.broker
    cls = call.response
    entry = nested(cls, "DescribeClusterBroker")
    return make(
        cls, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None,
        endpoint_type=1, cluster_id=broker.cluster_id, controller_id=0,
        brokers=tuple(
            entry(broker_id=i, host=h, port=p, rack=None) for i, h, p in broker.brokers()
        ),
        cluster_authorized_operations=CLUSTER_ACTION_OPS,
    )


GROUP_KEY = 0
TRANSACTION_KEY = 1


@serves(10, "FindCoordinator", 0, 6)
async def find_coordinator(call: Call, request: Any) -> Any:
    """Every group's coordinator is shard 0; transactions have none (not supported)."""
    broker = call.broker
    cls = call.response
    key_type = getattr(request, "key_type", GROUP_KEY)
    node = broker.coordinator_id
    host, port = broker.host, broker.port + node
    principal = call.principal

    def answer(key: str) -> tuple[ErrorCode, str | None]:
        if key_type != GROUP_KEY:
            return ErrorCode.transactional_id_authorization_failed, "transactions are not supported"
        if not (principal.allows("group", group=key)):
            return ErrorCode.group_authorization_failed, f"no access to group {key!r}"
        return ErrorCode.none, None

    if has(cls, "coordinators"):
        entry = nested(cls, "Coordinator")
        coordinators = []
        for key in request.coordinator_keys:
            code, message = answer(key)
            ok = code == ErrorCode.none
            coordinators.append(entry(
                key=key, node_id=node if ok else -1, host=host if ok else "",
                port=port if ok else -1, error_code=code, error_message=message,
            ))
        return make(cls, throttle_time=NO_THROTTLE, coordinators=tuple(coordinators))
    code, message = answer(request.key)
    ok = code == ErrorCode.none
    return make(
        cls, throttle_time=NO_THROTTLE, error_code=code, error_message=message,
        node_id=node if ok else -1, host=host if ok else "", port=port if ok else -1,
    )
