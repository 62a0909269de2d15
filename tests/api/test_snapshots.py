"""Snapshots: the endpoints, hard links, the manifest, and consistency while the live log is
produced to, compacted and trimmed (the app in this process); the CLI on a stopped data dir and
against a real server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.settings import Settings
from engine.snapshots import MANIFEST, SnapshotLimits, default_root
from tests.kafka_oracle import decode_all

from ..conftest import KEPT_ENV
from .test_api import assert_problem

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
    assert snap["path"] == snap["id"]  # from the snapshot dir: beside the data dir, never in it
    path = server.data_dir.parent / f"{server.data_dir.name}.snapshots" / snap["path"]
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
        path = default_root(server.data_dir) / snap["path"]
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
    root = default_root(server.data_dir)
    later = json.loads((root / second["path"] / "manifest.json").read_text())
    part = later["topics"][0]["partitions"][0]
    assert part["log_start_offset"] >= hw and part["high_watermark"] >= part["log_start_offset"]
    records = snapshot_records(root / second["path"], later, "acct", 0)
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
        # a snapshot writes to the server's disk: a read-only token may not take one, even of
        # its own topics (fifty of them once filled the disk, and producers got 507)
        assert analyst.post("/v1/snapshots", json={"topics": ["sales.eu"]}).status_code == 403
        assert analyst.post("/v1/snapshots", json={"topics": ["hr"]}).status_code == 403
        assert analyst.post("/v1/snapshots").status_code == 403
        assert analyst.get("/v1/snapshots").status_code == 403
        producer = client("producer-token")
        assert producer.post("/v1/snapshots", json={"topics": ["sales.eu"]}).status_code == 403
        assert client(None).post("/v1/snapshots").status_code == 401
        assert admin.post("/v1/snapshots").status_code == 201
        assert admin.post("/v1/snapshots", json={"topics": ["__consumer_offsets"]}).status_code == 201
        assert len(admin.get("/v1/snapshots").json()["snapshots"]) == 2
        # the refused ones left nothing
        assert len(list(default_root(server.data_dir).iterdir())) == 2
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
    root = default_root(server.data_dir)
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
        refused = subprocess.run(
            [str(eventlog), "snapshot", "--url", server.url, "--topics", "nope"],
            capture_output=True, text=True, timeout=60,
        )
        # app/remote.py: a refusal is told by its problem code and detail
        assert refused.returncode == 1 and "snapshot failed" in refused.stderr, refused.stderr
        assert "topic_not_found" in refused.stderr, refused.stderr
    finally:
        server.stop()
    gone = subprocess.run(
        [str(eventlog), "snapshot", "--url", server.url], capture_output=True, text=True, timeout=60
    )
    assert gone.returncode == 1 and "cannot reach" in gone.stderr, gone.stderr
    assert "without --url" in gone.stderr, gone.stderr


def _texts(*responses) -> str:
    return "\n".join(r.text for r in responses)


def test_answers_say_paths_relative_to_the_data_dir_never_absolute(server_factory, tmp_path: Path) -> None:
    """Snapshot answers (and their errors) showed the server's absolute filesystem path."""
    server = server_factory().start()
    try:
        with server.client() as c:
            c.post("/v1/topics", json={"name": "t"})
            produce(c, "t", [{"value": "v"}])
            created = c.post("/v1/snapshots", json={"topics": ["t"]})
            snap = created.json()
            assert snap["path"] == snap["id"]
            listed, described = c.get("/v1/snapshots"), c.get(f"/v1/snapshots/{snap['id']}")
            assert listed.json()["snapshots"][0]["path"] == described.json()["path"] == snap["path"]
            # a damaged manifest: a storage_error whose detail names the file from the snapshot dir
            manifest = default_root(server.data_dir) / snap["path"] / "manifest.json"
            manifest.write_bytes(b"{not json")
            damaged = c.get(f"/v1/snapshots/{snap['id']}")
            problem = assert_problem(damaged, 500, "storage_error")
            shown = f"<snapshot dir>/{snap['id']}/manifest.json: "
            assert problem["detail"].startswith(shown), problem
            assert_problem(c.get("/v1/snapshots"), 500, "storage_error")
            assert str(tmp_path) not in _texts(created, listed, described, damaged, c.get("/v1/snapshots"))
    finally:
        server.stop()
    # a snapshot dir outside the data dir (on another filesystem, even): paths from the snapshot dir
    outside = tmp_path / "elsewhere"
    other = server_factory(tmp_path / "data2", EVENTLOG_SNAPSHOT_DIR=str(outside)).start()
    try:
        with other.client() as c:
            c.post("/v1/topics", json={"name": "t"})
            produce(c, "t", [{"value": "v"}])
            created = c.post("/v1/snapshots", json={"topics": ["t"]})
            snap = created.json()
            assert snap["path"] == snap["id"] and (outside / snap["id"] / "manifest.json").is_file()
            assert str(tmp_path) not in _texts(created, c.get("/v1/snapshots"), c.get(f"/v1/snapshots/{snap['id']}"))
    finally:
        other.stop()


def _snapshot_dirs(root: Path) -> list[str]:
    return sorted(d.name for d in root.iterdir()) if root.exists() else []


def test_the_snapshot_count_cap_refuses_before_writing(server_factory) -> None:
    server = server_factory(EVENTLOG_SNAPSHOT_MAX_COUNT="2").start()
    root = default_root(server.data_dir)
    try:
        with server.client() as c:
            c.post("/v1/topics", json={"name": "t"})
            produce(c, "t", [{"value": "v"}])
            first, _second = (c.post("/v1/snapshots", json={"topics": ["t"]}).json() for _ in range(2))
            before = _snapshot_dirs(root)
            problem = assert_problem(c.post("/v1/snapshots", json={"topics": ["t"]}), 507, "snapshot_limit")
            assert (problem["limit"], problem["max_count"], problem["snapshots"]) == ("count", 2, 2), problem
            assert _snapshot_dirs(root) == before  # nothing written
            assert c.delete(f"/v1/snapshots/{first['id']}").status_code == 204
            assert c.post("/v1/snapshots", json={"topics": ["t"]}).status_code == 201
    finally:
        server.stop()


def test_the_snapshot_bytes_cap_counts_copies_not_links_shared_with_the_log(server_factory) -> None:
    server = server_factory(EVENTLOG_SNAPSHOT_MAX_BYTES="300000").start()
    root = default_root(server.data_dir)
    value = "x" * 1000
    try:
        with server.client() as c:
            c.post("/v1/topics", json={"name": "active"})  # one big active segment: copied
            for _ in range(10):
                produce(c, "active", [{"value": value}] * 20)
            c.post("/v1/topics", json={"name": "linked", "configs": {"segment.bytes": 10000}})  # closed: linked
            for _ in range(15):
                produce(c, "linked", [{"value": value}] * 10)
            assert c.get("/v1/topics/linked").json()["partitions"][0]["segments"] > 10
            first = c.post("/v1/snapshots", json={"topics": ["active"]})
            assert first.status_code == 201, first.text
            # 150 KB of closed segments: hard links the live log shares cost the disk nothing
            linked = c.post("/v1/snapshots", json={"topics": ["linked"]})
            assert linked.status_code == 201, linked.text
            before = _snapshot_dirs(root)
            refused = c.post("/v1/snapshots", json={"topics": ["active"]})
            problem = assert_problem(refused, 507, "snapshot_limit")
            assert (problem["limit"], problem["max_bytes"], problem["snapshots"]) == ("bytes", 300000, 2), problem
            assert 200_000 <= problem["snapshot_bytes"] < 300_000 <= problem["snapshot_bytes"] + problem["needed_bytes"]
            assert problem["needed_bytes"] >= 200_000
            assert _snapshot_dirs(root) == before  # nothing written
            assert c.delete(f"/v1/snapshots/{first.json()['id']}").status_code == 204
            assert c.post("/v1/snapshots", json={"topics": ["active"]}).status_code == 201
    finally:
        server.stop()


def test_snapshot_cap_settings(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).snapshot_limits() == SnapshotLimits(max_count=32, max_disk_fraction=0.1)
    limits = Settings(data_dir=tmp_path, snapshot_max_count=3, snapshot_max_bytes="300000").snapshot_limits()
    assert limits == SnapshotLimits(max_count=3, max_bytes=300_000)
    assert Settings(data_dir=tmp_path, snapshot_max_bytes="2.5%").snapshot_limits().max_disk_fraction == 0.025
    for bad in ("0", "-1", "150%", "0%", "x%", "lots", True):
        with pytest.raises(ValidationError):
            Settings(data_dir=tmp_path, snapshot_max_bytes=bad)
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, snapshot_max_count=0)


def test_the_cli_on_a_stopped_data_dir_keeps_to_the_caps(server_factory) -> None:
    server = server_factory().start()
    with server.client() as c:
        c.post("/v1/topics", json={"name": "t"})
        produce(c, "t", [{"value": "v"}])
        assert c.post("/v1/snapshots", json={"topics": ["t"]}).status_code == 201
    server.stop()
    eventlog = Path(sys.executable).with_name("eventlog")
    command = [str(eventlog), "snapshot", "--data-dir", str(server.data_dir), "--topics", "t"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLOG_")} | KEPT_ENV
    refused = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**env, "EVENTLOG_SNAPSHOT_MAX_COUNT": "1"}, check=False
    )
    assert refused.returncode == 1 and "1 snapshots exist, at most 1 are allowed" in refused.stderr, refused.stderr
    assert len(list(default_root(server.data_dir).iterdir())) == 1
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**env, "EVENTLOG_SNAPSHOT_MAX_COUNT": "2"}, check=False
    )
    assert done.returncode == 0, done.stderr
    # on the operator's machine: the full path
    assert str(default_root(server.data_dir)) in done.stdout


@pytest.mark.parametrize("small", ["data_dir", "snapshot_dir"])
def test_a_snapshot_on_a_full_disk_is_507_and_leaves_nothing_behind(server_factory, small_fs, tmp_path: Path, small: str) -> None:
    """A full disk answered 500 and could leave a half-written snapshot directory."""
    fs = small_fs(16 * 1024 * 1024)
    env = {"EVENTLOG_SNAPSHOT_MAX_BYTES": str(1 << 40), "EVENTLOG_CHECKPOINT_INTERVAL_MS": "3600000"}
    if small == "data_dir":  # the default snapshot dir, beside the data dir on its filesystem
        server = server_factory(fs.path / "data", **env)
        root = fs.path / "data.snapshots"
    else:
        root = fs.path / "snapshots"
        server = server_factory(tmp_path / "data", EVENTLOG_SNAPSHOT_DIR=str(root), **env)
    server.start()
    try:
        with server.client() as c:
            c.post("/v1/topics", json={"name": "t", "configs": {"segment.bytes": 200_000}})
            for _ in range(20):  # 2 MB: closed segments and a big active one
                produce(c, "t", [{"value": "x" * 10_000}] * 10)
            fs.fill(leave_bytes=32 * 1024)
            free_before = fs.free_bytes()
            full = c.post("/v1/snapshots", json={"topics": ["t"]})
            assert_problem(full, 507, "storage_full")
            assert str(tmp_path) not in full.text
            assert _snapshot_dirs(root) == []  # no half-written snapshot
            assert fs.free_bytes() >= free_before  # the space it took is back
            assert c.get("/v1/snapshots").json() == {"snapshots": []}
            fs.free()
            done = c.post("/v1/snapshots", json={"topics": ["t"]})
            assert done.status_code == 201, done.text
            assert (root / done.json()["id"] / "manifest.json").is_file()
            assert c.get("/readyz").status_code == 200
    finally:
        fs.free()
        assert server.stop() == 0, server.log()


@pytest.mark.slow
def test_snapshot_cost_grows_with_segments_not_bytes(app_factory) -> None:
    """A sanity bound, not a benchmark: 200 closed segments are linked, not copied."""
    server = app_factory().start()
    try:
        with server.client() as c:
            _big(server, c)
    finally:
        server.stop()


def _big(server, c) -> None:
    c.post("/v1/topics", json={"name": "big", "configs": {"segment.bytes": 20000}})
    value = "x" * 1000
    for _ in range(200):
        produce(c, "big", [{"key": f"k{j}", "value": value} for j in range(19)])
    snap = c.post("/v1/snapshots", json={"topics": ["big"]}).json()
    (part,) = snap["partitions"]
    assert part["segments"] >= 190
    manifest = json.loads((default_root(server.data_dir) / snap["path"] / MANIFEST).read_text())
    copied = [s for s in manifest["topics"][0]["partitions"][0]["segments"] if s["copied"]]
    assert len(copied) == 1


# -- a log dir Kafka can open: snapshots beside it, never in it ---------------------------------

# Apache Kafka's UnifiedLog.parseTopicPartitionName, which LogManager.loadLogs applies to every
# directory of a log dir (files it passes over): anything it cannot parse stops the broker
_KAFKA_SUFFIXED = re.compile(r"^(\S+)-(\S+)\.(\S+)-(delete|future|stray)$")


def kafka_partition_of(name: str) -> tuple[str, int]:
    """What Kafka makes of a directory in a log dir; ValueError where it refuses to start."""
    if "-" not in name:
        raise ValueError(f"{name}: not in the form of topic-partition")
    if name.endswith(("-delete", "-future", "-stray")):
        if not _KAFKA_SUFFIXED.match(name):
            raise ValueError(f"{name}: not topic-partition.uniqueId-delete/-future/-stray")
        name = name[: name.rindex(".")]
    topic, _, partition = name.rpartition("-")
    if not topic or not re.fullmatch(r"[+-]?\d+", partition):  # Java's Integer.parseInt
        raise ValueError(f"{name}: not in the form of topic-partition")
    return topic, int(partition)


def kafka_refuses(log_dir: Path) -> list[str]:
    refused = []
    for entry in sorted(log_dir.iterdir()):
        if entry.is_dir():
            try:
                kafka_partition_of(entry.name)
            except ValueError as exc:
                refused.append(str(exc))
    return refused


def test_kafkas_rule_for_log_dir_entries() -> None:
    accepted = ("orders-0", "a-b-12", "__metadata-0", "t-0.a1b2c3d4e5f64718293a4b5c6d7e8f90-delete",
                "t-3.AAAAAAAAAAAAAAAAAAAAAA-stray", "t-1.f00-future")
    for name in accepted:
        kafka_partition_of(name)
    for name in ("snapshots", "data.snapshots", "lost+found", "t-x", "-0", "t-", "t-0-delete"):
        with pytest.raises(ValueError):
            kafka_partition_of(name)


def test_a_data_dir_after_snapshots_holds_only_what_kafka_accepts(app_factory) -> None:
    """The outside check: Kafka refuses to start on a log dir holding `snapshots/`. Snapshots
    now go beside the data dir (`<data dir>.snapshots`, its filesystem: closed segments are
    still links), and every directory left in the data dir is one Kafka parses."""
    server = app_factory().start()
    try:
        with server.client() as c:
            configs = {"segment.bytes": 300}
            c.post("/v1/topics", json={"name": "orders", "partitions": 2, "configs": configs})
            c.post("/v1/topics", json={"name": "gone"})
            for i in range(20):
                produce(c, "orders", [{"key": f"k{i}", "value": f"v{i}"}], partition=i % 2)
            snap = c.post("/v1/snapshots", json={"topics": ["orders", "__consumer_offsets"]}).json()
            assert c.delete("/v1/topics/gone").status_code in (200, 202, 204)
            assert kafka_refuses(server.data_dir) == []
    finally:
        server.stop()
    assert kafka_refuses(server.data_dir) == []
    root = server.data_dir.parent / f"{server.data_dir.name}.snapshots"
    manifest = json.loads((root / snap["id"] / "manifest.json").read_text())
    (orders,) = [t for t in manifest["topics"] if t["name"] == "orders"]
    part = orders["partitions"][0]
    linked = [s for s in part["segments"] if not s["copied"]]
    assert linked, "closed segments"
    for seg in linked:  # hard links of the live files: the same filesystem
        live = server.data_dir / part["dir"] / seg["file"]
        assert (root / snap["id"] / part["dir"] / seg["file"]).stat().st_ino == live.stat().st_ino


@pytest.mark.in_process_only  # reads the server's log records
def test_snapshots_an_older_version_kept_in_the_data_dir_are_moved_beside_it(
    app_factory, caplog, tmp_path: Path
) -> None:
    """Snapshots of older versions (`<data dir>/snapshots`, their default) are moved out at
    start-up, links and all, and listed as before; an unfinished one is removed; anything else
    there stays, with a warning, and so does the directory."""
    legacy = tmp_path / "data" / "snapshots"  # what the older versions' default was
    old = app_factory(tmp_path / "data", EVENTLOG_SNAPSHOT_DIR=str(legacy)).start()
    try:
        with old.client() as c:
            c.post("/v1/topics", json={"name": "t", "configs": {"segment.bytes": 300}})
            for i in range(10):
                produce(c, "t", [{"key": "k", "value": f"v{i}"}])
            first = c.post("/v1/snapshots", json={"topics": ["t"]}).json()
            second = c.post("/v1/snapshots", json={"topics": ["t"]}).json()
    finally:
        old.stop()
    # inside the data dir, as older versions answered
    assert first["path"] == f"snapshots/{first['id']}"
    assert kafka_refuses(old.data_dir) == ["snapshots: not in the form of topic-partition"]
    linked = next(p for p in (legacy / first["id"] / "t-0").glob("*.log") if p.stat().st_nlink > 1)
    (legacy / "20260101T000000000Z-abcdef" / "t-0").mkdir(parents=True)  # unfinished: no manifest
    server = app_factory(old.data_dir).start()  # the default snapshot dir
    try:
        with server.client() as c:
            listed = c.get("/v1/snapshots").json()["snapshots"]
            assert [s["id"] for s in listed] == [first["id"], second["id"]]
            assert listed[0]["path"] == first["id"]
            assert c.delete(f"/v1/snapshots/{second['id']}").status_code == 204
    finally:
        server.stop()
    root = default_root(server.data_dir)
    assert not legacy.exists() and kafka_refuses(server.data_dir) == []
    moved = root / first["id"] / "t-0" / linked.name
    # a link still
    assert moved.stat().st_ino == (server.data_dir / "t-0" / linked.name).stat().st_ino
    assert sorted(p.name for p in root.iterdir()) == [first["id"]]
    # what is not a snapshot stays, and so does the directory, with a warning saying why
    legacy.mkdir()
    (legacy / "notes.txt").write_text("mine")
    caplog.clear()
    server = app_factory(old.data_dir).start()
    server.stop()
    assert (legacy / "notes.txt").read_text() == "mine"
    warned = [m for r in caplog.records if "notes.txt: not a snapshot" in (m := r.getMessage())]
    assert warned and "Apache Kafka will not start on that log dir" in warned[0], warned
