"""Queues in a shard family: each queue's window of a partition lives on the partition's owner
shard (engine/queues.py, persisted in that shard's partition of __queue_state); this is the
queue interface of one shard, which answers for the whole topic by asking the other owners
over the channel (engine/shards.py), as ShardFamily does for topics.

- Definitions are metadata (queue_created, queue_deleted in __metadata-0): every shard knows
  every queue. Create and delete run on shard 0, which writes the event; it answers once every
  shard has applied it (ShardFamily.sync), and each shard then makes or forgets its windows
  (Queues.sync_definitions). A list answers from this shard's own knowledge.
- Lease: this shard's own partitions first (no hop), then, for what is still wanted, the other
  owners of the topic's partitions, concurrently, each asked for a share of what is left (never
  more in all: a record leased and not answered would count a delivery no worker saw), and
  once more, one by one, those that filled their share. What any owner leased is answered
  even when another failed; the call fails (503) only when no owner answered (this shard's
  partitions, if it owns some, answer too: an empty answer is one). A long-poll waits on the
  partitions' appends (owned or followed), on this shard's records coming back, and on
  "queue_back" notes: an owner asked for records and having none remembers the asking shard
  until the wait ends, and tells it when records come back to the queue (an expiry, a
  release, a key's next record; Queue.touched). A lost note costs at most WAIT_SLICE_S: the
  wait asks the owners again then.
- Settle: the leases name their partitions: grouped by owner, this shard's settled here, one
  call per other owner, concurrently; the statuses in the order given. An owner that is down:
  its leases are not settled and the call fails (503) after the others are durable (a retry
  answers `expired` for those already settled: nothing is acknowledged twice).
- Dead letters: the owner appends them to the dead-letter topic's partition, through the
  family's forwarded produce when another shard owns it (queues.py).
- Describe: fanned out to the owners and merged by partition; a partition whose owner does not
  answer is `offline` (its figures 0). Metrics: each shard reports its own partitions' figures,
  summed over the family by api/metrics_merge.py (the oldest unacknowledged age: the largest).

A shard that dies takes its partitions' windows with it until it is back (its state is
replayed at its restart); the other owners' partitions go on.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio

from .errors import EngineError, LogClosedError, ShardUnavailableError
from .queues import (
    LOCK_MS_RANGE,
    MAX_LEASE_RECORDS,
    MAX_WAIT_MS,
    LeasedRecord,
    LeaseId,
    Queue,
    QueueInfo,
    Queues,
    QueueSettings,
    _in_range,
)
from .shards import owner_of

if TYPE_CHECKING:
    from .family import ShardFamily

logger = logging.getLogger(__name__)

# what one shard may ask of another's queues ("queues" calls)
QUEUE_CALLS = frozenset({"create", "delete", "describe", "lease", "settle"})
# a long-poll asks the other owners again at least this often (a "queue_back" note lost)
WAIT_SLICE_S = 1.0
# the figures of a partition whose owner did not answer
OFFLINE_FIGURES = {
    "start_offset": 0, "end_offset": 0, "available": 0, "leased": 0, "acked": 0,
    "dead_lettered": 0, "lag": 0, "redeliveries": 0, "lost_to_retention": 0,
    "oldest_unacked_age_ms": 0,
}
# an owner that cannot answer for its partitions now (down, silent, starting again)
_UNANSWERED = (ShardUnavailableError, LogClosedError)


class ShardQueues:
    """The queues as one shard of a family serves them (see the module's doc): `local` holds
    the windows of the partitions this shard owns."""

    def __init__(self, family: ShardFamily, local: Queues) -> None:
        self.local = local
        self.manager = family.manager
        self.channel = family.channel
        self.me = family.manager.shard_index
        self.count = family.manager.shard_count
        self._turn = 0
        local.on_back = self._send_back
        for q in local._queues.values():
            q.on_back = self._send_back

    # -- the channel: what other shards ask of this one ------------------------------------

    async def on_call(self, what: str, args: tuple, kwargs: dict) -> Any:
        """A queue call another shard makes of this one's windows (or, create and delete, of
        shard 0)."""
        if what == "lease":
            watcher, wait_s = kwargs.pop("watcher", None), kwargs.pop("wait_s", 0.0)
            got = await self.local.lease(*args, **kwargs)
            if not got and watcher is not None:
                q = self.local._queue(args[0], args[1])
                q.watchers[watcher] = anyio.current_time() + wait_s
            return got
        if what == "create":
            _info, created = await self.local.create(*args, **kwargs)
            return created
        result = getattr(self.local, what)(*args, **kwargs)
        return await result if what in ("delete", "settle") else result

    def on_back_note(self, qids: list[bytes]) -> None:
        """Records came back to a queue on another shard: this shard's long-polls look again."""
        for qid in qids:
            q = self.local._by_id.get(qid)
            if q is not None:
                q.wake_local()

    def _send_back(self, q: Queue) -> None:
        now = anyio.current_time()
        shards = [shard for shard, until in q.watchers.items() if until >= now]
        q.watchers.clear()
        for shard in shards:
            self.channel.note(shard, "queue_back", [q.qid])

    async def _call(self, shard: int, what: str, *args: Any, **kwargs: Any) -> Any:
        return await self.channel.call(shard, "queues", what, args, kwargs)

    def _owners(self, topic: str) -> dict[int, list[int]]:
        """The other shards owning partitions of `topic`: shard -> its partitions."""
        owners: dict[int, list[int]] = {}
        for p in range(len(self.manager.topic(topic).partitions)):
            shard = owner_of(topic, p, self.count)
            if shard != self.me:
                owners.setdefault(shard, []).append(p)
        return owners

    # -- definitions --------------------------------------------------------------------------

    async def create(
        self, topic: str, name: str, settings: QueueSettings
    ) -> tuple[QueueInfo, bool]:
        if self.manager.is_controller:
            _info, created = await self.local.create(topic, name, settings)
        else:
            created = await self._call(0, "create", topic, name, settings)
        return await self.describe(topic, name), bool(created)

    async def delete(self, topic: str, name: str) -> None:
        if self.manager.is_controller:
            await self.local.delete(topic, name)
        else:
            self.local._queue(topic, name)  # (404 here, as on shard 0)
            await self._call(0, "delete", topic, name)

    async def forget_topic(self, topic: str) -> int:
        return await self.local.forget_topic(topic)

    async def sync_definitions(self) -> None:
        await self.local.sync_definitions()
        for q in self.local._queues.values():
            q.on_back = self._send_back

    def names(self, topic: str) -> list[str]:
        return self.local.names(topic)

    def figures(self) -> list[tuple[str, str, dict[str, int]]]:
        """This shard's partitions' figures (the family's metrics sum the shards')."""
        return self.local.figures()

    async def describe(self, topic: str, name: str) -> QueueInfo:
        info = self.local.describe(topic, name)
        parts = {part["partition"]: part for part in info.partitions}

        async def ask(shard: int, partitions: list[int]) -> None:
            try:
                other = await self._call(shard, "describe", topic, name)
            except (*_UNANSWERED, EngineError) as exc:
                logger.debug("queue %s/%s: shard %d did not describe: %s", topic, name, shard, exc)
                for p in partitions:
                    parts[p] = {"partition": p, **OFFLINE_FIGURES, "offline": True}
                return
            for part in other.partitions:
                if part["partition"] in partitions:
                    parts[part["partition"]] = part

        async with anyio.create_task_group() as tg:
            for shard, partitions in self._owners(topic).items():
                tg.start_soon(ask, shard, partitions)
        return replace(info, partitions=tuple(parts[p] for p in sorted(parts)))

    # -- leasing ----------------------------------------------------------------------------

    async def lease(
        self, topic: str, name: str, max_records: int, lock_ms: int | None = None,
        wait_ms: int = 0,
    ) -> list[LeasedRecord]:
        _in_range("max_records", max_records, 1, MAX_LEASE_RECORDS)
        _in_range("wait_ms", wait_ms, 0, MAX_WAIT_MS)
        q = self.local._queue(topic, name)
        _in_range("lock_ms", q.settings.lock_ms if lock_ms is None else lock_ms, *LOCK_MS_RANGE)
        deadline = anyio.current_time() + wait_ms / 1000
        while True:
            left_s = deadline - anyio.current_time()
            got = await self._lease_once(topic, name, max_records, lock_ms, left_s)
            left_s = deadline - anyio.current_time()
            if got or left_s <= 0 or self.manager.stopping:
                return got
            await self.local._wait(q, min(left_s, WAIT_SLICE_S))
            q = self.local._queue(topic, name)  # (deleted meanwhile: 404)

    async def _lease_once(
        self, topic: str, name: str, n: int, lock_ms: int | None, wait_s: float
    ) -> list[LeasedRecord]:
        """This shard's partitions, then the other owners' (see the module's doc)."""
        got: list[LeasedRecord] = []
        errors: list[BaseException] = []
        answered = 0  # owners that answered (an empty answer is one)
        owners = list(self._owners(topic))
        if len(owners) < len(self.manager.topic(topic).partitions):  # (this shard owns some)
            try:  # (the call's checks passed: what fails here is a partition's lease)
                got += await self.local.lease(topic, name, n, lock_ms, 0)
                answered += 1
            except Exception as exc:
                errors.append(exc)
        if len(got) >= n or not owners:
            return self._answer(got, errors, answered)
        self._turn = (self._turn + 1) % len(owners)
        owners = owners[self._turn:] + owners[: self._turn]
        full: list[int] = []

        async def ask(shard: int, share: int) -> None:
            nonlocal answered
            try:
                records = await self._call(
                    shard, "lease", topic, name, share, lock_ms, 0,
                    watcher=self.me if wait_s > 0 else None, wait_s=wait_s,
                )
            except (*_UNANSWERED, EngineError) as exc:
                errors.append(exc)
                return
            answered += 1
            got.extend(records)
            if len(records) >= share:
                full.append(shard)

        left = n - len(got)
        async with anyio.create_task_group() as tg:
            for i, shard in enumerate(owners):
                share = left // len(owners) + (1 if i < left % len(owners) else 0)
                if share:
                    tg.start_soon(ask, shard, share)
        for shard in full:  # (those that had as much as asked may have more)
            if len(got) >= n:
                break
            await ask(shard, n - len(got))
        return self._answer(got, errors, answered)

    @staticmethod
    def _answer(
        got: list[LeasedRecord], errors: list[BaseException], answered: int
    ) -> list[LeasedRecord]:
        """What was leased; an owner's failure only when no owner answered (an empty answer
        is one: the partitions of the owners that are up had nothing)."""
        if got or answered or not errors:
            return got
        raise errors[0]

    # -- settling ---------------------------------------------------------------------------

    async def settle(
        self, topic: str, name: str, action: str, leases: Any, *, delay_ms: int = 0,
        lock_ms: int | None = None,
    ) -> list[tuple[str, str]]:
        q = self.local._queue(topic, name)
        partitions = len(self.manager.topic(topic).partitions)
        by_owner: dict[int, list[int]] = {self.me: []}  # (here always: the call's checks)
        leases = list(leases)
        for i, text in enumerate(leases):
            lease = LeaseId.decode(text)
            shard = self.me
            if lease is not None and lease.qid == q.qid and 0 <= lease.partition < partitions:
                shard = owner_of(topic, lease.partition, self.count)
            by_owner.setdefault(shard, []).append(i)
        results: list[tuple[str, str] | None] = [None] * len(leases)
        errors: list[BaseException] = []
        kwargs = {"delay_ms": delay_ms, "lock_ms": lock_ms}

        async def run(shard: int, indices: list[int]) -> None:
            given = [leases[i] for i in indices]
            try:
                if shard == self.me:
                    answer = await self.local.settle(topic, name, action, given, **kwargs)
                else:
                    answer = await self._call(shard, "settle", topic, name, action, given,
                                              **kwargs)
            except Exception as exc:  # (the others go on: their changes are durable first)
                errors.append(exc)
                return
            for i, result in zip(indices, answer, strict=True):
                results[i] = result

        async with anyio.create_task_group() as tg:
            for shard, indices in by_owner.items():
                tg.start_soon(run, shard, indices)
        if errors:
            raise errors[0]
        return [r for r in results if r is not None]
