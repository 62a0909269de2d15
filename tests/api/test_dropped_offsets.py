"""Reads across offsets recovery dropped say so (issue 23): a batch damaged in the middle of a
closed segment is dropped at the next start; a fetch, raw fetch, per-key read or event stream
that covers its offsets names them (header Eventlog-Dropped-Offsets, field `dropped`, SSE
event `dropped`), one that does not is unchanged, and the record survives restarts
(dropped-offsets-checkpoint, shown by dump-log). Runs against a shard family too
(EVENTLOG_TEST_PROCESSES=2): every shard reads the owner's record."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.dump import run_dump
from engine.checkpoints import RECOVERY_POINT, read_checkpoint, write_checkpoint
from engine.dropped import DROPPED_OFFSETS
from engine.log_dirs import CLEAN_SHUTDOWN_FILE

from .test_damaged_files import QUIET, SEGMENT_BYTES, _batches, _flip, _segments

# the paths between shards (forwarded appends, shard 0's groups): again at N = 2 (Makefile)
pytestmark = pytest.mark.shards

HEADER = "Eventlog-Dropped-Offsets"
FETCH = "/v1/topics/t/partitions/0/records"
RAW = {"accept": "application/vnd.kafka.record-batch.v2"}


def _fill(c: httpx.Client) -> list[tuple[int, str]]:
    """500 acknowledged records in 50 batches of 10, each with a key of its own, over several
    segments of one partition."""
    assert c.post("/v1/topics", json={"name": "t", "configs": {"segment.bytes": SEGMENT_BYTES}}).status_code == 201
    written = []
    for i in range(50):
        records = [{"key": f"k{i * 10 + j:04d}", "value": f"record-{i * 10 + j:04d}-" + "x" * 20} for j in range(10)]
        r = c.post(FETCH, json={"records": records})
        assert r.status_code == 200, r.text
        written += [(r.json()["base_offset"] + j, rec["value"]) for j, rec in enumerate(records)]
    assert [o for o, _ in written] == list(range(500))
    return written


def _as_after_a_crash(data: Path) -> None:
    """No clean-shutdown marker, and t-0's recovery point 0 (no checkpoint since it was made):
    the next start scans every segment of t-0."""
    (data / CLEAN_SHUTDOWN_FILE).unlink()
    entries = read_checkpoint(data / RECOVERY_POINT)
    entries[("t", 0)] = 0
    write_checkpoint(data / RECOVERY_POINT, entries)


def _stream_text(c: httpx.Client, path: str, params: dict, until: str) -> str:
    text = ""
    with c.stream("GET", path, params=params) as s:
        for chunk in s.iter_text():
            text += chunk
            if until in text:
                break
    return text


def test_reads_across_offsets_recovery_dropped_say_so(app_factory, capsys: pytest.CaptureFixture[str]) -> None:
    server = app_factory(**QUIET).start()
    with server.client() as c:
        written = _fill(c)
    assert server.stop() == 0
    data = server.data_dir
    directory = data / "t-0"
    segments = _segments(directory)
    assert len(segments) >= 4
    victim = segments[1]
    batch = _batches(victim)[1]  # a batch in the middle of a closed segment
    first, last = batch.base_offset, batch.last_offset
    assert _batches(victim)[-1].last_offset > last
    _flip(victim, batch.position + 70)  # its CRC fails; its header is whole
    _as_after_a_crash(data)
    kept = [w for w in written if not first <= w[0] <= last]
    named = f"{first}-{last}"

    for start in range(2):  # the recovery that drops it, then a clean restart that scans nothing
        server = app_factory(data, **QUIET).start()
        with server.client() as c:
            # a fetch across the dropped batch names exactly its offsets
            r = c.get(FETCH, params={"offset": 0, "max_records": 10_000})
            assert r.status_code == 200, r.text
            assert [(x["offset"], x["value"]) for x in r.json()["records"]] == kept
            assert r.headers[HEADER] == named and r.json()["dropped"] == [{"first": first, "last": last}]
            # one that stops before it, or starts after it, has neither
            for params in ({"offset": 0, "max_records": first - 10}, {"offset": last + 1}):
                r = c.get(FETCH, params=params)
                assert r.status_code == 200 and r.json()["records"], r.text
                assert HEADER not in r.headers and "dropped" not in r.json(), params
            # one whose next_offset steps over it says so, though its last record is before it
            r = c.get(FETCH, params={"offset": 0, "max_records": first})
            assert r.json()["records"][-1]["offset"] == first - 1 and r.json()["next_offset"] == last + 1
            assert r.headers[HEADER] == named
            # one that starts inside it names the part it covered
            r = c.get(FETCH, params={"offset": first + 3, "max_records": 1})
            assert r.json()["records"][0]["offset"] == last + 1
            assert r.headers[HEADER] == f"{first + 3}-{last}" and r.json()["dropped"] == [{"first": first + 3, "last": last}]
            # a raw fetch says so in its header
            r = c.get(FETCH, params={"offset": first}, headers=RAW)
            assert r.status_code == 200 and r.content and r.headers[HEADER] == named
            r = c.get(FETCH, params={"offset": last + 1}, headers=RAW)
            assert r.status_code == 200 and HEADER not in r.headers
            # a key whose only record was dropped: no records, and the read says why
            r = c.get(f"/v1/topics/t/keys/k{first + 2:04d}/records")
            assert r.status_code == 200, r.text
            assert r.json()["records"] == [] and r.json()["latest_offset"] == -1
            assert r.json()["dropped"] == [{"first": first, "last": last}] and r.headers[HEADER] == named
            # a key read after it is unchanged
            r = c.get(f"/v1/topics/t/keys/k{last + 1:04d}/records", params={"offset": last + 1})
            assert [x["offset"] for x in r.json()["records"]] == [last + 1]
            assert "dropped" not in r.json() and HEADER not in r.headers
            # an event stream tells its reader before the records after the gap
            text = _stream_text(c, FETCH + "/stream", {"offset": first}, f"id: {last + 1}\n")
            assert f'event: dropped\ndata: {{"first":{first},"last":{last}}}\n\n' in text, text
            assert text.index("event: dropped") < text.index(f"id: {last + 1}\n")
            text = _stream_text(c, f"/v1/topics/t/keys/k{first:04d}/records/stream", {"offset": 0}, "event: dropped")
            assert f'"first":{first},"last":{last}' in text, text
        for _ in range(6):  # new connections: in a shard family, they reach either shard
            with server.client() as c:
                r = c.get(FETCH, params={"offset": first - 1, "max_records": 2})
                assert r.headers[HEADER] == named and r.json()["dropped"] == [{"first": first, "last": last}]
        assert server.stop() == 0
        assert (directory / DROPPED_OFFSETS).read_text() == f"0\n1\n{first} {last}\n", start

    # dump-log shows it, after the segment that held it and in the record itself
    capsys.readouterr()
    assert run_dump([victim, directory / DROPPED_OFFSETS], verify=True, records=False, values=False) == 0
    out = capsys.readouterr().out
    assert f"Offsets recovery dropped ({DROPPED_OFFSETS}): {named}" in out
    assert f"dropped offsets: {named} ({last - first + 1} offsets)" in out
    assert run_dump([segments[0]], verify=False, records=False, values=False) == 0
    assert "recovery dropped" not in capsys.readouterr().out
