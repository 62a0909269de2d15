"""Produce and fetch.

Produce bodies are parsed with orjson and checked here by hand (the pydantic models in
schemas.py document them); a request is all-or-nothing: every record is checked and encoded
before anything is appended. Records are grouped by partition, one batch (or a few, when
max.message.bytes forces a split) per partition, and all partitions are appended concurrently;
the response lists offsets in request order once every append is durable.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import re
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import anyio
import orjson
from fastapi import APIRouter, Header, Query, Request
from starlette.responses import Response, StreamingResponse

from engine import compression
from engine.errors import (
    CorruptDataError,
    KeyRequiredError,
    LogClosedError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PartitionNotFoundError,
    RecordTooLargeError,
    StorageError,
    TopicDeletedError,
)
from engine.format import NO_PRODUCER_ID, set_producer
from engine.partition_log import (
    INLINE_READ_BYTES,
    AppendResult,
    PartitionLog,
    PreparedBatch,
    prepare_batches,
    wall_clock_ms,
)
from engine.partitioner import partition_for_key
from engine.reader import RecordsResult
from engine.records import encode_batch

from . import formats
from .auth import Principal, Reader, Writer
from .deps import Engine, refuse_internal
from .errors import ApiError, ServerPaths
from .responses import FileRangeResponse, PartsResponse
from .schemas import FetchResponse, Format, PartitionProduceResponse, ProduceResponse, Problem
from .slicing import JSON_SLICE_BYTES, dumps_parts, free_in_slices, gc_paused, loads_in_slices

router = APIRouter(prefix="/v1/topics", tags=["records"])
T = TypeVar("T")

RECORD_BATCH_MEDIA_TYPE = "application/vnd.kafka.record-batch.v2"
# No request may hold the event loop for long (every other request waits meanwhile): work that
# grows with a request goes to a worker thread above these sizes, so inline work stays around
# a millisecond or two (docs/OPERATIONS.md, "Limits and slow clients"); the work there is done
# in slices (slicing.py).
# validating a raw body walks its records (about 0.4 us each)
VALIDATE_IN_THREAD_BYTES = 128 * 1024
# a JSON produce costs about 1 us per record (parse, check, encode, answer): bodies above this
# are parsed in a thread, and requests of more than INLINE_RECORDS records handled there
INLINE_JSON_BYTES = 64 * 1024
# records per request handled on the loop: produce (check, encode, the offsets answer) and
# fetch (decode, JSON); the SSE stream's chunks (500 records) stay under it
INLINE_RECORDS = 1000
# a request body's declared length is allocated at once up to this (see _read_body)
PREALLOCATE_BYTES = 1024 * 1024
_RECORD_KEYS = frozenset({"key", "value", "headers", "timestamp", "partition"})
_BODY_KEYS = frozenset({"records", "key_format", "value_format", "expected_offset"})
_spread = itertools.count()

# Idempotency-Key: the key names a producer id of its own (top bits 01, out of the way of
# the small ids Kafka hands out), whose batches are deduplicated like any idempotent producer's
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
IDEMPOTENT_PRODUCER_BASE = 1 << 62
REPLAYED_HEADER = "Idempotent-Replayed"

_auth_problems: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "unauthorized"},
    403: {"model": Problem, "description": "forbidden"},
}
_produce_problems: dict[int | str, dict[str, Any]] = {
    **_auth_problems,
    400: {"model": Problem, "description": "invalid_json, corrupt_batch, transactions_unsupported, invalid_request (an internal topic)"},
    404: {"model": Problem, "description": "topic_not_found, partition_not_found"},
    409: {"model": Problem, "description": "offset_mismatch (expected_offset / If-Match), out_of_order_sequence, producer_fenced"},
    413: {"model": Problem, "description": "record_too_large, request_too_large (the body, or what its compressed batches inflate to)"},
    415: {"model": Problem, "description": "unsupported_media_type"},
    422: {"model": Problem, "description": "validation_error, key_required, idempotency_key_reused"},
    503: {"model": Problem, "description": "unavailable: the server is shutting down; partition_offline; too_many_open_files (Retry-After): nothing was written"},
    507: {"model": Problem, "description": "storage_full: the disk is full; nothing was written"},
}


IDEMPOTENCY_KEY_DOC = (
    "Makes the request safe to retry: a repeat with the same key (same token, within "
    "EVENTLOG_PRODUCER_ID_EXPIRATION_MS) writes nothing and returns the first attempt's offsets "
    "(header Idempotent-Replayed: true); 1-255 visible ASCII characters"
)
IF_MATCH_DOC = (
    'Conditional append: `"<offset>"` — append only if the partition\'s next offset (high watermark) '
    "is this, else 409 offset_mismatch; the same as the JSON field expected_offset"
)


def idempotent_producer_id(principal: Principal, request: Request) -> int:
    """The producer id an Idempotency-Key header stands for; NO_PRODUCER_ID without one."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return NO_PRODUCER_ID
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise ApiError(422, "validation_error", "Idempotency-Key: 1 to 255 visible ASCII characters")
    digest = hashlib.blake2b(f"{principal.name}\0{key}".encode(), digest_size=8).digest()
    return IDEMPOTENT_PRODUCER_BASE | (int.from_bytes(digest, "big") & (IDEMPOTENT_PRODUCER_BASE - 1))


def _expected_offset(request: Request, doc: dict[str, Any] | None) -> int | None:
    """The conditional-append offset from If-Match (`"42"`, `42`, `*` = none) or the body's
    expected_offset; both given must agree."""
    from_body = doc.get("expected_offset") if doc is not None else None
    if from_body is not None and (type(from_body) is not int or from_body < 0):
        raise ApiError(422, "validation_error", "expected_offset: must be a non-negative integer")
    header = request.headers.get("if-match")
    from_header = None
    if header is not None and header.strip() != "*":
        text = header.strip()
        if len(text) >= 2 and text[0] == text[-1] == '"':
            text = text[1:-1]
        if not text.isdigit() or not text.isascii():
            raise ApiError(422, "validation_error", 'If-Match: must be an offset, e.g. "42" (or *)')
        from_header = int(text)
    if from_body is not None and from_header is not None and from_body != from_header:
        raise ApiError(422, "validation_error", "If-Match and expected_offset disagree")
    return from_body if from_body is not None else from_header


def _idempotency_conflict() -> ApiError:
    return ApiError(
        422, "idempotency_key_reused",
        "this Idempotency-Key was used for a different request (another number of records or partitions)",
    )


def _record_bytes(record: Any) -> int:
    return 48 + len(record.key or b"") + len(record.value or b"") + sum(len(k) + len(v or b"") for k, v in record.headers)


def _json_body(body: bytes | bytearray) -> dict[str, Any]:
    if len(body) > JSON_SLICE_BYTES:
        sliced = loads_in_slices(body)
        if sliced is not None:
            return sliced
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"request body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError(422, "validation_error", "request body must be a JSON object")
    return doc


def _format(doc: dict[str, Any], name: str) -> str:
    fmt = doc.get(name, "string")
    if fmt not in formats.FORMATS:
        raise ApiError(422, "validation_error", f"{name}: must be one of {', '.join(formats.FORMATS)}")
    return fmt


def _parse_records(
    doc: dict[str, Any], topic: str, partitions: int, *, fixed_partition: int | None, now: int, spread: Any = _spread
) -> list[tuple[int, bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]]:
    """(partition, key, value, timestamp, headers) for each record, in request order.

    The hot loop of JSON produce: error messages are built only on the error paths, and
    string keys and values (the common case) are encoded inline.
    """
    records = doc.get("records")
    if not isinstance(records, list) or not records:
        raise ApiError(422, "validation_error", "records: must be a non-empty list")
    unknown = set(doc) - _BODY_KEYS
    if unknown:
        raise ApiError(422, "validation_error", f"unknown field(s): {', '.join(sorted(unknown))}")
    key_format = _format(doc, "key_format")
    value_format = _format(doc, "value_format")
    key_is_string = key_format == "string"
    value_is_string = value_format == "string"
    encode = formats.encode
    allowed = _RECORD_KEYS
    out = []
    for i, rec in enumerate(records):
        if type(rec) is not dict:
            raise ApiError(422, "validation_error", f"records[{i}]: must be an object")
        if not allowed.issuperset(rec):
            raise ApiError(422, "validation_error", f"records[{i}]: unknown field(s): {', '.join(sorted(rec.keys() - allowed))}")
        key = rec.get("key")
        if key is not None:
            key = key.encode("utf-8", "surrogatepass") if key_is_string and type(key) is str else encode(key, key_format, f"records[{i}].key")
        value = rec.get("value")
        if value is not None:
            value = value.encode("utf-8", "surrogatepass") if value_is_string and type(value) is str else encode(value, value_format, f"records[{i}].value")
        ts = rec.get("timestamp")
        if ts is None:
            ts = now
        elif type(ts) is not int or not 0 <= ts < 2**63:
            raise ApiError(422, "validation_error", f"records[{i}].timestamp: must be a non-negative integer (ms)")
        headers = []
        raw_headers = rec.get("headers")
        if raw_headers:
            if type(raw_headers) is not list:
                raise ApiError(422, "validation_error", f"records[{i}].headers: must be a list")
            for j, h in enumerate(raw_headers):
                if type(h) is not dict or type(h.get("key")) is not str or not h.keys() <= {"key", "value"}:
                    raise ApiError(422, "validation_error", f"records[{i}].headers[{j}]: must be {{\"key\": string, \"value\": ...}}")
                headers.append((h["key"], encode(h.get("value"), value_format, f"records[{i}].headers[{j}].value")))
        elif raw_headers is not None and type(raw_headers) is not list:
            raise ApiError(422, "validation_error", f"records[{i}].headers: must be a list")
        partition = rec.get("partition")
        if fixed_partition is not None:
            if partition is not None and (type(partition) is not int or partition != fixed_partition):
                raise ApiError(422, "validation_error", f"records[{i}].partition: this endpoint writes partition {fixed_partition}")
            partition = fixed_partition
        elif partition is None:
            partition = partition_for_key(key, partitions) if key is not None else next(spread) % partitions
        elif type(partition) is not int:
            raise ApiError(422, "validation_error", f"records[{i}].partition: must be an integer")
        elif not 0 <= partition < partitions:
            raise PartitionNotFoundError(topic, partition, partitions)
        out.append((partition, key, value, ts, headers))
    return out


def _encode_batches(records: list[tuple], log: PartitionLog, producer_id: int = NO_PRODUCER_ID) -> list[PreparedBatch]:
    """One batch per partition, split in halves until each fits max.message.bytes. With a
    producer id, the batches carry it (epoch 0) with consecutive sequences from 0."""
    config = log.config
    codec = compression.CODECS.get(config.compression_type, compression.NONE)  # producer/uncompressed: none
    limit = config.max_batch_bytes
    if config.compact and any(r[1] is None for r in records):
        raise KeyRequiredError(log.topic)
    epoch = 0 if producer_id >= 0 else -1

    def build(chunk: list[tuple], sequence: int) -> list[PreparedBatch]:
        batch = encode_batch(
            0, [(k, v, ts, h) for _p, k, v, ts, h in chunk], compression_type=codec,
            producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence if producer_id >= 0 else -1,
        )
        if len(batch) > limit:
            if len(chunk) == 1:
                raise RecordTooLargeError(len(batch), limit, "max.message.bytes" if limit == config.max_message_bytes else "segment.bytes")
            mid = len(chunk) // 2
            return build(chunk[:mid], sequence) + build(chunk[mid:], sequence + mid)
        return prepare_batches(batch, config, check_records=False)

    if codec != compression.NONE or len(records) <= INLINE_RECORDS:
        return build(records, 0)
    # a big request: encoding it whole, then in halves until each fits, would encode every
    # record log2(size / limit) times; cut it by estimated size first (halving stays the
    # fallback should an estimate fall short)
    out: list[PreparedBatch] = []
    sequence = 0
    for chunk in _cut_by_size(records, limit - BATCH_HEADER_BYTES):
        out += build(chunk, sequence)
        sequence += len(chunk)
    return out


# a record's bytes beyond its key, value and header bytes: the length, attributes, timestamp
# and offset deltas and the key/value/header lengths, as varints (most are 1-3 bytes)
RECORD_OVERHEAD_BYTES = 24
BATCH_HEADER_BYTES = 61


def _cut_by_size(records: list[tuple], limit: int) -> list[list[tuple]]:
    """Consecutive runs of records whose estimated encoded size fits `limit`."""
    chunks = []
    start = 0
    size = 0
    for i, (_p, k, v, _ts, h) in enumerate(records):
        n = RECORD_OVERHEAD_BYTES + (len(k) if k is not None else 0) + (len(v) if v is not None else 0)
        if h:
            n += sum(len(hk) * 3 + (len(hv) if hv is not None else 0) + 10 for hk, hv in h)
        if size + n > limit and i > start:
            chunks.append(records[start:i])
            start, size = i, 0
        size += n
    chunks.append(records[start:])
    return chunks


async def _append_all(
    groups: dict[int, tuple[PartitionLog, list[PreparedBatch]]],
    expected_offset: int | None = None,
    producer_id: int = NO_PRODUCER_ID,
) -> dict[int, AppendResult]:
    results: dict[int, AppendResult] = {}

    async def one(p: int, log: PartitionLog, batches: list[PreparedBatch]) -> None:
        try:
            results[p] = await log.append(batches, expected_offset=expected_offset)
        except OutOfOrderSequenceError:
            if producer_id < 0:
                raise
            raise _idempotency_conflict() from None

    if len(groups) == 1:
        (p, (log, batches)), = groups.items()
        await one(p, log, batches)
        return results
    try:
        async with anyio.create_task_group() as tg:
            for p, (log, batches) in groups.items():
                tg.start_soon(one, p, log, batches)
    except ExceptionGroup as group:  # one partition's refusal is the answer (the first one)
        first = group
        while isinstance(first, ExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return results


async def _produce_json(
    engine, topic: str, body: bytes | bytearray, fixed_partition: int | None, request: Request, principal: Principal,
    answer: Callable[[list[dict[str, int]]], T],
) -> tuple[T, bool]:
    """(answer(offsets in request order), whether the whole request was a replay of an earlier
    one). A big request is parsed, checked, encoded and answered in worker threads, and its
    million objects are freed there too (freeing them takes a while as well)."""
    refuse_internal(topic)
    state = engine.topic(topic)
    if fixed_partition is not None:
        engine.partition(topic, fixed_partition)
    prepare = functools.partial(
        _prepare_json, engine, request, principal, topic, len(state.partitions), fixed_partition, wall_clock_ms()
    )
    doc = None
    big = len(body) > INLINE_JSON_BYTES
    if not big:
        doc = _json_body(body)
        records_in = doc.get("records")
        big = type(records_in) is list and len(records_in) > INLINE_RECORDS
        del records_in
    if not big:
        prepared = prepare(doc)
        results = await _append_all(prepared.groups, prepared.expected_offset, prepared.producer_id)
        return _offsets_answer(prepared, results, answer), all(r.duplicate for r in results.values())
    with gc_paused():
        prepared = await anyio.to_thread.run_sync(prepare, body if doc is None else doc)
        del doc
        try:
            results = await _append_all(prepared.groups, prepared.expected_offset, prepared.producer_id)
        except Exception:
            await anyio.to_thread.run_sync(free_in_slices, prepared.records)
            raise
        finish = functools.partial(_offsets_answer, prepared, results, answer)
        return await anyio.to_thread.run_sync(finish), all(r.duplicate for r in results.values())


@dataclass(slots=True)
class _PreparedJson:
    records: list[tuple]  # (partition, key, value, timestamp, headers) in request order
    groups: dict[int, tuple[PartitionLog, list[PreparedBatch]]]  # partition -> (log, batches)
    expected_offset: int | None
    producer_id: int
    now: int


def _prepare_json(
    engine, request: Request, principal: Principal, topic: str, partitions: int, fixed_partition: int | None,
    now: int, body: bytes | bytearray | dict[str, Any],
) -> _PreparedJson:
    """Parse (unless given the document), check and encode a JSON produce; raises on bad input."""
    doc = body if isinstance(body, dict) else _json_body(body)
    expected_offset = _expected_offset(request, doc)
    producer_id = idempotent_producer_id(principal, request)
    # a retry must send unkeyed records to the same partitions as the first attempt
    spread = itertools.count(producer_id) if producer_id >= 0 else _spread
    records = _parse_records(doc, topic, partitions, fixed_partition=fixed_partition, now=now, spread=spread)
    by_partition: dict[int, list[tuple]] = {}
    for rec in records:
        by_partition.setdefault(rec[0], []).append(rec)
    if expected_offset is not None and len(by_partition) > 1:
        raise ApiError(422, "validation_error", "expected_offset: the records go to several partitions; a conditional append writes one")
    groups = {}
    for p, recs in by_partition.items():
        log = engine.partition(topic, p)
        groups[p] = (log, _encode_batches(recs, log, producer_id))
    if type(doc.get("records")) is list:
        free_in_slices(doc["records"])
    return _PreparedJson(records, groups, expected_offset, producer_id, now)


def _offsets_answer(
    prepared: _PreparedJson, results: dict[int, AppendResult], answer: Callable[[list[dict[str, int]]], T]
) -> T:
    # offsets in request order: the i-th record of partition p is result.base_offset + i
    # (the batches of one append get consecutive offsets)
    now = prepared.now
    seen: dict[int, int] = {}
    out = []
    for p, _k, _v, ts, _h in prepared.records:
        i = seen.get(p, 0)
        seen[p] = i + 1
        result = results[p]
        offset = result.base_offset + i
        if result.duplicate and ts == now:  # the first attempt stamped its own time
            ts = result.batch_max_timestamps[bisect.bisect_right(result.batch_base_offsets, offset) - 1]
        out.append({
            "partition": p,
            "offset": offset,
            "timestamp": result.log_append_time if result.log_append_time >= 0 else ts,
        })
    free_in_slices(prepared.records)
    try:
        return answer(out)
    finally:
        free_in_slices(out)


def _offsets_body(offsets: list[dict[str, int]]) -> list[bytes]:
    return dumps_parts(offsets, list, b'{"offsets":', {})


def _partition_answer(offsets: list[dict[str, int]]) -> dict[str, int]:
    return {
        "partition": offsets[0]["partition"],
        "base_offset": offsets[0]["offset"],
        "last_offset": offsets[-1]["offset"],
        "timestamp": max(o["timestamp"] for o in offsets),
    }


async def _read_body(request: Request) -> bytearray:
    """The body straight into one writable buffer (offsets are then rewritten in place): no
    joined copy (joining 64 MiB held the event loop ~60 ms), no second copy for prepare_batches.
    Up to PREALLOCATE_BYTES, the declared length is allocated at once; a bigger buffer grows as
    the bytes arrive (zeroing 64 MiB up front held the loop ~55 ms, and would hold the memory of
    a client that declares a big body and sends nothing)."""
    declared = request.headers.get("content-length")
    size = int(declared) if declared and declared.isdigit() else 0
    buf = bytearray(size) if size <= PREALLOCATE_BYTES else bytearray()
    view = memoryview(buf)
    filled = 0
    async for chunk in request.stream():
        n = len(chunk)
        if filled + n <= len(buf):
            view[filled : filled + n] = chunk
        else:
            view.release()
            del buf[filled:]
            buf += chunk
            view = memoryview(buf)
        filled += n
    view.release()
    if filled < len(buf):
        del buf[filled:]
    return buf


def _stream_error(exc: Exception, position: int) -> dict[str, Any]:
    if isinstance(exc, CorruptDataError):
        return {"code": "corrupt_data", "detail": str(exc), "offset": position, "first_offset": exc.first_offset, "last_offset": exc.last_offset}
    if isinstance(exc, TopicDeletedError):
        return {"code": "topic_deleted", "detail": str(exc), "offset": position}
    if isinstance(exc, LogClosedError):
        return {"code": "unavailable", "detail": "the server is shutting down", "offset": position}
    if isinstance(exc, StorageError):
        return {"code": "storage_error", "detail": str(exc), "offset": position}
    if isinstance(exc, OffsetOutOfRangeError):
        return {"code": "offset_out_of_range", "detail": str(exc), "offset": position, "log_start_offset": exc.log_start_offset}
    assert isinstance(exc, ApiError)
    return {"code": exc.code, "detail": exc.detail, "offset": position}


def _records_json(records: list, kf: str, vf: str) -> list[dict[str, Any]]:
    return [
        {
            "offset": r.offset,
            "timestamp": r.timestamp,
            "key": formats.decode(r.key, kf, "key", r.offset),
            "value": formats.decode(r.value, vf, "value", r.offset),
            # a header key that is not UTF-8 shows U+FFFD, as Java's clients decode it
            "headers": [{"key": k if k.isascii() else k.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                         "value": formats.decode(v, vf, "value of header", r.offset)} for k, v in r.headers],
        }
        for r in records
    ]


@router.post(
    "/{topic}/records",
    operation_id="produceRecords",
    response_model=ProduceResponse,
    responses=_produce_problems,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ProduceRequest"}}},
        }
    },
    summary="Produce records (JSON); partitions chosen by murmur2(key) unless given",
)
async def produce(
    topic: str,
    request: Request,
    engine: Engine,
    principal: Writer,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", description=IDEMPOTENCY_KEY_DOC),
) -> Response:
    parts, replayed = await _produce_json(engine, topic, await _read_body(request), None, request, principal, _offsets_body)
    headers = {REPLAYED_HEADER: "true"} if replayed else None
    return PartsResponse(parts, media_type="application/json", headers=headers)


@router.post(
    "/{topic}/partitions/{partition}/records",
    operation_id="produceToPartition",
    response_model=PartitionProduceResponse,
    responses=_produce_problems,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/ProduceRequest"}},
                RECORD_BATCH_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
    summary="Produce to one partition: JSON records, or raw Kafka v2 record batches",
)
async def produce_to_partition(
    topic: str,
    partition: int,
    request: Request,
    engine: Engine,
    principal: Writer,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", description=IDEMPOTENCY_KEY_DOC),
    if_match: str | None = Header(None, alias="If-Match", description=IF_MATCH_DOC),
) -> Response:
    refuse_internal(topic)
    log = engine.partition(topic, partition)
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    body = await _read_body(request)
    if content_type == RECORD_BATCH_MEDIA_TYPE:
        expected_offset = _expected_offset(request, None)
        producer_id = idempotent_producer_id(principal, request)
        max_inflated = request.app.state.settings.max_inflated_bytes_per_request
        result, max_timestamp = await _produce_raw(log, body, expected_offset, producer_id, max_inflated)
        if result.log_append_time >= 0:
            timestamp = result.log_append_time
        elif result.duplicate:
            timestamp = max(result.batch_max_timestamps)
        else:
            timestamp = max_timestamp
        payload = {"partition": partition, "base_offset": result.base_offset, "last_offset": result.last_offset, "timestamp": timestamp}
        replayed = result.duplicate
    elif content_type in ("application/json", ""):
        payload, replayed = await _produce_json(engine, topic, body, partition, request, principal, _partition_answer)
    else:
        raise ApiError(415, "unsupported_media_type", f"use application/json or {RECORD_BATCH_MEDIA_TYPE}")
    # the offset a follow-up conditional append expects (If-Match)
    headers = {"ETag": f'"{payload["last_offset"] + 1}"'}
    if replayed:
        headers[REPLAYED_HEADER] = "true"
    return Response(orjson.dumps(payload), media_type="application/json", headers=headers)


async def _produce_raw(
    log: PartitionLog, body: bytearray, expected_offset: int | None, producer_id: int, max_inflated_bytes: int
) -> tuple[AppendResult, int]:
    """(the append's result, the batches' max timestamp). A big body (it may hold a million
    small batches) is checked in a worker thread and its batch objects are freed there."""
    prepare = functools.partial(_prepare_raw, body, log, producer_id, max_inflated_bytes)
    if len(body) <= VALIDATE_IN_THREAD_BYTES:
        batches, max_timestamp = prepare()
        return await _append_raw(log, batches, expected_offset, producer_id, len(body)), max_timestamp
    with gc_paused():
        batches, max_timestamp = await anyio.to_thread.run_sync(prepare)
        try:
            result = await _append_raw(log, batches, expected_offset, producer_id, len(body))
        except Exception:  # the append is over (a cancelled one may still be queued: left alone)
            await anyio.to_thread.run_sync(free_in_slices, batches)
            raise
        await anyio.to_thread.run_sync(free_in_slices, batches)
        return result, max_timestamp


async def _append_raw(
    log: PartitionLog, batches: list[PreparedBatch], expected_offset: int | None, producer_id: int, size: int
) -> AppendResult:
    """`size`: the batches' bytes (the whole body: prepare_batches refuses anything else in it)."""
    try:
        return await log.append(batches, expected_offset=expected_offset, size=size)
    except OutOfOrderSequenceError:
        if producer_id < 0:
            raise
        raise _idempotency_conflict() from None


def _prepare_raw(
    body: bytearray, log: PartitionLog, producer_id: int, max_inflated_bytes: int
) -> tuple[list[PreparedBatch], int]:
    """(validated batches, carrying the Idempotency-Key's producer id if any, their max
    timestamp). Compressed batches inflate to at most `max_inflated_bytes` in all."""
    batches = prepare_batches(body, log.config, topic=log.topic, max_inflated_bytes=max_inflated_bytes)
    if producer_id >= 0:
        batches = _stamp_producer(batches, producer_id)
    return batches, max(b.header.max_timestamp for b in batches)


def _stamp_producer(batches: list[PreparedBatch], producer_id: int) -> list[PreparedBatch]:
    """Give raw batches without a producer id the Idempotency-Key's, sequences from 0."""
    if any(b.header.producer_id != NO_PRODUCER_ID for b in batches):
        raise ApiError(422, "validation_error", "Idempotency-Key: these batches carry their own producer id (Kafka's idempotent producer)")
    out = []
    sequence = 0
    for b in batches:
        set_producer(b.data, 0, b.header.size, producer_id, 0, sequence)
        out.append(PreparedBatch(b.data, b.header._replace(producer_id=producer_id, producer_epoch=0, base_sequence=sequence)))
        sequence += b.header.last_offset_delta + 1
    return out


@router.get(
    "/{topic}/partitions/{partition}/records",
    operation_id="fetchRecords",
    response_model=FetchResponse,
    responses={
        200: {"content": {RECORD_BATCH_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
        **_auth_problems,
        404: {"model": Problem, "description": "topic_not_found, partition_not_found"},
        416: {"model": Problem, "description": "offset_out_of_range"},
        422: {"model": Problem, "description": "validation_error, not_utf8, not_json"},
        500: {"model": Problem, "description": "corrupt_data: a stored batch fails its CRC (JSON only; with first_offset, last_offset)"},
        503: {"model": Problem, "description": "partition_offline: the partition could not be loaded at start-up"},
    },
    summary="Fetch records from an offset (JSON, or raw batches with Accept: " + RECORD_BATCH_MEDIA_TYPE + ")",
)
async def fetch(
    topic: str,
    partition: int,
    request: Request,
    engine: Engine,
    _principal: Reader,
    offset: int | None = Query(None, ge=0, description="default: the log start offset"),
    max_records: int = Query(500, ge=1, le=100_000),
    max_bytes: int = Query(1_048_576, ge=1, le=64 * 1024 * 1024),
    max_wait_ms: int = Query(0, ge=0, le=300_000, description="long-poll: wait this long for data at the end"),
    key_format: Format = Format.string,
    value_format: Format = Format.string,
) -> Response:
    log = engine.partition(topic, partition)
    if offset is None:
        offset = log.log_start_offset
    log.check_offset(offset)
    if max_wait_ms and offset >= log.high_watermark:
        await log.wait_for_data(offset, max_wait_ms / 1000)
    raw = RECORD_BATCH_MEDIA_TYPE in request.headers.get("accept", "")
    if raw:
        slice_ = log.fetch_slice(offset, max_bytes)
        view = log.view
        headers = {
            "X-Next-Offset": str(offset if slice_ is None else slice_.next_offset),
            "X-High-Watermark": str(view.high_watermark if slice_ is None else slice_.high_watermark),
            "X-Log-Start-Offset": str(view.log_start_offset),
        }
        if slice_ is None:
            return Response(b"", media_type=RECORD_BATCH_MEDIA_TYPE, headers=headers)
        request.app.state.metrics.fetched_bytes.labels(topic).inc(slice_.size)
        return FileRangeResponse(
            slice_.handle, slice_.position, slice_.size, lambda: log.read_slice(slice_),
            media_type=RECORD_BATCH_MEDIA_TYPE, headers=headers,
        )
    kf, vf = key_format.value, value_format.value
    if max_records <= INLINE_RECORDS and max_bytes <= INLINE_READ_BYTES:
        result = await log.read_records(offset, max_records, max_bytes)
        count = len(result.records)
        parts = await _records_answer(_fetch_body, result, kf, vf)
    else:  # decoded in a worker thread (see PartitionLog.read_records), written in another
        with gc_paused():
            result = await log.read_records(offset, max_records, max_bytes)
            count = len(result.records)
            parts = await _records_answer(_fetch_body, result, kf, vf)
    metrics = request.app.state.metrics
    metrics.fetched_records.labels(topic).inc(count)
    metrics.fetched_bytes.labels(topic).inc(result.bytes_read)
    return PartsResponse(parts, media_type="application/json")


async def _records_answer(write: Callable[[RecordsResult, str, str], T], result: RecordsResult, kf: str, vf: str) -> T:
    """write(result, kf, vf): inline for a small read, else in a worker thread (a first batch
    may be far above max_bytes, up to max.message.bytes)."""
    if len(result.records) <= INLINE_RECORDS and result.bytes_read <= INLINE_READ_BYTES:
        return write(result, kf, vf)
    return await anyio.to_thread.run_sync(write, result, kf, vf)


def _fetch_body(result: RecordsResult, kf: str, vf: str) -> list[bytes]:
    """The JSON fetch answer (FetchResponse), in parts for a big one."""
    parts = dumps_parts(result.records, functools.partial(_records_json, kf=kf, vf=vf), b'{"records":', {
        "next_offset": result.next_offset,
        "high_watermark": result.high_watermark,
        "log_start_offset": result.log_start_offset,
    }, _record_bytes)
    free_in_slices(result.records)  # here: in the worker thread for a big answer
    return parts


SSE_KEEPALIVE_S = 15.0
SSE_CHUNK_RECORDS = 500
SSE_CHUNK_BYTES = 1024 * 1024


def _sse_events(result: RecordsResult, kf: str, vf: str) -> bytes:
    """One `record` event per record."""
    return b"".join(
        b"id: %d\nevent: record\ndata: %s\n\n" % (record["offset"], orjson.dumps(record))
        for record in _records_json(result.records, kf, vf)
    )


@router.get(
    "/{topic}/partitions/{partition}/records/stream",
    operation_id="streamRecords",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "one `record` event per record: `id` is its offset, `data` the record as JSON",
        },
        **_auth_problems,
        404: {"model": Problem, "description": "topic_not_found, partition_not_found"},
        416: {"model": Problem, "description": "offset_out_of_range"},
    },
    summary="Tail a partition as server-sent events (curl -N), from an offset or the end",
)
async def stream(
    topic: str,
    partition: int,
    request: Request,
    engine: Engine,
    _principal: Reader,
    offset: int | None = Query(None, ge=0, description="default: the high watermark (new records only)"),
    key_format: Format = Format.string,
    value_format: Format = Format.string,
    last_event_id: int | None = Header(None, ge=-1, description="resume after this offset (sent by EventSource on reconnect)"),
) -> StreamingResponse:
    log = engine.partition(topic, partition)
    if last_event_id is not None:
        offset = last_event_id + 1
    elif offset is None:
        offset = log.high_watermark
    log.check_offset(offset)
    kf, vf = key_format.value, value_format.value
    metrics = request.app.state.metrics

    position = offset

    async def next_chunk() -> bytes:
        """The next records as events, or a keep-alive comment after SSE_KEEPALIVE_S without
        any; raises LogClosedError once the topic is deleted or the server shuts down."""
        nonlocal position
        if engine.stopping or log.waiting_stopped:
            raise LogClosedError(log.name)
        log.check_open()
        if position >= log.high_watermark and not await log.wait_for_data(position, SSE_KEEPALIVE_S):
            return b": keepalive\n\n"
        result = await log.read_records(position, SSE_CHUNK_RECORDS, SSE_CHUNK_BYTES)
        metrics.fetched_records.labels(topic).inc(len(result.records))
        chunk = await _records_answer(_sse_events, result, kf, vf)
        position = max(result.next_offset, position)
        return chunk

    paths = ServerPaths.of(request)

    async def events():
        yield b": streaming " + f"{topic}/{partition} from offset {position}".encode() + b"\n\n"
        while True:
            # uvicorn's send returns without suspending while the socket takes the bytes: every
            # round must give the loop a turn, or a stream that always has something to send
            # holds it
            await anyio.lowlevel.checkpoint()
            try:
                chunk = await next_chunk()
            except (ApiError, OffsetOutOfRangeError, StorageError, LogClosedError) as exc:
                # retention passed us, bytes the format cannot show, a failed read, the topic
                # deleted, shutdown: say why, then end the stream
                event = _stream_error(exc, position)
                if paths is not None:  # no absolute server paths in answers
                    event["detail"] = paths.scrub(event["detail"])
                yield b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"
                return
            if chunk:
                yield chunk

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
