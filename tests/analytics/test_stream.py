"""The eventlog streaming source: offset planning in plain Python, reading snapshots and a live
data dir without Spark, then micro-batches through a real local SparkSession.

Data comes from the service itself (app_factory: the app `eventlog serve` runs, in this process),
produced over its HTTP API; snapshots are its own. Spark queries are few (each costs seconds):
one over successive snapshots, one for retention loss, one over a live data dir.
"""

from __future__ import annotations

import json
import pickle
import random
import struct
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from analytics import stream, stream_sources
from analytics.decoder import ARROW_SCHEMA, SnapshotCorruptError
from analytics.stream import (
    DataLossError,
    EventlogStreamReader,
    LiveSlice,
    PartitionRange,
    SnapshotSlice,
    from_json,
    initial_offsets,
    next_end,
    plan_ranges,
    rate_limit,
    to_json,
)

from ..conftest import wait_until

A, B, C = ("t", 0), ("t", 1), ("u", 0)


# ---------------------------------------------------------------------------------------------
# offset planning (pure)


def test_offsets_print_the_same_whatever_the_order() -> None:
    offsets = {("b", 10): 5, ("a", 2): 1, ("b", 9): 0}
    assert json.dumps(to_json(offsets)) == json.dumps(to_json(dict(reversed(offsets.items()))))
    assert to_json(offsets) == {"a": {"2": 1}, "b": {"9": 0, "10": 5}}
    assert from_json(json.loads(json.dumps(to_json(offsets)))) == offsets


def test_rate_limit_shares_a_backlog_exactly() -> None:
    begins = {A: 0, B: 100, C: 7}
    ends = {A: 1000, B: 1100, C: 8}
    limited = rate_limit(begins, ends, 10)
    assert sum(limited[tp] - begins[tp] for tp in ends) == 10
    assert limited[C] == 8  # the small backlog is not starved
    assert limited == {A: 5, B: 104, C: 8}
    assert rate_limit(begins, ends, None) == ends
    assert rate_limit(begins, ends, 2001) == ends  # the whole backlog fits
    assert rate_limit(begins, ends, 2) == {A: 1, B: 101, C: 7}  # below the partition count: largest first


def test_rate_limit_oracle() -> None:
    rng = random.Random(16)
    for _ in range(500):
        tps = [("t", p) for p in range(rng.randint(1, 6))]
        begins = {tp: rng.randint(0, 50) for tp in tps}
        ends = {tp: begins[tp] + rng.choice([0, 0, 1, 2, rng.randint(0, 500)]) for tp in tps}
        cap = rng.randint(1, 400)
        limited = rate_limit(begins, ends, cap)
        total = sum(ends[tp] - begins[tp] for tp in tps)
        taken = {tp: limited[tp] - begins[tp] for tp in tps}
        assert all(0 <= taken[tp] <= ends[tp] - begins[tp] for tp in tps)
        assert sum(taken.values()) == min(cap, total)
        backlog = [tp for tp in tps if ends[tp] > begins[tp]]
        if cap >= len(backlog):
            assert all(taken[tp] >= 1 for tp in backlog)
        for x in backlog:  # roughly in proportion: a larger backlog never gets fewer
            for y in backlog:
                if ends[x] - begins[x] > ends[y] - begins[y]:
                    assert taken[x] >= taken[y]


def test_next_end_from_each_partitions_begin() -> None:
    view = {A: PartitionRange(10, 50), B: PartitionRange(0, 5), C: PartitionRange(3, 9)}
    # A: start below the log start (retention) begins at the log start; C is new: from its log
    # start; a partition of the start that the view lacks is left out
    start = {A: 2, B: 5, ("gone", 0): 4}
    assert next_end(start, view, None) == {A: 50, B: 5, C: 9}
    assert next_end(start, view, 10) == {A: 10 + 8, B: 5, C: 3 + 2}  # shared from the begins
    # offsets went back (a topic created again): read again from the log start
    assert next_end({A: 70}, {A: PartitionRange(0, 20)}, 5) == {A: 5}
    # Trigger.AvailableNow: never past the target; partitions it lacks wait
    assert next_end({A: 10, B: 5}, view, None, target={A: 30, B: 5}) == {A: 30, B: 5}
    assert next_end({A: 40}, {A: PartitionRange(45, 60)}, None, target={A: 42}) == {A: 45}
    # nothing listed (no snapshot yet, say): nothing changes
    assert next_end(start, {}, 10) == start


def test_plan_ranges_reports_what_kafka_reports() -> None:
    view = {A: PartitionRange(0, 50), B: PartitionRange(3, 9)}
    messages: list[str] = []
    ranges = plan_ranges({A: 10, ("gone", 0): 4}, {A: 20, B: 9}, view, messages.append)
    assert ranges == [(A, 10, 20), (B, 3, 9)]
    assert messages == ["gone-0 are gone. Some data may have been missed",
                        "Added partition t-1 starts from 3 instead of 0. Some data may have been missed"]
    messages.clear()
    assert plan_ranges({A: 70}, {A: 20}, view, messages.append) == [(A, 0, 20)]
    assert messages == ["Partition t-0's offset was changed from 70 to 20, some data may have been missed"]
    # a query that started before any data existed reports no added partition
    messages.clear()
    assert plan_ranges({}, {B: 9}, view, messages.append) == [(B, 3, 9)]
    assert messages == []
    with pytest.raises(DataLossError, match='"failOnDataLoss" to "false"'):
        plan_ranges({("gone", 0): 1}, {}, view, stream._reporter(True))


def test_initial_offsets() -> None:
    view = {A: PartitionRange(10, 50), B: PartitionRange(0, 5)}
    assert initial_offsets(view, None) == {A: 10, B: 0}
    assert initial_offsets(view, "latest") == {A: 50, B: 5}
    assert initial_offsets(view, "30") == {A: 30, B: 5}  # clamped to the log
    assert initial_offsets(view, '{"t": {"0": -1, "1": 2}}') == {A: 50, B: 2}
    assert initial_offsets(view, '{"t": {"0": 3}}') == {A: 10, B: 0}  # below the log start
    with pytest.raises(ValueError, match="t-7"):
        initial_offsets(view, '{"t": {"7": 3}}')
    for bad in ("soon", '{"t": {"0": 1.5}}', '{"t": 3}', "[1]"):
        with pytest.raises(ValueError, match="startingOffsets"):
            initial_offsets(view, bad)
    with pytest.raises(ValueError, match="not an offset"):
        initial_offsets(view, "-3")


def test_options_are_checked_when_the_stream_is_made(tmp_path: Path) -> None:
    for options, error in [
        ({"endingOffsets": "latest"}, "batch reads only"),
        ({"compacted": "true"}, "batch reads only"),
        ({"maxOffsetsPerTrigger": "0"}, "positive"),
        ({"failOnDataLoss": "maybe"}, "true or false"),
        ({"liveEnd": "soon"}, "liveEnd"),
        ({"mode": "kafka"}, "mode"),
    ]:
        with pytest.raises(ValueError, match=error):
            EventlogStreamReader({"path": str(tmp_path), **options})
    reader = EventlogStreamReader({"path": str(tmp_path), "maxRecordsPerTrigger": "7", "compacted": "false"})
    assert reader.getDefaultReadLimit() == ReadMaxRows(7)
    assert reader.mode == "snapshots"
    assert reader.initialOffset() == {}  # no snapshot yet
    assert reader.latestOffset({}, ReadAllAvailable()) == {}


# ---------------------------------------------------------------------------------------------
# the service's data, read without Spark


def produce(client, topic: str, n: int, tag: str, partition: int | None = None, per: int = 10) -> list[tuple]:
    """Produce n records, `per` a request (one batch each); (topic, partition, offset, key,
    value) of each."""
    if n > per:
        return [r for i in range(0, n, per) for r in produce(client, topic, min(per, n - i), f"{tag}{i}", partition, per)]
    records = [{"key": f"k{i % 7}", "value": f"{tag}-{i}"} for i in range(n)]
    url = f"/v1/topics/{topic}/records" if partition is None else f"/v1/topics/{topic}/partitions/{partition}/records"
    response = client.post(url, json={"records": records})
    assert response.status_code == 200, response.text
    body = response.json()
    if partition is None:
        placed = [(o["partition"], o["offset"]) for o in body["offsets"]]
    else:
        placed = [(partition, body["base_offset"] + i) for i in range(n)]
    return [(topic, p, o, r["key"].encode(), r["value"].encode()) for (p, o), r in zip(placed, records)]


def snapshot(client) -> str:
    response = client.post("/v1/snapshots", json={})
    assert response.status_code == 201 or response.status_code == 200, response.text
    return response.json()["id"]


def read_all(reader: EventlogStreamReader, limit=None, start: dict | None = None) -> tuple[list[tuple], list[dict]]:
    """Micro-batches as Spark runs them, without Spark: (rows, the offsets after each batch)."""
    start = reader.initialOffset() if start is None else start
    rows, ends = [], []
    while True:
        end = reader.latestOffset(start, ReadMaxRows(limit) if limit else ReadAllAvailable())
        if end == start:
            return rows, ends
        worker = pickle.loads(pickle.dumps(reader))
        for part in reader.partitions(start, end):
            for batch in worker.read(pickle.loads(pickle.dumps(part))):
                assert batch.schema.equals(ARROW_SCHEMA)
                d = batch.to_pydict()
                rows += list(zip(d["topic"], d["partition"], d["offset"], d["key"], d["value"]))
        ends.append(end)
        start = end


def by_offset(rows) -> list[tuple]:
    return sorted(rows, key=lambda r: (r[0], r[1], r[2]))


@pytest.fixture
def server(app_factory):
    s = app_factory().start()
    client = s.client()
    response = client.post("/v1/topics", json={"name": "orders", "partitions": 2, "configs": {"segment.bytes": 1500}})
    assert response.status_code == 201, response.text
    yield s, client
    if s.running:
        s.stop()


def test_snapshots_each_offset_from_the_newest_snapshot_holding_it(server) -> None:
    s, client = server
    root = s.data_dir / "snapshots"
    first = produce(client, "orders", 40, "a", partition=0) + produce(client, "orders", 20, "a", partition=1)
    old = snapshot(client)
    second = produce(client, "orders", 40, "b", partition=0) + produce(client, "orders", 20, "b", partition=1)
    response = client.post("/v1/topics/orders/partitions/0/delete-records", json={"before_offset": 40})
    assert response.status_code == 200, response.text
    snapshot(client)
    expected = by_offset(r for r in first + second if not (r[1] == 0 and r[2] < 40))

    reader = EventlogStreamReader({"path": str(root), "maxOffsetsPerTrigger": "25"})
    assert reader.initialOffset() == {"orders": {"0": 40, "1": 0}}
    rows, ends = read_all(reader, 25)
    assert by_offset(rows) == expected and len(rows) == len(set(rows))
    assert len(ends) == -(-len(expected) // 25)
    # from offset 0, partition 0's first 40 offsets come from the older snapshot
    rows, _ = read_all(reader, None, start={"orders": {"0": 0, "1": 0}})
    assert by_offset(rows) == by_offset(first + second)
    # once that snapshot is gone they are lost: an error, or skipped with failOnDataLoss=false
    assert client.delete(f"/v1/snapshots/{old}").status_code == 204
    with pytest.raises(DataLossError, match="offsets 0 to 39 of orders-0 are in no snapshot"):
        read_all(reader, None, start={"orders": {"0": 0, "1": 0}})
    lenient = EventlogStreamReader({"path": str(root), "failOnDataLoss": "false"})
    rows, _ = read_all(lenient, None, start={"orders": {"0": 0, "1": 0}})
    assert by_offset(rows) == expected


def test_a_partition_left_out_of_the_newest_snapshot_is_not_gone(server) -> None:
    s, client = server
    rows = produce(client, "orders", 20, "a", partition=0) + produce(client, "orders", 20, "a", partition=1)
    snapshot(client)
    rows += produce(client, "orders", 10, "b", partition=0)
    newest = s.data_dir / "snapshots" / snapshot(client) / "manifest.json"
    manifest = json.loads(newest.read_text())  # as if orders-1 had been offline
    manifest["topics"][0]["partitions"] = [p for p in manifest["topics"][0]["partitions"] if p["partition"] == 0]
    newest.write_text(json.dumps(manifest))
    got, ends = read_all(EventlogStreamReader({"path": str(s.data_dir / "snapshots")}))
    assert by_offset(got) == by_offset(rows)
    assert ends[-1] == {"orders": {"0": 30, "1": 20}}


def test_a_snapshot_deleted_after_planning(server) -> None:
    s, client = server
    rows = produce(client, "orders", 30, "a")
    snapshot_id = snapshot(client)
    reader = EventlogStreamReader({"path": str(s.data_dir / "snapshots")})
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    assert parts and all(isinstance(p, SnapshotSlice) for p in parts)
    assert client.delete(f"/v1/snapshots/{snapshot_id}").status_code == 204
    with pytest.raises(DataLossError, match="its snapshot was deleted"):
        list(reader.read(parts[0]))
    lenient = EventlogStreamReader({"path": str(s.data_dir / "snapshots"), "failOnDataLoss": "false"})
    assert [b for p in parts for b in lenient.read(p)] == []
    assert rows  # produced, then lost with the snapshot


def test_live_checkpoint_mode_reads_what_the_server_checkpointed(server) -> None:
    s, client = server
    rows = produce(client, "orders", 80, "a")
    s.stop()  # a clean shutdown writes the recovery-point checkpoint
    reader = EventlogStreamReader({"path": str(s.data_dir), "maxOffsetsPerTrigger": "30"})
    assert reader.mode == "live"
    got, _ = read_all(reader, 30)
    assert by_offset(got) == by_offset(rows)
    # a checkpoint lower than the log end: nothing past it is read
    checkpoint = s.data_dir / stream_sources.RECOVERY_POINT
    entries = stream_sources._read_checkpoint(str(checkpoint))
    entries[("orders", 0)] = 5
    lines = ["0", str(len(entries))] + [f"{t} {p} {o}" for (t, p), o in sorted(entries.items())]
    checkpoint.write_text("\n".join(lines) + "\n")
    got, _ = read_all(EventlogStreamReader({"path": str(s.data_dir)}))
    assert by_offset(got) == by_offset(r for r in rows if r[1] == 1 or r[2] < 5)


def _last_segment(directory: Path) -> Path:
    return max(directory.glob("*.log"))


def test_live_log_end_stops_at_a_torn_or_corrupt_tail(server) -> None:
    s, client = server
    rows = produce(client, "orders", 50, "a", partition=0)
    s.stop()
    reader = EventlogStreamReader({"path": str(s.data_dir), "liveEnd": "logEnd", "topics": "orders"})
    assert reader.latestOffset({}, ReadAllAvailable()) == {"orders": {"0": 50, "1": 0}}
    active = _last_segment(s.data_dir / "orders-0")
    data = active.read_bytes()
    at = {"orders": {"0": 50, "1": 0}}
    with open(active, "ab") as f:  # a write in flight: a batch's first 40 bytes
        f.write(data[:40])
    assert reader.latestOffset(at, ReadAllAvailable()) == at
    # an undone commit: the file shrinks below where the last walk stopped
    position = _last_batch_position(data)
    last_base, = struct.unpack_from(">q", data, position)
    active.write_bytes(data[:position])
    assert reader.latestOffset(at, ReadAllAvailable())["orders"]["0"] == last_base
    # the last batch back, with a bad CRC: a new walk stops before it
    active.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    fresh = EventlogStreamReader({"path": str(s.data_dir), "liveEnd": "logEnd", "topics": "orders"})
    assert fresh.latestOffset({"orders": {"0": 0, "1": 0}}, ReadAllAvailable())["orders"]["0"] == last_base
    got, _ = read_all(EventlogStreamReader({"path": str(s.data_dir), "liveEnd": "logEnd"}))
    assert by_offset(got) == [r for r in rows if r[2] < last_base]


def _last_batch_position(data: bytes) -> int:
    position = last = 0
    while position < len(data):
        last = position
        position += struct.unpack_from(">i", data, position + 8)[0] + 12
    return last


def test_live_segments_removed_between_planning_and_reading(server) -> None:
    s, client = server
    rows = produce(client, "orders", 200, "a", partition=0)
    s.stop()
    directory = s.data_dir / "orders-0"
    reader = EventlogStreamReader({"path": str(s.data_dir), "topics": "orders"})
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = [p for p in reader.partitions(start, end) if isinstance(p, LiveSlice)]
    assert len(parts) >= 3  # one per segment
    first = min(directory.glob("*.log"))
    # retention renames before it removes: a .deleted segment is still read
    for suffix in (".log", ".index", ".timeindex"):
        source = first.with_suffix(suffix)
        source.rename(source.with_name(source.name + ".deleted"))
    assert by_offset(_read_parts(reader, parts)) == by_offset(rows)
    # removed: the records are lost, an error naming them or skipped
    Path(str(first) + ".deleted").unlink()
    lost = int(first.stem), int(min(directory.glob("*.log")).stem)
    with pytest.raises(DataLossError, match=f"offsets {lost[0]} to {lost[1] - 1} of orders-0 are gone"):
        _read_parts(reader, parts)
    lenient = EventlogStreamReader({"path": str(s.data_dir), "failOnDataLoss": "false"})
    assert by_offset(_read_parts(lenient, parts)) == [r for r in rows if r[2] >= lost[1]]
    # planning now sees the loss too
    with pytest.raises(DataLossError, match=f"offsets 0 to {lost[1] - 1} of orders-0 are gone from the log"):
        reader.partitions(start, end)


def _read_parts(reader, parts) -> list[tuple]:
    rows = []
    for part in parts:
        for batch in reader.read(part):
            d = batch.to_pydict()
            rows += list(zip(d["topic"], d["partition"], d["offset"], d["key"], d["value"]))
    return rows


def test_reads_far_into_a_segment_copy_what_they_need(server, monkeypatch) -> None:
    s, client = server
    response = client.patch("/v1/topics/orders/configs",
                            json={"configs": {"segment.bytes": 1 << 20, "index.interval.bytes": 100}})
    assert response.status_code == 200, response.text
    rows = produce(client, "orders", 200, "a", partition=1, per=5)
    snapshot(client)
    s.stop()
    monkeypatch.setattr(stream_sources, "_COPY_FROM", 64)  # any position past 64 bytes: copied
    copied = []
    copy = stream_sources._copy
    monkeypatch.setattr(stream_sources, "_copy", lambda *args: copied.append(args[2]) or copy(*args))
    for path in (s.data_dir, s.data_dir / "snapshots"):
        reader = EventlogStreamReader({"path": str(path), "topics": "orders"})
        got, ends = read_all(reader, 17)
        assert by_offset(got) == by_offset(rows) and len(ends) == -(-200 // 17)
        assert len(copied) >= len(ends) - 1 and all(position > 64 for position in copied)
        copied.clear()
    # errors name the segment file and its position, not the copy
    active = _last_segment(s.data_dir / "orders-1")
    data = bytearray(active.read_bytes())
    position = _last_batch_position(bytes(data))
    data[position + 70] ^= 0xFF  # inside the last batch's records: its CRC fails
    active.write_bytes(bytes(data))
    part = LiveSlice(str(active.parent), "orders", 1, 199, 200)
    with pytest.raises(SnapshotCorruptError) as caught:
        list(EventlogStreamReader({"path": str(s.data_dir)}).read(part))
    assert caught.value.path == str(active) and caught.value.position == position


# ---------------------------------------------------------------------------------------------
# through Spark


def _query(spark, path: Path, out: Path, checkpoint: Path, **options):
    reader = spark.readStream.format("eventlog")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load(str(path)).select("topic", "partition", "offset", "key", "value")
        .writeStream.format("parquet").option("checkpointLocation", str(checkpoint))
    ), str(out)


def _output(spark, out: Path) -> list[tuple]:
    return by_offset(tuple(r) for r in spark.read.parquet(str(out)).collect())


def _batch_sizes(query) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_spark_over_successive_snapshots(spark, server, tmp_path: Path) -> None:
    s, client = server
    root, out, checkpoint = s.data_dir / "snapshots", tmp_path / "out", tmp_path / "checkpoint"
    produced = produce(client, "orders", 70, "a")
    snapshot(client)
    writer, target = _query(spark, root, out, checkpoint, maxOffsetsPerTrigger="40")
    query = writer.start(target)
    try:
        query.processAllAvailable()
        produced += produce(client, "orders", 30, "b")  # a new snapshot, new records
        snapshot(client)
        query.processAllAvailable()
    finally:
        query.stop()
    sizes = _batch_sizes(query)
    assert sum(sizes) == 100 and max(sizes) <= 40 and len(sizes) >= 3
    assert _output(spark, out) == by_offset(produced)

    # stopped: more records, and the topic gains a partition; the query restarts from its
    # checkpoint and reads only what is new, the new partition from offset 0
    produced += produce(client, "orders", 45, "c")
    response = client.post("/v1/topics/orders/partitions", json={"count": 3})
    assert response.status_code == 200, response.text
    produced += produce(client, "orders", 12, "d", partition=2)
    snapshot(client)
    query = writer.trigger(availableNow=True).start(target)
    query.awaitTermination(120)
    sizes = _batch_sizes(query)
    assert sum(sizes) == 57 and max(sizes) <= 40 and len(sizes) == 2
    assert _output(spark, out) == by_offset(produced)
    assert {r[1] for r in produced} == {0, 1, 2}


def test_spark_retention_loss(spark, server, tmp_path: Path) -> None:
    s, client = server
    root, out, checkpoint = s.data_dir / "snapshots", tmp_path / "out", tmp_path / "checkpoint"
    produced = produce(client, "orders", 40, "a", partition=0)
    old = snapshot(client)
    writer, target = _query(spark, root, out, checkpoint, topics="orders")
    writer.trigger(availableNow=True).start(target).awaitTermination(120)
    assert _output(spark, out) == by_offset(produced)
    # the stream is stopped while the log moves on and the snapshot it read is deleted
    produced += produce(client, "orders", 40, "b", partition=0)
    response = client.post("/v1/topics/orders/partitions/0/delete-records", json={"before_offset": 55})
    assert response.status_code == 200, response.text
    snapshot(client)
    assert client.delete(f"/v1/snapshots/{old}").status_code == 204
    failing = writer.trigger(availableNow=True).start(target)
    with pytest.raises(Exception, match="offsets 40 to 54 of orders-0 are in no snapshot") as caught:
        failing.awaitTermination(120)
    assert "failOnDataLoss" in str(caught.value)
    writer, target = _query(spark, root, out, checkpoint, topics="orders", failOnDataLoss="false")
    writer.trigger(availableNow=True).start(target).awaitTermination(120)
    assert _output(spark, out) == by_offset(r for r in produced if not 40 <= r[2] < 55)


def test_spark_over_a_live_data_dir(spark, app_factory, tmp_path: Path) -> None:
    s = app_factory(EVENTLOG_CHECKPOINT_INTERVAL_MS="100").start()
    try:
        client = s.client()
        assert client.post("/v1/topics", json={"name": "clicks", "partitions": 2,
                                               "configs": {"segment.bytes": 1500}}).status_code == 201
        out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
        live = EventlogStreamReader({"path": str(s.data_dir)})

        def checkpointed(rows):  # the server's recovery-point checkpoint covers these rows
            ends = {tp: r.end for tp, r in live.source.view().items()}
            return all(ends.get((t, p), 0) > o for t, p, o, _, _ in rows)

        produced = produce(client, "clicks", 50, "a")
        wait_until(lambda: checkpointed(produced), what="the checkpoint")
        writer, target = _query(spark, s.data_dir, out, checkpoint, maxOffsetsPerTrigger="30")
        query = writer.start(target)
        try:
            query.processAllAvailable()
            produced += produce(client, "clicks", 25, "b")
            wait_until(lambda: checkpointed(produced), what="the checkpoint")
            query.processAllAvailable()
        finally:
            query.stop()
        sizes = _batch_sizes(query)
        assert sum(sizes) == 75 and max(sizes) <= 30
        assert _output(spark, out) == by_offset(produced)
    finally:
        s.stop()
