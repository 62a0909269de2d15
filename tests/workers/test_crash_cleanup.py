"""Compaction and retention against real servers that die mid-pass (docs/FORMAT.md, "Deletion
and compaction file protocols", "Recovery, step by step"): a crash at any step leaves either the
old or the new segments, the next start resolves every .cleaned/.swap/.deleted file, and what
was acknowledged is still there.

The model is what the server acknowledged: offset -> (key, value). After each crash and
restart, a read of the whole partition over HTTP must have strictly increasing offsets, hold
only acknowledged records (compaction keeps offsets), and give the model's table view (latest
value per key, tombstones removed); every .log file must decode with kafka-python with valid
CRCs and hold exactly what the API returns.

Crash points are engine/faults.py's (EVENTLOG_CRASH_AT); the kills during a running pass are
sent by the test itself.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from engine import filenames
from tests.conftest import ServerProcess, wait_until
from tests.kafka_oracle import decode_all

TRANSIENT = (filenames.CLEANED_SUFFIX, filenames.SWAP_SUFFIX, filenames.DELETED_SUFFIX)
PROBLEM_JSON = "application/problem+json"

# only the on-demand passes run; the retention loop's interval is far away
QUIET = {"EVENTLOG_CLEANER_ENABLED": "false", "EVENTLOG_RETENTION_CHECK_INTERVAL_MS": "3600000"}


# -- the model and the workload ---------------------------------------------------------------


@dataclass
class Model:
    """What the server acknowledged."""

    acked: dict[int, tuple[str, str | None]] = field(default_factory=dict)

    def table(self, start: int = 0) -> dict[str, str]:
        return table((o, k, v) for o, (k, v) in sorted(self.acked.items()) if o >= start)


def table(records) -> dict[str, str]:
    """Latest value per key; a tombstone removes its key."""
    view: dict[str, str] = {}
    for _offset, key, value in records:
        if value is None:
            view.pop(key, None)
        else:
            view[key] = value
    return view


def produce(client: httpx.Client, topic: str, records: list[dict], model: Model) -> None:
    r = client.post(f"/v1/topics/{topic}/records", json={"records": records})
    assert r.status_code == 200, r.text
    for rec, ack in zip(records, r.json()["offsets"], strict=True):
        assert ack["offset"] not in model.acked
        model.acked[ack["offset"]] = (rec["key"], rec["value"])


def fill(
    client: httpx.Client,
    topic: str,
    model: Model,
    *,
    seed: int,
    requests: int,
    per_request: int,
    value_bytes: int,
    hot_keys: int,
    hot_share: float,
    tombstone_share: float,
) -> None:
    """Keyed records: a few hot keys overwritten all the time, unique keys that survive a pass
    (so every segment keeps something and a pass has several groups), and tombstones for keys
    written before (hot or unique)."""
    rng = random.Random(seed)
    written: list[str] = []
    seq = len(model.acked)
    for _ in range(requests):
        records = []
        for _ in range(per_request):
            seq += 1
            if written and rng.random() < tombstone_share:
                records.append({"key": rng.choice(written), "value": None})
                continue
            key = f"h{rng.randrange(hot_keys)}" if rng.random() < hot_share else f"u{seq}"
            value = f"{key}={seq}:"
            records.append({"key": key, "value": value + "x" * max(value_bytes - len(value), 0)})
            written.append(key)
        produce(client, topic, records, model)


# -- reading back -----------------------------------------------------------------------------


def read_all(client: httpx.Client, topic: str, *, max_records: int = 5000) -> tuple[int, list[tuple]]:
    """(log start offset, [(offset, key, value)]) read over HTTP from the log start to the high
    watermark."""
    records: list[tuple] = []
    got = client.get(f"/v1/topics/{topic}/partitions/0/records", params={"max_records": max_records})
    assert got.status_code == 200, got.text
    body = got.json()
    start = body["log_start_offset"]
    while True:
        records.extend((r["offset"], r["key"], r["value"]) for r in body["records"])
        if body["next_offset"] >= body["high_watermark"]:
            return start, records
        got = client.get(
            f"/v1/topics/{topic}/partitions/0/records",
            params={"offset": body["next_offset"], "max_records": max_records},
        )
        assert got.status_code == 200, got.text
        body = got.json()


def check_scan(records: list[tuple], model: Model, start: int = 0) -> None:
    offsets = [r[0] for r in records]
    assert all(a < b for a, b in itertools.pairwise(offsets)), "offsets strictly increase, no duplicates"
    for offset, key, value in records:
        assert offset >= start
        assert model.acked.get(offset) == (key, value), f"offset {offset}: not what was acknowledged"
    assert table(records) == model.table(start), "the table view is the acknowledged one"


def partition_dir(server: ServerProcess, topic: str) -> Path:
    return server.data_dir / f"{topic}-0"


def transient_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(TRANSIENT))


def decode_files(directory: Path) -> list[tuple]:
    """Every live .log file through kafka-python (CRC-checked, whole batches only), in offset
    order; each batch lies within its segment's offset range."""
    logs = sorted(
        (parsed[0], directory / name)
        for name in os.listdir(directory)
        if (parsed := filenames.parse_segment_file(name)) and parsed[1] == filenames.LOG_SUFFIX and parsed[2] == ""
    )
    out: list[tuple] = []
    for i, (base, path) in enumerate(logs):
        limit = logs[i + 1][0] if i + 1 < len(logs) else None
        batches, records = decode_all(path.read_bytes())
        for batch in batches:
            assert batch.base_offset >= base, f"{path.name}: batch at {batch.base_offset} below the base"
            assert limit is None or batch.base_offset + batch.last_offset_delta < limit, (
                f"{path.name}: batch {batch.base_offset}+{batch.last_offset_delta} reaches the next segment"
            )
        for r in records:
            out.append((r.offset, r.key.decode(), None if r.value is None else r.value.decode()))
    return out


def check_partition(server: ServerProcess, client: httpx.Client, topic: str, model: Model) -> int:
    """The whole set of checks; returns the log start offset."""
    directory = partition_dir(server, topic)
    assert transient_files(directory) == []
    start, records = read_all(client, topic)
    check_scan(records, model, start)
    on_disk = [r for r in decode_files(directory) if r[0] >= start]
    assert on_disk == records, "the files hold exactly what the API returns"
    offsets = client.get(f"/v1/topics/{topic}/partitions/0/offsets").json()
    assert offsets["log_start_offset"] == start
    assert offsets["high_watermark"] == max(model.acked) + 1
    check_key_index(client, topic, records)
    return start


def check_key_index(client: httpx.Client, topic: str, records: list[tuple]) -> None:
    """Each key's history through the key index (engine/key_index.py, rebuilt or checked after
    the crash) is the partition's records with that key, and its ETag its latest offset."""
    by_key: dict[str, list[tuple]] = {}
    for offset, key, value in records:
        by_key.setdefault(key, []).append((offset, value))
    # every hot key (many records, across segments and passes) and a sample of the others
    sample = sorted(k for k in by_key if not k.startswith("h"))[::7]
    for key in sorted(k for k in by_key if k.startswith("h")) + sample:
        want = by_key[key]
        got, after = [], -1
        while True:
            r = client.get(f"/v1/topics/{topic}/keys/{key}/records", params={"after_offset": after, "max_records": 1000})
            assert r.status_code == 200, r.text
            page = r.json()
            got += [(rec["offset"], rec["value"]) for rec in page["records"]]
            if not page["more"]:
                break
            after = page["next_offset"] - 1
        assert got == want, f"key {key!r}: the key index disagrees with the partition"
        assert r.headers["etag"] == f'"{want[-1][0]}"'


def check_partition_allowing_deleted(server: ServerProcess, client: httpx.Client, topic: str, model: Model) -> int:
    """check_partition for a partition whose .deleted files wait out file.delete.delay.ms."""
    directory = partition_dir(server, topic)
    assert [n for n in transient_files(directory) if not n.endswith(filenames.DELETED_SUFFIX)] == []
    start, records = read_all(client, topic)
    check_scan(records, model, start)
    on_disk = [r for r in decode_files(directory) if r[0] >= start]
    assert on_disk == records
    return start


def wait_no_transient(directory: Path, timeout_s: float = 10.0) -> None:
    """.deleted files of a finished pass go after file.delete.delay.ms (0 here) in the server's
    background: wait for them."""
    wait_until(lambda: not transient_files(directory), timeout_s, f"the transient files of {directory.name} going")


def compaction_run(client: httpx.Client, topic: str) -> httpx.Response:
    return client.post("/v1/admin/compaction/run", json={"topic": topic}, timeout=120)


def cleanup_passes(client: httpx.Client, worker: str, outcome: str) -> float:
    prefix = f'eventlog_cleanup_passes_total{{outcome="{outcome}",worker="{worker}"}} '
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return 0.0


def assert_killed(server: ServerProcess, timeout_s: float = 30.0) -> None:
    assert server.proc is not None
    code = server.proc.wait(timeout=timeout_s)
    assert code == -signal.SIGKILL, f"expected death by SIGKILL, got {code}:\n{server.log()[-3000:]}"
    server.stop()  # closes its log file


def second_pass_keeps_the_table(server: ServerProcess, client: httpx.Client, topic: str, model: Model) -> None:
    r = compaction_run(client, topic)
    assert r.status_code == 200, r.text
    (part,) = r.json()["partitions"]
    assert part["cleaned"], part
    wait_no_transient(partition_dir(server, topic))
    check_partition(server, client, topic, model)


# -- 1. crash points of a compaction pass -----------------------------------------------------

COMPACTED_SMALL = {
    "cleanup.policy": "compact",
    "segment.bytes": 4096,
    "file.delete.delay.ms": 0,
    "delete.retention.ms": 0,  # tombstones go in the pass after the one that stamps them
    "min.cleanable.dirty.ratio": 0.01,
}
SMALL_FILL = {
    "requests": 50, "per_request": 10, "value_bytes": 40, "hot_keys": 15, "hot_share": 0.6, "tombstone_share": 0.1,
}

# clean.mid_recopy fires after 4 MiB of one new segment are written: segments big enough
COMPACTED_LARGE = {**COMPACTED_SMALL, "segment.bytes": 5 * 1024 * 1024}
LARGE_FILL = {
    "requests": 12, "per_request": 500, "value_bytes": 1000, "hot_keys": 50, "hot_share": 0.05, "tombstone_share": 0.02,
}

SWAP_POINTS = [
    "swap.after_swap_rename",
    "swap.after_deleted_rename",
    "swap.after_live_rename",
    "swap.after_swap_rename@3",  # two groups already swapped in, later groups still .cleaned
    "swap.after_deleted_rename@2",
    "swap.after_live_rename@4",
]


def _segments(client: httpx.Client, topic: str) -> list[dict]:
    return client.get(f"/v1/topics/{topic}/partitions/0/segments").json()["segments"]


@pytest.mark.slow
@pytest.mark.parametrize("point", SWAP_POINTS)
def test_server_killed_during_a_swap(server_factory, point: str) -> None:
    """The server kills itself inside PartitionLog.replace_segments; the next start finishes or
    undoes the swap, and the data is what was acknowledged."""
    env = {**QUIET, "EVENTLOG_CLEANER_RUN_IN": "thread"}
    server = server_factory(**env, EVENTLOG_CRASH_AT=point).start()
    model = Model()
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "c", "configs": COMPACTED_SMALL}).status_code == 201
        fill(c, "c", model, seed=1, **SMALL_FILL)
        before = _segments(c, "c")
        assert len(before) >= 6
        with pytest.raises(httpx.TransportError):
            compaction_run(c, "c")
    assert_killed(server)

    again = server_factory(server.data_dir, **env).start()
    n = int(point.partition("@")[2] or 1)
    # the compacted segments come with the key index files the cleaner wrote (issue 28), which
    # the key reads of check_partition use as they are: none rebuilt, none written again
    directory = partition_dir(again, "c")
    compacted = [filenames.key_index_file(directory, s["base_offset"]) for s in before[:n]]
    written = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in compacted}
    with again.client() as c:
        check_partition(again, c, "c", model)
        assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in compacted} == written
        # Each group is one segment here, and the pass swaps groups in lowest first. The n-th
        # swap had renamed all its new files to .swap (step 1 done), so recovery finishes it
        # (redo); the groups before it were swapped in, the ones after were still .cleaned
        # (undo): the first n segments are the compacted ones, the others are untouched.
        after = _segments(c, "c")
        assert [s["base_offset"] for s in after] == [s["base_offset"] for s in before]
        for i, (old, new) in enumerate(zip(before[:-1], after[:-1])):
            assert new["last_offset"] == old["last_offset"]
            if i < n:
                assert new["size_bytes"] < old["size_bytes"], f"segment {i} is the compacted one"
            else:
                assert new["size_bytes"] == old["size_bytes"], f"segment {i} is the old one"
        second_pass_keeps_the_table(again, c, "c", model)
    assert again.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("point", ["clean.after_cleaned", "clean.mid_recopy"])
def test_worker_process_killed_during_a_pass(server_factory, point: str) -> None:
    """The worker process dies; the server survives, answers with a problem (500
    compaction_failed), removes the pass's .cleaned files and keeps serving the old segments."""
    large = point == "clean.mid_recopy"
    env = {**QUIET, "EVENTLOG_CLEANER_RUN_IN": "process"}
    server = server_factory(**env, EVENTLOG_CRASH_AT=point).start()
    model = Model()
    topic_configs = COMPACTED_LARGE if large else COMPACTED_SMALL
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "c", "configs": topic_configs}).status_code == 201
        fill(c, "c", model, seed=2, **(LARGE_FILL if large else SMALL_FILL))
        before = _segments(c, "c")
        assert len(before) >= 2
        r = compaction_run(c, "c")
        assert r.status_code == 500, r.text
        assert r.headers["content-type"].startswith(PROBLEM_JSON)
        problem = r.json()
        assert problem["code"] == "compaction_failed" and problem["status"] == 500
        assert "Traceback" not in r.text
        assert server.proc is not None and server.proc.poll() is None, "the server survives its worker"
    # a new connection: the failed request's one is reset (see test_a_failed_pass_keeps_the_connection)
    with server.client() as c:
        assert transient_files(partition_dir(server, "c")) == [], "the failed pass removed its files"
        assert cleanup_passes(c, "compaction", "error") == 1
        assert _segments(c, "c") == before, "the old segments are untouched"
        check_partition(server, c, "c", model)
    assert server.stop() == 0
    assert "BrokenWorkerProcess" in server.log(), "the worker died at the crash point"

    again = server_factory(server.data_dir, **env).start()
    with again.client() as c:
        check_partition(again, c, "c", model)
        second_pass_keeps_the_table(again, c, "c", model)
    assert again.stop() == 0


# -- 2. retention -----------------------------------------------------------------------------

DELETE_SMALL = {
    "cleanup.policy": "delete",
    "segment.bytes": 4096,
    "retention.ms": -1,
    "retention.bytes": -1,
    "file.delete.delay.ms": 60_000,
}


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["retention_bytes", "delete_records"])
def test_server_killed_after_retention_renamed_to_deleted(server_factory, rule: str) -> None:
    """Crash after retention renamed segments to .deleted but before the log start offset was
    raised: the next start removes them and starts the log at the first remaining segment (or
    at the acknowledged delete-records offset, whichever is higher)."""
    configs = {**DELETE_SMALL, "retention.bytes": 12_000} if rule == "retention_bytes" else DELETE_SMALL
    server = server_factory(**QUIET, EVENTLOG_CRASH_AT="delete.after_deleted_rename").start()
    model = Model()
    deleted_to = 0
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "r", "configs": configs}).status_code == 201
        fill(c, "r", model, seed=3, **{**SMALL_FILL, "tombstone_share": 0.0})
        before = _segments(c, "r")
        assert len(before) >= 6
        if rule == "delete_records":
            deleted_to = before[3]["base_offset"] + 5  # inside the fourth segment
            r = c.post("/v1/topics/r/partitions/0/delete-records", json={"before_offset": deleted_to})
            assert r.status_code == 200 and r.json() == {"log_start_offset": deleted_to}, r.text
        with pytest.raises(httpx.TransportError):
            c.post("/v1/admin/retention/run", json={"topic": "r"})
    assert_killed(server)

    again = server_factory(server.data_dir, **QUIET).start()
    with again.client() as c:
        start = check_partition(again, c, "r", model)
        bases = [s["base_offset"] for s in _segments(c, "r")]
        assert bases[0] > 0, "the segments renamed to .deleted are gone"
        if rule == "delete_records":
            assert start == deleted_to, "an acknowledged delete-records survives the crash"
            assert bases[0] <= deleted_to < bases[1]
        else:
            assert start == bases[0], "the log starts at the first remaining segment"
            assert sum(s["size_bytes"] for s in _segments(c, "r")) >= 12_000
        r = c.get("/v1/topics/r/partitions/0/records", params={"offset": start - 1})
        assert r.status_code == 416 and r.json()["code"] == "offset_out_of_range"
        # every acknowledged record at or above the log start offset is still readable
        _, records = read_all(c, "r")
        assert [r[0] for r in records] == [o for o in sorted(model.acked) if o >= start]
        # the crashed pass had deleted all it planned: the next one finds nothing more
        r = c.post("/v1/admin/retention/run", json={"topic": "r"})
        assert r.status_code == 200 and r.json()["segments_deleted"] == 0, r.text
        assert check_partition_allowing_deleted(again, c, "r", model) >= start
    assert again.stop() == 0


@pytest.mark.slow
def test_server_killed_while_compaction_deletes_a_range_left_empty(server_factory) -> None:
    """A pass that keeps no record of the cleaned range (every key's last record there is a
    tombstone past its horizon) deletes the old segments instead of swapping: a crash after
    their rename to .deleted leaves a log that starts at the active segment, with the same
    table view."""
    env = {**QUIET, "EVENTLOG_CLEANER_RUN_IN": "thread"}
    server = server_factory(**env, EVENTLOG_CRASH_AT="delete.after_deleted_rename").start()
    model = Model()
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "e", "configs": COMPACTED_SMALL}).status_code == 201
        for round_ in range(4):
            produce(c, "e", [{"key": f"k{i}", "value": f"v{round_}-{i}" + "x" * 40} for i in range(30)], model)
        produce(c, "e", [{"key": f"k{i}", "value": None} for i in range(30)], model)
        # one record too big to share a segment: the tombstones' segment closes behind it
        produce(c, "e", [{"key": "tail", "value": "t" * 3000}], model)
        before = _segments(c, "e")
        assert len(before) >= 3 and before[-1]["base_offset"] == max(model.acked)
        r = compaction_run(c, "e")  # keeps the tombstones, stamped with their horizon (now)
        assert r.status_code == 200 and r.json()["partitions"][0]["records_kept"] == 30, r.text
        with pytest.raises(httpx.TransportError):
            compaction_run(c, "e")  # drops them: nothing is left to swap in
    assert_killed(server)

    again = server_factory(server.data_dir, **env).start()
    with again.client() as c:
        start = check_partition(again, c, "e", model)
        assert [s["base_offset"] for s in _segments(c, "e")] == [start] == [before[-1]["base_offset"]]
        assert model.table(start) == model.table() == {"tail": "t" * 3000}
    assert again.stop() == 0


def test_a_failed_pass_keeps_the_connection(server_factory) -> None:
    """A pass whose worker process died is answered with a problem, and the client's
    keep-alive connection stays usable, as after any other error response."""
    server = server_factory(**QUIET, EVENTLOG_CRASH_AT="clean.after_cleaned").start()
    model = Model()
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "c", "configs": COMPACTED_SMALL}).status_code == 201
        fill(c, "c", model, seed=4, **{**SMALL_FILL, "requests": 15})
        r = compaction_run(c, "c")
        assert r.status_code == 500 and r.headers["content-type"].startswith(PROBLEM_JSON)
        if r.headers.get("connection") != "close":
            assert c.get("/readyz").status_code == 200
    assert server.stop() == 0
    assert "Exception in ASGI application" not in server.log(), "the failure is handled, not left to uvicorn"


# -- 3. the server killed from outside while a pass runs --------------------------------------

LARGER = {**COMPACTED_SMALL, "segment.bytes": 128 * 1024, "file.delete.delay.ms": 60_000}
LARGER_FILL = {
    "requests": 40, "per_request": 500, "value_bytes": 150, "hot_keys": 200, "hot_share": 0.3, "tombstone_share": 0.05,
}


def children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(name))
    return out


def alive(pid: int) -> bool:
    """Running (a zombie left to a parent that does not reap it counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def cleaned_files(directory: Path) -> set[str]:
    return {n for n in os.listdir(directory) if n.endswith(filenames.CLEANED_SUFFIX)}


def _kill_when(
    server: ServerProcess, directory: Path, trigger: str, timeout_s: float = 60.0
) -> tuple[list[int], set[str]]:
    """Wait for `trigger` during the pass, SIGKILL the server, and return its worker processes
    as they were just before, and the .cleaned files there were once the server was gone (the
    worker's death signal comes with its parent's death, not with our kill: on a loaded machine
    a fast pass may write a few more files in between)."""
    assert server.proc is not None
    deadline = time.monotonic() + timeout_s
    spawned_at = None
    workers: list[int] = []
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.log()[-3000:]
        workers = children(server.proc.pid) or workers
        names = os.listdir(directory)
        if trigger == "worker_starting":
            if workers and spawned_at is None:
                spawned_at = time.monotonic()
            fire = spawned_at is not None and time.monotonic() - spawned_at >= 0.05
        elif trigger == "first_cleaned":
            fire = any(n.endswith(filenames.CLEANED_SUFFIX) for n in names)
        else:
            assert trigger == "first_swap"
            fire = any(n.endswith((filenames.SWAP_SUFFIX, filenames.DELETED_SUFFIX)) for n in names)
        if fire:
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(10)
            return workers, cleaned_files(directory)
        time.sleep(0.001)  # watching for the moment to kill: nothing signals it, and it is brief
    raise AssertionError(f"{trigger} never happened:\n{server.log()[-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("trigger", ["worker_starting", "first_cleaned", "first_swap"])
def test_server_killed_while_a_pass_runs(server_factory, trigger: str) -> None:
    """SIGKILL from outside at three moments of a pass over a few MB in a worker process: while
    the worker starts, while it writes .cleaned segments, while the server swaps them in. The
    worker dies with the server (PR_SET_PDEATHSIG, or end of input before its first pass), so
    nothing writes into the partition after the next start."""
    env = {**QUIET, "EVENTLOG_CLEANER_RUN_IN": "process"}
    server = server_factory(**env).start()
    model = Model()
    directory = partition_dir(server, "c")
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "c", "configs": LARGER}).status_code == 201
        fill(c, "c", model, seed=6, **LARGER_FILL)
        assert len(_segments(c, "c")) >= 20
    outcome: list[BaseException | httpx.Response] = []

    def run() -> None:
        try:
            with server.client() as rc:
                outcome.append(compaction_run(rc, "c"))
        except httpx.TransportError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        workers, cleaned_at_kill = _kill_when(server, directory, trigger)
    finally:
        thread.join(60)
    assert_killed(server)
    if trigger != "first_swap":  # the last swaps may just beat the kill
        assert isinstance(outcome[0], httpx.TransportError), outcome
    assert workers, "the pass ran in a worker process"
    wait_until(lambda: not any(alive(pid) for pid in workers), 10, "the worker processes ending with the server")
    # A worker that went on would have written the .cleaned segments of every group (about 25);
    # one killed with the server got at most the one it was writing a little further.
    assert len(cleaned_files(directory) - cleaned_at_kill) <= 3, "the worker kept writing after the kill"

    again = server_factory(server.data_dir, **env).start()
    with again.client() as c:
        check_partition(again, c, "c", model)  # start-up removed the .deleted files too
        r = c.patch("/v1/topics/c/configs", json={"configs": {"file.delete.delay.ms": 0}})
        assert r.status_code == 200, r.text
        second_pass_keeps_the_table(again, c, "c", model)
    # nothing from the killed pass shows up later
    assert transient_files(directory) == []
    assert again.stop() == 0


# -- 4. readers during a pass -----------------------------------------------------------------


@pytest.mark.slow
def test_readers_see_the_table_view_throughout_a_pass(server_factory) -> None:
    """Full scans from the log start to the high watermark, in small reads, while passes swap
    segments under them: offsets always increase, every record is an acknowledged one, and
    every scan's table view is the model's (compaction never changes it)."""
    server = server_factory(**QUIET, EVENTLOG_CLEANER_RUN_IN="thread").start()
    model = Model()
    configs = {**COMPACTED_SMALL, "segment.bytes": 1024, "file.delete.delay.ms": 60_000}
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "c", "configs": configs}).status_code == 201
        fill(c, "c", model, seed=7, **{**SMALL_FILL, "requests": 100, "per_request": 8})
        assert len(_segments(c, "c")) >= 40
    stop = threading.Event()
    scans: list[tuple[float, float, int]] = []  # (started, ended, records)
    failures: list[BaseException] = []

    def reader() -> None:
        try:
            with server.client() as rc:
                while not stop.is_set():
                    started = time.monotonic()
                    start, records = read_all(rc, "c", max_records=37)
                    check_scan(records, model, start)
                    scans.append((started, time.monotonic(), len(records)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    passes = []
    try:
        with server.client() as c:
            for _ in range(2):  # the first keeps the tombstones (stamps them), the second drops them
                began = time.monotonic()
                r = compaction_run(c, "c")
                passes.append((began, time.monotonic()))
                assert r.status_code == 200, r.text
                (part,) = r.json()["partitions"]
                assert part["cleaned"], part
                cleaned_to = part["end_offset"]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not failures, failures[0]
    during = [s for s in scans if any(s[0] < end and s[1] > began for began, end in passes)]
    assert len(during) >= 3, (scans, passes)
    directory = partition_dir(server, "c")
    assert [n for n in transient_files(directory) if not n.endswith(filenames.DELETED_SUFFIX)] == []
    with server.client() as c:
        start, records = read_all(c, "c")
        check_scan(records, model, start)
        cleaned = [r for r in records if r[0] < cleaned_to]
        assert len({r[1] for r in cleaned}) == len(cleaned), "each key once in the cleaned range"
        assert all(r[2] is not None for r in cleaned), "and its tombstones are gone"
    assert server.stop() == 0
