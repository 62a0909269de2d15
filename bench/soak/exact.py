"""The soak's exact writers: producers whose every request is eventually answered, so each of
their records is known exactly and must be in the log exactly once.

* Idempotent producers: every request carries a unique Idempotency-Key (JSON to the topic or to
  a partition; ~30 % raw batches, which the server stamps with the key's producer id). When the
  outcome is in doubt (connection lost, timeout, server killed, 5xx) or the request was refused
  (connect error, 507 storage_full), the SAME body goes again with the SAME key, every
  RETRY_PAUSE_S, across restarts, until it is answered. The answer -- a first write, or a
  replay (header Idempotent-Replayed: true) -- gives the records' offsets.
* Conditional producers, two on one partition: append 1-3 records with If-Match at the high
  watermark they know (and an Idempotency-Key per request); on 412 offset_mismatch take the
  watermark the 412 names and try again.
* Key writers (issue 14), two on the aggregates topic: each appends one record at a time to a
  key (its n-th record to agg-<n % 12>, so they contend for every key) through
  POST .../keys/{key}/records with If-Match at the key's version they know (If-None-Match: *
  for a new key) and an Idempotency-Key; on 412 key_version_mismatch they take the
  current_offset it names and try again. A request in doubt is resolved by the same retry: the
  key is checked before the offset, so one that was written is answered as a replay. Their ids
  carry their own sequence numbers (verify.check_sequences).

A replay answering a request none of whose attempts can have been written, any other 4xx, and a
request unanswered for UNRESOLVED_AFTER_S are failures. ExactWriters is a base of load.Load:
it uses the load's client, model, stats, gate, fault state and _request.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from engine.compression import CODECS
from engine.records import encode_batch

from .model import Model, content, id_header, record_id

if TYPE_CHECKING:
    from .load import Gate, Stats
    from .phases import FaultState

RAW = "application/vnd.kafka.record-batch.v2"
RETRY_PAUSE_S = 0.2
REPLAYED = "idempotent-replayed"
UNRESOLVED_AFTER_S = 120.0  # an exact request still unanswered after this long is a failure


@dataclass
class Exact:
    """Counts of the exact writers' requests (idempotent and conditional)."""

    requests: int = 0
    records: int = 0
    records_answered: int = 0  # records of the requests answered 2xx (at last): all of them, normally
    in_doubt: int = 0  # requests with an attempt whose outcome was unknown
    retries: int = 0  # attempts after the first (same key)
    replayed: int = 0  # answers with Idempotent-Replayed: true
    resolved: int = 0  # requests in doubt, answered at last
    resolved_by_replay: int = 0  # ... the first attempt had been written
    resolved_by_write: int = 0  # ... it had not: the retry wrote it
    refused_507: int = 0  # attempts answered 507 storage_full (sent again with their key)
    conflicts_409: int = 0  # conditional appends answered offset_mismatch (412 since issue 14)
    key_conflicts_412: int = 0  # per-key appends answered key_version_mismatch
    unresolved: int = 0  # left in doubt when the load stopped


class ExactWriters:
    """The exact writers' tasks (mixed into load.Load, whose _request and _writer_number they
    use besides the attributes below)."""

    client: httpx.AsyncClient
    model: Model
    stats: Stats
    gate: Gate
    faults: FaultState
    partitions: dict[str, int]
    rng: random.Random

    def _init_exact(self) -> None:
        self.exact = Exact()
        self.finishing = False  # answer the request at hand, start no new one
        self._exact_running = 0

    def _json_records(self, topic: str, ids: list[int], rng: random.Random, spread: bool) -> list[dict[str, Any]]:
        records = []
        for rid in ids:
            key, value = content(topic, rid)
            record: dict[str, Any] = {
                "key": None if key is None else key.decode(),
                "value": None if value is None else value.decode(),
                "headers": [{"key": "id", "value": str(rid)}],
            }
            if spread and key is None and rng.random() < 0.3:
                record["partition"] = rng.randrange(self.partitions[topic])
            records.append(record)
        return records

    async def _idempotent_producer(self, topic: str) -> None:
        """Every request with a unique Idempotency-Key, retried with it until answered."""
        writer = self._writer_number()
        self.model.exact_writers.add(writer)
        rng = random.Random(self.rng.random())
        codecs = list(CODECS.values())
        seq = 0
        self._exact_running += 1
        try:
            while not self.gate.stopping and not self.finishing:
                n = rng.randint(1, 10)
                ids = [record_id(writer, seq + i) for i in range(n)]
                seq += n
                headers = {"idempotency-key": f"soak-{writer}-{ids[0] & ((1 << 40) - 1)}"}
                partition = rng.randrange(self.partitions[topic])
                url = f"/v1/topics/{topic}/partitions/{partition}/records"
                draw = rng.random()
                if draw < 0.3:  # raw batches: the server stamps the key's producer id on them
                    payload = bytearray()
                    now_ms = int(time.time() * 1000)
                    cut = rng.randint(1, n)
                    for chunk in (ids[:cut], ids[cut:]):
                        if chunk:
                            records = [(*content(topic, rid), now_ms, [id_header(rid)]) for rid in chunk]
                            payload += encode_batch(0, records, compression_type=rng.choice(codecs))
                    body, headers["content-type"] = bytes(payload), RAW
                    placement = _range_placement(partition, len(ids))
                elif draw < 0.5:  # JSON to one partition
                    body = orjson.dumps({"records": self._json_records(topic, ids, rng, False)})
                    headers["content-type"] = "application/json"
                    placement = _range_placement(partition, len(ids))
                else:  # JSON to the topic: keys and the server's spread pick the partitions
                    url = f"/v1/topics/{topic}/records"
                    body = orjson.dumps({"records": self._json_records(topic, ids, rng, True)})
                    headers["content-type"] = "application/json"
                    placement = _offsets_placement
                if await self._exactly_once("produce_idempotent", topic, url, body, headers, ids, placement) is None:
                    return
        finally:
            self._exact_running -= 1

    async def _conditional_producer(self, topic: str, partition: int) -> None:
        """Appends with If-Match at the high watermark it knows; on 409 takes the one the 409
        names and tries again. Each request also has an Idempotency-Key, so one in doubt is
        resolved by sending it again: a replay if it was written (the key is checked before the
        offset), else 409 or a first write."""
        writer = self._writer_number()
        self.model.exact_writers.add(writer)
        self.model.sequenced[(topic, partition)].add(writer)
        seq = 0
        rng = random.Random(self.rng.random())
        url = f"/v1/topics/{topic}/partitions/{partition}/records"
        high_watermark: int | None = None
        self._exact_running += 1
        try:
            while not self.gate.stopping and not self.finishing:
                if high_watermark is None:
                    try:
                        r = await self.client.get(f"/v1/topics/{topic}/partitions/{partition}/offsets")
                        high_watermark = r.json()["high_watermark"] if r.status_code == 200 else None
                    except httpx.TransportError:
                        pass
                    if high_watermark is None:
                        await asyncio.sleep(RETRY_PAUSE_S)
                    continue
                n = rng.randint(1, 3)
                ids = [record_id(writer, seq + i) for i in range(n)]
                headers = {"content-type": "application/json", "idempotency-key": f"cond-{writer}-{seq}",
                           "if-match": f'"{high_watermark}"'}
                body = orjson.dumps({"records": self._json_records(topic, ids, rng, False)})
                answer = await self._exactly_once("produce_conditional", topic, url, body, headers, ids,
                                                  _range_placement(partition, n), conditional=True)
                if answer is None:
                    return
                seq += n
                high_watermark = answer["last_offset"] + 1
        finally:
            self._exact_running -= 1

    async def _key_producer(self, topic: str) -> None:
        """One record at a time to a key of the aggregates topic, conditional on the key's
        version this writer knows; a 412 names the current one (see the module's docstring)."""
        writer = self._writer_number()
        self.model.exact_writers.add(writer)
        seq = 0
        versions: dict[bytes, int] = {}
        self._exact_running += 1
        try:
            while not self.gate.stopping and not self.finishing:
                rid = record_id(writer, seq)
                key, value = content(topic, rid)
                assert key is not None and value is not None
                if key not in versions:
                    try:
                        r = await self.client.get(f"/v1/topics/{topic}/keys/{key.decode()}/records", params={"max_records": 1})
                    except httpx.TransportError:
                        r = None
                    if r is None or r.status_code != 200:
                        await asyncio.sleep(RETRY_PAUSE_S)
                        continue
                    versions[key] = r.json()["latest_offset"]
                headers = {"content-type": "application/json", "idempotency-key": f"key-{writer}-{seq}"}
                _key_condition(headers, versions[key])
                body = orjson.dumps({"records": [{"value": value.decode(), "headers": [{"key": "id", "value": str(rid)}]}]})
                answer = await self._exactly_once("produce_key", topic, f"/v1/topics/{topic}/keys/{key.decode()}/records",
                                                  body, headers, [rid], _key_placement, conditional=True)
                if answer is None:
                    return
                versions[key] = answer["last_offset"]
                seq += 1
        finally:
            self._exact_running -= 1

    async def _exactly_once(self, kind: str, topic: str, url: str, body: bytes, headers: dict[str, str],
                            ids: list[int], placement: Callable[[dict], list[tuple[int, int]]],
                            conditional: bool = False) -> dict | None:
        """Send one request (headers carry its Idempotency-Key) until it is answered; acknowledge
        its records where the answer puts them. None if the load stopped first or the answer was
        unusable (a failure)."""
        x = self.exact
        x.requests += 1
        x.records += len(ids)
        doubted = False  # some attempt's outcome was unknown: it may have been written
        began = self.stats.now()
        overdue = False
        key = headers["idempotency-key"]
        while True:
            mark, started = self.faults.mark(), self.stats.now()
            outcome = await self._request(kind, "POST", url, content=body, headers=headers)
            status = outcome.status_code if isinstance(outcome, httpx.Response) else 0
            if isinstance(outcome, httpx.Response):
                replayed = outcome.headers.get(REPLAYED) == "true"
                self.faults.judge(mark, topic, status, replayed, started, self.model, self.stats)
            if status == 200:
                return self._answered(kind, topic, outcome, ids, placement, doubted, key)
            if outcome == "in_doubt" or (status >= 500 and status != 507):
                if status:
                    self.stats.errors[f"{kind}_{status}"] += 1
                if not doubted:
                    doubted = True
                    x.in_doubt += 1
                    self.model.doubt(topic, ids)
            elif status == 507:
                x.refused_507 += 1  # nothing written; the same key goes again
            elif status in (409, 412) and conditional and outcome.json().get("code") == "offset_mismatch":
                # not written, by this attempt nor (the key is checked first) by an earlier one
                x.conflicts_409 += 1
                self.stats.event("conditional_409")
                headers["if-match"] = f'"{outcome.json()["high_watermark"]}"'
                await asyncio.sleep(_rng_pause())
                continue
            elif status == 412 and conditional and outcome.json().get("code") == "key_version_mismatch":
                x.key_conflicts_412 += 1  # not written: the same request goes with the version named
                self.stats.event("key_conflict_412")
                _key_condition(headers, outcome.json()["current_offset"])
                await asyncio.sleep(_rng_pause())
                continue
            elif status:
                self.model.fail("unexpected_status", f"{kind} ({key}): {status} {outcome.text[:300]}")
                if not doubted:
                    self.model.doubt(topic, ids)  # an earlier attempt may still have been written
                return None
            if self.gate.stopping:
                if doubted:
                    x.unresolved += 1
                return None
            x.retries += 1
            self.stats.event("exact_retry")
            if not overdue and self.stats.now() - began > UNRESOLVED_AFTER_S:
                overdue = True
                self.model.fail("unresolved", f"{kind} ({key}) still unanswered after {UNRESOLVED_AFTER_S:.0f} s")
            await asyncio.sleep(RETRY_PAUSE_S)

    def _answered(self, kind: str, topic: str, r: httpx.Response, ids: list[int],
                  placement: Callable[[dict], list[tuple[int, int]]], doubted: bool, key: str) -> dict | None:
        x = self.exact
        answer = r.json()
        replayed = r.headers.get(REPLAYED) == "true"
        if replayed:
            x.replayed += 1
            self.stats.event("idempotent_replayed")
            if not doubted:
                self.model.fail("bad_replay", f"{kind} ({key}): answered as a replay, but no earlier attempt can "
                                              f"have been written (each was refused or answered 507)")
        try:
            placed = placement(answer)
        except (KeyError, TypeError, ValueError) as exc:
            self.model.fail("bad_answer", f"{kind} ({key}) of {len(ids)} records: {answer} ({exc})")
            return None
        if len(placed) != len(ids):
            self.model.fail("bad_answer", f"{kind} ({key}) of {len(ids)} records: {answer}")
            return None
        if doubted:
            x.resolved += 1
            if replayed:
                x.resolved_by_replay += 1
            else:
                x.resolved_by_write += 1
            self.model.resolve(topic, ids)
        for rid, (partition, offset) in zip(ids, placed, strict=True):
            self.model.ack(topic, partition, offset, rid)
        x.records_answered += len(ids)
        self.stats.op(kind)
        self.stats.op("records_acked", len(ids))
        return answer

    async def settle(self, timeout: float) -> bool:
        """Let the exact writers finish (answer) the request at hand and stop; False on timeout."""
        self.finishing = True
        deadline = self.stats.now() + timeout
        while self._exact_running and self.stats.now() < deadline:
            await asyncio.sleep(0.05)
        return self._exact_running == 0


def _rng_pause() -> float:
    """A short random pause before a conditional retry, so two contenders do not spin."""
    return random.uniform(0.0, 0.02)


def _range_placement(partition: int, n: int) -> Callable[[dict], list[tuple[int, int]]]:
    """Offsets of an answer from a partition endpoint: base_offset .. last_offset."""

    def place(answer: dict) -> list[tuple[int, int]]:
        if answer["partition"] != partition or answer["last_offset"] - answer["base_offset"] + 1 != n:
            raise ValueError(f"expected {n} records in partition {partition}")
        return [(partition, answer["base_offset"] + i) for i in range(n)]

    return place


def _key_condition(headers: dict[str, str], version: int) -> None:
    """If-Match at a key's version, or If-None-Match: * while it has no records."""
    headers.pop("if-match", None)
    headers.pop("if-none-match", None)
    if version >= 0:
        headers["if-match"] = f'"{version}"'
    else:
        headers["if-none-match"] = "*"


def _key_placement(answer: dict) -> list[tuple[int, int]]:
    return [(answer["partition"], offset) for offset in answer["offsets"]]


def _offsets_placement(answer: dict) -> list[tuple[int, int]]:
    return [(o["partition"], o["offset"]) for o in answer["offsets"]]
