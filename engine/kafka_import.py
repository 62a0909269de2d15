"""Adopting partition directories written by Apache Kafka (2.x and 3.x brokers).

A Kafka log dir holds `<topic>-<partition>/` directories of the same segment format eventlog
uses, plus files eventlog does not need (leader-epoch-checkpoint, *.snapshot producer state,
*.txnindex, partition.metadata). Import:

1. Find the partition directories (skipping *-delete, *-future, __cluster_metadata and, unless
   named, other internal topics) and read Kafka's log-start-offset-checkpoint.
2. Per partition, bring the .log files into "<target>.importing": hard links with --link,
   copies otherwise. A linked file with a torn tail is copied instead, so that the recovery
   scan's truncation never touches Kafka's own file. Index files are not taken: the scan
   rebuilds them (whether Kafka left them trimmed or preallocated).
3. The recovery scan validates every batch (framing, CRC, offsets) and truncates at the first
   bad one; then the directory is renamed into place.
4. The topic is registered (topic_created event) with its partition count and default configs.

Blocking parts run in threads; LogManager.adopt_topic drives the steps.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from . import filenames
from .checkpoints import LOG_START_OFFSET, read_checkpoint
from .config import LogConfig
from .errors import DataDirError
from .fileutil import fsync_dir
from .recovery import LoadedLog, load_log
from .scan import BatchScanner

SKIP_TOPICS = frozenset({"__cluster_metadata"})
IMPORTING_SUFFIX = ".importing"


@dataclass(frozen=True)
class KafkaTopic:
    name: str
    partitions: dict[int, Path]  # partition -> directory

    @property
    def partition_count(self) -> int:
        return max(self.partitions) + 1


def discover(kafka_log_dir: Path, topics: list[str] | None = None) -> list[KafkaTopic]:
    """The topics in a Kafka log dir; `topics` limits (and may name internal ones)."""
    found: dict[str, dict[int, Path]] = {}
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
        elif topic.startswith("__") or topic in SKIP_TOPICS:
            continue
        if topic in SKIP_TOPICS:
            continue
        found.setdefault(topic, {})[partition] = Path(entry.path)
    if topics is not None:
        missing = sorted(set(topics) - set(found))
        if missing:
            raise DataDirError(kafka_log_dir, f"no partition directories for topic(s) {', '.join(missing)}")
    return [KafkaTopic(name, parts) for name, parts in sorted(found.items())]


def kafka_log_start_offsets(kafka_log_dir: Path) -> dict[tuple[str, int], int]:
    return read_checkpoint(kafka_log_dir / LOG_START_OFFSET)


def stage_partition(source: Path, target: Path, *, link: bool) -> Path:
    """Step 2: the .log files of `source` in "<target>.importing"; returns that directory."""
    staging = target.with_name(target.name + IMPORTING_SUFFIX)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for name in sorted(os.listdir(source)):
        parsed = filenames.parse_segment_file(name)
        if parsed is None or parsed[1] != filenames.LOG_SUFFIX or parsed[2] != "":
            continue
        src = source / name
        dst = staging / name
        if link and not _has_torn_tail(src):
            os.link(src, dst)
        else:
            shutil.copyfile(src, dst)
            with open(dst, "rb+") as f:
                os.fsync(f.fileno())
    fsync_dir(staging)
    return staging


def recover_staged(staging: Path, config: LogConfig, log_start_offset: int, now_ms: int) -> LoadedLog:
    """Step 3: full recovery scan of the staged directory (indexes rebuilt)."""
    loaded = load_log(
        staging, config, clean_shutdown=False, recovery_point=0, log_start_offset=log_start_offset, now_ms=now_ms
    )
    for segment in loaded.segments:
        segment.close_for_append()
        segment.close()
    return loaded


def _has_torn_tail(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        scanner = BatchScanner(fd, with_data=True, check_crc=True)
        for _ in scanner:
            pass
        return scanner.error is not None
    finally:
        os.close(fd)
