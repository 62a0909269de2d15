"""A generated SDK: openapi-python-client run on the live /openapi.json, used the way a team would.

The document declares the bearer token optional (top-level `security: [{HTTPBearer: []}, {}]`),
so every operation takes a plain Client as well as an AuthenticatedClient. The app here runs with
an auth file, so the tests call it with an AuthenticatedClient (a plain Client where no token is
needed, or where its absence is the point), in this process: the SDK's clients get its
transport. The SDK is generated once for the module; each test has an app of its own. The client
raises on any status the document does not list, so every response here is also checked against
the documented status codes.

USES holds one use of each operation, its results checked, in the order one scenario runs them:
adding an operation to the API means adding its use there, and nothing else. The SDK clients'
transport names the operation of every request they send (by the document's method and path
template); test_every_operation_in_the_document_is_used_through_the_sdk runs USES on an app of
its own and asserts that the operations it sent are exactly the document's, so an operation
without a use fails it.
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
import threading
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from http import HTTPStatus
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from engine.format import iter_batches
from engine.partitioner import partition_for_key
from engine.records import decode_records

from ..conftest import KEPT_ENV, REPO, VENV_BIN
from ..inprocess import ASGITransport, InProcessServer
from ..kafka_oracle import build_batch

PACKAGE = "eventlog_client"
ADMIN_TOKEN = "admin-token-0123456789"
CONSUMER_TOKEN = "consumer-token-0123456789"
STREAM_TIMEOUT_S = 30.0  # an event stream the test waits on ends well within this

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
    used: list[str] = field(default_factory=list)  # the operation of each request the clients sent
    received: dict[str, bytes] = field(default_factory=dict)  # operation -> its latest response's body so far
    arrived: threading.Condition = field(default_factory=threading.Condition)

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

    def anonymous(self) -> Any:
        """A plain Client: no token."""
        package = importlib.import_module(PACKAGE)
        return package.Client(base_url=self.server.url, raise_on_unexpected_status=True, httpx_args=self.httpx_args())

    def httpx_args(self) -> dict[str, Any]:
        runner = getattr(self.server, "runner", None)
        # None: a real server (EVENTLOG_TEST_PROCESSES: a shard family)
        inner = httpx.HTTPTransport() if runner is None else ASGITransport(runner)
        return {"transport": _Recording(inner, self)}

    @cached_property
    def _routes(self) -> list[tuple[str, re.Pattern[str], str]]:
        routes = []
        for template, operations in self.document["paths"].items():
            pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))  # a parameter: one percent-encoded segment
            for method, operation in operations.items():
                routes.append((method.upper(), re.compile(pattern), operation["operationId"]))
        return routes

    def operation(self, request: httpx.Request) -> str:
        """The operationId the request is, by its method and path; 'METHOD /path' if none."""
        path = request.url.raw_path.split(b"?", 1)[0].decode("ascii")
        found = [op_id for method, pattern, op_id in self._routes if method == request.method and pattern.fullmatch(path)]
        return found[0] if len(found) == 1 else f"{request.method} {path}"

    def arrive(self, operation: str, chunk: bytes | None) -> None:
        with self.arrived:
            self.received[operation] = b"" if chunk is None else self.received.get(operation, b"") + chunk
            self.arrived.notify_all()

    def wait_for(self, operation: str, data: bytes) -> None:
        """Until `data` is in the body of `operation`'s latest response, as far as it has arrived."""
        with self.arrived:
            seen = self.arrived.wait_for(lambda: data in self.received.get(operation, b""), STREAM_TIMEOUT_S)
            assert seen, (operation, data, self.received.get(operation))


class _Recording(httpx.BaseTransport):
    """The SDK clients' transport: notes the operation of each request, and each response's
    body as it arrives (an event stream's sync_detailed returns only when the stream ends)."""

    def __init__(self, inner: httpx.BaseTransport, sdk: SDK) -> None:
        self.inner = inner
        self.sdk = sdk

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        operation = self.sdk.operation(request)
        self.sdk.used.append(operation)
        self.sdk.arrive(operation, None)
        response = self.inner.handle_request(request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _Watched(response.stream, lambda chunk: self.sdk.arrive(operation, chunk))
        return response

    def close(self) -> None:
        self.inner.close()


class _Watched(httpx.SyncByteStream):
    def __init__(self, stream: httpx.SyncByteStream, arrive: Callable[[bytes], None]) -> None:
        self.stream = stream
        self.arrive = arrive

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.stream:
            self.arrive(chunk)
            yield chunk

    def close(self) -> None:
        self.stream.close()


@contextmanager
def _on_a_thread(call: Callable[[], Any]) -> Iterator[Future]:
    """`call` on a thread of its own: an event stream's sync_detailed returns when the stream
    ends. Take its result with a timeout; a stream the test gave up on ends with the app."""
    pool = ThreadPoolExecutor(1)
    try:
        yield pool.submit(call)
    finally:
        pool.shutdown(wait=False)


def _events(body: str) -> list[tuple[str, str | None, Any]]:
    """An event stream's events as (event, id, data as JSON); comments left out."""
    events = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
        if fields:
            events.append((fields.get("event", "message"), fields.get("id"), json.loads(fields["data"])))
    return events


def _doc_function(name: str) -> Callable[..., Any]:
    """The function `name` as docs/API.md shows it (its ```python block), run as written."""
    text = (REPO / "docs" / "API.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if f"def {name}(" in b)
    scope: dict[str, Any] = {}
    exec(compile(block, "docs/API.md", "exec"), scope)  # noqa: S102 -- the doc's own code
    return scope[name]


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
            if name.startswith("EVENTLOG_") and name not in KEPT_ENV:
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
    """The generated SDK and a fresh app (with the same auth file) to use it on; the
    compactor's loop is off, so the compaction passes the tests see are the ones they run."""
    root, document = generated
    server = app_factory(
        EVENTLOG_AUTH_FILE=str(_write_auth_file(tmp_path / "auth.json")), EVENTLOG_CLEANER_ENABLED="false",
    ).start(token=ADMIN_TOKEN)
    try:
        yield SDK(server, root, document)
    finally:
        server.stop()


# -- one use of every operation --------------------------------------------------------------------


@dataclass
class Scene:
    """What the uses share: the SDK, an admin's client, and what the uses before made."""

    sdk: SDK
    client: Any
    sent: list[Any] = field(default_factory=list)  # the ProduceRecords produceRecords sent to `orders`
    produced: Any = None  # and its ProduceResponse
    compaction: Any = None  # runCompaction's CompactionRun
    snapshot: Any = None  # createSnapshot's Snapshot
    queued: int = 0  # the records createQueue's queue holds
    leases: list[str] = field(default_factory=list)  # leaseQueueRecords' leases

    @property
    def m(self) -> ModuleType:
        return self.sdk.models

    def op(self, tag: str, name: str) -> ModuleType:
        return self.sdk.op(tag, name)


@dataclass(frozen=True)
class Use:
    tag: str  # the operation's module is api/<tag>/<module>.py in the SDK: renaming an operation
    module: str  # id (or a tag) renames a module that teams import, so a test fails first
    run: Callable[[Scene], None]


USES: dict[str, Use] = {}  # operationId -> its use; run in this order, each after the ones before


def _uses(operation_id: str, tag: str, module: str) -> Callable[[Callable[[Scene], None]], Callable[[Scene], None]]:
    def register(run: Callable[[Scene], None]) -> Callable[[Scene], None]:
        assert operation_id not in USES, operation_id
        USES[operation_id] = Use(tag, module, run)
        return run
    return register


@_uses("getHealth", "health", "get_health")
def _get_health(s: Scene) -> None:
    with s.sdk.anonymous() as anonymous:  # open without a token
        assert s.op("health", "get_health").sync(client=anonymous).status == "ok"


@_uses("getReadiness", "health", "get_readiness")
def _get_readiness(s: Scene) -> None:
    assert s.op("health", "get_readiness").sync(client=s.client).status == "ready"
    with s.sdk.anonymous() as anonymous:  # the server has an auth file: the token is needed
        refused = s.op("health", "get_readiness").sync(client=anonymous)
        assert isinstance(refused, s.m.Problem) and (refused.code, refused.status) == ("unauthorized", 401)


@_uses("getPrincipal", "server", "get_principal")
def _get_principal(s: Scene) -> None:
    me = s.op("server", "get_principal").sync(client=s.client)
    assert isinstance(me, s.m.WhoAmI), me
    assert (me.name, me.role, me.topics, me.groups) == ("ops", "admin", [""], [""])
    assert sorted(me.actions) == ["admin", "describe", "group", "monitor", "read", "write"]
    assert me.server.auth is True and 0 <= me.server.shard < me.server.shards and me.server.version
    with s.sdk.client(CONSUMER_TOKEN) as consumer:
        them = s.op("server", "get_principal").sync(client=consumer)
        assert (them.name, them.role, them.topics) == ("analytics", "consumer", ["orders"])
        assert sorted(them.actions) == ["describe", "group", "monitor", "read"]


@_uses("createTopic", "topics", "create_topic")
def _create_topic(s: Scene) -> None:
    m = s.m
    created = s.op("topics", "create_topic").sync(
        client=s.client,
        body=m.TopicCreate(name="orders", partitions=3, configs=m.TopicCreateConfigs.from_dict({"retention.ms": 86_400_000})),
    )
    assert isinstance(created, m.Topic), created
    assert (created.name, created.partitions, created.configs["retention.ms"]) == ("orders", 3, "86400000")
    assert isinstance(s.op("topics", "create_topic").sync(client=s.client, body=m.TopicCreate(name="events", partitions=1)), m.Topic)


@_uses("listTopics", "topics", "list_topics")
def _list_topics(s: Scene) -> None:
    listed = s.op("topics", "list_topics").sync(client=s.client)
    assert [(t.name, t.partitions) for t in listed.topics] == [("events", 1), ("orders", 3)]


@_uses("produceRecords", "records", "produce_records")
def _produce_records(s: Scene) -> None:
    m = s.m
    # keys, values and headers; murmur2 chooses the partition
    s.sent = [
        m.ProduceRecord(
            key=f"user-{i}", value=f"value-{i}", timestamp=1_000 + i,
            headers=[m.RecordHeader(key="source", value="sdk"), m.RecordHeader(key="seq", value=str(i)), m.RecordHeader(key="none", value=None)],
        )
        for i in range(12)
    ]
    s.produced = s.op("records", "produce_records").sync(topic="orders", client=s.client, body=m.ProduceRequest(records=s.sent))
    assert isinstance(s.produced, m.ProduceResponse), s.produced
    assert [o.partition for o in s.produced.offsets] == [partition_for_key(f"user-{i}".encode(), 3) for i in range(12)]
    assert [o.timestamp for o in s.produced.offsets] == [1_000 + i for i in range(12)]
    # the member every produce answer has: per partition written, its first and last offset
    by_partition: dict[int, list[int]] = {}
    for o in s.produced.offsets:
        by_partition.setdefault(o.partition, []).append(o.offset)
    assert [(p.partition, p.base_offset, p.last_offset) for p in s.produced.partitions] == [
        (p, offsets[0], offsets[-1]) for p, offsets in sorted(by_partition.items())
    ]
    assert all(isinstance(p, m.ProducedPartition) for p in s.produced.partitions)
    # other formats: base64 keys, JSON values and header values
    produced = s.op("records", "produce_records").sync(
        topic="events", client=s.client,
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


@_uses("fetchRecords", "records", "fetch_records")
def _fetch_records(s: Scene) -> None:
    m = s.m
    # every partition of `orders` back, record by record
    fetched = {}
    for p in range(3):
        page = s.op("records", "fetch_records").sync(topic="orders", partition=p, client=s.client, offset=0)
        assert isinstance(page, m.FetchResponse), page
        assert page.next_offset == page.high_watermark == len(page.records) and page.log_start_offset == 0
        for r in page.records:
            fetched[(p, r.offset)] = (r.key, r.value, r.timestamp, [(h.key, h.value) for h in r.headers])
    assert fetched == {
        (o.partition, o.offset): (r.key, r.value, r.timestamp, [(h.key, h.value) for h in r.headers])
        for o, r in zip(s.produced.offsets, s.sent)
    }
    page = s.op("records", "fetch_records").sync(
        topic="events", partition=0, client=s.client, offset=3, max_records=2,
        key_format=m.Format.BASE64, value_format=m.Format.JSON,
    )
    assert [(r.offset, r.key, r.value, r.timestamp, [(h.key, h.value) for h in r.headers]) for r in page.records] == [
        (3, "AAEC/w==", {"n": 3, "tags": ["a", None]}, 2_003, [("h", [3])]),
        (4, "AAEC/w==", {"n": 4, "tags": ["a", None]}, 2_004, [("h", [4])]),
    ]
    assert page.next_offset == 5


@_uses("browseRecords", "records", "browse_records")
def _browse_records(s: Scene) -> None:
    m = s.m
    browse = s.op("records", "browse_records")
    # every partition of `orders` merged, oldest first (timestamps 1 000 + i), page by page
    seen, cursor = [], None
    for _ in range(10):
        kwargs = {"cursor": cursor} if cursor else {}
        page = browse.sync(
            topic="orders", client=s.client, order=m.RecordsOrder.OLDEST, limit=5, **kwargs
        )
        assert isinstance(page, m.TopicRecordsPage), page
        seen += [(r.partition, r.offset, r.key, r.value, r.timestamp) for r in page.records]
        cursor = page.next_cursor
        if cursor is None:
            break
    sent = zip(s.produced.offsets, s.sent, strict=True)
    assert seen == [(o.partition, o.offset, r.key, r.value, r.timestamp) for o, r in sent]
    # filtered: a header's value, in two partitions, newest first
    wanted = sorted({s.produced.offsets[i].partition for i in (3, 7)})
    page = browse.sync(topic="orders", client=s.client, header="seq=7", partition=wanted)
    assert [r.key for r in page.records] == ["user-7"]
    assert page.next_cursor is None and not page.scan_limited
    refused = browse.sync(topic="orders", client=s.client, cursor="nope")
    assert isinstance(refused, m.Problem)
    assert (refused.code, refused.status) == ("invalid_cursor", 400)


@_uses("produceToPartition", "records", "produce_to_partition")
def _produce_to_partition(s: Scene) -> None:
    m = s.m
    to_partition = s.op("records", "produce_to_partition")
    one = to_partition.sync(
        topic="events", partition=0, client=s.client,
        body=m.ProduceRequest(records=[m.ProduceRecord(key=None, value="x", timestamp=3_000), m.ProduceRecord(value=None, timestamp=3_001)]),
    )
    assert isinstance(one, m.PartitionProduceResponse), one
    assert (one.partition, one.base_offset, one.last_offset, one.timestamp) == (0, 10, 11, 3_001)
    assert [(p.partition, p.base_offset, p.last_offset) for p in one.partitions] == [(0, 10, 11)]
    # a raw Kafka v2 batch, sent as application/octet-stream
    batch = build_batch([(b"k", b"raw", 4_000, [("h", b"v")]), (None, b"raw2", 4_001, [])])
    raw = to_partition.sync(topic="events", partition=0, client=s.client, body=s.sdk.types.File(payload=io.BytesIO(batch)))
    assert isinstance(raw, m.PartitionProduceResponse), raw
    assert (raw.base_offset, raw.last_offset, raw.timestamp) == (12, 13, 4_001)
    assert [(p.partition, p.base_offset, p.last_offset) for p in raw.partitions] == [(0, 12, 13)]
    page = s.op("records", "fetch_records").sync(topic="events", partition=0, client=s.client, offset=10)
    assert [(r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in page.records] == [
        (10, None, "x", []), (11, None, None, []), (12, "k", "raw", [("h", "v")]), (13, None, "raw2", []),
    ]


@_uses("fetchRecordBatches", "records", "fetch_record_batches")
def _fetch_record_batches(s: Scene) -> None:
    """The stored batches as bytes (what fetchRecords answers with Accept: the vendor type):
    the raw batch produced above comes back as it was, for a Kafka decoder."""
    fetch = s.op("records", "fetch_record_batches")
    answer = fetch.sync_detailed(
        topic="events", partition=0, client=s.client, offset=12, max_bytes=1
    )
    assert answer.status_code == HTTPStatus.OK, answer.content
    assert isinstance(answer.parsed, s.sdk.types.File), answer.parsed
    data = answer.parsed.payload.read()
    headers = list(iter_batches(data))
    records = [
        (r.offset, r.key, r.value, r.headers) for h in headers for r in decode_records(data, h)
    ]
    assert records == [(12, b"k", b"raw", (("h", b"v"),)), (13, None, b"raw2", ())], records
    assert (answer.headers["x-next-offset"], answer.headers["x-high-watermark"]) == ("14", "14")
    with s.sdk.client() as client:  # the same bytes as the Accept route
        accept = {"accept": "application/vnd.kafka.record-batch.v2"}
        assert client.get_httpx_client().get(
            "/v1/topics/events/partitions/0/records", params={"offset": 12, "max_bytes": 1},
            headers=accept,
        ).content == data
    at_end = fetch.sync_detailed(topic="events", partition=0, client=s.client, offset=14)
    assert at_end.parsed.payload.read() == b"" and at_end.headers["x-next-offset"] == "14"


@_uses("streamRecords", "records", "stream_records")
def _stream_records(s: Scene) -> None:
    """The records there, then one produced while it listens; deleting the topic ends the
    stream (an `error` event), and only then does sync_detailed return."""
    m = s.m
    produce = s.op("records", "produce_records")
    s.op("topics", "create_topic").sync(client=s.client, body=m.TopicCreate(name="tail", partitions=1))
    produce.sync(topic="tail", client=s.client, body=m.ProduceRequest(records=[
        m.ProduceRecord(key="a", value="1", timestamp=5_000), m.ProduceRecord(key="b", value="2", timestamp=5_001),
    ]))
    stream = s.op("records", "stream_records")
    with s.sdk.client() as listener, _on_a_thread(
        lambda: stream.sync_detailed(topic="tail", partition=0, client=listener, offset=0),
    ) as listening:
        s.sdk.wait_for("streamRecords", b"\nid: 1\n")
        produce.sync(topic="tail", client=s.client, body=m.ProduceRequest(records=[m.ProduceRecord(value="3", timestamp=5_002)]))
        s.sdk.wait_for("streamRecords", b"\nid: 2\n")
        # what docs/API.md tells a reader to do (the stream never ends while the topic lives):
        # docs/API.md's reader on the SDK's own httpx client, bounded by a count
        for generated in (stream, s.op("keys", "stream_key_records")):  # the SDK says so too
            said = " ".join((inspect.getdoc(generated.sync) or "").split())
            assert "does not end on its own" in said, said
        sse_events = _doc_function("sse_events")
        with s.sdk.client() as reader:
            bounded = list(sse_events(
                reader.get_httpx_client(), "/v1/topics/tail/partitions/0/records/stream",
                params={"offset": 1}, limit=2,
            ))
        assert [(e, i, d["offset"], d["value"]) for e, i, d in bounded] == [
            ("record", "1", 1, "2"), ("record", "2", 2, "3"),
        ]
        assert s.op("topics", "delete_topic").sync_detailed(topic="tail", client=s.client).status_code == HTTPStatus.NO_CONTENT
        response = listening.result(timeout=STREAM_TIMEOUT_S)
    assert response.status_code == HTTPStatus.OK and response.headers["content-type"].startswith("text/event-stream")
    assert response.parsed == response.content.decode()
    events = _events(response.parsed)
    assert [(e, i, d["offset"], d["key"], d["value"], d["timestamp"]) for e, i, d in events[:-1]] == [
        ("record", "0", 0, "a", "1", 5_000), ("record", "1", 1, "b", "2", 5_001), ("record", "2", 2, None, "3", 5_002),
    ]
    event, _, error = events[-1]
    assert (event, error["code"], error["offset"]) == ("error", "topic_deleted", 3), events[-1]


@_uses("listOffsets", "offsets", "list_offsets")
def _list_offsets(s: Scene) -> None:
    m = s.m
    list_offsets = s.op("offsets", "list_offsets")
    by_time = list_offsets.sync(topic="events", partition=0, client=s.client, timestamp=2_005)
    assert isinstance(by_time, m.PartitionOffsets), by_time
    assert (by_time.offset, by_time.timestamp) == (5, 2_005)
    assert (by_time.log_start_offset, by_time.high_watermark, by_time.log_end_offset) == (0, 14, 14)
    later = list_offsets.sync(topic="events", partition=0, client=s.client, timestamp=10**12)
    assert (later.offset, later.timestamp) == (None, None)
    assert list_offsets.sync(topic="events", partition=0, client=s.client, spec=m.OffsetSpec.LATEST).offset == 14
    newest = list_offsets.sync(topic="events", partition=0, client=s.client, spec=m.OffsetSpec.MAX_TIMESTAMP)
    assert (newest.offset, newest.timestamp) == (13, 4_001)


@_uses("commitGroupOffsets", "groups", "commit_group_offsets")
def _commit_group_offsets(s: Scene) -> None:
    m = s.m
    committed = s.op("groups", "commit_group_offsets").sync(
        group="billing", client=s.client,
        body=m.GroupOffsetsCommit(offsets=[
            m.GroupOffset(topic="events", partition=0, offset=5, metadata="checkpoint"),
            m.GroupOffset(topic="orders", partition=2, offset=1),
        ]),
    )
    assert isinstance(committed, m.GroupOffsets), committed
    assert (committed.group, sorted((o.topic, o.partition, o.offset) for o in committed.offsets)) == (
        "billing", [("events", 0, 5), ("orders", 2, 1)],
    )


@_uses("fetchGroupOffsets", "groups", "fetch_group_offsets")
def _fetch_group_offsets(s: Scene) -> None:
    fetch = s.op("groups", "fetch_group_offsets")
    got = fetch.sync(group="billing", client=s.client)
    assert sorted((o.topic, o.partition, o.offset, o.metadata) for o in got.offsets) == [
        ("events", 0, 5, "checkpoint"), ("orders", 2, 1, ""),
    ]
    assert [(o.topic, o.offset) for o in fetch.sync(group="billing", client=s.client, topic="orders").offsets] == [("orders", 1)]


@_uses("resetGroupOffsets", "groups", "reset_group_offsets")
def _reset_group_offsets(s: Scene) -> None:
    m, reset = s.m, s.op("groups", "reset_group_offsets")
    plan = reset.sync(
        group="billing", client=s.client,
        body=m.GroupOffsetsReset(topic="events", to_latest=True, dry_run=True),
    )
    assert isinstance(plan, m.GroupOffsetsResetResult), plan
    planned = [(o.topic, o.partition, o.previous_offset, o.offset) for o in plan.offsets]
    assert (plan.dry_run, planned) == (True, [("events", 0, 5, 14)])
    body = m.GroupOffsetsReset(all_topics=True, shift_by=0)
    done = reset.sync(group="billing", client=s.client, body=body)
    assert sorted((o.topic, o.previous_offset, o.offset) for o in done.offsets) == [
        ("events", 5, 5), ("orders", 1, 1),
    ]


@_uses("listGroups", "groups", "list_groups")
def _list_groups(s: Scene) -> None:
    list_groups = s.op("groups", "list_groups")
    listed = list_groups.sync(client=s.client)
    assert (listed.groups, listed.next_after) == (["billing"], None)
    page = list_groups.sync(client=s.client, limit=1, after="a")
    assert (page.groups, page.next_after) == (["billing"], None)
    assert list_groups.sync(client=s.client, after="billing").groups == []


@_uses("deleteGroupOffsets", "groups", "delete_group_offsets")
def _delete_group_offsets(s: Scene) -> None:
    deleted = s.op("groups", "delete_group_offsets").sync_detailed(group="billing", client=s.client, topic="orders")
    assert deleted.status_code == HTTPStatus.NO_CONTENT
    assert [o.topic for o in s.op("groups", "fetch_group_offsets").sync(group="billing", client=s.client).offsets] == ["events"]


@_uses("deleteRecords", "offsets", "delete_records")
def _delete_records(s: Scene) -> None:
    start = s.op("offsets", "delete_records").sync(
        topic="events", partition=0, client=s.client, body=s.m.DeleteRecordsRequest(before_offset=4),
    )
    assert isinstance(start, s.m.DeleteRecordsResponse), start
    assert start.log_start_offset == 4
    assert s.op("records", "fetch_records").sync(topic="events", partition=0, client=s.client, offset=0).code == "offset_out_of_range"


@_uses("listSegments", "offsets", "list_segments")
def _list_segments(s: Scene) -> None:
    segments = s.op("offsets", "list_segments").sync(topic="events", partition=0, client=s.client).segments
    assert [(seg.base_offset, seg.last_offset, seg.active) for seg in segments] == [(0, 13, True)]


@_uses("appendKeyRecords", "keys", "append_key_records")
def _append_key_records(s: Scene) -> None:
    """On a compacted topic whose segments hold about two batches each."""
    m = s.m
    append = s.op("keys", "append_key_records")
    s.op("topics", "create_topic").sync(client=s.client, body=m.TopicCreate(
        name="carts", partitions=1, configs=m.TopicCreateConfigs.from_dict({"cleanup.policy": "compact", "segment.bytes": 200}),
    ))
    created = append.sync_detailed(
        topic="carts", key="cart/7", client=s.client, if_none_match="*",
        body=m.KeyProduceRequest(records=[m.KeyRecord(value={"type": "created"}, timestamp=6_000)], value_format=m.Format.JSON),
    )
    assert isinstance(created.parsed, m.KeyProduceResponse), created.content
    assert (created.parsed.partition, created.parsed.offsets, created.headers["etag"]) == (0, [0], '"0"')
    paid = append.sync(
        topic="carts", key="cart/7", client=s.client, if_match='"0"',
        body=m.KeyProduceRequest(records=[m.KeyRecord(value={"type": "paid"}, timestamp=6_001)], value_format=m.Format.JSON),
    )
    assert (paid.base_offset, paid.last_offset) == (1, 1)
    assert [(p.partition, p.base_offset, p.last_offset) for p in paid.partitions] == [(0, 1, 1)]


@_uses("readKeyRecords", "keys", "read_key_records")
def _read_key_records(s: Scene) -> None:
    page = s.op("keys", "read_key_records").sync_detailed(topic="carts", key="cart/7", client=s.client, value_format=s.m.Format.JSON)
    assert isinstance(page.parsed, s.m.KeyRecordsResponse), page.content
    assert [(r.offset, r.value, r.timestamp) for r in page.parsed.records] == [(0, {"type": "created"}, 6_000), (1, {"type": "paid"}, 6_001)]
    assert (page.parsed.latest_offset, page.parsed.more, page.headers["etag"]) == (1, False, '"1"')


@_uses("streamKeyRecords", "keys", "stream_key_records")
def _stream_key_records(s: Scene) -> None:
    """A tombstone ends a key's stream on a compacted topic (an `end` event): sync_detailed returns."""
    m = s.m
    tombstone = s.op("keys", "append_key_records").sync(
        topic="carts", key="cart/7", client=s.client, body=m.KeyProduceRequest(records=[m.KeyRecord(value=None, timestamp=6_002)]),
    )
    assert tombstone.last_offset == 2
    stream = s.op("keys", "stream_key_records")
    with _on_a_thread(lambda: stream.sync_detailed(topic="carts", key="cart/7", client=s.client, offset=0, value_format=m.Format.JSON)) as listening:
        response = listening.result(timeout=STREAM_TIMEOUT_S)
    assert response.status_code == HTTPStatus.OK and response.headers["content-type"].startswith("text/event-stream")
    assert [(e, i, d.get("key"), d.get("value")) for e, i, d in _events(response.parsed)] == [
        ("record", "0", "cart/7", {"type": "created"}), ("record", "1", "cart/7", {"type": "paid"}),
        ("record", "2", "cart/7", None), ("end", None, None, None),
    ]
    assert _events(response.parsed)[-1][2] == {"offset": 2, "reason": "tombstone"}


@_uses("runCompaction", "admin", "run_compaction")
def _run_compaction(s: Scene) -> None:
    """cart/8 three times more: in the closed segments only each key's latest record stays
    (the tombstone too: its delete horizon has not passed); the active segment is untouched."""
    m = s.m
    for i in range(3):
        s.op("keys", "append_key_records").sync(
            topic="carts", key="cart/8", client=s.client, body=m.KeyProduceRequest(records=[m.KeyRecord(value=f"v{i}", timestamp=6_010 + i)]),
        )
    before = s.op("records", "fetch_records").sync(topic="carts", partition=0, client=s.client, offset=0).records
    closed = [seg for seg in s.op("offsets", "list_segments").sync(topic="carts", partition=0, client=s.client).segments if not seg.active]
    assert closed, "the segments of carts did not roll"
    s.compaction = s.op("admin", "run_compaction").sync(client=s.client, body=m.MaintenanceRequest(topic="carts", partition=0))
    assert isinstance(s.compaction, m.CompactionRun), s.compaction
    (ran,) = s.compaction.partitions
    assert (ran.topic, ran.partition, ran.cleaned, ran.end_offset) == ("carts", 0, True, closed[-1].last_offset + 1)
    assert ran.records_read == ran.records_kept + ran.records_removed and ran.records_removed == s.compaction.records_removed > 0
    after = s.op("records", "fetch_records").sync(topic="carts", partition=0, client=s.client, offset=0).records
    # as Kafka's cleaner: the latest offset of each key below end_offset (the active segment is not read)
    latest = {r.key: r.offset for r in before if r.offset < ran.end_offset}
    assert [r.offset for r in after] == [
        r.offset for r in before if r.offset >= ran.end_offset or latest[r.key] == r.offset
    ]
    assert len(before) - len(after) == ran.records_removed


@_uses("runRetention", "admin", "run_retention")
def _run_retention(s: Scene) -> None:
    """A segment per batch; the closed segments below the log start offset are deleted."""
    m = s.m
    s.op("topics", "create_topic").sync(client=s.client, body=m.TopicCreate(
        name="logs", partitions=1, configs=m.TopicCreateConfigs.from_dict({"segment.bytes": 100}),
    ))
    for i in range(3):
        s.op("records", "produce_to_partition").sync(
            topic="logs", partition=0, client=s.client, body=m.ProduceRequest(records=[m.ProduceRecord(value=f"line {i}", timestamp=7_000 + i)]),
        )
    segments = s.op("offsets", "list_segments").sync(topic="logs", partition=0, client=s.client).segments
    assert [(seg.base_offset, seg.active) for seg in segments] == [(0, False), (1, False), (2, True)]
    s.op("offsets", "delete_records").sync(topic="logs", partition=0, client=s.client, body=m.DeleteRecordsRequest(before_offset=2))
    ran = s.op("admin", "run_retention").sync(client=s.client, body=m.MaintenanceRequest(topic="logs", partition=0))
    assert isinstance(ran, m.RetentionRun), ran
    assert (ran.segments_deleted, ran.bytes_reclaimed) == (2, sum(seg.size_bytes for seg in segments[:2]))
    assert [(p.topic, p.partition, p.segments_deleted, p.reasons.to_dict(), p.log_start_offset) for p in ran.partitions] == [
        ("logs", 0, 2, {"log_start_offset": 2, "retention_bytes": 0, "retention_ms": 0}, 2),
    ]
    segments = s.op("offsets", "list_segments").sync(topic="logs", partition=0, client=s.client).segments
    assert [(seg.base_offset, seg.active) for seg in segments] == [(2, True)]


@_uses("describeMaintenance", "offsets", "describe_maintenance")
def _describe_maintenance(s: Scene) -> None:
    describe = s.op("offsets", "describe_maintenance")
    carts = describe.sync(topic="carts", partition=0, client=s.client)
    assert isinstance(carts, s.m.PartitionMaintenance), carts
    (ran,) = s.compaction.partitions
    assert (carts.topic, carts.partition, carts.cleanup_policy, carts.cleaner_offset) == ("carts", 0, "compact", ran.end_offset)
    assert (carts.last_compaction.outcome, carts.last_retention) == ("ok", None)
    assert carts.last_compaction.result["records_removed"] == ran.records_removed
    logs = describe.sync(topic="logs", partition=0, client=s.client)
    assert (logs.cleanup_policy, logs.cleaner_offset, logs.last_compaction) == ("delete", None, None)
    assert (logs.last_retention.outcome, logs.last_retention.result["segments_deleted"]) == ("ok", 2)
    assert 0 <= carts.owner_shard and 0 <= logs.owner_shard
    missing = describe.sync(topic="carts", partition=5, client=s.client)
    assert isinstance(missing, s.m.Problem) and (missing.code, missing.status) == ("partition_not_found", 404)


@_uses("createSnapshot", "snapshots", "create_snapshot")
def _create_snapshot(s: Scene) -> None:
    s.snapshot = s.op("snapshots", "create_snapshot").sync(client=s.client, body=s.m.SnapshotRequest(topics=["events"]))
    assert isinstance(s.snapshot, s.m.Snapshot), s.snapshot
    # the path is from the snapshot dir, beside the data dir
    assert (s.snapshot.topics, s.snapshot.path) == (["events"], s.snapshot.id)
    (p,) = s.snapshot.partitions
    assert (p.topic, p.partition, p.log_start_offset, p.high_watermark, p.segments) == ("events", 0, 4, 14, 1)
    assert p.size_bytes > 0


@_uses("listSnapshots", "snapshots", "list_snapshots")
def _list_snapshots(s: Scene) -> None:
    assert [x.id for x in s.op("snapshots", "list_snapshots").sync(client=s.client).snapshots] == [s.snapshot.id]


@_uses("describeSnapshot", "snapshots", "describe_snapshot")
def _describe_snapshot(s: Scene) -> None:
    described = s.op("snapshots", "describe_snapshot").sync(snapshot_id=s.snapshot.id, client=s.client)
    assert isinstance(described, s.m.Snapshot) and described.to_dict() == s.snapshot.to_dict()


@_uses("deleteSnapshot", "snapshots", "delete_snapshot")
def _delete_snapshot(s: Scene) -> None:
    deleted = s.op("snapshots", "delete_snapshot").sync_detailed(snapshot_id=s.snapshot.id, client=s.client)
    assert deleted.status_code == HTTPStatus.NO_CONTENT
    gone = s.op("snapshots", "describe_snapshot").sync(snapshot_id=s.snapshot.id, client=s.client)
    assert (gone.code, gone.status) == ("snapshot_not_found", 404)
    assert s.op("snapshots", "list_snapshots").sync(client=s.client).snapshots == []


@_uses("getMetrics", "health", "get_metrics")
def _get_metrics(s: Scene) -> None:
    text = s.op("health", "get_metrics").sync(client=s.client)
    assert isinstance(text, str), text
    assert re.search(r'^eventlog_produce_records_total\{topic="orders"\} 12\.0$', text, re.MULTILINE), text
    assert re.search(r'^eventlog_http_requests_total\{.*route="/v1/snapshots".*\} [1-9]', text, re.MULTILINE), text


@_uses("describeTopic", "topics", "describe_topic")
def _describe_topic(s: Scene) -> None:
    detail = s.op("topics", "describe_topic").sync(topic="events", client=s.client)
    assert isinstance(detail, s.m.TopicDetail), detail
    assert [(p.partition, p.log_start_offset, p.high_watermark) for p in detail.partitions] == [(0, 4, 14)]


@_uses("alterTopicConfigs", "topics", "alter_topic_configs")
def _alter_topic_configs(s: Scene) -> None:
    m = s.m
    altered = s.op("topics", "alter_topic_configs").sync(
        topic="orders", client=s.client,
        body=m.ConfigsPatch(configs=m.ConfigsPatchConfigs.from_dict({"retention.ms": None, "segment.ms": 60_000})),
    )
    assert (altered.configs["retention.ms"], altered.configs["segment.ms"]) == ("604800000", "60000")


@_uses("addPartitions", "topics", "add_partitions")
def _add_partitions(s: Scene) -> None:
    grown = s.op("topics", "add_partitions").sync(topic="orders", client=s.client, body=s.m.PartitionsIncrease(count=4))
    assert grown.partitions == 4
    assert s.op("records", "fetch_records").sync(topic="orders", partition=3, client=s.client).records == []


@_uses("createQueue", "queues", "create_queue")
def _create_queue(s: Scene) -> None:
    made = s.op("queues", "create_queue").sync_detailed(
        topic="orders", queue="work", client=s.client,
        body=s.m.QueueCreate(lock_ms=60_000, max_deliveries=2),
    )
    assert made.status_code == HTTPStatus.CREATED
    made_ = made.parsed
    assert (made_.queue, made_.lock_ms, made_.ordering) == ("work", 60_000, "none")
    s.queued = sum(p.lag for p in made.parsed.partitions)
    assert s.queued >= 4 and [p.partition for p in made.parsed.partitions] == [0, 1, 2, 3]


@_uses("listQueues", "queues", "list_queues")
def _list_queues(s: Scene) -> None:
    assert s.op("queues", "list_queues").sync(topic="orders", client=s.client).queues == ["work"]


@_uses("leaseQueueRecords", "queues", "lease_queue_records")
def _lease_queue_records(s: Scene) -> None:
    got = s.op("queues", "lease_queue_records").sync(
        topic="orders", queue="work", client=s.client,
        body=s.m.LeaseRequest(max_records=1000, wait_ms=0),
    )
    assert len(got.records) == s.queued
    assert {r.delivery_count for r in got.records} == {1}
    assert all(r.value.startswith("value-") and r.lease for r in got.records)
    s.leases = [r.lease for r in got.records]


@_uses("ackQueueRecords", "queues", "ack_queue_records")
def _ack_queue_records(s: Scene) -> None:
    done = s.op("queues", "ack_queue_records").sync(
        topic="orders", queue="work", client=s.client,
        body=s.m.LeasesRequest(leases=[s.leases[0], "nope"]),
    )
    assert [(r.lease, r.status) for r in done.results] == [
        (s.leases[0], "acked"), ("nope", "unknown"),
    ]


@_uses("renewQueueLeases", "queues", "renew_queue_leases")
def _renew_queue_leases(s: Scene) -> None:
    done = s.op("queues", "renew_queue_leases").sync(
        topic="orders", queue="work", client=s.client,
        body=s.m.RenewRequest(leases=[s.leases[1]], lock_ms=1000),
    )
    assert [r.status for r in done.results] == ["renewed"]


@_uses("releaseQueueRecords", "queues", "release_queue_records")
def _release_queue_records(s: Scene) -> None:
    done = s.op("queues", "release_queue_records").sync(
        topic="orders", queue="work", client=s.client,
        body=s.m.ReleaseRequest(leases=[s.leases[2]], delay_ms=60_000),
    )
    assert [r.status for r in done.results] == ["released"]


@_uses("rejectQueueRecords", "queues", "reject_queue_records")
def _reject_queue_records(s: Scene) -> None:
    done = s.op("queues", "reject_queue_records").sync(
        topic="orders", queue="work", client=s.client,
        body=s.m.LeasesRequest(leases=[s.leases[3], s.leases[0]]),
    )
    assert [r.status for r in done.results] == ["rejected", "expired"]


@_uses("describeQueue", "queues", "describe_queue")
def _describe_queue(s: Scene) -> None:
    d = s.op("queues", "describe_queue").sync(topic="orders", queue="work", client=s.client)
    fields = ("acked", "dead_lettered", "leased", "lag")
    totals = [sum(getattr(p, f) for p in d.partitions) for f in fields]
    assert totals == [1, 1, s.queued - 3, s.queued - 2]


@_uses("deleteQueue", "queues", "delete_queue")
def _delete_queue(s: Scene) -> None:
    gone = s.op("queues", "delete_queue").sync_detailed(
        topic="orders", queue="work", client=s.client
    )
    assert gone.status_code == HTTPStatus.NO_CONTENT
    assert s.op("queues", "list_queues").sync(topic="orders", client=s.client).queues == []


@_uses("deleteTopic", "topics", "delete_topic")
def _delete_topic(s: Scene) -> None:
    assert s.op("topics", "delete_topic").sync_detailed(topic="orders", client=s.client).status_code == HTTPStatus.NO_CONTENT
    assert [t.name for t in s.op("topics", "list_topics").sync(client=s.client).topics] == ["carts", "events", "logs"]


def _document_operations(document: dict[str, Any]) -> dict[str, list[str]]:
    """operationId -> its tags."""
    return {op["operationId"]: op["tags"] for ops in document["paths"].values() for op in ops.values()}


# -- the tests -----------------------------------------------------------------------------------


def test_every_operation_in_the_document_is_used_through_the_sdk(sdk: SDK) -> None:
    """Every use in USES, in order, on one app: each sends its own operation, and together they
    send every operation of the document and nothing else."""
    with sdk.client() as client:
        scene = Scene(sdk, client)
        for operation_id, use in USES.items():
            first = len(sdk.used)
            use.run(scene)
            assert operation_id in sdk.used[first:], f"the use of {operation_id} never sent it: {sdk.used[first:]}"
    documented, used = set(_document_operations(sdk.document)), set(sdk.used)
    assert used == documented, f"never used (add a use to USES): {sorted(documented - used)}; not in the document: {sorted(used - documented)}"


def test_one_module_per_operation_named_after_its_operation_id(sdk: SDK) -> None:
    assert _document_operations(sdk.document) == {op_id: [use.tag] for op_id, use in USES.items()}
    tags: dict[str, set[str]] = {}
    for use in USES.values():
        tags.setdefault(use.tag, set()).add(use.module)
    api_dir = sdk.root / PACKAGE / "api"
    assert {p.name for p in api_dir.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(tags)
    for tag, modules in tags.items():
        assert {p.stem for p in (api_dir / tag).glob("*.py") if p.stem != "__init__"} == modules, tag
    package = importlib.import_module(PACKAGE)
    for operation_id, use in USES.items():
        module = sdk.op(use.tag, use.module)
        for fn in ("sync", "sync_detailed", "asyncio", "asyncio_detailed"):
            assert callable(getattr(module, fn)), f"{use.module}.{fn}"
            # the token is optional (a server without an auth file needs none): every operation
            # takes a plain Client as well as an AuthenticatedClient
            client = typing.get_type_hints(getattr(module, fn))["client"]
            assert set(typing.get_args(client)) == {package.AuthenticatedClient, package.Client}, (operation_id, fn, client)
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
