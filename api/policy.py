"""One request pipeline: the policy every route applies, wrapped around its handler once, when the
app is assembled (app.main.create_app), as Redpanda's HTTP proxy wraps each handler
(pandaproxy/server.cc, handler_adaptor).

A request passes these steps, in this order, whichever way it came in (a documented FastAPI
route, a fast route, the hot lane's produce and stream handlers, api/lane.py; the event streams
through api/sse.py):

    admit     1. a declared Content-Length that is not a number (400) or above
                 max_request_bytes (413, the connection closing);
              2. with an auth file, the bearer token (401), unless the route is public (the
                 health check, the documents' and the console's pages and assets);
              3. the principal's produce or fetch quota, for the routes under one (429 with
                 Retry-After, before the body is read);
              4. the engine open, for the routes that use it (503 while starting or stopping);
              5. the route's declared right on the path's topic (and group, and a ?topic=
                 filter) (403).
    body      the body within request_timeout_ms of the request's start (408) and
              max_request_bytes as it arrives (413), both closing the connection; a produce's
              bytes count against its quota (account).
    answer    a GET but an event stream must start its answer within request_timeout_ms (a
              long-poll fetch: plus its max_wait_ms): 503 `request_timeout` otherwise. Writes are
              not cut off once their body is in (a half-done append must not look refused).
    account   produce: the body's bytes; fetch: the answer's bytes (an event stream's chunks
              wait out the throttle first, api/sse.py).
    observe   eventlog_http_requests_total and _request_duration_seconds by route template
              (`unmatched` for no route), method and status; the in-flight gauge; the access line
              (buffered: observability.AccessLog).
    map       any exception before the answer started, as problem+json (api/errors.problem_for,
              the exception handlers' mapping).

What each route needs is read from it once, at registration (Rule): its quota kind by method
and template (quotas.request_kind), its right (the auth.require dependency it declares), whether
it uses the engine (api.deps.get_engine), whether it is public or an event stream. The hot lane
builds its Rules by hand and calls the same steps; it differs from the routes only in how it
parses the request. A request no route takes goes through the policy too (the router's default,
rule `unmatched`): a token is still needed for it (401 before 404).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import anyio
from fastapi.routing import APIRoute, _IncludedRouter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.errors import LogClosedError
from engine.interface import Engine

from .auth import ANONYMOUS_ADMIN, Authenticator, Principal, check_access
from .errors import ApiError, problem_for
from .observability import AccessLog, Metrics
from .quotas import FETCH, PRODUCE, QuotaManager, over_quota, request_kind
from .responses import ZEROCOPY

logger = logging.getLogger("eventlog.api")

UNMATCHED = "unmatched"
STREAM_SUFFIX = "/records/stream"
MAX_WAIT_PARAM = "max_wait_ms"
MAX_WAIT_LIMIT_MS = 300_000  # fetch's own bound on max_wait_ms
PREALLOCATE_BYTES = 1024 * 1024  # records.PREALLOCATE_BYTES (a body up to it is allocated at once)
# scope["state"]: the principal whose fetch quota an event stream counts against (api/sse.py)
THROTTLED_KEY = "eventlog.throttled"
# scope: [bytes] an event stream wrote past the ASGI send (parked with the pusher, api/tail.py)
SENT_KEY = "eventlog.stream_sent"


class RequestRefused(ApiError, StarletteHTTPException):
    """Raised from inside receive() for a body the server will not take (too large, too slow).

    Also a Starlette HTTPException because FastAPI turns any other exception met while it reads
    a body into its own 400; an HTTPException it re-raises as it is. The ApiError handler comes
    first in the MRO, so the answer is the usual problem+json."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: object,
    ) -> None:
        ApiError.__init__(self, status, code, detail, headers=headers, **extra)
        self.status_code = status


class Disconnected(Exception):
    """The client went away before its body arrived."""


@dataclass(frozen=True)
class Rule:
    """What the policy does for one route (Policy.rule reads it off a route)."""

    route: str  # the template metrics and the access log name
    methods: frozenset[str] = frozenset()  # the methods the route serves (empty: any)
    kinds: dict[str, str] = field(default_factory=dict)  # method -> PRODUCE or FETCH
    right: str | None = None  # the action the principal must be allowed (auth.ROLES)
    engine: bool = False  # the route needs the engine open
    public: bool | None = False  # no token needed; None: decided by the request's path
    stream: bool = False  # an event stream: no answer deadline, throttled chunk by chunk


def public_path(path: str) -> bool:
    """Paths open even with an auth file: the health check, the documents' and the console's
    pages and assets (api/docs.py, api/console.py; they hold no data: the OpenAPI document and
    everything the console shows need a token)."""
    from . import console, docs  # (their routers are PolicyRoutes)

    return (
        path == "/healthz"
        or path in docs.PUBLIC_PATHS
        or path.startswith(docs.ASSETS_PREFIX + "/")
        or path in console.PUBLIC_PATHS
        or path.startswith(console.ASSETS_PREFIX + "/")
    )


class Policy:
    """The steps above, with what they need (built once per app, from the settings)."""

    def __init__(
        self,
        state: Any,
        *,
        metrics: Metrics,
        authenticator: Authenticator | None,
        quotas: QuotaManager,
        access_log: AccessLog,
        max_request_bytes: int,
        request_timeout_ms: int,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.authenticator = authenticator
        self.quotas = quotas
        self.access_log = access_log
        self.max_request_bytes = max_request_bytes
        self.timeout_ms = request_timeout_ms
        self.timeout_s = request_timeout_ms / 1000
        self._counters: dict[tuple[str, str, int], Any] = {}
        self._latency: dict[tuple[str, str], Any] = {}

    # -- registration ------------------------------------------------------------------------------

    def apply(self, app: Any) -> None:
        """Wrap every route of `app` (and the router's answer for no route) in the policy."""
        for route in app.router.routes:
            self.wrap_route(route)
        default = app.router.default
        unmatched = Rule(UNMATCHED, public=None)

        async def answer_unmatched(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await default(scope, receive, send)
                return
            await self.serve(unmatched, default, scope, receive, send)

        app.router.default = answer_unmatched

    def wrap_route(self, route: BaseRoute, rule: Rule | None = None) -> None:
        """Replace `route`'s handle with the policy around it (once). For a route of this app
        only: the routes of the API's routers (shared by every app made) are PolicyRoutes."""
        if (
            isinstance(route, (PolicyRoute, _IncludedRouter))
            or getattr(route, "eventlog_policy", None) is self
        ):
            return
        rule = rule or self.rule(route)
        inner = route.handle

        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await inner(scope, receive, send)
                return
            await self.serve(rule, inner, scope, receive, send)

        route.handle = handle  # type: ignore[method-assign]
        route.eventlog_policy = self  # type: ignore[attr-defined]

    @staticmethod
    def rule(route: BaseRoute) -> Rule:
        """What `route` declares: read once, at registration."""
        from .deps import get_engine

        template: str = getattr(route, "path", UNMATCHED)
        methods = frozenset(getattr(route, "methods", None) or ())
        right = getattr(route, "eventlog_right", None)
        engine = bool(getattr(route, "eventlog_engine", False))
        dependant = getattr(route, "dependant", None)
        if dependant is not None:
            calls = _calls(dependant)
            engine = engine or get_engine in calls
            right = right or next(
                (c.eventlog_right for c in calls if hasattr(c, "eventlog_right")), None
            )
        kinds = {m: k for m in methods if (k := request_kind(m, template)) is not None}
        return Rule(
            template,
            methods,
            kinds,
            right,
            engine,
            public_path(template),
            template.endswith(STREAM_SUFFIX),
        )

    # -- the steps (the hot lane calls them one by one) -----------------------------------------

    def declared(self, length: bytes | None) -> int:
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
                413,
                "request_too_large",
                f"request body of {declared} bytes exceeds the limit of {limit}",
                headers={"Connection": "close"},
                limit=limit,
            )
        return declared

    def authenticate(self, authorization: bytes | None) -> Principal:
        """The request's principal (401 without a valid token); ANONYMOUS_ADMIN without an
        auth file."""
        if self.authenticator is None:
            return ANONYMOUS_ADMIN
        return self.authenticator.authenticate(
            authorization.decode("latin-1") if authorization else None
        )

    def within_quota(self, principal: Principal, kind: str | None) -> bool:
        """Whether `principal` has a `kind` quota (its bytes then count); 429 while over it."""
        if kind is None:
            return False
        quotas = self.quotas
        if quotas.quota(principal, kind) is None:
            return False
        throttle = quotas.throttle_ms(principal, kind)
        if throttle > 0:
            self.metrics.throttled.labels(kind).inc()
            raise over_quota(quotas, principal, kind, throttle)
        return True

    def engine(self) -> Engine:
        """The engine, 503 while it is not open (starting, or stopping)."""
        state = self.state
        engine: Engine | None = state.engine
        if engine is None or state.shutting_down:
            raise LogClosedError("engine")
        return engine

    @staticmethod
    def authorize(
        principal: Principal, right: str, path_params: dict[str, Any], query: bytes
    ) -> None:
        """403 unless `principal` may do `right` on the path's topic and group, and on the topic a
        query names (?topic= filters group offsets)."""
        query_topic = None
        if b"topic=" in query:
            values = parse_qs(query.decode("latin-1")).get("topic")
            query_topic = values[-1] if values else None
        check_access(principal, right, path_params.get("topic"), query_topic)
        group = path_params.get("group")
        if group is not None and not principal.allows(right, group=group):
            raise ApiError(403, "forbidden", f"{principal.name!r} has no access to group {group!r}")

    def admit(
        self,
        rule: Rule,
        method: str,
        path: str,
        length: bytes | None,
        authorization: bytes | None,
        path_params: dict[str, Any],
        query: bytes,
    ) -> tuple[int, Principal, bool]:
        """Steps 1 to 5: (declared body size, principal, whether its bytes count against a
        quota)."""
        declared = self.declared(length)
        public = rule.public if rule.public is not None else public_path(path)
        principal = ANONYMOUS_ADMIN if public else self.authenticate(authorization)
        if rule.methods and method not in rule.methods:
            return declared, principal, False  # the route answers 405
        quota_on = self.within_quota(principal, rule.kinds.get(method))
        if rule.engine:
            self.engine()
        if rule.right is not None:
            self.authorize(principal, rule.right, path_params, query)
        return declared, principal, quota_on

    async def body(
        self, receive: Receive, declared: int, started: float, received: list[int]
    ) -> bytearray:
        """The whole body straight into one writable buffer (see records._read_body), within the
        request's time and size limits; received[0] follows the bytes taken."""
        limit = self.max_request_bytes
        buf = bytearray(declared) if declared <= PREALLOCATE_BYTES else bytearray()
        filled = 0
        deadline = (
            asyncio.get_running_loop().time() + self.timeout_s - (time.perf_counter() - started)
        )
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        raise Disconnected
                    chunk = message.get("body", b"")
                    n = len(chunk)
                    if n:
                        if filled + n > limit:
                            raise self._too_large()
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
            raise self._too_slow() from None
        if filled < len(buf):
            del buf[filled:]
        return buf

    def limited(self, receive: Receive, started: float, received: list[int]) -> Receive:
        """`receive` for a handler that reads the body itself: the same limits as body()."""
        limit = self.max_request_bytes
        clock = asyncio.get_running_loop().time
        deadline = clock() + self.timeout_s - (time.perf_counter() - started)
        done = False

        async def limited_receive() -> Message:
            nonlocal done
            if done:  # afterwards receive() only waits for the client to go away
                return await receive()
            with anyio.move_on_after(deadline - clock()) as waiting:
                message = await receive()
            if waiting.cancelled_caught:
                raise self._too_slow()
            if message["type"] == "http.request":
                n = received[0] + len(message.get("body", b""))
                if n > limit:
                    raise self._too_large()
                received[0] = n
                if not message.get("more_body", False):
                    done = True
            else:
                done = True
            return message

        return limited_receive

    def _too_large(self) -> RequestRefused:
        limit = self.max_request_bytes
        return RequestRefused(
            413,
            "request_too_large",
            f"request body exceeds the limit of {limit} bytes",
            headers={"Connection": "close"},
            limit=limit,
        )

    def _too_slow(self) -> RequestRefused:
        return RequestRefused(
            408,
            "request_timeout",
            f"the request body did not arrive within {self.timeout_ms} ms",
            headers={"Connection": "close"},
            limit_ms=self.timeout_ms,
        )

    def account(self, principal: Principal, kind: str, n: int) -> None:
        """`n` bytes of `kind` against `principal`'s quota."""
        if n:
            self.quotas.record(principal, kind, n)

    async def throttle(self, principal: Principal, kind: str, n: int) -> None:
        """An open stream is slowed, not refused: wait out the throttle, then count `n` bytes."""
        quotas = self.quotas
        throttle = quotas.throttle_ms(principal, kind)
        if throttle > 0:
            self.metrics.throttled.labels(kind).inc()
            await asyncio.sleep(throttle / 1000)
        quotas.record(principal, kind, n)

    def observe(
        self, scope: Scope, route: str, status: int, started: float, sent: int, principal: Principal
    ) -> None:
        """The request's metrics and access line (the in-flight gauge is the caller's)."""
        elapsed = time.perf_counter() - started
        method = scope["method"]
        counter = self._counters.get((route, method, status))
        if counter is None:
            counter = self._counters[(route, method, status)] = self.metrics.requests.labels(
                route, method, str(status)
            )
        counter.inc()
        latency = self._latency.get((route, method))
        if latency is None:
            latency = self._latency[(route, method)] = self.metrics.latency.labels(route, method)
        latency.observe(elapsed)
        self.access_log.add(
            method,
            scope["path"],
            scope.get("query_string", b""),
            route,
            status,
            elapsed,
            sent,
            scope.get("client"),
            principal.name,
        )

    def kafka_quota(self, principal: Principal, kind: str, n: int) -> int:
        """A Kafka request's `n` bytes of `kind` counted against `principal`'s quota; the
        throttle it has earned in ms (0: none, or no quota). Kafka's way (KIP-219): the request
        is served, its response says how long, and the connection is muted for that long."""
        quotas = self.quotas
        if quotas.quota(principal, kind) is None:
            return 0
        if n:
            quotas.record(principal, kind, n)
        throttle = quotas.throttle_ms(principal, kind)
        if throttle > 0:
            self.metrics.throttled.labels(kind).inc()
        return int(throttle)

    def observe_kafka(
        self, api: str, version: int, error: int, started: float, sent: int, client: Any,
        principal: str,
    ) -> None:
        """A Kafka request's metrics and access line (broker/listener.py): the API's name as
        the route, KAFKA as the method, the request's error code (0: none) as the status."""
        elapsed = time.perf_counter() - started
        metrics = self.metrics
        metrics.kafka_requests.labels(api, str(error)).inc()
        metrics.kafka_latency.labels(api).observe(elapsed)
        self.access_log.add(
            "KAFKA", f"{api} v{version}", b"", api, error, elapsed, sent, client, principal
        )

    def problem(self, exc: Exception, scope: Scope) -> Any:
        """The problem+json answer for `exc` (api/errors.problem_for)."""
        return problem_for(exc, self.state, scope)

    # -- a route's request, start to end ----------------------------------------------------------

    async def serve(
        self, rule: Rule, inner: ASGIApp, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Run `inner` (a route's handler) under the policy."""
        started = time.perf_counter()
        metrics = self.metrics
        metrics.in_flight += 1
        principal = ANONYMOUS_ADMIN
        method = scope["method"]
        status = 500
        sent = 0
        answering = False
        received = [0]
        kind: str | None = None
        parked = [0]  # an event stream's bytes written past the send (api/sse.py)
        # fetch bytes count as they are sent (not an event stream's: api/sse.py counts those)
        counted = False

        async def observed_send(message: Message) -> None:
            nonlocal status, sent, answering
            kind_of_message = message["type"]
            if kind_of_message == "http.response.body":
                n = len(message.get("body", b""))
                sent += n
                if counted and n:
                    self.quotas.record(principal, FETCH, n)
            elif kind_of_message == "http.response.start":
                status = message["status"]
                answering = True
                if deadline is not None:  # the answer has started: the body may take its time
                    deadline.deadline = math.inf
            elif kind_of_message == ZEROCOPY and counted:
                self.quotas.record(principal, FETCH, message["count"])
            await send(message)

        deadline: anyio.CancelScope | None = None
        try:
            length, authorization = length_and_authorization(scope)
            query = scope.get("query_string", b"")
            _declared, principal, quota_on = self.admit(
                rule,
                method,
                scope["path"],
                length,
                authorization,
                scope.get("path_params") or {},
                query,
            )
            state = scope.setdefault("state", {})
            state["principal"] = principal
            if quota_on:
                kind = rule.kinds[method]
                counted = kind == FETCH and not rule.stream
                if rule.stream:  # each chunk waits out the throttle (api/sse.py)
                    state[THROTTLED_KEY] = principal
            if rule.stream:
                scope[SENT_KEY] = parked
            if method == "GET" and not rule.stream:
                deadline = anyio.CancelScope(
                    deadline=asyncio.get_running_loop().time() + self.timeout_s + _max_wait_s(query)
                )
                with deadline:
                    await inner(scope, self.limited(receive, started, received), observed_send)
                if deadline.cancelled_caught and not answering:
                    raise ApiError(
                        503,
                        "request_timeout",
                        f"no answer within {self.timeout_ms} ms",
                        limit_ms=self.timeout_ms,
                    )
            else:
                await inner(scope, self.limited(receive, started, received), observed_send)
        except Exception as exc:
            if answering:
                raise  # the answer has begun: the connection breaks (the server's doing)
            response = self.problem(exc, scope)
            await response(scope, receive, observed_send)
        finally:
            metrics.in_flight -= 1
            if kind == PRODUCE and received[0]:
                self.quotas.record(principal, PRODUCE, received[0])
            self.observe(scope, rule.route, status, started, sent + parked[0], principal)


class PolicyRoute(APIRoute):
    """The route class of every router of the API (route_class=PolicyRoute): its handler runs
    under the app's policy, with the Rule read off the route once (at its first request: the
    routers are declared while the modules the Rule looks at are being imported)."""

    policy_rule: Rule | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handle = super().handle

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._handle(scope, receive, send)
            return
        rule = self.policy_rule
        if rule is None:
            rule = self.policy_rule = Policy.rule(self)
        await scope["app"].state.policy.serve(rule, self._handle, scope, receive, send)


def first_headers(scope: Scope, names: tuple[bytes, ...]) -> list[bytes | None]:
    """The first value of each of these headers (lower-case names) in the request, in the
    order asked (None: absent)."""
    found: dict[bytes, bytes | None] = dict.fromkeys(names)
    for name, value in scope["headers"]:
        if name in found and found[name] is None:
            found[name] = value
    return [found[name] for name in names]


def length_and_authorization(scope: Scope) -> tuple[bytes | None, bytes | None]:
    """The first Content-Length and Authorization headers of the request (None: absent)."""
    length, authorization = first_headers(scope, (b"content-length", b"authorization"))
    return length, authorization


def _calls(dependant: Any) -> list[Callable[..., Any]]:
    """Every dependency callable of a FastAPI dependant, sub-dependencies included."""
    out: list[Callable[..., Any]] = []
    stack = list(dependant.dependencies)
    while stack:
        d = stack.pop()
        if d.call is not None:
            out.append(d.call)
        stack.extend(d.dependencies)
    return out


def _max_wait_s(query: bytes) -> float:
    """A fetch's long-poll time, from its query string (0 when absent or not a number: the route
    then refuses it anyway)."""
    if MAX_WAIT_PARAM.encode() not in query:
        return 0.0
    values = parse_qs(query.decode("latin-1")).get(MAX_WAIT_PARAM, [])
    try:
        wait = int(values[-1]) if values else 0
    except ValueError:
        return 0.0
    return min(max(wait, 0), MAX_WAIT_LIMIT_MS) / 1000
