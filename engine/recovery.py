"""Opening a partition directory: finish or undo interrupted file changes, then load segments.

Steps, in order (Kafka's LogLoader does the same):

1. Delete every *.deleted file (deletion had been decided; only unlinking was left).
2. Collect *.cleaned and *.swap files. A .swap whose base offset is at or above the lowest
   .cleaned base belongs to a replacement that had not finished renaming (new segments are
   renamed .cleaned -> .swap highest first): delete it. Then delete every .cleaned file.
3. For the remaining .swap segments (a replacement that had finished step 1 of
   replace_segments): delete the live segment files whose base offset lies in
   [lowest swap base, highest swap next offset), then rename the .swap files to live names.
4. Delete index files without a .log.
5. Open every segment. After an unclean shutdown, every segment from the one holding the
   recovery point on is scanned: each batch's framing and CRC checked, indexes rebuilt, and
   the log truncated at the first invalid batch, after which all later segments are deleted.
   After a clean shutdown nothing is scanned and indexes are mapped on first use. Either way
   a segment whose index files are missing or have impossible sizes is rebuilt.
6. If no segment is left, create an empty one at the log start offset.
7. The last segment becomes the active one (indexes preallocated again).

Blocking; the log manager runs it in worker threads, before the partition takes any request.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import filenames
from .config import LogConfig
from .errors import CorruptIndexError, StorageError
from .fileutil import fsync_dir
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
    resolved_files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class LoadedLog:
    segments: list[LogSegment]
    next_offset: int
    log_start_offset: int
    recovery_point: int
    stats: LoadStats


def resolve_transient_files(directory: Path, config: LogConfig, stats: LoadStats | None = None) -> None:
    """Steps 1-4 above."""
    stats = stats if stats is not None else LoadStats()
    names = sorted(os.listdir(directory))
    cleaned: list[tuple[int, str]] = []
    swaps: list[tuple[int, str]] = []
    for name in names:
        parsed = filenames.parse_segment_file(name)
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
            parsed = filenames.parse_segment_file(name)
            if parsed and parsed[2] == "" and low <= parsed[0] < max(high, swap_bases[-1] + 1):
                _unlink(directory / name, stats)
    for _base, name in valid_swaps:
        target = name[: -len(filenames.SWAP_SUFFIX)]
        os.replace(directory / name, directory / target)
        stats.resolved_files.append(f"{name} -> {target}")
    # orphaned index files
    names = set(os.listdir(directory))
    for name in names:
        parsed = filenames.parse_segment_file(name)
        if parsed and parsed[2] == "" and parsed[1] != filenames.LOG_SUFFIX:
            if filenames.base_name(parsed[0]) + filenames.LOG_SUFFIX not in names:
                _unlink(directory / name, stats)
    if stats.resolved_files:
        fsync_dir(directory)


def load_log(
    directory: Path,
    config: LogConfig,
    *,
    clean_shutdown: bool,
    recovery_point: int,
    log_start_offset: int,
    now_ms: int,
) -> LoadedLog:
    """Steps 1-7 above; returns the segments with the last one open for appends."""
    stats = LoadStats()
    directory.mkdir(parents=True, exist_ok=True)
    resolve_transient_files(directory, config, stats)
    bases = sorted(
        parsed[0]
        for name in os.listdir(directory)
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

    # which segments to scan
    first_unflushed = len(segments)
    if not clean_shutdown and segments:
        first_unflushed = 0
        for i, segment in enumerate(segments):
            if segment.base_offset <= recovery_point:
                first_unflushed = i
    truncated_at: int | None = None
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if i >= first_unflushed or segment.base_offset in needs_rebuild:
            result = segment.recover(config.index_interval_bytes, active=last, max_index_bytes=config.segment_index_bytes)
            stats.scanned_segments += 1
            stats.scanned_bytes += result.valid_bytes + result.truncated_bytes
            if segment.base_offset in needs_rebuild:
                stats.rebuilt_indexes += 1
            if result.truncated_bytes:
                stats.truncated_bytes += result.truncated_bytes
                stats.errors.append(f"{segment.name}: {result.error} at byte {result.valid_bytes}; truncated {result.truncated_bytes} bytes")
                logger.warning("%s/%s: truncated %d bytes at byte %d (%s)", directory.name, segment.name, result.truncated_bytes, result.valid_bytes, result.error)
                if i >= first_unflushed:
                    truncated_at = i
                    break
    if truncated_at is not None:
        for segment in segments[truncated_at + 1 :]:
            logger.warning("%s: deleting %s after a truncated segment", directory.name, segment.name)
            segment.close()
            segment.delete_files()
            stats.deleted_segments += 1
        segments = segments[: truncated_at + 1]
        fsync_dir(directory)
        if not segments[-1].offset_index.appendable:
            segments[-1].open_for_append()

    if not segments:
        base = max(log_start_offset, 0)
        segments.append(LogSegment.create(directory, base, max_index_bytes=config.segment_index_bytes, now_ms=now_ms))
        fsync_dir(directory)
    else:
        active = segments[-1]
        if not active.offset_index.appendable:
            active.open_for_append()

    next_offset = segments[-1].next_offset
    # an empty active segment after the others (a roll that got no data): its base is the end
    next_offset = max(next_offset, segments[-1].base_offset)
    stats.segments = len(segments)
    start = max(log_start_offset, segments[0].base_offset)
    if start > next_offset:
        logger.warning("%s: log start offset %d is past the log end %d; clamping", directory.name, start, next_offset)
        start = next_offset
    # Everything below next_offset is now on disk and verified: either flushed before the
    # shutdown, or scanned and fsynced by recover().
    return LoadedLog(segments, next_offset, start, next_offset, stats)


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
        raise StorageError(path, f"cannot delete: {exc}") from exc
