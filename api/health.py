"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from .errors import problem
from .schemas import Problem, Status

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="getHealth", response_model=Status, summary="The process is serving")
async def healthz() -> Status:
    return Status(status="ok")


@router.get(
    "/readyz",
    operation_id="getReadiness",
    response_model=Status,
    responses={503: {"model": Problem, "description": "recovering or shutting down"}},
    summary="Recovery is done and the engine takes requests",
)
async def readyz(request: Request) -> Status | Response:
    engine = request.app.state.engine
    if engine is None or not engine.ready or request.app.state.shutting_down:
        return problem(503, "not_ready", "the engine is not ready")
    return Status(status="ready")
