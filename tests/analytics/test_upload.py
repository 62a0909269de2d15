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
import re
from pathlib import Path

import pytest

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
        match = re.search(r'"([A-Z]+) (\S+) HTTP', record.getMessage())
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

    local_dirs = [server.data_dir / "snapshots" / snapshot_id for snapshot_id, _, _ in uploads]
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


def _uploaded(target: str, endpoint: str, snapshot_id: str) -> dict:
    from analytics import storage

    location = f"{target}/snapshots/{snapshot_id}/manifest.json?endpoint_override={endpoint}"
    return json.loads(storage.read_bytes(location))

