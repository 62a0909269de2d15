"""Request and response models: the OpenAPI document's types.

Hot request bodies (produce) are parsed with orjson and checked by hand in records.py; the
models here still describe them, so generated SDKs get real types.

Request models are strict where the document says integer: a JSON string ("3"), a float (3.0)
or a boolean (true for 1) is refused with 422 validation_error, never coerced (StrictInt; the
JSON schema is the same). records.py's hand-parsed produce bodies are held to the same rule.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)


class Problem(BaseModel):
    """RFC 9457 problem details; `code` is stable and meant for programs."""

    type: str = Field(examples=["urn:eventlog:problem:topic_not_found"])
    title: str
    status: int
    detail: str
    code: str = Field(examples=["topic_not_found"])
    # the members some codes add (docs/API.md, "Errors"); absent otherwise
    expected_offset: int | None = Field(None, description="offset_mismatch, key_version_mismatch: the condition's offset")
    high_watermark: int | None = Field(None, description="offset_mismatch, offset_out_of_range: the partition's")
    current_offset: int | None = Field(None, description="key_version_mismatch: the key's latest record, -1 for none")
    log_start_offset: int | None = Field(None, description="offset_out_of_range")
    first_offset: int | None = Field(None, description="corrupt_data: the damaged batch's first offset")
    last_offset: int | None = Field(None, description="corrupt_data: the damaged batch's last offset")
    producer_id: int | None = Field(None, description="out_of_order_sequence, producer_fenced")
    producer_epoch: int | None = Field(None, description="out_of_order_sequence, producer_fenced")
    sequence: int | None = Field(None, description="out_of_order_sequence: the batch's first sequence")
    last_sequence: int | None = Field(None, description="out_of_order_sequence: the last one written")
    current_epoch: int | None = Field(None, description="producer_fenced")
    topic: str | None = Field(None, description="partition_offline")
    partition: int | None = Field(None, description="partition_offline")
    reason: str | None = Field(None, description="partition_offline")
    members: int | None = Field(None, description="group_not_empty: the group's live members")
    group_state: str | None = Field(
        None, description="group_not_empty: the group's state (Stable, PreparingRebalance, ...)"
    )
    limit: Any = Field(None, description="request_too_large: the byte limit; snapshot_limit: count or bytes")
    limit_ms: int | None = Field(None, description="request_timeout")
    kind: str | None = Field(None, description="quota_exceeded: produce or fetch")
    quota_bytes_per_sec: int | None = Field(None, description="quota_exceeded")
    throttle_time_ms: int | None = Field(None, description="quota_exceeded")
    errors: list[dict[str, Any]] | None = Field(None, description="validation_error: each invalid parameter or field")
    model_config = ConfigDict(extra="allow")


class Status(BaseModel):
    status: str = Field(examples=["ok"])


class Format(str, Enum):
    string = "string"
    base64 = "base64"
    json = "json"


ConfigValue = StrictStr | StrictInt | StrictFloat
"""A topic config's value: Kafka's string, or a JSON number (never a boolean)."""


class TopicCreate(BaseModel):
    name: str = Field(min_length=1, max_length=249, examples=["orders"])
    partitions: StrictInt | None = Field(None, ge=1, le=10_000, description="default: the server's num.partitions (1)")
    configs: dict[str, ConfigValue] = Field(default_factory=dict, examples=[{"cleanup.policy": "compact"}])
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [  # docs/API.md's
        {"name": "orders", "partitions": 3, "configs": {"retention.ms": 86400000}},
    ]})


class TopicSummary(BaseModel):
    name: str
    partitions: int
    internal: bool = False


class TopicList(BaseModel):
    topics: list[TopicSummary]


class Topic(BaseModel):
    name: str
    partitions: int
    configs: dict[str, str] = Field(description="effective configs, Kafka names and string values")
    overrides: dict[str, str] = Field(default_factory=dict, description="the configs set on this topic")
    topic_id: str
    internal: bool = False


class PartitionInfo(BaseModel):
    """Offsets and sizes of a partition; an offline partition has only `offline` and `error`."""

    partition: int
    log_start_offset: int | None = None
    high_watermark: int | None = None
    log_end_offset: int | None = None
    segments: int | None = None
    size_bytes: int | None = None
    offline: bool | None = Field(None, description="true when the partition could not be loaded at start-up (absent otherwise)")
    error: str | None = Field(None, description="why it is offline")


class TopicDetail(BaseModel):
    name: str
    topic_id: str
    internal: bool = False
    configs: dict[str, str]
    overrides: dict[str, str] = Field(default_factory=dict)
    partitions: list[PartitionInfo]


class RecordHeader(BaseModel):
    key: str
    value: Any = None
    model_config = ConfigDict(extra="forbid")


class ProduceRecord(BaseModel):
    key: Any = None
    value: Any = None
    headers: list[RecordHeader] = Field(default_factory=list)
    timestamp: StrictInt | None = Field(None, ge=0, le=2**63 - 1, description="CreateTime in ms; default: now")
    partition: StrictInt | None = Field(None, ge=0, description="default: murmur2(key), or spread when keyless")
    model_config = ConfigDict(extra="forbid")


class ProduceRequest(BaseModel):
    records: list[ProduceRecord] = Field(min_length=1)
    key_format: Format = Format.string
    value_format: Format = Format.string
    expected_offset: StrictInt | None = Field(
        None, ge=0, description="conditional append: the partition's next offset must be this (as If-Match); "
        "the records must all go to one partition",
    )
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [  # docs/API.md's
        {"records": [
            {"key": "user-42", "value": "hello", "headers": [{"key": "source", "value": "curl"}]},
            {"key": "user-6", "value": "world", "timestamp": 1700000000000},
        ]},
        {"key_format": "string", "value_format": "json", "records": [
            {"key": "user-42", "value": {"total": 12.5, "items": 3}},
            {"key": "user-42", "value": None},
        ]},
    ]})


class RecordOffset(BaseModel):
    partition: int
    offset: int
    timestamp: int


class ProducedPartition(BaseModel):
    """One partition a produce wrote to. Each produce answer (a topic's, a partition's, a
    key's) has `partitions`, a list of these: the one shape a client can read from all three."""

    partition: int
    base_offset: int = Field(description="the offset of the request's first record here")
    last_offset: int = Field(description="the offset of the request's last record here")


PRODUCED_PARTITIONS_DOC = (
    "each partition written, by partition number: the same member in every produce answer "
    "(topic, partition and key produce), so one client function reads them all"
)


class ProduceResponse(BaseModel):
    offsets: list[RecordOffset] = Field(
        description="each record's partition, offset and timestamp, in request order"
    )
    partitions: list[ProducedPartition] = Field(description=PRODUCED_PARTITIONS_DOC)


class PartitionProduceResponse(BaseModel):
    partition: int
    base_offset: int
    last_offset: int
    timestamp: int = Field(description="the LogAppendTime if the topic uses it, else the largest record timestamp")
    partitions: list[ProducedPartition] = Field(
        description=PRODUCED_PARTITIONS_DOC + " (here: this one)"
    )


class FetchedRecord(BaseModel):
    offset: int
    timestamp: int
    key: Any = Field(description="in the requested key_format; null for a null key")
    value: Any = Field(description="in the requested value_format; null for a tombstone")
    headers: list[RecordHeader]


class DroppedRange(BaseModel):
    """Offsets recovery dropped with a damaged batch (records that may have been acknowledged are
    missing there; docs/RELIABILITY.md, "Damaged files")."""

    first: int = Field(description="the first dropped offset the read covered")
    last: int = Field(description="the last dropped offset the read covered (inclusive)")


DROPPED_DOC = (
    "only when the read covered offsets that recovery dropped with damaged batches: those offsets, in ascending "
    "inclusive ranges (also in the Eventlog-Dropped-Offsets header); absent otherwise"
)


class FetchResponse(BaseModel):
    records: list[FetchedRecord]
    next_offset: int
    high_watermark: int
    log_start_offset: int
    dropped: list[DroppedRange] = Field(default_factory=list, description=DROPPED_DOC)


class KeyRecord(BaseModel):
    """A record of a per-key append: the key comes from the path."""

    value: Any = Field(None, description="in value_format; null writes a tombstone (it ends the key's stream on a compacted topic)")
    headers: list[RecordHeader] = Field(default_factory=list)
    timestamp: StrictInt | None = Field(None, ge=0, le=2**63 - 1, description="CreateTime in ms; default: now")
    model_config = ConfigDict(extra="forbid")


class KeyProduceRequest(BaseModel):
    records: list[KeyRecord] = Field(min_length=1)
    value_format: Format = Format.string
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [  # docs/API.md's
        {"value_format": "json", "records": [{"value": {"type": "created", "total": 40}}]},
    ]})


class KeyProduceResponse(BaseModel):
    partition: int = Field(description="the key's partition (murmur2, as Kafka places a keyed record)")
    offsets: list[int] = Field(description="of the records, in request order; the last is the key's new version (ETag)")
    base_offset: int
    last_offset: int
    partitions: list[ProducedPartition] = Field(
        description=PRODUCED_PARTITIONS_DOC + " (here: the key's)"
    )


class KeyRecordsResponse(BaseModel):
    partition: int = Field(description="the key's partition (murmur2, as Kafka places a keyed record)")
    records: list[FetchedRecord] = Field(description="the key's records in offset order")
    next_offset: int = Field(description="where the next page starts: pass it as `offset` (more records of the key may follow it)")
    more: bool = Field(description="true when the page stopped at max_records or max_bytes")
    latest_offset: int = Field(description="the offset of the key's latest record (its version, also the ETag); -1 when it has none")
    high_watermark: int
    log_start_offset: int
    dropped: list[DroppedRange] = Field(
        default_factory=list, description=DROPPED_DOC + "; the key's records there, if it had any, are missing from the page",
    )


class PartitionOffsets(BaseModel):
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    offset: int | None = Field(
        None, description="with ?timestamp= or ?spec=: the answer (null when no record qualifies, or when not asked)"
    )
    timestamp: int | None = Field(None, description="the timestamp of the record at `offset` (null for earliest/latest)")


class OffsetSpec(str, Enum):
    earliest = "earliest"
    latest = "latest"
    max_timestamp = "max_timestamp"


class DeleteRecordsRequest(BaseModel):
    before_offset: StrictInt = Field(ge=-1, description="the new log start offset; -1 means the high watermark")
    model_config = ConfigDict(extra="forbid")


class DeleteRecordsResponse(BaseModel):
    log_start_offset: int


class SegmentInfo(BaseModel):
    base_offset: int
    last_offset: int = Field(description="base_offset - 1 when the segment is empty")
    size_bytes: int
    first_timestamp: int = Field(description="-1 when unknown")
    max_timestamp: int = Field(description="-1 when unknown")
    index_entries: int
    time_index_entries: int
    active: bool


class SegmentList(BaseModel):
    segments: list[SegmentInfo]


class GroupOffset(BaseModel):
    topic: str
    partition: StrictInt = Field(ge=0)
    offset: StrictInt = Field(ge=0, le=2**63 - 1)
    metadata: str = Field("", max_length=4096)
    model_config = ConfigDict(extra="forbid")


class CommittedGroupOffset(BaseModel):
    topic: str
    partition: int
    offset: int
    metadata: str
    commit_timestamp: int


class GroupOffsetsCommit(BaseModel):
    offsets: list[GroupOffset] = Field(min_length=1)
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [  # docs/API.md's
        {"offsets": [{"topic": "orders", "partition": 0, "offset": 3, "metadata": "batch 17"}]},
    ]})


class GroupOffsets(BaseModel):
    group: str
    offsets: list[CommittedGroupOffset]


class GroupOffsetsReset(BaseModel):
    """Kafka's `kafka-consumer-groups.sh --reset-offsets`: one scope (`topic`, with or without
    `partitions`, or `all_topics`) and one strategy (`to_earliest`, `to_latest`,
    `to_datetime`, `to_offset` or `shift_by`), each named after the tool's option."""

    topic: str | None = Field(None, description="the topic whose offsets to reset (--topic)")
    partitions: list[StrictInt] | None = Field(
        None, min_length=1,
        description="only these partitions of `topic` (--topic t:0,1); default: all of them",
    )
    all_topics: bool = Field(
        False, description="every topic the group has committed offsets on (--all-topics)"
    )
    to_earliest: bool = Field(
        False, description="to each partition's log start offset (--to-earliest)"
    )
    to_latest: bool = Field(False, description="to each partition's high watermark (--to-latest)")
    to_datetime: str | None = Field(
        None,
        description=(
            "to the first offset whose record timestamp is at least this ISO 8601 time, or "
            "the high watermark where none is (--to-datetime); a time without a zone is UTC"
        ),
        examples=["2024-05-01T09:30:00Z"],
    )
    to_offset: StrictInt | None = Field(
        None, ge=0,
        description="to this offset, moved into [log start offset, high watermark] (--to-offset)",
    )
    shift_by: StrictInt | None = Field(
        None,
        description=(
            "the committed offset plus this (negative: back), moved into [log start offset, high "
            "watermark] (--shift-by); every partition reset needs a committed offset"
        ),
    )
    dry_run: bool = Field(
        False, description="answer the new offsets without committing them (--dry-run)"
    )
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [  # docs/API.md's
        {"topic": "payments", "to_earliest": True, "dry_run": True},
        {"all_topics": True, "shift_by": -1},
    ]})

    @model_validator(mode="after")
    def _one_scope_one_strategy(self) -> GroupOffsetsReset:
        strategies = [
            name for name, given in (
                ("to_earliest", self.to_earliest), ("to_latest", self.to_latest),
                ("to_datetime", self.to_datetime is not None),
                ("to_offset", self.to_offset is not None),
                ("shift_by", self.shift_by is not None),
            ) if given
        ]
        if len(strategies) != 1:
            raise ValueError(
                "give exactly one of to_earliest, to_latest, to_datetime, to_offset, shift_by"
                + (f" (got {', '.join(strategies)})" if strategies else "")
            )
        if (self.topic is None) == (not self.all_topics):
            raise ValueError("give either topic or all_topics: true")
        if self.partitions is not None and self.topic is None:
            raise ValueError("partitions needs topic")
        if self.partitions is not None and any(p < 0 for p in self.partitions):
            raise ValueError("partitions are at least 0")
        return self


class ResetGroupOffset(BaseModel):
    topic: str
    partition: int
    previous_offset: int | None = Field(
        description="the committed offset before the reset; null: none"
    )
    offset: int = Field(description="the new committed offset")


class GroupOffsetsResetResult(BaseModel):
    group: str
    dry_run: bool = Field(description="true: nothing was committed")
    offsets: list[ResetGroupOffset]


class GroupList(BaseModel):
    groups: list[str] = Field(description="sorted by name")
    next_after: str | None = Field(
        None, description="pass as `after` for the next page; null on the last page"
    )


class MaintenanceRequest(BaseModel):
    topic: str | None = Field(None, description="only this topic; default: every topic")
    partition: StrictInt | None = Field(None, ge=0, description="only this partition of `topic` (needs `topic`)")
    model_config = ConfigDict(extra="forbid")


class RetentionPartition(BaseModel):
    topic: str
    partition: int
    segments_deleted: int
    bytes_reclaimed: int
    reasons: dict[str, int] = Field(description="segments deleted per rule: log_start_offset, retention_bytes, retention_ms")
    log_start_offset: int = Field(description="after the pass")


class RetentionRun(BaseModel):
    segments_deleted: int
    bytes_reclaimed: int
    partitions: list[RetentionPartition] = Field(description="partitions where segments were deleted")


class CompactionPartition(BaseModel):
    topic: str
    partition: int
    cleaned: bool = Field(description="false when there was nothing to clean")
    first_dirty_offset: int = Field(description="where the pass's dirty range began")
    end_offset: int = Field(description="the first offset not cleaned: the next pass's first dirty offset")
    dirty_ratio: float = Field(description="dirty bytes / (clean + dirty bytes) before the pass")
    segments_before: int
    segments_after: int
    bytes_reclaimed: int
    records_read: int
    records_kept: int
    records_removed: int
    tombstones_removed: int
    map_full: bool = Field(description="the offset map filled up: the dirty range was cleaned in part")
    seconds: float
    throttled_seconds: float = Field(
        0.0, description="of `seconds`, slept to keep to EVENTLOG_CLEANER_IO_MAX_BYTES_PER_SEC"
    )
    note: str = ""


class MaintenancePass(BaseModel):
    """A worker's latest pass over one partition since the server started."""

    at_ms: int = Field(description="when the pass ended, ms since the epoch")
    outcome: str = Field(description="ok; abandoned (the log changed under it, retried later); error")
    note: str = ""
    result: dict[str, Any] | None = Field(
        None, description="what the pass did (the fields of RetentionPartition or CompactionPartition); null unless ok"
    )


class PartitionMaintenance(BaseModel):
    topic: str
    partition: int
    cleanup_policy: str
    owner_shard: int = Field(description="the shard process that writes and cleans the partition (0 with one process)")
    cleaner_offset: int | None = Field(
        None, description="the compactor's checkpoint: offsets below it are clean (null: never cleaned)"
    )
    dirty_ratio: float | None = Field(None, description="dirty bytes / cleanable bytes when last measured (compacted topics)")
    last_retention: MaintenancePass | None = None
    last_compaction: MaintenancePass | None = None


class CompactionRun(BaseModel):
    bytes_reclaimed: int
    records_removed: int
    partitions: list[CompactionPartition] = Field(description="every compacted partition looked at")


class ServerInfo(BaseModel):
    version: str
    shards: int = Field(description="shard processes serving (EVENTLOG_PROCESSES)")
    shard: int = Field(description="the shard that answered")
    auth: bool = Field(description="true when the server has an auth file: every request needs a token")


class WhoAmI(BaseModel):
    """The caller as the server sees it: what the console shows, hides or disables."""

    name: str = Field(description="the token's name; `anonymous` without an auth file")
    role: str = Field(description="admin, producer or consumer")
    actions: list[str] = Field(description="what the role may do: admin, write, read, describe, group, monitor")
    topics: list[str] = Field(description="topic name prefixes it covers (\"\" is every user topic)")
    groups: list[str] = Field(description="consumer group prefixes it covers")
    server: ServerInfo


class SnapshotRequest(BaseModel):
    topics: list[str] | None = Field(None, description="topics to include; default: every user topic")
    model_config = ConfigDict(extra="forbid")


class SnapshotPartition(BaseModel):
    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int = Field(description="the snapshot holds the offsets below it")
    segments: int
    size_bytes: int


class Snapshot(BaseModel):
    id: str
    path: str = Field(
        description="the snapshot's directory (manifest.json and one directory per partition), relative to the "
        "server's snapshot dir (`<id>`; by default `<data dir>.snapshots`, beside the data dir), or to its data dir "
        "when EVENTLOG_SNAPSHOT_DIR is inside that (`snapshots/<id>`)"
    )
    created_at: str = Field(description="ISO 8601, UTC")
    topics: list[str]
    partitions: list[SnapshotPartition]


class SnapshotList(BaseModel):
    snapshots: list[Snapshot]



# -- queues (api/queues.py, engine/queues.py) --------------------------------------------------


class QueueStartTime(BaseModel):
    timestamp: StrictInt = Field(
        ge=0, description="ms since the epoch: the first record at or after it"
    )
    model_config = ConfigDict(extra="forbid")


class QueueCreate(BaseModel):
    """A queue's settings (PUT): the same again answers 200, others 409 queue_exists."""

    lock_ms: StrictInt = Field(
        30_000, ge=100, le=43_200_000, description="how long a lease holds its record"
    )
    max_deliveries: StrictInt = Field(
        5,
        ge=1,
        le=1000,
        description="after this many deliveries without an ack, the record is dead-lettered",
    )
    ordering: Literal["none", "key"] = Field(
        "none",
        description="key: no record is leased while an earlier record of its key is leased "
        "or waiting",
    )
    start: Literal["earliest", "latest"] | QueueStartTime = Field(
        "earliest",
        description='where each partition\'s queue begins: "earliest", "latest" or '
        '{"timestamp": ms}',
    )
    dead_letter_topic: str | None = Field(
        None,
        min_length=1,
        max_length=249,
        description="where dead records go, with headers naming their source; null: archived",
    )
    model_config = ConfigDict(extra="forbid")


class QueuePartition(BaseModel):
    partition: int
    start_offset: int = Field(description="the first offset not yet acknowledged or dead-lettered")
    end_offset: int = Field(description="the partition's high watermark")
    available: int = Field(description="records waiting for a lease (read or not yet)")
    leased: int
    acked: int = Field(description="acknowledged since the queue was made")
    dead_lettered: int = Field(description="dead-lettered or archived since the queue was made")
    lag: int = Field(description="records from start_offset to end_offset not yet settled")
    redeliveries: int = Field(
        description="leases of a record delivered before (since this server started)"
    )
    lost_to_retention: int = Field(
        description="unsettled records retention deleted (since this server started)"
    )
    oldest_unacked_age_ms: int = Field(
        description="how old (now less its timestamp) the first record not yet acknowledged or "
        "dead-lettered is; 0 when none"
    )
    offline: bool = Field(
        False,
        description="the shard owning the partition (and its window) did not answer: its figures "
        "are 0, not known (a family of shards; docs/RELIABILITY.md)",
    )


class Queue(BaseModel):
    topic: str
    queue: str
    lock_ms: int
    max_deliveries: int
    ordering: str
    start: str | QueueStartTime
    dead_letter_topic: str | None
    created_ms: int
    partitions: list[QueuePartition]


class QueueList(BaseModel):
    queues: list[str] = Field(description="sorted by name")


class LeaseRequest(BaseModel):
    max_records: StrictInt = Field(100, ge=1, le=10_000)
    lock_ms: StrictInt | None = Field(
        None, ge=100, le=43_200_000, description="default: the queue's lock_ms"
    )
    wait_ms: StrictInt = Field(
        0, ge=0, le=30_000, description="long-poll: wait this long for a record"
    )
    model_config = ConfigDict(extra="forbid")


class LeasedRecord(BaseModel):
    partition: int
    offset: int
    key: Any = Field(description="in the requested key_format; null for a null key")
    value: Any = Field(description="in the requested value_format; null for a tombstone")
    headers: list[RecordHeader]
    timestamp: int
    delivery_count: int = Field(description="1 on the first delivery")
    lease: str = Field(description="opaque: pass it to ack, release, reject or renew")
    lease_expires_at: int = Field(
        description="ms since the epoch; then the record is delivered again"
    )


class LeaseResponse(BaseModel):
    records: list[LeasedRecord]


class LeasesRequest(BaseModel):
    leases: list[str] = Field(min_length=1, max_length=10_000)
    model_config = ConfigDict(extra="forbid")


class ReleaseRequest(LeasesRequest):
    delay_ms: StrictInt = Field(
        0, ge=0, le=43_200_000, description="leasable again only after this"
    )


class RenewRequest(LeasesRequest):
    lock_ms: StrictInt | None = Field(
        None, ge=100, le=43_200_000, description="default: the queue's lock_ms"
    )


class LeaseStatus(BaseModel):
    lease: str
    status: Literal["acked", "released", "rejected", "renewed", "expired", "unknown"] = Field(
        description="expired: the lease no longer holds its record (its lock ran out, or it "
        "was settled); unknown: not a lease of this queue"
    )


class LeaseResults(BaseModel):
    results: list[LeaseStatus]
