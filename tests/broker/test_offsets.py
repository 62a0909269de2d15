"""ListOffsets through the clients (issue 25), at N = 1 and N = 2: offsets by time (the earliest
offset whose timestamp is at least the one asked for, or none), earliest, latest and the record
with the largest timestamp, each as HTTP's offsets endpoint answers it; earliest follows the log
start when records are deleted over HTTP."""

from __future__ import annotations

import asyncio
import re
import subprocess
from typing import Any

import pytest

from .clients import CLIENTS, TIMEOUT_S, Confluent, Rec

T0 = 1_700_000_000_000
# partition 0: a timestamp out of order (offset 2 is older than offset 1); partition 1 the same
# timestamps a second later
STAMPS = {0: [T0, T0 + 2000, T0 + 1000, T0 + 3000], 1: [T0 + 1000, T0 + 3000, T0 + 2000, T0 + 4000]}
# asked -> the answer for partition 0 (the earliest offset with a timestamp >= asked; None: none)
ASKED = {
    T0 - 1: 0,
    T0: 0,
    T0 + 1: 1,
    T0 + 1000: 1,
    T0 + 2000: 1,
    T0 + 2001: 3,
    T0 + 3000: 3,
    T0 + 3001: None,
}


def _lookup(stamps: list[int], asked: int) -> int | None:
    return next((i for i, t in enumerate(stamps) if t >= asked), None)


@pytest.fixture
def timed_topic(kafka_server, new_topic) -> str:
    """A topic whose two partitions hold records with the timestamps of STAMPS."""
    topic = new_topic(2)
    records = [
        Rec(p, f"k{i}".encode(), f"v{i}".encode(), (), t)
        for p, stamps in STAMPS.items()
        for i, t in enumerate(stamps)
    ]
    CLIENTS["kafka-python"].produce(kafka_server.bootstrap, topic, records, "none")
    return topic


def test_the_lookups_are_kafkas() -> None:
    assert {asked: _lookup(STAMPS[0], asked) for asked in ASKED} == ASKED


def _http_offset(http: Any, topic: str, partition: int, **params: Any) -> dict[str, Any]:
    response = http.get(f"/v1/topics/{topic}/partitions/{partition}/offsets", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_kafka_python(kafka_server, timed_topic: str) -> None:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=kafka_server.bootstrap, group_id=None, request_timeout_ms=10_000
    )
    try:
        tps = [TopicPartition(timed_topic, p) for p in STAMPS]
        for asked in ASKED:
            found = consumer.offsets_for_times({tp: asked for tp in tps}, timeout_ms=10_000)
            for tp in tps:
                want = _lookup(STAMPS[tp.partition], asked)
                got = found[tp]
                assert (None if got is None else got.offset) == want, (tp, asked, got)
                if want is not None:
                    assert got.timestamp == STAMPS[tp.partition][want]
                http = _http_offset(kafka_server.http, timed_topic, tp.partition, timestamp=asked)
                assert http["offset"] == want
        assert consumer.beginning_offsets(tps, timeout_ms=10_000) == {tp: 0 for tp in tps}
        assert consumer.end_offsets(tps, timeout_ms=10_000) == {tp: 4 for tp in tps}
    finally:
        consumer.close()


def test_aiokafka(kafka_server, timed_topic: str) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_server.bootstrap, group_id=None, request_timeout_ms=10_000
        )
        await consumer.start()
        try:
            tps = [TopicPartition(timed_topic, p) for p in STAMPS]
            for asked in ASKED:
                found = await consumer.offsets_for_times({tp: asked for tp in tps})
                for tp in tps:
                    want = _lookup(STAMPS[tp.partition], asked)
                    got = found[tp]
                    assert (None if got is None else got.offset) == want, (tp, asked, got)
            assert await consumer.beginning_offsets(tps) == {tp: 0 for tp in tps}
            assert await consumer.end_offsets(tps) == {tp: 4 for tp in tps}
        finally:
            await consumer.stop()

    asyncio.run(asyncio.wait_for(run(), TIMEOUT_S))


def test_confluent_kafka_consumer_and_admin(kafka_server, timed_topic: str) -> None:
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    consumer = Consumer(Confluent.config(kafka_server.bootstrap, **{"group.id": "unused"}))
    try:
        for asked in ASKED:
            found = consumer.offsets_for_times(
                [TopicPartition(timed_topic, p, asked) for p in STAMPS], timeout=10
            )
            for tp in found:
                assert tp.error is None
                want = _lookup(STAMPS[tp.partition], asked)
                assert tp.offset == (OFFSET_END if want is None else want), (tp, asked)
        for p in STAMPS:
            assert consumer.get_watermark_offsets(TopicPartition(timed_topic, p), timeout=10) == (
                0,
                4,
            )
    finally:
        consumer.close()

    admin = AdminClient(Confluent.config(kafka_server.bootstrap))
    specs = {
        "earliest": (OffsetSpec.earliest(), lambda p: 0),
        "latest": (OffsetSpec.latest(), lambda p: 4),
        "max_timestamp": (OffsetSpec.max_timestamp(), lambda p: 3),
        "for_timestamp": (
            OffsetSpec.for_timestamp(T0 + 2500),
            lambda p: _lookup(STAMPS[p], T0 + 2500),
        ),
    }
    for what, (spec, want) in specs.items():
        futures = admin.list_offsets(
            {TopicPartition(timed_topic, p): spec for p in STAMPS}, request_timeout=10
        )
        for tp, future in futures.items():
            info = future.result(timeout=TIMEOUT_S)
            assert info.offset == want(tp.partition), (what, tp, info)
            if what == "max_timestamp":
                assert info.timestamp == max(STAMPS[tp.partition])
                http = _http_offset(
                    kafka_server.http, timed_topic, tp.partition, spec="max_timestamp"
                )
                assert (http["offset"], http["timestamp"]) == (info.offset, info.timestamp)


def test_kcat_query(kafka_server, timed_topic: str) -> None:
    kcat = CLIENTS["kcat"]
    if kcat.missing():
        pytest.skip(kcat.missing())
    for asked in (T0, T0 + 1500, T0 + 3001):
        args = ["kcat", "-b", kafka_server.bootstrap, "-m", "10", "-Q"]
        for p in STAMPS:
            args += ["-t", f"{timed_topic}:{p}:{asked}"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        found = {int(p): int(o) for p, o in re.findall(r"\[(\d+)\] offset (-?\d+)", done.stdout)}
        # none: librdkafka's OFFSET_END (-1)
        assert found == {
            p: (-1 if (o := _lookup(s, asked)) is None else o) for p, s in STAMPS.items()
        }


def test_earliest_follows_records_deleted_over_http(kafka_server, timed_topic: str) -> None:
    from kafka import KafkaConsumer, TopicPartition

    response = kafka_server.http.post(
        f"/v1/topics/{timed_topic}/partitions/1/delete-records", json={"before_offset": 2}
    )
    assert response.status_code == 200, response.text
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_server.bootstrap, group_id=None, request_timeout_ms=10_000
    )
    try:
        tps = [TopicPartition(timed_topic, p) for p in STAMPS]
        assert consumer.beginning_offsets(tps, timeout_ms=10_000) == {tps[0]: 0, tps[1]: 2}
        # by time: the records left (offset 2 has T0 + 2000, the earliest remaining >= T0)
        found = consumer.offsets_for_times({tps[1]: T0}, timeout_ms=10_000)
        assert found[tps[1]].offset == 2
        consumer.assign([tps[1]])
        consumer.seek_to_beginning()
        polled: list[Any] = []
        for _ in range(50):
            polled += [m for ms in consumer.poll(timeout_ms=200).values() for m in ms]
            if len(polled) >= 2:
                break
        assert [m.offset for m in polled] == [2, 3]
    finally:
        consumer.close()
