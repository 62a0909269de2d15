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
partitions open their files lazily and idle ones give them back (unflushed ones too, issue 28),
so a process serves any number of them; only under a limit that leaves no descriptor for one
append (descriptors.max_partitions_for) are user topics refused (OpenFilesLimitError); internal
topics never are.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

import anyio
from anyio.abc import TaskGroup

from . import commits, filenames, kafka_import
from .checkpoints import (
    CLEANER_OFFSET,
    EVENTLOG_LEADER_EPOCH,
    LEADER_EPOCH,
    LOG_START_OFFSET,
    RECOVERY_POINT,
    LeaderEpochs,
    leader_epochs_from_batches,
    read_leader_epoch_checkpoint,
    truncate_leader_epochs,
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
    OpenFilesLimitError,
    PartitionNotFoundError,
    PartitionOfflineError,
    StorageError,
    TopicExistsError,
    TopicNotFoundError,
)
from .fileutil import fsync_dir, io_errors, replace_file
from .family import ShardFamily
from .follower import FollowedPartition
from .groups import CONSUMER_OFFSETS_CONFIG, GroupOffsets
from .queues import Queues
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
from .partition_log import (
    PartitionLog,
    gc_paused,
    loop_turn,
    prepare_batches,
    start_writers,
    wall_clock_ms,
)
from .producer_state import DEFAULT_EXPIRATION_MS, ProducerStateManager
from .producer_state import rebuild as rebuild_producer_state
from .reader import read_records
from .records import encode_batch
from .recovery import LoadedLog, LoadStats, load_log
from .segment import LogSegment
from .topic_state import METADATA_LOG_CONFIG, OfflinePartition, TopicState
from .shards import (
    REGION_SLOTS,
    PartitionTable,
    ShardChannel,
    owner_of,
)

logger = logging.getLogger("eventlog.engine")

PARTITION_METADATA = "partition.metadata"
MAX_PARTITIONS = 10_000  # per topic
LOAD_CHUNK = 64  # partitions loaded per worker thread hop at start-up (_load_partitions)


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
    # per log dir: the supervisor made it on this start (it opens the dirs before any shard,
    # so a shard never sees a dir as new itself): the start-up line says "new data dir"
    new_dirs: tuple[bool, ...] = ()


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
        self.queues: Queues | None = None  # set once __queue_state is replayed (queues.py)
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
        # ownership and routing in a shard family (family.py); None in a lone process
        self.family: ShardFamily | None = None

    async def _sync_family(self) -> None:
        """After a topic change on the controller: return once every shard has applied it."""
        if self.family is not None:
            await self.family.sync()

    @property
    def table(self) -> PartitionTable | None:
        """The family's partition table (None in a lone process)."""
        return self.family.table if self.family is not None else None

    @property
    def channel(self) -> ShardChannel | None:
        """The channel to the other shards (None in a lone process)."""
        return self.family.channel if self.family is not None else None

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
            return await self.family.open(tg)
        self._tg = tg
        clean = all(d.had_clean_shutdown for d in self.dirs)
        await self._load_metadata(tg)
        await anyio.to_thread.run_sync(self._remove_deleted_topic_dirs)
        with gc_paused():
            loaded = await self._load_topics()
            await start_writers(tg, [log for _state, _p, log in loaded])
        await self._open_group_offsets()
        await self._open_queues()
        for d in self.dirs:
            await anyio.to_thread.run_sync(d.clear_clean_shutdown)
        tg.start_soon(self._checkpoint_loop)
        self.ready = True
        partitions = len(self.all_partitions())
        logger.info(
            "engine ready: %d topic(s), %d partition(s), %d offline, %s; %s",
            len(self.image.topics), partitions, len(self._offline), self._last_shutdown(clean), BUDGET.describe(),
        )
        self._log_open_files_limit()

    async def _load_topics(self) -> list[tuple[TopicState, int, PartitionLog]]:
        """Publish a topic state for every topic of the image: the partitions this process owns
        loaded in parallel (recovery; one that fails goes offline alone), the others followed
        (in a shard family). Returns the loaded ones, whose writers are not started yet."""
        loaded: list[tuple[TopicState, int, PartitionLog]] = []
        states = []
        for name, meta in self.image.topics.items():
            if name == METADATA_TOPIC:
                continue
            state = TopicState(meta, self.config.default_log_config.with_overrides(meta.overrides))
            state.partitions = [None] * meta.partitions  # type: ignore[list-item]
            states.append(state)
        mine: list[tuple[TopicState, int]] = []
        followed_count = 0
        for state in states:
            for p in range(state.meta.partitions):
                if self.owns(state.name, p):
                    mine.append((state, p))
                else:
                    followed = self.family.follow(state.name, state.meta.topic_id, p, state.config)
                    state.partitions[p] = followed  # type: ignore[call-overload]
                    await loop_turn(followed_count)
                    followed_count += 1
        todo = [(s.name, p, s.config, s.meta.topic_id) for s, p in mine]
        logs = await self._load_partitions(todo)
        for (state, p), log in zip(mine, logs, strict=True):
            if isinstance(log, Exception):
                self._set_offline(state, p, log)
            else:
                loaded.append((state, p, log))
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
                if self.config.shard and i < len(self.config.shard.new_dirs):
                    d.created = d.created or self.config.shard.new_dirs[i]
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
        """The log dir holding the fewest partitions (first one on ties). One log dir (the
        usual case) is the answer without counting: the count is O(partitions), and creating
        a topic picks once per partition (quadratic at 50,000 partitions: issue 28)."""
        if len(self.dirs) == 1:
            return self.dirs[0]
        counts = {id(d): 0 for d in self.dirs}
        for d in self._partition_dir.values():
            counts[id(d)] += 1
        return min(self.dirs, key=lambda d: counts[id(d)])

    async def _load_partition(
        self, topic: str, partition: int, config: LogConfig, topic_id: str | None
    ) -> PartitionLog:
        log_dir = self._find_partition_dir(topic, partition) or self._pick_dir()
        limiter = self._recovery_limiter
        loaded = await anyio.to_thread.run_sync(
            self._load_files, log_dir, topic, partition, config, topic_id, limiter=limiter
        )
        return self._make_log(topic, partition, config, loaded)

    def _place(self, tps: list[tuple[str, int]]) -> list[LogDir]:
        """Each partition's log dir, decided on the loop (what _pick_dir counts, the loop
        changes): where its directory is, else the dir with the fewest partitions, counting
        those placed before it in `tps`. One log dir needs no look: every partition is there
        (no stat per partition on the loop at start-up)."""
        if len(self.dirs) == 1:
            return [self.dirs[0]] * len(tps)
        counts = {id(d): 0 for d in self.dirs}
        for d in self._partition_dir.values():
            counts[id(d)] += 1
        placed = []
        for topic, partition in tps:
            found = self._find_partition_dir(topic, partition)
            if found is None:
                found = min(self.dirs, key=lambda d: counts[id(d)])
                counts[id(found)] += 1
            placed.append(found)
        return placed

    async def _load_partitions(
        self, todo: list[tuple[str, int, LogConfig, str | None]]
    ) -> list[PartitionLog | Exception]:
        """Load many partitions (start-up): their files in chunks of LOAD_CHUNK per worker
        thread hop, recovery_threads hops at once, so a start pays one hop per chunk instead of
        one per partition (at 5,000 partitions the hops and their tasks cost more than the
        loads); each partition's log, or the error that takes it offline, in `todo`'s order."""
        results: list[PartitionLog | Exception] = [None] * len(todo)  # type: ignore[list-item]
        dirs = self._place([(t, p) for t, p, _c, _i in todo])

        def load_chunk(start: int) -> list[Any]:
            out: list[Any] = []
            for i in range(start, min(start + LOAD_CHUNK, len(todo))):
                topic, partition, config, topic_id = todo[i]
                try:
                    out.append(self._load_files(dirs[i], topic, partition, config, topic_id))
                except Exception as exc:
                    out.append(exc)
            return out

        async def run_chunk(start: int) -> None:
            limiter = self._recovery_limiter
            files = await anyio.to_thread.run_sync(load_chunk, start, limiter=limiter)
            for i, got in enumerate(files, start):
                if isinstance(got, Exception):
                    results[i] = got
                    continue
                topic, partition, config, _topic_id = todo[i]
                try:
                    results[i] = self._make_log(topic, partition, config, got)
                except Exception as exc:
                    results[i] = exc

        async with anyio.create_task_group() as tg:
            for start in range(0, len(todo), LOAD_CHUNK):
                tg.start_soon(run_chunk, start)
        return results

    def _load_files(
        self, log_dir: LogDir, topic: str, partition: int, config: LogConfig, topic_id: str | None
    ) -> Any:
        """A partition's files in `log_dir` opened and recovered (blocking: a worker thread)."""
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
                exists=existed,
            )
            if topic_id is not None and PARTITION_METADATA not in loaded.names:
                try:
                    _write_partition_metadata(directory, topic_id)
                except OSError as exc:
                    if not existed:
                        raise  # part of creating the partition: the create fails
                    # an existing partition still loads and serves (a full disk): next start
                    logger.warning("%s: %s not written: %s", directory.name, PARTITION_METADATA, exc)
            epoch = _load_leader_epoch(directory, loaded, existed)
            if not existed:
                fsync_dir(directory.parent)
            producers = ProducerStateManager(directory, self.config.producer_id_expiration_ms)
            names = list(loaded.names) if existed else None
            rebuild_producer_state(
                producers, loaded.segments, loaded.next_offset, self.clock(), names
            )
            return log_dir, directory, loaded, producers, epoch

        return load()

    def _make_log(self, topic: str, partition: int, config: LogConfig, files: Any) -> PartitionLog:
        """The PartitionLog of a partition whose files _load_files opened (on the loop)."""
        log_dir, directory, loaded, producers, epoch = files
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
            leader_epoch=epoch,
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

    async def _open_queues(self) -> None:
        """Replay __queue_state (made with the first queue) into the queues' windows."""
        queues = Queues(self, self.clock)
        await queues.load()
        self.queues = queues

    def _remove_deleted_topic_dirs(self, own_only: bool = False) -> None:
        """Remove what deleted topics, unfinished topic changes and interrupted imports
        (`<topic>-<partition>.importing`, which Kafka would refuse as a log dir's entry: the
        import registered no topic, and Kafka's own files are elsewhere) left in the log dirs;
        `own_only`: only the partition directories this shard owns."""
        for d in self.dirs:
            for entry in os.scandir(d.path):
                if not entry.is_dir():
                    continue
                if entry.name.endswith(filenames.DELETE_DIR_SUFFIX):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    continue
                if entry.name.endswith(kafka_import.IMPORTING_SUFFIX):
                    logger.info("removing %s, left by an import that did not finish", entry.path)
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
            await self.family.forward_topic_change("create_topic", name, partitions, configs, internal=internal)
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
            return await self.family.create_partitions(state, numbers)
        logs: list[PartitionLog] = []
        try:
            # made as start-up loads (chunks of partitions per worker-thread hop, several hops
            # at once): one by one, a 1,000-partition topic waited out ~3,000 fsyncs in turn
            todo = [(state.name, p, state.config, state.meta.topic_id) for p in numbers]
            made = await self._load_partitions(todo)
            logs = [log for log in made if isinstance(log, PartitionLog)]
            for log in logs:
                await self._tg.start(log.run)
            failed = [exc for exc in made if isinstance(exc, Exception)]
            if failed:
                raise failed[0]
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._discard_partition_logs(logs)
            if isinstance(exc, OSError):
                raise StorageError(state.name, f"cannot create partitions: {exc}") from exc
            raise
        return logs

    async def _discard_partition_logs(self, logs: list[PartitionLog]) -> None:
        """Undo _create_partition_logs: stop the writers, remove the directories (durably)."""
        followed = [log for log in logs if isinstance(log, FollowedPartition)]
        if followed:
            assert self.channel is not None
            by_shard: dict[int, list[int]] = {}
            for f in followed:
                self.family.unfollow(f)
                by_shard.setdefault(f.owner, []).append(f.partition)
            for shard, ps in by_shard.items():
                try:
                    await self.channel.call(shard, "discard_partitions", followed[0].topic_id, ps)
                except EngineError as exc:  # its start-up removes them (empty leftovers)
                    logger.warning("shard %d could not discard partitions %s: %s", shard, ps, exc)
            logs = [log for log in logs if not isinstance(log, FollowedPartition)]
        if self.family is not None:
            for log in logs:
                self.family.retire_slot(log)
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
            await self.family.forward_topic_change("alter_topic_configs", name, dict(configs), replace_all=replace_all)
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

    async def add_partitions(
        self, name: str, count: int, *, internal: bool = False
    ) -> TopicState:
        """Grow a topic to `count` partitions; all or nothing, as create_topic. `internal`: the
        server grows one of its own (__queue_state to a family's size: queues.py)."""
        if self.sharded and not self.is_controller:
            await self.family.forward_topic_change(
                "add_partitions", name, count, internal=internal
            )
            return self.topic(name)
        async with self._topic_lock:
            state = self.topic(name) if internal else self._user_topic(name)
            current = len(state.partitions)
            if isinstance(count, bool) or not isinstance(count, int) or count <= current or count > MAX_PARTITIONS:
                raise InvalidPartitionsError(count if isinstance(count, int) else -1, current)
            self._check_partition_budget(
                count - current, internal=internal, topic=name, first=current
            )
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
                await self.family.forward_topic_change("delete_topic", name)
                return
            async with self._topic_lock:
                state = self._user_topic(name)
                await self._append_event("topic_deleted", name, state.meta.topic_id)
                del self.topics[name]
                await self.family.drop_topic_here(state)
                await self._sync_family()
                assert self.groups is not None
                await self.groups.forget_topic(name)
                if self.queues is not None:
                    await self.queues.forget_topic(name)
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
            if self.queues is not None:
                await self.queues.forget_topic(name)
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
                    epochs = kafka_import.leader_epochs(
                        source, staging, loaded.log_start_offset, loaded.next_offset
                    )
                    write_leader_epoch_checkpoint(staging, epochs)
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
        has its own limit): a budget that holds one append's descriptors serves any number
        (descriptors.max_partitions_for: idle partitions hold none, unflushed or not).
        Partitions past what the budget keeps open at once are served all the same, taking
        turns."""
        if internal:
            return
        in_use = sum(len(s.partitions) for name, s in self.topics.items() if name not in INTERNAL_TOPICS)
        if in_use + adding > self.config.max_partitions:
            raise InvalidPartitionsError(
                adding,
                reason=f"the server holds {in_use} partitions; {adding} more would pass its limit of "
                f"{self.config.max_partitions}: raise EVENTLOG_MAX_PARTITIONS to at least "
                f"{in_use + adding} and restart (docs/OPERATIONS.md, 'Partition limits')",
            )
        counts = self._partitions_per_process(topic, range(first, first + adding))
        most = max(counts)
        if self.sharded and most > REGION_SLOTS:
            raise InvalidPartitionsError(
                adding,
                reason=f"a process of this family would own {most} partitions; the partition table "
                f"holds {REGION_SLOTS} a process: run more processes (eventlog serve --processes, "
                f"EVENTLOG_PROCESSES) and restart (docs/OPERATIONS.md, 'Partition limits')",
            )
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
                "%d partitions on this process, and its open-files limit of %d leaves no descriptor for an append "
                "after the reserve for connections: they start, but appends may answer 503 too_many_open_files, and "
                "no partitions can be added; raise the limit to at least %d (ulimit -n, systemd LimitNOFILE=, "
                "docker --ulimit nofile=) and restart",
                most, BUDGET.limit, limit_for(max(most, 1)),
            )
        elif BUDGET.active_partitions < wanted and self.shard_index == 0:
            logger.warning(
                "open-files limit %d is low: %d partitions active at once%s (EVENTLOG_MAX_PARTITIONS allows %d), "
                "the others take turns (their files closed and opened again), after %d descriptors kept for "
                "connections; raise it to at least %d (ulimit -n, systemd LimitNOFILE=, docker --ulimit nofile=) "
                "to keep them all open",
                BUDGET.limit, BUDGET.active_partitions, " per process" if self.shard_count > 1 else "",
                self.config.max_partitions, BUDGET.reserve, limit_for(wanted),
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
        with gc_paused():
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


@asynccontextmanager
async def open_engine(config: EngineConfig, clock: Callable[[], int] = wall_clock_ms) -> AsyncIterator[LogManager]:
    """Open (recover) every log dir, run the writers, and close everything cleanly on exit."""
    BUDGET.configure(raise_open_files_limit())
    commits.batcher_for(asyncio.get_running_loop()).shared_sync = config.shared_sync and commits.kernel_reports_syncfs_errors()
    manager = LogManager(config, clock)
    await anyio.to_thread.run_sync(manager._open_dirs)
    if config.shard is not None:
        manager.family = ShardFamily(manager, config.shard)
        await manager.family.start()
    try:
        async with anyio.create_task_group() as tg:
            if manager.family is not None:
                tg.start_soon(manager.family.heartbeat)
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
        if manager.family is not None:
            await manager.family.close()
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


def _load_leader_epoch(directory: Path, loaded: LoadedLog, existed: bool) -> int:
    """The epoch a loaded partition writes its batches in: the latest of its
    leader-epoch-checkpoint (checkpoints.py). Without one (a partition being created, a dir
    written before the file existed), or with one holding no entry, eventlog's own epoch is
    the newest and `0 <log start>` is written. A file that does not parse is rebuilt from the
    batches' epochs, as Kafka's recovery rebuilds its cache. A write that fails fails a
    partition being created; an existing one is served all the same, told in the log."""
    try:
        entries = read_leader_epoch_checkpoint(directory)
    except StorageError as exc:
        entries = _leader_epochs_of(loaded)
        logger.warning("%s: %s; rebuilt from the batches: %s", directory.name, exc, entries)
        if entries is None:  # the batches cannot be read either: the file stays as it is
            return EVENTLOG_LEADER_EPOCH
    else:
        if entries:
            return entries[-1][0]
    entries = entries or [(EVENTLOG_LEADER_EPOCH, loaded.log_start_offset)]
    try:
        write_leader_epoch_checkpoint(directory, entries)
    except (OSError, StorageError) as exc:
        if not existed:
            raise
        logger.warning("%s: %s not written: %s", directory.name, LEADER_EPOCH, exc)
    return entries[-1][0]


def _leader_epochs_of(loaded: LoadedLog) -> LeaderEpochs | None:
    """The leader-epoch history the batches of a loaded log carry, trimmed to its offsets;
    None when a segment cannot be read through."""
    try:
        pairs = [
            (header.partition_leader_epoch, header.base_offset)
            for segment in loaded.segments
            for header in segment.headers(0, segment.size)
        ]
    except EngineError as exc:
        name = loaded.segments[0].directory.name
        logger.warning("%s: leader epochs not read from the batches: %s", name, exc)
        return None
    history = leader_epochs_from_batches(pairs)
    return truncate_leader_epochs(history, loaded.log_start_offset, loaded.next_offset)


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
