"""One compaction pass over one partition: Kafka's log cleaner, as a pure function over files.

`clean(request)` reads closed segments and writes new ones; it touches nothing the live log
uses, so it runs in a separate process (see compactor.py) while producers and readers go on.
The caller swaps the new segments in (PartitionLog.replace_segments) and records the new first
dirty offset in cleaner-offset-checkpoint.

The pass, after Kafka's LogCleaner:

1. Map. Walk the dirty range — from the first dirty offset up to the first uncleanable offset
   (the active segment, or the first segment younger than min.compaction.lag.ms) — putting each
   keyed record's key digest and offset in a fixed-size OffsetMap. When the map is full, stop at
   a batch boundary: the pass cleans up to there (`end_offset`) and the next pass goes on.
2. Group. The segments from the log's first up to the one holding end_offset - 1 are grouped,
   consecutive, so that a group's bytes fit in segment.bytes and its offsets in an int32 delta.
3. Recopy each group into one `<base>.log.cleaned` segment (with indexes, and its key index,
   `<base>.keyindex.cleaned`, for a topic with eventlog.key.index on), keeping a record when
   no later record of its key is in the map, and dropping tombstones whose batch's delete
   horizon has passed. Offsets are kept; gaps are normal. A batch kept whole is copied byte for
   byte; the survivors of thinned batches are re-encoded into batches of up to 1 MiB with their
   original codec. A batch holding tombstones is stamped with a delete horizon (now +
   delete.retention.ms, Kafka's KIP-534 layout: the horizon in baseTimestamp, attribute bit 6)
   the first time it is cleaned; the tombstones go in the first pass after the horizon.
4. Each new segment's last batch claims the offsets up to the group's end (its lastOffsetDelta
   is raised, as Kafka's cleaner does for producer state), so a new segment covers exactly the
   offsets of the segments it replaces. Start-up recovery relies on that to finish a swap.
   A group whose every record is dropped joins its neighbour; if all are dropped, the result
   says so and the caller deletes the old segments instead.

Records without a key (only possible in logs written before the topic became compacted) are
kept. Control batches are copied as they are.

I/O rate limit (Kafka's log.cleaner.io.max.bytes.per.second, `request.io_max_bytes_per_s`):
every batch read by the map and by the recopy, and every batch written, is reported to one
Throttler (throttler.py), which sleeps when their sum runs faster than the limit.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine import filenames
from engine.faults import crash_point
from engine.format import (
    COMPRESSION_MASK,
    CONTROL_BIT,
    DELETE_HORIZON_BIT,
    NO_PRODUCER_ID,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    parse_header,
    set_last_offset_delta,
)
from engine.key_index import ActiveKeys
from engine.records import encode_record_tails, frame_batch, split_records
from engine.scan import BatchScanner
from engine.segment import AppendBatch, LogSegment

from .offset_map import OffsetMap, key_digests
from .throttler import Throttler

INT32_MAX = 2**31 - 1
REBUILT_BATCH_BYTES = 1024 * 1024  # target size of a batch re-formed from survivors
CHUNK_RECORDS = 8192  # records decided together (one map lookup)
MIN_MAP_BYTES = 16 * 24  # tests use tiny maps; settings ask for at least 1 MiB


class CleanerError(Exception):
    """A pass that cannot run as configured (e.g. a map too small for one batch)."""


@dataclass(frozen=True, slots=True)
class SegmentRef:
    base_offset: int
    size: int


@dataclass(frozen=True, slots=True)
class CleanRequest:
    directory: str
    segments: tuple[SegmentRef, ...]  # closed segments, the log's first up to the first uncleanable
    end_limit: int  # the first uncleanable offset: base offset of the segment after `segments`
    first_dirty_offset: int
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    max_index_bytes: int
    index_interval_bytes: int
    map_budget_bytes: int
    map_load_factor: float = 0.9
    # recopy the clean segments even with nothing dirty, to drop tombstones whose horizon passed
    sweep: bool = False
    in_worker_process: bool = False  # run by the compactor in a process of its own
    server_pid: int = 0  # that process's parent
    # log.cleaner.io.max.bytes.per.second: bytes read (both phases) + written per second
    io_max_bytes_per_s: float = math.inf
    # eventlog.key.index: write each new segment's .keyindex (engine/key_index.py) with it
    key_index: bool = True


@dataclass(slots=True)
class Group:
    old_bases: list[int]
    new_base: int | None  # None: every record of the group was dropped


@dataclass(slots=True)
class CleanOutcome:
    end_offset: int  # the first offset not cleaned: the next pass's first dirty offset
    groups: list[Group] = field(default_factory=list)
    map_full: bool = False  # stopped early because the map was full
    map_entries: int = 0
    map_budget_bytes: int = 0
    records_read: int = 0
    records_kept: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    bytes_read: int = 0  # bytes of the segments recopied (the map phase reads the dirty part again)
    map_bytes_read: int = 0  # bytes the map phase read
    bytes_written: int = 0
    io_bytes: int = 0  # what the I/O rate limit counted: map_bytes_read + bytes_read + bytes_written
    throttled_seconds: float = 0.0  # time slept to keep to io_max_bytes_per_s
    batches_copied: int = 0
    batches_rebuilt: int = 0
    seconds: float = 0.0
    map_seconds: float = 0.0
    peak_rss_bytes: int = 0
    next_horizon_ms: int | None = None  # the earliest delete horizon of the tombstones kept


# ---------------------------------------------------------------------------------------------
# records


class _Batch:
    """One source batch read during recopying, with its records' fields (records.split_records)."""

    __slots__ = ("header", "keys", "offsets", "raw", "tails", "timestamps", "tombstones")

    def __init__(self, header: BatchHeader, raw: bytes, with_tails: bool) -> None:
        fields = split_records(raw, header, 0, with_tails=with_tails)
        self.header = header
        self.raw = raw
        self.offsets: list[int] = fields.offsets
        self.timestamps: list[int] = fields.timestamps
        self.keys: list[bytes | None] = fields.keys  # type: ignore[assignment]
        self.tombstones: list[bool] = fields.tombstones
        self.tails: list[bytes] = fields.tails or []  # each record from its key length to its end


def parse_batch(header: BatchHeader, raw: bytes, *, with_tails: bool) -> _Batch:
    """The records of one non-control batch (raw = the whole batch's bytes)."""
    return _Batch(header, raw, with_tails)


# ---------------------------------------------------------------------------------------------
# writing a cleaned segment


Keyed = tuple[list[int], list[bytes]]  # a batch's keyed records: their offsets and keys


def keyed_records(offsets: list[int], keys: list[bytes | None]) -> Keyed:
    """The (offsets, keys) of the records that have a key."""
    if None not in keys:
        return list(offsets), keys  # type: ignore[return-value]
    pairs = [(o, k) for o, k in zip(offsets, keys, strict=True) if k is not None]
    return [o for o, _k in pairs], [k for _o, k in pairs]


class _SegmentWriter:
    """Appends batches to one `.cleaned` segment. The last batch is held back so that, once the
    group's end is known, its lastOffsetDelta can be raised to cover the group's offsets.

    With the topic's key index on, each batch's keyed records go into the segment's key index
    as they are written (the cleaner has every key in hand), and finish() writes it as
    `<base>.keyindex.cleaned` beside the segment: the same bytes a rebuild from the segment
    would make (ActiveKeys.add_keys per batch, then freeze), so the first per-key reads after
    the swap use it instead of rebuilding it (engine/key_index.py)."""

    def __init__(self, directory: Path, base_offset: int, request: CleanRequest, throttler: Throttler) -> None:
        self.base_offset = base_offset
        self.request = request
        self.throttler = throttler
        self.segment = LogSegment.create(
            directory, base_offset, max_index_bytes=request.max_index_bytes, now_ms=request.now_ms,
            suffix=filenames.CLEANED_SUFFIX,
        )
        self.keys = ActiveKeys(base_offset) if request.key_index else None
        self.held: bytearray | bytes | None = None
        self.held_keys: Keyed | None = None
        self.bytes_written = 0

    def add(self, batch: bytes | bytearray, keyed: Keyed | None = None) -> None:
        """`keyed`: the batch's keyed records, when the caller has them (None: read here)."""
        if self.held is not None:
            self._stage(self.held, self.held_keys)
        self.held = batch
        self.held_keys = keyed

    def _stage(self, data: bytes | bytearray, keyed: Keyed | None) -> None:
        header = parse_header(data)
        if self.keys is not None:
            if keyed is None and not header.attributes & CONTROL_BIT:
                fields = split_records(bytes(data), header, 0, with_keys=True)
                keyed = keyed_records(fields.offsets, fields.keys)  # type: ignore[arg-type]
            if keyed is not None and keyed[1]:
                self.keys.add_keys(keyed[0], keyed[1], self.segment.size)
        self.segment.stage(
            AppendBatch(data, header.base_offset, header.last_offset, header.max_timestamp, len(data)),
            self.request.index_interval_bytes,
        )
        self.bytes_written += len(data)
        self.throttler.maybe_throttle(len(data))
        if self.segment._staged_bytes >= 4 * 1024 * 1024:
            self.segment.write_staged()
            # written back as it goes: a pass never leaves more than ~4 MiB dirty, which a
            # syncfs of the filesystem (the commits' shared durable point, engine/commits.py)
            # would otherwise have to write before any commit on it is acknowledged
            self.segment.flush()
            crash_point("clean.mid_recopy")

    def finish(self, end_offset: int) -> None:
        """Raise the held batch's last offset to end_offset - 1, write it, fsync all three files."""
        assert self.held is not None
        data = bytearray(self.held)
        header = parse_header(data)
        if header.last_offset < end_offset - 1:
            set_last_offset_delta(data, 0, len(data), end_offset - 1 - header.base_offset)
        self._stage(data, self.held_keys)
        self.held = self.held_keys = None
        segment = self.segment
        segment.close_for_append()
        paths = [segment.log_path, segment._offset_index.path, segment._time_index.path]
        if self.keys is not None:
            # the .cleaned name is itself the temporary one: written in place, then renamed
            # with the segment's files (LogSegment.change_suffix)
            path = filenames.key_index_file(segment.directory, segment.base_offset, segment.suffix)
            path.write_bytes(self.keys.freeze().encode(segment.next_offset, segment.size))
            self.keys = None
            paths.append(path)
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        segment.close()

    def abandon(self) -> None:
        self.segment.close()
        self.segment.delete_files()


class _Rebuilder:
    """Collects survivors of thinned batches and encodes them into new batches."""

    def __init__(self, writer_add, now_ms: int, delete_retention_ms: int, outcome: CleanOutcome) -> None:
        self.add = writer_add
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        self.outcome = outcome
        self.key: tuple | None = None
        self.records: list[tuple[int, int, bytes]] = []  # (offset, timestamp, tail)
        self.keys: list[bytes | None] = []  # each record's key
        self.has_tombstone = False
        self.pending_bytes = 0
        self.horizon: int | None = None
        self.producer: tuple[int, int, int] = (NO_PRODUCER_ID, -1, -1)
        self.override_last: int | None = None
        self.attributes = 0
        self.max_ts_override: int | None = None

    def take(self, batch: _Batch, indices: list[int]) -> None:
        h = batch.header
        codec = h.attributes & COMPRESSION_MASK
        log_append = bool(h.attributes & TIMESTAMP_TYPE_BIT)
        horizon = h.base_timestamp if h.attributes & DELETE_HORIZON_BIT else None
        producer = h.producer_id != NO_PRODUCER_ID
        key = (codec, log_append, h.max_timestamp if log_append else None, horizon, h.attributes & TRANSACTIONAL_BIT)
        if producer or key != self.key or self.pending_bytes >= REBUILT_BATCH_BYTES:
            self.flush()
        self.key = key
        self.attributes = h.attributes & (COMPRESSION_MASK | TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT)
        self.horizon = horizon
        self.max_ts_override = h.max_timestamp if log_append else None
        for i in indices:
            tail = batch.tails[i]
            self.records.append((batch.offsets[i], batch.timestamps[i], tail))
            self.keys.append(batch.keys[i])
            self.pending_bytes += len(tail) + 8
            if batch.tombstones[i]:
                self.has_tombstone = True
        if producer:
            # a producer's batch keeps its identity and its last offset (its sequence numbers)
            self.producer = (h.producer_id, h.producer_epoch, h.base_sequence)
            self.override_last = h.last_offset
            self.flush()

    def flush(self) -> None:
        records = self.records
        if not records:
            self._reset()
            return
        attributes = self.attributes
        base_offset = records[0][0]
        if self.has_tombstone:
            horizon = self.horizon if self.horizon is not None else self.now_ms + self.delete_retention_ms
            base_ts = horizon
            attributes |= DELETE_HORIZON_BIT
            _note_horizon(self.outcome, horizon)
        else:
            base_ts = min(r[1] for r in records)
        max_ts = self.max_ts_override if self.max_ts_override is not None else max(r[1] for r in records)
        last_offset = self.override_last if self.override_last is not None else records[-1][0]
        pid, epoch, seq = self.producer
        self.add(frame_batch(
            encode_record_tails(records, base_offset, base_ts), base_offset=base_offset, attributes=attributes,
            last_offset_delta=last_offset - base_offset, base_timestamp=base_ts, max_timestamp=max_ts,
            records_count=len(records), producer_id=pid, producer_epoch=epoch, base_sequence=seq,
        ), keyed_records([r[0] for r in records], self.keys))
        self.outcome.batches_rebuilt += 1
        self._reset()

    def _reset(self) -> None:
        self.records = []
        self.keys = []
        self.has_tombstone = False
        self.pending_bytes = 0
        self.producer = (NO_PRODUCER_ID, -1, -1)
        self.override_last = None
        self.key = None


# ---------------------------------------------------------------------------------------------
# the pass


def clean(request: CleanRequest) -> CleanOutcome:
    """Run one pass (see the module docstring). Writes `.cleaned` segments in the partition's
    directory; returns which old segments each replaces. On error, removes what it wrote."""
    started = time.perf_counter()
    if request.in_worker_process:
        _die_with_parent(request.server_pid)
        _yield_the_cpu()
    directory = Path(request.directory)
    segments = request.segments
    outcome = CleanOutcome(end_offset=request.first_dirty_offset)
    if not segments or (request.first_dirty_offset >= request.end_limit and not request.sweep):
        return outcome
    budget = max(request.map_budget_bytes, MIN_MAP_BYTES)
    offset_map = OffsetMap(budget, request.map_load_factor)
    outcome.map_budget_bytes = offset_map.budget_bytes
    throttler = Throttler(request.io_max_bytes_per_s)
    _clean(directory, request, offset_map, outcome, throttler, started)
    outcome.io_bytes = throttler.total_bytes
    outcome.throttled_seconds = throttler.slept_s
    outcome.seconds = time.perf_counter() - started
    outcome.peak_rss_bytes = _peak_rss_bytes()
    return outcome


def _clean(
    directory: Path, request: CleanRequest, offset_map: OffsetMap, outcome: CleanOutcome, throttler: Throttler,
    started: float,
) -> None:
    segments = request.segments
    end_offset = _build_map(directory, request, offset_map, outcome, throttler)
    outcome.map_seconds = time.perf_counter() - started
    outcome.end_offset = end_offset
    outcome.map_entries = offset_map.size
    if end_offset <= request.first_dirty_offset and not request.sweep:
        return
    groups = _group_segments(segments, end_offset, request)
    if not groups:
        return
    _recopy(directory, groups, request, offset_map, outcome, end_offset, throttler)
    crash_point("clean.after_cleaned")


def _next_base(segments: tuple[SegmentRef, ...], i: int, end_limit: int) -> int:
    return segments[i + 1].base_offset if i + 1 < len(segments) else end_limit


def _build_map(
    directory: Path, request: CleanRequest, offset_map: OffsetMap, outcome: CleanOutcome, throttler: Throttler
) -> int:
    """Put the dirty range's keys in the map; returns the offset the map covers up to."""
    segments = request.segments
    first_dirty = request.first_dirty_offset
    start = 0
    for i, ref in enumerate(segments):
        if ref.base_offset <= first_dirty:
            start = i
    end_offset = first_dirty
    keys: list[bytes] = []
    offsets: list[int] = []
    chunk_end = first_dirty  # the offset after the last batch in the chunk
    chunk_records = max(1, min(CHUNK_RECORDS, offset_map.max_entries // 4))

    def put_chunk() -> bool:
        nonlocal keys, offsets, end_offset
        if not offset_map.room_for(len(keys)):
            return False
        if keys:
            hi, lo = key_digests(keys)
            offset_map.put(hi, lo, np.asarray(offsets, dtype=np.int64))
        end_offset = chunk_end
        keys, offsets = [], []
        return True

    for i in range(start, len(segments)):
        ref = segments[i]
        path = filenames.log_file(directory, ref.base_offset)
        fd = os.open(path, os.O_RDONLY)
        try:
            scanner = BatchScanner(fd, 0, ref.size, with_data=True, check_crc=True)
            for header, data in scanner:
                outcome.map_bytes_read += header.size
                throttler.maybe_throttle(header.size)
                if header.next_offset <= first_dirty:
                    continue
                if header.base_offset >= request.end_limit:
                    break
                if not header.attributes & CONTROL_BIT:
                    batch = parse_batch(header, bytes(data), with_tails=False)
                    for offset, key in zip(batch.offsets, batch.keys):
                        if key is not None and offset >= first_dirty:
                            keys.append(key)
                            offsets.append(offset)
                chunk_end = header.next_offset
                if len(keys) >= chunk_records and not put_chunk():
                    outcome.map_full = True
                    break
            if scanner.error is not None:
                raise CleanerError(f"{path.name}: {scanner.error} at byte {scanner.error_position}")
        finally:
            os.close(fd)
        if outcome.map_full:
            break
        chunk_end = _next_base(segments, i, request.end_limit)
        if not put_chunk():
            outcome.map_full = True
            break
    if end_offset <= first_dirty and outcome.map_full:
        raise CleanerError(
            f"the offset map ({offset_map.budget_bytes} bytes, {offset_map.max_entries} keys) cannot hold one "
            "chunk of the dirty range: raise log.cleaner.dedupe.buffer.size"
        )
    return end_offset


def _group_segments(segments: tuple[SegmentRef, ...], end_offset: int, request: CleanRequest) -> list[list[int]]:
    """Indexes of `segments` to recopy, in groups that fit one segment each."""
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, ref in enumerate(segments):
        if ref.base_offset >= end_offset:
            break
        span_end = _next_base(segments, i, request.end_limit)
        if current:
            base = segments[current[0]].base_offset
            fits = size + ref.size <= request.segment_bytes and span_end - 1 - base <= INT32_MAX
            if not fits:
                groups.append(current)
                current, size = [], 0
        current.append(i)
        size += ref.size
    if current:
        groups.append(current)
    return groups


def _recopy(
    directory: Path, groups: list[list[int]], request: CleanRequest, offset_map: OffsetMap, outcome: CleanOutcome,
    end_offset: int, throttler: Throttler,
) -> None:
    segments = request.segments
    now = request.now_ms
    written: list[_SegmentWriter] = []
    writer: _SegmentWriter | None = None  # the last group's segment with output, still open
    writer_group: Group | None = None
    writer_end = 0  # the end offset that segment will cover
    carried: list[int] = []  # old bases of leading groups with no output yet

    try:
        for group in groups:
            bases = [segments[i].base_offset for i in group]
            group_end = _next_base(segments, group[-1], request.end_limit)
            new_writer: _SegmentWriter | None = None
            first_base = carried[0] if carried else bases[0]

            def add(
                batch: bytes | bytearray, keyed: Keyed | None = None, first_base: int = first_base
            ) -> None:
                nonlocal new_writer
                if new_writer is None:
                    new_writer = _SegmentWriter(directory, first_base, request, throttler)
                    written.append(new_writer)
                new_writer.add(batch, keyed)

            rebuilder = _Rebuilder(add, now, request.delete_retention_ms, outcome)
            for i in group:
                _recopy_segment(
                    directory, segments[i], request, offset_map, rebuilder, add, outcome, end_offset, throttler
                )
            rebuilder.flush()
            if new_writer is None:
                if writer is not None and writer_group is not None:
                    writer_group.old_bases.extend(bases)  # the previous new segment covers them
                    writer_end = group_end
                else:
                    carried.extend(bases)
                continue
            if writer is not None:
                writer.finish(writer_end)
            writer = new_writer
            writer_group = Group(carried + bases, first_base)
            outcome.groups.append(writer_group)
            carried = []
            writer_end = group_end
        if writer is not None:
            writer.finish(writer_end)
        if carried:
            outcome.groups.append(Group(carried, None))
        outcome.bytes_written = sum(w.bytes_written for w in written)
    except BaseException:
        for w in written:
            try:
                w.abandon()
            except OSError:
                pass
        raise


def _recopy_segment(
    directory: Path,
    ref: SegmentRef,
    request: CleanRequest,
    offset_map: OffsetMap,
    rebuilder: _Rebuilder,
    add,
    outcome: CleanOutcome,
    end_offset: int,
    throttler: Throttler,
) -> None:
    """Recopy one old segment. Batches at or past `end_offset` (the part of the last segment the
    map did not reach) are copied as they are: the next pass cleans them."""
    path = filenames.log_file(directory, ref.base_offset)
    fd = os.open(path, os.O_RDONLY)
    try:
        scanner = BatchScanner(fd, 0, ref.size, with_data=True, check_crc=True)
        chunk: list[_Batch] = []
        chunk_records = 0
        for header, data in scanner:
            outcome.bytes_read += header.size
            throttler.maybe_throttle(header.size)
            raw = bytes(data)
            if header.attributes & CONTROL_BIT or header.base_offset >= end_offset:
                _decide(chunk, offset_map, request.now_ms, rebuilder, add, outcome)
                chunk, chunk_records = [], 0
                rebuilder.flush()
                add(raw)
                outcome.batches_copied += 1
                continue
            batch = parse_batch(header, raw, with_tails=True)
            chunk.append(batch)
            chunk_records += header.records_count
            if chunk_records >= CHUNK_RECORDS:
                _decide(chunk, offset_map, request.now_ms, rebuilder, add, outcome)
                chunk, chunk_records = [], 0
        if scanner.error is not None:
            raise CleanerError(f"{path.name}: {scanner.error} at byte {scanner.error_position}")
        _decide(chunk, offset_map, request.now_ms, rebuilder, add, outcome)
    finally:
        os.close(fd)


def _decide(chunk: list[_Batch], offset_map: OffsetMap, now_ms: int, rebuilder: _Rebuilder, add, outcome: CleanOutcome) -> None:
    """Which records of these batches survive, and write them (whole batches or survivors)."""
    if not chunk:
        return
    keys: list[bytes] = []
    for batch in chunk:
        keys.extend(k for k in batch.keys if k is not None)
    latest = offset_map.get(*key_digests(keys)).tolist() if keys else []
    j = 0
    for batch in chunk:
        h = batch.header
        horizon_passed = bool(h.attributes & DELETE_HORIZON_BIT) and now_ms >= h.base_timestamp
        keep_idx: list[int] = []
        tombstones = False
        for i, key in enumerate(batch.keys):
            offset = batch.offsets[i]
            if key is not None:
                newer = latest[j] > offset
                j += 1
                if newer:
                    continue
            if batch.tombstones[i]:
                if horizon_passed:
                    outcome.tombstones_removed += 1
                    continue
                tombstones = True
            keep_idx.append(i)
        n = len(batch.keys)
        outcome.records_read += n
        outcome.records_kept += len(keep_idx)
        outcome.records_removed += n - len(keep_idx)
        if len(keep_idx) == n and (not tombstones or h.attributes & DELETE_HORIZON_BIT):
            if tombstones:
                _note_horizon(outcome, h.base_timestamp)
            rebuilder.flush()
            add(batch.raw, keyed_records(batch.offsets, batch.keys))
            outcome.batches_copied += 1
        elif keep_idx:
            rebuilder.take(batch, keep_idx)


def _peak_rss_bytes() -> int:
    """This process's own peak resident size (VmHWM): ru_maxrss would carry over the peak of
    the process that spawned a worker."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _note_horizon(outcome: CleanOutcome, horizon: int) -> None:
    if outcome.next_horizon_ms is None or horizon < outcome.next_horizon_ms:
        outcome.next_horizon_ms = horizon


WORKER_NICENESS = 19


def _yield_the_cpu() -> None:
    """Run the pass at the lowest CPU priority (nice 19): on a machine with few cores a pass
    competes with the server's event loop for a core, and producers' latency is what matters;
    the pass still gets every idle cycle."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, WORKER_NICENESS)
    except (OSError, AttributeError):
        pass


def _die_with_parent(server_pid: int) -> None:
    """Ask Linux to SIGKILL this worker process when the server dies, so that a pass never
    outlives the server and writes .cleaned files after the next start's recovery. If the
    server died before the request was made, exit at once."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if server_pid and os.getppid() != server_pid:
        os._exit(1)
