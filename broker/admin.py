"""Kafka's admin APIs: CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords,
DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, on the engine calls HTTP's topic
routes use (api/topics.py, api/offsets.py), so both protocols change topics the same way: the
same validation, the same errors (broker/errors.py maps them), the same all-or-nothing creates.
In a shard family any broker takes a change: the engine forwards it to the controller (shard 0,
engine/family.py), which answers once every shard has applied it, so the client's next request
finds the change whichever broker it reaches; a controller that cannot be reached is
NOT_CONTROLLER, which admin clients retry.

Rights are HTTP's: creating, deleting, altering and deleting records need "admin" on the topic
(TOPIC_AUTHORIZATION_FAILED otherwise), describing configs "describe". Internal topics
(__metadata, __consumer_offsets) are the server's: they cannot be created, deleted, altered or
have records deleted (INVALID_REQUEST, as HTTP's 400), only described, by an admin.

What is eventlog's own:

* one replica: replication_factor -1 or 1, anything else INVALID_REPLICATION_FACTOR; manual
  replica assignments are refused (INVALID_REPLICA_ASSIGNMENT): the owner shard of a partition
  is fixed by its name and number (engine/shards.owner_of);
* the broker's configs are the server's settings, read at start: DescribeConfigs answers them
  read-only (the topic defaults under Kafka's broker names, log.retention.ms and the like, and
  num.partitions, default.replication.factor, auto.create.topics.enable), AlterConfigs and
  IncrementalAlterConfigs refuse them (INVALID_REQUEST, with the setting to use instead);
* a request's timeout bounds the wait for topic changes: one still running then is answered
  REQUEST_TIMED_OUT and goes on (Kafka's meaning: it may still complete); a timeout of 0 or
  less waits for the change (it is applied by every shard before it is answered).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode

from engine.config import CONFIG_DEFS, LogConfig, normalise_overrides, validate_new_topic_name
from engine.errors import InvalidConfigError, InvalidPartitionsError, TopicExistsError
from engine.interface import Engine
from engine.log_manager import MAX_PARTITIONS
from engine.metadata import INTERNAL_TOPICS, refuse_internal

from .cluster import NO_UUID, topic_uuid
from .errors import KafkaError, change_error_code, error_code, message_of
from .listener import Call
from .protocol import NO_THROTTLE, has, make, nested, serves

logger = logging.getLogger("eventlog.kafka")

# ConfigResource.Type
TOPIC = 2
BROKER = 4

# ConfigEntry.ConfigSource
TOPIC_CONFIG = 1  # DYNAMIC_TOPIC_CONFIG: the topic's own override
STATIC_BROKER_CONFIG = 4  # the server's setting (EVENTLOG_TOPIC_DEFAULTS, ...)
DEFAULT_CONFIG = 5  # the built-in default

# ConfigDef.Type, as DescribeConfigs v3+ reports it
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7
_INT_CONFIGS = frozenset(
    {"index.interval.bytes", "max.message.bytes", "segment.bytes", "segment.index.bytes"}
)
LIST_CONFIGS = frozenset({"cleanup.policy"})  # what APPEND and SUBTRACT apply to

# IncrementalAlterConfigs' operations
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

# a topic config's name as a broker config (Kafka's ServerTopicConfigSynonyms): the server
# default it falls back to; eventlog's own configs have no other name
BROKER_NAMES: dict[str, str] = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.index.bytes": "log.index.size.max.bytes",
    "segment.ms": "log.roll.ms",
}


def broker_name(topic_config: str) -> str:
    return BROKER_NAMES.get(topic_config, topic_config)


@cache
def _builtin() -> dict[str, str]:
    """Every topic config's built-in default, as Kafka writes it."""
    return LogConfig().to_kafka()


def config_type(name: str) -> int:
    if name in LIST_CONFIGS:
        return LIST
    default = CONFIG_DEFS[name].default
    if isinstance(default, bool):
        return BOOLEAN
    if isinstance(default, float):
        return DOUBLE
    if isinstance(default, int):
        return INT if name in _INT_CONFIGS else LONG
    return STRING


def _doc(name: str) -> str | None:
    d = CONFIG_DEFS.get(name)
    return d.doc if d is not None else None


# -- shared steps ----------------------------------------------------------------------------


def _note(call: Call, code: ErrorCode) -> None:
    """The request's first error, for the access log and the metrics."""
    if code != ErrorCode.none and not call.error:
        call.error = code


def _may_change(call: Call, topic: str) -> None:
    principal = call.principal
    if not (principal.allows("admin", topic=topic)):
        raise KafkaError(
            ErrorCode.topic_authorization_failed,
            f"{principal.name!r} may not change topic {topic!r} (needs the admin right)",
        )


def _duplicates(keys: Iterable[Any]) -> set[Any]:
    return {k for k, n in Counter(keys).items() if n > 1}


def _millis(timeout: Any) -> float:
    return timeout.total_seconds() * 1000 if isinstance(timeout, datetime.timedelta) else 0.0


def _observe(task: asyncio.Task[Any]) -> None:
    """A change answered REQUEST_TIMED_OUT, or whose client went away, still finishes: what
    became of it is logged, not lost."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("kafka topic change failed", exc_info=task.exception())


async def _within(
    timeout: Any, jobs: list[Awaitable[Any]], late: Callable[[int], Any]
) -> list[Any]:
    """Each job's answer (a job answers its own errors), waiting up to `timeout` for them all;
    late(i) answers job i when it is still running then. The jobs run to the end whatever
    happens to this request: a topic change is never cut half-way by a client's timeout or
    its closed connection."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    for task in tasks:
        task.add_done_callback(_observe)
    if tasks:
        wait_ms = _millis(timeout)
        await asyncio.wait(tasks, timeout=wait_ms / 1000 if wait_ms > 0 else None)
    return [t.result() if t.done() else late(i) for i, t in enumerate(tasks)]


def _timed_out(timeout: Any) -> KafkaError:
    return KafkaError(
        ErrorCode.request_timed_out,
        f"not done within the request's timeout of {_millis(timeout):.0f} ms; "
        "the change goes on and may still complete",
    )


def _sources(name: str, overrides: Mapping[str, str], server: Mapping[str, Any]) -> int:
    if name in overrides:
        return TOPIC_CONFIG
    if name in server:
        return STATIC_BROKER_CONFIG
    return DEFAULT_CONFIG


def topic_configs(
    config: LogConfig, overrides: Mapping[str, str], server: Mapping[str, Any]
) -> list[tuple[str, str, int]]:
    """(name, value, source) of each of a topic's configs: its overrides, the server's topic
    defaults (`server`: EVENTLOG_TOPIC_DEFAULTS) and the built-in defaults, in Kafka's order of
    precedence."""
    return [
        (name, value, _sources(name, overrides, server))
        for name, value in config.to_kafka().items()
    ]


# -- CreateTopics ----------------------------------------------------------------------------


def _check_create_request(call: Call, topic: Any, duplicated: set[str]) -> dict[str, str]:
    """What Kafka checks of a CreatableTopic before the controller sees it; its configs."""
    name = topic.name
    _may_change(call, name)
    if name in duplicated:
        raise KafkaError(ErrorCode.invalid_request, f"topic {name!r} is named more than once")
    if topic.replication_factor not in (-1, 1):
        raise KafkaError(
            ErrorCode.invalid_replication_factor,
            f"replication factor {topic.replication_factor}: eventlog keeps one replica of "
            "each partition (use 1, or -1 for the default)",
        )
    if topic.assignments:
        raise KafkaError(
            ErrorCode.invalid_replica_assignment,
            "manual replica assignments are not supported: a partition's broker is its owner "
            "shard (num_partitions sets the count)",
        )
    configs: dict[str, str] = {}
    for c in topic.configs:
        if c.value is None:
            raise KafkaError(
                ErrorCode.invalid_config, f"Null value not supported for topic configs: {c.name}"
            )
        configs[c.name] = c.value
    return configs


def _check_create(
    engine: Engine, name: str, partitions: int | None, configs: Mapping[str, str]
) -> tuple[int, dict[str, str], LogConfig]:
    """Everything LogManager.create_topic checks, creating nothing (validate_only): the
    partition count, the overrides and the config they make."""
    validate_new_topic_name(name)
    count = engine.config.default_partitions if partitions is None else partitions
    if not 1 <= count <= MAX_PARTITIONS:
        raise InvalidPartitionsError(count)
    overrides = normalise_overrides(configs)
    config = engine.config.default_log_config.with_overrides(overrides)
    if name in engine.topics or name in INTERNAL_TOPICS:
        raise TopicExistsError(name)
    engine._check_collision(name)
    engine._check_partition_budget(count, topic=name)
    return count, overrides, config


@serves(19, "CreateTopics", 2, 7)
async def create_topics(call: Call, request: Any) -> Any:
    cls = call.response
    result_cls = nested(cls, "CreatableTopicResult")
    config_cls = nested(cls, "CreatableTopicConfigs") if has(result_cls, "configs") else None
    duplicated = _duplicates(t.name for t in request.topics)
    server = call.broker.state.settings.topic_defaults

    def created(name: str, topic_id: uuid.UUID, count: int, config: LogConfig,
                overrides: Mapping[str, str]) -> Any:
        configs = None
        if config_cls is not None:
            configs = tuple(
                config_cls(name=n, value=v, read_only=False, config_source=s, is_sensitive=False)
                for n, v, s in topic_configs(config, overrides, server)
            )
        return make(
            result_cls, name=name, topic_id=topic_id, error_code=ErrorCode.none,
            error_message=None, topic_config_error_code=0, num_partitions=count,
            replication_factor=1, configs=configs,
        )

    def failed(name: str, exc: BaseException) -> Any:
        return make(
            result_cls, name=name, topic_id=NO_UUID,
            error_code=change_error_code(exc, "CreateTopics"), error_message=message_of(exc),
            topic_config_error_code=0, num_partitions=-1, replication_factor=-1, configs=None,
        )

    async def one(topic: Any) -> Any:
        name = topic.name
        try:
            configs = _check_create_request(call, topic, duplicated)
            partitions = None if topic.num_partitions == -1 else topic.num_partitions
            engine = call.broker.engine
            if request.validate_only:
                count, overrides, config = _check_create(engine, name, partitions, configs)
                return created(name, NO_UUID, count, config, overrides)
            state = await engine.create_topic(name, partitions, configs)
            return created(
                name, topic_uuid(state.meta.topic_id), len(state.partitions), state.config,
                state.meta.overrides,
            )
        except Exception as exc:
            return failed(name, exc)

    topics = request.topics
    results = await _within(
        request.timeout, [one(t) for t in topics],
        lambda i: failed(topics[i].name, _timed_out(request.timeout)),
    )
    for r in results:
        _note(call, r.error_code)
    return make(cls, throttle_time=NO_THROTTLE, topics=tuple(results))


# -- DeleteTopics ----------------------------------------------------------------------------


def _named(engine: Engine, name: str | None, topic_id: uuid.UUID | None) -> tuple[str, uuid.UUID]:
    """The topic a DeleteTopicState names (by name, or by id from v6), and its id."""
    by_id = topic_id is not None and topic_id != NO_UUID
    if name is not None and by_id:
        raise KafkaError(ErrorCode.invalid_request, "give a topic's name or its id, not both")
    if by_id:
        for state in engine.topics.values():
            if topic_uuid(state.meta.topic_id) == topic_id:
                return state.name, topic_id
        raise KafkaError(ErrorCode.unknown_topic_id, f"no topic has the id {topic_id}")
    if name is None:
        raise KafkaError(ErrorCode.invalid_request, "a topic needs a name or an id")
    named = engine.topics.get(name)
    return name, topic_uuid(named.meta.topic_id) if named is not None else NO_UUID


@serves(20, "DeleteTopics", 1, 6)
async def delete_topics(call: Call, request: Any) -> Any:
    cls = call.response
    result_cls = nested(cls, "DeletableTopicResult")
    if has(type(request), "topics"):  # v6+: by name or by id
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(n, None) for n in request.topic_names]
    duplicated = _duplicates(n for n, _ in wanted if n is not None) | _duplicates(
        i for _, i in wanted if i is not None and i != NO_UUID
    )

    def answer(name: str | None, topic_id: uuid.UUID | None, exc: BaseException | None) -> Any:
        code = ErrorCode.none if exc is None else change_error_code(exc, "DeleteTopics")
        return make(
            result_cls, name=name, topic_id=topic_id if topic_id is not None else NO_UUID,
            error_code=code, error_message=None if exc is None else message_of(exc),
        )

    async def one(name: str | None, topic_id: uuid.UUID | None) -> Any:
        by_id = topic_id is not None and topic_id != NO_UUID
        try:
            if name in duplicated or (by_id and topic_id in duplicated):
                raise KafkaError(ErrorCode.invalid_request, "a topic is named more than once")
            engine = call.broker.engine
            name, topic_id = _named(engine, name, topic_id)
            principal = call.principal
            if by_id and not (principal.allows("describe", topic=name)):
                # a topic one may not see cannot be named by its id (Kafka's answer)
                raise KafkaError(ErrorCode.unknown_topic_id, f"no topic has the id {topic_id}")
            _may_change(call, name)
            await engine.delete_topic(name)
            return answer(name, topic_id, None)
        except Exception as exc:
            return answer(name, topic_id, exc)

    results = await _within(
        request.timeout, [one(n, i) for n, i in wanted],
        lambda i: answer(wanted[i][0], wanted[i][1], _timed_out(request.timeout)),
    )
    for r in results:
        _note(call, r.error_code)
    return make(cls, throttle_time=NO_THROTTLE, responses=tuple(results))



# -- CreatePartitions ------------------------------------------------------------------------


def _check_add_partitions(engine: Engine, name: str, count: int) -> None:
    """Everything LogManager.add_partitions checks, adding nothing (validate_only)."""
    refuse_internal(name)
    current = len(engine.topic(name).partitions)
    if count <= current or count > MAX_PARTITIONS:
        raise InvalidPartitionsError(count, current)
    engine._check_partition_budget(count - current, topic=name, first=current)


@serves(37, "CreatePartitions", 0, 3)
async def create_partitions(call: Call, request: Any) -> Any:
    cls = call.response
    result_cls = nested(cls, "CreatePartitionsTopicResult")
    duplicated = _duplicates(t.name for t in request.topics)

    def answer(name: str, exc: BaseException | None) -> Any:
        if exc is None:
            return make(result_cls, name=name, error_code=ErrorCode.none, error_message=None)
        return make(
            result_cls, name=name, error_code=change_error_code(exc, "CreatePartitions"),
            error_message=message_of(exc),
        )

    async def one(topic: Any) -> Any:
        name = topic.name
        try:
            _may_change(call, name)
            if name in duplicated:
                raise KafkaError(ErrorCode.invalid_request, f"topic {name!r} named more than once")
            if topic.assignments:
                raise KafkaError(
                    ErrorCode.invalid_replica_assignment,
                    "manual replica assignments are not supported: a partition's broker is its "
                    "owner shard",
                )
            engine = call.broker.engine
            if request.validate_only:
                _check_add_partitions(engine, name, topic.count)
            else:
                await engine.add_partitions(name, topic.count)
            return answer(name, None)
        except Exception as exc:
            return answer(name, exc)

    topics = request.topics
    results = await _within(
        request.timeout, [one(t) for t in topics],
        lambda i: answer(topics[i].name, _timed_out(request.timeout)),
    )
    for r in results:
        _note(call, r.error_code)
    return make(cls, throttle_time=NO_THROTTLE, results=tuple(results))


# -- DeleteRecords ---------------------------------------------------------------------------


@serves(21, "DeleteRecords", 0, 2)
async def delete_records(call: Call, request: Any) -> Any:
    """Each partition's log start moves up to its offset (-1: the high watermark) through
    PartitionLog.delete_records, HTTP's delete-records; in a family, on its owner shard."""
    cls = call.response
    topic_cls = nested(cls, "DeleteRecordsTopicResult")
    part_cls = nested(cls, "DeleteRecordsPartitionResult")

    async def one(topic: str, partition: int, offset: int) -> Any:
        try:
            _may_change(call, topic)
            refuse_internal(topic)
            log = call.broker.engine.partition(topic, partition)
            low = await log.delete_records(offset)
            return part_cls(partition_index=partition, low_watermark=low, error_code=ErrorCode.none)
        except Exception as exc:
            code = error_code(exc, "DeleteRecords")
            return part_cls(partition_index=partition, low_watermark=-1, error_code=code)

    jobs = [
        (t.name, [asyncio.ensure_future(one(t.name, p.partition_index, p.offset))
                  for p in t.partitions])
        for t in request.topics
    ]
    topics = []
    for name, futures in jobs:
        parts = tuple(await asyncio.gather(*futures))
        topics.append(topic_cls(name=name, partitions=parts))
        for part in parts:
            _note(call, part.error_code)
    return make(cls, throttle_time=NO_THROTTLE, topics=tuple(topics))


# -- DescribeConfigs -------------------------------------------------------------------------


def _describe_topic(call: Call, name: str) -> list[tuple[str, str, int, tuple[Any, ...]]]:
    """(name, value, source, synonyms) of every config of topic `name`; a synonym is (name,
    value, source), from the topic's override down to the built-in default."""
    principal = call.principal
    if not (principal.allows("describe", topic=name)):
        raise KafkaError(
            ErrorCode.topic_authorization_failed, f"{principal.name!r} may not describe {name!r}"
        )
    engine = call.broker.engine
    state = engine.topic(name)
    server = call.broker.state.settings.topic_defaults
    defaults = engine.config.default_log_config.to_kafka()
    builtin = _builtin()
    out = []
    for key, value, source in topic_configs(state.config, state.meta.overrides, server):
        synonyms: list[tuple[str, str, int]] = []
        if key in state.meta.overrides:
            synonyms.append((key, value, TOPIC_CONFIG))
        if key in server:
            synonyms.append((broker_name(key), defaults[key], STATIC_BROKER_CONFIG))
        synonyms.append((broker_name(key), builtin[key], DEFAULT_CONFIG))
        out.append((key, value, source, tuple(synonyms)))
    return out


def _describe_broker(call: Call, name: str) -> list[tuple[str, str, int, tuple[Any, ...]]]:
    """The server's settings a Kafka broker would show as its configs: the topic defaults under
    Kafka's broker names, and the broker's identity and topic-creation settings."""
    principal = call.principal
    if not principal.may("describe"):
        raise KafkaError(
            ErrorCode.cluster_authorization_failed, f"{principal.name!r} may not describe brokers"
        )
    broker = call.broker
    if name == "":  # the cluster-wide dynamic defaults: there are none
        return []
    if not name.isdigit() or not 0 <= int(name) < broker.count:
        raise KafkaError(
            ErrorCode.invalid_request,
            f"broker {name!r}: the brokers are 0..{broker.count - 1} (or '' for the cluster)",
        )
    settings = broker.state.settings
    server = settings.topic_defaults
    builtin = _builtin()
    out: list[tuple[str, str, int, tuple[Any, ...]]] = [
        ("broker.id", name, STATIC_BROKER_CONFIG, ()),
        ("node.id", name, STATIC_BROKER_CONFIG, ()),
        ("num.partitions", str(settings.default_partitions), STATIC_BROKER_CONFIG, ()),
        ("default.replication.factor", "1", DEFAULT_CONFIG, ()),
        ("min.insync.replicas", "1", DEFAULT_CONFIG, ()),
        ("auto.create.topics.enable", "true" if settings.kafka_auto_create_topics else "false",
         STATIC_BROKER_CONFIG, ()),
        ("delete.topic.enable", "true", DEFAULT_CONFIG, ()),
    ]
    for key, value in broker.engine.config.default_log_config.to_kafka().items():
        source = STATIC_BROKER_CONFIG if key in server else DEFAULT_CONFIG
        synonyms: tuple[tuple[str, str, int], ...] = ((broker_name(key), value, source),)
        if source == STATIC_BROKER_CONFIG:
            synonyms += ((broker_name(key), builtin[key], DEFAULT_CONFIG),)
        out.append((broker_name(key), value, source, synonyms))
    return out


_BROKER_DOCS = {
    "broker.id": "this broker: the shard's index in the family",
    "node.id": "this broker: the shard's index in the family",
    "num.partitions": "partitions of a topic created without a count (EVENTLOG_DEFAULT_PARTITIONS)",
    "default.replication.factor": "eventlog keeps one replica of each partition",
    "min.insync.replicas": "eventlog keeps one replica of each partition",
    "auto.create.topics.enable": "a Metadata request for a missing topic creates it "
    "(EVENTLOG_KAFKA_AUTO_CREATE_TOPICS)",
    "delete.topic.enable": "topics can be deleted",
}
_TOPIC_NAMES = {broker_name(k): k for k in CONFIG_DEFS}


def _broker_doc(name: str) -> str | None:
    if name in _BROKER_DOCS:
        return _BROKER_DOCS[name]
    key = _TOPIC_NAMES.get(name)
    if key is None:
        return None
    return f"the default of the topic config {key} (EVENTLOG_TOPIC_DEFAULTS): {_doc(key)}"


def _broker_type(name: str) -> int:
    if name in _TOPIC_NAMES:
        return config_type(_TOPIC_NAMES[name])
    if name.endswith(".enable"):
        return BOOLEAN
    return INT


@serves(32, "DescribeConfigs", 1, 4)
async def describe_configs(call: Call, request: Any) -> Any:
    cls = call.response
    result_cls = nested(cls, "DescribeConfigsResult")
    entry_cls = nested(cls, "DescribeConfigsResourceResult")
    synonym_cls = nested(cls, "DescribeConfigsSynonym")
    synonyms_wanted = bool(getattr(request, "include_synonyms", False))
    docs_wanted = bool(getattr(request, "include_documentation", False))

    def entry(kind: int, name: str, value: str, source: int, synonyms: tuple[Any, ...]) -> Any:
        if kind == TOPIC:
            doc, ctype, read_only = _doc(name), config_type(name), False
        else:
            doc, ctype, read_only = _broker_doc(name), _broker_type(name), True
        return make(
            entry_cls, name=name, value=value, read_only=read_only, config_source=source,
            is_sensitive=False,
            synonyms=tuple(synonym_cls(name=n, value=v, source=s) for n, v, s in synonyms)
            if synonyms_wanted else (),
            config_type=ctype, documentation=doc if docs_wanted else None,
        )

    results = []
    for resource in request.resources:
        kind, name = resource.resource_type, resource.resource_name
        keys = resource.configuration_keys
        try:
            if kind == TOPIC:
                configs = _describe_topic(call, name)
            elif kind == BROKER:
                configs = _describe_broker(call, name)
            else:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    f"resource type {kind}: eventlog has topic (2) and broker (4) configs",
                )
            entries = tuple(
                entry(kind, n, v, s, syn) for n, v, s, syn in configs
                if keys is None or n in keys
            )
            code, message = ErrorCode.none, None
        except Exception as exc:
            entries, code, message = (), error_code(exc, "DescribeConfigs"), message_of(exc)
        _note(call, code)
        results.append(make(
            result_cls, error_code=code, error_message=message, resource_type=kind,
            resource_name=name, configs=entries,
        ))
    return make(cls, throttle_time=NO_THROTTLE, results=tuple(results))


# -- AlterConfigs and IncrementalAlterConfigs ------------------------------------------------


def _may_alter(call: Call, kind: int, name: str) -> None:
    if kind == TOPIC:
        _may_change(call, name)
    elif not call.principal.may("admin"):
        raise KafkaError(
            ErrorCode.cluster_authorization_failed,
            f"{call.principal.name!r} may not alter broker configs",
        )


def _refuse_broker(kind: int, configs: tuple[Any, ...]) -> None:
    """Broker configs are the server's settings, read at start: none can change over Kafka's
    protocol (an empty change changes nothing, and is answered so)."""
    if kind == BROKER:
        if configs:
            names = ", ".join(sorted({c.name for c in configs}))
            raise KafkaError(
                ErrorCode.invalid_request,
                f"cannot alter broker configs ({names}): they are the server's settings, read "
                "at start (EVENTLOG_*; topic defaults: EVENTLOG_TOPIC_DEFAULTS); alter a "
                "topic's configs instead",
            )
    elif kind != TOPIC:
        raise KafkaError(
            ErrorCode.invalid_request,
            f"resource type {kind}: eventlog has topic (2) and broker (4) configs",
        )


def _check_keys(configs: tuple[Any, ...]) -> None:
    repeated = _duplicates(c.name for c in configs)
    if repeated:
        raise KafkaError(
            ErrorCode.invalid_request,
            f"Error due to duplicate config keys: {', '.join(sorted(repeated))}",
        )


async def _alter_all(
    call: Call, request: Any, change: Callable[[Engine, Any], Awaitable[None]], what: str
) -> Any:
    """AlterConfigs and IncrementalAlterConfigs: each resource checked and changed by
    `change(engine, resource)` (topics only), answered on its own."""
    cls = call.response
    result_cls = nested(cls, "AlterConfigsResourceResponse")
    duplicated = _duplicates((r.resource_type, r.resource_name) for r in request.resources)
    results = []
    for resource in request.resources:
        kind, name = resource.resource_type, resource.resource_name
        try:
            _may_alter(call, kind, name)
            if (kind, name) in duplicated:
                raise KafkaError(ErrorCode.invalid_request, f"{name!r} is named more than once")
            _refuse_broker(kind, resource.configs)
            _check_keys(resource.configs)
            if kind == TOPIC:
                await change(call.broker.engine, resource)
            code, message = ErrorCode.none, None
        except Exception as exc:
            code, message = change_error_code(exc, what), message_of(exc)
        _note(call, code)
        results.append(make(
            result_cls, error_code=code, error_message=message, resource_type=kind,
            resource_name=name,
        ))
    return make(cls, throttle_time=NO_THROTTLE, responses=tuple(results))


@serves(33, "AlterConfigs", 0, 2)
async def alter_configs(call: Call, request: Any) -> Any:
    """A topic's whole set of overrides replaced by the request's (Kafka's semantics: a config
    not named goes back to its default)."""

    async def change(engine: Engine, resource: Any) -> None:
        configs: dict[str, str] = {}
        for c in resource.configs:
            if c.value is None:
                raise KafkaError(ErrorCode.invalid_request, f"Null value not supported: {c.name}")
            configs[c.name] = c.value
        name = resource.resource_name
        if request.validate_only:
            refuse_internal(name)
            engine.topic(name)
            engine.config.default_log_config.with_overrides(normalise_overrides(configs))
        else:
            await engine.alter_topic_configs(name, configs, replace_all=True)

    return await _alter_all(call, request, change, "AlterConfigs")


def _incremental(state: Any, configs: tuple[Any, ...]) -> dict[str, str | None]:
    """The overrides IncrementalAlterConfigs' operations change: {name: new value, or None to
    remove the override}. APPEND and SUBTRACT edit a list config's current value (its override,
    or the default), as Kafka does."""
    changes: dict[str, str | None] = {}
    current = state.config.to_kafka()
    for c in configs:
        op, key = c.config_operation, c.name
        if key not in CONFIG_DEFS:
            raise InvalidConfigError(key, c.value, "unknown topic config")
        if op == DELETE:
            changes[key] = None
            continue
        if op not in (SET, APPEND, SUBTRACT):
            raise KafkaError(ErrorCode.invalid_request, f"unknown config operation {op} for {key}")
        if c.value is None:
            raise KafkaError(ErrorCode.invalid_request, f"Null value not supported for: {key}")
        if op == SET:
            changes[key] = c.value
            continue
        if key not in LIST_CONFIGS:
            verb = "append" if op == APPEND else "subtract"
            raise InvalidConfigError(key, c.value, f"{verb} is allowed on list configs only")
        items = [v for v in current[key].split(",") if v]
        given = [v.strip() for v in c.value.split(",") if v.strip()]
        if op == APPEND:
            items += [v for v in given if v not in items]
        else:
            items = [v for v in items if v not in given]
        changes[key] = ",".join(items)
    return changes


@serves(44, "IncrementalAlterConfigs", 0, 1)
async def incremental_alter_configs(call: Call, request: Any) -> Any:
    """SET, DELETE (back to the default), APPEND and SUBTRACT (cleanup.policy) on a topic's
    overrides; the configs not named keep theirs."""

    async def change(engine: Engine, resource: Any) -> None:
        name = resource.resource_name
        refuse_internal(name)
        state = engine.topic(name)
        changes = _incremental(state, resource.configs)
        if request.validate_only:
            overrides = dict(state.meta.overrides)
            overrides.update(
                normalise_overrides({k: v for k, v in changes.items() if v is not None})
            )
            for k in [k for k, v in changes.items() if v is None]:
                overrides.pop(k, None)
            engine.config.default_log_config.with_overrides(overrides)
        else:
            await engine.alter_topic_configs(name, changes)

    return await _alter_all(call, request, change, "IncrementalAlterConfigs")
