"""The hot routes are served without FastAPI's machinery (produce: api/lane.py, ahead of the
middleware; fetch: api/records.py, _FastRoute); every answer must be the one the documented
route gives."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.routing import Match

from api import lane, records

RAW = records.RECORD_BATCH_MEDIA_TYPE

# (taken by a fast route, method, path, headers, JSON body): parameters the fast route reads and
# ones it leaves to the documented route
REQUESTS = [
    (True, "GET", "/v1/topics/t/partitions/1/records", {}, None),
    (True, "GET", "/v1/topics/t/partitions/1/records?offset=1&max_records=2", {}, None),
    (True, "GET", "/v1/topics/t/partitions/1/records?offset=2&max_bytes=1&key_format=base64&value_format=json", {}, None),
    (True, "GET", "/v1/topics/t/partitions/1/records?offset=0&max_records=100000&max_bytes=67108864", {}, None),
    (True, "GET", "/v1/topics/t/partitions/1/records?offset=1", {"accept": RAW}, None),
    (True, "GET", "/v1/topics/t/partitions/01/records?offset=1&offset=0&unknown=3", {}, None),
    (True, "GET", "/v1/topics/t/partitions/1/records?offset=9", {}, None),
    (True, "GET", "/v1/topics/t/partitions/7/records", {}, None),
    (True, "GET", "/v1/topics/nope/partitions/0/records", {}, None),
    (False, "GET", "/v1/topics/t/partitions/x/records", {}, None),
    (False, "GET", "/v1/topics/t/partitions/-1/records", {}, None),
    (False, "GET", "/v1/topics/t/partitions/1/records?offset=-1", {}, None),
    (False, "GET", "/v1/topics/t/partitions/1/records?offset=", {}, None),
    (False, "GET", "/v1/topics/t/partitions/1/records?offset=+1", {}, None),
    (False, "GET", "/v1/topics/t/partitions/1/records?offset=1.0", {}, None),
    (False, "GET", "/v1/topics/t/partitions/1/records?max_records=0", {}, None),
    (False, "GET", "/v1/topics/t/partitions/1/records?max_records=100001", {}, None),
    (False, "GET", "/v1/topics/t/partitions/1/records?max_bytes=67108865", {}, None),
    (False, "GET", "/v1/topics/t/partitions/1/records?max_wait_ms=300001", {}, None),
    (False, "GET", "/v1/topics/t/partitions/1/records?key_format=hex", {}, None),
    (False, "GET", "/v1/topics/t/partitions/1/records?offset=99999999999999999999999", {}, None),
    (True, "POST", "/v1/topics/t/records", {}, {"records": []}),
    (True, "POST", "/v1/topics/t/records", {}, {"records": [{"value": 1}]}),
    (True, "POST", "/v1/topics/t/records", {"idempotency-key": " "}, {"records": [{"value": "v"}]}),
    (True, "POST", "/v1/topics/nope/records", {}, {"records": [{"value": "v"}]}),
    (True, "POST", "/v1/topics/__metadata/records", {}, {"records": [{"value": "v"}]}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"if-match": "x"}, {"records": [{"value": "v"}]}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"if-match": '"0"'}, {"records": [{"value": "v"}]}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"content-type": "text/plain"}, None),
    (True, "POST", "/v1/topics/t/partitions/9/records", {}, {"records": [{"value": "v"}]}),
    (True, "POST", "/v1/topics/t/partitions/01/records", {"idempotency-key": "k1"}, {"records": [{"value": "v", "timestamp": 5}]}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"idempotency-key": "k1"}, {"records": [{"value": "v", "timestamp": 5}]}),
    (True, "POST", "/v1/topics/t/records", {"idempotency-key": "k2"}, {"records": [{"value": "a", "timestamp": 6}, {"value": "b", "timestamp": 7}]}),
    (True, "POST", "/v1/topics/t/records", {"idempotency-key": "k2"}, {"records": [{"value": "a", "timestamp": 6}, {"value": "b", "timestamp": 7}]}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"content-type": RAW}, {"not": "a batch"}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"content-type": "application/json; charset=utf-8"}, {"records": 3}),
    (True, "POST", "/v1/topics/t/records", {"content-type": "text/plain"}, {"records": [{"key": "k", "value": "v", "timestamp": 8}]}),
    (True, "POST", "/v1/topics/__consumer_offsets/partitions/0/records", {}, {"records": [{"value": "v"}]}),
    # per-key appends (api/keys.py)
    (True, "POST", "/v1/topics/t/keys/k1/records", {"if-none-match": "*"}, {"records": [{"value": "v", "timestamp": 10}]}),
    (True, "POST", "/v1/topics/t/keys/k1/records", {"if-none-match": "*"}, {"records": [{"value": "v", "timestamp": 10}]}),
    (True, "POST", "/v1/topics/t/keys/k1/records", {"if-match": '"0"'}, {"records": [{"value": "w"}]}),
    (True, "POST", "/v1/topics/t/keys/a/b/c/records", {"idempotency-key": "k3"}, {"records": [{"value": "x", "timestamp": 11}]}),
    (True, "POST", "/v1/topics/t/keys/a/b/c/records", {"idempotency-key": "k3"}, {"records": [{"value": "x", "timestamp": 11}]}),
    (True, "POST", "/v1/topics/t/keys/AAE/records?key_format=base64", {}, {"records": [{"value": "b", "timestamp": 12}]}),
    (True, "POST", "/v1/topics/t/keys/!!/records?key_format=base64", {}, {"records": [{"value": "b"}]}),
    (True, "POST", "/v1/topics/t/keys/k1/records", {"if-match": "nope"}, {"records": [{"value": "v"}]}),
    # conditions (api/conditions.py): one ETag grammar, 409 or 412, the body's faults first
    (True, "POST", "/v1/topics/t/keys/k1/records", {"if-match": ' W/"1" '},
     {"records": [{"value": "w"}]}),
    (True, "POST", "/v1/topics/t/keys/k9/records", {"if-match": "-1"},
     {"records": [{"value": "w", "timestamp": 13}]}),
    (True, "POST", "/v1/topics/t/keys/k1/records", {"if-none-match": '"3"'},
     {"records": [{"value": "w"}]}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"if-match": 'W/"0"'},
     {"records": [{"value": "v"}]}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"if-match": "-1"},
     {"records": [{"value": "v"}]}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"if-match": '"5"'},
     {"records": [{"value": "v"}], "expected_offset": 4}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {},
     {"records": [{"value": "v"}], "expected_offset": 0}),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"if-match": "x"},
     [{"value": "v"}]),
    (True, "POST", "/v1/topics/t/partitions/1/records", {"if-match": "x"},
     {"records": [{"value": "v"}], "expected_offset": -1}),
    (True, "POST", "/v1/topics/t/keys/k1/records", {"content-type": "text/plain"}, {"records": [{"value": "v"}]}),
    (True, "POST", "/v1/topics/t/keys/k1/records", {}, {"records": [{"key": "k", "value": "v"}]}),
    (True, "POST", "/v1/topics/nope/keys/k1/records", {}, {"records": [{"value": "v"}]}),
    (False, "POST", "/v1/topics/t/keys/k1/records?key_format=hex", {}, {"records": [{"value": "v"}]}),
    (False, "POST", "/v1/topics/t/keys/k1/records?other=1", {}, {"records": [{"value": "v"}]}),
    (False, "POST", "/v1/topics/t/partitions/x/records", {}, {"records": [{"value": "v"}]}),
    (False, "POST", "/v1/topics/t/partitions/1/records/", {}, {"records": [{"value": "v"}]}),
    (False, "POST", "/v1/topics/t/partitions/%2B1/records", {}, {"records": [{"value": "v", "timestamp": 9}]}),
    (False, "PUT", "/v1/topics/t/records", {}, None),
    (True, "HEAD", "/v1/topics/t/partitions/1/records", {}, None),  # served as its GET (app/main.py)
    (False, "DELETE", "/v1/topics/t/partitions/1/records", {}, None),
]


def _answers(server) -> list[tuple[int, str | None, bytes, dict[str, str]]]:
    out = []
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "t", "partitions": 2}).status_code == 201
        for i in range(3):
            ok = c.post("/v1/topics/t/partitions/1/records", json={"records": [{"key": "aw==", "value": str(i), "timestamp": i}]})
            assert ok.status_code == 200
        for _fast, method, path, headers, body in REQUESTS:
            r = c.request(method, path, headers=headers, json=body) if body is not None else c.request(method, path, headers=headers)
            kept = {k: r.headers[k] for k in ("allow", "etag", "x-next-offset", "x-high-watermark", "content-type", "idempotent-replayed", "connection") if k in r.headers}
            out.append((r.status_code, r.headers.get("content-type"), r.content, kept))
    return out


@pytest.mark.in_process_only  # patches the app's routing in this process
def test_every_answer_is_the_documented_routes(app_factory, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    matches = records._FastRoute.matches
    lane_match = lane.HotLane.match

    def counting(self, scope):
        match, child = matches(self, scope)
        if match is Match.FULL and not scope.get("eventlog.allow_probe"):  # (a 405's Allow asks every route)
            taken.append(f"{scope['method']} {scope['path']}?{scope['query_string'].decode()}")
        return match, child

    def lane_counting(self, scope):
        found = lane_match(self, scope)
        if found is not None:
            taken.append(f"{scope['method']} {scope['path']}?{scope['query_string'].decode()}")
        return found

    monkeypatch.setattr(records._FastRoute, "matches", counting)
    monkeypatch.setattr(lane.HotLane, "match", lane_counting)
    fast = _answers(app_factory(tmp_path / "fast").start())
    assert taken[:3] == ["POST /v1/topics/t/partitions/1/records?"] * 3  # the set-up's produces
    as_get = {"HEAD": "GET"}
    assert taken[3:] == [f"{as_get.get(m, m)} {p}" if "?" in p else f"{as_get.get(m, m)} {p}?"
                         for fast, m, p, _h, _b in REQUESTS if fast]
    monkeypatch.setattr(records._FastRoute, "matches", lambda self, scope: (Match.NONE, {}))
    monkeypatch.setattr(lane.HotLane, "match", lambda self, scope: None)
    documented = _answers(app_factory(tmp_path / "documented").start())
    for request, a, b in zip(REQUESTS, fast, documented):
        assert a == b, request


def test_the_hot_routes_stay_documented(app_server) -> None:
    with app_server.client() as c:
        paths = c.get("/openapi.json").json()["paths"]
    assert paths["/v1/topics/{topic}/records"]["post"]["operationId"] == "produceRecords"
    assert paths["/v1/topics/{topic}/partitions/{partition}/records"]["post"]["operationId"] == "produceToPartition"
    assert paths["/v1/topics/{topic}/partitions/{partition}/records"]["get"]["operationId"] == "fetchRecords"


def test_fast_routes_check_rights_as_the_dependencies_do(app_factory, tmp_path) -> None:
    import json

    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [
        {"name": "ops", "token": "admin-token-1", "role": "admin"},
        {"name": "reader", "token": "reader-token-1", "role": "consumer", "topics": ["t"]},
        {"name": "other", "token": "other-token-1", "role": "producer", "topics": ["u"]},
    ]}))
    server = app_factory(EVENTLOG_AUTH_FILE=str(auth)).start(token="admin-token-1")
    with server.client() as c:
        admin = {"authorization": "Bearer admin-token-1"}
        assert c.post("/v1/topics", json={"name": "t", "partitions": 1}, headers=admin).status_code == 201
        body = {"records": [{"value": "v"}]}
        r = c.post("/v1/topics/t/records", json=body)
        assert (r.status_code, r.json()["code"]) == (401, "unauthorized")
        r = c.post("/v1/topics/t/records", json=body, headers={"authorization": "Bearer reader-token-1"})
        assert (r.status_code, r.json()["detail"]) == (403, "role 'consumer' may not write")
        r = c.post("/v1/topics/t/partitions/0/records", json=body, headers={"authorization": "Bearer other-token-1"})
        assert (r.status_code, r.json()["detail"]) == (403, "'other' has no access to topic 't'")
        r = c.get("/v1/topics/t/partitions/0/records", headers={"authorization": "Bearer other-token-1"})
        assert (r.status_code, r.json()["detail"]) == (403, "role 'producer' may not read")
        assert c.post("/v1/topics/t/records", json=body, headers=admin).status_code == 200
        r = c.get("/v1/topics/t/partitions/0/records", headers={"authorization": "Bearer reader-token-1"})
        assert r.status_code == 200 and [x["value"] for x in r.json()["records"]] == ["v"]


@pytest.mark.in_process_only  # reads this process's log records
@pytest.mark.parametrize("sample", ["1", "1e-12"])
def test_the_access_log_has_a_line_per_request_soon_after(app_factory, tmp_path, caplog, sample: str) -> None:
    import logging
    import time

    import orjson

    caplog.set_level(logging.INFO, logger="eventlog.access")
    server = app_factory(tmp_path / sample, EVENTLOG_ACCESS_LOG="true", EVENTLOG_ACCESS_LOG_SAMPLE=sample).start()
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "t"}).status_code == 201
        assert c.post("/v1/topics/t/partitions/0/records", json={"records": [{"value": "v"}]}).status_code == 200
        bad = c.post("/v1/topics/t/partitions/0/records", content=b"{", headers={"content-type": "application/json"})
        assert bad.status_code == 400
        assert c.get("/v1/topics/t").status_code == 200
    expected = [
        ("POST", "/v1/topics", 201),
        ("POST", "/v1/topics/{topic}/partitions/{partition}/records", 200),
        ("POST", "/v1/topics/{topic}/partitions/{partition}/records", 400),
        ("GET", "/v1/topics/{topic}", 200),
    ]
    if sample != "1":
        expected = [e for e in expected if e[2] >= 400]  # errors are always written
    deadline = time.monotonic() + 5
    while True:
        lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "eventlog.access"]
        if len(lines) >= len(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(0.3)  # nothing more comes
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "eventlog.access"]
    assert [(x["method"], x["route"], x["status"]) for x in lines] == expected
    assert all(x["ms"] >= 0 and x["principal"] == "anonymous" for x in lines)


# -- the same policy on both paths: auth, quotas, limits, event streams -------------------------

_TOKENS = {"tokens": [
    {"name": "ops", "token": "admin-token-1", "role": "admin"},
    {"name": "reader", "token": "reader-token-1", "role": "consumer", "topics": ["t"]},
    {"name": "other", "token": "other-token-1", "role": "producer", "topics": ["u"]},
    {"name": "slow", "token": "slow-token-1", "role": "admin", "quota": {"produce_bytes_per_sec": 100, "fetch_bytes_per_sec": 100}},
]}
_KEPT = ("content-type", "connection", "retry-after", "www-authenticate", "cache-control", "etag")


def _bearer(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _policy_answers(server) -> list:
    """What every step of the request policy answers, request by request (fields that change
    from run to run left out), and the metrics' route labels."""
    out: list = []
    body = {"records": [{"value": "v" * 150}]}

    def keep(r) -> None:
        code = r.json().get("code") if r.headers.get("content-type", "").startswith("application/problem+json") else None
        out.append((r.request.method, r.request.url.path, r.status_code, code, {k: r.headers[k] for k in _KEPT if k in r.headers}))

    with server.client(token="admin-token-1") as c:
        assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
        assert c.post("/v1/topics/t/partitions/0/records", json={"records": [{"value": "a", "timestamp": 1}, {"value": "b", "timestamp": 2}]}).status_code == 200
        for path in ("/v1/topics/t/records", "/v1/topics/t/partitions/0/records", "/v1/topics/t/keys/k/records"):
            for token in (None, "nope-token-1", "reader-token-1", "other-token-1", "admin-token-1"):
                keep(c.post(path, json=body, headers={"authorization": f"Bearer {token}"} if token else {"authorization": ""}))
            # limits: a declared size over max_request_bytes; a chunked one that passes it
            keep(c.post(path, content=b"x" * 2048, headers={"content-type": "application/json"}))
            keep(c.post(path, content=iter([b"{", b" " * 1500, b"}"]), headers={"content-type": "application/json"}))
            # quotas: the second request of a principal over its produce quota
            keep(c.post(path, json=body, headers=_bearer("slow-token-1")))
            keep(c.post(path, json=body, headers=_bearer("slow-token-1")))
        stream = "/v1/topics/t/partitions/0/records/stream"
        for token, query in ((None, "?offset=0"), ("other-token-1", "?offset=0"), ("reader-token-1", "?offset=99"),
                             ("reader-token-1", "?offset=0"), ("admin-token-1", "?offset=0&value_format=json")):
            with c.stream("GET", stream + query, headers=_bearer(token) if token else {"authorization": ""}) as r:
                if r.status_code != 200:
                    r.read()
                    keep(r)
                    continue
                events = b""
                for piece in r.iter_bytes():
                    events += piece
                    if events.count(b"\n\n") >= 3 or b"event: error" in events:
                        break
                out.append((stream + query, r.status_code, {k: r.headers[k] for k in _KEPT if k in r.headers},
                            events.split(b"\n\n")[:3]))
        text = c.get("/metrics").text
    out.append(sorted(
        line.split("{", 1)[1].split("}", 1)[0] for line in text.splitlines()
        if line.startswith("eventlog_http_requests_total{") and "/metrics" not in line
    ))
    return out


@pytest.mark.in_process_only  # patches the app's routing in this process
def test_the_lane_and_the_routes_apply_the_same_policy(app_factory, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps(_TOKENS))
    settings = {"EVENTLOG_AUTH_FILE": str(auth), "EVENTLOG_MAX_REQUEST_BYTES": "1024",
                "EVENTLOG_QUOTA_WINDOW_NUM": "2", "EVENTLOG_QUOTA_WINDOW_SIZE_MS": "1000"}
    taken: list[str] = []
    lane_match = lane.HotLane.match

    def lane_counting(self, scope):
        found = lane_match(self, scope)
        if found is not None:
            taken.append(scope["path"])
        return found

    monkeypatch.setattr(lane.HotLane, "match", lane_counting)
    fast = _policy_answers(app_factory(tmp_path / "fast", **settings).start(token="admin-token-1"))
    assert len(taken) > 30 and any(p.endswith("/stream") for p in taken)
    monkeypatch.setattr(lane.HotLane, "match", lambda self, scope: None)
    documented = _policy_answers(app_factory(tmp_path / "documented", **settings).start(token="admin-token-1"))
    assert len(fast) == len(documented)
    for a, b in zip(fast, documented):
        assert a == b
    statuses = {x[2] for x in fast if len(x) == 5}
    assert {401, 403, 413, 429, 200} <= statuses, statuses


# -- queues: lease and the settle calls (api/queues.py) through the lane ------------------------

_QUEUE_TOKENS = {"tokens": [
    {"name": "ops", "token": "admin-token-1", "role": "admin"},
    {"name": "reader", "token": "reader-token-1", "role": "consumer", "topics": ["t"]},
    {"name": "other", "token": "other-token-1", "role": "producer", "topics": ["t"]},
    {"name": "elsewhere", "token": "elsewhere-token-1", "role": "consumer", "topics": ["u"]},
    {"name": "slow", "token": "slow-token-1", "role": "consumer", "topics": ["t"],
     "quota": {"fetch_bytes_per_sec": 100}},
]}
_Q = "/v1/topics/t/queues/q/"
_JSON = {"content-type": "application/json"}
_ONE = b'{"max_records": 1}'


def _queue_steps(got: list[str]) -> list[tuple[bool, str | None, str, dict[str, str], Any]]:
    """(taken by the lane, token, path, headers, body: JSON, bytes, or a callable of the leases
    answered so far): the happy paths and every refusal, in an order whose answers do not
    depend on the clock (every lock is long)."""
    r, a, other, slow = "reader-token-1", "admin-token-1", "other-token-1", "slow-token-1"
    one = {"max_records": 1}
    return [
        (True, None, _Q + "lease", {}, one),  # 401
        (True, "nope-token-1", _Q + "ack", {}, {"leases": ["x"]}),  # 401
        (True, other, _Q + "lease", {}, one),  # 403: a producer may not read
        (True, "elsewhere-token-1", _Q + "renew", {}, {"leases": ["x"]}),  # 403: not topic t
        (True, r, _Q + "lease", {}, {"max_records": 2}),
        (True, r, _Q + "lease?key_format=base64&value_format=string", {},
         {"max_records": 1, "lock_ms": None, "wait_ms": 0}),
        (True, r, _Q + "lease?value_format=json&unknown=1", {}, one),  # 422 not_json (leased)
        (True, r, _Q + "lease?value_format=base64", {}, {"max_records": 1, "lock_ms": 60_000}),
        (True, r, _Q + "lease?value_format=json", {}, one),  # 422 not_json again
        (False, r, _Q + "lease?key_format=hex", {}, one),  # FastAPI's 422
        (True, r, "/v1/topics/t/queues/nope/lease", {}, one),  # 404 queue
        (True, a, "/v1/topics/nope/queues/q/lease", {}, one),  # 404 topic
        (True, r, "/v1/topics/nope/queues/q/lease", {}, one),  # 403: not topic nope
        (True, r, _Q + "ack?topic=u", {}, {"leases": ["x"]}),  # 403: the query's topic
        (True, a, "/v1/topics/__queue_state/queues/q/lease", {}, one),
        # bodies the lane leaves to the route (its 400 and 422 answers)
        (True, r, _Q + "lease", _JSON, b"{"),
        (True, r, _Q + "lease", _JSON, b""),
        (True, r, _Q + "lease", _JSON, b"[]"),
        (True, r, _Q + "lease", _JSON, b'{"max_records": NaN}'),
        (True, r, _Q + "lease", _JSON, b"\xef\xbb\xbf" + _ONE),  # (json.loads takes it)
        (True, r, _Q + "lease", {}, {"max_records": 0}),
        (True, r, _Q + "lease", {}, {"max_records": 10_001}),
        (True, r, _Q + "lease", {}, {"max_records": True}),
        (True, r, _Q + "lease", {}, {"max_records": 1.0}),
        (True, r, _Q + "lease", {}, {"max_records": "1"}),
        (True, r, _Q + "lease", {}, {"max_records": 1, "lock_ms": 99}),
        (True, r, _Q + "lease", {}, {"max_records": 1, "wait_ms": 30_001}),
        (True, r, _Q + "lease", {}, {"max_records": 1, "extra": 1}),
        (True, r, _Q + "lease", {"content-type": "text/plain"}, _ONE),
        (True, r, _Q + "lease", {"content-type": "application/json; charset=utf-8"}, _ONE),
        (True, r, _Q + "lease", {"content-type": "application/vnd.x+json"}, _ONE),
        (True, r, _Q + "ack", {}, lambda: {"leases": got[:2]}),  # acked, acked
        (True, r, _Q + "ack", {}, lambda: {"leases": [*got[:2], "nope", "A" * 43, got[2]]}),
        (True, r, _Q + "ack", {}, {"leases": []}),
        (True, r, _Q + "ack", {}, {"leases": "x"}),
        (True, r, _Q + "ack", {}, {"leases": [1]}),
        (True, r, _Q + "ack", {}, {"leases": ["x"], "delay_ms": 1}),
        (True, r, "/v1/topics/t/queues/nope/ack", {}, {"leases": ["x"]}),
        (True, r, _Q + "release", {}, lambda: {"leases": [got[3]], "delay_ms": 0}),
        (True, r, _Q + "release", {}, {"leases": ["x"], "delay_ms": -1}),
        (True, r, _Q + "release", {}, {"leases": ["x"], "delay_ms": 43_200_001}),
        (True, r, _Q + "renew", {}, lambda: {"leases": [got[4]], "lock_ms": 120_000}),
        (True, r, _Q + "renew", {}, lambda: {"leases": [got[4]], "lock_ms": None}),
        (True, r, _Q + "renew", {}, {"leases": ["x"], "lock_ms": 50}),
        (True, r, _Q + "reject", {}, lambda: {"leases": [got[4]]}),
        (True, r, _Q + "reject", {}, lambda: {"leases": [got[4]]}),  # expired
        (True, other, _Q + "ack", {}, lambda: {"leases": [got[5]]}),  # 403
        # the fetch quota: the second lease of a principal over it is refused (429)
        (True, slow, _Q + "lease", {}, one),
        (True, slow, _Q + "lease", {}, one),
        (True, slow, _Q + "ack", {}, lambda: {"leases": [got[-1]]}),  # settling: no quota
        (True, r, _Q + "lease", {}, {"max_records": 100}),  # the rest, the released one again
        (True, r, _Q + "lease", {}, {"max_records": 5, "wait_ms": 0}),  # none left
        (True, r, _Q + "ack", {}, lambda: {"leases": got[5:]}),
        # the request limits: declared too large (413), one that passes the limit as it comes
        (True, r, _Q + "ack", _JSON, b"x" * 2048),
        (True, r, _Q + "ack", _JSON, iter([b'{"leases": [', b" " * 1500, b"]}"])),
        (False, r, _Q + "lease/", {}, one),
        (False, r, "/v1/topics/t/queues/q/settle", {}, {"leases": ["x"]}),
    ]


def _queue_answers(server) -> list:
    """Each step's answer, the leases in it named by their order of appearance (their nonces
    and deadlines differ from run to run), then the queue routes' request metrics."""
    got: list[str] = []
    names: dict[str, str] = {}
    out: list = []

    def named(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: "<deadline>" if k == "lease_expires_at" else named(v)
                    for k, v in value.items()}
        if isinstance(value, list):
            return [named(v) for v in value]
        return names.get(value, value) if isinstance(value, str) else value

    headers = [{"key": "h", "value": "x"}]
    values = [
        {"key": "k1", "value": "a", "timestamp": 1}, {"key": "k2", "value": "b", "timestamp": 2},
        {"key": "k3", "value": "not json", "timestamp": 3}, {"value": "v4", "timestamp": 4},
        {"value": "[5]", "timestamp": 5}, {"value": "v6", "timestamp": 6},
        *({"value": f"v{i}", "timestamp": i, "headers": headers} for i in range(7, 21)),
    ]
    with server.client(token="admin-token-1") as c:
        assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
        for i in range(0, len(values), 5):  # (max_request_bytes)
            batch = {"records": values[i:i + 5]}
            assert c.post("/v1/topics/t/partitions/0/records", json=batch).status_code == 200
        assert c.put("/v1/topics/t/queues/q", json={"lock_ms": 600_000}).status_code == 201
        for _taken, token, path, extra, body in _queue_steps(got):
            if callable(body):
                body = body()
            sent = {"authorization": f"Bearer {token}" if token else "", **extra}
            if isinstance(body, (dict, list)):
                r = c.post(path, json=body, headers=sent)
            else:
                r = c.post(path, content=body, headers=sent)
            answer = r.json() if r.content else None
            if r.status_code == 200 and isinstance(answer, dict):
                for record in answer.get("records", []):
                    names.setdefault(record["lease"], f"<lease {len(names)}>")
                    got.append(record["lease"])
            problem = r.headers.get("content-type", "").startswith("application/problem+json")
            kept = {k: r.headers[k] for k in _KEPT if k in r.headers}
            out.append((path, r.status_code, answer.get("code") if problem else None,
                        named(answer), kept, r.headers.get("content-length")))
        text = c.get("/metrics").text
    out.append(sorted(
        line for line in text.splitlines()
        if line.startswith("eventlog_fetched_records_total{")
        or (line.startswith("eventlog_http_requests_total{") and "/queues/" in line)
    ))
    return out


@pytest.mark.in_process_only  # patches the app's routing in this process
def test_the_lane_answers_queue_calls_as_the_routes_do(
    app_factory, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lease, ack, release, reject and renew through the lane and through the documented routes,
    with an auth file, a fetch quota and a request size limit: the same answers (statuses,
    problem codes, bodies, headers), the same metrics, the lane taking every one but those
    whose path or query FastAPI reads otherwise (and handing on the bodies it does not take)."""
    import json

    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps(_QUEUE_TOKENS))
    settings = {"EVENTLOG_AUTH_FILE": str(auth), "EVENTLOG_MAX_REQUEST_BYTES": "1024",
                "EVENTLOG_QUOTA_WINDOW_NUM": "2", "EVENTLOG_QUOTA_WINDOW_SIZE_MS": "1000"}
    taken: list[str] = []
    lane_match = lane.HotLane.match

    def lane_counting(self, scope):
        found = lane_match(self, scope)
        if found is not None:
            taken.append(f"{scope['path']}?{scope['query_string'].decode()}".rstrip("?"))
        return found

    monkeypatch.setattr(lane.HotLane, "match", lane_counting)
    admin = "admin-token-1"
    fast = _queue_answers(app_factory(tmp_path / "fast", **settings).start(token=admin))
    steps = _queue_steps([])
    assert [t for t in taken if "/queues/" in t] == [p for lane_, _t, p, _h, _b in steps if lane_]
    monkeypatch.setattr(lane.HotLane, "match", lambda self, scope: None)
    documented = _queue_answers(app_factory(tmp_path / "documented", **settings).start(token=admin))
    assert len(fast) == len(documented) == len(steps) + 1
    for step, a, b in zip([*steps, "metrics"], fast, documented, strict=True):
        assert a == b, step
    assert {200, 400, 401, 403, 404, 413, 422, 429} <= {x[1] for x in fast[:-1]}
    statuses = {r["status"] for x in fast[:-1] if x[1] == 200 for r in x[3].get("results", [])}
    assert statuses == {"acked", "released", "renewed", "rejected", "expired", "unknown"}
    assert any(len(x[3].get("records", [])) >= 10 for x in fast[:-1] if x[1] == 200)
