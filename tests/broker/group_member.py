"""Group members that commit each record after processing it, journaling what they do, so a
test can tell which records were delivered, to whom, and which were committed. A confluent-kafka
(librdkafka) member runs in a thread of the test (`Member`) or as a process of its own
(`spawn_args`, run as `python -m tests.broker.group_member`: the one a test kills with SIGKILL,
so that its session expires with whatever it had not committed); kafka-python and aiokafka
members run in a thread (`Member(..., client="kafka-python" | "aiokafka")`). A member whose
commit fails does what an at-least-once application does: it drops the rest of what it polled
and reads it again from the failed record on (`rewind`), so a refused commit never leaves a
record behind.

Each journal entry is a dict: {"event": "assigned" | "revoked" | "lost" | "processed" |
"committed" | "commit_failed" | "error" | "closed", "member": name, "t": time.monotonic() (one
clock for every process of the machine), ...}: "assigned"/"revoked"/"lost" carry "partitions",
"processed"/"committed"/"commit_failed" carry "partition", "offset", "value" (and "error" for a
failed commit, the Kafka error's name). A record is "processed" before its commit is sent and
"committed" once the commit is answered without error: a member that dies between the two left
it uncommitted, and the group delivers it again to the member that takes its partition over.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

SESSION_TIMEOUT_MS = 6000  # the coordinator's group.min.session.timeout.ms: the smallest allowed
HEARTBEAT_INTERVAL_MS = 1000

Emit = Callable[[dict[str, Any]], None]


def consumer_config(bootstrap: str, group: str, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": name,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        "fetch.wait.max.ms": 100,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        **extra,
    }


def run(
    bootstrap: str, topic: str, group: str, name: str, emit: Emit, stop: threading.Event,
    **extra: Any,
) -> None:
    """Consume `topic` in `group` until `stop` is set, committing each record synchronously
    after it is processed; then close (a clean LeaveGroup)."""
    from confluent_kafka import Consumer, KafkaException

    note = _noter(emit, name)

    consumer = Consumer(consumer_config(bootstrap, group, name, **extra))
    consumer.subscribe(
        [topic],
        on_assign=lambda _c, parts: note("assigned", partitions=[p.partition for p in parts]),
        on_revoke=lambda _c, parts: note("revoked", partitions=[p.partition for p in parts]),
        on_lost=lambda _c, parts: note("lost", partitions=[p.partition for p in parts]),
    )
    try:
        while not stop.is_set():
            message = consumer.poll(0.1)
            if message is None:
                continue
            if message.error() is not None:
                note("error", error=message.error().name())
                continue
            record = {
                "partition": message.partition(), "offset": message.offset(),
                "value": message.value().decode(),
            }
            note("processed", **record)
            try:
                consumer.commit(message=message, asynchronous=False)
            except KafkaException as exc:
                note("commit_failed", error=exc.args[0].name(), **record)
            else:
                note("committed", **record)
    finally:
        consumer.close()
        note("closed")


def _noter(emit: Emit, name: str) -> Callable[..., None]:
    def note(event: str, **fields: Any) -> None:
        emit({"event": event, "member": name, "t": time.monotonic(), **fields})

    return note


def run_kafka_python(
    bootstrap: str, topic: str, group: str, name: str, emit: Emit, stop: threading.Event,
    **extra: Any,
) -> None:
    """`run` with kafka-python's KafkaConsumer (its heartbeats in a thread of its own)."""
    from kafka import KafkaConsumer
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata, TopicPartition

    note = _noter(emit, name)

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            note("revoked", partitions=sorted(tp.partition for tp in revoked))

        def on_partitions_assigned(self, assigned: Any) -> None:
            note("assigned", partitions=sorted(tp.partition for tp in assigned))

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, client_id=name,
        auto_offset_reset="earliest", enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        fetch_max_wait_ms=100, request_timeout_ms=30_000, **extra,
    )
    consumer.subscribe([topic], listener=Listener())
    try:
        while not stop.is_set():
            batch = [(tp, m) for tp, ms in consumer.poll(timeout_ms=100).items() for m in ms]
            for i, (tp, m) in enumerate(batch):
                record = {"partition": tp.partition, "offset": m.offset, "value": m.value.decode()}
                note("processed", **record)
                offsets = {TopicPartition(topic, tp.partition):
                           OffsetAndMetadata(m.offset + 1, "", -1)}
                try:
                    consumer.commit(offsets)
                except KafkaError as exc:
                    note("commit_failed", error=error_name(exc), **record)
                    rewind(consumer.seek, batch[i:], (KafkaError, AssertionError))
                    break
                note("committed", **record)
    finally:
        consumer.close()
        note("closed")


def rewind(seek: Callable[[Any, int], None], rest: list[tuple[Any, Any]], gone: Any) -> None:
    """After a failed commit, what an at-least-once application does with the rest of a polled
    batch: nothing, and it reads it again: each partition's position goes back to its first
    record not committed (the one whose commit failed, in its partition). A partition no longer
    assigned (`gone` is raised) is read by its new owner from the committed offset."""
    first: dict[Any, int] = {}
    for tp, m in rest:
        first.setdefault(tp, m.offset)
    for tp, offset in first.items():
        try:
            seek(tp, offset)
        except gone:
            pass


NOT_IN_GROUP = "NOT_IN_GROUP"  # the client refused to commit: it knows it left the generation


def error_name(exc: BaseException) -> str:
    """The Kafka error a kafka-python or aiokafka exception stands for (its `message`, Kafka's
    name): CommitFailedError wraps the coordinator's answer (kafka-python as its argument,
    aiokafka as its cause); without one the client refused the commit itself."""
    for error in (exc, exc.__cause__, *exc.args):
        name = getattr(error, "message", None)
        if isinstance(error, BaseException) and getattr(error, "errno", None) and name:
            return str(name)
    if "not part of an active group" in str(exc):
        return NOT_IN_GROUP
    return type(exc).__name__  # the client's own: a connection refused, a timeout


def run_aiokafka(
    bootstrap: str, topic: str, group: str, name: str, emit: Emit, stop: threading.Event,
    **extra: Any,
) -> None:
    """`run` with aiokafka's AIOKafkaConsumer, on an event loop of this thread's own."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
    from aiokafka.errors import KafkaError

    note = _noter(emit, name)

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            note("revoked", partitions=sorted(tp.partition for tp in revoked))

        async def on_partitions_assigned(self, assigned: Any) -> None:
            note("assigned", partitions=sorted(tp.partition for tp in assigned))

    async def main() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, client_id=name,
            auto_offset_reset="earliest", enable_auto_commit=False,
            session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            fetch_max_wait_ms=100, **extra,
        )
        consumer.subscribe([topic], listener=Listener())
        await consumer.start()
        try:
            while not stop.is_set():
                polled = await consumer.getmany(timeout_ms=100)
                batch = [(tp, m) for tp, ms in polled.items() for m in ms]
                for i, (tp, m) in enumerate(batch):
                    record = {"partition": tp.partition, "offset": m.offset,
                              "value": m.value.decode()}
                    note("processed", **record)
                    offsets = {TopicPartition(topic, tp.partition): m.offset + 1}
                    try:
                        await consumer.commit(offsets)
                    except KafkaError as exc:
                        note("commit_failed", error=error_name(exc), **record)
                        rewind(consumer.seek, batch[i:], (KafkaError, AssertionError))
                        break
                    note("committed", **record)
        finally:
            await consumer.stop()
            note("closed")

    asyncio.run(main())


RUNNERS = {"confluent-kafka": run, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}


class Member:
    """A member in a thread of this process (confluent-kafka's `run` unless `client` names
    another), journaling into `journal` (a shared list)."""

    def __init__(
        self, bootstrap: str, topic: str, group: str, name: str, journal: list[dict[str, Any]],
        client: str = "confluent-kafka", **extra: Any,
    ) -> None:
        self.name = name
        self._stop = threading.Event()
        args = (bootstrap, topic, group, name, journal.append, self._stop)
        self._thread = threading.Thread(
            target=RUNNERS[client], args=args, kwargs=extra, name=f"member-{name}", daemon=True,
        )
        self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stop consuming and leave the group (consumer.close sends LeaveGroup)."""
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"member {self.name} did not close"


def spawn_args(bootstrap: str, topic: str, group: str, name: str, **extra: Any) -> list[str]:
    """The command line of a member run as a process of its own (journal lines on stdout; it
    stops and leaves when its stdin closes)."""
    spec = {"bootstrap": bootstrap, "topic": topic, "group": group, "name": name, "extra": extra}
    return [sys.executable, "-m", "tests.broker.group_member", json.dumps(spec)]


def _main() -> None:
    spec = json.loads(sys.argv[1])
    stop = threading.Event()
    lock = threading.Lock()

    def emit(entry: dict[str, Any]) -> None:
        with lock:
            sys.stdout.write(json.dumps(entry) + "\n")
            sys.stdout.flush()

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    run(spec["bootstrap"], spec["topic"], spec["group"], spec["name"], emit, stop, **spec["extra"])


if __name__ == "__main__":
    _main()
