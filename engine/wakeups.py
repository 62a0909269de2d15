"""Paced wake-ups: thousands of waiters released a few at a time, so that no turn of the event
loop has to run them all.

An asyncio.Event wakes every waiter in one go: each gets a call in the loop's ready queue, and
the loop runs the whole queue before it looks at its sockets again. With 5,000 long-polls on one
partition, a publish (or their common deadline) put 5,000 requests' worth of work in one turn:
/healthz waited 0.4-0.9 s behind it (issue 23). Here they go through the loop's Pacer, which
resolves at most PER_TURN futures (or runs as many callbacks) per turn and then yields, so every
turn is bounded and other requests are answered between two batches. The total work is the
same; it is spread.

    PacedEvent   what a partition's data event is (log_reads.py): set(), is_set() and
                 wait(timeout) as asyncio.Event's, its waiters released through the pacer, and
                 a waiter's timeout (a timer of its own, no cancel scope) through the pacer as
                 well. Waiters are kept in a dict: one that leaves (cancelled, timed out) costs
                 O(1), not a scan of the others (asyncio.Event's deque.remove: O(waiters) per
                 leaver, O(waiters^2) when they all time out together).
    Pacer.call   a callback run in a coming turn, in the same order: the HTTP protocol
                 (app/server.py) leaves the heads of long-polls and event streams beyond its
                 share of a turn to the pacer, and the closes of connections whose clients left.

Futures and callbacks are taken in the order they were queued.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from typing import Any, Callable, Iterable

# futures resolved per loop turn: each wakes a task that may then answer a request (~50-100 us
# of work here), so a turn of released waiters stays within a few ms
PER_TURN = 64


class Pacer:
    """Resolves queued futures and runs queued callbacks, at most PER_TURN per turn of `loop`, in
    the order queued."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # (future, its value), or (None, a callback)
        self._queue: deque[tuple[asyncio.Future[Any] | None, Any]] = deque()
        self._scheduled = False
        self.turns = 0  # turns that released something (a figure for tests)

    def release(self, future: asyncio.Future[Any], value: Any) -> None:
        """Resolve `future` with `value` in a coming turn (unless it is done by then)."""
        self._queue.append((future, value))
        self._schedule()

    def release_all(self, futures: Iterable[asyncio.Future[Any]], value: Any) -> None:
        self._queue.extend((future, value) for future in futures)
        self._schedule()

    def call(self, callback: Callable[[], None]) -> None:
        """Call `callback()` in a coming turn."""
        self._queue.append((None, callback))
        self._schedule()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _schedule(self) -> None:
        if not self._scheduled and self._queue:
            self._scheduled = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        queue = self._queue
        left = PER_TURN
        try:
            while queue and left:
                future, value = queue.popleft()
                if future is None:
                    left -= 1
                    value()
                elif not future.done():  # a done one: cancelled meanwhile (its client left)
                    left -= 1
                    future.set_result(value)
        except Exception as exc:  # noqa: BLE001 -- a callback's error is reported, the rest still run
            self.loop.call_exception_handler({"message": "paced callback failed", "exception": exc})
        finally:
            self.turns += 1
            if queue:  # the rest in the next turn, after the loop has looked at its sockets
                self.loop.call_soon(self._run)
            else:
                self._scheduled = False


_pacers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pacer] = weakref.WeakKeyDictionary()


_last: Pacer | None = None  # the last one asked for: a process has one loop that serves


def pacer_for(loop: asyncio.AbstractEventLoop) -> Pacer:
    """The loop's pacer (one per event loop: in a shard family, one per shard)."""
    global _last
    pacer = _last
    if pacer is None or pacer.loop is not loop:
        pacer = _pacers.get(loop)
        if pacer is None:
            pacer = _pacers[loop] = Pacer(loop)
        _last = pacer
    return pacer


class PacedEvent:
    """A one-shot event (set once, never cleared: make a new one for the next wake-up) whose
    waiters are released through their loop's Pacer. Made without a running loop."""

    __slots__ = ("_value", "_waiters")

    def __init__(self) -> None:
        self._waiters: dict[asyncio.Future[bool], None] = {}
        self._value = False

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        if self._value:
            return
        self._value = True
        waiters = self._waiters
        if waiters:
            self._waiters = {}
            pacer_for(next(iter(waiters)).get_loop()).release_all(waiters, True)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def wait(self, timeout: float | None = None) -> bool:
        """True once set; False when `timeout` seconds pass first."""
        if self._value:
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._waiters[future] = None
        timer = None
        if timeout is not None:
            timer = loop.call_later(max(timeout, 0.0), self._expire, future)
        try:
            return await future
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.pop(future, None)

    def _expire(self, future: asyncio.Future[bool]) -> None:
        if self._waiters.pop(future, False) is None:  # still waiting (not released by set())
            pacer_for(future.get_loop()).release(future, False)
