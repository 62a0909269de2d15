"""Hardening: topic prefix ACLs on every route and request size limits (the app in this process),
request time limits, slow clients and TLS (a real server)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi.routing import iter_route_contexts

from api.errors import ServerPaths
from app.main import create_app
from app.settings import Settings

from ..conftest import KEPT_ENV, VENV_BIN, free_port, run_eventlog, wait_until
from ..inprocess import InProcessServer
from .test_api import RAW, assert_problem

# -- prefix ACLs on every route ---------------------------------------------------------------

TOKENS = {
    "admin": "admin-token-0000",
    "producer_in": "producer-in-0000",  # producer, topics "billing."
    "producer_out": "producer-out-000",  # producer, topics "orders"
    "consumer_in": "consumer-in-0000",  # consumer, topics "billing.", groups "g-"
    "consumer_out": "consumer-out-000",  # consumer, topics "orders", groups "g-"
    "consumer_all": "consumer-all-000",  # consumer, every topic (no "topics"), groups "g-"
    "producer_all": "producer-all-000",  # producer, every topic (no "topics")
}
TOPIC = "billing.x"  # covered by the *_in tokens only
DOOMED = "billing.doomed"  # deleteTopic's own topic
GROUP = "g-1"  # covered by both consumers
QUEUE = f"/v1/topics/{TOPIC}/queues/q-1"

# operationId -> (who may call it, request). "who" is the role that may besides admin
# ("producer", "consumer", "monitor": every role, "admin": admin only, "open": anyone) and
# whether the request names a topic, which prefixes must then cover. A new operation fails
# test_the_table_lists_every_route until it is added here; if it names a topic, the test below
# then checks that a token whose prefixes do not cover it is refused.
Req = tuple[str, str, Any]  # method, path, JSON body
ROUTES: dict[str, tuple[str, bool, Req]] = {
    "getHealth": ("open", False, ("GET", "/healthz", None)),
    "getReadiness": ("monitor", False, ("GET", "/readyz", None)),
    "getMetrics": ("monitor", False, ("GET", "/metrics", None)),
    "getPrincipal": ("monitor", False, ("GET", "/v1/whoami", None)),
    "createTopic": ("admin", True, ("POST", "/v1/topics", {"name": "billing.new"})),
    "listTopics": ("monitor", False, ("GET", "/v1/topics", None)),  # filtered: test_listings_show_only_covered_names
    "describeTopic": ("producer+consumer", True, ("GET", f"/v1/topics/{TOPIC}", None)),
    "alterTopicConfigs": ("admin", True, ("PATCH", f"/v1/topics/{TOPIC}/configs", {"configs": {"retention.ms": 86400000}})),
    "addPartitions": ("admin", True, ("POST", f"/v1/topics/{TOPIC}/partitions", {"count": 1})),
    "deleteTopic": ("admin", True, ("DELETE", f"/v1/topics/{DOOMED}", None)),
    "produceRecords": ("producer", True, ("POST", f"/v1/topics/{TOPIC}/records", {"records": [{"value": "v"}]})),
    "produceToPartition": ("producer", True, ("POST", f"/v1/topics/{TOPIC}/partitions/0/records", {"records": [{"value": "v"}]})),
    "fetchRecords": ("consumer", True, ("GET", f"/v1/topics/{TOPIC}/partitions/0/records", None)),
    "browseRecords": ("consumer", True, ("GET", f"/v1/topics/{TOPIC}/records", None)),
    "fetchRecordBatches": (
        "consumer", True, ("GET", f"/v1/topics/{TOPIC}/partitions/0/records/batches", None),
    ),
    "appendKeyRecords": ("producer", True, ("POST", f"/v1/topics/{TOPIC}/keys/k-1/records", {"records": [{"value": "v"}]})),
    "readKeyRecords": ("consumer", True, ("GET", f"/v1/topics/{TOPIC}/keys/k-1/records", None)),
    "streamKeyRecords": ("consumer", True, ("GET", f"/v1/topics/{TOPIC}/keys/k-1/records/stream", None)),
    "streamRecords": ("consumer", True, ("GET", f"/v1/topics/{TOPIC}/partitions/0/records/stream", None)),
    "listOffsets": ("consumer", True, ("GET", f"/v1/topics/{TOPIC}/partitions/0/offsets", None)),
    "deleteRecords": ("admin", True, ("POST", f"/v1/topics/{TOPIC}/partitions/0/delete-records", {"before_offset": 0})),
    "listSegments": ("consumer", True, ("GET", f"/v1/topics/{TOPIC}/partitions/0/segments", None)),
    "describeMaintenance": ("producer+consumer", True, ("GET", f"/v1/topics/{TOPIC}/partitions/0/maintenance", None)),
    "commitGroupOffsets": ("consumer", True, (
        "POST", f"/v1/groups/{GROUP}/offsets", {"offsets": [{"topic": TOPIC, "partition": 0, "offset": 0}]},
    )),
    "fetchGroupOffsets": ("consumer", True, ("GET", f"/v1/groups/{GROUP}/offsets?topic={TOPIC}", None)),
    "deleteGroupOffsets": ("consumer", True, ("DELETE", f"/v1/groups/{GROUP}/offsets?topic={TOPIC}", None)),
    "resetGroupOffsets": ("consumer", True, (
        "POST", f"/v1/groups/{GROUP}/offsets/reset",
        {"topic": TOPIC, "to_earliest": True, "dry_run": True},
    )),
    "listGroups": ("monitor", False, ("GET", "/v1/groups", None)),  # filtered by group prefixes
    "createQueue": ("consumer", True, ("PUT", f"/v1/topics/{TOPIC}/queues/q-1", {})),
    "describeQueue": ("consumer", True, ("GET", f"/v1/topics/{TOPIC}/queues/q-1", None)),
    "listQueues": ("consumer", True, ("GET", f"/v1/topics/{TOPIC}/queues", None)),
    "deleteQueue": ("consumer", True, ("DELETE", f"/v1/topics/{TOPIC}/queues/q-1", None)),
    "leaseQueueRecords": ("consumer", True, ("POST", f"/v1/topics/{TOPIC}/queues/q-1/lease", {})),
    "ackQueueRecords": ("consumer", True, ("POST", f"{QUEUE}/ack", {"leases": ["x"]})),
    "releaseQueueRecords": ("consumer", True, ("POST", f"{QUEUE}/release", {"leases": ["x"]})),
    "rejectQueueRecords": ("consumer", True, ("POST", f"{QUEUE}/reject", {"leases": ["x"]})),
    "renewQueueLeases": ("consumer", True, ("POST", f"{QUEUE}/renew", {"leases": ["x"]})),
    "runRetention": ("admin", True, ("POST", "/v1/admin/retention/run", {"topic": TOPIC})),
    "runCompaction": ("admin", True, ("POST", "/v1/admin/compaction/run", {"topic": TOPIC})),
    "createSnapshot": ("admin", True, ("POST", "/v1/snapshots", {"topics": [TOPIC]})),
    "listSnapshots": ("admin", False, ("GET", "/v1/snapshots", None)),
    "describeSnapshot": ("admin", False, ("GET", "/v1/snapshots/none", None)),
    "deleteSnapshot": ("admin", False, ("DELETE", "/v1/snapshots/none", None)),
}
# routes outside the OpenAPI document: the document itself, its viewers, and the web console
NOT_IN_OPENAPI = {
    "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/static/docs/{name}",
    "/", "/console", "/console/", "/console/assets/{name}",
}


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """One app for the module's ACL tests (the conftest factory is per test); the tests only
    add to what it holds, but deleteTopic, on a topic of its own."""
    tmp_path = tmp_path_factory.mktemp("acl")
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [
        {"name": "ops", "token": TOKENS["admin"], "role": "admin"},
        {"name": "producer-in", "token": TOKENS["producer_in"], "role": "producer", "topics": ["billing."]},
        {"name": "producer-out", "token": TOKENS["producer_out"], "role": "producer", "topics": ["orders"]},
        {"name": "consumer-in", "token": TOKENS["consumer_in"], "role": "consumer", "topics": ["billing."], "groups": ["g-"]},
        {"name": "consumer-out", "token": TOKENS["consumer_out"], "role": "consumer", "topics": ["orders"], "groups": ["g-"]},
        {"name": "consumer-all", "token": TOKENS["consumer_all"], "role": "consumer", "groups": ["g-"]},
        {"name": "producer-all", "token": TOKENS["producer_all"], "role": "producer"},
    ]}))
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("EVENTLOG_") and name not in KEPT_ENV:
                mp.delenv(name)
        server = InProcessServer(tmp_path / "data", env={"EVENTLOG_AUTH_FILE": str(auth)}).start(token=TOKENS["admin"])
    with as_("admin", server) as admin:
        for name in (TOPIC, DOOMED, "orders"):
            assert admin.post("/v1/topics", json={"name": name}).status_code == 201
        assert admin.post(f"/v1/topics/{TOPIC}/records", json={"records": [{"value": "v"}]}).status_code == 200
        assert admin.post("/v1/topics/orders/records", json={"records": [{"value": "v"}]}).status_code == 200
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log()


def as_(who: str | None, server) -> httpx.Client:
    return server.client(token=TOKENS[who] if who else None)


def _call(client: httpx.Client, request: Req, headers: dict[str, str] | None = None) -> int:
    method, path, body = request
    if path.endswith("/stream"):  # an event stream never ends: the status is enough
        with client.stream(method, path, headers=headers) as r:
            return r.status_code
    return client.request(method, path, json=body, headers=headers).status_code


def _may(who: str, allowed: str) -> bool:
    role = who.split("_")[0]
    return allowed in ("open", "monitor") or role == "admin" or role in allowed.split("+")


def test_the_table_lists_every_route(acl_server) -> None:
    with as_("admin", acl_server) as admin:
        document = admin.get("/openapi.json").json()
    operations = {op["operationId"] for item in document["paths"].values() for op in item.values()}
    assert operations == set(ROUTES)
    app = create_app(Settings(data_dir=acl_server.data_dir))
    # routers included, flattened; a path convertor ({key:path}) is not part of the document's path
    paths = {re.sub(r":\w+\}", "}", route.path) for route in iter_route_contexts(app.routes)}
    assert paths == set(document["paths"]) | NOT_IN_OPENAPI
    with as_(None, acl_server) as anonymous:
        # the document needs a token; its pages and their assets hold no data and are open
        # (their token field sends the token when they fetch it: api/docs.py)
        assert_problem(anonymous.get("/openapi.json"), 401, "unauthorized")
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect", "/static/docs/swagger-ui.css", "/console",
                     "/console/", "/console/assets/console.js"):
            assert anonymous.get(path).status_code == 200, path
        assert anonymous.get("/", follow_redirects=False).status_code == 302  # to /console
        with as_("consumer_out", acl_server) as c:
            assert c.get("/openapi.json").status_code == 200


@pytest.mark.parametrize("operation_id", sorted(ROUTES))
def test_every_route_checks_roles_and_topic_prefixes(acl_server, operation_id: str) -> None:
    allowed, names_topic, request = ROUTES[operation_id]
    # admin last: its call may change the topic (deleteTopic, deleteRecords)
    for who in ("producer_out", "consumer_out", "producer_in", "consumer_in", "admin"):
        with as_(who, acl_server) as c:
            status = _call(c, request)
        covered = who.endswith("_in") or who == "admin" or not names_topic
        if _may(who, allowed) and covered:
            assert status not in (401, 403) and status < 500, (operation_id, who, status)
        else:
            assert status == 403, (operation_id, who, status)
    if allowed != "open":
        with as_(None, acl_server) as anonymous:
            assert _call(anonymous, request) == 401


def test_variants_of_reads_and_writes_check_prefixes(acl_server) -> None:
    s = acl_server
    with as_("admin", s) as admin:
        batch = admin.get("/v1/topics/orders/partitions/0/records", headers={"accept": RAW}).content
        snapshots_before = len(admin.get("/v1/snapshots").json()["snapshots"])
    raw_produce = ("POST", f"/v1/topics/{TOPIC}/partitions/0/records")
    with as_("producer_out", s) as c:
        r = c.post(raw_produce[1], content=batch, headers={"content-type": RAW})
        assert_problem(r, 403, "forbidden")
    with as_("producer_in", s) as c:
        assert c.post(raw_produce[1], content=batch, headers={"content-type": RAW}).status_code == 200
    fetch = ("GET", f"/v1/topics/{TOPIC}/partitions/0/records", None)
    stream = ("GET", f"/v1/topics/{TOPIC}/partitions/0/records/stream", None)
    with as_("consumer_out", s) as c:
        assert _call(c, fetch, {"accept": RAW}) == 403  # raw fetch
        assert _call(c, stream, {"last-event-id": "0"}) == 403  # an EventSource resuming
        assert _call(c, ("GET", stream[1] + "?offset=0", None)) == 403
        # snapshots write to the server's disk: admin only, even of covered topics (fifty of
        # them from a read-only token once filled the disk and every producer got 507)
        assert_problem(c.post("/v1/snapshots", json={"topics": ["orders", TOPIC]}), 403, "forbidden")
        assert_problem(c.post("/v1/snapshots", json={}), 403, "forbidden")
        assert_problem(c.post("/v1/snapshots"), 403, "forbidden")
        assert_problem(c.post("/v1/snapshots", json={"topics": ["orders"]}), 403, "forbidden")
        # group offsets naming an uncovered topic, in the body or the query
        assert_problem(c.post(f"/v1/groups/{GROUP}/offsets", json={"offsets": [
            {"topic": "orders", "partition": 0, "offset": 0}, {"topic": TOPIC, "partition": 0, "offset": 0},
        ]}), 403, "forbidden")
    with as_("consumer_in", s) as c:
        assert _call(c, fetch, {"accept": RAW}) == 200
        assert _call(c, stream, {"last-event-id": "0"}) == 200
        assert_problem(c.post("/v1/snapshots", json={"topics": [TOPIC]}), 403, "forbidden")
    for who in ("producer_in", "producer_all", "consumer_all"):
        with as_(who, s) as c:
            assert_problem(c.post("/v1/snapshots", json={"topics": [TOPIC]}), 403, "forbidden")
    with as_("admin", s) as admin:
        assert admin.post("/v1/snapshots", json={"topics": [TOPIC]}).status_code == 201
        snapshots = admin.get("/v1/snapshots").json()["snapshots"]
        # the admin's, none of the refused
        assert [snap["topics"] for snap in snapshots[snapshots_before:]] == [[TOPIC]]


def test_listings_and_metrics_show_only_covered_topics_and_groups(acl_server) -> None:
    s = acl_server
    with as_("admin", s) as admin:
        admin.post("/v1/groups/g-1/offsets", json={"offsets": [{"topic": TOPIC, "partition": 0, "offset": 1}]})
        admin.post("/v1/groups/g-2/offsets", json={"offsets": [{"topic": "orders", "partition": 0, "offset": 1}]})
        admin.post("/v1/groups/other/offsets", json={"offsets": [{"topic": "orders", "partition": 0, "offset": 1}]})
        admin.get(f"/v1/topics/{TOPIC}/partitions/0/records")
        everything = admin.get("/metrics").text
        assert f'topic="{TOPIC}"' in everything and 'topic="orders"' in everything
        assert admin.get("/v1/groups").json()["groups"] == ["g-1", "g-2", "other"]
    with as_("consumer_out", s) as c:
        assert [t["name"] for t in c.get("/v1/topics").json()["topics"]] == ["orders"]
        # g-1 is in its group prefix, but its offsets are of billing.x, which it does not cover
        assert c.get("/v1/groups").json() == {"groups": ["g-2"], "next_after": None}
        assert c.get("/v1/groups/g-1/offsets").json()["offsets"] == []  # g-1's offsets are of billing.x
        metrics = c.get("/metrics").text
        assert 'topic="orders"' in metrics and f'topic="{TOPIC}"' not in metrics and DOOMED not in metrics
        assert "eventlog_http_requests_total" in metrics  # the rest is there
    with as_("producer_in", s) as p:
        metrics = p.get("/metrics").text
        assert f'topic="{TOPIC}"' in metrics and 'topic="orders"' not in metrics
        # every group prefix, topics "billing.": only the groups with offsets of billing. topics
        assert p.get("/v1/groups").json() == {"groups": ["g-1"], "next_after": None}
    with as_("producer_out", s) as p:
        assert p.get("/v1/groups").json() == {"groups": ["g-2", "other"], "next_after": None}
        # the filter chooses before the limit counts: pages of what the token may see
        first = p.get("/v1/groups", params={"limit": 1}).json()
        assert first == {"groups": ["g-2"], "next_after": "g-2"}
        last = p.get("/v1/groups", params={"limit": 1, "after": "g-2"}).json()
        assert last == {"groups": ["other"], "next_after": None}
    with as_("consumer_all", s) as c:  # every topic, groups "g-"
        assert c.get("/v1/groups").json() == {"groups": ["g-1", "g-2"], "next_after": None}
        assert c.get("/v1/groups", params={"limit": 1, "after": "g-1"}).json() == {
            "groups": ["g-2"], "next_after": None  # "other" is outside its group prefixes
        }


INTERNAL = ("__consumer_offsets", "__metadata")


def test_internal_topics_are_admin_only(acl_server) -> None:
    """A token whose topics are not limited (only its groups are) read every group's offsets
    from __consumer_offsets and all topic metadata from __metadata: reads, descriptions,
    listings and metrics of internal topics are the admin's alone."""
    s = acl_server
    with as_("admin", s) as admin:
        admin.post("/v1/groups/secret-group/offsets", json={"offsets": [{"topic": "orders", "partition": 0, "offset": 1}]})
        admin.get("/v1/topics/__consumer_offsets/partitions/0/records")  # a fetch metric labelled with it
        for topic in INTERNAL:
            for path in _internal_reads(topic):
                assert _call(admin, ("GET", path, None)) == 200, path
        assert {t["name"] for t in admin.get("/v1/topics?internal=true").json()["topics"]} >= set(INTERNAL)
        assert 'topic="__consumer_offsets"' in admin.get("/metrics").text
    for who in ("consumer_all", "producer_all", "consumer_in"):
        with as_(who, s) as c:
            for topic in INTERNAL:
                for path in _internal_reads(topic):
                    assert _call(c, ("GET", path, None)) == 403, (who, path)
                assert_problem(c.get(f"/v1/groups/g-1/offsets?topic={topic}"), 403, "forbidden")
            listed = [t["name"] for t in c.get("/v1/topics?internal=true").json()["topics"]]
            assert not any(name.startswith("__") for name in listed), (who, listed)
            metrics = c.get("/metrics").text
            assert 'topic="__' not in metrics, who
            # a group outside its group prefixes (producer_all has none: every group)
            assert ("secret-group" in c.get("/v1/groups").json()["groups"]) == (who == "producer_all")
    with as_("consumer_all", s) as c:
        # its own group's offsets stay readable through the groups API
        c.post("/v1/groups/g-all/offsets", json={"offsets": [{"topic": "orders", "partition": 0, "offset": 1}]})
        assert [o["topic"] for o in c.get("/v1/groups/g-all/offsets").json()["offsets"]] == ["orders"]
        # the commit itself may not name an internal topic
        r = c.post("/v1/groups/g-all/offsets", json={"offsets": [{"topic": "__metadata", "partition": 0, "offset": 0}]})
        assert_problem(r, 403, "forbidden")


def _internal_reads(topic: str) -> list[str]:
    base = f"/v1/topics/{topic}/partitions/0"
    return [f"/v1/topics/{topic}", f"{base}/records", f"{base}/records/stream", f"{base}/offsets", f"{base}/segments"]


def test_error_details_name_paths_from_the_data_dir_never_absolute() -> None:
    """StorageError details carried the server's absolute paths (and snapshot answers did)."""
    paths = ServerPaths(Path("/srv/el/data"), Path("/srv/el/data/snapshots"), (Path("/srv/el/data"), Path("/mnt/d2/log")))
    cases = {
        "/srv/el/data/t-0/00000000000000000000.log: torn": "t-0/00000000000000000000.log: torn",
        "/srv/el/data/snapshots/20260101T000000000Z-abcdef: full": "snapshots/20260101T000000000Z-abcdef: full",
        "data dir /srv/el/data: locked": "data dir <data dir>: locked",
        "/mnt/d2/log/t-1/x.index: corrupt": "<log dir>/t-1/x.index: corrupt",
        "[Errno 28] No space left on device: '/srv/el/data/t-0/x'": "[Errno 28] No space left on device: 't-0/x'",
        "/srv/el/database/x and /x/srv/el/data/y": "/srv/el/database/x and /x/srv/el/data/y",  # not ours
    }
    for detail, shown in cases.items():
        assert paths.scrub(detail) == shown
    assert paths.snapshot("20260101T000000000Z-abcdef") == "snapshots/20260101T000000000Z-abcdef"
    elsewhere = ServerPaths(Path("/srv/el/data"), Path("/backup/snaps"))
    assert elsewhere.snapshot("20260101T000000000Z-abcdef") == "20260101T000000000Z-abcdef"
    assert elsewhere.scrub("/backup/snaps/x/manifest.json: bad") == "<snapshot dir>/x/manifest.json: bad"


# -- request size limits ----------------------------------------------------------------------


def test_a_chunked_body_over_the_limit_is_413_on_every_kind_of_route(any_server_factory) -> None:
    server = any_server_factory(EVENTLOG_MAX_REQUEST_BYTES="2000").start()

    def chunks(prefix: bytes) -> Iterator[bytes]:
        yield prefix
        for _ in range(10):
            yield b"y" * 500

    with server.client() as c:
        # a pydantic-validated body (FastAPI reads it): was a 400 "error parsing the body"
        r = c.post("/v1/topics", content=chunks(b'{"name": "t", "configs": {"x": "'), headers={"content-type": "application/json"})
        assert_problem(r, 413, "request_too_large")
        assert r.headers["connection"] == "close"
        assert c.get("/v1/topics").json()["topics"] == []
        c.post("/v1/topics", json={"name": "t"})
        r = c.post("/v1/topics/t/partitions/0/records", content=chunks(b"\0"), headers={"content-type": RAW})
        assert_problem(r, 413, "request_too_large")
        declared = c.post("/v1/topics/t/records", content=b"x" * 2001, headers={"content-type": "application/json"})
        assert_problem(declared, 413, "request_too_large")
        assert c.get("/v1/topics/t").json()["partitions"][0]["high_watermark"] == 0
    server.stop()


# -- slow clients -----------------------------------------------------------------------------


def _read_response(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection (bounded by the socket timeout)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return data
        if not chunk:
            return data
        data += chunk


def _problem_of(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


def test_a_client_sending_headers_byte_by_byte_is_cut_off_while_others_are_served(server_factory) -> None:
    server = server_factory(EVENTLOG_HEADER_TIMEOUT_MS="1000").start()
    head = b"GET /v1/topics HTTP/1.1\r\nhost: x\r\n" + b"x-padding: " + b"p" * 10_000 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as slow, server.client() as c:
        sent = 0
        closed = False
        deadline = time.monotonic() + 60
        while not closed and time.monotonic() < deadline:
            try:
                slow.sendall(head[sent : sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            if sent % 20 == 0:
                # the server goes on serving others meanwhile
                assert c.get("/v1/topics").status_code == 200
                slow.setblocking(False)
                try:
                    closed = slow.recv(1, socket.MSG_PEEK) is not None
                except BlockingIOError:
                    pass
                finally:
                    slow.setblocking(True)
            time.sleep(0.01)  # the slow client under test: one byte every 10 ms
        assert sent < len(head), "the whole head went through: the slow client was never cut off"
        slow.settimeout(30)
        status, problem = _problem_of(_read_response(slow))
        assert (status, problem["code"]) == (408, "request_timeout")
        assert c.get("/v1/topics").status_code == 200


def test_a_connection_that_sends_nothing_is_closed(server_factory) -> None:
    server = server_factory(EVENTLOG_HEADER_TIMEOUT_MS="500").start()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as idle:
        assert _read_response(idle) == b""  # closed, without an answer to a request never made


def test_headers_over_the_limit_are_431(server_factory) -> None:
    server = server_factory(EVENTLOG_MAX_HEADER_BYTES="4096").start()
    with server.client() as c:
        assert c.get("/v1/topics", headers={"x-padding": "p" * 3000}).status_code == 200
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"GET /v1/topics HTTP/1.1\r\nhost: x\r\n")
        for _ in range(10):  # 10 KB of headers in pieces, never ending
            try:
                s.sendall(b"x-padding: " + b"p" * 1000 + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
        status, problem = _problem_of(_read_response(s))
        assert (status, problem["code"]) == (431, "headers_too_large")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/topics/t/records", {"records": [{"value": "x" * 100}]}),  # read by the route
        ("/v1/topics", {"name": "other", "configs": {"retention.ms": 1000}}),  # read by FastAPI
    ],
)
def test_a_slow_body_is_cut_off_with_408_and_changes_nothing(server_factory, path: str, body: dict) -> None:
    server = server_factory(EVENTLOG_REQUEST_TIMEOUT_MS="1000").start()
    with server.client() as c:
        c.post("/v1/topics", json={"name": "t"})
        raw = json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as slow:
            slow.sendall(
                b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" % path.encode()
                + b"content-length: %d\r\n\r\n" % len(raw) + raw[:10]
            )
            assert c.get("/v1/topics/t").status_code == 200  # others are served meanwhile
            response = _read_response(slow)  # the rest never comes; the server answers and closes
        status, problem = _problem_of(response)
        assert (status, problem["code"]) == (408, "request_timeout")
        assert b"connection: close" in response.lower()
        assert c.get("/v1/topics/t").json()["partitions"][0]["high_watermark"] == 0
        assert [t["name"] for t in c.get("/v1/topics").json()["topics"]] == ["t"]
    server.stop()


def test_a_client_that_does_not_read_its_response_is_dropped(server_factory) -> None:
    server = server_factory(EVENTLOG_REQUEST_TIMEOUT_MS="1000").start()
    value = "x" * 1_000_000
    with server.client() as c:
        c.post("/v1/topics", json={"name": "big", "configs": {"max.message.bytes": 2_000_000}})
        for _ in range(24):
            assert c.post("/v1/topics/big/records", json={"records": [{"value": value}]}).status_code == 200
        with socket.socket() as stalled:
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.settimeout(30)
            stalled.connect(("127.0.0.1", server.port))
            stalled.sendall(
                b"GET /v1/topics/big/partitions/0/records?max_bytes=67108864 HTTP/1.1\r\nhost: x\r\n"
                b"accept: application/vnd.kafka.record-batch.v2\r\n\r\n"
            )

            def dropped() -> bool:
                assert c.get("/v1/topics").status_code == 200  # meanwhile others are served
                return "took no response bytes" in server.log()

            wait_until(dropped, timeout=60, what="the stalled reader being dropped", interval=0.1)
            received = _read_response(stalled)
        head, _, body = received.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        assert length > 24_000_000 and len(body) < length  # cut short, connection closed
        assert c.get("/readyz").status_code == 200
    server.stop()


# -- request time limit on answers (the middleware on its own, with an app that never answers) --


async def _never(scope, receive, send) -> None:
    while (await receive())["type"] == "http.request":
        pass
    await anyio.Event().wait()


async def _call_asgi(app, method: str, path: str, body: list[bytes]) -> tuple[int, dict]:
    messages = [{"type": "http.request", "body": b, "more_body": i < len(body) - 1} for i, b in enumerate(body)]
    stalled = anyio.Event()
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await stalled.wait()  # the client neither sends more nor goes away
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    path, _, query = path.partition("?")
    scope = {"type": "http", "method": method, "path": path, "query_string": query.encode(), "headers": []}
    with anyio.fail_after(30):
        await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body_bytes = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body_bytes)


async def test_a_get_without_an_answer_in_time_is_503() -> None:
    app = _under_policy(_never, request_timeout_ms=200)
    status, problem = await _call_asgi(app, "GET", "/v1/topics/t/partitions/0/offsets", [b""])
    assert (status, problem["code"], problem["limit_ms"]) == (503, "request_timeout", 200)
    # a long poll gets its max_wait_ms on top, and still ends
    status, problem = await _call_asgi(app, "GET", "/v1/topics/t/partitions/0/records?max_wait_ms=100", [b""])
    assert (status, problem["code"]) == (503, "request_timeout")


def _under_policy(inner, *, request_timeout_ms: int):
    """`inner` wrapped in the request policy as a route of the offsets' template is."""
    from types import SimpleNamespace

    from api.observability import AccessLog, Metrics
    from api.policy import Policy, Rule
    from api.quotas import QuotaConfig, QuotaManager

    policy = Policy(
        SimpleNamespace(engine=None, shutting_down=False), metrics=Metrics(), authenticator=None,
        quotas=QuotaManager(QuotaConfig()), access_log=AccessLog(False), max_request_bytes=1024,
        request_timeout_ms=request_timeout_ms,
    )
    rule = Rule("/v1/topics/{topic}/partitions/{partition}/offsets", frozenset({"GET"}))

    async def app(scope, receive, send):
        await policy.serve(rule, inner, scope, receive, send)

    return app


# -- TLS ---------------------------------------------------------------------------------------


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:  # pragma: no cover - the image has it
        pytest.fail("the openssl command is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def test_https_with_a_certificate_the_client_verifies(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    port = free_port()
    log_path = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLOG_")} | KEPT_ENV
    trusted = ssl.create_default_context(cafile=str(cert))
    url = f"https://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(VENV_BIN / "eventlog"), "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port),
             "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        try:
            with httpx.Client(base_url=url, verify=trusted, timeout=30) as c:
                deadline = time.monotonic() + 30
                while True:
                    assert proc.poll() is None, log_path.read_text()
                    try:
                        if c.get("/readyz").status_code == 200:
                            break
                    except httpx.TransportError:
                        assert time.monotonic() < deadline, log_path.read_text()
                        time.sleep(0.05)  # polling the starting server, as ServerProcess.start
                assert c.post("/v1/topics", json={"name": "t"}).status_code == 201
                assert c.post("/v1/topics/t/records", json={"records": [{"value": "over tls"}]}).status_code == 200
                assert c.get("/v1/topics/t/partitions/0/records").json()["records"][0]["value"] == "over tls"
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                httpx.get(f"{url}/healthz", timeout=30)  # the default trust store does not know it
            with pytest.raises(httpx.TransportError):
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30)  # plain http is not spoken
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log_path.read_text()


@pytest.mark.parametrize(
    ("args", "reason"),
    [(["--ssl-keyfile", "{key}"], "ssl_keyfile needs ssl_certfile"), (["--ssl-certfile", "{missing}"], "not a readable file")],
)
def test_bad_tls_settings_stop_the_server_at_start(tmp_path: Path, args: list[str], reason: str) -> None:
    _cert, key = _self_signed(tmp_path)
    args = [a.format(key=key, missing=tmp_path / "missing.pem") for a in args]
    result = run_eventlog("serve", "--data-dir", str(tmp_path / "d"), "--port", "0", *args)
    assert result.returncode == 2 and reason in result.stderr
