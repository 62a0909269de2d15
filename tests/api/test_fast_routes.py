"""The hot routes are served without FastAPI's machinery (produce: api/lane.py, ahead of the
middleware; fetch: api/records.py, _FastRoute); every answer must be the one the documented
route gives."""

from __future__ import annotations

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
