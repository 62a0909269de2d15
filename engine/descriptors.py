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
worker process, transient opens): a quarter of the limit, at least 256. Topic changes that would
give the server more partitions than the budget keeps open at once (3 descriptors each) are
refused up front (log_manager.py).

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
MIN_RESERVE = 256
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


def budget_for(limit: int) -> int:
    """Descriptors the engine may keep open under an open-files limit of `limit`."""
    return max(limit - max(MIN_RESERVE, limit // 4), DESCRIPTORS_PER_PARTITION)


class DescriptorBudget:
    def __init__(self, limit: int) -> None:
        self._lock = threading.Lock()
        self.limit = limit
        self.budget = budget_for(limit)
        self.open = 0  # FileHandles currently open
        self.evictions = 0
        self._owners: OrderedDict[int, weakref.ref] = OrderedDict()  # least recently used first

    def configure(self, limit: int) -> None:
        with self._lock:
            self.limit = limit
            self.budget = budget_for(limit)

    @property
    def max_partitions(self) -> int:
        """Partitions whose active segments fit the budget at once."""
        return self.budget // DESCRIPTORS_PER_PARTITION

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
