"""The HTTP API: the app in this process (real engine, real files, real fsync) and, where a
process must die, a real server (uvicorn on a free port)."""

from __future__ import annotations

import base64
import threading
import time

import httpx
import pytest

from engine.partitioner import partition_for_key

from ..conftest import wait_until
from ..kafka_oracle import build_batch, decode_all

RAW = "application/vnd.kafka.record-batch.v2"


@pytest.fixture
def client(app_server):
    with app_server.client() as c:
        yield c


def assert_problem(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == code and body["status"] == status
    assert body["type"].endswith(code) and body["title"] and body["detail"]
    return body


def in_flight(client: httpx.Client) -> int:
    """The server's eventlog_http_requests_in_flight, this scrape included."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("eventlog_http_requests_in_flight "):
            return int(float(line.split()[1]))
    raise AssertionError("/metrics has no eventlog_http_requests_in_flight")


def test_topic_lifecycle(client: httpx.Client) -> None:
    r = client.post("/v1/topics", json={"name": "orders", "partitions": 2, "configs": {"retention.ms": 1000, "cleanup.policy": "compact"}})
    assert r.status_code == 201
    body = r.json()
    assert body["name"] == "orders" and body["partitions"] == 2
    assert body["configs"]["retention.ms"] == "1000" and body["configs"]["segment.bytes"] == "1073741824"
    assert_problem(client.post("/v1/topics", json={"name": "orders"}), 409, "topic_exists")
    assert_problem(client.post("/v1/topics", json={"name": "bad name"}), 422, "invalid_topic_name")
    assert_problem(client.post("/v1/topics", json={"name": "x", "configs": {"nope": 1}}), 422, "invalid_config")
    assert_problem(client.post("/v1/topics", json={"name": "x", "partitions": 0}), 422, "validation_error")
    assert client.get("/v1/topics").json() == {"topics": [{"name": "orders", "partitions": 2, "internal": False}]}
    assert "__metadata" in [t["name"] for t in client.get("/v1/topics?internal=true").json()["topics"]]
    detail = client.get("/v1/topics/orders").json()
    assert [p["partition"] for p in detail["partitions"]] == [0, 1]
    assert detail["partitions"][0] == {"partition": 0, "log_start_offset": 0, "high_watermark": 0, "log_end_offset": 0, "segments": 1, "size_bytes": 0}
    r = client.patch("/v1/topics/orders/configs", json={"configs": {"retention.ms": None, "segment.ms": 60000}})
    assert r.status_code == 200 and r.json()["configs"]["retention.ms"] == "604800000" and r.json()["configs"]["segment.ms"] == "60000"
    assert client.post("/v1/topics/orders/partitions", json={"count": 3}).json()["partitions"] == 3
    assert_problem(client.post("/v1/topics/orders/partitions", json={"count": 2}), 422, "invalid_partitions")
    assert client.delete("/v1/topics/orders").status_code == 204
    assert_problem(client.get("/v1/topics/orders"), 404, "topic_not_found")
    assert_problem(client.delete("/v1/topics/orders"), 404, "topic_not_found")


def test_produce_places_keys_like_kafka_and_fetches_them_back(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 12})
    keys = ["21", "foobar", "abc", "a-little-bit-long-string", "user-42", ""]
    r = client.post("/v1/topics/t/records", json={"records": [{"key": k, "value": f"v-{k}"} for k in keys]})
    assert r.status_code == 200
    offsets = r.json()["offsets"]
    assert [o["partition"] for o in offsets] == [0, 6, 3, 8, 4, 9]  # docs/FORMAT.md's murmur2 vectors, 12 partitions
    assert [o["partition"] for o in offsets] == [partition_for_key(k.encode(), 12) for k in keys]
    for key, o in zip(keys, offsets):
        got = client.get(f"/v1/topics/t/partitions/{o['partition']}/records", params={"offset": o["offset"]}).json()
        assert got["records"][0]["key"] == key and got["records"][0]["value"] == f"v-{key}"
        assert got["records"][0]["timestamp"] == o["timestamp"]


def test_formats_headers_nulls_and_timestamps(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t"})
    blob = bytes(range(256))
    body = {
        "key_format": "base64",
        "value_format": "json",
        "records": [
            {"key": base64.b64encode(b"\xff\x00k").decode(), "value": {"a": [1, 2]}, "timestamp": 1234, "headers": [{"key": "h", "value": "x"}, {"key": "n", "value": None}]},
            {"key": None, "value": None},
        ],
    }
    offsets = client.post("/v1/topics/t/records", json=body).json()["offsets"]
    assert [o["offset"] for o in offsets] == [0, 1] and offsets[0]["timestamp"] == 1234
    got = client.get("/v1/topics/t/partitions/0/records", params={"key_format": "base64", "value_format": "json"}).json()
    assert got["records"][0] == {"offset": 0, "timestamp": 1234, "key": base64.b64encode(b"\xff\x00k").decode(), "value": {"a": [1, 2]}, "headers": [{"key": "h", "value": "x"}, {"key": "n", "value": None}]}
    assert got["records"][1]["key"] is None and got["records"][1]["value"] is None
    assert got["next_offset"] == 2 and got["high_watermark"] == 2
    # bytes that are not UTF-8 cannot come back as strings: a clear 422
    client.post("/v1/topics/t/records", json={"key_format": "base64", "value_format": "base64", "records": [{"value": base64.b64encode(blob).decode()}]})
    assert_problem(client.get("/v1/topics/t/partitions/0/records", params={"offset": 2}), 422, "not_utf8")
    assert client.get("/v1/topics/t/partitions/0/records", params={"offset": 2, "value_format": "base64"}).json()["records"][0]["value"] == base64.b64encode(blob).decode()


def test_produce_is_all_or_nothing(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 2, "configs": {"max.message.bytes": 300}})
    good = {"value": "ok"}
    bad_requests = [
        ({"value_format": "base64", "records": [{"value": "aGk="}, {"value": "not base64!"}]}, 422, "validation_error"),
        ({"records": [good, {"value": "v", "partition": 7}]}, 404, "partition_not_found"),
        ({"records": [good, {"value": "x" * 500}]}, 413, "record_too_large"),
        ({"records": []}, 422, "validation_error"),
        ({"records": [good, {"value": 5}]}, 422, "validation_error"),
        ({"records": [good], "surprise": 1}, 422, "validation_error"),
        ({"records": [good, {"valeu": "typo"}]}, 422, "validation_error"),  # not a silent tombstone
        ({"records": [good, {"value": "v", "headers": [{"key": "h", "value": "x", "extra": 1}]}]}, 422, "validation_error"),
        ({"records": [good, {"value": "v", "timestamp": True}]}, 422, "validation_error"),
    ]
    for body, status, code in bad_requests:
        assert_problem(client.post("/v1/topics/t/records", json=body), status, code)
    r = client.post("/v1/topics/t/records", content=b"{not json", headers={"content-type": "application/json"})
    assert_problem(r, 400, "invalid_json")
    assert_problem(client.post("/v1/topics/nope/records", json={"records": [good]}), 404, "topic_not_found")
    detail = client.get("/v1/topics/t").json()
    assert [p["high_watermark"] for p in detail["partitions"]] == [0, 0]  # nothing was written


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_raw_batches_in_and_out(client: httpx.Client, codec: int) -> None:
    client.post("/v1/topics", json={"name": "raw"})
    records = [(None if i % 2 else b"k%d" % i, None if i == 3 else b"value-%d" % i * 30, 1_700_000_000_000 + i, [("h", None), ("g", b"1")]) for i in range(20)]
    body = build_batch(records[:10], codec=codec, base_offset=999_999) + build_batch(records[10:], codec=codec, base_offset=5)
    r = client.post("/v1/topics/raw/partitions/0/records", content=body, headers={"content-type": RAW})
    assert r.status_code == 200, r.text
    assert r.json()["base_offset"] == 0 and r.json()["last_offset"] == 19
    fetched = client.get("/v1/topics/raw/partitions/0/records", headers={"accept": RAW})
    assert fetched.headers["content-type"] == RAW and fetched.headers["x-next-offset"] == "20"
    _, oracle = decode_all(fetched.content)
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in oracle] == [
        (i, k, v, ts, tuple(h)) for i, (k, v, ts, h) in enumerate(records)
    ]
    as_json = client.get("/v1/topics/raw/partitions/0/records", params={"offset": 12, "max_records": 3, "key_format": "base64", "value_format": "base64"}).json()
    assert [x["offset"] for x in as_json["records"]] == [12, 13, 14] and as_json["next_offset"] == 15
    corrupt = bytearray(body)
    corrupt[-3] ^= 1
    assert_problem(client.post("/v1/topics/raw/partitions/0/records", content=bytes(corrupt), headers={"content-type": RAW}), 400, "corrupt_batch")
    assert client.get("/v1/topics/raw/partitions/0/records", params={"offset": 20}).json()["records"] == []


def test_offsets_out_of_range_and_long_poll(client: httpx.Client, app_server) -> None:
    client.post("/v1/topics", json={"name": "t"})
    body = assert_problem(client.get("/v1/topics/t/partitions/0/records", params={"offset": 1}), 416, "offset_out_of_range")
    assert body["log_start_offset"] == 0 and body["high_watermark"] == 0
    assert_problem(client.get("/v1/topics/t/partitions/5/records"), 404, "partition_not_found")
    result: dict = {}

    def poll() -> None:
        with app_server.client() as c:
            start = time.monotonic()
            result["body"] = c.get("/v1/topics/t/partitions/0/records", params={"offset": 0, "max_wait_ms": 20000}).json()
            result["waited"] = time.monotonic() - start

    t = threading.Thread(target=poll)
    t.start()
    wait_until(lambda: in_flight(client) == 2, what="the long-poll being in flight")  # it and the scrape
    assert "body" not in result  # still waiting: the log is empty
    client.post("/v1/topics/t/records", json={"records": [{"value": "wake"}]})
    t.join(30)
    assert result["body"]["records"][0]["value"] == "wake"
    assert result["waited"] < 10  # woken by the produce, long before max_wait_ms


def test_durability_across_sigkill(server_factory) -> None:
    server = server_factory().start()
    acked = []
    with server.client() as c:
        c.post("/v1/topics", json={"name": "d", "partitions": 2, "configs": {"segment.bytes": 20000}})
        stop = threading.Event()
        enough = threading.Event()

        def producer(n: int) -> None:
            with server.client() as pc:
                i = 0
                while not stop.is_set():
                    try:
                        r = pc.post("/v1/topics/d/records", json={"records": [{"key": f"{n}-{i}", "value": f"v{n}-{i}-{j}" * 5} for j in range(10)]})
                    except httpx.TransportError:
                        return
                    if r.status_code == 200:
                        acked.extend((o["partition"], o["offset"], f"v{n}-{i}-{j}" * 5) for j, o in enumerate(r.json()["offsets"]))
                        if len(acked) >= 2000:
                            enough.set()
                    i += 1

        threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        enough.wait(30)  # or kill it with what it has by then
        server.kill()
        stop.set()
        for t in threads:
            t.join(10)
    assert len(acked) >= 500
    again = server_factory(server.data_dir).start()
    with again.client() as c:
        stored = {}
        for p in range(2):
            offset = 0
            while True:
                got = c.get(f"/v1/topics/d/partitions/{p}/records", params={"offset": offset, "max_records": 5000}).json()
                for rec in got["records"]:
                    stored[(p, rec["offset"])] = rec["value"]
                if got["next_offset"] >= got["high_watermark"]:
                    break
                offset = got["next_offset"]
    missing = [(p, o, v) for p, o, v in acked if stored.get((p, o)) != v]
    assert not missing, missing[:5]
    assert again.stop() == 0
