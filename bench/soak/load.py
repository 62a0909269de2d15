"""The soak's mixed load: asyncio tasks on one event loop, each a loop of HTTP requests that
survives the server's deaths (a failed request is classified, counted, retried after a pause).

Writers (paused while the runner verifies, so the log holds still):
* JSON producers to the plain and the retained topic (keyed, unkeyed, some with an explicit
  partition); raw producers (Kafka v2 batches from engine.records.encode_batch, every codec);
  JSON producers to the compacted topic (a small key space, ~15 % tombstones);
* small producers: one-record appends to a partition of the many-partition topic drawn at
  random, many of them at once (issue 13's shape: commits of many partitions due together);
* the admin task: POST /v1/admin/retention/run and /v1/admin/compaction/run in turn;
* the snapshot task: POST /v1/snapshots, check the manifest against the model, delete it;
* queue workers (queue.py): lease the aggregates topic's records from a queue, acknowledge,
  release, reject or abandon them; drained and judged at the end.

Readers (never paused; they see kills as broken connections and resume where they were):
* fetchers reading every partition from offset 0 to the end, then again from 0 (JSON; and one
  asking for raw batches, decoded with kafka-python);
* long-pollers at the end of a partition (max_wait_ms);
* SSE tailers following a partition's event stream from its start;
* key readers reading one aggregate's history at a time through the key index (issue 14): its
  offsets increase, every record has that key, and its ETag is its latest offset.

Every record a reader gets goes to Model.observe; its offsets must increase, without gaps in
the topics that cannot have them, and a jump forward is allowed only past the log start offset
(retention or compaction removed the records). A reader whose position is above the high
watermark after a restart saw records that are gone: a failure.

Exact writers (exact.py, a base of Load): idempotent producers to the plain and the disk-full
topic and two conditional producers on the ledger partition, whose requests are retried with
their Idempotency-Key until answered, never left in doubt.

Produce outcomes: 2xx acknowledges (Model.ack); a connection refused means nothing was sent;
507 storage_full means nothing was written (Model.refuse); any other transport error, or
another 5xx, puts the request's records in doubt (Model.doubt).

Every produce answer is also judged against the fault phases (phases.py, FaultState.judge):
inside a disk-full phase the disk-full topic must refuse appends with 507 and go on serving
reads (counted per phase in _read); a 507 anywhere else is a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import orjson

from engine.compression import CODECS
from engine.records import encode_batch
from engine.snapshots import default_root
from tests.kafka_oracle import decode_all

from .exact import RAW, RETRY_PAUSE_S, ExactWriters
from .model import (
    AGGREGATE_KEYS,
    AGGREGATES,
    EXPIRES,
    FULL,
    GAPS,
    LEDGER,
    MANY,
    PLAIN,
    RETAINED,
    TABLE,
    Model,
    content,
    id_header,
    record_id,
)
from .phases import FaultState, Phase
from .queue import QueueWorkers
from .verify import check_snapshot

JSON = {"content-type": "application/json"}
REFUSED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)

SMALL_PRODUCERS = 8  # concurrent one-record producers on the many-partition topic

class Gate:
    """Lets writers run, or holds them while the runner verifies; counts requests in flight."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0
        self.stopping = False

    async def enter(self) -> None:
        await self._open.wait()
        self._in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def close(self) -> None:
        """Hold new writes and wait for those in flight to finish."""
        self._open.clear()
        await self._idle.wait()

    def open(self) -> None:
        self._open.set()


class Stats:
    """Completed operations per kind, per second of the run, for the report and the plot."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.ops: Counter = Counter()
        self.timeline: dict[int, Counter] = defaultdict(Counter)
        self.errors: Counter = Counter()
        self.events: Counter = Counter()  # not requests: 507s, retries, replays (also in the timeline)
        # one shard is down or stopped (a single-shard fault, --processes >= 2) and the others
        # serve on: requests that need it answer 503 `unavailable` at once (Retry-After: 1);
        # writers put such a request in doubt and retry it like any 5xx; readers and the
        # admin and snapshot tasks count it and retry, not a failure, while this is set
        self.shard_fault = False
        self.answered_503: Counter = Counter()  # by request kind: during single-shard faults
        self.answered_503_otherwise: Counter = Counter()  # writers' 503s at other times (in doubt)

    def note_503(self, kind: str) -> None:
        (self.answered_503 if self.shard_fault else self.answered_503_otherwise)[kind] += 1

    def unavailable(self, reader: str, status: int, code: str | None, counted: bool = False) -> bool:
        """A 503 `unavailable` during a single-shard fault: count it (unless Load._request did)
        and say so."""
        if self.shard_fault and status == 503 and code in ("unavailable", None):
            if not counted:
                self.note_503(reader)
            self.errors[f"{reader}_503_shard_fault"] += 1
            return True
        return False

    def now(self) -> float:
        return time.monotonic() - self.t0

    def op(self, kind: str, n: int = 1) -> None:
        self.ops[kind] += n
        self.timeline[int(self.now())][kind] += n

    def event(self, kind: str, n: int = 1) -> None:
        self.events[kind] += n
        self.timeline[int(self.now())][kind] += n


class Load(ExactWriters):
    def __init__(self, client: httpx.AsyncClient, model: Model, stats: Stats, gate: Gate,
                 partitions: dict[str, int], seed: int, data_dir: Path):
        self.client = client
        self.data_dir = data_dir  # snapshot answers name their directory relative to it
        self.model = model
        self.stats = stats
        self.gate = gate
        self.partitions = partitions
        self.rng = random.Random(seed)
        self._writers = 0
        self.faults = FaultState()
        self._init_exact()
        # (its own seed: the other tasks' draws stay as they were)
        self.queue = QueueWorkers(self._request, model, stats, seed + 26)

    def tasks(self) -> list[Any]:
        """The coroutines of the whole load; each runs until gate.stopping."""
        out = [
            self._json_producer(PLAIN), self._json_producer(PLAIN), self._json_producer(RETAINED),
            self._raw_producer(PLAIN), self._raw_producer(RETAINED),
            self._json_producer(TABLE), self._json_producer(TABLE),
            self._json_producer(FULL),
            self._idempotent_producer(PLAIN), self._idempotent_producer(PLAIN), self._idempotent_producer(FULL),
            self._conditional_producer(LEDGER, 0), self._conditional_producer(LEDGER, 0),
            self._key_producer(AGGREGATES), self._key_producer(AGGREGATES), self._key_reader(AGGREGATES),
            self._admin(), self._snapshots(),
        ]
        out += [self._small_producer(MANY) for _ in range(SMALL_PRODUCERS)]
        out += self.queue.tasks()  # queue workers on the aggregates topic (queue.py)
        for topic in (PLAIN, RETAINED, TABLE, FULL, LEDGER, MANY, AGGREGATES):
            out.append(self._fetcher(topic))
        out.append(self._raw_fetcher(PLAIN))
        out.append(self._long_poller(PLAIN, 0))
        out.append(self._long_poller(TABLE, 1 % self.partitions[TABLE]))
        out.append(self._sse_tailer(PLAIN, 1 % self.partitions[PLAIN]))
        out.append(self._sse_tailer(RETAINED, 0))
        out.append(self._sse_tailer(MANY, 0))
        return out

    # -- writers ----------------------------------------------------------------------------

    def _writer_number(self) -> int:
        self._writers += 1
        return self._writers

    async def _request(self, kind: str, method: str, url: str, *, gated: bool = True,
                       **kwargs: Any) -> httpx.Response | str:
        """One request (gated: held while the runner verifies): the response, or "refused" /
        "in_doubt" after a transport error."""
        if gated:
            await self.gate.enter()
        try:
            r = await self.client.request(method, url, **kwargs)
            if r.status_code == 503:
                self.stats.note_503(kind)
            return r
        except REFUSED:
            self.stats.errors[f"{kind}_refused"] += 1
            return "refused"
        except httpx.TransportError:
            self.stats.errors[f"{kind}_connection_lost"] += 1
            return "in_doubt"
        except Exception as exc:  # noqa: BLE001 - the client library's own error on a dropped connection
            # Seen when a shard is killed mid-request: anyio or h11 raising past httpx's
            # wrapping. The request may have been written: in doubt, like a lost connection.
            self.stats.errors[f"{kind}_client_{type(exc).__name__}"] += 1
            return "in_doubt"
        finally:
            if gated:
                self.gate.leave()

    def _produced(self, kind: str, topic: str, outcome: httpx.Response | str, ids: list[int],
                  mark: tuple[Phase | None, int, bool], started: float) -> dict | None:
        """The JSON answer of a successful produce; otherwise the ids' fate is noted."""
        if isinstance(outcome, str):
            if outcome == "in_doubt":
                self.model.doubt(topic, ids)
            return None
        self.faults.judge(mark, topic, outcome.status_code, False, started, self.model, self.stats)
        if outcome.status_code == 507:
            self.stats.errors[f"{kind}_507"] += 1
            if topic == FULL:  # one partition: the refusal covers the whole request
                self.model.refuse(topic, ids)
            else:
                self.model.doubt(topic, ids)  # a request spanning partitions may have landed in others
            return None
        if outcome.status_code >= 500:
            self.stats.errors[f"{kind}_{outcome.status_code}"] += 1
            self.model.doubt(topic, ids)
            return None
        if outcome.status_code != 200:
            self.model.fail("unexpected_status", f"{kind}: {outcome.status_code} {outcome.text[:300]}")
            return None
        return outcome.json()

    async def _json_producer(self, topic: str) -> None:
        writer = self._writer_number()
        rng = random.Random(self.rng.random())
        seq = 0
        kind = {TABLE: "produce_table", FULL: "produce_full"}.get(topic, "produce_json")
        while not self.gate.stopping:
            n = rng.randint(1, 12)
            ids = [record_id(writer, seq + i) for i in range(n)]
            seq += n
            body = orjson.dumps({"records": self._json_records(topic, ids, rng, spread=True)})
            mark, started = self.faults.mark(), self.stats.now()
            outcome = await self._request(kind, "POST", f"/v1/topics/{topic}/records", content=body, headers=JSON)
            answer = self._produced(kind, topic, outcome, ids, mark, started)
            if answer is None:
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            for rid, placed in zip(ids, answer["offsets"], strict=True):
                self.model.ack(topic, placed["partition"], placed["offset"], rid)
            self.stats.op(kind)
            self.stats.op("records_acked", n)

    async def _small_producer(self, topic: str) -> None:
        """One-record appends, each to a partition drawn at random, one request at a time."""
        writer = self._writer_number()
        rng = random.Random(self.rng.random())
        seq = 0
        kind = "produce_small"
        while not self.gate.stopping:
            partition = rng.randrange(self.partitions[topic])
            ids = [record_id(writer, seq)]
            seq += 1
            body = orjson.dumps({"records": self._json_records(topic, ids, rng, spread=False)})
            mark, started = self.faults.mark(), self.stats.now()
            url = f"/v1/topics/{topic}/partitions/{partition}/records"
            outcome = await self._request(kind, "POST", url, content=body, headers=JSON)
            answer = self._produced(kind, topic, outcome, ids, mark, started)
            if answer is None:
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            if answer["partition"] != partition or answer["base_offset"] != answer["last_offset"]:
                self.model.fail("unexpected_answer", f"{kind} to {topic}/{partition}: {answer}")
                continue
            self.model.ack(topic, partition, answer["base_offset"], ids[0])
            self.stats.op(kind)
            self.stats.op("records_acked")

    async def _raw_producer(self, topic: str) -> None:
        writer = self._writer_number()
        rng = random.Random(self.rng.random())
        codecs = list(CODECS.values())
        seq = 0
        while not self.gate.stopping:
            partition = rng.randrange(self.partitions[topic])
            payload = bytearray()
            ids: list[int] = []
            for _ in range(rng.randint(1, 3)):
                n = rng.randint(1, 20)
                batch_ids = [record_id(writer, seq + i) for i in range(n)]
                seq += n
                now_ms = int(time.time() * 1000)
                records = [(*content(topic, rid), now_ms, [id_header(rid)]) for rid in batch_ids]
                payload += encode_batch(0, records, compression_type=rng.choice(codecs))
                ids += batch_ids
            mark, started = self.faults.mark(), self.stats.now()
            outcome = await self._request(
                "produce_raw", "POST", f"/v1/topics/{topic}/partitions/{partition}/records",
                content=bytes(payload), headers={"content-type": RAW},
            )
            answer = self._produced("produce_raw", topic, outcome, ids, mark, started)
            if answer is None:
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            base, last = answer["base_offset"], answer["last_offset"]
            if last - base + 1 != len(ids) or answer["partition"] != partition:
                self.model.fail("bad_answer", f"raw produce of {len(ids)} records to {topic}/{partition}: {answer}")
                continue
            for i, rid in enumerate(ids):
                self.model.ack(topic, partition, base + i, rid)
            self.stats.op("produce_raw")
            self.stats.op("records_acked", len(ids))

    async def _admin(self) -> None:
        rng = random.Random(self.rng.random())
        turn = 0
        while not self.gate.stopping:
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            kind = ("retention_run", "compaction_run")[turn % 2]
            turn += 1
            path = "/v1/admin/retention/run" if kind == "retention_run" else "/v1/admin/compaction/run"
            outcome = await self._request(kind, "POST", path)
            if isinstance(outcome, str):
                continue
            if outcome.status_code != 200:
                if not self.stats.unavailable(kind, outcome.status_code, _code(outcome), counted=True):
                    self.model.fail("unexpected_status", f"{kind}: {outcome.status_code} {outcome.text[:300]}")
                continue
            answer = outcome.json()
            self.stats.op(kind)
            if kind == "compaction_run":
                self.stats.op("compaction_records_removed", answer["records_removed"])
            else:
                self.stats.op("retention_segments_deleted", answer["segments_deleted"])

    async def _snapshots(self) -> None:
        rng = random.Random(self.rng.random())
        while not self.gate.stopping:
            await asyncio.sleep(rng.uniform(2.0, 5.0))
            # one gated unit: the runner's clean-up after a restart must not delete it midway
            await self.gate.enter()
            try:
                await self._snapshot_once()
            finally:
                self.gate.leave()

    async def _snapshot_once(self) -> None:
        """Take a snapshot, check its manifest and files against the model, delete it."""
        topics = sorted(self.partitions)
        # everything acknowledged before the request must be in the snapshot
        floor = {
            (t, p): max(self.model.acked.get((t, p), ()), default=-1) + 1
            for t in topics for p in range(self.partitions[t])
        }
        outcome = await self._request("snapshot", "POST", "/v1/snapshots", gated=False, json={"topics": topics})
        if isinstance(outcome, str):
            return
        if outcome.status_code != 201:
            if not self.stats.unavailable("snapshot", outcome.status_code, _code(outcome), counted=True):
                self.model.fail("unexpected_status", f"snapshot: {outcome.status_code} {outcome.text[:300]}")
            return
        answer = outcome.json()
        path = default_root(self.data_dir) / answer["path"]  # (relative to the snapshot dir)
        check_snapshot(path, topics, self.partitions, floor, self.model)
        outcome = await self._request("snapshot", "DELETE", f"/v1/snapshots/{answer['id']}", gated=False)
        if isinstance(outcome, str) or self.stats.unavailable("snapshot", outcome.status_code, _code(outcome), counted=True):
            return  # the runner deletes leftovers after the restart (or the shard fault)
        if outcome.status_code != 204:
            self.model.fail("snapshot", f"delete {answer['id']}: {outcome.status_code} {outcome.text[:300]}")
        elif path.exists():
            self.model.fail("snapshot", f"delete {answer['id']}: 204, but {answer['path']} is still there")
        else:
            self.stats.op("snapshot")

    # -- readers ----------------------------------------------------------------------------

    def _take(self, reader: str, topic: str, partition: int, position: int,
              records: list[dict], log_start: int) -> int:
        """Check and observe a run of records read from `position`; return the next position."""
        for record in records:
            offset = record["offset"]
            if offset < position:
                self.model.fail("out_of_order", f"{reader} at {topic}/{partition} {position}: got offset {offset}")
                continue
            if offset > position and not GAPS[topic] and not (EXPIRES[topic] and log_start >= offset):
                self.model.fail("gap", f"{reader}: {topic}/{partition} jumped from {position} to {offset}")
            headers = {h["key"]: h["value"] for h in record["headers"]}
            rid = int(headers["id"]) if "id" in headers else None
            self.model.observe(topic, partition, offset, rid, reader)
            if rid is not None:
                key, value = content(topic, rid)
                if record["key"] != (None if key is None else key.decode()) or record["value"] != (
                    None if value is None else value.decode()
                ):
                    self.model.fail("corrupt", f"{reader}: {topic}/{partition} offset {offset}: key/value of id {rid} differ")
            position = offset + 1
        return position

    def _out_of_range(self, reader: str, topic: str, partition: int, position: int, problem: dict) -> int:
        """A 416: jump to the log start if retention passed us; above the high watermark is a loss."""
        log_start, hw = problem.get("log_start_offset"), problem.get("high_watermark")
        if log_start is not None and position < log_start:
            if not EXPIRES[topic]:
                self.model.fail("lost", f"{reader}: {topic}/{partition} log start moved to {log_start} past {position}")
            return log_start
        self.model.fail(
            "lost",
            f"{reader}: {topic}/{partition} position {position} is above the high watermark {hw} "
            "(records a reader saw below the watermark are gone)",
        )
        return hw if hw is not None else 0

    async def _read(self, reader: str, topic: str, partition: int, position: int, **params: Any) -> tuple[int, int]:
        """One fetch from `position`; returns (next position, records read), (position, -1) on errors."""
        phase = self.faults.phase
        try:
            r = await self.client.get(
                f"/v1/topics/{topic}/partitions/{partition}/records", params={"offset": position, **params}
            )
        except Exception as exc:  # noqa: BLE001 -- see _connection_lost
            self._connection_lost(reader, exc)
            await asyncio.sleep(RETRY_PAUSE_S)
            return position, -1
        if r.status_code == 416:
            return self._out_of_range(reader, topic, partition, position, r.json()), -1
        if r.status_code != 200:
            if not self.stats.unavailable(reader, r.status_code, _code(r)):
                self.model.fail("unexpected_status", f"{reader}: {r.status_code} {r.text[:300]}")
            await asyncio.sleep(RETRY_PAUSE_S)
            return position, -1
        body = r.json()
        records = body["records"]
        if topic == FULL and phase is not None and phase is self.faults.phase:
            phase.reads_ok += 1
        self._take(reader, topic, partition, position, records, body["log_start_offset"])
        return max(position, body["next_offset"]), len(records)

    async def _key_reader(self, topic: str) -> None:
        """Reads a random aggregate's whole history through the key index, again and again."""
        reader = f"key_reader({topic})"
        rng = random.Random(self.rng.random())
        while not self.gate.stopping:
            key = f"agg-{rng.randrange(AGGREGATE_KEYS)}"
            try:
                r = await self.client.get(f"/v1/topics/{topic}/keys/{key}/records", params={"max_records": 10_000})
            except Exception as exc:  # noqa: BLE001 -- see _connection_lost
                self._connection_lost(reader, exc)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            if r.status_code != 200:
                if not self.stats.unavailable(reader, r.status_code, _code(r)):
                    self.model.fail("unexpected_status", f"{reader}: {r.status_code} {r.text[:300]}")
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            body = r.json()
            offsets = [rec["offset"] for rec in body["records"]]
            if offsets != sorted(set(offsets)) or any(rec["key"] != key for rec in body["records"]):
                self.model.fail("key_index", f"{reader}: {key}: offsets {offsets[:20]}... or keys out of place")
            elif r.headers.get("etag") != f'"{offsets[-1] if offsets and not body["more"] else body["latest_offset"]}"':
                self.model.fail("key_index", f"{reader}: {key}: ETag {r.headers.get('etag')} for latest {offsets[-1:]}")
            for rec in body["records"]:
                headers = {h["key"]: h["value"] for h in rec["headers"]}
                if "id" in headers:
                    self.model.observe(topic, body["partition"], rec["offset"], int(headers["id"]), reader)
            self.stats.op("key_read")
            await asyncio.sleep(0.02)

    async def _fetcher(self, topic: str) -> None:
        positions = dict.fromkeys(range(self.partitions[topic]), 0)
        kind = "fetch"
        while not self.gate.stopping:
            for partition in positions:
                position, n = await self._read(f"fetcher({topic})", topic, partition, positions[partition], max_records=500)
                if n == 0:
                    position = 0  # caught up: read the partition again from the start
                positions[partition] = position
                if n >= 0:
                    self.stats.op(kind)

    async def _raw_fetcher(self, topic: str) -> None:
        """Like _fetcher, with Accept: raw batches, decoded by kafka-python (tests/kafka_oracle)."""
        reader = f"raw_fetcher({topic})"
        positions = dict.fromkeys(range(self.partitions[topic]), 0)
        while not self.gate.stopping:
            for partition, position in positions.items():
                try:
                    r = await self.client.get(
                        f"/v1/topics/{topic}/partitions/{partition}/records",
                        params={"offset": position, "max_bytes": 256 * 1024}, headers={"accept": RAW},
                    )
                except Exception as exc:  # noqa: BLE001 -- see _connection_lost
                    self._connection_lost(reader, exc)
                    await asyncio.sleep(RETRY_PAUSE_S)
                    continue
                if r.status_code == 416:
                    positions[partition] = self._out_of_range(reader, topic, partition, position, r.json())
                    continue
                if r.status_code != 200:
                    if not self.stats.unavailable(reader, r.status_code, _code(r)):
                        self.model.fail("unexpected_status", f"{reader}: {r.status_code} {r.text[:300]}")
                    await asyncio.sleep(RETRY_PAUSE_S)
                    continue
                try:
                    _batches, decoded = decode_all(r.content)
                except Exception as exc:  # noqa: BLE001 -- any decoder complaint is a finding
                    self.model.fail("corrupt", f"{reader}: {topic}/{partition} from {position}: {exc!r}")
                    continue
                records = [
                    {"offset": d.offset, "key": None if d.key is None else d.key.decode(),
                     "value": None if d.value is None else d.value.decode(),
                     "headers": [{"key": k, "value": v.decode()} for k, v in d.headers]}
                    for d in decoded if d.offset >= position
                ]
                log_start = int(r.headers["x-log-start-offset"])
                self._take(reader, topic, partition, position, records, log_start)
                next_offset = int(r.headers["x-next-offset"])
                positions[partition] = 0 if not records else max(position, next_offset)
                self.stats.op("fetch_raw")

    async def _long_poller(self, topic: str, partition: int) -> None:
        position = None
        while not self.gate.stopping:
            if position is None:
                try:
                    r = await self.client.get(f"/v1/topics/{topic}/partitions/{partition}/offsets")
                    position = r.json()["high_watermark"] if r.status_code == 200 else None
                except Exception as exc:  # noqa: BLE001 -- see _connection_lost
                    self._connection_lost(f"long_poller({topic}/{partition})", exc)
                    await asyncio.sleep(RETRY_PAUSE_S)
                continue
            position, n = await self._read(
                f"long_poller({topic}/{partition})", topic, partition, position, max_wait_ms=2000
            )
            if n >= 0:
                self.stats.op("long_poll")

    async def _sse_tailer(self, topic: str, partition: int) -> None:
        """Follow the event stream; after a broken connection, resume after the last event seen."""
        reader = f"sse({topic}/{partition})"
        state = {"position": 0}  # updated per event, so a kill mid-stream loses no progress
        while not self.gate.stopping:
            url = f"/v1/topics/{topic}/partitions/{partition}/records/stream"
            try:
                async with self.client.stream("GET", url, params={"offset": state["position"]}) as r:
                    if r.status_code == 416:
                        problem = orjson.loads(await r.aread())
                        state["position"] = self._out_of_range(reader, topic, partition, state["position"], problem)
                        continue
                    if r.status_code != 200:
                        if not self.stats.unavailable(reader, r.status_code, None):
                            self.model.fail("unexpected_status", f"{reader}: {r.status_code}")
                        await asyncio.sleep(RETRY_PAUSE_S)
                        continue
                    self.stats.op("sse_connect")
                    await self._events(reader, topic, partition, state, r)
            except httpx.TransportError as exc:  # (not wider: _events checks what arrives)
                self._connection_lost(reader, exc)
                await asyncio.sleep(RETRY_PAUSE_S)

    def _connection_lost(self, reader: str, exc: Exception) -> None:
        """A reader's request failed on its way (a reader resumes where it was). Besides httpx's
        transport errors, the client library's own errors on a connection a kill dropped (seen:
        anyio's AttributeError on a socket already gone) end up here, caught around the request
        only: what an answer holds is checked after it."""
        if isinstance(exc, httpx.TransportError):
            self.stats.errors[f"{reader}_connection"] += 1
        else:
            self.stats.errors[f"{reader}_client_{type(exc).__name__}"] += 1

    async def _events(self, reader: str, topic: str, partition: int, state: dict[str, int], r: httpx.Response) -> None:
        event, data = None, None
        async for line in r.aiter_lines():
            if self.gate.stopping:
                return
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = orjson.loads(line[6:])
            elif line == "" and event is not None:
                if event == "record":
                    state["position"] = self._take(reader, topic, partition, state["position"], [data], -1)
                    self.stats.op("sse_event")
                elif event == "error" and data.get("code") == "offset_out_of_range":
                    state["position"] = self._out_of_range(reader, topic, partition, state["position"], data)
                    return
                elif event == "error" and self.stats.unavailable(reader, 503, data.get("code")):
                    return  # a shard is down: reconnect
                else:
                    self.model.fail("unexpected_event", f"{reader}: {event} {data}")
                event, data = None, None


def _code(r: httpx.Response) -> str | None:
    try:
        return orjson.loads(r.content).get("code")
    except (orjson.JSONDecodeError, AttributeError):
        return None


async def drain(tasks: list[asyncio.Task]) -> None:
    """Cancel the load's tasks and wait for them. An error a task raises while it is being
    cancelled is the client library's, not a finding (seen: anyio asking a socket that uvloop had
    already closed for its peer name); findings are recorded in the model as they happen."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
