"""The compactor against a model: the table view never changes, offsets only increase, each key
once in the cleaned range, tombstones go after their horizon; the offset map against a dict;
kafka-python reads what the cleaner writes."""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import filenames, key_index, reader
from engine.config import LogConfig
from engine.errors import KeyRequiredError
from engine.key_index import ActiveKeys
from engine.partition_log import prepare_batches
from engine.records import encode_batch
from tests.engine.helpers import FakeClock, append_records, running_log
from tests.kafka_oracle import build_batch, decode_all
from workers.compactor import compact_partition, dirty_stats
from workers.offset_map import OffsetMap, key_digests

CODECS = [0, 1, 2, 3, 4]


def read_all(log) -> list:
    out = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        result = reader.read_records(log.view, offset, 10_000, 1 << 22)
        out.extend(result.records)
        if result.next_offset <= offset:
            break
        offset = result.next_offset
    return out


def table(records) -> dict[bytes, bytes]:
    view: dict[bytes, bytes] = {}
    for r in records:
        if r.value is None:
            view.pop(r.key, None)
        else:
            view[r.key] = r.value
    return view


def leftovers(directory: Path) -> list[str]:
    return sorted(
        p.name for p in directory.iterdir()
        if p.name.endswith((filenames.CLEANED_SUFFIX, filenames.SWAP_SUFFIX, filenames.DELETED_SUFFIX))
    )


# -- the offset map ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    slots=st.integers(16, 400),
    ops=st.lists(st.lists(st.integers(0, 300), min_size=0, max_size=60), min_size=1, max_size=12),
)
def test_offset_map_matches_a_dict(slots: int, ops: list[list[int]]) -> None:
    m = OffsetMap(slots * 24)
    model: dict[bytes, int] = {}
    offset = 0
    for chunk in ops:
        keys = [f"key-{k}".encode() for k in chunk]
        new = len({k for k in keys if k not in model})
        if not m.room_for(new):
            continue
        offsets = np.arange(offset, offset + len(keys), dtype=np.int64)
        offset += len(keys)
        m.put(*key_digests(keys), offsets)
        for k, o in zip(keys, offsets.tolist()):
            model[k] = o
        assert m.size == len(model) <= m.max_entries
    probe = list(model) + [f"absent-{i}".encode() for i in range(20)]
    got = m.get(*key_digests(probe)).tolist()
    assert got == [model.get(k, -1) for k in probe]


# -- passes against a model -------------------------------------------------------------------


async def _produce(log, clock: FakeClock, rng: random.Random, batches: int, keys: int, tombstone_share: float) -> list:
    written = []
    for _ in range(batches):
        items = []
        for _ in range(rng.randint(1, 12)):
            key = f"k{rng.randrange(keys)}".encode()
            value = None if rng.random() < tombstone_share else rng.randbytes(rng.randint(0, 40))
            headers = [("h", b"x")] if rng.random() < 0.2 else []
            items.append((key, value, clock(), headers))
        await append_records(log, items, compression_type=rng.choice(CODECS))
        written.extend(items)
        clock.now += rng.randint(0, 5)
    return written


def _check_pass(log, before: list, result) -> list:
    after = read_all(log)
    offsets = [r.offset for r in after]
    assert offsets == sorted(set(offsets)), "offsets must increase, without duplicates"
    assert set(offsets) <= {r.offset for r in before}, "compaction never invents offsets"
    assert table(after) == table(before), "the table view is unchanged"
    kept = {r.offset: r for r in before}
    for r in after:
        assert kept[r.offset] == r, "a kept record is kept whole (timestamp, key, value, headers)"
    cleaned = [r for r in after if r.offset < result.end_offset]
    keys = [r.key for r in cleaned]
    assert len(keys) == len(set(keys)), "each key once in the cleaned range"
    return after


def _check_key_index_files(log) -> None:
    """Each closed segment's .keyindex, where there is one (the cleaner's, or a roll's), is the
    file a rebuild from the segment makes (issue 28: the cleaner writes the same bytes)."""
    for segment in log.view.segments[:-1]:
        path = filenames.key_index_file(segment.directory, segment.base_offset)
        if path.exists():
            scanned = ActiveKeys(segment.base_offset)
            key_index._scan_into(scanned, segment, segment.size)
            rebuilt = scanned.freeze().encode(segment.next_offset, segment.size)
            assert path.read_bytes() == rebuilt, path.name


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    keys=st.integers(1, 60),
    rounds=st.integers(1, 4),
    tombstone_share=st.sampled_from([0.0, 0.1, 0.4]),
    map_slots=st.sampled_from([20, 40, 200, 100_000]),
    segment_bytes=st.sampled_from([600, 3000, 50_000]),
)
def test_passes_keep_the_table_view(
    tmp_path_factory, seed: int, keys: int, rounds: int, tombstone_share: float, map_slots: int, segment_bytes: int
) -> None:
    directory = tmp_path_factory.mktemp("log") / "t-0"
    directory.mkdir()
    rng = random.Random(seed)
    clock = FakeClock()
    config = LogConfig(
        cleanup_policy="compact", segment_bytes=segment_bytes, delete_retention_ms=100, file_delete_delay_ms=0,
        index_interval_bytes=200,
    )

    async def main() -> None:
        async with running_log(directory, config, clock=clock) as log:
            checkpoint = None
            for _ in range(rounds):
                await _produce(log, clock, rng, rng.randint(5, 40), keys, tombstone_share)
                await log.roll()
                # passes until the dirty range is done (a small map needs several)
                for _pass in range(50):
                    before = read_all(log)
                    result = await compact_partition(
                        log, cleaner_checkpoint=checkpoint, map_budget_bytes=map_slots * 24, run_in="thread",
                        sweep=rng.random() < 0.5,
                    )
                    _check_pass(log, before, result)
                    if not result.cleaned:
                        break
                    checkpoint = result.end_offset
                    if not result.map_full:
                        break
                clock.now += rng.choice([0, 50, 200])  # tombstones' horizons pass, sometimes
            assert leftovers(directory) == []
            stats = dirty_stats(log.view, log.config, checkpoint, clock())
            assert stats.dirty_bytes == 0
            _check_key_index_files(log)

    anyio.run(main)


async def test_tombstones_go_after_their_horizon(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LogConfig(cleanup_policy="compact", segment_bytes=500, delete_retention_ms=1000, file_delete_delay_ms=0)
    async with running_log(tmp_path, config, clock=clock) as log:
        await append_records(log, [(b"a", b"1", clock(), ()), (b"b", b"1", clock(), ())])
        await append_records(log, [(b"a", None, clock(), ())])
        await log.roll()
        first = await compact_partition(log, cleaner_checkpoint=None, map_budget_bytes=1 << 20, run_in="thread")
        assert first.cleaned and first.records_removed == 1 and first.tombstones_removed == 0
        assert first.next_horizon_ms == clock() + 1000
        records = read_all(log)
        assert [(r.key, r.value) for r in records] == [(b"b", b"1"), (b"a", None)]
        # before the horizon: a sweep keeps the tombstone
        clock.now += 999
        early = await compact_partition(log, cleaner_checkpoint=first.end_offset, map_budget_bytes=1 << 20, run_in="thread", sweep=True)
        assert early.tombstones_removed == 0
        clock.now += 1
        late = await compact_partition(log, cleaner_checkpoint=first.end_offset, map_budget_bytes=1 << 20, run_in="thread", sweep=True)
        assert late.tombstones_removed == 1 and late.next_horizon_ms is None
        assert [(r.key, r.value) for r in read_all(log)] == [(b"b", b"1")]
        # offsets beyond the cleaned range carry on where they were
        result = await append_records(log, [(b"c", b"1", clock(), ())])
        assert result.base_offset == 3


async def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LogConfig(cleanup_policy="compact", segment_bytes=500, min_compaction_lag_ms=10_000, file_delete_delay_ms=0)
    async with running_log(tmp_path, config, clock=clock) as log:
        await append_records(log, [(b"a", b"old", clock(), ())])
        await log.roll()
        clock.now += 20_000
        await append_records(log, [(b"a", b"young", clock(), ())])
        await log.roll()
        stats = dirty_stats(log.view, log.config, None, clock())
        assert stats.first_uncleanable_offset == 1  # the young segment is not cleanable
        result = await compact_partition(log, cleaner_checkpoint=None, map_budget_bytes=1 << 20, run_in="thread")
        assert result.end_offset == 1
        # "a" in the young segment is not in the map: the old record stays for now
        assert [r.value for r in read_all(log)] == [b"old", b"young"]
        clock.now += 10_000
        result = await compact_partition(log, cleaner_checkpoint=result.end_offset, map_budget_bytes=1 << 20, run_in="thread")
        assert [r.value for r in read_all(log)] == [b"young"]


async def test_cleaned_segments_decode_with_kafka_python(tmp_path: Path) -> None:
    rng = random.Random(7)
    clock = FakeClock()
    config = LogConfig(cleanup_policy="compact", segment_bytes=4000, file_delete_delay_ms=0)
    async with running_log(tmp_path, config, clock=clock) as log:
        for i in range(60):
            items = [
                (f"k{rng.randrange(20)}".encode(), None if rng.random() < 0.1 else rng.randbytes(30), clock() + j, [("h", None)])
                for j in range(rng.randint(1, 8))
            ]
            raw = build_batch(items, codec=CODECS[i % len(CODECS)])
            await log.append(prepare_batches(raw, config))
        await log.roll()
        before = read_all(log)
        result = await compact_partition(log, cleaner_checkpoint=None, map_budget_bytes=1 << 20, run_in="thread")
        assert result.cleaned and result.records_removed > 0
        ours = read_all(log)
        theirs = []
        for segment in log.view.segments:
            _batches, records = decode_all(segment.log_path.read_bytes())
            theirs.extend(records)
        assert [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in ours] == [
            (r.offset, r.timestamp, r.key, r.value, r.headers) for r in theirs
        ]
        assert table(ours) == table(before)


async def test_a_pass_runs_in_a_worker_process(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LogConfig(cleanup_policy="compact", segment_bytes=1000, file_delete_delay_ms=0)
    async with running_log(tmp_path, config, clock=clock) as log:
        for i in range(50):
            await append_records(log, [(f"k{i % 5}".encode(), str(i).encode(), clock(), ())])
        await log.roll()
        before = read_all(log)
        result = await compact_partition(log, cleaner_checkpoint=None, map_budget_bytes=1 << 20, run_in="process")
        assert result.cleaned and result.outcome["peak_rss_bytes"] > 0
        after = read_all(log)
        assert table(after) == table(before) and len(after) == 5


async def test_segments_changed_during_a_pass_abandon_it(tmp_path: Path) -> None:
    """delete-records + retention remove a segment the pass read: the swap is refused, the pass's
    files are removed, nothing changes."""
    from workers.compactor import SegmentsChanged
    from workers.retention import run_retention

    clock = FakeClock()
    config = LogConfig(cleanup_policy="compact,delete", segment_bytes=300, file_delete_delay_ms=0, retention_ms=-1)
    async with running_log(tmp_path, config, clock=clock) as log:
        for i in range(30):
            await append_records(log, [(f"k{i % 3}".encode(), str(i).encode(), clock(), ())])
        await log.roll()
        view = log.view
        from workers import compactor

        stats = dirty_stats(view, log.config, None, clock())
        original = compactor.clean

        def clean_then_shrink(request):
            outcome = original(request)
            anyio.from_thread.run(log.delete_records, view.segments[1].base_offset)
            anyio.from_thread.run(run_retention, log)
            return outcome

        compactor.clean = clean_then_shrink
        try:
            with pytest.raises(SegmentsChanged):
                await compact_partition(log, cleaner_checkpoint=None, map_budget_bytes=1 << 20, run_in="thread", stats=stats)
        finally:
            compactor.clean = original
        assert leftovers(tmp_path) == []
        offsets = [r.offset for r in read_all(log)]
        assert offsets == list(range(log.log_start_offset, log.high_watermark))


def test_compacted_topics_refuse_keyless_records() -> None:
    config = LogConfig(cleanup_policy="compact")
    with pytest.raises(KeyRequiredError):
        prepare_batches(encode_batch(0, [(b"k", b"v", 1, ()), (None, b"v", 1, ())], compression_type=3), config)
    prepare_batches(encode_batch(0, [(b"k", None, 1, ())]), config)  # a keyed tombstone is fine
    prepare_batches(encode_batch(0, [(None, b"v", 1, ())]), LogConfig())  # delete policy: fine


async def test_a_reader_holding_the_replaced_segments_still_reads_them(tmp_path: Path) -> None:
    """Closed segments map their indexes lazily, by name; the swap renames the old segments to
    .deleted (and here unlinks them at once). A view taken before the swap must still read:
    the soak found a 500 from exactly this window."""
    config = LogConfig(cleanup_policy="compact", segment_bytes=1024, min_cleanable_dirty_ratio=0.01)
    async with running_log(tmp_path, config) as log:
        for i in range(60):
            await append_records(log, [(b"k%d" % (i % 5), b"v%d" % i, 1_700_000_000_000 + i, [])])
    async with running_log(tmp_path, config, clean_shutdown=True) as log:  # indexes not mapped yet
        old = log.view
        before = len(old.segments)
        await compact_partition(log, cleaner_checkpoint=None, map_budget_bytes=1 << 20, run_in="thread")
        assert len(log.view.segments) < before
        assert not any(p.name.endswith(".deleted") for p in tmp_path.iterdir()), "deleted at once here"
        records = reader.read_records(old, old.log_start_offset, 100, 1 << 20).records
        assert [r.value for r in records] == [b"v%d" % i for i in range(len(records))]
        assert reader.offset_for_timestamp(old, 1_700_000_000_030) is not None
