"""Point-in-time snapshots of the data directory (engine/snapshots.py), for Spark and backups."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Body, Request, Response

from engine import snapshots
from engine.metadata import INTERNAL_TOPICS

from .auth import Admin, Reader
from .deps import Engine
from .errors import ApiError
from .schemas import Problem, Snapshot, SnapshotList, SnapshotRequest

router = APIRouter(prefix="/v1/snapshots", tags=["snapshots"])

_problems: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "invalid_json"},
    401: {"model": Problem, "description": "unauthorized"},
    403: {"model": Problem, "description": "forbidden"},
    404: {"model": Problem, "description": "topic_not_found, snapshot_not_found"},
    422: {"model": Problem, "description": "validation_error"},
}


def _root(request: Request):
    return request.app.state.settings.snapshot_root


@router.post(
    "",
    operation_id="createSnapshot",
    status_code=201,
    response_model=Snapshot,
    responses=_problems,
    summary="Take a consistent snapshot of topics",
    description=(
        "Hard-links every closed segment and copies the active segment's durable prefix into "
        "`<snapshot dir>/<id>/<topic>-<partition>/`, with `manifest.json`. Records written later never "
        "show in it; records compacted or deleted later stay in it. Producers are not blocked. Without "
        "`topics`: every user topic, for an admin; internal topics only when named. A consumer may "
        "snapshot the topics its prefixes cover."
    ),
)
async def create_snapshot(
    request: Request,
    engine: Engine,
    principal: Reader,
    body: SnapshotRequest | None = Body(None),
) -> Snapshot:
    names = body.topics if body and body.topics is not None else None
    if names is None:
        if principal.role != "admin":
            raise ApiError(403, "forbidden", "name the topics to snapshot: all topics need the admin role")
        names = sorted(n for n in engine.topics if n not in INTERNAL_TOPICS)
    for name in names:
        if not principal.covers_topic(name):
            raise ApiError(403, "forbidden", f"{principal.name!r} has no access to topic {name!r}")
    infos = snapshots.topic_infos(engine, names)
    root = _root(request)
    manifest = await snapshots.take_snapshot(root, infos, engine.clock())
    return Snapshot(**snapshots.summary(manifest, root))


@router.get(
    "",
    operation_id="listSnapshots",
    response_model=SnapshotList,
    responses={401: _problems[401], 403: _problems[403]},
    summary="List snapshots, oldest first",
)
async def list_snapshots(request: Request, _principal: Admin) -> SnapshotList:
    root = _root(request)
    manifests = await anyio.to_thread.run_sync(snapshots.list_snapshots, root)
    return SnapshotList(snapshots=[Snapshot(**snapshots.summary(m, root)) for m in manifests])


@router.get(
    "/{snapshot_id}",
    operation_id="describeSnapshot",
    response_model=Snapshot,
    responses={401: _problems[401], 403: _problems[403], 404: _problems[404]},
    summary="One snapshot: its topics, partitions, offsets and sizes",
)
async def describe_snapshot(snapshot_id: str, request: Request, _principal: Admin) -> Snapshot:
    root = _root(request)
    manifest = await anyio.to_thread.run_sync(snapshots.read_manifest, root, snapshot_id)
    return Snapshot(**snapshots.summary(manifest, root))


@router.delete(
    "/{snapshot_id}",
    operation_id="deleteSnapshot",
    status_code=204,
    response_class=Response,
    responses={401: _problems[401], 403: _problems[403], 404: _problems[404]},
    summary="Delete a snapshot (its own links and copies; the live segments are untouched)",
)
async def delete_snapshot(snapshot_id: str, request: Request, _principal: Admin) -> Response:
    await anyio.to_thread.run_sync(snapshots.delete_snapshot, _root(request), snapshot_id)
    return Response(status_code=204)
