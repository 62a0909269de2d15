"""Idempotent producers (issue 25), at N = 1 and N = 2: every client's idempotent producer
(acks=all) gets a producer id and stamps its batches with contiguous sequences, nothing twice;
on the wire, a retried batch is answered with its first offset and not appended again, a
sequence gap is OUT_OF_ORDER_SEQUENCE_NUMBER and an old epoch INVALID_PRODUCER_EPOCH, the same
through the broker that writes the partition and through one that forwards to it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

from tests.kafka_oracle import build_batch, decode_all

from .clients import CLIENTS, Client, counts_of, expected, read_raw, records_for
from .wire import Wire

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47

IDEMPOTENCE = {
    "kafka-python": {"enable_idempotence": True},
    "aiokafka": {"enable_idempotence": True},
    "confluent-kafka": {"enable.idempotence": True, "max.in.flight.requests.per.connection": 5},
    "kcat": {"enable.idempotence": "true"},
    "kafkajs": {"idempotent": True},
}


def _client(name: str) -> Client:
    client = CLIENTS[name]
    reason = client.missing()
    if reason is not None:
        pytest.skip(reason)
    return client


ROUNDS = 3


@pytest.mark.parametrize("name", list(IDEMPOTENCE))
def test_idempotent_producers_write_each_record_once(kafka_server, new_topic, name: str) -> None:
    """One idempotent producer per round (each gets its own producer id); within a producer
    the sequences of a partition's batches follow each other from 0."""
    client = _client(name)
    topic = new_topic(3)
    rounds = [
        [
            replace(r, value=None if r.value is None else r.value + f" round {n}".encode())
            for r in records_for(client, "gzip")
        ]
        for n in range(ROUNDS)
    ]
    produced = []
    for records in rounds:
        produced += client.produce(
            kafka_server.bootstrap, topic, records, "gzip", **IDEMPOTENCE[name]
        )
    records = [r for records in rounds for r in records]
    want = expected(records)
    if client.reports_offsets:
        assert sorted(produced) == sorted((r.partition, r.offset) for r in want)
    consumed = client.consume(kafka_server.bootstrap, topic, counts_of(records))
    assert [(r.partition, r.offset, r.key, r.value) for r in consumed] == [
        (r.partition, r.offset, r.key, r.value) for r in want
    ]
    producers = set()
    for p, count in counts_of(records).items():
        batches, decoded = decode_all(read_raw(kafka_server.http, topic, p))
        assert len(decoded) == count
        sequences: dict[int, int] = {}
        for batch in batches:
            assert batch.producer_id >= 0 and batch.producer_epoch >= 0, batch
            assert batch.base_sequence == sequences.get(batch.producer_id, 0), (p, batch)
            sequences[batch.producer_id] = batch.base_sequence + batch.last_offset_delta + 1
            producers.add(batch.producer_id)
    # a producer id per producer: kcat runs one (a process) per partition
    assert len(producers) == ROUNDS * (len(counts_of(records)) if name == "kcat" else 1)


def _init_producer(wire: Wire, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
    answer = wire.call(
        InitProducerIdRequest[4](
            transactional_id=None,
            transaction_timeout_ms=60_000,
            producer_id=producer_id,
            producer_epoch=epoch,
        )
    )
    assert answer.error_code == 0, answer
    return answer.producer_id, answer.producer_epoch


def _produce(wire: Wire, topic: str, partition: int, batch: bytes) -> tuple[int, int]:
    """(error code, base offset) of a Produce v9 of `batch`."""
    cls = ProduceRequest[9]
    part = cls.TopicProduceData.PartitionProduceData(index=partition, records=batch)
    answer = wire.call(
        cls(
            transactional_id=None,
            acks=-1,
            timeout_ms=10_000,
            topic_data=[cls.TopicProduceData(name=topic, partition_data=[part])],
        )
    )
    [[result]] = [t.partition_responses for t in answer.responses]
    return result.error_code, result.base_offset


def _batch(pid: int, epoch: int, sequence: int, count: int = 2) -> bytes:
    rows = [
        (f"k{sequence + i}".encode(), f"v{sequence + i}".encode(), 1_700_000_000_000, [])
        for i in range(count)
    ]
    return build_batch(rows, producer_id=pid, producer_epoch=epoch, base_sequence=sequence)


@pytest.mark.parametrize("partition", [0, 1])
def test_a_retried_batch_is_answered_with_its_offset_and_written_once(
    kafka_server, new_topic, partition: int
) -> None:
    """Sent to broker 0, whatever shard writes the partition (at N = 2 one of the two is
    forwarded: the producer state is the owner's)."""
    topic = new_topic(2)
    with Wire(kafka_server.bootstrap) as wire:
        pid, epoch = _init_producer(wire)
        first = _batch(pid, epoch, 0)
        assert _produce(wire, topic, partition, first) == (0, 0)
        assert _produce(wire, topic, partition, first) == (0, 0)  # a retry: the same answer
        assert _produce(wire, topic, partition, _batch(pid, epoch, 2)) == (0, 2)
        assert _produce(wire, topic, partition, _batch(pid, epoch, 2)) == (0, 2)
        assert (
            _produce(wire, topic, partition, _batch(pid, epoch, 7))[0]
            == OUT_OF_ORDER_SEQUENCE_NUMBER
        )
        # a new epoch (KIP-360's bump), and the old one fenced
        same_pid, bumped = _init_producer(wire, pid, epoch)
        assert (same_pid, bumped) == (pid, epoch + 1)
        assert _produce(wire, topic, partition, _batch(pid, bumped, 0)) == (0, 4)
        assert _produce(wire, topic, partition, _batch(pid, epoch, 4))[0] == INVALID_PRODUCER_EPOCH
    batches, decoded = decode_all(read_raw(kafka_server.http, topic, partition))
    assert [r.key for r in decoded] == [b"k0", b"k1", b"k2", b"k3", b"k0", b"k1"]
    assert [(b.producer_epoch, b.base_sequence) for b in batches] == [
        (epoch, 0),
        (epoch, 2),
        (bumped, 0),
    ]


@pytest.mark.parametrize("partition", [0, 1])
def test_pipelined_produce_requests_append_in_the_order_sent(
    kafka_server, new_topic, partition: int
) -> None:
    """librdkafka keeps up to 5 Produce requests in flight on a connection: the listener serves
    them together (their appends share commits) but queues their appends in the order sent, so
    an idempotent producer's sequences never arrive out of order, and answers them in order.
    A big batch (checked in a worker thread) first, small ones behind it."""
    topic = new_topic(2)
    with Wire(kafka_server.bootstrap) as wire:
        pid, epoch = _init_producer(wire)
        sizes = [12000, 2, 2, 2, 2, 2, 2, 2]  # the first over the engine's in-thread threshold
        sequence = 0
        cls = ProduceRequest[9]
        for count in sizes:
            batch = _batch(pid, epoch, sequence, count)
            part = cls.TopicProduceData.PartitionProduceData(index=partition, records=batch)
            wire.protocol.send_request(cls(
                transactional_id=None, acks=-1, timeout_ms=10_000,
                topic_data=[cls.TopicProduceData(name=topic, partition_data=[part])],
            ))
            sequence += count
        wire.sock.sendall(wire.protocol.send_bytes())  # all eight before any answer
        answers = []
        while len(answers) < len(sizes):
            data = wire.sock.recv(1 << 16)
            assert data, "the broker closed the connection"
            answers += [a for _, a in wire.protocol.receive_bytes(data)]
    results = [t.partition_responses[0] for a in answers for t in a.responses]
    assert [r.error_code for r in results] == [0] * len(sizes)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    assert [r.base_offset for r in results] == starts  # answered in order, appended in order
    batches, decoded = decode_all(read_raw(kafka_server.http, topic, partition))
    assert [b.base_sequence for b in batches] == starts
    assert len(decoded) == sum(sizes)
