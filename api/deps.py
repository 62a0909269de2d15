"""Dependencies shared by the routers (Annotated aliases)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from engine.errors import LogClosedError
from engine.interface import Engine as EngineFace


async def get_engine(request: Request) -> EngineFace:
    # async: a plain def dependency would run in FastAPI's threadpool, a hop on every request
    engine: EngineFace | None = request.app.state.engine
    if engine is None or request.app.state.shutting_down:
        raise LogClosedError("engine")
    return engine


# a route's engine; to mypy, engine/interface.py's Engine (a LogManager, or a shard's view of its
# family), which the routers' helpers take as well
Engine = Annotated[EngineFace, Depends(get_engine)]
