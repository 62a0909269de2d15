"""The log manager: every partition log of a server, its log dirs, topics and checkpoints.

Start-up (open_engine):
1. Lock every log dir, read or create meta.properties, note the clean-shutdown markers.
2. Load __metadata-0 and replay it into the topic image.
3. Remove directories of deleted topics ("*-delete", or a topic_id the image marks deleted).
4. Load every partition of every topic in parallel worker threads (recovery.load_log): a
   clean dir loads lazily, an unclean one scans from each partition's recovery point.
5. Start one writer task per partition, remove the clean-shutdown markers, start the
   checkpoint loop. Only then does open_engine yield.

Shutdown (leaving open_engine): writers drain their queues and close their active segments
(fsync, trimmed indexes); then recovery-point and log-start checkpoints are written, and
finally the clean-shutdown marker, so the next start can skip the scan.

Topic changes are serialised by one lock; each appends its event to __metadata-0 (fsynced)
before touching any directory, and start-up makes directories agree with the events.
"""

from __future__ import annotations

import logging
import os
import shutil
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

import anyio
from anyio.abc import TaskGroup

from . import filenames
from .checkpoints import CLEANER_OFFSET, LOG_START_OFFSET, RECOVERY_POINT
from .config import CONFIG_DEFS, LogConfig, normalise_overrides, validate_topic_name
from .errors import (
    DataDirError,
    EngineError,
    InvalidConfigError,
    InvalidTopicNameError,
    InvalidPartitionsError,
    InvalidRequestError,
    PartitionNotFoundError,
    TopicExistsError,
    TopicNotFoundError,
)
from . import kafka_import
from .fileutil import fsync_dir
from .log_dirs import LogDir
from .groups import CONSUMER_OFFSETS_CONFIG, GroupOffsets
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
from .partition_log import PartitionLog, prepare_batches, wall_clock_ms
from .reader import read_records
from .records import encode_batch
from .producer_state import DEFAULT_EXPIRATION_MS, ProducerStateManager, rebuild as rebuild_producer_state
from .recovery import LoadStats, load_log
from .segment import LogSegment

logger = logging.getLogger("eventlog.engine")

PARTITION_METADATA = "partition.metadata"
# compacted: every event but topic_deleted carries the topic's whole state (metadata.py)
METADATA_LOG_CONFIG = LogConfig(cleanup_policy="compact", retention_ms=-1, segment_bytes=64 * 1024 * 1024)
MAX_PARTITIONS = 10_000  # per topic


@dataclass(frozen=True)
class EngineConfig:
    """What the engine needs from the settings (built by app/)."""

    log_dirs: tuple[Path, ...]
    default_log_config: LogConfig = LogConfig()
    node_id: int = 0
    recovery_threads: int = 2
    checkpoint_interval_ms: int = 60_000
    default_partitions: int = 1
    # partitions of user topics on this server: each costs three open descriptors while active
    max_partitions: int = 4096
    # idempotent producers (and Idempotency-Key requests) are remembered this long after
    # their last batch's timestamp (Kafka's producer.id.expiration.ms)
    producer_id_expiration_ms: int = DEFAULT_EXPIRATION_MS
    # how long deleting a topic, and shutdown, wait for a closed partition's writer to finish
    writer_stop_timeout_ms: int = 30_000


@dataclass
class TopicState:
    meta: TopicMeta
    config: LogConfig
    partitions: list[PartitionLog] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.meta.name


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
        self._log_starts: dict[tuple[str, int], int] = {}
        # the compactor's first dirty offset per partition (cleaner-offset-checkpoint)
        self._cleaner_offsets: dict[tuple[str, int], int] = {}

    # -- lookups ------------------------------------------------------------------------------

    def topic(self, name: str) -> TopicState:
        state = self.topics.get(name)
        if state is None:
            raise TopicNotFoundError(name)
        return state

    def partition(self, topic: str, partition: int) -> PartitionLog:
        state = self.topic(topic)
        if not 0 <= partition < len(state.partitions):
            raise PartitionNotFoundError(topic, partition, len(state.partitions))
        return state.partitions[partition]

    def all_partitions(self) -> list[PartitionLog]:
        return [p for state in self.topics.values() for p in state.partitions]

    def log_dir_of(self, log: PartitionLog) -> LogDir:
        return self._partition_dir[log]

    # -- start-up -----------------------------------------------------------------------------

    async def _open(self, tg: TaskGroup) -> None:
        self._tg = tg
        clean = all(d.had_clean_shutdown for d in self.dirs)
        await self._load_metadata(tg)
        await anyio.to_thread.run_sync(self._remove_deleted_topic_dirs)
        loaded: list[tuple[TopicState, int, PartitionLog]] = []

        async def load_one(state: TopicState, p: int) -> None:
            log = await self._load_partition(state.name, p, state.config, state.meta.topic_id)
            loaded.append((state, p, log))

        states = []
        for name, meta in self.image.topics.items():
            state = TopicState(meta, self.config.default_log_config.with_overrides(meta.overrides))
            state.partitions = [None] * meta.partitions  # type: ignore[list-item]
            states.append(state)
        async with anyio.create_task_group() as loaders:
            for state in states:
                for p in range(state.meta.partitions):
                    loaders.start_soon(load_one, state, p)
        for state in states:
            self.topics[state.name] = state
        for state, p, log in loaded:
            state.partitions[p] = log
        for state, p, log in loaded:
            await tg.start(log.run)
        await self._open_group_offsets()
        for d in self.dirs:
            await anyio.to_thread.run_sync(d.clear_clean_shutdown)
        tg.start_soon(self._checkpoint_loop)
        self.ready = True
        logger.info(
            "engine ready: %d topic(s), %d partition(s), %s shutdown",
            len(self.image.topics), len(self.all_partitions()), "clean" if clean else "unclean",
        )

    def _open_dirs(self) -> None:
        cluster_id = None
        opened: list[LogDir] = []
        try:
            for d in self.dirs:
                d.open(self.config.node_id, cluster_id)
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
            loaded = load_log(
                directory,
                config,
                clean_shutdown=log_dir.had_clean_shutdown,
                recovery_point=self._recovery_points.get(tp, 0),
                log_start_offset=self._log_starts.get(tp, 0),
                now_ms=self.clock(),
            )
            if topic_id is not None and not (directory / PARTITION_METADATA).exists():
                _write_partition_metadata(directory, topic_id)
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
        )
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

    def _remove_deleted_topic_dirs(self) -> None:
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
                topic_id = _read_partition_topic_id(Path(entry.path))
                meta = self.image.topics.get(parsed[0])
                if topic_id is not None and topic_id in self.image.deleted_topic_ids:
                    logger.info("removing %s, left over from a deleted topic", entry.path)
                    shutil.rmtree(entry.path, ignore_errors=True)
                elif meta is None:
                    logger.warning("ignoring %s: no such topic in the metadata log", entry.path)
                elif topic_id is not None and topic_id != meta.topic_id:
                    aside = f"{entry.path}.{topic_id}-stray"
                    logger.warning("moving %s aside to %s: it belongs to another topic id", entry.path, aside)
                    os.replace(entry.path, aside)
                elif parsed[1] >= meta.partitions:
                    logger.warning("ignoring %s: topic has %d partitions", entry.path, meta.partitions)
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
        """Validate, record topic_created, then create the partition directories.

        Internal topics (__metadata, __consumer_offsets) are created by the server only.
        """
        validate_topic_name(name)
        count = self.config.default_partitions if partitions is None else partitions
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PARTITIONS:
            raise InvalidPartitionsError(count if isinstance(count, int) else -1)
        overrides = normalise_overrides(configs or {})
        config = self.config.default_log_config.with_overrides(overrides)
        async with self._topic_lock:
            if name in self.topics or (name in INTERNAL_TOPICS and not internal):
                raise TopicExistsError(name)
            self._check_collision(name)
            if not internal:
                self._check_partition_budget(count)
            topic_id = new_topic_id()
            await self._append_event("topic_created", name, topic_id, partitions=count, configs=overrides)
            state = TopicState(self.image.topics[name], config)
            self.topics[name] = state
            await self._add_partition_logs(state, count)
            return state

    async def _add_partition_logs(self, state: TopicState, count: int) -> None:
        assert self._tg is not None
        for p in range(len(state.partitions), count):
            log = await self._load_partition(state.name, p, state.config, state.meta.topic_id)
            await self._tg.start(log.run)
            state.partitions.append(log)

    async def alter_topic_configs(self, name: str, configs: Mapping[str, Any], *, replace_all: bool = False) -> TopicState:
        """Merge `configs` into the topic's overrides (a null value removes an override)."""
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
            return state

    async def add_partitions(self, name: str, count: int) -> TopicState:
        async with self._topic_lock:
            state = self._user_topic(name)
            current = len(state.partitions)
            if isinstance(count, bool) or not isinstance(count, int) or count <= current or count > MAX_PARTITIONS:
                raise InvalidPartitionsError(count if isinstance(count, int) else -1, current)
            self._check_partition_budget(count - current)
            await self._append_event(
                "partitions_added", name, state.meta.topic_id, partitions=count,
                configs=dict(state.meta.overrides), created_ms=state.meta.created_ms,
            )
            state.meta = self.image.topics[name]
            await self._add_partition_logs(state, count)
            return state

    async def delete_topic(self, name: str) -> None:
        """Record topic_deleted, stop the writers, rename the directories to *-delete and
        remove them in the background (start-up finishes any removal a crash interrupted)."""
        async with self._topic_lock:
            state = self._user_topic(name)
            await self._append_event("topic_deleted", name, state.meta.topic_id)
            del self.topics[name]
            for log in state.partitions:
                await log.close(deleted=True)  # ends its streams and long-polls at once
            await self._wait_stopped(state.partitions, f"deleting {name}")
            doomed = []
            for log in state.partitions:
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
        log_start_offsets: Mapping[int, int] | None = None,
    ) -> tuple[TopicState, dict[int, LoadStats]]:
        """Import partition directories written by Kafka (see kafka_import.py for the steps).

        Partitions missing from `partition_dirs` (below the highest number) start empty.
        Raises TopicExistsError if the topic exists here already.
        """
        validate_topic_name(name)
        count = max(partition_dirs) + 1
        if count > MAX_PARTITIONS:
            raise InvalidPartitionsError(count)
        config = self.config.default_log_config
        stats: dict[int, LoadStats] = {}
        async with self._topic_lock:
            if name in self.topics or name in INTERNAL_TOPICS:
                raise TopicExistsError(name)
            self._check_collision(name)
            self._check_partition_budget(count)
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
            await self._append_event("topic_created", name, topic_id, partitions=count, configs={})
            state = TopicState(self.image.topics[name], config)
            self.topics[name] = state
            await self._add_partition_logs(state, count)
        await self.checkpoint()
        return state, stats

    def _check_partition_budget(self, adding: int) -> None:
        in_use = sum(len(s.partitions) for name, s in self.topics.items() if name not in INTERNAL_TOPICS)
        if in_use + adding > self.config.max_partitions:
            raise InvalidPartitionsError(
                adding,
                reason=f"the server holds {in_use} partitions; {adding} more would pass its limit of "
                f"{self.config.max_partitions} (EVENTLOG_MAX_PARTITIONS)",
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

    async def _on_log_start_change(self, log: PartitionLog) -> None:
        await self._write_checkpoints(self._partition_dir[log])

    async def _write_checkpoints(self, log_dir: LogDir, exclude: set[tuple[str, int]] = frozenset()) -> None:  # type: ignore[assignment]
        lock = self._checkpoint_locks.setdefault(log_dir.path, anyio.Lock())
        async with lock:
            logs = [
                log for log, d in self._partition_dir.items()
                if d is log_dir and (log.topic, log.partition) not in exclude
            ]
            recovery = {(log.topic, log.partition): log.recovery_point for log in logs}
            starts = {(log.topic, log.partition): log.log_start_offset for log in logs}
            await anyio.to_thread.run_sync(log_dir.write_checkpoint, RECOVERY_POINT, recovery)
            await anyio.to_thread.run_sync(log_dir.write_checkpoint, LOG_START_OFFSET, starts)

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
            await anyio.to_thread.run_sync(log_dir.write_checkpoint, CLEANER_OFFSET, entries)

    async def checkpoint(self) -> None:
        for d in self.dirs:
            await self._write_checkpoints(d)

    async def _checkpoint_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.checkpoint_interval_ms / 1000)
            try:
                await self.checkpoint()
            except Exception:  # noqa: BLE001 -- keep checkpointing; the error is logged
                logger.exception("writing checkpoints failed")

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

    async def _close(self) -> None:
        self.ready = False
        logs = self.all_partitions()
        for log in logs:
            await log.close()
        stopped = await self._wait_stopped(logs, "shutdown")
        clean = stopped and all(log.failed is None for log in logs)
        for d in self.dirs:
            await self._write_checkpoints(d)
            if clean:
                await anyio.to_thread.run_sync(d.mark_clean_shutdown)
        logger.info("engine closed (%s)", "clean" if clean else "with failed partitions: next start recovers")


@asynccontextmanager
async def open_engine(config: EngineConfig, clock: Callable[[], int] = wall_clock_ms) -> AsyncIterator[LogManager]:
    """Open (recover) every log dir, run the writers, and close everything cleanly on exit."""
    manager = LogManager(config, clock)
    await anyio.to_thread.run_sync(manager._open_dirs)
    try:
        async with anyio.create_task_group() as tg:
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
    path = directory / PARTITION_METADATA
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"version: 0\ntopic_id: {topic_id}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
