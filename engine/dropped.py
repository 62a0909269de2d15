"""The offsets recovery dropped: `dropped-offsets-checkpoint` in each partition directory.

Recovery (recovery.py, repair.py) drops damaged batches it cannot keep; their offsets stay a
gap that readers step over. So that a read across such a gap can say acknowledged records may
be missing there (api: the `Eventlog-Dropped-Offsets` header, a `dropped` field), the ranges
are recorded in a small text file with the frame of Kafka's leader-epoch-checkpoint:

    version\\n               always 0
    count\\n                 number of ranges
    first SP last\\n         x count: inclusive offset ranges, ascending, never overlapping
                            or touching (merged)

Written by recovery only, atomically (`.tmp`, fsync, rename, directory fsync: checkpoints.py),
when it drops offsets: the ranges already recorded merged with the new ones, less those wholly
below the log start offset. Never changed while the partition serves; readers filter what is
below the log start offset.

A file that does not parse (damaged by hand or by the disk) never stops a start-up: it is
rebuilt, with a warning, from the headers of the `<base>.log.<position>.damaged` files that
recovery keeps aside (a file that holds exactly one whole batch frame names its offsets); a
missing file is rebuilt from them too (directories recovered before this file existed), and
is written only if that finds something. Offsets recovery dropped without leaving such a file
(a gap below the recovery point, a damaged header) are lost from the record then. A
`.damaged` file newer than the record adds what it names too: a crash between a segment's
repair and the write of the record leaves just that.

Blocking (small file reads and writes); recovery runs in worker threads, the readers of a shard
family (follower.py) read it once per segment listing.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from .errors import StorageError
from .fileutil import io_errors, replace_file, storage_error
from .format import HEADER_SIZE, MAGIC_V2, MIN_BATCH_LENGTH, parse_header

logger = logging.getLogger("eventlog.recovery")

DROPPED_OFFSETS = "dropped-offsets-checkpoint"
_VERSION = 0
_DAMAGED_NAME = re.compile(r"^(\d{20})\.log\.(\d+)\.damaged$")

Ranges = tuple[tuple[int, int], ...]  # inclusive (first, last), ascending, merged


def merge(*groups: Iterable[tuple[int, int]]) -> Ranges:
    """The union of the ranges, sorted, overlapping or touching ones merged."""
    out: list[list[int]] = []
    for first, last in sorted(r for group in groups for r in group):
        if last < first:
            continue
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return tuple((a, b) for a, b in out)


def crossing(ranges: Ranges, first: int, last: int) -> Ranges:
    """The parts of `ranges` within [first, last]."""
    if not ranges or last < first:
        return ()
    return tuple((max(a, first), min(b, last)) for a, b in ranges if a <= last and b >= first)


def describe(ranges: Ranges) -> str:
    """"120-130, 200-201" (a single offset: "7-7")."""
    return ", ".join(f"{a}-{b}" for a, b in ranges)


def parse(data: bytes) -> Ranges:
    """The ranges of a file's bytes; ValueError if they are not the format above."""
    lines = data.decode("ascii").split("\n")
    if len(lines) < 3:
        raise ValueError(f"{len(data)} bytes, not a whole file")
    if int(lines[0]) != _VERSION:
        raise ValueError(f"unsupported version {lines[0]!r}")
    count = int(lines[1])
    if count < 0 or len(lines) != count + 3 or lines[-1] != "":
        raise ValueError(f"says {count} ranges, holds {len(lines) - 3}")
    ranges = []
    for line in lines[2 : 2 + count]:
        first, last = line.split(" ")
        a, b = int(first), int(last)
        if a < 0 or b < a:
            raise ValueError(f"bad range {line!r}")
        ranges.append((a, b))
    if tuple(ranges) != merge(ranges):
        raise ValueError("ranges not ascending, or overlapping")
    return tuple(ranges)


def format_ranges(ranges: Ranges) -> bytes:
    lines = [str(_VERSION), str(len(ranges))] + [f"{a} {b}" for a, b in ranges]
    return ("\n".join(lines) + "\n").encode("ascii")


def read(directory: Path) -> Ranges:
    """The recorded ranges; () when there is no file. Raises ValueError for a file that does
    not parse, StorageError when it cannot be read."""
    path = directory / DROPPED_OFFSETS
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise storage_error(exc, path, "cannot read") from exc
    return parse(data)


def read_quietly(directory: Path) -> Ranges:
    """read(), for readers that cannot repair anything (another shard's partition): () with a
    warning when the file does not parse or cannot be read (its owner rebuilds it at its next
    start)."""
    try:
        return read(directory)
    except (ValueError, StorageError) as exc:
        logger.warning("%s: %s ignored: %s", directory.name, DROPPED_OFFSETS, exc)
        return ()


def write(directory: Path, ranges: Ranges) -> None:
    """Atomically replace the file with `ranges`. Raises StorageError."""
    path = directory / DROPPED_OFFSETS
    with io_errors(path, "cannot write"):
        replace_file(path, format_ranges(ranges))


def from_damaged_files(
    directory: Path, newer_than_ns: int | None = None, names: list[str] | None = None
) -> Ranges:
    """The offsets named by the `.damaged` files recovery kept aside: those holding exactly one
    whole batch frame whose offsets lie at or above their segment's base offset (with
    `newer_than_ns`, only files modified after that time). `names`: the directory's listing,
    when the caller has it."""
    found = []
    for name in sorted(os.listdir(directory) if names is None else names):
        m = _DAMAGED_NAME.match(name)
        if m is None:
            continue
        try:
            with open(directory / name, "rb") as f:
                head = f.read(HEADER_SIZE)
                st = os.fstat(f.fileno())
        except OSError:
            continue
        if len(head) < HEADER_SIZE or (newer_than_ns is not None and st.st_mtime_ns <= newer_than_ns):
            continue
        header = parse_header(head, 0, 0)
        if (
            header.magic == MAGIC_V2 and header.batch_length >= MIN_BATCH_LENGTH and header.size == st.st_size
            and header.base_offset >= int(m.group(1)) and header.last_offset_delta >= 0
        ):
            found.append((header.base_offset, header.last_offset))
    return merge(found)


def load(directory: Path, names: list[str] | None = None) -> tuple[Ranges, bool]:
    """The recorded ranges, before recovery scans anything, and whether the file must be
    written. Never raises for a bad file: warns and rebuilds from the `.damaged` files. A
    `.damaged` file newer than the record (a crash came between the repair that kept it aside
    and the write of the record), or any when there is no record, adds what it names.
    `names`: the directory's listing, when the caller has it (start-up: a partition with
    neither file costs no system call here)."""
    path = directory / DROPPED_OFFSETS
    if names is not None and DROPPED_OFFSETS not in names:
        rebuilt = _rebuild(directory, None, names)
        return rebuilt, bool(rebuilt)
    try:
        with open(path, "rb") as f:
            data = f.read()
            mtime_ns = os.fstat(f.fileno()).st_mtime_ns
    except FileNotFoundError:
        rebuilt = _rebuild(directory, None)
        return rebuilt, bool(rebuilt)
    except OSError as exc:
        error = f"cannot read: {exc}"
    else:
        try:
            recorded = parse(data)
        except ValueError as exc:  # UnicodeDecodeError is a ValueError
            error = str(exc)
        else:
            ranges = merge(recorded, _rebuild(directory, mtime_ns))
            return ranges, ranges != recorded
    rebuilt = _rebuild(directory, None)
    logger.warning(
        "%s: %s is damaged (%s); rebuilt from the .damaged files: %s",
        directory.name, DROPPED_OFFSETS, error, describe(rebuilt) or "no ranges",
    )
    return rebuilt, True


def _rebuild(
    directory: Path, newer_than_ns: int | None, names: list[str] | None = None
) -> Ranges:
    try:
        return from_damaged_files(directory, newer_than_ns, names)
    except OSError:
        return ()


__all__ = [
    "DROPPED_OFFSETS", "Ranges", "crossing", "describe", "format_ranges", "from_damaged_files", "load", "merge",
    "parse", "read", "read_quietly", "write",
]
