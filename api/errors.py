"""The one mapping from errors to RFC 9457 problem+json responses with stable codes.

    {"type": "urn:eventlog:problem:<code>", "title": str, "status": int, "detail": str,
     "code": str, ...extra members}

Handlers are registered for engine base classes; the most specific class wins. Engine code
never speaks HTTP; API code raises ApiError for request problems the engine never sees.

No answer shows the server's absolute paths: an engine error's detail names files relative to
the data dir, and directories outside it as `<snapshot dir>` or `<log dir>` (ServerPaths).
"""

from __future__ import annotations

import logging
import os
import re
from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Scope

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
    e.SnapshotLimitError: (507, "snapshot_limit"),
    e.TopicNotFoundError: (404, "topic_not_found"),
    e.PartitionNotFoundError: (404, "partition_not_found"),
    e.QueueNotFoundError: (404, "queue_not_found"),
    e.QueueExistsError: (409, "queue_exists"),
    e.NotFoundError: (404, "not_found"),
    e.TopicExistsError: (409, "topic_exists"),
    e.InvalidTopicNameError: (422, "invalid_topic_name"),
    e.InvalidConfigError: (422, "invalid_config"),
    e.InvalidPartitionsError: (422, "invalid_partitions"),
    e.InvalidJsonError: (400, "invalid_json"),
    e.InvalidFieldError: (422, "validation_error"),
    e.CorruptBatchError: (400, "corrupt_batch"),
    e.TransactionsUnsupportedError: (400, "transactions_unsupported"),
    e.InflatedTooLargeError: (413, "request_too_large"),
    e.KeyRequiredError: (422, "key_required"),
    e.RecordTooLargeError: (413, "record_too_large"),
    e.InvalidRequestError: (400, "invalid_request"),
    e.OffsetOutOfRangeError: (416, "offset_out_of_range"),
    e.OffsetMismatchError: (409, "offset_mismatch"),  # 412 when If-Match named it (conditions.py)
    e.KeyVersionMismatchError: (412, "key_version_mismatch"),
    e.KeyIndexDisabledError: (409, "key_index_disabled"),
    e.OutOfOrderSequenceError: (409, "out_of_order_sequence"),
    e.ProducerFencedError: (409, "producer_fenced"),
    e.IdempotencyKeyReusedError: (422, "idempotency_key_reused"),
    e.StorageFullError: (507, "storage_full"),
    e.TooManyOpenFilesError: (503, "too_many_open_files"),
    e.OpenFilesLimitError: (507, "open_files_limit"),
    e.TopicDeletedError: (404, "topic_not_found"),  # what a new request would get
    e.LogClosedError: (503, "unavailable"),
    e.ShardUnavailableError: (503, "unavailable"),
    e.CompactionFailedError: (500, "compaction_failed"),
    # the server's own stored bytes are bad (not a bad gateway): 500, like storage_error
    e.CorruptDataError: (500, "corrupt_data"),
    e.PartitionOfflineError: (503, "partition_offline"),
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


# One realistic detail (and the members the code adds) per code, for the OpenAPI document's
# examples (api/__init__.py): what a client sees, not a body generated from the schema
PROBLEM_EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "validation_error": (
        "body.records.0.partition: Input should be a valid integer",
        {
            "errors": [
                {
                    "loc": ["body", "records", 0, "partition"],
                    "msg": "Input should be a valid integer",
                    "type": "int_type",
                }
            ],
        },
    ),
    "invalid_json": ("the body is not JSON: unexpected character: line 1 column 2 (char 1)", {}),
    "invalid_topic_name": ("invalid topic name 'orders/2024': only a-z A-Z 0-9 . _ - allowed", {}),
    "invalid_config": ("retention.ms: -5 is below -1", {}),
    "invalid_partitions": ("topic 'orders' has 3 partitions; the count can only grow", {}),
    "invalid_request": ("invalid group id '': 1..249 printable characters", {}),
    "topic_exists": ("topic 'orders' already exists", {}),
    "queue_exists": ("queue 'work' of topic 'jobs' exists with other settings", {}),
    "topic_not_found": ("topic 'orders' does not exist", {}),
    "partition_not_found": ("topic 'orders' has no partition 7", {}),
    "queue_not_found": ("topic 'jobs' has no queue 'work'", {}),
    "snapshot_not_found": ("no snapshot '20260101T000000Z-1'", {}),
    "not_found": ("no such resource", {}),
    "offset_out_of_range": (
        "offset 120 is outside [0, 42]",
        {"log_start_offset": 0, "high_watermark": 42},
    ),
    "record_too_large": (
        "a batch of 1,200,000 bytes; the topic's max.message.bytes is 1,048,588",
        {},
    ),
    "request_too_large": ("the body is over 67,108,864 bytes", {"limit": 67108864}),
    "request_timeout": (
        "no request body, or no answer, within EVENTLOG_REQUEST_TIMEOUT_MS",
        {"limit_ms": 30000},
    ),
    "quota_exceeded": (
        "'reader' is over its fetch quota of 1,048,576 bytes/s",
        {
            "kind": "fetch",
            "quota_bytes_per_sec": 1048576,
            "throttle_time_ms": 1200,
        },
    ),
    "corrupt_batch": ("batch at byte 0: CRC mismatch", {}),
    "transactions_unsupported": (
        "a transactional batch: eventlog has no transaction coordinator",
        {},
    ),
    "unsupported_media_type": ("Content-Type text/plain: send application/json", {}),
    "not_utf8": ("the value of offset 3 is not UTF-8: ask for format base64", {}),
    "not_json": ("the value of offset 3 is not JSON: ask for format base64", {}),
    "unauthorized": ("no bearer token: send Authorization: Bearer <token>", {}),
    "forbidden": ("'reader' has no access to topic 'orders'", {}),
    "unavailable": ("the server is shutting down", {}),
    "not_ready": ("recovery is still running", {}),
    "offset_mismatch": (
        "the partition's next offset is 42, not 40",
        {"expected_offset": 40, "high_watermark": 42},
    ),
    "key_version_mismatch": (
        "the key's latest record is at offset 17, not 12",
        {
            "expected_offset": 12,
            "current_offset": 17,
        },
    ),
    "key_index_disabled": ("topic 'orders' has eventlog.key.index=false", {}),
    "key_required": ("a record without a key: this route appends to one key", {}),
    "out_of_order_sequence": (
        "producer 4001 epoch 0: sequence 7 after 4",
        {
            "producer_id": 4001,
            "producer_epoch": 0,
            "sequence": 7,
            "last_sequence": 4,
        },
    ),
    "producer_fenced": (
        "producer 4001: epoch 0 is older than 1",
        {
            "producer_id": 4001,
            "producer_epoch": 0,
            "current_epoch": 1,
        },
    ),
    "idempotency_key_reused": ("Idempotency-Key 'order-17' was used with another request", {}),
    "group_not_empty": (
        "group 'billing' has 2 live member(s) (state Stable): offsets can be reset only "
        "while the group is inactive; stop its consumers first",
        {"members": 2, "group_state": "Stable"},
    ),
    "storage_full": ("the disk is full: nothing was written; retry later", {}),
    "open_files_limit": ("3 more partitions would pass what the open-files limit serves", {}),
    "too_many_open_files": ("out of file descriptors: the append was undone; retry", {}),
    "snapshot_limit": ("32 snapshots are held: delete one first", {"limit": "count"}),
    "storage_error": ("orders-0/00000000000000000000.log: Input/output error", {}),
    "corrupt_data": (
        "orders-0: the batch at offsets 40..44 fails its CRC-32C",
        {
            "first_offset": 40,
            "last_offset": 44,
        },
    ),
    "partition_offline": (
        "orders-1 could not be loaded at start-up",
        {
            "topic": "orders",
            "partition": 1,
            "reason": "Permission denied",
        },
    ),
    "compaction_failed": ("orders-0: compaction failed: Input/output error", {}),
    "internal_error": ("an unexpected error: see the server's log", {}),
    "method_not_allowed": ("GET, HEAD, POST only", {}),
}
# the code an answer of this status most often has, where a description names none
STATUS_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "topic_exists",
    412: "key_version_mismatch",
    413: "request_too_large",
    415: "unsupported_media_type",
    416: "offset_out_of_range",
    422: "validation_error",
    429: "quota_exceeded",
    500: "storage_error",
    503: "unavailable",
    507: "storage_full",
}


def problem_example(status: int, code: str) -> dict[str, Any]:
    """The body a `code` answer at `status` has, as problem() writes it, with a real detail."""
    detail, extra = PROBLEM_EXAMPLES[code]
    return {
        "type": f"urn:eventlog:problem:{code}",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    }


class ServerPaths:
    """The server's directories, to show a path relative to the data dir and to take absolute
    paths out of error details. Directories outside the data dir show as `<snapshot dir>` and
    `<log dir>` (the last for each of several log dirs alike)."""

    def __init__(self, data_dir: Path, snapshot_root: Path, log_dirs: tuple[Path, ...] = ()) -> None:
        self.data_dir = data_dir.resolve()
        self.snapshot_root = snapshot_root.resolve()
        labels: dict[str, str] = {}  # absolute form -> what answers say instead ("": the data dir)
        for directory, label in [(d, "<log dir>") for d in log_dirs] + [(snapshot_root, "<snapshot dir>"), (data_dir, "")]:
            resolved = directory.resolve()
            if resolved.is_relative_to(self.data_dir):
                label = str(resolved.relative_to(self.data_dir)).removeprefix(".")
            for form in {os.path.abspath(directory), str(resolved)}:
                labels[form] = label
        bases = sorted(labels, key=len, reverse=True)  # longest first
        self._labels = labels
        self._pattern = re.compile(
            r"(?<![\w.\-/])(" + "|".join(re.escape(b) for b in bases) + r")(/|(?![\w.\-]))"
        ) if bases else None

    @classmethod
    def of(cls, request: Request) -> ServerPaths | None:
        """The app's (cached on app.state), or None for an app without settings."""
        return cls.for_state(request.app.state)

    @classmethod
    def for_state(cls, state: Any) -> ServerPaths | None:
        """ServerPaths.of an app by its state."""
        cached = getattr(state, "server_paths", None)
        if cached is None:
            settings = getattr(state, "settings", None)
            if settings is None:
                return None
            cached = state.server_paths = cls(settings.data_dir, settings.snapshot_root, settings.effective_log_dirs)
        return cached

    def snapshot(self, snapshot_id: str) -> str:
        """A snapshot's directory: from the snapshot root (`<id>`), or from the data dir when
        the root is inside it (`snapshots/<id>`, as older versions kept it)."""
        if self.snapshot_root.is_relative_to(self.data_dir):
            return str((self.snapshot_root / snapshot_id).relative_to(self.data_dir))
        return snapshot_id

    def scrub(self, text: str) -> str:
        """`text` with the server's directories made relative (the data dir) or named."""
        if self._pattern is None:
            return text

        def replace(match: re.Match[str]) -> str:
            label = self._labels[match.group(1)]
            if match.group(2) == "/":
                return f"{label}/" if label else ""
            return label or "<data dir>"

        return self._pattern.sub(replace, text)


def engine_problem(exc: e.EngineError, paths: ServerPaths | None = None) -> Response:
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
    elif isinstance(exc, e.KeyVersionMismatchError):
        extra = {"expected_offset": exc.expected, "current_offset": exc.current}
    elif isinstance(exc, e.OutOfOrderSequenceError):
        extra = {"producer_id": exc.producer_id, "producer_epoch": exc.epoch, "sequence": exc.first_seq}
        if exc.last_seq is not None:
            extra["last_sequence"] = exc.last_seq
    elif isinstance(exc, e.ProducerFencedError):
        extra = {"producer_id": exc.producer_id, "producer_epoch": exc.epoch, "current_epoch": exc.current_epoch}
    elif isinstance(exc, e.SnapshotLimitError):
        extra = {
            "limit": exc.limit, "max_count": exc.max_count, "max_bytes": exc.max_bytes,
            "snapshots": exc.count, "snapshot_bytes": exc.held_bytes, "needed_bytes": exc.needed_bytes,
        }
    elif isinstance(exc, e.CorruptDataError):
        extra = {"first_offset": exc.first_offset, "last_offset": exc.last_offset}
    elif isinstance(exc, e.PartitionOfflineError):
        extra = {"topic": exc.topic, "partition": exc.partition, "reason": exc.reason}
    elif isinstance(exc, e.OpenFilesLimitError):
        extra = {"partitions": exc.partitions, "max_partitions": exc.max_partitions, "open_files_limit": exc.limit}
    # both pass: a shard restarting is back in seconds (its supervisor starts it at once)
    headers = {"Retry-After": "1"} if isinstance(exc, (e.TooManyOpenFilesError, e.ShardUnavailableError)) else None
    if status == 507 or isinstance(exc, e.ShardUnavailableError):
        # a full disk refuses every append until space returns (the engine logs each undone
        # commit once); a shard down or silent refuses every request that needs it until it is
        # back (the supervisor logs the death, the silence and the return): one line per
        # refused request would flood the log
        logger.debug("%s: %s", code, exc)
    elif status >= 500 and not isinstance(exc, (e.PartitionOfflineError, e.CorruptDataError)):
        # (an offline partition was logged once, at start-up, a corrupt batch by the read that
        # met it; a second line per request would add nothing)
        logger.error("%s: %s", code, exc)
    detail = str(exc) if paths is None else paths.scrub(str(exc))
    return problem(status, code, detail, headers=headers, **extra)


async def _engine_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, e.EngineError)
    return engine_problem(exc, ServerPaths.of(request))


async def _api_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return problem(exc.status, exc.code, exc.detail, headers=exc.headers, **exc.extra)


async def _validation_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return validation_problem(exc)


def validation_problem(exc: RequestValidationError) -> Response:
    invalid_json = next((err for err in exc.errors() if err.get("type") == "json_invalid"), None)
    if invalid_json is not None:  # a body that is not JSON: as produce answers it
        reason = (invalid_json.get("ctx") or {}).get("error") or invalid_json.get("msg", "invalid JSON")
        return problem(400, "invalid_json", f"request body is not valid JSON: {reason}")
    errors: list[dict[str, Any]] = [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors()
    ]
    first: dict[str, Any] = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    return problem(422, "validation_error", f"{where}: {first['msg']}" if where else first["msg"], errors=errors)


async def _http_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return http_problem(exc, _request.app, _request.scope)


def http_problem(exc: StarletteHTTPException, app: Any, scope: Scope) -> Response:
    codes = {
        400: "invalid_json",  # FastAPI: a JSON body it cannot decode (a BOM, then bytes that are not UTF-8)
        404: "not_found", 405: "method_not_allowed", 406: "not_acceptable", 413: "request_too_large", 415: "unsupported_media_type",
    }
    code = codes.get(exc.status_code, HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_"))
    response = problem(exc.status_code, code, str(exc.detail))
    if exc.headers:
        response.headers.update(exc.headers)
    if exc.status_code == 405 and app is not None:
        # every method some route of this path takes (Starlette names only the first route's)
        response.headers["Allow"] = ", ".join(allowed_methods(app, scope))
    return response


def problem_for(exc: Exception, state: Any, scope: Scope) -> Response:
    """The one mapping, for code that answers an exception itself (api/policy.py): what the
    exception handlers below answer; anything unexpected is logged and answers 500."""
    if isinstance(exc, ApiError):
        return problem(exc.status, exc.code, exc.detail, headers=exc.headers, **exc.extra)
    if isinstance(exc, e.EngineError):
        return engine_problem(exc, ServerPaths.for_state(state))
    if isinstance(exc, RequestValidationError):
        return validation_problem(exc)
    if isinstance(exc, StarletteHTTPException):
        return http_problem(exc, scope.get("app"), scope)
    logger.error("%s %s failed", scope.get("method"), scope.get("path"), exc_info=exc)
    return problem(500, "internal_error", "internal error")


def allowed_methods(app: Any, scope: Scope) -> list[str]:
    """The methods the routes matching scope's path take, HEAD wherever GET (app/main.py)."""
    from starlette.routing import Match

    methods: set[str] = set()
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        probe = {**scope, "method": method, "eventlog.allow_probe": True}
        if any(route.matches(probe)[0] == Match.FULL for route in app.router.routes):
            methods.add(method)
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


async def _unexpected_handler(_request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware calls this, then re-raises, so the traceback is logged too
    return problem(500, "internal_error", "internal error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(e.EngineError, _engine_handler)
    app.add_exception_handler(ApiError, _api_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(Exception, _unexpected_handler)
