"""Building a segment's two indexes in memory from its batch headers, then writing them once.

Used by recovery and by the lazy rebuild of a damaged index: the same placement rule as the
writer (see segment.py), applied to headers as a scan meets them, with the entries collected
in bytearrays and the files written whole at the end: atomically (temp file, fsync, rename) for
a closed segment, as the first entries of an appendable index for the active one.

If a segment holds more batches than its indexes can index (a Kafka segment written with a
larger segment.index.bytes), entries stop at capacity: lookups in the tail scan further, and
no data is dropped.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .errors import TransientStorageError
from .fileutil import fsync_dir, io_errors, replace_file
from .format import NO_TIMESTAMP, OFFSET_INDEX_ENTRY, TIME_INDEX_ENTRY
from .offset_index import OffsetIndex
from .time_index import TimeIndex

logger = logging.getLogger("eventlog.engine")


class IndexBuilder:
    def __init__(self, base_offset: int, index_interval_bytes: int, max_index_bytes: int) -> None:
        self.base_offset = base_offset
        self.interval = index_interval_bytes
        self.max_offset_entries = max(max_index_bytes // OffsetIndex.ENTRY_SIZE, 1)
        self.max_time_entries = max(max_index_bytes // TimeIndex.ENTRY_SIZE, 1)
        self.offset_entries = bytearray()
        self.time_entries = bytearray()
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset
        self.first_timestamp: int | None = None
        self._last_indexed_ts = NO_TIMESTAMP
        self._time_count = 0
        self.bytes_since_last_entry = 0

    def add(self, last_offset: int, position: int, size: int, max_timestamp: int) -> None:
        """Account for the batch ending at `last_offset` that starts at `position`."""
        if self.first_timestamp is None:
            self.first_timestamp = max_timestamp
        if max_timestamp > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = max_timestamp, last_offset
        if self.bytes_since_last_entry > self.interval and len(self.offset_entries) // OFFSET_INDEX_ENTRY.size < self.max_offset_entries:
            self.offset_entries += OFFSET_INDEX_ENTRY.pack(last_offset - self.base_offset, position)
            if self._time_count < self.max_time_entries - 1:  # one slot kept for the final entry
                self._maybe_time_entry()
            self.bytes_since_last_entry = 0
        self.bytes_since_last_entry += size

    def _maybe_time_entry(self) -> None:
        if self.max_timestamp > self._last_indexed_ts:
            self.time_entries += TIME_INDEX_ENTRY.pack(self.max_timestamp, self.offset_of_max_timestamp - self.base_offset)
            self._last_indexed_ts = self.max_timestamp
            self._time_count += 1

    def finish_closed(self) -> None:
        """The final time index entry a closed segment gets (its largest timestamp)."""
        if self.max_timestamp != NO_TIMESTAMP and self._time_count < self.max_time_entries:
            self._maybe_time_entry()

    def write_closed(
        self, index_path: Path, time_path: Path, max_index_bytes: int, *, in_memory_if_full: bool = False
    ) -> tuple[OffsetIndex, TimeIndex]:
        """Trimmed files, each written atomically (fileutil.replace_file). With
        `in_memory_if_full`, a full disk (or no descriptor to write with) leaves the old files
        as they were and returns indexes held in memory, so that recovery and a lazy rebuild
        still serve reads on a full disk; the next recovery writes the files."""
        self.finish_closed()
        try:
            with io_errors(index_path, "cannot write rebuilt indexes"):
                replace_file(index_path, self.offset_entries, sync_dir=False)
                replace_file(time_path, self.time_entries, sync_dir=False)
                fsync_dir(index_path.parent)
        except TransientStorageError as exc:
            if not in_memory_if_full:
                raise
            logger.warning("%s: rebuilt indexes kept in memory: %s", index_path.parent.name, exc)
            return (
                OffsetIndex.in_memory(index_path, self.base_offset, max_index_bytes, self.offset_entries),
                TimeIndex.in_memory(time_path, self.base_offset, max_index_bytes, self.time_entries),
            )
        return (
            OffsetIndex.open_read_only(index_path, self.base_offset, max_index_bytes, len(self.offset_entries)),
            TimeIndex.open_read_only(time_path, self.base_offset, max_index_bytes, len(self.time_entries)),
        )

    def write_active(self, index_path: Path, time_path: Path, max_index_bytes: int) -> tuple[OffsetIndex, TimeIndex]:
        """Appendable indexes holding the entries built so far (written to their files now, or
        with the next append on a full disk)."""
        return (
            OffsetIndex.create_appendable(index_path, self.base_offset, max_index_bytes, bytes(self.offset_entries)),
            TimeIndex.create_appendable(time_path, self.base_offset, max_index_bytes, bytes(self.time_entries)),
        )
