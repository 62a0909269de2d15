"""Build a log dir the way an Apache Kafka 2.x/3.x broker leaves it, with kafka-python's encoder.

Per partition: segments of v2 batches (several codecs), Kafka's extra files
(leader-epoch-checkpoint, an empty producer snapshot, partition.metadata), and indexes either
preallocated (the active segment of a crashed broker) or trimmed; per log dir: meta.properties
(ZooKeeper-era v0), checkpoint files including 0-byte ones, internal topics to skip.

write_kraft_log_dir() adds what a KRaft broker leaves: `__cluster_metadata-0` holding topic and
config records (with a `.checkpoint` snapshot), and `__consumer_offsets-N` holding committed
offsets in every value version, transactional commits and tombstones. Those records are encoded
here from Kafka's own schemas (metadata/.../TopicRecord.json, ConfigRecord.json,
RemoveTopicRecord.json, the frame of AbstractApiMessageSerde; group-coordinator's
OffsetCommitKey.json / OffsetCommitValue.json), independently of eventlog's decoders.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

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
    write_raw_partition(root / "__consumer_offsets-0", [
        build_batch([(offset_commit_key("zk-group", "orders", 0), offset_commit_value(1, 7, "zk", T0), T0, [])]),
    ])
    # the broker's producer state for orders-3 (6 records): producer 42 (epoch 0) last wrote
    # sequences 8..9 at offsets 4..5, in Kafka's snapshot layout (ProducerSnapshot.json)
    entry = struct.pack(">qhiqiqiq", 42, 0, 9, 5, 1, T0, -1, -1)
    body = struct.pack(">i", 1) + entry
    (root / "orders-3" / f"{6:020d}.snapshot").write_bytes(struct.pack(">hI", 1, crc32c(body)) + body)
    (root / "orders-2.a1b2c3d4e5f64718293a4b5c6d7e8f90-delete").mkdir()
    (root / "log-start-offset-checkpoint").write_text("0\n1\norders 0 5\n")
    (root / "recovery-point-offset-checkpoint").write_text("0\n2\norders 0 10\norders 1 0\n")
    return topics


# -- KRaft -----------------------------------------------------------------------------------


def write_raw_partition(directory: Path, built: list[bytes], *, base: int = 0) -> None:
    """One segment of already built batches (base offsets assigned in order)."""
    directory.mkdir(parents=True)
    data = bytearray()
    offset = base
    for b in built:
        b = bytearray(b)
        struct.pack_into(">q", b, 0, offset)
        (last_delta,) = struct.unpack_from(">i", b, 23)
        offset += last_delta + 1
        data += b
    (directory / f"{base:020d}.log").write_bytes(bytes(data))
    (directory / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def compact_string(s: str | None) -> bytes:
    if s is None:
        return uvarint(0)
    raw = s.encode("utf-8")
    return uvarint(len(raw) + 1) + raw


def metadata_record(api_key: int, version: int, body: bytes) -> bytes:
    """AbstractApiMessageSerde's frame: frame version 1, api key, version (unsigned varints)."""
    return uvarint(1) + uvarint(api_key) + uvarint(version) + body


NO_TAGS = b"\x00"


def topic_record(name: str, topic_id: bytes) -> bytes:
    return metadata_record(2, 0, compact_string(name) + topic_id + NO_TAGS)


def config_record(resource_type: int, resource_name: str, name: str, value: str | None) -> bytes:
    return metadata_record(4, 0, bytes([resource_type]) + compact_string(resource_name) + compact_string(name) + compact_string(value) + NO_TAGS)


def remove_topic_record(topic_id: bytes) -> bytes:
    return metadata_record(9, 0, topic_id + NO_TAGS)


def control_batch(producer_id: int, commit: bool, *, key_type: int | None = None, value: bytes | None = None) -> bytes:
    """A control batch of one record: an end-transaction marker (or another control type)."""
    key = struct.pack(">hh", 0, key_type if key_type is not None else int(commit))
    if value is None:
        value = struct.pack(">hi", 0, 3)  # version 0, coordinator epoch 3
    raw = bytearray(build_batch([(key, value, T0, [])], producer_id=producer_id, producer_epoch=0, transactional=producer_id >= 0))
    (attributes,) = struct.unpack_from(">h", raw, 21)
    struct.pack_into(">h", raw, 21, attributes | 0x20)
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    return bytes(raw)


def _str16(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def offset_commit_key(group: str, topic: str, partition: int, key_version: int = 1) -> bytes:
    return struct.pack(">h", key_version) + _str16(group) + _str16(topic) + struct.pack(">i", partition)


def offset_commit_value(version: int, offset: int, metadata: str, commit_ts: int, leader_epoch: int = -1) -> bytes:
    out = struct.pack(">hq", version, offset)
    if version >= 3:
        out += struct.pack(">i", leader_epoch)
    if version >= 4:
        out += compact_string(metadata) + struct.pack(">q", commit_ts) + NO_TAGS
        return out
    out += _str16(metadata) + struct.pack(">q", commit_ts)
    if version == 1:
        out += struct.pack(">q", commit_ts + 86_400_000)  # expire timestamp
    return out


def group_metadata_key(group: str) -> bytes:
    return struct.pack(">h", 2) + _str16(group)


ORDERS_ID = bytes(range(16))
CPU_ID_OLD = bytes(range(16, 32))
CPU_ID = bytes(range(32, 48))

# what import must carry: (eventlog config name, value) per topic
KRAFT_CONFIGS = {
    "orders": {"cleanup.policy": "compact,delete", "retention.ms": "86400000", "segment.bytes": "1048576"},
    "metrics.cpu": {},  # its configs belonged to an incarnation that was deleted
}
# committed offsets import must merge: (group, topic, partition) -> (offset, metadata, commit timestamp)
KRAFT_OFFSETS = {
    ("g1", "orders", 0): (20, "", T0 + 3),
    ("g1", "orders", 1): (11, "v1", T0 + 1),
    ("g2", "metrics.cpu", 0): (7, "flex", T0 + 5),
    ("g2", "orders", 0): (3, "txn", T0 + 6),
}


def _records(values: list[bytes | None], keys: list[bytes | None] | None = None, **kw) -> bytes:
    keys = keys or [None] * len(values)
    return build_batch([(k, v, T0, []) for k, v in zip(keys, values)], **kw)


def write_kraft_log_dir(root: Path) -> dict[str, dict[int, KafkaPartition]]:
    """A KRaft broker's log dir (combined mode): user topics, __cluster_metadata-0 and
    __consumer_offsets partitions."""
    root.mkdir(parents=True)
    (root / "meta.properties").write_text(
        "#\n#Tue Nov 22 03:00:00 UTC 2022\nnode.id=1\ndirectory.id=ZZZZZZZZZZZZZZZZZZZZZw\nversion=1\ncluster.id=q1Sh-9_ISia_zwGINzRvyQ\n"
    )
    topics = {
        "orders": {
            0: write_partition(root / "orders-0", [batches(6)]),
            1: write_partition(root / "orders-1", [batches(4)]),
        },
        "metrics.cpu": {0: write_partition(root / "metrics.cpu-0", [batches(3)])},
    }
    meta = root / "__cluster_metadata-0"
    # the snapshot covers offsets below 5; the log holds what came after
    snapshot = [
        control_batch(-1, False, key_type=3, value=struct.pack(">h", 0) + b"\x00" * 9),  # SnapshotHeader
        _records([
            topic_record("orders", ORDERS_ID),
            config_record(2, "orders", "retention.ms", "86400000"),
            config_record(2, "orders", "max.message.bytes", "2000000"),
            config_record(4, "", "log.retention.ms", "1000"),  # a broker default: not a topic's
            topic_record("metrics.cpu", CPU_ID_OLD),
        ]),
    ]
    write_raw_partition(meta, [
        _records([config_record(2, "metrics.cpu", "retention.ms", "1000")]),
    ], base=5)
    data = bytearray()
    offset = 0
    for b in snapshot:
        b = bytearray(b)
        struct.pack_into(">q", b, 0, offset)
        offset += struct.unpack_from(">i", b, 23)[0] + 1
        data += b
    (meta / "00000000000000000005-0000000001.checkpoint").write_bytes(bytes(data))
    log = (meta / f"{5:020d}.log")
    tail = bytearray()
    offset = 6
    for b in [
        control_batch(-1, False, key_type=2, value=b"\x00\x00leader-change"),  # LeaderChange
        _records([
            config_record(2, "orders", "max.message.bytes", None),  # deleted again
            config_record(2, "orders", "cleanup.policy", "compact,delete"),
            config_record(2, "orders", "min.insync.replicas", "2"),  # no such eventlog config
            config_record(2, "orders", "segment.bytes", "1048576"),
            metadata_record(12, 0, compact_string("metadata.version") + struct.pack(">h", 7) + NO_TAGS),  # FeatureLevelRecord
            remove_topic_record(CPU_ID_OLD),
            topic_record("metrics.cpu", CPU_ID),
        ]),
    ]:
        b = bytearray(b)
        struct.pack_into(">q", b, 0, offset)
        offset += struct.unpack_from(">i", b, 23)[0] + 1
        tail += b
    log.write_bytes(log.read_bytes() + bytes(tail))

    write_raw_partition(root / "__consumer_offsets-0", [
        _records(
            [offset_commit_value(0, 10, "v0", T0), offset_commit_value(1, 11, "v1", T0 + 1), b"\x00\x03junk"],
            [offset_commit_key("g1", "orders", 0, 0), offset_commit_key("g1", "orders", 1), group_metadata_key("g1")],
        ),
        _records(
            [offset_commit_value(2, 5, "gone", T0 + 2), offset_commit_value(3, 20, "", T0 + 3, leader_epoch=5), None],
            [offset_commit_key("g1", "gone", 0), offset_commit_key("g1", "orders", 0), offset_commit_key("g1", "gone", 0)],
            codec=1,
        ),
    ])
    write_raw_partition(root / "__consumer_offsets-3", [
        _records([offset_commit_value(4, 7, "flex", T0 + 5)], [offset_commit_key("g2", "metrics.cpu", 0)]),
        _records([offset_commit_value(3, 3, "txn", T0 + 6)], [offset_commit_key("g2", "orders", 0)],
                 producer_id=99, producer_epoch=0, base_sequence=0, transactional=True),
        _records([offset_commit_value(3, 4, "aborted", T0 + 7)], [offset_commit_key("g2", "orders", 1)],
                 producer_id=100, producer_epoch=0, base_sequence=0, transactional=True),
        control_batch(100, False),
        control_batch(99, True),
        _records([offset_commit_value(3, 9, "open", T0 + 8)], [offset_commit_key("g2", "orders", 0)],
                 producer_id=101, producer_epoch=0, base_sequence=0, transactional=True),
    ])
    return topics
