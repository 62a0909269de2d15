"""The listener on the wire, with requests built by kafka-python's protocol classes (independent
of kio) and by hand, at N = 1 and N = 2: every version ApiVersions advertises of the APIs below
is answered; the paths no client takes on purpose: a version not served, an ApiVersions version
from the future, a frame above max_request_bytes, an unknown API; auto-created topics."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from kafka.protocol.admin import DescribeClusterRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

from tests.kafka_oracle import build_batch

from .clients import CLIENTS, Rec, read_json
from .wire import Wire

UNSUPPORTED_VERSION = 35
MAX_REQUEST_BYTES = 64 * 1024 * 1024  # the server's default (EVENTLOG_MAX_REQUEST_BYTES)


def api_versions(bootstrap: str) -> dict[int, tuple[int, int]]:
    with Wire(bootstrap) as wire:
        answer = wire.call(
            ApiVersionsRequest[3](client_software_name="t", client_software_version="1")
        )
    assert answer.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}


def _batch() -> bytes:
    return build_batch([(b"k", b"v", 1_700_000_000_000, [("h", b"x")])])


# api key -> (kafka-python's class, request(version, topic) -> message, errors(answer) -> codes)
def _metadata(v: int, topic: str) -> Any:
    cls = MetadataRequest[v]
    return cls(topics=[cls.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False)


def _fetch(v: int, topic: str, tid: Any = None) -> Any:
    cls = FetchRequest[v]
    part = cls.FetchTopic.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    named = {"topic": topic} if v < 13 else {"topic_id": tid}
    return cls(
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        topics=[cls.FetchTopic(partitions=[part], **named)],
    )


def _list_offsets(v: int, topic: str) -> Any:
    cls = ListOffsetsRequest[v]
    part = cls.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1)
    return cls(replica_id=-1, topics=[cls.ListOffsetsTopic(name=topic, partitions=[part])])


def _produce(v: int, topic: str) -> Any:
    cls = ProduceRequest[v]
    part = cls.TopicProduceData.PartitionProduceData(index=0, records=_batch())
    return cls(
        transactional_id=None,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[cls.TopicProduceData(name=topic, partition_data=[part])],
    )


def _epoch(v: int, topic: str) -> Any:
    cls = OffsetForLeaderEpochRequest[v]
    part = cls.OffsetForLeaderTopic.OffsetForLeaderPartition(partition=0, leader_epoch=0)
    return cls(replica_id=-1, topics=[cls.OffsetForLeaderTopic(topic=topic, partitions=[part])])


def _partition_errors(answer: Any, topics: str, parts: str) -> list[int]:
    return [p.error_code for t in getattr(answer, topics) for p in getattr(t, parts)]


REQUESTS: dict[int, tuple[str, Any, Any]] = {
    0: ("Produce", _produce, lambda a: _partition_errors(a, "responses", "partition_responses")),
    1: ("Fetch", _fetch, lambda a: _partition_errors(a, "responses", "partitions")),
    2: ("ListOffsets", _list_offsets, lambda a: _partition_errors(a, "topics", "partitions")),
    3: ("Metadata", _metadata, lambda a: [t.error_code for t in a.topics]),
    10: (
        "FindCoordinator",
        lambda v, t: FindCoordinatorRequest[v](key="g", key_type=0, coordinator_keys=["g"]),
        lambda a: [c.error_code for c in a.coordinators] if a.version >= 4 else [a.error_code],
    ),
    18: (
        "ApiVersions",
        lambda v, t: ApiVersionsRequest[v](client_software_name="t", client_software_version="1"),
        lambda a: [a.error_code],
    ),
    22: (
        "InitProducerId",
        lambda v, t: InitProducerIdRequest[v](transactional_id=None, transaction_timeout_ms=60_000),
        lambda a: [a.error_code],
    ),
    23: ("OffsetForLeaderEpoch", _epoch, lambda a: _partition_errors(a, "topics", "partitions")),
    60: ("DescribeCluster", lambda v, t: DescribeClusterRequest[v](), lambda a: [a.error_code]),
}


@pytest.mark.parametrize("key", sorted(REQUESTS), ids=[REQUESTS[k][0] for k in sorted(REQUESTS)])
def test_every_advertised_version_is_answered(kafka_server, new_topic, key: int) -> None:
    from .test_cross_protocol import topic_id

    topic = new_topic(1)
    advertised = api_versions(kafka_server.bootstrap)
    assert key in advertised
    low, high = advertised[key]
    if key == 0:
        low = 3  # Produce v0-2: advertised for librdkafka, not served (the next test)
    name, build, errors = REQUESTS[key]
    tid = topic_id(kafka_server.http, topic)
    with Wire(kafka_server.bootstrap) as wire:  # one connection: no answer closes it
        for version in range(low, high + 1):
            request = _fetch(version, topic, tid) if key == 1 else build(version, topic)
            answer = wire.call(request)
            assert errors(answer) and set(errors(answer)) == {0}, (name, version, answer)
    if key == 0:
        assert len(read_json(kafka_server.http, topic, 0)) == high - low + 1


def test_produce_v0_to_v2_are_advertised_but_not_served(kafka_server, new_topic) -> None:
    """As Kafka 4 (KAFKA-18659): advertised so librdkafka before 2.11.1 compresses its batches,
    refused (the connection closes, nothing is written) if a client ever sent one."""
    topic = new_topic(1)
    assert api_versions(kafka_server.bootstrap)[0][0] == 0
    for version in (0, 2):
        with Wire(kafka_server.bootstrap) as wire:
            with pytest.raises(ConnectionError):
                wire.call(_produce(version, topic))
    assert read_json(kafka_server.http, topic, 0) == []


def _api_versions_frame(version: int, correlation_id: int) -> bytes:
    client_id = b"raw-test"
    return struct.pack(">hhih", 18, version, correlation_id, len(client_id)) + client_id


def test_an_api_versions_version_from_the_future_gets_a_v0_answer(kafka_server) -> None:
    """KIP-511: UNSUPPORTED_VERSION in ApiVersions v0's layout, with what is served, so the
    client can retry with a version it finds there; the connection stays open for that."""
    advertised = api_versions(kafka_server.bootstrap)
    with Wire(kafka_server.bootstrap) as wire:
        wire.send_frame(_api_versions_frame(99, 4242))
        frame = wire.read_frame()
        assert frame is not None
        correlation_id, error, count = struct.unpack_from(">ihi", frame, 0)
        assert (correlation_id, error) == (4242, UNSUPPORTED_VERSION)
        keys = {}
        for i in range(count):
            key, low, high = struct.unpack_from(">hhh", frame, 10 + 6 * i)
            keys[key] = (low, high)
        assert len(frame) == 10 + 6 * count  # v0: nothing after the list
        assert keys == advertised
        answer = wire.call(
            ApiVersionsRequest[keys[18][1]](client_software_name="t", client_software_version="1")
        )
        assert answer.error_code == 0


@pytest.mark.parametrize("size", [MAX_REQUEST_BYTES + 1, 0, -5])
def test_a_frame_size_beyond_the_limits_closes_the_connection(kafka_server, size: int) -> None:
    """As Kafka's socket.request.max.bytes: decided from the size alone, nothing more is read."""
    with Wire(kafka_server.bootstrap) as wire:
        wire.sock.sendall(struct.pack(">i", size) + _api_versions_frame(3, 1))
        assert wire.closed_by_peer()
    assert api_versions(kafka_server.bootstrap)  # the listener goes on


def test_a_frame_at_the_limit_is_read_and_answered(kafka_server) -> None:
    """max_request_bytes itself is allowed: a frame that size is read whole and answered (the
    bytes after its body are ignored, as Kafka ignores them)."""
    with Wire(kafka_server.bootstrap) as wire:
        # v3: header v2 (tags after the client id), then two empty compact strings and tags
        payload = _api_versions_frame(3, 1) + b"\0" + b"\1\1\0"
        wire.sock.sendall(struct.pack(">i", MAX_REQUEST_BYTES) + payload)
        wire.sock.sendall(b"\0" * (MAX_REQUEST_BYTES - len(payload)))
        frame = wire.read_frame()
        assert frame is not None
        assert struct.unpack_from(">ih", frame, 0) == (1, 0)  # correlation id, no error


def test_bytes_after_a_body_are_ignored(kafka_server, new_topic) -> None:
    """As Kafka: librdkafka's Metadata v9+ for all topics carries 3 bytes after its body
    (librdkafka#5049: the topics' count written as a 4-byte placeholder, 0x00000000, whose
    first byte is the compact null). That very request is answered as the same request
    without them: every topic, on a connection that stays open."""
    topic = new_topic(1)
    client_id = b"rdkafka"
    header = struct.pack(">hhih", 3, 12, 5, len(client_id)) + client_id + b"\0"
    # topics (null), allow_auto_topic_creation, include_topic_authorized_operations, tags
    body = b"\0\0\0\0"
    answers = []
    with Wire(kafka_server.bootstrap) as wire:
        for trailing in (b"\1\0\0", b""):
            wire.send_frame(header + body + trailing)
            answers.append(wire.read_frame())
    assert answers[0] is not None and answers[0] == answers[1]
    assert topic.encode() in answers[0]


def test_an_unknown_api_closes_the_connection(kafka_server) -> None:
    with Wire(kafka_server.bootstrap) as wire:
        wire.send_frame(struct.pack(">hhih", 999, 0, 1, 0))
        assert wire.read_frame() is None


def test_metadata_creates_the_topic_a_producer_names(kafka_server) -> None:
    """auto.create.topics.enable (on by default): the server's default partition count."""
    topic = f"auto-{uuid.uuid4().hex[:12]}"
    assert kafka_server.http.get(f"/v1/topics/{topic}").status_code == 404
    CLIENTS["confluent-kafka"].produce(
        kafka_server.bootstrap, topic, [Rec(0, b"k", b"v", (), 1_700_000_000_000)], "none"
    )
    described = kafka_server.http.get(f"/v1/topics/{topic}")
    assert described.status_code == 200
    assert len(described.json()["partitions"]) == 1  # EVENTLOG_DEFAULT_PARTITIONS' default
    assert [r.value for r in read_json(kafka_server.http, topic, 0)] == [b"v"]
