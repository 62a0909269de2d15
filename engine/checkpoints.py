"""Offset checkpoint files in Kafka's text format.

    version\\n                 always 0
    count\\n                   number of entries
    topic SP partition SP offset\\n   x count (any order)

An empty set is written as "0\\n0\\n"; a 0-byte file (seen in real Kafka dirs) reads as empty.
Used for recovery-point-offset-checkpoint, log-start-offset-checkpoint and
cleaner-offset-checkpoint. The per-partition leader-epoch-checkpoint has the same frame with
entries `epoch SP start_offset\\n`, ascending: the leader epochs the partition's batches were
written in, each from its first offset (Kafka's LeaderEpochFileCache). eventlog is the one
leader of every partition it writes and never starts an epoch: a partition it creates has the
one entry `0 <log start offset>`; one imported from Kafka keeps Kafka's history (trimmed as
Kafka trims it when it loads a log: truncate_leader_epochs), and eventlog writes its batches
in the latest epoch there (PartitionLog.leader_epoch), so epochs never go backwards in the log.
Writes go to "<name>.tmp", are fsynced, renamed over the old file, and the directory is
fsynced, so after a crash the file is either the old or the new one.
Blocking; call from a worker thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .errors import StorageError
from .fileutil import io_errors, replace_file, storage_error

RECOVERY_POINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET = "log-start-offset-checkpoint"
CLEANER_OFFSET = "cleaner-offset-checkpoint"
CHECKPOINT_NAMES = (RECOVERY_POINT, LOG_START_OFFSET, CLEANER_OFFSET)
LEADER_EPOCH = "leader-epoch-checkpoint"  # in each partition directory
EVENTLOG_LEADER_EPOCH = 0  # the epoch of a partition eventlog creates

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


# -- leader-epoch-checkpoint -------------------------------------------------------------------

LeaderEpochs = list[tuple[int, int]]  # (epoch, start offset), ascending in both


def read_leader_epoch_checkpoint(directory: Path) -> LeaderEpochs | None:
    """`directory`'s leader-epoch-checkpoint entries; None when there is no file. A 0-byte file
    reads as no entries. Raises StorageError for a file that is not the format (Kafka's broker
    refuses such a file: "Malformed line in checkpoint file"), or whose entries do not ascend,
    and OSError as it comes (the caller's I/O error handling decides)."""
    path = directory / LEADER_EPOCH
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if not data:
        return []
    try:
        lines = data.decode("ascii").split("\n")
        if int(lines[0]) != _VERSION:
            raise StorageError(path, f"unsupported checkpoint version {lines[0]}")
        count = int(lines[1])
        entries = []
        for line in lines[2 : 2 + count]:
            epoch, start = line.split(" ")
            entries.append((int(epoch), int(start)))
    except (IndexError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise StorageError(path, f"malformed checkpoint: {exc}") from exc
    if len(entries) != count:
        raise StorageError(path, f"checkpoint says {count} entries, holds {len(entries)}")
    if any(e < 0 or o < 0 for e, o in entries) or any(
        b[0] <= a[0] or b[1] < a[1] for a, b in zip(entries, entries[1:], strict=False)
    ):
        raise StorageError(path, f"leader epochs do not ascend: {entries}")
    return entries


def write_leader_epoch_checkpoint(directory: Path, entries: LeaderEpochs) -> None:
    """Atomically write `directory`'s leader-epoch-checkpoint with `entries`."""
    path = directory / LEADER_EPOCH
    lines = [str(_VERSION), str(len(entries))] + [f"{epoch} {start}" for epoch, start in entries]
    with io_errors(path, "cannot write checkpoint"):
        replace_file(path, ("\n".join(lines) + "\n").encode("ascii"))


def truncate_leader_epochs(
    entries: LeaderEpochs, log_start_offset: int, log_end_offset: int
) -> LeaderEpochs:
    """What Kafka's log loader keeps of a leader-epoch history (UnifiedLog/LogLoader:
    truncateFromEnd(log end), then truncateFromStart(log start)): entries starting at or past
    the log end go (an epoch with no record here, or records a recovery truncated); the
    entries at or below the log start collapse into the latest of them, moved up to start
    there."""
    kept = [(e, o) for e, o in entries if o < log_end_offset]
    below = [(e, o) for e, o in kept if o <= log_start_offset]
    if below:
        kept = [(below[-1][0], log_start_offset)] + kept[len(below) :]
    return kept


def leader_epochs_from_batches(batches: Iterable[tuple[int, int]]) -> LeaderEpochs:
    """A history from (partitionLeaderEpoch, baseOffset) of a log's batches in offset order, as
    Kafka's LogSegment.recover assigns it: an epoch counts from the first batch written in it,
    and only when it is above the latest so far (batches of no epoch, -1, count for none)."""
    entries: LeaderEpochs = []
    for epoch, base_offset in batches:
        if epoch >= 0 and (not entries or epoch > entries[-1][0]):
            entries.append((epoch, base_offset))
    return entries
