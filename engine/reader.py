"""Lock-free reads over a LogView: fetch slices, decoded records, time lookups.

Every function takes a view (an immutable snapshot of a partition) and reads only below the
view's high watermark, so it never waits for the writer and never sees a partial batch. They
block on pread (page cache, normally) and belong in a worker thread for large reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CorruptDataError, OffsetOutOfRangeError
from .fileutil import FileHandle, pread_exact, read_if_cached
from .format import CONTROL_BIT, HEADER_SIZE, MIN_BATCH_LENGTH, NO_TIMESTAMP, compute_crc, parse_header
from .records import Record, batch_records_bytes, decode_block
from .segment import LogSegment
from .segments import LogView


CACHED_CHECK_BYTES = 64 * 1024  # smaller reads are not worth the RWF_NOWAIT probe


@dataclass(frozen=True, slots=True)
class FetchSlice:
    """Whole batches [position, end) of one segment, ready to be read or sent as they are."""

    segment: LogSegment
    handle: FileHandle  # holds the .log open, even if the segment is deleted meanwhile
    position: int
    end: int
    first_batch_offset: int  # base offset of the first batch (may be below the fetch offset)
    next_offset: int  # where the next fetch should start
    high_watermark: int
    log_start_offset: int

    @property
    def size(self) -> int:
        return self.end - self.position

    def read(self) -> bytes:
        return pread_exact(self.handle.fd, self.end - self.position, self.position)

    def read_if_cached(self) -> memoryview | bytes | None:
        """The bytes if the page cache holds all of them, read without blocking
        (preadv2 RWF_NOWAIT); None when any would need the disk (or the kernel or file system
        cannot say), so the caller reads in a worker thread instead."""
        return read_if_cached(self.handle.fd, self.end - self.position, self.position)


@dataclass(frozen=True, slots=True)
class RecordsResult:
    records: list[Record]
    next_offset: int
    high_watermark: int
    log_start_offset: int
    bytes_read: int


def check_offset(view: LogView, offset: int) -> LogView:
    """Raise OffsetOutOfRangeError unless log_start_offset <= offset <= high_watermark."""
    if offset < view.log_start_offset or offset > view.high_watermark:
        raise OffsetOutOfRangeError(offset, view.log_start_offset, view.high_watermark)
    return view


def fetch_slice(view: LogView, offset: int, max_bytes: int) -> FetchSlice | None:
    """Whole batches starting with the one that holds `offset` (or the first offset after it,
    across compaction gaps), about `max_bytes` long and never less than one batch. None when
    `offset` is the high watermark. Reads batch headers only."""
    check_offset(view, offset)
    if offset == view.high_watermark:
        return None
    index = view.segment_index_for(offset)
    while index < len(view.segments):
        segment = view.segments[index]
        end_position = view.end_position(index)
        header = segment.find_batch(offset, end_position)
        if header is not None:
            end, next_offset = segment.batch_end_within(header, header.position + max(max_bytes, 1), end_position)
            return FetchSlice(
                segment, segment.open_handle(), header.position, end, header.base_offset, next_offset,
                view.high_watermark, view.log_start_offset,
            )
        index += 1
    return None


class NotCached(Exception):
    """Raised by read_records(cached_only=True) when a read would wait for the disk."""


def read_records(
    view: LogView, offset: int, max_records: int, max_bytes: int, *, cached_only: bool = False
) -> RecordsResult:
    """Decode up to `max_records` records with offset >= `offset` from about `max_bytes` of
    batches (at least one batch). Control batches (transaction markers) are skipped, as Kafka
    consumers skip them. next_offset is where the following read should start (the high
    watermark when only a gap in the offsets is left before it).

    Every batch's CRC-32C is checked before it is decoded. A damaged batch ends the read: the
    records before it are returned (next_offset then points at it), and a read that meets it
    first raises CorruptDataError naming its offsets.

    Compressed batches are inflated one at a time (each up to compression.MAX_RECORDS_BYTES),
    and `max_bytes` also bounds what they inflate to: once the records blocks decoded so far
    reach it, the read ends after the batch that got there (a small compressed batch can
    inflate a thousandfold, so a read of a few such batches would otherwise hold gigabytes).
    """
    records: list[Record] = []
    next_offset = offset
    bytes_read = 0
    inflated = 0
    while len(records) < max_records and next_offset < view.high_watermark:
        budget = max_bytes - bytes_read
        if bytes_read and budget <= 0 or records and inflated >= max_bytes:
            break
        slice_ = fetch_slice(view, next_offset, max(budget, 1))
        if slice_ is None:
            next_offset = view.high_watermark  # nothing below it: a gap (damage, compaction) ends the log
            break
        if bytes_read and slice_.size > budget:
            break  # only the first batch of a read may exceed max_bytes
        if cached_only and slice_.size > CACHED_CHECK_BYTES:
            data = slice_.read_if_cached()
            if data is None:
                raise NotCached
        else:
            data = slice_.read()
        bytes_read += len(data)
        position = 0
        full = False
        while position < len(data) and not full:
            header = parse_header(data, position, slice_.position + position)
            damage = _damage(data, position, header)
            if damage is not None:
                if records:
                    return RecordsResult(records, records[-1].offset + 1, view.high_watermark, view.log_start_offset, bytes_read)
                raise CorruptDataError(slice_.segment.log_path, header.position, header.base_offset, header.last_offset, damage)
            position += header.size
            if header.attributes & CONTROL_BIT:
                continue
            block = batch_records_bytes(data, header, position - header.size)
            inflated += len(block)
            try:
                decoded = decode_block(block, header)
            finally:
                if isinstance(block, memoryview):
                    block.release()
            del block
            for record in decoded:
                if record.offset < offset:
                    continue
                if len(records) >= max_records:
                    next_offset = record.offset
                    full = True
                    break
                records.append(record)
            if not full and inflated >= max_bytes and records and position < len(data):
                next_offset = header.next_offset  # the batches after it wait for the next read
                full = True
        if full:
            break
        next_offset = slice_.next_offset
    return RecordsResult(records, next_offset, view.high_watermark, view.log_start_offset, bytes_read)


def _damage(data: bytes | memoryview, position: int, header) -> str | None:  # noqa: ANN001 -- a BatchHeader
    """Why the stored batch at `position` of `data` cannot be decoded; None if it is whole."""
    if header.batch_length < MIN_BATCH_LENGTH or position + header.size > len(data):
        return f"batch length {header.batch_length} does not fit the {len(data) - position} bytes read"
    actual = compute_crc(data, position, header.size)
    if actual != header.crc:
        return f"CRC-32C mismatch: stored {header.crc:#010x}, computed {actual:#010x}"
    return None


def offset_for_timestamp(view: LogView, timestamp: int) -> tuple[int, int] | None:
    """Kafka's ListOffsets by time: (offset, timestamp) of the earliest record at or above the
    log start offset whose timestamp >= `timestamp`; None if there is none.

    The first segment whose largest timestamp reaches `timestamp` holds the answer (every
    earlier segment has only smaller timestamps); inside it the time index gives a batch to
    start from, and a scan of headers, then of one batch's records, finds the record.
    """
    for index, segment in enumerate(view.segments):
        end_position = view.end_position(index)
        if end_position == 0:
            continue
        if index == len(view.segments) - 1 or segment.max_timestamp >= timestamp:
            found = segment.find_timestamp(timestamp, view.log_start_offset, end_position)
            if found is not None:
                return found
    return None


def max_timestamp_offset(view: LogView) -> tuple[int, int] | None:
    """Kafka's ListOffsets MAX_TIMESTAMP: (offset, timestamp) of the first record carrying the
    largest timestamp in the log; None for an empty log."""
    best: tuple[int, int] | None = None  # (timestamp, segment index)
    for index, segment in enumerate(view.segments):
        if view.end_position(index) == 0:
            continue
        ts = _visible_max_timestamp(view, index)
        if ts != NO_TIMESTAMP and (best is None or ts > best[0]):
            best = (ts, index)
    if best is None:
        return None
    ts, index = best
    return view.segments[index].find_timestamp(ts, view.log_start_offset, view.end_position(index))


def _visible_max_timestamp(view: LogView, index: int) -> int:
    """Largest timestamp readers of `view` can see in segment `index`."""
    segment = view.segments[index]
    if index < len(view.segments) - 1:
        return segment.max_timestamp
    # The active segment may already hold staged, unpublished batches: start from the last
    # time index entry below the high watermark and scan the headers after it.
    end = view.end_position(index)
    time_index = segment.time_index
    best, from_offset = NO_TIMESTAMP, segment.base_offset
    for i in range(time_index.entries - 1, -1, -1):
        ts, entry_offset = time_index.entry(i)
        if entry_offset < view.high_watermark:
            best, from_offset = ts, entry_offset
            break
    _, position = segment.offset_index.lookup(from_offset)
    if position >= end:
        position = 0
    for header in segment.headers(position, end):
        if header.max_timestamp > best:
            best = header.max_timestamp
    return best


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    base_offset: int
    last_offset: int  # base_offset - 1 when empty
    size_bytes: int
    first_timestamp: int
    max_timestamp: int
    index_entries: int
    time_index_entries: int
    active: bool


def segment_infos(view: LogView) -> list[SegmentInfo]:
    out = []
    last = len(view.segments) - 1
    for index, segment in enumerate(view.segments):
        end = view.end_position(index)
        if index == last:
            next_offset = view.high_watermark
            max_ts = _visible_max_timestamp(view, index) if end else NO_TIMESTAMP
        else:
            next_offset = segment.next_offset
            max_ts = segment.max_timestamp
        first_ts = NO_TIMESTAMP
        if end >= HEADER_SIZE:
            first_ts = parse_header(segment.read_bytes(0, HEADER_SIZE), 0).max_timestamp
        out.append(
            SegmentInfo(
                segment.base_offset, next_offset - 1, end, first_ts, max_ts,
                segment.offset_index.entries, segment.time_index.entries, index == last,
            )
        )
    return out
