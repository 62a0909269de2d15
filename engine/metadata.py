"""Event-sourced topic metadata: the events in __metadata-0 and the image they fold into.

Each event is one record in an ordinary partition log (`__metadata-0` in the first log dir):
key = topic name (UTF-8), value = a JSON object with "v": 1, "type", "topic", "topic_id",
"ts" (ms) and per type:

    topic_created     "partitions": int, "configs": {kafka name: string}  (overrides only)
    configs_altered   "configs": {...}   the complete new set of overrides, and "partitions",
                      "created_ms": the rest of the topic's state
    partitions_added  "partitions": int  the new total, and "configs", "created_ms"
    topic_deleted     -  (the topic's queues go with it)
    queue_created     "queue": name, "id": the queue id (16 hex digits), "settings": the queue's
                      settings (engine/queues.py QueueSettings, as JSON), "created_ms", and
                      "starts": per partition, the offset the queue starts at (absent in an event
                      migrated from __queue_state's old "q" records, whose starts are there)
    queue_deleted     "queue", "id"

Queue events (engine/queues.py: a queue's definition, which every shard of a family needs) are
keyed "<topic>/<queue>": '/' is in no topic name, so no queue's key is a topic's. Their
"topic_id" is the queue's topic's: a queue of a topic deleted and made again is not the new
topic's (MetadataImage.queues_of filters on it, so a compacted log that kept a queue_created of
an older incarnation, and not its topic_deleted, names no live queue).

The log is compacted (key = topic name), so only the latest event per topic name is sure to
survive: every event but topic_deleted carries the topic's whole state, and an event for a
topic the image does not know yet creates it. (Events written before "created_ms" was added
lack it and the two state fields; a compacted log never held those.)

Start-up replays the log from its start into a MetadataImage. An event is appended (and
fsynced) before the change it describes touches any file, so after a crash the image says
what should exist and the log manager makes the directories agree.

decode_event() checks an event's shape (the fields apply() reads, with their types) and raises
StorageError for anything else: an event that passed its batch's CRC but is not one of the
above was damaged before it was written, and start-up refuses to guess what it meant.

Pure except for the image's mutation by apply(); no I/O.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from .errors import InvalidRequestError, StorageError

METADATA_TOPIC = "__metadata"
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
# queues' state (engine/queues.py), Kafka's __share_group_state: made with the first queue
QUEUE_STATE_TOPIC = "__queue_state"
INTERNAL_TOPICS = frozenset({METADATA_TOPIC, CONSUMER_OFFSETS_TOPIC, QUEUE_STATE_TOPIC})

EVENT_VERSION = 1
QUEUE_EVENTS = frozenset({"queue_created", "queue_deleted"})
TOPIC_EVENTS = frozenset({"topic_created", "configs_altered", "partitions_added", "topic_deleted"})
EVENT_TYPES = TOPIC_EVENTS | QUEUE_EVENTS
_REQUIRED = {
    "topic_created": ("partitions",),
    "configs_altered": ("configs",),
    "partitions_added": ("partitions",),
    "queue_created": ("queue", "id", "settings"),
    "queue_deleted": ("queue", "id"),
}
_MAX_PARTITIONS = 2**31 - 1


def refuse_internal(topic: str) -> None:
    """Only the server writes __metadata and __consumer_offsets, or moves their log start:
    Kafka refuses Produce and DeleteRecords on internal topics, and here a client's records would
    be replayed as topic metadata or group offsets (deleting __metadata's records loses every
    topic at the next start). Every transport's produce and delete-records calls this."""
    if topic in INTERNAL_TOPICS:
        raise InvalidRequestError(f"{topic} is managed by the server")


def new_topic_id() -> str:
    """A random UUID in Kafka's text form: URL-safe base64 without padding (22 chars)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class TopicMeta:
    name: str
    topic_id: str
    partitions: int
    overrides: dict[str, str] = field(default_factory=dict)
    created_ms: int = 0

    @property
    def internal(self) -> bool:
        return self.name in INTERNAL_TOPICS


@dataclass(frozen=True)
class QueueMeta:
    """A queue's definition as the metadata log holds it (engine/queues.py keeps its state)."""

    topic: str
    name: str
    queue_id: str  # hex
    topic_id: str
    settings: dict[str, Any]
    created_ms: int
    starts: tuple[int, ...] = ()  # per partition at creation; () for a migrated queue


def queue_key(topic: str, name: str) -> bytes:
    """The metadata log's key of a queue's events (see the module's doc)."""
    return f"{topic}/{name}".encode("utf-8")


@dataclass
class MetadataImage:
    topics: dict[str, TopicMeta] = field(default_factory=dict)
    deleted_topic_ids: set[str] = field(default_factory=set)
    queues: dict[tuple[str, str], QueueMeta] = field(default_factory=dict)
    events: int = 0

    def queues_of(self, topic: str | None = None) -> list[QueueMeta]:
        """The live queues (of `topic`): those whose topic exists with the id they were made on."""
        out = []
        for q in self.queues.values():
            meta = self.topics.get(q.topic)
            if meta is not None and meta.topic_id == q.topic_id and topic in (None, q.topic):
                out.append(q)
        return out

    def apply(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        name = event["topic"]
        topic_id = event["topic_id"]
        current = self.topics.get(name)
        self.events += 1
        if kind in QUEUE_EVENTS:
            self._apply_queue(kind, event)
            return
        if kind == "topic_deleted":
            for q in [q for q in self.queues.values() if (q.topic, q.topic_id) == (name, topic_id)]:
                del self.queues[(q.topic, q.name)]
        if kind == "topic_created":
            self.topics[name] = TopicMeta(
                name, topic_id, int(event["partitions"]), dict(event.get("configs", {})), int(event.get("ts", 0))
            )
            self.deleted_topic_ids.discard(topic_id)
            return
        if current is None and kind != "topic_deleted":
            if "partitions" in event and "configs" in event:
                # its topic_created was compacted away: the event holds the whole state
                self.topics[name] = TopicMeta(
                    name, topic_id, int(event["partitions"]), dict(event["configs"]),
                    int(event.get("created_ms", event.get("ts", 0))),
                )
                self.deleted_topic_ids.discard(topic_id)
            return
        if current is None or current.topic_id != topic_id:
            if kind == "topic_deleted":
                self.deleted_topic_ids.add(topic_id)
            return  # an event for a topic incarnation that no longer exists
        if kind == "configs_altered":
            self.topics[name] = replace(current, overrides=dict(event["configs"]))
        elif kind == "partitions_added":
            self.topics[name] = replace(current, partitions=int(event["partitions"]))
        elif kind == "topic_deleted":
            del self.topics[name]
            self.deleted_topic_ids.add(topic_id)
        else:
            raise ValueError(f"unknown metadata event type {kind!r}")

    def _apply_queue(self, kind: str, event: dict[str, Any]) -> None:
        """Kept whether or not the topic is known yet: compaction may have kept the queue's
        event and dropped its topic's topic_created for a later event of the topic."""
        key = (event["topic"], event["queue"])
        if kind == "queue_created":
            self.queues[key] = QueueMeta(
                event["topic"], event["queue"], event["id"], event["topic_id"],
                dict(event["settings"]), int(event.get("created_ms", event.get("ts", 0))), tuple(event.get("starts", ())),
            )
        else:
            current = self.queues.get(key)
            if current is not None and current.queue_id == event["id"]:
                del self.queues[key]


def encode_event(kind: str, topic: str, topic_id: str, ts: int, **fields_: Any) -> tuple[bytes, bytes]:
    """(key, value) of the record for one event (a queue's: keyed by queue_key)."""
    body = {"v": EVENT_VERSION, "type": kind, "topic": topic, "topic_id": topic_id, "ts": ts, **fields_}
    key = queue_key(topic, fields_["queue"]) if kind in QUEUE_EVENTS else topic.encode("utf-8")
    return key, orjson.dumps(body)


def decode_event(value: bytes) -> dict[str, Any]:
    """The event in a metadata record's value; StorageError if it is not a well-formed event."""
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise _malformed(value, f"not JSON ({exc})") from None
    if not isinstance(event, dict) or event.get("v") != EVENT_VERSION:
        raise _malformed(value, f"not a version {EVENT_VERSION} event")
    kind = event.get("type")
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        raise _malformed(value, f"unknown type {kind!r}")
    if not isinstance(event.get("topic"), str) or not isinstance(event.get("topic_id"), str):
        raise _malformed(value, "topic and topic_id must be strings")
    for name in _REQUIRED.get(kind, ()):
        if name not in event:
            raise _malformed(value, f"{kind} without {name}")
    partitions = event.get("partitions", 1)
    if type(partitions) is not int or not 1 <= partitions <= _MAX_PARTITIONS:
        raise _malformed(value, f"partitions {partitions!r} is not a count")
    configs = event.get("configs", {})
    if not isinstance(configs, dict) or not all(isinstance(v, str) for v in configs.values()):
        raise _malformed(value, "configs must map names to strings")
    for name in ("ts", "created_ms"):
        if type(event.get(name, 0)) is not int:
            raise _malformed(value, f"{name} must be an integer")
    if kind in QUEUE_EVENTS:
        _check_queue_event(value, event)
    return event


def _check_queue_event(value: bytes, event: dict[str, Any]) -> None:
    if not isinstance(event["queue"], str) or not isinstance(event["id"], str):
        raise _malformed(value, "queue and id must be strings")
    if "settings" in event and not isinstance(event["settings"], dict):
        raise _malformed(value, "settings must be an object")
    starts = event.get("starts", [])
    if not isinstance(starts, list) or not all(type(s) is int and s >= 0 for s in starts):
        raise _malformed(value, "starts must be a list of offsets")


def _malformed(value: bytes, reason: str) -> StorageError:
    return StorageError(f"{METADATA_TOPIC}-0", f"malformed metadata event {bytes(value[:80])!r}: {reason}")
