"""Consumer groups with real clients (issue 25), at N = 1 and N = 2: a group of three
confluent-kafka members that rebalances as members join, leave and die, with every record
consumed and committed once; kafka-python and aiokafka groups; and one set of groups for both
protocols: what a Kafka consumer commits is what GET /v1/groups shows, an HTTP commit is where a
Kafka consumer resumes, and the admin clients list, describe and delete the same groups.

"Consumed once" under at-least-once delivery, precisely (`check_consumed_once`): every record
is delivered to some member; no record is delivered after a commit covering it (a commit of its
offset or a later one on its partition) was answered; a record is delivered again only when the
member that had it died, or had a commit on that partition refused or unanswered after that
delivery (refused because a rebalance had begun: REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION,
UNKNOWN_MEMBER_ID); no record's own commit is answered twice; and at the end the group's
committed offset of each partition is its high watermark.

The coordinator waits Kafka's group.initial.rebalance.delay.ms (3 s) before a new group's
first generation, so every test that subscribes pays it once.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import pytest

from tests.conftest import REPO, wait_until

from .group_member import Member, spawn_args

PARTITIONS = 6
RATE_PER_S = 60  # records produced per second while the group changes
# why a commit may be refused while a rebalance is under way (the record is delivered again)
REFUSED_IN_REBALANCE = {"REBALANCE_IN_PROGRESS", "ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID"}


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:12]}"


class SteadyProducer:
    """An idempotent confluent-kafka producer writing unique values ("0", "1", ...) round robin
    over the partitions at `rate` records a second, in a thread, until stopped; `acked` holds
    the values the delivery callback confirmed, `failed` the errors it reported."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, rate: float = RATE_PER_S,
        **config: Any,
    ) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, **config,
        })
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.sent = 0
        self.acked: list[str] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self._thread.start()

    def _delivered(self, error: Any, message: Any) -> None:
        if error is None:
            self.acked.append(message.value().decode())
        else:
            self.failed.append(f"{message.value()!r}: {error}")

    def _run(self) -> None:
        while not self._stop.is_set():
            n = self.sent
            self.producer.produce(
                self.topic, value=str(n).encode(), partition=n % self.partitions,
                on_delivery=self._delivered,
            )
            self.sent += 1
            self.producer.poll(0)  # delivery reports
            time.sleep(1 / self.rate)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop producing and wait for every record's delivery report (once: later calls do
        nothing); the client is let go, so it stops connecting to a server the test ends."""
        if self.producer is None:
            return
        self._stop.set()
        self._thread.join(10)
        left = self.producer.flush(timeout)
        self.producer = None
        assert left == 0, f"{left} records not delivered within {timeout} s"


def _high_watermarks(http: Any, topic: str) -> dict[int, int]:
    response = http.get(f"/v1/topics/{topic}")
    assert response.status_code == 200, response.text
    return {p["partition"]: p["high_watermark"] for p in response.json()["partitions"]}


def _http_offsets(http: Any, group: str) -> dict[tuple[str, int], dict[str, Any]]:
    response = http.get(f"/v1/groups/{group}/offsets")
    assert response.status_code == 200, response.text
    return {(o["topic"], o["partition"]): o for o in response.json()["offsets"]}


def _committed_to_end(http: Any, group: str, topic: str) -> bool:
    ends = _high_watermarks(http, topic)
    offsets = _http_offsets(http, group)
    return all(offsets.get((topic, p), {}).get("offset") == end for p, end in ends.items())


def _read_values(http: Any, topic: str, partitions: int) -> dict[tuple[int, int], str]:
    """Every record of `topic` over HTTP: (partition, offset) -> value."""
    out = {}
    for p in range(partitions):
        offset = 0
        while True:
            page = http.get(
                f"/v1/topics/{topic}/partitions/{p}/records",
                params={"offset": offset, "max_records": 1000},
            ).json()
            for record in page["records"]:
                out[(p, record["offset"])] = record["value"]
            if not page["records"]:
                break
            offset = page["next_offset"]
    return out


# -- the journal of the members ----------------------------------------------------------------


def _assignments(journal: list[dict[str, Any]]) -> dict[str, frozenset[int]]:
    """Each member's current assignment, by its latest rebalance callback."""
    current: dict[str, frozenset[int]] = {}
    for entry in list(journal):
        if entry["event"] == "assigned":
            current[entry["member"]] = frozenset(entry["partitions"])
        elif entry["event"] in ("revoked", "lost", "closed", "killed"):
            current[entry["member"]] = frozenset()
    return current


def _shared_by(journal: list[dict[str, Any]], members: set[str]) -> bool:
    """Whether the partitions are split among exactly `members`, each with some, none twice (a
    rebalance has completed with them)."""
    current = _assignments(journal)
    held = [current.get(m, frozenset()) for m in members]
    others = [parts for m, parts in current.items() if m not in members and parts]
    return (
        not others and all(held) and sum(len(h) for h in held) == PARTITIONS
        and frozenset().union(*held) == frozenset(range(PARTITIONS))
    )


def _processed_by(journal: list[dict[str, Any]], member: str) -> int:
    return sum(1 for e in list(journal) if e["event"] == "processed" and e["member"] == member)


def check_consumed_once(
    journal: list[dict[str, Any]],
    records: dict[tuple[int, int], str],
    dead: Iterable[str] = (),
    refusals: Iterable[str] = REFUSED_IN_REBALANCE,
) -> Counter:
    """The module's "consumed once" (see its docstring) for `records` ((partition, offset) ->
    value, every record of the topic); `dead` are the members killed without closing,
    `refusals` the errors a commit may fail with. Returns why the records delivered twice
    were (a Counter of reasons)."""
    dead, refusals = set(dead), set(refusals)
    deliveries: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    answered: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    covered: dict[int, list[tuple[float, int]]] = defaultdict(list)  # partition: (t, offset)
    failed: dict[tuple[str, int], list[float]] = defaultdict(list)  # (member, partition): [t]
    for e in journal:
        key = (e.get("partition"), e.get("offset"))
        if e["event"] == "processed":
            assert records.get(key) == e["value"], f"{e} is not the record at {key}"
            deliveries[key].append(e)
        elif e["event"] == "committed":
            answered[key].append(e)
            covered[e["partition"]].append((e["t"], e["offset"]))
        elif e["event"] == "commit_failed":
            assert e["error"] in refusals, e
            failed[(e["member"], e["partition"])].append(e["t"])
        elif e["event"] == "error":
            raise AssertionError(f"a consumer reported an error: {e}")
    missing = sorted(set(records) - set(deliveries))
    assert not missing, f"{len(missing)} records never delivered, e.g. {missing[:5]}"
    # per partition: the highest offset an answered commit covered by each time
    high: dict[int, tuple[list[float], list[int]]] = {}
    for partition, commits in covered.items():
        commits.sort()
        times, most, top = [], [], -1
        for t, offset in commits:
            top = max(top, offset)
            times.append(t)
            most.append(top)
        high[partition] = (times, most)
    reasons: Counter = Counter()
    for (partition, offset), delivered in deliveries.items():
        commits = answered.get((partition, offset), [])
        assert len(commits) <= 1, f"{(partition, offset)} committed twice: {commits}"
        times, most = high.get(partition, ([], []))
        for d in delivered:
            i = bisect.bisect_left(times, d["t"])
            assert i == 0 or most[i - 1] < offset, (
                f"{d} delivered after a commit of offset {most[i - 1]} was answered"
            )
        delivered = sorted(delivered, key=lambda d: d["t"])
        for d, again in itertools.pairwise(delivered):
            # why the earlier delivery did not keep the record from coming again
            refused = [
                t for t in failed.get((d["member"], partition), []) if d["t"] <= t <= again["t"]
            ]
            if refused:
                reasons["a commit refused or unanswered"] += 1
            elif d["member"] in dead:
                reasons["its member died before the commit was answered"] += 1
            else:
                raise AssertionError(f"{(partition, offset)} delivered again ({again}) though "
                                     f"no commit of {d['member']} failed after {d}")
    return reasons


def _coordinator_saw(kafka_server: Any, group: str) -> dict[str, str]:
    """How the coordinator (its log) saw members of `group` go, by client id (a member id is
    the client id and a UUID): "left" (a LeaveGroup) or "session expired"."""
    log = kafka_server.server.log()
    member = r"(\w+)-[0-9a-f]{8}-[0-9a-f-]{27}"
    seen = {m: "left" for m in re.findall(rf"group {group}: \['{member}'\] left", log)}
    for m in re.findall(rf"group {group}: member {member}'s session expired", log):
        seen[m] = "session expired"
    return seen


class Spawned:
    """A member in a process of its own (tests/broker/group_member.py), its journal lines read
    into `journal` by a thread."""

    def __init__(
        self, journal: list[dict[str, Any]], bootstrap: str, topic: str, group: str, name: str
    ) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            spawn_args(bootstrap, topic, group, name), cwd=REPO, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )
        self._reader = threading.Thread(target=self._read, args=(journal,), daemon=True)
        self._reader.start()

    def _read(self, journal: list[dict[str, Any]]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            journal.append(json.loads(line))

    def kill(self, journal: list[dict[str, Any]]) -> None:
        """SIGKILL: no LeaveGroup, no commit in flight answered; journaled as "killed"."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        journal.append({"event": "killed", "member": self.name, "t": time.monotonic()})

    def end(self) -> None:
        """Kill the process if it still runs (a test that failed), read the rest of its
        journal and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.mark.slow
def test_a_group_of_three_rebalances_as_members_join_leave_and_die(kafka_server, new_topic):
    """a joins; b joins (rebalance); c, a process of its own, joins (rebalance); b leaves
    cleanly (LeaveGroup: a rebalance at once, well before a session timeout); c is SIGKILLed
    (its session expires: a takes its partitions). Records are produced all along."""
    topic, group = new_topic(PARTITIONS), _group()
    bootstrap, http = kafka_server.bootstrap, kafka_server.http
    journal: list[dict[str, Any]] = []
    producer = SteadyProducer(bootstrap, topic, PARTITIONS)
    members: list[Member] = []
    c = None
    try:
        members.append(Member(bootstrap, topic, group, "a", journal))
        wait_until(lambda: _shared_by(journal, {"a"}), timeout=30, what="a's assignment")
        members.append(Member(bootstrap, topic, group, "b", journal))
        wait_until(lambda: _shared_by(journal, {"a", "b"}), timeout=30, what="a and b sharing")
        c = Spawned(journal, bootstrap, topic, group, "c")
        wait_until(lambda: _shared_by(journal, {"a", "b", "c"}), timeout=30, what="a, b, c sharing")
        wait_until(lambda: _processed_by(journal, "c") >= 5, timeout=30, what="c to consume")
        members.pop().close()  # b
        wait_until(lambda: _shared_by(journal, {"a", "c"}), timeout=30, what="a and c sharing")
        wait_until(lambda: _processed_by(journal, "c") >= 10, timeout=30, what="c to consume")
        c.kill(journal)
        wait_until(lambda: _shared_by(journal, {"a"}), timeout=30, what="a taking c's partitions")
        # how each went, in the coordinator's words: b left, c's session expired
        assert _coordinator_saw(kafka_server, group) == {"b": "left", "c": "session expired"}
        producer.stop()
        wait_until(
            lambda: _committed_to_end(http, group, topic), timeout=30,
            what="every record committed", interval=0.2,
        )
    finally:
        producer.stop()
        for member in members:
            member.close()
        if c is not None:
            c.end()
    assert producer.failed == [], producer.failed[:5]
    records = _read_values(http, topic, PARTITIONS)
    assert sorted(records.values(), key=int) == [str(n) for n in range(producer.sent)]
    assert sorted(producer.acked, key=int) == [str(n) for n in range(producer.sent)]
    reasons = check_consumed_once(journal, records, dead={"c"})
    # c committed each record before taking the next: at most one was left in flight
    assert reasons["its member died before the commit was answered"] <= 1, reasons
    assert {e["member"] for e in journal if e["event"] == "committed"} == {"a", "b", "c"}


def _check_described(bootstrap: str, group: str, topic: str, members: set[str]) -> None:
    """Both admin clients describe `group` as Stable with `members` (by client id), the
    partitions split among them, and refuse to delete it (NON_EMPTY_GROUP)."""
    from confluent_kafka import ConsumerGroupState, KafkaException
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        described = admin.describe_groups([group])[group]
        assert described["group_state"] == "Stable" and described["protocol_type"] == "consumer"
        assert {m["client_id"] for m in described["members"]} == members
        split = [
            p for m in described["members"]
            for a in m["member_assignment"]["assigned_partitions"] if a["topic"] == topic
            for p in a["partitions"]
        ]
        assert sorted(split) == list(range(PARTITIONS)), described
        assert admin.delete_groups([group]) == {group: "NonEmptyGroupError"}
    finally:
        admin.close()
    confluent = AdminClient({"bootstrap.servers": bootstrap})
    d = confluent.describe_consumer_groups([group], request_timeout=10)[group].result()
    assert d.state == ConsumerGroupState.STABLE and not d.is_simple_consumer_group
    assert {m.client_id for m in d.members} == members
    split = [tp.partition for m in d.members for tp in m.assignment.topic_partitions]
    assert sorted(split) == list(range(PARTITIONS))
    with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
        confluent.delete_consumer_groups([group], request_timeout=10)[group].result()


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_a_group_of_two_rebalances_and_commits(kafka_server, new_topic, client: str) -> None:
    """a joins; b joins (rebalance; the admin clients describe both members and their
    partitions); b leaves (rebalance at once); records produced all along are each consumed
    and committed once."""
    topic, group = new_topic(PARTITIONS), _group()
    bootstrap, http = kafka_server.bootstrap, kafka_server.http
    journal: list[dict[str, Any]] = []
    producer = SteadyProducer(bootstrap, topic, PARTITIONS)
    members: list[Member] = []
    try:
        members.append(Member(bootstrap, topic, group, "a", journal, client=client))
        wait_until(lambda: _shared_by(journal, {"a"}), timeout=30, what="a's assignment")
        members.append(Member(bootstrap, topic, group, "b", journal, client=client))
        wait_until(lambda: _shared_by(journal, {"a", "b"}), timeout=30, what="a and b sharing")
        wait_until(lambda: _processed_by(journal, "b") >= 5, timeout=30, what="b to consume")
        _check_described(bootstrap, group, topic, {"a", "b"})
        members.pop().close()
        wait_until(lambda: _shared_by(journal, {"a"}), timeout=30, what="a taking b's partitions")
        assert _coordinator_saw(kafka_server, group) == {"b": "left"}
        producer.stop()
        wait_until(
            lambda: _committed_to_end(http, group, topic), timeout=30,
            what="every record committed", interval=0.2,
        )
    finally:
        producer.stop()
        for member in members:
            member.close()
    assert producer.failed == [], producer.failed[:5]
    records = _read_values(http, topic, PARTITIONS)
    assert sorted(records.values(), key=int) == [str(n) for n in range(producer.sent)]
    check_consumed_once(journal, records)
    assert {e["member"] for e in journal if e["event"] == "committed"} == {"a", "b"}


# -- one set of groups for both protocols ------------------------------------------------------


def _produce_http(http: Any, topic: str, counts: dict[int, int]) -> None:
    for p, n in counts.items():
        records = [{"value": f"{p}-{i}"} for i in range(n)]
        response = http.post(
            f"/v1/topics/{topic}/partitions/{p}/records", json={"records": records}
        )
        assert response.status_code == 200, response.text


def _http_commit(http: Any, group: str, offsets: list[dict[str, Any]]) -> None:
    response = http.post(f"/v1/groups/{group}/offsets", json={"offsets": offsets})
    assert response.status_code == 200, response.text


def _http_groups(http: Any) -> set[str]:
    response = http.get("/v1/groups", params={"limit": 10_000})
    assert response.status_code == 200, response.text
    return set(response.json()["groups"])


def test_offsets_kafka_clients_commit_show_over_http(kafka_server, new_topic) -> None:
    """A commit (with metadata) by confluent-kafka, kafka-python and aiokafka, each for a group
    of its own, is what GET /v1/groups and GET /v1/groups/{group}/offsets show."""
    import asyncio

    import aiokafka
    import confluent_kafka
    import kafka
    from kafka.structs import OffsetAndMetadata

    topic = new_topic(3)
    _produce_http(kafka_server.http, topic, {0: 5, 1: 5, 2: 5})
    bootstrap = kafka_server.bootstrap
    want = {0: (3, "c0"), 1: (5, ""), 2: (1, "two")}
    groups = {name: _group() for name in ("confluent-kafka", "kafka-python", "aiokafka")}

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": groups["confluent-kafka"]}
    )
    try:
        consumer.commit(
            offsets=[confluent_kafka.TopicPartition(topic, p, o, m) for p, (o, m) in want.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()
    kp = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=groups["kafka-python"],
                             enable_auto_commit=False, request_timeout_ms=10_000)
    try:
        kp.commit({kafka.TopicPartition(topic, p): OffsetAndMetadata(o, m, -1)
                   for p, (o, m) in want.items()})
    finally:
        kp.close()

    async def aio() -> None:
        c = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=groups["aiokafka"],
                                      enable_auto_commit=False)
        await c.start()
        try:
            parts = {p: aiokafka.TopicPartition(topic, p) for p in want}
            c.assign(list(parts.values()))  # aiokafka commits only what is assigned
            await c.commit({parts[p]: (o, m) for p, (o, m) in want.items()})
        finally:
            await c.stop()

    asyncio.run(aio())
    http = kafka_server.http
    assert set(groups.values()) <= _http_groups(http)
    for name, group in groups.items():
        # confluent-kafka-python sends a metadata string with its C terminator (py_to_c_parts:
        # metadata_size = strlen + 1), which a Kafka broker keeps too
        end = "\0" if name == "confluent-kafka" else ""
        shown = _http_offsets(http, group)
        assert {k: (o["offset"], o["metadata"]) for k, o in shown.items()} == {
            (topic, p): (o, m + end) for p, (o, m) in want.items()
        }, name


def test_an_http_commit_is_where_kafka_consumers_resume(kafka_server, new_topic) -> None:
    """Offsets committed over HTTP are what every client's OffsetFetch answers (committed(),
    the admin clients' group offsets), and where a consumer of the group starts reading.

    confluent-kafka is asked about a group committed without metadata: it reads a committed
    offset's metadata as a C string, past the bytes a broker sends when they hold no NUL
    terminator (librdkafka issue 4649), so its metadata is garbage after Kafka's too."""
    import asyncio

    import aiokafka
    import confluent_kafka
    import kafka
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient

    topic, group, plain = new_topic(3), _group(), _group()
    http, bootstrap = kafka_server.http, kafka_server.bootstrap
    _produce_http(http, topic, {0: 6, 1: 6, 2: 6})
    want = {0: (2, "batch 17"), 1: (5, ""), 2: (0, "x")}
    offsets = {p: o for p, (o, _m) in want.items()}
    _http_commit(http, group, [
        {"topic": topic, "partition": p, "offset": o, "metadata": m} for p, (o, m) in want.items()
    ])
    _http_commit(http, plain, [
        {"topic": topic, "partition": p, "offset": o} for p, o in offsets.items()
    ])

    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": plain, "enable.auto.commit": False,
        "auto.offset.reset": "error",  # a missing committed offset fails instead of guessing
    })
    try:
        parts = [confluent_kafka.TopicPartition(topic, p) for p in want]
        committed = consumer.committed(parts, timeout=10)
        assert {tp.partition: tp.offset for tp in committed} == offsets
        consumer.assign(parts)  # no offset: each partition from its committed one
        first: dict[int, Any] = {}
        deadline = time.monotonic() + 20
        while len(first) < len(want) and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is not None:
                assert m.error() is None, m.error()
                first.setdefault(m.partition(), (m.offset(), m.value().decode()))
        assert first == {p: (o, f"{p}-{o}") for p, o in offsets.items()}
    finally:
        consumer.close()
    confluent = AdminClient({"bootstrap.servers": bootstrap})  # held until its futures end
    result = confluent.list_consumer_group_offsets(
        [confluent_kafka.ConsumerGroupTopicPartitions(plain)], request_timeout=10
    )[plain].result()
    assert {tp.partition: tp.offset for tp in result.topic_partitions} == offsets

    kp = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, request_timeout_ms=10_000)
    try:
        for p, (o, m) in want.items():
            got = kp.committed(kafka.TopicPartition(topic, p), metadata=True)
            assert (got.offset, got.metadata) == (o, m)
    finally:
        kp.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        listed = admin.list_group_offsets(group)[group]
        assert {tp.partition: (om.offset, om.metadata) for tp, om in listed.items()} == want
    finally:
        admin.close()

    async def aio() -> dict[int, int]:
        c = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                      enable_auto_commit=False)
        await c.start()
        try:
            return {p: await c.committed(aiokafka.TopicPartition(topic, p)) for p in want}
        finally:
            await c.stop()

    assert asyncio.run(aio()) == offsets


def test_kcat_resumes_a_group_from_an_http_commit_and_commits_what_it_reads(
    kafka_server, new_topic
) -> None:
    """kcat -G (librdkafka's balanced consumer, auto-committing) starts each partition at the
    offset HTTP committed, reads to the end, and its commits are what HTTP shows after."""
    import shutil

    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed")
    topic, group = new_topic(3), _group()
    http = kafka_server.http
    _produce_http(http, topic, {0: 4, 1: 4, 2: 4})
    start = {0: 1, 1: 4, 2: 3}
    _http_commit(http, group, [
        {"topic": topic, "partition": p, "offset": o} for p, o in start.items()
    ])
    done = subprocess.run(
        ["kcat", "-b", kafka_server.bootstrap, "-G", group, "-e", "-q",
         "-f", "%p %o %s\\n", "-X", "auto.offset.reset=earliest",
         "-X", "session.timeout.ms=6000", topic],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    read = sorted(tuple(map(int, line.split()[:2])) for line in done.stdout.splitlines())
    assert read == [(p, o) for p, first in sorted(start.items()) for o in range(first, 4)]
    assert {p: o["offset"] for (_t, p), o in _http_offsets(http, group).items()} == {
        0: 4, 1: 4, 2: 4
    }


def test_an_http_offset_reset_is_refused_while_kafka_consumers_are_members(
    kafka_server, new_topic
) -> None:
    """POST /v1/groups/{group}/offsets/reset answers 409 group_not_empty while a kafka-python
    consumer is a member of the group (asked of shard 0's coordinator from every shard, as
    Kafka's tool refuses a group that is not inactive); a dry run is refused as well, and
    nothing is committed. Once the consumer leaves, the same reset is applied, and the
    consumer that joins next resumes from it."""
    import kafka

    topic = new_topic(2)
    http, bootstrap = kafka_server.http, kafka_server.bootstrap
    _produce_http(http, topic, {0: 4, 1: 4})
    group = _group()
    reset = {"topic": topic, "to_offset": 1}

    def consumer() -> Any:
        return kafka.KafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", request_timeout_ms=10_000, consumer_timeout_ms=500,
        )

    member = consumer()
    try:
        deadline, read = time.monotonic() + 30, 0
        while read < 8 and time.monotonic() < deadline:
            read += sum(map(len, member.poll(timeout_ms=200).values()))
        assert read == 8, "the consumer never joined its group and read its records"
        member.commit()
        before = _http_offsets(http, group)
        assert {k: o["offset"] for k, o in before.items()} == {(topic, 0): 4, (topic, 1): 4}
        for body in (reset, {**reset, "dry_run": True}):
            response = http.post(f"/v1/groups/{group}/offsets/reset", json=body)
            assert response.status_code == 409, response.text
            assert response.headers["content-type"].startswith("application/problem+json")
            problem = response.json()
            assert (problem["code"], problem["members"]) == ("group_not_empty", 1), problem
            assert problem["group_state"] == "Stable", problem
        assert _http_offsets(http, group) == before
    finally:
        member.close()  # leaves the group (LeaveGroup)
    wait_until(lambda: http.post(
        f"/v1/groups/{group}/offsets/reset", json={**reset, "dry_run": True}
    ).status_code == 200, timeout=15, interval=0.2)
    response = http.post(f"/v1/groups/{group}/offsets/reset", json=reset)
    assert response.status_code == 200, response.text
    assert {k: o["offset"] for k, o in _http_offsets(http, group).items()} == {
        (topic, 0): 1, (topic, 1): 1
    }
    again = consumer()
    try:
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + 30
        while len(seen) < 6 and time.monotonic() < deadline:
            for records in again.poll(timeout_ms=200).values():
                seen += [(r.partition, r.offset) for r in records]
        assert sorted(seen) == [(p, o) for p in (0, 1) for o in (1, 2, 3)]
    finally:
        again.close()


def test_the_admin_clients_list_describe_and_delete_groups_http_made(
    kafka_server, new_topic
) -> None:
    """Groups that have only offsets (committed over HTTP) are Empty to both admin clients:
    listed, described with no members; their offsets deleted per partition (OffsetDelete) and
    whole (DeleteGroups), which HTTP sees at once."""
    import confluent_kafka
    import kafka.errors
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient

    topic = new_topic(2)
    http, bootstrap = kafka_server.http, kafka_server.bootstrap
    g1, g2 = _group(), _group()
    for group in (g1, g2):
        _http_commit(http, group, [
            {"topic": topic, "partition": p, "offset": 0} for p in range(2)
        ])
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    confluent = AdminClient({"bootstrap.servers": bootstrap})
    try:
        listed = {g["group_id"]: g for g in admin.list_groups()}
        for group in (g1, g2):
            assert listed[group]["group_state"] == "Empty", listed[group]
        described = admin.describe_groups([g1])[g1]
        assert (described["group_state"], described["members"]) == ("Empty", [])
        valid = confluent.list_consumer_groups(request_timeout=10).result().valid
        states = {g.group_id: g.state for g in valid}
        assert states[g1] == states[g2] == ConsumerGroupState.EMPTY
        d = confluent.describe_consumer_groups([g2], request_timeout=10)[g2].result()
        assert (d.state, d.members) == (ConsumerGroupState.EMPTY, [])

        # OffsetDelete of one partition (kafka-python); the other stays
        deleted = admin.delete_group_offsets(g1, [kafka_tp(topic, 0)])
        assert deleted == {kafka_tp(topic, 0): kafka.errors.NoError}, deleted
        assert set(_http_offsets(http, g1)) == {(topic, 1)}
        # DeleteGroups: kafka-python for g1, confluent-kafka for g2
        assert admin.delete_groups([g1]) == {g1: "OK"}
        confluent.delete_consumer_groups([g2], request_timeout=10)[g2].result()
        assert _http_offsets(http, g1) == {} and _http_offsets(http, g2) == {}
        assert not {g1, g2} & _http_groups(http)
        listed = {g["group_id"] for g in admin.list_groups()}
        assert not {g1, g2} & listed
        assert admin.delete_groups([g1]) == {g1: "GroupIdNotFoundError"}
        # a group with neither members nor offsets is not found (Kafka's OffsetDelete)
        with pytest.raises(kafka.errors.GroupIdNotFoundError):
            admin.delete_group_offsets(g1, [kafka_tp(topic, 1)])
        with pytest.raises(confluent_kafka.KafkaException, match="GROUP_ID_NOT_FOUND"):
            confluent.delete_consumer_groups([g2], request_timeout=10)[g2].result()
    finally:
        admin.close()


def kafka_tp(topic: str, partition: int) -> Any:
    from kafka.structs import TopicPartition

    return TopicPartition(topic, partition)
