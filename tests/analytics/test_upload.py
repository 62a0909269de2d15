"""Snapshots on shared storage: `eventlog snapshot --to` uploads incrementally, and every reader
(the data source, analytics.load, the nightly job, the streaming source) reads the upload.

Two targets: a local directory (pure Python, through the conftest snapshot), and a real
S3-compatible server on loopback (moto's standalone server, in a thread), written by the CLI
from a real `eventlog serve`'s snapshots and read back by Spark's Python workers through
pyarrow's S3 filesystem (the Hadoop S3 connector is not installed here). PUTs are counted from
the server's request log.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from engine.snapshots import default_root

from .conftest import S3_TEST_ENV, Row, Snapshot

BUCKET = "eventlog-test"


def _rows_of(batches) -> list[Row]:
    rows = []
    for batch in batches:
        for r in batch.to_pylist():
            rows.append(Row(r["topic"], r["partition"], r["offset"], int(r["timestamp"].timestamp() * 1000), r["key"],
                            r["value"], tuple((h["key"], h["value"]) for h in r["headers"])))
    return sorted(rows, key=lambda r: (r.topic, r.partition, r.offset))


def _read_all(path: str) -> list[Row]:
    """The data source's rows of a snapshot, without Spark: its plan, then each partition's read."""
    from analytics.source import _read_raw, plan_partitions

    return _rows_of(b for p in plan_partitions(path, {}) for b in _read_raw(p))


def _objects(manifest: dict) -> list[str]:
    return [s["object"] for t in manifest["topics"] for p in t["partitions"] for s in p["segments"] if s.get("object")]


HOUR_MS = 3_600_000
OLD, OLDER, NEW = "20261124T020000000Z-00000a", "20261125T020000000Z-00000b", "20261126T020000000Z-00000c"


def _upload_as(snapshot: Snapshot, tmp_path: Path, target: str, snapshot_id: str, shrink: int = 0) -> dict:
    """Upload a copy of the conftest snapshot as `snapshot_id`, with orders-1's newest segment
    `shrink` bytes shorter (as an older snapshot saw it: another object); its uploaded manifest."""
    from analytics import storage
    from analytics.upload import upload_snapshot

    copy = tmp_path / "taken" / snapshot_id
    shutil.copytree(snapshot.path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["snapshot_id"] = snapshot_id
    manifest["topics"][0]["partitions"][1]["segments"][-1]["size_bytes"] -= shrink
    (copy / "manifest.json").write_text(json.dumps(manifest))
    upload_snapshot(str(copy), target)
    return json.loads(storage.read_bytes(storage.join(target, "snapshots", snapshot_id, "manifest.json")))


def _newest_segment_object(manifest: dict) -> str:
    """orders-1's newest segment's object, relative to the upload root."""
    return manifest["topics"][0]["partitions"][1]["segments"][-1]["object"].removeprefix("../../")


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*"))


def _age(path: Path, mtime_ms: int) -> None:
    os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))


# -- a local directory ------------------------------------------------------------------------


def test_upload_to_a_directory_reads_the_same_and_sends_each_segment_once(snapshot: Snapshot, tmp_path: Path) -> None:
    from analytics import cache
    from analytics.upload import upload_snapshot

    from ..conftest import run_eventlog

    store = tmp_path / "store"
    first = upload_snapshot(str(snapshot.path), str(store))
    segments = [s for t in snapshot.manifest["topics"] for p in t["partitions"] for s in p["segments"]]
    assert (first.uploaded, first.skipped) == (len(segments), 0)
    uploaded = store / "snapshots" / "test-snapshot"
    manifest = json.loads((uploaded / "manifest.json").read_text())
    assert first.manifest == str(uploaded / "manifest.json")
    assert len(_objects(manifest)) == len(segments) and all(o.startswith("../../segments/id-") for o in _objects(manifest))
    assert not any("index_file" in s for t in manifest["topics"] for p in t["partitions"] for s in p["segments"])
    # each object is the segment's [0, size_bytes): orders-1's live segment grew after the snapshot
    for t, t_up in zip(snapshot.manifest["topics"], manifest["topics"], strict=True):
        for p, p_up in zip(t["partitions"], t_up["partitions"], strict=True):
            for s, s_up in zip(p["segments"], p_up["segments"], strict=True):
                data = (snapshot.path / p["dir"] / s["file"]).read_bytes()[: s["size_bytes"]]
                assert (uploaded / s_up["object"]).read_bytes() == data
    assert not list(store.rglob("*.tmp"))
    # readers follow the objects: the same rows as the snapshot itself (internal topic included)
    assert _read_all(str(uploaded)) == sorted(snapshot.rows, key=lambda r: (r.topic, r.partition, r.offset))
    # again, through a file:// URI and the CLI: nothing is sent
    again = run_eventlog("upload-snapshot", str(snapshot.path), "--to", f"file://{store}")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1]) == {
        "manifest": str(uploaded / "manifest.json"), "uploaded": 0, "skipped": len(segments)}
    # the segment cache names an object's Parquet file as the segment's (its digest from its
    # name): a cache built from the local snapshot serves the uploaded one
    local, _ = cache.plan(snapshot.path, tmp_path / "cache", {})
    remote, _ = cache.plan(uploaded, tmp_path / "cache", {})
    assert [c.file for c in remote] == [c.file for c in local]
    missing = run_eventlog("upload-snapshot", str(tmp_path), "--to", str(store))
    assert missing.returncode == 2 and "not a finished snapshot" in missing.stderr


def test_prune_keeps_the_newest_snapshots_and_what_they_name_and_what_uploads_write_now(
        snapshot: Snapshot, tmp_path: Path) -> None:
    """Three snapshots uploaded (the two older with older sizes of orders-1's newest segment), a
    crashed upload's leftovers and a running upload's: keep 1 drops the two older manifests, the
    two objects only they named, and what the crash left, past the grace period."""
    from analytics.prune import prune_upload

    store = tmp_path / "store"
    manifests = {i: _upload_as(snapshot, tmp_path, str(store), i, shrink) for i, shrink in
                 ((OLD, 40), (OLDER, 20), (NEW, 0))}
    now_ms = int(time.time() * 1000) + 2 * HOUR_MS  # everything written so far is 2 hours old
    crashed = store / "segments" / "id-orders" / "0" / ".00000000000000000000-1-0.log.0badf00d.tmp"
    crashed.write_bytes(b"x")
    sending = store / "segments" / "id-orders" / "0" / "00000000000000000999-3-00000000.log"  # no manifest yet
    sending.write_bytes(b"abc")
    _age(sending, now_ms - HOUR_MS + 60_000)
    (store / "snapshots" / "20261123T020000000Z-dead00").mkdir()  # a crash while writing its manifest
    (store / "snapshots" / "20261123T020000000Z-dead00" / ".manifest.json.0badf00d.tmp").write_bytes(b"{")
    writing = store / "snapshots" / "20261126T030000000Z-11ae00"  # an upload writing its manifest now
    writing.mkdir()
    _age(writing, now_ms - 60_000)
    before = _tree(store)

    dry = prune_upload(str(store), keep=1, dry_run=True, now_ms=now_ms)
    assert _tree(store) == before
    assert (dry.root, dry.kept, dry.snapshots_removed) == (str(store), [NEW], [OLD, OLDER])
    assert (dry.unfinished_removed, dry.unfinished_left) == (["20261123T020000000Z-dead00"], [writing.name])
    gone = {_newest_segment_object(manifests[OLD]), _newest_segment_object(manifests[OLDER]),
            str(crashed.relative_to(store))}
    assert {name for name, _ in dry.objects_removed} == gone and dry.objects_young == 1
    assert dry.bytes_removed == sum((store / name).stat().st_size for name in gone)

    lines: list[str] = []
    done = prune_upload(f"file://{store}", keep=1, now_ms=now_ms, progress=lines.append)
    assert (done.kept, done.snapshots_removed, done.unfinished_removed, done.objects_removed, done.objects_young) == \
        (dry.kept, dry.snapshots_removed, dry.unfinished_removed, dry.objects_removed, dry.objects_young)
    assert f"removed snapshot {OLD}" in lines and len(lines) == 2 + 1 + 3
    assert sorted(p.name for p in (store / "snapshots").iterdir()) == [NEW, writing.name]
    named = {o.removeprefix("../../") for o in _objects(manifests[NEW])}
    assert {str(p.relative_to(store)) for p in (store / "segments").rglob("*") if p.is_file()} == \
        named | {str(sending.relative_to(store))}
    assert _read_all(str(store / "snapshots" / NEW)) == sorted(snapshot.rows, key=lambda r: (r.topic, r.partition, r.offset))
    # again: nothing left to remove; without --keep every finished snapshot stays
    again = prune_upload(str(store), now_ms=now_ms)
    assert (again.kept, again.snapshots_removed, again.objects_removed, again.objects_young) == ([NEW], [], [], 1)
    # the running upload's object, once past the grace period with no manifest naming it (it crashed)
    later = prune_upload(str(store), now_ms=now_ms + HOUR_MS)
    assert later.objects_removed == [(str(sending.relative_to(store)), 3)] and later.unfinished_removed == [writing.name]
    assert prune_upload(str(store), keep=0, dry_run=True, now_ms=now_ms).snapshots_removed == [NEW]


def test_prune_refuses_what_is_not_an_upload_root(snapshot: Snapshot, tmp_path: Path) -> None:
    from analytics.prune import prune_upload

    from ..conftest import run_eventlog

    def refused(root: Path | str, message: str, **options) -> None:
        with pytest.raises(ValueError, match=message):
            prune_upload(str(root), **options)

    refused(tmp_path / "nothing", "no such upload root")
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", r"not an upload root \(no snapshots/ or segments/")
    store = tmp_path / "store"
    _upload_as(snapshot, tmp_path, str(store), NEW)
    refused(store / "snapshots", "the parent of this snapshots/")
    refused(store / "snapshots" / NEW / "manifest.json", r"not an upload root \(a file\)")
    refused(store, "keep must be >= 0", keep=-1)
    data = tmp_path / "data"
    shutil.copytree(snapshot.path, data / "snapshots" / NEW)
    (data / "meta.properties").write_text("version=0\n")
    refused(data, "a data dir")
    # a data dir's snapshots laid out as an upload root's: its manifests name local files
    orphan = store / "segments" / "id-orders" / "0" / "00000000000000000999-3-00000000.log"
    orphan.write_bytes(b"abc")
    later = int(time.time() * 1000) + 2 * HOUR_MS
    shutil.copytree(snapshot.path, store / "snapshots" / OLDER)
    refused(store, f"snapshots/{OLDER}/manifest.json: names local files", now_ms=later)
    shutil.rmtree(store / "snapshots" / OLDER)
    (store / "snapshots" / NEW / "manifest.json").write_text('{"format_version": 1, "topics": [')
    refused(store, f"snapshots/{NEW}/manifest.json: cannot read it .*nothing removed", now_ms=later)
    assert orphan.exists()
    # a dropped snapshot's manifest is not read
    assert str(orphan.relative_to(store)) in dict(prune_upload(str(store), keep=0, now_ms=later).objects_removed)

    cli = run_eventlog("prune-upload", str(tmp_path / "nothing"))
    assert cli.returncode == 2 and "no such upload root" in cli.stderr
    assert run_eventlog("prune-upload", str(store), "--keep", "-1").returncode == 2


def test_prune_upload_command(snapshot: Snapshot, tmp_path: Path) -> None:
    from ..conftest import run_eventlog

    store = tmp_path / "store"
    old = _upload_as(snapshot, tmp_path, str(store), OLD, shrink=40)
    _upload_as(snapshot, tmp_path, str(store), NEW)
    gone = _newest_segment_object(old)
    size = (store / gone).stat().st_size
    dry = run_eventlog("prune-upload", f"file://{store}", "--keep", "1", "--dry-run", "--grace-ms", "0")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.strip().splitlines()
    assert lines[:2] == [f"would remove snapshot {OLD}", f"would remove {gone} ({size} bytes)"]
    assert lines[2] == f"dry run: {store}: would remove 1 snapshots (1 kept), 0 unfinished snapshots, 1 segment objects " \
        f"({size} bytes)"
    summary = {"root": str(store), "dry_run": True, "kept": 1, "snapshots_removed": 1, "unfinished_removed": 0,
               "objects_removed": 1, "bytes_removed": size}
    assert json.loads(lines[-1]) == summary and (store / gone).exists()
    done = run_eventlog("prune-upload", str(store), "--keep", "1", "--grace-ms", "0")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {**summary, "dry_run": False}
    assert not (store / gone).exists() and not (store / "snapshots" / OLD).exists()
    # with the default grace period (an hour), what was just written stays
    young = run_eventlog("prune-upload", str(store), "--keep", "0")
    assert young.returncode == 0, young.stderr
    assert json.loads(young.stdout.strip().splitlines()[-1])["objects_removed"] == 0
    assert "unnamed objects younger than 3600000 ms" in young.stdout


def test_the_nightly_job_refuses_an_object_store_output(tmp_path: Path) -> None:
    from ..conftest import run_eventlog

    refused = run_eventlog("nightly", "--snapshot", str(tmp_path), "--out", f"s3://{BUCKET}/warehouse")
    assert refused.returncode == 2
    assert "must be a local directory" in refused.stderr and not Path("s3:").exists()


def test_locations() -> None:
    from analytics import storage

    uri = "s3a://bucket/p/snapshots/x?endpoint_override=http://127.0.0.1:9000"
    assert storage.is_uri(uri) and not storage.is_uri("file:///tmp/x") and not storage.is_uri("/tmp/x")
    assert storage.join(uri, "../../segments/a/0/1.log") == "s3a://bucket/p/segments/a/0/1.log?endpoint_override=http://127.0.0.1:9000"
    assert storage.display(uri) == "s3a://bucket/p/snapshots/x"
    assert storage.basename(storage.join(uri, "manifest.json")) == "manifest.json"
    assert storage.normalize("file:///tmp/x") == "/tmp/x"
    assert storage.join("/tmp/snap", "../../segments/a") == "/segments/a"
    assert storage.join("/tmp/snap", "orders-0", "0.log") == "/tmp/snap/orders-0/0.log"


# -- a real S3-compatible server ----------------------------------------------------------------


class _Requests(logging.Handler):
    """The moto server's request log (werkzeug's logger): method and path of each request."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = re.search(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (\S+) HTTP', record.getMessage())  # werkzeug colours some
        if match:
            self.seen.append((match[1], match[2]))

    def puts(self, prefix: str) -> list[str]:
        """Paths (without the query) of the PUTs under `prefix`, in order."""
        return [path.split("?")[0] for method, path in self.seen if method == "PUT" and path.startswith(prefix)]


@pytest.fixture(scope="module")
def s3():
    """(endpoint, request log) of a moto server on a free loopback port, with an empty bucket;
    this process's AWS environment points at it."""
    pytest.importorskip("moto.server")
    from moto.server import ThreadedMotoServer
    from pyarrow import fs as pafs

    requests = _Requests()
    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    werkzeug.setLevel(logging.INFO)
    werkzeug.addHandler(requests)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name, value in S3_TEST_ENV.items():
                mp.setenv(name, value)
            for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
                mp.delenv(name, raising=False)
            pafs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True).create_dir(BUCKET)
            yield endpoint, requests
    finally:
        server.stop()
        werkzeug.removeHandler(requests)
        werkzeug.setLevel(level)


@pytest.mark.spark
@pytest.mark.slow
def test_snapshots_uploaded_to_s3_twice_and_read_by_spark(spark, s3, tmp_path: Path) -> None:
    """A server's snapshot uploaded by `eventlog snapshot --url --to` (AWS_ENDPOINT_URL), more
    records, a second one: only its new segments are PUT. Spark reads the upload (the endpoint
    in the URI, for the workers) as the local snapshot; the nightly job and the stream read it."""
    from analytics.nightly import run_nightly
    from analytics.stream_sources import SnapshotSource, read_slice
    from app.settings import Settings
    from app.snapshot import run_snapshot

    from ..conftest import ServerProcess, run_eventlog

    endpoint, requests = s3
    target = f"s3://{BUCKET}/lake"
    env = {"AWS_ENDPOINT_URL": endpoint}
    server = ServerProcess(tmp_path / "data", env={"EVENTLOG_CLEANER_ENABLED": "false"}).start()
    acked = 0
    try:
        with server.client() as c:
            config = {"segment.bytes": 2048}
            assert c.post("/v1/topics", json={"name": "orders", "partitions": 2, "configs": config}).status_code < 300

            def produce(rounds: int) -> None:
                nonlocal acked
                for i in range(rounds):
                    records = [{"key": f"k{(i * 13 + j) % 17}", "value": f"order {i}-{j} " + "x" * 40,
                                "headers": [{"key": "h", "value": str(j)}] if j % 4 == 0 else []} for j in range(20)]
                    response = c.post("/v1/topics/orders/records", json={"records": records})
                    assert response.status_code == 200, response.text
                    acked += len(records)

            uploads = []
            for rounds in (6, 3):
                produce(rounds)
                before = len(requests.puts(f"/{BUCKET}/lake/"))
                done = run_eventlog("snapshot", "--url", server.url, "--data-dir", str(server.data_dir), "--to", target,
                                    env=env)
                assert done.returncode == 0, done.stderr
                summary = json.loads(done.stdout.strip().splitlines()[-1])
                snapshot_id = summary["manifest"].split("/")[-2]
                puts = requests.puts(f"/{BUCKET}/lake/")[before:]
                uploads.append((snapshot_id, summary, puts))
            # the files must be readable where --to runs: elsewhere, a clear refusal
            assert run_snapshot(Settings(data_dir=tmp_path / "elsewhere"), None, url=server.url, token=None, to=target) == 1
    finally:
        server.stop()

    local_dirs = [default_root(server.data_dir) / snapshot_id for snapshot_id, _, _ in uploads]
    manifests = [json.loads((d / "manifest.json").read_text()) for d in local_dirs]
    segments = [sum(len(p["segments"]) for t in m["topics"] for p in t["partitions"]) for m in manifests]
    (id1, first, puts1), (id2, second, puts2) = uploads
    assert first["uploaded"] == segments[0] and first["skipped"] == 0 and segments[0] >= 4
    assert sorted(puts1) == sorted(
        [f"/{BUCKET}/lake/segments/" + o.removeprefix("../../segments/") for o in _objects(_uploaded(target, endpoint, id1))]
        + [f"/{BUCKET}/lake/snapshots/{id1}/manifest.json"])
    # the second upload sends only the segments the first did not hold: those written since,
    # and each partition's newest one, grown since
    names1, names2 = set(_objects(_uploaded(target, endpoint, id1))), set(_objects(_uploaded(target, endpoint, id2)))
    assert second["uploaded"] == len(names2 - names1) and second["skipped"] == len(names2 & names1) > 0
    assert len(puts2) == second["uploaded"] + 1 and second["uploaded"] < segments[1]

    # Spark's workers read the upload through pyarrow's S3 filesystem: the same rows as locally
    remote = f"s3a://{BUCKET}/lake/snapshots/{id2}?endpoint_override={endpoint}"
    cols = ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    from_s3 = sorted(tuple(r) for r in spark.read.format("eventlog").load(remote).select(*cols).collect())
    from_disk = sorted(tuple(r) for r in spark.read.format("eventlog").load(str(local_dirs[1])).select(*cols).collect())
    assert len(from_s3) == acked and from_s3 == from_disk

    # the nightly job: input from S3 (the newest snapshot of the prefix), output local
    out = tmp_path / "warehouse"
    result = run_nightly(spark, f"s3://{BUCKET}/lake/snapshots?endpoint_override={endpoint}", out)
    assert result.snapshot_id == id2 and result.snapshot_path.endswith(f"/snapshots/{id2}?endpoint_override={endpoint}")
    import pyarrow.parquet as pq

    assert sum(r["records"] for r in pq.read_table(out / "daily").to_pylist()) == acked
    assert len(list((out / "segments").rglob("*.parquet"))) == segments[1]

    # the streaming source's snapshots mode over the prefix: every offset, from the newest snapshot
    source = SnapshotSource(f"s3://{BUCKET}/lake/snapshots?endpoint_override={endpoint}", None)
    view = source.view()
    assert {tp: r.end for tp, r in view.items()} == {
        ("orders", p["partition"]): p["high_watermark"] for p in manifests[1]["topics"][0]["partitions"]}

    def report(message: str) -> None:
        raise AssertionError(message)

    slices = source.slices([(tp, r.log_start, r.end) for tp, r in sorted(view.items())], report)
    streamed = _rows_of(b for s in slices for b in read_slice(s, report))
    assert streamed == _read_all(str(local_dirs[1]))


def test_prune_an_upload_on_s3(s3, snapshot: Snapshot, tmp_path: Path) -> None:
    """Two snapshots uploaded to the S3 server, --keep 1: the older manifest goes at once, the
    objects only it named once past the grace period (the clock moved), by DELETE requests."""
    from pyarrow import fs as pafs

    from analytics.prune import prune_upload

    endpoint, requests = s3
    target = f"s3://{BUCKET}/pruned?endpoint_override={endpoint}"
    old = _upload_as(snapshot, tmp_path, target, OLD, shrink=40)
    new = _upload_as(snapshot, tmp_path, target, NEW)
    fs = pafs.S3FileSystem(endpoint_override=endpoint)
    with fs.open_output_stream(f"{BUCKET}/pruned/segments/id-orders/0/00000000000000000999-3-00000000.log") as out:
        out.write(b"abc")  # a crashed upload's
    gone = {_newest_segment_object(old), "segments/id-orders/0/00000000000000000999-3-00000000.log"}

    first = prune_upload(target, keep=1)
    assert (first.root, first.kept, first.snapshots_removed) == (f"s3://{BUCKET}/pruned", [NEW], [OLD])
    assert first.objects_removed == [] and first.objects_young == 2  # written within the hour
    later = int(time.time() * 1000) + 2 * HOUR_MS
    dry = prune_upload(target, keep=1, dry_run=True, now_ms=later)
    assert {name for name, _ in dry.objects_removed} == gone and dry.snapshots_removed == []
    before = len(requests.seen)
    done = prune_upload(target, keep=1, now_ms=later)
    assert done.objects_removed == dry.objects_removed
    deleted = {path.split("?")[0] for method, path in requests.seen[before:] if method == "DELETE"}
    assert deleted == {f"/{BUCKET}/pruned/{name}" for name in gone}
    files = fs.get_file_info(pafs.FileSelector(f"{BUCKET}/pruned", recursive=True))
    assert {i.path.removeprefix(f"{BUCKET}/pruned/") for i in files if i.type == pafs.FileType.File} == \
        {o.removeprefix("../../") for o in _objects(new)} | {f"snapshots/{NEW}/manifest.json"}
    assert {i.path for i in files if i.path.startswith(f"{BUCKET}/pruned/snapshots/")} == {
        f"{BUCKET}/pruned/snapshots/{NEW}", f"{BUCKET}/pruned/snapshots/{NEW}/manifest.json"}
    remote = f"s3://{BUCKET}/pruned/snapshots/{NEW}?endpoint_override={endpoint}"
    assert _read_all(remote) == sorted(snapshot.rows, key=lambda r: (r.topic, r.partition, r.offset))


def _uploaded(target: str, endpoint: str, snapshot_id: str) -> dict:
    from analytics import storage

    location = f"{target}/snapshots/{snapshot_id}/manifest.json?endpoint_override={endpoint}"
    return json.loads(storage.read_bytes(location))



def test_an_object_removed_while_an_upload_runs_is_sent_again(snapshot: Snapshot, tmp_path: Path, monkeypatch) -> None:
    """An upload skips the objects its listing shows; one that a prune-upload removes after that
    listing is looked at again before the manifest names it, and sent again."""
    from analytics import storage, upload

    store = tmp_path / "store"
    first = _upload_as(snapshot, tmp_path, str(store), OLD)
    gone = store / _newest_segment_object(first)
    listing = upload._listing

    def listed_then_pruned(fs, folder: str) -> dict[str, int]:
        present = listing(fs, folder)
        if gone.exists() and str(gone.parent).endswith(folder.rsplit("/", 3)[-1]) and gone.name in present:
            gone.unlink()  # a prune-upload removes it right after this upload listed it
        return present

    monkeypatch.setattr(upload, "_listing", listed_then_pruned)
    second = _upload_as(snapshot, tmp_path, str(store), NEW)
    assert gone.exists()
    assert all((store / o.removeprefix("../../")).is_file() for o in _objects(second))
    assert _read_all(storage.join(str(store), "snapshots", NEW)) == _read_all(str(snapshot.path))
