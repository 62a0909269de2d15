"""Power cuts under load, on a real `eventlog serve` (one process, and a family of two shards)
whose data dir is on holdfs (holdfs.py): a FUSE layer that keeps in memory whatever the server
has not made durable (fsync of the file for data and size, fsync of the directory for names)
and drops it all in the cut. syncfs(2) flushes nothing there, as on any FUSE mount.

Each round: concurrent producers (JSON produce to partitions and to the topic with keys,
per-key conditional and plain appends, consumer-group offset commits) record every 200 answer;
then the server's processes are SIGKILLed, the FUSE daemon with them (the cut), the mount is
made again over what was durable, and the server restarted on it. Then every acknowledged
record is at its acknowledged offset with its value, every acknowledged key append is in its
key's history, every group holds its last acknowledged commit (or the one in flight at the
cut), and no offset is handed out twice: new records get offsets above every acknowledged one.

Issue 23: with the shared sync (one syncfs standing for many fdatasyncs) used on FUSE,
acknowledged records were lost here and their offsets handed out again.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from ..conftest import KEPT_ENV, VENV_BIN, child_pids, free_port, pid_alive
from .mount import HoldMount

pytestmark = pytest.mark.slow

ROUNDS = 3
EVENTS_PARTITIONS = 4
KEYED_PARTITIONS = 2
PRODUCERS = 4  # one per partition of `events`
TOPIC_PRODUCERS = 1  # keyed produce to the topic: records spread over its partitions
KEY_WRITERS = 2  # each owns KEYS_EACH keys of `keyed`
KEYS_EACH = 3
COMMITTERS = 2  # each owns one consumer group
SEGMENT_BYTES = 32 * 1024


class Server:
    """`eventlog serve` in its own session, so the cut can kill it and every shard at once."""

    def __init__(self, data_dir: Path, log: Path, processes: int) -> None:
        self.data_dir = data_dir
        self.log = log
        self.processes = processes
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        self.port = free_port()
        start = self.log.stat().st_size if self.log.exists() else 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLOG_")} | KEPT_ENV
        env["EVENTLOG_ACCESS_LOG"] = "false"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(VENV_BIN / "eventlog"), "serve", "--data-dir", str(self.data_dir), "--port", str(self.port),
                 "--processes", str(self.processes)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self._log_since(start)}")
            try:
                ready = httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                ready = False
            if ready and (self.processes == 1 or " eventlog.supervisor: ready: " in self._log_since(start)):
                return
            time.sleep(0.05)
        raise AssertionError(f"the server did not become ready in {timeout} s:\n{self._log_since(start)}")

    def _log_since(self, start: int) -> str:
        with open(self.log, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    def kill(self) -> list[int]:
        """SIGKILL to the server's process group and to each shard (a shard leads a group of
        its own); returns the pids killed, to wait for."""
        assert self.proc is not None
        pids = [self.proc.pid, *child_pids(self.proc.pid)]
        for pid in reversed(pids):
            try:
                os.killpg(pid, signal.SIGKILL) if pid == self.proc.pid else os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def wait_dead(self, pids: list[int]) -> None:
        assert self.proc is not None
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(pid_alive(p) for p in pids):
            assert time.monotonic() < deadline, f"processes {pids} outlived SIGKILL"
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.wait_dead(self.kill())


@dataclass
class Acks:
    """Every acknowledged write, across rounds."""

    records: dict[tuple[str, int, int], str] = field(default_factory=dict)  # (topic, partition, offset) -> value
    keys: dict[str, dict[int, str]] = field(default_factory=dict)  # key -> {offset: value}
    key_partition: dict[str, int] = field(default_factory=dict)
    commits: dict[tuple[str, int], int] = field(default_factory=dict)  # (group, partition) -> last acked offset
    in_flight: dict[tuple[str, int], int] = field(default_factory=dict)  # the commit sent last
    lock: threading.Lock = field(default_factory=threading.Lock)
    answered: int = 0

    def record(self, topic: str, partition: int, offset: int, value: str) -> None:
        with self.lock:
            previous = self.records.setdefault((topic, partition, offset), value)
            assert previous == value, f"{topic}/{partition} offset {offset} acknowledged twice: {previous!r} and {value!r}"
            self.answered += 1


class Load:
    """The producers of one round, each in its own thread with its own client, until stop()."""

    def __init__(self, url: str, acks: Acks, round_: int, seed: int) -> None:
        self.url = url
        self.acks = acks
        self.round = round_
        self.random = random.Random(seed)
        self.stopping = threading.Event()  # set just before the cut: requests may fail from then on
        self.errors: list[str] = []
        self.threads = [
            *(threading.Thread(target=self._guard, args=(self._produce, i)) for i in range(PRODUCERS)),
            *(threading.Thread(target=self._guard, args=(self._produce_topic, i)) for i in range(TOPIC_PRODUCERS)),
            *(threading.Thread(target=self._guard, args=(self._append_keys, i)) for i in range(KEY_WRITERS)),
            *(threading.Thread(target=self._guard, args=(self._commit, i)) for i in range(COMMITTERS)),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def cutting(self) -> None:
        self.stopping.set()

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a producer thread did not end"

    def _guard(self, body, index: int) -> None:
        with httpx.Client(base_url=self.url, timeout=20) as client:
            try:
                body(client, index)
            except (httpx.TransportError, httpx.RemoteProtocolError):
                if not self.stopping.is_set():  # the cut ends every request in flight
                    self.errors.append(f"{body.__name__}[{index}]: connection lost before the cut")
            except Exception as exc:  # noqa: BLE001 -- reported by the test
                if not self.stopping.is_set():
                    self.errors.append(f"{body.__name__}[{index}]: {exc!r}")

    def _value(self, kind: str, index: int, n: int) -> str:
        return f"r{self.round}-{kind}{index}-{n}-" + "x" * self.random.randrange(0, 200)

    def _produce(self, client: httpx.Client, index: int) -> None:
        partition = index % EVENTS_PARTITIONS
        for n in itertools.count():
            if self.stopping.is_set():
                return
            values = [self._value("p", index, n * 10 + i) for i in range(1 + n % 3)]
            answer = client.post(f"/v1/topics/events/partitions/{partition}/records",
                                 json={"records": [{"value": v} for v in values]})
            if answer.status_code != 200:
                raise AssertionError(f"produce answered {answer.status_code}: {answer.text}")
            body = answer.json()
            assert body["last_offset"] - body["base_offset"] == len(values) - 1
            for i, v in enumerate(values):
                self.acks.record("events", partition, body["base_offset"] + i, v)

    def _produce_topic(self, client: httpx.Client, index: int) -> None:
        for n in itertools.count():
            if self.stopping.is_set():
                return
            records = [{"key": f"user-{self.random.randrange(50)}", "value": self._value("t", index, n * 10 + i)}
                       for i in range(3)]
            answer = client.post("/v1/topics/events/records", json={"records": records})
            if answer.status_code != 200:
                raise AssertionError(f"topic produce answered {answer.status_code}: {answer.text}")
            for record, at in zip(records, answer.json()["offsets"]):
                self.acks.record("events", at["partition"], at["offset"], record["value"])

    def _append_keys(self, client: httpx.Client, index: int) -> None:
        keys = [f"agg-{index}-{k}" for k in range(KEYS_EACH)]
        latest = {}
        for key in keys:  # where each key's stream stands after the last cut
            answer = client.get(f"/v1/topics/keyed/keys/{key}/records", params={"max_records": 1})
            assert answer.status_code == 200, answer.text
            latest[key] = answer.json()["latest_offset"]
        for n in itertools.count():
            if self.stopping.is_set():
                return
            key = keys[n % len(keys)]
            value = self._value("k", index, n)
            conditional = n % 4 != 3  # most appends are conditional on the key's version
            headers = {"If-Match": f'"{latest[key]}"'} if conditional else {}
            answer = client.post(f"/v1/topics/keyed/keys/{key}/records", json={"records": [{"value": value}]},
                                 headers=headers)
            if answer.status_code == 412:
                raise AssertionError(f"{key}: only this thread writes it, yet {answer.text}")
            if answer.status_code != 200:
                raise AssertionError(f"key append answered {answer.status_code}: {answer.text}")
            body = answer.json()
            (offset,) = body["offsets"]
            assert offset > latest[key], f"{key}: appended at {offset}, at or below its version {latest[key]}"
            latest[key] = offset
            with self.acks.lock:
                self.acks.keys.setdefault(key, {})[offset] = value
                self.acks.key_partition[key] = body["partition"]
            self.acks.record("keyed", body["partition"], offset, value)

    def _commit(self, client: httpx.Client, index: int) -> None:
        group = f"group-{index}"
        for _ in itertools.count():
            if self.stopping.is_set():
                return
            partition = self.random.randrange(EVENTS_PARTITIONS)
            with self.acks.lock:
                offset = max(self.acks.in_flight.get((group, partition), 0), self.acks.commits.get((group, partition), 0)) + 1
                self.acks.in_flight[(group, partition)] = offset
            answer = client.post(f"/v1/groups/{group}/offsets",
                                 json={"offsets": [{"topic": "events", "partition": partition, "offset": offset}]})
            if answer.status_code != 200:
                raise AssertionError(f"group commit answered {answer.status_code}: {answer.text}")
            with self.acks.lock:
                self.acks.commits[(group, partition)] = offset


def _partition_records(client: httpx.Client, topic: str, partition: int) -> tuple[dict[int, str], int]:
    """Every record of the partition (offset -> value), and its high watermark."""
    records: dict[int, str] = {}
    offset = 0
    while True:
        answer = client.get(f"/v1/topics/{topic}/partitions/{partition}/records",
                            params={"offset": offset, "max_records": 100_000, "max_bytes": 64 << 20})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        for r in body["records"]:
            records[r["offset"]] = r["value"]
        if body["next_offset"] >= body["high_watermark"] or not body["records"]:
            return records, body["high_watermark"]
        offset = body["next_offset"]


def _check(client: httpx.Client, acks: Acks, tag: str) -> list[str]:
    """What the restarted server lost or changed of the acknowledged writes, in words."""
    problems: list[str] = []
    ends: dict[tuple[str, int], int] = {}
    for topic, count in (("events", EVENTS_PARTITIONS), ("keyed", KEYED_PARTITIONS)):
        for partition in range(count):
            records, high_watermark = _partition_records(client, topic, partition)
            ends[(topic, partition)] = high_watermark
            acked = {o: v for (t, p, o), v in acks.records.items() if (t, p) == (topic, partition)}
            lost = sorted(o for o in acked if o not in records)
            changed = sorted(o for o, v in acked.items() if o in records and records[o] != v)
            if lost:
                problems.append(f"{topic}/{partition}: {len(lost)} of {len(acked)} acknowledged records lost "
                                f"(offsets {lost[:10]}{'...' if len(lost) > 10 else ''}); high watermark {high_watermark}")
            if changed:
                problems.append(f"{topic}/{partition}: {len(changed)} acknowledged offsets hold another record now "
                                f"(offsets {changed[:10]}): offsets handed out twice")
            if acked and high_watermark <= max(acked):
                problems.append(f"{topic}/{partition}: high watermark {high_watermark}, at or below acknowledged "
                                f"offset {max(acked)}: the next append reuses it")
    for key, offsets in acks.keys.items():
        answer = client.get(f"/v1/topics/keyed/keys/{key}/records", params={"max_records": 10_000})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        history = {r["offset"]: r["value"] for r in body["records"]}
        assert not body["more"], f"{key}: more than one page of history"
        missing = sorted(o for o, v in offsets.items() if history.get(o) != v)
        if missing:
            problems.append(f"key {key}: acknowledged appends at {missing[:10]} not in its history (latest {body['latest_offset']})")
    for (group, partition), offset in acks.commits.items():
        answer = client.get(f"/v1/groups/{group}/offsets")
        assert answer.status_code == 200, answer.text
        committed = {o["partition"]: o["offset"] for o in answer.json()["offsets"] if o["topic"] == "events"}
        allowed = {offset, acks.in_flight.get((group, partition), offset)}
        if committed.get(partition) not in allowed:
            problems.append(f"{group} events/{partition}: committed offset {committed.get(partition)}, "
                            f"acknowledged {offset} (in flight at the cut: {acks.in_flight.get((group, partition))})")
    # appends after the restart: offsets beyond every acknowledged one
    for topic, partition in ends:
        answer = client.post(f"/v1/topics/{topic}/partitions/{partition}/records", json={"records": [{"value": tag}]})
        assert answer.status_code == 200, answer.text
        offset = answer.json()["base_offset"]
        acked = [o for (t, p, o) in acks.records if (t, p) == (topic, partition)]
        if acked and offset <= max(acked):
            problems.append(f"{topic}/{partition}: a new record got offset {offset}, not above acknowledged {max(acked)}")
        else:
            acks.record(topic, partition, offset, tag)  # checked after the next cut too
    return problems


@pytest.mark.parametrize("processes", [1, 2], ids=["one-process", "two-shards"])
def test_acknowledged_writes_survive_power_cuts(holdfs: HoldMount, tmp_path: Path, processes: int) -> None:
    started = time.monotonic()
    server = Server(holdfs.mountpoint / "data", tmp_path / "server.log", processes)
    acks = Acks()
    rng = random.Random(23 + processes)
    try:
        server.start()
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for name, count in (("events", EVENTS_PARTITIONS), ("keyed", KEYED_PARTITIONS)):
                # small segments: each round rolls several, so new files and their names must
                # be made durable too
                answer = client.post("/v1/topics", json={"name": name, "partitions": count,
                                                         "configs": {"segment.bytes": SEGMENT_BYTES}})
                assert answer.status_code == 201, answer.text
        for round_ in range(ROUNDS):
            load = Load(server.url, acks, round_, seed=rng.randrange(1 << 30))
            before = acks.answered
            load.start()
            time.sleep(rng.uniform(1.0, 2.0))
            # the cut: the server's processes and the filesystem's volatile state, at once
            load.cutting()
            pids = server.kill()
            holdfs.cut()
            load.join()
            server.wait_dead(pids)
            assert not load.errors, load.errors
            assert acks.answered > before + 20, f"round {round_}: only {acks.answered - before} records acknowledged"
            holdfs.mount()
            server.start()
            with httpx.Client(base_url=server.url, timeout=30) as client:
                problems = _check(client, acks, f"after cut {round_ + 1}")
            assert not problems, f"after power cut {round_ + 1}:\n" + "\n".join(problems)
        assert "on fuse: fdatasync per file" in server.log.read_text(errors="replace")
    finally:
        server.stop()
    print(f"{ROUNDS} power cuts at {processes} process(es): {len(acks.records)} acknowledged records, "
          f"{sum(len(v) for v in acks.keys.values())} key appends, {len(acks.commits)} group offsets; "
          f"{time.monotonic() - started:.1f} s")
