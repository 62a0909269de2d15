"""Dependencies shared by the routers (Annotated aliases)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from engine.errors import InvalidRequestError, LogClosedError
from engine.log_manager import LogManager
from engine.metadata import INTERNAL_TOPICS


async def get_engine(request: Request) -> LogManager:
    # async: a plain def dependency would run in FastAPI's threadpool, a hop on every request
    engine = request.app.state.engine
    if engine is None or request.app.state.shutting_down:
        raise LogClosedError("engine")
    return engine


Engine = Annotated[LogManager, Depends(get_engine)]


def refuse_internal(topic: str) -> None:
    """Only the server writes __metadata and __consumer_offsets, or moves their log start:
    Kafka refuses Produce and DeleteRecords on internal topics, and here a client's records would
    be replayed as topic metadata or group offsets (deleting __metadata's records loses every
    topic at the next start)."""
    if topic in INTERNAL_TOPICS:
        raise InvalidRequestError(f"{topic} is managed by the server")
