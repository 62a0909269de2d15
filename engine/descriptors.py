"""The engine's file descriptors: a budget under the process's open-files limit, kept by
closing the least recently used segments' descriptors.

Every descriptor the engine keeps open beyond one call (a segment's .log, an active segment's
two index files) is a FileHandle (fileutil.py), counted here while it is open. A segment that
opens handles registers as an owner and is touched on each use; when opening one more would
pass the budget, the least recently used owners are asked to let go of theirs
(LogSegment.release_descriptors()). A handle closes when its last holder drops it, so a read or
a group commit in flight keeps its descriptor, and the owner opens a new one on its next use:
an eviction costs a reopen, never data. Segments open nothing until they are used, so a server
starts with any number of partitions whatever its limit (as Kafka opens indexes lazily).

Budget: the soft RLIMIT_NOFILE, which open_engine() first raises to the hard limit, minus a
reserve for descriptors that are not the engine's (client connections, pipes, the cleaner's
worker process, transient opens, the process's own ~20): a quarter of the limit, at least 64 and
at most 16,384 (256 -> 192 for the engine, 1024 -> 768, 65,536 -> 49,152).

What a partition truly needs. An idle partition holds nothing, and one in use holds up to three
(an active segment's .log, .index and .timeindex) that the budget takes back once it is idle,
unflushed writes or not (issue 28): an active .log with writes not yet fsynced gives its
descriptor back too, and its flush opens the file again and fdatasyncs that descriptor, which
covers every dirty page of the file and reports a write-back error nobody has seen yet
(segment.py says why that is exact on Linux, and the kernel's one caveat). Until issue 28 that
descriptor stayed pinned until the fsync, so a process served one partition per descriptor of
its budget (14,997 under a limit of 20,000, so 50,000 partitions needed four processes). Now
only what is in flight pins descriptors (a write, an fsync, a read: bounded by the worker
threads, not by the partitions), so the open-files limit no longer caps the partitions: a
process serves any number once its budget holds one append's three (max_partitions_for), and
partitions past budget / 3 written at once take turns through the least recently used owners.
EVENTLOG_MAX_PARTITIONS is the cap (memory: about 18 KiB a partition). Under a limit whose
budget cannot hold one append (the reserve takes it all: a limit below 67) user topics are
refused up front (log_manager.py); internal topics never are.

Thread-safe: owners are touched from the event loop, writer threads and reader threads.
"""

from __future__ import annotations

import itertools
import logging
import resource
import threading
import weakref
from collections import OrderedDict
from typing import Protocol

logger = logging.getLogger("eventlog.engine")

DESCRIPTORS_PER_PARTITION = 3  # an active segment's .log, .index and .timeindex
# max_partitions_for when the budget holds an append: descriptors no longer limit the partitions
ANY_NUMBER = 1 << 62
MIN_RESERVE = 64
MAX_RESERVE = 16_384
# A hard limit of "unlimited" is not a number setrlimit takes for RLIMIT_NOFILE on Linux
# (fs.nr_open caps it, 1,048,576 by default): ask for that much at most.
UNLIMITED_CAP = 1 << 20


class Owner(Protocol):
    def release_descriptors(self) -> bool:
        """Drop the owner's handles unless it is busy; True if it did."""


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as far as the kernel allows); returns
    the soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_CAP if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        for wanted in (target, UNLIMITED_CAP):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, target), hard))
                break
            except (ValueError, OSError):
                continue
    return open_files_limit()


def open_files_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return UNLIMITED_CAP if soft == resource.RLIM_INFINITY else int(soft)


def reserve_for(limit: int) -> int:
    """Descriptors kept for what is not the engine's (connections above all): a quarter."""
    return min(max(limit // 4, MIN_RESERVE), MAX_RESERVE)


def budget_for(limit: int) -> int:
    """Descriptors the engine may keep open under an open-files limit of `limit`."""
    return max(limit - reserve_for(limit), DESCRIPTORS_PER_PARTITION)


def max_partitions_for(limit: int) -> int:
    """Partitions one process serves under an open-files limit of `limit`, whatever their
    configs: any number (ANY_NUMBER) once the budget holds one append's three descriptors (idle
    partitions hold none, unflushed or not), none below that."""
    return ANY_NUMBER if limit - reserve_for(limit) >= DESCRIPTORS_PER_PARTITION else 0


def limit_for(partitions: int) -> int:
    """The lowest open-files limit under which one process keeps `partitions` active at once
    (three descriptors each, none taking turns): what to raise a limit to. It serves them
    under any limit from 67 on."""
    low, high = 1, DESCRIPTORS_PER_PARTITION * partitions + MAX_RESERVE + 1
    while low < high:
        mid = (low + high) // 2
        if mid - reserve_for(mid) >= DESCRIPTORS_PER_PARTITION * partitions:
            high = mid
        else:
            low = mid + 1
    return low


class DescriptorBudget:
    def __init__(self, limit: int) -> None:
        self._lock = threading.Lock()
        self.limit = limit
        self.reserve = reserve_for(limit)
        self.budget = budget_for(limit)
        self.open = 0  # FileHandles currently open
        self.evictions = 0
        self._owners: OrderedDict[int, weakref.ref] = OrderedDict()  # least recently used first

    def configure(self, limit: int) -> None:
        with self._lock:
            self.limit = limit
            self.reserve = reserve_for(limit)
            self.budget = budget_for(limit)

    @property
    def max_partitions(self) -> int:
        """Partitions this process serves (max_partitions_for): creates past it are refused."""
        return max_partitions_for(self.limit)

    @property
    def active_partitions(self) -> int:
        """Partitions whose active segments stay open at once; past it they take turns."""
        return self.budget // DESCRIPTORS_PER_PARTITION

    def describe(self) -> str:
        """The start-up line's account of the limit: what it serves and keeps open at once."""
        if self.max_partitions == 0:
            return (f"open-files limit {self.limit} (no user partitions: the reserve for "
                    f"connections takes it all; raise it to at least {limit_for(1)})")
        return (f"open-files limit {self.limit} (any number of partitions, "
                f"{self.active_partitions} active at once, the others taking turns)")

    def touch(self, owner: Owner) -> None:
        """`owner` holds (or is about to open) handles and was just used."""
        key = id(owner)
        with self._lock:
            ref = self._owners.get(key)
            if ref is not None and ref() is owner:
                self._owners.move_to_end(key)
            else:
                self._owners[key] = weakref.ref(owner)

    def forget(self, owner: Owner) -> None:
        """`owner` let go of its handles (closed, deleted)."""
        with self._lock:
            ref = self._owners.get(id(owner))
            if ref is not None and ref() is owner:
                del self._owners[id(owner)]

    def opening(self) -> None:
        """Called before a FileHandle opens: make room if the budget is spent."""
        if self.open >= self.budget:
            self.evict(self.open - self.budget + 1)

    def opened(self) -> None:
        with self._lock:
            self.open += 1

    def closed(self) -> None:
        with self._lock:
            self.open -= 1

    def evict(self, wanted: int) -> int:
        """Ask up to all owners, least recently used first, to let go of their handles until
        about `wanted` descriptors are freed (an owner's handles close once its in-flight
        reads and writes finish). Returns how many owners let go."""
        with self._lock:  # the least recently used few: owners that are busy are skipped
            candidates = list(itertools.islice(self._owners.items(), 4 * wanted + 16))
        released = 0
        freed_before = self.open
        for key, ref in candidates:
            if freed_before - self.open >= wanted:
                break
            owner = ref()
            if owner is None:
                self._drop(key, ref)
                continue
            if owner.release_descriptors():
                self._drop(key, ref)
                released += 1
        if released:
            self.evictions += released
            logger.debug("closed the descriptors of %d idle segment(s) (%d open, budget %d)", released, self.open, self.budget)
        return released

    def _drop(self, key: int, ref: weakref.ref) -> None:
        with self._lock:
            if self._owners.get(key) is ref:
                del self._owners[key]


# The engine's one budget (one engine per process); open_engine() configures it.
BUDGET = DescriptorBudget(open_files_limit())
