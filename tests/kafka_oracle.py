"""kafka-python (pinned) as an independent encoder and decoder of v2 record batches.

What kafka-python 3.0.12 does that a test must know (checked against its record codec; the
version is pinned in pyproject.toml because its kafka.record modules are internal):

1. The builder never writes the base offset: it packs baseOffset 0 and partitionLeaderEpoch 0,
   and the offset given to append() becomes the record's offsetDelta. build_batch patches bytes
   0-7 afterwards; neither field is covered by the CRC, so no CRC is recomputed.
2. The builder never sets the timestamp type (CreateTime, attribute bit 3 clear). For
   LogAppendTime, build_batch sets bit 3 and maxTimestamp and recomputes the CRC (attributes
   are inside it). On read, kafka-python reports every record's timestamp as maxTimestamp for
   LogAppendTime batches, as Java does.
3. A timestamp must be an int (a float raises TypeError); None means now.
4. Compression falls back silently: if the compressed records are not smaller, the batch is
   written uncompressed (attributes & 7 == 0). Check the attributes, not what was asked for.
5. Iteration never checks the CRC: decode_all calls validate_crc() before iterating (it asserts
   the batch has not been decompressed yet). v2 records have no CRC of their own.
6. A torn tail is silent: MemoryRecords stops before a trailing partial batch without an error,
   so decode_all compares valid_bytes() with the length. A zero-filled tail (length 0) raises
   CorruptRecordError from next_batch() instead.
7. Header keys must be str (the builder encodes them as UTF-8); header values bytes or None.
8. The builder refuses (returns None) a record after the first that would pass batch_size:
   build_batch passes a huge batch_size.
9. Attribute bit 6 (hasDeleteHorizonMs, set by compaction) is ignored; when it is set,
   baseTimestamp is the delete horizon, so baseTimestamp + timestampDelta is not the
   producer's timestamp.
10. next_batch() also accepts magic 0 and 1 (legacy) batches: decode_all asserts magic == 2.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@dataclass(frozen=True)
class OracleRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def build_batch(
    records: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]],
    *,
    codec: int = 0,
    base_offset: int = 0,
    log_append_time: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=transactional,
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for i, (key, value, ts, headers) in enumerate(records):
        assert builder.append(i, timestamp=ts, key=key, value=value, headers=list(headers)) is not None
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, base_offset)
    if log_append_time is not None:
        (attributes,) = struct.unpack_from(">h", buf, 21)
        struct.pack_into(">h", buf, 21, attributes | 0x08)
        struct.pack_into(">q", buf, 35, log_append_time)
        struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


def decode_all(data: bytes) -> tuple[list[DefaultRecordBatch], list[OracleRecord]]:
    """Every batch (CRC-checked, magic 2 asserted) and record; the data must hold whole batches."""
    memory = MemoryRecords(bytes(data))
    assert memory.valid_bytes() == len(data), f"{len(data) - memory.valid_bytes()} trailing bytes"
    batches = []
    records = []
    while True:
        batch = memory.next_batch()
        if batch is None:
            break
        assert batch.magic == 2
        assert batch.validate_crc(), f"bad CRC in batch at offset {batch.base_offset}"
        batches.append(batch)
        for r in batch:
            records.append(
                OracleRecord(r.offset, r.timestamp, r.key, r.value, tuple((k, v) for k, v in r.headers))
            )
    return batches, records
