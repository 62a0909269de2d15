"""Bearer tokens, roles and topic/group prefixes: the whole matrix against the app in this
process; a bad auth file refused by `eventlog serve`."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import httpx
import pytest

from api.auth import Principal

from ..conftest import VENV_BIN, run_eventlog
from .test_api import assert_problem

TOKENS = {
    "admin": "admin-token-0000",
    "producer": "producer-token-1",
    "consumer": "consumer-token-2",
    "other": "other-token-3333",
}


@pytest.fixture
def auth_server(app_factory, tmp_path: Path):
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [
        {"name": "ops", "token": TOKENS["admin"], "role": "admin"},
        {"name": "billing-writer", "token_sha256": hashlib.sha256(TOKENS["producer"].encode()).hexdigest(), "role": "producer", "topics": ["billing."]},
        {"name": "billing-reader", "token": TOKENS["consumer"], "role": "consumer", "topics": ["billing."], "groups": ["reports-"]},
        {"name": "elsewhere", "token": TOKENS["other"], "role": "consumer", "topics": ["orders"]},
    ]}))
    server = app_factory(EVENTLOG_AUTH_FILE=str(auth)).start(token=TOKENS["admin"])
    yield server
    server.stop()


def as_(who: str | None, server) -> httpx.Client:
    return server.client(token=None if who is None else TOKENS.get(who, who))


def test_auth_matrix(auth_server) -> None:
    s = auth_server
    with as_("admin", s) as admin:
        assert admin.post("/v1/topics", json={"name": "billing.invoices"}).status_code == 201
        assert admin.post("/v1/topics", json={"name": "orders"}).status_code == 201
    produce = ("POST", "/v1/topics/{t}/records", {"records": [{"value": "v"}]})
    fetch = ("GET", "/v1/topics/{t}/partitions/0/records", None)
    describe = ("GET", "/v1/topics/{t}", None)
    offsets = ("GET", "/v1/topics/{t}/partitions/0/offsets", None)
    alter = ("PATCH", "/v1/topics/{t}/configs", {"configs": {"retention.ms": 1000}})
    delete_records = ("POST", "/v1/topics/{t}/partitions/0/delete-records", {"before_offset": 0})
    cases = [
        # (who, request, topic, expected status)
        (None, produce, "billing.invoices", 401),
        ("not-a-token", produce, "billing.invoices", 401),
        ("producer", produce, "billing.invoices", 200),
        ("producer", produce, "orders", 403),  # outside its prefixes
        ("producer", fetch, "billing.invoices", 403),  # wrong role
        ("producer", describe, "billing.invoices", 200),
        ("consumer", produce, "billing.invoices", 403),
        ("consumer", fetch, "billing.invoices", 200),
        ("consumer", offsets, "billing.invoices", 200),
        ("consumer", fetch, "orders", 403),
        ("consumer", alter, "billing.invoices", 403),
        ("consumer", delete_records, "billing.invoices", 403),
        ("admin", alter, "billing.invoices", 200),
        ("admin", delete_records, "billing.invoices", 200),
        ("admin", fetch, "orders", 200),
        ("other", fetch, "orders", 200),
        ("other", fetch, "billing.invoices", 403),
    ]
    for who, (method, path, body), topic, expected in cases:
        with as_(who, s) as c:
            r = c.request(method, path.format(t=topic), json=body)
        if expected >= 400:
            problem = assert_problem(r, expected, {401: "unauthorized", 403: "forbidden"}[expected])
            assert problem["detail"], (who, method, path)
            if expected == 401:
                assert r.headers["www-authenticate"].startswith("Bearer")
        else:
            assert r.status_code == expected, (who, method, path, r.text)


def test_admin_only_operations_and_filtered_listing(auth_server) -> None:
    s = auth_server
    with as_("admin", s) as admin:
        admin.post("/v1/topics", json={"name": "billing.a"})
        admin.post("/v1/topics", json={"name": "orders"})
    with as_("consumer", s) as c:
        assert_problem(c.post("/v1/topics", json={"name": "billing.b"}), 403, "forbidden")
        assert_problem(c.delete("/v1/topics/billing.a"), 403, "forbidden")
        assert_problem(c.post("/v1/topics/billing.a/partitions", json={"count": 2}), 403, "forbidden")
        assert [t["name"] for t in c.get("/v1/topics").json()["topics"]] == ["billing.a"]
        assert c.get("/metrics").status_code == 200
        assert c.get("/readyz").status_code == 200
    with as_(None, s) as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok"}  # the one open endpoint
        for path in ("/readyz", "/metrics", "/openapi.json", "/v1/topics"):
            assert_problem(anonymous.get(path), 401, "unauthorized")


def test_group_prefixes(auth_server) -> None:
    s = auth_server
    with as_("admin", s) as admin:
        admin.post("/v1/topics", json={"name": "billing.a"})
        admin.post("/v1/topics", json={"name": "orders"})
    commit = {"offsets": [{"topic": "billing.a", "partition": 0, "offset": 0}]}
    with as_("consumer", s) as c:
        assert c.post("/v1/groups/reports-daily/offsets", json=commit).status_code == 200
        assert_problem(c.post("/v1/groups/other-group/offsets", json=commit), 403, "forbidden")
        outside = {"offsets": [{"topic": "orders", "partition": 0, "offset": 0}]}
        assert_problem(c.post("/v1/groups/reports-daily/offsets", json=outside), 403, "forbidden")
        assert c.get("/v1/groups/reports-daily/offsets").json()["offsets"][0]["topic"] == "billing.a"
        assert c.get("/v1/groups").json() == {"groups": ["reports-daily"], "next_after": None}
    with as_("producer", s) as p:
        assert_problem(p.get("/v1/groups/reports-daily/offsets"), 403, "forbidden")


def test_prefixes_never_cover_internal_topics() -> None:
    """An empty prefix (or none) covered __consumer_offsets and __metadata: a consumer whose
    groups were limited read every group's offsets and all topic metadata from them."""
    for role in ("producer", "consumer"):
        unlimited = Principal("u", role)  # no "topics": every prefix
        assert unlimited.covers_topic("orders") and unlimited.covers_topic("__user_made")
        underscored = Principal("x", role, topics=("__",))
        for internal in ("__consumer_offsets", "__metadata"):
            assert not unlimited.covers_topic(internal)
            assert not underscored.covers_topic(internal)
    admin = Principal("ops", "admin")
    assert admin.covers_topic("__consumer_offsets") and admin.covers_topic("__metadata")


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '{"tokens": []}',
        '{"tokens": [{"token": "short", "role": "admin"}]}',
        '{"tokens": [{"token": "long-enough-token", "role": "root"}]}',
        '{"tokens": [{"token_sha256": "abc", "role": "admin"}]}',
    ],
)
def test_a_bad_auth_file_stops_the_server_at_start(tmp_path: Path, content: str) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(content)
    result = run_eventlog("serve", "--data-dir", str(tmp_path / "d"), "--port", "0", env={"EVENTLOG_AUTH_FILE": str(auth)})
    assert result.returncode == 2 and "auth file" in result.stderr


def test_the_installed_command_exits_2_on_a_bad_auth_file(tmp_path: Path) -> None:
    """The refusals above, once through the installed script in a process of its own."""
    auth = tmp_path / "auth.json"
    auth.write_text("not json")
    result = subprocess.run(
        [str(VENV_BIN / "eventlog"), "serve", "--data-dir", str(tmp_path / "d"), "--port", "0"],
        env={"EVENTLOG_AUTH_FILE": str(auth), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "auth file" in result.stderr


def test_warning_when_listening_beyond_loopback_without_auth(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [str(VENV_BIN / "eventlog"), "serve", "--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "without EVENTLOG_AUTH_FILE" in line or "Uvicorn running" in line:
                break
        assert "without EVENTLOG_AUTH_FILE" in line
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()
