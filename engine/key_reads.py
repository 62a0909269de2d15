"""Reads of one key's records through the key index (key_index.py): its history in offset
order, paged, and its latest offset (what a conditional per-key append compares).

The index points at offsets by key hash; each record it points at is read and its key bytes
compared, so two keys sharing a hash never see each other's records, and an offset whose record
compaction has removed since (a tombstone past delete.retention.ms) is skipped. A key's
records are its partition's (Kafka's murmur2 placement, decided by the caller).

Blocking (page cache or disk reads, numpy searches): callers run these in a worker thread, or
in the partition's commit thread for conditions.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CorruptDataError
from .format import CONTROL_BIT, HEADER_SIZE, BatchHeader, parse_header
from .key_index import KeyIndex
from .reader import _damage, fetch_slice
from .records import Record, batch_records_bytes, decode_one
from .segments import LogView

NO_RECORDS = -1
ANY_RECORDS = -2  # a condition's expected offset: the key has records, whichever is its latest


def condition_holds(expected: int, current: int) -> bool:
    """A per-key condition: the key's latest record is at `expected` (NO_RECORDS: it has none;
    ANY_RECORDS: it has some), given it is at `current`."""
    return current >= 0 if expected == ANY_RECORDS else current == expected


@dataclass(slots=True)
class KeyRecords:
    """A page of one key's records: `records` in offset order; `latest`, the offset of the key's
    latest record in the view (NO_RECORDS when it has none); `next_after`, what to pass as
    after_offset for the next page; `more`, whether the page stopped at max_records."""

    records: list[Record]
    latest: int
    next_after: int
    more: bool
    high_watermark: int
    log_start_offset: int


class BatchCache:
    """The batches one lookup read: a key's consecutive records often share one. Each is read
    at the position its key index entry names, its CRC-32C checked once, and only the records
    asked for are decoded."""

    __slots__ = ("batches",)

    READ_AHEAD = 4096  # a first read of a batch takes this much (most batches of events fit)

    def __init__(self) -> None:
        self.batches: dict[tuple[int, int], tuple[BatchHeader, bytes | None]] = {}  # (segment, position) -> header, records block

    def record_at(self, view: LogView, offset: int, position: int) -> Record | None:
        """The record at exactly `offset`, whose batch starts at `position` of its segment; None
        when there is none (compaction removed it, or a control batch holds the offset)."""
        index = view.segment_index_for(offset)
        segment = view.segments[index]
        key = (id(segment), position)
        found = self.batches.get(key)
        if found is None:
            found = self._read(view, index, offset, position)
            if found is None:
                return self._searched(view, offset)  # the entry is not this segment's: look it up
            if len(self.batches) >= 64:
                self.batches.clear()
            self.batches[key] = found
        header, block = found
        if block is None or not header.base_offset <= offset <= header.last_offset:
            return None
        return decode_one(block, header, offset - header.base_offset)

    @classmethod
    def _read(cls, view: LogView, index: int, offset: int, position: int) -> tuple[BatchHeader, bytes | None] | None:
        segment = view.segments[index]
        end = view.end_position(index)
        if position + HEADER_SIZE > end:
            return None
        data = segment.read_bytes(position, min(cls.READ_AHEAD, end - position))
        header = parse_header(data, 0, position)
        if not header.base_offset <= offset <= header.last_offset or position + header.size > end:
            return None
        if header.size > len(data):
            data = segment.read_bytes(position, header.size)
        damage = _damage(data, 0, header)
        if damage is not None:
            raise CorruptDataError(segment.log_path, header.position, header.base_offset, header.last_offset, damage)
        if header.attributes & CONTROL_BIT:
            return header, None
        block = batch_records_bytes(data, header, 0)
        return header, bytes(block)

    def _searched(self, view: LogView, offset: int) -> Record | None:
        """The record at `offset` found through the offset index (an entry whose position is
        not in this view's segment)."""
        slice_ = fetch_slice(view, offset, 1)
        index = view.segment_index_for(offset)
        if slice_ is None or slice_.segment is not view.segments[index] or slice_.first_batch_offset > offset:
            return None
        found = self._read(view, index, offset, slice_.position)
        if found is None:
            return None
        self.batches[(id(slice_.segment), slice_.position)] = found
        header, block = found
        return None if block is None else decode_one(block, header, offset - header.base_offset)


def latest_of(view: LogView, index: KeyIndex, key: bytes, h: int, cache: BatchCache | None = None) -> int:
    """The offset of `key`'s latest record in the view; NO_RECORDS when it has none."""
    cache = cache or BatchCache()
    for offset, position in index.newest_first(view, h):
        record = cache.record_at(view, offset, position)
        if record is not None and record.key == key:
            return offset
    return NO_RECORDS


def read_key(
    view: LogView, index: KeyIndex, key: bytes, h: int, after_offset: int, max_records: int, max_bytes: int
) -> KeyRecords:
    """`key`'s records above `after_offset`, at most `max_records` and about `max_bytes` of
    keys and values (at least one record), in offset order."""
    cache = BatchCache()
    records: list[Record] = []
    cursor = after_offset
    size = 0
    more = False
    while True:
        want = max_records - len(records)
        candidates = index.entries_after(view, h, cursor, want + 1)
        if not candidates:
            break
        for offset, position in candidates:
            record = cache.record_at(view, offset, position)
            cursor = offset
            if record is None or record.key != key:
                continue
            if len(records) >= max_records or (records and size >= max_bytes):
                more = True
                break
            records.append(record)
            size += len(record.key or b"") + len(record.value or b"")
        if more or len(candidates) <= want:
            break
    if more:
        next_after = records[-1].offset
    elif records:
        next_after = max(records[-1].offset, view.high_watermark - 1)
    else:
        next_after = max(after_offset, view.high_watermark - 1)
    latest = records[-1].offset if records and not more else latest_of(view, index, key, h, cache)
    return KeyRecords(records, latest, next_after, more, view.high_watermark, view.log_start_offset)
