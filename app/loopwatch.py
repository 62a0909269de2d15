"""A watch on the event loop's responsiveness: a task that asks to wake every TICK_S and logs
how late it woke when that is more than the threshold ("event loop blocked for 1.2 s"), so a
blocking call on the loop (a synchronous fsync, a big parse inline) shows in the log, and the
test suite, which turns the watch on for every server it starts, fails on it
(tests/conftest.py).

It measures from outside the callbacks, so it works on uvloop (whose handles cannot be timed
from Python) and costs one wake-up per tick; it cannot name the callback that blocked (the
test suite's in-process check does: it times asyncio's handles). A late wake-up may also be the
whole process descheduled on a busy machine: the threshold is set well above such pauses.
"""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger("eventlog.loop")

TICK_S = 0.05
BLOCKED = "event loop blocked for"  # the start of the log line (tests look for it)


async def watch(threshold_s: float) -> None:
    """Log each wake-up later than `threshold_s`, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + TICK_S
        await asyncio.sleep(TICK_S)
        late = loop.time() - due
        if late > threshold_s:
            logger.warning("%s %.3f s (a wake-up due every %.2f s came late)", BLOCKED, late,
                           TICK_S)
