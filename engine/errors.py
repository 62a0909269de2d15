"""Errors raised by the storage engine.

    EngineError
    ├── NotFoundError
    │   ├── TopicNotFoundError
    │   └── PartitionNotFoundError
    ├── TopicExistsError
    ├── InvalidTopicNameError
    ├── InvalidConfigError
    ├── InvalidRequestError
    │   ├── CorruptBatchError
    │   ├── RecordTooLargeError
    │   └── InvalidPartitionsError
    ├── OffsetOutOfRangeError
    ├── ConflictError
    │   ├── OffsetMismatchError
    │   ├── OutOfOrderSequenceError
    │   └── ProducerFencedError
    ├── LogClosedError
    │   └── TopicDeletedError
    ├── DataDirError
    │   └── DataDirLockedError
    └── StorageError
        ├── StorageFullError
        ├── CorruptIndexError
        └── CorruptSegmentError

Engine code never speaks HTTP; api/errors.py maps these classes to problem+json. Every class
carries the offending values as attributes so that the mapping (and log lines) can show them.
"""

from __future__ import annotations

from pathlib import Path


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class NotFoundError(EngineError):
    """Raised when a named thing does not exist."""


class TopicNotFoundError(NotFoundError):
    """Raised when a topic does not exist."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist")
        self.topic = topic


class PartitionNotFoundError(NotFoundError):
    """Raised when a topic exists but the partition number is outside [0, partitions)."""

    def __init__(self, topic: str, partition: int, partitions: int) -> None:
        super().__init__(
            f"topic {topic!r} has {partitions} partition(s); partition {partition} does not exist"
        )
        self.topic = topic
        self.partition = partition
        self.partitions = partitions


class CompactionFailedError(EngineError):
    """Raised when a compaction pass fails on the server's side (its worker process died, a
    segment it read was corrupt); the pass's files are removed and the log is unchanged."""

    def __init__(self, partition: str, reason: str) -> None:
        super().__init__(f"compaction of {partition} failed: {reason}")
        self.partition = partition
        self.reason = reason


class SnapshotNotFoundError(NotFoundError):
    def __init__(self, snapshot_id: str) -> None:
        super().__init__(f"snapshot {snapshot_id!r} not found")
        self.snapshot_id = snapshot_id


class TopicExistsError(EngineError):
    """Raised when creating a topic whose name is taken."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} already exists")
        self.topic = topic


class InvalidTopicNameError(EngineError):
    """Raised when a topic name breaks Kafka's naming rules."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"invalid topic name {topic!r}: {reason}")
        self.topic = topic
        self.reason = reason


class InvalidConfigError(EngineError):
    """Raised when a topic config name is unknown or its value is out of range."""

    def __init__(self, name: str, value: object, reason: str) -> None:
        super().__init__(f"invalid config {name}={value!r}: {reason}")
        self.name = name
        self.value = value
        self.reason = reason


class InvalidRequestError(EngineError):
    """Raised when a caller's input is malformed in a way the engine detects."""


class CorruptBatchError(InvalidRequestError):
    """Raised when bytes offered as Kafka v2 record batches fail framing, magic or CRC checks."""

    def __init__(self, reason: str, position: int = 0) -> None:
        super().__init__(f"corrupt record batch at byte {position}: {reason}")
        self.reason = reason
        self.position = position


class RecordTooLargeError(InvalidRequestError):
    """Raised when a batch is larger than the topic's max.message.bytes or segment.bytes."""

    def __init__(self, size: int, limit: int, what: str = "max.message.bytes") -> None:
        super().__init__(f"record batch of {size} bytes exceeds {what}={limit}")
        self.size = size
        self.limit = limit
        self.what = what


class KeyRequiredError(InvalidRequestError):
    """Raised when a record without a key is offered to a compacted topic (Kafka refuses them:
    compaction keeps the latest record per key, and a keyless record has none)."""

    def __init__(self, topic: str, position: int | None = None) -> None:
        where = f" (batch at byte {position})" if position is not None else ""
        super().__init__(f"topic {topic!r} is compacted (cleanup.policy=compact): every record needs a key{where}")
        self.topic = topic


class InvalidPartitionsError(InvalidRequestError):
    """Raised when a partition count is not positive, would shrink a topic, or would take the
    server past its partition limit."""

    def __init__(self, requested: int, current: int | None = None, reason: str | None = None) -> None:
        if reason is not None:
            msg = reason
        elif current is None:
            msg = f"partition count must be at least 1, got {requested}"
        else:
            msg = f"partitions only grow: topic has {current}, asked for {requested}"
        super().__init__(msg)
        self.requested = requested
        self.current = current


class OffsetOutOfRangeError(EngineError):
    """Raised when an offset lies outside [log_start_offset, high_watermark]."""

    def __init__(self, offset: int, log_start_offset: int, high_watermark: int) -> None:
        super().__init__(
            f"offset {offset} is outside [{log_start_offset}, {high_watermark}]"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.high_watermark = high_watermark


class ConflictError(EngineError):
    """Raised when an append's precondition does not hold; nothing was written."""


class OffsetMismatchError(ConflictError):
    """Raised when a conditional append's expected offset is not the partition's next offset."""

    def __init__(self, expected: int, high_watermark: int) -> None:
        super().__init__(f"expected the next offset to be {expected}, but it is {high_watermark}")
        self.expected = expected
        self.high_watermark = high_watermark


class OutOfOrderSequenceError(ConflictError):
    """Raised when an idempotent producer's batch does not follow its previous one (Kafka's
    OUT_OF_ORDER_SEQUENCE_NUMBER): a batch was lost in between, or a retry changed."""

    def __init__(self, producer_id: int, epoch: int, first_seq: int, last_seq: int | None) -> None:
        after = "a new epoch must start at sequence 0" if last_seq is None else f"the last sequence written is {last_seq}"
        super().__init__(f"producer {producer_id} (epoch {epoch}): sequence {first_seq} is out of order; {after}")
        self.producer_id = producer_id
        self.epoch = epoch
        self.first_seq = first_seq
        self.last_seq = last_seq


class ProducerFencedError(ConflictError):
    """Raised when a batch carries an older epoch than its producer id has used (a zombie)."""

    def __init__(self, producer_id: int, epoch: int, current_epoch: int) -> None:
        super().__init__(f"producer {producer_id}: epoch {epoch} is older than the current epoch {current_epoch}")
        self.producer_id = producer_id
        self.epoch = epoch
        self.current_epoch = current_epoch


class LogClosedError(EngineError):
    """Raised when a request reaches a partition log that is shutting down or was deleted."""

    def __init__(self, name: str) -> None:
        super().__init__(f"partition log {name} is closed")
        self.name = name


class TopicDeletedError(LogClosedError):
    """Raised when a request reaches (or waits on) a partition log whose topic was deleted."""

    def __init__(self, name: str, topic: str) -> None:
        EngineError.__init__(self, f"topic {topic!r} was deleted")
        self.name = name
        self.topic = topic


class DataDirError(EngineError):
    """Raised when a data directory cannot be opened or is inconsistent."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"data dir {path}: {reason}")
        self.path = Path(path)
        self.reason = reason


class DataDirLockedError(DataDirError):
    """Raised when another process already holds a data directory's lock file."""


class StorageError(EngineError):
    """Raised when the file system fails or files are damaged beyond what recovery repairs."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


class StorageFullError(StorageError):
    """Raised when the disk is full (ENOSPC) during an append: the append was undone and the
    partition keeps serving reads; appends succeed again once space returns."""


class CorruptIndexError(StorageError):
    """Raised when an index file fails its sanity check (recovery rebuilds it)."""


class CorruptSegmentError(StorageError):
    """Raised when a closed segment holds an invalid batch (dump-log --verify reports it)."""
