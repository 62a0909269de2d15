"""Queues over HTTP: create, describe, list and delete a topic's queues; lease records, and ack,
release, reject or renew the leases (engine/queues.py holds the semantics; docs/API.md, "Queues").

Rights: a consumer of the topic (the `read` right on the path's topic) for every route. A lease
is under the token's fetch quota (its answer's bytes count, api/quotas.py) and long-polls with
`wait_ms`; fetched records' formats (key_format, value_format) are fetch's (api/formats.py).

The hot lane (api/lane.py) serves lease and the settle calls ahead of the router, with the
answers these routes write (lease_answer, settle_answer) and their bodies' models: a body the
model does not take comes here.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from engine.errors import LogClosedError
from engine.interface import Queues, ready
from engine.queues import LeasedRecord as EngineLeased
from engine.queues import QueueInfo, QueueSettings

from . import formats
from .auth import Reader
from .deps import Engine
from .policy import PolicyRoute
from .schemas import (
    Format,
    LeaseRequest,
    LeaseResponse,
    LeaseResults,
    LeasesRequest,
    Problem,
    QueueCreate,
    QueueList,
    QueuePartition,
    QueueStartTime,
    ReleaseRequest,
    RenewRequest,
)
from .schemas import Queue as QueueModel

router = APIRouter(prefix="/v1/topics", tags=["queues"], route_class=PolicyRoute)

_problems: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "invalid_request (queue name)"},
    401: {"model": Problem, "description": "unauthorized"},
    403: {"model": Problem, "description": "forbidden"},
    404: {"model": Problem, "description": "topic_not_found, queue_not_found"},
    422: {"model": Problem, "description": "validation_error"},
    503: {
        "model": Problem,
        "description": "unavailable: a shard owning a partition the call needs is down",
    },
}
_QUEUE = "/{topic}/queues/{queue}"


def _queues(engine: Engine) -> Queues:
    queues = engine.queues
    if queues is None:
        raise LogClosedError("queues")
    return queues



def _model(info: QueueInfo) -> QueueModel:
    s = info.settings
    start: str | QueueStartTime = (
        s.start if isinstance(s.start, str) else QueueStartTime(timestamp=s.start)
    )
    return QueueModel(
        topic=info.topic,
        queue=info.name,
        lock_ms=s.lock_ms,
        max_deliveries=s.max_deliveries,
        ordering=s.ordering,
        start=start,
        dead_letter_topic=s.dead_letter_topic,
        created_ms=info.created_ms,
        partitions=[QueuePartition(**p) for p in info.partitions],
    )


@router.put(
    _QUEUE,
    operation_id="createQueue",
    response_model=QueueModel,
    status_code=201,
    responses={
        200: {"model": QueueModel, "description": "it exists with the same settings"},
        **_problems,
        409: {"model": Problem, "description": "queue_exists: with other settings"},
    },
    summary="Create a queue of a topic: records leased to workers, acknowledged one by one",
)
async def create_queue(
    topic: str, queue: str, body: QueueCreate, engine: Engine, _principal: Reader
) -> Response:
    start = body.start if isinstance(body.start, str) else body.start.timestamp
    settings = QueueSettings(
        body.lock_ms, body.max_deliveries, body.ordering, start, body.dead_letter_topic
    )
    info, created = await _queues(engine).create(topic, queue, settings)
    return Response(
        _model(info).model_dump_json().encode(),
        status_code=201 if created else 200,
        media_type="application/json",
    )


@router.get(
    _QUEUE,
    operation_id="describeQueue",
    response_model=QueueModel,
    responses=_problems,
    summary="A queue's settings and, per partition, its window and counts",
)
async def describe_queue(topic: str, queue: str, engine: Engine, _principal: Reader) -> QueueModel:
    return _model(await ready(_queues(engine).describe(topic, queue)))


@router.delete(
    _QUEUE,
    operation_id="deleteQueue",
    status_code=204,
    response_class=Response,
    responses=_problems,
    summary="Delete a queue (its leases end; the topic's records stay)",
)
async def delete_queue(topic: str, queue: str, engine: Engine, _principal: Reader) -> Response:
    await _queues(engine).delete(topic, queue)
    return Response(status_code=204)


@router.get(
    "/{topic}/queues",
    operation_id="listQueues",
    response_model=QueueList,
    responses=_problems,
    summary="A topic's queues, by name",
)
async def list_queues(topic: str, engine: Engine, _principal: Reader) -> QueueList:
    return QueueList(queues=await ready(_queues(engine).names(topic)))


def _record_json(r: EngineLeased, kf: str, vf: str) -> dict[str, Any]:
    return {
        "partition": r.partition,
        "offset": r.offset,
        "key": formats.decode(r.key, kf, "key", r.offset),
        "value": formats.decode(r.value, vf, "value", r.offset),
        # a header key that is not UTF-8 shows U+FFFD, as fetch shows it (api/records.py)
        "headers": [
            {
                "key": k
                if k.isascii()
                else k.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                "value": formats.decode(v, vf, "value of header", r.offset),
            }
            for k, v in r.headers
        ],
        "timestamp": r.timestamp,
        "delivery_count": r.delivery_count,
        "lease": r.lease,
        "lease_expires_at": r.lease_expires_at,
    }


@router.post(
    _QUEUE + "/lease",
    operation_id="leaseQueueRecords",
    response_model=LeaseResponse,
    responses={
        **_problems,
        422: {"model": Problem, "description": "validation_error, not_utf8, not_json"},
    },
    summary="Lease records: each is held for lock_ms, then delivered again unless acknowledged",
)
async def lease(
    topic: str,
    queue: str,
    body: LeaseRequest,
    request: Request,
    engine: Engine,
    _principal: Reader,
    key_format: Format = Format.string,
    value_format: Format = Format.string,
) -> Response:
    answer = await lease_answer(
        engine, request.app.state.metrics, topic, queue, body, key_format.value, value_format.value
    )
    return Response(answer, media_type="application/json")


async def lease_answer(
    engine: Engine, metrics: Any, topic: str, queue: str, body: LeaseRequest, kf: str, vf: str
) -> bytes:
    """A lease's records as LeaseResponse's JSON (written here, not by the route's model: one
    model per record cost more than the lease): the route's answer and the hot lane's
    (api/lane.py)."""
    leased = await _queues(engine).lease(topic, queue, body.max_records, body.lock_ms, body.wait_ms)
    records = [_record_json(r, kf, vf) for r in leased]
    if records:
        metrics.fetched_records.labels(topic).inc(len(records))
    return orjson.dumps({"records": records})


# what each settle call's body holds: its model (each route declares it too)
SETTLE_BODIES: dict[str, type[LeasesRequest]] = {
    "ack": LeasesRequest,
    "release": ReleaseRequest,
    "reject": LeasesRequest,
    "renew": RenewRequest,
}


async def settle_answer(
    engine: Engine, topic: str, queue: str, action: str, body: LeasesRequest
) -> bytes:
    """Settle the body's leases: LeaseResults' JSON, written here (a model per lease, validated
    and serialized again by the route, cost more than the engine's settling of it): the routes'
    answer and the hot lane's (api/lane.py)."""
    options: dict[str, Any] = {}
    if isinstance(body, ReleaseRequest):
        options["delay_ms"] = body.delay_ms
    elif isinstance(body, RenewRequest):
        options["lock_ms"] = body.lock_ms
    results = await _queues(engine).settle(topic, queue, action, body.leases, **options)
    return orjson.dumps({"results": [{"lease": lease, "status": s} for lease, s in results]})


async def _settle(
    engine: Engine, topic: str, queue: str, action: str, body: LeasesRequest
) -> Response:
    answer = await settle_answer(engine, topic, queue, action, body)
    return Response(answer, media_type="application/json")


_SETTLE_DOC = (
    "Each lease's status, in the order given: `expired` when the lease no longer holds its record "
    "(its lock ran out, even if the record was leased again since; or it was settled), `unknown` "
    "when it is not a lease of this queue. Durable (fsynced) before the answer."
)


@router.post(
    _QUEUE + "/ack",
    operation_id="ackQueueRecords",
    response_model=LeaseResults,
    responses=_problems,
    summary="Acknowledge leased records: never delivered again",
    description=_SETTLE_DOC,
)
async def ack(
    topic: str, queue: str, body: LeasesRequest, engine: Engine, _principal: Reader
) -> Response:
    return await _settle(engine, topic, queue, "ack", body)


@router.post(
    _QUEUE + "/release",
    operation_id="releaseQueueRecords",
    response_model=LeaseResults,
    responses=_problems,
    summary="Release leased records: leasable again (after delay_ms), their delivery counts kept",
    description=_SETTLE_DOC,
)
async def release(
    topic: str, queue: str, body: ReleaseRequest, engine: Engine, _principal: Reader
) -> Response:
    return await _settle(engine, topic, queue, "release", body)


@router.post(
    _QUEUE + "/reject",
    operation_id="rejectQueueRecords",
    response_model=LeaseResults,
    responses=_problems,
    summary="Reject leased records: dead-lettered at once (or archived)",
    description=_SETTLE_DOC,
)
async def reject(
    topic: str, queue: str, body: LeasesRequest, engine: Engine, _principal: Reader
) -> Response:
    return await _settle(engine, topic, queue, "reject", body)


@router.post(
    _QUEUE + "/renew",
    operation_id="renewQueueLeases",
    response_model=LeaseResults,
    responses=_problems,
    summary="Renew leases: each holds its record for lock_ms more from now",
    description=_SETTLE_DOC,
)
async def renew(
    topic: str, queue: str, body: RenewRequest, engine: Engine, _principal: Reader
) -> Response:
    return await _settle(engine, topic, queue, "renew", body)
