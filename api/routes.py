"""install_routes(app): the routers, the fast routes, the error handlers, the console and the
OpenAPI document wired into an app. Its own module, not api/__init__.py: importing any api
module runs the package's __init__ first, and the CLI's settings (app/settings.py) must not
load every router and FastAPI with it."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from . import (
    admin,
    browse,
    console,
    docs,
    groups,
    health,
    keys,
    offsets,
    queues,
    records,
    snapshots,
    topics,
)
from .errors import (
    PROBLEM_EXAMPLES,
    PROBLEM_JSON,
    STATUS_CODES,
    install_error_handlers,
    problem_example,
)
from .schemas import KeyProduceRequest, ProduceRequest

# operations under a produce or fetch quota (quotas.py)
_QUOTA_OPERATIONS = frozenset({
    "produceRecords", "produceToPartition", "fetchRecords", "streamRecords", "appendKeyRecords",
    "readKeyRecords",
    "streamKeyRecords", "leaseQueueRecords",
    "browseRecords", "fetchRecordBatches",
})
# models referenced only from openapi_extra (bodies parsed by hand) must still be published
_EXTRA_SCHEMAS = (ProduceRequest, KeyProduceRequest)


def install_routes(app: FastAPI) -> None:
    install_error_handlers(app)
    # No 307 to the path without its trailing slash: a path parameter ending in an encoded "/"
    # (DELETE /v1/topics/orders%2F) would be redirected to another resource (/v1/topics/orders).
    app.router.redirect_slashes = False
    app.include_router(health.router)
    app.include_router(topics.router)
    app.include_router(records.router)
    app.include_router(browse.router)  # GET /v1/topics/{topic}/records: all partitions merged
    app.include_router(keys.router)
    app.include_router(offsets.router)
    app.include_router(groups.router)
    app.include_router(queues.router)
    app.include_router(admin.router)
    app.include_router(snapshots.router)
    app.include_router(health.server_router)
    app.include_router(docs.router)  # /docs and /redoc without a CDN
    app.include_router(console.router)  # the web console at / and /console
    # produce and fetch without FastAPI's per-request machinery, ahead of their documented routes
    app.router.routes[0:0] = records.fast_routes()

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in _EXTRA_SCHEMAS:
                extra = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(extra.pop("$defs", {}))
                components[model.__name__] = extra
            _document_problems(schema)
            _document_examples(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document_problems(schema: dict[str, Any]) -> None:
    """Every error is application/problem+json (errors.py), not the application/json FastAPI
    documents for `responses={...: {"model": Problem}}`; request validation answers a Problem
    with code validation_error, not FastAPI's own HTTPValidationError; any request body may
    meet the request policy's size and time limits (policy.py), any GET its answer time limit,
    and produce and fetch their quotas (quotas.py)."""
    problem = {"schema": {"$ref": "#/components/schemas/Problem"}}
    optional: list[dict[str, Any]] = []
    for path_item in schema.get("paths", {}).values():
        for method, operation in path_item.items():
            responses = operation["responses"]
            if "requestBody" in operation:
                responses.setdefault(
                    "413", {"description": "request_too_large", "content": {PROBLEM_JSON: problem}}
                )
                # policy.py: a body that does not arrive within EVENTLOG_REQUEST_TIMEOUT_MS
                responses.setdefault(
                    "408", {"description": "request_timeout", "content": {PROBLEM_JSON: problem}}
                )
            streams = ("streamRecords", "streamKeyRecords")
            if method == "get" and operation.get("operationId") not in streams:
                # policy.py: a GET that has not started its answer within
                # EVENTLOG_REQUEST_TIMEOUT_MS
                if "503" in responses:
                    responses["503"]["description"] += "; request_timeout: no answer in time"
                else:
                    responses["503"] = {
                        "description": "request_timeout", "content": {PROBLEM_JSON: problem}
                    }
            if operation.get("operationId") in _QUOTA_OPERATIONS:
                responses.setdefault("429", {
                    "description": (
                        "quota_exceeded: the token is over its produce or fetch byte rate"
                    ),
                    "headers": {"Retry-After": {
                        "description": "whole seconds to wait", "schema": {"type": "integer"},
                    }},
                    "content": {PROBLEM_JSON: problem},
                })
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if not status.startswith(("4", "5")) or "application/json" not in content:
                    continue
                ref = content["application/json"].get("schema", {}).get("$ref", "")
                if ref.endswith("/HTTPValidationError"):
                    response["description"] = "validation_error"  # the 422 FastAPI adds by itself
                response["content"] = {PROBLEM_JSON: problem}
            if operation.get("security"):
                # a token is needed only when the server has an auth file (off by default): the
                # bearer scheme goes to the document's top level with an empty alternative, the
                # form SDK generators read as optional (openapi-python-client takes any
                # operation-level security as required, and types its client as authenticated)
                for requirement in operation.pop("security"):
                    if requirement and requirement not in optional:
                        optional.append(requirement)
    if optional:
        schema["security"] = [*optional, {}]
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)


# an operation whose body's model is shared, with its own example (docs/API.md's)
_REQUEST_EXAMPLES: dict[str, Any] = {
    "produceToPartition": {"records": [{"value": "to partition 3"}]},
}
_CODE = re.compile(r"\b[a-z]+(?:_[a-z0-9]+)*\b")


def _document_examples(schema: dict[str, Any]) -> None:
    """Real examples, where Swagger UI and ReDoc would otherwise render a body generated from
    the schema (status 0, every optional member empty): each problem+json response gets one
    example per code its description names (the status's usual code where it names none),
    each that code's own body at that status; a request body whose model carries examples
    (docs/API.md's) shows the first."""
    components = schema.get("components", {}).get("schemas", {})
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {}).get(PROBLEM_JSON)
                if content is None or not status.isdigit():
                    continue
                code_status = int(status)
                words = _CODE.findall(response.get("description", ""))
                named = [c for c in dict.fromkeys(words) if c in PROBLEM_EXAMPLES]
                codes = named or [STATUS_CODES.get(code_status, "internal_error")]
                examples = {
                    code: {"summary": code, "value": problem_example(code_status, code)}
                    for code in codes
                }
                # a new dict: _document_problems gives every response the same content object
                response["content"][PROBLEM_JSON] = {**content, "examples": examples}
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            ref = (body or {}).get("schema", {}).get("$ref", "")
            model = components.get(ref.rsplit("/", 1)[-1], {}) if ref else {}
            if body is not None and operation.get("operationId") in _REQUEST_EXAMPLES:
                body["example"] = _REQUEST_EXAMPLES[operation["operationId"]]
            elif body is not None and model.get("examples"):
                body["example"] = model["examples"][0]
