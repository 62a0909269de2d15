"""Test data for the benchmarks: pre-encoded v2 batches and fast partition filling.

Encoding is not what the benchmarks measure, so batches are encoded once with
engine.records.encode_batch and reused. The writer rewrites baseOffset in place, so every
append gets a fresh bytearray copy of the bytes (a memcpy, cheap next to an fsync).

Batches that must differ (increasing timestamps for time lookups) are made by patching a
template's baseTimestamp and maxTimestamp and recomputing the CRC, which covers them; the
records inside carry only deltas, so they stay valid.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterable, Iterator

import anyio

from engine.format import HEADER_SIZE, compute_crc
from engine.partition_log import PartitionLog, prepare_batches
from engine.records import encode_batch

MiB = 1 << 20
T0_MS = 1_700_000_000_000  # 2023-11-14: a fixed, realistic base for timestamps

_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_BASE_TIMESTAMP_AT = 27
_MAX_TIMESTAMP_AT = 35
_CRC_AT = 17


def value_bytes(size: int, seed: int = 7) -> bytes:
    """`size` pseudo-random bytes (incompressible, the same for a given seed)."""
    return random.Random(seed).randbytes(size)


def encode_records_batch(
    record_bytes: int, count: int, base_timestamp_ms: int = T0_MS
) -> bytearray:
    """One uncompressed batch of `count` records with no key and a `record_bytes` value; record
    i has timestamp base + i (one per millisecond)."""
    value = value_bytes(record_bytes)
    return encode_batch(0, [(None, value, base_timestamp_ms + i, ()) for i in range(count)])


def largest_batch_under(limit_bytes: int, record_bytes: int = 1024) -> bytearray:
    """The batch with the most `record_bytes` records whose total size is <= `limit_bytes`
    (e.g. a "1 MiB batch" that fits max.message.bytes and ten to a 10 MiB segment)."""
    count = max(1, (limit_bytes - HEADER_SIZE) // (record_bytes + 8))
    batch = encode_records_batch(record_bytes, count)
    while len(batch) > limit_bytes and count > 1:
        count -= 1
        batch = encode_records_batch(record_bytes, count)
    while True:
        bigger = encode_records_batch(record_bytes, count + 1)
        if len(bigger) > limit_bytes:
            return batch
        batch, count = bigger, count + 1


def retimed(template: bytes | bytearray, base_timestamp_ms: int) -> bytearray:
    """A copy of `template` moved in time: baseTimestamp = `base_timestamp_ms`, maxTimestamp
    shifted by the same amount, CRC recomputed (records keep their deltas)."""
    out = bytearray(template)
    old_base = _I64.unpack_from(out, _BASE_TIMESTAMP_AT)[0]
    old_max = _I64.unpack_from(out, _MAX_TIMESTAMP_AT)[0]
    _I64.pack_into(out, _BASE_TIMESTAMP_AT, base_timestamp_ms)
    _I64.pack_into(out, _MAX_TIMESTAMP_AT, old_max - old_base + base_timestamp_ms)
    _U32.pack_into(out, _CRC_AT, compute_crc(out, 0, len(out)))
    return out


async def fill(
    log: PartitionLog, bodies: Iterable[bytes | bytearray], *, producers: int = 1
) -> int:
    """Append every body (one or more concatenated batches) with `producers` concurrent tasks;
    returns the bytes appended.

    Set-up only: record framing is not re-checked (check_records=False) and, with more than
    one producer, bodies may be appended in any order. Use one producer when offsets must
    follow the order of `bodies` (increasing timestamps).
    """
    source: Iterator[bytes | bytearray] = iter(bodies)
    total = 0

    async def producer() -> None:
        nonlocal total
        for body in source:
            await log.append(prepare_batches(bytearray(body), log.config, check_records=False))
            total += len(body)

    async with anyio.create_task_group() as tg:
        for _ in range(producers):
            tg.start_soon(producer)
    return total
