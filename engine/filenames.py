"""Names of files and directories in a data dir.

    <topic>-<partition>/                    partition directory
    <20-digit base offset>.log              segment data
    <20-digit base offset>.index            offset index
    <20-digit base offset>.timeindex        time index
    <20-digit base offset>.keyindex         key index (eventlog's; key_index.py), not a segment file
    ... + ".cleaned" / ".swap" / ".deleted" transient suffixes of compaction and deletion
    <base>.log.<position>.damaged           bytes recovery dropped, kept aside (repair.py)
    <topic>-<partition>.<uuid hex>-delete   a deleted topic's directory, removed at start-up

Pure string functions; no I/O.
"""

from __future__ import annotations

import re
from pathlib import Path

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)
KEY_INDEX_SUFFIX = ".keyindex"

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
TRANSIENT_SUFFIXES = (CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX)
DELETE_DIR_SUFFIX = "-delete"

_SEGMENT_RE = re.compile(r"^(\d{20})(\.log|\.index|\.timeindex)(\.cleaned|\.swap|\.deleted)?$")
_KEY_INDEX_RE = re.compile(r"^(\d{20})\.keyindex(\.cleaned|\.swap|\.deleted)?$")
_PARTITION_DIR_RE = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")


def base_name(base_offset: int) -> str:
    """The 20-digit zero-padded base offset that names a segment's files."""
    if base_offset < 0:
        raise ValueError(f"negative base offset {base_offset}")
    return f"{base_offset:020d}"


def log_file(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{base_name(base_offset)}{LOG_SUFFIX}{suffix}"


def index_file(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{base_name(base_offset)}{INDEX_SUFFIX}{suffix}"


def time_index_file(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{base_name(base_offset)}{TIME_INDEX_SUFFIX}{suffix}"


def key_index_file(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{base_name(base_offset)}{KEY_INDEX_SUFFIX}{suffix}"


def segment_files(directory: Path, base_offset: int, suffix: str = "") -> tuple[Path, Path, Path]:
    return (
        log_file(directory, base_offset, suffix),
        index_file(directory, base_offset, suffix),
        time_index_file(directory, base_offset, suffix),
    )


def parse_segment_file(name: str) -> tuple[int, str, str] | None:
    """'00000000000000000042.index.swap' -> (42, '.index', '.swap'); None if not a segment file."""
    m = _SEGMENT_RE.match(name)
    if m is None:
        return None
    return int(m.group(1)), m.group(2), m.group(3) or ""


def parse_key_index_file(name: str) -> tuple[int, str] | None:
    """'00000000000000000042.keyindex.swap' -> (42, '.swap'); None if not a key index file (a
    key index is no segment file: parse_segment_file does not name it)."""
    m = _KEY_INDEX_RE.match(name)
    if m is None:
        return None
    return int(m.group(1)), m.group(2) or ""


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """'orders-3' -> ('orders', 3). Topic names may contain '-', so split at the last one."""
    if name.endswith(DELETE_DIR_SUFFIX):
        return None
    m = _PARTITION_DIR_RE.match(name)
    if m is None:
        return None
    return m.group("topic"), int(m.group("partition"))
