"""Conditional appends: what an append requires of the log before it writes, as typed values.

The engine takes these and never a transport's text: the HTTP layer reads them from If-Match,
If-None-Match and ETags (api/conditions.py), a Kafka listener would read them from its own
request fields. A failed condition raises one engine error whatever the transport
(OffsetMismatchError for a partition's, KeyVersionMismatchError for a key's), and the transport
chooses how to answer it (HTTP: 409 or 412, api/conditions.py).

    ExpectedOffset(n)   a partition append: the partition's next offset (its high watermark) is n
    KeyIsNew()          a per-key append: the key has no records
    KeyAt(n)            a per-key append: the key's latest record is at offset n
    KeyHasRecords()     a per-key append: the key has records, wherever its latest is
"""

from __future__ import annotations

from dataclasses import dataclass

from .key_reads import ANY_RECORDS, NO_RECORDS


@dataclass(frozen=True, slots=True)
class ExpectedOffset:
    """Append only if the partition's next offset is `offset` (Kafka's high watermark)."""

    offset: int

    def __post_init__(self) -> None:
        if type(self.offset) is not int or self.offset < 0:
            raise ValueError(f"ExpectedOffset: a non-negative offset, not {self.offset!r}")


@dataclass(frozen=True, slots=True)
class KeyIsNew:
    """Append for a key only if it has no records (none written, or all compacted away)."""


@dataclass(frozen=True, slots=True)
class KeyAt:
    """Append for a key only if its latest record is at `offset` (the key's version)."""

    offset: int

    def __post_init__(self) -> None:
        if type(self.offset) is not int or self.offset < 0:
            raise ValueError(f"KeyAt: a non-negative offset, not {self.offset!r} (KeyIsNew: none)")


@dataclass(frozen=True, slots=True)
class KeyHasRecords:
    """Append for a key only if it has records, whichever is its latest."""


KeyCondition = KeyIsNew | KeyAt | KeyHasRecords


def key_version(condition: KeyCondition) -> int:
    """The version a partition's key check compares (partition_log.append's key_condition):
    the latest record's offset, NO_RECORDS (-1) for none, ANY_RECORDS for any."""
    if isinstance(condition, KeyAt):
        return condition.offset
    if isinstance(condition, KeyIsNew):
        return NO_RECORDS
    if isinstance(condition, KeyHasRecords):
        return ANY_RECORDS
    raise TypeError(f"not a key condition: {condition!r}")
