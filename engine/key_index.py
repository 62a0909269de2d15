"""The per-key index of a partition: which offsets hold a key's records, and its latest one.

A key is an aggregate's stream (docs/API.md, "Per-key event streams"). Reading one key's
history, or appending only if the key is unchanged, must not scan the partition, so the
partition's writer indexes every keyed record it appends:

* An entry is per record with a key: its key hash, its offset, and the position of its batch
  in the segment (so a reader reads that batch without searching the offset index).
* The active segment's entries live in memory (ActiveKeys): the newest in arrays, older ones in
  sorted runs.
* A closed segment's entries are an immutable file beside it, `<base offset>.keyindex`
  (ClosedKeys; format below), written when the segment rolls, or by the log cleaner with each
  segment it makes (workers/cleaner.py), searched with numpy. Kafka
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
          offset), ascending within one hash; then count u32 batch positions (where the
          record's batch starts in the .log)

16 bytes per keyed record. A file whose magic, version, CRC, base offset, next offset or log
size does not match its segment (damaged, torn, or left by a segment that compaction replaced
at the same base offset) is not used: the index is rebuilt from the segment (every batch's
keys) and written again, as Kafka rebuilds a missing offset index. A roll's or a rebuild's file
is never fsynced: it is derived data, and the checks above catch whatever a crash leaves.
Retention and compaction remove a segment's file with it (PartitionLog.delete_segments,
replace_segments); recovery removes files whose segment is gone.

Compaction: the cleaner has every key of a segment it writes in hand, so it writes that
segment's file too (ActiveKeys.add_keys per batch, as a rebuild does: the same bytes), as
`<base>.keyindex.cleaned`, fsynced with the segment's other files; the swap renames it with them
(LogSegment.change_suffix: .cleaned -> .swap -> live, the key index last), and recovery treats
it as one of them (recovery.py, steps 2-3). So the first per-key reads after a pass find the
file ready instead of rebuilding it on the read path (issue 28), and a crash at any step leaves
the old segments or the new ones, each with its own file or none, never another's.

Crash story: appends never wait for this file. A crash before a roll finished writing it
leaves a torn or missing file: rebuilt on first use.

The active segment after a restart (issue 28: a restart costs O(1) per partition, not
O(active segment)). A clean shutdown writes the active segment's entries as its
`<base>.keyindex` too (KeyIndex.write_active: the same format, stamped with the segment's next
offset and size at close, not fsynced; skipped when the file there already holds them). After
a start, the writer's first append does not read the segment: it makes the active entries
*pending* (ActiveKeys with prefix_end = the segment's size then) and adds its own entries from
there, while one background thread (_Loader) loads the entries of [0, prefix_end): from that
file when it matches the segment exactly as a closed segment's must (base offset, next offset,
size, CRC), else by scanning those bytes (after a crash, or when no file was written). What
uses the entries before the load is done waits for it, and nothing else does: a per-key read
(load_active, in a worker thread: it loads the prefix itself if the thread has not got to it
yet), an append with a per-key condition (PartitionLog.append waits in a worker thread before
its request is queued, never in the commit thread), and a clean shutdown, which then leaves the
file as it was instead of waiting. A roll while the prefix is pending writes no file for the
closed segment (its first per-key read rebuilds it). Such a file is stale once the segment has
grown, and then never matches it; recovery removes the file of any segment it had to repair
(recovery.py), so a file can never claim offsets or positions its segment does not hold.

Threads: the writer (its commit thread) adds entries; readers (the event loop, worker
threads) look them up concurrently, no further than the published high watermark. The active
segment's tail arrays are extended and read under ActiveKeys.lock; loading a closed segment's
file takes KeyIndex._lock.
"""

from __future__ import annotations

import logging
import os
import queue
import struct
import threading
import time
import weakref
from array import array
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np
import xxhash
from crc32c import crc32c

from . import filenames
from .format import CONTROL_BIT
from .mapping import map_read_only
from .records import split_records

if TYPE_CHECKING:
    from .segment import LogSegment
    from .segments import LogView

logger = logging.getLogger("eventlog.engine")

KEY_INDEX_SUFFIX = filenames.KEY_INDEX_SUFFIX
MAGIC = b"EVKI"
VERSION = 1
HEADER = struct.Struct("<4sHHqqqQII")
ENTRY_BYTES = 16  # hash, offset delta, batch position
REBUILD_CHUNK_BYTES = 4 * 1024 * 1024  # a rebuild reads the segment this much at a time


key_hash = xxhash.xxh3_64_intdigest  # the index's 64-bit hash of a key (bytes -> int)


key_index_file = filenames.key_index_file  # (directory, base offset, suffix="") -> its path


class _Tail:
    """The newest entries of an active segment, in append order (hash, offset, batch position)."""

    __slots__ = ("hashes", "offsets", "positions")

    def __init__(self) -> None:
        self.hashes = array("Q")
        self.offsets = array("q")
        self.positions = array("I")

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies (the caller holds the lock)."""
        return (np.array(self.hashes, dtype=np.uint64), np.array(self.offsets, dtype=np.int64),
                np.array(self.positions, dtype=np.uint32))


class ActiveKeys:
    """The active segment's keyed records. The newest (up to TAIL_ENTRIES) are two arrays in
    append order, scanned with numpy on lookup; older ones are sorted runs (12 bytes an entry),
    spilled from the tail and merged FAN_IN at a time once that many of one size tier pile up
    (up to MERGE_ENTRIES), so an entry is merged about twice in a 10 M-entry segment, a lookup
    searches some twenty runs at most, and the memory of a segment with 10 M keys stays ~120 MB
    where a dict of them would hold ~1 GB. The writer replaces `state` whole when it spills: a
    reader takes it once and reads a consistent set; the tail's arrays are read and extended
    under `lock` (an array that a reader's view holds cannot grow)."""

    TAIL_ENTRIES = 65_536
    FAN_IN = 8
    MERGE_ENTRIES = 4 * 1024 * 1024

    __slots__ = (
        "base_offset", "entries", "lock", "scanned_to", "state", "prefix", "prefix_end",
        "prefix_next_offset", "prefix_ready", "prefix_source", "cancelled", "_prefix_lock",
    )

    def __init__(
        self, base_offset: int, prefix_end: int = 0, prefix_next_offset: int | None = None
    ) -> None:
        self.base_offset = base_offset
        self.state: tuple[tuple[ClosedKeys, ...], _Tail] = ((), _Tail())
        self.entries = 0
        self.lock = threading.Lock()
        # the segment's bytes its entries cover: [0, scanned_to), a batch boundary; those of
        # [0, prefix_end) are `prefix` (loaded by load_prefix), the rest the runs and the tail
        self.scanned_to = prefix_end
        self.prefix: ClosedKeys | None = None
        self.prefix_end = prefix_end
        # the segment's next offset when it was prefix_end bytes (what its file must say)
        self.prefix_next_offset = base_offset if prefix_next_offset is None else prefix_next_offset
        self.prefix_ready = threading.Event()  # set once `prefix` holds [0, prefix_end)
        self.prefix_source = ""  # "file" or "scan", once loaded (tests and logs)
        self.cancelled = False  # no longer the log's: the background load skips it
        self._prefix_lock = threading.Lock()
        if prefix_end == 0:
            self.prefix_ready.set()

    def __len__(self) -> int:
        prefix = self.prefix
        return self.entries + (len(prefix) if prefix is not None else 0)

    def load_prefix(self, segment: LogSegment, *, background: bool = False) -> None:
        """Load the entries of the segment's first prefix_end bytes, once: from its
        `.keyindex` when that matches the segment as it was then, else by scanning them.
        Blocking; whoever comes second waits for the first (the background thread or a reader).
        `background`: the loader thread's scan gives the GIL up after every batch (_scan_into)."""
        if self.prefix_ready.is_set():
            return
        with self._prefix_lock:
            if self.prefix_ready.is_set():
                return
            path = key_index_file(segment.directory, self.base_offset)
            keys = ClosedKeys.read(path, self.base_offset, self.prefix_next_offset, self.prefix_end)
            source = "file"
            if keys is None:
                scanned = ActiveKeys(self.base_offset)
                _scan_into(scanned, segment, self.prefix_end, yield_gil=background)
                keys = scanned.freeze()
                source = "scan"
            self.prefix = keys
            self.prefix_source = source
            self.prefix_ready.set()

    def add(self, h: int, offset: int, position: int) -> None:
        self.add_many([h], [offset], position)

    def add_many(self, hashes: list[int] | np.ndarray, offsets: Sequence[int], position: int) -> None:
        """Each (hash, offset), in order: the keyed records of the batch at `position`."""
        tail = self.state[1]
        n = len(hashes)
        if n >= 32 and isinstance(offsets, range):  # a batch numbered without gaps: copied as bytes
            h = np.asarray(hashes, dtype=np.uint64).tobytes()
            o = np.arange(offsets.start, offsets.stop, dtype=np.int64).tobytes()
            p = np.full(n, position, dtype=np.uint32).tobytes()
            with self.lock:
                before = len(tail.offsets)
                tail.hashes.frombytes(h)
                tail.offsets.frombytes(o)
                tail.positions.frombytes(p)
                size = len(tail.offsets)
        else:
            if isinstance(hashes, np.ndarray):
                hashes = hashes.tolist()
            with self.lock:
                before = len(tail.offsets)
                tail.hashes.extend(hashes)
                tail.offsets.extend(offsets)
                tail.positions.extend(repeat(position, n))
                size = len(tail.offsets)
        self.entries += size - before
        if size >= self.TAIL_ENTRIES:
            self._spill()

    def add_keys(self, offsets: Sequence[int], keys: list[bytes], position: int) -> None:
        """The keyed records (offsets, keys) of the batch at `position`: what a rebuild adds per
        batch, and the cleaner per batch it writes (workers/cleaner.py), so both make one file."""
        self.add_many(np.fromiter(map(key_hash, keys), np.uint64, len(keys)), offsets, position)

    def _spill(self) -> None:
        runs, tail = self.state
        with self.lock:
            arrays = tail.arrays()
        merged = [*runs, _sorted(self.base_offset, *arrays)]
        while len(merged) >= self.FAN_IN:
            group = merged[-self.FAN_IN:]
            if len(group[0]) > 2 * len(group[-1]) or sum(len(r) for r in group) > self.MERGE_ENTRIES:
                break  # not one size tier, or too big to merge again
            del merged[-self.FAN_IN:]
            merged.append(_merge(self.base_offset, group))
        self.state = (tuple(merged), _Tail())

    def newest_first(self, h: int) -> Iterator[tuple[int, int]]:
        """(offset, batch position) of hash `h`, newest first."""
        runs, tail = self.state
        with self.lock:
            hashes, offsets, positions = tail.arrays()
        mine = hashes == np.uint64(h)
        yield from zip(reversed(offsets[mine].tolist()), reversed(positions[mine].tolist()))
        prefix = self.prefix
        for run in reversed(runs) if prefix is None else (*reversed(runs), prefix):
            offsets, positions = run.entries_of(h)
            yield from zip(reversed(offsets.tolist()), reversed(positions.tolist()))

    def freeze(self) -> ClosedKeys:
        """Every entry, sorted by hash and then offset (a closed segment's file's order). The
        prefix must be loaded (prefix_ready)."""
        runs, tail = self.state
        if self.prefix is not None:
            runs = (self.prefix, *runs)
        with self.lock:
            hashes, offsets, positions = tail.arrays()
        hashes = np.concatenate([r.hashes for r in runs] + [hashes])
        deltas = np.concatenate([r.deltas for r in runs] + [(offsets - self.base_offset).astype(np.uint32)])
        positions = np.concatenate([r.positions for r in runs] + [positions])
        order = np.lexsort((deltas, hashes))
        return ClosedKeys(self.base_offset, hashes[order], deltas[order], positions[order])

    def memory_bytes(self) -> int:
        """About what the entries hold in memory (the runs' arrays and the tail's)."""
        runs, tail = self.state
        prefix = 16 * len(self.prefix) if self.prefix is not None else 0  # (a file's: mapped)
        return prefix + sum(16 * len(r) for r in runs) + 20 * len(tail.offsets)


def _sorted(base_offset: int, hashes: np.ndarray, offsets: np.ndarray, positions: np.ndarray) -> ClosedKeys:
    """Entries sorted by hash (quicksort: 6 x a stable sort's speed here; one hash's entries
    may come in any order within the run, and ClosedKeys.entries_of orders them)."""
    deltas = (offsets - base_offset).astype(np.uint32)
    order = np.argsort(hashes, kind="quicksort")
    return ClosedKeys(base_offset, hashes[order], deltas[order], positions[order])


def _merge(base_offset: int, runs: list[ClosedKeys]) -> ClosedKeys:
    """Runs sorted by hash, into one (a stable sort of them end to end: timsort merges them)."""
    if len(runs) == 1:
        return runs[0]
    hashes = np.concatenate([r.hashes for r in runs])
    deltas = np.concatenate([r.deltas for r in runs])
    positions = np.concatenate([r.positions for r in runs])
    order = np.argsort(hashes, kind="stable")
    return ClosedKeys(base_offset, hashes[order], deltas[order], positions[order])


class ClosedKeys:
    """A closed segment's keyed records: hashes ascending, offset deltas ascending per hash, and
    each one's batch position."""

    __slots__ = ("base_offset", "deltas", "hashes", "positions")

    def __init__(self, base_offset: int, hashes: np.ndarray, deltas: np.ndarray, positions: np.ndarray) -> None:
        self.base_offset = base_offset
        self.hashes = hashes
        self.deltas = deltas
        self.positions = positions

    def __len__(self) -> int:
        return len(self.hashes)

    def entries_of(self, h: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets as int64, batch positions) of hash `h`, offsets ascending."""
        q = np.uint64(h)
        lo = int(np.searchsorted(self.hashes, q, "left"))
        hi = int(np.searchsorted(self.hashes, q, "right"))
        deltas, positions = self.deltas[lo:hi], self.positions[lo:hi]
        if hi - lo > 1:  # an active segment's run keeps one hash's entries in any order
            order = np.argsort(deltas, kind="stable")
            deltas, positions = deltas[order], positions[order]
        return deltas.astype(np.int64) + self.base_offset, positions

    def offsets_of(self, h: int) -> np.ndarray:
        """The offsets of hash `h`, ascending (int64)."""
        return self.entries_of(h)[0]

    # -- the file -----------------------------------------------------------------------------

    def encode(self, next_offset: int, log_size: int) -> bytes:
        """The file's bytes, for the segment with this next offset and .log size."""
        body = self.hashes.astype("<u8").tobytes() + self.deltas.astype("<u4").tobytes() + self.positions.astype("<u4").tobytes()
        header = HEADER.pack(MAGIC, VERSION, 0, self.base_offset, next_offset, log_size, len(self.hashes), crc32c(body), 0)
        return header + body

    def write(self, path: Path, next_offset: int, log_size: int) -> None:
        """Write the file (through a temporary name, so a reader never sees half of one)."""
        data = self.encode(next_offset, log_size)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def read(cls, path: Path, base_offset: int, next_offset: int, log_size: int) -> ClosedKeys | None:
        """The file's entries if it is whole and belongs to this segment; None otherwise. The
        arrays are views of the file mapped read-only: the page cache holds them, not the heap.
        The mapping holds no descriptor (mapping.py: Python's mmap kept a duplicate open for as
        long as the map lived, one per partition whose key index was loaded, outside the
        descriptor budget: issue 28 met EMFILE with them)."""
        try:
            size = os.stat(path).st_size
            if size < HEADER.size:
                return None
            data = map_read_only(path, size)
        except (FileNotFoundError, ValueError):  # gone, or replaced by a shorter one since
            return None
        magic, version, _flags, base, nxt, logged, count, crc, _ = HEADER.unpack_from(data)
        if (magic, version, base, nxt, logged) != (MAGIC, VERSION, base_offset, next_offset, log_size):
            return None
        if size != HEADER.size + ENTRY_BYTES * count:
            return None
        if crc32c(memoryview(data)[HEADER.size:]) != crc:
            return None
        hashes = np.frombuffer(data, dtype="<u8", count=count, offset=HEADER.size)
        deltas = np.frombuffer(data, dtype="<u4", count=count, offset=HEADER.size + 8 * count)
        positions = np.frombuffer(data, dtype="<u4", count=count, offset=HEADER.size + 12 * count)
        return cls(base_offset, hashes, deltas, positions)


def segment_keys(
    segment: LogSegment, end_position: int, start_position: int = 0, *, yield_gil: bool = False
) -> Iterator[tuple[list[int], list[bytes], int]]:
    """(offsets, keys, batch position) of the keyed records of each batch in the segment's bytes
    [start_position, end_position) (batch boundaries), in offset order (control batches skipped).
    `yield_gil`: sleep(0) after each batch, keyless ones included (_scan_into says why)."""
    from .scan import scan_headers

    handle = segment.open_handle()
    chunk = b""
    chunk_start = 0
    for header in scan_headers(handle.fd, start_position, end_position):
        if yield_gil:
            time.sleep(0)
        if header.attributes & CONTROL_BIT:
            continue
        start, end = header.position, header.position + header.size
        if not (chunk_start <= start and end <= chunk_start + len(chunk)):
            chunk_start = start
            chunk = os.pread(handle.fd, max(header.size, min(REBUILD_CHUNK_BYTES, end_position - start)), start)
        fields = split_records(chunk, header, start - chunk_start, with_keys=True)
        assert fields.keys is not None
        if None in fields.keys:
            pairs = [(o, k) for o, k in zip(fields.offsets, fields.keys) if k is not None]
            if pairs:
                yield [o for o, _k in pairs], [k for _o, k in pairs], start
        elif fields.keys:
            yield fields.offsets, fields.keys, start


class _Loader:
    """One daemon thread that loads pending active entries (ActiveKeys.load_prefix) in the
    order their partitions first appended after a start: one at a time, so a restart's loads
    do not take every core from the appends they make room for. A daemon thread, not an
    executor's, so that a process exiting never waits for a scan (the entries are derived)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[ActiveKeys, LogSegment]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, active: ActiveKeys, segment: LogSegment) -> None:
        self._jobs.put((active, segment))
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    name = "eventlog-keyindex-load"
                    thread = threading.Thread(target=self._run, name=name, daemon=True)
                    thread.start()
                    self._thread = thread

    def _run(self) -> None:
        while True:
            active, segment = self._jobs.get()
            if active.cancelled or active.prefix_ready.is_set():
                continue
            try:
                active.load_prefix(segment, background=True)
            except Exception as exc:  # (a segment closed under it, say): whoever needs it loads it
                where = f"{segment.directory.name}/{segment.name}"
                logger.debug("%s: key index not loaded in the background: %r", where, exc)


_LOADER = _Loader()


class KeyIndex:
    """A partition's key index (its writer's; readers use lookups)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.active: ActiveKeys | None = None  # None until loaded (load_active)
        self._closed: weakref.WeakKeyDictionary[LogSegment, ClosedKeys] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.rebuilt_files = 0

    # -- the writer ---------------------------------------------------------------------------

    def active_for_append(self, segment: LogSegment) -> ActiveKeys:
        """The writer's entries for the active segment, never reading its bytes here: when
        none are loaded (after a start, or an undone append) they start pending at the
        segment's end, their prefix loaded by the background thread (the module's docstring)."""
        active = self.active
        base = segment.base_offset
        if active is None or active.base_offset != base or active.scanned_to < segment.size:
            with self._lock:
                active = self.active
                if active is None or active.base_offset != segment.base_offset:
                    active = ActiveKeys(segment.base_offset, segment.size, segment.next_offset)
                    self.active = active
                    if not active.prefix_ready.is_set():
                        _LOADER.submit(active, segment)
                elif active.scanned_to < segment.size:  # (made by a reader from an older view)
                    _scan_into(active, segment, segment.size)
        return active

    def load_active(self, segment: LogSegment, end_position: int) -> ActiveKeys:
        """The active segment's entries, loaded and covering at least its first `end_position`
        bytes (a reader's, or a per-key condition's; blocking: it waits for a pending prefix, or
        loads it itself): loaded when not yet (after a start, or an undone append), and brought
        up to `end_position` when they cover less (a reader that loaded them from an older
        view of the log)."""
        active = self.active
        if active is None or active.base_offset != segment.base_offset:
            with self._lock:
                active = self.active
                if active is None or active.base_offset != segment.base_offset:
                    active = ActiveKeys(segment.base_offset, end_position, segment.next_offset)
                    self.active = active
        active.load_prefix(segment)
        if active.scanned_to < end_position:
            with self._lock:
                if active.scanned_to < end_position:
                    _scan_into(active, segment, end_position)
        return active

    def active_ready(self) -> bool:
        """Whether the active entries are loaded (a per-key condition reads them at once)."""
        active = self.active
        return active is not None and active.prefix_ready.is_set()

    def rolled(self, old: LogSegment, new_base_offset: int) -> None:
        """`old` was closed: its entries become its file (unless they are still pending: then
        its first per-key read rebuilds it); the new active segment starts empty."""
        active = self.active
        if active is not None and active.base_offset == old.base_offset:
            if active.scanned_to < old.size:  # (loaded by a reader from an older view)
                with self._lock:
                    _scan_into(active, old, old.size)
            if active.prefix_ready.is_set():
                self._closed[old] = self._write(active.freeze(), old)
            else:
                active.cancelled = True
                remove_key_index(self.directory, old.base_offset)  # a clean shutdown's: stale
        self.active = ActiveKeys(new_base_offset)

    def write_active(self, segment: LogSegment) -> bool:
        """Clean shutdown: write the active segment's entries as its `.keyindex`, so the next
        start loads them instead of scanning the segment. Not when they are not loaded or do
        not cover the segment (the next start scans, in the background), nor when the file
        there already holds them (loaded from it, nothing added since). True if written."""
        active = self.active
        if (
            active is None or active.base_offset != segment.base_offset or segment.size == 0
            or not active.prefix_ready.is_set() or active.scanned_to != segment.size
        ):
            return False
        if active.prefix_source == "file" and active.prefix_end == segment.size:
            return False
        self._write(active.freeze(), segment)
        return True

    def _write(self, keys: ClosedKeys, segment: LogSegment) -> ClosedKeys:
        """Write a segment's file; a failure is logged (derived data: rebuilt on first use)."""
        try:
            path = key_index_file(self.directory, segment.base_offset)
            keys.write(path, segment.next_offset, segment.size)
        except OSError as exc:
            where = f"{self.directory.name}/{segment.name}"
            logger.warning("%s: key index not written: %s", where, exc)
        return keys

    def forget_active(self) -> None:
        """Drop the active segment's entries (an undone append): rebuilt on next use."""
        active = self.active
        if active is not None:
            active.cancelled = True
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
                scanned = ActiveKeys(segment.base_offset)
                _scan_into(scanned, segment, segment.size)
                keys = scanned.freeze()
                self.rebuilt_files += 1
                if segment.suffix == "":
                    try:
                        keys.write(path, segment.next_offset, segment.size)
                    except OSError as exc:
                        logger.warning("%s: key index of %s not written: %s", self.directory.name, segment.name, exc)
            self._closed[segment] = keys
            return keys

    def entries_after(self, view: LogView, h: int, after: int, limit: int) -> list[tuple[int, int]]:
        """Up to `limit` (offset, batch position) of hash `h` with offsets above `after`,
        ascending, below the view's high watermark and at or above its log start offset."""
        floor = max(after + 1, view.log_start_offset)
        top = view.high_watermark
        out: list[tuple[int, int]] = []
        if floor >= top:
            return out
        segments = view.segments
        first = view.segment_index_for(floor)
        for i in range(first, len(segments)):
            segment = segments[i]
            if i == len(segments) - 1:
                active = self.load_active(segment, view.active_end)
                found = [e for e in active.newest_first(h) if floor <= e[0] < top]
                found.reverse()
            else:
                offsets, positions = self.closed_keys(segment).entries_of(h)
                keep = (offsets >= floor) & (offsets < top)
                found = list(zip(offsets[keep].tolist(), positions[keep].tolist()))
            out.extend(found[: limit - len(out)])
            if len(out) >= limit:
                break
        return out

    def newest_first(self, view: LogView, h: int) -> Iterator[tuple[int, int]]:
        """(offset, batch position) of hash `h` in the view, newest first."""
        floor, top = view.log_start_offset, view.high_watermark
        segments = view.segments
        for i in range(len(segments) - 1, -1, -1):
            segment = segments[i]
            if i == len(segments) - 1:
                entries: Iterator[tuple[int, int]] = self.load_active(segment, view.active_end).newest_first(h)
            else:
                offsets, positions = self.closed_keys(segment).entries_of(h)
                entries = zip(reversed(offsets.tolist()), reversed(positions.tolist()))
            for offset, position in entries:
                if offset < floor:
                    return
                if offset < top:
                    yield offset, position



def _scan_into(
    active: ActiveKeys, segment: LogSegment, end_position: int, *, yield_gil: bool = False
) -> None:
    """Add the entries of the segment's bytes from what `active` covers to `end_position`.

    `yield_gil`: sleep(0) after each batch, so that a background scan hands the GIL to a
    waiting thread within one batch's work instead of the interpreter's 5 ms switch interval:
    an append after a crash needs the GIL a few times (event loop, writer thread), and waited up
    to 5 ms each time for a scan of a large active segment (13 ms first appends at 256 MB)."""
    scanned = segment_keys(segment, end_position, active.scanned_to, yield_gil=yield_gil)
    for offsets, keys, position in scanned:
        active.add_keys(offsets, keys, position)
    active.scanned_to = max(active.scanned_to, end_position)


def remove_key_index(directory: Path, base_offset: int) -> None:
    """Unlink a segment's key index file, if any (the segment is leaving)."""
    try:
        os.unlink(key_index_file(directory, base_offset))
    except FileNotFoundError:
        pass
