"""Conditional appends (expected_offset / If-Match), Idempotency-Key, Kafka idempotent producers
(the app in this process), and across a kill and injected disk faults (a real server)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from ..kafka_oracle import build_batch, decode_all
from .test_api import RAW, assert_problem

T0 = 1_700_000_000_000


@pytest.fixture
def client(app_server):
    with app_server.client() as c:
        yield c


def produce(client: httpx.Client, path: str, values: list[str], headers: dict | None = None, **body) -> httpx.Response:
    return client.post(path, json={"records": [{"value": v} for v in values], **body}, headers=headers or {})


def all_values(client: httpx.Client, topic: str, partition: int = 0) -> list[str]:
    r = client.get(f"/v1/topics/{topic}/partitions/{partition}/records", params={"offset": 0, "max_records": 10_000})
    return [rec["value"] for rec in r.json()["records"]]


def test_conditional_appends_with_expected_offset_and_if_match(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "acct", "partitions": 1})
    path = "/v1/topics/acct/partitions/0/records"
    r = produce(client, path, ["opened"], expected_offset=0)
    assert r.status_code == 200 and r.json()["base_offset"] == 0
    assert r.headers["etag"] == '"1"'
    body = assert_problem(produce(client, path, ["stale"], expected_offset=0), 409, "offset_mismatch")
    assert body["expected_offset"] == 0 and body["high_watermark"] == 1
    # the ETag of one append is the If-Match of the next
    r = produce(client, path, ["deposited"], headers={"If-Match": r.headers["etag"]})
    assert r.status_code == 200 and r.json()["base_offset"] == 1
    # a failed If-Match is a failed HTTP precondition (RFC 9110): 412, the same code and fields
    body = assert_problem(produce(client, path, ["stale"], headers={"If-Match": '"1"'}), 412, "offset_mismatch")
    assert body["expected_offset"] == 1 and body["high_watermark"] == 2
    # raw batches take If-Match too
    raw = build_batch([(None, b"raw", T0, [])])
    assert_problem(client.post(path, content=raw, headers={"content-type": RAW, "If-Match": "0"}), 412, "offset_mismatch")
    r = client.post(path, content=raw, headers={"content-type": RAW, "If-Match": "2"})
    assert r.status_code == 200 and r.json()["base_offset"] == 2 and r.headers["etag"] == '"3"'
    assert client.post(path, content=raw, headers={"content-type": RAW, "If-Match": "*"}).status_code == 200
    # bad preconditions are 422s, and nothing is written
    assert_problem(produce(client, path, ["x"], expected_offset=-1), 422, "validation_error")
    assert_problem(produce(client, path, ["x"], expected_offset="4"), 422, "validation_error")
    for garbage in ('W/"x"', "-1"):
        r = produce(client, path, ["x"], headers={"If-Match": garbage})
        assert_problem(r, 422, "validation_error")
    # a weak ETag names its offset too (one grammar with the per-key appends, api/conditions.py)
    r = produce(client, path, ["x"], headers={"If-Match": 'W/"3"'})
    assert_problem(r, 412, "offset_mismatch")
    assert_problem(produce(client, path, ["x"], headers={"If-Match": '"5"'}, expected_offset=4), 422, "validation_error")
    assert all_values(client, "acct") == ["opened", "deposited", "raw", "raw"]


def test_expected_offset_on_the_topic_endpoint_needs_one_partition(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "streams", "partitions": 4})
    r = client.post("/v1/topics/streams/records", json={"records": [{"key": "order-7", "value": "created"}], "expected_offset": 0})
    assert r.status_code == 200
    p = r.json()["offsets"][0]["partition"]
    r = client.post("/v1/topics/streams/records", json={"records": [{"key": "order-7", "value": "again"}], "expected_offset": 0})
    assert_problem(r, 409, "offset_mismatch")
    r = client.post("/v1/topics/streams/records", json={"records": [{"key": "a", "value": "1"}, {"key": "b", "value": "2"}, {"key": "c", "value": "3"}], "expected_offset": 0})
    assert_problem(r, 422, "validation_error")
    assert all_values(client, "streams", p) == ["created"]


def test_idempotency_key_returns_the_first_offsets(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "orders", "partitions": 3})
    body = {"records": [{"value": f"unkeyed-{i}"} for i in range(7)] + [{"key": "k1", "value": "keyed"}]}
    first = client.post("/v1/topics/orders/records", json=body, headers={"Idempotency-Key": "order-1001"})
    assert first.status_code == 200 and "idempotent-replayed" not in first.headers
    again = client.post("/v1/topics/orders/records", json=body, headers={"Idempotency-Key": "order-1001"})
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    total = sum(len(all_values(client, "orders", p)) for p in range(3))
    assert total == 8
    # another key writes
    other = client.post("/v1/topics/orders/records", json=body, headers={"Idempotency-Key": "order-1002"})
    assert other.status_code == 200 and other.json() != first.json()
    # the same key with another body is refused, not silently replayed
    r = client.post("/v1/topics/orders/records", json={"records": [{"value": "x"}]}, headers={"Idempotency-Key": "order-1001"})
    assert_problem(r, 422, "idempotency_key_reused")
    assert_problem(client.post("/v1/topics/orders/records", json=body, headers={"Idempotency-Key": ""}), 422, "validation_error")
    assert_problem(client.post("/v1/topics/orders/records", json=body, headers={"Idempotency-Key": "a b"}), 422, "validation_error")
    assert sum(len(all_values(client, "orders", p)) for p in range(3)) == 16


def test_idempotency_key_on_the_partition_endpoint_json_and_raw(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "p", "partitions": 1})
    path = "/v1/topics/p/partitions/0/records"
    a = produce(client, path, ["a", "b"], headers={"Idempotency-Key": "j1"})
    b = produce(client, path, ["a", "b"], headers={"Idempotency-Key": "j1"})
    assert a.json() == b.json() and b.headers["idempotent-replayed"] == "true"
    raw = build_batch([(None, b"r1", T0, []), (None, b"r2", T0 + 1, [])])
    c = client.post(path, content=raw, headers={"content-type": RAW, "Idempotency-Key": "raw-1"})
    d = client.post(path, content=raw, headers={"content-type": RAW, "Idempotency-Key": "raw-1"})
    assert c.status_code == d.status_code == 200
    assert c.json() == d.json() == {
        "partition": 0, "base_offset": 2, "last_offset": 3, "timestamp": T0 + 1,
        "partitions": [{"partition": 0, "base_offset": 2, "last_offset": 3}],
    }
    # a retried conditional append is a replay, not a mismatch
    e = produce(client, path, ["c"], headers={"Idempotency-Key": "j2", "If-Match": '"4"'})
    f = produce(client, path, ["c"], headers={"Idempotency-Key": "j2", "If-Match": '"4"'})
    assert e.status_code == f.status_code == 200 and e.json() == f.json()
    # batches that already carry a producer id cannot take an Idempotency-Key
    own = build_batch([(None, b"x", T0, [])], producer_id=5, producer_epoch=0, base_sequence=0)
    assert_problem(client.post(path, content=own, headers={"content-type": RAW, "Idempotency-Key": "raw-2"}), 422, "validation_error")
    assert all_values(client, "p") == ["a", "b", "r1", "r2", "c"]


def test_kafka_idempotent_producer_batches(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "k", "partitions": 1})
    path = "/v1/topics/k/partitions/0/records"

    def send(seq: int, n: int = 2, epoch: int = 0) -> httpx.Response:
        batch = build_batch([(None, f"s{seq + i}".encode(), T0, []) for i in range(n)], producer_id=42, producer_epoch=epoch, base_sequence=seq)
        return client.post(path, content=batch, headers={"content-type": RAW})

    assert send(0).json()["base_offset"] == 0
    dup = send(0)
    assert dup.json()["base_offset"] == 0 and dup.headers["idempotent-replayed"] == "true"
    assert send(2).json()["base_offset"] == 2
    body = assert_problem(send(9), 409, "out_of_order_sequence")
    assert body["producer_id"] == 42 and body["last_sequence"] == 3
    assert send(0, epoch=1).json()["base_offset"] == 4
    assert_problem(send(2, epoch=0), 409, "producer_fenced")
    assert all_values(client, "k") == ["s0", "s1", "s2", "s3", "s0", "s1"]


def test_idempotency_survives_a_crash(server_factory, tmp_path: Path) -> None:
    server = server_factory().start()
    body = {"records": [{"value": f"v{i}"} for i in range(5)]}
    with server.client() as c:
        c.post("/v1/topics", json={"name": "t", "partitions": 2, "configs": {"segment.bytes": 2048}})
        firsts = [c.post("/v1/topics/t/records", json=body, headers={"Idempotency-Key": f"req-{i}"}).json() for i in range(30)]
    server.kill()
    server.start()
    with server.client() as c:
        for i in (0, 13, 29):
            again = c.post("/v1/topics/t/records", json=body, headers={"Idempotency-Key": f"req-{i}"})
            assert again.headers.get("idempotent-replayed") == "true", i
            assert again.json() == firsts[i]
        total = sum(len(all_values(c, "t", p)) for p in range(2))
        assert total == 150
    assert any(p.name.endswith(".snapshot") for p in (tmp_path / "data").rglob("*")), "rolls wrote producer snapshots"
    server.stop()


def write_faults(path: Path, *rules: dict) -> None:
    stat = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(json.dumps({"rules": list(rules)}))
    os.utime(path, ns=(stat + 10**9, stat + 10**9))


def test_disk_full_is_507_reads_go_on_and_writes_resume(server_factory, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    write_faults(faults)
    server = server_factory(EVENTLOG_FAULTS_FILE=str(faults)).start()
    with server.client() as c:
        c.post("/v1/topics", json={"name": "full", "partitions": 1})
        c.post("/v1/topics", json={"name": "other", "partitions": 1})
        assert produce(c, "/v1/topics/full/records", ["before"]).status_code == 200
        write_faults(faults, {"op": "write", "path": "/full-0/", "errno": "ENOSPC"})
        body = assert_problem(produce(c, "/v1/topics/full/records", ["refused"]), 507, "storage_full")
        assert "disk full" in body["detail"]
        raw = build_batch([(None, b"refused-raw", T0, [])])
        assert_problem(c.post("/v1/topics/full/partitions/0/records", content=raw, headers={"content-type": RAW}), 507, "storage_full")
        assert all_values(c, "full") == ["before"], "reads go on; nothing partial"
        assert produce(c, "/v1/topics/other/records", ["unaffected"]).status_code == 200
        assert c.get("/readyz").status_code == 200
        write_faults(faults)
        r = produce(c, "/v1/topics/full/records", ["after"])
        assert r.status_code == 200 and r.json()["offsets"][0]["offset"] == 1
        assert all_values(c, "full") == ["before", "after"]
    server.kill()
    server.start()
    with server.client() as c:
        assert all_values(c, "full") == ["before", "after"]
    server.stop()
    decode_all(b"".join(p.read_bytes() for p in sorted((tmp_path / "data" / "full-0").glob("*.log"))))


def test_a_failed_read_fails_that_request_only(server_factory, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    write_faults(faults)
    server = server_factory(EVENTLOG_FAULTS_FILE=str(faults)).start()
    with server.client() as c:
        c.post("/v1/topics", json={"name": "bad", "partitions": 1})
        c.post("/v1/topics", json={"name": "good", "partitions": 1})
        produce(c, "/v1/topics/bad/records", ["x" * 100] * 10)
        produce(c, "/v1/topics/good/records", ["y"])
        write_faults(faults, {"op": "read", "path": "/bad-0/", "errno": "EIO"})
        assert_problem(c.get("/v1/topics/bad/partitions/0/records", params={"offset": 0}), 500, "storage_error")
        r = c.get("/v1/topics/bad/partitions/0/records", params={"offset": 0}, headers={"accept": RAW})
        assert_problem(r, 500, "storage_error")
        assert all_values(c, "good") == ["y"]
        assert produce(c, "/v1/topics/bad/records", ["still-writable"]).status_code == 200
        write_faults(faults)
        assert len(all_values(c, "bad")) == 11
    server.stop()
