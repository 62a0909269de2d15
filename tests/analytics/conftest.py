"""Fixtures for analytics tests: a snapshot directory built here, and one local SparkSession.

The snapshot follows the manifest spec in analytics/source.py: segments written by the engine
(topic `orders`, compacted, two partitions, several segments) and by kafka-python (topic
`events`: every codec, LogAppendTime, a control batch), plus an internal topic. Partition
`orders-0` has log_start_offset 7; `orders-1` has a high watermark 3 below its last record and
a live segment that grew after the snapshot (bytes past size_bytes).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from engine.config import LogConfig
from engine.format import iter_batches
from engine.records import decode_records, encode_batch

from ..engine.helpers import append_records, running_log
from ..kafka_oracle import build_batch

REPO = Path(__file__).resolve().parents[2]
JAVA_HOME = "/usr/lib/jvm/java-17-openjdk-amd64"
S3_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "eventlog-test",
    "AWS_SECRET_ACCESS_KEY": "eventlog-test",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
T0 = 1_700_000_000_000


@dataclass(frozen=True)
class Row:
    topic: str
    partition: int
    offset: int
    timestamp: int  # ms
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Snapshot:
    path: Path
    rows: list[Row]  # what a full read must return: every non-internal topic, in bounds
    internal_rows: list[Row]
    manifest: dict


def _segment_rows(topic: str, partition: int, path: Path, size: int) -> list[Row]:
    data = path.read_bytes()[:size]
    rows = []
    if data:
        for header in iter_batches(data):
            if not header.is_control:
                rows += [Row(topic, partition, r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
                         for r in decode_records(data, header)]
    return rows


def _write_engine_partition(directory: Path, seed: int) -> None:
    rng = random.Random(seed)
    config = LogConfig(segment_bytes=6000, cleanup_policy="compact")

    async def main() -> None:
        async with running_log(directory, config) as log:
            for i in range(40):
                records = []
                for j in range(rng.randint(1, 12)):
                    key = b"user-%d" % rng.randint(0, 24)
                    value = None if rng.random() < 0.12 else b'{"n": %d, "pad": "%s"}' % (i * 100 + j, b"x" * rng.randint(0, 80))
                    headers = [("trace-id", b"%08x" % rng.getrandbits(32)), ("null", None)] if rng.random() < 0.3 else []
                    records.append((key, value, T0 + i * 1000 + j, headers))
                await append_records(log, records, compression_type=[0, 0, 1, 2, 3, 4][i % 6])

    anyio.run(main)


def _write_events_partition(directory: Path) -> None:
    directory.mkdir(parents=True)
    batches = []
    offset = 0
    for b, codec in enumerate([0, 1, 2, 3, 4, 0]):
        records = [(None if i % 4 == 0 else b"e%d" % i, None if i % 9 == 5 else b"payload-%d-%d" % (b, i),
                    T0 + 60_000 * b + i, [("h", None), ("k", b"v")] if i % 5 == 0 else []) for i in range(25)]
        batches.append(build_batch(records, codec=codec, base_offset=offset,
                                   log_append_time=T0 + 999_999 if b == 5 else None))
        offset += 25
        if b == 2:  # a transaction marker
            batches.append(bytes(encode_batch(offset, [(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", T0, [])],
                                              control=True, transactional=True, producer_id=7)))
            offset += 1
    (directory / "00000000000000000000.log").write_bytes(b"".join(batches))


def _segments_of(directory: Path) -> list[dict]:
    out = []
    for log in sorted(directory.glob("*.log")):
        data = log.read_bytes()
        headers = list(iter_batches(data)) if data else []
        out.append({
            "file": log.name,
            "base_offset": int(log.stem),
            "last_offset": headers[-1].last_offset if headers else int(log.stem) - 1,
            "size_bytes": len(data),
            "index_file": log.stem + ".index",
            "time_index_file": log.stem + ".timeindex",
            "copied": False,
        })
    return [s for s in out if s["size_bytes"] > 0]


def build_snapshot(root: Path) -> Snapshot:
    """Write a snapshot directory (segments + manifest.json) and the rows it must read as."""
    work = root / "work"
    snap = root / "snapshot"
    _write_engine_partition(work / "orders-0", seed=1)
    _write_engine_partition(work / "orders-1", seed=2)
    _write_events_partition(work / "events-0")
    (work / "__metadata-0").mkdir()
    (work / "__metadata-0" / "00000000000000000000.log").write_bytes(
        bytes(encode_batch(0, [(b"orders", b'{"type": "topic_created"}', T0, [])])))

    partitions = {}
    for d in sorted(work.iterdir()):
        shutil.copytree(d, snap / d.name)
        segments = _segments_of(d)
        partitions[d.name] = {"partition": int(d.name.rsplit("-", 1)[1]), "dir": d.name,
                              "log_start_offset": segments[0]["base_offset"],
                              "high_watermark": segments[-1]["last_offset"] + 1, "segments": segments}
    partitions["orders-0"]["log_start_offset"] = 7
    orders1 = partitions["orders-1"]
    orders1["high_watermark"] -= 3
    last = orders1["segments"][-1]
    with open(snap / "orders-1" / last["file"], "ab") as f:  # the live segment grew afterwards
        f.write(bytes(encode_batch(last["last_offset"] + 1, [(b"user-1", b"after the snapshot", T0 + 10**7, [])])))

    def topic(name, n, internal, policy):
        return {"name": name, "topic_id": f"id-{name}", "internal": internal, "cleanup_policy": policy,
                "configs": {"cleanup.policy": policy},
                "partitions": [partitions[f"{name}-{p}"] for p in range(n)]}

    manifest = {"format_version": 1, "snapshot_id": "test-snapshot", "created_at": "2026-11-23T09:15:00.123Z",
                "created_ms": 1795000000000,
                "topics": [topic("orders", 2, False, "compact"), topic("events", 1, False, "delete"),
                           topic("__metadata", 1, True, "compact")]}
    (snap / "manifest.json").write_text(json.dumps(manifest, indent=1))

    def rows_of(name):
        out = []
        for t in manifest["topics"]:
            if t["name"] != name:
                continue
            for p in t["partitions"]:
                for seg in p["segments"]:
                    out += [r for r in _segment_rows(name, p["partition"], snap / p["dir"] / seg["file"], seg["size_bytes"])
                            if p["log_start_offset"] <= r.offset < p["high_watermark"]]
        return out

    return Snapshot(snap, rows_of("events") + rows_of("orders"), rows_of("__metadata"), manifest)


@pytest.fixture(scope="session")
def snapshot(tmp_path_factory) -> Snapshot:
    return build_snapshot(tmp_path_factory.mktemp("snapshot"))


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession per pytest process, set up as analytics/session.py sets up its own
    (docs/ANALYTICS.md, "The local session", says why each setting)."""
    pytest.importorskip("pyspark")
    if not Path(JAVA_HOME, "bin", "java").exists():
        pytest.skip(f"Java 17 not found at {JAVA_HOME}")
    from pyspark.sql import SparkSession

    import analytics

    saved = dict(os.environ)
    os.environ.update({
        "JAVA_HOME": JAVA_HOME,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_HOSTNAME": "localhost",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "TZ": "UTC",
        # workers import analytics/ and engine/ even when pytest runs from another directory
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [saved.get("PYTHONPATH")])]),
        # the Python workers the JVM starts inherit these: credentials for the loopback S3 server
        # of test_upload.py (its endpoint travels in the URI), never a developer's own
        **S3_TEST_ENV,
    })
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        os.environ.pop(name, None)
    time.tzset()
    log4j = Path(__file__).with_name("log4j2.properties")
    java_options = f"-Duser.timezone=UTC -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile=file:{log4j}"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("eventlog-analytics-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "1g")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", java_options)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    analytics.register(session)
    try:
        yield session
    finally:
        session.stop()
        os.environ.clear()
        os.environ.update(saved)
        time.tzset()
