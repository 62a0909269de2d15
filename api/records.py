"""Produce and fetch: HTTP in, engine calls, HTTP out.

Produce is engine/produce.py's (parsing, partitioning, batching, Idempotency-Key, conditions):
these routes pass it the body, the headers and the typed condition If-Match names
(api/conditions.py), and turn its answer, or its error, into a response.
Fetch decodes records to JSON here; raw fetches answer with the segment's bytes.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import orjson
from fastapi import APIRouter, Header, Query, Request
from starlette.datastructures import QueryParams
from starlette.responses import Response, StreamingResponse
from starlette.routing import Match, Route
from starlette.types import Scope

from engine import dropped as dropped_offsets
from engine.errors import (
    ConditionConflictError,
    CorruptDataError,
    InvalidFieldError,
    LogClosedError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    StorageError,
    TopicDeletedError,
)
from engine.interface import Partition
from engine.log_reads import INLINE_READ_BYTES
from engine.produce import (
    INLINE_JSON_BYTES,
    INLINE_RECORDS,
    ProduceService,
    expected_offset_in,
    parse_body,
)
from engine.reader import RecordsResult
from engine.records import Record
from engine.segments import LogView
from engine.slicing import dumps_parts, free_in_slices, gc_paused

from . import formats
from .auth import Principal, Reader, Writer, authorize
from .conditions import partition_condition, refused
from .deps import Engine, get_engine
from .errors import ApiError, ServerPaths
from .policy import PolicyRoute
from .responses import FileRangeResponse, PartsResponse
from .schemas import FetchResponse, Format, PartitionProduceResponse, Problem, ProduceResponse

router = APIRouter(prefix="/v1/topics", tags=["records"], route_class=PolicyRoute)
T = TypeVar("T")

RECORD_BATCH_MEDIA_TYPE = "application/vnd.kafka.record-batch.v2"
OCTET_STREAM = "application/octet-stream"  # accepted for raw batches too (generated SDKs send it)
# a request body's declared length is allocated at once up to this (see _read_body)
PREALLOCATE_BYTES = 1024 * 1024
REPLAYED_HEADER = "Idempotent-Replayed"
# on a read that covered offsets recovery dropped (engine/dropped.py): "120-130, 200-201"
DROPPED_HEADER = "Eventlog-Dropped-Offsets"
DROPPED_HEADER_DOC = {
    DROPPED_HEADER: {
        "description": "only when the read covered offsets that recovery dropped with damaged batches (records that "
        "may have been acknowledged are missing there): their inclusive ranges, e.g. `120-130, 200-201`",
        "schema": {"type": "string"},
    }
}

_services: weakref.WeakKeyDictionary[Engine, ProduceService] = weakref.WeakKeyDictionary()


def produce_service(engine: Engine) -> ProduceService:
    """The engine's produce service (one per engine)."""
    service = _services.get(engine)
    if service is None:
        service = _services[engine] = ProduceService(engine)
    return service


_auth_problems: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "unauthorized"},
    403: {"model": Problem, "description": "forbidden"},
}
_produce_problems: dict[int | str, dict[str, Any]] = {
    **_auth_problems,
    400: {"model": Problem, "description": "invalid_json, corrupt_batch, transactions_unsupported, invalid_request (an internal topic)"},
    404: {"model": Problem, "description": "topic_not_found, partition_not_found"},
    409: {"model": Problem, "description": "offset_mismatch (expected_offset), out_of_order_sequence, producer_fenced"},
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
    'Conditional append: `"<offset>"` (or `W/"<offset>"`, the same) — append only if the '
    "partition's next offset (high watermark) is this, else 412 offset_mismatch; `*`: no "
    "condition. The JSON field expected_offset says the same (409 when it alone fails)"
)


def _record_bytes(record: Record) -> int:
    return 48 + len(record.key or b"") + len(record.value or b"") + sum(len(k) + len(v or b"") for k, v in record.headers)


def _offsets_body(offsets: list[dict[str, int]]) -> list[bytes]:
    return dumps_parts(offsets, list, b'{"offsets":', {"partitions": produced_partitions(offsets)})


def produced_partitions(offsets: list[dict[str, int]]) -> list[dict[str, int]]:
    """The `partitions` member of every produce answer (schemas.ProducedPartition): per
    partition written, the offsets of the request's first and last record there. A request's
    records in one partition get increasing offsets in request order (one batch a partition)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for o in offsets:
        partition = o["partition"]
        if partition not in first:
            first[partition] = o["offset"]
        last[partition] = o["offset"]
    return [partition_span(p, first[p], last[p]) for p in sorted(first)]


def partition_span(partition: int, base_offset: int, last_offset: int) -> dict[str, int]:
    return {"partition": partition, "base_offset": base_offset, "last_offset": last_offset}


def _partition_answer(offsets: list[dict[str, int]]) -> dict[str, Any]:
    partition, base, last = offsets[0]["partition"], offsets[0]["offset"], offsets[-1]["offset"]
    return {
        "partition": partition,
        "base_offset": base,
        "last_offset": last,
        "timestamp": max(o["timestamp"] for o in offsets),
        "partitions": [partition_span(partition, base, last)],
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


def error_event(exc: Exception, position: int, paths: ServerPaths | None) -> bytes:
    """The `error` event that ends an event stream (_stream_error's members), with no absolute
    server paths in its detail."""
    event = _stream_error(exc, position)
    if paths is not None:
        event["detail"] = paths.scrub(event["detail"])
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


def dropped_json(ranges: dropped_offsets.Ranges) -> list[dict[str, int]]:
    """The `dropped` field of an answer (schemas.DroppedRange each)."""
    return [{"first": a, "last": b} for a, b in ranges]


def dropped_headers(ranges: dropped_offsets.Ranges, headers: dict[str, str] | None = None) -> dict[str, str] | None:
    """`headers` with DROPPED_HEADER added when `ranges` is not empty."""
    if not ranges:
        return headers
    headers = dict(headers or {})
    headers[DROPPED_HEADER] = dropped_offsets.describe(ranges)
    return headers


def dropped_events(ranges: dropped_offsets.Ranges) -> bytes:
    """One `dropped` event per range (no id: a resume goes on after the last record's)."""
    return b"".join(b"event: dropped\ndata: %s\n\n" % orjson.dumps({"first": a, "last": b}) for a, b in ranges)


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
    return await _produce(request, engine, principal, topic, idempotency_key)


def check_json_body(content_type: str | None) -> None:
    """The topic endpoint (and the per-key one) takes JSON only: 415 otherwise, as the partition
    endpoint answers; raw batches are told where they go."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind in ("application/json", ""):
        return
    if kind == RECORD_BATCH_MEDIA_TYPE:
        raise ApiError(415, "unsupported_media_type",
                       "raw record batches are appended to one partition: POST /v1/topics/{topic}/partitions/{partition}/records")
    raise ApiError(415, "unsupported_media_type", "use application/json")


async def _produce(request: Request, engine: Engine, principal: Principal, topic: str, idempotency_key: str | None) -> Response:
    check_json_body(request.headers.get("content-type"))
    parts, replayed = await produce_service(engine).produce_json(
        topic, await _read_body(request), principal=principal.name, idempotency_key=idempotency_key,
        answer=_offsets_body,
    )
    headers = {REPLAYED_HEADER: "true"} if replayed else None
    return PartsResponse(parts, media_type="application/json", headers=headers)


@router.post(
    "/{topic}/partitions/{partition}/records",
    operation_id="produceToPartition",
    response_model=PartitionProduceResponse,
    responses={
        **_produce_problems,
        412: {"model": Problem, "description": "offset_mismatch: If-Match named another next offset "
              "(with expected_offset and high_watermark); nothing was written"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/ProduceRequest"}},
                # raw Kafka v2 batches, under a type SDK generators know (they skip vendor types);
                # application/vnd.kafka.record-batch.v2 is taken as well (docs/API.md)
                OCTET_STREAM: {
                    "schema": {"type": "string", "format": "binary"},
                    "description": "raw Kafka v2 record batches (also accepted as " + RECORD_BATCH_MEDIA_TYPE + ")",
                },
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
    return await _produce_to_partition(request, engine, principal, topic, partition, idempotency_key, if_match)


async def _produce_to_partition(
    request: Request, engine: Engine, principal: Principal, topic: str, partition: int, idempotency_key: str | None,
    if_match: str | None,
) -> Response:
    service = produce_service(engine)
    service.partition(topic, partition)  # before reading the body
    content_type = request.headers.get("content-type", "application/json")
    body = await _read_body(request)
    payload, replayed = await produce_to_partition_body(
        service, topic, partition, content_type, body, principal.name, idempotency_key, if_match,
        request.app.state.settings.max_inflated_bytes_per_request,
    )
    # the offset a follow-up conditional append expects (If-Match)
    headers = {"ETag": f'"{payload["last_offset"] + 1}"'}
    if replayed:
        headers[REPLAYED_HEADER] = "true"
    return Response(orjson.dumps(payload), media_type="application/json", headers=headers)


async def produce_to_partition_body(
    service: ProduceService, topic: str, partition: int, content_type: str, body: bytearray, principal: str,
    idempotency_key: str | None, if_match: str | None, max_inflated_bytes: int,
) -> tuple[dict[str, Any], bool]:
    """The produce-to-partition answer ({partition, base_offset, last_offset, timestamp}) and
    whether it was a replay, for a body of `content_type` (JSON or raw batches: 415 otherwise)."""
    content_type = content_type.split(";")[0].strip().lower()
    if content_type in (RECORD_BATCH_MEDIA_TYPE, OCTET_STREAM):  # octet-stream: what generated SDKs send
        condition = partition_condition(if_match)
        try:
            raw = await service.produce_raw(
                topic, partition, body, principal=principal, idempotency_key=idempotency_key,
                condition=condition, max_inflated_bytes=max_inflated_bytes,
            )
        except OffsetMismatchError as exc:
            raise refused(exc, condition) from None
        payload = {"partition": partition, "base_offset": raw.base_offset,
                   "last_offset": raw.last_offset, "timestamp": raw.timestamp,
                   "partitions": [partition_span(partition, raw.base_offset, raw.last_offset)]}
        return payload, raw.replayed
    if content_type in ("application/json", ""):
        try:
            condition = partition_condition(if_match)
        except InvalidFieldError:
            await _body_faults(body)  # the body's own faults answer first, as they always have
            raise
        try:
            return await service.produce_json(
                topic, body, partition=partition, principal=principal, idempotency_key=idempotency_key,
                condition=condition, answer=_partition_answer,
            )
        except (OffsetMismatchError, ConditionConflictError) as exc:
            raise refused(exc, condition) from None
    raise ApiError(415, "unsupported_media_type", f"use application/json, or {RECORD_BATCH_MEDIA_TYPE} (or {OCTET_STREAM}) for raw batches")


async def _body_faults(body: bytearray) -> None:
    """Raise what is wrong with a JSON produce body before its records are read: not JSON, not
    an object, a bad expected_offset (a big body in a worker thread, where it is freed too)."""

    def check() -> None:
        expected_offset_in(parse_body(body))

    if len(body) <= INLINE_JSON_BYTES:
        check()
    else:
        with gc_paused():
            await anyio.to_thread.run_sync(check)


@router.get(
    "/{topic}/partitions/{partition}/records",
    operation_id="fetchRecords",
    response_model=FetchResponse,
    responses={
        200: {"content": {RECORD_BATCH_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
              "headers": DROPPED_HEADER_DOC},
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
    return await _fetch(
        request, engine, topic, partition, offset, max_records, max_bytes, max_wait_ms, key_format.value, value_format.value
    )


def _integer_header(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "integer"}}


@router.get(
    "/{topic}/partitions/{partition}/records/batches",
    operation_id="fetchRecordBatches",
    response_class=Response,
    responses={
        200: {
            "content": {
                OCTET_STREAM: {"schema": {"type": "string", "format": "binary"}},
                RECORD_BATCH_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
            },
            "description": "the stored Kafka v2 record batches, as they are (Content-Type "
            f"{RECORD_BATCH_MEDIA_TYPE}); empty at the end of the log",
            "headers": {
                "X-Next-Offset": _integer_header("where the next fetch starts"),
                "X-High-Watermark": _integer_header("the partition's high watermark"),
                "X-Log-Start-Offset": _integer_header("the partition's log start offset"),
                **DROPPED_HEADER_DOC,
            },
        },
        **_auth_problems,
        404: {"model": Problem, "description": "topic_not_found, partition_not_found"},
        416: {"model": Problem, "description": "offset_out_of_range"},
        503: {
            "model": Problem,
            "description": "partition_offline: the partition could not be loaded at start-up",
        },
    },
    summary="Fetch raw Kafka record batches from an offset (the stored bytes)",
    description=(
        "What `fetchRecords` answers with `Accept: " + RECORD_BATCH_MEDIA_TYPE + "`, as an "
        "operation of its own: SDK generators render one body type per status and skip vendor "
        "media types, so raw batches reached through Accept were out of a generated SDK's "
        "reach. The first batch comes whole even when larger than `max_bytes`; batches are not "
        "CRC-checked here (the client's Kafka decoder does that, as with a Kafka broker)."
    ),
)
async def fetch_batches(
    topic: str,
    partition: int,
    request: Request,
    engine: Engine,
    _principal: Reader,
    offset: int | None = Query(None, ge=0, description="default: the log start offset"),
    max_bytes: int = Query(1_048_576, ge=1, le=64 * 1024 * 1024),
    max_wait_ms: int = Query(
        0, ge=0, le=300_000, description="long-poll: wait this long for data at the end"
    ),
) -> Response:
    return await _fetch(
        request, engine, topic, partition, offset, 1, max_bytes, max_wait_ms, "string", "string",
        raw=True,
    )


async def _fetch(
    request: Request, engine: Engine, topic: str, partition: int, offset: int | None, max_records: int, max_bytes: int,
    max_wait_ms: int, kf: str, vf: str, *, raw: bool = False,
) -> Response:
    log = engine.partition(topic, partition)
    if offset is None:
        offset = log.log_start_offset
    log.check_offset(offset)
    if max_wait_ms and offset >= log.high_watermark:
        await log.wait_for_data(offset, max_wait_ms / 1000)
    raw = raw or RECORD_BATCH_MEDIA_TYPE in request.headers.get("accept", "")
    if raw:
        await log.settle()
        slice_ = log.fetch_slice(offset, max_bytes)
        view = log.view
        headers = {
            "X-Next-Offset": str(offset if slice_ is None else slice_.next_offset),
            "X-High-Watermark": str(view.high_watermark if slice_ is None else slice_.high_watermark),
            "X-Log-Start-Offset": str(view.log_start_offset),
        }
        if log.dropped_offsets:  # (an empty answer covers the offsets up to the high watermark)
            end = view.high_watermark if slice_ is None else slice_.next_offset
            headers = dropped_headers(log.dropped_in(offset, end - 1), headers)  # type: ignore[assignment]
        if slice_ is None:
            return Response(b"", media_type=RECORD_BATCH_MEDIA_TYPE, headers=headers)
        request.app.state.metrics.fetched_bytes.labels(topic).inc(slice_.size)
        return FileRangeResponse(
            slice_.handle, slice_.position, slice_.size, lambda: log.read_slice(slice_),
            media_type=RECORD_BATCH_MEDIA_TYPE, headers=headers,
        )
    if max_records <= INLINE_RECORDS and max_bytes <= INLINE_READ_BYTES:
        view = log.view
        key = (id(log), offset, max_records, max_bytes, kf, vf)
        kept = ANSWERS.get(key, log, view)
        if kept is not None:
            # the log's view has not changed since this answer was made (no publish, no segment
            # swapped): a read now would make it again (long-pollers woken by one record take
            # one read and one encoding between them)
            made, count, bytes_read, dropped = kept
            parts = list(made)
        else:
            result = await log.read_records(offset, max_records, max_bytes)
            count, bytes_read = len(result.records), result.bytes_read
            dropped = log.dropped_in(offset, result.next_offset - 1)
            parts = await _records_answer(_fetch_writer(dropped), result, kf, vf)
            ANSWERS.put(key, log, view, (tuple(parts), count, bytes_read, dropped), sum(len(p) for p in parts))
        metrics = request.app.state.metrics
        metrics.fetched_records.labels(topic).inc(count)
        metrics.fetched_bytes.labels(topic).inc(bytes_read)
        return PartsResponse(parts, media_type="application/json", headers=dropped_headers(dropped))
    else:  # decoded in a worker thread (see PartitionLog.read_records), written in another
        with gc_paused():
            result = await log.read_records(offset, max_records, max_bytes)
            count = len(result.records)
            dropped = log.dropped_in(offset, result.next_offset - 1)
            parts = await _records_answer(_fetch_writer(dropped), result, kf, vf)
    metrics = request.app.state.metrics
    metrics.fetched_records.labels(topic).inc(count)
    metrics.fetched_bytes.labels(topic).inc(result.bytes_read)
    return PartsResponse(parts, media_type="application/json", headers=dropped_headers(dropped))


class _Answers:
    """The latest small JSON fetch answers, each with the log's view it was read from: while the
    log still has that view (every publish and every segment change makes a new one), the same
    request gets the same answer without a read or an encoding. At most BUDGET_BYTES of answers
    (and MAX_ANSWERS) for the whole process, the least recently used going first."""

    BUDGET_BYTES = 8 * 1024 * 1024
    MAX_ANSWERS = 4096

    def __init__(self) -> None:
        self._kept: dict[tuple, tuple] = {}  # key -> (weakref to the log, view, value, size)
        self._bytes = 0
        self.reused = 0  # answers given again (eventlog_fetch_answers_reused_total)

    def get(self, key: tuple, log: Partition, view: LogView) -> Any:
        kept = self._kept.get(key)
        if kept is None or kept[0]() is not log or kept[1] is not view:
            return None
        del self._kept[key]  # to the end: the most recently used
        self._kept[key] = kept
        self.reused += 1
        return kept[2]

    def put(self, key: tuple, log: Partition, view: LogView, value: Any, size: int) -> None:
        if size > self.BUDGET_BYTES // 16:
            return
        old = self._kept.pop(key, None)
        if old is not None:
            self._bytes -= old[3]
        self._kept[key] = (weakref.ref(log), view, value, size)
        self._bytes += size
        while self._bytes > self.BUDGET_BYTES or len(self._kept) > self.MAX_ANSWERS:
            oldest = next(iter(self._kept))
            self._bytes -= self._kept.pop(oldest)[3]


ANSWERS = _Answers()


async def _records_answer(write: Callable[[RecordsResult, str, str], T], result: RecordsResult, kf: str, vf: str) -> T:
    """write(result, kf, vf): inline for a small read, else in a worker thread (a first batch
    may be far above max_bytes, up to max.message.bytes)."""
    if len(result.records) <= INLINE_RECORDS and result.bytes_read <= INLINE_READ_BYTES:
        return write(result, kf, vf)
    return await anyio.to_thread.run_sync(write, result, kf, vf)


def _fetch_writer(dropped: dropped_offsets.Ranges) -> Callable[[RecordsResult, str, str], list[bytes]]:
    return functools.partial(_fetch_body, dropped=dropped) if dropped else _fetch_body


def _fetch_body(result: RecordsResult, kf: str, vf: str, dropped: dropped_offsets.Ranges = ()) -> list[bytes]:
    """The JSON fetch answer (FetchResponse), in parts for a big one; `dropped`: the offsets
    recovery dropped that the read covered (the field only when there are some)."""
    tail: dict[str, Any] = {
        "next_offset": result.next_offset,
        "high_watermark": result.high_watermark,
        "log_start_offset": result.log_start_offset,
    }
    if dropped:
        tail["dropped"] = dropped_json(dropped)
    parts = dumps_parts(result.records, functools.partial(_records_json, kf=kf, vf=vf), b'{"records":', tail, _record_bytes)
    free_in_slices(result.records)  # here: in the worker thread for a big answer
    return parts


SSE_KEEPALIVE_S = 15.0
# the description of every event-stream operation in the OpenAPI document: a generated SDK's
# call of one returns only when the stream ends, so a client reads it as it comes
SSE_DOC = (
    "A `text/event-stream` (server-sent events, as the HTML standard defines them): events of "
    "`event`, `id` and `data` lines (`data`: one JSON object), each ended by a blank line; "
    "lines starting with `:` are comments (the first names the stream; `: keepalive` after "
    f"{SSE_KEEPALIVE_S:.0f} s without an event). The stream does not end on its own while the "
    "client listens: only an `error` event (or, on a key's stream, an `end` event) ends it. A "
    "generated SDK's call of this operation therefore returns only then; read the stream as it "
    "comes instead, with the SDK's httpx client (`client.get_httpx_client().stream(\"GET\", "
    "...)`) or any SSE client, and stop when you have what you need: docs/API.md, \"Reading an "
    "event stream from code\", has a short reader. `Last-Event-ID` (what `EventSource` sends "
    "on reconnect) resumes after that offset."
)
SSE_CHUNK_RECORDS = 500
SSE_CHUNK_BYTES = 1024 * 1024


def _sse_events(result: RecordsResult, kf: str, vf: str) -> bytes:
    """One `record` event per record."""
    return b"".join(
        b"id: %d\nevent: record\ndata: %s\n\n" % (record["offset"], orjson.dumps(record))
        for record in _records_json(result.records, kf, vf)
    )


def stream_start(log: Partition, offset: int | None, last_event_id: int | None) -> int:
    """Where an event stream starts: after Last-Event-ID, else at `offset`, else at the end;
    OffsetOutOfRangeError (416) outside the log."""
    if last_event_id is not None:
        offset = last_event_id + 1
    elif offset is None:
        offset = log.high_watermark
    log.check_offset(offset)
    return offset


@router.get(
    "/{topic}/partitions/{partition}/records/stream",
    operation_id="streamRecords",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "one `record` event per record: `id` is its offset, `data` the record as JSON; a `dropped` "
            "event (`data` {first, last}) ahead of the records after offsets recovery dropped with a damaged batch",
        },
        **_auth_problems,
        404: {"model": Problem, "description": "topic_not_found, partition_not_found"},
        416: {"model": Problem, "description": "offset_out_of_range"},
    },
    summary="Tail a partition as server-sent events (curl -N), from an offset or the end",
    description=SSE_DOC,
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
) -> Response:  # an EventStreamResponse (api/sse.py): documented by response_class
    from .sse import EventStreamResponse, PartitionEvents  # (sse.py builds on this module)

    log = engine.partition(topic, partition)
    offset = stream_start(log, offset, last_event_id)
    state = request.app.state
    events = PartitionEvents(engine, log, offset, key_format.value, value_format.value, state.metrics.fetched_records.labels(topic))
    return EventStreamResponse(events, state.policy, ServerPaths.of(request))


# -- the hot routes without FastAPI's per-request machinery ----------------------------------------
#
# Fetch is served by a plain Starlette route placed ahead of its documented FastAPI route
# (produce goes further: api/lane.py serves it ahead of the whole middleware stack) (which keep the OpenAPI document): dependency solving
# and parameter models were 8 % of the event loop's time under JSON produce and 28 % under raw
# fetch (docs/PERFORMANCE.md). A fast route takes a request only when it reads every parameter
# as FastAPI would without converting anything (plain decimal digits within the documented
# bounds, a format by its name); any other request goes on to the documented route, which
# answers as before (422 validation_error and all). The request policy (api/policy.py: limits,
# authentication, quotas, the engine open, the principal's rights, metrics by route template,
# the access log, problem mapping) is the same, wrapped around both routes alike.

_FETCH_QUERY = {  # name -> (lowest, highest); None: a format
    "offset": (0, None), "max_records": (1, 100_000), "max_bytes": (1, 64 * 1024 * 1024), "max_wait_ms": (0, 300_000),
    "key_format": None, "value_format": None,
}
_FORMAT_NAMES = frozenset(f.value for f in Format)
_MAX_DIGITS = 18  # an int64 and then some; a longer number goes to FastAPI
_PARAMS = "eventlog.params"


def _plain_int(text: str, low: int, high: int | None) -> int | None:
    """`text` as an int if it is plain ASCII digits in [low, high], else None (for FastAPI)."""
    if not (0 < len(text) <= _MAX_DIGITS and text.isdigit() and text.isascii()):
        return None
    value = int(text)
    return value if value >= low and (high is None or value <= high) else None


class _FastRoute(Route):
    """A route for the requests `parse(scope, path_params)` reads (it returns their parameters,
    or None to leave the request to the documented route after this one)."""

    # what the request policy checks first (api/policy.py): a read, of the engine's data
    eventlog_right = "read"
    eventlog_engine = True

    def __init__(self, path: str, method: str, endpoint: Callable[..., Any], parse: Callable[[Scope, dict[str, Any]], dict[str, Any] | None]) -> None:
        super().__init__(path, endpoint, methods=[method], include_in_schema=False)
        self._method = method  # only: Starlette would add HEAD to GET, FastAPI's route does not
        self._parse = parse

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope.get("method") != self._method:
            return Match.NONE, {}  # another method: the documented route answers (405 and all)
        match, child = super().matches(scope)
        if match is not Match.FULL:
            return Match.NONE, {}
        params = self._parse(scope, child["path_params"])
        if params is None:
            return Match.NONE, {}
        child["route"] = self  # metrics and the access log name the route by its template
        child[_PARAMS] = params
        return match, child


def _parse_partition_path(_scope: Scope, path: dict[str, Any]) -> dict[str, Any] | None:
    partition = _plain_int(path["partition"], 0, None)
    return None if partition is None else {"partition": partition}


def _parse_fetch(scope: Scope, path: dict[str, Any]) -> dict[str, Any] | None:
    params = _parse_partition_path(scope, path)
    if params is None:
        return None
    query = scope.get("query_string", b"")
    if query:
        given = QueryParams(query)
        for name, bounds in _FETCH_QUERY.items():
            text = given.get(name)
            if text is None:
                continue
            if bounds is None:
                if text not in _FORMAT_NAMES:
                    return None
                params[name] = text
            else:
                value = _plain_int(text, *bounds)
                if value is None:
                    return None
                params[name] = value
    return params


async def _fast_fetch(request: Request) -> Response:
    engine = await get_engine(request)
    authorize(request, "read")
    p = request.scope[_PARAMS]
    return await _fetch(
        request, engine, request.path_params["topic"], p["partition"], p.get("offset"), p.get("max_records", 500),
        p.get("max_bytes", 1_048_576), p.get("max_wait_ms", 0), p.get("key_format", "string"), p.get("value_format", "string"),
    )


def fast_routes() -> list[Route]:
    """The hot routes, to be placed ahead of the API's routes (api/routes.py:install_routes)."""
    prefix = router.prefix
    return [
        _FastRoute(prefix + "/{topic}/partitions/{partition}/records", "GET", _fast_fetch, _parse_fetch),
    ]
