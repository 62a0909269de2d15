"""Per-key event streams: a key is an aggregate's stream (docs/API.md, "Per-key event streams").

    GET  /v1/topics/{topic}/keys/{key}/records          the key's records, paged, ETag = its version
    POST /v1/topics/{topic}/keys/{key}/records          append for the key, If-Match / If-None-Match
    GET  /v1/topics/{topic}/keys/{key}/records/stream   the key's records as server-sent events

The key in the path is percent-decoded and read per `key_format` (string: its UTF-8 bytes;
base64, standard or URL-safe alphabet, padding optional: any bytes; json: the JSON text as a
produce with key_format=json stores it). Its partition is Kafka's murmur2 placement, so a key
written through the partition-level produce endpoints (with that placement) is the same
stream. A key's version is the offset of its latest record (-1: none); the engine's key index
(engine/key_index.py) answers both without scanning the partition, on the partition's owner
shard.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import anyio
import orjson
from fastapi import APIRouter, Header, Query, Request
from prometheus_client import Counter
from starlette.responses import Response, StreamingResponse

from engine.errors import LogClosedError, OffsetOutOfRangeError
from engine.interface import Partition
from engine.partitioner import partition_for_key
from engine.produce import KeyProduced

from .auth import Reader, Writer
from .conditions import key_condition
from .deps import Engine
from .errors import ApiError, ServerPaths
from .policy import PolicyRoute
from .records import (
    DROPPED_HEADER_DOC,
    IDEMPOTENCY_KEY_DOC,
    REPLAYED_HEADER,
    SSE_DOC,
    SSE_KEEPALIVE_S,
    _auth_problems,
    _read_body,
    _records_json,
    check_json_body,
    dropped_events,
    dropped_headers,
    dropped_json,
    partition_span,
    produce_service,
)
from .schemas import Format, KeyProduceResponse, KeyRecordsResponse, Problem
from .sse import EventStreamResponse

router = APIRouter(prefix="/v1/topics", tags=["keys"], route_class=PolicyRoute)

STREAM_PAGE_RECORDS = 500
STREAM_PAGE_BYTES = 1024 * 1024

KEY_DOC = (
    "the key, percent-encoded; read per key_format (string: UTF-8; base64: any bytes, standard or "
    "URL-safe alphabet; json: JSON text)"
)
IF_MATCH_DOC = (
    'Append only if the key\'s latest record is at this offset (its ETag, e.g. `"42"`, or '
    '`W/"42"`, the same; `"-1"`: the key has no records; `*`: it has some), else 412 '
    "key_version_mismatch and nothing written"
)
IF_NONE_MATCH_DOC = "`*`: append only if the key has no records, else 412 key_version_mismatch"

_read_problems: dict[int | str, dict[str, Any]] = {
    **_auth_problems,
    404: {"model": Problem, "description": "topic_not_found"},
    409: {"model": Problem, "description": "key_index_disabled: the topic keeps no key index (eventlog.key.index=false)"},
    422: {"model": Problem, "description": "validation_error (a key not in key_format), not_utf8, not_json"},
    503: {"model": Problem, "description": "partition_offline, unavailable"},
}


def path_key(text: str, key_format: str) -> bytes:
    """The key bytes a path segment stands for."""
    if key_format == "string":
        return text.encode("utf-8", "surrogatepass")
    if key_format == "base64":
        cleaned = text.replace("-", "+").replace("_", "/")
        cleaned += "=" * (-len(cleaned) % 4)
        try:
            return base64.b64decode(cleaned, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(422, "validation_error", "key: not valid base64 (key_format=base64)") from None
    try:
        return orjson.dumps(orjson.loads(text))
    except orjson.JSONDecodeError:
        raise ApiError(422, "validation_error", "key: not valid JSON (key_format=json)") from None


def _start_after(offset: int | None, after_offset: int | None) -> int | None:
    if offset is not None and after_offset is not None:
        raise ApiError(422, "validation_error", "give offset or after_offset, not both")
    if offset is not None:
        return offset - 1
    return after_offset


def _key_partition(engine: Engine, topic: str, key: bytes) -> Partition:
    state = engine.topic(topic)
    return engine.partition(topic, partition_for_key(key, len(state.partitions)))


@router.get(
    "/{topic}/keys/{key:path}/records",
    operation_id="readKeyRecords",
    response_model=KeyRecordsResponse,
    responses={200: {"headers": {"ETag": {"description": 'the key\'s version: `"<offset of its latest record>"`, `"-1"` when it has none', "schema": {"type": "string"}}, **DROPPED_HEADER_DOC}}, **_read_problems},
    summary="Read one key's records (an aggregate's events) in offset order; ETag = its version",
)
async def read_key_records(
    topic: str,
    key: str,
    request: Request,
    engine: Engine,
    _principal: Reader,
    offset: int | None = Query(None, ge=0, description="the first offset to read (a page's next_offset); default: the beginning"),
    after_offset: int | None = Query(None, ge=-1, description="read the records after this offset (instead of offset)"),
    max_records: int = Query(500, ge=1, le=10_000),
    max_bytes: int = Query(1_048_576, ge=1, le=64 * 1024 * 1024, description="about this many key and value bytes (at least one record)"),
    key_format: Format = Query(Format.string, description=KEY_DOC),
    value_format: Format = Format.string,
) -> Response:
    data = path_key(key, key_format.value)
    after = _start_after(offset, after_offset)
    log = _key_partition(engine, topic, data)
    after = -1 if after is None else after
    page = await log.read_key(data, after, max_records, max_bytes)
    records = await anyio.to_thread.run_sync(_records_json, page.records, key_format.value, value_format.value) \
        if len(page.records) > 100 else _records_json(page.records, key_format.value, value_format.value)
    metrics = request.app.state.metrics
    metrics.fetched_records.labels(topic).inc(len(records))
    body = {
        "partition": log.partition,
        "records": records,
        "next_offset": page.next_after + 1,
        "more": page.more,
        "latest_offset": page.latest,
        "high_watermark": page.high_watermark,
        "log_start_offset": page.log_start_offset,
    }
    # the page covered the offsets after `after` up to next_after: the key's records there may
    # be among those recovery dropped
    dropped = log.dropped_in(after + 1, page.next_after)
    if dropped:
        body["dropped"] = dropped_json(dropped)
    return Response(orjson.dumps(body), media_type="application/json", headers=dropped_headers(dropped, {"ETag": f'"{page.latest}"'}))


@router.post(
    "/{topic}/keys/{key:path}/records",
    operation_id="appendKeyRecords",
    response_model=KeyProduceResponse,
    responses={
        200: {"headers": {"ETag": {"description": "the key's new version: the last record's offset", "schema": {"type": "string"}}}},
        **_auth_problems,
        400: {"model": Problem, "description": "invalid_json, invalid_request (an internal topic)"},
        404: {"model": Problem, "description": "topic_not_found"},
        409: {"model": Problem, "description": "key_index_disabled (a conditional append on a topic without a key index)"},
        412: {"model": Problem, "description": "key_version_mismatch: the key's latest record is elsewhere (with expected_offset and current_offset, -1 for none); nothing was written"},
        413: {"model": Problem, "description": "record_too_large, request_too_large"},
        415: {"model": Problem, "description": "unsupported_media_type: the body must be application/json"},
        422: {"model": Problem, "description": "validation_error, idempotency_key_reused"},
        503: {"model": Problem, "description": "unavailable, partition_offline, too_many_open_files: nothing was written"},
        507: {"model": Problem, "description": "storage_full: nothing was written"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/KeyProduceRequest"}}},
        }
    },
    summary="Append records to one key's stream, atomically, optionally only if the key is unchanged",
)
async def append_key_records(
    topic: str,
    key: str,
    request: Request,
    engine: Engine,
    principal: Writer,
    key_format: Format = Query(Format.string, description=KEY_DOC),
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", description=IDEMPOTENCY_KEY_DOC),
    if_match: str | None = Header(None, alias="If-Match", description=IF_MATCH_DOC),
    if_none_match: str | None = Header(None, alias="If-None-Match", description=IF_NONE_MATCH_DOC),
) -> Response:
    data = path_key(key, key_format.value)
    check_json_body(request.headers.get("content-type"))
    service = produce_service(engine)
    service.partition(topic, 0)  # the topic exists, and is not internal, before the body is read
    body = await _read_body(request)
    done = await service.produce_key(
        topic, data, body, principal=principal.name, idempotency_key=idempotency_key,
        condition=key_condition(if_match, if_none_match),
    )
    headers = {"ETag": f'"{done.offsets[-1]}"'}
    if done.replayed:
        headers[REPLAYED_HEADER] = "true"
    return Response(key_answer(done), media_type="application/json", headers=headers)


def key_answer(done: KeyProduced) -> bytes:
    """A per-key append's answer (KeyProduceResponse), from engine.produce.KeyProduced (the hot
    lane, api/lane.py, answers it too)."""
    return orjson.dumps({"partition": done.partition, "offsets": done.offsets, "base_offset": done.offsets[0],
                         "last_offset": done.offsets[-1],
                         "partitions": [
                             partition_span(done.partition, done.offsets[0], done.offsets[-1])
                         ]})


@router.get(
    "/{topic}/keys/{key:path}/records/stream",
    operation_id="streamKeyRecords",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "one `record` event per record of the key (`id`: its offset); on a compacted topic a "
            "tombstone is followed by an `end` event and the stream ends; a `dropped` event (`data` {first, last}) "
            "names offsets recovery dropped with a damaged batch (the key's records there, if any, are missing)",
        },
        **_read_problems,
    },
    summary="Follow one key's records as server-sent events, from an offset or from now",
    description=SSE_DOC,
)
async def stream_key_records(
    topic: str,
    key: str,
    request: Request,
    engine: Engine,
    _principal: Reader,
    offset: int | None = Query(None, ge=0, description="the first offset to send; default: new records only"),
    after_offset: int | None = Query(None, ge=-1, description="send the records after this offset (instead of offset)"),
    key_format: Format = Query(Format.string, description=KEY_DOC),
    value_format: Format = Format.string,
    last_event_id: int | None = Header(None, ge=-1, description="resume after this offset (sent by EventSource on reconnect)"),
) -> Response:  # an EventStreamResponse (api/sse.py): documented by response_class
    data = path_key(key, key_format.value)
    log = _key_partition(engine, topic, data)
    log.check_open()
    after = last_event_id if last_event_id is not None else _start_after(offset, after_offset)
    if after is None:
        after = log.high_watermark - 1
    if after >= log.high_watermark:
        raise OffsetOutOfRangeError(after + 1, log.log_start_offset, log.high_watermark)
    await log.read_key(data, after, 1, 1)  # the key index is on: 409 now, not in the stream
    state = request.app.state
    events = _KeyEvents(engine, log, topic, data, after, key_format.value, value_format.value, state.metrics.fetched_records.labels(topic))
    return EventStreamResponse(events, state.policy, ServerPaths.of(request))


class _KeyEvents:
    """One key's records as events (a source of api/sse.py's core), after offset `after`; on a
    compacted topic a tombstone ends the stream with an `end` event."""

    def __init__(self, engine: Engine, log: Partition, topic: str, data: bytes, after: int, kf: str, vf: str, fetched: Counter) -> None:
        self.engine = engine
        self.log = log
        self.data = data
        self.after = after
        self.kf = kf
        self.vf = vf
        self.fetched = fetched
        self.compacted = log.config.compact
        self.first = b": streaming " + f"{topic} key from offset {after + 1} (partition {log.partition})".encode() + b"\n\n"
        self._wait = False  # the last page was the end: wait for more before reading again
        self._ended = False  # a tombstone was sent: the stream is over

    @property
    def position(self) -> int:
        return self.after + 1

    async def next(self, _stream: Any) -> bytes | None:
        log = self.log
        if self._ended:
            return None
        if self._wait:
            self._wait = False
            if not await log.wait_for_data(self.after + 1, SSE_KEEPALIVE_S):
                return b""
        if self.engine.stopping or log.waiting_stopped:
            raise LogClosedError(log.name)
        log.check_open()
        page = await log.read_key(self.data, self.after, STREAM_PAGE_RECORDS, STREAM_PAGE_BYTES)
        out = []
        dropped = log.dropped_in(self.after + 1, page.next_after)
        if dropped:
            out.append(dropped_events(dropped))
        if page.records:
            self.fetched.inc(len(page.records))
            for record in _records_json(page.records, self.kf, self.vf):
                out.append(b"id: %d\nevent: record\ndata: %s\n\n" % (record["offset"], orjson.dumps(record)))
                if self.compacted and record["value"] is None:
                    out.append(b"event: end\ndata: " + orjson.dumps({"offset": record["offset"], "reason": "tombstone"}) + b"\n\n")
                    self._ended = True
                    return b"".join(out)
        self.after = page.next_after
        self._wait = not page.more
        return b"".join(out)
