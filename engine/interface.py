"""The engine's typed face: what api/ and broker/ may rely on, as protocols.

The routers and the Kafka handlers never see one concrete class behind a name. A partition is
a log this process writes (partition_log.PartitionLog) or, in a shard family, one another shard
owns (follower.FollowedPartition): both read through log_reads.LogReads and take appends, the
follower by sending them to the owner. The group offsets are groups.GroupOffsets on the process
that holds them, family.RemoteGroups (calls to shard 0) on the others, which answer reads with
an awaitable where GroupOffsets answers at once. So the transports are typed against these
protocols, not against one of the classes, and mypy (the type gate, tests/test_types.py) holds
them to what every implementation gives; `_conforms` below holds every implementation to the
protocols, so a change on either side that breaks the other fails the gate.

    Engine      a server's partitions (log_manager.LogManager): topics, lookups, topic changes,
                the group offsets, its place in a family, what /metrics reads
    Topic       a topic as the server holds it (topic_state.TopicState)
    Partition   one partition's reads, waits and appends (PartitionLog, FollowedPartition)
    Groups      the committed group offsets (GroupOffsets, RemoteGroups)
    Queues      the queues: leases, acknowledgements, dead letters (queues.Queues in a lone
                process, shard_queues.ShardQueues on each shard of a family)

Only typing is imported at run time: importing this module costs nothing and pulls in no
other engine module.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

if TYPE_CHECKING:
    from .checkpoints import LeaderEpochs
    from .config import LogConfig
    from .dropped import Ranges
    from .family import RemoteGroups
    from .follower import FollowedPartition
    from .groups import CommittedOffset, GroupFilter, GroupOffsets, GroupPage
    from .key_reads import KeyRecords
    from .log_dirs import LogDir
    from .log_manager import EngineConfig, LogManager
    from .metadata import TopicMeta
    from .partition_log import AppendResult, PartitionLog, PreparedBatch
    from .queues import LeasedRecord, QueueInfo, QueueSettings
    from .queues import Queues as QueuesImpl
    from .reader import FetchSlice, RecordsResult
    from .segments import LogView
    from .shard_queues import ShardQueues
    from .shards import PartitionTable, ShardChannel
    from .topic_state import OfflinePartition, TopicState
    from .wakeups import PacedEvent

T = TypeVar("T")
# an answer now (GroupOffsets, on the process that holds the offsets) or later (RemoteGroups)
MaybeAwaitable: TypeAlias = T | Awaitable[T]


async def ready(value: MaybeAwaitable[T]) -> T:
    """The value of a read that shard 0 answers at once and another shard through shard 0
    (an awaitable): what every caller of Groups and Queues reads with."""
    return await value if inspect.isawaitable(value) else value


class Partition(Protocol):
    """One partition a request reads or appends to. Reads take the current LogView and never
    lock; appends return once durable (through the owner, in a family)."""

    # plain attributes (as engine/produce.py's Partition, what produce needs, has them)
    topic: str
    partition: int
    config: LogConfig
    # requests waiting for records (wait_for_data, and the event streams' waits on
    # data_event(), which count themselves here): a gauge in /metrics
    waiters: int
    corrupt_batches: dict[str, int]  # damaged batches met: {"recovery": n, "read": n}

    @property
    def name(self) -> str: ...  # "<topic>-<partition>", the directory's name
    @property
    def directory(self) -> Path: ...
    @property
    def view(self) -> LogView: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def dropped_offsets(self) -> Ranges: ...
    @property
    def leader_epochs(self) -> LeaderEpochs: ...
    @property
    def current_leader_epoch(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def waiting_stopped(self) -> bool: ...

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]: ...
    def dropped_in(self, first: int, last: int) -> Ranges: ...
    def check_offset(self, offset: int, view: LogView | None = None) -> LogView: ...
    def check_open(self) -> None: ...
    async def settle(self) -> LogView: ...
    def fetch_slice(self, offset: int, max_bytes: int) -> FetchSlice | None: ...
    async def read_slice(self, slice_: FetchSlice) -> bytes | memoryview: ...
    async def read_records(
        self, offset: int, max_records: int, max_bytes: int
    ) -> RecordsResult: ...
    async def read_key(
        self, key: bytes, after_offset: int, max_records: int, max_bytes: int
    ) -> KeyRecords: ...
    async def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None: ...
    async def max_timestamp_offset(self) -> tuple[int, int] | None: ...
    async def wait_for_data(self, offset: int, timeout_s: float) -> bool: ...
    def data_event(self) -> PacedEvent: ...
    def wake_waiters(self, force: bool = False) -> None: ...

    async def append(
        self, batches: Sequence[PreparedBatch], *, expected_offset: int | None = None,
        size: int | None = None, key_condition: tuple[bytes, int] | None = None,
    ) -> AppendResult: ...

    def append_soon(
        self, batches: Sequence[PreparedBatch],
        callback: Callable[[AppendResult | None, BaseException | None], None],
        *, expected_offset: int | None = None, size: int | None = None,
        key_condition: tuple[bytes, int] | None = None,
    ) -> None: ...

    async def delete_records(self, before_offset: int) -> int: ...
    async def roll(self) -> int: ...
    async def flush(self) -> None: ...


class Topic(Protocol):
    """A topic: its metadata, config, and partitions in order (an offline one holds its place)."""

    @property
    def name(self) -> str: ...
    @property
    def meta(self) -> TopicMeta: ...
    @property
    def config(self) -> LogConfig: ...
    @property
    def partitions(self) -> Sequence[Partition | OfflinePartition]: ...
    @property
    def online_partitions(self) -> Sequence[Partition]: ...


class Groups(Protocol):
    """The committed group offsets. Writes are durable when they return; reads answer at once
    where the offsets are held and through shard 0 elsewhere (MaybeAwaitable)."""

    # (topic, partition, offset, metadata) each; the offsets as stored
    def commit(
        self, group: str, offsets: Iterable[tuple[str, int, int, str]]
    ) -> Awaitable[list[CommittedOffset]]: ...
    def merge(self, offsets: Iterable[CommittedOffset]) -> Awaitable[int]: ...
    # the rest answer how many offsets they removed
    def delete(self, group: str, topic: str | None = None) -> Awaitable[int]: ...
    def delete_partitions(
        self, group: str, partitions: Iterable[tuple[str, int]]
    ) -> Awaitable[int]: ...
    def forget_topic(self, topic: str) -> Awaitable[int]: ...
    def fetch(
        self, group: str, topic: str | None = None
    ) -> MaybeAwaitable[list[CommittedOffset]]: ...
    def groups_page(
        self, limit: int, after: str | None = None, accept: GroupFilter | None = None
    ) -> MaybeAwaitable[GroupPage]: ...
    def groups(
        self, topic_filter: Callable[[str], bool] | None = None
    ) -> MaybeAwaitable[list[str]]: ...


class Queues(Protocol):
    """The queues of a server (engine/queues.py). Changes are durable when they return; the
    reads answer at once on shard 0 and through it elsewhere (MaybeAwaitable)."""

    # (the queue, True when made now; False: it existed with the same settings)
    def create(
        self, topic: str, name: str, settings: QueueSettings
    ) -> Awaitable[tuple[QueueInfo, bool]]: ...
    def delete(self, topic: str, name: str) -> Awaitable[None]: ...
    def forget_topic(self, topic: str) -> Awaitable[int]: ...
    def names(self, topic: str) -> MaybeAwaitable[list[str]]: ...
    def describe(self, topic: str, name: str) -> MaybeAwaitable[QueueInfo]: ...
    def lease(
        self, topic: str, name: str, max_records: int, lock_ms: int | None = None,
        wait_ms: int = 0,
    ) -> Awaitable[list[LeasedRecord]]: ...
    # [(lease, status)] in the order given
    def settle(
        self, topic: str, name: str, action: str, leases: Sequence[str], *, delay_ms: int = 0,
        lock_ms: int | None = None,
    ) -> Awaitable[list[tuple[str, str]]]: ...


class Engine(Protocol):
    """A server's partitions: one process's, or one shard's view of its family's."""

    @property
    def config(self) -> EngineConfig: ...
    @property
    def topics(self) -> Mapping[str, Topic]: ...
    @property
    def groups(self) -> Groups | None: ...  # None until __consumer_offsets is loaded
    @property
    def queues(self) -> Queues | None: ...  # None until __queue_state is replayed
    @property
    def dirs(self) -> Sequence[LogDir]: ...
    @property
    def ready(self) -> bool: ...  # recovery is done
    @property
    def stopping(self) -> bool: ...  # shutdown has begun
    @property
    def shard_index(self) -> int: ...
    @property
    def shard_count(self) -> int: ...
    @property
    def table(self) -> PartitionTable | None: ...  # a family's partition table
    @property
    def channel(self) -> ShardChannel | None: ...  # to the other shards of a family
    # what /metrics hooks into: each group commit and each fsync of a log this process writes
    @property
    def commit_hooks(self) -> list[Callable[[PartitionLog, int, int, int], None]]: ...
    @property
    def fsync_hooks(self) -> list[Callable[[PartitionLog, float], None]]: ...

    def clock(self) -> int: ...  # milliseconds since the epoch
    def topic(self, name: str) -> Topic: ...  # TopicNotFoundError
    # TopicNotFoundError, PartitionNotFoundError, PartitionOfflineError
    def partition(self, topic: str, partition: int) -> Partition: ...
    def owns(self, topic: str, partition: int) -> bool: ...
    def all_partitions(self) -> Sequence[Partition]: ...  # the logs this process writes
    def followed_partitions(self) -> Sequence[Partition]: ...  # those other shards own
    def offline_partitions(self) -> Sequence[OfflinePartition]: ...

    async def create_topic(
        self, name: str, partitions: int | None = None, configs: Mapping[str, Any] | None = None,
        *, internal: bool = False,
    ) -> Topic: ...
    async def alter_topic_configs(
        self, name: str, configs: Mapping[str, Any], *, replace_all: bool = False
    ) -> Topic: ...
    async def add_partitions(self, name: str, count: int) -> Topic: ...
    async def delete_topic(self, name: str) -> None: ...

    # the checks of create_topic and add_partitions that a validate-only request (Kafka's
    # CreateTopics and CreatePartitions, broker/admin.py) runs without changing anything
    def _check_collision(self, name: str) -> None: ...
    def _check_partition_budget(
        self, adding: int, *, internal: bool = False, topic: str = "", first: int = 0
    ) -> None: ...


if TYPE_CHECKING:

    def _conforms(
        manager: LogManager, log: PartitionLog, followed: FollowedPartition, state: TopicState,
        offsets: GroupOffsets, remote: RemoteGroups, queues: QueuesImpl,
        remote_queues: ShardQueues,
    ) -> tuple[Engine, Partition, Partition, Topic, Groups, Groups, Queues, Queues]:
        """Never called: mypy checks that each implementation is what its protocol says."""
        return manager, log, followed, state, offsets, remote, queues, remote_queues
