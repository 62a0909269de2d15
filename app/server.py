"""uvicorn's configuration from the settings: listen limits, slow-client guards, TLS.

uvicorn closes idle keep-alive connections (timeout_keep_alive) and can refuse work beyond a
number of connections + requests (limit_concurrency, 503), but it waits for ever for a request
line and headers, and with httptools (its choice when installed) it takes headers of any size.
The protocol classes made here add both limits, for httptools and h11 alike:

    head timeout   a connection must deliver a whole request head (request line + headers)
                   within header_timeout_ms of opening, or of the first byte of its next
                   request: otherwise 408 `request_timeout` (or, if nothing came, just the
                   close) and the connection ends.
    head size      a request line + headers over max_header_bytes: 431 `headers_too_large`
                   and the connection ends, the request never routed. Counted twice: the bytes
                   of a head still incomplete after each read (a client trickling an endless
                   head), and the parsed head itself once complete (a whole 70 KB head read in
                   one go completes before any count after the read could see it; so can one
                   following a keep-alive request). h11 also gets the limit as its
                   h11_max_incomplete_event_size, and its overflow is answered the same way.
    stalled reader a response the client takes nothing of for request_timeout_ms (the
                   transport's write buffer above its high-water mark and not shrinking) ends
                   the connection at once (abort: the buffered bytes are dropped). Without it a
                   client that stops reading would hold its response's bytes in memory and its
                   connection open for ever: uvicorn hands a whole body to the transport and
                   the request is done as far as the application can tell.

    burst intake  request heads are taken at most INTAKE_PER_TURN per turn of the event
                   loop when they start a request that will wait (a long-poll fetch, an event
                   stream: told by the request line): beyond that, the connection's bytes wait
                   for a coming turn of the loop's pacer (engine/wakeups.py), in order, reading
                   paused if more come meanwhile. Thousands of long-polls opened at once were
                   otherwise taken in one turn (each parsed and given a task, then taken through
                   the request policy to its wait in the next): /healthz waited 0.3-0.5 s behind
                   them (issue 23). Every other request is taken at once, as before; a client's
                   EOF closes its connection through the pacer too (thousands leaving at once).

The body and the answer have their limits in the request policy (api/policy.py).

serve() runs the app until SIGTERM or SIGINT: on a socket of its own (eventlog serve, one
process) or on one it inherited (a shard of a family, app/shard.py). SIGHUP checks the auth
file for a new version at once (api/auth.py, AuthFileWatcher); one that comes before the
server's handlers are in place is ignored (the watcher's first check finds the change anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import weakref
from types import FrameType
from typing import Any, Callable, Iterator, Sequence

import orjson
import uvicorn

from api.tail import TRANSPORT_SCOPE_KEY
from engine.wakeups import pacer_for

from .balance import Balancer
from .settings import Settings
from .startup import CannotStart, shutdown_watchdog_s

logger = logging.getLogger("eventlog.app")


def _problem_bytes(status: int, reason: str, code: str, detail: str) -> bytes:
    body = orjson.dumps({
        "type": f"urn:eventlog:problem:{code}", "title": reason, "status": status, "detail": detail, "code": code,
    })
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


# request heads an event loop's connections take in one turn before the head of a request that
# will wait is left for a coming turn (see "burst intake" above)
INTAKE_PER_TURN = 64


class _Intake:
    """How many request heads the connections of one event loop took in its current turn."""

    __slots__ = ("_armed", "loop", "taken")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.taken = 0
        self._armed = False

    def take(self) -> bool:
        """Count a head; False once this turn has taken INTAKE_PER_TURN."""
        if not self._armed:  # the count starts again in the next turn
            self._armed = True
            self.loop.call_soon(self._reset)
        self.taken += 1
        return self.taken <= INTAKE_PER_TURN

    def _reset(self) -> None:
        self.taken = 0
        self._armed = False


_intakes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Intake] = (
    weakref.WeakKeyDictionary()
)
_last_intake: _Intake | None = None  # the last one asked for: a process has one loop that serves


def _intake(loop: asyncio.AbstractEventLoop) -> _Intake:
    global _last_intake
    intake = _last_intake
    if intake is None or intake.loop is not loop:
        intake = _intakes.get(loop)
        if intake is None:
            intake = _intakes[loop] = _Intake(loop)
        _last_intake = intake
    return intake


def _will_wait(data: bytes) -> bool:
    """Whether `data`, the first bytes of a request, start a request that waits for records: a
    GET of an event stream (.../stream) or one with max_wait_ms (a long-poll fetch)."""
    if not data.startswith(b"GET "):
        return False
    end = data.find(b" ", 4, 8192)
    path, _, query = (data[4:end] if end > 0 else data[4:8192]).partition(b"?")
    return path.endswith(b"/stream") or b"max_wait_ms=" in query


class _HeadGuard:
    """Mixed into a uvicorn HTTP protocol class (before it in the bases)."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0

    def _arm_head(self) -> None:
        if self._head_timer is None:
            self._head_bytes = 0
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _head_done(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _count_head(self, n: int) -> None:
        """After bytes were parsed and the head is still incomplete."""
        if self._head_timer is None:
            return
        self._head_bytes += n
        if self._head_bytes > self.max_header_bytes:
            self._head_too_large()

    def _head_too_large(self) -> None:
        self._head_done()
        self._refuse(431, "Request Header Fields Too Large", "headers_too_large",
                     f"request line and headers exceed {self.max_header_bytes} bytes")

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._head_bytes:
            ms = round(self.header_timeout_s * 1000)
            self._refuse(408, "Request Timeout", "request_timeout", f"request headers did not arrive within {ms} ms")
        elif not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, reason: str, code: str, detail: str) -> None:
        if not self.transport.is_closing():
            self.transport.write(_problem_bytes(status, reason, code, detail))
            self.transport.close()

    # -- a burst of requests that will wait ----------------------------------------------------

    cycle: Any
    flow: Any
    _deferred: bytes | None = None

    def _receive(self, data: bytes) -> None:
        """What data_received does with bytes taken now."""
        raise NotImplementedError

    def _defer_intake(self, data: bytes) -> bool:
        """True when `data` is left for a coming turn: it starts a request that will wait, on a
        connection with no request in progress, and this turn has taken its share of heads."""
        if self._deferred is not None:  # more came meanwhile: after what waits, in order
            self._deferred += data
            self.flow.pause_reading()  # (a client sends a request and waits: rarely needed)
            return True
        if self.cycle is not None and not self.cycle.response_complete:
            return False
        if _intake(self.loop).take() or not _will_wait(data):
            return False
        self._deferred = data
        self._unset_keepalive_if_required()  # type: ignore[attr-defined] # uvicorn's: the connection is in use
        pacer_for(self.loop).call(self._take_deferred)
        return True

    def _take_deferred(self) -> None:
        data, self._deferred = self._deferred, None
        if data is None or self.transport.is_closing():
            return
        self.flow.resume_reading()  # if more came meanwhile
        self._receive(data)

    def eof_received(self) -> bool | None:
        """The client closed its side: the connection closes, as uvicorn closes it, but in a
        coming turn of the pacer (thousands of clients leaving at once close a few per turn).
        With TLS the transport closes at once, as before (it cannot be kept half-open)."""
        if self.transport.get_extra_info("ssl_object") is not None:
            return None
        if not self.transport.is_closing():
            pacer_for(self.loop).call(self._close_after_eof)
        return True  # the transport stays until then

    def _close_after_eof(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    # -- a client that stops reading ---------------------------------------------------------

    send_timeout_s: float = 30.0
    _write_timer: asyncio.TimerHandle | None = None
    _write_buffered = 0

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._write_timer is None:
            self._write_buffered = self.transport.get_write_buffer_size()
            self._write_timer = self.loop.call_later(self.send_timeout_s, self._check_writing)

    def resume_writing(self) -> None:
        self._stop_write_watch()
        super().resume_writing()  # type: ignore[misc]

    def _stop_write_watch(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _check_writing(self) -> None:
        self._write_timer = None
        if self.transport.is_closing() and self.transport.get_write_buffer_size() == 0:
            return
        buffered = self.transport.get_write_buffer_size()
        if buffered < self._write_buffered:  # the client took some: watch on
            self._write_buffered = buffered
            self._write_timer = self.loop.call_later(self.send_timeout_s, self._check_writing)
            return
        logger.warning(
            "%s: the client took no response bytes for %d ms (%d bytes waiting); connection dropped",
            _peer(self.transport), round(self.send_timeout_s * 1000), buffered,
        )
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        self._stop_write_watch()
        super().connection_lost(exc)  # type: ignore[misc]


def _peer(transport: asyncio.Transport) -> str:
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "client"


def _httptools_guarded() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpTools(_HeadGuard, HttpToolsProtocol):
        _refused = False  # a head was refused: the rest of what the client sent is dropped
        _read_bytes = 0  # of the read being parsed

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head()

        def data_received(self, data: bytes) -> None:
            if self._refused or self._defer_intake(data):
                return
            self._receive(data)

        def _receive(self, data: bytes) -> None:
            if self._refused:
                return
            self._read_bytes = len(data)
            super().data_received(data)
            self._count_head(len(data))

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_head()

        def on_headers_complete(self) -> None:
            # what came before this read, plus this read, bounds the head: only a head that may
            # be too large is measured (from what the parser collected)
            may_exceed = self._head_bytes + self._read_bytes > self.max_header_bytes
            self._head_done()
            if may_exceed and self._parsed_head_bytes() > self.max_header_bytes:
                self._refused = True
                self._head_too_large()
                return
            # event streams write shared chunks straight to their subscribers' transports
            # (api/tail.py, Fanout): only this server's own protocol offers it
            self.scope[TRANSPORT_SCOPE_KEY] = self.transport  # type: ignore[literal-required]
            super().on_headers_complete()

        def _parsed_head_bytes(self) -> int:
            # "<method> <url> HTTP/1.1\r\n", "<name>: <value>\r\n" each, "\r\n"
            request_line = len(self.parser.get_method()) + len(self.url) + 12
            return request_line + sum(len(name) + len(value) + 4 for name, value in self.headers) + 2

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._refused:
                super().on_message_complete()

    return GuardedHttpTools


def _h11_guarded() -> type:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadLimitedConnection(h11.Connection):
        """h11's connection, answering a head over the limit with the guard's 431: a complete
        one as its Request event comes out, an incomplete one when h11 finds its buffer too
        long (which it reports as a protocol error, answered 400 by uvicorn)."""

        def __init__(self, guard: _HeadGuard, limit: int) -> None:
            super().__init__(h11.SERVER, max_incomplete_event_size=limit)
            self._guard = guard
            self._limit = limit

        def next_event(self):  # type: ignore[no-untyped-def]
            try:
                event = super().next_event()
            except h11.RemoteProtocolError as exc:
                if exc.error_status_hint != 431:
                    raise
                self._guard._head_too_large()
                return h11.PAUSED  # uvicorn stops reading; the connection is closing
            if type(event) is h11.Request:
                size = len(event.method) + len(event.target) + 12 + 2
                size += sum(len(name) + len(value) + 4 for name, value in event.headers)
                if size > self._limit:
                    self._guard._head_too_large()
                    return h11.PAUSED
            return event

    class GuardedH11(_HeadGuard, H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.conn = HeadLimitedConnection(self, self.max_header_bytes)
            self._arm_head()

        def data_received(self, data: bytes) -> None:
            if not self._defer_intake(data):
                self._receive(data)

        def _receive(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE:
                self._arm_head()
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:
                self._count_head(len(data))
            else:
                self._head_done()

    return GuardedH11


class _Balanced:
    """Mixed into the protocol class of a shard (app/balance.py): a connection that another
    shard should serve is handed over as it is accepted, before this protocol reads or answers
    anything, and this shard forgets it."""

    balancer: Balancer | None = None
    adopted = False  # handed over to this shard by another: stays here
    _handed_off = False
    server_state: Any

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        balancer = self.balancer
        if balancer is not None:
            if not self.adopted and balancer.hand_off(transport, len(self.server_state.connections)):
                self._handed_off = True
                transport.abort()  # our copy only: the other shard holds the connection now
                return
            super().connection_made(transport)  # type: ignore[misc]
            balancer.publish(len(self.server_state.connections))
            return
        super().connection_made(transport)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handed_off:
            return
        super().connection_lost(exc)  # type: ignore[misc]
        if self.balancer is not None:
            self.balancer.publish(len(self.server_state.connections))


def protocol_class(settings: Settings, implementation: str = "auto", balancer: Balancer | None = None) -> type:
    """uvicorn's own choice (httptools when installed, else h11), with the head limits;
    `implementation` "httptools" or "h11" picks one (tests check both). With a balancer (a
    shard of a family), new connections are spread evenly over the shards."""
    if implementation == "auto":
        try:
            import httptools  # noqa: F401
        except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
            implementation = "h11"
        else:
            implementation = "httptools"
    base = _h11_guarded() if implementation == "h11" else _httptools_guarded()
    bases = (_Balanced, base) if balancer is not None else (base,)
    return type(base.__name__, bases, {
        "header_timeout_s": settings.header_timeout_ms / 1000,
        "max_header_bytes": settings.max_header_bytes,
        "send_timeout_s": settings.request_timeout_ms / 1000,
        "balancer": balancer,
    })


def uvicorn_config(app: Any, settings: Settings, balancer: Balancer | None = None) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol_class(settings, balancer=balancer),
        lifespan="on",
        log_config=None,
        log_level=settings.log_level,
        access_log=False,  # our middleware writes structured access lines (eventlog.access)
        timeout_graceful_shutdown=settings.shutdown_timeout_ms / 1000,  # type: ignore[arg-type] # wait_for takes floats
        limit_concurrency=settings.limit_concurrency,
        timeout_keep_alive=settings.timeout_keep_alive_ms / 1000,  # type: ignore[arg-type] # call_later takes floats
        backlog=settings.backlog,
        h11_max_incomplete_event_size=settings.max_header_bytes,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        ssl_keyfile_password=settings.ssl_keyfile_password,
    )


class Server(uvicorn.Server):
    """uvicorn's server, minus re-raising the shutdown signal afterwards: SIGTERM and SIGINT
    mean a clean shutdown and exit status 0. The first signal also ends long-polls and event
    streams at once (on_exit), so the graceful wait for open requests is short, and arms a
    watchdog: a shutdown still running `watchdog_s` later (a writer stuck in a system call on a
    hung disk, which no task can cancel) ends the process with status 1. Acknowledged appends
    were fsynced; the next start recovers as after a crash. `on_started` is called once the
    lifespan is up and the socket accepts (a shard tells its supervisor it is ready).
    SIGHUP calls `on_reload` (the auth file is checked again) and nothing else."""

    on_exit: Callable[[], None] | None = None
    on_started: Callable[[], None] | None = None
    on_reload: Callable[[], None] | None = None  # SIGHUP
    watchdog_s: float | None = None
    # SIGTERM/SIGINT that came before the server ran (a shard noting them while it starts)
    early_signals: Sequence[int] = ()
    _watchdog: threading.Timer | None = None
    balancer: Balancer | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.balancer is not None:
            self.balancer.start(self._adopt)
        if self.started and self.on_started is not None:
            self.on_started()

    async def _adopt(self, sock: socket.socket) -> None:
        """Serve a connection another shard accepted (app/balance.py), as if accepted here."""
        config = self.config

        def adopted() -> asyncio.Protocol:
            protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state,
            )
            protocol.adopted = True
            return protocol

        await asyncio.get_running_loop().connect_accepted_socket(adopted, sock)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.balancer is not None:
            self.balancer.close()
        await super().shutdown(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._watchdog is None and self.watchdog_s is not None:
            self._watchdog = threading.Timer(self.watchdog_s, _shutdown_overdue, (self.watchdog_s,))
            self._watchdog.daemon = True
            self._watchdog.start()
        if self.on_exit is not None:
            self.on_exit()

    def handle_reload(self, sig: int, frame: FrameType | None) -> None:
        if self.on_reload is not None:
            self.on_reload()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self.handle_reload)
        for sig in self.early_signals:
            self.handle_exit(sig, None)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _shutdown_overdue(after_s: float) -> None:
    logger.error(
        "shutdown did not finish within %.0f s of the signal; exiting now without a clean close "
        "(the next start recovers the partitions)", after_s,
    )
    logging.shutdown()
    os._exit(1)


class _HideStartupTraceback(logging.Filter):
    """When the engine refuses to start (a locked or broken data dir), the lifespan has logged
    one clear line and the CLI prints it again; uvicorn's traceback of it adds only noise."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self.app = app

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and self.app.state.startup_error is not None)


def serve(
    settings: Settings,
    sockets: list[socket.socket] | None = None,
    on_started: Callable[[], None] | None = None,
    early_signals: list[int] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT and a clean shutdown: on host:port, or on `sockets` (listening
    already). `on_started` is called once it serves; `early_signals` are SIGTERM/SIGINT received
    before, acted on as soon as the server's own handlers are in place. Raises CannotStart:
    status 2 for an invalid auth file, 1 when the engine refused to start (the message says
    why) or the server could not listen (message None: uvicorn logged it)."""
    from api.auth import AuthConfigError

    from .main import begin_shutdown, create_app, reload_auth

    with _sighup_ignored():
        try:
            app = create_app(settings)
        except AuthConfigError as exc:
            raise CannotStart(str(exc), 2) from None
        logging.getLogger("uvicorn.error").addFilter(_HideStartupTraceback(app))
        shard = settings.shard
        balancer = None
        if shard is not None and shard.count > 1 and settings.ssl_certfile is None:
            balancer = Balancer(shard.run_dir, shard.index, shard.count)
        server = Server(uvicorn_config(app, settings, balancer))
        server.balancer = balancer
        server.on_exit = lambda: begin_shutdown(app)
        server.on_started = on_started
        server.on_reload = lambda: reload_auth(app)
        server.early_signals = early_signals if early_signals is not None else ()
        server.watchdog_s = shutdown_watchdog_s(settings)
        try:  # on uvloop when installed (uvicorn picks the loop)
            if sockets is None:
                server.run()
            else:
                server.run(sockets=sockets)
        except SystemExit:  # uvicorn exits with status 3 when the lifespan fails
            pass
    if app.state.startup_error is not None:
        raise CannotStart(str(app.state.startup_error), 1)
    if not server.started:
        raise CannotStart(None, 1)


@contextlib.contextmanager
def _sighup_ignored() -> Iterator[None]:
    """SIGHUP ignored (in the main thread) until the server's own handler takes it: its default
    action would end the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)
