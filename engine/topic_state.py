"""A topic as a server holds it: its metadata, config and partition objects (logs this
process writes, partitions other shards own, or partitions that could not be loaded)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import filenames
from .config import LogConfig
from .errors import StorageError
from .log_dirs import LogDir
from .metadata import TopicMeta
from .partition_log import PartitionLog

# compacted: every event but topic_deleted carries the topic's whole state (metadata.py)
METADATA_LOG_CONFIG = LogConfig(cleanup_policy="compact", retention_ms=-1, segment_bytes=64 * 1024 * 1024)


@dataclass(eq=False)
class OfflinePartition:
    """A partition that could not be loaded at start-up: it holds its place in its topic's
    partition list and serves nothing until the cause is fixed and the server restarted."""

    topic: str
    partition: int
    directory: Path
    log_dir: LogDir
    config: LogConfig
    error: StorageError
    closed: bool = True  # the workers' loops pass over it like a log being deleted

    @property
    def name(self) -> str:
        return filenames.partition_dir_name(self.topic, self.partition)

    @property
    def reason(self) -> str:
        return self.error.args[0] if self.error.args else repr(self.error)


@dataclass
class TopicState:
    meta: TopicMeta
    config: LogConfig
    partitions: list[PartitionLog | OfflinePartition] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def online_partitions(self) -> list[PartitionLog]:
        """Every partition that serves: this shard's own and those other shards own."""
        return [p for p in self.partitions if not isinstance(p, OfflinePartition)]

    @property
    def owned_partitions(self) -> list[PartitionLog]:
        """The partitions this process writes (all of them outside a shard family)."""
        return [p for p in self.partitions if isinstance(p, PartitionLog)]
