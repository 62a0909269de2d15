"""A generated SDK: openapi-python-client run on the live /openapi.json, used the way a team would.

The app runs with an auth file (the document declares bearer security, so the SDK's
operations take an AuthenticatedClient), in this process: the SDK's clients get its transport.
The SDK is generated once for the module; each test has an app of its own. The client raises on
any status the document does not list, so every response here is also checked against the
documented status codes.
"""

from __future__ import annotations

import importlib
import inspect
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from engine.partitioner import partition_for_key

from ..conftest import VENV_BIN
from ..inprocess import ASGITransport, InProcessServer
from ..kafka_oracle import build_batch

PACKAGE = "eventlog_client"
ADMIN_TOKEN = "admin-token-0123456789"
CONSUMER_TOKEN = "consumer-token-0123456789"

# operationId -> the module openapi-python-client makes of it, under api/<tag>/: renaming an
# operation id (or a tag) renames a module that teams import, so this test fails first
OPERATIONS = {
    "topics": {
        "createTopic": "create_topic",
        "listTopics": "list_topics",
        "describeTopic": "describe_topic",
        "alterTopicConfigs": "alter_topic_configs",
        "addPartitions": "add_partitions",
        "deleteTopic": "delete_topic",
    },
    "records": {
        "produceRecords": "produce_records",
        "produceToPartition": "produce_to_partition",
        "fetchRecords": "fetch_records",
        "streamRecords": "stream_records",
    },
    "keys": {
        "readKeyRecords": "read_key_records",
        "appendKeyRecords": "append_key_records",
        "streamKeyRecords": "stream_key_records",
    },
    "offsets": {
        "listOffsets": "list_offsets",
        "deleteRecords": "delete_records",
        "listSegments": "list_segments",
    },
    "snapshots": {
        "createSnapshot": "create_snapshot",
        "listSnapshots": "list_snapshots",
        "describeSnapshot": "describe_snapshot",
        "deleteSnapshot": "delete_snapshot",
    },
    "admin": {
        "runRetention": "run_retention",
        "runCompaction": "run_compaction",
    },
    "groups": {
        "commitGroupOffsets": "commit_group_offsets",
        "fetchGroupOffsets": "fetch_group_offsets",
        "deleteGroupOffsets": "delete_group_offsets",
        "listGroups": "list_groups",
    },
    "health": {
        "getHealth": "get_health",
        "getReadiness": "get_readiness",
        "getMetrics": "get_metrics",
    },
}

# No post-hooks (they would run ruff, which need not be installed, and format nothing we test).
# No content-type overrides: openapi-python-client knows JSON, +json, text/*, octet-stream and
# forms, and skips the raw Kafka batch's vendor type; the document offers raw batches as
# application/octet-stream too, which is what the SDK sends.
GENERATOR_CONFIG = """\
post_hooks: []
package_name_override: eventlog_client
"""


@dataclass
class SDK:
    server: InProcessServer
    root: Path
    document: dict[str, Any]

    def op(self, tag: str, name: str) -> ModuleType:
        return importlib.import_module(f"{PACKAGE}.api.{tag}.{name}")

    @property
    def models(self) -> ModuleType:
        return importlib.import_module(f"{PACKAGE}.models")

    @property
    def types(self) -> ModuleType:
        return importlib.import_module(f"{PACKAGE}.types")

    def client(self, token: str = ADMIN_TOKEN) -> Any:
        package = importlib.import_module(PACKAGE)
        return package.AuthenticatedClient(
            base_url=self.server.url, token=token, raise_on_unexpected_status=True, timeout=httpx.Timeout(30),
            httpx_args=self.httpx_args(),
        )

    def httpx_args(self) -> dict[str, Any]:
        runner = getattr(self.server, "runner", None)
        if runner is None:  # a real server (EVENTLOG_TEST_PROCESSES: a shard family)
            return {}
        return {"transport": ASGITransport(runner)}


def _import_unset(package: Path) -> list[str]:
    """openapi-python-client 0.29 annotates the body of an operation with several request
    content types (produceToPartition: JSON or raw batches) as `A | B | Unset = UNSET` without
    importing Unset (openapi-generators/openapi-python-client#1451, open): add the import."""
    patched = []
    for module in sorted((package / "api").rglob("*.py")):
        text = module.read_text()
        if re.search(r"\| Unset\b", text) and not re.search(r"^from \.\.\.types import .*\bUnset\b", text, re.MULTILINE):
            module.write_text("from ...types import Unset\n" + text)
            patched.append(module.stem)
    return patched


def _forget_package() -> None:
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def _write_auth_file(path: Path) -> Path:
    path.write_text(json.dumps({"tokens": [
        {"name": "ops", "token": ADMIN_TOKEN, "role": "admin"},
        {"name": "analytics", "token": CONSUMER_TOKEN, "role": "consumer", "topics": ["orders"]},
    ]}))
    return path


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The SDK generated from the document of an app with an auth file: (root, document)."""
    tmp_path = tmp_path_factory.mktemp("sdk")
    auth_file = _write_auth_file(tmp_path / "auth.json")
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("EVENTLOG_"):
                mp.delenv(name)
        server = InProcessServer(tmp_path / "data", env={"EVENTLOG_AUTH_FILE": str(auth_file)}).start()
    try:
        with server.client(token=ADMIN_TOKEN) as c:
            response = c.get("/openapi.json")
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    document = response.json()
    (tmp_path / "openapi.json").write_bytes(response.content)
    (tmp_path / "generator.yml").write_text(GENERATOR_CONFIG)
    root = tmp_path / "sdk"
    generated = subprocess.run(
        [
            str(VENV_BIN / "openapi-python-client"), "generate",
            "--path", str(tmp_path / "openapi.json"),
            "--output-path", str(root / PACKAGE),
            "--meta", "none",
            "--config", str(tmp_path / "generator.yml"),
            "--fail-on-warning",  # an operation the generator cannot type is a failure
        ],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )
    assert generated.returncode == 0, generated.stdout + generated.stderr
    assert _import_unset(root / PACKAGE) in ([], ["produce_to_partition"])
    _forget_package()
    sys.path.insert(0, str(root))
    try:
        yield root, document
    finally:
        sys.path.remove(str(root))
        _forget_package()
        importlib.invalidate_caches()


@pytest.fixture
def sdk(generated: tuple[Path, dict[str, Any]], app_factory, tmp_path: Path) -> Iterator[SDK]:
    """The generated SDK and a fresh app (with the same auth file) to use it on."""
    root, document = generated
    server = app_factory(EVENTLOG_AUTH_FILE=str(_write_auth_file(tmp_path / "auth.json"))).start(token=ADMIN_TOKEN)
    try:
        yield SDK(server, root, document)
    finally:
        server.stop()


def test_one_module_per_operation_named_after_its_operation_id(sdk: SDK) -> None:
    ids = {op["operationId"]: op["tags"] for ops in sdk.document["paths"].values() for op in ops.values()}
    assert ids == {op_id: [tag] for tag, ops in OPERATIONS.items() for op_id in ops}
    api_dir = sdk.root / PACKAGE / "api"
    assert {p.name for p in api_dir.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(OPERATIONS)
    for tag, ops in OPERATIONS.items():
        modules = {p.stem for p in (api_dir / tag).glob("*.py") if p.stem != "__init__"}
        assert modules == set(ops.values()), tag
        for module_name in ops.values():
            module = sdk.op(tag, module_name)
            for fn in ("sync", "sync_detailed", "asyncio", "asyncio_detailed"):
                assert callable(getattr(module, fn)), f"{module_name}.{fn}"
    # the hand-parsed produce bodies are still typed by the ProduceRequest model
    for module_name in ("produce_records", "produce_to_partition"):
        body = inspect.signature(sdk.op("records", module_name).sync).parameters["body"].annotation
        assert "ProduceRequest" in str(body), (module_name, body)
    models = sdk.models
    for model in ("ProduceRequest", "ProduceRecord", "RecordHeader", "Problem", "ProduceResponse",
                  "PartitionProduceResponse", "FetchResponse", "PartitionOffsets", "GroupOffsets"):
        assert hasattr(models, model), model


def test_an_aggregate_through_the_sdk_per_key_streams(sdk: SDK) -> None:
    """Per-key appends with If-None-Match / If-Match, the key's history and its ETag, a stale
    write refused with 412, through the generated client."""
    m = sdk.models
    append = sdk.op("keys", "append_key_records")
    read = sdk.op("keys", "read_key_records")
    with sdk.client() as client:
        sdk.op("topics", "create_topic").sync(client=client, body=m.TopicCreate(name="carts", partitions=3))
        created = append.sync_detailed(
            topic="carts", key="cart/7", client=client, if_none_match="*",
            body=m.KeyProduceRequest(records=[m.KeyRecord(value={"type": "created"})], value_format=m.Format.JSON),
        )
        assert created.status_code == 200, created.content
        assert isinstance(created.parsed, m.KeyProduceResponse)
        assert created.parsed.partition == partition_for_key(b"cart/7", 3) and created.headers["etag"] == f'"{created.parsed.last_offset}"'
        page = read.sync_detailed(topic="carts", key="cart/7", client=client, value_format=m.Format.JSON)
        assert isinstance(page.parsed, m.KeyRecordsResponse) and page.headers["etag"] == created.headers["etag"]
        assert [r.value for r in page.parsed.records] == [{"type": "created"}] and page.parsed.latest_offset == created.parsed.last_offset
        paid = append.sync_detailed(
            topic="carts", key="cart/7", client=client, if_match=page.headers["etag"],
            body=m.KeyProduceRequest(records=[m.KeyRecord(value="paid")]),
        )
        assert paid.status_code == 200
        stale = append.sync_detailed(
            topic="carts", key="cart/7", client=client, if_match=page.headers["etag"],
            body=m.KeyProduceRequest(records=[m.KeyRecord(value="cancelled")]),
        )
        assert stale.status_code == 412 and stale.parsed.code == "key_version_mismatch"
        values = [r.value for r in read.sync(topic="carts", key="cart/7", client=client).records]
        assert values == ['{"type":"created"}', "paid"]


def test_topics_produce_fetch_offsets_and_groups_through_the_sdk(sdk: SDK) -> None:
    m = sdk.models
    with sdk.client() as client:
        # topics
        created = sdk.op("topics", "create_topic").sync(
            client=client,
            body=m.TopicCreate(name="orders", partitions=3, configs=m.TopicCreateConfigs.from_dict({"retention.ms": 86_400_000})),
        )
        assert isinstance(created, m.Topic), created
        assert (created.name, created.partitions, created.configs["retention.ms"]) == ("orders", 3, "86400000")
        assert isinstance(sdk.op("topics", "create_topic").sync(client=client, body=m.TopicCreate(name="events", partitions=1)), m.Topic)
        listed = sdk.op("topics", "list_topics").sync(client=client)
        assert [(t.name, t.partitions) for t in listed.topics] == [("events", 1), ("orders", 3)]

        # produce with keys, values and headers; murmur2 chooses the partition
        sent = [
            m.ProduceRecord(
                key=f"user-{i}", value=f"value-{i}", timestamp=1_000 + i,
                headers=[m.RecordHeader(key="source", value="sdk"), m.RecordHeader(key="seq", value=str(i)), m.RecordHeader(key="none", value=None)],
            )
            for i in range(12)
        ]
        produced = sdk.op("records", "produce_records").sync(topic="orders", client=client, body=m.ProduceRequest(records=sent))
        assert isinstance(produced, m.ProduceResponse), produced
        assert [o.partition for o in produced.offsets] == [partition_for_key(f"user-{i}".encode(), 3) for i in range(12)]
        assert [o.timestamp for o in produced.offsets] == [1_000 + i for i in range(12)]

        # fetch every partition back and compare record by record
        fetched = {}
        for p in range(3):
            page = sdk.op("records", "fetch_records").sync(topic="orders", partition=p, client=client, offset=0)
            assert isinstance(page, m.FetchResponse), page
            assert page.next_offset == page.high_watermark == len(page.records) and page.log_start_offset == 0
            for r in page.records:
                fetched[(p, r.offset)] = (r.key, r.value, r.timestamp, [(h.key, h.value) for h in r.headers])
        assert fetched == {
            (o.partition, o.offset): (s.key, s.value, s.timestamp, [(h.key, h.value) for h in s.headers])
            for o, s in zip(produced.offsets, sent)
        }

        # other formats: base64 keys, JSON values and header values
        produced = sdk.op("records", "produce_records").sync(
            topic="events", client=client,
            body=m.ProduceRequest(
                records=[
                    m.ProduceRecord(key="AAEC/w==", value={"n": i, "tags": ["a", None]}, timestamp=2_000 + i,
                                    headers=[m.RecordHeader(key="h", value=[i])])
                    for i in range(10)
                ],
                key_format=m.Format.BASE64, value_format=m.Format.JSON,
            ),
        )
        assert [(o.partition, o.offset) for o in produced.offsets] == [(0, i) for i in range(10)]
        page = sdk.op("records", "fetch_records").sync(
            topic="events", partition=0, client=client, offset=3, max_records=2,
            key_format=m.Format.BASE64, value_format=m.Format.JSON,
        )
        assert [(r.offset, r.key, r.value, r.timestamp, [(h.key, h.value) for h in r.headers]) for r in page.records] == [
            (3, "AAEC/w==", {"n": 3, "tags": ["a", None]}, 2_003, [("h", [3])]),
            (4, "AAEC/w==", {"n": 4, "tags": ["a", None]}, 2_004, [("h", [4])]),
        ]
        assert page.next_offset == 5

        # one partition: JSON records, then a raw Kafka v2 batch
        to_partition = sdk.op("records", "produce_to_partition")
        one = to_partition.sync(
            topic="events", partition=0, client=client,
            body=m.ProduceRequest(records=[m.ProduceRecord(key=None, value="x", timestamp=3_000), m.ProduceRecord(value=None, timestamp=3_001)]),
        )
        assert isinstance(one, m.PartitionProduceResponse), one
        assert (one.partition, one.base_offset, one.last_offset, one.timestamp) == (0, 10, 11, 3_001)
        batch = build_batch([(b"k", b"raw", 4_000, [("h", b"v")]), (None, b"raw2", 4_001, [])])
        raw = to_partition.sync(
            topic="events", partition=0, client=client, body=sdk.types.File(payload=io.BytesIO(batch)),
        )
        assert (raw.base_offset, raw.last_offset, raw.timestamp) == (12, 13, 4_001)
        page = sdk.op("records", "fetch_records").sync(topic="events", partition=0, client=client, offset=10)
        assert [(r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in page.records] == [
            (10, None, "x", []), (11, None, None, []), (12, "k", "raw", [("h", "v")]), (13, None, "raw2", []),
        ]

        # ListOffsets: by timestamp, by spec, and the plain partition offsets
        list_offsets = sdk.op("offsets", "list_offsets")
        by_time = list_offsets.sync(topic="events", partition=0, client=client, timestamp=2_005)
        assert isinstance(by_time, m.PartitionOffsets), by_time
        assert (by_time.offset, by_time.timestamp) == (5, 2_005)
        assert (by_time.log_start_offset, by_time.high_watermark, by_time.log_end_offset) == (0, 14, 14)
        later = list_offsets.sync(topic="events", partition=0, client=client, timestamp=10**12)
        assert (later.offset, later.timestamp) == (None, None)
        assert list_offsets.sync(topic="events", partition=0, client=client, spec=m.OffsetSpec.LATEST).offset == 14
        newest = list_offsets.sync(topic="events", partition=0, client=client, spec=m.OffsetSpec.MAX_TIMESTAMP)
        assert (newest.offset, newest.timestamp) == (13, 4_001)

        # consumer-group offsets: commit, fetch, list, delete
        committed = sdk.op("groups", "commit_group_offsets").sync(
            group="billing", client=client,
            body=m.GroupOffsetsCommit(offsets=[
                m.GroupOffset(topic="events", partition=0, offset=5, metadata="checkpoint"),
                m.GroupOffset(topic="orders", partition=2, offset=1),
            ]),
        )
        assert isinstance(committed, m.GroupOffsets), committed
        got = sdk.op("groups", "fetch_group_offsets").sync(group="billing", client=client)
        assert sorted((o.topic, o.partition, o.offset, o.metadata) for o in got.offsets) == [
            ("events", 0, 5, "checkpoint"), ("orders", 2, 1, ""),
        ]
        assert [(o.topic, o.offset) for o in sdk.op("groups", "fetch_group_offsets").sync(group="billing", client=client, topic="orders").offsets] == [("orders", 1)]
        assert sdk.op("groups", "list_groups").sync(client=client).groups == ["billing"]
        deleted = sdk.op("groups", "delete_group_offsets").sync_detailed(group="billing", client=client, topic="orders")
        assert deleted.status_code == HTTPStatus.NO_CONTENT
        assert [o.topic for o in sdk.op("groups", "fetch_group_offsets").sync(group="billing", client=client).offsets] == ["events"]

        # delete-records, segments, configs, partitions, delete
        start = sdk.op("offsets", "delete_records").sync(topic="events", partition=0, client=client, body=m.DeleteRecordsRequest(before_offset=4))
        assert start.log_start_offset == 4
        segments = sdk.op("offsets", "list_segments").sync(topic="events", partition=0, client=client).segments
        assert [(s.base_offset, s.last_offset, s.active) for s in segments] == [(0, 13, True)]
        detail = sdk.op("topics", "describe_topic").sync(topic="events", client=client)
        assert [(p.partition, p.log_start_offset, p.high_watermark) for p in detail.partitions] == [(0, 4, 14)]
        altered = sdk.op("topics", "alter_topic_configs").sync(
            topic="orders", client=client, body=m.ConfigsPatch(configs=m.ConfigsPatchConfigs.from_dict({"retention.ms": None, "segment.ms": 60_000})),
        )
        assert (altered.configs["retention.ms"], altered.configs["segment.ms"]) == ("604800000", "60000")
        grown = sdk.op("topics", "add_partitions").sync(topic="orders", client=client, body=m.PartitionsIncrease(count=4))
        assert grown.partitions == 4
        assert sdk.op("topics", "delete_topic").sync_detailed(topic="orders", client=client).status_code == HTTPStatus.NO_CONTENT
        assert [t.name for t in sdk.op("topics", "list_topics").sync(client=client).topics] == ["events"]

        # health and metrics
        assert sdk.op("health", "get_readiness").sync(client=client).status == "ready"
        assert "eventlog_http_requests_total" in sdk.op("health", "get_metrics").sync(client=client)
    package = importlib.import_module(PACKAGE)
    with package.Client(base_url=sdk.server.url, raise_on_unexpected_status=True, httpx_args=sdk.httpx_args()) as anonymous:
        assert sdk.op("health", "get_health").sync(client=anonymous).status == "ok"  # no token needed
    # auth is optional (a server without an auth file needs no token): every operation takes a
    # plain Client as well as an AuthenticatedClient
    for tag, ops in OPERATIONS.items():
        for module_name in ops.values():
            annotation = str(inspect.signature(sdk.op(tag, module_name).sync).parameters["client"].annotation)
            assert "AuthenticatedClient" in annotation and annotation.endswith("Client") and "|" in annotation, (module_name, annotation)


def test_errors_come_back_as_typed_problems(sdk: SDK) -> None:
    m = sdk.models
    with sdk.client() as client:
        missing = sdk.op("topics", "describe_topic").sync_detailed(topic="nope", client=client)
        assert missing.status_code == HTTPStatus.NOT_FOUND
        assert missing.headers["content-type"].startswith("application/problem+json")
        problem = missing.parsed
        assert isinstance(problem, m.Problem), problem
        assert (problem.code, problem.status, problem.type_, problem.title) == (
            "topic_not_found", 404, "urn:eventlog:problem:topic_not_found", "Not Found",
        )
        assert "nope" in problem.detail
        # sync() hands back the same Problem instead of the model a success would give
        assert sdk.op("topics", "describe_topic").sync(topic="nope", client=client).code == "topic_not_found"

        sdk.op("topics", "create_topic").sync(client=client, body=m.TopicCreate(name="orders"))
        exists = sdk.op("topics", "create_topic").sync(client=client, body=m.TopicCreate(name="orders"))
        assert isinstance(exists, m.Problem) and (exists.code, exists.status) == ("topic_exists", 409)
        bad_name = sdk.op("topics", "create_topic").sync(client=client, body=m.TopicCreate(name="no spaces"))
        assert (bad_name.code, bad_name.status) == ("invalid_topic_name", 422)
        no_partition = sdk.op("records", "fetch_records").sync(topic="orders", partition=7, client=client)
        assert (no_partition.code, no_partition.status) == ("partition_not_found", 404)

        # the members a code adds are typed fields of the Problem model
        out_of_range = sdk.op("records", "fetch_records").sync(topic="orders", partition=0, client=client, offset=5)
        assert isinstance(out_of_range, m.Problem), out_of_range
        assert (out_of_range.code, out_of_range.status) == ("offset_out_of_range", 416)
        assert (out_of_range.log_start_offset, out_of_range.high_watermark) == (0, 0)
        assert out_of_range.additional_properties == {}

        not_a_string = sdk.op("records", "produce_records").sync(
            topic="orders", client=client, body=m.ProduceRequest(records=[m.ProduceRecord(value=42)]),
        )
        assert (not_a_string.code, not_a_string.status) == ("validation_error", 422)
        internal = sdk.op("records", "produce_records").sync(
            topic="__consumer_offsets", client=client, body=m.ProduceRequest(records=[m.ProduceRecord(value="x")]),
        )
        assert (internal.code, internal.status) == ("invalid_request", 400)
        metadata = sdk.op("offsets", "delete_records").sync(
            topic="__metadata", partition=0, client=client, body=m.DeleteRecordsRequest(before_offset=-1),
        )
        assert (metadata.code, metadata.status) == ("invalid_request", 400)  # it would forget every topic

    with sdk.client("not-a-known-token") as stranger:
        unauthorized = sdk.op("topics", "list_topics").sync_detailed(client=stranger)
        assert unauthorized.status_code == HTTPStatus.UNAUTHORIZED
        assert (unauthorized.parsed.code, unauthorized.parsed.status) == ("unauthorized", 401)
    with sdk.client(CONSUMER_TOKEN) as consumer:
        forbidden = sdk.op("topics", "create_topic").sync(client=consumer, body=m.TopicCreate(name="orders-2"))
        assert (forbidden.code, forbidden.status) == ("forbidden", 403)
        other_topic = sdk.op("records", "fetch_records").sync(topic="events", partition=0, client=consumer)
        assert (other_topic.code, other_topic.status) == ("forbidden", 403)
