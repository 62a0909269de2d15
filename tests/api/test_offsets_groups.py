"""Offsets, time lookups, delete-records, segments, consumer-group offsets, SSE, metrics."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from ..conftest import wait_until
from .test_api import assert_problem, in_flight

# the paths between shards (forwarded appends, shard 0's groups): again at N = 2 (Makefile)
pytestmark = pytest.mark.shards


@pytest.fixture
def client(app_server):
    with app_server.client() as c:
        yield c


def produce(client: httpx.Client, topic: str, values: list[str], partition: int = 0, ts0: int | None = None) -> list[dict]:
    records = [{"value": v, "partition": partition} | ({"timestamp": ts0 + i} if ts0 is not None else {}) for i, v in enumerate(values)]
    r = client.post(f"/v1/topics/{topic}/records", json={"records": records})
    assert r.status_code == 200, r.text
    return r.json()["offsets"]


def test_list_offsets_by_spec_and_time(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t"})
    url = "/v1/topics/t/partitions/0/offsets"
    assert client.get(url).json() == {"log_start_offset": 0, "high_watermark": 0, "log_end_offset": 0, "offset": None, "timestamp": None}
    assert client.get(url, params={"spec": "max_timestamp"}).json()["offset"] is None
    produce(client, "t", ["a", "b", "c"], ts0=1000)
    produce(client, "t", ["d"], ts0=500)  # timestamps need not grow
    assert client.get(url, params={"timestamp": 1001}).json() | {} == {"log_start_offset": 0, "high_watermark": 4, "log_end_offset": 4, "offset": 1, "timestamp": 1001}
    assert client.get(url, params={"timestamp": 0}).json()["offset"] == 0
    assert client.get(url, params={"timestamp": 1003}).json()["offset"] is None
    assert client.get(url, params={"spec": "earliest"}).json()["offset"] == 0
    assert client.get(url, params={"spec": "latest"}).json()["offset"] == 4
    got = client.get(url, params={"spec": "max_timestamp"}).json()
    assert (got["offset"], got["timestamp"]) == (2, 1002)
    assert_problem(client.get(url, params={"spec": "sometime"}), 422, "validation_error")
    assert_problem(client.get(url, params={"timestamp": 1, "spec": "latest"}), 422, "validation_error")
    assert_problem(client.get(url, params={"timestamp": -5}), 422, "validation_error")
    assert_problem(client.get("/v1/topics/t/partitions/3/offsets"), 404, "partition_not_found")


def test_delete_records_and_segments(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t", "configs": {"segment.bytes": 200}})
    for i in range(6):
        produce(client, "t", [f"value-{i}" * 5])
    segments = client.get("/v1/topics/t/partitions/0/segments").json()["segments"]
    assert len(segments) >= 3 and segments[-1]["active"] and not segments[0]["active"]
    assert segments[0]["base_offset"] == 0 and segments[0]["first_timestamp"] > 0
    url = "/v1/topics/t/partitions/0/delete-records"
    assert client.post(url, json={"before_offset": 4}).json() == {"log_start_offset": 4}
    assert client.post(url, json={"before_offset": 2}).json() == {"log_start_offset": 4}
    assert_problem(client.post(url, json={"before_offset": 7}), 416, "offset_out_of_range")
    assert_problem(client.post(url, json={"before_offset": -3}), 422, "validation_error")
    assert_problem(client.get("/v1/topics/t/partitions/0/records", params={"offset": 3}), 416, "offset_out_of_range")
    got = client.get("/v1/topics/t/partitions/0/records").json()
    assert [r["offset"] for r in got["records"]] == [4, 5] and got["log_start_offset"] == 4
    assert client.post(url, json={"before_offset": -1}).json() == {"log_start_offset": 6}


def test_group_offsets(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 2})
    client.post("/v1/topics", json={"name": "u"})
    body = {"offsets": [{"topic": "t", "partition": 0, "offset": 5, "metadata": "m"}, {"topic": "u", "partition": 0, "offset": 1}]}
    r = client.post("/v1/groups/g1/offsets", json=body)
    assert r.status_code == 200
    assert [(o["topic"], o["offset"]) for o in r.json()["offsets"]] == [("t", 5), ("u", 1)]
    got = client.get("/v1/groups/g1/offsets").json()
    assert got["group"] == "g1"
    assert [(o["topic"], o["partition"], o["offset"], o["metadata"]) for o in got["offsets"]] == [("t", 0, 5, "m"), ("u", 0, 1, "")]
    assert all(o["commit_timestamp"] > 0 for o in got["offsets"])
    assert [o["topic"] for o in client.get("/v1/groups/g1/offsets", params={"topic": "u"}).json()["offsets"]] == ["u"]
    assert client.get("/v1/groups/nobody/offsets").json() == {"group": "nobody", "offsets": []}
    assert client.get("/v1/groups").json() == {"groups": ["g1"], "next_after": None}
    assert_problem(client.post("/v1/groups/g1/offsets", json={"offsets": [{"topic": "nope", "partition": 0, "offset": 1}]}), 404, "topic_not_found")
    assert_problem(client.post("/v1/groups/g1/offsets", json={"offsets": [{"topic": "t", "partition": 9, "offset": 1}]}), 404, "partition_not_found")
    assert_problem(client.post("/v1/groups/g1/offsets", json={"offsets": [{"topic": "t", "partition": 0, "offset": -1}]}), 422, "validation_error")
    assert_problem(client.post("/v1/groups/g1/offsets", json={"offsets": []}), 422, "validation_error")
    assert client.delete("/v1/groups/g1/offsets", params={"topic": "u"}).status_code == 204
    assert [o["topic"] for o in client.get("/v1/groups/g1/offsets").json()["offsets"]] == ["t"]
    client.delete("/v1/topics/t")  # a deleted topic takes its committed offsets with it
    assert client.get("/v1/groups/g1/offsets").json()["offsets"] == []


def test_groups_are_listed_a_page_at_a_time(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t"})
    names = [f"g{i:02d}" for i in range(25)]
    for g in reversed(names):
        commit = {"offsets": [{"topic": "t", "partition": 0, "offset": 1}]}
        assert client.post(f"/v1/groups/{g}/offsets", json=commit).status_code == 200
    assert client.get("/v1/groups").json() == {"groups": names, "next_after": None}
    pages, after = [], None
    while True:
        got = client.get("/v1/groups", params={"limit": 10} | ({"after": after} if after else {}))
        assert got.status_code == 200
        pages.append(got.json()["groups"])
        after = got.json()["next_after"]
        if after is None:
            break
        assert after == pages[-1][-1]
    assert pages == [names[:10], names[10:20], names[20:]]
    # exactly the last page: no cursor; a cursor that names no group; past the end
    assert client.get("/v1/groups", params={"limit": 5, "after": "g19"}).json() == {
        "groups": names[20:], "next_after": None
    }
    assert client.get("/v1/groups", params={"limit": 2, "after": "g03x"}).json() == {
        "groups": ["g04", "g05"], "next_after": "g05"
    }
    past = client.get("/v1/groups", params={"after": "h"}).json()
    assert past == {"groups": [], "next_after": None}
    too_long = "g" * 250  # no group id is longer than 249 characters
    for bad in ({"limit": 0}, {"limit": 10_001}, {"after": ""}, {"after": too_long}):
        assert_problem(client.get("/v1/groups", params=bad), 422, "validation_error")
    assert_problem(client.get("/v1/groups", params={"limit": "x"}), 422, "validation_error")


def _reset(client: httpx.Client, group: str, **body: object) -> httpx.Response:
    return client.post(f"/v1/groups/{group}/offsets/reset", json=body)


def _plan(response: httpx.Response) -> dict[tuple[str, int], tuple[int | None, int]]:
    assert response.status_code == 200, response.text
    offsets = response.json()["offsets"]
    return {(o["topic"], o["partition"]): (o["previous_offset"], o["offset"]) for o in offsets}


def _committed(client: httpx.Client, group: str) -> dict[tuple[str, int], int]:
    offsets = client.get(f"/v1/groups/{group}/offsets").json()["offsets"]
    return {(o["topic"], o["partition"]): o["offset"] for o in offsets}


def test_group_offsets_reset_as_kafkas_tool_does(client: httpx.Client) -> None:
    """Each of kafka-consumer-groups.sh's strategies (--to-earliest, --to-latest, --to-datetime,
    --to-offset, --shift-by) over a topic, chosen partitions or all of the group's topics;
    targets outside [log start, high watermark] are moved into it; --dry-run commits nothing."""
    client.post("/v1/topics", json={"name": "t", "partitions": 3})
    client.post("/v1/topics", json={"name": "u"})
    for p in range(3):
        produce(client, "t", [f"v{i}" for i in range(10)], partition=p, ts0=1_000_000 + 100 * p)
    produce(client, "u", ["a", "b"])
    client.post("/v1/topics/t/partitions/1/delete-records", json={"before_offset": 2})
    commit = {"offsets": [
        {"topic": "t", "partition": 0, "offset": 5}, {"topic": "u", "partition": 0, "offset": 1}
    ]}
    assert client.post("/v1/groups/g/offsets", json=commit).status_code == 200

    dry = _reset(client, "g", topic="t", to_earliest=True, dry_run=True)
    assert _plan(dry) == {("t", 0): (5, 0), ("t", 1): (None, 2), ("t", 2): (None, 0)}
    assert dry.json()["dry_run"] is True and dry.json()["group"] == "g"
    assert _committed(client, "g") == {("t", 0): 5, ("u", 0): 1}  # a dry run commits nothing

    assert _plan(_reset(client, "g", topic="t", partitions=[1, 2], to_latest=True)) == {
        ("t", 1): (None, 10), ("t", 2): (None, 10)
    }
    assert _committed(client, "g") == {("t", 0): 5, ("t", 1): 10, ("t", 2): 10, ("u", 0): 1}
    # to_datetime: the first record at or after the time; none there: the high watermark
    at = "1970-01-01T00:16:40.103Z"  # 1,000,103 ms: after all of p0, offset 3 of p1, before p2
    assert _plan(_reset(client, "g", topic="t", to_datetime=at)) == {
        ("t", 0): (5, 10), ("t", 1): (10, 3), ("t", 2): (10, 0)
    }
    later = "1970-01-01T01:16:40.103+01:00"  # the same instant as above, in another zone
    again = _reset(client, "g", topic="t", partitions=[1], to_datetime=later, dry_run=True)
    assert _plan(again) == {("t", 1): (3, 3)}
    # a time before the log start offset's record: the log start offset
    early = "1970-01-01T00:00:00Z"
    first = _reset(client, "g", topic="t", partitions=[1], to_datetime=early, dry_run=True)
    assert _plan(first) == {("t", 1): (3, 2)}
    assert _plan(_reset(client, "g", topic="t", to_datetime="1970-01-01T00:16:40.205")) == {
        ("t", 0): (10, 10), ("t", 1): (3, 10), ("t", 2): (0, 5)
    }
    assert _plan(_reset(client, "g", topic="t", to_datetime="2999-01-01T00:00:00")) == {
        ("t", 0): (10, 10), ("t", 1): (10, 10), ("t", 2): (5, 10)
    }
    # to_offset and shift_by are held within [log start offset, high watermark]
    assert _plan(_reset(client, "g", topic="t", to_offset=1)) == {
        ("t", 0): (10, 1), ("t", 1): (10, 2), ("t", 2): (10, 1)
    }
    assert _plan(_reset(client, "g", topic="t", to_offset=99, partitions=[0])) == {
        ("t", 0): (1, 10)
    }
    assert _plan(_reset(client, "g", all_topics=True, shift_by=-4)) == {
        ("t", 0): (10, 6), ("t", 1): (2, 2), ("t", 2): (1, 0), ("u", 0): (1, 0)
    }
    assert _plan(_reset(client, "g", all_topics=True, shift_by=3)) == {
        ("t", 0): (6, 9), ("t", 1): (2, 5), ("t", 2): (0, 3), ("u", 0): (0, 2)
    }
    assert _committed(client, "g") == {("t", 0): 9, ("t", 1): 5, ("t", 2): 3, ("u", 0): 2}
    got = client.get("/v1/groups/g/offsets").json()["offsets"]
    assert all(o["commit_timestamp"] > 0 and o["metadata"] == "" for o in got)

    # shift_by needs a committed offset on every partition it resets (Kafka: "no current
    # committed offset"); nothing is committed when one lacks it
    client.post("/v1/topics", json={"name": "w", "partitions": 2})
    one = {"offsets": [{"topic": "w", "partition": 0, "offset": 0}]}
    client.post("/v1/groups/h/offsets", json=one)
    body = assert_problem(_reset(client, "h", topic="w", shift_by=1), 400, "invalid_request")
    assert "w-1" in body["detail"]
    assert _committed(client, "h") == {("w", 0): 0}
    # an unknown group with all_topics has nothing to reset
    assert _plan(_reset(client, "nobody", all_topics=True, to_earliest=True)) == {}
    assert client.get("/v1/groups/nobody/offsets").json()["offsets"] == []

    assert_problem(_reset(client, "g", topic="nope", to_earliest=True), 404, "topic_not_found")
    missing = _reset(client, "g", topic="t", partitions=[7], to_earliest=True)
    assert_problem(missing, 404, "partition_not_found")
    for bad in (
        {"topic": "t"},  # no strategy
        {"topic": "t", "to_earliest": True, "to_latest": True},  # two
        {"to_earliest": True},  # no scope
        {"topic": "t", "all_topics": True, "to_earliest": True},  # two
        {"all_topics": True, "partitions": [0], "to_earliest": True},
        {"topic": "t", "partitions": [-1], "to_earliest": True},
        {"topic": "t", "to_offset": -1},
        {"topic": "t", "to_offset": "3"},
        {"topic": "t", "to_datetime": "yesterday"},
        {"topic": "t", "to_earliest": True, "execute": True},
    ):
        assert_problem(client.post("/v1/groups/g/offsets/reset", json=bad), 422, "validation_error")
    assert _committed(client, "g") == {("t", 0): 9, ("t", 1): 5, ("t", 2): 3, ("u", 0): 2}


def test_group_offsets_survive_restart(app_factory) -> None:
    server = app_factory().start()
    with server.client() as c:
        c.post("/v1/topics", json={"name": "t"})
        c.post("/v1/groups/g/offsets", json={"offsets": [{"topic": "t", "partition": 0, "offset": 42}]})
    assert server.stop() == 0
    again = app_factory(server.data_dir).start()
    with again.client() as c:
        assert c.get("/v1/groups/g/offsets").json()["offsets"][0]["offset"] == 42
        assert [t["name"] for t in c.get("/v1/topics", params={"internal": True}).json()["topics"]] == ["__consumer_offsets", "__metadata", "t"]
    again.stop()


def _sse_events(lines: Iterator[str], count: int, timeout: float = 20) -> list[dict]:
    """Parse server-sent events from a response's iter_lines() until `count` record events
    arrived (the iterator may be handed in again for the next ones)."""
    import orjson

    events, current = [], {}
    deadline = time.monotonic() + timeout
    for line in lines:
        assert time.monotonic() < deadline
        if not line:
            if current.get("event") in ("record", "error"):
                events.append(current)
                if len(events) >= count or current["event"] == "error":
                    return events
            current = {}
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(": ")
            current[name] = orjson.loads(value) if name == "data" else value
    return events


def test_sse_stream_delivers_records_in_order_and_tails(any_server_factory) -> None:
    server = any_server_factory().start()
    with server.client() as client:
        client.post("/v1/topics", json={"name": "s"})
        produce(client, "s", [f"v{i}" for i in range(5)])

        def later() -> None:
            with server.client() as c:
                for i in range(5, 305, 100):
                    produce(c, "s", [f"v{j}" for j in range(i, i + 100)])

        with server.client() as streaming:
            with streaming.stream("GET", "/v1/topics/s/partitions/0/records/stream", params={"offset": 2}) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                lines = response.iter_lines()
                events = _sse_events(lines, 3)  # all the log holds: from here on the stream tails it
                producer = threading.Thread(target=later)
                producer.start()
                events += _sse_events(lines, 300)
                producer.join(30)
        assert [int(e["id"]) for e in events] == list(range(2, 305))
        assert [e["data"]["value"] for e in events] == [f"v{i}" for i in range(2, 305)]
        # resume after a reconnect: Last-Event-ID wins over offset
        with server.client() as streaming:
            with streaming.stream("GET", "/v1/topics/s/partitions/0/records/stream", headers={"Last-Event-ID": "300"}) as response:
                assert [int(e["id"]) for e in _sse_events(response.iter_lines(), 4)] == [301, 302, 303, 304]
        assert_problem(client.get("/v1/topics/s/partitions/0/records/stream", params={"offset": 999}), 416, "offset_out_of_range")
    assert server.stop() == 0


def test_sse_reports_undecodable_values_as_an_error_event(app_server) -> None:
    with app_server.client() as client:
        client.post("/v1/topics", json={"name": "b"})
        client.post("/v1/topics/b/records", json={"value_format": "base64", "records": [{"value": "/w=="}]})
        with client.stream("GET", "/v1/topics/b/partitions/0/records/stream", params={"offset": 0}) as response:
            events = _sse_events(response.iter_lines(), 1)
        assert events[0]["event"] == "error" and events[0]["data"]["code"] == "not_utf8"


def test_shutdown_releases_long_polls_and_streams(server_factory) -> None:
    server = server_factory().start()
    with server.client() as c:
        c.post("/v1/topics", json={"name": "t"})
    outcomes = []

    def long_poll() -> None:
        with server.client() as c:
            outcomes.append(c.get("/v1/topics/t/partitions/0/records", params={"offset": 0, "max_wait_ms": 120_000}).status_code)

    def stream() -> None:
        with server.client() as c, c.stream("GET", "/v1/topics/t/partitions/0/records/stream") as response:
            for _ in response.iter_lines():
                pass
            outcomes.append("stream ended")

    threads = [threading.Thread(target=long_poll), threading.Thread(target=stream)]
    for t in threads:
        t.start()
    with server.client() as c:
        wait_until(lambda: in_flight(c) == 3, what="the long-poll and the stream being in flight")  # and the scrape
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 10  # not the 120 s of the long-poll, nor the 30 s grace
    for t in threads:
        t.join(10)
    assert sorted(map(str, outcomes)) == ["200", "stream ended"]


def test_metrics_count_requests_records_commits_and_fsyncs(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "m", "partitions": 2})
    produce(client, "m", ["x"] * 10)
    client.get("/v1/topics/m/partitions/0/records")
    client.get("/v1/topics/nope")
    text = client.get("/metrics").text
    assert 'eventlog_http_requests_total{method="POST",route="/v1/topics/{topic}/records",status="200"} 1.0' in text
    assert 'eventlog_http_requests_total{method="GET",route="/v1/topics/{topic}",status="404"} 1.0' in text
    assert 'eventlog_produce_records_total{topic="m"} 10.0' in text
    assert 'eventlog_fetch_records_total{topic="m"} 10.0' in text
    assert 'eventlog_partition_high_watermark{partition="0",topic="m"} 10.0' in text
    assert 'eventlog_partition_log_start_offset{partition="1",topic="m"} 0.0' in text
    assert "eventlog_fsync_seconds_bucket" in text and "eventlog_group_commit_requests_count" in text
    assert "eventlog_http_request_duration_seconds_bucket" in text
    assert "\neventlog_http_requests_in_flight 1.0\n" in text  # the scrape itself


def test_request_body_limit(any_server_factory) -> None:
    server = any_server_factory(EVENTLOG_MAX_REQUEST_BYTES="2000").start()
    with server.client() as c:
        c.post("/v1/topics", json={"name": "t"})
        body = {"records": [{"value": "x" * 3000}]}
        assert_problem(c.post("/v1/topics/t/records", json=body), 413, "request_too_large")

        def chunks():
            yield b'{"records": [{"value": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}]}'

        r = c.post("/v1/topics/t/records", content=chunks(), headers={"content-type": "application/json"})
        assert_problem(r, 413, "request_too_large")
        assert c.get("/v1/topics/t").json()["partitions"][0]["high_watermark"] == 0
    server.stop()
