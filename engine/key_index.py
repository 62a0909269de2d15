"""The per-key index of a partition: which offsets hold a key's records, and its latest one.

A key is an aggregate's stream (docs/API.md, "Per-key event streams"). Reading one key's
history, or appending only if the key is unchanged, must not scan the partition, so the
partition's writer indexes every keyed record it appends:

* The active segment's entries live in memory (ActiveKeys): per record with a key, its key
  hash and offset, and a chain from each entry to the previous one of the same hash, so one
  key's offsets are found newest first without a scan; and per hash the newest entry.
* A closed segment's entries are an immutable file beside it, `<base offset>.keyindex`
  (ClosedKeys; format below), written when the segment rolls, searched with numpy. Kafka
  ignores the file (its loader looks at .log, .index, .timeindex and .txnindex), so a data dir
  stays one Kafka can adopt, and it stays out of snapshots.
* A key hash is the key's XXH3-64 (seed 0; xxhash, a stable spec). Two keys may share a hash:
  every reader of this index compares the stored key bytes of the records it is pointed at
  (key_reads.py), so a collision costs reads, never a wrong answer.

File format (little-endian), `<base offset>.keyindex`:

    header, 48 bytes: magic b"EVKI", u16 version (1), u16 flags (0),
                      i64 base offset, i64 next offset (the segment's, when written),
                      i64 log size (the segment's .log bytes, when written), u64 count,
                      u32 CRC-32C of the body, u32 unused
    body: count u64 key hashes, ascending; then count u32 offset deltas (offset - base
          offset), ascending within one hash

12 bytes per keyed record. A file whose magic, version, CRC, base offset, next offset or log
size does not match its segment (damaged, torn, or left by a segment that compaction replaced
at the same base offset) is not used: the index is rebuilt from the segment (every batch's
keys) and written again, as Kafka rebuilds a missing offset index. The file is never fsynced:
it is derived data, and the checks above catch whatever a crash leaves. Retention and
compaction remove a segment's file with it (PartitionLog.delete_segments, replace_segments);
recovery removes files whose segment is gone.

Crash story: appends never wait for this file. A crash before a roll finished writing it
leaves a torn or missing file: rebuilt on first use. The active segment's entries are rebuilt
by scanning the active segment on first use after a start (load_active), for a partition
whose topic has `eventlog.key.index` on (the default).

Threads: the writer (its commit thread) adds entries; readers (the event loop, worker
threads) look them up concurrently. Entries are appended to arrays before the hash's newest
entry is moved to them, and readers look no further than the published high watermark, so a
reader never follows an entry that is half made. Loading a closed segment's file takes
`_lock`.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import weakref
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np
import xxhash
from crc32c import crc32c

from . import filenames
from .format import CONTROL_BIT
from .records import split_records

if TYPE_CHECKING:
    from .segment import LogSegment
    from .segments import LogView

logger = logging.getLogger("eventlog.engine")

KEY_INDEX_SUFFIX = ".keyindex"
MAGIC = b"EVKI"
VERSION = 1
HEADER = struct.Struct("<4sHHqqqQII")
NO_OFFSET = -1
REBUILD_CHUNK_BYTES = 4 * 1024 * 1024  # a rebuild reads the segment this much at a time


key_hash = xxhash.xxh3_64_intdigest  # the index's 64-bit hash of a key (bytes -> int)


def key_index_file(directory: Path, base_offset: int) -> Path:
    return directory / f"{filenames.base_name(base_offset)}{KEY_INDEX_SUFFIX}"


class _Tail:
    """The newest entries of an active segment, in append order: per entry its hash, offset and
    the entry before it with the same hash, and per hash its newest entry."""

    __slots__ = ("hashes", "heads", "offsets", "previous")

    def __init__(self) -> None:
        self.hashes = array("Q")
        self.offsets = array("q")
        self.previous = array("q")  # the entry before this one with the same hash, or -1
        self.heads: dict[int, int] = {}  # hash -> its newest entry

    def newest_first(self, h: int) -> Iterator[int]:
        entry = self.heads.get(h, -1)
        offsets, previous = self.offsets, self.previous
        while 0 <= entry < len(previous):
            yield offsets[entry]
            entry = previous[entry]


class ActiveKeys:
    """The active segment's keyed records. The newest (up to TAIL_ENTRIES) are a chain per hash
    in a dict; older ones are sorted runs (numpy, 12 bytes an entry), spilled from the tail and
    merged while a run is at least half its elder's size (up to MERGE_ENTRIES), so a lookup
    searches a few runs and the memory of a segment with 10 M keys stays ~120 MB, not the ~1 GB
    a dict of them would hold. The writer replaces `state` whole when it spills: a reader takes
    it once and reads a consistent set."""

    TAIL_ENTRIES = 65_536
    MERGE_ENTRIES = 4 * 1024 * 1024

    __slots__ = ("base_offset", "entries", "state")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.state: tuple[tuple[ClosedKeys, ...], _Tail] = ((), _Tail())
        self.entries = 0

    def __len__(self) -> int:
        return self.entries

    def add(self, h: int, offset: int) -> None:
        self.add_many([h], [offset])

    def add_many(self, hashes: list[int], offsets: list[int]) -> None:
        """Each (hash, offset), in order (a batch's keyed records)."""
        runs, tail = self.state
        heads = tail.heads
        get = heads.get
        entry = len(tail.offsets)
        previous = []
        for h in hashes:
            previous.append(get(h, -1))
            heads[h] = entry
            entry += 1
        # a reader that finds a head before its entry is appended sees an index past the end
        # and stops there (it looks no further than what is published anyway)
        tail.hashes.extend(hashes)
        tail.offsets.extend(offsets)
        tail.previous.extend(previous)
        self.entries += len(hashes)
        if len(tail.offsets) >= self.TAIL_ENTRIES:
            self._spill()

    def _spill(self) -> None:
        runs, tail = self.state
        merged = [*runs, _sorted(self.base_offset, np.array(tail.hashes, dtype=np.uint64),
                                 np.array(tail.offsets, dtype=np.int64))]
        while len(merged) >= 2 and 2 * len(merged[-1]) >= len(merged[-2]) and len(merged[-1]) + len(merged[-2]) <= self.MERGE_ENTRIES:
            newer, older = merged.pop(), merged.pop()
            merged.append(_merge(self.base_offset, older, newer))
        self.state = (tuple(merged), _Tail())

    def newest_first(self, h: int) -> Iterator[int]:
        """The offsets of hash `h`, newest first."""
        runs, tail = self.state
        yield from tail.newest_first(h)
        for run in reversed(runs):
            yield from reversed(run.offsets_of(h).tolist())

    def freeze(self) -> ClosedKeys:
        runs, tail = self.state
        whole = _sorted(self.base_offset, np.array(tail.hashes, dtype=np.uint64), np.array(tail.offsets, dtype=np.int64))
        for run in runs:
            whole = _merge(self.base_offset, run, whole)
        return whole

    def memory_bytes(self) -> int:
        """About what the entries hold in memory (the runs' arrays, the tail's and its dict)."""
        runs, tail = self.state
        return sum(12 * len(r) for r in runs) + 24 * len(tail.offsets) + 100 * len(tail.heads)


def _sorted(base_offset: int, hashes: np.ndarray, offsets: np.ndarray) -> ClosedKeys:
    deltas = (offsets - base_offset).astype(np.uint32)
    order = np.lexsort((deltas, hashes))
    return ClosedKeys(base_offset, hashes[order], deltas[order])


def _merge(base_offset: int, older: ClosedKeys, newer: ClosedKeys) -> ClosedKeys:
    hashes = np.concatenate((older.hashes, newer.hashes))
    deltas = np.concatenate((older.deltas, newer.deltas))
    order = np.lexsort((deltas, hashes))
    return ClosedKeys(base_offset, hashes[order], deltas[order])


class ClosedKeys:
    """A closed segment's keyed records: hashes ascending, offset deltas ascending per hash."""

    __slots__ = ("base_offset", "deltas", "hashes")

    def __init__(self, base_offset: int, hashes: np.ndarray, deltas: np.ndarray) -> None:
        self.base_offset = base_offset
        self.hashes = hashes
        self.deltas = deltas

    def __len__(self) -> int:
        return len(self.hashes)

    def offsets_of(self, h: int) -> np.ndarray:
        """The offsets of hash `h`, ascending (int64)."""
        q = np.uint64(h)
        lo = int(np.searchsorted(self.hashes, q, "left"))
        hi = int(np.searchsorted(self.hashes, q, "right"))
        return self.deltas[lo:hi].astype(np.int64) + self.base_offset

    # -- the file -----------------------------------------------------------------------------

    def write(self, path: Path, next_offset: int, log_size: int) -> None:
        """Write the file (through a temporary name, so a reader never sees half of one)."""
        body = self.hashes.astype("<u8").tobytes() + self.deltas.astype("<u4").tobytes()
        header = HEADER.pack(MAGIC, VERSION, 0, self.base_offset, next_offset, log_size, len(self.hashes), crc32c(body), 0)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(body)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def read(cls, path: Path, base_offset: int, next_offset: int, log_size: int) -> ClosedKeys | None:
        """The file's entries if it is whole and belongs to this segment; None otherwise. The
        arrays are views of the file mapped read-only: the page cache holds them, not the heap."""
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < HEADER.size:
                    return None
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            return None
        magic, version, _flags, base, nxt, logged, count, crc, _ = HEADER.unpack_from(data)
        if (magic, version, base, nxt, logged) != (MAGIC, VERSION, base_offset, next_offset, log_size):
            return None
        if size != HEADER.size + 12 * count:
            return None
        with memoryview(data) as whole:
            if crc32c(whole[HEADER.size:]) != crc:
                return None
        hashes = np.frombuffer(data, dtype="<u8", count=count, offset=HEADER.size)
        deltas = np.frombuffer(data, dtype="<u4", count=count, offset=HEADER.size + 8 * count)
        return cls(base_offset, hashes, deltas)


def segment_keys(segment: LogSegment, end_position: int) -> Iterator[tuple[int, bytes]]:
    """(offset, key) of every keyed record in the segment's first `end_position` bytes, in
    offset order (control batches skipped)."""
    from .scan import scan_headers

    handle = segment.open_handle()
    chunk = b""
    chunk_start = 0
    for header in scan_headers(handle.fd, 0, end_position):
        if header.attributes & CONTROL_BIT:
            continue
        start, end = header.position, header.position + header.size
        if not (chunk_start <= start and end <= chunk_start + len(chunk)):
            chunk_start = start
            chunk = os.pread(handle.fd, max(header.size, min(REBUILD_CHUNK_BYTES, end_position - start)), start)
        fields = split_records(chunk, header, start - chunk_start, with_keys=True)
        assert fields.keys is not None
        for offset, key in zip(fields.offsets, fields.keys):
            if key is not None:
                yield offset, key


class KeyIndex:
    """A partition's key index (its writer's; readers use lookups)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.active: ActiveKeys | None = None  # None until loaded (load_active)
        self._closed: weakref.WeakKeyDictionary[LogSegment, ClosedKeys] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.rebuilt_files = 0

    # -- the writer ---------------------------------------------------------------------------

    def load_active(self, segment: LogSegment, end_position: int) -> ActiveKeys:
        """The active segment's entries, scanned from its first `end_position` bytes if not
        loaded yet (after a start, or after an undone append)."""
        active = self.active
        if active is not None and active.base_offset == segment.base_offset:
            return active
        with self._lock:
            active = self.active
            if active is None or active.base_offset != segment.base_offset:
                active = ActiveKeys(segment.base_offset)
                for offset, key in segment_keys(segment, end_position):
                    active.add(key_hash(key), offset)
                self.active = active
        return active

    def rolled(self, old: LogSegment, new_base_offset: int) -> None:
        """`old` was closed: its entries become its file; the new active segment starts empty."""
        active = self.active
        if active is not None and active.base_offset == old.base_offset:
            closed = active.freeze()
            try:
                closed.write(key_index_file(self.directory, old.base_offset), old.next_offset, old.size)
            except OSError as exc:  # derived data: rebuilt on first use
                logger.warning("%s: key index of %s not written: %s", self.directory.name, old.name, exc)
            self._closed[old] = closed
        self.active = ActiveKeys(new_base_offset)

    def forget_active(self) -> None:
        """Drop the active segment's entries (an undone append): rebuilt on next use."""
        self.active = None

    # -- lookups (any thread) -----------------------------------------------------------------

    def closed_keys(self, segment: LogSegment) -> ClosedKeys:
        """A closed segment's entries: from its file, else rebuilt from the segment (and the
        file written again). Blocking I/O."""
        keys = self._closed.get(segment)
        if keys is not None:
            return keys
        with self._lock:
            keys = self._closed.get(segment)
            if keys is not None:
                return keys
            path = key_index_file(segment.directory, segment.base_offset)
            keys = ClosedKeys.read(path, segment.base_offset, segment.next_offset, segment.size)
            if keys is None:
                active = ActiveKeys(segment.base_offset)
                for offset, key in segment_keys(segment, segment.size):
                    active.add(key_hash(key), offset)
                keys = active.freeze()
                self.rebuilt_files += 1
                if segment.suffix == "":
                    try:
                        keys.write(path, segment.next_offset, segment.size)
                    except OSError as exc:
                        logger.warning("%s: key index of %s not written: %s", self.directory.name, segment.name, exc)
            self._closed[segment] = keys
            return keys

    def offsets_after(self, view: LogView, h: int, after: int, limit: int) -> list[int]:
        """Up to `limit` offsets of hash `h` above `after`, ascending, below the view's high
        watermark and at or above its log start offset."""
        floor = max(after + 1, view.log_start_offset)
        top = view.high_watermark
        out: list[int] = []
        if floor >= top:
            return out
        segments = view.segments
        first = view.segment_index_for(floor)
        for i in range(first, len(segments)):
            segment = segments[i]
            if i == len(segments) - 1:
                active = self.load_active(segment, view.active_end)
                found = [o for o in active.newest_first(h) if floor <= o < top]
                found.reverse()
            else:
                offsets = self.closed_keys(segment).offsets_of(h)
                found = offsets[(offsets >= floor) & (offsets < top)].tolist()
            out.extend(found[: limit - len(out)])
            if len(out) >= limit:
                break
        return out

    def newest_first(self, view: LogView, h: int) -> Iterator[int]:
        """The offsets of hash `h` in the view, newest first."""
        floor, top = view.log_start_offset, view.high_watermark
        segments = view.segments
        for i in range(len(segments) - 1, -1, -1):
            segment = segments[i]
            if i == len(segments) - 1:
                for o in self.load_active(segment, view.active_end).newest_first(h):
                    if o < floor:
                        return
                    if o < top:
                        yield o
            else:
                for o in reversed(self.closed_keys(segment).offsets_of(h).tolist()):
                    if o < floor:
                        return
                    if o < top:
                        yield o

    def memory_bytes(self) -> int:
        active = self.active
        return (active.memory_bytes() if active is not None else 0) + sum(
            12 * len(k) for k in list(self._closed.values())
        )


def remove_key_index(directory: Path, base_offset: int) -> None:
    """Unlink a segment's key index file, if any (the segment is leaving)."""
    try:
        os.unlink(key_index_file(directory, base_offset))
    except FileNotFoundError:
        pass
