"""The produce service (engine/produce.py) against a real engine, through partitions that offer
only what a shard's proxy offers (.topic, .partition, .config, .append)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from engine import produce, reader
from engine.conditions import ExpectedOffset
from engine.errors import (
    ConditionConflictError,
    IdempotencyKeyReusedError,
    InvalidFieldError,
    InvalidJsonError,
    InvalidRequestError,
    OffsetMismatchError,
    PartitionNotFoundError,
    RecordTooLargeError,
)
from engine.log_manager import EngineConfig, open_engine
from engine.partitioner import murmur2
from engine.produce import ProduceService, producer_id_for
from engine.records import encode_batch

T0 = 1_700_000_000_000


class ProxyPartition:
    """Only the proxy's surface: any other attribute the service touched would fail."""

    __slots__ = ("_log", "config", "partition", "topic")

    def __init__(self, log: Any) -> None:
        self._log, self.topic, self.partition, self.config = log, log.topic, log.partition, log.config

    async def append(self, batches, *, expected_offset=None, size=None):
        return await self._log.append(batches, expected_offset=expected_offset, size=size)

    def append_soon(self, batches, callback, *, expected_offset=None, size=None):
        self._log.append_soon(batches, callback, expected_offset=expected_offset, size=size)


class ProxyEngine:
    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def topic(self, name: str) -> Any:
        return self._engine.topic(name)

    def partition(self, topic: str, partition: int) -> ProxyPartition:
        return ProxyPartition(self._engine.partition(topic, partition))


def body(records: list[dict], **fields: Any) -> bytes:
    return orjson.dumps({"records": records, **fields})


def offsets(parts: list[bytes]) -> list[dict[str, int]]:
    return orjson.loads(b"".join(parts))["offsets"]


def as_parts(out: list[dict[str, int]]) -> list[bytes]:
    return [orjson.dumps({"offsets": out})]


def stored(engine: Any, topic: str, partition: int) -> list[tuple[int, bytes | None, bytes | None]]:
    log = engine.partition(topic, partition)
    return [(r.offset, r.key, r.value) for r in reader.read_records(log.view, 0, 10**6, 10**8).records]


async def test_keyed_records_go_where_kafka_puts_them_and_offsets_come_in_request_order(tmp_path: Path) -> None:
    async with open_engine(EngineConfig(log_dirs=(tmp_path,))) as engine:
        await engine.create_topic("t", 4)
        service = ProduceService(ProxyEngine(engine))
        keys = [f"key-{i}" for i in range(40)]
        parts, replayed = await service.produce_json(
            "t", body([{"key": k, "value": f"v{i}"} for i, k in enumerate(keys)]), answer=as_parts
        )
        out = offsets(parts)
        assert not replayed and len(out) == 40
        seen: dict[int, int] = {}
        for k, o in zip(keys, out):
            assert o["partition"] == (murmur2(k.encode()) & 0x7FFFFFFF) % 4
            assert o["offset"] == seen.get(o["partition"], 0)  # request order within each partition
            seen[o["partition"]] = o["offset"] + 1
        for p in range(4):
            want = [(o["offset"], k.encode(), f"v{i}".encode()) for i, (k, o) in enumerate(zip(keys, out)) if o["partition"] == p]
            assert stored(engine, "t", p) == want


async def test_unkeyed_records_are_spread_and_a_retry_with_the_key_lands_the_same(tmp_path: Path) -> None:
    async with open_engine(EngineConfig(log_dirs=(tmp_path,))) as engine:
        await engine.create_topic("t", 3)
        service = ProduceService(ProxyEngine(engine))
        records = [{"value": f"v{i}"} for i in range(6)]
        first, replayed = await service.produce_json("t", body(records), principal="p", idempotency_key="k1", answer=as_parts)
        assert not replayed
        assert sorted(o["partition"] for o in offsets(first)) == [0, 0, 1, 1, 2, 2]  # round robin
        again, replayed = await service.produce_json("t", body(records), principal="p", idempotency_key="k1", answer=as_parts)
        assert replayed and offsets(again) == offsets(first)
        assert sum(len(stored(engine, "t", p)) for p in range(3)) == 6  # nothing written twice
        with pytest.raises(IdempotencyKeyReusedError):  # the same key for another request
            await service.produce_json("t", body(records[:4]), principal="p", idempotency_key="k1", answer=as_parts)
        other, replayed = await service.produce_json("t", body(records), principal="q", idempotency_key="k1", answer=as_parts)
        assert not replayed  # the key is per principal
        assert producer_id_for("p", "k1") != producer_id_for("q", "k1")


async def test_conditions_and_their_refusals(tmp_path: Path) -> None:
    async with open_engine(EngineConfig(log_dirs=(tmp_path,))) as engine:
        await engine.create_topic("t", 2)
        service = ProduceService(ProxyEngine(engine))
        one = body([{"value": "a", "partition": 1}], expected_offset=0)
        parts, _ = await service.produce_json("t", one, answer=as_parts)
        assert offsets(parts)[0]["offset"] == 0
        with pytest.raises(OffsetMismatchError):
            await service.produce_json("t", one, answer=as_parts)
        cond = ExpectedOffset(1)
        b = body([{"value": "b"}])
        answer, _ = await service.produce_json("t", b, partition=1, condition=cond, answer=list)
        assert answer[0]["offset"] == 1
        # the condition fails as the body's expected_offset does: one error (the transport answers)
        with pytest.raises(OffsetMismatchError) as failed:
            await service.produce_json("t", b, partition=1, condition=cond, answer=list)
        assert (failed.value.expected, failed.value.high_watermark) == (1, 2)
        assert type(failed.value) is OffsetMismatchError
        with pytest.raises(ConditionConflictError) as conflict:
            await service.produce_json(
                "t", body([{"value": "b"}], expected_offset=2), partition=1,
                condition=ExpectedOffset(3), answer=as_parts,
            )
        assert (conflict.value.condition, conflict.value.in_body) == (3, 2)
        agreeing = body([{"value": "b"}], expected_offset=2)
        answer, _ = await service.produce_json(
            "t", agreeing, partition=1, condition=ExpectedOffset(2), answer=list
        )
        assert answer[0]["offset"] == 2
        with pytest.raises(InvalidFieldError, match="several partitions"):
            await service.produce_json(
                "t", body([{"value": "a", "partition": 0}, {"value": "b", "partition": 1}], expected_offset=0), answer=as_parts
            )
        with pytest.raises(PartitionNotFoundError):
            await service.produce_json("t", body([{"value": "a", "partition": 2}]), answer=as_parts)
        with pytest.raises(InvalidJsonError):
            await service.produce_json("t", b"{", answer=as_parts)
        with pytest.raises(InvalidRequestError, match="managed by the server"):
            await service.produce_json("__consumer_offsets", body([{"value": "a"}]), answer=as_parts)
        assert [v for _o, _k, v in stored(engine, "t", 1)] == [b"a", b"b", b"b"]
        assert stored(engine, "t", 0) == []


async def test_records_are_split_to_fit_max_message_bytes(tmp_path: Path) -> None:
    async with open_engine(EngineConfig(log_dirs=(tmp_path,))) as engine:
        await engine.create_topic("t", 1, {"max.message.bytes": 2000})
        service = ProduceService(ProxyEngine(engine))
        records = [{"key": f"k{i}", "value": "x" * 300} for i in range(20)]
        parts, _ = await service.produce_json("t", body(records), answer=as_parts)
        assert [o["offset"] for o in offsets(parts)] == list(range(20))
        log = engine.partition("t", 0)
        sizes = [h.size for s in log.view.segments for h in s.headers(0, s.size)]
        assert len(sizes) > 1 and max(sizes) <= 2000
        with pytest.raises(RecordTooLargeError):
            await service.produce_json("t", body([{"value": "x" * 3000}]), answer=as_parts)


async def test_raw_batches_are_stamped_with_the_idempotency_key(tmp_path: Path) -> None:
    async with open_engine(EngineConfig(log_dirs=(tmp_path,))) as engine:
        await engine.create_topic("t", 1)
        service = ProduceService(ProxyEngine(engine))
        batch = bytes(encode_batch(0, [(b"k", b"v", T0 + i, []) for i in range(3)]))
        first = await service.produce_raw("t", 0, bytearray(batch), principal="p", idempotency_key="r")
        assert (first.base_offset, first.last_offset, first.timestamp, first.replayed) == (0, 2, T0 + 2, False)
        again = await service.produce_raw("t", 0, bytearray(batch), principal="p", idempotency_key="r")
        assert (again.base_offset, again.last_offset, again.timestamp, again.replayed) == (0, 2, T0 + 2, True)
        segment = engine.partition("t", 0).view.segments[0]
        header = next(segment.headers(0, segment.size))
        assert header.producer_id == producer_id_for("p", "r") and header.base_sequence == 0
        own = bytes(encode_batch(0, [(b"k", b"v", T0, [])], producer_id=7, producer_epoch=0, base_sequence=0))
        with pytest.raises(InvalidFieldError, match="carry their own producer id"):
            await service.produce_raw("t", 0, bytearray(own), principal="p", idempotency_key="s")


@pytest.mark.parametrize("tasks", ["asyncio", "anyio"])
async def test_a_refusal_in_one_partition_is_the_answer_once_every_append_is_over(tmp_path: Path, tasks: str, monkeypatch) -> None:
    if tasks == "anyio":  # the task group used off asyncio
        monkeypatch.setattr(produce, "_asyncio_loop", lambda: None)
    async with open_engine(EngineConfig(log_dirs=(tmp_path,))) as engine:
        await engine.create_topic("t", 3)
        service = ProduceService(ProxyEngine(engine))
        first = [{"value": "a", "partition": 0}, {"value": "b", "partition": 1}, {"value": "c", "partition": 2}]
        await service.produce_json("t", body(first), principal="p", idempotency_key="k", answer=as_parts)
        # the same key: partition 0 replays, 1 and 2 get other records (sequence errors)
        changed = [first[0], first[1], first[1], first[2], first[2]]
        with pytest.raises(IdempotencyKeyReusedError):
            await service.produce_json("t", body(changed), principal="p", idempotency_key="k", answer=as_parts)
        assert [len(stored(engine, "t", p)) for p in range(3)] == [1, 1, 1]
        parts, replayed = await service.produce_json("t", body(first), principal="p", idempotency_key="k", answer=as_parts)
        assert replayed and [o["offset"] for o in offsets(parts)] == [0, 0, 0]
