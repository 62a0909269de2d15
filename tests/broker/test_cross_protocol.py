"""One log, two protocols (issue 25), at N = 1 and N = 2: records produced over Kafka are read
over HTTP at once (the produce's acknowledgement is the moment they are readable) as JSON, raw
batches, server-sent events and per-key pages, byte for byte; a Kafka Fetch answers exactly the
bytes HTTP's raw fetch answers, at every Fetch version and from every broker of the family;
records produced over HTTP (JSON or raw batches) are consumed by every Kafka client."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import replace
from typing import Any

import pytest
from kafka.protocol.consumer.fetch import FetchRequest

from tests.kafka_oracle import CODECS as CODEC_IDS
from tests.kafka_oracle import build_batch, decode_all

from .clients import (
    CLIENTS,
    Client,
    Rec,
    counts_of,
    expected,
    json_rec,
    read_json,
    read_raw,
    records_for,
)
from .wire import Wire

# Fetch v4 (the oldest served), v11 (librdkafka's), v12 (flexible), v13+ (topic ids), v16
FETCH_VERSIONS = (4, 11, 12, 13, 16)


def _client(name: str) -> Client:
    client = CLIENTS[name]
    reason = client.missing()
    if reason is not None:
        pytest.skip(reason)
    return client


def topic_id(http: Any, topic: str) -> uuid.UUID:
    """The topic's id (HTTP's text form, URL-safe base64) as the UUID Kafka's wire carries."""
    text = http.get(f"/v1/topics/{topic}").json()["topic_id"]
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def kafka_fetch(bootstrap: str, topic: str, tid: uuid.UUID, partition: int, version: int) -> bytes:
    """The record bytes a Fetch at `version` answers for `partition` from offset 0."""
    topic_cls = FetchRequest[version].FetchTopic
    part = topic_cls.FetchPartition(
        partition=partition, fetch_offset=0, partition_max_bytes=1 << 20
    )
    named = {"topic": topic} if version < 13 else {"topic_id": tid}
    request = FetchRequest[version](
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=[topic_cls(partitions=[part], **named)],
    )
    with Wire(bootstrap) as wire:
        response = wire.call(request)
    [answer] = response.responses
    [data] = answer.partitions
    assert data.error_code == 0, data
    return bytes(data.records or b"")


def read_sse(http: Any, topic: str, partition: int, count: int) -> list[Rec]:
    """The first `count` record events of the partition's event stream from offset 0 (the
    read times out, failing the test, if fewer come)."""
    out: list[Rec] = []
    event: dict[str, str] = {}
    path = f"/v1/topics/{topic}/partitions/{partition}/records/stream"
    params = {"offset": 0, "key_format": "base64", "value_format": "base64"}
    with http.stream("GET", path, params=params, timeout=10) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(":")
                event[name] = value.removeprefix(" ")
                continue
            if event.get("event") == "record":
                rec = json_rec(partition, json.loads(event["data"]))
                assert event["id"] == str(rec.offset)
                out.append(rec)
            event = {}
            if len(out) == count:
                return out
    raise AssertionError(f"the stream ended after {len(out)} of {count} records")


def read_key(http: Any, topic: str, key: bytes) -> list[Rec]:
    """The key's records, by HTTP's per-key read."""
    text = base64.urlsafe_b64encode(key).decode().rstrip("=")
    response = http.get(
        f"/v1/topics/{topic}/keys/{text}/records",
        params={"key_format": "base64", "value_format": "base64"},
    )
    assert response.status_code == 200, response.text
    page = response.json()
    return [
        json_rec(page["partition"], {"key": text + "=" * (-len(text) % 4), **r})
        for r in page["records"]
    ]


@pytest.mark.parametrize("name", ["kafka-python", "confluent-kafka"])
def test_records_produced_over_kafka_are_read_over_http_at_once(
    kafka_server, new_topic, name: str
) -> None:
    """Keyed records placed by the client's own murmur2 partitioner (Java's default; librdkafka
    needs partitioner=murmur2_random) land where HTTP's per-key reads look for them."""
    client = _client(name)
    topic = new_topic(3)
    records = [replace(r, partition=None) for r in records_for(client, "lz4")]
    config = {"partitioner": "murmur2_random"} if name == "confluent-kafka" else {}
    placed = client.produce(kafka_server.bootstrap, topic, records, "lz4", **config)
    want = sorted(
        (replace(r, partition=p, offset=o) for r, (p, o) in zip(records, placed, strict=True)),
        key=lambda r: (r.partition, r.offset),
    )
    counts = counts_of(want)
    http = kafka_server.http
    # at once: no wait, no retry, between the acknowledgement and these reads
    assert [r for p in sorted(counts) for r in read_json(http, topic, p)] == want
    assert [r for p in sorted(counts) for r in read_sse(http, topic, p, counts[p])] == want
    for key in {r.key for r in want if r.key is not None}:
        assert read_key(http, topic, key) == [r for r in want if r.key == key]
    tid = topic_id(http, topic)
    for p in counts:
        raw = read_raw(http, topic, p)
        assert [(r.offset, r.key, r.value) for r in decode_all(raw)[1]] == [
            (r.offset, r.key, r.value) for r in want if r.partition == p
        ]
        for version in FETCH_VERSIONS:
            for broker in range(kafka_server.processes):  # any broker answers a read
                bootstrap = f"127.0.0.1:{kafka_server.kafka_port + broker}"
                assert kafka_fetch(bootstrap, topic, tid, p, version) == raw, (p, version, broker)


def _json_body(records: list[Rec]) -> dict[str, Any]:
    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode()

    return {
        "key_format": "base64",
        "value_format": "base64",
        "records": [
            {
                "partition": r.partition,
                "key": b64(r.key),
                "value": b64(r.value),
                "headers": [{"key": k, "value": b64(v)} for k, v in r.headers],
                **({"timestamp": r.timestamp} if r.timestamp is not None else {}),
            }
            for r in records
        ],
    }


@pytest.mark.parametrize("name", list(CLIENTS))
def test_records_produced_over_http_are_consumed_over_kafka(
    kafka_server, new_topic, name: str
) -> None:
    client = _client(name)
    topic = new_topic(3)
    records = records_for(client, "none")
    response = kafka_server.http.post(f"/v1/topics/{topic}/records", json=_json_body(records))
    assert response.status_code == 200, response.text
    over_http = [
        r for p in sorted(counts_of(records)) for r in read_json(kafka_server.http, topic, p)
    ]
    want = expected(records)
    if not client.sets_timestamps:  # the server stamped them
        want = [replace(r, timestamp=h.timestamp) for r, h in zip(want, over_http, strict=True)]
    assert over_http == want
    assert client.consume(kafka_server.bootstrap, topic, counts_of(records)) == want


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_raw_batches_produced_over_http_are_fetched_over_kafka_as_stored(
    kafka_server, new_topic, codec: str
) -> None:
    """A batch a Kafka producer would send, posted to HTTP's raw produce, is what a Kafka Fetch
    answers, byte for byte but the base offset the log gives it, and what clients consume."""
    topic = new_topic(2)
    http = kafka_server.http
    rows = [
        (
            f"k{i}".encode(),
            None if i == 3 else (f"v{i} " * 50).encode(),
            1_700_000_000_000 + i,
            [("h", bytes([i]))],
        )
        for i in range(5)
    ]
    first = build_batch(rows[:2], codec=CODEC_IDS[codec])
    second = build_batch(rows[2:], codec=CODEC_IDS[codec])
    for batch in (first, second):
        response = http.post(
            f"/v1/topics/{topic}/partitions/1/records",
            content=batch,
            headers={"content-type": "application/vnd.kafka.record-batch.v2"},
        )
        assert response.status_code == 200, response.text
    stored = read_raw(http, topic, 1)
    assert stored[: len(first)] == first  # at offset 0: as posted
    rest = stored[len(first) :]
    assert rest[:8] == (2).to_bytes(8, "big") and rest[8:] == second[8:]  # only its offset set
    tid = topic_id(http, topic)
    for version in FETCH_VERSIONS:
        assert kafka_fetch(kafka_server.bootstrap, topic, tid, 1, version) == stored
    consumed = CLIENTS["kafka-python"].consume(kafka_server.bootstrap, topic, {1: 5})
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in consumed] == [
        (i, k, v, t, tuple(h)) for i, (k, v, t, h) in enumerate(rows)
    ]
