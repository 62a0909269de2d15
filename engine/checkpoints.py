"""Offset checkpoint files in Kafka's text format.

    version\\n                 always 0
    count\\n                   number of entries
    topic SP partition SP offset\\n   x count (any order)

An empty set is written as "0\\n0\\n"; a 0-byte file (seen in real Kafka dirs) reads as empty.
Used for recovery-point-offset-checkpoint, log-start-offset-checkpoint and
cleaner-offset-checkpoint. The per-partition leader-epoch-checkpoint has the same frame with
entries `epoch SP start_offset\\n`; eventlog writes leader epoch 0 into every batch, so its
one entry is `0 <log start offset>` (written when a partition is created or first loaded).
Writes go to "<name>.tmp", are fsynced, renamed over the old file, and the directory is
fsynced, so after a crash the file is either the old or the new one.
Blocking; call from a worker thread.
"""

from __future__ import annotations

from pathlib import Path

from .errors import StorageError
from .fileutil import io_errors, replace_file, storage_error

RECOVERY_POINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET = "log-start-offset-checkpoint"
CLEANER_OFFSET = "cleaner-offset-checkpoint"
CHECKPOINT_NAMES = (RECOVERY_POINT, LOG_START_OFFSET, CLEANER_OFFSET)
LEADER_EPOCH = "leader-epoch-checkpoint"  # in each partition directory
LEADER_EPOCH_OF_EVERY_BATCH = 0

_VERSION = 0

TopicPartition = tuple[str, int]


def read_checkpoint(path: Path) -> dict[TopicPartition, int]:
    """Entries of a checkpoint file; {} when it is missing or 0 bytes long. Raises StorageError
    for anything else that is not the format above (not UTF-8, a bad number, a wrong count)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise storage_error(exc, path, "cannot read checkpoint") from exc
    if not data:
        return {}
    try:
        lines = data.decode("utf-8").split("\n")
        version = int(lines[0])
        if version != _VERSION:
            raise StorageError(path, f"unsupported checkpoint version {version}")
        count = int(lines[1])
        entries: dict[TopicPartition, int] = {}
        for line in lines[2 : 2 + count]:
            topic, partition, offset = line.rsplit(" ", 2)
            entries[(topic, int(partition))] = int(offset)
    except (IndexError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise StorageError(path, f"malformed checkpoint: {exc}") from exc
    if len(entries) != count:
        raise StorageError(path, f"checkpoint says {count} entries, holds {len(entries)}")
    return entries


def format_checkpoint(entries: dict[TopicPartition, int]) -> str:
    lines = [str(_VERSION), str(len(entries))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(entries.items())]
    return "\n".join(lines) + "\n"


def write_checkpoint(path: Path, entries: dict[TopicPartition, int]) -> None:
    """Atomically replace `path` with `entries` (temp file, fsync, rename, fsync dir)."""
    with io_errors(path, "cannot write checkpoint"):
        replace_file(path, format_checkpoint(entries).encode("utf-8"))


def write_leader_epoch_checkpoint(directory: Path, start_offset: int) -> None:
    """Atomically write `directory`'s leader-epoch-checkpoint: epoch 0 from `start_offset`."""
    path = directory / LEADER_EPOCH
    lines = [str(_VERSION), "1", f"{LEADER_EPOCH_OF_EVERY_BATCH} {start_offset}"]
    with io_errors(path, "cannot write checkpoint"):
        replace_file(path, ("\n".join(lines) + "\n").encode("ascii"))
