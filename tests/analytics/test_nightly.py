"""The nightly job end to end: records produced over HTTP, a snapshot taken by the server, the
job's Parquet output equal to a model (read back with pyarrow, not Spark)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.snapshots import default_root

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
    return default_root(data_dir) / snap["path"], acked


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
    table = pq.read_table(out / "tables" / "accounts")
    # the key as bytes (Kafka's) and as text after it; times are UTC instants, not zone-less
    names = table.schema.names
    assert names[names.index("key") + 1] == "key_string"
    assert table.schema.field("key").type == pa.binary()
    assert table.schema.field("key_string").type == pa.string()
    assert table.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    rows = table.to_pylist()
    assert all(r["key_string"] == r["key"].decode() for r in rows)
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
    assert steps == ["segment cache", "table view of accounts", "daily counts and bytes"]
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


# -- incremental runs ---------------------------------------------------------------------------


def _table(out: Path, topic: str) -> dict[tuple[int, str], tuple[int, str]]:
    rows = pq.read_table(out / "tables" / topic).to_pylist()
    assert all(r["key_string"] == r["key"].decode() for r in rows), "key_string kept on upserts"
    table = {(r["partition"], r["key"].decode()): (r["offset"], r["value"].decode()) for r in rows}
    assert len(table) == len(rows), "one row per (partition, key)"
    return table


def _daily(out: Path) -> dict[tuple[str, str], dict]:
    return {(r["topic"], r["date"].isoformat()): r for r in pq.read_table(out / "daily").to_pylist()}


def test_incremental_runs_read_only_what_is_new_and_converge(spark, tmp_path: Path) -> None:
    """Four snapshots of a live server, one nightly run after each: the first reads everything,
    one after no new data reads nothing, one after updates, tombstones, compaction and retention
    reads only the new offsets. Each time the table view and the daily counts equal the model,
    and equal a full rebuild's; no record is counted twice."""
    from analytics.nightly import run_nightly
    from tests.conftest import ServerProcess

    server = ServerProcess(tmp_path / "data", env={"EVENTLOG_CLEANER_ENABLED": "false"}).start()
    out, acked = tmp_path / "out", []
    try:
        c = server.client()
        c.post("/v1/topics", json={"name": "accounts", "partitions": 2, "configs": {"cleanup.policy": "compact", "segment.bytes": 1024}})
        c.post("/v1/topics", json={"name": "clicks", "configs": {"segment.bytes": 1024}})

        def produce(topic: str, day: int, records: list[dict]) -> None:
            for i, r in enumerate(records):
                r["timestamp"] = T0 + day * DAY + i
            answer = c.post(f"/v1/topics/{topic}/records", json={"records": records})
            assert answer.status_code == 200, answer.text
            acked.extend({**r, "topic": topic, **o} for r, o in zip(records, answer.json()["offsets"]))

        def nightly(**kwargs):
            snap = c.post("/v1/snapshots").json()
            steps: list[str] = []
            return run_nightly(spark, default_root(server.data_dir) / snap["path"], out, step=steps.append, **kwargs), steps

        def model() -> dict[tuple[int, str], tuple[int, str]]:
            table: dict[tuple[int, str], tuple[int, str]] = {}
            for r in sorted((r for r in acked if r["topic"] == "accounts"), key=lambda r: r["offset"]):
                if r["value"] is None:
                    table.pop((r["partition"], r["key"]), None)
                else:
                    table[(r["partition"], r["key"])] = (r["offset"], r["value"])
            return table

        produce("accounts", 0, [{"key": f"acct-{i % 12}", "value": f"day0 {i}"} for i in range(60)])
        produce("clicks", 0, [{"value": "c" * 20} for _ in range(30)])
        first, steps = nightly()
        assert (first.run, first.incremental) == (1, False)
        assert steps == ["segment cache", "table view of accounts", "daily counts and bytes"]
        assert _table(out, "accounts") == model()
        daily = _daily(out)
        assert (daily[("accounts", "2026-01-01")]["records"], daily[("accounts", "2026-01-01")]["produced"]) == (60, 60)
        assert not daily[("accounts", "2026-01-01")]["compacted"]

        # nothing new: nothing read, nothing rewritten
        table_files = sorted(p.name for p in (out / "tables" / "accounts").iterdir())
        idle, steps = nightly()
        assert (idle.run, idle.incremental, steps) == (2, True, [])
        assert [t.offsets_read for t in idle.topics] == [0, 0]
        assert sorted(p.name for p in (out / "tables" / "accounts").iterdir()) == table_files
        assert _daily(out) == daily

        # day 1: updates and tombstones; then compaction removes day-0 records (already counted)
        # and retention takes clicks the nightly job never saw
        produce("accounts", 1, [{"key": f"acct-{i % 15}", "value": None if i % 7 == 3 else f"day1 {i}"} for i in range(45)])
        assert c.post("/v1/admin/compaction/run", json={"topic": "accounts"}).json()["records_removed"] > 0
        produce("clicks", 1, [{"value": "d" * 20} for _ in range(40)])
        cut = acked[-10]["offset"]  # the first 30 of day 1's clicks are deleted unseen
        assert c.post("/v1/topics/clicks/partitions/0/delete-records", json={"before_offset": cut}).status_code == 200
        c.post("/v1/admin/retention/run", json={"topic": "clicks"})
        third, steps = nightly()
        assert (third.run, third.incremental) == (3, True)
        assert steps == ["segment cache", "table view of accounts", "daily counts and bytes"]
        # the segment cache holds exactly the segments of this snapshot, each once
        from analytics import cache

        names, _ = cache.plan(third.snapshot_path, out / "segments", {"topics": "accounts,clicks"})
        assert sorted(str(f) for f in (out / "segments").rglob("*.parquet")) == sorted(s.file for s in names)
        by_topic = {t.topic: t for t in third.topics}
        assert by_topic["accounts"].offsets_read == 45 and not by_topic["accounts"].rebuilt
        assert (by_topic["clicks"].offsets_read, by_topic["clicks"].offsets_lost) == (10, 30)
        assert _table(out, "accounts") == model() and third.topics[0].table_rows == len(model())
        daily = _daily(out)
        assert (daily[("accounts", "2026-01-01")]["records"], daily[("accounts", "2026-01-01")]["produced"]) == (60, 60)
        assert (daily[("accounts", "2026-01-02")]["records"], daily[("accounts", "2026-01-02")]["produced"]) == (45, 45)
        assert (daily[("clicks", "2026-01-02")]["records"], daily[("clicks", "2026-01-02")]["produced"]) == (10, 10)
        assert daily[("clicks", "2026-01-01")]["records"] == 30
        summary = json.loads((out / "_SUMMARY.json").read_text())
        assert summary["run"] == 3 and summary["topics"][1]["offsets_lost"] == 30
        state = json.loads((out / "_STATE.json").read_text())
        assert state["topics"]["accounts"]["partitions"] == {
            str(p["partition"]): p["high_watermark"] for p in c.get("/v1/topics/accounts").json()["partitions"]}

        # a full rebuild from the compacted snapshot: the same table; its daily counts are of
        # what compaction left, and say so
        rebuilt_out = tmp_path / "rebuilt"
        snap = c.post("/v1/snapshots").json()
        snap_dir = default_root(server.data_dir) / snap["path"]
        full = run_nightly(spark, snap_dir, rebuilt_out, full=True)
        assert _table(rebuilt_out, "accounts") == model() and full.topics[0].rebuilt
        fresh = _daily(rebuilt_out)
        offsets = sum(p["high_watermark"] - p["log_start_offset"] for p in c.get("/v1/topics/accounts").json()["partitions"])
        assert sum(r["produced"] for (t, _), r in fresh.items() if t == "accounts") == offsets == 105
        assert any(r["compacted"] for (t, _), r in fresh.items() if t == "accounts")
        assert all(r["records"] <= r["produced"] for r in fresh.values())
        c.close()
    finally:
        server.stop()
    # other engines read the output as plain Parquet
    import pandas as pd

    frame = pd.read_parquet(out / "daily")
    assert set(frame.columns) == {"topic", "date", "records", "bytes", "produced", "compacted"}


def test_an_interrupted_commit_is_finished_or_undone(tmp_path: Path) -> None:
    """Pure Python: a run that died after staging its state finishes its moves at the next
    start; one that died before leaves .next outputs that are removed; the old outputs stay."""
    from analytics.nightly import load_state

    out = tmp_path / "out"
    (out / "tables" / "a").mkdir(parents=True)
    (out / "tables" / "a" / "old.parquet").write_text("old")
    (out / "tables" / "a.next").mkdir()
    (out / "tables" / "a.next" / "new.parquet").write_text("new")
    (out / "daily.next").mkdir()
    (out / "_SUMMARY.json.next").write_text("{}")
    (out / "_STATE.json.next").write_text('{"format_version": 1, "runs": 4, "topics": {}, "moves": ["tables/a", "daily", "_SUMMARY.json"]}')
    assert load_state(out)["runs"] == 4
    assert [p.name for p in (out / "tables" / "a").iterdir()] == ["new.parquet"]
    assert (out / "daily").is_dir() and (out / "_SUMMARY.json").read_text() == "{}"
    assert sorted(p.name for p in out.rglob("*") if p.name.endswith((".next", ".old"))) == []

    (out / "tables" / "a.next").mkdir()
    (out / "tables" / "a.next" / "newer.parquet").write_text("newer")
    (out / "_STATE.json.next").write_text('{"format_version": 1, "runs": 5, "topi')  # torn
    assert load_state(out)["runs"] == 4
    assert [p.name for p in (out / "tables" / "a").iterdir()] == ["new.parquet"]
    assert not (out / "tables" / "a.next").exists() and not (out / "_STATE.json.next").exists()


def test_typed_tables_from_a_value_schema(spark, tmp_path: Path) -> None:
    """A topic's value schema makes its table typed; a value that does not fit stays (null,
    with its bytes in _corrupt_record) instead of deleting its key; updates and tombstones
    upsert typed rows; a changed schema rebuilds the table."""
    from analytics.nightly import run_nightly
    from tests.conftest import ServerProcess

    schema = tmp_path / "orders.schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["status"], "properties": {
        "status": {"type": "string"}, "total": {"type": "number"}}}))
    server = ServerProcess(tmp_path / "data", env={"EVENTLOG_CLEANER_ENABLED": "false"}).start()
    out = tmp_path / "out"
    try:
        with server.client() as c:
            c.post("/v1/topics", json={"name": "orders", "configs": {"cleanup.policy": "compact"}})

            def produce(records: list[tuple[str, str | None]]) -> str:
                answer = c.post("/v1/topics/orders/records", json={"records": [{"key": k, "value": v} for k, v in records]})
                assert answer.status_code == 200, answer.text
                return str(default_root(server.data_dir) / c.post("/v1/snapshots").json()["path"])

            snap = produce([("o-1", '{"status": "new", "total": 12.5}'), ("o-2", '{"status": "new"}'), ("o-3", "not json")])
            first = run_nightly(spark, snap, out, schemas={"orders": str(schema)})
            rows = {r["key"].decode(): r for r in pq.read_table(out / "tables" / "orders").to_pylist()}
            assert rows["o-1"]["value"] == {"status": "new", "total": 12.5}
            assert rows["o-2"]["value"] == {"status": "new", "total": None}
            assert rows["o-3"]["value"] is None and rows["o-3"]["_corrupt_record"] == b"not json"
            assert first.topics[0].table_rows == 3

            snap = produce([("o-1", '{"status": "paid", "total": 12.5}'), ("o-2", None), ("o-3", '{"status": "fixed"}')])
            run_nightly(spark, snap, out, schemas={"orders": str(schema)})
            rows = {r["key"].decode(): r for r in pq.read_table(out / "tables" / "orders").to_pylist()}
            assert {k: r["value"] for k, r in rows.items()} == {
                "o-1": {"status": "paid", "total": 12.5}, "o-3": {"status": "fixed", "total": None}}
            # a new schema (DDL this time): the table is rebuilt from the whole topic
            again = run_nightly(spark, snap, out, schemas={"orders": "status STRING, total DOUBLE, note STRING"})
            assert again.topics[0].rebuilt and again.topics[0].offsets_read == 0
            rows = {r["key"].decode(): r for r in pq.read_table(out / "tables" / "orders").to_pylist()}
            assert rows["o-1"]["value"] == {"status": "paid", "total": 12.5, "note": None}
    finally:
        server.stop()


def test_key_string_is_the_key_as_text_where_it_is_utf8(spark) -> None:
    """Kafka keys are bytes: `key` keeps them; `key_string` is their text where they are valid
    UTF-8, null where not (or where there is no key); the other columns stay, in their order."""
    from analytics.nightly import with_key_string

    keys = [b"user-1", "caf\u00e9 \u2615".encode(), b"\xff\xfe\x00", b"\xc3", None, b""]
    rows = [(i, k, b"v") for i, k in enumerate(keys)]
    df = spark.createDataFrame(rows, "offset LONG, key BINARY, value BINARY")
    out = with_key_string(df)
    assert out.columns == ["offset", "key", "key_string", "value"]
    rows = sorted(out.collect(), key=lambda r: r["offset"])
    assert [bytes(r["key"]) if r["key"] is not None else None for r in rows] == keys
    assert [r["key_string"] for r in rows] == ["user-1", "caf\u00e9 \u2615", None, None, None, ""]


def test_nightly_cli_refuses_bad_schemas_before_spark(produced, tmp_path: Path) -> None:
    from tests.conftest import run_eventlog

    snapshot, _ = produced
    bad = run_eventlog("nightly", "--snapshot", str(snapshot), "--out", str(tmp_path / "o"), "--schema", "accounts")
    assert bad.returncode == 2 and "TOPIC=SCHEMA" in bad.stderr
    unknown = run_eventlog("nightly", "--snapshot", str(snapshot), "--out", str(tmp_path / "o"), "--schema", "nope=a INT")
    assert unknown.returncode == 2 and "does not read: nope" in unknown.stderr
    broken = run_eventlog("nightly", "--snapshot", str(snapshot), "--out", str(tmp_path / "o"), "--schema", "accounts=a NOTATYPE")
    assert broken.returncode == 2
