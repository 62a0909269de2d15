"""Request time limits: a pure ASGI layer (inside the authentication middleware).

    body      every request's body must arrive within request_timeout_ms of the request's
              start: 408 `request_timeout` (and the connection closes) otherwise. The route has
              not acted on a body it has not got, so nothing changes.
    answer    a GET must start its answer within request_timeout_ms (a long-poll fetch:
              request_timeout_ms + its max_wait_ms): 503 `request_timeout` otherwise; a read
              changes nothing. Event streams (.../records/stream) are exempt.
              Writes (POST, PATCH, DELETE) are not cut off once their body is in: cancelling an
              append, a topic change or a compaction pass half-way would leave it done (or half
              done) without the client knowing, breaking "a rejected request changes nothing".
The request line and headers have their own limits in the HTTP server, and so has a client that
stops reading its response (app/server.py).
"""

from __future__ import annotations

import asyncio
import math
from urllib.parse import parse_qs

import anyio
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, problem

STREAM_SUFFIX = "/records/stream"
MAX_WAIT_PARAM = "max_wait_ms"
MAX_WAIT_LIMIT_MS = 300_000  # fetch's own bound on max_wait_ms


class RequestRefused(ApiError, StarletteHTTPException):
    """Raised from inside receive() for a body the server will not take (too large, too slow).

    Also a Starlette HTTPException because FastAPI turns any other exception met while it reads
    a body into its own 400; an HTTPException it re-raises as it is. The ApiError handler comes
    first in the MRO, so the answer is the usual problem+json."""

    def __init__(self, status: int, code: str, detail: str, *, headers: dict[str, str] | None = None, **extra: object) -> None:
        ApiError.__init__(self, status, code, detail, headers=headers, **extra)
        self.status_code = status


class LimitsMiddleware:
    def __init__(self, app: ASGIApp, *, request_timeout_ms: int) -> None:
        self.app = app
        self.timeout_ms = request_timeout_ms
        self.timeout_s = request_timeout_ms / 1000

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timeout_s = self.timeout_s
        clock = asyncio.get_running_loop().time  # anyio's clock on asyncio, without its backend lookup per call
        body_deadline = clock() + timeout_s
        body_done = False
        started = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:  # afterwards receive() only waits for the client to go away
                return await receive()
            with anyio.move_on_after(body_deadline - clock()) as waiting:
                message = await receive()
            if waiting.cancelled_caught:
                raise RequestRefused(
                    408, "request_timeout", f"the request body did not arrive within {self.timeout_ms} ms",
                    headers={"Connection": "close"}, limit_ms=self.timeout_ms,
                )
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        answer = anyio.CancelScope()

        async def timed_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                answer.deadline = math.inf  # the answer has started: the body may take its time
            await send(message)

        path = scope.get("path", "")
        if scope.get("method") == "GET" and not path.endswith(STREAM_SUFFIX):
            answer.deadline = clock() + timeout_s + _max_wait_s(scope)
        with answer:
            await self.app(scope, timed_receive, timed_send)
        if answer.cancelled_caught and not started:
            await problem(
                503, "request_timeout", f"no answer within {self.timeout_ms} ms", limit_ms=self.timeout_ms,
            )(scope, receive, send)


def _max_wait_s(scope: Scope) -> float:
    """A fetch's long-poll time, from its query string (0 when absent or not a number: the route
    then refuses it anyway)."""
    query = scope.get("query_string", b"")
    if MAX_WAIT_PARAM.encode() not in query:
        return 0.0
    values = parse_qs(query.decode("latin-1")).get(MAX_WAIT_PARAM, [])
    try:
        wait = int(values[-1]) if values else 0
    except ValueError:
        return 0.0
    return min(max(wait, 0), MAX_WAIT_LIMIT_MS) / 1000
