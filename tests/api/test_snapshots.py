"""Snapshots: the endpoints, hard links, the manifest, and consistency while the live log is
produced to, compacted and trimmed (the app in this process); the CLI on a stopped data dir and
against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.kafka_oracle import decode_all

MANIFEST_KEYS = {"format_version", "snapshot_id", "created_at", "created_ms", "topics"}
TOPIC_KEYS = {"name", "topic_id", "internal", "cleanup_policy", "configs", "partitions"}
PARTITION_KEYS = {"partition", "dir", "log_start_offset", "high_watermark", "segments"}
SEGMENT_KEYS = {"file", "base_offset", "last_offset", "size_bytes", "index_file", "time_index_file", "copied"}


def snapshot_records(path: Path, manifest: dict, topic: str, partition: int) -> list:
    """What a reader of the snapshot sees: records in [log start, high watermark), decoded by
    kafka-python from each segment's first size_bytes."""
    (t,) = [t for t in manifest["topics"] if t["name"] == topic]
    (p,) = [p for p in t["partitions"] if p["partition"] == partition]
    out = []
    for seg in p["segments"]:
        data = (path / p["dir"] / seg["file"]).read_bytes()[: seg["size_bytes"]]
        _batches, records = decode_all(data)
        out.extend(r for r in records if p["log_start_offset"] <= r.offset < p["high_watermark"])
    return out


def check_manifest(manifest: dict) -> None:
    assert set(manifest) == MANIFEST_KEYS and manifest["format_version"] == 1
    for t in manifest["topics"]:
        assert set(t) == TOPIC_KEYS and isinstance(t["configs"], dict)
        assert t["cleanup_policy"] == t["configs"]["cleanup.policy"]
        for p in t["partitions"]:
            assert set(p) == PARTITION_KEYS
            bases = [s["base_offset"] for s in p["segments"]]
            assert bases == sorted(bases)
            for s in p["segments"]:
                assert set(s) == SEGMENT_KEYS
                assert s["base_offset"] <= s["last_offset"] + 1


def produce(client, topic: str, records: list[dict], partition: int | None = None) -> list[int]:
    body = {"records": [dict(r, partition=partition) if partition is not None else r for r in records]}
    response = client.post(f"/v1/topics/{topic}/records", json=body)
    assert response.status_code == 200, response.text
    return [o["offset"] for o in response.json()["offsets"]]


def test_snapshot_endpoints_links_and_manifest(app_server) -> None:
    with app_server.client() as c:
        _endpoints_links_and_manifest(app_server, c)


def _endpoints_links_and_manifest(server, c) -> None:
    c.post("/v1/topics", json={"name": "orders", "partitions": 2, "configs": {"segment.bytes": 400}})
    for i in range(40):
        produce(c, "orders", [{"key": f"k{i % 7}", "value": f"v{i}", "headers": [{"key": "h", "value": None}]}], partition=i % 2)
    created = c.post("/v1/snapshots", json={"topics": ["orders"]})
    assert created.status_code == 201, created.text
    snap = created.json()
    path = Path(snap["path"])
    assert path.parent == server.data_dir / "snapshots"
    assert {(p["topic"], p["partition"], p["high_watermark"]) for p in snap["partitions"]} == {("orders", 0, 20), ("orders", 1, 20)}
    manifest = json.loads((path / "manifest.json").read_text())
    check_manifest(manifest)
    assert manifest["snapshot_id"] == snap["id"]
    # closed segments are hard links of the live files; the active one is a copy of its prefix
    for p in manifest["topics"][0]["partitions"]:
        live = server.data_dir / p["dir"]
        assert len(p["segments"]) > 1
        for seg in p["segments"]:
            for name in (seg["file"], seg["index_file"], seg["time_index_file"]):
                inode = (path / p["dir"] / name).stat().st_ino
                if seg["copied"]:
                    assert inode != (live / name).stat().st_ino
                else:
                    assert inode == (live / name).stat().st_ino
        assert [s["copied"] for s in p["segments"]] == [False] * (len(p["segments"]) - 1) + [True]
        records = snapshot_records(path, manifest, "orders", p["partition"])
        assert [r.offset for r in records] == list(range(20))
        assert all(r.headers == (("h", None),) for r in records)
    # list, describe, delete; the live log is untouched by a delete
    assert [s["id"] for s in c.get("/v1/snapshots").json()["snapshots"]] == [snap["id"]]
    assert c.get(f"/v1/snapshots/{snap['id']}").json() == snap
    assert c.delete(f"/v1/snapshots/{snap['id']}").status_code == 204
    assert not path.exists()
    missing = c.get(f"/v1/snapshots/{snap['id']}")
    assert missing.status_code == 404 and missing.json()["code"] == "snapshot_not_found"
    assert c.delete("/v1/snapshots/../../etc").status_code == 404
    assert c.get("/v1/topics/orders/partitions/0/records", params={"offset": 0, "max_records": 100}).json()["records"][19]["value"] == "v38"
    assert c.post("/v1/snapshots", json={"topics": ["nope"]}).json()["code"] == "topic_not_found"


def test_a_snapshot_does_not_change_when_the_live_log_does(app_factory) -> None:
    """Producers run throughout; compaction, delete-records and retention run after the
    snapshot: every record of the snapshot is still there, and it holds nothing written later."""
    server = app_factory(EVENTLOG_CLEANER_ENABLED="false").start()
    with server.client() as c:
        _snapshot_stays(server, c)
    server.stop()


def _snapshot_stays(server, c) -> None:
    c.post("/v1/topics", json={"name": "acct", "configs": {"cleanup.policy": "compact,delete", "segment.bytes": 600,
                                                            "file.delete.delay.ms": 0, "retention.ms": -1}})
    model: dict[int, tuple[str, str]] = {}
    stop = threading.Event()
    enough = threading.Event()  # 150 records acknowledged
    lock = threading.Lock()

    def producer() -> None:
        with server.client() as pc:
            i = 0
            while not stop.is_set():
                key, value = f"k{i % 13}", f"v{i}"
                (offset,) = produce(pc, "acct", [{"key": key, "value": value}])
                with lock:
                    model[offset] = (key, value)
                    if len(model) >= 150:
                        enough.set()
                i += 1

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        assert enough.wait(30), "the producer did not get 150 records acknowledged"
        with lock:
            acked_before = len(model)
        snap = c.post("/v1/snapshots", json={"topics": ["acct"]}).json()
        path = Path(snap["path"])
        manifest = json.loads((path / "manifest.json").read_text())
        hw = manifest["topics"][0]["partitions"][0]["high_watermark"]
        assert hw >= acked_before  # everything acknowledged before the request is in it
        before = snapshot_records(path, manifest, "acct", 0)
        assert [r.offset for r in before] == list(range(hw))
        with lock:
            assert all(model[r.offset] == (r.key.decode(), r.value.decode()) for r in before)
        # now change the live log under it
        ran = c.post("/v1/admin/compaction/run", json={"topic": "acct"}).json()
        assert ran["records_removed"] > 0
        c.post("/v1/topics/acct/partitions/0/delete-records", json={"before_offset": -1})
        assert c.post("/v1/admin/retention/run", json={"topic": "acct"}).json()["segments_deleted"] > 0
    finally:
        stop.set()
        thread.join()
    after = snapshot_records(path, manifest, "acct", 0)
    assert after == before
    second = c.post("/v1/snapshots", json={"topics": ["acct"]}).json()
    later = json.loads((Path(second["path"]) / "manifest.json").read_text())
    part = later["topics"][0]["partitions"][0]
    assert part["log_start_offset"] >= hw and part["high_watermark"] >= part["log_start_offset"]
    records = snapshot_records(Path(second["path"]), later, "acct", 0)
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets))
    table = {}
    with lock:
        for offset in sorted(model):
            if offset >= part["log_start_offset"] and offset < part["high_watermark"]:
                table[model[offset][0]] = model[offset][1]
    # compaction kept the latest of each key: the table views agree
    assert {r.key.decode(): r.value.decode() for r in records} == table


def test_snapshot_auth(app_factory, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [
        {"name": "ops", "token": "admin-token", "role": "admin"},
        {"name": "analyst", "token": "consumer-token", "role": "consumer", "topics": ["sales."]},
        {"name": "app", "token": "producer-token", "role": "producer", "topics": [""]},
    ]}))
    server = app_factory(EVENTLOG_AUTH_FILE=str(auth)).start(token="admin-token")
    clients = []

    def client(token: str | None):
        c = server.client()
        if token:
            c.headers["authorization"] = f"Bearer {token}"
        clients.append(c)
        return c

    try:
        admin = client("admin-token")
        admin.post("/v1/topics", json={"name": "sales.eu"})
        admin.post("/v1/topics", json={"name": "hr"})
        analyst = client("consumer-token")
        assert analyst.post("/v1/snapshots", json={"topics": ["sales.eu"]}).status_code == 201
        assert analyst.post("/v1/snapshots", json={"topics": ["hr"]}).status_code == 403
        assert analyst.post("/v1/snapshots").status_code == 403  # all topics: admin only
        assert analyst.get("/v1/snapshots").status_code == 403
        producer = client("producer-token")
        assert producer.post("/v1/snapshots", json={"topics": ["sales.eu"]}).status_code == 403
        assert client(None).post("/v1/snapshots").status_code == 401
        assert admin.post("/v1/snapshots").status_code == 201
        assert len(admin.get("/v1/snapshots").json()["snapshots"]) == 2
    finally:
        for c in clients:
            c.close()
        server.stop()


def test_cli_snapshot_of_a_stopped_data_dir_and_unfinished_ones_removed(app_factory, server_factory, tmp_path: Path) -> None:
    """The app in this process writes and restarts; a real server for the last part (the
    offline snapshot refused beside a running one, and a snapshot through --url)."""
    server = app_factory().start()
    with server.client() as c:
        c.post("/v1/topics", json={"name": "t", "configs": {"segment.bytes": 300}})
        for i in range(20):
            produce(c, "t", [{"key": "k", "value": f"v{i}"}])
    server.stop()
    eventlog = Path(sys.executable).with_name("eventlog")
    done = subprocess.run(
        [str(eventlog), "snapshot", "--data-dir", str(server.data_dir), "--topics", "t"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    root = server.data_dir / "snapshots"
    (snap,) = list(root.iterdir())
    manifest = json.loads((snap / "manifest.json").read_text())
    check_manifest(manifest)
    assert [r.value for r in snapshot_records(snap, manifest, "t", 0)] == [f"v{i}".encode() for i in range(20)]
    # a snapshot directory without a manifest was cut short: the next start removes it
    unfinished = root / "20260101T000000000Z-abcdef"
    (unfinished / "t-0").mkdir(parents=True)
    server.start()
    try:
        assert not unfinished.exists() and snap.exists()
        with server.client() as c:
            assert [s["id"] for s in c.get("/v1/snapshots").json()["snapshots"]] == [snap.name]
    finally:
        server.stop()
    # a running server's data dir is refused by the offline snapshot (one process per dir)
    server = server_factory(server.data_dir).start()
    try:
        busy = subprocess.run(
            [str(eventlog), "snapshot", "--data-dir", str(server.data_dir)], capture_output=True, text=True, timeout=60
        )
        assert busy.returncode != 0 and "snapshot failed" in busy.stderr
        remote = subprocess.run(
            [str(eventlog), "snapshot", "--url", server.url, "--topics", "t"], capture_output=True, text=True, timeout=60,
            env={**os.environ},
        )
        assert remote.returncode == 0, remote.stderr
    finally:
        server.stop()


@pytest.mark.slow
def test_snapshot_cost_grows_with_segments_not_bytes(app_factory) -> None:
    """A sanity bound, not a benchmark: 200 closed segments are linked, not copied."""
    server = app_factory().start()
    try:
        with server.client() as c:
            _big(c)
    finally:
        server.stop()


def _big(c) -> None:
    c.post("/v1/topics", json={"name": "big", "configs": {"segment.bytes": 20000}})
    value = "x" * 1000
    for _ in range(200):
        produce(c, "big", [{"key": f"k{j}", "value": value} for j in range(19)])
    snap = c.post("/v1/snapshots", json={"topics": ["big"]}).json()
    (part,) = snap["partitions"]
    assert part["segments"] >= 190
    manifest = json.loads((Path(snap["path"]) / "manifest.json").read_text())
    copied = [s for s in manifest["topics"][0]["partitions"][0]["segments"] if s["copied"]]
    assert len(copied) == 1
