"""Errors raised by the storage engine.

    EngineError
    ├── NotFoundError
    │   ├── TopicNotFoundError
    │   ├── PartitionNotFoundError
    │   ├── SnapshotNotFoundError
    │   └── QueueNotFoundError
    ├── SnapshotLimitError
    ├── TopicExistsError
    ├── InvalidTopicNameError
    ├── InvalidConfigError
    ├── InvalidRequestError
    │   ├── CorruptBatchError
    │   │   └── InflateLimitError
    │   ├── TransactionsUnsupportedError
    │   ├── RecordTooLargeError
    │   ├── InflatedTooLargeError
    │   ├── InvalidPartitionsError
    │   ├── InvalidJsonError
    │   └── InvalidFieldError
    │       └── ConditionConflictError
    ├── OffsetOutOfRangeError
    ├── ConflictError
    │   ├── QueueExistsError
    │   ├── OffsetMismatchError
    │   ├── OutOfOrderSequenceError
    │   ├── ProducerFencedError
    │   └── IdempotencyKeyReusedError
    ├── LogClosedError
    │   └── TopicDeletedError
    ├── OpenFilesLimitError
    ├── DataDirError
    │   └── DataDirLockedError
    └── StorageError
        ├── TransientStorageError
        │   ├── StorageFullError
        │   └── TooManyOpenFilesError
        ├── CorruptIndexError
        ├── CorruptSegmentError
        ├── CorruptDataError
        └── PartitionOfflineError

Engine code never speaks HTTP; api/errors.py maps these classes to problem+json. Every class
carries the offending values as attributes so that the mapping (and log lines) can show them.
"""

from __future__ import annotations

from pathlib import Path


def _rebuild(cls: type, args: tuple, state: dict) -> "EngineError":
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class EngineError(Exception):
    """Base of every error the engine raises on purpose.

    Picklable whatever a subclass's __init__ takes (the default pickling calls the class with
    `args`, the formatted message): compaction passes run in a worker process, and the error
    of a failed pass (a full disk while writing .cleaned segments) crosses back to the server.
    """

    def __reduce__(self):  # noqa: ANN204
        return _rebuild, (type(self), self.args, dict(self.__dict__))


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


class QueueNotFoundError(NotFoundError):
    """Raised when a topic has no queue of that name (engine/queues.py)."""

    def __init__(self, topic: str, queue: str) -> None:
        super().__init__(f"topic {topic!r} has no queue {queue!r}")
        self.topic = topic
        self.queue = queue


class SnapshotNotFoundError(NotFoundError):
    def __init__(self, snapshot_id: str) -> None:
        super().__init__(f"snapshot {snapshot_id!r} not found")
        self.snapshot_id = snapshot_id


class SnapshotLimitError(EngineError):
    """Raised when a snapshot would pass a cap on snapshots (`limit`: "count" or "bytes");
    nothing was written."""

    def __init__(
        self, limit: str, count: int, held_bytes: int, needed_bytes: int, max_count: int | None, max_bytes: int | None
    ) -> None:
        if limit == "count":
            msg = f"{count} snapshots exist, at most {max_count} are allowed: delete one first"
        else:
            msg = (
                f"snapshots hold {held_bytes} bytes of their own and this one would add about {needed_bytes}, "
                f"over the limit of {max_bytes} bytes: delete old snapshots first"
            )
        super().__init__(msg)
        self.limit = limit
        self.count = count
        self.held_bytes = held_bytes
        self.needed_bytes = needed_bytes
        self.max_count = max_count
        self.max_bytes = max_bytes


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


class InflateLimitError(CorruptBatchError):
    """Raised when a compressed records block inflates past a limit: compression.MAX_RECORDS_BYTES
    for one batch, or what is left of a request's allowance (see InflatedTooLargeError)."""

    def __init__(self, codec_name: str, limit: int, position: int = 0) -> None:
        super().__init__(f"{codec_name} records inflate past {limit} bytes", position)
        self.limit = limit


class TransactionsUnsupportedError(InvalidRequestError):
    """Raised when a produced batch is transactional (attribute bit 4): eventlog has no
    transaction coordinator, so no marker would ever commit or abort it, and readers would
    have to hold it back (read_committed) for ever."""

    def __init__(self, producer_id: int, position: int = 0) -> None:
        super().__init__(
            f"record batch at byte {position} is transactional (producerId {producer_id}): "
            "transactions are not supported; produce without transactional.id"
        )
        self.producer_id = producer_id
        self.position = position


class RecordTooLargeError(InvalidRequestError):
    """Raised when a batch is larger than the topic's max.message.bytes or segment.bytes."""

    def __init__(self, size: int, limit: int, what: str = "max.message.bytes") -> None:
        super().__init__(f"record batch of {size} bytes exceeds {what}={limit}")
        self.size = size
        self.limit = limit
        self.what = what


class InflatedTooLargeError(InvalidRequestError):
    """Raised when the compressed batches of one produce request inflate past the server's
    per-request limit (their records are walked to validate them, so inflating costs memory
    and CPU); nothing was written."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the compressed records of this request inflate past {limit} bytes "
            "(EVENTLOG_MAX_INFLATED_BYTES_PER_REQUEST); send fewer or smaller batches per request"
        )
        self.limit = limit


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


class InvalidJsonError(InvalidRequestError):
    """Raised when a produce request's body is not JSON (`reason`: the parser's message)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"request body is not JSON: {reason}")
        self.reason = reason


class InvalidFieldError(InvalidRequestError):
    """Raised when a produce request breaks its schema: a field missing, unknown, of the wrong
    type or out of range, or fields that disagree (the message names the field first)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConditionConflictError(InvalidFieldError):
    """Raised when a produce's condition (an ExpectedOffset, engine/conditions.py) and its JSON
    body's expected_offset name different offsets; nothing was written."""

    def __init__(self, condition: int, in_body: int) -> None:
        super().__init__(f"expected_offset: {in_body}, but the request's condition is {condition}")
        self.condition = condition
        self.in_body = in_body


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


class QueueExistsError(ConflictError):
    """Raised when a queue is created again with settings other than its own."""

    def __init__(self, topic: str, queue: str) -> None:
        super().__init__(f"queue {queue!r} of topic {topic!r} exists with other settings")
        self.topic = topic
        self.queue = queue


class OffsetMismatchError(ConflictError):
    """Raised when a conditional append's expected offset is not the partition's next offset."""

    def __init__(self, expected: int, high_watermark: int) -> None:
        super().__init__(f"expected the next offset to be {expected}, but it is {high_watermark}")
        self.expected = expected
        self.high_watermark = high_watermark


class KeyVersionMismatchError(ConflictError):
    """Raised when a per-key conditional append finds the key's latest record elsewhere:
    `expected` and `current` are offsets, -1 meaning the key has no records."""

    def __init__(self, key: bytes, expected: int, current: int) -> None:
        shown = key.decode("utf-8", "backslashreplace")
        if len(shown) > 200:
            shown = shown[:200] + "..."
        want = {-1: "no records", -2: "some records"}.get(expected, f"its latest record at offset {expected}")
        have = "it has none" if current < 0 else f"its latest is at offset {current}"
        super().__init__(f"key {shown!r}: expected {want}, but {have}")
        self.key = key
        self.expected = expected
        self.current = current


class KeyIndexDisabledError(ConflictError):
    """Raised by per-key reads and conditional appends on a topic whose key index is off."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} keeps no key index (eventlog.key.index=false): per-key reads and "
                         "conditional appends need it; set it to true")
        self.topic = topic


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


class IdempotencyKeyReusedError(ConflictError):
    """Raised when a request reuses an Idempotency-Key (its producer id) for a different request:
    its batches do not match the sequences the first request's left behind."""

    def __init__(self, producer_id: int) -> None:
        super().__init__(
            "this Idempotency-Key was used for a different request (another number of records or partitions)"
        )
        self.producer_id = producer_id


class LogClosedError(EngineError):
    """Raised when a request reaches a partition log that is shutting down or was deleted."""

    def __init__(self, name: str) -> None:
        super().__init__(f"partition log {name} is closed")
        self.name = name


class ShardUnavailableError(EngineError):
    """Raised when the shard that owns a partition (or the family's metadata) cannot be
    reached: it is restarting or shutting down. The request may or may not have been applied
    by the owner (a forwarded append in flight); retrying with an Idempotency-Key is safe."""

    def __init__(self, shard: int, why: str) -> None:
        super().__init__(f"shard {shard} is unavailable: {why}")
        self.shard = shard


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


class TransientStorageError(StorageError):
    """Raised when the file system refuses a call for a reason that passes by itself (a full
    disk, an exhausted descriptor table): what the call was part of is undone, and the
    partition, topic or snapshot stays as it was and usable; a retry may succeed."""


class StorageFullError(TransientStorageError):
    """Raised when the disk is full (ENOSPC, EDQUOT): an append, topic change or snapshot was
    undone; reads go on, and writes succeed again once space returns."""


class TooManyOpenFilesError(TransientStorageError):
    """Raised when the process or the system is out of file descriptors (EMFILE, ENFILE), or
    the kernel of memory for a file call (ENOMEM, EAGAIN, ENOBUFS: fileutil.TRANSIENT_ERRNOS):
    the request was undone (a read: refused); it may succeed once other descriptors are closed."""


class OpenFilesLimitError(EngineError):
    """Raised when a topic change would give a server process more partitions than its
    open-files limit serves: any number once the limit less a reserve for connections holds one
    append's descriptors, none below that (descriptors.max_partitions_for; idle partitions hold
    none, issue 28). `partitions`: what the process would own; `needed`: the lowest limit that
    keeps them all open at once."""

    def __init__(self, partitions: int, max_partitions: int, limit: int, needed: int | None = None) -> None:
        raise_to = f" to at least {needed}" if needed is not None else ""
        super().__init__(
            f"{partitions} partitions on one server process would pass what its open-files limit of {limit} "
            f"serves ({max_partitions} partitions: the reserve for connections leaves no descriptor for an "
            "append; idle partitions hold none, unflushed or not); "
            f"raise the limit{raise_to} (ulimit -n, LimitNOFILE) and restart"
        )
        self.partitions = partitions
        self.max_partitions = max_partitions
        self.limit = limit
        self.needed = needed


class CorruptIndexError(StorageError):
    """Raised when an index file fails its sanity check (recovery rebuilds it)."""


class CorruptSegmentError(StorageError):
    """Raised when a closed segment holds an invalid batch (dump-log --verify reports it)."""


class CorruptDataError(StorageError):
    """Raised when a stored batch fails its CRC-32C as a read is about to decode it: the bytes
    changed on disk after they were written (recovery drops such batches; a read meets those
    it did not scan). `first_offset`/`last_offset` are what the batch's header says."""

    def __init__(self, path: Path | str, position: int, first_offset: int, last_offset: int, reason: str) -> None:
        super().__init__(path, f"the batch of offsets {first_offset}-{last_offset} at byte {position} is damaged: {reason}")
        self.position = position
        self.first_offset = first_offset
        self.last_offset = last_offset


class PartitionOfflineError(StorageError):
    """Raised when a request names a partition that could not be loaded at start-up (a file it
    may not write, an I/O error, damage recovery cannot handle): it serves nothing until the
    cause is fixed and the server restarted."""

    def __init__(self, topic: str, partition: int, path: Path | str, reason: str) -> None:
        super().__init__(path, reason)
        self.args = (f"partition {topic}-{partition} is offline: {reason}",)
        self.topic = topic
        self.partition = partition
