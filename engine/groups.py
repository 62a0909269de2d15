"""Consumer-group offsets, stored as records in the compacted internal topic __consumer_offsets.

Record per committed (group, topic, partition):

    key   = JSON ["<group>", "<topic>", <partition>]          (compact, canonical)
    value = JSON {"offset": int, "metadata": str, "commit_timestamp": ms}
            or null (a tombstone: the offset was deleted, e.g. with its topic)

The latest record per key wins, which is exactly what compaction keeps. At start-up the log is
replayed into an index (group -> topic -> partition); a commit appends one batch holding all of its
offsets (durable before the call returns) and then updates the index, so readers see only
acknowledged commits.

Writes go through the partition's writer; reads are dictionary lookups: one group's offsets cost
its partitions, whatever the other groups hold, and the listing pages through the sorted group
names (a bisection, then the page). Safe from any task.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import anyio
import orjson

from .config import LogConfig
from .errors import InvalidRequestError
from .partition_log import PartitionLog, prepare_batches, wall_clock_ms
from .reader import read_records
from .records import encode_batch

CONSUMER_OFFSETS_CONFIG = LogConfig(cleanup_policy="compact", segment_bytes=100 * 1024 * 1024)
MAX_METADATA_CHARS = 4096  # Kafka's offset.metadata.max.bytes
MAX_GROUP_CHARS = 249
# records per batch when merging imported offsets: 200 records with the longest group, topic
# and metadata (249 + 249 + 4,096 characters) stay under the topic's max.message.bytes (1 MiB)
MERGE_BATCH_RECORDS = 200


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    group: str
    topic: str
    partition: int
    offset: int
    metadata: str
    commit_timestamp: int


def _key(group: str, topic: str, partition: int) -> bytes:
    return orjson.dumps([group, topic, partition])


def validate_group(group: str) -> None:
    if not group or len(group) > MAX_GROUP_CHARS or any(ord(c) < 32 for c in group):
        raise InvalidRequestError(f"invalid group id {group!r}: 1..{MAX_GROUP_CHARS} printable characters")


class GroupOffsets:
    """The committed offsets, indexed by group: one group's offsets are found without looking
    at another's, and the listing pages through the group names in order."""

    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        # group -> topic -> partition -> its committed offset
        self._groups: dict[str, dict[str, dict[int, CommittedOffset]]] = {}
        # topic -> the groups with an offset committed on it (a deleted topic's offsets)
        self._topics: dict[str, set[str]] = {}
        # the keys of _groups, sorted: a page of the listing begins with a bisection
        self._names: list[str] = []

    async def load(self) -> None:
        """Replay the log into memory (called once, before any request)."""

        def replay() -> None:
            view = self.log.view
            offset = view.log_start_offset
            while offset < view.high_watermark:
                result = read_records(view, offset, 10_000, 4 * 1024 * 1024)
                for record in result.records:
                    self._apply(record.key, record.value)
                if result.next_offset <= offset:
                    break
                offset = result.next_offset
            self._names = sorted(self._groups)

        await anyio.to_thread.run_sync(replay)

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        """One replayed record (the names are sorted once the replay is done)."""
        if key is None:
            return
        group, topic, partition = orjson.loads(key)
        if value is None:
            self._drop(group, topic, partition)
            return
        v = orjson.loads(value)
        metadata, timestamp = v.get("metadata", ""), v.get("commit_timestamp", 0)
        self._put(CommittedOffset(group, topic, partition, v["offset"], metadata, timestamp))

    def _put(self, c: CommittedOffset) -> bool:
        """Store one offset in the index; True when its group is new."""
        topics = self._groups.get(c.group)
        new = topics is None
        if topics is None:
            topics = self._groups[c.group] = {}
        partitions = topics.get(c.topic)
        if partitions is None:
            partitions = topics[c.topic] = {}
            self._topics.setdefault(c.topic, set()).add(c.group)
        partitions[c.partition] = c
        return new

    def _drop(self, group: str, topic: str, partition: int) -> bool:
        """Forget one offset; True when it was its group's last."""
        topics = self._groups.get(group)
        partitions = topics.get(topic) if topics is not None else None
        if topics is None or partitions is None or partitions.pop(partition, None) is None:
            return False
        if partitions:
            return False
        del topics[topic]
        holders = self._topics[topic]
        holders.discard(group)
        if not holders:
            del self._topics[topic]
        if topics:
            return False
        del self._groups[group]
        return True

    def _named(self, added: list[str], removed: list[str]) -> None:
        """Keep the sorted names in step with _groups: O(groups) memory moves at worst."""
        if len(added) == 1:
            bisect.insort(self._names, added[0])
        elif added:
            self._names.extend(added)
            self._names.sort()  # two sorted runs: one merge
        for group in removed:
            i = bisect.bisect_left(self._names, group)
            if i < len(self._names) and self._names[i] == group:
                del self._names[i]

    async def commit(
        self, group: str, offsets: Iterable[tuple[str, int, int, str]]
    ) -> list[CommittedOffset]:
        """Store (topic, partition, offset, metadata) for `group` as one durable batch."""
        validate_group(group)
        now = wall_clock_ms()
        items = []
        committed = []
        for topic, partition, offset, metadata in offsets:
            if len(metadata) > MAX_METADATA_CHARS:
                raise InvalidRequestError(f"metadata of {len(metadata)} characters; at most {MAX_METADATA_CHARS}")
            value = orjson.dumps({"offset": offset, "metadata": metadata, "commit_timestamp": now})
            items.append((_key(group, topic, partition), value, now, ()))
            committed.append(CommittedOffset(group, topic, partition, offset, metadata, now))
        if not items:
            return []
        await self._append(items)
        self._named([c.group for c in committed if self._put(c)], [])
        return committed

    async def merge(self, offsets: Iterable[CommittedOffset]) -> int:
        """Store offsets committed elsewhere (imported from Kafka) as they were: their
        metadata and commit timestamps kept; each replaces what is stored for its key. Durable
        before it returns, in batches of at most MERGE_BATCH_RECORDS. Returns how many."""
        items = []
        for c in offsets:
            validate_group(c.group)
            value = orjson.dumps({"offset": c.offset, "metadata": c.metadata, "commit_timestamp": c.commit_timestamp})
            items.append((c, (_key(c.group, c.topic, c.partition), value, c.commit_timestamp, ())))
        for i in range(0, len(items), MERGE_BATCH_RECORDS):
            chunk = items[i : i + MERGE_BATCH_RECORDS]
            await self._append([item for _c, item in chunk])
            self._named([c.group for c, _item in chunk if self._put(c)], [])
        return len(items)

    async def delete(self, group: str, topic: str | None = None) -> int:
        """Tombstone a group's offsets (all, or one topic's); returns how many were removed."""
        topics = self._groups.get(group, {})
        doomed = [
            (group, t, p)
            for t in (sorted(topics) if topic is None else [topic] if topic in topics else [])
            for p in sorted(topics[t])
        ]
        await self._tombstone(doomed)
        return len(doomed)

    async def delete_partitions(self, group: str, partitions: Iterable[tuple[str, int]]) -> int:
        """Tombstone a group's offsets of the given (topic, partition)s that it has (Kafka's
        OffsetDelete); returns how many were removed."""
        topics = self._groups.get(group, {})
        doomed = sorted({(group, t, p) for t, p in partitions if p in topics.get(t, ())})
        await self._tombstone(doomed)
        return len(doomed)

    async def forget_topic(self, topic: str) -> int:
        """Tombstone every group's offsets for a deleted topic (as Kafka does)."""
        holders = sorted(self._topics.get(topic, ()))
        doomed = [(g, topic, p) for g in holders for p in sorted(self._groups[g][topic])]
        await self._tombstone(doomed)
        return len(doomed)

    async def _tombstone(self, keys: list[tuple[str, str, int]]) -> None:
        if not keys:
            return
        now = wall_clock_ms()
        await self._append([(_key(*k), None, now, ()) for k in keys])
        self._named([], [k[0] for k in keys if self._drop(*k)])

    async def _append(self, items: list) -> None:
        batch = encode_batch(0, items)
        await self.log.append(prepare_batches(batch, self.log.config, check_records=False))

    def fetch(self, group: str, topic: str | None = None) -> list[CommittedOffset]:
        """One group's offsets (of one topic), by topic and partition: O(its partitions)."""
        topics = self._groups.get(group)
        if not topics:
            return []
        chosen = sorted(topics) if topic is None else [topic] if topic in topics else []
        return [topics[t][p] for t in chosen for p in sorted(topics[t])]

    def committed(self) -> list[CommittedOffset]:
        """Every committed offset, by group, topic and partition."""
        return [c for g in self._names for c in self.fetch(g)]

    def groups(self, topic_filter: Callable[[str], bool] | None = None) -> list[str]:
        """Groups with committed offsets, sorted; with `topic_filter`, only those with an offset
        committed on a topic it accepts. Every group: the listing pages (groups_page)."""
        if topic_filter is None:
            return list(self._names)
        return [g for g in self._names if any(topic_filter(t) for t in self._groups[g])]

    def page(self, after: str | None, limit: int) -> list[tuple[str, list[str]]]:
        """Up to `limit` groups named after `after` (from the first without), each with its
        topics: what a follower shard's listing asks of shard 0, one bounded call at a time."""
        start = 0 if after is None else bisect.bisect_right(self._names, after)
        return [(g, sorted(self._groups[g])) for g in self._names[start : start + limit]]

    def groups_page(
        self, limit: int, after: str | None = None, accept: GroupFilter | None = None
    ) -> GroupPage:
        """The first `limit` groups named after `after` that `accept` takes (every group
        without it), and the name to go on after, None on the last page. Without `accept`
        O(limit); with it O(the groups passed over)."""
        names = self._names
        start = 0 if after is None else bisect.bisect_right(names, after)
        if accept is None:
            return cut_page(names[start : start + limit + 1], limit)
        chosen: list[str] = []
        for i in range(start, len(names)):
            if accept(names[i], self._groups[names[i]]):
                chosen.append(names[i])
                if len(chosen) > limit:
                    break
        return cut_page(chosen, limit)


# accept(group, its topics): whether a listing shows the group (the caller's prefixes)
GroupFilter = Callable[[str, Iterable[str]], bool]
# (groups, the name to pass as `after` for the next page: None on the last)
GroupPage = tuple[list[str], str | None]


def cut_page(chosen: list[str], limit: int) -> GroupPage:
    """A page from up to limit + 1 chosen groups: one more than the limit means more remain."""
    if len(chosen) > limit:
        return chosen[:limit], chosen[limit - 1] if limit else None
    return chosen, None
