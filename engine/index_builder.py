"""Building a segment's two indexes in memory from its batch headers, then writing them once.

Used by recovery and by the lazy rebuild of a damaged index: the same placement rule as the
writer (see segment.py), applied to headers as a scan meets them, with the entries collected
in bytearrays rather than written one by one into a freshly preallocated mapping, and the
files written whole at the end: trimmed, fsynced and renamed into place for a closed segment,
preallocated and mapped for the active one.

If a segment holds more batches than its indexes can index (a Kafka segment written with a
larger segment.index.bytes), entries stop at capacity: lookups in the tail scan further, and
no data is dropped.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from .format import NO_TIMESTAMP
from .offset_index import OffsetIndex
from .time_index import TimeIndex

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


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
        if self.bytes_since_last_entry > self.interval and len(self.offset_entries) // 8 < self.max_offset_entries:
            self.offset_entries += _OFFSET_ENTRY.pack(last_offset - self.base_offset, position)
            if self._time_count < self.max_time_entries - 1:  # one slot kept for the final entry
                self._maybe_time_entry()
            self.bytes_since_last_entry = 0
        self.bytes_since_last_entry += size

    def _maybe_time_entry(self) -> None:
        if self.max_timestamp > self._last_indexed_ts:
            self.time_entries += _TIME_ENTRY.pack(self.max_timestamp, self.offset_of_max_timestamp - self.base_offset)
            self._last_indexed_ts = self.max_timestamp
            self._time_count += 1

    def finish_closed(self) -> None:
        """The final time index entry a closed segment gets (its largest timestamp)."""
        if self.max_timestamp != NO_TIMESTAMP and self._time_count < self.max_time_entries:
            self._maybe_time_entry()

    def write_closed(self, index_path: Path, time_path: Path, max_index_bytes: int) -> tuple[OffsetIndex, TimeIndex]:
        """Trimmed files, each written to a temp file, fsynced and renamed into place."""
        self.finish_closed()
        for path, data in ((index_path, self.offset_entries), (time_path, self.time_entries)):
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        return (
            OffsetIndex.open_read_only(index_path, self.base_offset, max_index_bytes, len(self.offset_entries)),
            TimeIndex.open_read_only(time_path, self.base_offset, max_index_bytes, len(self.time_entries)),
        )

    def write_active(self, index_path: Path, time_path: Path, max_index_bytes: int) -> tuple[OffsetIndex, TimeIndex]:
        """Files preallocated and mapped for appends, holding the entries built so far."""
        return (
            OffsetIndex.create_appendable(index_path, self.base_offset, max_index_bytes, bytes(self.offset_entries)),
            TimeIndex.create_appendable(time_path, self.base_offset, max_index_bytes, bytes(self.time_entries)),
        )
