"""Produce: the rules between a client's records and the partitions' appends.

The HTTP layer (api/records.py) only translates a request into one of these calls and the
result (or the engine error) into a response; everything a produce decides is here:

* JSON records: the body is parsed (orjson) and checked by hand against the request schema
  (api/schemas.py ProduceRequest is the documented form; BODY_KEYS, RECORD_KEYS and HEADER_KEYS
  are what this parser accepts, and a test holds the two equal), each record to
  (partition, key, value, timestamp, headers), in request order.
* Partitioning: a record's own `partition`; else murmur2(key) as Kafka's default partitioner
  places it; else (no key) round robin over a process-wide counter, or, with an
  Idempotency-Key, from a counter that starts at the key's producer id, so that a retry sends
  unkeyed records where the first attempt did.
* Batching: one v2 batch per partition, encoded here with the topic's compression codec and cut
  (by estimated size first for a big request, then in halves) until each fits
  max.message.bytes (RecordTooLargeError for a single record that does not fit).
* Idempotency-Key: the key names a producer id of its own (top bits 01, out of the way of the
  small ids Kafka hands out); the request's batches carry it (epoch 0) with sequences from 0
  per partition, so the partition's producer state deduplicates a retry like any idempotent
  producer's, and a different request under the same key is IdempotencyKeyReusedError.
* Conditions (engine/conditions.py): typed, never a transport's text. A partition append takes
  an ExpectedOffset (HTTP reads it from If-Match, api/conditions.py) and the JSON body's
  expected_offset (both given, they must agree: ConditionConflictError); either makes the append
  conditional (OffsetMismatchError from the partition, the same error whichever named it: the
  transport chooses its answer), and the records must all go to one partition. A per-key append
  takes a KeyCondition (KeyVersionMismatchError).
* Appends: every partition of a request is appended concurrently; the answer comes once all
  are durable, offsets in request order. A request is all-or-nothing up to the appends: every
  record is checked and encoded before anything is appended.
* Raw produce (Kafka v2 batches): validated (prepare_batches), stamped with the
  Idempotency-Key's producer id when there is one, appended.

What the service uses of a partition is only what a shard's proxy for a partition that another
process owns also offers: `.topic`, `.partition`, `.config` (LogConfig) and
`await .append(batches, expected_offset=, size=)`; of the engine, `.topic(name).partitions`
(its length) and `.partition(topic, p)`. Batches cross to `append` as bytes (PreparedBatch
views), already validated and encoded.

No request may hold the event loop for long (every other request waits meanwhile): work that
grows with a request goes to a worker thread above the sizes below, so inline work stays
around a millisecond or two (docs/OPERATIONS.md, "Limits and slow clients"); the work there is
done in slices (slicing.py). Safe to call from the event loop only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import functools
import hashlib
import itertools
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence, TypeVar

import anyio
import orjson

from . import compression, interface
from .conditions import ExpectedOffset, KeyCondition, key_version
from .config import LogConfig
from .errors import (
    ConditionConflictError,
    IdempotencyKeyReusedError,
    InvalidFieldError,
    InvalidJsonError,
    KeyRequiredError,
    OutOfOrderSequenceError,
    PartitionNotFoundError,
    RecordTooLargeError,
)
from .format import NO_PRODUCER_ID, set_producer
from .metadata import refuse_internal
from .partition_log import AppendResult, PreparedBatch, prepare_batches, wall_clock_ms
from .partitioner import partition_for_key, partitions_for_keys
from .records import encode_batch
from .slicing import JSON_SLICE_BYTES, free_in_slices, gc_paused, loads_in_slices

T = TypeVar("T")

# validating a raw body walks its records (about 0.4 us each)
VALIDATE_IN_THREAD_BYTES = 128 * 1024
# a JSON produce costs about 1 us per record on the loop (parse, check, place, encode, answer;
# 3.3 us before the C builder and the vector murmur2): bodies above this are parsed in a thread,
# and requests of more than INLINE_RECORDS records handled there
INLINE_JSON_BYTES = 128 * 1024
# records per request handled on the loop (check, encode, the offsets answer)
INLINE_RECORDS = 1000

# the fields the JSON parser accepts (api/schemas.py ProduceRequest, ProduceRecord, RecordHeader)
BODY_KEYS = frozenset({"records", "key_format", "value_format", "expected_offset"})
RECORD_KEYS = frozenset({"key", "value", "headers", "timestamp", "partition"})
HEADER_KEYS = frozenset({"key", "value"})
FORMATS = ("string", "base64", "json")

IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
IDEMPOTENT_PRODUCER_BASE = 1 << 62

# a record's bytes beyond its key, value and header bytes: the length, attributes, timestamp
# and offset deltas and the key/value/header lengths, as varints (most are 1-3 bytes)
RECORD_OVERHEAD_BYTES = 24
BATCH_HEADER_BYTES = 61

_spread = itertools.count()

Record = tuple  # (key, value, timestamp, headers): what encode_batch takes


class Partition(Protocol):
    """What produce needs of a partition: a PartitionLog, or a shard's proxy for one."""

    topic: str
    partition: int
    config: LogConfig

    async def append(
        self, batches: Sequence[PreparedBatch], *, expected_offset: int | None = None, size: int | None = None,
        key_condition: tuple[bytes, int] | None = None,
    ) -> AppendResult: ...

    def append_soon(
        self, batches: Sequence[PreparedBatch], callback: Callable[[AppendResult | None, BaseException | None], None],
        *, expected_offset: int | None = None, size: int | None = None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class RawProduced:
    """The answer to a raw produce: `timestamp` is the LogAppendTime if the topic uses it, else
    the largest record timestamp (of the stored batches, for a replay)."""

    partition: int
    base_offset: int
    last_offset: int
    timestamp: int
    replayed: bool


def producer_id_for(principal: str, idempotency_key: str | None) -> int:
    """The producer id an Idempotency-Key stands for (per principal); NO_PRODUCER_ID without one."""
    if idempotency_key is None:
        return NO_PRODUCER_ID
    if not IDEMPOTENCY_KEY.fullmatch(idempotency_key):
        raise InvalidFieldError("Idempotency-Key: 1 to 255 visible ASCII characters")
    digest = hashlib.blake2b(f"{principal}\0{idempotency_key}".encode(), digest_size=8).digest()
    return IDEMPOTENT_PRODUCER_BASE | (int.from_bytes(digest, "big") & (IDEMPOTENT_PRODUCER_BASE - 1))


def expected_offset_in(doc: dict[str, Any]) -> int | None:
    """A JSON produce body's expected_offset (None: not given)."""
    from_body = doc.get("expected_offset")
    if from_body is not None and (type(from_body) is not int or from_body < 0):
        raise InvalidFieldError("expected_offset: must be a non-negative integer")
    return from_body


def expected_offset_of(condition: ExpectedOffset | None, doc: dict[str, Any] | None) -> int | None:
    """The offset a conditional append expects: the request's condition's or the JSON body's
    expected_offset; both given must agree (ConditionConflictError)."""
    from_body = expected_offset_in(doc) if doc is not None else None
    if condition is None:
        return from_body
    if not isinstance(condition, ExpectedOffset):
        raise TypeError(f"a partition append's condition is an ExpectedOffset, not {condition!r}")
    if from_body is not None and from_body != condition.offset:
        raise ConditionConflictError(condition.offset, from_body)
    return condition.offset


# ---------------------------------------------------------------------------------------------
# JSON records


def parse_body(body: bytes | bytearray) -> dict[str, Any]:
    """The JSON object of a produce body (a big one parsed in slices, see slicing.py)."""
    if len(body) > JSON_SLICE_BYTES:
        sliced = loads_in_slices(body)
        if sliced is not None:
            return sliced
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJsonError(str(exc)) from None
    if not isinstance(doc, dict):
        raise InvalidFieldError("request body must be a JSON object")
    return doc


def encode_value(value: Any, fmt: str, what: str) -> bytes | None:
    """A JSON-side key, value or header value to record bytes in format `fmt` (string: UTF-8,
    base64, json: the value's JSON text). None stays None (a null key, a tombstone)."""
    if value is None:
        return None
    if fmt == "string":
        if not isinstance(value, str):
            raise InvalidFieldError(f"{what}: expected a string for format 'string'")
        return value.encode("utf-8", "surrogatepass")
    if fmt == "base64":
        if not isinstance(value, str):
            raise InvalidFieldError(f"{what}: expected a base64 string")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidFieldError(f"{what}: not valid base64") from None
    if fmt == "json":
        return orjson.dumps(value)
    raise InvalidFieldError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")


def _format(doc: dict[str, Any], name: str) -> str:
    fmt = doc.get(name, "string")
    if fmt not in FORMATS:
        raise InvalidFieldError(f"{name}: must be one of {', '.join(FORMATS)}")
    return fmt


def parse_records(
    doc: dict[str, Any], topic: str, partitions: int, *, fixed_partition: int | None, now: int,
    spread: Iterator[int] = _spread,
) -> tuple[list[int], list[Record]]:
    """(the partition of each record, (key, value, timestamp, headers) of each), in request order.

    The hot loop of JSON produce: error messages are built only on the error paths, string keys
    and values (the common case) are encoded inline, and the keys that place their records are
    hashed together afterwards (partitioner.partitions_for_keys).
    """
    records = doc.get("records")
    if not isinstance(records, list) or not records:
        raise InvalidFieldError("records: must be a non-empty list")
    unknown = set(doc) - BODY_KEYS
    if unknown:
        raise InvalidFieldError(f"unknown field(s): {', '.join(sorted(unknown))}")
    key_format = _format(doc, "key_format")
    value_format = _format(doc, "value_format")
    key_is_string = key_format == "string"
    value_is_string = value_format == "string"
    encode = encode_value
    allowed = RECORD_KEYS
    header_keys = HEADER_KEYS
    no_headers = ()
    out: list[Record] = []
    append = out.append
    placed: list[int] = []  # the partition of each record; -1 until its key is hashed
    place = placed.append
    hashed: list[int] = []  # the records whose key places them
    keys: list[bytes] = []
    for i, rec in enumerate(records):
        if type(rec) is not dict:
            raise InvalidFieldError(f"records[{i}]: must be an object")
        if not allowed.issuperset(rec):
            raise InvalidFieldError(f"records[{i}]: unknown field(s): {', '.join(sorted(rec.keys() - allowed))}")
        get = rec.get
        key = get("key")
        if key is not None:
            key = key.encode("utf-8", "surrogatepass") if key_is_string and type(key) is str else encode(key, key_format, f"records[{i}].key")
        value = get("value")
        if value is not None:
            value = value.encode("utf-8", "surrogatepass") if value_is_string and type(value) is str else encode(value, value_format, f"records[{i}].value")
        ts = get("timestamp")
        if ts is None:
            ts = now
        elif type(ts) is not int or not 0 <= ts < 2**63:
            raise InvalidFieldError(f"records[{i}].timestamp: must be a non-negative integer (ms)")
        raw_headers = get("headers")
        if raw_headers:
            if type(raw_headers) is not list:
                raise InvalidFieldError(f"records[{i}].headers: must be a list")
            headers = []
            for j, h in enumerate(raw_headers):
                if type(h) is not dict or type(h.get("key")) is not str or not header_keys.issuperset(h):
                    raise InvalidFieldError(f"records[{i}].headers[{j}]: must be {{\"key\": string, \"value\": ...}}")
                headers.append((h["key"], encode(h.get("value"), value_format, f"records[{i}].headers[{j}].value")))
        else:
            if raw_headers is not None and type(raw_headers) is not list:
                raise InvalidFieldError(f"records[{i}].headers: must be a list")
            headers = no_headers
        partition = get("partition")
        if fixed_partition is not None:
            if partition is not None and (type(partition) is not int or partition != fixed_partition):
                raise InvalidFieldError(f"records[{i}].partition: this endpoint writes partition {fixed_partition}")
            partition = fixed_partition
        elif partition is None:
            if key is not None:
                hashed.append(i)
                keys.append(key)
                partition = -1
            else:
                partition = next(spread) % partitions
        elif type(partition) is not int:
            raise InvalidFieldError(f"records[{i}].partition: must be an integer")
        elif not 0 <= partition < partitions:
            raise PartitionNotFoundError(topic, partition, partitions)
        place(partition)
        append((key, value, ts, headers))
    if hashed:
        for i, p in zip(hashed, partitions_for_keys(keys, partitions)):
            placed[i] = p
    return placed, out


def encode_batches(records: list[Record], log: Partition, producer_id: int = NO_PRODUCER_ID) -> list[PreparedBatch]:
    """One batch per partition, split in halves until each fits max.message.bytes. With a
    producer id, the batches carry it (epoch 0) with consecutive sequences from 0."""
    config = log.config
    codec = compression.CODECS.get(config.compression_type, compression.NONE)  # producer/uncompressed: none
    limit = config.max_batch_bytes
    if config.compact and any(r[0] is None for r in records):
        raise KeyRequiredError(log.topic)
    epoch = 0 if producer_id >= 0 else -1

    def build(chunk: list[Record], sequence: int) -> list[PreparedBatch]:
        batch = encode_batch(
            0, chunk, compression_type=codec,
            producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence if producer_id >= 0 else -1,
        )
        if len(batch) > limit:
            if len(chunk) == 1:
                raise RecordTooLargeError(len(batch), limit, "max.message.bytes" if limit == config.max_message_bytes else "segment.bytes")
            mid = len(chunk) // 2
            return build(chunk[:mid], sequence) + build(chunk[mid:], sequence + mid)
        out = prepare_batches(batch, config, check_records=False)
        if config.key_index and len(out) == 1:  # the key index's input, known here
            out[0].keys = [r[0] for r in chunk]
        return out

    if codec != compression.NONE or len(records) <= INLINE_RECORDS:
        return build(records, 0)
    # a big request: encoding it whole, then in halves until each fits, would encode every
    # record log2(size / limit) times; cut it by estimated size first (halving stays the
    # fallback should an estimate fall short)
    out: list[PreparedBatch] = []
    sequence = 0
    for chunk in cut_by_size(records, limit - BATCH_HEADER_BYTES):
        out += build(chunk, sequence)
        sequence += len(chunk)
    return out


def cut_by_size(records: list[Record], limit: int) -> list[list[Record]]:
    """Consecutive runs of records whose estimated encoded size fits `limit`."""
    chunks = []
    start = 0
    size = 0
    for i, (k, v, _ts, h) in enumerate(records):
        n = RECORD_OVERHEAD_BYTES + (len(k) if k is not None else 0) + (len(v) if v is not None else 0)
        if h:
            n += sum(len(hk) * 3 + (len(hv) if hv is not None else 0) + 10 for hk, hv in h)
        if size + n > limit and i > start:
            chunks.append(records[start:i])
            start, size = i, 0
        size += n
    chunks.append(records[start:])
    return chunks


@dataclass(slots=True)
class _PreparedJson:
    partitions: list[int]  # of each record, in request order
    records: list[Record]  # in request order
    groups: dict[int, tuple[Partition, list[PreparedBatch]]]  # partition -> (log, batches)
    expected_offset: int | None
    producer_id: int
    now: int


def _offsets(prepared: _PreparedJson, results: dict[int, AppendResult]) -> list[dict[str, int]]:
    """{partition, offset, timestamp} per record, in request order: the i-th record of partition
    p is result.base_offset + i (the batches of one append get consecutive offsets)."""
    now = prepared.now
    next_offset = {p: r.base_offset for p, r in results.items()}
    if all(not r.duplicate and r.log_append_time < 0 for r in results.values()):  # the usual case
        out = []
        append = out.append
        for p, rec in zip(prepared.partitions, prepared.records):
            offset = next_offset[p]
            next_offset[p] = offset + 1
            append({"partition": p, "offset": offset, "timestamp": rec[2]})
        return out
    out = []
    for p, (_k, _v, ts, _h) in zip(prepared.partitions, prepared.records):
        offset = next_offset[p]
        next_offset[p] = offset + 1
        result = results[p]
        if result.duplicate and ts == now:  # the first attempt stamped its own time
            ts = result.batch_max_timestamps[bisect.bisect_right(result.batch_base_offsets, offset) - 1]
        out.append({
            "partition": p,
            "offset": offset,
            "timestamp": result.log_append_time if result.log_append_time >= 0 else ts,
        })
    return out


# ---------------------------------------------------------------------------------------------
# the service


class ProduceService:
    """Produce requests against one engine (a LogManager, or a shard's view of the family)."""

    def __init__(self, engine: interface.Engine) -> None:
        self.engine = engine

    def partition(self, topic: str, partition: int) -> interface.Partition:
        """The partition a produce to (topic, partition) writes: refuses internal topics, and
        raises TopicNotFoundError, PartitionNotFoundError, PartitionOfflineError. A router calls
        it before reading the body."""
        refuse_internal(topic)
        return self.engine.partition(topic, partition)

    # -- JSON ----------------------------------------------------------------------------------

    async def produce_json(
        self,
        topic: str,
        body: bytes | bytearray,
        *,
        partition: int | None = None,
        principal: str = "",
        idempotency_key: str | None = None,
        condition: ExpectedOffset | None = None,
        answer: Callable[[list[dict[str, int]]], T],
    ) -> tuple[T, bool]:
        """(answer(offsets in request order), whether the whole request was a replay of an
        earlier one). `partition`: the records go there (the partition route). `condition`: the
        partition's next offset must be this (with the body's expected_offset, if any, equal to
        it; OffsetMismatchError otherwise). `answer` turns
        the offsets into what the caller sends (it runs where the rest of the request ran:
        inline, or in a worker thread for a big one; the list is emptied once it returns). A big request is parsed, checked, encoded
        and answered in worker threads, and its million objects are freed there too (freeing
        them takes a while as well)."""
        refuse_internal(topic)
        state = self.engine.topic(topic)
        if partition is not None:
            self.engine.partition(topic, partition)
        prepare = functools.partial(
            self._prepare_json, topic, len(state.partitions), partition, principal, idempotency_key, condition,
            wall_clock_ms(),
        )
        doc = None
        big = len(body) > INLINE_JSON_BYTES
        if not big:
            doc = parse_body(body)
            records_in = doc.get("records")
            big = type(records_in) is list and len(records_in) > INLINE_RECORDS
            del records_in
        if not big:
            prepared = prepare(doc)
            results = await self._append_all(prepared)
            return self._answer(prepared, results, answer), all(r.duplicate for r in results.values())
        with gc_paused():
            prepared = await anyio.to_thread.run_sync(prepare, body if doc is None else doc)
            del doc
            try:
                results = await self._append_all(prepared)
            except Exception:
                await anyio.to_thread.run_sync(free_in_slices, prepared.records)
                raise
            finish = functools.partial(self._answer, prepared, results, answer)
            return await anyio.to_thread.run_sync(finish), all(r.duplicate for r in results.values())

    def _prepare_json(
        self, topic: str, partitions: int, fixed_partition: int | None, principal: str,
        idempotency_key: str | None, condition: ExpectedOffset | None, now: int,
        body: bytes | bytearray | dict[str, Any],
    ) -> _PreparedJson:
        """Parse (unless given the document), check and encode a JSON produce; raises on bad input."""
        doc = body if isinstance(body, dict) else parse_body(body)
        expected_offset = expected_offset_of(condition, doc)
        producer_id = producer_id_for(principal, idempotency_key)
        # a retry must send unkeyed records to the same partitions as the first attempt
        spread = itertools.count(producer_id) if producer_id >= 0 else _spread
        placed, records = parse_records(doc, topic, partitions, fixed_partition=fixed_partition, now=now, spread=spread)
        if fixed_partition is not None or partitions == 1:
            by_partition: dict[int, list[Record]] = {placed[0]: records}
        else:
            by_partition = {}
            for p, rec in zip(placed, records):
                group = by_partition.get(p)
                if group is None:
                    by_partition[p] = [rec]
                else:
                    group.append(rec)
        if expected_offset is not None and len(by_partition) > 1:
            raise InvalidFieldError("expected_offset: the records go to several partitions; a conditional append writes one")
        groups: dict[int, tuple[Partition, list[PreparedBatch]]] = {}
        for p, recs in by_partition.items():
            log = self.engine.partition(topic, p)
            groups[p] = (log, encode_batches(recs, log, producer_id))
        if type(doc.get("records")) is list:
            free_in_slices(doc["records"])
        return _PreparedJson(placed, records, groups, expected_offset, producer_id, now)

    @staticmethod
    def _answer(
        prepared: _PreparedJson, results: dict[int, AppendResult], answer: Callable[[list[dict[str, int]]], T]
    ) -> T:
        out = _offsets(prepared, results)
        free_in_slices(prepared.records)
        free_in_slices(prepared.partitions)
        try:
            return answer(out)
        finally:
            free_in_slices(out)

    async def _append_all(self, prepared: _PreparedJson) -> dict[int, AppendResult]:
        """Append each partition's batches, all partitions at once, and wait for every append;
        the first refusal in request order is the answer (the other partitions' appends may have
        happened: each is its own unit). On asyncio the appends are plain tasks: anyio's task
        group (its cancel scopes, and a getpid() per backend lookup in Python 3.11) cost more
        than the appends' own work on the event loop."""
        groups = prepared.groups
        expected_offset, producer_id = prepared.expected_offset, prepared.producer_id
        if len(groups) == 1:
            (p, (log, batches)), = groups.items()
            return {p: await _append(log, batches, expected_offset, producer_id)}
        loop = _asyncio_loop()
        if loop is None:
            return await self._append_all_anyio(prepared)
        # Each partition's writer (or owner shard) calls back as it finishes; the last one
        # wakes this request. (A task per append cost two more loop turns per request, and
        # under load a turn is milliseconds.) A cancelled request leaves its queued appends
        # to finish: they are units of their own.
        everything = loop.create_future()
        results: dict[int, AppendResult] = {}
        errors: dict[int, BaseException] = {}
        left = len(groups)

        def done(p: int, result: AppendResult | None, error: BaseException | None) -> None:
            nonlocal left
            if error is not None:
                errors[p] = error
            else:
                results[p] = result  # type: ignore[assignment]
            left -= 1
            if left == 0 and not everything.done():
                everything.set_result(None)

        for p, (log, batches) in groups.items():
            try:
                log.append_soon(batches, functools.partial(done, p), expected_offset=expected_offset)
            except Exception as exc:
                done(p, None, exc)
        await everything
        for p in groups:
            if p in errors:
                raise _append_error(errors[p], producer_id)
        return results

    async def _append_all_anyio(self, prepared: _PreparedJson) -> dict[int, AppendResult]:
        results: dict[int, AppendResult] = {}

        async def one(p: int, log: Partition, batches: list[PreparedBatch]) -> None:
            try:
                results[p] = await _append(log, batches, prepared.expected_offset, prepared.producer_id)
            except Exception as exc:
                errors[p] = exc

        errors: dict[int, Exception] = {}
        async with anyio.create_task_group() as tg:
            for p, (log, batches) in prepared.groups.items():
                tg.start_soon(one, p, log, batches)
        for p in prepared.groups:
            if p in errors:
                raise errors[p]
        return results

    # -- raw Kafka batches -----------------------------------------------------------------------

    async def produce_raw(
        self,
        topic: str,
        partition: int,
        body: bytearray,
        *,
        principal: str = "",
        idempotency_key: str | None = None,
        condition: ExpectedOffset | None = None,
        max_inflated_bytes: int | None = None,
        queued: Callable[[], None] | None = None,
    ) -> RawProduced:
        """Append the v2 batches of `body` (rewritten in place: offsets, and the Idempotency-Key's
        producer id), if the partition's next offset is `condition`'s (OffsetMismatchError
        otherwise). Compressed batches inflate to at most `max_inflated_bytes` in all. A big
        body (it may hold a million small batches) is checked in a worker thread and its batch
        objects are freed there. `queued` is called once the append has its place in the
        partition's queue (appends queued later come after it: a Kafka connection's pipelined
        requests keep their order, broker/listener.py)."""
        log = self.partition(topic, partition)
        expected_offset = expected_offset_of(condition, None)
        producer_id = producer_id_for(principal, idempotency_key)
        prepare = functools.partial(prepare_raw, body, log, producer_id, max_inflated_bytes)
        if len(body) <= VALIDATE_IN_THREAD_BYTES:
            batches, max_timestamp = prepare()
            result = await _append(
                log, batches, expected_offset, producer_id, len(body), queued=queued
            )
        else:
            with gc_paused():
                batches, max_timestamp = await anyio.to_thread.run_sync(prepare)
                try:
                    result = await _append(
                        log, batches, expected_offset, producer_id, len(body), queued=queued
                    )
                except Exception:  # the append is over (a cancelled one may still be queued: left alone)
                    await anyio.to_thread.run_sync(free_in_slices, batches)
                    raise
                await anyio.to_thread.run_sync(free_in_slices, batches)
        if result.log_append_time >= 0:
            timestamp = result.log_append_time
        elif result.duplicate:
            timestamp = max(result.batch_max_timestamps)
        else:
            timestamp = max_timestamp
        return RawProduced(partition, result.base_offset, result.last_offset, timestamp, result.duplicate)

    async def produce_key(
        self,
        topic: str,
        key: bytes,
        body: bytes | bytearray,
        *,
        principal: str = "",
        idempotency_key: str | None = None,
        condition: KeyCondition | None = None,
    ) -> KeyProduced:
        """Append a per-key append's records (docs/API.md, "Per-key event streams") to the key's
        partition (murmur2, as Kafka places a keyed record) as one unit, if the key's latest
        record meets `condition` (KeyVersionMismatchError otherwise)."""
        refuse_internal(topic)
        state = self.engine.topic(topic)
        key_condition = (key, key_version(condition)) if condition is not None else None
        producer_id = producer_id_for(principal, idempotency_key)
        log = self.engine.partition(topic, partition_for_key(key, len(state.partitions)))
        partition = log.partition
        now = wall_clock_ms()

        def prepare() -> list[PreparedBatch]:
            return encode_batches(parse_key_records(parse_body(body), key, now), log, producer_id)

        # a big body is parsed and encoded in a worker thread, as produce_json does
        batches = prepare() if len(body) <= INLINE_JSON_BYTES else await anyio.to_thread.run_sync(prepare)
        result = await _append(log, batches, None, producer_id, key_condition=key_condition)
        offsets = []
        for base, batch in zip(result.batch_base_offsets, batches):
            offsets.extend(range(base, base + batch.record_count))
        return KeyProduced(partition, offsets, result.duplicate)


# ---------------------------------------------------------------------------------------------
# per-key appends


KEY_BODY_KEYS = frozenset({"records", "value_format"})
KEY_RECORD_KEYS = frozenset({"value", "headers", "timestamp"})


@dataclass(frozen=True, slots=True)
class KeyProduced:
    """The answer to a per-key append: the records' offsets (the last is the key's new ETag)."""

    partition: int
    offsets: list[int]
    replayed: bool


def parse_key_records(doc: dict[str, Any], key: bytes, now: int) -> list[Record]:
    """(key, value, timestamp, headers) of a per-key append's records: the key is the path's."""
    unknown = set(doc) - KEY_BODY_KEYS
    if unknown:
        raise InvalidFieldError(f"unknown field(s): {', '.join(sorted(unknown))} (the key comes from the path)")
    records = doc.get("records")
    if not isinstance(records, list) or not records:
        raise InvalidFieldError("records: must be a non-empty list")
    for i, rec in enumerate(records):
        if type(rec) is dict and not KEY_RECORD_KEYS.issuperset(rec):
            extra = sorted(rec.keys() - KEY_RECORD_KEYS)
            why = " (the key and the partition come from the path)" if {"key", "partition"} & set(extra) else ""
            raise InvalidFieldError(f"records[{i}]: unknown field(s): {', '.join(extra)}{why}")
    _placed, out = parse_records(doc, "", 1, fixed_partition=0, now=now)
    return [(key, value, ts, headers) for _key, value, ts, headers in out]


def prepare_raw(
    body: bytearray, log: Partition, producer_id: int, max_inflated_bytes: int | None
) -> tuple[list[PreparedBatch], int]:
    """(validated batches, carrying the Idempotency-Key's producer id if any, their max
    timestamp)."""
    batches = prepare_batches(body, log.config, topic=log.topic, max_inflated_bytes=max_inflated_bytes)
    if producer_id >= 0:
        batches = stamp_producer(batches, producer_id)
    return batches, max(b.header.max_timestamp for b in batches)


def stamp_producer(batches: list[PreparedBatch], producer_id: int) -> list[PreparedBatch]:
    """Give raw batches without a producer id the Idempotency-Key's, sequences from 0."""
    if any(b.header.producer_id != NO_PRODUCER_ID for b in batches):
        raise InvalidFieldError("Idempotency-Key: these batches carry their own producer id (Kafka's idempotent producer)")
    out = []
    sequence = 0
    for b in batches:
        set_producer(b.data, 0, b.header.size, producer_id, 0, sequence)
        out.append(PreparedBatch(b.data, b.header._replace(producer_id=producer_id, producer_epoch=0, base_sequence=sequence)))
        sequence += b.header.last_offset_delta + 1
    return out


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # not on asyncio
        return None


async def _append(
    log: Partition, batches: list[PreparedBatch], expected_offset: int | None, producer_id: int, size: int | None = None,
    *, key_condition: tuple[bytes, int] | None = None, queued: Callable[[], None] | None = None,
) -> AppendResult:
    """log.append; a sequence error of an Idempotency-Key's producer id means the key was
    reused for another request. With `queued`: through append_soon, which queues at once (in
    call order, also while the queue is full), calling `queued` then."""
    try:
        if queued is not None:
            future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()

            def answered(result: AppendResult | None, error: BaseException | None) -> None:
                if future.done():
                    return
                if error is None:
                    future.set_result(result)  # type: ignore[arg-type]
                else:
                    future.set_exception(error)

            log.append_soon(batches, answered, expected_offset=expected_offset, size=size)
            queued()
            return await future
        if key_condition is not None:
            return await log.append(batches, expected_offset=expected_offset, size=size, key_condition=key_condition)
        return await log.append(batches, expected_offset=expected_offset, size=size)
    except OutOfOrderSequenceError as exc:
        raise _append_error(exc, producer_id) from None


def _append_error(error: BaseException, producer_id: int) -> BaseException:
    """What a refused append answers: a sequence error of an Idempotency-Key's producer id means
    the key was reused for another request."""
    if isinstance(error, OutOfOrderSequenceError) and producer_id >= 0:
        return IdempotencyKeyReusedError(producer_id)
    return error
