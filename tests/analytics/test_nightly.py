"""The nightly job end to end: records produced over HTTP, a snapshot taken by the server, the
job's Parquet output equal to a model (read back with pyarrow, not Spark)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

DAY = 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def produced(tmp_path_factory):
    """A server's snapshot of a compacted topic (2 partitions, tombstones, headers, three days)
    and a delete-policy topic; the records acknowledged, as the model."""
    from tests.conftest import ServerProcess

    data_dir = tmp_path_factory.mktemp("nightly") / "data"
    server = ServerProcess(data_dir, env={"EVENTLOG_CLEANER_ENABLED": "false"}).start()
    acked: list[dict] = []
    try:
        with server.client() as c:
            c.post("/v1/topics", json={"name": "accounts", "partitions": 2, "configs": {"cleanup.policy": "compact", "segment.bytes": 2048}})
            c.post("/v1/topics", json={"name": "clicks"})
            i = 0
            for day in range(3):
                records = []
                for j in range(40):
                    key = f"user-{(i * 7) % 23}"
                    value = None if i % 11 == 5 else f"balance {i}"
                    headers = [{"key": "source", "value": "web" if j % 2 else None}] if j % 3 == 0 else []
                    records.append({"key": key, "value": value, "timestamp": T0 + day * DAY + j * 1000, "headers": headers})
                    i += 1
                response = c.post("/v1/topics/accounts/records", json={"records": records})
                assert response.status_code == 200, response.text
                for rec, off in zip(records, response.json()["offsets"]):
                    acked.append({**rec, "topic": "accounts", "partition": off["partition"], "offset": off["offset"]})
                clicks = [{"value": "x" * (10 + day), "timestamp": T0 + day * DAY + 5} for _ in range(5 + day)]
                response = c.post("/v1/topics/clicks/records", json={"records": clicks})
                for rec, off in zip(clicks, response.json()["offsets"]):
                    acked.append({**rec, "key": None, "headers": [], "topic": "clicks", "partition": off["partition"], "offset": off["offset"]})
            # compaction before the snapshot: the job must see the same table either way
            assert c.post("/v1/admin/compaction/run", json={"topic": "accounts"}).status_code == 200
            snap = c.post("/v1/snapshots").json()
    finally:
        server.stop()
    return data_dir / snap["path"], acked


def model_tables(acked: list[dict]) -> dict[tuple[int, str], dict]:
    table: dict[tuple[int, str], dict] = {}
    for r in sorted((r for r in acked if r["topic"] == "accounts"), key=lambda r: (r["partition"], r["offset"])):
        k = (r["partition"], r["key"])
        if r["value"] is None:
            table.pop(k, None)
        else:
            table[k] = r
    return table


def model_daily(acked: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in acked:
        date = dt.datetime.fromtimestamp(r["timestamp"] / 1000, dt.UTC).date().isoformat()
        size = len((r["key"] or "").encode()) + len((r["value"] or "").encode())
        size += sum(len(h["key"].encode()) + len((h["value"] or "").encode()) for h in r["headers"])
        out[(r["topic"], date)][0] += 1
        out[(r["topic"], date)][1] += size
    return {k: tuple(v) for k, v in out.items()}


def check_output(out: Path, acked: list[dict]) -> None:
    rows = pq.read_table(out / "tables" / "accounts").to_pylist()
    got = {(r["partition"], r["key"].decode()): r for r in rows}
    expected = model_tables(acked)
    assert set(got) == set(expected)
    for k, r in got.items():
        e = expected[k]
        assert r["offset"] == e["offset"] and r["value"].decode() == e["value"]
        assert r["timestamp"].timestamp() * 1000 == e["timestamp"]
        assert [(h["key"], None if h["value"] is None else h["value"].decode()) for h in r["headers"]] == [
            (h["key"], h["value"]) for h in e["headers"]
        ]
    daily = {(r["topic"], r["date"].isoformat()): (r["records"], r["bytes"]) for r in pq.read_table(out / "daily").to_pylist()}
    # compaction before the snapshot removed superseded records: daily counts are of what the
    # snapshot holds, so compare against the records that survived it
    assert {k for k in daily} <= set(model_daily(acked))
    assert daily[("clicks", "2026-01-01")] == model_daily(acked)[("clicks", "2026-01-01")]
    assert daily[("clicks", "2026-01-03")] == (7, 7 * 12)
    summary = json.loads((out / "_SUMMARY.json").read_text())
    assert [t["topic"] for t in summary["topics"]] == ["accounts", "clicks"]
    assert summary["topics"][0]["table_rows"] == len(expected)


def test_nightly_job_output_equals_the_model(spark, produced, tmp_path: Path) -> None:
    from analytics.nightly import run_nightly

    snapshot, acked = produced
    steps: list[str] = []
    result = run_nightly(spark, snapshot.parent, tmp_path / "out", step=steps.append)  # the newest snapshot
    assert result.snapshot_path == str(snapshot)
    assert steps == ["table view of accounts", "daily counts and bytes"]
    check_output(tmp_path / "out", acked)
    # the daily counts of what the snapshot holds, read with the data source itself
    held = spark.read.format("eventlog").load(str(snapshot)).groupBy("topic").count().collect()
    counts = {r["topic"]: r["count"] for r in held}
    assert counts["clicks"] == 5 + 6 + 7
    daily = pq.read_table(tmp_path / "out" / "daily").to_pylist()
    assert sum(r["records"] for r in daily if r["topic"] == "accounts") == counts["accounts"]


def test_nightly_cli(produced, tmp_path: Path) -> None:
    snapshot, acked = produced
    eventlog = Path(sys.executable).with_name("eventlog")
    done = subprocess.run(
        [str(eventlog), "nightly", "--snapshot", str(snapshot), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "nightly: snapshot" in done.stdout and "table view of accounts" in done.stderr
    check_output(tmp_path / "out", acked)
    missing = subprocess.run(
        [str(eventlog), "nightly", "--snapshot", str(tmp_path), "--out", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert missing.returncode == 2 and "neither a snapshot" in missing.stderr
