"""Idempotent producers and conditional appends in the partition log, across restarts."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import anyio
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import reader
from engine.config import LogConfig
from engine.errors import OffsetMismatchError, OutOfOrderSequenceError, ProducerFencedError, StorageError
from engine.partition_log import prepare_batches
from engine.producer_state import (
    MAX_BATCHES_PER_PRODUCER,
    ProducerStateManager,
    last_sequence,
    parse_snapshot_name,
)
from engine.records import encode_batch

from ..kafka_oracle import decode_all
from .helpers import FakeClock, running_log

T0 = 1_700_000_000_000


def batch(pid: int, epoch: int, seq: int, n: int = 3, tag: str = "v", ts: int = T0) -> bytes:
    return encode_batch(
        0, [(b"k", f"{tag}{seq + i}".encode(), ts, []) for i in range(n)],
        producer_id=pid, producer_epoch=epoch, base_sequence=seq,
    )


async def put(log, data: bytes, **kw):
    return await log.append(prepare_batches(data, log.config), **kw)


def snapshots(directory: Path) -> list[int]:
    return sorted(o for p in directory.iterdir() if (o := parse_snapshot_name(p.name)) is not None)


def test_last_sequence_wraps() -> None:
    assert last_sequence(0, 4) == 4
    assert last_sequence(2**31 - 1, 0) == 2**31 - 1
    assert last_sequence(2**31 - 2, 3) == 1  # ..., MAX-1, MAX, 0, 1


async def test_a_retry_returns_the_first_offsets_and_writes_nothing(tmp_path: Path) -> None:
    async with running_log(tmp_path) as log:
        await put(log, encode_batch(0, [(None, b"other", T0, [])]))
        first = await put(log, batch(7, 0, 0))
        assert (first.base_offset, first.last_offset, first.duplicate) == (1, 3, False)
        again = await put(log, batch(7, 0, 0))
        assert again.duplicate and (again.base_offset, again.last_offset) == (1, 3)
        assert again.batch_max_timestamps == (T0,)
        assert log.high_watermark == 4
        nxt = await put(log, batch(7, 0, 3))
        assert (nxt.base_offset, nxt.duplicate) == (4, False)
        result = reader.read_records(log.view, 0, 100, 10**6)
        assert [r.value for r in result.records] == [b"other", b"v0", b"v1", b"v2", b"v3", b"v4", b"v5"]


async def test_sequence_gaps_old_epochs_and_new_epochs(tmp_path: Path) -> None:
    async with running_log(tmp_path) as log:
        await put(log, batch(7, 3, 0))
        with pytest.raises(OutOfOrderSequenceError) as gap:
            await put(log, batch(7, 3, 10))  # 3..9 are missing
        assert gap.value.last_seq == 2
        with pytest.raises(ProducerFencedError):
            await put(log, batch(7, 2, 3))  # a zombie with an older epoch
        with pytest.raises(OutOfOrderSequenceError):
            await put(log, batch(7, 4, 5))  # a new epoch starts at 0
        assert log.high_watermark == 3, "refused batches take no offsets"
        assert (await put(log, batch(7, 4, 0))).base_offset == 3
        # an unknown producer may start anywhere (its state expired or was never here)
        assert (await put(log, batch(8, 0, 500))).base_offset == 6
        # batches without a producer id are never checked
        assert (await put(log, encode_batch(0, [(None, b"x", T0, [])]))).base_offset == 9


async def test_the_last_five_batches_are_remembered(tmp_path: Path) -> None:
    async with running_log(tmp_path) as log:
        results = [await put(log, batch(7, 0, 2 * i, n=2)) for i in range(MAX_BATCHES_PER_PRODUCER + 1)]
        for i in range(1, MAX_BATCHES_PER_PRODUCER + 1):
            again = await put(log, batch(7, 0, 2 * i, n=2))
            assert again.duplicate and again.base_offset == results[i].base_offset
        with pytest.raises(OutOfOrderSequenceError):  # the oldest has been forgotten
            await put(log, batch(7, 0, 0, n=2))


async def test_one_group_commit_checks_requests_against_each_other(tmp_path: Path) -> None:
    """Retries queued behind their first attempt (same group commit) are still duplicates."""
    async with running_log(tmp_path) as log:
        results = []

        async def send(data: bytes) -> None:
            results.append(await put(log, data))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(send, batch(9, 0, 0))
            tg.start_soon(send, batch(9, 0, 3))
        assert log.high_watermark == 6
        assert sorted((r.base_offset, r.duplicate) for r in results) == [(0, False)] + [(0, True)] * 4 + [(3, False)]


async def test_expected_offset(tmp_path: Path) -> None:
    async with running_log(tmp_path) as log:
        assert (await put(log, batch(-1, -1, -1), expected_offset=0)).base_offset == 0
        with pytest.raises(OffsetMismatchError) as exc:
            await put(log, batch(-1, -1, -1), expected_offset=0)
        assert (exc.value.expected, exc.value.high_watermark) == (0, 3)
        assert log.high_watermark == 3

        # concurrent writers expecting the same offset: exactly one wins
        outcomes = []

        async def writer(i: int) -> None:
            try:
                await put(log, batch(-1, -1, -1, tag=f"w{i}-"), expected_offset=3)
                outcomes.append("ok")
            except OffsetMismatchError:
                outcomes.append("mismatch")

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(writer, i)
        assert sorted(outcomes) == ["mismatch"] * 7 + ["ok"]
        assert log.high_watermark == 6


async def test_a_retried_conditional_append_is_a_duplicate_not_a_mismatch(tmp_path: Path) -> None:
    async with running_log(tmp_path) as log:
        first = await put(log, batch(5, 0, 0), expected_offset=0)
        again = await put(log, batch(5, 0, 0), expected_offset=0)
        assert again.duplicate and again.base_offset == first.base_offset == 0


async def test_state_survives_a_clean_restart_through_the_snapshot(tmp_path: Path) -> None:
    async with running_log(tmp_path) as log:
        await put(log, batch(7, 0, 0))
        await put(log, batch(7, 0, 3))
    assert snapshots(tmp_path) == [6]
    async with running_log(tmp_path, clean_shutdown=True) as log:
        assert (await put(log, batch(7, 0, 3))).duplicate
        with pytest.raises(OutOfOrderSequenceError):
            await put(log, batch(7, 0, 9))
        assert (await put(log, batch(7, 0, 6))).base_offset == 6


async def test_state_is_rebuilt_from_the_log_after_a_crash(tmp_path: Path) -> None:
    """The files as a SIGKILL would leave them (copied while the log runs): snapshots from the
    rolls, then batch headers replayed from the newest one."""
    config = LogConfig(segment_bytes=300)
    live = tmp_path / "live"
    crashed = tmp_path / "crashed"
    acked = {}
    async with running_log(live, config) as log:
        for i in range(12):
            pid = 100 + i % 3
            seq = (i // 3) * 3
            acked[(pid, seq)] = await put(log, batch(pid, 0, seq))
        assert len(snapshots(live)) >= 1, "rolls write producer snapshots"
        shutil.copytree(live, crashed)
    assert len(list(crashed.glob("*.log"))) > 2
    async with running_log(crashed, config, clean_shutdown=False) as log:
        hw = log.high_watermark
        for (pid, seq), first in acked.items():  # 4 batches each: all remembered
            again = await put(log, batch(pid, 0, seq))
            assert again.duplicate and again.base_offset == first.base_offset
        assert log.high_watermark == hw
        assert (await put(log, batch(100, 0, 12))).base_offset == hw


async def test_unreadable_or_too_new_snapshots_are_dropped(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=600)
    async with running_log(tmp_path, config) as log:
        for i in range(8):
            await put(log, batch(1, 0, 3 * i))
    newest = snapshots(tmp_path)[-1]
    for suffix in (".snapshot", ".producers"):
        (tmp_path / f"{newest:020d}{suffix}").write_bytes(b"\x00\x01garbage")
        (tmp_path / f"{newest + 1000:020d}{suffix}").write_bytes(ProducerStateManager(tmp_path, 1).encode())
    async with running_log(tmp_path, config, clean_shutdown=False) as log:
        assert (await put(log, batch(1, 0, 21))).duplicate, "rebuilt from an older snapshot plus the log"
        assert newest + 1000 not in snapshots(tmp_path)
        assert not (tmp_path / f"{newest + 1000:020d}.producers").exists()
        assert not (tmp_path / f"{newest:020d}.producers").exists()


async def test_producers_expire(tmp_path: Path) -> None:
    """A window after the last append (by the server's clock, whatever the batch timestamps)."""
    clock = FakeClock(T0 + 10**9)
    async with running_log(tmp_path, clock=clock, producer_id_expiration_ms=60_000) as log:
        await put(log, batch(7, 0, 0))
        clock.now += 59_999
        assert (await put(log, batch(7, 0, 0))).duplicate
        clock.now += 60_000
        again = await put(log, batch(7, 0, 0))  # forgotten: written again, as Kafka would
        assert not again.duplicate and again.base_offset == 3


def test_snapshot_round_trip_and_corruption(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path, 10**12)
    state.replay(
        (
            prepare_batches(batch(pid, 0, seq), LogConfig())[0].header._replace(base_offset=off)
            for off, (pid, seq) in enumerate([(1, 0), (2, 0), (1, 3), (1, 6)])
        ),
        T0,
    )
    data = state.encode()
    decoded = ProducerStateManager.decode(data)
    assert {pid: list(e.batches) for pid, e in decoded.items()} == {pid: list(e.batches) for pid, e in state.producers.items()}
    for cut in range(len(data)):
        with pytest.raises(StorageError):
            ProducerStateManager.decode(data[:cut])
    flipped = bytearray(data)
    flipped[-1] ^= 1
    with pytest.raises(StorageError):
        ProducerStateManager.decode(bytes(flipped))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 6)), min_size=1, max_size=25))
def test_against_a_model(tmp_path_factory, ops) -> None:
    """Random retries, gaps and epoch changes: the log holds each (producer, epoch, sequence)
    batch at most once, and what was refused took no offsets."""
    directory = tmp_path_factory.mktemp("model")

    async def run() -> None:
        written: dict[tuple[int, int, int], int] = {}
        async with running_log(directory) as log:
            for pid, epoch, step in ops:
                seq = step * 2
                try:
                    result = await put(log, batch(pid, epoch, seq, n=2))
                except (OutOfOrderSequenceError, ProducerFencedError):
                    continue
                key = (pid, epoch, seq)
                if result.duplicate:
                    assert written[key] == result.base_offset
                else:
                    written[key] = result.base_offset
            hw = log.high_watermark
            records = reader.read_records(log.view, 0, 10_000, 10**8).records
            assert len(records) == hw == 2 * len({v for v in written.values()})
        data = b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))
        batches, _records = decode_all(data)
        assert len(batches) == hw // 2

    anyio.run(run)


# -- Kafka's snapshot layout -------------------------------------------------------------------
# Written here from Kafka's schema (ProducerStateManager / ProducerSnapshot.json), independently
# of engine/producer_state.py: int16 version 1, uint32 CRC-32C of everything after it, int32
# count, then per producer int64 producer_id, int16 epoch, int32 last_sequence, int64
# last_offset, int32 offset_delta, int64 timestamp, int32 coordinator_epoch, int64
# current_txn_first_offset.

_KAFKA_ENTRY = struct.Struct(">qhiqiqiq")


def kafka_snapshot_entries(data: bytes) -> list[tuple[int, ...]]:
    version, crc = struct.unpack_from(">hI", data, 0)
    assert version == 1
    assert crc32c(data[6:]) == crc
    (count,) = struct.unpack_from(">i", data, 6)
    assert len(data) == 10 + count * _KAFKA_ENTRY.size, "exactly Kafka's entries, nothing else"
    return [_KAFKA_ENTRY.unpack_from(data, 10 + i * _KAFKA_ENTRY.size) for i in range(count)]


def kafka_snapshot(entries: list[tuple[int, ...]]) -> bytes:
    body = struct.pack(">i", len(entries)) + b"".join(_KAFKA_ENTRY.pack(*e) for e in entries)
    return struct.pack(">hI", 1, crc32c(body)) + body


def test_an_empty_snapshot_is_byte_for_byte_kafkas(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path, 10**12)
    state.write_snapshot(0, T0)
    assert (tmp_path / "00000000000000000000.snapshot").read_bytes() == bytes.fromhex("000148674bc700000000")


async def test_snapshot_files_hold_kafkas_layout_and_our_state_has_its_own_file(tmp_path: Path) -> None:
    async with running_log(tmp_path) as log:
        await put(log, encode_batch(0, [(None, b"other", T0, [])]))
        for i in range(7):
            await put(log, batch(7, 2, 3 * i, ts=T0 + i))
        await put(log, batch(8, 0, 2**31 - 2, n=4, ts=T0 + 99))  # sequences wrap: MAX-1 .. 1
    entries = kafka_snapshot_entries((tmp_path / "00000000000000000026.snapshot").read_bytes())
    assert sorted(entries) == [
        # pid, epoch, last seq, last offset, offset delta, timestamp, coordinator epoch, txn first offset
        (7, 2, 20, 21, 2, T0 + 6, -1, -1),
        (8, 0, 1, 25, 3, T0 + 99, -1, -1),
    ]
    assert [p.name for p in sorted(tmp_path.glob("*.producers"))] == ["00000000000000000026.producers"]
    # eventlog's own file keeps the last five batches: a retry of the third-newest is still seen
    async with running_log(tmp_path, clean_shutdown=True) as log:
        again = await put(log, batch(7, 2, 12))
        assert again.duplicate and again.base_offset == 13


async def test_a_snapshot_written_by_a_kafka_broker_loads(tmp_path: Path) -> None:
    """An imported Kafka dir has only Kafka's `.snapshot`: its producers (here one whose batches
    are no longer in the log) are remembered by their last batch."""
    async with running_log(tmp_path) as log:
        await put(log, encode_batch(0, [(None, b"x", T0, [])] * 10))
    for p in list(tmp_path.glob("*.snapshot")) + list(tmp_path.glob("*.producers")):
        p.unlink()
    # producer 42, epoch 3, last batch: sequences 5..9 at offsets 4..8; one wrapped: MAX-1 .. 2
    (tmp_path / "00000000000000000010.snapshot").write_bytes(kafka_snapshot([
        (42, 3, 9, 8, 4, T0, -1, -1),
        (43, 0, 2, 9, 4, T0, -1, -1),
        (44, 1, -1, -1, 0, T0, 5, -1),  # no batch metadata (only markers were written)
    ]))
    async with running_log(tmp_path, clean_shutdown=True) as log:
        again = await put(log, batch(42, 3, 5, n=5))
        assert again.duplicate and (again.base_offset, again.last_offset) == (4, 8)
        with pytest.raises(OutOfOrderSequenceError):
            await put(log, batch(42, 3, 20))
        with pytest.raises(ProducerFencedError):
            await put(log, batch(42, 2, 0))
        assert (await put(log, batch(42, 3, 10))).base_offset == 10
        wrapped = await put(log, batch(43, 0, 2**31 - 2, n=5))
        assert wrapped.duplicate and wrapped.base_offset == 5
        assert (await put(log, batch(43, 0, 3))).base_offset == 13
        with pytest.raises(ProducerFencedError):
            await put(log, batch(44, 0, 0))


async def test_a_snapshot_of_the_old_eventlog_layout_still_loads(tmp_path: Path) -> None:
    """Data dirs written before the split hold eventlog's own layout under the Kafka name."""
    async with running_log(tmp_path) as log:
        for i in range(4):
            await put(log, batch(7, 0, 3 * i))
    state = ProducerStateManager(tmp_path, 10**12)
    state.load(12, T0)
    old = state.encode()
    for p in list(tmp_path.glob("*.snapshot")) + list(tmp_path.glob("*.producers")):
        p.unlink()
    (tmp_path / "00000000000000000012.snapshot").write_bytes(old)
    async with running_log(tmp_path, clean_shutdown=True) as log:
        assert (await put(log, batch(7, 0, 0))).duplicate, "all five batches came back"
