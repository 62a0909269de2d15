"""create_app(settings): the composition root of the HTTP service."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import anyio
from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import Authenticator, AuthFileWatcher
from api.errors import allowed_methods
from api.lane import HotLane
from api.observability import AccessLog, Metrics
from api.policy import Policy
from api.quotas import QuotaManager
from api.routes import install_routes
from api.tail import TRANSPORT_SCOPE_KEY

from . import __version__
from .lifespan import make_lifespan
from .settings import Settings

_CORS_DONE = "eventlog.cors"  # a request the CORS middleware has seen (it calls the app back)


class EventlogApp(FastAPI):
    """FastAPI with the hot lane (api/lane.py) ahead of its router. Every route, the lane's
    handlers included, runs under one request policy (api/policy.py), applied per route here."""

    lane: HotLane | None = None
    cors: ASGIApp | None = None  # CORSMiddleware around everything (hot lane included), if configured

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cors = self.cors
        if cors is not None and scope["type"] == "http" and not scope.get(_CORS_DONE):
            await cors({**scope, _CORS_DONE: True}, receive, send)
            return
        if scope["type"] == "http" and scope["method"] in ("HEAD", "OPTIONS"):
            await (self._head if scope["method"] == "HEAD" else self._options)(scope, receive, send)
            return
        lane = self.lane
        if lane is not None and scope["type"] == "http":
            taken = lane.match(scope)
            if taken is not None:
                handler, args = taken
                await handler(scope, receive, send, *args)
                return
        await super().__call__(scope, receive, send)

    async def _options(self, scope: Scope, receive: Receive, send: Send) -> None:
        """OPTIONS (a browser's preflight when no CORS origin is configured, or a client asking):
        204 with the methods the path takes in `Allow`, and no CORS headers; 404 for no route."""
        methods = allowed_methods(self, scope)
        if methods:
            headers = [(b"allow", ", ".join([*methods, "OPTIONS"]).encode()), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 204, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        await super().__call__(scope, receive, send)  # the router's 404

    async def _head(self, scope: Scope, receive: Receive, send: Send) -> None:
        """HEAD wherever GET works (RFC 9110): the GET's status and headers, no body. An event
        stream is told the client went away once its head is sent, so it ends at once."""
        answered = False

        async def head_receive() -> Message:
            if answered:
                return {"type": "http.disconnect"}
            return await receive()

        async def head_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                await send(message)
            elif not answered:  # the first body message (or a zero-copy file range) ends it
                answered = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        # (no transport: an event stream must not be parked with the pusher, which writes past head_send)
        await super().__call__({**scope, "method": "GET", TRANSPORT_SCOPE_KEY: None}, head_receive, head_send)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service. Raises api.auth.AuthConfigError for an unreadable or invalid auth file."""
    settings = settings or Settings()
    authenticator = Authenticator.from_file(settings.auth_file) if settings.auth_file else None
    watcher = None
    if authenticator is not None and settings.auth_file is not None:
        watcher = AuthFileWatcher(authenticator, settings.auth_file, settings.auth_reload_ms)
    metrics = Metrics()
    lifespan = make_lifespan(settings, metrics)
    app = EventlogApp(
        title="eventlog",
        version=__version__,
        summary="Apache Kafka's log layer behind a REST API",
        description=(
            "Topics and partitions stored in Kafka's own segment format. Every error is "
            "`application/problem+json` with a stable `code`. With an auth file configured, every "
            "request but `GET /healthz` needs `Authorization: Bearer <token>`."
        ),
        lifespan=lifespan if watcher is None else _watching(lifespan, watcher),
        # served by api/docs.py from the server's own files (FastAPI's load from a CDN)
        docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.engine = None
    app.state.workers = None
    app.state.startup_error = None
    app.state.shutting_down = False
    app.state.loop = None
    app.state.peer_metrics = None  # a shard of a family: the other shards' /metrics (lifespan)
    # with the Kafka listener: group -> (state, live members), from shard 0's coordinator
    app.state.group_members = None
    app.state.auth_watcher = watcher
    install_routes(app)
    quotas = QuotaManager(settings.quota_config())
    app.state.quotas = quotas
    access_log = AccessLog(settings.access_log, settings.access_log_sample)
    app.state.access_log = access_log
    # one policy (limits, authentication, quotas, the engine's state, rights, metrics, the access
    # log, problem mapping) wrapped around each route's handler, and used by the hot lane: no
    # middleware of ours (CORS, below, answers preflights for every path, the lane's included)
    policy = Policy(
        app.state, metrics=metrics, authenticator=authenticator, quotas=quotas, access_log=access_log,
        max_request_bytes=settings.max_request_bytes, request_timeout_ms=settings.request_timeout_ms,
    )
    app.state.policy = policy
    policy.apply(app)
    if settings.cors_origins:
        app.cors = CORSMiddleware(
            app, allow_origins=list(settings.cors_origins), allow_methods=["GET", "HEAD", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "If-Match", "If-None-Match", "Idempotency-Key", "Last-Event-ID"],
            expose_headers=["ETag", "Idempotent-Replayed", "X-Next-Offset", "X-High-Watermark", "X-Log-Start-Offset",
                            "Eventlog-Dropped-Offsets", "Retry-After", "Allow"],
            max_age=600,
        )
    app.lane = HotLane(app, policy, max_inflated_bytes=settings.max_inflated_bytes_per_request)
    return app


def _watching(lifespan: Callable[[FastAPI], Any], watcher: AuthFileWatcher) -> Callable[[FastAPI], Any]:
    """The lifespan, with the auth file's watcher running while the app serves (it starts once
    the engine is open, and stops before the engine closes)."""

    @asynccontextmanager
    async def with_watcher(app: FastAPI) -> AsyncIterator[None]:
        async with lifespan(app), anyio.create_task_group() as tg:
            await tg.start(watcher.run)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    return with_watcher


def reload_auth(app: FastAPI) -> None:
    """Called from a signal handler (SIGHUP): check the auth file now. Nothing without one."""
    watcher: AuthFileWatcher | None = app.state.auth_watcher
    if watcher is not None:
        watcher.request()


def begin_shutdown(app: FastAPI) -> None:
    """Called from a signal handler when shutdown starts: end long-polls and event streams now,
    so the HTTP server's wait for open requests does not last until they time out."""
    loop: asyncio.AbstractEventLoop | None = app.state.loop
    engine = app.state.engine
    if loop is None or engine is None:
        return

    def stop() -> None:
        app.state.shutting_down = True
        engine.begin_shutdown()

    loop.call_soon_threadsafe(stop)
