"""The partition log against a model, at its boundaries, and under concurrency."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import filenames, reader
from engine.config import LogConfig
from engine.dump import LogDump, iter_log, read_offset_index, read_time_index, verify_offset_index, verify_time_index
from engine.errors import CorruptBatchError, LogClosedError, OffsetOutOfRangeError, RecordTooLargeError, TopicDeletedError
from engine.format import parse_header, validate_batch
from engine.partition_log import PreparedBatch, prepare_batches
from engine.records import decode_batch, encode_batch
from engine.segment import INT32_MAX, LogSegment

from ..kafka_oracle import decode_all
from .helpers import FakeClock, LogModel, append_records, patch_last_offset_delta, running_log

T0 = 1_700_000_000_000


def _segment_logs(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(".log"))


def check_files(directory: Path) -> None:
    """Every .log decodes in kafka-python with valid CRCs; every index verifies."""
    for log_path in _segment_logs(directory):
        data = log_path.read_bytes()
        if data:
            decode_all(data)
        dump = LogDump(log_path, int(log_path.name[:20]), len(data))
        for _ in iter_log(log_path, dump, check_crc=True, decode=True):
            pass
        assert not dump.problems, dump.problems
        idx = log_path.with_suffix(".index")
        tidx = log_path.with_suffix(".timeindex")
        assert not verify_offset_index(read_offset_index(idx), dump, idx.name)
        assert not verify_time_index(read_time_index(tidx), dump, tidx.name)


async def check_against_model(log, model: LogModel, rng: random.Random) -> None:
    view = log.view
    assert view.high_watermark == (model.records[-1].offset + 1 if model.records else view.high_watermark)
    offsets = [r.offset for r in model.records]
    probes = offsets if len(offsets) < 60 else rng.sample(offsets, 60)
    for offset in probes:
        result = reader.read_records(view, offset, 7, rng.choice([1, 100, 5000, 10**6]))
        assert result.records == model.from_offset(offset, len(result.records))
        assert result.records, "a read at an existing offset returns at least one record"
        slice_ = reader.fetch_slice(view, offset, 1)
        assert slice_.first_batch_offset <= offset < slice_.next_offset
    stamps = sorted({r.timestamp for r in model.records})
    for ts in rng.sample(stamps, min(len(stamps), 30)) + [0, (stamps[-1] + 1) if stamps else 0]:
        assert reader.offset_for_timestamp(view, ts) == model.first_at_or_after(ts)
    assert reader.max_timestamp_offset(view) == model.max_timestamp()


record_strategy = st.tuples(
    st.one_of(st.none(), st.binary(max_size=20)),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.integers(0, 10_000),
    st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))), max_size=2),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    batches=st.lists(st.tuples(st.lists(record_strategy, min_size=1, max_size=8), st.sampled_from([0, 0, 1, 4])), min_size=1, max_size=40),
    segment_bytes=st.sampled_from([300, 1000, 4000, 1 << 20]),
    interval=st.sampled_from([0, 100, 4096]),
    seed=st.integers(0, 2**32),
)
def test_log_matches_model_through_rolls_and_restarts(tmp_path_factory, batches, segment_bytes, interval, seed) -> None:
    directory = tmp_path_factory.mktemp("log") / "t-0"
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval, max_message_bytes=segment_bytes)
    rng = random.Random(seed)

    async def main() -> None:
        model = LogModel()
        async with running_log(directory, config) as log:
            for items, codec in batches:
                items = [(k, v, T0 + ts, h) for k, v, ts, h in items]
                batch = encode_batch(0, items, compression_type=codec)
                if len(batch) > config.max_batch_bytes:
                    with pytest.raises(RecordTooLargeError):
                        prepare_batches(batch, config)
                    continue
                result = await log.append(prepare_batches(batch, config))
                model.add(result.base_offset, items)
            await check_against_model(log, model, rng)
        check_files(directory)
        # clean restart: lazy, nothing scanned
        async with running_log(directory, config, clean_shutdown=True, recovery_point=log.high_watermark) as log2:
            assert log2.load_stats.scanned_segments == 0
            await check_against_model(log2, model, rng)
        # unclean restart from scratch: everything scanned, indexes rebuilt, same answers
        async with running_log(directory, config, clean_shutdown=False, recovery_point=0) as log3:
            assert log3.load_stats.scanned_segments == len(log3.view.segments)
            assert log3.load_stats.truncated_bytes == 0
            await check_against_model(log3, model, rng)
        check_files(directory)

    anyio.run(main)


async def test_group_commit_gives_each_append_consecutive_offsets(tmp_path: Path) -> None:
    async with running_log(tmp_path / "t-0") as log:
        results = []

        async def produce(i: int) -> None:
            items = [(b"p%d" % i, b"%d-%d" % (i, j), T0, []) for j in range(i % 5 + 1)]
            results.append((items, await append_records(log, items)))

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(produce, i)
        taken = set()
        for items, result in results:
            span = range(result.base_offset, result.last_offset + 1)
            assert len(span) == len(items)
            assert not taken & set(span)
            taken |= set(span)
            got = reader.read_records(log.view, result.base_offset, len(items), 1 << 20).records
            assert [r.value for r in got] == [v for _k, v, _t, _h in items]
        assert taken == set(range(log.high_watermark))


async def test_segment_exactly_full_then_roll(tmp_path: Path) -> None:
    one = encode_batch(0, [(b"k", b"v" * 100, T0, [])])
    size = len(one)
    config = LogConfig(segment_bytes=3 * size, max_message_bytes=size)
    async with running_log(tmp_path / "t-0", config) as log:
        for _ in range(3):
            await append_records(log, [(b"k", b"v" * 100, T0, [])])
        assert len(log.view.segments) == 1 and log.view.segments[0].size == 3 * size  # exactly full
        await append_records(log, [(b"k", b"v" * 100, T0, [])])
        assert [s.base_offset for s in log.view.segments] == [0, 3]


async def test_index_one_entry_short_of_full_then_roll(tmp_path: Path) -> None:
    # 48-byte indexes: the time index holds 4 entries, one kept for the final entry on roll
    config = LogConfig(segment_index_bytes=48, index_interval_bytes=0)
    async with running_log(tmp_path / "t-0", config) as log:
        for i in range(4):  # entries for batches 2..4: three, one short of full
            await append_records(log, [(b"k", b"v", T0 + i, [])])
        segment = log.view.segments[0]
        assert segment.time_index.entries == 3 and segment.time_index.is_full
        assert len(log.view.segments) == 1
        await append_records(log, [(b"k", b"v", T0 + 10, [])])
        assert [s.base_offset for s in log.view.segments] == [0, 4]
        assert segment.time_index.last_entry() == (T0 + 3, 3)  # already the largest: no final entry
        assert segment.offset_index.entries == 3 and not segment.offset_index.is_full
    check_files(tmp_path / "t-0")


async def test_roll_writes_a_final_time_index_entry(tmp_path: Path) -> None:
    size = len(encode_batch(0, [(b"k", b"v", T0, [])]))
    config = LogConfig(index_interval_bytes=size + 10, segment_bytes=4 * size)
    async with running_log(tmp_path / "t-0", config) as log:
        for i in range(4):  # an index entry at the 3rd batch only
            await append_records(log, [(b"k", b"v", T0 + i, [])])
        segment = log.view.segments[0]
        assert [segment.time_index.entry(i) for i in range(segment.time_index.entries)] == [(T0 + 2, 2)]
        await append_records(log, [(b"k", b"v", T0 + 9, [])])  # rolls: segment is full
        assert [segment.time_index.entry(i) for i in range(segment.time_index.entries)] == [(T0 + 2, 2), (T0 + 3, 3)]
        assert (tmp_path / "t-0" / "00000000000000000000.timeindex").stat().st_size == 24  # trimmed
    check_files(tmp_path / "t-0")


async def test_relative_offset_overflow_rolls(tmp_path: Path) -> None:
    config = LogConfig()
    async with running_log(tmp_path / "t-0", config) as log:
        # one record claiming 2^31 - 1 offsets: produce validation refuses it (Kafka's "Inconsistent
        # batch offset range"), but a log may hold such a batch (compaction's shape), so it goes in
        # past prepare_batches
        big = patch_last_offset_delta(encode_batch(0, [(b"a", b"1", T0, [])]), INT32_MAX - 1)
        await log.append([PreparedBatch(memoryview(big), parse_header(big))])
        assert log.high_watermark == INT32_MAX  # offsets 0 .. 2^31-2
        await append_records(log, [(b"b", b"2", T0, [])])  # offset 2^31-1: relative offset fits exactly
        assert len(log.view.segments) == 1
        await append_records(log, [(b"c", b"3", T0, [])])  # 2^31 does not
        assert [s.base_offset for s in log.view.segments] == [0, INT32_MAX + 1]
        records = reader.read_records(log.view, INT32_MAX - 1, 10, 1 << 20).records
        assert [(r.offset, r.value) for r in records] == [(INT32_MAX, b"2"), (INT32_MAX + 1, b"3")]
    names = sorted(p.name for p in (tmp_path / "t-0").iterdir())
    assert filenames.log_file(Path(), INT32_MAX + 1).name in names


async def test_segment_ms_rolls_on_record_time(tmp_path: Path) -> None:
    config = LogConfig(segment_ms=1000)
    async with running_log(tmp_path / "t-0", config) as log:
        await append_records(log, [(b"k", b"v", T0, [])])
        await append_records(log, [(b"k", b"v", T0 + 1000, [])])  # waited == segment.ms: no roll
        assert len(log.view.segments) == 1
        await append_records(log, [(b"k", b"v", T0 + 1001, [])])
        assert [s.base_offset for s in log.view.segments] == [0, 2]


async def test_empty_segment_never_rolls(tmp_path: Path) -> None:
    async with running_log(tmp_path / "t-0", LogConfig(segment_ms=1)) as log:
        assert await log.roll() == 0  # nothing in it: stays
        await append_records(log, [(b"k", b"v", T0, [])])
        assert await log.roll() == 1
        assert await log.roll() == 1
        assert [s.size > 0 for s in log.view.segments] == [True, False]


async def test_log_append_time_is_stamped_by_the_writer(tmp_path: Path) -> None:
    clock = FakeClock(T0 + 5000)
    config = LogConfig(message_timestamp_type="LogAppendTime")
    async with running_log(tmp_path / "t-0", config, clock=clock) as log:
        result = await append_records(log, [(b"k", b"v", 1, []), (b"k", b"w", 2, [])])
        assert result.log_append_time == T0 + 5000
        data = reader.fetch_slice(log.view, 0, 1 << 20).read()
        header, records = decode_batch(data)
        assert header.timestamp_type == 1 and [r.timestamp for r in records] == [T0 + 5000] * 2
    check_files(tmp_path / "t-0")


async def test_out_of_range_reads(tmp_path: Path) -> None:
    async with running_log(tmp_path / "t-0") as log:
        await append_records(log, [(b"k", b"v", T0, [])] * 3)
        assert reader.fetch_slice(log.view, 3, 100) is None  # at the high watermark: nothing yet
        with pytest.raises(OffsetOutOfRangeError) as info:
            reader.fetch_slice(log.view, 4, 100)
        assert (info.value.log_start_offset, info.value.high_watermark) == (0, 3)
        assert await log.delete_records(2) == 2
        with pytest.raises(OffsetOutOfRangeError):
            reader.fetch_slice(log.view, 1, 100)
        assert [r.offset for r in reader.read_records(log.view, 2, 10, 1000).records] == [2]
        assert await log.delete_records(1) == 2  # never moves back
        with pytest.raises(OffsetOutOfRangeError):
            await log.delete_records(4)
        assert await log.delete_records(-1) == 3  # -1: the high watermark


async def test_time_lookup_skips_records_below_log_start(tmp_path: Path) -> None:
    async with running_log(tmp_path / "t-0") as log:
        await append_records(log, [(b"k", b"v", T0 + i, []) for i in range(5)])
        await log.delete_records(3)
        assert reader.offset_for_timestamp(log.view, T0) == (3, T0 + 3)
        assert reader.max_timestamp_offset(log.view) == (4, T0 + 4)


async def test_bad_batches_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    async with running_log(tmp_path / "t-0", LogConfig(max_message_bytes=200)) as log:
        good = encode_batch(0, [(b"k", b"v", T0, [])])
        bad = bytearray(good)
        bad[-1] ^= 0xFF
        with pytest.raises(CorruptBatchError, match="CRC"):
            prepare_batches(bytes(good) + bytes(bad), log.config)
        with pytest.raises(RecordTooLargeError):
            prepare_batches(encode_batch(0, [(b"k", b"v" * 300, T0, [])]), log.config)
        control = encode_batch(0, [(b"k", b"v", T0, [])], control=True)
        with pytest.raises(CorruptBatchError, match="control"):
            prepare_batches(control, log.config)
        assert log.high_watermark == 0


async def test_long_poll_wakes_on_append(tmp_path: Path) -> None:
    async with running_log(tmp_path / "t-0") as log:
        woke = anyio.Event()

        async def waiter() -> None:
            assert await log.wait_for_data(0, 10)
            woke.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert not woke.is_set()
            await append_records(log, [(b"k", b"v", T0, [])])
            with anyio.fail_after(5):
                await woke.wait()
        assert not await log.wait_for_data(1, 0.01)  # times out: nothing new


async def test_appends_after_close_are_refused(tmp_path: Path) -> None:
    async with running_log(tmp_path / "t-0") as log:
        pass
    with pytest.raises(LogClosedError):
        await append_records(log, [(b"k", b"v", T0, [])])


async def test_closing_a_log_ends_every_wait_at_once(tmp_path: Path) -> None:
    """Waits on a closed log raise instead of returning False without suspending: an event
    stream that looped on wait_for_data spun for ever on a deleted topic (issue 11)."""
    async with running_log(tmp_path / "t-0") as log:
        ended: list[type] = []

        async def waiter() -> None:
            with pytest.raises(LogClosedError) as caught:
                await log.wait_for_data(0, 60)
            ended.append(type(caught.value))

        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert log.waiters == 2
            with anyio.fail_after(5):
                await log.close(deleted=True)
        assert ended == [TopicDeletedError, TopicDeletedError] and log.waiters == 0
        with anyio.fail_after(5), pytest.raises(TopicDeletedError, match="'t' was deleted"):
            await log.wait_for_data(0, 60)
        with pytest.raises(TopicDeletedError):
            await append_records(log, [(b"k", b"v", T0, [])])


async def test_stop_waiting_releases_waits_then_close_refuses_them(tmp_path: Path) -> None:
    async with running_log(tmp_path / "t-0") as log:
        await append_records(log, [(b"k", b"v", T0, [])])
        async with anyio.create_task_group() as tg:
            results: list[bool] = []

            async def waiter() -> None:
                results.append(await log.wait_for_data(1, 60))

            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            log.stop_waiting()
        assert results == [False] and log.waiting_stopped
        with anyio.fail_after(5):
            assert not await log.wait_for_data(1, 60)  # at once from now on
            assert await log.wait_for_data(0, 60)  # data there: True, as before
    with anyio.fail_after(5), pytest.raises(LogClosedError) as caught:
        await log.wait_for_data(1, 60)
    assert type(caught.value) is LogClosedError  # shut down, not deleted


async def test_deferred_flush_acknowledges_before_fsync(tmp_path: Path) -> None:
    config = LogConfig(flush_messages=3)
    async with running_log(tmp_path / "t-0", config) as log:
        await append_records(log, [(b"k", b"v", T0, [])])
        assert log.high_watermark == 1 and log.recovery_point == 0  # acknowledged, not yet flushed
        await append_records(log, [(b"k", b"v", T0, [])] * 2)
        assert log.recovery_point == 3  # three unflushed messages: fsynced


async def test_flush_ms_follows_the_injected_clock(tmp_path: Path) -> None:
    config = LogConfig(flush_messages=1000, flush_ms=60_000)
    clock = FakeClock(T0)
    async with running_log(tmp_path / "t-0", config, clock=clock) as log:
        with anyio.fail_after(10):
            await append_records(log, [(b"k", b"v", T0, [])])
            assert log.recovery_point == 0
            clock.now += 59_999
            await log.tick()
            assert log.recovery_point == 0  # a millisecond short of flush.ms by the clock
            clock.now += 1
            await log.tick()
            assert log.recovery_point == 1


async def test_flush_timer_wakes_the_idle_writer_when_the_clock_says(tmp_path: Path) -> None:
    """No tick: the writer's own timer (what is left of flush.ms by the clock, in real time)
    wakes it, and the clock says flush.ms has passed."""
    config = LogConfig(flush_messages=1000, flush_ms=20)
    clock = FakeClock(T0)
    flushed = threading.Event()  # set by the fsync hook, in the writer's thread
    async with running_log(tmp_path / "t-0", config, clock=clock, on_fsync=lambda _log, _s: flushed.set()) as log:
        await append_records(log, [(b"k", b"v", T0, [])])
        assert log.recovery_point == 0
        clock.now += 20
        assert await anyio.to_thread.run_sync(flushed.wait, 10)
        assert log.recovery_point == 1


async def test_flush_ms_counts_from_now_when_the_clock_goes_back(tmp_path: Path) -> None:
    config = LogConfig(flush_messages=1000, flush_ms=60_000)
    clock = FakeClock(T0)
    async with running_log(tmp_path / "t-0", config, clock=clock) as log:
        with anyio.fail_after(10):
            await append_records(log, [(b"k", b"v", T0, [])])
            clock.now -= 3_600_000  # an hour back (a stepped wall clock)
            await log.tick()
            assert log.recovery_point == 0
            clock.now += 60_000  # flush.ms after the step, not an hour and flush.ms
            await log.tick()
            assert log.recovery_point == 1


async def test_many_producers_and_readers_never_see_partial_batches(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=6_000, index_interval_bytes=500)
    producers, per_producer = 8, 40
    acked: dict[bytes, int] = {}
    async with running_log(tmp_path / "t-0", config) as log:
        done = anyio.Event()

        async def produce(p: int) -> None:
            rng = random.Random(p)
            for i in range(per_producer):
                items = [(b"p%d" % p, b"%d:%d:%d" % (p, i, j), T0 + i, []) for j in range(rng.randint(1, 6))]
                result = await append_records(log, items, compression_type=rng.choice([0, 0, 3]))
                for j, (_k, value, _t, _h) in enumerate(items):
                    acked[value] = result.base_offset + j
                await anyio.sleep(0)

        async def read() -> None:
            offset = 0
            while True:
                view = log.view
                hw = view.high_watermark
                if offset < hw:
                    slice_ = reader.fetch_slice(view, offset, random.choice([1, 300, 5000]))
                    data = slice_.read()
                    position = 0
                    while position < len(data):
                        header = validate_batch(data, position)  # whole, CRC-valid batches only
                        assert header.last_offset < hw
                        position += header.size
                    offset = slice_.next_offset
                elif done.is_set():
                    return
                else:
                    await log.wait_for_data(offset, 0.05)

        async with anyio.create_task_group() as readers:
            for _ in range(4):
                readers.start_soon(read)
            async with anyio.create_task_group() as tg:
                for p in range(producers):
                    tg.start_soon(produce, p)
            done.set()
        assert len(log.view.segments) > 3
        everything = reader.read_records(log.view, 0, 10**6, 10**8).records
        assert len(everything) == len(acked) and {r.value: r.offset for r in everything} == acked
    check_files(tmp_path / "t-0")


async def test_delete_segments_renames_then_removes(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=200)
    async with running_log(directory, config) as log:
        for i in range(6):
            await append_records(log, [(b"k", b"v" * 50, T0 + i, [])])
        segments = log.view.segments
        assert len(segments) == 6
        held = reader.fetch_slice(log.view, 0, 100)  # a reader holding the old view
        removed = await log.delete_segments(segments[:2], reason="test")
        assert removed == segments[0].size + segments[1].size
        assert log.log_start_offset == 2
        assert [s.base_offset for s in log.view.segments] == [2, 3, 4, 5]
        names = os.listdir(directory)
        assert not any(n.endswith(".deleted") for n in names)  # default: unlinked at once
        assert filenames.log_file(directory, 0).name not in names
        with pytest.raises(OffsetOutOfRangeError):
            reader.fetch_slice(log.view, 1, 100)
        assert held.read()  # the old view's open descriptor still reads
        await log.delete_segments([log.view.segments[-1]])  # the active one: rolls first
        assert [s.base_offset for s in log.view.segments] == [2, 3, 4, 6]


async def test_replace_segments_swaps_in_compacted_output(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=300)
    async with running_log(directory, config) as log:
        for i in range(8):
            await append_records(log, [(b"k%d" % (i % 2), b"v%d" % i, T0 + i, [])] * 2)
        old = log.view.segments[:-1]
        # the "compactor": keep the last record per key from the closed segments
        kept = {}
        for s in old:
            for r in reader.read_records(log.view, s.base_offset, 1000, 1 << 20).records:
                if r.offset < log.view.segments[-1].base_offset:
                    kept[r.key] = r
        cleaned = LogSegment.create(directory, old[0].base_offset, max_index_bytes=config.segment_index_bytes, now_ms=T0, suffix=filenames.CLEANED_SUFFIX)
        from engine.segment import AppendBatch

        for r in sorted(kept.values(), key=lambda r: r.offset):
            b = encode_batch(r.offset, [(r.key, r.value, r.timestamp, [])])
            h = validate_batch(b)
            cleaned.append([AppendBatch(b, h.base_offset, h.last_offset, h.max_timestamp, h.size)], config.index_interval_bytes)
        cleaned.close_for_append()
        await log.replace_segments([cleaned], old)
        assert log.view.segments[0] is cleaned
        got = reader.read_records(log.view, 0, 1000, 1 << 20).records
        assert [r.offset for r in got[:2]] == sorted(r.offset for r in kept.values())
        names = os.listdir(directory)
        assert not any(n.endswith((".swap", ".cleaned", ".deleted")) for n in names)
    check_files(directory)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("log_append_time", [None, T0 + 99])
async def test_batches_built_by_kafka_python_append_and_read_back_equal(tmp_path: Path, codec: int, log_append_time) -> None:
    from ..kafka_oracle import build_batch

    records = [
        (None if i % 3 == 0 else b"key-%d" % i, None if i % 4 == 1 else b"value-%d" % i * 20, T0 + i, [("h", None), ("x", b"y")])
        for i in range(12)
    ]
    body = build_batch(records[:5], codec=codec, base_offset=77, log_append_time=log_append_time)
    body += build_batch(records[5:], codec=codec, base_offset=3, log_append_time=log_append_time, producer_id=9, producer_epoch=1, base_sequence=0)
    async with running_log(tmp_path / "t-0") as log:
        await append_records(log, [(b"first", b"!", T0, [])])
        result = await log.append(prepare_batches(body, log.config))
        assert (result.base_offset, result.last_offset) == (1, 12)
        got = reader.read_records(log.view, 1, 100, 1 << 20).records
        expected_ts = lambda ts: log_append_time if log_append_time is not None else ts  # noqa: E731
        assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in got] == [
            (1 + i, k, v, expected_ts(ts), tuple(h)) for i, (k, v, ts, h) in enumerate(records)
        ]
        raw = reader.fetch_slice(log.view, 1, 1 << 20).read()
        batches, _ = decode_all(raw)
        assert batches[-1].producer_id == 9 and batches[-1].base_sequence == 0  # kept as sent
    check_files(tmp_path / "t-0")


async def test_segment_infos_describe_what_readers_see(tmp_path: Path) -> None:
    size = len(encode_batch(0, [(b"k", b"v" * 60, T0, [])]))
    config = LogConfig(segment_bytes=3 * size, index_interval_bytes=50)
    async with running_log(tmp_path / "t-0", config) as log:
        for i in range(7):
            await append_records(log, [(b"k", b"v" * 60, T0 + 10 * i, [])])
        infos = reader.segment_infos(log.view)
    assert [(i.base_offset, i.last_offset, i.active) for i in infos] == [(0, 2, False), (3, 5, False), (6, 6, True)]
    assert [(i.first_timestamp, i.max_timestamp) for i in infos] == [(T0, T0 + 20), (T0 + 30, T0 + 50), (T0 + 60, T0 + 60)]
    assert all(i.size_bytes > 0 for i in infos) and infos[0].index_entries >= 1
    assert sum(i.size_bytes for i in infos) == log.view.size_bytes
