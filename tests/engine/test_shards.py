"""A shard family in one process: two log managers over one data dir, each owning half the
partitions, talking over their real Unix sockets and shared partition table.

(The process side — the supervisor, one process per shard — is tested against
`eventlog serve --processes 2` in tests/app/test_supervisor.py.)"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import anyio
import pytest

from engine import reader
from engine.errors import (
    OffsetMismatchError,
    ShardUnavailableError,
    StorageError,
    TopicDeletedError,
    TopicNotFoundError,
)
from engine.follower import FollowedPartition
from engine.log_dirs import CLEAN_SHUTDOWN_FILE, LogDir, parse_clean_shutdown
from engine.log_manager import EngineConfig, LogManager, ShardSpec, open_engine
from engine.partition_log import PartitionLog, prepare_batches
from engine.records import encode_batch
from engine.shards import REGION_SLOTS, LIVE, PartitionTable, SlotState, owner_of, slot_key

T0 = 1_700_000_000_000


@asynccontextmanager
async def family(data: Path, count: int = 2) -> AsyncIterator[list[LogManager]]:
    """`count` shards over `data`, the lock held here as a supervisor would."""
    lock = LogDir(data.resolve())
    lock.open(0, None)
    run_dir = Path(tempfile.mkdtemp(prefix="eventlog-shards-test-"))
    engines: list[LogManager] = []
    try:
        async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
            async def start(i: int, ready: anyio.Event) -> None:
                spec = ShardSpec(i, count, run_dir, (lock._lock_fd,))
                async with open_engine(EngineConfig(log_dirs=(data,), shard=spec)) as engine:
                    engines.append(engine)
                    ready.set()
                    await done.wait()

            done = anyio.Event()
            events = []
            for i in range(count):
                ev = anyio.Event()
                events.append(ev)
                tg.start_soon(start, i, ev)
            for ev in events:
                await ev.wait()
            try:
                yield sorted(engines, key=lambda e: e.shard_index)
            finally:
                done.set()
    finally:
        lock.unlock()
        shutil.rmtree(run_dir, ignore_errors=True)


async def produce(engine: LogManager, topic: str, partition: int, values: list[bytes], expected: int | None = None) -> int:
    log = engine.partition(topic, partition)
    batch = encode_batch(0, [(b"k%d" % i, v, T0, []) for i, v in enumerate(values)])
    return (await log.append(prepare_batches(batch, log.config), expected_offset=expected)).base_offset


def values_of(engine: LogManager, topic: str, partition: int, start: int | None = None) -> list[bytes]:
    log = engine.partition(topic, partition)
    view = log.view
    return [r.value for r in reader.read_records(view, view.log_start_offset if start is None else start, 10**6, 10**8).records]


def test_ownership_is_stable_and_spreads_a_topics_partitions() -> None:
    assert all(owner_of("__metadata", 0, n) == 0 and owner_of("__consumer_offsets", 0, n) == 0 for n in (1, 2, 16))
    owners = [owner_of("orders", p, 4) for p in range(8)]
    assert owners == [owner_of("orders", p, 4) for p in range(8)]  # a function of its arguments
    assert sorted(owners) == [0, 0, 1, 1, 2, 2, 3, 3]  # round the shards


def test_partition_table_slots(tmp_path: Path) -> None:
    owner = PartitionTable(tmp_path / "t", 2)
    reader_ = PartitionTable(tmp_path / "t", 2)  # another process's mapping of the same file
    key = slot_key("orders", "id", 3)
    assert reader_.find(1, key) is None
    index = owner.claim(1, key)
    owner.publish(1, index, key, SlotState(10, 2, 5, 8, 4096, LIVE))
    assert reader_.read(1, reader_.find(1, key), key) == SlotState(10, 2, 5, 8, 4096, LIVE)
    assert reader_.find(0, key) is None  # each owner has its own region
    # colliding start positions probe on; a deleted slot is reused by the next claim
    other = slot_key("orders", "id", 4)
    while other % REGION_SLOTS != key % REGION_SLOTS:
        other += 2
    second = owner.claim(1, other)
    assert second != index and reader_.find(1, other) == second
    owner.publish(1, index, key, SlotState(10, 2, 5, 8, 4096, 2))
    assert reader_.read(1, index, key).deleted
    fresh = PartitionTable(tmp_path / "t", 2)
    assert fresh.claim(1, slot_key("x", "y", 0)) is not None
    for t in (owner, reader_, fresh):
        t.close()


async def test_any_shard_appends_and_reads_every_partition(tmp_path: Path) -> None:
    async with family(tmp_path) as (s0, s1):
        await s1.create_topic("orders", 4)  # forwarded to the controller
        assert "orders" in s0.topics and "orders" in s1.topics
        for p in range(4):
            mine = s0 if owner_of("orders", p, 2) == 0 else s1
            other = s1 if mine is s0 else s0
            assert isinstance(mine.partition("orders", p), PartitionLog)
            assert isinstance(other.partition("orders", p), FollowedPartition)
            await produce(mine, "orders", p, [b"a%d" % p])
            await produce(other, "orders", p, [b"b%d" % p])  # through the owner
            for engine in (s0, s1):  # read-your-writes on either shard
                assert values_of(engine, "orders", p) == [b"a%d" % p, b"b%d" % p]
        # conditions are the owner's: a stale expected offset fails from either shard
        follower = s1 if owner_of("orders", 0, 2) == 0 else s0
        with pytest.raises(OffsetMismatchError):
            await produce(follower, "orders", 0, [b"c"], expected=1)
        assert await produce(follower, "orders", 0, [b"c"], expected=2) == 2


async def test_followers_track_rolls_retention_and_waits(tmp_path: Path) -> None:
    async with family(tmp_path) as (s0, s1):
        await s0.create_topic("t", 2, {"segment.bytes": "1024", "retention.bytes": "2048"})
        p = next(p for p in range(2) if owner_of("t", p, 2) == 1)  # owned by shard 1
        owner, follower = s1, s0
        for i in range(60):
            await produce(follower, "t", p, [b"v%03d" % i + b"x" * 60])
        view = follower.partition("t", p).view
        assert len(view.segments) > 3
        assert values_of(follower, "t", p) == values_of(owner, "t", p)
        # retention on the owner: the follower's view drops the segments, reads go on
        log = owner.partition("t", p)
        deleted = await log.delete_segments(list(log.view.segments[:3]), reason="test")
        assert deleted > 0
        start = follower.partition("t", p).log_start_offset
        assert start == log.log_start_offset > 0
        assert values_of(follower, "t", p) == values_of(owner, "t", p)
        # a long-poll on the follower is woken by an append the owner takes
        hw = follower.partition("t", p).high_watermark
        woke = []

        async def wait() -> None:
            woke.append(await follower.partition("t", p).wait_for_data(hw, 10))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.1)
            await produce(owner, "t", p, [b"late"])
        assert woke == [True]


async def test_topic_changes_reach_every_shard_and_survive_restarts(tmp_path: Path) -> None:
    async with family(tmp_path) as (s0, s1):
        await s1.create_topic("a", 3)
        await s1.alter_topic_configs("a", {"retention.ms": "5000"})
        assert s0.topic("a").config.retention_ms == s1.topic("a").config.retention_ms == 5000
        await s1.add_partitions("a", 5)
        for p in range(5):
            await produce(s1, "a", p, [b"x%d" % p])
        await s1.create_topic("doomed", 2)
        await produce(s0, "doomed", 1, [b"y"])
        followed = next(e.partition("doomed", p) for e in (s0, s1) for p in range(2) if isinstance(e.partition("doomed", p), FollowedPartition))
        await s1.delete_topic("doomed")
        for engine in (s0, s1):
            with pytest.raises(TopicNotFoundError):
                engine.topic("doomed")
        with pytest.raises(TopicDeletedError):
            followed.view  # noqa: B018
        await s0.groups.commit("g", [("a", 0, 1, "")])
        assert [c.offset for c in await s1.groups.fetch("g")] == [1]
    # each shard wrote its part of the clean-shutdown marker
    marker = parse_clean_shutdown((tmp_path / CLEAN_SHUTDOWN_FILE).read_bytes())
    assert {("a", p) for p in range(5)} <= set(marker)
    assert not any(t == "doomed" for t, _ in marker)
    async with family(tmp_path) as (s0, s1):
        for p in range(5):
            assert values_of(s0, "a", p) == values_of(s1, "a", p) == [b"x%d" % p]
        assert s0.topic("a").config.retention_ms == 5000
        assert [c.offset for c in await s1.groups.fetch("g")] == [1]
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # removed once the family started
    # the same data dir opens in a single process, and with another number of shards
    async with open_engine(EngineConfig(log_dirs=(tmp_path,))) as lone:
        assert [values_of(lone, "a", p) for p in range(5)] == [[b"x%d" % p] for p in range(5)]
    async with family(tmp_path, 3) as shards:
        assert all(values_of(e, "a", 4) == [b"x4"] for e in shards)


async def test_followers_read_through_a_compaction_swap(tmp_path: Path) -> None:
    from workers.manager import Workers, WorkerSettings

    async with family(tmp_path) as (s0, s1):
        await s0.create_topic("c", 2, {"cleanup.policy": "compact", "segment.bytes": "2048"})
        p = next(p for p in range(2) if owner_of("c", p, 2) == 1)
        owner, follower = s1, s0
        log = owner.partition("c", p)
        for i in range(120):
            batch = encode_batch(0, [(b"key%d" % (i % 5), b"v%03d" % i + b"x" * 40, T0, [])])
            await follower.partition("c", p).append(prepare_batches(batch, log.config))
        before = values_of(follower, "c", p)
        assert len(before) == 120 and len(follower.partition("c", p).view.segments) > 2
        results = await Workers(owner, WorkerSettings(cleaner_run_in="thread")).run_compaction("c")
        assert any(r.cleaned for r in results)
        after = values_of(follower, "c", p)
        assert after == values_of(owner, "c", p) and len(after) < 120
        # every key's latest value survives, seen from the follower
        latest = {i % 5: b"v%03d" % i + b"x" * 40 for i in range(120)}
        assert set(latest.values()) <= set(after)


async def test_a_follower_that_reads_mid_swap_lists_the_new_segments_after_it(tmp_path: Path) -> None:
    """The owner publishes a swap's new generation while its slot still says CHANGING (the
    writer publishes before replace_segments clears the flag). A follower reading right then
    keeps its previous list, as it should; once the flag clears it must list again, not take
    the new generation for the one its list was made at: it went on reading the replaced
    segments from their .deleted files until the generation moved again (the flaky
    test_readers_see_the_table_view_throughout_a_pass saw tombstones the pass had dropped)."""
    from workers.manager import Workers, WorkerSettings

    async with family(tmp_path) as (s0, s1):
        await s0.create_topic("c", 2, {"cleanup.policy": "compact", "segment.bytes": "1024"})
        p = next(p for p in range(2) if owner_of("c", p, 2) == 1)
        owner, follower = s1.partition("c", p), s0.partition("c", p)
        for i in range(60):  # a unique key, then a hot one: every segment keeps something
            key = b"hot" if i % 2 else b"u%02d" % i
            await owner.append(prepare_batches(encode_batch(0, [(key, b"v%02d" % i + b"x" * 40, T0, [])]), owner.config))
        table = {}
        for r in reader.read_records(follower.view, 0, 1000, 10**6).records:
            table[r.key] = r.value
        publish_slot, generation, mid_swap = owner.on_publish, owner.generation, []

        def read_mid_swap(log: PartitionLog) -> None:
            publish_slot(log)
            if log.files_changing and log.generation > generation:
                # the owner's view has the new segments, the slot the new generation and
                # CHANGING: the follower reads its previous list
                mid_swap.append(follower.view)

        owner.on_publish = read_mid_swap
        results = await Workers(s1, WorkerSettings(cleaner_run_in="thread")).run_compaction("c")
        owner.on_publish = publish_slot
        assert any(r.cleaned for r in results) and len(mid_swap) > 1  # a swap per group
        for view in mid_swap:
            assert {r.key: r.value for r in reader.read_records(view, 0, 1000, 10**6).records} == table
        after = values_of(s1, "c", p)
        assert len(after) < 60
        assert [s.base_offset for s in follower.view.segments] == [s.base_offset for s in owner.view.segments]
        assert values_of(s0, "c", p) == after


async def test_a_follower_that_must_list_mid_swap_reads_no_records_from_that_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a swap's rename of the old segments to .deleted and of the new ones to their
    live names, a directory listing holds neither. A follower that lists right then (its view
    was dropped: a file went away under it, or it never had one) must not read records from
    that listing: they would skip the swapped range, and a compacted log's offsets may have
    gaps, so nothing would say so (the flaky test_readers_see_the_table_view_throughout_a_pass
    saw keys' latest values missing). A read then waits for the renames to end; a read that
    cannot wait is told to retry."""
    import asyncio

    import engine.partition_log as partition_log
    from workers.manager import Workers, WorkerSettings

    async with family(tmp_path) as (s0, s1):
        await s0.create_topic("c", 2, {"cleanup.policy": "compact", "segment.bytes": "1024"})
        p = next(p for p in range(2) if owner_of("c", p, 2) == 1)
        owner, follower = s1.partition("c", p), s0.partition("c", p)
        assert isinstance(follower, FollowedPartition)
        for i in range(60):  # a unique key, then a hot one: every segment keeps something
            key = b"hot" if i % 2 else b"u%02d" % i
            batch = encode_batch(0, [(key, b"v%02d" % i + b"x" * 40, T0, [])])
            await owner.append(prepare_batches(batch, owner.config))

        async def table_of(log: FollowedPartition) -> dict:
            return {r.key: r.value for r in (await log.read_records(0, 1000, 10**6)).records}

        table = await table_of(follower)
        loop = asyncio.get_running_loop()
        torn, refused, waited = [], [], []

        async def read_now() -> None:
            waited.append(await table_of(follower))

        def mid_swap(name: str) -> None:
            if name != "swap.after_deleted_rename" or torn:
                return
            follower._state = follower._view = None  # as after a file went away under it
            view = follower.view  # offsets still answer, from the slot
            torn.append((getattr(follower, "_torn", False), {s.base_offset for s in view.segments}))
            try:
                follower.fetch_slice(0, 10**6)
            except ShardUnavailableError as exc:
                refused.append(exc)
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(read_now()))

        monkeypatch.setattr(partition_log, "crash_point", mid_swap)
        results = await Workers(s1, WorkerSettings(cleaner_run_in="thread")).run_compaction("c")
        assert any(r.cleaned for r in results)
        for _ in range(500):
            if waited:
                break
            await anyio.sleep(0.01)
        assert waited == [table], "the read waited for the swap and saw every key's latest value"
        (was_torn, listed), = torn
        assert was_torn and len(refused) == 1
        owned = {s.base_offset for s in owner.view.segments}
        assert listed < owned | listed, "the listing missed segments"
        assert not follower._torn
        assert await table_of(follower) == table


async def test_follower_reads_a_growing_active_segment_by_offset_and_time(tmp_path: Path) -> None:
    async with family(tmp_path) as (s0, s1):
        await s0.create_topic("g", 2)
        p = next(p for p in range(2) if owner_of("g", p, 2) == 1)
        owner = s1.partition("g", p)
        follower = s0.partition("g", p)
        for i in range(2500):  # ~2.6 MB in one active segment: the follower re-reads its index
            batch = encode_batch(0, [(b"k", b"%05d" % i + b"y" * 1000, T0 + i, [])])
            await owner.append(prepare_batches(batch, owner.config))
            if i in (10, 1100, 2499):
                view = follower.view
                assert view.high_watermark == i + 1
                got = reader.read_records(view, i, 1, 10**6).records
                assert [r.value[:5] for r in got] == [b"%05d" % i]
        assert len(follower.view.segments[-1].offset_index.view()) > 100  # entries from the owner's file
        assert await follower.offset_for_timestamp(T0 + 2000) == await owner.offset_for_timestamp(T0 + 2000) == (2000, T0 + 2000)
        assert await follower.max_timestamp_offset() == (2499, T0 + 2499)


async def test_a_follower_never_reads_a_swapped_in_file_as_the_one_it_listed(tmp_path: Path) -> None:
    """A compaction swap renames the listed .log to .deleted and puts a new file under its
    name: a follower that opens the name afterwards (its descriptor was closed meanwhile)
    must read the file it listed, or see that it is gone, never the new one with the old
    size (seen in the soak: "0 bytes left, a batch header needs 61")."""
    async with family(tmp_path) as (s0, s1):
        await s0.create_topic("w", 2, {"segment.bytes": "1024"})
        p = next(p for p in range(2) if owner_of("w", p, 2) == 1)
        for i in range(40):
            await produce(s0, "w", p, [b"%03d" % i + b"z" * 60])
        followed = s0.partition("w", p)
        segment = followed.view.segments[0]
        expected = values_of(s0, "w", p)
        assert segment.inode is not None and segment.release_descriptors()
        live = segment.log_path
        deleted = live.with_name(live.name + ".deleted")
        os.replace(live, deleted)
        live.write_bytes(b"\0" * 10)  # a stranger under the listed name
        assert values_of(s0, "w", p) == expected  # read from the .deleted file it listed
        segment.release_descriptors()
        deleted.unlink()
        with pytest.raises(StorageError):
            segment.open_handle()
        os.replace(live, tmp_path / "stranger")


def test_a_reader_waits_out_an_owner_preempted_mid_write(tmp_path: Path) -> None:
    """Seen under load on 2 CPUs: the owner was descheduled between the stores of a slot write
    and a reader gave up after a few ms of spinning (500 internal_error on a fetch)."""
    import struct
    import threading

    owner = PartitionTable(tmp_path / "t", 2)
    reader_ = PartitionTable(tmp_path / "t", 2)
    key = slot_key("orders", "id", 0)
    index = owner.claim(0, key)
    owner.publish(0, index, key, SlotState(1, 0, 1, 0, 100, LIVE))
    at = owner._offset(0, index)
    seq = struct.unpack_from("<Q", owner._map, at)[0]
    struct.pack_into("<Q", owner._map, at, seq + 1)  # half written: the owner stops here ...
    finish = threading.Timer(0.2, lambda: owner.publish(0, index, key, SlotState(2, 0, 1, 0, 200, LIVE)))
    finish.start()  # ... and goes on 200 ms later
    try:
        assert reader_.read(0, index, key) == SlotState(2, 0, 1, 0, 200, LIVE)
    finally:
        finish.join()
    for t in (owner, reader_):
        t.close()


async def test_a_follower_calls_a_partition_gone_only_when_its_topic_is_gone(
    tmp_path: Path,
) -> None:
    """A slot or directory that says a partition is gone, while the metadata still holds its
    topic under the same id (its owner between processes), answers 503 (retry), never 404;
    once the topic's deletion reached the follower, 404."""
    async with family(tmp_path) as (s0, s1):
        await s0.create_topic("orders", 2)
        p = next(p for p in range(2) if owner_of("orders", p, 2) == 0)
        followed = s1.partition("orders", p)
        assert isinstance(followed, FollowedPartition)
        # another key's slot, as a slot read while its owner is between processes may be
        followed._slot_index = 16_383 if followed._slot_index != 16_383 else 16_382
        with pytest.raises(ShardUnavailableError):
            followed.view  # noqa: B018
        followed._slot_index = None
        assert followed.view.high_watermark == 0
        await s0.delete_topic("orders")
        with pytest.raises(TopicDeletedError):
            followed.view  # noqa: B018
