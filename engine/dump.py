"""Reading segment files for inspection: the engine side of `eventlog dump-log`.

Works on loose files (a .log, .index or .timeindex with or without its siblings), written by
eventlog or by Kafka, and never modifies them. Verification checks every batch's framing and
CRC, that offsets increase, that compressed batches inflate and their records parse, and that
every index entry points at a real batch boundary with the offset and timestamp it claims.

Blocking; meant for the CLI.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from . import filenames
from .errors import CorruptBatchError
from .format import NO_TIMESTAMP, BatchHeader
from .offset_index import OffsetIndex
from .records import Record, decode_records
from .scan import BatchScanner
from .time_index import TimeIndex


@dataclass
class BatchReport:
    header: BatchHeader
    records: list[Record] | None = None
    error: str | None = None


@dataclass
class LogDump:
    path: Path
    base_offset: int
    size: int
    batches: int = 0
    valid_bytes: int = 0
    problems: list[str] = field(default_factory=list)
    boundaries: dict[int, BatchHeader] = field(default_factory=dict)  # position -> header


def base_offset_of(path: Path) -> int:
    parsed = filenames.parse_segment_file(path.name)
    return parsed[0] if parsed else 0


def iter_log(
    path: Path,
    dump: LogDump,
    *,
    check_crc: bool,
    decode: bool,
    progress: Callable[[int], None] | None = None,
) -> Iterator[BatchReport]:
    """Yield one report per batch; fills `dump` (batch count, problems, boundaries)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        scanner = BatchScanner(fd, 0, dump.size, with_data=True, check_crc=check_crc)
        expected = dump.base_offset
        for header, data in scanner:
            report = BatchReport(header)
            if header.base_offset < expected:
                report.error = f"base offset {header.base_offset} is below the previous batch's next offset {expected}"
                dump.problems.append(f"{path.name}: position {header.position}: {report.error}")
            expected = header.next_offset
            if decode:
                try:
                    assert data is not None
                    report.records = decode_records(data, header, 0)
                except CorruptBatchError as exc:
                    report.error = exc.reason
                    dump.problems.append(f"{path.name}: position {header.position}: {exc.reason}")
            dump.batches += 1
            dump.boundaries[header.position] = header
            if progress is not None:
                progress(header.size)
            yield report
        dump.valid_bytes = scanner.valid_end
        if scanner.error is not None:
            dump.problems.append(
                f"{path.name}: invalid data at position {scanner.error_position}: {scanner.error} "
                f"({dump.size - scanner.valid_end} bytes after the last valid batch)"
            )
    finally:
        os.close(fd)


def read_offset_index(path: Path) -> list[tuple[int, int]]:
    """(offset, position) entries of a .index file, preallocated or trimmed."""
    return OffsetIndex.read_entries(path.read_bytes(), base_offset_of(path))


def read_time_index(path: Path) -> list[tuple[int, int]]:
    """(timestamp, offset) entries of a .timeindex file, preallocated or trimmed."""
    return TimeIndex.read_entries(path.read_bytes(), base_offset_of(path))


def index_size_problems(path: Path, time_index: bool) -> list[str]:
    entry_size = TimeIndex.ENTRY_SIZE if time_index else OffsetIndex.ENTRY_SIZE
    size = path.stat().st_size
    if size % entry_size:
        return [f"{path.name}: size {size} is not a multiple of {entry_size}"]
    return []


def verify_offset_index(entries: list[tuple[int, int]], dump: LogDump, name: str) -> list[str]:
    problems = []
    last_offset, last_pos = -1, -1
    for offset, position in entries:
        if offset <= last_offset or position <= last_pos:
            problems.append(f"{name}: entry ({offset}, {position}) does not increase after ({last_offset}, {last_pos})")
        header = dump.boundaries.get(position)
        if header is None:
            problems.append(f"{name}: entry ({offset}, {position}): no batch starts at position {position}")
        elif header.last_offset != offset:
            problems.append(
                f"{name}: entry ({offset}, {position}): the batch there ends at offset {header.last_offset}"
            )
        last_offset, last_pos = offset, position
    return problems


def verify_time_index(entries: list[tuple[int, int]], dump: LogDump, name: str) -> list[str]:
    """Each entry's timestamp must be the largest timestamp up to its offset. Entries may name
    a batch's last offset (eventlog, Kafka >= 3) or the record carrying the timestamp (Kafka
    2.x), so the check allows anything between the largest timestamp of the earlier batches
    and that of the batch holding the offset."""
    problems = []
    ordered = sorted(dump.boundaries.values(), key=lambda h: h.position)
    before = NO_TIMESTAMP  # largest timestamp of the batches before the containing one
    through = NO_TIMESTAMP  # ... including it
    i = 0
    last_ts, last_offset = None, -1
    for ts, offset in entries:
        if last_ts is not None and (ts <= last_ts or offset < last_offset):
            problems.append(f"{name}: entry ({ts}, {offset}) does not increase after ({last_ts}, {last_offset})")
        while i < len(ordered) and ordered[i].base_offset <= offset:
            before = through
            through = max(through, ordered[i].max_timestamp)
            i += 1
        containing = ordered[i - 1] if i else None
        if containing is None or containing.last_offset < offset:
            problems.append(f"{name}: entry ({ts}, {offset}): offset {offset} is not in the log")
        elif not before <= ts <= through:
            problems.append(f"{name}: entry ({ts}, {offset}): the largest timestamp up to that offset is {through}")
        last_ts, last_offset = ts, offset
    return problems
