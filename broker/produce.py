"""Produce and InitProducerId: Kafka producers append through the same engine path as HTTP's
raw produce (ProduceService.produce_raw): the batches are checked once (framing, CRC-32C,
records, codecs inflating within max_inflated_bytes_per_request), their offsets rewritten in
place, appended by the partition's single writer and made durable before the answer.

acks=1 and acks=all answer after the fsync (eventlog has one replica: the leader's durable
append is the whole in-sync set); acks=0 appends and answers nothing, as Kafka does. The
partitions of one request are appended together, so they share group commits. A partition
another shard writes is forwarded to it (a client with stale metadata still lands its
records; clients that follow Metadata send each partition to its writer directly).

Idempotent producers (enable.idempotence, the default of every client tested) get a producer
id from InitProducerId and stamp it with an epoch and sequences on their batches; the
partition's producer state (engine/producer_state.py, the same as Idempotency-Key's) answers a
retried batch with its first offsets instead of appending it twice, across restarts (it is
snapshotted and rebuilt from the log). Transactions are not served: a transactional id gets
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients treat as fatal, with the reason.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
import time
from typing import Any

from kio.schema.errors import ErrorCode

from api.quotas import PRODUCE
from engine.faults import crash_point
from engine.produce import ProduceService

from .errors import KafkaError, error_code, message_of
from .listener import Call
from .protocol import has, make, ms, nested, serves

logger = logging.getLogger("eventlog.kafka")

ACKS = (0, 1, -1)
EPOCH_MAX = 32767  # producer epochs are int16; past it the producer gets a new id


@serves(0, "Produce", 3, 11, ordered=True)
async def produce(call: Call, request: Any) -> Any:
    broker = call.broker
    policy = broker.policy
    cls = call.response
    topic_cls = nested(cls, "TopicProduceResponse")
    part_cls = nested(cls, "PartitionProduceResponse")
    principal = call.principal
    acks = request.acks
    transactional = request.transactional_id is not None
    size = sum(len(p.records or b"") for t in request.topic_data for p in t.partition_data)
    call.throttle_ms = policy.kafka_quota(principal, PRODUCE, size)
    try:
        engine = broker.engine
        if acks not in ACKS:
            raise KafkaError(ErrorCode.invalid_required_acks, f"acks={acks}: use 0, 1 or -1 (all)")
        if transactional:
            raise KafkaError(
                ErrorCode.transactional_id_authorization_failed, "transactions are not supported"
            )
    except Exception as exc:
        code, message = error_code(exc, "Produce"), message_of(exc)
        call.error = code
        return _all_failed(call, request, code, message)
    service = ProduceService(engine)
    max_inflated = broker.state.settings.max_inflated_bytes_per_request
    # the request is admitted (the connection's next one may start) once every partition's
    # append is queued or refused: pipelined requests then append in the order sent
    unqueued = [sum(len(t.partition_data) for t in request.topic_data)]

    def queued() -> None:
        unqueued[0] -= 1
        if not unqueued[0]:
            call.admit()

    async def one(topic: str, partition: int, records: Any) -> Any:
        marked = False

        def mark() -> None:
            nonlocal marked
            if not marked:
                marked = True
                queued()

        try:
            if not (principal.allows("write", topic=topic)):
                raise KafkaError(
                    ErrorCode.topic_authorization_failed, f"no write access to {topic!r}"
                )
            if not records:
                raise KafkaError(ErrorCode.corrupt_message, "no records")
            log = service.partition(topic, partition)
            result = await service.produce_raw(
                topic, partition, bytearray(records), principal=principal.name,
                max_inflated_bytes=max_inflated, queued=mark,
            )
            append_time = result.timestamp if log.config.log_append_time else -1
            return make(
                part_cls, index=partition, error_code=ErrorCode.none,
                base_offset=result.base_offset, log_append_time=_time_field(part_cls, append_time),
                log_start_offset=log.log_start_offset,
                record_errors=(), error_message=None,
            )
        except Exception as exc:
            mark()
            code = error_code(exc, "Produce")
            return make(
                part_cls, index=partition, error_code=code, base_offset=-1,
                log_append_time=_time_field(part_cls, -1), log_start_offset=-1, record_errors=(),
                error_message=message_of(exc),
            )

    jobs = [
        (t.name, [asyncio.ensure_future(one(t.name, p.index, p.records)) for p in t.partition_data])
        for t in request.topic_data
    ]
    topics = []
    for name, futures in jobs:
        parts = tuple(await asyncio.gather(*futures))
        topics.append(topic_cls(name=name, partition_responses=parts))
        for part in parts:
            if part.error_code != ErrorCode.none and not call.error:
                call.error = part.error_code
    # a crash with the request's records durable and its answer unsent: the producer retries
    # them, and its idempotence must keep them once (tests/broker/test_shard_faults.py)
    crash_point("kafka.produce.after_append")
    if acks == 0:
        call.close = bool(call.error)  # Kafka's answer to a failed acks=0 request: it closes
        return None
    return make(cls, responses=tuple(topics), throttle_time=ms(call.throttle_ms))


def _all_failed(call: Call, request: Any, code: ErrorCode, message: str) -> Any:
    cls = call.response
    topic_cls = nested(cls, "TopicProduceResponse")
    part_cls = nested(cls, "PartitionProduceResponse")
    topics = tuple(
        topic_cls(name=t.name, partition_responses=tuple(
            make(
                part_cls, index=p.index, error_code=code, base_offset=-1,
                log_append_time=_time_field(part_cls, -1), log_start_offset=-1, record_errors=(),
                error_message=message,
            )
            for p in t.partition_data
        ))
        for t in request.topic_data
    )
    if request.acks == 0:
        return None
    return make(cls, responses=topics, throttle_time=ms(call.throttle_ms))


def _time_field(part_cls: Any, timestamp_ms: int) -> Any:
    """log_append_time: a datetime in kio (None for -1, "not LogAppendTime")."""
    if not has(part_cls, "log_append_time") or timestamp_ms < 0:
        return None
    return datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)


class ProducerIds:
    """Producer ids for InitProducerId, unique across the family and across restarts without a
    write: (wall-clock ms, shard, counter) packed into 62 bits below the Idempotency-Key ids
    (engine/produce.py IDEMPOTENT_PRODUCER_BASE). The clock part never goes back within a
    process; across restarts it relies on the wall clock not going back by more than the
    process was down (ids of producers still remembered must not come again: such a producer
    would look like one that skipped sequences)."""

    SHARD_BITS = 6
    COUNTER_BITS = 10

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self._last_ms = 0
        self._counter = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            now = time.time_ns() // 1_000_000
            if now > self._last_ms:
                self._last_ms, self._counter = now, 0
            else:
                self._counter += 1
                if self._counter >> self.COUNTER_BITS:
                    self._last_ms, self._counter = self._last_ms + 1, 0
            stamp = self._last_ms
            return ((stamp << self.SHARD_BITS | self.shard) << self.COUNTER_BITS) | self._counter


@serves(22, "InitProducerId", 0, 5)
async def init_producer_id(call: Call, request: Any) -> Any:
    cls = call.response
    principal = call.principal
    code, pid, epoch = ErrorCode.none, -1, -1
    if request.transactional_id is not None:
        code = ErrorCode.transactional_id_authorization_failed
    elif not principal.may("write"):
        code = ErrorCode.cluster_authorization_failed
    else:
        ids = call.broker.producer_ids
        given = getattr(request, "producer_id", -1)
        given_epoch = getattr(request, "producer_epoch", -1)
        if given >= 0 and 0 <= given_epoch < EPOCH_MAX:
            pid, epoch = given, given_epoch + 1  # a producer bumping its epoch (KIP-360)
        else:
            pid, epoch = ids.next(), 0
    call.error = code
    return make(cls, throttle_time=ms(0), error_code=code, producer_id=pid, producer_epoch=epoch)
