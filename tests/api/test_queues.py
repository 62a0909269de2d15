"""Queues over HTTP (api/queues.py): the contract in docs/API.md, "Queues", end to end, and what
an acknowledgement is worth after a SIGKILL; at N = 2 too (marked `shards`: each partition's
window on its owner shard, engine/shard_queues.py), and a family with one owner down."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from engine.shards import owner_of

from ..conftest import wait_until
from .test_api import assert_problem
from .test_queue_kills import _shard_pid

pytestmark = pytest.mark.shards

Q = "/v1/topics/jobs/queues/work"


def setup(c: httpx.Client, partitions: int = 1, **settings: object) -> None:
    assert c.post("/v1/topics", json={"name": "jobs", "partitions": partitions}).status_code == 201
    r = c.put(Q, json=settings)
    assert r.status_code == 201, r.text


def produce(c: httpx.Client, records: list[dict]) -> None:
    r = c.post("/v1/topics/jobs/records", json={"records": records})
    assert r.status_code == 200, r.text


def lease(c: httpx.Client, **body: object) -> list[dict]:
    r = c.post(Q + "/lease", json=body)
    assert r.status_code == 200, r.text
    return r.json()["records"]


def settle(c: httpx.Client, action: str, leases: list[str], **extra: object) -> list[str]:
    r = c.post(f"{Q}/{action}", json={"leases": leases, **extra})
    assert r.status_code == 200, r.text
    assert [x["lease"] for x in r.json()["results"]] == leases
    return [x["status"] for x in r.json()["results"]]


def test_create_describe_list_delete_and_the_errors(app_server) -> None:
    with app_server.client() as c:
        assert_problem(c.put(Q, json={}), 404, "topic_not_found")
        setup(c, lock_ms=1000, ordering="key", start={"timestamp": 0})
        again = c.put(Q, json={"lock_ms": 1000, "ordering": "key", "start": {"timestamp": 0}})
        assert again.status_code == 200
        assert again.json()["start"] == {"timestamp": 0}
        assert_problem(c.put(Q, json={"lock_ms": 2000}), 409, "queue_exists")
        assert_problem(c.put(Q, json={"ordering": "random"}), 422, "validation_error")
        assert_problem(c.put(Q, json={"lock_ms": "1000"}), 422, "validation_error")
        assert_problem(c.put(Q + "x", json={"dead_letter_topic": "nope"}), 404, "topic_not_found")
        assert_problem(c.put("/v1/topics/jobs/queues/bad%20name", json={}), 400, "invalid_request")
        d = c.get(Q).json()
        assert (d["topic"], d["queue"], d["lock_ms"], d["max_deliveries"], d["ordering"]) == (
            "jobs",
            "work",
            1000,
            5,
            "key",
        )
        assert [p["partition"] for p in d["partitions"]] == [0]
        assert c.get("/v1/topics/jobs/queues").json() == {"queues": ["work"]}
        assert c.delete(Q).status_code == 204
        assert_problem(c.get(Q), 404, "queue_not_found")
        assert_problem(c.post(Q + "/lease", json={}), 404, "queue_not_found")
        assert c.get("/v1/topics/jobs/queues").json() == {"queues": []}


def test_lease_ack_release_reject_renew_and_dead_letters(app_server) -> None:
    with app_server.client() as c:
        assert c.post("/v1/topics", json={"name": "dead"}).status_code == 201
        setup(c, lock_ms=300, max_deliveries=2, dead_letter_topic="dead")
        produce(
            c,
            [
                {"key": f"k{i}", "value": f'{{"n":{i}}}', "headers": [{"key": "h", "value": "7"}]}
                for i in range(4)
            ],
        )
        got = lease(c, max_records=3)
        assert [(r["offset"], r["delivery_count"]) for r in got] == [(0, 1), (1, 1), (2, 1)]
        assert got[0]["value"] == '{"n":0}' and got[0]["headers"] == [{"key": "h", "value": "7"}]
        assert got[0]["lease_expires_at"] > time.time() * 1000
        r = c.post(Q + "/lease", params={"value_format": "json"}, json={"max_records": 1})
        assert r.json()["records"][0]["value"] == {"n": 3}
        assert settle(c, "ack", [got[0]["lease"], "bogus"]) == ["acked", "unknown"]
        assert settle(c, "ack", [got[0]["lease"]]) == ["expired"]  # settled: no longer held
        assert settle(c, "reject", [got[1]["lease"]]) == ["rejected"]
        assert settle(c, "renew", [got[2]["lease"]], lock_ms=5000) == ["renewed"]
        assert settle(c, "release", [r.json()["records"][0]["lease"]], delay_ms=0) == ["released"]
        [back] = lease(c, max_records=5)  # offset 3, released; offset 2 is renewed
        assert (back["offset"], back["delivery_count"]) == (3, 2)
        time.sleep(0.4)  # its lock runs out: with max_deliveries 2 it is dead-lettered
        assert lease(c, max_records=5) == []
        assert settle(c, "ack", [back["lease"]]) == ["expired"]
        dead = c.get("/v1/topics/dead/partitions/0/records").json()["records"]
        reasons = {d["key"]: {h["key"]: h["value"] for h in d["headers"]} for d in dead}
        assert reasons["k1"] == {
            "h": "7",
            "eventlog.source.topic": "jobs",
            "eventlog.source.partition": "0",
            "eventlog.source.offset": "1",
            "eventlog.delivery.count": "1",
            "eventlog.dead.reason": "rejected",
            "eventlog.source.queue": "work",
        }
        assert reasons["k3"]["eventlog.dead.reason"] == "max_deliveries"
        assert reasons["k3"]["eventlog.delivery.count"] == "2"
        p = c.get(Q).json()["partitions"][0]
        assert (p["start_offset"], p["leased"], p["acked"], p["dead_lettered"], p["lag"]) == (
            2,
            1,
            1,
            2,
            1,
        )


def test_a_lease_long_polls_until_a_record_arrives(app_server) -> None:
    with app_server.client() as c:
        setup(c, partitions=2)
        timer = threading.Timer(0.3, lambda: produce(c, [{"value": "late", "partition": 1}]))
        timer.start()
        started = time.monotonic()
        try:
            got = lease(c, max_records=10, wait_ms=10_000)
        finally:
            timer.join()
        assert [(r["partition"], r["value"]) for r in got] == [(1, "late")]
        assert time.monotonic() - started < 5
        started = time.monotonic()
        assert lease(c, wait_ms=200) == []
        assert time.monotonic() - started >= 0.2


def test_a_long_poll_wakes_when_a_record_comes_back(app_server) -> None:
    """A release wakes a long-poll at once, whichever shard it waits on (at N = 2 the record's
    window is on its partition's owner: another shard's long-poll is woken by its queue_back
    note, not by its once-a-second look). Each try on a new connection, so both shards' turn
    comes."""
    with app_server.client() as c:
        setup(c, lock_ms=60_000, max_deliveries=100)
        produce(c, [{"value": "job"}])
    for _try in range(6):
        with app_server.client() as holder, app_server.client() as waiter:
            held = lease(holder, max_records=1)
            assert len(held) == 1
            out: list[tuple[float, list[dict]]] = []

            def poll(waiter: httpx.Client = waiter, out: list = out) -> None:
                started = time.monotonic()
                got = lease(waiter, max_records=1, wait_ms=10_000)
                out.append((time.monotonic() - started, got))

            thread = threading.Thread(target=poll)
            thread.start()
            time.sleep(0.3)  # (the long-poll is waiting)
            assert settle(holder, "release", [held[0]["lease"]]) == ["released"]
            thread.join(timeout=15)
            took, got = out[0]
            assert [r["value"] for r in got] == ["job"], (_try, took)
            assert took < 0.3 + 0.6, took  # (not the 1 s look)
            assert settle(waiter, "release", [got[0]["lease"]]) == ["released"]


def test_an_ack_survives_a_sigkill_and_unacked_records_come_back_counted(server_factory) -> None:
    server = server_factory().start()
    with server.client() as c:
        setup(c, lock_ms=60_000)
        produce(c, [{"value": f"job {i}"} for i in range(4)])
        got = lease(c, max_records=4)
        assert settle(c, "ack", [got[1]["lease"], got[2]["lease"]]) == ["acked", "acked"]
    server.kill()
    server.start()
    with server.client() as c:
        got = lease(c, max_records=10)
        # the acknowledged records never come back; the others do, their deliveries counted
        assert [(r["offset"], r["delivery_count"]) for r in got] == [(0, 2), (3, 2)]
        p = c.get(Q).json()["partitions"][0]
        assert (p["start_offset"], p["acked"], p["leased"]) == (0, 2, 2)
        assert settle(c, "ack", [r["lease"] for r in got]) == ["acked", "acked"]
        assert c.get(Q).json()["partitions"][0]["start_offset"] == 4
    server.stop()


def test_metrics_show_each_queue(app_server) -> None:
    """eventlog_queue_* per (topic, queue): what GET on the queue reports, summed over its
    partitions."""
    with app_server.client() as c:
        setup(c, partitions=2, max_deliveries=1)
        produce(c, [{"value": f"v{i}", "partition": i % 2} for i in range(6)])
        leased = lease(c, max_records=4)
        assert len(leased) == 4
        assert settle(c, "ack", [r["lease"] for r in leased[:2]]) == ["acked", "acked"]
        assert settle(c, "reject", [leased[2]["lease"]]) == ["rejected"]
        text = c.get("/metrics").text

    def value(name: str) -> float:
        prefix = f'{name}{{queue="work",topic="jobs"}}'
        line = next(x for x in text.splitlines() if x.startswith(prefix))
        return float(line.rsplit(" ", 1)[1])

    assert value("eventlog_queue_acked_total") == 2
    assert value("eventlog_queue_dead_lettered_total") == 1
    assert value("eventlog_queue_leased") == 1
    assert value("eventlog_queue_available") == 2
    assert value("eventlog_queue_lag") == 3
    # the oldest unsettled record was produced in this test, just now
    assert 0 <= value("eventlog_queue_oldest_unacked_age_seconds") < 60


def test_a_family_with_an_owner_down_leases_and_settles_the_others(server_factory) -> None:
    """N = 2, each partition's window on its owner shard: one lease gathers records of both
    shards' partitions. With shard 1 down (killed, and kept down: its supervisor stopped), a
    describe says its partitions are offline, a lease goes on from shard 0's, and an ack of
    leases of both answers 503 having acknowledged shard 0's (durable: once shard 1 is back, a
    retry finds them expired and they never come back; shard 1's come back, counted)."""
    server = server_factory()
    server.processes = 2
    server.start(timeout=60)
    assert server.proc is not None
    owners = {p: owner_of("jobs", p, 2) for p in range(4)}
    assert set(owners.values()) == {0, 1}
    with server.client() as c:
        setup(c, partitions=4, lock_ms=60_000)
        produce(c, [{"value": f"v{p}", "partition": p} for p in range(4)])
        got = lease(c, max_records=10)  # (the shard it reaches has two of them: the rest asked)
        assert sorted(r["partition"] for r in got) == [0, 1, 2, 3]
        produce(c, [{"value": f"w{p}", "partition": p} for p in range(4)])
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        os.kill(_shard_pid(server, 1), signal.SIGKILL)
        with server.client() as c:  # (a new connection: shard 0 alone accepts now)
            def offline() -> bool:
                parts = c.get(Q).json()["partitions"]
                return [bool(p.get("offline")) for p in parts] == [owners[p] == 1 for p in range(4)]

            wait_until(offline, timeout=10, what="shard 1's partitions offline")
            more = lease(c, max_records=4)
            assert sorted(r["partition"] for r in more) == [p for p in range(4) if owners[p] == 0]
            r = c.post(Q + "/ack", json={"leases": [x["lease"] for x in got]})
            assert_problem(r, 503, "unavailable")
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    wait_until(lambda: "is back after restart 1" in server.log(), timeout=60, what="shard 1 back")
    with server.client() as c:
        assert settle(c, "ack", [x["lease"] for x in got]) == ["expired"] * 4
        parts = c.get(Q).json()["partitions"]
        assert [p["acked"] for p in parts] == [1 - owners[p] for p in range(4)]
        again = lease(c, max_records=10)
        back = sorted((r["partition"], r["value"], r["delivery_count"]) for r in again)
        assert back == sorted(
            [(p, f"v{p}", 2) for p in range(4) if owners[p] == 1]
            + [(p, f"w{p}", 1) for p in range(4) if owners[p] == 1]
        )
    assert server.stop() == 0
