"""Adopting partition directories written by Apache Kafka (2.x and 3.x brokers).

A Kafka log dir holds `<topic>-<partition>/` directories of the same segment format eventlog
uses, plus files eventlog does not need (*.txnindex, partition.metadata: a new topic id is
written) or takes (leader-epoch-checkpoint, producer snapshots), and Kafka's internal topics.
Import:

1. Find the partition directories (skipping *-delete, *-future and internal topics unless
   named) and read Kafka's log-start-offset-checkpoint. Of the internal topics only
   `__consumer_offsets` can be named: its committed offsets are merged into eventlog's group
   store (kafka_state.py reads them). `__cluster_metadata` (KRaft's metadata log) and the
   transaction and share-group state topics are refused: they are Kafka's bookkeeping, not
   data; the topic configs in `__cluster_metadata` are carried to each imported topic
   (kafka_state.py, topic_overrides()).
2. Per partition, bring the .log files into "<target>.importing": with --link, hard links of
   the closed segments and a copy of the active one (the highest base offset: eventlog appends
   to it, and Kafka's own file must never change); copies of everything otherwise. A linked
   file with a torn tail is copied instead, so that the recovery scan's truncation never
   touches Kafka's own file. Kafka's producer snapshots (`*.snapshot`, Kafka's layout, which
   eventlog reads) are copied. Index files are not taken: the scan rebuilds them (whether
   Kafka left them trimmed or preallocated).
3. The recovery scan validates every batch (framing, CRC, offsets) and truncates at the first
   bad one. Kafka's leader-epoch-checkpoint is kept (leader_epochs: trimmed as Kafka's own
   loader trims it, to the offsets the partition now holds), so the history of leader epochs
   comes along and eventlog goes on writing in the latest of them; then the directory is
   renamed into place.
4. The topic is registered (topic_created event) with its partition count and the overrides
   topic_overrides() gives: the source's configs where it has them, retention off otherwise.

Blocking parts run in threads; LogManager.adopt_topic drives the steps.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from . import filenames
from .checkpoints import (
    EVENTLOG_LEADER_EPOCH,
    LOG_START_OFFSET,
    LeaderEpochs,
    leader_epochs_from_batches,
    read_checkpoint,
    read_leader_epoch_checkpoint,
    truncate_leader_epochs,
)
from .config import CONFIG_DEFS, LogConfig, normalise_overrides
from .errors import DataDirError, InvalidConfigError, StorageError
from .fileutil import fsync_dir
from .metadata import CONSUMER_OFFSETS_TOPIC, METADATA_TOPIC
from .producer_state import SNAPSHOT_SUFFIX, parse_snapshot_name
from .recovery import LoadedLog, load_log
from .scan import BatchScanner, scan_headers

IMPORTING_SUFFIX = ".importing"
# Kafka's internal topics that are bookkeeping, never data; why each is refused when named
REFUSED_TOPICS = {
    "__cluster_metadata": "Kafka's KRaft metadata log, not a topic; the topic configs it holds are "
    "carried to each imported topic",
    "__transaction_state": "the state of Kafka's transaction coordinator; eventlog has no transactions",
    "__share_group_state": "the state of Kafka's share groups; eventlog has none",
    METADATA_TOPIC: "the name of eventlog's own metadata log",
}
RETENTION_CONFIGS = ("retention.ms", "retention.bytes")

logger = logging.getLogger("eventlog.engine")


@dataclass(frozen=True)
class KafkaTopic:
    name: str
    partitions: dict[int, Path]  # partition -> directory

    @property
    def partition_count(self) -> int:
        return max(self.partitions) + 1


@dataclass(frozen=True)
class KafkaLogDir:
    """What discover() found to import."""

    topics: list[KafkaTopic]
    consumer_offsets: list[Path]  # __consumer_offsets partition directories, when named
    internal_skipped: list[str]  # internal topics present and not named


def discover(kafka_log_dir: Path, topics: list[str] | None = None) -> KafkaLogDir:
    """The topics in a Kafka log dir; `topics` limits (and may name `__consumer_offsets` or
    user topics whose names start with "__"). Raises DataDirError for a named topic that is
    missing or that REFUSED_TOPICS names."""
    for name in topics or ():
        if name in REFUSED_TOPICS:
            raise DataDirError(kafka_log_dir, f"{name} cannot be imported: it is {REFUSED_TOPICS[name]}")
    found: dict[str, dict[int, Path]] = {}
    skipped: set[str] = set()
    for entry in sorted(os.scandir(kafka_log_dir), key=lambda e: e.name):
        if not entry.is_dir():
            continue
        parsed = filenames.parse_partition_dir(entry.name)
        if parsed is None:
            continue  # *-delete, *-future, *.importing, ...
        topic, partition = parsed
        if topics is not None:
            if topic not in topics:
                continue
        elif topic.startswith("__"):
            if topic not in REFUSED_TOPICS:
                skipped.add(topic)
            continue
        found.setdefault(topic, {})[partition] = Path(entry.path)
    if topics is not None:
        missing = sorted(set(topics) - set(found))
        if missing:
            raise DataDirError(kafka_log_dir, f"no partition directories for topic(s) {', '.join(missing)}")
    offsets = found.pop(CONSUMER_OFFSETS_TOPIC, {})
    return KafkaLogDir(
        [KafkaTopic(name, parts) for name, parts in sorted(found.items())],
        [offsets[p] for p in sorted(offsets)],
        sorted(skipped),
    )


@dataclass(frozen=True)
class ImportedConfigs:
    """A topic's overrides on import, and where each came from."""

    overrides: dict[str, str]
    carried: dict[str, str]  # from the source's configs
    retention_off: dict[str, str]  # retention.ms / retention.bytes the source did not set
    not_carried: dict[str, str]  # source config -> why it was left out


def topic_overrides(source: dict[str, str] | None) -> ImportedConfigs:
    """The overrides an imported topic gets from its configs in the Kafka dir (None or {}:
    none known). Retention limits the source does not set are turned off (-1): the broker's
    defaults are not in the log dir, and eventlog's defaults would delete old imported data."""
    carried: dict[str, str] = {}
    not_carried: dict[str, str] = {}
    for name, value in sorted((source or {}).items()):
        if name not in CONFIG_DEFS:
            not_carried[name] = f"{value} (no such eventlog config)"
            continue
        try:
            carried.update(normalise_overrides({name: value}))
        except InvalidConfigError as exc:
            not_carried[name] = f"{value} ({exc.reason})"
    retention_off = {name: "-1" for name in RETENTION_CONFIGS if name not in carried}
    return ImportedConfigs({**retention_off, **carried}, carried, retention_off, not_carried)


def kafka_log_start_offsets(kafka_log_dir: Path) -> dict[tuple[str, int], int]:
    return read_checkpoint(kafka_log_dir / LOG_START_OFFSET)


def stage_partition(source: Path, target: Path, *, link: bool) -> Path:
    """Step 2: the .log and .snapshot files of `source` in "<target>.importing"; returns
    that directory."""
    staging = target.with_name(target.name + IMPORTING_SUFFIX)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    logs = []
    for name in sorted(os.listdir(source)):
        parsed = filenames.parse_segment_file(name)
        if parsed is not None and parsed[1] == filenames.LOG_SUFFIX and parsed[2] == "":
            logs.append((parsed[0], name))
        elif parse_snapshot_name(name, SNAPSHOT_SUFFIX) is not None:
            _copy(source / name, staging / name)
    active = max(logs)[1] if logs else None
    for _base, name in logs:
        src = source / name
        if link and name != active and not _has_torn_tail(src):
            os.link(src, staging / name)
        else:
            _copy(src, staging / name)
    fsync_dir(staging)
    return staging


def _copy(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    with open(dst, "rb+") as f:
        os.fsync(f.fileno())


def recover_staged(staging: Path, config: LogConfig, log_start_offset: int, now_ms: int) -> LoadedLog:
    """Step 3: full recovery scan of the staged directory (indexes rebuilt)."""
    loaded = load_log(
        staging, config, clean_shutdown=False, recovery_point=0, log_start_offset=log_start_offset, now_ms=now_ms
    )
    for segment in loaded.segments:
        segment.close_for_append()
        segment.close()
    return loaded


def leader_epochs(
    source: Path, staging: Path, log_start_offset: int, log_end_offset: int
) -> LeaderEpochs:
    """Step 3: the leader-epoch history of the imported partition: Kafka's own
    (`source`'s leader-epoch-checkpoint), trimmed as Kafka's loader trims it at its next start
    (checkpoints.truncate_leader_epochs: no entry at or past the log end, the first one moved
    up to the log start). Where Kafka's file is missing, does not parse or keeps nothing, the
    history the staged batches carry (as Kafka's recovery derives it); with no batches either,
    eventlog's own `0 <log start>`, the one entry of a partition eventlog creates."""
    try:
        found = read_leader_epoch_checkpoint(source)
    except StorageError as exc:
        logger.warning("%s: %s; its leader epochs are taken from its batches", source.name, exc)
        found = None
    entries = truncate_leader_epochs(found or [], log_start_offset, log_end_offset)
    if not entries:
        history = leader_epochs_from_batches(_batch_epochs(staging))
        entries = truncate_leader_epochs(history, log_start_offset, log_end_offset)
    return entries or [(EVENTLOG_LEADER_EPOCH, log_start_offset)]


def _batch_epochs(directory: Path) -> list[tuple[int, int]]:
    """(partitionLeaderEpoch, baseOffset) of every batch of the (recovered) segments."""
    pairs = []
    for name in sorted(os.listdir(directory)):
        parsed = filenames.parse_segment_file(name)
        if parsed is None or parsed[1] != filenames.LOG_SUFFIX or parsed[2] != "":
            continue
        fd = os.open(directory / name, os.O_RDONLY)
        try:
            for header in scan_headers(fd, 0, os.fstat(fd).st_size):
                pairs.append((header.partition_leader_epoch, header.base_offset))
        finally:
            os.close(fd)
    return pairs


def _has_torn_tail(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        scanner = BatchScanner(fd, with_data=True, check_crc=True)
        for _ in scanner:
            pass
        return scanner.error is not None
    finally:
        os.close(fd)
