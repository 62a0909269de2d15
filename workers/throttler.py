"""An I/O rate limit for the log cleaner: Kafka's `log.cleaner.io.max.bytes.per.second`.

A compaction pass reports every byte it reads and writes (`Throttler.maybe_throttle(n)`); the
throttler keeps one window: the bytes reported since the window opened and when it opened.
A window is checked when it has lasted `check_interval_s` (Kafka's cleaner: 300 ms), or as soon
as it holds more bytes than the rate allows in that interval, so a pass shorter than the
interval is limited too. At a check, the window's bytes need `bytes / rate` seconds; if less
time has passed, the throttler sleeps the difference (`sleep_needed_s`). Then a new window opens
at the current time, after the sleep.

Invariant: a checked window lasted (sleep included) at least its bytes / rate, so over a whole
pass, elapsed >= (bytes reported - bytes of the open window) / rate; the open window holds less
than one interval's allowance, or less than one interval's time.

An unlimited rate (`math.inf`, the default, as Kafka's Double.MaxValue) never reads the clock
and never sleeps. The clock and the sleep are injected: tests drive a fake clock.
One throttler per pass; it is not thread-safe.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

CHECK_INTERVAL_S = 0.3  # Kafka's Throttler checks every 300 ms


def sleep_needed_s(window_bytes: int, window_s: float, rate_bytes_per_s: float) -> float:
    """Seconds to sleep so that `window_bytes` over `window_s` (+ the sleep) keep to the rate:
    0.0 when the window was slow enough, or for an unlimited rate or an empty window."""
    if window_bytes <= 0 or math.isinf(rate_bytes_per_s):
        return 0.0
    return max(window_bytes / rate_bytes_per_s - window_s, 0.0)


class Throttler:
    def __init__(
        self,
        rate_bytes_per_s: float,
        *,
        check_interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if not rate_bytes_per_s > 0:  # also refuses NaN
            raise ValueError(f"rate_bytes_per_s must be > 0, not {rate_bytes_per_s!r}")
        if not check_interval_s > 0:
            raise ValueError(f"check_interval_s must be > 0, not {check_interval_s!r}")
        self.rate_bytes_per_s = rate_bytes_per_s
        self.check_interval_s = check_interval_s
        self.unlimited = math.isinf(rate_bytes_per_s)
        # bytes that close a window early: one interval's allowance
        self._window_limit = math.inf if self.unlimited else rate_bytes_per_s * check_interval_s
        self._clock = clock
        self._sleep = sleep
        self._window_start = 0.0 if self.unlimited else clock()
        self.window_bytes = 0
        self.total_bytes = 0  # every byte reported
        self.slept_s = 0.0  # every sleep, added up
        self.sleeps = 0

    def maybe_throttle(self, n: int) -> float:
        """Report `n` more bytes read or written; sleeps if the rate is exceeded. Returns the
        seconds slept by this call (0.0 nearly always)."""
        self.total_bytes += n
        if self.unlimited:
            return 0.0
        self.window_bytes += n
        now = self._clock()
        elapsed = now - self._window_start
        if elapsed < self.check_interval_s and self.window_bytes < self._window_limit:
            return 0.0
        delay = sleep_needed_s(self.window_bytes, elapsed, self.rate_bytes_per_s)
        if delay > 0:
            self._sleep(delay)
            self.slept_s += delay
            self.sleeps += 1
            now = self._clock()
        self._window_start = now
        self.window_bytes = 0
        return delay
