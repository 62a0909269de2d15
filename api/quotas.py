"""Client quotas, as Kafka's: a produce and a fetch byte rate per principal.

Usage is measured as Kafka's client quotas measure it: bytes are recorded into a window of
`window_num` samples, each `window_size_ms` long; the rate is the window's bytes over its
elapsed time (never taken over less than window_num - 1 samples, so one burst after a quiet
spell is not divided by a few milliseconds). A principal whose rate is above its quota has
its next requests of that kind refused with 429 `quota_exceeded` and `Retry-After`, the time
it must stay quiet for the rate to fall back to the quota:

    throttle_ms = (rate - quota) / quota * window_ms

What is counted (by the request policy, api/policy.py, for the routes request_kind names at
registration, the hot lane's included):

    produce   request body bytes of POST .../records (the produce operations, per-key appends too)
    fetch     response body bytes of GET .../partitions/{p}/records and .../records/stream, and
              of the per-key reads and streams (GET .../keys/{key}/records[/stream])

A refused request is answered before its body is read or the route runs, so it changes
nothing, and its bytes are not counted. An event stream already open is not cut off when its
principal goes over the fetch quota: its next chunk waits out the throttle time instead, as
Kafka delays a throttled fetch response. The principal is the token's name (with an auth
file) or "anonymous", which every client shares without one. One QuotaManager per app; it
runs on the event loop only. In a shard family each shard passes what it records to the
others (a note per event-loop round), so a principal's rate is the family's, whichever shards
its connections reach; a shard sees the others' bytes a moment late.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .auth import Principal
from .errors import ApiError

PRODUCE = "produce"
FETCH = "fetch"
KINDS = (PRODUCE, FETCH)

_PRODUCE_PATH = re.compile(r"^/v1/topics/[^/]+/(?:partitions/[^/]+/|keys/.*/)?records$")
# (and a topic's records, every partition merged: api/browse.py)
_FETCH_PATH = re.compile(
    r"^/v1/topics/[^/]+/(?:(?:partitions/[^/]+|keys/.*)/)?records(?:/stream)?$"
    r"|^/v1/topics/[^/]+/partitions/[^/]+/records/batches$"  # raw batches (fetchRecordBatches)
)
# a queue's lease (api/queues.py): its records count as fetched
_LEASE_PATH = re.compile(r"^/v1/topics/[^/]+/queues/[^/]+/lease$")


def request_kind(method: str, path: str) -> str | None:
    """PRODUCE, FETCH, or None for requests no quota applies to."""
    if method == "POST" and _PRODUCE_PATH.match(path):
        return PRODUCE
    if method == "GET" and _FETCH_PATH.match(path):
        return FETCH
    if method == "POST" and _LEASE_PATH.match(path):
        return FETCH
    return None


class Rate:
    """Bytes over a window of `num` samples of `size_ms` each (Kafka's SampledStat + Rate).

    record() and throttle_ms() take the current time in ms; samples older than the window are
    dropped as time passes. An empty window has rate 0.
    """

    def __init__(self, num: int, size_ms: int) -> None:
        self.num = num
        self.size_ms = size_ms
        self._samples: deque[list[float]] = deque()  # [start_ms, bytes], oldest first

    def _expire(self, now_ms: float) -> None:
        horizon = now_ms - self.num * self.size_ms  # as Kafka: a sample lasts num * size_ms from its start
        while self._samples and self._samples[0][0] <= horizon:
            self._samples.popleft()

    def record(self, now_ms: float, n: int) -> None:
        self._expire(now_ms)
        if self._samples and now_ms < self._samples[-1][0] + self.size_ms:
            self._samples[-1][1] += n
        else:
            self._samples.append([now_ms, n])

    def _window(self, now_ms: float) -> tuple[float, float]:
        """(bytes, elapsed ms) of the window; elapsed is at least num - 1 whole samples."""
        self._expire(now_ms)
        total = sum(s[1] for s in self._samples)
        elapsed = now_ms - self._samples[0][0] if self._samples else 0.0
        return total, max(elapsed, (self.num - 1) * self.size_ms, 1.0)

    def rate(self, now_ms: float) -> float:
        """Bytes per second."""
        total, elapsed = self._window(now_ms)
        return total * 1000 / elapsed

    def throttle_ms(self, now_ms: float, quota: float) -> float:
        """How long to stay quiet until the rate is back at `quota` bytes/s; 0 when within it."""
        total, elapsed = self._window(now_ms)
        rate = total * 1000 / elapsed
        if rate <= quota:
            return 0.0
        # never longer than the window: by then every sample recorded so far has expired
        return min((rate - quota) / quota * elapsed, self.num * self.size_ms)


@dataclass(frozen=True)
class QuotaConfig:
    produce_bytes_per_sec: int | None = None
    fetch_bytes_per_sec: int | None = None
    window_num: int = 11
    window_size_ms: int = 1000


class QuotaManager:
    """Rates per (principal name, kind); the quota of a principal is its own override (auth
    file) or the server's default; None means unlimited."""

    def __init__(self, config: QuotaConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._rates: dict[tuple[str, str], Rate] = {}
        # in a shard family: told of every recording, to pass on to the other shards, whose
        # recordings come back through record_remote (so each shard sees the family's rate)
        self.on_record: Callable[[str, str, int], None] | None = None

    def quota(self, principal: Principal, kind: str) -> int | None:
        own = principal.produce_bytes_per_sec if kind == PRODUCE else principal.fetch_bytes_per_sec
        if own is not None:
            return own
        return self.config.produce_bytes_per_sec if kind == PRODUCE else self.config.fetch_bytes_per_sec

    def _rate(self, principal: Principal, kind: str) -> Rate:
        key = (principal.name, kind)
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = Rate(self.config.window_num, self.config.window_size_ms)
        return rate

    def _now_ms(self) -> float:
        return self._clock() * 1000

    def record(self, principal: Principal, kind: str, n: int) -> None:
        if n and self.quota(principal, kind) is not None:
            self._rate(principal, kind).record(self._now_ms(), n)
            if self.on_record is not None:
                self.on_record(principal.name, kind, n)

    def record_remote(self, name: str, kind: str, n: int) -> None:
        """Bytes another shard of the family recorded for principal `name`."""
        key = (name, kind)
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = Rate(self.config.window_num, self.config.window_size_ms)
        rate.record(self._now_ms(), n)

    def throttle_ms(self, principal: Principal, kind: str) -> float:
        quota = self.quota(principal, kind)
        if quota is None:
            return 0.0
        return self._rate(principal, kind).throttle_ms(self._now_ms(), quota)


def retry_after_s(throttle_ms: float) -> int:
    """Whole seconds for Retry-After, at least 1."""
    return max(1, math.ceil(throttle_ms / 1000))


def over_quota(quotas: QuotaManager, principal: Principal, kind: str, throttle: float) -> ApiError:
    """The 429 for a request refused over its quota, `throttle` ms before it may go on."""
    quota = quotas.quota(principal, kind)
    seconds = retry_after_s(throttle)
    return ApiError(
        429, "quota_exceeded",
        f"{principal.name!r} is over its {kind} quota of {quota} bytes/s; retry in {seconds} s",
        headers={"Retry-After": str(seconds)},
        throttle_time_ms=math.ceil(throttle), quota_bytes_per_sec=quota, kind=kind,
    )
