"""The service in the test's own process: the app `eventlog serve` runs, with its lifespan, on an
event loop thread, and a synchronous httpx transport that hands it requests as uvicorn would.

Why not Starlette's TestClient: it wants httpx2 (httpx is deprecated there, and warnings are
errors here), and it cancels an app whose client goes away where uvicorn tells the app
(http.disconnect) and lets it finish. Why not httpx.ASGITransport: it runs no lifespan and
buffers whole responses, so an event stream never returns.

What the transport does as uvicorn does: the scope (ASGI spec 2.3, so Starlette listens for
disconnects), a request body in the chunks the client's stream yields, the response streamed
chunk by chunk with backpressure (an app more than RESPONSE_BUFFER chunks ahead of its client
waits, as uvicorn's does when its write buffer fills), the request's read timeout,
http.disconnect once the response is complete or the client closed it (later sends are
dropped), a 500 text/plain when the app fails before it answers and a broken connection when
it fails after. Shutdown as `serve`'s: app.main.begin_shutdown (long-polls and event streams
end), open requests get a grace period, then the lifespan's shutdown closes the engine.

What it does not do: sockets, HTTP parsing, head and body timeouts of the server, TLS,
keep-alive, uvicorn's limits, signals, and a process of its own (for EVENTLOG_CRASH_AT and
EVENTLOG_FAULTS_FILE, read at import, and for kills): tests of those use ServerProcess.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import anyio
import anyio.from_thread
import httpx

logger = logging.getLogger("tests.inprocess")

GRACE_S = 30.0  # serve's timeout_graceful_shutdown (app/server.py)


class AppRunner:
    """An ASGI app on an event loop thread (an anyio blocking portal, on uvloop like `serve`),
    its lifespan started and stopped through the ASGI lifespan protocol."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.portal: anyio.from_thread.BlockingPortal | None = None
        self.state: dict[str, Any] = {}
        self.requests: set[_Exchange] = set()
        self._portal_cm: Any = None
        self._lifespan: Future | None = None
        self._streams: list[Any] = []

    def start(self) -> None:
        """Run the lifespan's start-up; raises the app's own exception if it fails."""
        self._portal_cm = anyio.from_thread.start_blocking_portal("asyncio", {"use_uvloop": True})
        self.portal = portal = self._portal_cm.__enter__()
        try:
            to_app_send, to_app_receive = portal.call(_stream)
            from_app_send, from_app_receive = portal.call(_stream)
            self._streams = [to_app_send, to_app_receive, from_app_send, from_app_receive]
            scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
            self._lifespan = portal.start_task_soon(self.app, scope, to_app_receive.receive, from_app_send.send)
            portal.call(to_app_send.send, {"type": "lifespan.startup"})
            message = portal.call(from_app_receive.receive)
            if message["type"] != "lifespan.startup.complete":
                self._lifespan.result(GRACE_S)  # the app's own exception
                raise RuntimeError(f"the lifespan's start-up failed: {message.get('message')}")
        except BaseException:
            self._close_portal()
            raise

    def stop(self, begin_shutdown: Any = None) -> None:
        """As `serve` on SIGTERM: begin_shutdown(), wait for open requests (at most GRACE_S,
        then they are cancelled), then the lifespan's shutdown."""
        portal = self.portal
        assert portal is not None and self._lifespan is not None
        try:
            if begin_shutdown is not None:
                begin_shutdown()
            # an exchange joins `requests` a moment before its task is started (its `future`):
            # one caught in between would be neither waited for nor cancelled, and its task would
            # hold the portal open forever (seen once: a hung stop under xdist)
            deadline = time.monotonic() + GRACE_S
            def starting() -> bool:
                return any(e.future is None for e in list(self.requests))

            while starting() and time.monotonic() < deadline:
                time.sleep(0.001)
            open_requests = [exchange.future for exchange in list(self.requests) if exchange.future is not None]
            _done, late = wait_futures(open_requests, timeout=GRACE_S)
            for exchange in list(self.requests):
                if exchange.future in late:
                    portal.call(exchange.scope.cancel)
            wait_futures(late, timeout=GRACE_S)
            to_app_send, _, _, from_app_receive = self._streams
            portal.call(to_app_send.send, {"type": "lifespan.shutdown"})
            message = portal.call(from_app_receive.receive)
            self._lifespan.result(GRACE_S)
            if message["type"] != "lifespan.shutdown.complete":
                raise RuntimeError(f"the lifespan's shutdown failed: {message.get('message')}")
        finally:
            self._close_portal()

    def _close_portal(self) -> None:
        for stream in self._streams:
            stream.close()
        cm, self._portal_cm, self.portal = self._portal_cm, None, None
        if cm is not None:
            cm.__exit__(None, None, None)


def _stream() -> tuple[Any, Any]:
    return anyio.create_memory_object_stream[dict](math.inf)


RESPONSE_BUFFER = 64  # chunks an app may send ahead of its client (uvicorn: its write buffer)


class _Exchange:
    """One request: the app's task on the loop, and the response as the client reads it."""

    def __init__(self, runner: AppRunner, request: httpx.Request) -> None:
        self.runner = runner
        self.request = request
        self.chunks: Iterator[bytes] | None = iter(request.stream)  # type: ignore[arg-type]
        self.ahead: bytes | None = None
        timeout = request.extensions.get("timeout", {})
        self.read_timeout_s: float = timeout.get("read") or math.inf
        self.future: Future | None = None
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.failed: BaseException | None = None
        # made on the loop (setup): the response head, the body, the end of the exchange
        self.scope: anyio.CancelScope
        self.started: anyio.Event
        self.body_send: Any
        self.body_receive: Any
        self.finished: anyio.Event  # response complete or client gone: http.disconnect

    async def setup(self) -> None:
        self.scope = anyio.CancelScope()
        self.started = anyio.Event()
        self.finished = anyio.Event()
        self.body_send, self.body_receive = anyio.create_memory_object_stream[bytes](RESPONSE_BUFFER)

    def asgi_scope(self) -> dict[str, Any]:
        url = self.request.url
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "server": ("127.0.0.1", url.port or 80),
            "client": ("127.0.0.1", 50000),
            "scheme": url.scheme,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in self.request.headers.raw],
            "state": self.runner.state.copy(),
            "method": self.request.method,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?", 1)[0],
            "query_string": url.query,
        }

    async def run(self) -> None:
        try:
            with self.scope:
                await self.runner.app(self.asgi_scope(), self.receive, self.send)
            if self.status is None and not self.scope.cancelled_caught:
                logger.error("the app returned without a response to %s %s", self.request.method, self.request.url.path)
                await self._internal_error()
        except Exception as exc:  # as uvicorn: logged, and the client hears of it
            self.failed = exc
            logger.exception("the app raised on %s %s", self.request.method, self.request.url.path)
            if self.status is None:
                await self._internal_error()
        finally:
            self.started.set()
            self.finished.set()
            self.body_send.close()
            self.runner.requests.discard(self)

    async def _internal_error(self) -> None:
        self.status, self.headers = 500, [(b"content-type", b"text/plain; charset=utf-8")]
        self.started.set()
        await self._put(b"Internal Server Error")

    def _take(self) -> bytes | None:
        """The client's next non-empty chunk (a generator body is read as the app asks)."""
        assert self.chunks is not None
        return next((bytes(chunk) for chunk in self.chunks if chunk), None)

    async def receive(self) -> dict[str, Any]:
        if self.chunks is not None:
            body = self.ahead if self.ahead is not None else (self._take() or b"")
            self.ahead = self._take()
            if self.ahead is None:
                self.chunks = None
            return {"type": "http.request", "body": body, "more_body": self.chunks is not None}
        await self.finished.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.finished.is_set():
            return  # the client went away: dropped, as uvicorn does
        if message["type"] == "http.response.start":
            assert self.status is None, "a second http.response.start"
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
            self.started.set()
        elif message["type"] == "http.response.body":
            assert self.status is not None, "a body before http.response.start"
            body = bytes(message.get("body", b""))
            if body and self.request.method != "HEAD":
                await self._put(body)
            if not message.get("more_body", False):
                self.finished.set()
                self.body_send.close()

    async def _put(self, body: bytes) -> None:
        try:
            await self.body_send.send(body)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.finished.set()  # the client closed the response meanwhile

    async def wait_started(self) -> bool:
        with anyio.move_on_after(self.read_timeout_s):
            await self.started.wait()
        return self.started.is_set()

    async def next_chunk(self) -> bytes | None:
        """The next chunk of the body; None at its end; TimeoutError past the read timeout."""
        with anyio.fail_after(self.read_timeout_s):
            try:
                return await self.body_receive.receive()
            except anyio.EndOfStream:
                self.body_receive.close()
                return None

    async def close(self) -> None:
        self.finished.set()
        self.body_receive.close()


class _ResponseStream(httpx.SyncByteStream):
    def __init__(self, exchange: _Exchange) -> None:
        self.exchange = exchange

    def __iter__(self) -> Iterator[bytes]:
        exchange = self.exchange
        while True:
            try:
                chunk = _portal(exchange).call(exchange.next_chunk)
            except TimeoutError:
                raise httpx.ReadTimeout("no response bytes within the read timeout", request=exchange.request) from None
            if chunk is None:
                break
            yield chunk
        if exchange.failed is not None and exchange.status != 500:
            raise httpx.RemoteProtocolError("the app failed after its response started", request=exchange.request)

    def close(self) -> None:
        portal = self.exchange.runner.portal
        try:
            if portal is not None:
                portal.call(self.exchange.close)
                return
        except RuntimeError:  # the portal stopped meanwhile (the app shut down)
            pass
        self.exchange.body_receive.close()  # no loop runs it any more: closed from here


def _portal(exchange: _Exchange) -> anyio.from_thread.BlockingPortal:
    portal = exchange.runner.portal
    if portal is None:
        raise httpx.RemoteProtocolError("the app stopped", request=exchange.request)
    return portal


class ASGITransport(httpx.BaseTransport):
    """A synchronous httpx transport into an AppRunner's app; usable from any thread, by any
    number of clients (closing one ends nothing but its own responses). It keeps to the
    request's read timeout (httpx.ReadTimeout) as a socket would."""

    def __init__(self, runner: AppRunner) -> None:
        self.runner = runner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        exchange = _Exchange(self.runner, request)
        portal = self.runner.portal
        if portal is None:
            raise httpx.ConnectError("the app is not running", request=request)
        portal.call(exchange.setup)
        self.runner.requests.add(exchange)
        exchange.future = portal.start_task_soon(exchange.run)
        if not portal.call(exchange.wait_started):
            portal.call(exchange.close)
            raise httpx.ReadTimeout("no response within the read timeout", request=request)
        if exchange.status is None:  # cancelled at shutdown: the connection closes
            try:
                portal.call(exchange.close)
            except RuntimeError:  # the portal stopped with the app (a race with stop())
                exchange.body_receive.close()
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in exchange.headers]
        return httpx.Response(exchange.status, headers=headers, stream=_ResponseStream(exchange), request=request)


class _LogBuffer(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@dataclass
class InProcessServer:
    """The service `eventlog serve` runs, in this process: the same app object
    (app.main.create_app(settings): routes, middlewares, limits, quotas, auth, error handlers)
    with its lifespan running (recovery first, the real engine on real files with real fsync,
    the cleanup workers), driven through ASGITransport. Requests may come from several threads
    at once. ServerProcess's interface: built from the same EVENTLOG_* settings (see the
    app_factory fixture), with url, client(), start(), stop() and log()."""

    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    url: str = "http://testserver"
    app: Any = None
    runner: AppRunner | None = None
    _gc_threshold: tuple[int, ...] = ()
    _log: _LogBuffer = field(default_factory=_LogBuffer)

    @property
    def running(self) -> bool:
        return self.runner is not None

    def settings(self) -> Any:
        from app.settings import Settings

        given = {name.removeprefix("EVENTLOG_").lower(): value for name, value in self.env.items()}
        return Settings(data_dir=self.data_dir, **given)

    def start(self, timeout: float = 30.0, token: str | None = None) -> "InProcessServer":
        """Build the app and run the lifespan's start-up: ready when it returns (`timeout` and
        `token` are ServerProcess's, needed here for nothing)."""
        from app.main import create_app

        assert not self.running, "already started"
        self.app = create_app(self.settings())
        logging.getLogger("eventlog").addHandler(self._log)
        # the lifespan tunes the garbage collector for a server process (gc.freeze, a higher
        # threshold); stop() gives the test process its own settings back
        self._gc_threshold = gc.get_threshold()
        runner = AppRunner(self.app)
        try:
            runner.start()
        except BaseException:
            self._restore()
            raise
        self.runner = runner
        return self

    def stop(self, timeout: float = 30.0) -> int:
        """Shut down as `serve` does on SIGTERM; 0 (a clean exit) or the shutdown's error."""
        from app.main import begin_shutdown

        assert self.runner is not None, "not started"
        runner, self.runner = self.runner, None
        try:
            runner.stop(lambda: begin_shutdown(self.app))
        finally:
            self._restore()
        return 0

    def _restore(self) -> None:
        logging.getLogger("eventlog").removeHandler(self._log)
        gc.unfreeze()
        gc.set_threshold(*self._gc_threshold)

    def log(self) -> str:
        """This app's eventlog.* log records (those their loggers' levels let through)."""
        return "\n".join(self._log.lines)

    def client(self, token: str | None = None) -> httpx.Client:
        """A client of this app; with `token`, it sends it as a bearer token."""
        assert self.runner is not None, "not started"
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, transport=ASGITransport(self.runner), headers=headers, timeout=30)
