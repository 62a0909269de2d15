"""Live tails of partitions (event streams): each chunk read and encoded once for all its
subscribers, subscribers woken by the partition's publish.

A thousand subscribers of one partition sit at the same position with the same formats: when a
record arrives, the first of them to wake reads it and encodes it as events; the others take
the same bytes (Tails.chunk: the encoding in flight is shared, then kept for a while). A chunk
covers offsets [position, next_offset) as they were when it was read, and records never change
once written, so a chunk stays right for whoever asks for that position later; it only stops
being wanted, and the few latest per partition are kept (CHUNKS_KEPT). A chunk that covers
offsets recovery dropped starts with a `dropped` event per range (engine/dropped.py).

Writing (Fanout). A subscriber that has caught up with the partition's end is parked: its
coroutine sleeps until it is handed back, and one pusher per partition and format waits for the
next chunk and writes it, HTTP/1.1 chunk framing built once, straight to every parked
subscriber's transport. Per subscriber and record that is a transport.write, not a task's
wake-up, a look-up and a trip through the ASGI send (on 2 cores, 500 subscribers per shard, the
wake-ups held each record's fan-out for ~8 ms). A subscriber goes back to its own coroutine
(which then sends through the ASGI send, waiting for the client as it must) when its transport
holds more than PARKED_BUFFER_BYTES unsent, when a read fails, and when the partition closes or
shutdown begins; a quota'd principal's stream is never parked (each of its chunks may have to
wait out a throttle). Only this server's HTTP protocol puts the transport in the scope
(app/server.py); elsewhere every stream keeps its coroutine.

Waiting (Tails.wait) is on the partition's data event, which its publish sets (in a shard
family, the owner's note does), so a subscriber costs nothing between records. No timer per
subscriber: one ticker per process wakes the tailed partitions' waiters every TICK_S, for the
streams' keep-alives and to look again at a followed partition whose note a reconnecting
channel lost.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter

from engine.interface import Partition

from . import records

TICK_S = 1.0
CHUNKS_KEPT = 8
PARKED_BUFFER_BYTES = 256 * 1024
TRANSPORT_SCOPE_KEY = "eventlog.transport"


class Chunk:
    __slots__ = ("events", "next_offset", "records", "bytes_read")

    def __init__(self, events: bytes, next_offset: int, records: int, bytes_read: int) -> None:
        self.events = events
        self.next_offset = next_offset
        self.records = records
        self.bytes_read = bytes_read


class Tails:
    def __init__(self) -> None:
        self._chunks: weakref.WeakKeyDictionary[Partition, dict[tuple[int, str, str], asyncio.Future[Chunk | None]]] = (
            weakref.WeakKeyDictionary()
        )
        self._tailed: dict[Partition, int] = {}
        self._ticker: asyncio.TimerHandle | None = None
        self._ticker_loop: asyncio.AbstractEventLoop | None = None
        self.reads = 0  # chunks read and encoded (a figure for tests and benchmarks)

    async def chunk(self, log: Partition, position: int, kf: str, vf: str) -> Chunk:
        """The events for the records from `position` (up to SSE_CHUNK_RECORDS/_BYTES), in
        formats kf/vf; raises what the read raises (OffsetOutOfRangeError, CorruptDataError, ...)."""
        cache = self._chunks.get(log)
        if cache is None:
            cache = self._chunks[log] = {}
        key = (position, kf, vf)
        while True:
            future = cache.get(key)
            if future is None:
                break
            chunk = await asyncio.shield(future)
            if chunk is not None:
                return chunk
            # the reader was cancelled (its client left) before it finished: read it ourselves
        future = cache[key] = asyncio.get_running_loop().create_future()
        while len(cache) > CHUNKS_KEPT:
            del cache[next(iter(cache))]
        try:
            result = await log.read_records(position, records.SSE_CHUNK_RECORDS, records.SSE_CHUNK_BYTES)
            events = await records._records_answer(records._sse_events, result, kf, vf)
            if log.dropped_offsets:  # a `dropped` event ahead of the records, per range the chunk covers
                dropped = log.dropped_in(position, result.next_offset - 1)
                if dropped:
                    events = records.dropped_events(dropped) + events
        except BaseException as exc:
            if cache.get(key) is future:
                del cache[key]
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # the others see it when they ask; never "not retrieved"
            else:
                future.set_result(None)
            raise
        self.reads += 1
        chunk = Chunk(events, max(result.next_offset, position), len(result.records), result.bytes_read)
        future.set_result(chunk)
        return chunk

    async def wait(self, log: Partition, position: int, counted: bool = True) -> bool:
        """Wait for records at `position` (True), or for the next tick or the log's close or
        shutdown (False: look at the log again; send a keep-alive if it is time). `counted`:
        the wait shows in the log's waiters (the pusher's does not: its parked subscribers
        do, and keep it woken)."""
        if log.high_watermark > position:
            return True
        log.check_open()
        tailed = self._tailed
        tailed[log] = tailed.get(log, 0) + 1
        self._start_ticker()
        log.waiters += counted
        try:
            await log.data_event().wait()
        finally:
            log.waiters -= counted
            left = tailed[log] - 1
            if left:
                tailed[log] = left
            else:
                del tailed[log]
        return log.high_watermark > position

    def _start_ticker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._ticker is not None and self._ticker_loop is loop:
            return
        self._ticker_loop = loop
        self._ticker = loop.call_later(TICK_S, self._tick)

    def _tick(self) -> None:
        self._ticker = None
        for log in list(self._tailed):
            log.wake_waiters()
        if self._tailed:
            self._start_ticker()


class Parked:
    """A subscriber handed to the pusher; `wake` is done when it is handed back."""

    __slots__ = ("transport", "position", "sent", "last_sent", "wake")

    def __init__(self, transport: Any, position: int, last_sent: float) -> None:
        self.transport = transport
        self.position = position
        self.sent = 0  # bytes the pusher wrote for it
        self.last_sent = last_sent
        self.wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class Fanout:
    """Parked subscribers per (partition, key format, value format), and their pushers."""

    def __init__(self, tails: Tails) -> None:
        self.tails = tails
        self._parked: dict[tuple[Partition, str, str], list[Parked]] = {}
        self._pushers: set[asyncio.Future[None]] = set()
        self.pushed = 0  # chunks written to parked subscribers (a figure for tests)

    async def park(
        self, log: Partition, kf: str, vf: str, sub: Parked, fetched: Counter, keepalive_s: float, stopping: Callable[[], bool],
    ) -> None:
        """Hand the subscriber `sub` to the pusher until it is handed back; `sub` then says where
        it is (position, bytes written, time of the last write). Cancelled with it when its
        client leaves."""
        wake = sub.wake
        key = (log, kf, vf)
        subs = self._parked.get(key)
        if subs is None:
            subs = self._parked[key] = [sub]
            pusher = asyncio.ensure_future(self._push(key, subs, fetched, keepalive_s, stopping))
            self._pushers.add(pusher)
            pusher.add_done_callback(self._pushers.discard)
        else:
            subs.append(sub)
        log.waiters += 1  # the parked subscriber waits for records (the gauge shows it)
        try:
            await wake
        finally:
            log.waiters -= 1
            if not wake.done():  # cancelled: the client left
                wake.cancel()
                try:
                    subs.remove(sub)
                except ValueError:
                    pass
                if not subs:  # the pusher may be waiting, uncounted: let it end
                    log.wake_waiters(force=True)

    async def _push(
        self, key: tuple[Partition, str, str], subs: list[Parked], fetched: Counter, keepalive_s: float, stopping: Callable[[], bool],
    ) -> None:
        log, kf, vf = key
        tails = self.tails
        loop = asyncio.get_running_loop()
        try:
            while subs:
                if stopping() or log.waiting_stopped or log.closed:
                    break
                position = min(sub.position for sub in subs)
                try:
                    has_data = await tails.wait(log, position, counted=False)
                except Exception:  # the log closed meanwhile: each subscriber says so itself
                    break
                if not has_data:
                    now = loop.time()
                    for sub in list(subs):
                        if now - sub.last_sent >= keepalive_s:
                            self._write(subs, sub, _KEEPALIVE, len(b": keepalive\n\n"), sub.position, now)
                    continue
                positions = sorted({sub.position for sub in subs})
                for at in positions:
                    try:
                        chunk = await tails.chunk(log, at, kf, vf)
                    except Exception:
                        _hand_back([sub for sub in subs if sub.position == at], subs)  # each reads and reports it itself
                        continue
                    now = loop.time()
                    readers = [sub for sub in subs if sub.position == at]
                    framed = _framed(chunk.events)  # one HTTP/1.1 chunk, built once for all of them
                    for sub in readers:
                        self._write(subs, sub, framed, len(chunk.events), chunk.next_offset, now)
                    self.pushed += 1
                    fetched.inc(chunk.records * len(readers))
        finally:
            _hand_back(list(subs), subs)
            if self._parked.get(key) is subs:
                del self._parked[key]

    @staticmethod
    def _write(subs: list[Parked], sub: Parked, framed: bytes | None, size: int, next_offset: int, now: float) -> None:
        """Write `framed` (an HTTP/1.1 chunk of `size` bytes of events; None: nothing to show,
        e.g. only control batches) to a parked subscriber, or hand it back."""
        transport = sub.transport
        if framed is None:
            sub.position = next_offset
            return
        if sub.wake.done() or transport.is_closing():
            _hand_back([sub], subs)
            return
        if transport.get_write_buffer_size() > PARKED_BUFFER_BYTES:
            _hand_back([sub], subs)  # a slow reader: its own coroutine waits for it
            return
        transport.write(framed)
        sub.sent += size
        sub.position = next_offset
        sub.last_sent = now


def _framed(events: bytes) -> bytes | None:
    return b"%x\r\n%s\r\n" % (len(events), events) if events else None


_KEEPALIVE = _framed(b": keepalive\n\n")


def _hand_back(which: list[Parked], subs: list[Parked]) -> None:
    for sub in which:
        try:
            subs.remove(sub)
        except ValueError:
            pass
        if not sub.wake.done():
            sub.wake.set_result(None)


TAILS = Tails()
FANOUT = Fanout(TAILS)
