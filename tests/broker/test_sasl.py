"""SASL/PLAIN with an auth file (issue 25), through every client, at N = 1 and N = 2: the token
is the password and names the principal, as a bearer token does over HTTP. A producer may
produce to its topics and not read them, a consumer the reverse (TOPIC_AUTHORIZATION_FAILED),
neither reaches a topic outside its prefixes nor sees it listed; a bad token fails the
authentication (SASL_AUTHENTICATION_FAILED, and the connection closes); nothing but ApiVersions
and the SASL requests is served before it. The server also has auto-create off: a topic that
does not exist is UNKNOWN_TOPIC_OR_PARTITION, even for an admin, and is not created.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from tests.conftest import wait_until
from tests.kafka_oracle import build_batch

from .clients import CLIENTS, Client, ClientError, Rec, counts_of, expected, read_json, records_for
from .conftest import SHARD_COUNTS, KafkaServer, start_kafka_server
from .wire import Wire

TOKENS = {"admin": "token-admin", "producer": "token-producer", "consumer": "token-consumer"}
PREFIX = "billing."
SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_SASL_MECHANISM = 33
UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC_AUTHORIZATION_FAILED = 29
CLUSTER_AUTHORIZATION_FAILED = 31
AUTH_FAILED_LINE = '"route":"SaslAuthenticate","status":58'


@pytest.fixture(scope="module", params=SHARD_COUNTS, ids=lambda n: f"N={n}")
def auth_server(request, tmp_path_factory) -> Iterator[KafkaServer]:
    tmp = tmp_path_factory.mktemp(f"kafka-auth-n{request.param}")
    auth = tmp / "auth.json"
    auth.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "ops", "token": TOKENS["admin"], "role": "admin"},
                    {
                        "name": "billing-in",
                        "token": TOKENS["producer"],
                        "role": "producer",
                        "topics": [PREFIX],
                    },
                    {
                        "name": "billing-out",
                        "token": TOKENS["consumer"],
                        "role": "consumer",
                        "topics": [PREFIX],
                    },
                ]
            }
        )
    )
    server = start_kafka_server(
        tmp / "data",
        request.param,
        token=TOKENS["admin"],
        EVENTLOG_AUTH_FILE=str(auth),
        EVENTLOG_KAFKA_AUTO_CREATE_TOPICS="false",
    )
    try:
        yield server
    finally:
        server.close()


def sasl(role: str) -> tuple[str, str]:
    return (f"user-{role}", TOKENS[role])  # the user name is not checked: the token decides


def _client(name: str) -> Client:
    client = CLIENTS[name]
    reason = client.missing()
    if reason is not None:
        pytest.skip(reason)
    return client


def _topics(server: KafkaServer) -> tuple[str, str]:
    """A topic the producer and consumer tokens cover, and one they do not."""
    return (
        server.create_topic(f"{PREFIX}{uuid.uuid4().hex[:10]}", 2),
        server.create_topic(f"orders-{uuid.uuid4().hex[:10]}", 2),
    )


# the refusal each client reports when a producer consumes: Fetch's TOPIC_AUTHORIZATION_FAILED,
# but librdkafka's consumer needs a group.id and asks for its coordinator first, which a
# producer may not (as from Kafka)
REFUSED_READ = {"confluent-kafka": {"TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED"}}
# and when a consumer produces: Produce's, or InitProducerId's for an idempotent producer
# (kafka-python's default) that may write nowhere (as from Kafka)
REFUSED_WRITE = {"TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"}


@pytest.mark.parametrize("name", list(CLIENTS))
def test_a_producer_produces_to_its_topics_only_and_reads_none(auth_server, name: str) -> None:
    client = _client(name)
    mine, other = _topics(auth_server)
    records = records_for(client, "none", partitions=2, per_partition=2)
    client.produce(auth_server.bootstrap, mine, records, "none", sasl=sasl("producer"))
    over_http = [r for p in (0, 1) for r in read_json(auth_server.http, mine, p)]
    assert [(r.partition, r.offset, r.key, r.value) for r in over_http] == [
        (r.partition, r.offset, r.key, r.value) for r in expected(records)
    ]
    with pytest.raises(ClientError) as refused:
        client.consume(auth_server.bootstrap, mine, counts_of(records), sasl=sasl("producer"))
    assert refused.value.kind in REFUSED_READ.get(name, {"TOPIC_AUTHORIZATION_FAILED"})
    with pytest.raises(ClientError) as refused:
        client.produce(auth_server.bootstrap, other, records, "none", sasl=sasl("producer"))
    assert refused.value.kind == "TOPIC_AUTHORIZATION_FAILED"
    assert read_json(auth_server.http, other, 0) == read_json(auth_server.http, other, 1) == []


@pytest.mark.parametrize("name", list(CLIENTS))
def test_a_consumer_reads_its_topics_only_and_produces_to_none(auth_server, name: str) -> None:
    client = _client(name)
    mine, _ = _topics(auth_server)
    records = records_for(client, "none", partitions=2, per_partition=2)
    CLIENTS["kafka-python"].produce(
        auth_server.bootstrap, mine, records, "none", sasl=sasl("admin")
    )
    over_http = [r for p in (0, 1) for r in read_json(auth_server.http, mine, p)]
    consumed = client.consume(
        auth_server.bootstrap, mine, counts_of(records), sasl=sasl("consumer")
    )
    assert consumed == over_http
    assert [(r.partition, r.offset, r.key, r.value) for r in consumed] == [
        (r.partition, r.offset, r.key, r.value) for r in expected(records)
    ]
    with pytest.raises(ClientError) as refused:
        client.produce(auth_server.bootstrap, mine, records, "none", sasl=sasl("consumer"))
    assert refused.value.kind in REFUSED_WRITE
    assert len(read_json(auth_server.http, mine, 0)) == counts_of(records)[0]


@pytest.mark.parametrize("name", list(CLIENTS))
def test_each_principal_lists_the_topics_it_may_describe(auth_server, name: str) -> None:
    client = _client(name)
    mine, other = _topics(auth_server)
    for role in ("producer", "consumer"):
        listed = client.list_topics(auth_server.bootstrap, sasl=sasl(role))
        assert mine in listed and other not in listed
        assert all(t.startswith(PREFIX) for t in listed), listed
    listed = client.list_topics(auth_server.bootstrap, sasl=sasl("admin"))
    assert {mine, other} <= listed
    assert not any(t.startswith("__") for t in listed)  # internal topics are not listed


@pytest.mark.parametrize("name", list(CLIENTS))
def test_a_bad_token_fails_the_authentication(auth_server, name: str) -> None:
    client = _client(name)
    before = auth_server.server.log().count(AUTH_FAILED_LINE)
    with pytest.raises(ClientError) as failed:
        client.list_topics(auth_server.bootstrap, sasl=("user-admin", "not-a-token"), timeout_s=2)
    # kafka-python and aiokafka say only that they could not connect; the others name it
    if name not in ("kafka-python", "aiokafka"):
        assert failed.value.kind == "SASL_AUTHENTICATION_FAILED"
    wait_until(
        lambda: auth_server.server.log().count(AUTH_FAILED_LINE) > before,
        timeout=10,
        what="the failed SaslAuthenticate in the access log",
    )


def _authenticate(wire: Wire, token: str, mechanism: str = "PLAIN") -> tuple[int, int]:
    """(SaslHandshake's error code, SaslAuthenticate's) for `token` as the PLAIN password."""
    handshake = wire.call(SaslHandshakeRequest[1](mechanism=mechanism))
    if handshake.error_code:
        return handshake.error_code, -1
    answer = wire.call(SaslAuthenticateRequest[2](auth_bytes=b"\0user\0" + token.encode()))
    return 0, answer.error_code


def test_sasl_on_the_wire(auth_server) -> None:
    with Wire(auth_server.bootstrap) as wire:  # a request before authenticating closes it
        with pytest.raises(ConnectionError):
            wire.call(MetadataRequest[12](topics=None))
    with Wire(auth_server.bootstrap) as wire:
        handshake = wire.call(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-256"))
        assert (handshake.error_code, handshake.mechanisms) == (
            UNSUPPORTED_SASL_MECHANISM,
            ["PLAIN"],
        )
        assert _authenticate(wire, TOKENS["consumer"]) == (0, 0)  # the client may try another
        answer = wire.call(MetadataRequest[12](topics=None))
        assert all(t.name.startswith(PREFIX) for t in answer.topics)
    with Wire(auth_server.bootstrap) as wire:
        assert _authenticate(wire, "not-a-token") == (0, SASL_AUTHENTICATION_FAILED)
        assert wire.closed_by_peer()  # as Kafka closes it


@pytest.mark.parametrize("token", [TOKENS["consumer"], "not-a-token"])
def test_sasl_handshake_v0_then_the_bare_plain_message(auth_server, token: str) -> None:
    """KIP-43's flow: after SaslHandshake v0 the PLAIN message comes alone in a frame, answered
    with an empty frame, or the connection closes."""
    with Wire(auth_server.bootstrap) as wire:
        handshake = wire.call(SaslHandshakeRequest[0](mechanism="PLAIN"))
        assert (handshake.error_code, handshake.mechanisms) == (0, ["PLAIN"])
        wire.send_frame(b"\0user\0" + token.encode())
        if token == "not-a-token":
            assert wire.read_frame() is None
            return
        assert wire.read_frame() == b""
        answer = wire.call(MetadataRequest[12](topics=None))
        assert all(t.name.startswith(PREFIX) for t in answer.topics)


def test_rights_on_the_wire(auth_server) -> None:
    """Each request's right, as Kafka's: describe for Metadata and ListOffsets, read for
    Fetch, write for InitProducerId (CLUSTER_AUTHORIZATION_FAILED: may write nowhere)."""
    mine, other = _topics(auth_server)
    with Wire(auth_server.bootstrap) as wire:
        assert _authenticate(wire, TOKENS["producer"]) == (0, 0)
        offsets = wire.call(_list_offsets(mine))
        assert [p.error_code for t in offsets.topics for p in t.partitions] == [0]
        fetched = wire.call(_fetch(mine))
        assert [p.error_code for t in fetched.responses for p in t.partitions] == [
            TOPIC_AUTHORIZATION_FAILED
        ]
        cls = MetadataRequest[12]
        answer = wire.call(cls(topics=[cls.MetadataRequestTopic(name=other)]))
        assert [t.error_code for t in answer.topics] == [TOPIC_AUTHORIZATION_FAILED]
    with Wire(auth_server.bootstrap) as wire:
        assert _authenticate(wire, TOKENS["consumer"]) == (0, 0)
        answer = wire.call(
            InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=1)
        )
        assert answer.error_code == CLUSTER_AUTHORIZATION_FAILED
        fetched = wire.call(_fetch(mine))
        assert [p.error_code for t in fetched.responses for p in t.partitions] == [0]


def _list_offsets(topic: str):
    cls = ListOffsetsRequest[7]
    part = cls.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1)
    return cls(replica_id=-1, topics=[cls.ListOffsetsTopic(name=topic, partitions=[part])])


def _fetch(topic: str):
    cls = FetchRequest[11]
    part = cls.FetchTopic.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    return cls(
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        topics=[cls.FetchTopic(topic=topic, partitions=[part])],
    )


def test_an_unknown_topic_is_not_created_with_auto_create_off(auth_server) -> None:
    """Even for an admin, who could create it (kafka_auto_create_topics=false)."""
    topic = f"{PREFIX}{uuid.uuid4().hex[:10]}"
    with Wire(auth_server.bootstrap) as wire:
        assert _authenticate(wire, TOKENS["admin"]) == (0, 0)
        cls = MetadataRequest[12]
        answer = wire.call(
            cls(topics=[cls.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=True)
        )
        assert [(t.name, t.error_code) for t in answer.topics] == [
            (topic, UNKNOWN_TOPIC_OR_PARTITION)
        ]
        produce = ProduceRequest[9]
        batch = build_batch([(b"k", b"v", 1_700_000_000_000, [])])
        answer = wire.call(
            produce(
                transactional_id=None,
                acks=-1,
                timeout_ms=10_000,
                topic_data=[
                    produce.TopicProduceData(
                        name=topic,
                        partition_data=[
                            produce.TopicProduceData.PartitionProduceData(index=0, records=batch)
                        ],
                    )
                ],
            )
        )
        [[part]] = [t.partition_responses for t in answer.responses]
        assert part.error_code == UNKNOWN_TOPIC_OR_PARTITION
    confluent = CLIENTS["confluent-kafka"]
    with pytest.raises(ClientError) as refused:
        confluent.produce(
            auth_server.bootstrap,
            topic,
            [Rec(0, b"k", b"v", (), 1)],
            "none",
            sasl=sasl("admin"),
            **{"message.timeout.ms": 2000},
        )
    assert refused.value.kind in ("UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_MSG_TIMED_OUT")
    assert auth_server.http.get(f"/v1/topics/{topic}").status_code == 404


def test_a_handshake_v0_and_its_plain_message_sent_together_without_an_auth_file(
    kafka_server,
) -> None:
    """Without an auth file a connection needs no SASL, so its requests are pipelined; a SASL
    request still waits for its answer before the next frame is read, which after SaslHandshake
    v0 is the bare PLAIN message, not a request."""
    with Wire(kafka_server.bootstrap) as wire:
        wire.protocol.send_request(SaslHandshakeRequest[0](mechanism="PLAIN"))
        wire.sock.sendall(wire.protocol.send_bytes() + _frame(b"\0user\0any-password"))
        handshake = wire.read_frame()
        assert handshake is not None and handshake[4:6] == b"\0\0"  # (correlation id, error 0)
        assert wire.read_frame() == b""
        wire.protocol = KafkaProtocol(client_id="eventlog-wire-test")  # (it read the two itself)
        answer = wire.call(MetadataRequest[12](topics=None))
        assert answer.brokers


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload
