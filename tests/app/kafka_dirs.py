"""Build a log dir the way an Apache Kafka 2.x/3.x broker leaves it, with kafka-python's encoder.

Per partition: segments of v2 batches (several codecs), Kafka's extra files
(leader-epoch-checkpoint, an empty producer snapshot, partition.metadata), and indexes either
preallocated (the active segment of a crashed broker) or trimmed; per log dir: meta.properties
(ZooKeeper-era v0), checkpoint files including 0-byte ones, internal topics to skip.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..kafka_oracle import build_batch

T0 = 1_600_000_000_000
EMPTY_PRODUCER_SNAPSHOT = bytes.fromhex("000148674bc700000000")


@dataclass
class KafkaPartition:
    records: list[tuple[int, bytes | None, bytes | None, int]] = field(default_factory=list)  # offset, key, value, ts
    torn_bytes: int = 0


def _write_indexes(directory: Path, base: int, entries: list[tuple[int, int, int]], preallocate: bool) -> None:
    """entries: (last offset, position, max timestamp so far) per indexed batch."""
    index = b"".join(struct.pack(">ii", off - base, pos) for off, pos, _ts in entries)
    tindex = b"".join(struct.pack(">qi", ts, off - base) for off, _pos, ts in entries)
    if preallocate:
        index += bytes(10_485_760 - len(index))
        tindex += bytes(10_485_756 - len(tindex))
    (directory / f"{base:020d}.index").write_bytes(index)
    (directory / f"{base:020d}.timeindex").write_bytes(tindex)


def write_partition(
    directory: Path, segments: list[list[tuple[int, list]]], *, torn_tail: bytes = b"", crashed: bool = False
) -> KafkaPartition:
    """segments: per segment, a list of (codec, records) batches in offset order."""
    directory.mkdir(parents=True)
    part = KafkaPartition(torn_bytes=len(torn_tail))
    offset = 0
    for i, batches in enumerate(segments):
        base = offset
        data = bytearray()
        entries = []
        since, max_ts = 0, -1
        for codec, records in batches:
            batch = build_batch(records, codec=codec, base_offset=offset)
            last = offset + len(records) - 1
            max_ts = max(max_ts, max(ts for _k, _v, ts, _h in records))
            if since > 4096:
                entries.append((last, len(data), max_ts))
                since = 0
            for j, (k, v, ts, _h) in enumerate(records):
                part.records.append((offset + j, k, v, ts))
            data += batch
            since += len(batch)
            offset = last + 1
        last_segment = i == len(segments) - 1
        if last_segment:
            data += torn_tail
        (directory / f"{base:020d}.log").write_bytes(bytes(data))
        _write_indexes(directory, base, entries, preallocate=last_segment and crashed)
    (directory / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    (directory / f"{offset:020d}.snapshot").write_bytes(EMPTY_PRODUCER_SNAPSHOT)
    (directory / "partition.metadata").write_text("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n")
    return part


def batches(n: int, *, start_ts: int = T0, codecs=(0, 1, 2, 3, 4), size: int = 200) -> list[tuple[int, list]]:
    out = []
    for i in range(n):
        records = [
            (None if j % 4 == 0 else b"key-%d" % j, None if (i + j) % 9 == 0 else b"v%d-%d-" % (i, j) + b"x" * size, start_ts + i * 10 + j, [("h", b"1"), ("n", None)])
            for j in range(1 + i % 5)
        ]
        out.append((codecs[i % len(codecs)], records))
    return out


def write_kafka_log_dir(root: Path) -> dict[str, dict[int, KafkaPartition]]:
    root.mkdir(parents=True)
    (root / "meta.properties").write_text("#\n#Tue Nov 22 03:00:00 UTC 2022\nbroker.id=0\nversion=0\ncluster.id=q1Sh-9_ISia_zwGINzRvyQ\n")
    (root / ".lock").write_bytes(b"")
    (root / "cleaner-offset-checkpoint").write_bytes(b"")  # 0 bytes, as a real broker left it
    (root / "replication-offset-checkpoint").write_text("0\n0\n")
    topics = {
        "orders": {
            0: write_partition(root / "orders-0", [batches(40), batches(30, start_ts=T0 + 10_000)]),
            1: write_partition(root / "orders-1", [batches(25, codecs=(0,))], torn_tail=b"\x00\x00\x00\x00\x00\x00\x00\x19\x00\x00\x10", crashed=True),
            3: write_partition(root / "orders-3", [batches(3, codecs=(4,))]),
        },
        "metrics.cpu": {0: write_partition(root / "metrics.cpu-0", [batches(10, codecs=(2,))])},
    }
    write_partition(root / "__consumer_offsets-0", [batches(2)])
    write_partition(root / "__cluster_metadata-0", [batches(2)])
    (root / "orders-2.a1b2c3d4e5f64718293a4b5c6d7e8f90-delete").mkdir()
    (root / "log-start-offset-checkpoint").write_text("0\n1\norders 0 5\n")
    (root / "recovery-point-offset-checkpoint").write_text("0\n2\norders 0 10\norders 1 0\n")
    return topics
