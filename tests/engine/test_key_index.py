"""The key index (engine/key_index.py, key_reads.py) against the partition itself: a key's
records through the index are the partition's records with that key, in every state a log
goes through (appends, conditional appends, rolls, restarts clean and unclean, retention,
compaction); files damaged or missing are rebuilt; colliding hashes never mix keys."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import anyio.from_thread
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine import filenames, key_index, partition_log
from engine.config import LogConfig
from engine.errors import KeyIndexDisabledError, KeyVersionMismatchError
from engine.key_index import KEY_INDEX_SUFFIX, ActiveKeys, ClosedKeys, key_index_file
from engine.partition_log import prepare_batches
from engine.records import encode_batch
from tests.workers.test_compaction import read_all as scan  # every record, through the partition
from workers.compactor import compact_partition
from workers.retention import run_retention

from .helpers import FakeClock, running_log

KEYS = [b"order-%d" % i for i in range(6)]


async def append_for(log, key: bytes | None, values: list[bytes | None], clock, condition=None):
    batch = encode_batch(0, [(key, v, clock(), ()) for v in values])
    return await log.append(prepare_batches(batch, log.config), key_condition=condition)


async def key_history(log, key: bytes, after: int = -1, page: int = 7) -> tuple[list, int]:
    """All of the key's records after `after`, page by page; and its latest offset."""
    records, latest = [], None
    while True:
        got = await log.read_key(key, after, page, 1 << 20)
        records += got.records
        latest = got.latest
        if not got.more:
            return records, latest
        after = got.next_after


async def check_keys(log, keys=KEYS) -> None:
    everything = scan(log)
    for key in keys:
        want = [(r.offset, r.value) for r in everything if r.key == key]
        got, latest = await key_history(log, key)
        assert [(r.offset, r.value) for r in got] == want, key
        assert latest == (want[-1][0] if want else -1), key


def test_closed_keys_file_round_trip_and_checks(tmp_path: Path) -> None:
    active = ActiveKeys(100)
    for i, h in enumerate([5, 3, 5, 2**64 - 1, 3, 5]):
        active.add(h, 100 + i, 70 * (i // 2))  # two records a batch
    assert list(active.newest_first(5)) == [(105, 140), (102, 70), (100, 0)]
    closed = active.freeze()
    assert closed.offsets_of(5).tolist() == [100, 102, 105] and closed.offsets_of(2**64 - 1).tolist() == [103]
    assert closed.entries_of(5)[1].tolist() == [0, 70, 140]
    assert closed.offsets_of(4).tolist() == []
    path = tmp_path / "x.keyindex"
    closed.write(path, next_offset=106, log_size=999)
    before = set(os.listdir("/proc/self/fd"))
    back = ClosedKeys.read(path, 100, 106, 999)
    assert back is not None
    assert all(np.array_equal(getattr(back, a), getattr(closed, a)) for a in ("hashes", "deltas", "positions"))
    # mapped, and no descriptor held for it (issue 28: Python's mmap kept one per loaded file,
    # outside the descriptor budget, so partitions' key indexes used up the open-files limit)
    assert set(os.listdir("/proc/self/fd")) <= before
    # another segment's file (a compaction swap at the same base), or a damaged one, is not used
    assert ClosedKeys.read(path, 100, 106, 998) is None
    assert ClosedKeys.read(path, 100, 105, 999) is None
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert ClosedKeys.read(path, 100, 106, 999) is None
    path.write_bytes(data[:30])
    assert ClosedKeys.read(path, 100, 106, 999) is None



async def test_reads_and_conditions_through_rolls_and_restarts(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LogConfig(segment_bytes=400)
    async with running_log(tmp_path, config, clock=clock) as log:
        for i in range(40):
            await append_for(log, KEYS[i % 3], [b"v%d" % i], clock)
        await append_for(log, None, [b"keyless"], clock)
        assert len(log.view.segments) > 4
        await check_keys(log)
        latest = (await log.read_key(KEYS[0], -1, 1, 1)).latest
        with pytest.raises(KeyVersionMismatchError) as stale:
            await append_for(log, KEYS[0], [b"stale"], clock, (KEYS[0], latest - 3))
        assert stale.value.current == latest
        done = await append_for(log, KEYS[0], [b"next", b"and next"], clock, (KEYS[0], latest))
        with pytest.raises(KeyVersionMismatchError):
            await append_for(log, KEYS[4], [b"x"], clock, (KEYS[4], 0))
        await append_for(log, KEYS[4], [b"new"], clock, (KEYS[4], -1))
    # every closed segment has its key index file, and after a clean shutdown the active one
    # too (key_index.py: a restart loads it instead of scanning); Kafka's loader ignores them
    names = sorted(p.name for p in tmp_path.iterdir())
    keyfiles = [n for n in names if n.endswith(KEY_INDEX_SUFFIX)]
    logs = [n for n in names if n.endswith(filenames.LOG_SUFFIX)]
    assert len(keyfiles) == len(logs) and all(filenames.parse_segment_file(n) is None for n in keyfiles)
    last_value = b"and next"
    for clean in (True, False):  # the active segment's entries come back from its records
        async with running_log(tmp_path, config, clock=clock, clean_shutdown=clean) as log:
            await check_keys(log)
            got = await log.read_key(KEYS[0], -1, 100, 1 << 20)
            assert got.latest == done.last_offset and got.records[-1].value == last_value
            last_value = b"again"
            after = await append_for(log, KEYS[0], [b"after restart"], clock, (KEYS[0], done.last_offset))
            await append_for(log, KEYS[4], [b"between"], clock)
            done = await append_for(log, KEYS[0], [b"again"], clock, (KEYS[0], after.last_offset))


async def test_damaged_or_missing_files_are_rebuilt(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LogConfig(segment_bytes=300)
    async with running_log(tmp_path, config, clock=clock) as log:
        for i in range(30):
            await append_for(log, KEYS[i % 4], [b"value %d" % i], clock)
    files = sorted(tmp_path.glob("*" + KEY_INDEX_SUFFIX))
    assert len(files) >= 3
    files[0].unlink()
    data = bytearray(files[1].read_bytes())
    data[60] ^= 0xFF
    files[1].write_bytes(bytes(data))
    files[2].write_bytes(files[2].read_bytes()[:20])
    (tmp_path / "00000000000000099999.keyindex").write_bytes(b"orphan")
    (tmp_path / (files[3].name + ".tmp")).write_bytes(b"half")
    async with running_log(tmp_path, config, clock=clock) as log:
        assert not (tmp_path / "00000000000000099999.keyindex").exists()
        assert not (tmp_path / (files[3].name + ".tmp")).exists()
        await check_keys(log)
        assert log.key_index.rebuilt_files == 3
        assert files[0].exists()  # written again
    async with running_log(tmp_path, config, clock=clock) as log:
        await check_keys(log)
        assert log.key_index.rebuilt_files == 0


async def test_colliding_hashes_never_mix_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def few(key: bytes) -> int:
        return key[-1] % 2  # two hashes for every key

    monkeypatch.setattr(key_index, "key_hash", few)
    monkeypatch.setattr(partition_log, "key_hash", few)
    clock = FakeClock()
    async with running_log(tmp_path, LogConfig(segment_bytes=350), clock=clock) as log:
        for i in range(36):
            await append_for(log, KEYS[i % 6], [b"v%d" % i], clock)
        await check_keys(log)
        # the latest record of hash 0 belongs to another key: the condition still reads order-0's
        mine = (await log.read_key(KEYS[0], -1, 100, 1 << 20)).latest
        await append_for(log, KEYS[2], [b"same hash, other key"], clock)
        await append_for(log, KEYS[0], [b"ok"], clock, (KEYS[0], mine))
        with pytest.raises(KeyVersionMismatchError):
            await append_for(log, KEYS[2], [b"no"], clock, (KEYS[2], mine))
        await check_keys(log)


async def test_retention_and_compaction_keep_the_index_true(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LogConfig(cleanup_policy="compact,delete", segment_bytes=300, delete_retention_ms=0, file_delete_delay_ms=0,
                       retention_ms=10_000)
    async with running_log(tmp_path, config, clock=clock) as log:
        for i in range(30):
            await append_for(log, KEYS[i % 3], [b"v%d" % i], clock)
        await append_for(log, KEYS[1], [None], clock)  # a tombstone ends order-1
        await log.roll()
        latest_before = {k: (await log.read_key(k, -1, 1, 1)).latest for k in KEYS[:3]}
        first = await compact_partition(log, cleaner_checkpoint=None, map_budget_bytes=1 << 20, run_in="thread")
        assert first.cleaned
        await check_keys(log)
        # the latest record of a key survives compaction (order-1's is its tombstone, for now)
        assert {k: (await log.read_key(k, -1, 1, 1)).latest for k in KEYS[:3]} == latest_before
        clock.now += 1
        await compact_partition(log, cleaner_checkpoint=first.end_offset, map_budget_bytes=1 << 20, run_in="thread", sweep=True)
        await check_keys(log)
        # the tombstone is gone: order-1 has no records, so it may begin again
        assert (await log.read_key(KEYS[1], -1, 1, 1)).latest == -1
        await append_for(log, KEYS[1], [b"reborn"], clock, (KEYS[1], -1))
        live = {p.name for p in tmp_path.iterdir()}
        for name in live:
            if name.endswith(KEY_INDEX_SUFFIX):
                assert name[: -len(KEY_INDEX_SUFFIX)] + filenames.LOG_SUFFIX in live
        # retention: everything older than retention.ms goes, with its key index files
        await append_for(log, KEYS[2], [b"young"], clock)
        clock.now += 20_000
        await append_for(log, KEYS[2], [b"younger"], clock)
        await log.roll()
        result = await run_retention(log)
        assert result.segments_deleted
        await check_keys(log)
        assert (await log.read_key(KEYS[0], -1, 1, 1)).latest == -1
        live = {p.name for p in tmp_path.iterdir()}
        assert all(n[: -len(KEY_INDEX_SUFFIX)] + filenames.LOG_SUFFIX in live for n in live if n.endswith(KEY_INDEX_SUFFIX))


def rebuilt_file(segment) -> bytes:
    """The .keyindex bytes a lazy rebuild makes of `segment` (KeyIndex.closed_keys)."""
    scanned = ActiveKeys(segment.base_offset)
    key_index._scan_into(scanned, segment, segment.size)
    return scanned.freeze().encode(segment.next_offset, segment.size)


def key_files(directory: Path) -> dict[str, tuple[int, int]]:
    """Each .keyindex file (and any transient one): (inode, mtime in ns)."""
    paths = [p for p in directory.iterdir() if KEY_INDEX_SUFFIX in p.name]
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths}


@pytest.mark.parametrize(
    ("run_in", "map_slots"), [("thread", 100_000), ("process", 100_000), ("thread", 40)]
)
async def test_a_pass_leaves_the_key_index_ready(
    tmp_path: Path, run_in: str, map_slots: int
) -> None:
    """Issue 28: the cleaner writes each new segment's .keyindex (through .cleaned and .swap with
    the segment's files), byte for byte what a rebuild makes; the first per-key reads after the
    pass use those files and rebuild nothing. Every codec, tombstones, survivors re-encoded,
    batches copied whole, and (a small map) batches past the map's end copied as they are."""
    import random

    from tests.workers.test_compaction import _produce

    clock = FakeClock()
    config = LogConfig(
        cleanup_policy="compact", segment_bytes=3000, delete_retention_ms=100,
        file_delete_delay_ms=0, index_interval_bytes=200,
    )
    async with running_log(tmp_path, config, clock=clock) as log:
        await _produce(log, clock, random.Random(28), 80, 40, 0.1)
        await log.roll()
        keys = sorted({r.key for r in scan(log)})
        before = key_files(tmp_path)
        result = await compact_partition(
            log, cleaner_checkpoint=None, map_budget_bytes=map_slots * 24, run_in=run_in
        )
        assert result.cleaned and (result.outcome["map_full"] if map_slots == 40 else True)
        new = [s for s in log.view.segments[:-1] if s.base_offset < result.end_offset]
        assert new and all(s.suffix == "" for s in new)
        after = key_files(tmp_path)
        assert not [n for n in after if n.endswith(filenames.TRANSIENT_SUFFIXES)]
        for segment in new:
            path = key_index_file(tmp_path, segment.base_offset)
            assert after[path.name] != before.get(path.name), "the cleaner's file, not the old one"
            assert path.read_bytes() == rebuilt_file(segment), "what a rebuild would write"
        await check_keys(log, keys)
        assert log.key_index.rebuilt_files == 0, "no read after the pass rebuilt a key index"
        assert key_files(tmp_path) == after, "nor wrote one"


async def test_a_pass_on_a_topic_without_key_index_writes_none(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LogConfig(
        cleanup_policy="compact", segment_bytes=300, file_delete_delay_ms=0, key_index=False
    )
    async with running_log(tmp_path, config, clock=clock) as log:
        for i in range(30):
            await append_for(log, KEYS[i % 3], [b"v%d" % i], clock)
        await log.roll()
        result = await compact_partition(
            log, cleaner_checkpoint=None, map_budget_bytes=1 << 20, run_in="thread"
        )
        assert result.cleaned
        assert key_files(tmp_path) == {}


async def test_switched_off_the_index_costs_nothing_and_refuses_key_work(tmp_path: Path) -> None:
    clock = FakeClock()
    async with running_log(tmp_path, LogConfig(segment_bytes=300, key_index=False), clock=clock) as log:
        for i in range(20):
            await append_for(log, KEYS[i % 3], [b"v%d" % i], clock)
        assert log.key_index.active is None and not list(tmp_path.glob("*" + KEY_INDEX_SUFFIX))
        with pytest.raises(KeyIndexDisabledError):
            await log.read_key(KEYS[0], -1, 10, 1 << 20)
        with pytest.raises(KeyIndexDisabledError):
            await append_for(log, KEYS[0], [b"x"], clock, (KEYS[0], 3))
        log.config = LogConfig(segment_bytes=300)  # switched on: built from the records
        await check_keys(log)
        await append_for(log, KEYS[0], [b"more"], clock)
        await check_keys(log)


def test_active_entries_spill_into_sorted_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ActiveKeys, "TAIL_ENTRIES", 64)
    monkeypatch.setattr(ActiveKeys, "MERGE_ENTRIES", 1000)
    active = ActiveKeys(1000)
    model: dict[int, list[int]] = {}
    for i in range(5000):
        h = key_index.key_hash(b"k%d" % (i % 37))
        active.add_many([h], [1000 + i], 3 * i)
        model.setdefault(h, []).append(1000 + i)
    runs, tail = active.state
    assert 2 <= len(runs) < 20 and len(tail.offsets) < 64
    for h, offsets in model.items():
        assert list(active.newest_first(h)) == [(o, 3 * (o - 1000)) for o in offsets[::-1]]
        assert active.freeze().offsets_of(h).tolist() == offsets
        assert active.freeze().entries_of(h)[1].tolist() == [3 * (o - 1000) for o in offsets]
    assert active.memory_bytes() < 100_000
    # the hash is XXH3-64 (files written by one process are read by the next): pinned here
    assert key_index.key_hash(b"") == 0x2D06800538D394C2
    assert key_index.key_hash(b"order-1") == key_index.key_hash(bytearray(b"order-1"))


# -- the model ---------------------------------------------------------------------------------


class KeyedLog(RuleBasedStateMachine):
    """A dict-of-lists model of the keys' records, checked after every step against the key
    index; retention and compaction change the model only as the partition's own records say
    (a prefix gone, records superseded in the cleaned range), and never take a key's latest
    record unless it is a tombstone."""

    def __init__(self) -> None:
        super().__init__()
        self.portal_cm = anyio.from_thread.start_blocking_portal()
        self.portal = self.portal_cm.__enter__()
        self.clock = FakeClock()
        self.config = LogConfig(cleanup_policy="compact,delete", segment_bytes=260, delete_retention_ms=5,
                                file_delete_delay_ms=0, retention_ms=1_000_000)
        self.model: dict[bytes, list[tuple[int, bytes | None]]] = {}
        self.tail_entries = ActiveKeys.TAIL_ENTRIES
        ActiveKeys.TAIL_ENTRIES = 8  # the active segment's entries spill into sorted runs too
        self.checkpoint: int | None = None
        self.log_cm = None
        self.log = None

    @initialize(directory=st.integers(0, 10**9))
    def start(self, directory: int) -> None:
        import tempfile

        self.tmp = Path(tempfile.mkdtemp(prefix="keyed-"))
        self._open(clean=True)

    def _open(self, clean: bool) -> None:
        self.log_cm = self.portal.wrap_async_context_manager(running_log(self.tmp, self.config, clock=self.clock, clean_shutdown=clean))
        self.log = self.log_cm.__enter__()

    def _close(self) -> None:
        if self.log_cm is not None:
            self.log_cm.__exit__(None, None, None)
            self.log_cm = None

    def teardown(self) -> None:
        ActiveKeys.TAIL_ENTRIES = self.tail_entries
        self._close()
        self.portal_cm.__exit__(None, None, None)
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)

    def latest(self, key: bytes) -> int:
        records = self.model.get(key)
        return records[-1][0] if records else -1

    @rule(key=st.sampled_from(KEYS), values=st.lists(st.sampled_from([b"a", b"bb", b"c" * 30, None]), min_size=1, max_size=3))
    def append(self, key: bytes, values: list) -> None:
        result = self.portal.call(append_for, self.log, key, values, self.clock)
        self.model.setdefault(key, []).extend((result.base_offset + i, v) for i, v in enumerate(values))
        self.clock.now += 1

    @rule(key=st.sampled_from(KEYS), stale=st.booleans(), value=st.sampled_from([b"x", b"y" * 20]))
    def conditional_append(self, key: bytes, stale: bool, value: bytes) -> None:
        expected = self.latest(key) - (3 if stale else 0)
        if expected == -2:  # If-Match: * (any records), not a stale version
            expected = -5
        try:
            result = self.portal.call(append_for, self.log, key, [value], self.clock, (key, expected))
        except KeyVersionMismatchError as exc:
            assert expected != self.latest(key) and exc.current == self.latest(key)
        else:
            assert expected == self.latest(key)
            self.model.setdefault(key, []).append((result.base_offset, value))

    @rule()
    def roll(self) -> None:
        self.portal.call(self.log.roll)

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        self._close()
        self._open(clean)

    def _from_scan(self) -> None:
        """The model after records left the log: what the partition holds, which must be a
        part of what the model held, keeping every key's latest record unless a tombstone."""
        held: dict[bytes, list[tuple[int, bytes | None]]] = {}
        for r in scan(self.log):
            if r.key is not None:
                held.setdefault(r.key, []).append((r.offset, r.value))
        for key, records in held.items():
            assert set(records) <= set(self.model.get(key, [])), key
        for key, records in self.model.items():
            if records and records[-1][1] is not None and self.log.log_start_offset <= records[-1][0]:
                assert held.get(key, [])[-1:] == records[-1:], f"{key!r}: its latest record was removed"
        self.model = held

    @rule()
    def compact(self) -> None:
        self.clock.now += 10
        result = self.portal.call(
            lambda: compact_partition(self.log, cleaner_checkpoint=self.checkpoint, map_budget_bytes=1 << 20, run_in="thread", sweep=True)
        )
        if result.cleaned:
            self.checkpoint = result.end_offset
        self._from_scan()

    @precondition(lambda self: len(self.log.view.segments) > 2)
    @rule(count=st.integers(1, 2))
    def delete_oldest(self, count: int) -> None:
        doomed = list(self.log.view.segments[:count])
        self.portal.call(lambda: self.log.delete_segments(doomed, reason="test"))
        self._from_scan()

    @invariant()
    def index_agrees(self) -> None:
        if self.log is None:
            return
        for key in KEYS:
            got, latest = self.portal.call(key_history, self.log, key)
            want = self.model.get(key, [])
            assert [(r.offset, r.value) for r in got] == want, key
            assert latest == (want[-1][0] if want else -1), key


KeyedLog.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestKeyedLog = pytest.mark.slow(KeyedLog.TestCase)


def test_key_index_file_name() -> None:
    assert key_index_file(Path("/d"), 42).name == "00000000000000000042.keyindex"


def test_decode_one_reads_one_record_of_a_batch() -> None:
    from engine.format import parse_header
    from engine.records import batch_records_bytes, decode_block, decode_one

    batch = bytes(encode_batch(40, [(b"k%d" % i, None if i == 3 else b"v" * i, 1000 + i, [("h", b"x")] if i % 2 else [])
                                    for i in range(7)]))
    header = parse_header(batch, 0, 0)
    block = bytes(batch_records_bytes(batch, header, 0))
    every = decode_block(block, header)
    assert [decode_one(block, header, d) for d in range(7)] == every
    assert decode_one(block, header, 7) is None


async def test_entries_loaded_from_an_older_view_are_brought_up_to_date(tmp_path: Path) -> None:
    """The active segment's entries, loaded by a reader from a view older than the log (after
    they were dropped), cover what that view had; the next reader, the writer and a roll each
    bring them up to what they need."""
    clock = FakeClock()
    async with running_log(tmp_path, LogConfig(segment_bytes=10_000), clock=clock) as log:
        await append_for(log, KEYS[0], [b"a"], clock)
        old = log.view
        b = await append_for(log, KEYS[1], [b"b"], clock)
        log.key_index.forget_active()
        log.key_index.load_active(old.segments[-1], old.active_end)  # a reader with the older view
        assert log.key_index.active.scanned_to == old.active_end
        assert (await log.read_key(KEYS[1], -1, 10, 1 << 20)).latest == b.last_offset  # the current view
        log.key_index.forget_active()
        log.key_index.load_active(old.segments[-1], old.active_end)
        await append_for(log, KEYS[1], [b"c"], clock, (KEYS[1], b.last_offset))  # the writer
        log.key_index.forget_active()
        log.key_index.load_active(old.segments[-1], old.active_end)
        await log.roll()  # the closed segment's file holds every entry
        await check_keys(log)
    async with running_log(tmp_path, LogConfig(segment_bytes=10_000), clock=clock) as log:
        await check_keys(log)
        assert log.key_index.rebuilt_files == 0


async def test_a_background_scan_gives_the_gil_up_after_every_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28: a scan of the active segment in the loader thread held the GIL for the
    interpreter's whole switch interval (5 ms) each time, and the first append after a crash
    waited for it a few times over (13 ms at 256 MB). It sleeps (0) after each batch, so a
    waiting thread gets the GIL within one batch's work; a reader's scan in the foreground
    does not."""
    clock = FakeClock()
    async with running_log(tmp_path / "t-0", LogConfig(), clock=clock) as log:
        for i in range(7):
            await append_for(log, KEYS[i % 6], [b"a", b"b"], clock)
        await append_for(log, None, [b"keyless"], clock)  # yields too: nothing else would
        segment = log.view.segments[-1]
        end = segment.size
    yields: list[float] = []
    monkeypatch.setattr(key_index.time, "sleep", yields.append)
    key_index_file(tmp_path / "t-0", 0).unlink(missing_ok=True)  # what a crash leaves
    background = ActiveKeys(0, end, 14)
    background.load_prefix(segment, background=True)
    assert background.prefix_source == "scan" and yields == [0] * 8  # one per batch
    foreground = ActiveKeys(0, end, 14)
    foreground.load_prefix(segment)
    assert foreground.prefix_source == "scan" and yields == [0] * 8
