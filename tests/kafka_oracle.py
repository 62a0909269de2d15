"""kafka-python (pinned) as an independent encoder and decoder of v2 record batches.

Gotchas handled here (see ../shared/KAFKA-FORMAT.md): the builder writes baseOffset 0 and
leader epoch 0, never sets LogAppendTime, silently falls back to no compression when that is
not smaller, and iteration does not check CRCs.
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
