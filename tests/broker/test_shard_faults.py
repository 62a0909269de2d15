"""Shard and server deaths under real Kafka clients (issue 25): a shard restart is a leader that
comes back. While an idempotent confluent-kafka producer (acks=all) writes steadily to a topic
whose partitions both shards lead, a SIGKILLed shard is started again by the supervisor, the
producer retries, and every record it was told is written is in the log exactly once; a SIGKILL
of shard 0 (the controller and every group's coordinator) also takes the groups' membership:
the members get UNKNOWN_MEMBER_ID or NOT_COORDINATOR, rejoin, and resume from the offsets they
committed, each record consumed once (tests/broker/test_groups.py's sense). A whole server
killed with a Produce request's records durable and its answer unsent (the crash point
kafka.produce.after_append) and started again on the same ports and data dir: the producer,
allowed to wait out the restart, retries that request, and its records stay once (the producer
state is rebuilt from the log).

Each test kills, so these servers are their own, never the shared one of conftest.py: one
family for the shard kills (the supervisor restarts what was killed; the family serves on),
a server per test for the crashes.
"""

from __future__ import annotations

import gc
import os
import signal
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.shards import owner_of
from tests.app.test_supervisor import _identity
from tests.conftest import ServerProcess, wait_until

from .conftest import SHARD_COUNTS, KafkaServer, start_kafka_server
from .group_member import NOT_IN_GROUP, Member
from .test_groups import (
    REFUSED_IN_REBALANCE,
    SteadyProducer,
    _committed_to_end,
    _group,
    _read_values,
    _shared_by,
    check_consumed_once,
)

pytestmark = pytest.mark.slow

PARTITIONS = 6
RATE_PER_S = 300  # fast enough that a kill meets batches in flight
# librdkafka retries a produce until message.timeout.ms: long enough to wait out a restart
RIDE_OUT = {"message.timeout.ms": 60_000, "retry.backoff.ms": 50, "retry.backoff.max.ms": 500,
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500}
# what a commit may fail with while the coordinator is down and after it is back (besides a
# rebalance's refusals): librdkafka's own errors for a coordinator it cannot reach or that went
# away with the commit unanswered, and the coordinator's for a member it no longer knows
COORDINATOR_GONE = {
    "NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS",
    "GROUP_ID_NOT_FOUND", "REQUEST_TIMED_OUT",
    # librdkafka's own
    "_TRANSPORT", "_WAIT_COORD", "_TIMED_OUT", "_NO_OFFSET", "_ASSIGNMENT_LOST",
    # kafka-python's and aiokafka's own (group_member.error_name)
    NOT_IN_GROUP, "KafkaConnectionError", "NodeNotReadyError", "KafkaTimeoutError",
}


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """A family of two with Kafka on, for the shard kills (the supervisor restarts each)."""
    server = start_kafka_server(tmp_path_factory.mktemp("shard-faults") / "data", 2)
    try:
        yield server
    finally:
        server.close()


def _shard_pids(server: ServerProcess) -> dict[int, int]:
    return {_identity(pid)["index"]: pid for pid in server.shard_pids()}


def _kill_shard(kafka: KafkaServer, index: int) -> None:
    """SIGKILL shard `index` and wait until the supervisor has it back; the other shard is
    never restarted."""
    server = kafka.server
    before = _shard_pids(server)
    back = server.log().count(" is back after restart ")
    os.kill(before[index], signal.SIGKILL)
    wait_until(
        lambda: server.log().count(" is back after restart ") > back, timeout=60, interval=0.1,
        what=f"shard {index} back after its SIGKILL",
    )
    after = _shard_pids(server)
    assert after[index] != before[index]
    assert {i: p for i, p in after.items() if i != index} == {
        i: p for i, p in before.items() if i != index
    }, "another shard was restarted"


def _drop_refused_sockets() -> None:
    """Collect the sockets kafka-python 3.0.12 leaves open when a connect is refused (the
    coordinator was down: kafka/net/inet.py sock_connect raises without closing its socket),
    without their ResourceWarning, which the suite makes an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def _topic_on_both_shards(kafka: KafkaServer) -> str:
    """A new topic whose partitions both shards lead. Created as a client does after a shard
    fault: a 503 `unavailable` (the last test's victim back, but its first heartbeats late on
    a loaded machine) is retried, anything else fails the test."""
    names = (f"t-{uuid.uuid4().hex[:12]}" for _ in range(20))
    name = next((n for n in names if {owner_of(n, p, 2) for p in range(PARTITIONS)} == {0, 1}),
                None)
    assert name is not None, "no topic name spread its partitions over both shards"
    body = {"name": name, "partitions": PARTITIONS}

    def created() -> bool:
        response = kafka.http.post("/v1/topics", json=body)
        if response.status_code == 503 and response.json().get("code") == "unavailable":
            return False
        # 409: an earlier try's 503 came after the topic was made (the name is fresh)
        assert response.status_code in (201, 409), response.text
        return True

    wait_until(created, timeout=30, interval=0.2, what=f"topic {name} created")
    return name


def _check_written_once(http: Any, topic: str, producer: SteadyProducer) -> dict:
    """Every record the producer was told is written is in the log once, and nothing else is
    (every record it sent was acknowledged: message.timeout.ms outlasts the fault). Returns
    the log ((partition, offset) -> value)."""
    assert producer.failed == [], producer.failed[:5]
    sent = [str(n) for n in range(producer.sent)]
    assert sorted(producer.acked, key=int) == sent
    log = _read_values(http, topic, PARTITIONS)
    twice = [v for v, n in Counter(log.values()).items() if n > 1]
    assert twice == [], f"{len(twice)} records written twice, e.g. {twice[:5]}"
    assert sorted(log.values(), key=int) == sent
    return log


def _acked_on(producer: SteadyProducer, shard: int, topic: str) -> int:
    """How many acknowledged records went to the partitions `shard` leads."""
    return sum(
        1 for v in list(producer.acked) if owner_of(topic, int(v) % PARTITIONS, 2) == shard
    )


@pytest.mark.parametrize("victim", [1, 0])
def test_an_idempotent_producer_writes_each_record_once_through_a_shard_kill(
    family: KafkaServer, victim: int
) -> None:
    """Shard 1 (a leader) or shard 0 (the leader of others, the controller, the coordinator)
    is SIGKILLed while records are produced to partitions of both; the producer carries on
    with the other shard's partitions, retries the victim's once it is back, and no record
    is lost or written twice."""
    topic = _topic_on_both_shards(family)
    producer = SteadyProducer(family.bootstrap, topic, PARTITIONS, rate=RATE_PER_S, **RIDE_OUT)
    try:
        wait_until(lambda: _acked_on(producer, victim, topic) >= 100, timeout=30,
                   what="records on the victim's partitions")
        survivor = 1 - victim
        before = _acked_on(producer, survivor, topic)
        _kill_shard(family, victim)
        assert _acked_on(producer, survivor, topic) > before, "the survivor's partitions waited"
        after = _acked_on(producer, victim, topic)
        wait_until(lambda: _acked_on(producer, victim, topic) >= after + 100, timeout=30,
                   what="records on the victim's partitions after its restart")
    finally:
        producer.stop()
    _check_written_once(family.http, topic, producer)


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python", "aiokafka"])
def test_a_group_rejoins_and_resumes_from_its_commits_through_a_coordinator_kill(
    family: KafkaServer, client: str
) -> None:
    """Two members (confluent-kafka, kafka-python or aiokafka) share a topic, committing each
    record, while records are produced; shard 0, their coordinator, is SIGKILLed: its groups'
    membership goes with it, the members rejoin once it is back (a new generation: the initial
    rebalance delay again), and read on from what they had committed: nothing lost, nothing
    delivered again that was committed, the committed offsets at the high watermarks in the
    end."""
    topic, group = _topic_on_both_shards(family), _group()
    bootstrap, http = family.bootstrap, family.http
    journal: list[dict[str, Any]] = []
    producer = SteadyProducer(bootstrap, topic, PARTITIONS, **RIDE_OUT)
    members: list[Member] = []
    try:
        members.append(Member(bootstrap, topic, group, "a", journal, client=client))
        members.append(Member(bootstrap, topic, group, "b", journal, client=client))
        wait_until(lambda: _shared_by(journal, {"a", "b"}), timeout=30, what="a and b sharing")
        before = len(journal)
        _kill_shard(family, 0)
        since = time.monotonic()

        def rejoined() -> bool:
            fresh = [e for e in journal[before:] if e["event"] == "assigned"]
            return {e["member"] for e in fresh} == {"a", "b"} and _shared_by(journal, {"a", "b"})

        wait_until(rejoined, timeout=60, what="a and b to rejoin and share again")
        wait_until(
            lambda: {e["member"] for e in journal[before:] if e["event"] == "committed"
                     and e["t"] > since} == {"a", "b"},
            timeout=30, what="both to commit again",
        )
        producer.stop()
        wait_until(
            lambda: _committed_to_end(http, group, topic), timeout=30,
            what="every record committed", interval=0.2,
        )
    finally:
        producer.stop()
        for member in members:
            member.close()
        _drop_refused_sockets()
    records = _check_written_once(http, topic, producer)
    check_consumed_once(journal, records, refusals=REFUSED_IN_REBALANCE | COORDINATOR_GONE)


@pytest.mark.parametrize("processes", SHARD_COUNTS, ids=lambda n: f"N={n}")
def test_an_idempotent_producer_rides_out_a_server_crash_and_restart(
    tmp_path: Path, processes: int
) -> None:
    """The server dies (SIGKILL, the whole family with it) right after the 40th Produce request
    made its records durable, before answering; started again on the same ports and data dir,
    it answers the producer's retry of that request with its first offsets, and every record
    is in the log once."""
    kafka = start_kafka_server(
        tmp_path / "data", processes, EVENTLOG_CRASH_AT="kafka.produce.after_append@40"
    )
    server = kafka.server
    topic = kafka.create_topic(f"crash-{processes}", PARTITIONS)
    producer = SteadyProducer(kafka.bootstrap, topic, PARTITIONS, **RIDE_OUT)
    restarted = None
    try:
        assert server.proc is not None
        assert server.proc.wait(60) == -9  # the crash point's SIGKILL
        crashed_at = len(producer.acked)
        kafka.http.close()
        server.stop()  # closes its log
        again = ServerProcess(
            server.data_dir, port=server.port, env={"EVENTLOG_KAFKA_PORT": str(kafka.kafka_port)},
            processes=processes,
        )
        again.start(timeout=60)
        restarted = KafkaServer(again, kafka.kafka_port, processes)
        wait_until(lambda: len(producer.acked) >= crashed_at + 100, timeout=60,
                   what="records acknowledged after the restart")
    finally:
        producer.stop()
    assert restarted is not None
    try:
        log = _check_written_once(restarted.http, topic, producer)
        assert len(log) > crashed_at
    finally:
        restarted.close()
