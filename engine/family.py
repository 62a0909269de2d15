"""Ownership and routing in a shard family: a shard's side of `eventlog serve --processes N`.

LogManager (log_manager.py) keeps the logs on disk: loading, recovery, topic changes,
checkpoints. This keeps who owns what and how the shards reach one another, as Kafka keeps
ReplicaManager apart from LogManager: the partition table and its slots (shards.py), the
channel and its handlers, the partitions other shards own (follower.py), the metadata log
followed from shard 0, and the heartbeat the supervisor watches (app/supervisor.py).

In a shard family (config.shard) every partition has one owner shard (shards.owner_of),
which loads, recovers and writes it; the other shards follow it (follower.py). Shard 0,
the controller, also owns __metadata-0 and __consumer_offsets: every topic change runs
there (forwarded by the others), and returns only once every shard has applied the
event, so whichever shard a client's next request reaches knows the change.

Start-up: shard 0 loads the metadata log, removes leftovers of deleted topics and
publishes the log's slot; the others wait for that slot and replay the log from the
files. Each shard loads the partitions it owns (recovery) and publishes their slots,
then says LOADED. Shard 0 waits for every shard's LOADED (each has read the clean-
shutdown markers by then), opens the group offsets, removes the markers, says SERVING;
the others follow the metadata log from then on and say SERVING.

A shard that starts again alone (ShardSpec.rejoin: its supervisor restarted it into a family
that serves) waits for no other shard but, if it is not the controller, shard 0; it removes
what deleted topics left in the directories it owns, and goes on from its slots' generations.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import anyio
import orjson
from anyio.abc import TaskGroup

from . import filenames
from .config import LogConfig
from .descriptors import BUDGET
from .errors import (
    InvalidRequestError,
    LogClosedError,
    PartitionOfflineError,
    ShardUnavailableError,
    StorageError,
    TopicNotFoundError,
)
from .fileutil import fsync_dir
from .follower import FollowedPartition
from .groups import GroupFilter, GroupPage, cut_page
from .metadata import METADATA_TOPIC, TopicMeta, decode_event
from .partition_log import PartitionLog, PreparedBatch, gc_paused, loop_turn, start_writers
from .shard_queues import QUEUE_CALLS, ShardQueues
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
from .topic_state import METADATA_LOG_CONFIG, OfflinePartition, TopicState

if TYPE_CHECKING:
    from .log_manager import LogManager, ShardSpec

logger = logging.getLogger("eventlog.engine")

# the most groups one listing call to shard 0 carries (RemoteGroups.groups_page)
PAGE_CALL_GROUPS = 10_000


class ShardFamily:
    """This shard's place in its family (one per LogManager of a shard; see the module's doc)."""

    def __init__(self, manager: LogManager, spec: ShardSpec) -> None:
        self.manager = manager
        self.spec = spec
        self.table = PartitionTable(table_path(spec.run_dir), spec.count)
        self.channel = ShardChannel(spec.run_dir, spec.index, spec.count, self.table, spec.call_timeout_s)
        self._slots: dict[PartitionLog, tuple[int, int]] = {}  # owned log -> (slot index, key)
        self._followed: dict[int, FollowedPartition] = {}  # slot key -> followed partition
        self._pending: dict[tuple[str, int], PartitionLog] = {}  # (topic id, p) prepared for the controller
        self._meta_applied = 0  # followers: metadata log offset applied up to
        self._meta_lock = anyio.Lock()
        self._notes: set[int] = set()
        self._notes_scheduled = False

    async def start(self) -> None:
        """Say this process is the shard's now (starting, its pid, a first beat), and take the
        other shards' requests."""
        self.table.begin(self.spec.index)
        self.register_handlers()
        await self.channel.start()

    async def close(self) -> None:
        await self.channel.close()
        self.table.close()

    async def create_partitions(self, state: TopicState, numbers: range) -> list[PartitionLog]:
        assert self.manager._tg is not None and self.channel is not None
        by_shard: dict[int, list[int]] = {}
        for p in numbers:
            by_shard.setdefault(owner_of(state.name, p, self.manager.shard_count), []).append(p)
        made: dict[int, Any] = {}
        try:
            for p in by_shard.pop(self.manager.shard_index, []):
                log = await self.manager._load_partition(state.name, p, state.config, state.meta.topic_id)
                made[p] = log
                await self.manager._tg.start(log.run)
                self.register_owned(log, state.meta.topic_id)
            for shard, ps in by_shard.items():
                await self.channel.call(shard, "prepare_partitions", state.name, state.meta.topic_id, dict(state.meta.overrides), ps)
                for p in ps:
                    made[p] = self.follow(state.name, state.meta.topic_id, p, state.config)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self.manager._discard_partition_logs(list(made.values()))
            if isinstance(exc, OSError):
                raise StorageError(state.name, f"cannot create partitions: {exc}") from exc
            raise
        return [made[p] for p in numbers]



    def _topic_id_of(self, log: PartitionLog) -> str:
        state = self.manager.topics.get(log.topic)
        return state.meta.topic_id if state is not None else ""

    def register_owned(self, log: PartitionLog, topic_id: str) -> None:
        """Give an owned partition its slot in the partition table and publish it."""
        if self.table is None:
            return
        key = slot_key(log.topic, topic_id, log.partition)
        index = self.table.claim(self.manager.shard_index, key)
        # a slot this shard's previous process wrote: go on from its generation, so that no
        # follower takes this process's segment list for the one it already holds
        log.generation = max(log.generation, self.table.generation(self.manager.shard_index, index) + 1)
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
            self.manager.shard_index, index, key,
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
        for shard in range(self.manager.shard_count):
            if shard != self.manager.shard_index:
                self.channel.note(shard, "wake", keys)

    def _on_wake(self, keys: list[int]) -> None:
        for key in keys:
            followed = self._followed.get(key)
            if followed is not None:
                followed._wake_waiters()  # the owner published: a note reached us

    def retire_slot(self, log: PartitionLog) -> None:
        """The partition's topic is gone: its slot says so (readers elsewhere get 404)."""
        entry = self._slots.pop(log, None)
        if entry is None or self.table is None:
            return
        index, key = entry
        view = log.view
        self.table.publish(
            self.manager.shard_index, index, key,
            SlotState(view.high_watermark, view.log_start_offset, log.generation, view.active.base_offset, view.active_end, DELETED),
        )
        self._notes.add(key)
        self._send_notes()

    def follow(self, topic: str, topic_id: str, partition: int, config: LogConfig) -> FollowedPartition:
        dirs = self.manager.dirs  # (one log dir: no look on the loop for each of 25,000)
        found = dirs[0] if len(dirs) == 1 else self.manager._find_partition_dir(topic, partition)
        log_dir = found or dirs[0]
        directory = log_dir.path / filenames.partition_dir_name(topic, partition)
        owner = owner_of(topic, partition, self.manager.shard_count)
        followed = FollowedPartition(self.manager, topic, topic_id, partition, directory, config, owner)
        self._followed[followed.key] = followed
        return followed

    def unfollow(self, followed: FollowedPartition) -> None:
        self._followed.pop(followed.key, None)

    async def open(self, tg: TaskGroup) -> None:
        assert self.manager.config.shard is not None
        self.manager._tg = tg
        me = self.manager.shard_index
        table, channel = self.table, self.channel
        assert table is not None and channel is not None
        rejoin = self.manager.config.shard.rejoin
        clean = all(d.had_clean_shutdown for d in self.manager.dirs)
        if self.manager.is_controller:
            await self.manager._load_metadata(tg)
            # alone again in a family that serves: only its own partitions' leftovers are its to
            # remove (the others' shards may be creating theirs right now)
            await anyio.to_thread.run_sync(self.manager._remove_deleted_topic_dirs, rejoin)
            assert self.manager.metadata_log is not None
            self.register_owned(self.manager.metadata_log, "")
        else:
            await self._follow_metadata_log()
            if rejoin:  # topics deleted while it was down: their leftovers here are its own
                await anyio.to_thread.run_sync(self.manager._remove_deleted_topic_dirs, True)
        with gc_paused():
            loaded = await self.manager._load_topics()
            await start_writers(tg, [log for _state, _p, log in loaded])
            for i, (state, _p, log) in enumerate(loaded):
                self.register_owned(log, state.meta.topic_id)
                await loop_turn(i)
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
        if self.manager.is_controller:
            await self.manager._open_group_offsets()
            await self._open_queues()
            if not rejoin:
                for d in self.manager.dirs:
                    await anyio.to_thread.run_sync(d.clear_clean_shutdown)
        else:
            await table.wait_states(SERVING, forever, range(0, 1))
            self.manager.groups = RemoteGroups(self)  # type: ignore[assignment]
            await self.catch_up_metadata()
            await self._open_queues()  # (shard 0's queue definitions, and its migration, done)
            tg.start_soon(self._metadata_loop)
        table.set_state(me, SERVING)
        if not rejoin:
            await table.wait_states(SERVING, forever)
        tg.start_soon(self.manager._checkpoint_loop)
        self.manager.ready = True
        logger.info(
            "shard %d of %d ready: %d topic(s), %d partition(s) owned here, %d offline, %s; %s", me,
            self.manager.shard_count, len(self.manager.image.topics), len(self.manager.all_partitions()),
            len(self.manager._offline), self.manager._last_shutdown(clean), BUDGET.describe(),
        )
        self.manager._log_open_files_limit()

    async def _open_queues(self) -> None:
        """The windows of the queues' partitions this shard owns (replayed), served with the
        others' through the channel (shard_queues.py)."""
        await self.manager._open_queues()
        assert self.manager.queues is not None
        local = self.manager.queues
        self.manager.queues = ShardQueues(self, local)  # type: ignore[assignment,arg-type]

    async def heartbeat(self) -> None:
        """Stamp this shard's beat in the table every BEAT_S, from the event loop: the
        supervisor kills a shard whose loop stops beating (a stopped or hung process), and the
        others stop sending it work. Each beat also sweeps the channel's overdue requests."""
        assert self.table is not None and self.channel is not None
        while True:
            self.table.beat(self.manager.shard_index)
            self.channel.sweep()
            await anyio.sleep(BEAT_S)

    def _offline_note(self, shard: int) -> Path:
        assert self.manager.config.shard is not None
        return self.manager.config.shard.run_dir / f"offline-{shard}.json"

    def _write_offline_note(self) -> None:
        """The partitions this shard could not load, with why, for the others (run dir)."""
        notes = [
            {"topic": o.topic, "partition": o.partition, "path": str(o.error.path), "reason": o.error.reason}
            for o in self.manager._offline.values()
        ]
        self._offline_note(self.manager.shard_index).write_bytes(orjson.dumps(notes))

    def _read_offline_notes(self) -> None:
        """Partitions other shards could not load are offline here too, with their reasons
        (a request for one answers as on its owner)."""
        for shard in range(self.manager.shard_count):
            if shard == self.manager.shard_index:
                continue
            try:
                notes = orjson.loads(self._offline_note(shard).read_bytes())
            except (FileNotFoundError, orjson.JSONDecodeError):
                continue
            for note in notes:
                state = self.manager.topics.get(note["topic"])
                p = note["partition"]
                if state is None or not 0 <= p < len(state.partitions) or not isinstance(state.partitions[p], FollowedPartition):
                    continue
                followed = state.partitions[p]
                self.unfollow(followed)
                log_dir = self.manager._find_partition_dir(state.name, p) or self.manager.dirs[0]
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
        log = self.follow(METADATA_TOPIC, "", 0, METADATA_LOG_CONFIG)
        self.manager.metadata_log = log  # type: ignore[assignment]
        self._meta_applied = log.log_start_offset
        await self._read_metadata(apply=False)
        meta = TopicMeta(METADATA_TOPIC, "", 1, {})
        self.manager.topics[METADATA_TOPIC] = TopicState(meta, METADATA_LOG_CONFIG, [log])  # type: ignore[list-item]

    async def _read_metadata(self, *, apply: bool) -> None:
        log = self.manager.metadata_log
        assert log is not None
        while self._meta_applied < log.high_watermark:
            offset = max(self._meta_applied, log.log_start_offset)
            result = await log.read_records(offset, 10_000, 4 * 1024 * 1024)
            for record in result.records:
                if record.value is not None:
                    self.manager.image.apply(decode_event(record.value))
            if result.next_offset <= offset:
                break
            self._meta_applied = result.next_offset
        if apply:
            await self._reconcile()

    async def catch_up_metadata(self, until: int | None = None) -> None:
        """A follower: apply what the metadata log holds now (at least up to `until`)."""
        if self.manager.is_controller:
            return
        async with self._meta_lock:
            log = self.manager.metadata_log
            assert log is not None
            if until is not None and log.high_watermark < until:
                await log.wait_for_data(until - 1, 30)
            await self._read_metadata(apply=True)

    async def _metadata_loop(self) -> None:
        log = self.manager.metadata_log
        assert log is not None
        while not self.manager.stopping:
            try:
                await log.wait_for_data(self._meta_applied, 5)
                if self.manager.stopping:
                    return
                await self.catch_up_metadata()
            except LogClosedError:
                return
            except Exception:
                logger.exception("following the metadata log failed")
                await anyio.sleep(1)

    async def _reconcile(self) -> None:
        """A follower: make the topics agree with the image (created, grown, altered, deleted)."""
        for name in list(self.manager.topics):
            if name == METADATA_TOPIC:
                continue
            state = self.manager.topics[name]
            meta = self.manager.image.topics.get(name)
            if meta is None or meta.topic_id != state.meta.topic_id:
                del self.manager.topics[name]
                await self.drop_topic_here(state)
        for name, meta in list(self.manager.image.topics.items()):
            if name == METADATA_TOPIC:
                continue
            config = self.manager.config.default_log_config.with_overrides(meta.overrides)
            state = self.manager.topics.get(name)
            if state is None:
                state = TopicState(meta, config)
                state.partitions = await self._partitions_here(state, range(meta.partitions))
                self.manager.topics[name] = state
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
        queues = self.manager.queues
        if isinstance(queues, ShardQueues):  # (queues made, deleted, gone with their topic)
            await queues.sync_definitions()

    async def _partitions_here(self, state: TopicState, numbers: range) -> list[Any]:
        """This shard's objects for new partitions: the logs it prepared for the controller
        (or loads now), followers of the others'."""
        assert self.manager._tg is not None
        out: list[Any] = []
        for p in numbers:
            if not self.manager.owns(state.name, p):
                out.append(self.follow(state.name, state.meta.topic_id, p, state.config))
                continue
            log = self._pending.pop((state.meta.topic_id, p), None)
            if log is None:
                try:
                    log = await self.manager._load_partition(state.name, p, state.config, state.meta.topic_id)
                except Exception as exc:
                    self.manager._set_offline(state, p, exc)
                    out.append(self.manager._offline[(state.name, p)])
                    continue
                await self.manager._tg.start(log.run)
                self.register_owned(log, state.meta.topic_id)
            log.config = state.config
            out.append(log)
        return out

    async def drop_topic_here(self, state: TopicState) -> None:
        """A deleted topic: stop following what others own; close, retire and remove what this
        shard owns (as delete_topic does in a lone process)."""
        for log in state.partitions:
            if isinstance(log, FollowedPartition):
                self.unfollow(log)
                await log.close(deleted=True)
        owned = [log for log in state.partitions if isinstance(log, PartitionLog)]
        for log in owned:
            await log.close(deleted=True)
        await self.manager._wait_stopped(owned, f"deleting {state.name}")
        doomed = []
        for log in state.partitions:
            if isinstance(log, OfflinePartition):
                if not self.manager.owns(log.topic, log.partition):
                    continue
                log_dir = self.manager._offline.pop((log.topic, log.partition)).log_dir
                if not log.directory.exists():
                    continue
            elif isinstance(log, PartitionLog):
                self.retire_slot(log)
                log_dir = self.manager._partition_dir.pop(log)
            else:
                continue
            target = log.directory.with_name(f"{log.directory.name}.{state.meta.topic_id}{filenames.DELETE_DIR_SUFFIX}")
            await anyio.to_thread.run_sync(os.replace, log.directory, target)
            await anyio.to_thread.run_sync(fsync_dir, log_dir.path)
            doomed.append(target)
        tps = {(state.name, p) for p in range(len(state.partitions))}
        for tp in tps:
            self.manager._cleaner_offsets.pop(tp, None)
        if owned or doomed:
            for d in self.manager.dirs:
                await self.manager._write_checkpoints(d, exclude=tps)
        assert self.manager._tg is not None
        for path in doomed:
            self.manager._tg.start_soon(anyio.to_thread.run_sync, shutil.rmtree, path, True)

    async def sync(self) -> None:
        """The controller, after a topic change: return once every shard has applied it (or
        cannot: see confirm)."""
        assert self.manager.metadata_log is not None
        until = self.manager.metadata_log.high_watermark
        channel = self.channel

        async def confirm(shard: int) -> None:
            try:
                await channel.call(shard, "sync_metadata", until)
            except ShardUnavailableError as exc:
                # the change is in the metadata log: a shard that is down replays it when it
                # starts again, one that stopped answering is killed and does the same
                logger.warning("shard %d did not confirm metadata up to offset %d: %s", shard, until, exc)

        async with anyio.create_task_group() as tg:
            for shard in range(1, self.manager.shard_count):
                tg.start_soon(confirm, shard)

    async def forward_topic_change(self, what: str, *args: Any, **kwargs: Any) -> Any:
        """A follower: the controller makes the change (and every shard applies it first)."""
        assert self.channel is not None
        await self.channel.call(0, "topic_change", what, args, kwargs)
        await self.catch_up_metadata()

    # handlers of the channel (registered by start)

    async def _on_topic_change(self, what: str, args: tuple, kwargs: dict) -> None:
        if what not in ("create_topic", "alter_topic_configs", "add_partitions", "delete_topic"):
            raise InvalidRequestError(f"unknown topic change {what!r}")
        await getattr(self.manager, what)(*args, **kwargs)

    async def _on_sync_metadata(self, until: int) -> None:
        await self.catch_up_metadata(until)

    async def _on_prepare_partitions(self, topic: str, topic_id: str, overrides: dict[str, str], numbers: list[int]) -> None:
        """The controller creates a topic (or partitions): create this shard's, unpublished."""
        assert self.manager._tg is not None
        config = self.manager.config.default_log_config.with_overrides(overrides)
        created: list[PartitionLog] = []
        try:
            for p in numbers:
                log = await self.manager._load_partition(topic, p, config, topic_id)
                created.append(log)
                await self.manager._tg.start(log.run)
                self.register_owned(log, topic_id)
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
            self.retire_slot(log)
        await self.manager._discard_partition_logs(logs)

    async def _on_partition(self, what: str, topic: str, topic_id: str, partition: int, *args: Any) -> Any:
        """A request another shard forwards to a partition this shard owns."""
        state = self.manager.topics.get(topic)
        if state is None or state.meta.topic_id != topic_id:
            await self.catch_up_metadata()
            state = self.manager.topics.get(topic)
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
        log = self.manager.partition(topic, partition)
        if not isinstance(log, PartitionLog):
            raise PartitionOfflineError(topic, partition, "", f"shard {self.manager.shard_index} does not own it")
        return log

    def _on_partition_append(
        self, reply: Callable[[bool, Any], None], topic: str, topic_id: str, partition: int,
        data: bytes, headers: list, expected_offset: int | None, size: int | None,
        key_condition: tuple[bytes, int] | None = None, batch_keys: list | None = None,
    ) -> None:
        """An append another shard forwards (a quick handler: queued to the writer as it is
        read, answered as the writer finishes it). A topic this shard has not caught up with
        yet takes the slow path, which catches up first."""
        state = self.manager.topics.get(topic)
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
        assert self.manager.groups is not None
        if what not in ("commit", "merge", "delete", "forget_topic", "fetch", "page"):
            raise InvalidRequestError(f"unknown group request {what!r}")
        result = getattr(self.manager.groups, what)(*args)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    async def _on_queues(self, what: str, args: tuple, kwargs: dict) -> Any:
        """A queue call another shard makes of the windows this one owns (shard_queues.py)."""
        queues = self.manager.queues
        if not isinstance(queues, ShardQueues):
            raise LogClosedError("queues")  # (not replayed yet)
        if what not in QUEUE_CALLS:
            raise InvalidRequestError(f"unknown queue request {what!r}")
        return await queues.on_call(what, args, kwargs)

    def _on_queue_back(self, qids: list[bytes]) -> None:
        queues = self.manager.queues
        if isinstance(queues, ShardQueues):
            queues.on_back_note(qids)

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
            "queues": self._on_queues,
            "queue_back": self._on_queue_back,
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

    def __init__(self, family: ShardFamily) -> None:
        self._channel = family.channel

    async def _call(self, what: str, *args: Any) -> Any:
        return await self._channel.call(0, "groups", what, args)

    async def commit(self, group: str, offsets: Any) -> Any:
        return await self._call("commit", group, list(offsets))

    async def merge(self, offsets: Any) -> Any:
        return await self._call("merge", list(offsets))

    async def delete(self, group: str, topic: str | None = None) -> Any:
        return await self._call("delete", group, topic)

    async def forget_topic(self, topic: str) -> Any:
        return await self._call("forget_topic", topic)

    async def delete_partitions(self, group: str, partitions: Any) -> Any:
        return await self._call("delete_partitions", group, list(partitions))

    async def fetch(self, group: str, topic: str | None = None) -> Any:
        return await self._call("fetch", group, topic)

    async def groups_page(
        self, limit: int, after: str | None = None, accept: GroupFilter | None = None
    ) -> GroupPage:
        """GroupOffsets.groups_page through shard 0: the filter is a closure over the request's
        principal, so it stays here and the groups come, with their topics, in calls of at most
        PAGE_CALL_GROUPS (a filter that passes many over costs more calls, never a larger one)."""
        chosen: list[str] = []
        chunk = min(limit + 1, PAGE_CALL_GROUPS)
        while True:
            page = await self._call("page", after, chunk)
            for group, topics in page:
                if accept is None or accept(group, topics):
                    chosen.append(group)
                    if len(chosen) > limit:
                        return cut_page(chosen, limit)
            if len(page) < chunk:
                return cut_page(chosen, limit)
            after = page[-1][0]

    async def groups(self, topic_filter: Callable[[str], bool] | None = None) -> list[str]:
        """Every group (with an offset on a topic `topic_filter` accepts), page by page."""
        accept = None if topic_filter is None else lambda _g, ts: any(map(topic_filter, ts))
        groups: list[str] = []
        after: str | None = None
        while True:
            page, after = await self.groups_page(PAGE_CALL_GROUPS, after, accept)
            groups += page
            if after is None:
                return groups
