"""The eventlog streaming source: offset planning in plain Python, reading snapshots and a live
data dir without Spark, typed values (options, schemas, micro-batches) without Spark, then
micro-batches through a real local SparkSession.

Data comes from the service itself (app_factory: the app `eventlog serve` runs, in this process),
produced over its HTTP API; snapshots are its own. Typed values read test_typed.py's snapshot of
JSON records (malformed ones among them) as a directory of snapshots. Spark queries are few
(each costs seconds): one over successive snapshots, one for retention loss, one over a live
data dir, one typed.
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
from analytics.decoder import ARROW_SCHEMA, SPARK_DDL, SnapshotCorruptError
from analytics.schemas import arrow_schema, parse_ddl
from analytics.source import EventlogDataSource, typing_options
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
    stream_input,
    to_json,
)
from analytics.values import MalformedRecordError
from engine.snapshots import default_root

from ..conftest import wait_until
from .test_typed import (
    INFERRED,
    USER_VALUE_DDL,
    TypedSnapshot,
    build_typed_snapshot,
    expected_rows,
    orders_of,
    rows_of_batches,
    spark_rows,
)

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
    assert reader.input == "snapshots"
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
    root = default_root(s.data_dir)
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
    newest = default_root(s.data_dir) / snapshot(client) / "manifest.json"
    manifest = json.loads(newest.read_text())  # as if orders-1 had been offline
    manifest["topics"][0]["partitions"] = [p for p in manifest["topics"][0]["partitions"] if p["partition"] == 0]
    newest.write_text(json.dumps(manifest))
    got, ends = read_all(EventlogStreamReader({"path": str(default_root(s.data_dir))}))
    assert by_offset(got) == by_offset(rows)
    assert ends[-1] == {"orders": {"0": 30, "1": 20}}


def test_a_snapshot_deleted_after_planning(server) -> None:
    s, client = server
    rows = produce(client, "orders", 30, "a")
    snapshot_id = snapshot(client)
    reader = EventlogStreamReader({"path": str(default_root(s.data_dir))})
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    assert parts and all(isinstance(p, SnapshotSlice) for p in parts)
    assert client.delete(f"/v1/snapshots/{snapshot_id}").status_code == 204
    with pytest.raises(DataLossError, match="its snapshot was deleted"):
        list(reader.read(parts[0]))
    lenient = EventlogStreamReader({"path": str(default_root(s.data_dir)), "failOnDataLoss": "false"})
    assert [b for p in parts for b in lenient.read(p)] == []
    assert rows  # produced, then lost with the snapshot


def test_live_checkpoint_mode_reads_what_the_server_checkpointed(server) -> None:
    s, client = server
    rows = produce(client, "orders", 80, "a")
    s.stop()  # a clean shutdown writes the recovery-point checkpoint
    reader = EventlogStreamReader({"path": str(s.data_dir), "maxOffsetsPerTrigger": "30"})
    assert reader.input == "live"
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
    for path in (s.data_dir, default_root(s.data_dir)):
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
# typed values (the batch source's options and decoding), without Spark


@pytest.fixture(scope="module")
def typed_root(tmp_path_factory) -> tuple[Path, TypedSnapshot]:
    """A directory of snapshots holding one: test_typed.py's JSON records."""
    root = tmp_path_factory.mktemp("typed-snapshots")
    return root, build_typed_snapshot(root / "20240101T000000000Z-typed")


def test_input_and_mode_options(tmp_path: Path) -> None:
    path = str(tmp_path)
    assert stream_input({}, path) == "snapshots"
    for options, chosen in [
        ({"input": "live"}, "live"),
        ({"mode": "live"}, "live"),  # input's old name, still accepted
        ({"mode": " Snapshots "}, "snapshots"),
        ({"input": "snapshots", "mode": "snapshots"}, "snapshots"),
        ({"input": "live", "mode": "dropMalformed"}, "live"),  # any other mode: the typed values'
        ({"mode": "FAILFAST"}, "snapshots"),
        ({"mode": ""}, "snapshots"),
    ]:
        assert stream_input(options, path) == chosen, options
    (tmp_path / "meta.properties").write_text("")
    assert stream_input({"mode": "auto"}, path) == stream_input({}, path) == "live"
    for options, error in [
        ({"input": "kafka"}, "input must be auto, live or snapshots"),
        ({"mode": "kafka"}, "mode must be PERMISSIVE, DROPMALFORMED, FAILFAST .* or auto, live or snapshots"),
        ({"input": "live", "mode": "snapshots"}, "disagree"),
    ]:
        with pytest.raises(ValueError, match=error):
            stream_input(options, path)
    with pytest.raises(ValueError, match="not a URI"):
        stream_input({"input": "live"}, "s3://bucket/snapshots")
    # typing never sees a mode that names the input
    assert typing_options({"mode": "Live", "key_format": "string"}) == {"key_format": "string"}
    assert typing_options({"mode": "FAILFAST"}) == {"mode": "FAILFAST"}
    typed = EventlogStreamReader({"path": path, "mode": "snapshots", "key_format": "string"})
    assert (typed.input, typed._format.mode) == ("snapshots", "PERMISSIVE")
    failfast = EventlogStreamReader({"path": path, "input": "live", "mode": "failfast", "value_schema": "id INT"})
    assert (failfast.input, failfast._format.mode, failfast._format.value_format) == ("live", "FAILFAST", "json")
    with pytest.raises(ValueError, match="schemaInference must be true or false"):
        EventlogStreamReader({"path": path, "schemaInference": "yes"})


def test_stream_schema_follows_the_options(typed_root) -> None:
    root, _ = typed_root
    options = {"path": str(root), "topics": "orders", "key_format": "string", "value_schema": USER_VALUE_DDL,
               "mode": "snapshots"}
    schema = EventlogDataSource(options).schema()
    assert schema["key"].dataType.simpleString() == "string"
    assert schema["value"].dataType == parse_ddl(USER_VALUE_DDL)
    assert schema.fieldNames()[-1] == "_corrupt_record"
    assert EventlogDataSource({**options, "mode": "DROPMALFORMED"}).schema().fieldNames()[-1] == "headers"
    # a user schema: checked as for batch reads
    user = SPARK_DDL.replace("key binary", "key string").replace("value binary", "value struct<id: bigint>")
    reader = EventlogDataSource({"path": str(root), "input": "snapshots"}).streamReader(parse_ddl(user))
    assert reader._format.schema.equals(arrow_schema(parse_ddl(user)))
    for bad, error in [(SPARK_DDL + ", extra int", "schema is fixed"),
                       (SPARK_DDL.replace("value binary", "value map<string, int>"), "map")]:
        with pytest.raises(ValueError, match=error):
            EventlogDataSource({"path": str(root)}).streamReader(parse_ddl(bad))
    # untyped: the decoder's batches as they are
    assert EventlogStreamReader({"path": str(root)})._format is None


def test_a_stream_infers_the_value_type_only_when_asked(typed_root, tmp_path: Path) -> None:
    root, snap = typed_root
    options = {"path": str(root), "topics": "orders", "value_format": "json"}
    for make in (lambda o: EventlogDataSource(o).schema(), EventlogStreamReader):
        with pytest.raises(ValueError, match="value type is not inferred unless you ask.*schemaInference"):
            make(options)
    # asked: once, from what the snapshots hold (every record here: the batch read's type)
    schema = EventlogDataSource({**options, "schemaInference": "true"}).schema()
    assert schema["value"].dataType.simpleString() == INFERRED
    assert EventlogStreamReader({**options, "schemaInference": "true"})._format.value_format == "json"
    # one snapshot: schema() cannot tell a stream from a batch read and infers; the stream refuses
    # it on the instance Spark pickled after schema(), and takes a user schema
    one = {**options, "path": str(snap.path)}
    source = EventlogDataSource(one)
    inferred = source.schema()
    assert inferred["value"].dataType.simpleString() == INFERRED  # a batch read's inference
    with pytest.raises(ValueError, match="schemaInference"):
        pickle.loads(pickle.dumps(source)).streamReader(inferred)
    assert EventlogDataSource(one).streamReader(inferred)._format is not None
    assert EventlogDataSource({**one, "schemaInference": "true"}).streamReader(inferred) is not None
    # asked, a stream over one snapshot samples what it holds, whatever startingOffsets says (a
    # batch read would sample nothing past `latest`); batch reads refuse the option
    asked = EventlogDataSource({**one, "schemaInference": "true", "startingOffsets": "latest"}).schema()
    assert asked["value"].dataType.simpleString() == INFERRED
    with pytest.raises(ValueError, match="schemaInference is for readStream only"):
        EventlogDataSource({**one, "schemaInference": "true"}).reader(inferred)
    # nothing to infer from yet
    with pytest.raises(ValueError, match=r"no JSON value .*\(topics: none\).*value_schema"):
        EventlogStreamReader({"path": str(tmp_path), "value_format": "json", "schemaInference": "true"})


def typed_micro_batches(reader: EventlogStreamReader, limit: int) -> tuple[list, int]:
    """Every micro-batch's typed batches, read as Spark would (pickled reader and partitions),
    each checked against the reader's schema; (batches, how many micro-batches)."""
    start, batches, count = reader.initialOffset(), [], 0
    while (end := reader.latestOffset(start, ReadMaxRows(limit))) != start:
        worker = pickle.loads(pickle.dumps(reader))
        for part in reader.partitions(start, end):
            for batch in worker.read(pickle.loads(pickle.dumps(part))):
                assert batch.schema.equals(reader._format.schema) and batch.num_rows
                batches.append(batch)
        start, count = end, count + 1
    return batches, count


def test_typed_micro_batches_decode_as_the_batch_source(typed_root) -> None:
    root, snap = typed_root
    options = {"path": str(root), "topics": "orders", "key_format": "string", "header_format": "string",
               "value_format": "json", "schemaInference": "true"}
    batches, count = typed_micro_batches(EventlogStreamReader(options), 50)
    assert count == 3  # 120 offsets
    expected = expected_rows(orders_of(snap), parse_ddl(INFERRED), strings=True)
    assert rows_of_batches(batches) == expected
    assert any(row[4] is None and row[6] is not None for row in expected)  # malformed: null + raw bytes
    # DROPMALFORMED, and a value_schema instead of inference
    dropping = {**options, "value_schema": USER_VALUE_DDL, "mode": "DROPMALFORMED", "schemaInference": "false"}
    batches, _ = typed_micro_batches(EventlogStreamReader(dropping), 50)
    assert rows_of_batches(batches, corrupt_column=None) == expected_rows(
        orders_of(snap), parse_ddl(USER_VALUE_DDL), strings=True, corrupt=False, drop=True)
    # FAILFAST names the record
    failing = EventlogStreamReader({**dropping, "mode": "FAILFAST", "topics": "orders"})
    with pytest.raises(MalformedRecordError, match=r"orders-0 offset 5: value: not valid JSON"):
        typed_micro_batches(failing, 50)


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
    root, out, checkpoint = default_root(s.data_dir), tmp_path / "out", tmp_path / "checkpoint"
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
    root, out, checkpoint = default_root(s.data_dir), tmp_path / "out", tmp_path / "checkpoint"
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


@pytest.mark.spark
@pytest.mark.slow
def test_spark_typed_stream(spark, typed_root, tmp_path: Path) -> None:
    root, snap = typed_root
    df = (spark.readStream.format("eventlog").option("topics", "orders").option("input", "snapshots")
          .option("value_schema", USER_VALUE_DDL).option("key_format", "string").option("mode", "permissive")
          .option("maxOffsetsPerTrigger", "70").load(str(root)))
    assert df.schema["value"].dataType == parse_ddl(USER_VALUE_DDL)
    assert df.schema.fieldNames()[-1] == "_corrupt_record"
    query = (df.writeStream.format("memory").queryName("eventlog_typed_stream")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
        assert query.exception() is None
        assert _batch_sizes(query) == [70, 50]
        got = spark_rows(spark.table("eventlog_typed_stream"))
    finally:
        query.stop()
    expected = expected_rows(orders_of(snap), parse_ddl(USER_VALUE_DDL), strings=True, headers=False)
    assert got == expected
    corrupt = [row for row in got if row[6] is not None]
    assert corrupt and all(row[4] is None for row in corrupt)
    assert (("orders", 0, 11, "order-11"), b"not json") in {(row[:4], row[6]) for row in corrupt}
