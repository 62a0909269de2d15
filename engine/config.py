"""Topic configuration: Kafka's names, types, ranges and defaults.

A topic stores only its overrides (what the user set); LogConfig is the effective set, built by
laying the overrides over the defaults. Values arrive as strings or numbers, as in Kafka's
AdminClient; LogConfig.to_kafka() gives them back as strings.

Where eventlog differs from Kafka, on purpose (also in docs/OPERATIONS.md):
* flush.messages defaults to 1: a producer is acknowledged only after an fsync covering its
  records (one fsync per group commit, not per message). There is no replication to fall back
  on. Setting it above 1 acknowledges after the write and fsyncs once that many messages are
  unflushed or flush.ms has passed.
* segment.index.bytes must hold at least two time index entries (24 bytes).
* compression.type applies to batches the server builds (JSON produce); raw batches are
  stored as sent ("producer" semantics), never recompressed.

Pure; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from .errors import InvalidConfigError, InvalidTopicNameError

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1

TOPIC_NAME_MAX = 249
_TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]+$")
INTERNAL_PREFIX = "__"


def validate_topic_name(name: str) -> None:
    """Kafka's rules: 1..249 of [a-zA-Z0-9._-], not '.' or '..'."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicNameError(str(name), "the name is empty")
    if name in (".", ".."):
        raise InvalidTopicNameError(name, "'.' and '..' are not allowed")
    if len(name) > TOPIC_NAME_MAX:
        raise InvalidTopicNameError(name, f"longer than {TOPIC_NAME_MAX} characters")
    if not _TOPIC_RE.match(name):
        raise InvalidTopicNameError(name, "only ASCII letters, digits, '.', '_' and '-' are allowed")


# Kafka's own topics (common/internals/Topic.java: its internal topics, and the KRaft metadata
# log, which CreateTopics refuses by name) and eventlog's (engine/metadata.py): a user topic of
# one of these names would pass for the real thing to a tool, a mirror or an import.
RESERVED_TOPICS: dict[str, str] = {
    "__cluster_metadata": "Kafka's KRaft metadata log",
    "__consumer_offsets": "the internal topic of committed group offsets",
    "__transaction_state": "Kafka's internal topic of transaction state",
    "__share_group_state": "Kafka's internal topic of share group state",
    "__metadata": "eventlog's internal topic of topic metadata",
}


def validate_new_topic_name(name: str) -> None:
    """validate_topic_name(), and not a name Kafka or eventlog reserves (RESERVED_TOPICS). Other
    names starting with '__' stay allowed, as in Kafka."""
    validate_topic_name(name)
    why = RESERVED_TOPICS.get(name)
    if why is not None:
        raise InvalidTopicNameError(name, f"reserved: {why} has this name, and it is created by the server only")


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIX)


# -- value parsers --------------------------------------------------------------------------


def _int_parser(lo: int, hi: int) -> Callable[[str, Any], int]:
    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool):
            raise InvalidConfigError(name, value, "expected an integer")
        if isinstance(value, int):
            n = value
        elif isinstance(value, str):
            try:
                n = int(value.strip())
            except ValueError:
                raise InvalidConfigError(name, value, "expected an integer") from None
        else:
            raise InvalidConfigError(name, value, "expected an integer")
        if not lo <= n <= hi:
            raise InvalidConfigError(name, value, f"must be in [{lo}, {hi}]")
        return n

    return parse


def _ratio(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise InvalidConfigError(name, value, "expected a number")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidConfigError(name, value, "expected a number") from None
    if not 0.0 <= x <= 1.0:
        raise InvalidConfigError(name, value, "must be in [0, 1]")
    return x


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidConfigError(name, value, "expected true or false")


def _text(value: Any) -> str:
    """A parsed config value as Kafka writes it: 0.5, true, 1000."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _choice(*options: str) -> Callable[[str, Any], str]:
    def parse(name: str, value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise InvalidConfigError(name, value, f"must be one of {', '.join(options)}")
        return value

    return parse


def _cleanup_policy(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidConfigError(name, value, "expected 'delete', 'compact' or 'compact,delete'")
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        raise InvalidConfigError(name, value, "expected 'delete', 'compact' or 'compact,delete'")
    return ",".join(sorted(set(parts)))


@dataclass(frozen=True, slots=True)
class _Def:
    field: str
    parse: Callable[[str, Any], Any]
    default: Any
    doc: str


CONFIG_DEFS: dict[str, _Def] = {
    "cleanup.policy": _Def("cleanup_policy", _cleanup_policy, "delete", "delete, compact, or both"),
    "compression.type": _Def(
        "compression_type",
        _choice("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
        "producer",
        "codec for batches the server builds; raw batches are kept as sent",
    ),
    "delete.retention.ms": _Def("delete_retention_ms", _int_parser(0, LONG_MAX), 86_400_000, "how long tombstones survive compaction"),
    "file.delete.delay.ms": _Def("file_delete_delay_ms", _int_parser(0, LONG_MAX), 60_000, "delay before removing .deleted files"),
    "flush.messages": _Def("flush_messages", _int_parser(1, LONG_MAX), 1, "fsync after this many unflushed messages; 1 = before every acknowledgement"),
    "flush.ms": _Def("flush_ms", _int_parser(0, LONG_MAX), LONG_MAX, "fsync at least this often when flush.messages > 1"),
    "index.interval.bytes": _Def("index_interval_bytes", _int_parser(0, INT_MAX), 4096, "bytes of log between index entries"),
    "max.compaction.lag.ms": _Def("max_compaction_lag_ms", _int_parser(1, LONG_MAX), LONG_MAX, "longest a record stays uncompacted"),
    "max.message.bytes": _Def("max_message_bytes", _int_parser(0, INT_MAX), 1_048_588, "largest record batch accepted"),
    "message.timestamp.type": _Def("message_timestamp_type", _choice("CreateTime", "LogAppendTime"), "CreateTime", "whose clock stamps records"),
    "min.cleanable.dirty.ratio": _Def("min_cleanable_dirty_ratio", _ratio, 0.5, "dirty share that makes a log eligible for compaction"),
    "min.compaction.lag.ms": _Def("min_compaction_lag_ms", _int_parser(0, LONG_MAX), 0, "youngest a record may be to be compacted"),
    "retention.bytes": _Def("retention_bytes", _int_parser(-1, LONG_MAX), -1, "size limit per partition; -1 = none"),
    "retention.ms": _Def("retention_ms", _int_parser(-1, LONG_MAX), 604_800_000, "age limit; -1 = none"),
    "segment.bytes": _Def("segment_bytes", _int_parser(14, INT_MAX), 1_073_741_824, "roll a segment at this size"),
    "segment.index.bytes": _Def("segment_index_bytes", _int_parser(24, INT_MAX), 10_485_760, "preallocated size of each index"),
    "segment.ms": _Def("segment_ms", _int_parser(1, LONG_MAX), 604_800_000, "roll a segment this long after its first timestamp"),
    # not Kafka's: the per-key index (per-key reads and conditional appends); false for
    # firehose topics, which then pay nothing for it
    "eventlog.key.index": _Def("key_index", _bool, True, "keep a per-key index: per-key reads and conditional appends"),
}


@dataclass(frozen=True, slots=True)
class LogConfig:
    cleanup_policy: str = "delete"
    compression_type: str = "producer"
    delete_retention_ms: int = 86_400_000
    file_delete_delay_ms: int = 60_000
    flush_messages: int = 1
    flush_ms: int = LONG_MAX
    index_interval_bytes: int = 4096
    max_compaction_lag_ms: int = LONG_MAX
    max_message_bytes: int = 1_048_588
    message_timestamp_type: str = "CreateTime"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    retention_bytes: int = -1
    retention_ms: int = 604_800_000
    segment_bytes: int = 1_073_741_824
    segment_index_bytes: int = 10_485_760
    segment_ms: int = 604_800_000
    key_index: bool = True

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy.split(",")

    @property
    def durable_acks(self) -> bool:
        return self.flush_messages <= 1

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def max_batch_bytes(self) -> int:
        """A batch must fit both max.message.bytes and a segment."""
        return min(self.max_message_bytes, self.segment_bytes)

    def with_overrides(self, overrides: Mapping[str, Any]) -> LogConfig:
        """A new config with `overrides` (Kafka names) applied; raises InvalidConfigError."""
        changes = parse_overrides(overrides)
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in changes.items():
            values[CONFIG_DEFS[name].field] = value
        return LogConfig(**values)

    def to_kafka(self) -> dict[str, str]:
        out = {}
        for name, d in CONFIG_DEFS.items():
            out[name] = _text(getattr(self, d.field))
        return out


def parse_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Validate and normalise overrides: {kafka name: parsed value}."""
    parsed: dict[str, Any] = {}
    for name, value in overrides.items():
        d = CONFIG_DEFS.get(name)
        if d is None:
            raise InvalidConfigError(name, value, "unknown topic config")
        parsed[name] = d.parse(name, value)
    return parsed


def normalise_overrides(overrides: Mapping[str, Any]) -> dict[str, str]:
    """Validated overrides as Kafka-style strings, for storing in the metadata log."""
    out = {}
    for name, value in parse_overrides(overrides).items():
        out[name] = _text(value)
    return out
