"""What a Kafka log dir keeps in Kafka's own internal topics, read for `eventlog import-kafka`.

Topic configs, from KRaft's metadata log `__cluster_metadata-0`: the newest snapshot
(`<end offset, 20 digits>-<epoch, 10 digits>.checkpoint`, record batches like a segment) and
then every record of the `.log` files at or above its end offset. A record's value is framed
as Kafka's AbstractApiMessageSerde writes it (unsigned varints: frame version 1, api key,
version), then the record in Kafka's flexible encoding (compact strings: unsigned varint
length + 1, 0 for null; uuids: 16 bytes; a tagged-field section last). Used:

    TopicRecord        api key 2   name compact string, topic_id uuid
    ConfigRecord       api key 4   resource_type int8 (2 = topic), resource_name, name,
                                   value (compact strings; a null value removes the config)
    RemoveTopicRecord  api key 9   topic_id uuid (the topic's configs go with it)

Every other record (partitions, brokers, features, ...) and every control batch is skipped.

Committed offsets, from `__consumer_offsets-<n>`: key = int16 record type, then for types 0
and 1 (offset commits) group and topic (int16-length strings) and partition int32. The value
(null: a tombstone, the offset was deleted) is int16 version, then offset int64, leader_epoch
int32 (version 3+), metadata (int16-length string; compact string in the flexible version 4+),
commit_timestamp int64, expire_timestamp int64 (version 1 only), tagged fields (4+). Other key
types (group metadata, the new consumer protocol's records) are skipped. As Kafka's group
coordinator loads them: records of a transactional batch count only once a COMMIT marker of
their producer follows; an ABORT marker, or none, drops them. The latest record per key wins.

Files are read, never written, and each is read up to its first invalid batch (a torn tail).
Pure decoding over blocking reads; call from a worker thread.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from . import filenames
from .control_records import ABORT, COMMIT, control_type
from .errors import CorruptBatchError
from .groups import CommittedOffset
from .format import BatchHeader
from .records import Record, decode_records
from .scan import BatchScanner

METADATA_DIR = "__cluster_metadata-0"
TOPIC_RESOURCE = 2
_TOPIC_RECORD, _CONFIG_RECORD, _REMOVE_TOPIC_RECORD = 2, 4, 9
_FRAME_VERSION = 1
_CHECKPOINT_RE = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
_OFFSET_COMMIT_KEYS = (0, 1)


class _Malformed(Exception):
    pass


class _Reader:
    """Kafka's primitive types, big-endian, over one record's bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise _Malformed(f"needs {n} bytes at {self.pos}, has {len(self.data) - self.pos}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def _unpack(self, fmt: str) -> int:
        s = struct.Struct(fmt)
        return s.unpack(self._take(s.size))[0]

    def int8(self) -> int:
        return self._unpack(">b")

    def int16(self) -> int:
        return self._unpack(">h")

    def int32(self) -> int:
        return self._unpack(">i")

    def int64(self) -> int:
        return self._unpack(">q")

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise _Malformed("unsigned varint longer than 5 bytes")

    def string16(self) -> str | None:
        n = self.int16()
        return None if n == -1 else self._take(n).decode("utf-8")

    def compact_string(self) -> str | None:
        n = self.uvarint()
        return None if n == 0 else self._take(n - 1).decode("utf-8")

    def uuid(self) -> bytes:
        return self._take(16)

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._take(self.uvarint())

    def end(self) -> None:
        if self.pos != len(self.data):
            raise _Malformed(f"{len(self.data) - self.pos} bytes left over")


def read_file_batches(path: Path, problems: list[str]) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """Every valid batch of a `.log` or `.checkpoint` file with its records; a torn or corrupt
    tail ends the file (noted in `problems`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        scanner = BatchScanner(fd, with_data=True, check_crc=True)
        for header, data in scanner:
            assert data is not None
            try:
                records = decode_records(data, header, 0)
            except CorruptBatchError as exc:
                problems.append(f"{path.name}: position {header.position}: {exc.reason}; the rest is ignored")
                return
            yield header, records
        if scanner.error is not None:
            problems.append(f"{path.name}: invalid data at position {scanner.error_position} ({scanner.error}); the rest is ignored")
    finally:
        os.close(fd)


def _log_files(directory: Path) -> list[Path]:
    found = []
    for name in os.listdir(directory):
        parsed = filenames.parse_segment_file(name)
        if parsed is not None and parsed[1] == filenames.LOG_SUFFIX and parsed[2] == "":
            found.append((parsed[0], directory / name))
    return [p for _base, p in sorted(found)]


# -- topic configs ----------------------------------------------------------------------------


@dataclass
class KafkaTopicConfigs:
    """The configs each live topic of a KRaft metadata log sets (its overrides, Kafka's names)."""

    configs: dict[str, dict[str, str]] = field(default_factory=dict)
    undecodable: int = 0  # metadata records that were not well formed
    problems: list[str] = field(default_factory=list)


def read_topic_configs(kafka_log_dir: Path) -> KafkaTopicConfigs | None:
    """Topic configs from `__cluster_metadata-0`; None when there is none (a ZooKeeper-era
    broker keeps configs in ZooKeeper)."""
    directory = kafka_log_dir / METADATA_DIR
    if not directory.is_dir():
        return None
    result = KafkaTopicConfigs()
    names: dict[bytes, str] = {}  # topic id -> name, live topics
    configs: dict[str, dict[str, str]] = {}
    snapshots = sorted(
        (int(m.group(1)), int(m.group(2)), name) for name in os.listdir(directory) if (m := _CHECKPOINT_RE.match(name))
    )
    start = 0
    sources: list[tuple[Path, int]] = []
    if snapshots:
        start, _epoch, name = snapshots[-1]
        sources.append((directory / name, 0))
    sources += [(path, start) for path in _log_files(directory)]
    for path, from_offset in sources:
        for header, records in read_file_batches(path, result.problems):
            if header.is_control or header.last_offset < from_offset:
                continue
            for record in records:
                if record.offset < from_offset or record.value is None:
                    continue
                try:
                    _apply_metadata(record.value, names, configs)
                except (_Malformed, UnicodeDecodeError):
                    result.undecodable += 1
    live = set(names.values())
    result.configs = {name: c for name, c in configs.items() if name in live}
    return result


def _apply_metadata(value: bytes, names: dict[bytes, str], configs: dict[str, dict[str, str]]) -> None:
    r = _Reader(value)
    frame = r.uvarint()
    if frame != _FRAME_VERSION:
        raise _Malformed(f"frame version {frame}")
    api_key = r.uvarint()
    r.uvarint()  # version: every version of the three records below reads the same
    if api_key == _TOPIC_RECORD:
        name = r.compact_string()
        topic_id = r.uuid()
        r.tagged_fields()
        r.end()
        if name is None:
            raise _Malformed("topic without a name")
        names[topic_id] = name
    elif api_key == _CONFIG_RECORD:
        resource_type = r.int8()
        resource = r.compact_string()
        name = r.compact_string()
        config_value = r.compact_string()
        r.tagged_fields()
        r.end()
        if resource_type != TOPIC_RESOURCE or resource is None or name is None:
            return
        if config_value is None:
            configs.get(resource, {}).pop(name, None)
        else:
            configs.setdefault(resource, {})[name] = config_value
    elif api_key == _REMOVE_TOPIC_RECORD:
        topic_id = r.uuid()
        r.tagged_fields()
        r.end()
        removed = names.pop(topic_id, None)
        if removed is not None:
            configs.pop(removed, None)


# -- committed offsets ------------------------------------------------------------------------


@dataclass
class KafkaOffsets:
    commits: list[CommittedOffset] = field(default_factory=list)  # the latest per key, tombstones applied
    skipped: int = 0  # group metadata and other records that are not offset commits
    uncommitted: int = 0  # transactional commits aborted or never completed
    undecodable: int = 0
    problems: list[str] = field(default_factory=list)


def read_committed_offsets(partition_dirs: Iterable[Path]) -> KafkaOffsets:
    """The committed offsets in the `__consumer_offsets-<n>` directories given."""
    result = KafkaOffsets()
    latest: dict[tuple[str, str, int], CommittedOffset | None] = {}
    for directory in partition_dirs:
        pending: dict[int, list[tuple[tuple[str, str, int], CommittedOffset | None]]] = {}
        for path in _log_files(directory):
            for header, records in read_file_batches(path, result.problems):
                if header.is_control:
                    for record in records:
                        marker = control_type(record.key)
                        if marker == COMMIT:
                            latest.update(pending.pop(header.producer_id, []))
                        elif marker == ABORT:
                            result.uncommitted += len(pending.pop(header.producer_id, []))
                    continue
                for record in records:
                    try:
                        parsed = _offset_commit(record)
                    except (_Malformed, UnicodeDecodeError):
                        result.undecodable += 1
                        continue
                    if parsed is None:
                        result.skipped += 1
                    elif header.is_transactional:
                        pending.setdefault(header.producer_id, []).append(parsed)
                    else:
                        latest[parsed[0]] = parsed[1]
        result.uncommitted += sum(len(p) for p in pending.values())
    result.commits = [c for c in latest.values() if c is not None]
    return result


def _offset_commit(record: Record) -> tuple[tuple[str, str, int], CommittedOffset | None] | None:
    """(key, commit or None for a tombstone), or None for a record that is not a commit."""
    if record.key is None:
        raise _Malformed("no key")
    r = _Reader(record.key)
    if r.int16() not in _OFFSET_COMMIT_KEYS:
        return None
    group, topic = r.string16(), r.string16()
    partition = r.int32()
    r.end()
    if group is None or topic is None:
        raise _Malformed("null group or topic")
    key = (group, topic, partition)
    if record.value is None:
        return key, None
    r = _Reader(record.value)
    version = r.int16()
    if version < 0:
        raise _Malformed(f"value version {version}")
    offset = r.int64()
    if version >= 3:
        r.int32()  # leader epoch
    metadata = r.compact_string() if version >= 4 else r.string16()
    commit_timestamp = r.int64()
    if version == 1:
        r.int64()  # expire timestamp
    if version >= 4:
        r.tagged_fields()
    r.end()
    return key, CommittedOffset(group, topic, partition, offset, metadata or "", commit_timestamp)
