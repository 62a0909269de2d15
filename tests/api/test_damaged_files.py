"""Damaged files under a real server (issue 11, "Damaged files"): a torn or garbage tail after a
clean shutdown, bytes flipped inside a closed segment before a SIGKILL or a clean restart, and a
segment file the server may not write (chattr +i)."""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from engine.format import HEADER_SIZE, parse_header

from .test_api import assert_problem

# small segments, so that 1,000 records span several; checkpoints never come by themselves
SEGMENT_BYTES = 4000
QUIET = {"EVENTLOG_CHECKPOINT_INTERVAL_MS": "3600000"}


def _produce(c: httpx.Client, topic: str, partition: int, values: list[str]) -> dict:
    r = c.post(f"/v1/topics/{topic}/partitions/{partition}/records", json={"records": [{"value": v} for v in values]})
    assert r.status_code == 200, r.text
    return r.json()


def _read_all(c: httpx.Client, topic: str, partition: int = 0) -> list[tuple[int, str]]:
    """Every record from the log start on, following next_offset across gaps."""
    out: list[tuple[int, str]] = []
    offset = 0
    while True:
        r = c.get(f"/v1/topics/{topic}/partitions/{partition}/records", params={"offset": offset, "max_records": 10_000})
        assert r.status_code == 200, r.text
        body = r.json()
        out += [(rec["offset"], rec["value"]) for rec in body["records"]]
        if body["next_offset"] >= body["high_watermark"]:
            return out
        assert body["next_offset"] > offset, body
        offset = body["next_offset"]


def _batches(path: Path) -> list:
    data = path.read_bytes()
    out, position = [], 0
    while position + HEADER_SIZE <= len(data):
        header = parse_header(data, position)
        out.append(header)
        position += header.size
    return out


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def _flip(path: Path, position: int, count: int = 4) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        data = bytearray(f.read(count))
        f.seek(position)
        f.write(bytes(b ^ 0xFF for b in data))


def _metric(c: httpx.Client, name: str, **labels: str) -> float | None:
    text = c.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return None


def _fill_1000(c: httpx.Client) -> list[tuple[int, str]]:
    """1,000 acknowledged records in 100 batches of 10 over several segments."""
    assert c.post("/v1/topics", json={"name": "t", "configs": {"segment.bytes": SEGMENT_BYTES}}).status_code == 201
    written = []
    for i in range(100):
        values = [f"record-{i * 10 + j:04d}-" + "x" * 20 for j in range(10)]
        ack = _produce(c, "t", 0, values)
        written += [(ack["base_offset"] + j, v) for j, v in enumerate(values)]
    assert [o for o, _ in written] == list(range(1000))
    return written


def test_flipped_bytes_in_a_closed_segment_then_sigkill_lose_only_that_batch(server_factory, tmp_path: Path) -> None:
    server = server_factory(**QUIET).start()
    with server.client() as c:
        written = _fill_1000(c)
        assert _read_all(c, "t") == written  # readers have seen every offset
    directory = server.data_dir / "t-0"
    segments = _segments(directory)
    assert len(segments) >= 5
    victim = segments[2]  # closed, above the recovery point (no checkpoint since the topic was made)
    batch = _batches(victim)[1]
    _flip(victim, batch.position + 70)
    server.kill()

    server = server_factory(server.data_dir, **QUIET).start()
    with server.client() as c:
        lost = set(range(batch.base_offset, batch.last_offset + 1))
        assert _read_all(c, "t") == [w for w in written if w[0] not in lost]
        for offset in sorted(lost):  # the damaged batch's offsets are a gap now
            r = c.get("/v1/topics/t/partitions/0/records", params={"offset": offset, "max_records": 1})
            assert r.status_code == 200 and r.json()["records"][0]["offset"] == batch.last_offset + 1
        # the next append gets an offset above every offset ever acknowledged
        assert _produce(c, "t", 0, ["after"])["base_offset"] == 1000
        assert _metric(c, "eventlog_corrupt_batches_total", topic="t", partition="0", where="recovery") == 1
    server.stop()
    log = server.log()
    assert victim.name in log and f"offsets {batch.base_offset}-{batch.last_offset}" in log, log
    # every later segment was kept, and the dropped bytes were set aside for an operator
    assert [p.name for p in _segments(directory)] == [p.name for p in segments]
    aside = list(directory.glob(f"{victim.name}.*.damaged"))
    assert len(aside) == 1 and aside[0].stat().st_size == batch.size


@pytest.mark.parametrize("tail", ["torn", "garbage", "zeros"])
def test_a_bad_tail_after_a_clean_shutdown_is_truncated_with_a_warning(server_factory, tail: str) -> None:
    server = server_factory(**QUIET).start()
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "t"}).status_code == 201
        for i in range(5):
            _produce(c, "t", 0, [f"v{i}-{j}" for j in range(3)])
        written = _read_all(c, "t")
    assert server.stop() == 0
    assert (server.data_dir / ".kafka_cleanshutdown").exists()
    active = _segments(server.data_dir / "t-0")[-1]
    data = active.read_bytes()
    if tail == "torn":
        extra = data[_batches(active)[-1].position :][:-7]  # a copy of the last batch, cut short
    elif tail == "garbage":
        extra = random.Random(651).randbytes(651)
    else:
        extra = bytes(4096)
    with open(active, "ab") as f:
        f.write(extra)

    server = server_factory(server.data_dir, **QUIET).start()
    with server.client() as c:
        assert _read_all(c, "t") == written
        assert _produce(c, "t", 0, ["after"])["base_offset"] == 15
    server.stop()
    assert active.name in server.log() and f"truncated {len(extra)} bytes" in server.log(), server.log()


def test_a_json_fetch_of_a_damaged_batch_answers_corrupt_data(server_factory) -> None:
    server = server_factory(**QUIET).start()
    with server.client() as c:
        written = _fill_1000(c)
    assert server.stop() == 0
    segments = _segments(server.data_dir / "t-0")
    victim = segments[1]
    batch = _batches(victim)[2]
    _flip(victim, batch.position + 80)  # a value's bytes: the JSON would show the altered text

    server = server_factory(server.data_dir, **QUIET).start()  # clean: nothing is scanned
    path = "/v1/topics/t/partitions/0/records"
    with server.client() as c:
        body = assert_problem(c.get(path, params={"offset": batch.base_offset + 3}), 500, "corrupt_data")
        assert (body["first_offset"], body["last_offset"]) == (batch.base_offset, batch.last_offset)
        # a read that starts before the damage gets the records up to it
        r = c.get(path, params={"offset": 0, "max_records": 10_000})
        assert r.status_code == 200
        assert [(x["offset"], x["value"]) for x in r.json()["records"]] == written[: batch.base_offset]
        assert r.json()["next_offset"] == batch.base_offset
        # the records after it are readable, and raw fetches leave the check to Kafka clients
        r = c.get(path, params={"offset": batch.last_offset + 1, "max_records": 1})
        assert r.status_code == 200 and r.json()["records"][0]["value"] == written[batch.last_offset + 1][1]
        raw = c.get(path, params={"offset": batch.base_offset}, headers={"accept": "application/vnd.kafka.record-batch.v2"})
        assert raw.status_code == 200
        # an event stream ends with an error event naming the offsets
        with c.stream("GET", path + "/stream", params={"offset": batch.base_offset}) as s:
            text = ""
            for chunk in s.iter_text():
                text += chunk
                if "event: error" in text and text.endswith("\n\n"):
                    break
        assert '"code":"corrupt_data"' in text and f'"first_offset":{batch.base_offset}' in text, text
        assert _metric(c, "eventlog_corrupt_batches_total", topic="t", partition="0", where="read") >= 2
    server.stop()


def _chattr(flag: str, path: Path) -> str | None:
    try:
        result = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True)
    except FileNotFoundError:
        return "chattr is not installed"
    return None if result.returncode == 0 else f"chattr {flag} failed here: {result.stderr.strip()}"


@pytest.mark.parametrize("shutdown", ["sigkill", "clean"])
def test_an_immutable_segment_takes_only_its_partition_offline(server_factory, shutdown: str) -> None:
    server = server_factory(**QUIET).start()
    with server.client() as c:
        assert c.post("/v1/topics", json={"name": "a", "partitions": 2}).status_code == 201
        assert c.post("/v1/topics", json={"name": "b"}).status_code == 201
        for p in (0, 1):
            _produce(c, "a", p, ["a1", "a2"])
        _produce(c, "b", 0, ["b1"])
    if shutdown == "sigkill":
        server.kill()
    else:
        assert server.stop() == 0
    active = _segments(server.data_dir / "a-0")[-1]
    reason = _chattr("+i", active)
    if reason is not None:
        pytest.skip(reason)
    try:
        server = server_factory(server.data_dir, **QUIET).start()
        with server.client() as c:
            body = assert_problem(c.get("/v1/topics/a/partitions/0/records", params={"offset": 0}), 503, "partition_offline")
            assert body["topic"] == "a" and body["partition"] == 0 and active.name in body["reason"]
            assert_problem(c.post("/v1/topics/a/partitions/0/records", json={"records": [{"value": "x"}]}), 503, "partition_offline")
            assert_problem(c.get("/v1/topics/a/partitions/0/offsets", params={"timestamp": 0}), 503, "partition_offline")
            detail = c.get("/v1/topics/a").json()
            assert detail["partitions"][0]["offline"] is True and active.name in detail["partitions"][0]["error"]
            assert detail["partitions"][1]["high_watermark"] == 2 and "offline" not in detail["partitions"][1]
            assert _metric(c, "eventlog_partition_offline", topic="a", partition="0") == 1
            assert _metric(c, "eventlog_partition_offline", topic="a", partition="1") == 0
            # the other partitions serve
            assert [v for _, v in _read_all(c, "a", 1)] == ["a1", "a2"]
            assert _produce(c, "b", 0, ["b2"])["base_offset"] == 1
            assert [v for _, v in _read_all(c, "b")] == ["b1", "b2"]
            assert c.get("/readyz").status_code == 200
        assert server.stop() == 0
        assert server.log().count("partition a-0 is offline") == 1, server.log()
    finally:
        _chattr("-i", active)
    # once the file is writable again, the partition comes back with its records
    server = server_factory(server.data_dir, **QUIET).start()
    with server.client() as c:
        assert [v for _, v in _read_all(c, "a", 0)] == ["a1", "a2"]
        assert _produce(c, "a", 0, ["a3"])["base_offset"] == 2
    server.stop()
