"""A shard family seen from outside (`eventlog serve --processes 2`): what one process did,
the family does, whichever shard each connection reaches."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.conftest import ServerProcess


def _samples(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def test_every_connection_sees_one_server(tmp_path) -> None:
    server = ServerProcess(tmp_path / "data", processes=2).start()
    try:
        assert len(server.shard_pids()) == 2
        with server.client() as c:
            assert c.post("/v1/topics", json={"name": "f", "partitions": 4}).status_code == 201
        produced = 0
        for i in range(24):  # a new connection each time: the kernel spreads them over the shards
            with httpx.Client(base_url=server.url, timeout=30) as c:
                r = c.post("/v1/topics/f/records", json={"records": [{"key": f"k{i}-{j}", "value": "v"} for j in range(5)]})
                assert r.status_code == 200, r.text
                produced += 5
                for o in r.json()["offsets"]:  # readable at once, on this shard too
                    f = c.get(f"/v1/topics/f/partitions/{o['partition']}/records", params={"offset": o["offset"], "max_records": 1})
                    assert f.json()["records"][0]["offset"] == o["offset"]
        with httpx.Client(base_url=server.url, timeout=30) as c:
            text = c.get("/metrics").text
            detail = c.get("/v1/topics/f").json()
        # /metrics is the family's: every record counted once, every partition's gauge once
        assert _samples(text, "eventlog_produce_records_total")['topic="f"'] == produced
        hw = {k: v for k, v in _samples(text, "eventlog_partition_high_watermark").items() if 'topic="f"' in k}
        assert len(hw) == 4 and sum(hw.values()) == produced
        assert sum(p["high_watermark"] for p in detail["partitions"]) == produced
        in_flight = re.search(r"^eventlog_http_requests_in_flight (\S+)$", text, re.M)
        assert in_flight is not None and float(in_flight.group(1)) >= 1  # this scrape, on some shard
    finally:
        assert server.stop() == 0, server.log()


@pytest.mark.serial  # a rate between one and two shards' quota: a loaded machine sends slower
def test_a_quota_is_the_familys_whichever_shards_the_connections_reach(tmp_path) -> None:
    """50 kB/s of produce for the (anonymous) principal; 80 kB sent within a second over new
    connections, about half to each shard: neither shard alone sees its quota passed, the
    family does, and answers 429 `quota_exceeded`."""
    env = {"EVENTLOG_QUOTA_PRODUCE_BYTES_PER_SEC": "50000", "EVENTLOG_QUOTA_WINDOW_NUM": "2",
           "EVENTLOG_QUOTA_WINDOW_SIZE_MS": "1000", "EVENTLOG_ACCESS_LOG": "false"}
    server = ServerProcess(tmp_path / "data", processes=2, env=env).start()
    try:
        with server.client() as c:
            assert c.post("/v1/topics", json={"name": "q", "partitions": 2}).status_code == 201
        body = {"records": [{"value": "x" * 1900}]}
        statuses = []
        for _ in range(40):
            with httpx.Client(base_url=server.url, timeout=30) as c:
                statuses.append(c.post("/v1/topics/q/records", json=body).status_code)
        assert set(statuses) <= {200, 429}
        assert 429 in statuses, statuses
    finally:
        assert server.stop() == 0, server.log()
