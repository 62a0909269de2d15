"""The hot lane: produce requests and event streams served in one pass, ahead of FastAPI's
middleware stack.

A one-record produce spent most of its event-loop time in layers, not in the append: eight
ASGI middlewares (uvicorn's proxy headers, Starlette's server-error and exception middlewares,
FastAPI's telemetry and body limit, ours for observability, limits and quotas), each wrapping
receive and send in a closure, then Starlette's router (docs/PERFORMANCE.md, issue 13). The
lane takes the two produce routes before any of that and does, in one function and in the same
order, what the stack does for them:

    1. a declared Content-Length that is not a number (400) or above max_request_bytes (413);
    2. with an auth file, the bearer token (401);
    3. the principal's produce quota, when it has one (429 before the body is read);
    4. the engine open (503 while starting or stopping), the principal's right to write the
       topic (403), the partition known (404: before the body is read);
    5. the body, within request_timeout_ms of the request's start (408) and max_request_bytes
       as it arrives (413), both closing the connection; its bytes count against the quota;
    6. the produce itself (api/records.py, engine/produce.py), its answer or its problem+json
       (the same mapping as the exception handlers: api/errors.py);
    7. eventlog_http_requests_total and _request_duration_seconds by route template, the
       in-flight gauge, the access line (buffered: observability.AccessLog).

An event stream (GET .../records/stream) goes the same way: 1, 2, the fetch quota (429 before
it starts; while it runs each chunk waits out the throttle), 4 with the right to read, then one
coroutine per subscriber that waits on the partition's data event and sends the chunk every
subscriber at that position shares (api/tail.py), and a second, idle until the client leaves,
that ends it. Without the stack, a subscriber is its connection, those two and its place in
the partition's waiters: no task group, no six layers of send wrappers per event.

A request the lane does not take whole goes on to the stack, where the documented routes
answer it as before (their OpenAPI document is unchanged): another method, a partition that is
not plain decimal digits (FastAPI's 422), a path that is not one of the two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from starlette.datastructures import QueryParams
from starlette.types import Receive, Scope, Send

from engine.errors import EngineError, LogClosedError, OffsetOutOfRangeError, StorageError

from .auth import ANONYMOUS_ADMIN, Authenticator, Principal, check_access
from .errors import ApiError, ServerPaths, engine_problem, problem
from .keys import key_answer, path_key
from .limits import RequestRefused
from .observability import AccessLog, Metrics
from .quotas import FETCH, PRODUCE, QuotaManager, over_quota
from .records import (
    PREALLOCATE_BYTES,
    REPLAYED_HEADER,
    SSE_KEEPALIVE_S,
    _offsets_body,
    _plain_int,
    check_json_body,
    error_event,
    produce_service,
    produce_to_partition_body,
    stream_start,
)
from .responses import PartsResponse
from .schemas import Format
from .tail import FANOUT, TAILS, TRANSPORT_SCOPE_KEY, Parked

logger = logging.getLogger("eventlog.api")

TOPIC_ROUTE = "/v1/topics/{topic}/records"
PARTITION_ROUTE = "/v1/topics/{topic}/partitions/{partition}/records"
STREAM_ROUTE = PARTITION_ROUTE + "/stream"
KEY_ROUTE = "/v1/topics/{topic}/keys/{key:path}/records"  # the template FastAPI's route has
_STREAM_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"),
]
_FORMATS = frozenset(f.value for f in Format)
_PREFIX = "/v1/topics/"
_JSON_HEADERS = [(b"content-type", b"application/json")]
_REPLAYED = (REPLAYED_HEADER.lower().encode(), b"true")


class _Disconnected(Exception):
    """The client went away before its body arrived."""


class HotLane:
    """Serves the produce routes of `app` (a FastAPI app built by app.main.create_app)."""

    def __init__(
        self, app: Any, *, metrics: Metrics, authenticator: Authenticator | None, quotas: QuotaManager,
        access_log: AccessLog, max_request_bytes: int, request_timeout_ms: int, max_inflated_bytes: int,
    ) -> None:
        self.state = app.state
        self.metrics = metrics
        self.authenticator = authenticator
        self.quotas = quotas
        self.access_log = access_log
        self.max_request_bytes = max_request_bytes
        self.timeout_ms = request_timeout_ms
        self.max_inflated_bytes = max_inflated_bytes
        self._counters: dict[tuple[str, int], Any] = {}
        self._latency = {
            route: metrics.latency.labels(route, "POST") for route in (TOPIC_ROUTE, PARTITION_ROUTE, KEY_ROUTE)
        }
        self._stream_latency = metrics.latency.labels(STREAM_ROUTE, "GET")

    def match(self, scope: Scope) -> tuple[Any, tuple[Any, ...]] | None:
        """(handler, its arguments) for a request the lane takes; None for the stack."""
        method = scope["method"]
        path: str = scope["path"]
        if not path.startswith(_PREFIX) or method not in ("POST", "GET"):
            return None
        parts = path[len(_PREFIX):].split("/")
        n = len(parts)
        if method == "POST":
            if n == 2:
                if parts[1] == "records" and parts[0]:
                    return self.serve, (parts[0], None)
            elif n >= 4 and parts[1] == "keys" and parts[-1] == "records" and parts[0]:
                key_format = _key_format(scope.get("query_string", b""))
                if key_format is not None:
                    return self.serve, (parts[0], None, "/".join(parts[2:-1]), key_format)
            elif n == 4 and parts[1] == "partitions" and parts[3] == "records" and parts[0]:
                partition = _plain_int(parts[2], 0, None)
                if partition is not None:
                    return self.serve, (parts[0], partition)
        elif n == 5 and parts[4] == "stream" and parts[3] == "records" and parts[1] == "partitions" and parts[0]:
            partition = _plain_int(parts[2], 0, None)
            if partition is not None:
                return self._stream_args(scope, parts[0], partition)
        return None

    def _stream_args(self, scope: Scope, topic: str, partition: int) -> tuple[Any, tuple[Any, ...]] | None:
        """The stream's parameters, when each reads as FastAPI would read it unconverted (see
        records._FastRoute); None leaves the request to the documented route."""
        offset = None
        kf = vf = "string"
        query = scope.get("query_string", b"")
        if query:
            given = QueryParams(query)
            text = given.get("offset")
            if text is not None:
                offset = _plain_int(text, 0, None)
                if offset is None:
                    return None
            kf = given.get("key_format", kf)
            vf = given.get("value_format", vf)
            if kf not in _FORMATS or vf not in _FORMATS:
                return None
        last_event_id = None
        for name, value in scope["headers"]:
            if name == b"last-event-id":
                text = value.decode("latin-1")
                last_event_id = -1 if text == "-1" else _plain_int(text, 0, None)
                if last_event_id is None:
                    return None
                break
        return self.stream, (topic, partition, offset, kf, vf, last_event_id)

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, topic: str, partition: int | None,
        key_text: str | None = None, key_format: str = "string",
    ) -> None:
        started = time.perf_counter()
        metrics = self.metrics
        metrics.in_flight += 1
        route = KEY_ROUTE if key_text is not None else TOPIC_ROUTE if partition is None else PARTITION_ROUTE
        principal = ANONYMOUS_ADMIN
        quota_on = False
        received = [0]  # body bytes taken so far (_body counts them), for the quota
        status = 500
        sent = 0
        try:
            length = content_type = authorization = idempotency_key = if_match = if_none_match = None
            for name, value in scope["headers"]:
                if name == b"content-length":
                    length = length or value
                elif name == b"content-type":
                    content_type = content_type or value
                elif name == b"authorization":
                    authorization = authorization or value
                elif name == b"idempotency-key":
                    idempotency_key = idempotency_key or value
                elif name == b"if-match":
                    if_match = if_match or value
                elif name == b"if-none-match":
                    if_none_match = if_none_match or value
            declared = self._declared(length)
            principal = self._authenticate(authorization)
            quota_on = self._within_quota(principal, PRODUCE)
            engine = self._engine()
            check_access(principal, "write", topic)
            service = produce_service(engine)
            if key_text is not None:  # a per-key append (api/keys.py, append_key_records)
                status, sent = await self._append_key(
                    scope, receive, send, service, topic, key_text, key_format, declared, started, received, content_type,
                    principal.name, idempotency_key, if_match, if_none_match,
                )
                return
            if partition is not None:
                service.partition(topic, partition)  # before reading the body
            if partition is None:
                check_json_body(content_type.decode("latin-1") if content_type is not None else None)
            body = await self._body(receive, declared, started, received)
            key = idempotency_key.decode("latin-1") if idempotency_key is not None else None
            if partition is None:
                parts, replayed = await service.produce_json(
                    topic, body, principal=principal.name, idempotency_key=key, answer=_offsets_body,
                )
                response = PartsResponse(parts, media_type="application/json", headers={REPLAYED_HEADER: "true"} if replayed else None)
                status = 200
                sent = int(response.headers["content-length"])
                await response(scope, receive, send)
                return
            payload, replayed = await produce_to_partition_body(
                service, topic, partition, content_type.decode("latin-1") if content_type is not None else "application/json",
                body, principal.name, key, if_match.decode("latin-1") if if_match is not None else None,
                self.max_inflated_bytes,
            )
            answer = orjson.dumps(payload)
            # the offset a follow-up conditional append expects (If-Match)
            headers = [*_JSON_HEADERS, (b"content-length", b"%d" % len(answer)), (b"etag", b'"%d"' % (payload["last_offset"] + 1))]
            if replayed:
                headers.append(_REPLAYED)
            status = 200
            sent = len(answer)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": answer})
        except _Disconnected:
            status = 499  # nginx's "client closed request": nothing was answered, or written
        except Exception as exc:
            response = self._problem(exc, scope)
            status = response.status_code
            sent = len(response.body)
            await response(scope, receive, send)
        finally:
            metrics.in_flight -= 1
            elapsed = time.perf_counter() - started
            if quota_on and received[0]:
                self.quotas.record(principal, PRODUCE, received[0])
            counter = self._counters.get((route, status))
            if counter is None:
                counter = self._counters[(route, status)] = metrics.requests.labels(route, "POST", str(status))
            counter.inc()
            self._latency[route].observe(elapsed)
            self.access_log.add(
                "POST", scope["path"], scope.get("query_string", b""), route, status, elapsed, sent,
                scope.get("client"), principal.name,
            )

    async def _append_key(
        self, scope: Scope, receive: Receive, send: Send, service: Any, topic: str, key_text: str, key_format: str,
        declared: int, started: float, received: list[int], content_type: bytes | None, principal: str,
        idempotency_key: bytes | None, if_match: bytes | None, if_none_match: bytes | None,
    ) -> tuple[int, int]:
        """What keys.append_key_records does, in the same order; (status, bytes sent)."""
        data = path_key(key_text, key_format)
        check_json_body(content_type.decode("latin-1") if content_type is not None else None)
        service.partition(topic, 0)  # the topic exists, and is not internal, before the body is read
        body = await self._body(receive, declared, started, received)
        done = await service.produce_key(
            topic, data, body, principal=principal,
            idempotency_key=idempotency_key.decode("latin-1") if idempotency_key is not None else None,
            if_match=if_match.decode("latin-1") if if_match is not None else None,
            if_none_match=if_none_match.decode("latin-1") if if_none_match is not None else None,
        )
        answer = key_answer(done)
        headers = [*_JSON_HEADERS, (b"content-length", b"%d" % len(answer)), (b"etag", b'"%d"' % done.offsets[-1])]
        if done.replayed:
            headers.append(_REPLAYED)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
        return 200, len(answer)

    # -- the checks before a body is read (in this order) ---------------------------------------

    def _declared(self, length: bytes | None) -> int:
        """The declared body size (0 when none): 400 if not a number, 413 above the limit."""
        if length is None:
            return 0
        try:
            declared = int(length)
        except ValueError:
            raise ApiError(400, "invalid_request", "Content-Length is not a number") from None
        limit = self.max_request_bytes
        if declared > limit:
            raise ApiError(
                413, "request_too_large", f"request body of {declared} bytes exceeds the limit of {limit}",
                headers={"Connection": "close"}, limit=limit,
            )
        return declared

    def _authenticate(self, authorization: bytes | None) -> Principal:
        if self.authenticator is None:
            return ANONYMOUS_ADMIN
        return self.authenticator.authenticate(authorization.decode("latin-1") if authorization else None)

    def _within_quota(self, principal: Principal, kind: str) -> bool:
        """Whether `principal` has a `kind` quota (its bytes then count); 429 while over it."""
        quotas = self.quotas
        if quotas.quota(principal, kind) is None:
            return False
        throttle = quotas.throttle_ms(principal, kind)
        if throttle > 0:
            self.metrics.throttled.labels(kind).inc()
            raise over_quota(quotas, principal, kind, throttle)
        return True

    def _engine(self) -> Any:
        state = self.state
        engine = state.engine
        if engine is None or state.shutting_down:
            raise LogClosedError("engine")
        return engine

    async def _body(self, receive: Receive, declared: int, started: float, received: list[int]) -> bytearray:
        """The body straight into one writable buffer (see records._read_body), within the
        request's time and size limits; received[0] follows the bytes taken."""
        limit = self.max_request_bytes
        buf = bytearray(declared) if declared <= PREALLOCATE_BYTES else bytearray()
        filled = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_ms / 1000 - (time.perf_counter() - started)
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        raise _Disconnected
                    chunk = message.get("body", b"")
                    n = len(chunk)
                    if n:
                        if filled + n > limit:
                            raise RequestRefused(
                                413, "request_too_large", f"request body exceeds the limit of {limit} bytes",
                                headers={"Connection": "close"}, limit=limit,
                            )
                        if filled + n <= len(buf):
                            buf[filled : filled + n] = chunk
                        else:
                            del buf[filled:]
                            buf += chunk
                        filled += n
                        received[0] = filled
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise RequestRefused(
                408, "request_timeout", f"the request body did not arrive within {self.timeout_ms} ms",
                headers={"Connection": "close"}, limit_ms=self.timeout_ms,
            ) from None
        if filled < len(buf):
            del buf[filled:]
        return buf

    async def stream(
        self, scope: Scope, receive: Receive, send: Send, topic: str, partition: int, offset: int | None, kf: str, vf: str,
        last_event_id: int | None,
    ) -> None:
        started = time.perf_counter()
        metrics = self.metrics
        metrics.in_flight += 1
        principal = ANONYMOUS_ADMIN
        status = 500
        sent = 0
        try:
            try:
                length = authorization = None
                for name, value in scope["headers"]:
                    if name == b"content-length":
                        length = length or value
                    elif name == b"authorization":
                        authorization = authorization or value
                self._declared(length)
                principal = self._authenticate(authorization)
                quota_on = self._within_quota(principal, FETCH)
                engine = self._engine()
                check_access(principal, "read", topic)
                log = engine.partition(topic, partition)
                offset = stream_start(log, offset, last_event_id)
            except Exception as exc:
                response = self._problem(exc, scope)
                status = response.status_code
                sent = len(response.body)
                await response(scope, receive, send)
                return
            status = 200
            await send({"type": "http.response.start", "status": 200, "headers": _STREAM_HEADERS})
            sent = await self._events(
                scope, receive, send, engine, log, topic, partition, offset, kf, vf, principal if quota_on else None,
            )
        finally:
            metrics.in_flight -= 1
            elapsed = time.perf_counter() - started
            counter = self._counters.get((STREAM_ROUTE, status))
            if counter is None:
                counter = self._counters[(STREAM_ROUTE, status)] = metrics.requests.labels(STREAM_ROUTE, "GET", str(status))
            counter.inc()
            self._stream_latency.observe(elapsed)
            self.access_log.add(
                "GET", scope["path"], scope.get("query_string", b""), STREAM_ROUTE, status, elapsed, sent,
                scope.get("client"), principal.name,
            )

    async def _events(
        self, scope: Scope, receive: Receive, send: Send, engine: Any, log: Any, topic: str, partition: int, position: int,
        kf: str, vf: str, throttled: Any,
    ) -> int:
        """The stream's body until the client leaves, the log closes or shutdown begins; the
        bytes sent."""
        task = asyncio.current_task()
        assert task is not None
        left = asyncio.ensure_future(_until_gone(receive))

        def end(_left: asyncio.Future[None]) -> None:
            task.cancel()

        left.add_done_callback(end)
        fetched = self.metrics.fetched_records.labels(topic)
        sent = 0
        loop = asyncio.get_running_loop()

        async def body(data: bytes) -> None:
            nonlocal sent, last_sent
            if throttled is not None:  # an open stream is slowed, not refused
                throttle = self.quotas.throttle_ms(throttled, FETCH)
                if throttle > 0:
                    self.metrics.throttled.labels(FETCH).inc()
                    await asyncio.sleep(throttle / 1000)
                self.quotas.record(throttled, FETCH, len(data))
            await send({"type": "http.response.body", "body": data, "more_body": True})
            sent += len(data)
            last_sent = loop.time()

        last_sent = loop.time()
        # caught up, a plain HTTP/1.1 stream is parked with the pusher (api/tail.py), which
        # writes each chunk to its transport; it comes back here to wait for a slow client,
        # report an error or end
        transport = scope.get(TRANSPORT_SCOPE_KEY) if throttled is None and scope.get("http_version") == "1.1" else None
        may_park = transport is not None
        try:
            await body(b": streaming " + f"{topic}/{partition} from offset {position}".encode() + b"\n\n")
            while True:
                try:
                    if engine.stopping or log.waiting_stopped:
                        raise LogClosedError(log.name)
                    if may_park and position >= log.high_watermark:
                        parked = Parked(transport, position, last_sent)
                        try:
                            await FANOUT.park(log, kf, vf, parked, fetched, SSE_KEEPALIVE_S, lambda: engine.stopping)
                        finally:
                            sent += parked.sent
                        position, last_sent = parked.position, parked.last_sent
                        may_park = False  # once through the wait below first: no spin on a closing log
                        continue
                    if not await TAILS.wait(log, position):
                        if loop.time() - last_sent >= SSE_KEEPALIVE_S:
                            await body(b": keepalive\n\n")
                        continue
                    chunk = await TAILS.chunk(log, position, kf, vf)
                except (ApiError, OffsetOutOfRangeError, StorageError, LogClosedError) as exc:
                    # retention passed us, bytes the format cannot show, a failed read, the
                    # topic deleted, shutdown: say why, then end the stream
                    await body(error_event(exc, position, ServerPaths.for_state(self.state)))
                    break
                fetched.inc(chunk.records)
                position = chunk.next_offset
                if chunk.events:
                    await body(chunk.events)
                may_park = transport is not None
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not left.done() or left.cancelled():
                raise  # not the client leaving: shutdown, or whoever cancelled us
            task.uncancel()  # the client left: the stream is over
        finally:
            if not left.done():
                left.remove_done_callback(end)
                left.cancel()
        return sent

    def _problem(self, exc: Exception, scope: Scope) -> Any:
        if isinstance(exc, ApiError):
            return problem(exc.status, exc.code, exc.detail, headers=exc.headers, **exc.extra)
        if isinstance(exc, EngineError):
            return engine_problem(exc, ServerPaths.for_state(self.state))
        logger.exception("%s %s failed", scope["method"], scope["path"])
        return problem(500, "internal_error", "internal error")


async def _until_gone(receive: Receive) -> None:
    """Returns when the client has gone away (uvicorn answers receive() with http.disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _key_format(query: bytes) -> str | None:
    """The key_format of a per-key append's query when it is all the query holds and names a
    format as FastAPI would read it (else None: the documented route answers)."""
    if not query:
        return "string"
    given = QueryParams(query)
    if set(given.keys()) != {"key_format"} or len(given.getlist("key_format")) != 1:
        return None
    value = given["key_format"]
    return value if value in _FORMATS else None
