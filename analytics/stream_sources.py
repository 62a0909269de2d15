"""Where the stream's micro-batches come from: successive snapshots, or a live data dir read
without the server's cooperation (analytics/stream.py says what each offers; this module says
how the files are read).

A source answers view() (each partition's [log start, end) now) and slices(ranges, report)
(picklable InputPartitions, one per segment a range touches); read_slice() runs in the tasks.
`report(message)` is the stream's data-loss policy: it raises DataLossError, or logs and
returns, and then the lost offsets are skipped.

Snapshots. A finished snapshot (manifest.json written last) never changes: manifests are cached
by directory. A SnapshotSlice names one segment file, its manifest size and offset bounds; a
file gone at read time (the snapshot was deleted) is a loss. The snapshots may be under a URI
(storage.py), and a segment may be an uploaded object (upload.py): those are read from their
first byte, without an index.

Live data dir, what is read:

    <dir>/recovery-point-offset-checkpoint   liveEnd=checkpoint: each partition's end
    <dir>/log-start-offset-checkpoint        raises the log start (delete-records)
    <dir>/<topic>-<n>/<base>.log             segments, each covering [base, the next base)
    <dir>/<topic>-<n>/<base>.log.deleted     retention's and compaction's old segments, read
                                             where no .log has that base, until unlinked
    <dir>/<topic>-<n>/<base>.log.swap        mid-compaction: counts for the log start only
    <dir>/<topic>-<n>/<base>.index           a starting position for a read (checked)

1. view(): the log start is the lowest base of the .log and .log.swap files (at every step of
   a compaction swap one of them covers the start), raised to the checkpointed log start. The
   end is the recovery point, or (logEnd) a walk of the active segment over whole batches
   whose framing and CRC-32C check, continued from where the last walk stopped while the file
   is the same inode and not shorter, else from the index entry below the stream's start.
2. slices(): ranges split at the segment bases listed now; offsets below the first base are
   reported lost.
3. read_slice(): lists again, opens every file the range needs before reading any (a file
   gone meanwhile: list again, 3 tries), so nothing is yielded twice; open files stay
   readable after an unlink. Offsets below the first base are reported lost. The partition's
   last segment is read up to the first batch at or past the range's end (a torn tail beyond
   it is a write in flight); if its batches stop short of the end, the server truncated its
   log (an undone commit, recovery after a crash) and the rest is reported lost.

Reading far into a segment: decode_segment reads a file from byte 0, so a range starting at
or past _COPY_FROM bytes into a segment (the index says where) is copied to a temporary file
first (copy_file_range); errors still name the segment and its byte position.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from crc32c import crc32c
from pyspark.sql.datasource import InputPartition

from engine import filenames
from engine.format import (
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    OFFSET_INDEX_ENTRY,
    parse_header,
)

from . import storage
from .decoder import SnapshotCorruptError, decode_segment
from .source import segment_location

__all__ = [
    "LiveSlice",
    "LiveSource",
    "PartitionRange",
    "SnapshotSlice",
    "SnapshotSource",
    "read_slice",
]

logger = logging.getLogger("eventlog.analytics.stream")

MANIFEST = "manifest.json"
RECOVERY_POINT = "recovery-point-offset-checkpoint"
LOG_START = "log-start-offset-checkpoint"
_COPY_FROM = 1 << 20  # a read starting this far into a segment copies the bytes it needs first
_OPEN_TRIES = 3

TP = tuple[str, int]
Offsets = dict[TP, int]


@dataclass(frozen=True)
class PartitionRange:
    """What a source holds of one partition now: offsets [log_start, end)."""

    log_start: int
    end: int


@dataclass(frozen=True)
class SnapshotSlice(InputPartition):
    """Offsets [start_offset, end_offset) of one snapshot segment file (read up to size_bytes)."""

    path: str
    index_path: str
    topic: str
    partition: int
    base_offset: int
    size_bytes: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True)
class LiveSlice(InputPartition):
    """Offsets [start_offset, end_offset) of a live partition directory; files found at read time."""

    directory: str
    topic: str
    partition: int
    start_offset: int
    end_offset: int


def read_slice(part: InputPartition, report) -> Iterator[pa.RecordBatch]:
    """The rows of one slice (anything else: none)."""
    if isinstance(part, SnapshotSlice):
        yield from _read_snapshot_slice(part, report)
    elif isinstance(part, LiveSlice):
        yield from _read_live_slice(part, report)


# ---------------------------------------------------------------------------------------------
# snapshots


class SnapshotSource:
    """A directory of snapshots (or one snapshot); manifests cached while their directory stays."""

    def __init__(self, root: str, topics: tuple[str, ...] | None) -> None:
        self.root = root
        self.topics = topics
        self._manifests: dict[str, dict] = {}  # finished snapshots never change

    def snapshots(self) -> list[tuple[str, dict]]:
        """(directory, manifest) of each finished snapshot, oldest first: by the manifests'
        created_ms, then by name (eventlog's ids sort by creation time too)."""
        if storage.exists(storage.join(self.root, MANIFEST)):
            dirs = [self.root]
        else:
            dirs = [storage.join(self.root, n) for n in storage.list_dirs(self.root) if not n.startswith(".")]
        out = []
        for d in dirs:
            manifest = self._manifests.get(d)
            if manifest is None:
                try:
                    manifest = json.loads(storage.read_bytes(storage.join(d, MANIFEST)))
                except (FileNotFoundError, NotADirectoryError):
                    continue  # unfinished, or deleted meanwhile
                if manifest.get("format_version") != 1:
                    raise ValueError(f"eventlog: {d}: manifest format_version {manifest.get('format_version')!r}, expected 1")
                self._manifests[d] = manifest
            out.append((d, manifest))
        for d in set(self._manifests) - {d for d, _ in out}:
            del self._manifests[d]
        return sorted(out, key=lambda item: (item[1].get("created_ms", 0), item[0]))

    def _wanted(self, topic: dict) -> bool:
        return topic["name"] in self.topics if self.topics is not None else not topic.get("internal", False)

    def _holders(self) -> dict[str, list[tuple[str, dict]]]:
        """Per topic, (snapshot dir, topic entry) newest first, of one topic_id: the newest's."""
        holders: dict[str, list[tuple[str, dict]]] = {}
        for d, manifest in reversed(self.snapshots()):
            for topic in manifest.get("topics", []):
                if not self._wanted(topic):
                    continue
                same = holders.setdefault(topic["name"], [])
                if not same or same[0][1].get("topic_id") == topic.get("topic_id"):
                    same.append((d, topic))
        return holders

    def view(self, start: Offsets | None = None) -> dict[TP, PartitionRange]:
        """Each partition as the newest snapshot holding it has it (a snapshot leaves out the
        partitions that were offline)."""
        out = {}
        for name, held in self._holders().items():
            for _, entry in held:
                for part in entry.get("partitions", []):
                    tp = (name, int(part["partition"]))
                    if tp not in out:
                        out[tp] = PartitionRange(int(part["log_start_offset"]), int(part["high_watermark"]))
        return out

    def slices(self, ranges, report) -> list[InputPartition]:
        holders = self._holders()
        out: list[InputPartition] = []
        for (topic, number), begin, until in ranges:
            missing = [(begin, until)]
            for d, entry in holders.get(topic, []):
                part = next((p for p in entry.get("partitions", []) if int(p["partition"]) == number), None)
                if part is None or not missing:
                    continue
                lo, hi = int(part["log_start_offset"]), int(part["high_watermark"])
                left = []
                for a, b in missing:
                    x, y = max(a, lo), min(b, hi)
                    if x >= y:
                        left.append((a, b))
                        continue
                    out.extend(_snapshot_slices(d, part, topic, number, x, y))
                    left += [r for r in ((a, x), (y, b)) if r[0] < r[1]]
                missing = left
            for a, b in missing:
                report(f"offsets {a} to {b - 1} of {topic}-{number} are in no snapshot (retention removed them "
                       "before a snapshot held them, or the snapshots holding them were deleted)")
        return out


def _snapshot_slices(directory: str, part: dict, topic: str, number: int, begin: int, until: int):
    listed = sorted(part.get("segments", []), key=lambda s: int(s["base_offset"]))
    for i, seg in enumerate(listed):
        base = int(seg["base_offset"])
        nxt = int(listed[i + 1]["base_offset"]) if i + 1 < len(listed) else None
        last = seg.get("last_offset")
        stop = nxt if last is None and nxt is not None else (int(last) + 1 if last is not None else until)
        x, y = max(begin, base), min(until, stop)
        if int(seg["size_bytes"]) == 0 or x >= y:
            continue
        if seg.get("object") or storage.is_uri(directory):  # uploaded: no index file; remote: read from 0
            path, index = segment_location(directory, part, seg), ""
        else:
            folder = os.path.join(directory, part["dir"])
            path = os.path.join(folder, seg["file"])
            index = os.path.join(folder, seg.get("index_file") or filenames.index_file(Path(), base).name)
        yield SnapshotSlice(path, index, topic, number, base, int(seg["size_bytes"]), x, y)


def _read_snapshot_slice(s: SnapshotSlice, report) -> Iterator[pa.RecordBatch]:
    if storage.is_uri(s.path):
        yield from _read_remote_slice(s, report)
        return
    try:
        fd = os.open(s.path, os.O_RDONLY)
    except FileNotFoundError:
        report(f"offsets {s.start_offset} to {s.end_offset - 1} of {s.topic}-{s.partition}: {s.path} is gone "
               "(its snapshot was deleted after the micro-batch was planned)")
        return
    try:
        position, _ = _index_hint(fd, s.index_path, s.base_offset, s.start_offset)
        yield from _decode_range(fd, s.path, position, s.size_bytes, s.topic, s.partition, s.start_offset, s.end_offset)
    finally:
        os.close(fd)


def _read_remote_slice(s: SnapshotSlice, report) -> Iterator[pa.RecordBatch]:
    """A segment object read from its start (ranged reads of 16 MiB windows; batches below the
    range are skipped by their headers)."""
    bounds = {"topic": s.topic, "partition": s.partition, "start_offset": s.start_offset, "end_offset": s.end_offset}
    try:
        yield from decode_segment(s.path, s.size_bytes, **bounds)
    except FileNotFoundError:
        report(f"offsets {s.start_offset} to {s.end_offset - 1} of {s.topic}-{s.partition}: "
               f"{storage.display(s.path)} is gone (its snapshot was deleted after the micro-batch was planned)")


# ---------------------------------------------------------------------------------------------
# the live data dir


def _read_checkpoint(path: str) -> dict[TP, int]:
    """A Kafka offset checkpoint file ("0\\n<count>\\n<topic> <partition> <offset>\\n..."); {}
    when missing or empty. The server replaces it by rename, so a read sees a whole one."""
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8").split("\n")
    except FileNotFoundError:
        return {}
    if not lines[0]:
        return {}
    if lines[0] != "0" or len(lines) < 2:
        raise ValueError(f"eventlog: {path}: not a version 0 offset checkpoint")
    out = {}
    for line in lines[2 : 2 + int(lines[1])]:
        topic, partition, offset = line.rsplit(" ", 2)
        out[(topic, int(partition))] = int(offset)
    return out


def _segment_files(directory: str, suffixes: tuple[str, ...]) -> list[tuple[int, str]]:
    """(base offset, .log file name) sorted by base; of several files with one base, the one
    whose suffix comes first in `suffixes` ("" = live)."""
    best: dict[int, tuple[int, str]] = {}
    for name in os.listdir(directory):
        parsed = filenames.parse_segment_file(name)
        if parsed is None or parsed[1] != filenames.LOG_SUFFIX or parsed[2] not in suffixes:
            continue
        rank = suffixes.index(parsed[2])
        if parsed[0] not in best or rank < best[parsed[0]][0]:
            best[parsed[0]] = (rank, name)
    return [(base, name) for base, (_, name) in sorted(best.items())]


@dataclass
class _Tail:
    """Where the last logEnd walk of a partition's active segment stopped."""

    inode: int
    base_offset: int
    position: int
    next_offset: int


class LiveSource:
    """A server's log dir; with log_end, each partition's last walk position is kept."""

    def __init__(self, root: str, topics: tuple[str, ...] | None, log_end: bool) -> None:
        self.root = root
        self.topics = topics
        self.log_end = log_end
        self._tails: dict[TP, _Tail] = {}

    def _partitions(self) -> list[tuple[TP, str]]:
        out = []
        for entry in os.scandir(self.root):
            tp = filenames.parse_partition_dir(entry.name)
            if tp is None or not entry.is_dir():
                continue
            if tp[0] in self.topics if self.topics is not None else not tp[0].startswith("__"):
                out.append((tp, entry.path))
        return sorted(out)

    def view(self, start: Offsets | None = None) -> dict[TP, PartitionRange]:
        """Each partition dir's [log start, end) (step 1 of the module docstring); `start`, the
        stream's offsets, tells a first logEnd walk where to begin."""
        log_starts = _read_checkpoint(os.path.join(self.root, LOG_START))
        ends = {} if self.log_end else _read_checkpoint(os.path.join(self.root, RECOVERY_POINT))
        out = {}
        for tp, directory in self._partitions():
            try:
                # the log start: live segments, and those a compaction is swapping in
                segments = _segment_files(directory, ("", filenames.SWAP_SUFFIX))
            except FileNotFoundError:
                continue  # the topic was deleted meanwhile
            if not segments:
                continue
            log_start = max(segments[0][0], log_starts.get(tp, 0))
            if self.log_end:
                live = [s for s in segments if s[1].endswith(filenames.LOG_SUFFIX)]
                end = self._walk_tail(tp, directory, *live[-1], (start or {}).get(tp)) if live else None
                if end is None:
                    continue
            else:
                end = ends.get(tp, log_start)
            out[tp] = PartitionRange(log_start, max(end, log_start))
        return out

    def _walk_tail(self, tp: TP, directory: str, base: int, name: str, start: int | None) -> int | None:
        """logEnd: the next offset after the active segment's last whole CRC-valid batch."""
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            tail = self._tails.get(tp)
            if tail is not None and (tail.inode, tail.base_offset) == (st.st_ino, base) and tail.position <= st.st_size:
                position, first = tail.position, tail.next_offset
                end_position, next_offset = _walk(fd, position, first, st.st_size, None, check_crc=True)
                if end_position > position or end_position == st.st_size:
                    self._tails[tp] = _Tail(st.st_ino, base, end_position, next_offset)
                    return next_offset
            # first walk, a new segment, or the file changed under the last position: from the
            # index entry at or below `start` (validated), else from the segment start
            index = str(filenames.index_file(Path(directory), base))
            position, first = (0, base) if start is None or start <= base else _index_hint(fd, index, base, start)
            end_position, next_offset = _walk(fd, position, first, st.st_size, None, check_crc=True)
            self._tails[tp] = _Tail(st.st_ino, base, end_position, next_offset)
            return next_offset
        finally:
            os.close(fd)

    def slices(self, ranges, report) -> list[InputPartition]:
        out: list[InputPartition] = []
        directories = dict(self._partitions())
        for (topic, number), begin, until in ranges:
            directory = directories.get((topic, number))
            bases = []
            if directory is not None:
                try:
                    bases = [b for b, _ in _segment_files(directory, ("", filenames.DELETED_SUFFIX))]
                except FileNotFoundError:
                    pass
            first = bases[0] if bases else until
            if begin < first:
                report(f"offsets {begin} to {min(first, until) - 1} of {topic}-{number} are gone from the log "
                       "(retention or delete-records removed them, or the topic was deleted)")
                begin = first
            for i, base in enumerate(bases):
                stop = bases[i + 1] if i + 1 < len(bases) else until
                x, y = max(begin, base), min(until, stop)
                if x < y:
                    out.append(LiveSlice(directory, topic, number, x, y))
        return out


def _read_live_slice(s: LiveSlice, report) -> Iterator[pa.RecordBatch]:
    where = f"{s.topic}-{s.partition}"
    begin, until = s.start_offset, s.end_offset
    opened: list[tuple[int, str, int, int | None]] = []  # fd, file name, range start, range end
    try:
        for _ in range(_OPEN_TRIES):
            try:
                segments = _segment_files(s.directory, ("", filenames.DELETED_SUFFIX))
            except FileNotFoundError:
                segments = []
            ranges = [(base, name, segments[i + 1][0] if i + 1 < len(segments) else None)
                      for i, (base, name) in enumerate(segments)]
            ranges = [r for r in ranges if (r[2] is None or r[2] > begin) and r[0] < until]
            try:
                for base, name, stop in ranges:
                    opened.append((os.open(os.path.join(s.directory, name), os.O_RDONLY), name, base, stop))
                break
            except FileNotFoundError:  # renamed or removed since the listing: list again
                for fd, *_ in opened:
                    os.close(fd)
                opened = []
        first = opened[0][2] if opened else until
        if begin < first:
            report(f"offsets {begin} to {min(first, until) - 1} of {where} are gone from the log: removed after "
                   "the micro-batch was planned (retention, delete-records, or the topic was deleted)")
            begin = first
        for fd, name, base, stop in opened:
            x, y = max(begin, base), until if stop is None else min(until, stop)
            if x >= y:
                continue
            path = os.path.join(s.directory, name)
            suffix = filenames.parse_segment_file(name)[2]
            index = str(filenames.index_file(Path(s.directory), base, suffix))
            position, first_offset = _index_hint(fd, index, base, x)
            size = os.fstat(fd).st_size
            if stop is None:  # the partition's last segment: whole batches below `until` only
                size, reached = _walk(fd, position, first_offset, size, y, check_crc=False)
                if reached < y:
                    report(f"offsets {reached} to {y - 1} of {where} are not in the log any more (the server "
                           "truncated it: an undone commit, or recovery after a crash)")
            yield from _decode_range(fd, path, position, size, s.topic, s.partition, x, y)
    finally:
        for fd, *_ in opened:
            os.close(fd)


# ---------------------------------------------------------------------------------------------
# file helpers


def _walk(fd: int, position: int, first_offset: int, size: int, end_offset: int | None,
          *, check_crc: bool) -> tuple[int, int]:
    """From a batch boundary, over whole batches (framing, magic, CRC when asked), stopping at
    the first batch at or past `end_offset`, or an incomplete or invalid one: (the position
    there, the next offset after the last batch passed; `first_offset` if none)."""
    next_offset = first_offset
    while position + HEADER_SIZE <= size:
        raw = os.pread(fd, HEADER_SIZE, position)
        if len(raw) < HEADER_SIZE:
            break
        header = parse_header(raw)
        length = header.batch_length + LOG_OVERHEAD
        if (header.batch_length < MIN_BATCH_LENGTH or header.magic != MAGIC_V2 or header.last_offset_delta < 0
                or position + length > size):
            break
        if end_offset is not None and header.base_offset >= end_offset:
            break
        if check_crc:
            data = os.pread(fd, length, position)
            if len(data) < length or crc32c(memoryview(data)[CRC_START:]) != header.crc:
                break
        position += length
        next_offset = header.base_offset + header.last_offset_delta + 1
    return position, next_offset


def _index_hint(fd: int, index_path: str, base: int, offset: int) -> tuple[int, int]:
    """(position, base offset) of a batch at or before the one holding `offset`, from the
    segment's offset index (entries: last offset of a batch - base, its start position; a
    preallocated active index ends in zeros), checked against the batch header it points at;
    (0, base) when there is no index, no entry at or below, or the entry does not check."""
    try:
        index = os.open(index_path, os.O_RDONLY)
    except OSError:
        return 0, base
    try:
        def entry(i: int) -> tuple[int, int] | None:
            raw = os.pread(index, OFFSET_INDEX_ENTRY.size, i * OFFSET_INDEX_ENTRY.size)
            return OFFSET_INDEX_ENTRY.unpack(raw) if len(raw) == OFFSET_INDEX_ENTRY.size else None

        # entries: positions > 0 (position 0 never gets one), then zeros
        lo, hi = 0, os.fstat(index).st_size // OFFSET_INDEX_ENTRY.size
        while lo < hi:
            mid = (lo + hi) // 2
            e = entry(mid)
            if e is not None and e[1] > 0:
                lo = mid + 1
            else:
                hi = mid
        count, target = lo, offset - base
        lo, hi = 0, count
        while lo < hi:  # the last entry with relative offset <= target
            mid = (lo + hi) // 2
            e = entry(mid)
            if e is not None and e[0] <= target:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return 0, base
        rel, position = entry(lo - 1) or (0, 0)
    finally:
        os.close(index)
    raw = os.pread(fd, HEADER_SIZE, position)
    if len(raw) < HEADER_SIZE:
        return 0, base
    header = parse_header(raw)
    if header.magic != MAGIC_V2 or header.base_offset + header.last_offset_delta != base + rel:
        return 0, base
    return position, header.base_offset


def _decode_range(fd: int, path: str, position: int, size: int, topic: str, partition: int,
                  start: int, end: int) -> Iterator[pa.RecordBatch]:
    """decode_segment over bytes [position, size) of the open file, rows in [start, end). Far
    into a file, the bytes are first copied to a temporary file (decode_segment reads from byte
    0); errors name the real file and position."""
    if size <= position:
        return
    bounds = {"topic": topic, "partition": partition, "start_offset": start, "end_offset": end}
    if position < _COPY_FROM:
        yield from _decode(_fd_path(fd, path), size, 0, path, bounds)
        return
    with tempfile.NamedTemporaryFile(prefix="eventlog-stream-") as tmp:
        _copy(fd, tmp.fileno(), position, size - position)
        yield from _decode(tmp.name, size - position, position, path, bounds)


def _decode(source: str, size: int, shift: int, path: str, bounds: dict) -> Iterator[pa.RecordBatch]:
    try:
        yield from decode_segment(source, size, **bounds)
    except SnapshotCorruptError as exc:
        raise SnapshotCorruptError(path, exc.position + shift, exc.reason) from None


def _fd_path(fd: int, path: str) -> str:
    """A name for the open file itself (Linux), so a rename or unlink after opening is harmless."""
    proc = f"/proc/self/fd/{fd}"
    return proc if os.path.exists(proc) else path


def _copy(source: int, dest: int, position: int, count: int) -> None:
    done = 0
    while done < count:
        try:
            n = os.copy_file_range(source, dest, count - done, position + done, done)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            data = os.pread(source, min(count - done, 8 << 20), position + done)
            n = os.pwrite(dest, data, done) if data else 0
        if n == 0:
            raise OSError(errno.EIO, f"the file ends {count - done} bytes short of the range being read")
        done += n
