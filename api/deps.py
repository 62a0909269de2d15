"""Dependencies shared by the routers (Annotated aliases)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from engine.errors import LogClosedError
from engine.log_manager import LogManager


async def get_engine(request: Request) -> LogManager:
    # async: a plain def dependency would run in FastAPI's threadpool, a hop on every request
    engine = request.app.state.engine
    if engine is None or request.app.state.shutting_down:
        raise LogClosedError("engine")
    return engine


Engine = Annotated[LogManager, Depends(get_engine)]

