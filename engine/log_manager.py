"""The log manager: every partition log of a server, its log dirs, topics and checkpoints.

Start-up (open_engine):
1. Lock every log dir, read or create meta.properties, note the clean-shutdown markers.
2. Load __metadata-0 and replay it into the topic image.
3. Remove directories of deleted topics ("*-delete", or a topic_id the image marks deleted).
4. Load every partition of every topic in parallel worker threads (recovery.load_log): a
   partition the clean-shutdown marker covers loads lazily (if its files are as the marker
   says), any other scans from its recovery point. A partition that fails to load (a file it
   may not write, an I/O error) is offline: every request on it raises PartitionOfflineError,
   its checkpoint entries are kept, and the others serve.
5. Start one writer task per partition, remove the clean-shutdown markers, start the
   checkpoint loop. Only then does open_engine yield.

Shutdown (leaving open_engine): writers drain their queues and close their active segments
(fsync, trimmed indexes); then recovery-point and log-start checkpoints are written, and
finally the clean-shutdown marker naming each partition that closed cleanly and what its
files were (log_dirs.CleanTail), so the next start can skip the scan of those.

Topic changes are serialised by one lock and are all or nothing. Creating a topic or adding
partitions first creates the partition directories and starts their writers, then appends the
event to __metadata-0 (fsynced), and only then publishes the topic (or the new partitions) to
requests; a failure on the way (a full disk, no descriptors left) removes what was created.
A crash before the event leaves directories holding no records, which start-up removes.
Deleting a topic appends its event first, then removes the directories; start-up finishes a
removal a crash interrupted.

Descriptors (descriptors.py): open_engine() raises the soft open-files limit to the hard one;
partitions open their files lazily and idle ones give them back, so a server starts with any
number of them; topic changes that would give a process more partitions than its limit serves
(one descriptor each that unflushed writes keep, descriptors.max_partitions_for) are refused
(OpenFilesLimitError); internal topics never are.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

import anyio
import orjson
from anyio.abc import TaskGroup

from . import commits, filenames, kafka_import
from .checkpoints import (
    CLEANER_OFFSET,
    LEADER_EPOCH,
    LOG_START_OFFSET,
    RECOVERY_POINT,
    write_leader_epoch_checkpoint,
)
from .config import (
    CONFIG_DEFS,
    LogConfig,
    normalise_overrides,
    validate_new_topic_name,
    validate_topic_name,
)
from .descriptors import BUDGET, limit_for, raise_open_files_limit
from .errors import (
    DataDirError,
    EngineError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTopicNameError,
    LogClosedError,
    OpenFilesLimitError,
    PartitionNotFoundError,
    PartitionOfflineError,
    ShardUnavailableError,
    StorageError,
    TopicExistsError,
    TopicNotFoundError,
)
from .fileutil import fsync_dir, io_errors, replace_file
from .follower import FollowedPartition
from .groups import CONSUMER_OFFSETS_CONFIG, GroupOffsets
from .log_dirs import CleanTail, LogDir
from .metadata import (
    CONSUMER_OFFSETS_TOPIC,
    INTERNAL_TOPICS,
    METADATA_TOPIC,
    MetadataImage,
    TopicMeta,
    decode_event,
    encode_event,
    new_topic_id,
)
from .partition_log import PartitionLog, PreparedBatch, prepare_batches, wall_clock_ms
from .producer_state import DEFAULT_EXPIRATION_MS, ProducerStateManager
from .producer_state import rebuild as rebuild_producer_state
from .reader import read_records
from .records import encode_batch
from .recovery import LoadStats, load_log
from .segment import LogSegment
from .shards import (
    BEAT_S,
    CHANGING,
    DELETED,
    LIVE,
    LOADED,
    SERVING,
    PartitionTable,
    ShardChannel,
    SlotState,
    owner_of,
    slot_key,
    table_path,
)

logger = logging.getLogger("eventlog.engine")

PARTITION_METADATA = "partition.metadata"
# compacted: every event but topic_deleted carries the topic's whole state (metadata.py)
METADATA_LOG_CONFIG = LogConfig(cleanup_policy="compact", retention_ms=-1, segment_bytes=64 * 1024 * 1024)
MAX_PARTITIONS = 10_000  # per topic


@dataclass(frozen=True)
class ShardSpec:
    """This process's place in a shard family (eventlog serve --processes N, N >= 2):
    its index, the family's size, and the family's private run directory (Unix sockets and
    the shared-memory partition table live there). The supervisor holds the log dirs' locks
    for the whole family (log_dirs.LogDir.open(family_locked=True) in the shards)."""

    index: int
    count: int
    run_dir: Path
    # the supervisor's lock descriptors, one per log dir in the order of log_dirs
    lock_fds: tuple[int, ...] = ()
    # a shard started again alone, into a family that has served: it waits for no other shard
    # to start (only, if it is not the controller, for shard 0 to serve)
    rejoin: bool = False
    # the deadline of every call to another shard (the request timeout)
    call_timeout_s: float = 30.0


@dataclass(frozen=True)
class EngineConfig:
    """What the engine needs from the settings (built by app/)."""

    log_dirs: tuple[Path, ...]
    default_log_config: LogConfig = LogConfig()
    node_id: int = 0
    recovery_threads: int = 2
    checkpoint_interval_ms: int = 60_000
    default_partitions: int = 1
    # partitions of user topics on this server (the open-files limit caps each process's too)
    max_partitions: int = 4096
    # idempotent producers (and Idempotency-Key requests) are remembered this long after
    # their last batch's timestamp (Kafka's producer.id.expiration.ms)
    producer_id_expiration_ms: int = DEFAULT_EXPIRATION_MS
    # how long deleting a topic, and shutdown, wait for a closed partition's writer to finish
    writer_stop_timeout_ms: int = 30_000
    # None: a single process owning every partition (eventlog serve --processes 1)
    shard: ShardSpec | None = None
    # one syncfs for the flushes of a commit job on one filesystem (engine/commits.py)
    shared_sync: bool = True


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


class LogManager:
    def __init__(self, config: EngineConfig, clock: Callable[[], int] = wall_clock_ms) -> None:
        if not config.log_dirs:
            raise DataDirError(".", "no log dirs configured")
        self.config = config
        self.clock = clock
        self.dirs = [LogDir(Path(p).resolve()) for p in config.log_dirs]
        self.topics: dict[str, TopicState] = {}
        self.image = MetadataImage()
        self.metadata_log: PartitionLog | None = None
        self.load_stats: dict[str, LoadStats] = {}
        self.ready = False
        self.stopping = False
        self._tg: TaskGroup | None = None
        self._topic_lock = anyio.Lock()
        self._checkpoint_locks: dict[Path, anyio.Lock] = {}
        self._partition_dir: dict[PartitionLog, LogDir] = {}
        self._recovery_limiter = anyio.CapacityLimiter(max(1, config.recovery_threads))
        # observers (metrics), called from writer threads: (log, requests, records, bytes)
        # after each group commit, and (log, seconds) after each fsync
        self.commit_hooks: list[Callable[[PartitionLog, int, int, int], None]] = []
        self.fsync_hooks: list[Callable[[PartitionLog, float], None]] = []
        self.groups: GroupOffsets | None = None  # set once __consumer_offsets is loaded
        self._recovery_points: dict[tuple[str, int], int] = {}
        self._offline: dict[tuple[str, int], OfflinePartition] = {}
        self._log_starts: dict[tuple[str, int], int] = {}
        # the compactor's first dirty offset per partition (cleaner-offset-checkpoint)
        self._cleaner_offsets: dict[tuple[str, int], int] = {}
        # -- a shard of a family (config.shard): see "Shards" below --
        spec = config.shard
        self.sharded = spec is not None
        self.shard_index = spec.index if spec is not None else 0
        self.shard_count = spec.count if spec is not None else 1
        self.table: PartitionTable | None = None
        self.channel: ShardChannel | None = None
        self._slots: dict[PartitionLog, tuple[int, int]] = {}  # owned log -> (slot index, key)
        self._followed: dict[int, FollowedPartition] = {}  # slot key -> followed partition
        self._pending: dict[tuple[str, int], PartitionLog] = {}  # (topic id, p) prepared for the controller
        self._meta_applied = 0  # followers: metadata log offset applied up to
        self._meta_lock = anyio.Lock()
        self._notes: set[int] = set()
        self._notes_scheduled = False

    # -- lookups ------------------------------------------------------------------------------

    def topic(self, name: str) -> TopicState:
        state = self.topics.get(name)
        if state is None:
            raise TopicNotFoundError(name)
        return state

    def partition(self, topic: str, partition: int) -> PartitionLog:
        """The partition's log; PartitionOfflineError if it could not be loaded at start-up."""
        state = self.topic(topic)
        if not 0 <= partition < len(state.partitions):
            raise PartitionNotFoundError(topic, partition, len(state.partitions))
        log = state.partitions[partition]
        if isinstance(log, OfflinePartition):
            raise PartitionOfflineError(topic, partition, log.directory, log.reason)
        return log

    def all_partitions(self) -> list[PartitionLog]:
        """Every partition log this process writes and serves (offline partitions, and in a
        shard family the partitions other shards own, are not among them)."""
        return [p for state in self.topics.values() for p in state.partitions if isinstance(p, PartitionLog)]

    def followed_partitions(self) -> list[FollowedPartition]:
        """In a shard family: the partitions other shards own, read here from their files."""
        return [p for state in self.topics.values() for p in state.partitions if isinstance(p, FollowedPartition)]

    @property
    def is_controller(self) -> bool:
        """Writes the metadata log and holds the group offsets (shard 0, or a lone process)."""
        return self.shard_index == 0

    def owns(self, topic: str, partition: int) -> bool:
        return owner_of(topic, partition, self.shard_count) == self.shard_index

    def offline_partitions(self) -> list[OfflinePartition]:
        return list(self._offline.values())

    def _last_shutdown(self, clean: bool) -> str:
        """How the data dirs were left, for the start-up line (a new data dir was never shut down,
        cleanly or not)."""
        if clean:
            return "clean shutdown"
        if all(d.created for d in self.dirs):
            return "new data dir"
        return "unclean shutdown: recovered"

    def log_dir_of(self, log: PartitionLog) -> LogDir:
        return self._partition_dir[log]

    # -- start-up -----------------------------------------------------------------------------

    async def _open(self, tg: TaskGroup) -> None:
        if self.sharded:
            return await self._open_shard(tg)
        self._tg = tg
        clean = all(d.had_clean_shutdown for d in self.dirs)
        await self._load_metadata(tg)
        await anyio.to_thread.run_sync(self._remove_deleted_topic_dirs)
        loaded = await self._load_topics()
        for state, p, log in loaded:
            await tg.start(log.run)
        await self._open_group_offsets()
        for d in self.dirs:
            await anyio.to_thread.run_sync(d.clear_clean_shutdown)
        tg.start_soon(self._checkpoint_loop)
        self.ready = True
        partitions = len(self.all_partitions())
        logger.info(
            "engine ready: %d topic(s), %d partition(s), %d offline, %s; open-files limit %d "
            "(%d partitions, %d active at once)",
            len(self.image.topics), partitions, len(self._offline), self._last_shutdown(clean),
            BUDGET.limit, BUDGET.max_partitions, BUDGET.active_partitions,
        )
        self._log_open_files_limit()

    async def _load_topics(self) -> list[tuple[TopicState, int, PartitionLog]]:
        """Publish a topic state for every topic of the image: the partitions this process owns
        loaded in parallel (recovery; one that fails goes offline alone), the others followed
        (in a shard family). Returns the loaded ones, whose writers are not started yet."""
        loaded: list[tuple[TopicState, int, PartitionLog]] = []

        async def load_one(state: TopicState, p: int) -> None:
            try:
                log = await self._load_partition(state.name, p, state.config, state.meta.topic_id)
            except Exception as exc:
                self._set_offline(state, p, exc)
                return
            loaded.append((state, p, log))

        states = []
        for name, meta in self.image.topics.items():
            if name == METADATA_TOPIC:
                continue
            state = TopicState(meta, self.config.default_log_config.with_overrides(meta.overrides))
            state.partitions = [None] * meta.partitions  # type: ignore[list-item]
            states.append(state)
        async with anyio.create_task_group() as loaders:
            for state in states:
                for p in range(state.meta.partitions):
                    if self.owns(state.name, p):
                        loaders.start_soon(load_one, state, p)
                    else:
                        state.partitions[p] = self._follow(state.name, state.meta.topic_id, p, state.config)  # type: ignore[call-overload]
        for state in states:
            self.topics[state.name] = state
        for state, p, log in loaded:
            state.partitions[p] = log
        for (topic, p), offline in self._offline.items():
            self.topics[topic].partitions[p] = offline
        return loaded

    def _set_offline(self, state: TopicState, p: int, exc: Exception) -> None:
        """Start-up could not load partition p of `state`: keep its place, serve nothing."""
        tp = (state.name, p)
        log_dir = self._find_partition_dir(state.name, p) or self._pick_dir()
        directory = log_dir.path / filenames.partition_dir_name(state.name, p)
        error = exc if isinstance(exc, StorageError) else StorageError(directory, f"cannot load: {exc!r}")
        offline = OfflinePartition(state.name, p, directory, log_dir, state.config, error)
        self._offline[tp] = offline
        logger.error(
            "partition %s is offline: %s. It serves nothing until the cause is fixed and the server restarted; "
            "the other partitions serve.",
            offline.name, offline.reason,
        )

    def _open_dirs(self) -> None:
        cluster_id = None
        opened: list[LogDir] = []
        try:
            for i, d in enumerate(self.dirs):
                family_fd = self.config.shard.lock_fds[i] if self.config.shard and self.config.shard.lock_fds else None
                d.open(self.config.node_id, cluster_id, family_lock_fd=family_fd)
                cluster_id = d.cluster_id
                opened.append(d)
        except BaseException:
            for d in opened:
                d.unlock()
            raise
        for d in self.dirs:
            for tp, offset in d.read_checkpoint(RECOVERY_POINT).items():
                self._recovery_points[tp] = offset
            for tp, offset in d.read_checkpoint(LOG_START_OFFSET).items():
                self._log_starts[tp] = offset
            for tp, offset in d.read_checkpoint(CLEANER_OFFSET).items():
                self._cleaner_offsets[tp] = offset

    def _find_partition_dir(self, topic: str, partition: int) -> LogDir | None:
        name = filenames.partition_dir_name(topic, partition)
        for d in self.dirs:
            if (d.path / name).is_dir():
                return d
        return None

    def _pick_dir(self) -> LogDir:
        """The log dir holding the fewest partitions (first one on ties)."""
        counts = {id(d): 0 for d in self.dirs}
        for d in self._partition_dir.values():
            counts[id(d)] += 1
        return min(self.dirs, key=lambda d: counts[id(d)])

    async def _load_partition(
        self, topic: str, partition: int, config: LogConfig, topic_id: str | None
    ) -> PartitionLog:
        log_dir = self._find_partition_dir(topic, partition) or self._pick_dir()
        directory = log_dir.path / filenames.partition_dir_name(topic, partition)
        tp = (topic, partition)

        def load() -> Any:
            existed = directory.is_dir()
            try:
                with io_errors(directory, "cannot load partition"):
                    return load_inner(existed)
            except BaseException:
                if not existed:  # a partition being created: leave nothing behind
                    shutil.rmtree(directory, ignore_errors=True)
                raise

        def load_inner(existed: bool) -> Any:
            loaded = load_log(
                directory,
                config,
                clean_shutdown=log_dir.was_clean(tp),
                clean_tail=log_dir.clean_tail(tp),
                recovery_point=self._recovery_points.get(tp, 0),
                log_start_offset=self._log_starts.get(tp, 0),
                now_ms=self.clock(),
            )
            if topic_id is not None and not (directory / PARTITION_METADATA).exists():
                try:
                    _write_partition_metadata(directory, topic_id)
                except OSError as exc:
                    if not existed:
                        raise  # part of creating the partition: the create fails
                    # an existing partition still loads and serves (a full disk): next start
                    logger.warning("%s: %s not written: %s", directory.name, PARTITION_METADATA, exc)
            if not (directory / LEADER_EPOCH).exists():
                try:
                    write_leader_epoch_checkpoint(directory, loaded.log_start_offset)
                except (OSError, StorageError) as exc:
                    if not existed:
                        raise
                    logger.warning("%s: %s not written: %s", directory.name, LEADER_EPOCH, exc)
            if not existed:
                fsync_dir(directory.parent)
            producers = ProducerStateManager(directory, self.config.producer_id_expiration_ms)
            rebuild_producer_state(producers, loaded.segments, loaded.next_offset, self.clock())
            return loaded, producers

        loaded, producers = await anyio.to_thread.run_sync(load, limiter=self._recovery_limiter)
        self.load_stats[f"{topic}-{partition}"] = loaded.stats
        log = PartitionLog(
            topic,
            partition,
            directory,
            config,
            loaded.segments,
            log_start_offset=loaded.log_start_offset,
            recovery_point=loaded.recovery_point,
            clock=self.clock,
            on_log_start_change=self._on_log_start_change,
            on_commit=self._on_commit,
            schedule_delete=self._schedule_delete,
            on_fsync=self._on_fsync,
            producer_state=producers,
            dropped_offsets=loaded.dropped_offsets,
        )
        log.corrupt_batches["recovery"] += loaded.stats.corrupt_batches
        self._partition_dir[log] = log_dir
        return log

    async def _load_metadata(self, tg: TaskGroup) -> None:
        log = await self._load_partition(METADATA_TOPIC, 0, METADATA_LOG_CONFIG, None)
        self.metadata_log = log
        offset = log.log_start_offset
        while offset < log.high_watermark:
            result = await anyio.to_thread.run_sync(read_records, log.view, offset, 10_000, 4 * 1024 * 1024)
            for record in result.records:
                if record.value is not None:
                    self.image.apply(decode_event(record.value))
            if result.next_offset <= offset:
                break
            offset = result.next_offset
        await tg.start(log.run)
        meta = TopicMeta(METADATA_TOPIC, "", 1, {})
        self.topics[METADATA_TOPIC] = TopicState(meta, METADATA_LOG_CONFIG, [log])

    async def _open_group_offsets(self) -> None:
        """Create __consumer_offsets on first start, then replay it into memory."""
        if CONSUMER_OFFSETS_TOPIC not in self.topics:
            await self.create_topic(
                CONSUMER_OFFSETS_TOPIC,
                1,
                {"cleanup.policy": CONSUMER_OFFSETS_CONFIG.cleanup_policy, "segment.bytes": CONSUMER_OFFSETS_CONFIG.segment_bytes},
                internal=True,
            )
        self.groups = GroupOffsets(self.partition(CONSUMER_OFFSETS_TOPIC, 0))
        await self.groups.load()

    def _remove_deleted_topic_dirs(self, own_only: bool = False) -> None:
        """Remove what deleted topics and unfinished topic changes left in the log dirs;
        `own_only`: only the partition directories this shard owns."""
        for d in self.dirs:
            for entry in os.scandir(d.path):
                if not entry.is_dir():
                    continue
                if entry.name.endswith(filenames.DELETE_DIR_SUFFIX):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    continue
                parsed = filenames.parse_partition_dir(entry.name)
                if parsed is None or parsed[0] == METADATA_TOPIC:
                    continue
                if own_only and not self.owns(*parsed):
                    continue
                topic_id = _read_partition_topic_id(Path(entry.path))
                meta = self.image.topics.get(parsed[0])
                if topic_id is not None and topic_id in self.image.deleted_topic_ids:
                    logger.info("removing %s, left over from a deleted topic", entry.path)
                    shutil.rmtree(entry.path, ignore_errors=True)
                elif meta is None or (parsed[1] >= meta.partitions and topic_id in (None, meta.topic_id)):
                    if _holds_no_records(Path(entry.path)):
                        # a topic creation or partition addition that never reached the
                        # metadata log: nothing was ever written to it
                        logger.info("removing %s, left over from an unfinished topic change", entry.path)
                        shutil.rmtree(entry.path, ignore_errors=True)
                    elif meta is None:
                        logger.warning("ignoring %s: no such topic in the metadata log", entry.path)
                    else:
                        logger.warning("ignoring %s: topic has %d partitions", entry.path, meta.partitions)
                elif topic_id is not None and topic_id != meta.topic_id:
                    aside = f"{entry.path}.{topic_id}-stray"
                    logger.warning("moving %s aside to %s: it belongs to another topic id", entry.path, aside)
                    os.replace(entry.path, aside)
            fsync_dir(d.path)

    # -- topic changes ------------------------------------------------------------------------

    async def _append_event(self, kind: str, topic: str, topic_id: str, **fields_: Any) -> None:
        assert self.metadata_log is not None
        now = self.clock()
        key, value = encode_event(kind, topic, topic_id, now, **fields_)
        batch = encode_batch(0, [(key, value, now, ())])
        await self.metadata_log.append(prepare_batches(batch, METADATA_LOG_CONFIG))
        self.image.apply(decode_event(value))

    async def create_topic(
        self, name: str, partitions: int | None = None, configs: Mapping[str, Any] | None = None,
        *, internal: bool = False,
    ) -> TopicState:
        """Validate, create the partitions, record topic_created, then publish the topic.

        All or nothing: a failure (StorageFullError on a full disk, TooManyOpenFilesError,
        OpenFilesLimitError) leaves no directory, no event and no topic behind; requests see
        the topic only once all its partitions take appends. Internal topics (__metadata,
        __consumer_offsets) are created by the server only; their names and Kafka's other
        reserved ones are refused otherwise (config.RESERVED_TOPICS).
        """
        if self.sharded and not self.is_controller:
            await self._forward_topic_change("create_topic", name, partitions, configs, internal=internal)
            return self.topic(name)
        (validate_topic_name if internal else validate_new_topic_name)(name)
        count = self.config.default_partitions if partitions is None else partitions
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PARTITIONS:
            raise InvalidPartitionsError(count if isinstance(count, int) else -1)
        overrides = normalise_overrides(configs or {})
        config = self.config.default_log_config.with_overrides(overrides)
        async with self._topic_lock:
            if name in self.topics or (name in INTERNAL_TOPICS and not internal):
                raise TopicExistsError(name)
            self._check_collision(name)
            self._check_partition_budget(count, internal=internal, topic=name)
            state = await self._new_topic(name, new_topic_id(), count, overrides, config)
            await self._sync_family()
            return state

    async def _new_topic(
        self, name: str, topic_id: str, count: int, overrides: dict[str, str], config: LogConfig
    ) -> TopicState:
        """The partitions first, the topic_created event next, the topic published last; a
        failure on the way removes the partitions (create_topic, adopt_topic)."""
        state = TopicState(TopicMeta(name, topic_id, count, overrides, self.clock()), config)
        logs = await self._create_partition_logs(state, range(count))
        try:
            await self._append_event("topic_created", name, topic_id, partitions=count, configs=overrides)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._discard_partition_logs(logs)
            raise
        state.meta = self.image.topics[name]
        state.partitions = logs
        self.topics[name] = state  # published: requests see the topic from here on
        return state

    async def _create_partition_logs(self, state: TopicState, numbers: range) -> list[PartitionLog]:
        """Create the partitions' directories and start their writers; not yet visible to
        requests. On any failure, what was created is removed again and the error raised.
        In a shard family each owner creates its own (prepare_partitions)."""
        assert self._tg is not None
        if self.sharded:
            return await self._create_family_partitions(state, numbers)
        logs: list[PartitionLog] = []
        try:
            for p in numbers:
                log = await self._load_partition(state.name, p, state.config, state.meta.topic_id)
                logs.append(log)
                await self._tg.start(log.run)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._discard_partition_logs(logs)
            if isinstance(exc, OSError):
                raise StorageError(state.name, f"cannot create partitions: {exc}") from exc
            raise
        return logs

    async def _create_family_partitions(self, state: TopicState, numbers: range) -> list[PartitionLog]:
        assert self._tg is not None and self.channel is not None
        by_shard: dict[int, list[int]] = {}
        for p in numbers:
            by_shard.setdefault(owner_of(state.name, p, self.shard_count), []).append(p)
        made: dict[int, Any] = {}
        try:
            for p in by_shard.pop(self.shard_index, []):
                log = await self._load_partition(state.name, p, state.config, state.meta.topic_id)
                made[p] = log
                await self._tg.start(log.run)
                self._register_owned(log, state.meta.topic_id)
            for shard, ps in by_shard.items():
                await self.channel.call(shard, "prepare_partitions", state.name, state.meta.topic_id, dict(state.meta.overrides), ps)
                for p in ps:
                    made[p] = self._follow(state.name, state.meta.topic_id, p, state.config)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._discard_partition_logs(list(made.values()))
            if isinstance(exc, OSError):
                raise StorageError(state.name, f"cannot create partitions: {exc}") from exc
            raise
        return [made[p] for p in numbers]

    async def _discard_partition_logs(self, logs: list[PartitionLog]) -> None:
        """Undo _create_partition_logs: stop the writers, remove the directories (durably)."""
        followed = [log for log in logs if isinstance(log, FollowedPartition)]
        if followed:
            assert self.channel is not None
            by_shard: dict[int, list[int]] = {}
            for f in followed:
                self._unfollow(f)
                by_shard.setdefault(f.owner, []).append(f.partition)
            for shard, ps in by_shard.items():
                try:
                    await self.channel.call(shard, "discard_partitions", followed[0].topic_id, ps)
                except EngineError as exc:  # its start-up removes them (empty leftovers)
                    logger.warning("shard %d could not discard partitions %s: %s", shard, ps, exc)
            logs = [log for log in logs if not isinstance(log, FollowedPartition)]
        for log in logs:
            self._retire_slot(log)
        for log in logs:
            await log.close()
        for log in logs:
            if log._running:
                await log.stopped.wait()
        parents = set()
        for log in logs:
            self._partition_dir.pop(log, None)
            await anyio.to_thread.run_sync(shutil.rmtree, log.directory, True)
            parents.add(log.directory.parent)
        for parent in parents:
            try:
                await anyio.to_thread.run_sync(fsync_dir, parent)
            except OSError as exc:  # the directories are gone from the name space either way
                logger.warning("%s: fsync after removing partitions: %s", parent, exc)

    async def alter_topic_configs(self, name: str, configs: Mapping[str, Any], *, replace_all: bool = False) -> TopicState:
        """Merge `configs` into the topic's overrides (a null value removes an override)."""
        if self.sharded and not self.is_controller:
            await self._forward_topic_change("alter_topic_configs", name, dict(configs), replace_all=replace_all)
            return self.topic(name)
        async with self._topic_lock:
            state = self._user_topic(name)
            overrides = {} if replace_all else dict(state.meta.overrides)
            removals = [k for k, v in configs.items() if v is None]
            for k in removals:
                if k not in CONFIG_DEFS:
                    raise InvalidConfigError(k, None, "unknown topic config")
            overrides.update(normalise_overrides({k: v for k, v in configs.items() if v is not None}))
            for k in removals:
                overrides.pop(k, None)
            config = self.config.default_log_config.with_overrides(overrides)
            await self._append_event(
                "configs_altered", name, state.meta.topic_id, configs=overrides,
                partitions=state.meta.partitions, created_ms=state.meta.created_ms,
            )
            state.meta = self.image.topics[name]
            state.config = config
            for log in state.partitions:
                log.config = config
            await self._sync_family()
            return state

    async def add_partitions(self, name: str, count: int) -> TopicState:
        """Grow a topic to `count` partitions; all or nothing, as create_topic."""
        if self.sharded and not self.is_controller:
            await self._forward_topic_change("add_partitions", name, count)
            return self.topic(name)
        async with self._topic_lock:
            state = self._user_topic(name)
            current = len(state.partitions)
            if isinstance(count, bool) or not isinstance(count, int) or count <= current or count > MAX_PARTITIONS:
                raise InvalidPartitionsError(count if isinstance(count, int) else -1, current)
            self._check_partition_budget(count - current, topic=name, first=current)
            logs = await self._create_partition_logs(state, range(current, count))
            try:
                await self._append_event(
                    "partitions_added", name, state.meta.topic_id, partitions=count,
                    configs=dict(state.meta.overrides), created_ms=state.meta.created_ms,
                )
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._discard_partition_logs(logs)
                raise
            state.meta = self.image.topics[name]
            state.partitions = state.partitions + logs  # published: a new list, whole
            await self._sync_family()
            return state

    async def delete_topic(self, name: str) -> None:
        """Record topic_deleted, stop the writers, rename the directories to *-delete and
        remove them in the background (start-up finishes any removal a crash interrupted)."""
        if self.sharded:
            if not self.is_controller:
                await self._forward_topic_change("delete_topic", name)
                return
            async with self._topic_lock:
                state = self._user_topic(name)
                await self._append_event("topic_deleted", name, state.meta.topic_id)
                del self.topics[name]
                await self._drop_topic_here(state)
                await self._sync_family()
                assert self.groups is not None
                await self.groups.forget_topic(name)
            return
        async with self._topic_lock:
            state = self._user_topic(name)
            await self._append_event("topic_deleted", name, state.meta.topic_id)
            del self.topics[name]
            logs = state.online_partitions
            for log in logs:
                await log.close(deleted=True)  # ends its streams and long-polls at once
            await self._wait_stopped(logs, f"deleting {name}")
            doomed = []
            for log in state.partitions:
                if isinstance(log, OfflinePartition):
                    log_dir = self._offline.pop((log.topic, log.partition)).log_dir
                    if not log.directory.exists():
                        continue
                else:
                    log_dir = self._partition_dir.pop(log)
                target = log.directory.with_name(f"{log.directory.name}.{state.meta.topic_id}{filenames.DELETE_DIR_SUFFIX}")
                await anyio.to_thread.run_sync(os.replace, log.directory, target)
                await anyio.to_thread.run_sync(fsync_dir, log_dir.path)
                doomed.append(target)
            tps = {(name, p) for p in range(len(state.partitions))}
            for tp in tps:
                self._cleaner_offsets.pop(tp, None)
            for d in self.dirs:
                await self._write_checkpoints(d, exclude=tps)
            await self.groups.forget_topic(name)
        assert self._tg is not None
        for path in doomed:
            self._tg.start_soon(anyio.to_thread.run_sync, shutil.rmtree, path, True)

    async def adopt_topic(
        self, name: str, partition_dirs: Mapping[int, Path], *, link: bool = False,
        log_start_offsets: Mapping[int, int] | None = None, configs: Mapping[str, str] | None = None,
    ) -> tuple[TopicState, dict[int, LoadStats]]:
        """Import partition directories written by Kafka (see kafka_import.py for the steps),
        as a topic with the overrides `configs`.

        Partitions missing from `partition_dirs` (below the highest number) start empty.
        Raises TopicExistsError if the topic exists here already.
        """
        if self.sharded:
            raise InvalidRequestError("import-kafka opens the data dir itself: stop the server first")
        validate_topic_name(name)
        count = max(partition_dirs) + 1
        if count > MAX_PARTITIONS:
            raise InvalidPartitionsError(count)
        overrides = normalise_overrides(configs or {})
        config = self.config.default_log_config.with_overrides(overrides)
        stats: dict[int, LoadStats] = {}
        async with self._topic_lock:
            if name in self.topics or name in INTERNAL_TOPICS:
                raise TopicExistsError(name)
            self._check_collision(name)
            self._check_partition_budget(count, topic=name)
            topic_id = new_topic_id()
            planned: dict[LogDir, int] = {}
            for p in range(count):
                source = partition_dirs.get(p)
                if source is None:
                    continue
                counts = {d: sum(1 for x in self._partition_dir.values() if x is d) + planned.get(d, 0) for d in self.dirs}
                log_dir = min(self.dirs, key=lambda d: counts[d])
                planned[log_dir] = planned.get(log_dir, 0) + 1
                target = log_dir.path / filenames.partition_dir_name(name, p)
                if target.exists():
                    # left by an import that crashed before registering the topic
                    await anyio.to_thread.run_sync(shutil.rmtree, target)
                start = (log_start_offsets or {}).get(p, 0)

                def stage_and_recover(source: Path = source, target: Path = target, start: int = start) -> LoadStats:
                    staging = kafka_import.stage_partition(source, target, link=link)
                    loaded = kafka_import.recover_staged(staging, config, start, self.clock())
                    _write_partition_metadata(staging, topic_id)
                    os.replace(staging, target)
                    fsync_dir(target.parent)
                    self._recovery_points[(name, p)] = loaded.next_offset
                    self._log_starts[(name, p)] = loaded.log_start_offset
                    return loaded.stats

                stats[p] = await anyio.to_thread.run_sync(stage_and_recover, limiter=self._recovery_limiter)
            # as create_topic (the staged partitions load, missing ones start empty)
            state = await self._new_topic(name, topic_id, count, overrides, config)
        await self.checkpoint()
        return state, stats

    def _check_partition_budget(self, adding: int, *, internal: bool = False, topic: str = "", first: int = 0) -> None:
        """Refuse, before anything is created, partitions past EVENTLOG_MAX_PARTITIONS (user
        topics) or past what the open-files limit serves (all partitions count): partitions
        `first` .. `first + adding - 1` of `topic` would be added. Internal topics are never
        refused (the server creates them at start, whatever its limit).

        The open-files rule is per process, on the partitions it owns (each shard of a family
        has its own limit and writes only its own): one descriptor each that unflushed writes
        keep, within the budget (descriptors.max_partitions_for). Partitions past what the
        budget keeps open at once are served all the same, taking turns."""
        if internal:
            return
        in_use = sum(len(s.partitions) for name, s in self.topics.items() if name not in INTERNAL_TOPICS)
        if in_use + adding > self.config.max_partitions:
            raise InvalidPartitionsError(
                adding,
                reason=f"the server holds {in_use} partitions; {adding} more would pass its limit of "
                f"{self.config.max_partitions} (EVENTLOG_MAX_PARTITIONS)",
            )
        counts = self._partitions_per_process(topic, range(first, first + adding))
        most = max(counts)
        if most > BUDGET.max_partitions:
            raise OpenFilesLimitError(most, BUDGET.max_partitions, BUDGET.limit, needed=limit_for(most))

    def _partitions_per_process(self, topic: str = "", adding: range = range(0)) -> list[int]:
        """Partitions each process of the family owns (one entry for a single process), with
        partitions `adding` of `topic` counted as if created."""
        counts = [0] * max(self.shard_count, 1)
        for name, state in self.topics.items():
            for p in range(len(state.partitions)):
                counts[owner_of(name, p, self.shard_count)] += 1
        for p in adding:
            counts[owner_of(topic, p, self.shard_count)] += 1
        return counts

    def _log_open_files_limit(self) -> None:
        """At start: what the open-files limit allows, and what to raise when it is low (each
        shard of a family of its own partitions; the limit's line once, from shard 0)."""
        most = self._partitions_per_process()[self.shard_index]
        # what EVENTLOG_MAX_PARTITIONS lets a process own (a family spreads user topics)
        wanted = -(-self.config.max_partitions // max(self.shard_count, 1)) + len(INTERNAL_TOPICS)
        if most > BUDGET.max_partitions:
            logger.warning(
                "%d partitions on this process, more than its open-files limit of %d serves (%d): they start and serve, "
                "but appends may answer 503 too_many_open_files while many have unflushed writes, and no "
                "partitions can be added; raise the limit to at least %d (ulimit -n, systemd LimitNOFILE=, "
                "docker --ulimit nofile=) and restart",
                most, BUDGET.limit, BUDGET.max_partitions, limit_for(max(most, wanted)),
            )
        elif BUDGET.max_partitions < wanted and self.shard_index == 0:
            logger.warning(
                "open-files limit %d is low: it serves %d partitions%s (EVENTLOG_MAX_PARTITIONS allows %d), "
                "%d of them active at once (the others take turns), after %d descriptors kept for connections; "
                "raise it to at least %d (ulimit -n, systemd LimitNOFILE=, docker --ulimit nofile=) and restart",
                BUDGET.limit, BUDGET.max_partitions, " per process" if self.shard_count > 1 else "", self.config.max_partitions,
                BUDGET.active_partitions, BUDGET.reserve, limit_for(wanted),
            )

    def _check_collision(self, name: str) -> None:
        """Kafka refuses names that equal an existing one once '.' is read as '_' (metric
        names cannot tell them apart)."""
        folded = name.replace(".", "_")
        for other in self.topics:
            if other != name and other.replace(".", "_") == folded:
                raise InvalidTopicNameError(name, f"collides with existing topic {other!r} ('.' and '_' are not told apart)")

    def _user_topic(self, name: str) -> TopicState:
        if name in INTERNAL_TOPICS:
            raise InvalidRequestError(f"{name} is managed by the server")
        return self.topic(name)

    # -- checkpoints and deletions ------------------------------------------------------------

    def _on_commit(self, log: PartitionLog, requests: int, records: int, size: int) -> None:
        for hook in self.commit_hooks:
            hook(log, requests, records, size)

    def _on_fsync(self, log: PartitionLog, seconds: float) -> None:
        for hook in self.fsync_hooks:
            hook(log, seconds)

    async def _on_log_start_change(self, log: PartitionLog, start: int) -> None:
        """Checkpoint `log`'s new log start offset (before it takes effect, for delete-records)."""
        await self._write_checkpoints(self._partition_dir[log], starts={(log.topic, log.partition): start})

    async def _write_checkpoints(
        self, log_dir: LogDir, exclude: set[tuple[str, int]] = frozenset(),  # type: ignore[assignment]
        starts: dict[tuple[str, int], int] | None = None,
    ) -> None:
        """Write log_dir's recovery-point and log-start checkpoints; `starts` overrides log
        start offsets that have not taken effect yet."""
        lock = self._checkpoint_locks.setdefault(log_dir.path, anyio.Lock())
        async with lock:
            logs = [
                log for log, d in self._partition_dir.items()
                if d is log_dir and (log.topic, log.partition) not in exclude
            ]
            recovery = {(log.topic, log.partition): log.recovery_point for log in logs}
            starts = {(log.topic, log.partition): log.log_start_offset for log in logs} | (starts or {})
            for tp, offline in self._offline.items():  # what they had, until they load again
                if offline.log_dir is log_dir and tp not in exclude:
                    if tp in self._recovery_points:
                        recovery[tp] = self._recovery_points[tp]
                    if tp in self._log_starts:
                        starts[tp] = self._log_starts[tp]
            if self.sharded:
                await anyio.to_thread.run_sync(log_dir.merge_checkpoint, RECOVERY_POINT, recovery, self._mine)
                await anyio.to_thread.run_sync(log_dir.merge_checkpoint, LOG_START_OFFSET, starts, self._mine)
                return
            await anyio.to_thread.run_sync(log_dir.write_checkpoint, RECOVERY_POINT, recovery)
            await anyio.to_thread.run_sync(log_dir.write_checkpoint, LOG_START_OFFSET, starts)

    def _mine(self, tp: tuple[str, int]) -> bool:
        """Whether this shard writes tp's entries in the shared checkpoint files."""
        return self.owns(*tp)

    def cleaner_offset(self, log: PartitionLog) -> int | None:
        """Where the compactor's next pass starts (None: never cleaned)."""
        return self._cleaner_offsets.get((log.topic, log.partition))

    async def set_cleaner_offset(self, log: PartitionLog, offset: int) -> None:
        """Record a finished compaction pass in its log dir's cleaner-offset-checkpoint."""
        self._cleaner_offsets[(log.topic, log.partition)] = offset
        log_dir = self._partition_dir[log]
        lock = self._checkpoint_locks.setdefault(log_dir.path, anyio.Lock())
        async with lock:
            entries = {
                (lg.topic, lg.partition): self._cleaner_offsets[(lg.topic, lg.partition)]
                for lg, d in self._partition_dir.items()
                if d is log_dir and (lg.topic, lg.partition) in self._cleaner_offsets
            }
            if self.sharded:
                await anyio.to_thread.run_sync(log_dir.merge_checkpoint, CLEANER_OFFSET, entries, self._mine)
            else:
                await anyio.to_thread.run_sync(log_dir.write_checkpoint, CLEANER_OFFSET, entries)

    async def checkpoint(self) -> None:
        for d in self.dirs:
            await self._write_checkpoints(d)

    async def _checkpoint_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.checkpoint_interval_ms / 1000)
            for d in self.dirs:
                try:
                    await self._write_checkpoints(d)
                except DataDirError as exc:
                    self._lose_dir(d, exc)
                except Exception:
                    logger.exception("writing checkpoints failed")

    def _lose_dir(self, log_dir: LogDir, error: DataDirError) -> None:
        """`log_dir` is no longer the directory this server locked: refuse every write to its
        partitions (a roll would create files by path in someone else's directory)."""
        lost = [log for log, d in self._partition_dir.items() if d is log_dir and log.failed is None]
        if lost:
            logger.critical("%s; %d partition(s) refuse writes from now on", error, len(lost))
        for log in lost:
            log.fail(StorageError(log_dir.path, error.reason))

    def _schedule_delete(self, log: PartitionLog, segments: list[LogSegment]) -> None:
        delay_s = log.config.file_delete_delay_ms / 1000

        async def remove() -> None:
            await anyio.sleep(delay_s)
            for segment in segments:
                segment.close()
                await anyio.to_thread.run_sync(segment.delete_files)

        if self._tg is None:
            for segment in segments:
                segment.close()
                segment.delete_files()
        else:
            self._tg.start_soon(remove)

    # -- shutdown -----------------------------------------------------------------------------

    async def _wait_stopped(self, logs: list[PartitionLog], why: str) -> bool:
        """Wait for closed logs' writers to finish (their queued appends, the final fsync), at
        most writer_stop_timeout_ms: a writer stuck in a system call (a hung disk) must not
        hold a topic deletion or shutdown for ever. False, and an error logged, on timeout."""
        with anyio.move_on_after(self.config.writer_stop_timeout_ms / 1000):
            for log in logs:
                await log.stopped.wait()
            return True
        stuck = [log.name for log in logs if not log.stopped.is_set()]
        logger.error(
            "%s: the writer of %s did not stop within %d ms (a hung disk?); going on without it",
            why, ", ".join(stuck), self.config.writer_stop_timeout_ms,
        )
        return False

    def begin_shutdown(self) -> None:
        """Shutdown is coming: end long-polls and streams now. Call on the event loop."""
        self.stopping = True
        for log in self.all_partitions():
            log.stop_waiting()
        for followed in self.followed_partitions():
            followed.stop_waiting()

    async def _close(self) -> None:
        self.ready = False
        logs = self.all_partitions()
        for log in logs:
            await log.close()
        await self._wait_stopped(logs, "shutdown")
        unclean = [log.name for log in logs if log.failed is not None or not log.stopped.is_set()]
        unclean += [o.name for o in self._offline.values()]
        for d in self.dirs:
            try:
                await self._write_checkpoints(d)
                tails = {
                    (log.topic, log.partition): CleanTail(log.view.active.base_offset, log.view.active.size, log.high_watermark)
                    for log, log_dir in self._partition_dir.items()
                    if log_dir is d and log.failed is None and log.stopped.is_set()
                }
                if self.sharded:
                    await anyio.to_thread.run_sync(d.merge_clean_shutdown, tails, self._mine)
                else:
                    await anyio.to_thread.run_sync(d.mark_clean_shutdown, tails)
            except EngineError as exc:  # a full disk, a lost dir: the next start recovers it
                logger.error("%s: no clean-shutdown marker written: %s", d.path, exc)
                unclean.append(str(d.path))
        if unclean:
            logger.info("engine closed; the next start recovers %s as after a crash", ", ".join(sorted(unclean)))
        else:
            logger.info("engine closed (clean)")


    # -- shards -------------------------------------------------------------------------------
    #
    # In a shard family (config.shard) every partition has one owner shard (shards.owner_of),
    # which loads, recovers and writes it; the other shards follow it (follower.py). Shard 0,
    # the controller, also owns __metadata-0 and __consumer_offsets: every topic change runs
    # there (forwarded by the others), and returns only once every shard has applied the
    # event, so whichever shard a client's next request reaches knows the change.
    #
    # Start-up: shard 0 loads the metadata log, removes leftovers of deleted topics and
    # publishes the log's slot; the others wait for that slot and replay the log from the
    # files. Each shard loads the partitions it owns (recovery) and publishes their slots,
    # then says LOADED. Shard 0 waits for every shard's LOADED (each has read the clean-
    # shutdown markers by then), opens the group offsets, removes the markers, says SERVING;
    # the others follow the metadata log from then on and say SERVING.

    def slot_key(self, topic: str, topic_id: str, partition: int) -> int:
        return slot_key(topic, topic_id, partition)

    def _topic_id_of(self, log: PartitionLog) -> str:
        state = self.topics.get(log.topic)
        return state.meta.topic_id if state is not None else ""

    def _register_owned(self, log: PartitionLog, topic_id: str) -> None:
        """Give an owned partition its slot in the partition table and publish it."""
        if self.table is None:
            return
        key = slot_key(log.topic, topic_id, log.partition)
        index = self.table.claim(self.shard_index, key)
        # a slot this shard's previous process wrote: go on from its generation, so that no
        # follower takes this process's segment list for the one it already holds
        log.generation = max(log.generation, self.table.generation(self.shard_index, index) + 1)
        self._slots[log] = (index, key)
        log.on_publish = self._publish_slot
        self._publish_slot(log)

    def _publish_slot(self, log: PartitionLog, flags: int = LIVE) -> None:
        entry = self._slots.get(log)
        if entry is None or self.table is None:
            return
        index, key = entry
        view = log.view
        if log.files_changing:
            flags |= CHANGING
        self.table.publish(
            self.shard_index, index, key,
            SlotState(view.high_watermark, view.log_start_offset, log.generation, view.active.base_offset, view.active_end, flags),
        )
        self._notes.add(key)
        if not self._notes_scheduled:
            self._notes_scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self._send_notes)
            except RuntimeError:  # not on the loop (closing): nobody waits any more
                self._notes_scheduled = False

    def _send_notes(self) -> None:
        self._notes_scheduled = False
        keys, self._notes = list(self._notes), set()
        if self.channel is None or not keys:
            return
        for shard in range(self.shard_count):
            if shard != self.shard_index:
                self.channel.note(shard, "wake", keys)

    def _on_wake(self, keys: list[int]) -> None:
        for key in keys:
            followed = self._followed.get(key)
            if followed is not None:
                followed._wake_waiters()  # the owner published: a note reached us

    def _retire_slot(self, log: PartitionLog) -> None:
        """The partition's topic is gone: its slot says so (readers elsewhere get 404)."""
        entry = self._slots.pop(log, None)
        if entry is None or self.table is None:
            return
        index, key = entry
        view = log.view
        self.table.publish(
            self.shard_index, index, key,
            SlotState(view.high_watermark, view.log_start_offset, log.generation, view.active.base_offset, view.active_end, DELETED),
        )
        self._notes.add(key)
        self._send_notes()

    def _follow(self, topic: str, topic_id: str, partition: int, config: LogConfig) -> FollowedPartition:
        log_dir = self._find_partition_dir(topic, partition) or self.dirs[0]
        directory = log_dir.path / filenames.partition_dir_name(topic, partition)
        owner = owner_of(topic, partition, self.shard_count)
        followed = FollowedPartition(self, topic, topic_id, partition, directory, config, owner)
        self._followed[followed.key] = followed
        return followed

    def _unfollow(self, followed: FollowedPartition) -> None:
        self._followed.pop(followed.key, None)

    async def _open_shard(self, tg: TaskGroup) -> None:
        assert self.config.shard is not None
        self._tg = tg
        me = self.shard_index
        table, channel = self.table, self.channel
        assert table is not None and channel is not None
        rejoin = self.config.shard.rejoin
        clean = all(d.had_clean_shutdown for d in self.dirs)
        if self.is_controller:
            await self._load_metadata(tg)
            # alone again in a family that serves: only its own partitions' leftovers are its to
            # remove (the others' shards may be creating theirs right now)
            await anyio.to_thread.run_sync(self._remove_deleted_topic_dirs, rejoin)
            assert self.metadata_log is not None
            self._register_owned(self.metadata_log, "")
        else:
            await self._follow_metadata_log()
            if rejoin:  # topics deleted while it was down: their leftovers here are its own
                await anyio.to_thread.run_sync(self._remove_deleted_topic_dirs, True)
        loaded = await self._load_topics()
        for state, p, log in loaded:
            await tg.start(log.run)
            self._register_owned(log, state.meta.topic_id)
        await anyio.to_thread.run_sync(self._write_offline_note)
        table.set_state(me, LOADED)
        # A family's first start: every shard waits for the others (shard 0 clears the clean-
        # shutdown markers only once each has read them); a shard that dies meanwhile is
        # started again by the supervisor, and the others go on waiting for it. A shard that
        # rejoins waits for nobody but, if it is not the controller, shard 0.
        forever = 365 * 86400.0
        if not rejoin:
            await table.wait_states(LOADED, forever)
        await anyio.to_thread.run_sync(self._read_offline_notes)
        if self.is_controller:
            await self._open_group_offsets()
            if not rejoin:
                for d in self.dirs:
                    await anyio.to_thread.run_sync(d.clear_clean_shutdown)
        else:
            await table.wait_states(SERVING, forever, range(0, 1))
            self.groups = RemoteGroups(self)  # type: ignore[assignment]
            await self.catch_up_metadata()
            tg.start_soon(self._metadata_loop)
        table.set_state(me, SERVING)
        if not rejoin:
            await table.wait_states(SERVING, forever)
        tg.start_soon(self._checkpoint_loop)
        self.ready = True
        logger.info(
            "shard %d of %d ready: %d topic(s), %d partition(s) owned here, %d offline, %s; "
            "open-files limit %d (%d partitions a process, %d active at once)", me, self.shard_count,
            len(self.image.topics), len(self.all_partitions()), len(self._offline), self._last_shutdown(clean),
            BUDGET.limit, BUDGET.max_partitions, BUDGET.active_partitions,
        )
        self._log_open_files_limit()

    async def _heartbeat(self) -> None:
        """Stamp this shard's beat in the table every BEAT_S, from the event loop: the
        supervisor kills a shard whose loop stops beating (a stopped or hung process), and the
        others stop sending it work. Each beat also sweeps the channel's overdue requests."""
        assert self.table is not None and self.channel is not None
        while True:
            self.table.beat(self.shard_index)
            self.channel.sweep()
            await anyio.sleep(BEAT_S)

    def _offline_note(self, shard: int) -> Path:
        assert self.config.shard is not None
        return self.config.shard.run_dir / f"offline-{shard}.json"

    def _write_offline_note(self) -> None:
        """The partitions this shard could not load, with why, for the others (run dir)."""
        notes = [
            {"topic": o.topic, "partition": o.partition, "path": str(o.error.path), "reason": o.error.reason}
            for o in self._offline.values()
        ]
        self._offline_note(self.shard_index).write_bytes(orjson.dumps(notes))

    def _read_offline_notes(self) -> None:
        """Partitions other shards could not load are offline here too, with their reasons
        (a request for one answers as on its owner)."""
        for shard in range(self.shard_count):
            if shard == self.shard_index:
                continue
            try:
                notes = orjson.loads(self._offline_note(shard).read_bytes())
            except (FileNotFoundError, orjson.JSONDecodeError):
                continue
            for note in notes:
                state = self.topics.get(note["topic"])
                p = note["partition"]
                if state is None or not 0 <= p < len(state.partitions) or not isinstance(state.partitions[p], FollowedPartition):
                    continue
                followed = state.partitions[p]
                self._unfollow(followed)
                log_dir = self._find_partition_dir(state.name, p) or self.dirs[0]
                error = StorageError(note["path"], note["reason"])
                state.partitions[p] = OfflinePartition(state.name, p, followed.directory, log_dir, state.config, error)

    async def _follow_metadata_log(self) -> None:
        """A follower: wait for shard 0 to publish the metadata log, then replay it."""
        assert self.table is not None
        key = slot_key(METADATA_TOPIC, "", 0)
        while True:
            index = self.table.find(0, key)
            if index is not None:
                state = self.table.read(0, index, key)
                if state is not None and state.live:
                    break
            await anyio.sleep(0.01)
        log = self._follow(METADATA_TOPIC, "", 0, METADATA_LOG_CONFIG)
        self.metadata_log = log  # type: ignore[assignment]
        self._meta_applied = log.log_start_offset
        await self._read_metadata(apply=False)
        meta = TopicMeta(METADATA_TOPIC, "", 1, {})
        self.topics[METADATA_TOPIC] = TopicState(meta, METADATA_LOG_CONFIG, [log])  # type: ignore[list-item]

    async def _read_metadata(self, *, apply: bool) -> None:
        log = self.metadata_log
        assert log is not None
        while self._meta_applied < log.high_watermark:
            offset = max(self._meta_applied, log.log_start_offset)
            result = await log.read_records(offset, 10_000, 4 * 1024 * 1024)
            for record in result.records:
                if record.value is not None:
                    self.image.apply(decode_event(record.value))
            if result.next_offset <= offset:
                break
            self._meta_applied = result.next_offset
        if apply:
            await self._reconcile()

    async def catch_up_metadata(self, until: int | None = None) -> None:
        """A follower: apply what the metadata log holds now (at least up to `until`)."""
        if self.is_controller:
            return
        async with self._meta_lock:
            log = self.metadata_log
            assert log is not None
            if until is not None and log.high_watermark < until:
                await log.wait_for_data(until - 1, 30)
            await self._read_metadata(apply=True)

    async def _metadata_loop(self) -> None:
        log = self.metadata_log
        assert log is not None
        while not self.stopping:
            try:
                await log.wait_for_data(self._meta_applied, 5)
                if self.stopping:
                    return
                await self.catch_up_metadata()
            except LogClosedError:
                return
            except Exception:
                logger.exception("following the metadata log failed")
                await anyio.sleep(1)

    async def _reconcile(self) -> None:
        """A follower: make the topics agree with the image (created, grown, altered, deleted)."""
        for name in list(self.topics):
            if name == METADATA_TOPIC:
                continue
            state = self.topics[name]
            meta = self.image.topics.get(name)
            if meta is None or meta.topic_id != state.meta.topic_id:
                del self.topics[name]
                await self._drop_topic_here(state)
        for name, meta in list(self.image.topics.items()):
            if name == METADATA_TOPIC:
                continue
            config = self.config.default_log_config.with_overrides(meta.overrides)
            state = self.topics.get(name)
            if state is None:
                state = TopicState(meta, config)
                state.partitions = await self._partitions_here(state, range(meta.partitions))
                self.topics[name] = state
                continue
            if meta.overrides != state.meta.overrides:
                state.config = config
                for log in state.partitions:
                    if not isinstance(log, OfflinePartition):
                        log.config = config
            if meta.partitions > len(state.partitions):
                state.meta = meta
                state.partitions = state.partitions + await self._partitions_here(state, range(len(state.partitions), meta.partitions))
            state.meta = meta

    async def _partitions_here(self, state: TopicState, numbers: range) -> list[Any]:
        """This shard's objects for new partitions: the logs it prepared for the controller
        (or loads now), followers of the others'."""
        assert self._tg is not None
        out: list[Any] = []
        for p in numbers:
            if not self.owns(state.name, p):
                out.append(self._follow(state.name, state.meta.topic_id, p, state.config))
                continue
            log = self._pending.pop((state.meta.topic_id, p), None)
            if log is None:
                try:
                    log = await self._load_partition(state.name, p, state.config, state.meta.topic_id)
                except Exception as exc:
                    self._set_offline(state, p, exc)
                    out.append(self._offline[(state.name, p)])
                    continue
                await self._tg.start(log.run)
                self._register_owned(log, state.meta.topic_id)
            log.config = state.config
            out.append(log)
        return out

    async def _drop_topic_here(self, state: TopicState) -> None:
        """A deleted topic: stop following what others own; close, retire and remove what this
        shard owns (as delete_topic does in a lone process)."""
        for log in state.partitions:
            if isinstance(log, FollowedPartition):
                self._unfollow(log)
                await log.close(deleted=True)
        owned = [log for log in state.partitions if isinstance(log, PartitionLog)]
        for log in owned:
            await log.close(deleted=True)
        await self._wait_stopped(owned, f"deleting {state.name}")
        doomed = []
        for log in state.partitions:
            if isinstance(log, OfflinePartition):
                if not self.owns(log.topic, log.partition):
                    continue
                log_dir = self._offline.pop((log.topic, log.partition)).log_dir
                if not log.directory.exists():
                    continue
            elif isinstance(log, PartitionLog):
                self._retire_slot(log)
                log_dir = self._partition_dir.pop(log)
            else:
                continue
            target = log.directory.with_name(f"{log.directory.name}.{state.meta.topic_id}{filenames.DELETE_DIR_SUFFIX}")
            await anyio.to_thread.run_sync(os.replace, log.directory, target)
            await anyio.to_thread.run_sync(fsync_dir, log_dir.path)
            doomed.append(target)
        tps = {(state.name, p) for p in range(len(state.partitions))}
        for tp in tps:
            self._cleaner_offsets.pop(tp, None)
        if owned or doomed:
            for d in self.dirs:
                await self._write_checkpoints(d, exclude=tps)
        assert self._tg is not None
        for path in doomed:
            self._tg.start_soon(anyio.to_thread.run_sync, shutil.rmtree, path, True)

    async def _sync_family(self) -> None:
        """The controller, after a topic change: return once every shard has applied it."""
        if not self.sharded or self.channel is None:
            return
        assert self.metadata_log is not None
        until = self.metadata_log.high_watermark
        channel = self.channel

        async def sync(shard: int) -> None:
            try:
                await channel.call(shard, "sync_metadata", until)
            except ShardUnavailableError as exc:
                # the change is in the metadata log: a shard that is down replays it when it
                # starts again, one that stopped answering is killed and does the same
                logger.warning("shard %d did not confirm metadata up to offset %d: %s", shard, until, exc)

        async with anyio.create_task_group() as tg:
            for shard in range(1, self.shard_count):
                tg.start_soon(sync, shard)

    async def _forward_topic_change(self, what: str, *args: Any, **kwargs: Any) -> Any:
        """A follower: the controller makes the change (and every shard applies it first)."""
        assert self.channel is not None
        await self.channel.call(0, "topic_change", what, args, kwargs)
        await self.catch_up_metadata()

    # handlers of the channel (registered by open_engine)

    async def _on_topic_change(self, what: str, args: tuple, kwargs: dict) -> None:
        if what not in ("create_topic", "alter_topic_configs", "add_partitions", "delete_topic"):
            raise InvalidRequestError(f"unknown topic change {what!r}")
        await getattr(self, what)(*args, **kwargs)

    async def _on_sync_metadata(self, until: int) -> None:
        await self.catch_up_metadata(until)

    async def _on_prepare_partitions(self, topic: str, topic_id: str, overrides: dict[str, str], numbers: list[int]) -> None:
        """The controller creates a topic (or partitions): create this shard's, unpublished."""
        assert self._tg is not None
        config = self.config.default_log_config.with_overrides(overrides)
        created: list[PartitionLog] = []
        try:
            for p in numbers:
                log = await self._load_partition(topic, p, config, topic_id)
                created.append(log)
                await self._tg.start(log.run)
                self._register_owned(log, topic_id)
                self._pending[(topic_id, p)] = log
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._on_discard_partitions(topic_id, [log.partition for log in created])
            if isinstance(exc, OSError):
                raise StorageError(topic, f"cannot create partitions: {exc}") from exc
            raise

    async def _on_discard_partitions(self, topic_id: str, numbers: list[int]) -> None:
        logs = [log for p in numbers if (log := self._pending.pop((topic_id, p), None)) is not None]
        for log in logs:
            self._retire_slot(log)
        await self._discard_partition_logs(logs)

    async def _on_partition(self, what: str, topic: str, topic_id: str, partition: int, *args: Any) -> Any:
        """A request another shard forwards to a partition this shard owns."""
        state = self.topics.get(topic)
        if state is None or state.meta.topic_id != topic_id:
            await self.catch_up_metadata()
            state = self.topics.get(topic)
            if state is None or state.meta.topic_id != topic_id:
                raise TopicNotFoundError(topic)
        log = self._owned(topic, partition)
        if what == "append":
            data, headers, expected_offset, size, key_condition, batch_keys = args
            return await log.append(
                _batches_of(data, headers, batch_keys), expected_offset=expected_offset, size=size,
                key_condition=key_condition,
            )
        if what == "read_key":
            return await log.read_key(*args)
        if what == "delete_records":
            return await log.delete_records(*args)
        if what == "roll":
            return await log.roll()
        if what == "flush":
            return await log.flush()
        if what == "snapshot":
            from .snapshots import snapshot_partition

            return await snapshot_partition(log, *args)
        raise InvalidRequestError(f"unknown partition request {what!r}")

    def _owned(self, topic: str, partition: int) -> PartitionLog:
        log = self.partition(topic, partition)
        if not isinstance(log, PartitionLog):
            raise PartitionOfflineError(topic, partition, "", f"shard {self.shard_index} does not own it")
        return log

    def _on_partition_append(
        self, reply: Callable[[bool, Any], None], topic: str, topic_id: str, partition: int,
        data: bytes, headers: list, expected_offset: int | None, size: int | None,
        key_condition: tuple[bytes, int] | None = None, batch_keys: list | None = None,
    ) -> None:
        """An append another shard forwards (a quick handler: queued to the writer as it is
        read, answered as the writer finishes it). A topic this shard has not caught up with
        yet takes the slow path, which catches up first."""
        state = self.topics.get(topic)
        if state is None or state.meta.topic_id != topic_id:
            assert self.channel is not None

            async def slow() -> None:
                try:
                    result = await self._on_partition(
                        "append", topic, topic_id, partition, data, headers, expected_offset, size, key_condition, batch_keys
                    )
                except Exception as exc:
                    reply(False, exc)
                else:
                    reply(True, result)

            self.channel._spawn(slow())
            return
        self._owned(topic, partition).append_soon(
            _batches_of(data, headers, batch_keys),
            lambda result, error: reply(True, result) if error is None else reply(False, error),
            expected_offset=expected_offset, size=size, key_condition=key_condition,
        )

    async def _on_groups(self, what: str, args: tuple) -> Any:
        assert self.groups is not None
        if what == "pairs":
            return self.groups.pairs()
        if what not in ("commit", "merge", "delete", "forget_topic", "fetch"):
            raise InvalidRequestError(f"unknown group request {what!r}")
        result = getattr(self.groups, what)(*args)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    def register_handlers(self) -> None:
        assert self.channel is not None
        self.channel.handlers.update({
            "wake": self._on_wake,
            "topic_change": self._on_topic_change,
            "sync_metadata": self._on_sync_metadata,
            "prepare_partitions": self._on_prepare_partitions,
            "discard_partitions": self._on_discard_partitions,
            "partition": self._on_partition,
            "groups": self._on_groups,
        })
        self.channel.quick_handlers["partition_append"] = self._on_partition_append


def _batches_of(data: bytes, headers: list, batch_keys: list | None = None) -> list[PreparedBatch]:
    """A forwarded append's batches: its bytes (one writable copy) cut at its headers' sizes,
    with the keys their encoder knew (the key index's input), if it sent them."""
    buffer = memoryview(bytearray(data))
    batches = []
    position = 0
    for i, header in enumerate(headers):
        keys = batch_keys[i] if batch_keys is not None else None
        batches.append(PreparedBatch(buffer[position:position + header.size], header, keys))
        position += header.size
    return batches


class RemoteGroups:
    """The group offsets of a follower shard: shard 0 holds them; every call goes there."""

    def __init__(self, manager: LogManager) -> None:
        self._manager = manager

    async def _call(self, what: str, *args: Any) -> Any:
        assert self._manager.channel is not None
        return await self._manager.channel.call(0, "groups", what, args)

    async def commit(self, group: str, offsets: Any) -> Any:
        return await self._call("commit", group, list(offsets))

    async def merge(self, offsets: Any) -> Any:
        return await self._call("merge", list(offsets))

    async def delete(self, group: str, topic: str | None = None) -> Any:
        return await self._call("delete", group, topic)

    async def forget_topic(self, topic: str) -> Any:
        return await self._call("forget_topic", topic)

    async def fetch(self, group: str, topic: str | None = None) -> Any:
        return await self._call("fetch", group, topic)

    async def groups(self, topic_filter: Callable[[str], bool] | None = None) -> list[str]:
        # the filter is a closure over the request's principal: it stays here, the pairs come
        pairs = await self._call("pairs")
        return sorted({g for g, t in pairs if topic_filter is None or topic_filter(t)})


@asynccontextmanager
async def open_engine(config: EngineConfig, clock: Callable[[], int] = wall_clock_ms) -> AsyncIterator[LogManager]:
    """Open (recover) every log dir, run the writers, and close everything cleanly on exit."""
    BUDGET.configure(raise_open_files_limit())
    commits.batcher_for(asyncio.get_running_loop()).shared_sync = config.shared_sync and commits.kernel_reports_syncfs_errors()
    manager = LogManager(config, clock)
    await anyio.to_thread.run_sync(manager._open_dirs)
    if config.shard is not None:
        spec = config.shard
        manager.table = PartitionTable(table_path(spec.run_dir), spec.count)
        manager.table.begin(spec.index)
        manager.channel = ShardChannel(spec.run_dir, spec.index, spec.count, manager.table, spec.call_timeout_s)
        manager.register_handlers()
        await manager.channel.start()
    try:
        async with anyio.create_task_group() as tg:
            if manager.table is not None:
                tg.start_soon(manager._heartbeat)
            await manager._open(tg)
            try:
                yield manager
            finally:
                with anyio.CancelScope(shield=True):
                    await manager._close()
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise _single_engine_error(group) from None
    finally:
        if manager.channel is not None:
            await manager.channel.close()
        if manager.table is not None:
            manager.table.close()
        for d in manager.dirs:
            d.unlock()


def _single_engine_error(group: BaseExceptionGroup) -> BaseException:
    """A task group wraps errors; a lone engine error is more useful to callers bare."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    if len(leaves) == 1 and isinstance(leaves[0], EngineError):
        return leaves[0]
    return group


def _write_partition_metadata(directory: Path, topic_id: str) -> None:
    """Kafka's partition.metadata, as its broker writes it: no final newline."""
    replace_file(directory / PARTITION_METADATA, f"version: 0\ntopic_id: {topic_id}".encode("ascii"))


def _holds_no_records(directory: Path) -> bool:
    """True when every segment .log in `directory` is empty (or there is none)."""
    try:
        return all(
            entry.stat().st_size == 0
            for entry in os.scandir(directory)
            if (parsed := filenames.parse_segment_file(entry.name)) and parsed[1] == filenames.LOG_SUFFIX
        )
    except OSError:
        return False


def _read_partition_topic_id(directory: Path) -> str | None:
    try:
        text = (directory / PARTITION_METADATA).read_text(encoding="ascii")
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            return value.strip()
    return None
