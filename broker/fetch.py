"""Fetch, ListOffsets and OffsetForLeaderEpoch: reads, on any shard, without a lock.

Fetch answers whole batches as they lie in the segment files (LogReads.fetch_slice and
read_slice: the bytes are never decoded or re-encoded), from each partition's fetch offset,
at most partition_max_bytes each and max_bytes in all, but always at least one batch for the
first partition that has data (Kafka's rule, so a batch bigger than the limits still gets
through). With less than min_bytes to answer it waits up to max_wait for any of its
partitions to grow (the waiters HTTP's long-polls use), then reads again.

Fetch sessions (KIP-227) are not kept: every answer is a full one with session id 0, which
tells a client to send full requests (as a Kafka broker does when its session cache is full).
There are no transactions, so the last stable offset is the high watermark and no batch is
ever aborted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from api.quotas import FETCH
from engine.interface import Engine, Partition

from .cluster import topic_uuid
from .errors import KafkaError, error_code
from .listener import Broker, Call
from .protocol import make, ms, nested, serves

logger = logging.getLogger("eventlog.kafka")

MAX_WAIT_MS = 300_000  # (HTTP fetch's own bound on a long-poll)


def _check_epoch(log: Partition, current_leader_epoch: int) -> None:
    """A client's current_leader_epoch is the partition's, or unknown (-1): Kafka answers a
    newer one UNKNOWN_LEADER_EPOCH and an older one FENCED_LEADER_EPOCH."""
    if current_leader_epoch < 0:
        return
    epoch = log.current_leader_epoch
    if current_leader_epoch > epoch:
        raise KafkaError(ErrorCode.unknown_leader_epoch)
    if current_leader_epoch < epoch:
        raise KafkaError(ErrorCode.fenced_leader_epoch)


def _readable(call: Call, topic: str, right: str = "read") -> None:
    principal = call.principal
    if not (principal.allows(right, topic=topic)):
        raise KafkaError(ErrorCode.topic_authorization_failed, f"no {right} access to {topic!r}")


@serves(1, "Fetch", 4, 16)
async def fetch(call: Call, request: Any) -> Any:
    broker = call.broker
    cls = call.response
    try:
        engine = broker.engine
    except Exception as exc:
        call.error = error_code(exc, "Fetch")
        return make(cls, throttle_time=ms(0), error_code=call.error, session_id=0, responses=())
    names = _topic_names(engine, request.topics, by_id=call.version >= 13)
    wait_s = min(max(int(request.max_wait.total_seconds() * 1000), 0), MAX_WAIT_MS) / 1000
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        answers, total, waits = await _read_all(call, engine, request, names)
        remaining = deadline - asyncio.get_running_loop().time()
        enough = total >= max(request.min_bytes, 1)
        if enough or remaining <= 0 or not waits or engine_stopping(broker):
            break
        await _wait_any(waits, remaining)
        if asyncio.get_running_loop().time() >= deadline:
            answers, total, waits = await _read_all(call, engine, request, names)
            break
    call.sent = total
    call.throttle_ms = broker.policy.kafka_quota(call.principal, FETCH, total)
    topic_cls = nested(cls, "FetchableTopicResponse")
    responses = []
    for t, parts in zip(request.topics, answers, strict=True):
        responses.append(make(
            topic_cls, topic=names[id(t)] or "", topic_id=getattr(t, "topic_id", None),
            partitions=tuple(parts),
        ))
    return make(
        cls, throttle_time=ms(call.throttle_ms), error_code=ErrorCode.none, session_id=0,
        responses=tuple(responses),
    )


def engine_stopping(broker: Broker) -> bool:
    return bool(broker.state.shutting_down)


def _topic_names(engine: Engine, topics: Any, by_id: bool) -> dict[int, str | None]:
    """id(FetchTopic) -> the topic's name (None: a topic id we do not know)."""
    names: dict[int, str | None] = {}
    ids = None
    for t in topics:
        if not by_id:
            names[id(t)] = t.topic
            continue
        if ids is None:
            ids = {topic_uuid(s.meta.topic_id): n for n, s in engine.topics.items()}
        names[id(t)] = ids.get(t.topic_id)
    return names


async def _read_all(
    call: Call, engine: Engine, request: Any, names: dict[int, str | None]
) -> tuple[list[list[Any]], int, list[tuple[Partition, int]]]:
    """Every partition's answer, the bytes in all, and (log, offset) of the partitions a wait
    may see grow."""
    part_cls = nested(call.response, "PartitionData")
    budget = request.max_bytes if request.max_bytes > 0 else 1 << 31
    total = 0
    waits: list[tuple[Partition, int]] = []
    answers = []
    for t in request.topics:
        name = names[id(t)]
        parts = []
        for p in t.partitions:
            data: bytes | memoryview
            data, error, log = b"", ErrorCode.none, None
            try:
                if name is None:
                    raise KafkaError(ErrorCode.unknown_topic_id)
                _readable(call, name)
                log = engine.partition(name, p.partition)
                _check_epoch(log, getattr(p, "current_leader_epoch", -1))  # (v9+)
                limit = min(p.partition_max_bytes, budget - total)
                if limit > 0 or total == 0:
                    await log.settle()
                    slice_ = log.fetch_slice(p.fetch_offset, max(limit, 1))
                    if slice_ is not None:
                        data = await log.read_slice(slice_)
                        total += len(data)
                if not data:
                    waits.append((log, p.fetch_offset))
            except Exception as exc:
                error = error_code(exc, "Fetch")
            parts.append(_partition(part_cls, p.partition, error, log, data))
        answers.append(parts)
    if total:
        metrics = call.broker.policy.metrics
        for t, parts in zip(request.topics, answers, strict=True):
            n = sum(len(x.records or b"") for x in parts)
            if n:
                metrics.fetched_bytes.labels(names[id(t)]).inc(n)
    return answers, total, waits


def _partition(
    part_cls: Any, index: int, error: ErrorCode, log: Partition | None, data: bytes | memoryview
) -> Any:
    if log is not None and error == ErrorCode.none:
        view = log.view
        hw, start = view.high_watermark, view.log_start_offset
    else:
        hw = start = -1
    return make(
        part_cls, partition_index=index, error_code=error, high_watermark=hw,
        last_stable_offset=hw, log_start_offset=start, aborted_transactions=None,
        preferred_read_replica=-1, records=data,
    )


async def _wait_any(waits: list[tuple[Partition, int]], timeout_s: float) -> None:
    """Until any of the partitions has data past its offset, or `timeout_s`."""
    tasks = [asyncio.ensure_future(log.wait_for_data(offset, timeout_s)) for log, offset in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -3, -4, -5


@serves(2, "ListOffsets", 1, 9)
async def list_offsets(call: Call, request: Any) -> Any:
    cls = call.response
    topic_cls = nested(cls, "ListOffsetsTopicResponse")
    part_cls = nested(cls, "ListOffsetsPartitionResponse")
    topics = []
    try:
        engine = call.broker.engine
    except Exception as exc:
        engine, failed = None, error_code(exc, "ListOffsets")
    for t in request.topics:
        parts = []
        for p in t.partitions:
            try:
                if engine is None:
                    raise KafkaError(failed)
                # describe, as Kafka's ListOffsets (offsets are metadata: a producer may ask
                # them; a client that may not read gets its refusal from Fetch, where every
                # client reports it, where a refused ListOffsets has aiokafka retry forever)
                _readable(call, t.name, "describe")
                log = engine.partition(t.name, p.partition_index)
                _check_epoch(log, getattr(p, "current_leader_epoch", -1))
                timestamp, offset = await _offset(log, p.timestamp)
                epoch = log.current_leader_epoch if offset >= 0 else -1
                parts.append(make(
                    part_cls, partition_index=p.partition_index, error_code=ErrorCode.none,
                    timestamp=timestamp, offset=offset, leader_epoch=epoch,
                ))
            except Exception as exc:
                code = error_code(exc, "ListOffsets")
                call.error = call.error or code
                parts.append(make(
                    part_cls, partition_index=p.partition_index, error_code=code, timestamp=-1,
                    offset=-1, leader_epoch=-1,
                ))
        topics.append(topic_cls(name=t.name, partitions=tuple(parts)))
    return make(cls, throttle_time=ms(0), topics=tuple(topics))


async def _offset(log: Partition, timestamp: int) -> tuple[int, int]:
    """(timestamp, offset) ListOffsets answers for a partition (-1 for none)."""
    view = log.view
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return -1, view.log_start_offset
    if timestamp == LATEST:
        return -1, view.high_watermark
    if timestamp == LATEST_TIERED:
        return -1, -1  # no tiered storage
    if timestamp == MAX_TIMESTAMP:
        found = await log.max_timestamp_offset()
    else:
        found = await log.offset_for_timestamp(timestamp)
    if found is None:
        return -1, -1
    offset, stamp = found
    return stamp, offset


@serves(23, "OffsetForLeaderEpoch", 2, 4)
async def offset_for_leader_epoch(call: Call, request: Any) -> Any:
    """Kafka's answer from the partition's leader-epoch history (LogReads.end_offset_for_epoch):
    a consumer checks with it that the log did not lose what it read (it never does here)."""
    cls = call.response
    topic_cls = nested(cls, "OffsetForLeaderTopicResult")
    part_cls = nested(cls, "EpochEndOffset")
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            try:
                engine = call.broker.engine
                principal = call.principal
                if not (principal.allows("describe", topic=t.topic)):
                    raise KafkaError(ErrorCode.topic_authorization_failed)
                log = engine.partition(t.topic, p.partition)
                _check_epoch(log, getattr(p, "current_leader_epoch", -1))
                epoch, end = log.end_offset_for_epoch(p.leader_epoch)
                parts.append(make(
                    part_cls, error_code=ErrorCode.none, partition=p.partition, leader_epoch=epoch,
                    end_offset=end,
                ))
            except Exception as exc:
                parts.append(make(
                    part_cls, error_code=error_code(exc, "OffsetForLeaderEpoch"),
                    partition=p.partition, leader_epoch=-1, end_offset=-1,
                ))
        topics.append(topic_cls(topic=t.topic, partitions=tuple(parts)))
    return make(cls, throttle_time=ms(0), topics=tuple(topics))
