"""Produce and fetch byte-rate quotas (api/quotas.py): the window arithmetic with an injected
clock, then 429 `quota_exceeded` with Retry-After from the app (in this process, on the real
clock); a bad quota in the auth file refused by `eventlog serve`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from api.auth import Principal
from api.quotas import FETCH, PRODUCE, QuotaConfig, QuotaManager, Rate, request_kind, retry_after_s

from ..conftest import run_eventlog
from .test_api import RAW, assert_problem

# -- the arithmetic ---------------------------------------------------------------------------


def test_rate_is_bytes_over_the_window_never_over_less_than_num_minus_one_samples() -> None:
    rate = Rate(num=3, size_ms=1000)
    assert rate.rate(0) == 0 and rate.throttle_ms(0, 100) == 0
    rate.record(0, 4000)
    # one burst after a quiet spell is divided by (num - 1) samples, not by ~0 ms
    assert rate.rate(10) == 4000 * 1000 / 2000
    assert rate.throttle_ms(10, 2000) == 0  # exactly at the quota: not over
    assert rate.throttle_ms(10, 1000) == (2000 - 1000) / 1000 * 2000
    rate.record(2500, 2000)  # a third sample
    assert rate.rate(2500) == 6000 * 1000 / 2500
    # as in Kafka, a sample expires num * size_ms after its start: the first at t = 3000
    assert rate.rate(2999) == 6000 * 1000 / 2999
    assert rate.rate(3000) == 2000 * 1000 / 2000
    assert rate.rate(10_000) == 0


def test_throttle_time_is_capped_at_the_window() -> None:
    rate = Rate(num=2, size_ms=500)
    rate.record(0, 10**9)
    assert rate.throttle_ms(0, 1) == 1000  # all of it has expired after num * size_ms
    assert retry_after_s(1000) == 1 and retry_after_s(1001) == 2 and retry_after_s(0.5) == 1


def test_quota_per_principal_with_token_overrides() -> None:
    now = [100.0]
    quotas = QuotaManager(QuotaConfig(produce_bytes_per_sec=1000, window_num=2, window_size_ms=1000), clock=lambda: now[0])
    a, b = Principal("a", "producer"), Principal("b", "producer")
    big = Principal("big", "producer", produce_bytes_per_sec=10**9, fetch_bytes_per_sec=10)
    assert quotas.quota(a, PRODUCE) == 1000 and quotas.quota(a, FETCH) is None
    assert quotas.quota(big, PRODUCE) == 10**9 and quotas.quota(big, FETCH) == 10
    quotas.record(a, PRODUCE, 5000)
    quotas.record(big, PRODUCE, 5000)
    quotas.record(a, FETCH, 10**9)  # no fetch quota: not even recorded
    assert quotas.throttle_ms(a, PRODUCE) > 0
    assert quotas.throttle_ms(b, PRODUCE) == 0  # a's bytes are a's
    assert quotas.throttle_ms(big, PRODUCE) == 0
    assert quotas.throttle_ms(a, FETCH) == 0
    now[0] += 2.0  # the whole window later
    assert quotas.throttle_ms(a, PRODUCE) == 0


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("POST", "/v1/topics/t/records", PRODUCE),
        ("POST", "/v1/topics/t/partitions/0/records", PRODUCE),
        ("GET", "/v1/topics/t/partitions/0/records", FETCH),
        ("GET", "/v1/topics/t/partitions/0/records/stream", FETCH),
        ("GET", "/v1/topics/t/records", FETCH),  # the merged records browser (api/browse.py)
        ("POST", "/v1/topics/t/partitions/0/delete-records", None),
        ("GET", "/v1/topics/t/partitions/0/offsets", None),
        ("POST", "/v1/topics", None),
        ("DELETE", "/v1/topics/t", None),
    ],
)
def test_requests_are_classified_by_method_and_path(method: str, path: str, kind: str | None) -> None:
    assert request_kind(method, path) == kind


# -- against the app ---------------------------------------------------------------------------

WINDOW = {"EVENTLOG_QUOTA_WINDOW_NUM": "2", "EVENTLOG_QUOTA_WINDOW_SIZE_MS": "1000"}


def _high_watermark(client: httpx.Client, topic: str) -> int:
    return client.get(f"/v1/topics/{topic}").json()["partitions"][0]["high_watermark"]


def _until_accepted(send, deadline_s: float = 30.0) -> httpx.Response:
    """Retry a throttled request after its Retry-After until it is accepted (bounded)."""
    end = time.monotonic() + deadline_s
    while True:
        r = send()
        if r.status_code != 429 or time.monotonic() > end:
            return r
        # waiting out the quota's window on the real clock is what this checks: Retry-After
        # is the time after which the request goes through
        time.sleep(min(int(r.headers["retry-after"]), 5))


def test_produce_quota_refuses_with_retry_after_and_changes_nothing(app_factory) -> None:
    server = app_factory(EVENTLOG_QUOTA_PRODUCE_BYTES_PER_SEC="1000", **WINDOW).start()
    with server.client() as c:
        c.post("/v1/topics", json={"name": "q"})
        body = {"records": [{"value": "x" * 5000}]}
        assert c.post("/v1/topics/q/records", json=body).status_code == 200  # the first is measured afterwards
        refused = c.post("/v1/topics/q/records", json=body)
        problem = assert_problem(refused, 429, "quota_exceeded")
        assert int(refused.headers["retry-after"]) >= 1
        assert problem["kind"] == "produce" and problem["quota_bytes_per_sec"] == 1000 and problem["throttle_time_ms"] > 0
        # the other produce operation is the same kind; raw batches too
        assert_problem(c.post("/v1/topics/q/partitions/0/records", json=body), 429, "quota_exceeded")
        assert_problem(
            c.post("/v1/topics/q/partitions/0/records", content=b"\0" * 100, headers={"content-type": RAW}), 429, "quota_exceeded"
        )
        assert _high_watermark(c, "q") == 1  # the refused requests changed nothing
        # fetching is another quota (none here), and other requests go on
        assert c.get("/v1/topics/q/partitions/0/records").status_code == 200
        metrics = c.get("/metrics").text
        assert 'eventlog_quota_throttled_requests_total{kind="produce"} 3.0' in metrics
        assert 'eventlog_quota_throttled_requests_total{kind="fetch"} 0.0' in metrics
        # quiet for Retry-After seconds, the principal may produce again
        assert _until_accepted(lambda: c.post("/v1/topics/q/records", json={"records": [{"value": "y"}]})).status_code == 200
        assert _high_watermark(c, "q") == 2
    server.stop()


def test_fetch_quota_covers_json_raw_and_stream_reads(app_factory) -> None:
    server = app_factory(EVENTLOG_QUOTA_FETCH_BYTES_PER_SEC="1000", **WINDOW).start()
    with server.client() as c:
        c.post("/v1/topics", json={"name": "q"})
        assert c.post("/v1/topics/q/records", json={"records": [{"value": "x" * 4000}] * 2}).status_code == 200
        assert c.post("/v1/topics/q/records", json={"records": [{"value": "x" * 4000}]}).status_code == 200  # produce: no quota
        first = c.get("/v1/topics/q/partitions/0/records")
        assert first.status_code == 200 and len(first.json()["records"]) == 3
        assert_problem(c.get("/v1/topics/q/partitions/0/records"), 429, "quota_exceeded")
        assert_problem(c.get("/v1/topics/q/partitions/0/records", headers={"accept": RAW}), 429, "quota_exceeded")
        refused = c.get("/v1/topics/q/partitions/0/records/stream?offset=0")
        assert_problem(refused, 429, "quota_exceeded")
        assert int(refused.headers["retry-after"]) >= 1
        # other reads are not fetches
        assert c.get("/v1/topics/q/partitions/0/offsets").status_code == 200
        assert c.post("/v1/topics/q/records", json={"records": [{"value": "z"}]}).status_code == 200
        raw = _until_accepted(lambda: c.get("/v1/topics/q/partitions/0/records", headers={"accept": RAW}))
        assert raw.status_code == 200 and int(raw.headers["x-next-offset"]) == 4
    server.stop()


def test_each_token_has_its_own_quota_and_may_override_the_default(app_factory, tmp_path: Path) -> None:
    tokens = {"a": "token-a-000000", "b": "token-b-000000", "big": "token-big-0000", "admin": "token-admin-000"}
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [
        {"name": "a", "token": tokens["a"], "role": "producer"},
        {"name": "b", "token": tokens["b"], "role": "producer"},
        {"name": "big", "token": tokens["big"], "role": "producer", "quota": {"produce_bytes_per_sec": 10**9}},
        {"name": "admin", "token": tokens["admin"], "role": "admin", "quota": {"fetch_bytes_per_sec": 10**9}},
    ]}))
    server = app_factory(
        EVENTLOG_AUTH_FILE=str(auth), EVENTLOG_QUOTA_PRODUCE_BYTES_PER_SEC="1000", **WINDOW
    ).start(token=tokens["admin"])

    def as_(who: str) -> httpx.Client:
        return server.client(token=tokens[who])

    body = {"records": [{"value": "x" * 5000}]}
    with as_("admin") as admin, as_("a") as a, as_("b") as b, as_("big") as big:
        admin.post("/v1/topics", json={"name": "q"})
        assert a.post("/v1/topics/q/records", json=body).status_code == 200
        assert_problem(a.post("/v1/topics/q/records", json=body), 429, "quota_exceeded")
        assert b.post("/v1/topics/q/records", json=body).status_code == 200  # b's rate is b's own
        for _ in range(3):
            assert big.post("/v1/topics/q/records", json=body).status_code == 200  # its own, higher quota
        assert _high_watermark(admin, "q") == 5
    server.stop()


@pytest.mark.parametrize(
    "quota",
    [{"produce_bytes_per_sec": 0}, {"fetch_bytes_per_sec": "1000"}, {"produce_bytes": 10}, [1000]],
)
def test_a_bad_quota_in_the_auth_file_stops_the_server_at_start(tmp_path: Path, quota: object) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [{"token": "long-enough-token", "role": "producer", "quota": quota}]}))
    result = run_eventlog("serve", "--data-dir", str(tmp_path / "d"), "--port", "0", env={"EVENTLOG_AUTH_FILE": str(auth)})
    assert result.returncode == 2 and "quota" in result.stderr
