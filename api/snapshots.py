"""Point-in-time snapshots of the data directory (engine/snapshots.py), for Spark and backups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, Body, Request, Response

from engine import snapshots
from engine.metadata import INTERNAL_TOPICS

from .auth import Admin
from .deps import Engine
from .errors import ServerPaths
from .policy import PolicyRoute
from .schemas import Problem, Snapshot, SnapshotList, SnapshotRequest

router = APIRouter(prefix="/v1/snapshots", tags=["snapshots"], route_class=PolicyRoute)

_problems: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "invalid_json"},
    401: {"model": Problem, "description": "unauthorized"},
    403: {"model": Problem, "description": "forbidden"},
    404: {"model": Problem, "description": "topic_not_found, snapshot_not_found"},
    422: {"model": Problem, "description": "validation_error"},
    500: {"model": Problem, "description": "storage_error: the disk failed, or a manifest is damaged"},
}
_refusals: dict[int | str, dict[str, Any]] = {
    507: {
        "model": Problem,
        "description": (
            "snapshot_limit: the snapshot would pass EVENTLOG_SNAPSHOT_MAX_COUNT or EVENTLOG_SNAPSHOT_MAX_BYTES "
            "(with `limit`, `max_count`, `max_bytes`, `snapshots`, `snapshot_bytes`, `needed_bytes`); "
            "storage_full: the disk filled while it was taken. Either way nothing was kept."
        ),
    },
}


def _root(request: Request) -> Path:
    return request.app.state.settings.snapshot_root


def _answer(request: Request, manifest: dict[str, Any]) -> Snapshot:
    """The API's view of a manifest, its path relative to the data dir (api/errors.py)."""
    answer = snapshots.summary(manifest, _root(request))
    paths = ServerPaths.of(request)
    assert paths is not None  # the app has settings
    answer["path"] = paths.snapshot(answer["id"])
    return Snapshot(**answer)


@router.post(
    "",
    operation_id="createSnapshot",
    status_code=201,
    response_model=Snapshot,
    responses={**_problems, **_refusals},
    summary="Take a consistent snapshot of topics (admin only)",
    description=(
        "Hard-links every closed segment and copies the active segment's durable prefix into "
        "`<snapshot dir>/<id>/<topic>-<partition>/`, with `manifest.json`. Records written later never "
        "show in it; records compacted or deleted later stay in it. Producers are not blocked. Without "
        "`topics`: every user topic; internal topics only when named. Admin only: a snapshot takes "
        "disk space the log shares. Refused with 507 `snapshot_limit`, before anything is written, when "
        "it would pass the snapshot count or bytes cap; 507 `storage_full` when the disk fills meanwhile "
        "(the snapshot's directory is removed)."
    ),
)
async def create_snapshot(
    request: Request,
    engine: Engine,
    _principal: Admin,
    body: SnapshotRequest | None = Body(None),
) -> Snapshot:
    names = body.topics if body and body.topics is not None else None
    if names is None:
        names = sorted(n for n in engine.topics if n not in INTERNAL_TOPICS)
    infos = snapshots.topic_infos(engine, names)
    settings = request.app.state.settings
    manifest = await snapshots.take_snapshot(_root(request), infos, engine.clock(), settings.snapshot_limits())
    return _answer(request, manifest)


@router.get(
    "",
    operation_id="listSnapshots",
    response_model=SnapshotList,
    responses={401: _problems[401], 403: _problems[403], 500: _problems[500]},
    summary="List snapshots, oldest first",
)
async def list_snapshots(request: Request, _principal: Admin) -> SnapshotList:
    manifests = await anyio.to_thread.run_sync(snapshots.list_snapshots, _root(request))
    return SnapshotList(snapshots=[_answer(request, m) for m in manifests])


@router.get(
    "/{snapshot_id}",
    operation_id="describeSnapshot",
    response_model=Snapshot,
    responses={401: _problems[401], 403: _problems[403], 404: _problems[404], 500: _problems[500]},
    summary="One snapshot: its topics, partitions, offsets and sizes",
)
async def describe_snapshot(snapshot_id: str, request: Request, _principal: Admin) -> Snapshot:
    manifest = await anyio.to_thread.run_sync(snapshots.read_manifest, _root(request), snapshot_id)
    return _answer(request, manifest)


@router.delete(
    "/{snapshot_id}",
    operation_id="deleteSnapshot",
    status_code=204,
    response_class=Response,
    responses={401: _problems[401], 403: _problems[403], 404: _problems[404], 500: _problems[500]},
    summary="Delete a snapshot (its own links and copies; the live segments are untouched)",
)
async def delete_snapshot(snapshot_id: str, request: Request, _principal: Admin) -> Response:
    await anyio.to_thread.run_sync(snapshots.delete_snapshot, _root(request), snapshot_id)
    return Response(status_code=204)
