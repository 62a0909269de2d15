"""Opening a partition directory: finish or undo interrupted file changes, then load segments.

Steps, in order (Kafka's LogLoader does the same):

1. Delete every *.deleted file (deletion had been decided; only unlinking was left).
2. Collect *.cleaned and *.swap files (a new segment's .keyindex among them: the cleaner writes
   one with each segment it makes, and it is renamed with the segment's files, last). A .swap
   whose base offset is at or above the lowest .cleaned base belongs to a replacement that had
   not finished renaming (new segments are renamed .cleaned -> .swap highest first): delete it.
   Then delete every .cleaned file.
3. For the remaining .swap segments (a replacement that had finished step 1 of
   replace_segments): delete the live segment files (and key indexes) whose base offset lies
   in [lowest swap base, highest swap next offset), then rename the .swap files to live names.
   So a key index is the old segment's or the new one's, never another's.
4. Delete index files without a .log (key indexes too, and half-written ones: key_index.py).
5. Open every segment. After an unclean shutdown (or a clean one whose marker does not cover
   the partition, or whose last segment is not as the marker says: _tail_is_clean), every
   segment from the one holding the recovery point on is scanned (LogSegment.recover): each
   batch's framing, CRC and offsets checked, damaged bytes dropped where valid batches follow
   them (the segment rewritten without them, repair.py) and a torn tail truncated; later
   segments are kept; indexes rebuilt; the key index file of a segment that lost bytes is
   removed (its positions may be wrong; key_index.py). After a clean shutdown nothing is
   scanned and indexes are mapped on first use. Either way a segment whose index files are
   missing or have impossible sizes is rebuilt.
6. If segments existed and the log end is below an offset that may have been acknowledged (the
   recovery point, or what a dropped batch's header claims), start an empty active segment at
   that offset: a gap, never a reused offset.
7. If no segment is left, create an empty one at the log start offset.
8. The last segment becomes the active one (indexes preallocated again, .log opened for
   writing). A failure here or above raises StorageError: the log manager takes the partition
   offline.
9. The offsets dropped in step 5 (between the valid batches around damaged bytes, up to the
   next segment at a closed segment's end, or what a dropped tail's header claims) and the
   gap of step 6 are merged into dropped-offsets-checkpoint (dropped.py), which reads report
   ranges from; ranges wholly below the log start offset leave it. A damaged file there is
   rebuilt with a warning; a failed write is logged, never a reason to stop.

Blocking; the log manager runs it in worker threads, before the partition takes any request.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import dropped, filenames
from .config import LogConfig
from .errors import CorruptIndexError, StorageError
from .fileutil import fsync_dir, io_errors, storage_error
from .key_index import KEY_INDEX_SUFFIX, remove_key_index
from .log_dirs import CleanTail
from .repair import DAMAGED_SUFFIX, DamagedRange
from .segment import LogSegment

logger = logging.getLogger("eventlog.recovery")


@dataclass
class LoadStats:
    segments: int = 0
    scanned_segments: int = 0
    scanned_bytes: int = 0
    truncated_bytes: int = 0
    deleted_segments: int = 0
    rebuilt_indexes: int = 0
    corrupt_batches: int = 0  # damaged batches (or bytes that were no batch) dropped, not torn tails
    offset_gap: tuple[int, int] | None = None  # [from, to): offsets left unused to never reuse one
    dropped_offsets: tuple[tuple[int, int], ...] = ()  # what this recovery dropped (dropped.py)
    resolved_files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class LoadedLog:
    segments: list[LogSegment]
    next_offset: int
    log_start_offset: int
    recovery_point: int
    stats: LoadStats
    # every offset range recovery ever dropped (this time and before), at or above the log
    # start offset: dropped-offsets-checkpoint (dropped.py)
    dropped_offsets: tuple[tuple[int, int], ...] = ()
    # the directory's names as recovery found them after resolving transient files (before
    # it created any segment): what the caller's own look-ups may use instead of listing it
    names: tuple[str, ...] = ()


def resolve_transient_files(
    directory: Path, config: LogConfig, stats: LoadStats | None = None
) -> list[str]:
    """Steps 1-4 above; returns the names in `directory` after them. The directory is listed
    once when there is nothing to resolve (the usual case: a start with 25,000 partitions
    listed each three times), again only after a step changed it."""
    stats = stats if stats is not None else LoadStats()
    listed = os.listdir(directory)
    names = sorted(listed)
    cleaned: list[tuple[int, str]] = []
    swaps: list[tuple[int, str]] = []
    for name in names:
        parsed = _parse(name)
        if parsed is None:
            if name.endswith(filenames.DELETED_SUFFIX):
                _unlink(directory / name, stats)
            continue
        base, _kind, suffix = parsed
        if suffix == filenames.DELETED_SUFFIX:
            _unlink(directory / name, stats)
        elif suffix == filenames.CLEANED_SUFFIX:
            cleaned.append((base, name))
        elif suffix == filenames.SWAP_SUFFIX:
            swaps.append((base, name))
    min_cleaned = min((b for b, _ in cleaned), default=None)
    valid_swaps = []
    for base, name in swaps:
        if min_cleaned is not None and base >= min_cleaned:
            _unlink(directory / name, stats)
        else:
            valid_swaps.append((base, name))
    for _base, name in cleaned:
        _unlink(directory / name, stats)

    swap_bases = sorted({b for b, n in valid_swaps if n.endswith(filenames.LOG_SUFFIX + filenames.SWAP_SUFFIX)})
    if swap_bases:
        low = swap_bases[0]
        # the end of the range the swapped segments cover: the last one's next offset
        high = _scan_next_offset(directory, swap_bases[-1])
        for name in os.listdir(directory):
            parsed = _parse(name)
            if parsed and parsed[2] == "" and low <= parsed[0] < max(high, swap_bases[-1] + 1):
                _unlink(directory / name, stats)
    for _base, name in valid_swaps:
        target = name[: -len(filenames.SWAP_SUFFIX)]
        os.replace(directory / name, directory / target)
        stats.resolved_files.append(f"{name} -> {target}")
    # orphaned index files
    names = set(os.listdir(directory)) if stats.resolved_files else set(listed)
    for name in names:
        parsed = filenames.parse_segment_file(name)
        if parsed and parsed[2] == "" and parsed[1] != filenames.LOG_SUFFIX:
            if filenames.base_name(parsed[0]) + filenames.LOG_SUFFIX not in names:
                _unlink(directory / name, stats)
        elif name.endswith(KEY_INDEX_SUFFIX + ".tmp") or (
            name.endswith(KEY_INDEX_SUFFIX) and name[: -len(KEY_INDEX_SUFFIX)] + filenames.LOG_SUFFIX not in names
        ):
            _unlink(directory / name, stats)  # a key index half written, or whose segment is gone
    if stats.resolved_files:
        fsync_dir(directory)
        return os.listdir(directory)
    return listed


def load_log(
    directory: Path,
    config: LogConfig,
    *,
    clean_shutdown: bool,
    recovery_point: int,
    log_start_offset: int,
    now_ms: int,
    clean_tail: CleanTail | None = None,
    exists: bool = False,
) -> LoadedLog:
    """Steps 1-8 above; returns the segments with the last one open for appends.

    `clean_shutdown`: the clean-shutdown marker covers this partition; `clean_tail`: what it
    says of the partition's files (None: an old marker that does not say); `exists`: the
    caller has just seen the directory (no mkdir). Raises StorageError when the files cannot
    be read or changed as recovery must.
    """
    stats = LoadStats()
    if not exists:
        directory.mkdir(parents=True, exist_ok=True)
    names = resolve_transient_files(directory, config, stats)
    recorded = dropped.load(directory, names)  # before this scan keeps anything aside (step 9)
    bases = sorted(
        parsed[0]
        for name in names
        if (parsed := filenames.parse_segment_file(name)) and parsed[1] == filenames.LOG_SUFFIX and parsed[2] == ""
    )
    segments: list[LogSegment] = []
    needs_rebuild: set[int] = set()
    for base in bases:
        try:
            segment = LogSegment.open_existing(directory, base, max_index_bytes=config.segment_index_bytes)
        except CorruptIndexError as exc:
            logger.warning("%s: %s; rebuilding its indexes", directory.name, exc)
            for path in filenames.segment_files(directory, base)[1:]:
                path.write_bytes(b"")  # recover() below rebuilds both
            segment = LogSegment.open_existing(directory, base, max_index_bytes=config.segment_index_bytes)
            needs_rebuild.add(base)
        segment.index_interval_bytes = config.index_interval_bytes
        segments.append(segment)

    # which segments to scan: after a clean shutdown none, unless the tail is not what it was
    clean = clean_shutdown and (not segments or _tail_is_clean(directory, segments[-1], clean_tail))
    first_unflushed = len(segments)
    if not clean and segments:
        first_unflushed = 0
        for i, segment in enumerate(segments):
            if segment.base_offset <= recovery_point:
                first_unflushed = i
    acknowledged_end = 0  # the log end must not fall below this (step 6)
    lost: list[tuple[int, int]] = []  # offset ranges dropped (step 9)
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if i >= first_unflushed or segment.base_offset in needs_rebuild:
            next_base = None if last else segments[i + 1].base_offset
            result = segment.recover(
                config.index_interval_bytes, active=last, max_index_bytes=config.segment_index_bytes,
                next_base_offset=next_base,
            )
            stats.scanned_segments += 1
            stats.scanned_bytes += result.valid_bytes + result.truncated_bytes
            if segment.base_offset in needs_rebuild:
                stats.rebuilt_indexes += 1
            stats.truncated_bytes += result.truncated_bytes
            if result.damaged:  # bytes cut out or off: its key index's positions may be wrong
                remove_key_index(directory, segment.base_offset)
            for damaged in result.damaged:
                _report_damage(directory, segment, damaged, last, stats)
                if damaged.last_offset is not None:
                    acknowledged_end = max(acknowledged_end, damaged.last_offset + 1)
                offsets = damaged.lost_offsets
                if damaged.tail and next_base is not None and damaged.floor is not None and next_base > damaged.floor:
                    offsets = (damaged.floor, next_base - 1)  # a closed segment's end: up to the next one
                if offsets is not None:
                    lost.append(offsets)

    if not segments:
        base = max(log_start_offset, 0)
        segments.append(LogSegment.create(directory, base, max_index_bytes=config.segment_index_bytes, now_ms=now_ms))
        fsync_dir(directory)
    else:
        active = segments[-1]
        if not active.offset_index.appendable:
            active.open_for_append()
        # Offsets below the recovery point were fsynced, so may have been acknowledged; what
        # an old partition lost below it (damage, not a torn write) becomes a gap.
        acknowledged_end = max(acknowledged_end, recovery_point)
        if acknowledged_end > max(active.next_offset, active.base_offset):
            _leave_gap(directory, config, segments, acknowledged_end, now_ms, stats)

    _check_writable(segments[-1])
    next_offset = segments[-1].next_offset
    # an empty active segment after the others (a roll that got no data): its base is the end
    next_offset = max(next_offset, segments[-1].base_offset)
    stats.segments = len(segments)
    start = max(log_start_offset, segments[0].base_offset)
    if start > next_offset:
        logger.warning("%s: log start offset %d is past the log end %d; clamping", directory.name, start, next_offset)
        start = next_offset
    if stats.offset_gap is not None:
        lost.append((stats.offset_gap[0], stats.offset_gap[1] - 1))
    dropped_offsets = _record_dropped(directory, recorded, lost, start, stats)
    # Everything below next_offset is now on disk and verified: either flushed before the
    # shutdown, or scanned and fsynced by recover().
    return LoadedLog(
        segments, next_offset, start, next_offset, stats, dropped_offsets, tuple(names)
    )


def _record_dropped(
    directory: Path, before: tuple[dropped.Ranges, bool], lost: list[tuple[int, int]], start: int, stats: LoadStats,
) -> dropped.Ranges:
    """Step 9: the offset ranges recovery dropped, this time merged with those recorded before
    (`before`: dropped.load's answer), less those wholly below the log start offset; written to
    dropped-offsets-checkpoint if that changes it. A failed write is logged and the partition
    serves on (its reads still say so until the next start)."""
    stats.dropped_offsets = dropped.merge(lost)
    recorded, rewrite = before
    ranges = tuple(r for r in dropped.merge(recorded, lost) if r[1] >= start)
    if ranges != recorded or rewrite:
        try:
            dropped.write(directory, ranges)
        except StorageError as exc:
            logger.warning("%s: the offsets recovery dropped (%s) were not recorded: %s", directory.name, dropped.describe(ranges), exc)
        else:
            if stats.dropped_offsets:
                logger.warning("%s: offsets recovery dropped: %s (%s)", directory.name, dropped.describe(stats.dropped_offsets), dropped.DROPPED_OFFSETS)
    return ranges


def _tail_is_clean(directory: Path, active: LogSegment, tail: CleanTail | None) -> bool:
    """After a clean shutdown: whether the last segment is as the marker says (base offset,
    size, log end) and its tail after the last index entry is a run of batch headers. If not,
    the partition is recovered as after a crash (bytes appended or cut since, a torn tail)."""
    if tail is not None and (tail.base_offset, tail.size) != (active.base_offset, active.size):
        logger.warning(
            "%s: %s is %d bytes, the clean-shutdown marker says segment %d of %d bytes: recovering as after a crash",
            directory.name, active.name, active.size, tail.base_offset, tail.size,
        )
        return False
    try:
        end = active.next_offset
    except StorageError as exc:
        logger.warning("%s: the tail of %s is damaged (%s): recovering as after a crash", directory.name, active.name, exc.reason)
        return False
    if tail is not None and end != tail.log_end_offset:
        logger.warning(
            "%s: %s ends at offset %d, the clean-shutdown marker says %d: recovering as after a crash",
            directory.name, active.name, end, tail.log_end_offset,
        )
        return False
    return True


def _report_damage(directory: Path, segment: LogSegment, damaged: DamagedRange, last: bool, stats: LoadStats) -> None:
    """Log what recovery dropped; count it unless it was the torn tail a crash leaves."""
    where = f"{directory.name}/{segment.name}"
    if damaged.tail and last and not damaged.framed:
        stats.errors.append(f"{segment.name}: {damaged.reason} at byte {damaged.position}; truncated {damaged.size} bytes")
        logger.warning("%s: truncated %d bytes at byte %d (%s)", where, damaged.size, damaged.position, damaged.reason)
        return
    stats.corrupt_batches += 1
    aside = f"; kept in {segment.name}.{damaged.position}{DAMAGED_SUFFIX}" if damaged.keep_aside else ""
    stats.errors.append(f"{segment.name}: {damaged.reason} at byte {damaged.position}; dropped {damaged.size} bytes ({damaged.offsets})")
    logger.warning(
        "%s: dropped %d damaged bytes at byte %d (%s; %s)%s",
        where, damaged.size, damaged.position, damaged.reason, damaged.offsets, aside,
    )


def _leave_gap(
    directory: Path, config: LogConfig, segments: list[LogSegment], end: int, now_ms: int, stats: LoadStats
) -> None:
    """Make `end` the log end: a new, empty active segment based there (an empty active
    segment below it is replaced). The offsets in between are a gap; none is ever reused."""
    active = segments[-1]
    was = max(active.next_offset, active.base_offset)
    logger.warning(
        "%s: the log ends at offset %d after recovery, but offsets up to %d may have been acknowledged "
        "(the recovery point or a damaged batch's header says so); the next append gets offset %d",
        directory.name, was, end - 1, end,
    )
    if active.size == 0:
        active.close()
        active.delete_files()
        segments.pop()
    else:
        active.close_for_append()
    segments.append(LogSegment.create(directory, end, max_index_bytes=config.segment_index_bytes, now_ms=now_ms))
    fsync_dir(directory)
    stats.offset_gap = (was, end)


def _check_writable(active: LogSegment) -> None:
    """Open the active .log for writing once now: a file the process may not write (chattr +i,
    a read-only mount) fails the load of its partition at start-up, not its first append."""
    with io_errors(active.log_path, "cannot open segment for appends"):
        os.close(os.open(active.log_path, os.O_RDWR))


def _parse(name: str) -> tuple[int, str, str] | None:
    """A segment file's (base, kind, suffix), or a key index's: the cleaner writes one with each
    segment it makes, and it goes through .cleaned and .swap with the segment's other files."""
    parsed = filenames.parse_segment_file(name)
    if parsed is None and (key_index := filenames.parse_key_index_file(name)) is not None:
        return key_index[0], KEY_INDEX_SUFFIX, key_index[1]
    return parsed


def _scan_next_offset(directory: Path, base: int) -> int:
    from .scan import BatchScanner

    path = filenames.log_file(directory, base, filenames.SWAP_SUFFIX)
    fd = os.open(path, os.O_RDONLY)
    try:
        next_offset = base
        for header, _ in BatchScanner(fd, with_data=False):
            next_offset = header.next_offset
        return next_offset
    finally:
        os.close(fd)


def _unlink(path: Path, stats: LoadStats) -> None:
    try:
        path.unlink()
        stats.resolved_files.append(f"deleted {path.name}")
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise storage_error(exc, path, "cannot delete") from exc
