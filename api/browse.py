"""A topic's records, all partitions merged: the read behind a records browser (as Kafka UI's or
Redpanda Console's), GET /v1/topics/{topic}/records.

Each partition is read in offset order (forward for `oldest`, backward in chunks for `newest`)
and the partitions are merged by timestamp: the next record is the oldest (newest) of the
partitions' next ones, ties by partition then offset. A page ends when it holds `limit`
matching records, when every partition is read to its end, or after `max_scan` records were
looked at: a filter that matches nothing costs one bounded request a page, never a scan of the
whole topic. `next_cursor` carries each partition's position (where the next page goes on) and
the order; it is opaque to clients, and null once nothing is left in that direction.

Reads go through engine.partition(), as fetch does, so in a shard family a partition another
shard owns is read from its files here (engine/follower.py), and an offline one answers 503
`partition_offline`.
"""

from __future__ import annotations

import base64
import binascii
import heapq
from collections import deque
from enum import Enum
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from engine.interface import Partition
from engine.records import Record

from .auth import Reader
from .deps import Engine
from .errors import ApiError
from .policy import PolicyRoute
from .records import _records_json
from .schemas import Format, Problem, RecordHeader

router = APIRouter(prefix="/v1/topics", tags=["records"], route_class=PolicyRoute)

MAX_LIMIT = 500
DEFAULT_SCAN = 10_000  # records looked at per page, at most (max_scan)
MAX_SCAN = 100_000
# a partition is read this many records at a time at first, doubling up to MAX_CHUNK as the
# merge keeps taking from it: a page of 50 from 100 partitions decodes a few thousand records,
# a filter's scan of one busy partition reads in big steps
FIRST_CHUNK, MAX_CHUNK = 32, 1024
CHUNK_BYTES = 1024 * 1024
_CURSOR_VERSION = 1


class RecordsOrder(str, Enum):
    newest = "newest"
    oldest = "oldest"


class TopicRecord(BaseModel):
    partition: int
    offset: int
    timestamp: int
    key: Any = Field(description="in the requested key_format; null for a null key")
    value: Any = Field(description="in the requested value_format; null for a tombstone")
    headers: list[RecordHeader]


class TopicRecordsPage(BaseModel):
    records: list[TopicRecord] = Field(description="merged by timestamp, in the requested order")
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next page; null: nothing left in this order now"
    )
    scanned: int = Field(description="records looked at for this page (the filters' work)")
    scan_limited: bool = Field(
        description="true: the page stopped after `max_scan` records before it was full; "
        "more may match further on (follow next_cursor)"
    )


def _encode_cursor(order: RecordsOrder, positions: dict[int, int]) -> str:
    raw = orjson.dumps(
        {
            "v": _CURSOR_VERSION,
            "order": order.value,
            "positions": {str(p): o for p, o in positions.items()},
        }
    )
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _decode_cursor(cursor: str, order: RecordsOrder) -> dict[int, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = orjson.loads(raw)
        positions = {int(p): int(o) for p, o in data["positions"].items()}
        valid = data["v"] == _CURSOR_VERSION and all(
            p >= 0 and o >= 0 for p, o in positions.items()
        )
    except (
        ValueError,
        binascii.Error,
        KeyError,
        TypeError,
        AttributeError,
        orjson.JSONDecodeError,
    ):
        valid = False
    if not valid:
        raise ApiError(
            400,
            "invalid_cursor",
            "the cursor is not one this server gave (pass next_cursor as it came)",
        )
    if data["order"] != order.value:
        raise ApiError(
            400,
            "invalid_cursor",
            f"the cursor is for order={data['order']}, not order={order.value}",
        )
    return positions


class _Filter:
    """What a record must hold to be on the page (every given condition)."""

    def __init__(self, key: bytes | None, value_contains: bytes | None, header: str | None) -> None:
        self.key = key
        self.value_contains = value_contains
        self.header_name: str | None = None
        self.header_value: bytes | None = None
        if header is not None:
            name, eq, value = header.partition("=")
            self.header_name, self.header_value = name, (value.encode() if eq else None)
        self.any = key is not None or value_contains is not None or header is not None

    def __call__(self, record: Record) -> bool:
        if self.key is not None and record.key != self.key:
            return False
        if self.value_contains is not None and (
            record.value is None or self.value_contains not in record.value
        ):
            return False
        if self.header_name is not None:
            return any(
                k == self.header_name and (self.header_value is None or v == self.header_value)
                for k, v in record.headers
            )
        return True


class _Cursor:
    """One partition's place in the merge: records read ahead (`ahead`, in merge order), where
    reading goes on (`read_at`), and where the next page starts (`position`: for oldest, the
    next offset to look at; for newest, the offset below which records are left)."""

    def __init__(self, partition: int, log: Partition, position: int, newest: bool) -> None:
        self.partition = partition
        self.log = log
        self.newest = newest
        view = log.view
        self.start, self.end = view.log_start_offset, view.high_watermark  # this page's bounds
        self.position = min(max(position, self.start), self.end)
        self.read_at = self.position
        self.ahead: deque[Record] = deque()
        self.chunk = FIRST_CHUNK

    @property
    def drained(self) -> bool:
        return self.read_at <= self.start if self.newest else self.read_at >= self.end

    async def fill(self) -> int:
        """Read the next chunk into `ahead` (nothing once drained); the records read."""
        while not self.ahead and not self.drained:
            if self.newest:
                low = max(self.start, self.read_at - self.chunk)
                got: list[Record] = []
                at = low
                while at < self.read_at:
                    result = await self.log.read_records(at, self.read_at - at, CHUNK_BYTES)
                    got.extend(r for r in result.records if r.offset < self.read_at)
                    if not result.records or result.next_offset <= at:
                        break
                    at = result.next_offset
                self.read_at = low
                self.ahead.extend(reversed(got))
            else:
                result = await self.log.read_records(self.read_at, self.chunk, CHUNK_BYTES)
                records = [r for r in result.records if r.offset < self.end]
                self.read_at = (
                    self.end
                    if not result.records
                    else min(max(result.next_offset, self.read_at + 1), self.end)
                )
                self.ahead.extend(records)
            self.chunk = min(self.chunk * 2, MAX_CHUNK)
        return len(self.ahead)

    def take(self) -> Record:
        record = self.ahead.popleft()
        self.position = record.offset if self.newest else record.offset + 1
        return record

    @property
    def done(self) -> bool:
        return not self.ahead and self.drained


async def _starts(
    log: Partition, order: RecordsOrder, from_offset: int | None, from_time: int | None
) -> int:
    """Where a first page starts in one partition."""
    view = log.view
    if from_offset is not None:
        return from_offset if order is RecordsOrder.oldest else from_offset + 1
    if from_time is not None:
        # oldest: the first record at or after the time (ListOffsets); newest: the records before
        # the first one after it
        found = await log.offset_for_timestamp(
            from_time if order is RecordsOrder.oldest else from_time + 1
        )
        return view.high_watermark if found is None else found[0]
    return view.log_start_offset if order is RecordsOrder.oldest else view.high_watermark


def _filter_bytes(text: str | None, fmt: str, what: str) -> bytes | None:
    if text is None:
        return None
    if fmt == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error:
            raise ApiError(
                422, "validation_error", f"{what} is not base64 (key_format=base64)"
            ) from None
    return text.encode()


@router.get(
    "/{topic}/records",
    operation_id="browseRecords",
    response_model=TopicRecordsPage,
    responses={
        400: {"model": Problem, "description": "invalid_cursor"},
        401: {"model": Problem, "description": "unauthorized"},
        403: {"model": Problem, "description": "forbidden"},
        404: {"model": Problem, "description": "topic_not_found, partition_not_found"},
        422: {"model": Problem, "description": "validation_error, not_utf8, not_json"},
        503: {"model": Problem, "description": "partition_offline"},
    },
    summary="Browse a topic's records: partitions merged, newest or oldest first, filtered, paged",
    description=(
        "The records of every partition (or those in `partition`), merged by timestamp, newest or "
        "oldest first; filters on the key, a text in the value, a header; a first page may start "
        "at an offset (in each partition) or a time. A page looks at no more than `max_scan` "
        "records: a filter that matches little answers a short page (`scan_limited`) with a "
        "cursor to go on from."
    ),
)
async def browse(
    topic: str,
    request: Request,
    engine: Engine,
    _principal: Reader,
    order: RecordsOrder = RecordsOrder.newest,
    limit: int = Query(50, ge=1, le=MAX_LIMIT, description="records on the page, at most"),
    cursor: str | None = Query(
        None, max_length=1_000_000, description="next_cursor of the page before"
    ),
    partition: list[int] | None = Query(
        None, description="only these partitions (repeat the parameter)"
    ),
    key: str | None = Query(
        None, description="only records with this key (in key_format: base64 for binary keys)"
    ),
    value_contains: str | None = Query(
        None, min_length=1, description="only records whose value holds this text (its UTF-8 bytes)"
    ),
    header: str | None = Query(
        None, min_length=1, description="only records with this header: `name`, or `name=value`"
    ),
    from_offset: int | None = Query(
        None,
        ge=0,
        description="first page: start at this offset in each partition "
        "(oldest: at or after it; newest: at or before it)",
    ),
    from_time: int | None = Query(
        None,
        ge=0,
        description="first page: start at this time, ms since the epoch "
        "(oldest: the first records at or after it; newest: those up to it)",
    ),
    max_scan: int = Query(
        DEFAULT_SCAN, ge=1, le=MAX_SCAN, description="records looked at for this page, at most"
    ),
    key_format: Format = Format.string,
    value_format: Format = Format.string,
) -> Any:
    if from_offset is not None and from_time is not None:
        raise ApiError(422, "validation_error", "give from_offset or from_time, not both")
    state = engine.topic(topic)
    count = len(state.partitions)
    wanted = sorted(set(partition)) if partition else list(range(count))
    for p in wanted:
        if p >= count:
            engine.partition(topic, p)  # partition_not_found, as everywhere
    newest = order is RecordsOrder.newest
    positions = _decode_cursor(cursor, order) if cursor is not None else None
    cursors: list[_Cursor] = []
    for p in wanted:
        log = engine.partition(topic, p)
        if positions is not None:
            if p not in positions:
                continue  # a partition added since the first page, or one the first page left out
            start = positions[p]
        else:
            start = await _starts(log, order, from_offset, from_time)
        cursors.append(_Cursor(p, log, start, newest))
    match = _Filter(
        _filter_bytes(key, key_format.value, "key"),
        None if value_contains is None else value_contains.encode(),
        header,
    )
    page, scanned = await _merge(cursors, newest, match, limit, max_scan)
    records = _records_json([r for _, r in page], key_format.value, value_format.value)
    left = not all(c.done for c in cursors)
    request.app.state.metrics.fetched_records.labels(topic).inc(len(page))
    return {
        "records": [{"partition": p, **r} for (p, _), r in zip(page, records, strict=True)],
        "next_cursor": _encode_cursor(order, {c.partition: c.position for c in cursors})
        if left
        else None,
        "scanned": scanned,
        "scan_limited": left and len(page) < limit,
    }


async def _merge(
    cursors: list[_Cursor], newest: bool, match: _Filter, limit: int, max_scan: int
) -> tuple[list[tuple[int, Record]], int]:
    """Up to `limit` matching records, merged across `cursors` by timestamp, having looked at no
    more than `max_scan`; each cursor's position is left after the last record looked at."""
    heap: list[tuple[tuple[int, int, int], int]] = []

    def push(i: int) -> None:
        head = cursors[i].ahead[0]
        sort = (
            (-head.timestamp, cursors[i].partition, -head.offset)
            if newest
            else (head.timestamp, cursors[i].partition, head.offset)
        )
        heapq.heappush(heap, (sort, i))

    for i, c in enumerate(cursors):
        if await c.fill():
            push(i)
    page: list[tuple[int, Record]] = []
    scanned = 0
    while heap and len(page) < limit and scanned < max_scan:
        _, i = heapq.heappop(heap)
        c = cursors[i]
        record = c.take()
        scanned += 1
        if match(record):
            page.append((c.partition, record))
        if c.ahead or await c.fill():
            push(i)
    return page, scanned
