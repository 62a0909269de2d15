"""The one mapping from errors to RFC 9457 problem+json responses with stable codes.

    {"type": "urn:eventlog:problem:<code>", "title": str, "status": int, "detail": str,
     "code": str, ...extra members}

Handlers are registered for engine base classes; the most specific class wins. Engine code
never speaks HTTP; API code raises ApiError for request problems the engine never sees.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from engine import errors as e

logger = logging.getLogger("eventlog.api")

PROBLEM_JSON = "application/problem+json"


class ApiError(Exception):
    """Raised by API code for a request it refuses."""

    def __init__(self, status: int, code: str, detail: str, *, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra


# engine class -> (status, code); looked up along the exception's MRO, so subclasses win
ENGINE_ERRORS: dict[type[e.EngineError], tuple[int, str]] = {
    e.SnapshotNotFoundError: (404, "snapshot_not_found"),
    e.TopicNotFoundError: (404, "topic_not_found"),
    e.PartitionNotFoundError: (404, "partition_not_found"),
    e.NotFoundError: (404, "not_found"),
    e.TopicExistsError: (409, "topic_exists"),
    e.InvalidTopicNameError: (422, "invalid_topic_name"),
    e.InvalidConfigError: (422, "invalid_config"),
    e.InvalidPartitionsError: (422, "invalid_partitions"),
    e.CorruptBatchError: (400, "corrupt_batch"),
    e.KeyRequiredError: (422, "key_required"),
    e.RecordTooLargeError: (413, "record_too_large"),
    e.InvalidRequestError: (400, "invalid_request"),
    e.OffsetOutOfRangeError: (416, "offset_out_of_range"),
    e.OffsetMismatchError: (409, "offset_mismatch"),
    e.OutOfOrderSequenceError: (409, "out_of_order_sequence"),
    e.ProducerFencedError: (409, "producer_fenced"),
    e.StorageFullError: (507, "storage_full"),
    e.TopicDeletedError: (404, "topic_not_found"),  # what a new request would get
    e.LogClosedError: (503, "unavailable"),
    e.CompactionFailedError: (500, "compaction_failed"),
    e.StorageError: (500, "storage_error"),
    e.DataDirError: (500, "storage_error"),
    e.EngineError: (500, "internal_error"),
}


def problem(status: int, code: str, detail: str, *, headers: dict[str, str] | None = None, **extra: Any) -> Response:
    body = {
        "type": f"urn:eventlog:problem:{code}",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    }
    return Response(orjson.dumps(body), status_code=status, media_type=PROBLEM_JSON, headers=headers)


def engine_problem(exc: e.EngineError) -> Response:
    for cls in type(exc).__mro__:
        if cls in ENGINE_ERRORS:
            status, code = ENGINE_ERRORS[cls]
            break
    else:  # pragma: no cover - EngineError is in the table
        status, code = 500, "internal_error"
    extra: dict[str, Any] = {}
    if isinstance(exc, e.OffsetOutOfRangeError):
        extra = {"log_start_offset": exc.log_start_offset, "high_watermark": exc.high_watermark}
    elif isinstance(exc, e.OffsetMismatchError):
        extra = {"expected_offset": exc.expected, "high_watermark": exc.high_watermark}
    elif isinstance(exc, e.OutOfOrderSequenceError):
        extra = {"producer_id": exc.producer_id, "producer_epoch": exc.epoch, "sequence": exc.first_seq}
        if exc.last_seq is not None:
            extra["last_sequence"] = exc.last_seq
    elif isinstance(exc, e.ProducerFencedError):
        extra = {"producer_id": exc.producer_id, "producer_epoch": exc.epoch, "current_epoch": exc.current_epoch}
    if status == 507:
        # a full disk refuses every append until space returns: the engine logs each undone
        # commit once; one line per refused request would flood the log
        logger.debug("%s: %s", code, exc)
    elif status >= 500:
        logger.error("%s: %s", code, exc)
    return problem(status, code, str(exc), **extra)


async def _engine_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, e.EngineError)
    return engine_problem(exc)


async def _api_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return problem(exc.status, exc.code, exc.detail, headers=exc.headers, **exc.extra)


async def _validation_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors()
    ]
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    return problem(422, "validation_error", f"{where}: {first['msg']}" if where else first["msg"], errors=errors)


async def _http_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    codes = {
        400: "invalid_json",  # FastAPI: a JSON body it cannot decode (a BOM, then bytes that are not UTF-8)
        404: "not_found", 405: "method_not_allowed", 406: "not_acceptable", 413: "request_too_large", 415: "unsupported_media_type",
    }
    code = codes.get(exc.status_code, HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_"))
    response = problem(exc.status_code, code, str(exc.detail))
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def _unexpected_handler(_request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware calls this, then re-raises, so the traceback is logged too
    return problem(500, "internal_error", "internal error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(e.EngineError, _engine_handler)
    app.add_exception_handler(ApiError, _api_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(Exception, _unexpected_handler)
