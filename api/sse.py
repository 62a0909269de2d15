"""One server-sent-events core for the three event streams (a partition's, from the hot lane or
its documented route, api/records.py's stream; one key's, api/keys.py's stream_key_records).

run() sends the head, the source's first comment, then whatever the source gives until the
client leaves (a second coroutine, idle until then, ends the stream: no task group, no send
wrappers per event), the log closes or shutdown begins. What every stream shares is here:

    keep-alive    a `: keepalive` comment after SSE_KEEPALIVE_S without anything sent;
    errors        retention passing the stream, bytes the format cannot show, a failed read, the
                  topic deleted, shutdown: one `error` event (records.error_event), then the end;
    quota         a principal over its fetch quota is slowed, not cut off: each chunk waits out
                  the throttle and counts (Policy.throttle);
    bookkeeping   the bytes sent (a parked subscriber's too, api/tail.py), for the access log.

A source says what to send next: `first` (the opening comment), `position` (for the error
event), and `next(stream)`: the next events, b"" when there is nothing yet (a keep-alive may be
due), None when the stream is over.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from prometheus_client import Counter
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from engine.errors import LogClosedError, OffsetOutOfRangeError, StorageError
from engine.interface import Engine, Partition

from .auth import Principal
from .errors import ApiError, ServerPaths
from .policy import SENT_KEY, THROTTLED_KEY, Policy
from .quotas import FETCH
from .records import SSE_KEEPALIVE_S, error_event
from .tail import FANOUT, TAILS, TRANSPORT_SCOPE_KEY, Parked

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
STREAM_ERRORS = (ApiError, OffsetOutOfRangeError, StorageError, LogClosedError)
_KEEPALIVE = b": keepalive\n\n"


class Source(Protocol):
    first: bytes

    @property
    def position(self) -> int: ...

    async def next(self, stream: Stream) -> bytes | None: ...


class Stream:
    """One open event stream (what a source may read or update: the time of the last write,
    the bytes sent, the transport a parked subscriber is written to)."""

    __slots__ = ("last_sent", "parked", "sent", "transport")

    def __init__(self, transport: Any) -> None:
        self.last_sent = 0.0
        self.sent = 0  # every byte, the pusher's writes included
        self.parked = 0  # the pusher's writes (not seen by the ASGI send)
        self.transport = transport


async def run(
    scope: Scope,
    receive: Receive,
    send: Send,
    source: Source,
    *,
    policy: Policy,
    throttled: Principal | None,
    paths: ServerPaths | None,
) -> Stream:
    """Serve `source` as an event stream until its end or the client's; the stream's figures."""
    task = asyncio.current_task()
    assert task is not None
    # a plain HTTP/1.1 stream of no quota may be parked with the pusher (api/tail.py)
    transport = (
        scope.get(TRANSPORT_SCOPE_KEY)
        if throttled is None and scope.get("http_version") == "1.1"
        else None
    )
    stream = Stream(transport)
    loop = asyncio.get_running_loop()
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    left = asyncio.ensure_future(_until_gone(receive))

    def end(_left: asyncio.Future[None]) -> None:
        task.cancel()

    left.add_done_callback(end)

    async def body(data: bytes) -> None:
        if throttled is not None:
            await policy.throttle(throttled, FETCH, len(data))
        await send({"type": "http.response.body", "body": data, "more_body": True})
        stream.sent += len(data)
        stream.last_sent = loop.time()

    stream.last_sent = loop.time()
    try:
        await body(source.first)
        while True:
            try:
                chunk = await source.next(stream)
            except STREAM_ERRORS as exc:
                await body(error_event(exc, source.position, paths))
                break
            if chunk is None:
                break
            if chunk:
                await body(chunk)
                # uvicorn's send returns without suspending while the socket takes the bytes: a
                # stream that always has something to send must still give the loop a turn
                await asyncio.sleep(0)
            elif loop.time() - stream.last_sent >= SSE_KEEPALIVE_S:
                await body(_KEEPALIVE)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not left.done() or left.cancelled():
            raise  # not the client leaving: shutdown, or whoever cancelled us
        task.uncancel()  # the client left: the stream is over
    finally:
        if not left.done():
            left.remove_done_callback(end)
            left.cancel()
    return stream


class EventStreamResponse(Response):
    """A documented route's answer: `source` served by run() under the request's policy."""

    def __init__(self, source: Source, policy: Policy, paths: ServerPaths | None) -> None:
        self.source = source
        self.policy = policy
        self.paths = paths
        self.status_code = 200
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        throttled = scope.get("state", {}).get(THROTTLED_KEY)
        stream = await run(
            scope,
            receive,
            send,
            self.source,
            policy=self.policy,
            throttled=throttled,
            paths=self.paths,
        )
        counter = scope.get(SENT_KEY)
        if counter is not None:
            counter[0] += stream.parked


class PartitionEvents:
    """A partition's records as events, from `position`; read and encoded once for every
    subscriber at that position (api/tail.py), a subscriber caught up parked with the pusher."""

    def __init__(
        self, engine: Engine, log: Partition, position: int, kf: str, vf: str, fetched: Counter
    ) -> None:
        self.engine = engine
        self.log = log
        self.position = position
        self.kf = kf
        self.vf = vf
        self.fetched = fetched
        self.first = (
            b": streaming "
            + f"{log.topic}/{log.partition} from offset {position}".encode()
            + b"\n\n"
        )
        self._may_park: bool | None = None

    async def next(self, stream: Stream) -> bytes | None:
        log, engine = self.log, self.engine
        if engine.stopping or log.waiting_stopped:
            raise LogClosedError(log.name)
        if self._may_park is None:
            self._may_park = stream.transport is not None
        position = self.position
        if self._may_park and position >= log.high_watermark:
            parked = Parked(stream.transport, position, stream.last_sent)
            try:
                await FANOUT.park(
                    log,
                    self.kf,
                    self.vf,
                    parked,
                    self.fetched,
                    SSE_KEEPALIVE_S,
                    lambda: engine.stopping,
                )
            finally:
                stream.sent += parked.sent
                stream.parked += parked.sent
            self.position, stream.last_sent = parked.position, parked.last_sent
            self._may_park = False  # once through the wait below first: no spin on a closing log
            return b""
        if not await TAILS.wait(log, position):
            return b""
        chunk = await TAILS.chunk(log, position, self.kf, self.vf)
        self.fetched.inc(chunk.records)
        self.position = chunk.next_offset
        self._may_park = stream.transport is not None
        return chunk.events


async def _until_gone(receive: Receive) -> None:
    """Returns when the client has gone away (uvicorn answers receive() with http.disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass
