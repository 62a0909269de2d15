"""Liveness and readiness."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from .auth import ROLES, Monitor, Principal
from .errors import problem
from .metrics_merge import merge_expositions
from .policy import PolicyRoute
from .schemas import Problem, ServerInfo, Status, WhoAmI

router = APIRouter(tags=["health"], route_class=PolicyRoute)
server_router = APIRouter(tags=["server"], route_class=PolicyRoute)


@router.get("/healthz", operation_id="getHealth", response_model=Status, summary="The process is serving")
async def healthz() -> Status:
    return Status(status="ok")


@router.get(
    "/readyz",
    operation_id="getReadiness",
    response_model=Status,
    responses={
        401: {"model": Problem, "description": "unauthorized"},
        503: {"model": Problem, "description": "not_ready: shutting down"},
    },
    summary="Recovery is done and the engine takes requests",
)
async def readyz(request: Request, _principal: Monitor) -> Status | Response:
    engine = request.app.state.engine
    if engine is None or not engine.ready or engine.stopping or request.app.state.shutting_down:
        return problem(503, "not_ready", "the engine is not ready")
    return Status(status="ready")


@router.get(
    "/metrics",
    operation_id="getMetrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}, "description": "Prometheus text format"},
        401: {"model": Problem, "description": "unauthorized"},
    },
    summary="Prometheus metrics: requests, produce/fetch, group commits, fsync latency, partitions",
)
async def metrics(request: Request, principal: Monitor) -> Response:
    text = generate_latest(request.app.state.metrics.registry)
    if (peer_metrics := getattr(request.app.state, "peer_metrics", None)) is not None:  # a shard
        text = merge_expositions([text, *await peer_metrics()])
    if principal.role != "admin":
        text = _only_covered_topics(text, principal)
    return Response(text, media_type=CONTENT_TYPE_LATEST)


@server_router.get(
    "/v1/whoami",
    operation_id="getPrincipal",
    response_model=WhoAmI,
    responses={401: {"model": Problem, "description": "unauthorized"}},
    summary="The caller's token: its role, prefixes and what it may do; the server's version and shards",
)
async def whoami(request: Request, principal: Monitor) -> WhoAmI:
    engine = request.app.state.engine
    return WhoAmI(
        name=principal.name, role=principal.role, actions=sorted(ROLES[principal.role]),
        topics=list(principal.topics), groups=list(principal.groups),
        server=ServerInfo(
            version=request.app.version, shards=engine.shard_count if engine is not None else 1,
            shard=engine.shard_index if engine is not None else 0,
            auth=request.app.state.settings.auth_file is not None,
        ),
    )


_TOPIC_LABEL = re.compile(rb'[{,]topic="([^"]*)"')


def _only_covered_topics(text: bytes, principal: Principal) -> bytes:
    """Samples labelled with a topic the principal's prefixes do not cover are left out: a
    token limited to `billing.` does not learn other topics' names, sizes or traffic."""
    kept = []
    for line in text.split(b"\n"):
        found = _TOPIC_LABEL.search(line) if not line.startswith(b"#") else None
        if found is None or principal.covers_topic(found.group(1).decode()):
            kept.append(line)
    return b"\n".join(kept)
