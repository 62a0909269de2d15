"""Repairing a damaged .log file: where valid batches start again, and the file without the rest.

Damage inside a log (bytes flipped on the disk or by a person, bytes that are not a batch at
all) differs from a torn tail: valid batches follow it. Recovery (LogSegment.recover) keeps
them, in these steps:

1. At the first invalid batch (framing, magic, CRC-32C, or offsets that go backwards or leave
   the segment), `find_next_batch` looks for the next position where a whole valid batch
   starts: magic 2, a batchLength that fits the file, a matching CRC-32C, a base offset at or
   above where the valid part ended and a last offset below the next segment's base offset.
   The bytes in between are dropped; the scan goes on from there (more damage, more drops).
2. No such position: the damage runs to the end of the file. The file is truncated there (in
   the last segment after a crash this is the ordinary torn tail).
3. Dropped bytes with valid batches after them: `rewrite` copies the kept runs of bytes to
   `<base>.log.cleaned`, fsyncs it, renames it over `<base>.log` and fsyncs the directory.
   A crash before the rename leaves the `.cleaned` file, which recovery step 2 deletes, and
   the damaged file, which is repaired again; a crash after it leaves the repaired file. The
   indexes are rebuilt from the new file either way.
4. `save_aside` copies dropped bytes that may have held acknowledged records (a batch whose
   framing is whole, or anything with valid batches after it) to
   `<base>.log.<position>.damaged`, for an operator. No read serves them (Kafka ignores them
   too); only a rebuild of the partition's record of dropped offsets reads their headers
   (dropped.py). A torn tail (an incomplete batch, garbage or zeros at the very end) is not kept.

Offsets are never reused: a dropped batch leaves a gap in the offsets (readers step over gaps
as they do after compaction), and `claimed_offsets` says what a damaged batch's header claims
when that is plausible, so that the loader keeps the log end above it.

Blocking; recovery runs it in worker threads, before the partition takes any request.
"""

from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from . import filenames
from .faults import crash_point
from .fileutil import fsync_dir, pread
from .format import (
    BATCH_PREFIX,
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_AT,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    parse_header,
)

logger = logging.getLogger("eventlog.recovery")

DAMAGED_SUFFIX = ".damaged"
_COPY_CHUNK_BYTES = 8 * 1024 * 1024
_MAGIC_BYTE = bytes((MAGIC_V2,))


@dataclass(frozen=True, slots=True)
class DamagedRange:
    """Bytes [position, position + size) of a .log file that recovery dropped."""

    position: int
    size: int
    reason: str  # why the batch at `position` failed
    first_offset: int | None  # what the header at `position` claims, when plausible
    last_offset: int | None
    framed: bool  # a whole batch frame starts there (it may have held acknowledged records)
    tail: bool  # nothing valid follows it in its file
    # the offset the valid batches before it end at (the segment's base offset if none), and
    # the base offset of the valid batch after it (None: a tail): the offsets in between are
    # what it took (recovery records them: dropped.py)
    floor: int | None = None
    resume_offset: int | None = None

    @property
    def lost_offsets(self) -> tuple[int, int] | None:
        """(first, last) offsets missing where these bytes were: between the valid batches
        around them, or, for a tail, what its header claims; None if none or unknown."""
        if self.resume_offset is not None and self.floor is not None:
            return (self.floor, self.resume_offset - 1) if self.resume_offset > self.floor else None
        if self.first_offset is not None and self.last_offset is not None:
            return self.first_offset, self.last_offset
        return None

    @property
    def offsets(self) -> str:
        if self.first_offset is None:
            return "offsets unknown"
        return f"offsets {self.first_offset}-{self.last_offset}"

    @property
    def keep_aside(self) -> bool:
        """Worth a copy for an operator: not a mere torn tail."""
        return self.framed or not self.tail


def claimed_offsets(fd: int, position: int, end: int, floor: int, limit: int) -> tuple[int, int] | None:
    """(first, last) offsets the header of the damaged batch at `position` claims, when its
    frame is whole (the length fits before `end`), its magic is 2, and its offsets lie in
    [floor, limit); None otherwise (a torn write, garbage, or a header too damaged to trust)."""
    if end - position < HEADER_SIZE:
        return None
    header = parse_header(pread(fd, HEADER_SIZE, position), 0, position)
    if header.magic != MAGIC_V2 or header.batch_length < MIN_BATCH_LENGTH or position + header.size > end:
        return None
    if header.base_offset < floor or header.last_offset_delta < 0 or header.last_offset >= limit:
        return None
    return header.base_offset, header.last_offset


def base_offset_at(fd: int, position: int) -> int:
    """The base offset of the batch at `position` (one found by find_next_batch)."""
    return BATCH_PREFIX.unpack(pread(fd, BATCH_PREFIX.size, position))[0]


def is_framed(fd: int, position: int, end: int) -> bool:
    """A whole batch frame starts at `position`: magic 2 and a length that fits before `end`."""
    if end - position < HEADER_SIZE:
        return False
    header = parse_header(pread(fd, HEADER_SIZE, position), 0, position)
    return header.magic == MAGIC_V2 and header.batch_length >= MIN_BATCH_LENGTH and position + header.size <= end


def find_next_batch(fd: int, start: int, end: int, floor: int, limit: int) -> int | None:
    """The first position in [start, end) where a whole valid batch begins whose offsets lie in
    [floor, limit); None if there is none. Looks at every byte (a magic byte 2 first, then the
    length, the offsets, and last the CRC), so a damaged region costs one pass over it."""
    if end - start < HEADER_SIZE:
        return None
    with mmap.mmap(fd, end, prot=mmap.PROT_READ) as mm:
        view = memoryview(mm)
        try:
            i = mm.find(_MAGIC_BYTE, start + MAGIC_AT, end - HEADER_SIZE + MAGIC_AT + 1)
            while i >= 0:
                q = i - MAGIC_AT
                base, length = BATCH_PREFIX.unpack_from(mm, q)
                size = length + LOG_OVERHEAD
                if length >= MIN_BATCH_LENGTH and q + size <= end and base >= floor:
                    header = parse_header(mm, q, q)
                    if (
                        header.last_offset_delta >= 0
                        and header.records_count >= 0
                        and header.last_offset < limit
                        and crc32c(view[q + CRC_START : q + size]) == header.crc
                    ):
                        return q
                i = mm.find(_MAGIC_BYTE, i + 1, end - HEADER_SIZE + MAGIC_AT + 1)
            return None
        finally:
            view.release()


def rewrite(path: Path, fd: int, runs: list[tuple[int, int]]) -> int:
    """Replace the .log at `path` (open as `fd`) with the concatenation of byte runs [start,
    end) of it, atomically (steps 3 above). Returns the new size. Raises OSError."""
    tmp = path.with_name(path.name + filenames.CLEANED_SUFFIX)
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    size = 0
    try:
        for start, end in runs:
            _copy(fd, out, start, end - start)
            size += end - start
        os.fsync(out)
    finally:
        os.close(out)
    fsync_dir(path.parent)
    crash_point("repair.after_cleaned")
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return size


def save_aside(path: Path, fd: int, damaged: DamagedRange) -> Path | None:
    """Copy the dropped bytes to `<name>.<position>.damaged` next to `path` (step 4 above).
    Best effort: a failure (a full disk) is logged and the repair goes on without the copy."""
    target = path.with_name(f"{path.name}.{damaged.position}{DAMAGED_SUFFIX}")
    try:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _copy(fd, out, damaged.position, damaged.size)
            os.fsync(out)
        finally:
            os.close(out)
    except OSError as exc:
        logger.warning("%s: could not keep the %d damaged bytes at %d aside: %s", path, damaged.size, damaged.position, exc)
        target.unlink(missing_ok=True)
        return None
    return target


def _copy(src: int, dst: int, position: int, count: int) -> None:
    while count > 0:
        data = pread(src, min(count, _COPY_CHUNK_BYTES), position)
        if not data:
            raise OSError(f"unexpected end of file at byte {position}")
        view = memoryview(data)
        while view:
            view = view[os.write(dst, view) :]
        position += len(data)
        count -= len(data)


__all__ = ["DAMAGED_SUFFIX", "DamagedRange", "base_offset_at", "claimed_offsets", "find_next_batch", "is_framed", "rewrite", "save_aside"]
