"""Per-key event streams through HTTP: a key's history, conditional appends by key version,
Idempotency-Key, the partition a key lives in, bad input, and the event stream of one key."""

from __future__ import annotations

import base64
import threading
import urllib.parse

import httpx
import pytest

from engine.partitioner import partition_for_key

from ..conftest import wait_until
from .test_api import assert_problem

# the paths between shards (forwarded appends, shard 0's groups): again at N = 2 (Makefile)
pytestmark = pytest.mark.shards


@pytest.fixture
def client(app_server):
    with app_server.client() as c:
        yield c


def key_path(topic: str, key: str) -> str:
    return f"/v1/topics/{topic}/keys/{urllib.parse.quote(key, safe='')}/records"


def append(client: httpx.Client, topic: str, key: str, values: list, headers: dict | None = None, **body) -> httpx.Response:
    return client.post(key_path(topic, key), json={"records": [{"value": v} for v in values], **body}, headers=headers or {})


def history(client: httpx.Client, topic: str, key: str, **params) -> httpx.Response:
    return client.get(key_path(topic, key), params=params)


def test_an_order_aggregate_create_pay_ship_and_a_stale_write(client: httpx.Client) -> None:
    assert client.post("/v1/topics", json={"name": "orders", "partitions": 4}).status_code == 201
    # create: only if the order is new
    r = append(client, "orders", "order-1", ["created"], headers={"If-None-Match": "*"})
    assert r.status_code == 200, r.text
    created = r.json()
    assert created["partition"] == partition_for_key(b"order-1", 4)
    assert r.headers["etag"] == f'"{created["last_offset"]}"'
    assert_problem(append(client, "orders", "order-1", ["created again"], headers={"If-None-Match": "*"}), 412, "key_version_mismatch")
    # other orders in the same partition do not conflict with it
    for i in range(2, 12):
        assert append(client, "orders", f"order-{i}", ["created"], headers={"If-None-Match": "*"}).status_code == 200
    # read it, decide, append with its version
    h = history(client, "orders", "order-1")
    assert h.status_code == 200 and [rec["value"] for rec in h.json()["records"]] == ["created"]
    version = h.headers["etag"]
    paid = append(client, "orders", "order-1", ["paid"], headers={"If-Match": version})
    assert paid.status_code == 200, paid.text
    # a second writer that read the same version loses, and writes nothing
    body = assert_problem(append(client, "orders", "order-1", ["cancelled"], headers={"If-Match": version}), 412, "key_version_mismatch")
    assert body["expected_offset"] == int(version.strip('"')) and body["current_offset"] == paid.json()["last_offset"]
    shipped = append(client, "orders", "order-1", ["shipped"], headers={"If-Match": paid.headers["etag"]})
    assert shipped.status_code == 200
    h = history(client, "orders", "order-1").json()
    assert [rec["value"] for rec in h["records"]] == ["created", "paid", "shipped"]
    assert all(rec["key"] == "order-1" for rec in h["records"])
    assert h["latest_offset"] == shipped.json()["last_offset"] and h["more"] is False
    # the partition fetch shows the same records among the others
    p = created["partition"]
    r = client.get(f"/v1/topics/orders/partitions/{p}/records", params={"offset": 0, "max_records": 1000})
    mine = [rec["value"] for rec in r.json()["records"] if rec["key"] == "order-1"]
    assert mine == ["created", "paid", "shipped"]


def test_pages_and_an_empty_key(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 2})
    offsets = []
    for i in range(25):
        offsets.append(append(client, "t", "k", [f"v{i}"]).json()["last_offset"])
        append(client, "t", "other", [f"o{i}"])
    got, offset = [], 0
    while True:
        page = history(client, "t", "k", offset=offset, max_records=10).json()
        got += [rec["value"] for rec in page["records"]]
        if not page["more"]:
            break
        offset = page["next_offset"]
    assert got == [f"v{i}" for i in range(25)]
    assert history(client, "t", "k", after_offset=offsets[20]).json()["records"][0]["value"] == "v21"
    empty = history(client, "t", "never-written")
    assert empty.status_code == 200 and empty.json()["records"] == [] and empty.headers["etag"] == '"-1"'
    assert empty.json()["latest_offset"] == -1
    # If-Match "-1" is If-None-Match: *
    assert append(client, "t", "never-written", ["first"], headers={"If-Match": '"-1"'}).status_code == 200
    assert_problem(append(client, "t", "new-2", ["x"], headers={"If-Match": "*"}), 412, "key_version_mismatch")


def test_keys_with_slashes_and_bytes(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 3})
    assert append(client, "t", "a/b c%", ["slash"]).status_code == 200
    h = history(client, "t", "a/b c%").json()
    assert [r["value"] for r in h["records"]] == ["slash"] and h["records"][0]["key"] == "a/b c%"
    raw = bytes([0, 255, 1, 254])
    b64 = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    r = client.post(f"/v1/topics/t/keys/{b64}/records", params={"key_format": "base64"}, json={"records": [{"value": "bin"}]})
    assert r.status_code == 200, r.text
    assert r.json()["partition"] == partition_for_key(raw, 3)
    r = client.get(f"/v1/topics/t/keys/{b64}/records", params={"key_format": "base64"})
    assert [rec["value"] for rec in r.json()["records"]] == ["bin"]
    assert r.json()["records"][0]["key"] == base64.b64encode(raw).decode()
    # the same key through the partition endpoint (murmur2 placement) is the same stream
    client.post("/v1/topics/t/records", json={"records": [{"key": "a/b c%", "value": "via topic produce"}]})
    assert [r["value"] for r in history(client, "t", "a/b c%").json()["records"]] == ["slash", "via topic produce"]


def test_bad_input_changes_nothing(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 1})
    path = key_path("t", "k")
    assert_problem(client.post(path, json={"records": [{"key": "x", "value": "v"}]}), 422, "validation_error")
    assert_problem(client.post(path, json={"records": [{"value": "v", "partition": 0}]}), 422, "validation_error")
    assert_problem(client.post(path, json={"records": []}), 422, "validation_error")
    assert_problem(client.post(path, json={"records": [{"value": "v"}], "key_format": "base64"}), 422, "validation_error")
    assert_problem(client.post(path, content=b"{nope", headers={"content-type": "application/json"}), 400, "invalid_json")
    assert_problem(client.post(path, content=b"v", headers={"content-type": "text/plain"}), 415, "unsupported_media_type")
    assert_problem(append(client, "t", "k", ["v"], headers={"If-Match": "abc"}), 422, "validation_error")
    assert_problem(append(client, "t", "k", ["v"], headers={"If-None-Match": '"3"'}), 422, "validation_error")
    assert_problem(append(client, "t", "k", ["v"], headers={"If-None-Match": "*", "If-Match": '"1"'}), 422, "validation_error")
    assert_problem(client.post("/v1/topics/t/keys/!!/records", params={"key_format": "base64"}, json={"records": [{"value": "v"}]}),
                   422, "validation_error")
    assert_problem(append(client, "nope", "k", ["v"]), 404, "topic_not_found")
    assert_problem(history(client, "nope", "k"), 404, "topic_not_found")
    assert_problem(history(client, "t", "k", offset=1, after_offset=0), 422, "validation_error")
    assert client.get("/v1/topics/t/partitions/0/offsets").json()["high_watermark"] == 0


def test_idempotency_key_replays_a_conditional_append(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 1})
    first = append(client, "t", "acct", ["opened"], headers={"If-None-Match": "*", "Idempotency-Key": "open-acct"})
    again = append(client, "t", "acct", ["opened"], headers={"If-None-Match": "*", "Idempotency-Key": "open-acct"})
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json() and again.headers["idempotent-replayed"] == "true"
    assert [r["value"] for r in history(client, "t", "acct").json()["records"]] == ["opened"]


def test_key_index_off_refuses_key_reads_and_conditions(client: httpx.Client) -> None:
    r = client.post("/v1/topics", json={"name": "fire", "partitions": 1, "configs": {"eventlog.key.index": "false"}})
    assert r.status_code == 201, r.text
    assert client.get("/v1/topics/fire").json()["configs"]["eventlog.key.index"] == "false"
    assert append(client, "fire", "k", ["plain"]).status_code == 200  # unconditional: still fine
    assert_problem(append(client, "fire", "k", ["v"], headers={"If-Match": '"0"'}), 409, "key_index_disabled")
    assert_problem(history(client, "fire", "k"), 409, "key_index_disabled")
    # switched on, the index is built from what is there
    assert client.patch("/v1/topics/fire/configs", json={"configs": {"eventlog.key.index": "true"}}).status_code in (200, 204)
    h = history(client, "fire", "k")
    assert h.status_code == 200 and [r["value"] for r in h.json()["records"]] == ["plain"]
    assert append(client, "fire", "k", ["v"], headers={"If-Match": h.headers["etag"]}).status_code == 200


def test_racing_writers_on_one_key_one_winner_per_version(client: httpx.Client, app_server) -> None:
    client.post("/v1/topics", json={"name": "race", "partitions": 2})
    wins: list[tuple[int, int]] = []  # (version read, offset written)
    lock = threading.Lock()

    def writer(n: int) -> None:
        with app_server.client() as c:
            for i in range(15):
                version = history(c, "race", "counter").headers["etag"]
                r = append(c, "race", "counter", [f"w{n}-{i}"], headers={"If-Match": version})
                if r.status_code == 200:
                    with lock:
                        wins.append((int(version.strip('"')), r.json()["last_offset"]))
                else:
                    assert r.status_code == 412, r.text

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    versions = [v for v, _ in wins]
    assert len(versions) == len(set(versions)), "two writers won with the same version"
    records = history(client, "race", "counter", max_records=1000).json()["records"]
    assert len(records) == len(wins)
    # each win's version was the record just before it: no lost update
    chain = [-1] + [r["offset"] for r in records]
    assert sorted(wins) == list(zip(chain[:-1], chain[1:]))


def test_stream_of_one_key(app_server, client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "s", "partitions": 2})
    append(client, "s", "k", ["before"])
    got: list[str] = []
    done = threading.Event()

    def follow() -> None:
        with app_server.client() as c, c.stream("GET", key_path("s", "k") + "/stream", params={"offset": 0}) as r:
            assert r.status_code == 200
            event = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                if line.startswith("data: ") and event == "record":
                    import json

                    got.append(json.loads(line[6:])["value"])
                    if len(got) == 3:
                        done.set()
                        return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    wait_until(lambda: got == ["before"], 10, "the first record")
    append(client, "s", "other", ["not mine"])
    append(client, "s", "k", ["after 1"])
    append(client, "s", "k", ["after 2"])
    assert done.wait(10), got
    assert got == ["before", "after 1", "after 2"]


@pytest.mark.slow
def test_conditional_appends_and_the_key_index_survive_kill_9(server_factory) -> None:
    """Writers append to 12 keys with If-Match / If-None-Match while the server is killed with
    SIGKILL; after the restart (the active segment's key entries rebuilt from its records) every
    acknowledged append is in its key's history where it was acknowledged, each success's
    version was the record before it, and the key index agrees with the partitions."""
    server = server_factory(EVENTLOG_PROCESSES="1").start()
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "agg", "partitions": 2, "configs": {"segment.bytes": 2048}}).status_code == 201
    keys = [f"agg-{i}" for i in range(12)]
    wins: list[tuple[str, int, int]] = []  # (key, version before, offset written)
    doubt: list[str] = []  # keys of requests whose answer the kill took
    stop = threading.Event()
    lock = threading.Lock()

    def writer(n: int) -> None:
        versions: dict[str, int] = {}
        with httpx.Client(base_url=server.url, timeout=10) as c:
            i = 0
            while not stop.is_set():
                key = keys[(n * 5 + i) % len(keys)]
                i += 1
                version = versions.get(key, -1)
                headers = {"If-Match": f'"{version}"'} if version >= 0 else {"If-None-Match": "*"}
                try:
                    r = append(c, "agg", key, [f"w{n}-{i}"], headers=headers)
                except httpx.TransportError:
                    with lock:
                        doubt.append(key)
                    return
                if r.status_code == 200:
                    with lock:
                        wins.append((key, version, r.json()["last_offset"]))
                    versions[key] = r.json()["last_offset"]
                else:
                    assert r.status_code == 412, r.text
                    versions[key] = r.json()["current_offset"]

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(wins) >= 150, 60, "150 acknowledged appends")
    server.kill()
    stop.set()
    for t in threads:
        t.join(30)
    again = server_factory(server.data_dir, EVENTLOG_PROCESSES="1").start()
    with again.client() as c:
        scanned: dict[str, list[int]] = {}
        for p in range(2):
            r = c.get(f"/v1/topics/agg/partitions/{p}/records", params={"offset": 0, "max_records": 10_000})
            for rec in r.json()["records"]:
                scanned.setdefault(rec["key"], []).append(rec["offset"])
        for key in keys:
            h = history(c, "agg", key, max_records=10_000)
            offsets = [rec["offset"] for rec in h.json()["records"]]
            assert offsets == scanned.get(key, []), key
            assert h.headers["etag"] == f'"{offsets[-1] if offsets else -1}"'
            mine = sorted((w for w in wins if w[0] == key), key=lambda w: w[2])
            assert {w[2] for w in mine} <= set(offsets), f"{key}: an acknowledged append is gone"
            extra = len(offsets) - len(mine)
            assert 0 <= extra <= doubt.count(key), f"{key}: {extra} records nobody wrote"
            chain = [-1, *offsets]
            for _key, before, written in mine:  # each success's version was the record before it
                assert chain[chain.index(written) - 1] == before, (key, before, written)
        # and writing goes on from the versions the index gives after the restart
        h = history(c, "agg", keys[0])
        assert append(c, "agg", keys[0], ["after"], headers={"If-Match": h.headers["etag"]}).status_code == 200
    assert again.stop() == 0


def test_a_tombstone_ends_a_key_stream_on_a_compacted_topic(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "tbl", "partitions": 1, "configs": {"cleanup.policy": "compact"}})
    append(client, "tbl", "k", ["v1"])
    append(client, "tbl", "other", ["x"])
    append(client, "tbl", "k", [None])
    with client.stream("GET", key_path("tbl", "k") + "/stream", params={"offset": 0}) as r:
        assert r.status_code == 200
        text = "".join(r.iter_text())  # the stream ends by itself after the tombstone
    events = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    assert events == ["record", "record", "end"]
    assert '"value":null' in text and '"reason":"tombstone"' in text
    # a key's history shows its tombstone, and its version is the tombstone's offset
    h = history(client, "tbl", "k")
    assert [rec["value"] for rec in h.json()["records"]] == ["v1", None] and h.headers["etag"] == '"2"'
    assert_problem(append(client, "tbl", "k", ["again"], headers={"If-None-Match": "*"}), 412, "key_version_mismatch")
    assert append(client, "tbl", "k", ["again"], headers={"If-Match": '"2"'}).status_code == 200


def test_a_big_append_for_one_key_is_one_unit(client: httpx.Client) -> None:
    """A body above the inline size (parsed and encoded in a worker thread): every record gets
    consecutive offsets in the key's partition, and the history pages through them."""
    client.post("/v1/topics", json={"name": "big", "partitions": 3})
    r = append(client, "big", "bulk", [f"v{i:05d}-" + "x" * 100 for i in range(3000)], headers={"If-None-Match": "*"})
    assert r.status_code == 200, r.text
    offsets = r.json()["offsets"]
    assert offsets == list(range(offsets[0], offsets[0] + 3000)) and r.headers["etag"] == f'"{offsets[-1]}"'
    page = history(client, "big", "bulk", max_records=10_000).json()
    assert len(page["records"]) == 3000 and page["records"][-1]["value"].startswith("v02999-")


def test_a_key_stream_resumes_after_last_event_id(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "resume", "partitions": 2})
    offsets = [append(client, "resume", "k", [f"v{i}"]).json()["last_offset"] for i in range(4)]
    append(client, "resume", "other", ["x"])
    with client.stream("GET", key_path("resume", "k") + "/stream", headers={"Last-Event-ID": str(offsets[1])},
                       timeout=httpx.Timeout(5, read=2)) as r:
        assert r.status_code == 200
        ids = []
        try:
            for line in r.iter_lines():
                if line.startswith("id: "):
                    ids.append(int(line[4:]))
                    if len(ids) == 2:
                        break
        except httpx.ReadTimeout:
            pass
    assert ids == offsets[2:]
    # from now (no offset): an empty key waits; a bad start is a 416 before the stream begins
    assert_problem(client.get(key_path("resume", "k") + "/stream", params={"offset": 10_000}), 416, "offset_out_of_range")
