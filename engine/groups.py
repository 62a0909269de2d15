"""Consumer-group offsets, stored as records in the compacted internal topic __consumer_offsets.

Record per committed (group, topic, partition):

    key   = JSON ["<group>", "<topic>", <partition>]          (compact, canonical)
    value = JSON {"offset": int, "metadata": str, "commit_timestamp": ms}
            or null (a tombstone: the offset was deleted, e.g. with its topic)

The latest record per key wins, which is exactly what compaction keeps. At start-up the log is
replayed into a dict; a commit appends one batch holding all of its offsets (durable before the
call returns) and then updates the dict, so readers see only acknowledged commits.

Writes go through the partition's writer; reads are dictionary lookups. Safe from any task.
"""

from __future__ import annotations

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
    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self._offsets: dict[tuple[str, str, int], CommittedOffset] = {}

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

        await anyio.to_thread.run_sync(replay)

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        group, topic, partition = orjson.loads(key)
        k = (group, topic, partition)
        if value is None:
            self._offsets.pop(k, None)
            return
        v = orjson.loads(value)
        self._offsets[k] = CommittedOffset(group, topic, partition, v["offset"], v.get("metadata", ""), v.get("commit_timestamp", 0))

    async def commit(self, group: str, offsets: Iterable[tuple[str, int, int, str]]) -> list[CommittedOffset]:
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
        for c in committed:
            self._offsets[(c.group, c.topic, c.partition)] = c
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
            for c, _item in chunk:
                self._offsets[(c.group, c.topic, c.partition)] = c
        return len(items)

    async def delete(self, group: str, topic: str | None = None) -> int:
        """Tombstone a group's offsets (all, or one topic's); returns how many were removed."""
        doomed = [k for k in self._offsets if k[0] == group and (topic is None or k[1] == topic)]
        await self._tombstone(doomed)
        return len(doomed)

    async def forget_topic(self, topic: str) -> int:
        """Tombstone every group's offsets for a deleted topic (as Kafka does)."""
        doomed = [k for k in self._offsets if k[1] == topic]
        await self._tombstone(doomed)
        return len(doomed)

    async def _tombstone(self, keys: list[tuple[str, str, int]]) -> None:
        if not keys:
            return
        now = wall_clock_ms()
        await self._append([(_key(*k), None, now, ()) for k in keys])
        for k in keys:
            self._offsets.pop(k, None)

    async def _append(self, items: list) -> None:
        batch = encode_batch(0, items)
        await self.log.append(prepare_batches(batch, self.log.config, check_records=False))

    def fetch(self, group: str, topic: str | None = None) -> list[CommittedOffset]:
        return sorted(
            (c for (g, t, _p), c in self._offsets.items() if g == group and (topic is None or t == topic)),
            key=lambda c: (c.topic, c.partition),
        )

    def committed(self) -> list[CommittedOffset]:
        """Every committed offset, by group, topic and partition."""
        return [self._offsets[k] for k in sorted(self._offsets)]

    def pairs(self) -> list[tuple[str, str]]:
        """(group, topic) of every committed offset, without repeats."""
        return sorted({(g, t) for g, t, _p in self._offsets})

    def groups(self, topic_filter: Callable[[str], bool] | None = None) -> list[str]:
        """Groups with committed offsets, sorted; with `topic_filter`, only those with an offset
        committed on a topic it accepts."""
        return sorted({g for g, t, _p in self._offsets if topic_filter is None or topic_filter(t)})
