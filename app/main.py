"""create_app(settings): the composition root of the HTTP service."""

from __future__ import annotations

from fastapi import FastAPI

from api import install_routes

from .lifespan import make_lifespan
from .settings import Settings

__version__ = "0.1.0"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(
        title="eventlog",
        version=__version__,
        summary="Apache Kafka's log layer behind a REST API",
        lifespan=make_lifespan(settings),
    )
    app.state.settings = settings
    app.state.engine = None
    app.state.startup_error = None
    app.state.shutting_down = False
    install_routes(app)
    return app
