"""HTTP API: routers, schemas, error mapping. install_routes(app) wires it into an app."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from . import groups, health, offsets, records, topics
from .errors import install_error_handlers
from .schemas import ProduceRequest

# models referenced only from openapi_extra (bodies parsed by hand) must still be published
_EXTRA_SCHEMAS = (ProduceRequest,)


def install_routes(app: FastAPI) -> None:
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(topics.router)
    app.include_router(records.router)
    app.include_router(offsets.router)
    app.include_router(groups.router)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in _EXTRA_SCHEMAS:
                extra = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(extra.pop("$defs", {}))
                components[model.__name__] = extra
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["install_routes"]
