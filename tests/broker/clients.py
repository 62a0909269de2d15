"""The real Kafka clients, each behind one small interface, so every test runs the same records
through each of them: kafka-python, aiokafka, confluent-kafka (librdkafka), kcat (librdkafka
again, from Debian, through its command line) and KafkaJS (tests/broker/js/client.js).

    client.produce(bootstrap, topic, records, codec, sasl=None, **config) -> [(partition, offset)]
                                                    (offset None where the client does not say)
    client.consume(bootstrap, topic, counts, sasl=None) -> [Rec], by partition then offset

`records` are `Rec`s with their partition (each client's own partitioner is not under test
here); `counts` is {partition: how many records to read from offset 0}. A consume reads
without a consumer group (partitions assigned by hand; the group APIs are not served yet).
Every call is bounded by TIMEOUT_S, so a listener that does not answer fails a test quickly.

What a client cannot do is a property of the client (`codecs`, `text_only`, `per_partition_headers`,
`sets_timestamps`); `records_for` builds a record set within it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

TIMEOUT_S = 20.0
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
JS_DIR = Path(__file__).resolve().parent / "js"


class ClientError(Exception):
    """A client's call failed; `kind` is the Kafka error's name where the client gives one
    (TOPIC_AUTHORIZATION_FAILED, SASL_AUTHENTICATION_FAILED, ...), else the client's own
    error's, spelled the same way (kafka-python's KafkaTimeoutError: KAFKA_TIMEOUT)."""

    def __init__(self, kind: str, detail: str) -> None:
        inner = re.search(r"\[Error -?\d+\] (\w+)", detail)
        if kind == "KafkaError" and inner:  # kafka-python's "Unexpected error in ...Response"
            kind = inner.group(1)
        self.kind = kafka_name(kind)
        super().__init__(f"{self.kind}: {detail}")


def kafka_name(name: str) -> str:
    """TOPIC_AUTHORIZATION_FAILED from kafka-python's and aiokafka's
    TopicAuthorizationFailedError as from librdkafka's and KafkaJS's own spelling."""
    if "_" in name or name.isupper():
        return name.upper()
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name.removesuffix("Error")).upper()


@dataclass(frozen=True)
class Rec:
    """One record as produced or consumed; offset None until it has one, timestamp None for
    the producer's clock, partition None (produce only) for the client's partitioner's choice."""

    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None
    offset: int | None = None


def records_for(
    client: Client, codec: str, partitions: int = 3, per_partition: int = 3
) -> list[Rec]:
    """Records that exercise keys, values, headers, a null key, a tombstone (null value),
    binary bytes and a compressible value in every partition (so each partition's batch is
    worth compressing: clients send a batch uncompressed when compressing does not shrink it),
    within what `client` can send."""
    now = int(time.time() * 1000)
    out = []
    for i in range(partitions * per_partition):
        p = i % partitions
        key: bytes | None = f"key-{i}".encode()
        value: bytes | None = f"value {i} of {codec}, ünïcode".encode()
        if i == 1:
            key = None
        if i == 2:
            value = None  # a tombstone
        if i == 4 and not client.text_only:
            key, value = bytes([0, 255, 10, 9]), bytes(range(256))
        if i >= partitions * (per_partition - 1):
            value = (f"record {i} " * 200).encode()  # compressible, in every partition
        if client.per_partition_headers:
            headers: tuple[tuple[str, bytes], ...] = (
                ("partition", str(p).encode()),
                ("empty", b""),
            )
        else:
            headers = (("trace", f"t-{i}".encode()), ("empty", b"")) if i % 2 == 0 else ()
        if i == 5 and not client.text_only:
            headers = (("bytes", bytes([0, 255])),)
        stamp = now - 1000 * (partitions * per_partition - i) if client.sets_timestamps else None
        out.append(Rec(p, key, value, headers, stamp))
    return out


def expected(records: list[Rec]) -> list[Rec]:
    """`records` with the offsets a new topic gives them, by partition then offset."""
    next_offset: dict[int, int] = {}
    out = []
    for r in records:
        offset = next_offset.get(r.partition, 0)
        next_offset[r.partition] = offset + 1
        out.append(replace(r, offset=offset))
    return sorted(out, key=lambda r: (r.partition, r.offset))


def counts_of(records: list[Rec]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for r in records:
        counts[r.partition] = counts.get(r.partition, 0) + 1
    return counts


class Client:
    name = ""
    codecs: tuple[str, ...] = CODECS
    text_only = False  # keys and values must be UTF-8 text without tabs or newlines
    per_partition_headers = False  # every record of a partition gets the same headers
    sets_timestamps = True  # the producer can give each record its timestamp
    reports_offsets = True  # produce answers each record's offset (else None)

    def missing(self) -> str | None:
        """Why this client cannot run here (the test skips with it), or None."""
        return None

    def produce(
        self,
        bootstrap: str,
        topic: str,
        records: list[Rec],
        codec: str,
        sasl: tuple[str, str] | None = None,
        **config: Any,
    ) -> list[tuple[int, int]]:
        raise NotImplementedError

    def consume(
        self,
        bootstrap: str,
        topic: str,
        counts: dict[int, int],
        sasl: tuple[str, str] | None = None,
    ) -> list[Rec]:
        raise NotImplementedError

    def list_topics(
        self, bootstrap: str, sasl: tuple[str, str] | None = None, timeout_s: float = 5.0
    ) -> set[str]:
        """The topics a Metadata request for all of them lists (those the principal may
        describe), within about `timeout_s` (how long a client that cannot connect tries)."""
        raise NotImplementedError


def _sorted(records: list[Rec]) -> list[Rec]:
    return sorted(records, key=lambda r: (r.partition, r.offset))


def _done(got: dict[int, int], counts: dict[int, int]) -> bool:
    return all(got.get(p, 0) >= n for p, n in counts.items())


class KafkaPython(Client):
    name = "kafka-python"

    @staticmethod
    def _sasl(sasl: tuple[str, str] | None) -> dict[str, Any]:
        if sasl is None:
            return {}
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": sasl[0],
            "sasl_plain_password": sasl[1],
        }

    def produce(self, bootstrap, topic, records, codec, sasl=None, **config):
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            compression_type=None if codec == "none" else codec,
            linger_ms=50,
            acks="all",
            request_timeout_ms=10_000,
            max_block_ms=10_000,
            retries=2,
            **self._sasl(sasl),
            **config,
        )
        try:
            futures = [
                producer.send(
                    topic,
                    key=r.key,
                    value=r.value,
                    headers=list(r.headers),
                    partition=r.partition,
                    timestamp_ms=r.timestamp,
                )
                for r in records
            ]
            producer.flush(timeout=TIMEOUT_S)
            sent = [f.get(timeout=TIMEOUT_S) for f in futures]
            return [(m.partition, m.offset) for m in sent]
        except KafkaError as exc:
            raise ClientError(type(exc).__name__, str(exc)) from exc
        finally:
            producer.close(timeout=5)

    def consume(self, bootstrap, topic, counts, sasl=None):
        from kafka import KafkaConsumer, TopicPartition
        from kafka.errors import KafkaError

        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            request_timeout_ms=10_000,
            **self._sasl(sasl),
        )
        try:
            consumer.assign([TopicPartition(topic, p) for p in counts])
            consumer.seek_to_beginning()
            out: list[Rec] = []
            got: dict[int, int] = {}
            deadline = time.monotonic() + TIMEOUT_S
            while not _done(got, counts):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} consumed {got} of {counts}")
                try:
                    polled = consumer.poll(timeout_ms=200)
                except KafkaError as exc:
                    raise ClientError(type(exc).__name__, str(exc)) from exc
                for tp, messages in polled.items():
                    for m in messages:
                        got[tp.partition] = got.get(tp.partition, 0) + 1
                        out.append(
                            Rec(
                                tp.partition,
                                m.key,
                                m.value,
                                tuple(m.headers),
                                m.timestamp,
                                m.offset,
                            )
                        )
            return _sorted(out)
        finally:
            consumer.close()

    def list_topics(self, bootstrap, sasl=None, timeout_s=5.0):
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        try:
            consumer = KafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=None,
                request_timeout_ms=10_000,
                bootstrap_timeout_ms=int(timeout_s * 1000),
                **self._sasl(sasl),
            )
        except KafkaError as exc:  # kafka-python says no more than that it could not bootstrap
            raise ClientError(type(exc).__name__, str(exc)) from exc
        try:
            return set(consumer.topics())
        except KafkaError as exc:
            raise ClientError(type(exc).__name__, str(exc)) from exc
        finally:
            consumer.close()


class AioKafka(Client):
    name = "aiokafka"

    @staticmethod
    def _sasl(sasl: tuple[str, str] | None) -> dict[str, Any]:
        if sasl is None:
            return {}
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": sasl[0],
            "sasl_plain_password": sasl[1],
        }

    def produce(self, bootstrap, topic, records, codec, sasl=None, **config):
        return asyncio.run(
            asyncio.wait_for(
                self._produce(bootstrap, topic, records, codec, sasl, config), TIMEOUT_S
            )
        )

    async def _produce(self, bootstrap, topic, records, codec, sasl, config):
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import KafkaError

        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            compression_type=None if codec == "none" else codec,
            linger_ms=50,
            acks="all",
            request_timeout_ms=10_000,
            **self._sasl(sasl),
            **config,
        )
        try:
            await producer.start()
            futures = [
                await producer.send(
                    topic,
                    key=r.key,
                    value=r.value,
                    headers=list(r.headers),
                    partition=r.partition,
                    timestamp_ms=r.timestamp,
                )
                for r in records
            ]
            # every future awaited, so none is left with an error nobody retrieved
            sent = await asyncio.gather(*futures, return_exceptions=True)
            for result in sent:
                if isinstance(result, BaseException):
                    raise result
        except KafkaError as exc:
            raise ClientError(type(exc).__name__, str(exc)) from exc
        finally:
            await producer.stop()
        return [(m.partition, m.offset) for m in sent]

    def consume(self, bootstrap, topic, counts, sasl=None):
        return asyncio.run(
            asyncio.wait_for(self._consume(bootstrap, topic, counts, sasl), TIMEOUT_S)
        )

    async def _consume(self, bootstrap, topic, counts, sasl):
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.errors import KafkaError

        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            request_timeout_ms=10_000,
            **self._sasl(sasl),
        )
        try:
            await consumer.start()
            consumer.assign([TopicPartition(topic, p) for p in counts])
            await consumer.seek_to_beginning()
            out: list[Rec] = []
            got: dict[int, int] = {}
            while not _done(got, counts):
                polled = await consumer.getmany(timeout_ms=200)
                for tp, messages in polled.items():
                    for m in messages:
                        got[tp.partition] = got.get(tp.partition, 0) + 1
                        out.append(
                            Rec(
                                tp.partition,
                                m.key,
                                m.value,
                                tuple(m.headers),
                                m.timestamp,
                                m.offset,
                            )
                        )
        except KafkaError as exc:
            raise ClientError(type(exc).__name__, str(exc)) from exc
        finally:
            await consumer.stop()
        return _sorted(out)

    def list_topics(self, bootstrap, sasl=None, timeout_s=5.0):
        return asyncio.run(asyncio.wait_for(self._list_topics(bootstrap, sasl), TIMEOUT_S))

    async def _list_topics(self, bootstrap, sasl):
        from aiokafka import AIOKafkaConsumer
        from aiokafka.errors import KafkaError

        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            request_timeout_ms=10_000,
            **self._sasl(sasl),
        )
        try:
            await consumer.start()
            return set(await consumer.topics())
        except KafkaError as exc:  # a failed SASL authentication: KafkaConnectionError
            raise ClientError(type(exc).__name__, str(exc)) from exc
        finally:
            await consumer.stop()


class Confluent(Client):
    name = "confluent-kafka"

    @staticmethod
    def config(bootstrap: str, sasl: tuple[str, str] | None = None, **extra: Any) -> dict[str, Any]:
        """librdkafka's settings for `bootstrap`, bounded in time, with SASL/PLAIN when given."""
        out: dict[str, Any] = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 10_000}
        if sasl is not None:
            out |= {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": sasl[0],
                "sasl.password": sasl[1],
            }
        return out | extra

    def produce(self, bootstrap, topic, records, codec, sasl=None, **config):
        from confluent_kafka import Producer

        fatal: list[Any] = []  # an idempotent producer's fatal error (a refused InitProducerId)

        def on_error(err: Any) -> None:
            if err.fatal():
                fatal.append(err)

        producer = Producer(
            self.config(
                bootstrap,
                sasl,
                **{
                    "compression.type": codec,
                    "linger.ms": 50,
                    "acks": "all",
                    "message.timeout.ms": int(TIMEOUT_S * 1000) - 5000,
                    "error_cb": on_error,
                    **config,
                },
            )
        )
        results: list[Any] = [None] * len(records)

        def delivered(i: int):
            def report(err: Any, msg: Any) -> None:
                results[i] = err if err is not None else (msg.partition(), msg.offset())

            return report

        for i, r in enumerate(records):
            kwargs: dict[str, Any] = {"timestamp": r.timestamp} if r.timestamp is not None else {}
            if r.partition is not None:  # else: the partitioner's choice
                kwargs["partition"] = r.partition
            producer.produce(
                topic,
                value=r.value,
                key=r.key,
                headers=list(r.headers),
                on_delivery=delivered(i),
                **kwargs,
            )
        left = producer.flush(TIMEOUT_S)
        if left:
            raise TimeoutError(f"{left} record(s) not delivered")
        for result in results:
            if not isinstance(result, tuple):
                if fatal:  # the messages were purged for it (_FATAL, or _DESTROY by timing)
                    raise ClientError(*_fatal_cause(fatal[0]))
                raise ClientError(result.name(), result.str())
        return results

    def consume(self, bootstrap, topic, counts, sasl=None):
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            self.config(
                bootstrap,
                sasl,
                **{
                    "group.id": "unused-no-commits",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": 100,
                },
            )
        )
        try:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in counts])
            out: list[Rec] = []
            got: dict[int, int] = {}
            deadline = time.monotonic() + TIMEOUT_S
            while not _done(got, counts):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} consumed {got} of {counts}")
                m = consumer.poll(0.2)
                if m is None:
                    continue
                if m.error() is not None:
                    raise ClientError(m.error().name(), m.error().str())
                got[m.partition()] = got.get(m.partition(), 0) + 1
                out.append(
                    Rec(
                        m.partition(),
                        m.key(),
                        m.value(),
                        tuple(m.headers() or ()),
                        m.timestamp()[1],
                        m.offset(),
                    )
                )
            return _sorted(out)
        finally:
            consumer.close()

    def list_topics(self, bootstrap, sasl=None, timeout_s=5.0):
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        errors: list[Any] = []
        admin = AdminClient(self.config(bootstrap, sasl, error_cb=errors.append))
        try:
            return set(admin.list_topics(timeout=timeout_s).topics)
        except KafkaException as exc:
            admin.poll(0)  # (serves error_cb)
            if any(e.code() == -169 for e in errors):  # _AUTHENTICATION
                raise ClientError("SASL_AUTHENTICATION_FAILED", str(errors)) from exc
            raise ClientError(exc.args[0].name(), str(exc)) from exc


class Kcat(Client):
    """kcat 1.7 (librdkafka) from Debian: one `kcat -P` per partition (-p, -H name=value for
    all its records, -K for keys, -Z for nulls), `kcat -C -J` to read back."""

    name = "kcat"
    text_only = True
    per_partition_headers = True
    sets_timestamps = False
    reports_offsets = False

    def missing(self) -> str | None:
        if shutil.which("kcat") is None:
            return (
                "no kcat: `make test` installs Debian's (tests/install-test-peers.sh) where it "
                "may use apt-get"
            )
        return None

    @staticmethod
    def _args(bootstrap: str, sasl: tuple[str, str] | None) -> list[str]:
        args = ["kcat", "-b", bootstrap, "-m", "10", "-X", "socket.timeout.ms=10000"]
        if sasl is not None:
            args += [
                "-X",
                "security.protocol=SASL_PLAINTEXT",
                "-X",
                "sasl.mechanism=PLAIN",
                "-X",
                f"sasl.username={sasl[0]}",
                "-X",
                f"sasl.password={sasl[1]}",
            ]
        return args

    def produce(self, bootstrap, topic, records, codec, sasl=None, **config):
        for p in sorted({r.partition for r in records}):
            mine = [r for r in records if r.partition == p]
            headers = mine[0].headers
            assert all(r.headers == headers for r in mine), "kcat sends one set of headers per call"
            lines = b"".join((r.key or b"") + b"\t" + (r.value or b"") + b"\n" for r in mine)
            assert all(r.key != b"" and r.value != b"" for r in mine), "kcat -Z sends empty as null"
            args = [
                *self._args(bootstrap, sasl),
                "-P",
                "-t",
                topic,
                "-p",
                str(p),
                "-K",
                "\\t",
                "-Z",
                "-X",
                f"compression.codec={codec}",
                "-X",
                "linger.ms=50",
            ]
            for name, value in headers:
                args += ["-H", f"{name}={value.decode()}"]
            for name, value in config.items():
                args += ["-X", f"{name}={value}"]
            done = subprocess.run(args, input=lines, capture_output=True, timeout=TIMEOUT_S)
            if done.returncode != 0 or b"ERROR" in done.stderr or b"failed" in done.stderr:
                raise self._error(done.stderr)
        return [(r.partition, None) for r in records]  # kcat -P prints no offsets

    def consume(self, bootstrap, topic, counts, sasl=None):
        out = []
        for p, n in sorted(counts.items()):
            args = [
                *self._args(bootstrap, sasl),
                "-C",
                "-t",
                topic,
                "-p",
                str(p),
                "-o",
                "beginning",
                "-c",
                str(n),
                "-J",
                "-Z",
                "-q",
            ]
            done = subprocess.run(args, capture_output=True, timeout=TIMEOUT_S)
            if done.returncode != 0:
                raise self._error(done.stderr)
            for line in done.stdout.decode().splitlines():
                m = json.loads(line)
                flat = m.get("headers") or []
                headers = tuple((flat[i], flat[i + 1].encode()) for i in range(0, len(flat), 2))
                key = None if m["key"] is None else m["key"].encode()
                value = None if m["payload"] is None else m["payload"].encode()
                out.append(Rec(m["partition"], key, value, headers, m["ts"], m["offset"]))
        return _sorted(out)

    def list_topics(self, bootstrap, sasl=None, timeout_s=5.0):
        args = [*self._args(bootstrap, sasl), "-L", "-J", "-m", str(max(1, int(timeout_s)))]
        done = subprocess.run(args, capture_output=True, timeout=TIMEOUT_S)
        if done.returncode != 0:
            raise self._error(done.stderr)
        return {t["topic"] for t in json.loads(done.stdout)["topics"]}

    @staticmethod
    def _error(stderr: bytes) -> ClientError:
        """kcat's error, named by librdkafka's text for it."""
        text = stderr.decode(errors="replace")
        for phrase, name in KCAT_ERRORS.items():
            if phrase in text:
                return ClientError(name, text)
        return ClientError("kcat", text)


KCAT_ERRORS = {
    "Topic authorization failed": "TOPIC_AUTHORIZATION_FAILED",
    "SASL authentication error": "SASL_AUTHENTICATION_FAILED",
    "Unknown topic or partition": "UNKNOWN_TOPIC_OR_PARTITION",
}


class KafkaJS(Client):
    """KafkaJS through tests/broker/js/client.js (see there: KafkaJS's own codecs are none
    and gzip; the others need codec packages of their own)."""

    name = "kafkajs"
    codecs = ("none", "gzip")

    def missing(self) -> str | None:
        if shutil.which("node") is None:
            return (
                "no node: the KafkaJS tests need Node.js (and `make test-peers` to install KafkaJS)"
            )
        if not (JS_DIR / "node_modules" / "kafkajs" / "package.json").exists():
            return (
                "KafkaJS is not installed in tests/broker/js: `make test-peers` runs `npm ci` there"
            )
        return None

    @staticmethod
    def _b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode()

    @staticmethod
    def _bytes(text: str | None) -> bytes | None:
        return None if text is None else base64.b64decode(text)

    def run(self, command: dict[str, Any]) -> dict[str, Any]:
        done = subprocess.run(
            ["node", str(JS_DIR / "client.js")],
            input=json.dumps(command).encode(),
            capture_output=True,
            timeout=TIMEOUT_S + 10,
        )
        lines = done.stdout.decode().strip().splitlines()
        if not lines:
            raise ClientError(
                "kafkajs", f"no answer (exit {done.returncode}): {done.stderr.decode()}"
            )
        answer = json.loads(lines[-1])
        if "error" in answer:
            error = answer["error"]
            raise ClientError(error.get("type") or error.get("name"), error.get("message", ""))
        return answer

    def produce(self, bootstrap, topic, records, codec, sasl=None, **config):
        command = {
            "brokers": [bootstrap],
            "sasl": _js_sasl(sasl),
            "produce": {
                "topic": topic,
                "codec": codec,
                "idempotent": bool(config.get("idempotent")),
                "records": [
                    {
                        "partition": r.partition,
                        "key": self._b64(r.key),
                        "value": self._b64(r.value),
                        "headers": [[k, self._b64(v)] for k, v in r.headers],
                        "timestamp": r.timestamp,
                    }
                    for r in records
                ],
            },
        }
        return [(x["partition"], x["offset"]) for x in self.run(command)["produced"]]

    def consume(self, bootstrap, topic, counts, sasl=None):
        command = {
            "brokers": [bootstrap],
            "sasl": _js_sasl(sasl),
            "consume": {
                "topic": topic,
                "partitions": {str(p): n for p, n in counts.items()},
                "timeout_ms": int(TIMEOUT_S * 1000),
            },
        }
        return _sorted(
            [
                Rec(
                    m["partition"],
                    self._bytes(m["key"]),
                    self._bytes(m["value"]),
                    tuple((k, self._bytes(v) or b"") for k, v in m["headers"]),
                    m["timestamp"],
                    m["offset"],
                )
                for m in self.run(command)["consumed"]
            ]
        )

    def list_topics(self, bootstrap, sasl=None, timeout_s=5.0):
        command = {"brokers": [bootstrap], "sasl": _js_sasl(sasl), "list": True}
        return set(self.run(command)["topics"])

    def group_consume(self, bootstrap: str, topic: str, group: str, count: int) -> list[Rec]:
        """`count` records through KafkaJS's own consumer, a member of `group` subscribed to
        `topic` from the beginning, each committed once processed (in delivery order)."""
        command = {
            "brokers": [bootstrap],
            "group": {
                "topic": topic,
                "group": group,
                "count": count,
                "timeout_ms": int(TIMEOUT_S * 1000),
            },
        }
        return [
            Rec(
                m["partition"],
                self._bytes(m["key"]),
                self._bytes(m["value"]),
                tuple((k, self._bytes(v) or b"") for k, v in m["headers"]),
                m["timestamp"],
                m["offset"],
            )
            for m in self.run(command)["grouped"]
        ]


def _js_sasl(sasl: tuple[str, str] | None) -> dict[str, str] | None:
    return None if sasl is None else {"username": sasl[0], "password": sasl[1]}


CLIENTS: dict[str, Client] = {
    c.name: c for c in (KafkaPython(), AioKafka(), Confluent(), Kcat(), KafkaJS())
}


# -- the same records over HTTP ----------------------------------------------------------------


def read_json(http: Any, topic: str, partition: int) -> list[Rec]:
    """The partition's records from offset 0, as HTTP's JSON fetch gives them (base64 keys,
    values and header values, so every byte is compared)."""
    response = http.get(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        params={"offset": 0, "key_format": "base64", "value_format": "base64"},
    )
    assert response.status_code == 200, response.text
    return [json_rec(partition, r) for r in response.json()["records"]]


def json_rec(partition: int, r: dict[str, Any]) -> Rec:
    """A record of HTTP's JSON (base64 keys, values and header values) as a Rec."""

    def raw(text: str | None) -> bytes | None:
        return None if text is None else base64.b64decode(text)

    headers = tuple((h["key"], raw(h["value"])) for h in r["headers"])
    return Rec(partition, raw(r["key"]), raw(r["value"]), headers, r["timestamp"], r["offset"])


RECORD_BATCH = "application/vnd.kafka.record-batch.v2"


def read_raw(http: Any, topic: str, partition: int, offset: int = 0) -> bytes:
    """The partition's stored batches from `offset`, as HTTP's raw fetch gives them."""
    response = http.get(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        params={"offset": offset},
        headers={"accept": RECORD_BATCH},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(RECORD_BATCH)
    return response.content


def _fatal_cause(err: Any) -> tuple[str, str]:
    """(the broker's error name, text) behind librdkafka's fatal error: it reports
    `_FATAL: Fatal error: Broker: Cluster authorization failed: ...`; the name is the broker's."""
    text = err.str()
    for name in ("CLUSTER_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED"):
        if name.replace("_", " ").lower() in text.lower():
            return name, text
    return err.name(), text
