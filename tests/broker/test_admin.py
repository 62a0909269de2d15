"""Kafka's admin APIs (broker/admin.py) through kafka-python's KafkaAdminClient, confluent-kafka's
AdminClient and raw requests (kio's messages, for the paths clients do not reach: delete by id,
duplicates, broker resources, AlterConfigs' replace-all), at N = 1 and N = 2 shards, each
change checked over HTTP as well: both protocols see one set of topics.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.admin import ConfigResource, KafkaAdminClient, NewPartitions
from kafka.admin._configs import AlterConfigOp
from kafka.errors import (
    InvalidPartitionsError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
)
from kio.index import load_request_schema, load_response_schema
from kio.schema.alter_configs.v2 import request as alter_v2
from kio.schema.create_topics.v7 import request as create_v7
from kio.schema.delete_topics.v6 import request as delete_v6
from kio.schema.describe_configs.v4 import request as describe_v4
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1 import request as incremental_v1
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

import broker.apis  # noqa: F401  (registers every API)
from broker.protocol import APIS, has, make, ms, nested
from tests.broker.conftest import KafkaServer, start_kafka_server

TIMEOUT_MS = 10_000
TOPIC, BROKER = 2, 4
TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5


def new_name() -> str:
    return f"a-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def admin(kafka_server: KafkaServer) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(
        bootstrap_servers=kafka_server.bootstrap, request_timeout_ms=TIMEOUT_MS,
        client_id="test-admin",
    )
    try:
        yield client
    finally:
        client.close()


def http_topic(kafka_server: KafkaServer, name: str) -> dict[str, Any] | None:
    response = kafka_server.http.get(f"/v1/topics/{name}")
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    return response.json()


# -- raw requests ----------------------------------------------------------------------------


def _read(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return bytes(data)


def raw(kafka_server: KafkaServer, request: Any, broker: int = 0) -> Any:
    """`request` (a kio request) sent to broker `broker`, and its parsed response."""
    key, version, flexible = request.__api_key__, request.__version__, request.__flexible__
    header_cls = RequestHeaderV2 if flexible else RequestHeaderV1
    out = io.BytesIO()
    entity_writer(header_cls)(out, header_cls(
        request_api_key=key, request_api_version=version, correlation_id=7, client_id="raw",
    ))
    entity_writer(type(request))(out, request)
    frame = out.getvalue()
    with socket.create_connection(("127.0.0.1", kafka_server.kafka_port + broker), timeout=10) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", _read(s, 4))
        data = _read(s, size)
    header, offset = entity_reader(ResponseHeaderV1 if flexible else ResponseHeaderV0)(data, 0)
    assert header.correlation_id == 7
    body, length = entity_reader(load_response_schema(key, version))(data, offset)
    assert offset + length == len(data)
    return body


def raw_create(
    kafka_server: KafkaServer, *topics: Any, validate_only: bool = False,
    timeout_ms: int = TIMEOUT_MS,
) -> Any:
    return raw(kafka_server, create_v7.CreateTopicsRequest(
        topics=topics, timeout=ms(timeout_ms), validate_only=validate_only,
    ))


def creatable(name: str, partitions: int = 1, replication: int = -1, **configs: str) -> Any:
    return create_v7.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=replication, assignments=(),
        configs=tuple(create_v7.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()),
    )


# -- CreateTopics ----------------------------------------------------------------------------


def test_create_topic_with_configs(kafka_server: KafkaServer, admin: KafkaAdminClient) -> None:
    name = new_name()
    result = admin.create_topics(
        {name: {
            "num_partitions": 3,
            "configs": {"retention.ms": "3600000", "cleanup.policy": "compact"},
        }},
        timeout_ms=TIMEOUT_MS,
    )
    (topic,) = result["topics"]
    assert (topic["error_code"], topic["num_partitions"], topic["replication_factor"]) == (0, 3, 1)
    configs = topic["configs"]
    assert configs["retention.ms"]["value"] == "3600000"
    assert configs["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert configs["cleanup.policy"]["value"] == "compact"
    assert configs["segment.bytes"]["config_source"] == "DEFAULT_CONFIG"

    seen = http_topic(kafka_server, name)
    assert seen is not None
    assert len(seen["partitions"]) == 3
    assert seen["overrides"] == {"retention.ms": "3600000", "cleanup.policy": "compact"}
    # the id the response gave is the topic's (Kafka's URL-safe base64 form over HTTP)
    assert str(uuid.UUID(topic["topic_id"])) == str(_uuid_of(seen["topic_id"]))

    # every broker knows it at once: Metadata names each partition's owner shard as leader
    (described,) = admin.describe_topics([name])
    leaders = {p["leader_id"] for p in described["partitions"]}
    assert len(described["partitions"]) == 3
    assert leaders <= set(range(kafka_server.processes))


def _uuid_of(topic_id: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4)))


def test_create_with_the_defaults(kafka_server: KafkaServer, admin: KafkaAdminClient) -> None:
    """num_partitions and replication_factor -1: the server's default partitions, one replica."""
    name = new_name()
    (topic,) = admin.create_topics([name], timeout_ms=TIMEOUT_MS)["topics"]
    assert (topic["error_code"], topic["num_partitions"], topic["replication_factor"]) == (0, 1, 1)
    seen = http_topic(kafka_server, name)
    assert seen is not None and len(seen["partitions"]) == 1 and seen["overrides"] == {}


def test_validate_only_creates_nothing(kafka_server: KafkaServer, admin: KafkaAdminClient) -> None:
    name = new_name()
    (topic,) = admin.create_topics(
        {name: {"num_partitions": 4, "configs": {"retention.ms": "1000"}}},
        validate_only=True, timeout_ms=TIMEOUT_MS,
    )["topics"]
    assert (topic["error_code"], topic["num_partitions"]) == (0, 4)
    assert topic["configs"]["retention.ms"]["value"] == "1000"
    assert http_topic(kafka_server, name) is None
    assert name not in admin.list_topics()

    # and it checks what a create would: a bad value, an existing topic, a bad count
    existing = kafka_server.create_topic(new_name(), 1)
    response = raw_create(
        kafka_server, creatable(new_name(), **{"retention.ms": "soon"}), creatable(existing),
        creatable(new_name(), partitions=0), validate_only=True,
    )
    codes = [t.error_code for t in response.topics]
    assert codes == [
        ErrorCode.invalid_config, ErrorCode.topic_already_exists, ErrorCode.invalid_partitions
    ]
    assert "retention.ms" in response.topics[0].error_message


def test_create_errors(kafka_server: KafkaServer, admin: KafkaAdminClient) -> None:
    existing = kafka_server.create_topic(new_name(), 1)
    names = [new_name() for _ in range(5)]
    response = raw_create(
        kafka_server,
        creatable(names[0], replication=3),
        creatable(names[1], replication=0),
        creatable(existing),
        creatable(names[2], **{"retention.ms": "-5"}),
        creatable(names[3], **{"no.such.config": "1"}),
        creatable("bad name!"),
        creatable("__consumer_offsets"),
    )
    by_name = {t.name: t for t in response.topics}
    rf = by_name[names[0]]
    assert rf.error_code == ErrorCode.invalid_replication_factor
    assert "one replica" in rf.error_message
    assert by_name[names[1]].error_code == ErrorCode.invalid_replication_factor
    assert by_name[existing].error_code == ErrorCode.topic_already_exists
    assert by_name[names[2]].error_code == ErrorCode.invalid_config
    assert by_name[names[3]].error_code == ErrorCode.invalid_config
    assert by_name["bad name!"].error_code == ErrorCode.invalid_topic_exception
    assert by_name["__consumer_offsets"].error_code != ErrorCode.none
    for t in response.topics:
        assert t.error_message, t
        assert (t.num_partitions, t.replication_factor, t.configs) == (-1, -1, None)
    for name in names:
        assert http_topic(kafka_server, name) is None

    # kafka-python raises the code's exception
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([existing], timeout_ms=TIMEOUT_MS)

    # manual assignments and a topic named twice
    assigned = create_v7.CreatableTopic(
        name=names[4], num_partitions=-1, replication_factor=-1, configs=(),
        assignments=(create_v7.CreatableReplicaAssignment(partition_index=0, broker_ids=(0,)),),
    )
    twice = new_name()
    response = raw_create(kafka_server, assigned, creatable(twice), creatable(twice))
    codes = [t.error_code for t in response.topics]
    assert codes == [
        ErrorCode.invalid_replica_assignment, ErrorCode.invalid_request, ErrorCode.invalid_request
    ]
    assert http_topic(kafka_server, names[4]) is None and http_topic(kafka_server, twice) is None


# -- DescribeConfigs -------------------------------------------------------------------------


def test_describe_topic_configs(kafka_server: KafkaServer, admin: KafkaAdminClient) -> None:
    name = kafka_server.create_topic(
        new_name(), 1, {"retention.ms": 86_400_000, "segment.ms": 60_000}
    )
    described = admin.describe_configs([ConfigResource("TOPIC", name)])["topic"][name]
    # kafka-python's default filter: what is set on the topic
    assert {k: v["value"] for k, v in described.items()} == {
        "retention.ms": "86400000", "segment.ms": "60000"
    }
    every = admin.describe_configs(
        [ConfigResource("TOPIC", name)], config_filter="all", include_synonyms=True
    )["topic"][name]
    assert {k: v["value"] for k, v in every.items()} == http_topic(kafka_server, name)["configs"]
    retention = every["retention.ms"]
    assert retention["config_source"] == "DYNAMIC_TOPIC_CONFIG" and not retention["read_only"]
    assert [(s["name"], s["source"]) for s in retention["synonyms"]] == [
        ("retention.ms", "DYNAMIC_TOPIC_CONFIG"), ("log.retention.ms", "DEFAULT_CONFIG")
    ]
    assert every["cleanup.policy"]["config_type"] == "LIST"
    assert every["segment.bytes"]["config_source"] == "DEFAULT_CONFIG"

    # named keys only (an unknown one is left out), documentation on request
    response = raw(kafka_server, describe_v4.DescribeConfigsRequest(
        resources=(
            describe_v4.DescribeConfigsResource(
                resource_type=TOPIC, resource_name=name,
                configuration_keys=("retention.ms", "no.such.config"),
            ),
            describe_v4.DescribeConfigsResource(
                resource_type=TOPIC, resource_name=new_name(), configuration_keys=None,
            ),
            describe_v4.DescribeConfigsResource(
                resource_type=32, resource_name="g", configuration_keys=None,
            ),
        ),
        include_synonyms=False, include_documentation=True,
    ))
    found, missing, group = response.results
    assert found.error_code == ErrorCode.none
    assert [(c.name, c.value, c.config_source) for c in found.configs] == [
        ("retention.ms", "86400000", TOPIC_CONFIG)
    ]
    assert found.configs[0].documentation
    assert missing.error_code == ErrorCode.unknown_topic_or_partition and missing.configs == ()
    assert group.error_code == ErrorCode.invalid_request and group.error_message


def test_describe_broker_configs(kafka_server: KafkaServer, admin: KafkaAdminClient) -> None:
    for node in range(kafka_server.processes):
        configs = admin.describe_configs(
            [ConfigResource("BROKER", str(node))], config_filter="all"
        )["broker"][str(node)]
        assert configs["log.retention.ms"]["value"] == "604800000"
        assert configs["log.retention.ms"]["read_only"]
        assert configs["log.retention.ms"]["config_source"] == "DEFAULT_CONFIG"
        assert configs["log.segment.bytes"]["value"] == "1073741824"
        assert configs["default.replication.factor"]["value"] == "1"
        assert configs["broker.id"]["value"] == str(node)
    response = raw(kafka_server, describe_v4.DescribeConfigsRequest(
        resources=(describe_v4.DescribeConfigsResource(
            resource_type=BROKER, resource_name="17", configuration_keys=None,
        ),),
        include_synonyms=False, include_documentation=False,
    ))
    assert response.results[0].error_code == ErrorCode.invalid_request


# -- AlterConfigs and IncrementalAlterConfigs ------------------------------------------------


def test_alter_configs_replaces_the_whole_set(
    kafka_server: KafkaServer, admin: KafkaAdminClient
) -> None:
    name = kafka_server.create_topic(new_name(), 1, {"retention.ms": 1000, "segment.ms": 60_000})

    def alter(configs: dict[str, str], validate_only: bool = False, resource_type: int = TOPIC,
              resource: str = name) -> Any:
        (result,) = raw(kafka_server, alter_v2.AlterConfigsRequest(
            resources=(alter_v2.AlterConfigsResource(
                resource_type=resource_type, resource_name=resource,
                configs=tuple(
                    alter_v2.AlterableConfig(name=k, value=v) for k, v in configs.items()
                ),
            ),),
            validate_only=validate_only,
        )).responses
        return result

    assert alter({"retention.ms": "2000"}, validate_only=True).error_code == ErrorCode.none
    assert http_topic(kafka_server, name)["overrides"] == {
        "retention.ms": "1000", "segment.ms": "60000"
    }
    assert alter({"retention.ms": "2000"}).error_code == ErrorCode.none
    # segment.ms, not named, is back to its default (Kafka's AlterConfigs)
    assert http_topic(kafka_server, name)["overrides"] == {"retention.ms": "2000"}
    bad = alter({"retention.ms": "x"})
    assert bad.error_code == ErrorCode.invalid_config and "retention.ms" in bad.error_message
    assert alter({"retention.ms": "5"}, resource=new_name()).error_code == (
        ErrorCode.unknown_topic_or_partition
    )
    broker = alter({"log.retention.ms": "5"}, resource_type=BROKER, resource="0")
    assert broker.error_code == ErrorCode.invalid_request and "EVENTLOG_" in broker.error_message
    internal = alter({"retention.ms": "5"}, resource="__consumer_offsets")
    assert internal.error_code == ErrorCode.invalid_request
    assert http_topic(kafka_server, name)["overrides"] == {"retention.ms": "2000"}

    # kafka-python's non-incremental path (it sends the other set configs along)
    result = admin.alter_configs(
        [ConfigResource("TOPIC", name, {"segment.bytes": "1048576"})], incremental=False
    )
    assert result == {"topic": {name: "OK"}}
    assert http_topic(kafka_server, name)["overrides"] == {
        "retention.ms": "2000", "segment.bytes": "1048576"
    }


def test_incremental_alter_configs(kafka_server: KafkaServer, admin: KafkaAdminClient) -> None:
    name = kafka_server.create_topic(new_name(), 1, {"retention.ms": 1000, "segment.ms": 60_000})
    result = admin.alter_configs([ConfigResource("TOPIC", name, {
        "retention.ms": "7000",
        "segment.ms": (AlterConfigOp.DELETE, None),
        "cleanup.policy": (AlterConfigOp.APPEND, "compact"),
    })])
    assert result == {"topic": {name: "OK"}}
    seen = http_topic(kafka_server, name)
    assert seen["overrides"] == {"retention.ms": "7000", "cleanup.policy": "compact,delete"}
    assert seen["configs"]["segment.ms"] == "604800000"

    result = admin.alter_configs([ConfigResource("TOPIC", name, {
        "cleanup.policy": (AlterConfigOp.SUBTRACT, "delete"),
    })])
    assert result == {"topic": {name: "OK"}}
    assert http_topic(kafka_server, name)["overrides"]["cleanup.policy"] == "compact"

    def incremental(configs: list[tuple[str, int, str | None]], validate_only: bool = False) -> Any:
        (response,) = raw(kafka_server, incremental_v1.IncrementalAlterConfigsRequest(
            resources=(incremental_v1.AlterConfigsResource(
                resource_type=TOPIC, resource_name=name,
                configs=tuple(
                    incremental_v1.AlterableConfig(name=k, config_operation=op, value=v)
                    for k, op, v in configs
                ),
            ),),
            validate_only=validate_only,
        )).responses
        return response

    checked = incremental([("retention.ms", 0, "9000")], validate_only=True)
    assert checked.error_code == ErrorCode.none
    appended = incremental([("retention.ms", 2, "9000")])  # APPEND to a config that is no list
    assert appended.error_code == ErrorCode.invalid_config
    twice = incremental([("retention.ms", 0, "1"), ("retention.ms", 1, None)])
    assert twice.error_code == ErrorCode.invalid_request
    assert incremental([("no.such", 1, None)]).error_code == ErrorCode.invalid_config
    assert incremental([("retention.ms", 0, "-7")]).error_code == ErrorCode.invalid_config
    assert http_topic(kafka_server, name)["overrides"] == {
        "retention.ms": "7000", "cleanup.policy": "compact"
    }


# -- CreatePartitions ------------------------------------------------------------------------


def test_create_partitions(kafka_server: KafkaServer, admin: KafkaAdminClient) -> None:
    name = kafka_server.create_topic(new_name(), 2)
    admin.create_partitions({name: NewPartitions(5)}, validate_only=True)
    assert len(http_topic(kafka_server, name)["partitions"]) == 2
    admin.create_partitions({name: NewPartitions(5)})
    assert len(http_topic(kafka_server, name)["partitions"]) == 5
    (described,) = admin.describe_topics([name])
    assert sorted(p["partition_index"] for p in described["partitions"]) == [0, 1, 2, 3, 4]
    with pytest.raises(InvalidPartitionsError):
        admin.create_partitions({name: NewPartitions(3)})
    response = admin.create_partitions(
        {name: NewPartitions(6, [[0]]), new_name(): NewPartitions(2)}, raise_errors=False
    )
    codes = sorted(r.error_code for r in response.results)
    assert codes == sorted([
        ErrorCode.invalid_replica_assignment, ErrorCode.unknown_topic_or_partition
    ])
    assert len(http_topic(kafka_server, name)["partitions"]) == 5


# -- DeleteRecords ---------------------------------------------------------------------------


def test_delete_records(kafka_server: KafkaServer, admin: KafkaAdminClient) -> None:
    name = kafka_server.create_topic(new_name(), 2)
    for p in (0, 1):
        response = kafka_server.http.post(
            f"/v1/topics/{name}/partitions/{p}/records",
            json={"records": [{"value": f"v{i}"} for i in range(5)]},
        )
        assert response.status_code == 200, response.text
    result = admin.delete_records(
        {TopicPartition(name, 0): 3, TopicPartition(name, 1): -1}, timeout_ms=TIMEOUT_MS
    )
    assert result[TopicPartition(name, 0)]["low_watermark"] == 3
    assert result[TopicPartition(name, 1)]["low_watermark"] == 5
    starts = [p["log_start_offset"] for p in http_topic(kafka_server, name)["partitions"]]
    assert starts == [3, 5]
    with pytest.raises(OffsetOutOfRangeError):
        admin.delete_records({TopicPartition(name, 0): 99}, timeout_ms=TIMEOUT_MS)
    assert http_topic(kafka_server, name)["partitions"][0]["log_start_offset"] == 3


# -- DeleteTopics ----------------------------------------------------------------------------


def test_delete_topics(kafka_server: KafkaServer, admin: KafkaAdminClient) -> None:
    doomed = kafka_server.create_topic(new_name(), 2)
    result = admin.delete_topics([doomed], timeout_ms=TIMEOUT_MS)
    assert [t["error_code"] for t in result["topics"]] == [0]
    assert http_topic(kafka_server, doomed) is None
    assert doomed not in admin.list_topics()

    # by id (v6), an unknown name, an unknown id, an internal topic
    by_id = kafka_server.create_topic(new_name(), 1)
    topic_id = _uuid_of(http_topic(kafka_server, by_id)["topic_id"])
    unknown = new_name()
    response = raw(kafka_server, delete_v6.DeleteTopicsRequest(
        topics=(
            delete_v6.DeleteTopicState(name=None, topic_id=topic_id),
            delete_v6.DeleteTopicState(name=unknown, topic_id=uuid.UUID(int=0)),
            delete_v6.DeleteTopicState(name=None, topic_id=uuid.uuid4()),
            delete_v6.DeleteTopicState(name="__consumer_offsets", topic_id=uuid.UUID(int=0)),
        ),
        timeout=ms(TIMEOUT_MS),
    ), broker=kafka_server.processes - 1)
    first, second, third, fourth = response.responses
    assert (first.name, first.topic_id, first.error_code) == (by_id, topic_id, ErrorCode.none)
    assert (second.name, second.error_code) == (unknown, ErrorCode.unknown_topic_or_partition)
    assert third.error_code == ErrorCode.unknown_topic_id
    assert fourth.error_code == ErrorCode.invalid_request and fourth.error_message
    assert http_topic(kafka_server, by_id) is None
    assert kafka_server.http.get("/v1/topics/__consumer_offsets").status_code == 200


def test_a_deleted_name_can_be_created_again(
    kafka_server: KafkaServer, admin: KafkaAdminClient
) -> None:
    name = kafka_server.create_topic(new_name(), 3)
    admin.delete_topics([name], timeout_ms=TIMEOUT_MS)
    (topic,) = admin.create_topics({name: {"num_partitions": 1}}, timeout_ms=TIMEOUT_MS)["topics"]
    assert topic["error_code"] == 0
    assert len(http_topic(kafka_server, name)["partitions"]) == 1


# -- confluent-kafka's AdminClient ----------------------------------------------------------


def test_confluent_admin_client(kafka_server: KafkaServer) -> None:
    admin_mod = pytest.importorskip("confluent_kafka.admin")
    from confluent_kafka import TopicPartition as CTopicPartition

    client = admin_mod.AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    name, other = new_name(), new_name()

    def done(futures: dict[Any, Any]) -> dict[Any, Any]:
        return {k: f.result(timeout=TIMEOUT_MS / 1000) for k, f in futures.items()}

    done(client.create_topics(
        [admin_mod.NewTopic(name, num_partitions=2, replication_factor=1,
                            config={"retention.ms": "120000"})],
        validate_only=True, request_timeout=10,
    ))
    assert http_topic(kafka_server, name) is None
    done(client.create_topics(
        [admin_mod.NewTopic(name, num_partitions=2, replication_factor=1,
                            config={"retention.ms": "120000"}),
         admin_mod.NewTopic(other, num_partitions=1)],
        request_timeout=10,
    ))
    assert http_topic(kafka_server, name)["overrides"] == {"retention.ms": "120000"}
    failed = client.create_topics(
        [admin_mod.NewTopic(new_name(), num_partitions=1, replication_factor=2)], request_timeout=10
    )
    with pytest.raises(Exception, match="one replica"):
        done(failed)

    resource = admin_mod.ConfigResource(admin_mod.ResourceType.TOPIC, name)
    (configs,) = done(client.describe_configs([resource])).values()
    assert configs["retention.ms"].value == "120000"
    assert configs["retention.ms"].source == admin_mod.ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["segment.bytes"].source == admin_mod.ConfigSource.DEFAULT_CONFIG.value

    change = admin_mod.ConfigResource(admin_mod.ResourceType.TOPIC, name, incremental_configs=[
        admin_mod.ConfigEntry("segment.ms", "90000",
                              incremental_operation=admin_mod.AlterConfigOpType.SET),
        admin_mod.ConfigEntry("retention.ms", None,
                              incremental_operation=admin_mod.AlterConfigOpType.DELETE),
    ])
    done(client.incremental_alter_configs([change]))
    assert http_topic(kafka_server, name)["overrides"] == {"segment.ms": "90000"}

    done(client.create_partitions([admin_mod.NewPartitions(name, 4)]))
    assert len(http_topic(kafka_server, name)["partitions"]) == 4

    for p in (0, 1):
        response = kafka_server.http.post(
            f"/v1/topics/{name}/partitions/{p}/records", json={"records": [{"value": "x"}] * 3}
        )
        assert response.status_code == 200, response.text
    deleted = done(client.delete_records(
        [CTopicPartition(name, 0, 2), CTopicPartition(name, 1, -1)]
    ))
    assert sorted(d.low_watermark for d in deleted.values()) == [2, 3]

    done(client.delete_topics([name, other], request_timeout=10))
    assert http_topic(kafka_server, name) is None and http_topic(kafka_server, other) is None


# -- aiokafka ----------------------------------------------------------------------------------


def test_aiokafka_admin_client(kafka_server: KafkaServer) -> None:
    """aiokafka's admin client speaks older versions (CreateTopics v3, DescribeConfigs v1, ...)."""
    admin_mod = pytest.importorskip("aiokafka.admin")
    from aiokafka.admin.config_resource import ConfigResource as AConfigResource
    from aiokafka.admin.config_resource import ConfigResourceType as AConfigResourceType
    from aiokafka.structs import TopicPartition as ATopicPartition

    name = new_name()

    async def run() -> None:
        client = admin_mod.AIOKafkaAdminClient(
            bootstrap_servers=kafka_server.bootstrap, request_timeout_ms=TIMEOUT_MS
        )
        await client.start()
        try:
            response = await client.create_topics([admin_mod.NewTopic(
                name, num_partitions=2, replication_factor=1,
                topic_configs={"retention.ms": "60000"},
            )])
            assert [e[1] for e in response.topic_errors] == [0]
            assert http_topic(kafka_server, name)["overrides"] == {"retention.ms": "60000"}
            (described,) = await client.describe_configs(
                [AConfigResource(AConfigResourceType.TOPIC, name)]
            )
            ((code, _, _, _, entries),) = described.resources
            assert code == 0
            assert ("retention.ms", "60000") in [(e[0], e[1]) for e in entries]
            (altered,) = await client.alter_configs([AConfigResource(
                AConfigResourceType.TOPIC, name, {"segment.ms": "70000"}
            )])
            assert [r[0] for r in altered.resources] == [0]
            assert http_topic(kafka_server, name)["overrides"] == {"segment.ms": "70000"}
            await client.create_partitions({name: admin_mod.NewPartitions(3)})
            assert len(http_topic(kafka_server, name)["partitions"]) == 3
            kafka_server.http.post(
                f"/v1/topics/{name}/partitions/0/records", json={"records": [{"value": "x"}] * 2}
            ).raise_for_status()
            low = await client.delete_records(
                {ATopicPartition(name, 0): admin_mod.RecordsToDelete(before_offset=1)}
            )
            assert low == {ATopicPartition(name, 0): 1}
            response = await client.delete_topics([name])
            assert [e[1] for e in response.topic_error_codes] == [0]
        finally:
            await client.close()

    asyncio.run(run())
    assert http_topic(kafka_server, name) is None


# -- every served version --------------------------------------------------------------------


def _request(key: int, version: int, **values: Any) -> Any:
    """A request of API `key` at `version` from the fields that version has."""
    return make(load_request_schema(key, version), **values)


def _part(key: int, version: int, cls_name: str, /, **values: Any) -> Any:
    return make(nested(load_request_schema(key, version), cls_name), **values)


def _versions(key: int) -> range:
    api = APIS[key]
    return range(api.min_version, api.max_version + 1)


def test_every_served_version_answers(kafka_server: KafkaServer) -> None:
    """One request at each served version of each admin API: it parses, is answered, and the
    answer parses (kio's classes differ per version; the handlers build all of them)."""
    name = kafka_server.create_topic(new_name(), 1, {"retention.ms": 5000})
    missing = new_name()
    for v in _versions(19):
        topic = _part(19, v, "CreatableTopic", name=new_name(), num_partitions=2,
                      replication_factor=1, assignments=(), configs=())
        response = raw(kafka_server, _request(
            19, v, topics=(topic,), timeout=ms(TIMEOUT_MS), validate_only=True,
        ))
        assert [t.error_code for t in response.topics] == [ErrorCode.none], v
    for v in _versions(32):
        resource = _part(32, v, "DescribeConfigsResource", resource_type=TOPIC, resource_name=name,
                         configuration_keys=("retention.ms",))
        response = raw(kafka_server, _request(
            32, v, resources=(resource,), include_synonyms=True, include_documentation=True,
        ))
        (result,) = response.results
        assert [(c.name, c.value) for c in result.configs] == [("retention.ms", "5000")], v
    for v in _versions(33):
        config = _part(33, v, "AlterableConfig", name="retention.ms", value="5000")
        resource = _part(33, v, "AlterConfigsResource", resource_type=TOPIC, resource_name=name,
                         configs=(config,))
        response = raw(kafka_server, _request(33, v, resources=(resource,), validate_only=True))
        assert [r.error_code for r in response.responses] == [ErrorCode.none], v
    for v in _versions(44):
        config = _part(44, v, "AlterableConfig", name="retention.ms", config_operation=0,
                       value="5000")
        resource = _part(44, v, "AlterConfigsResource", resource_type=TOPIC, resource_name=name,
                         configs=(config,))
        response = raw(kafka_server, _request(44, v, resources=(resource,), validate_only=True))
        assert [r.error_code for r in response.responses] == [ErrorCode.none], v
    for v in _versions(37):
        topic = _part(37, v, "CreatePartitionsTopic", name=name, count=2, assignments=None)
        response = raw(kafka_server, _request(
            37, v, topics=(topic,), timeout=ms(TIMEOUT_MS), validate_only=True,
        ))
        assert [r.error_code for r in response.results] == [ErrorCode.none], v
    for v in _versions(21):
        part = _part(21, v, "DeleteRecordsPartition", partition_index=0, offset=0)
        topic = _part(21, v, "DeleteRecordsTopic", name=name, partitions=(part,))
        response = raw(kafka_server, _request(21, v, topics=(topic,), timeout=ms(TIMEOUT_MS)))
        ((result,),) = [t.partitions for t in response.topics]
        assert (result.error_code, result.low_watermark) == (ErrorCode.none, 0), v
    for v in _versions(20):
        cls = load_request_schema(20, v)
        if has(cls, "topics"):
            topics = (_part(20, v, "DeleteTopicState", name=missing, topic_id=uuid.UUID(int=0)),)
            request = _request(20, v, topics=topics, timeout=ms(TIMEOUT_MS))
        else:
            request = _request(20, v, topic_names=(missing,), timeout=ms(TIMEOUT_MS))
        response = raw(kafka_server, request)
        assert [r.error_code for r in response.responses] == [
            ErrorCode.unknown_topic_or_partition
        ], v
    # validate_only changed nothing
    seen = http_topic(kafka_server, name)
    assert len(seen["partitions"]) == 1 and seen["overrides"] == {"retention.ms": "5000"}


# -- rights ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """A single-process server with an auth file: an admin and a producer of "p." topics."""
    root = tmp_path_factory.mktemp("admin-auth")
    auth = root / "auth.json"
    auth.write_text(json.dumps({"tokens": [
        {"name": "ops", "token": "admin-token", "role": "admin"},
        {"name": "app", "token": "producer-token", "role": "producer", "topics": ["p."]},
    ]}))
    server = start_kafka_server(root / "data", 1, token="admin-token", EVENTLOG_AUTH_FILE=str(auth))
    try:
        yield server
    finally:
        server.close()


def _sasl_admin(server: KafkaServer, token: str) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=server.bootstrap, request_timeout_ms=TIMEOUT_MS,
        security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
        sasl_plain_username="someone", sasl_plain_password=token,
    )


def test_changes_need_the_admin_right(auth_server: KafkaServer) -> None:
    name = auth_server.create_topic("p." + new_name(), 1, {"retention.ms": 5000})
    producer = _sasl_admin(auth_server, "producer-token")
    try:
        (refused,) = producer.create_topics(["p." + new_name()], raise_errors=False)["topics"]
        assert refused["error_code"] == ErrorCode.topic_authorization_failed
        with pytest.raises(TopicAuthorizationFailedError):
            producer.delete_topics([name], timeout_ms=TIMEOUT_MS)
        with pytest.raises(TopicAuthorizationFailedError):
            producer.delete_records({TopicPartition(name, 0): -1}, timeout_ms=TIMEOUT_MS)
        with pytest.raises(TopicAuthorizationFailedError):
            producer.create_partitions({name: NewPartitions(2)})
        result = producer.alter_configs(
            [ConfigResource("TOPIC", name, {"retention.ms": "1"})], raise_on_unknown=False
        )
        assert "TopicAuthorizationFailed" in result["topic"][name]
        # describing its own topics is the producer's right; others' are not
        seen = producer.describe_configs([ConfigResource("TOPIC", name)])["topic"][name]
        assert seen["retention.ms"]["value"] == "5000"
    finally:
        producer.close()
    topic = http_topic(auth_server, name)
    assert topic is not None and len(topic["partitions"]) == 1
    assert topic["overrides"] == {"retention.ms": "5000"}

    admin = _sasl_admin(auth_server, "admin-token")
    try:
        admin.delete_topics([name], timeout_ms=TIMEOUT_MS)
    finally:
        admin.close()
    assert http_topic(auth_server, name) is None


# -- without a server ------------------------------------------------------------------------


def test_a_change_past_the_timeout_is_answered_and_goes_on() -> None:
    """_within answers a job still running at the timeout with late(i), and the job completes
    (a topic change is never cut half-way by a request's timeout)."""
    from broker.admin import _within

    finished: list[str] = []

    async def job(name: str, seconds: float) -> str:
        await asyncio.sleep(seconds)
        finished.append(name)
        return name

    async def run() -> list[str]:
        answers = await _within(ms(50), [job("quick", 0), job("slow", 0.3)], lambda i: f"late {i}")
        assert finished == ["quick"]
        await asyncio.sleep(0.5)
        return answers

    assert asyncio.run(run()) == ["quick", "late 1"]
    assert finished == ["quick", "slow"]

    async def unbounded() -> list[str]:  # a timeout of 0 waits for every job
        return await _within(ms(0), [job("a", 0.05), job("b", 0)], lambda i: "late")

    assert asyncio.run(unbounded()) == ["a", "b"]


def test_an_unreachable_controller_is_not_controller() -> None:
    from broker.errors import change_error_code, error_code
    from engine.errors import (
        LogClosedError,
        ShardUnavailableError,
        TopicDeletedError,
        TopicExistsError,
    )

    assert change_error_code(ShardUnavailableError(0, "restarting")) == ErrorCode.not_controller
    assert change_error_code(LogClosedError("engine")) == ErrorCode.not_controller
    assert change_error_code(TopicDeletedError("p", "t")) == ErrorCode.unknown_topic_or_partition
    assert change_error_code(TopicExistsError("t")) == ErrorCode.topic_already_exists
    # elsewhere (produce, fetch) a restarting shard stays a leader change
    assert error_code(ShardUnavailableError(0, "restarting")) == ErrorCode.not_leader_or_follower
    assert ErrorCode.not_controller.retriable
