"""Sparse time index for one segment.

Entry format.TIME_INDEX_ENTRY (big-endian int64, int32: 12 bytes): (largest timestamp seen so far in the segment,
offset - base_offset of the batch that carried it, its last offset). Written together with an offset index entry, but
only when the largest timestamp grew; plus one final entry when the segment rolls or the log
closes, so a closed segment's last entry holds its largest timestamp. Timestamps and offsets
never decrease.

Not checksummed: recovery rebuilds it. Writer task only, except lookups (any task or thread).
"""

from __future__ import annotations

import numpy as np

from .errors import CorruptIndexError
from .format import NO_TIMESTAMP, TIME_INDEX_DTYPE, TIME_INDEX_ENTRY
from .index_file import IndexFile


class TimeIndex(IndexFile):
    ENTRY_SIZE = TIME_INDEX_ENTRY.size
    DTYPE = TIME_INDEX_DTYPE

    @classmethod
    def read_entries(cls, data: bytes, base_offset: int) -> list[tuple[int, int]]:
        """(timestamp, offset) of each entry in a time index file's bytes (decode_entries)."""
        return [(ts, base_offset + rel) for ts, rel in cls.decode_entries(data).tolist()]

    @property
    def is_full(self) -> bool:
        # One slot stays free for the final entry written when the segment rolls.
        return self._entries >= self.max_entries - 1

    def entry(self, i: int) -> tuple[int, int]:
        """(timestamp, offset) of entry `i`."""
        ts, rel = self._entry(i)
        return ts, rel + self.base_offset

    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry; (NO_TIMESTAMP, base_offset) when empty."""
        if self._entries == 0:
            return NO_TIMESTAMP, self.base_offset
        return self.entry(self._entries - 1)

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> bool:
        """Append (timestamp, offset) if `timestamp` is above the last entry's; True if added.

        `skip_full_check` lets the final entry on roll use the slot reserved for it: a
        segment rolls when this index has one free entry left.
        """
        if self._entries:
            last_ts, last_offset = self.last_entry()
            if timestamp <= last_ts:
                return False
            if offset < last_offset:
                raise CorruptIndexError(self.path, f"offset {offset} is below the last indexed {last_offset}")
        if not skip_full_check and self.is_full:
            raise CorruptIndexError(self.path, "time index is full")
        self._append_raw(TIME_INDEX_ENTRY.pack(timestamp, offset - self.base_offset))
        return True

    def lookup_before(self, timestamp: int) -> tuple[int, int]:
        """Greatest entry with timestamp < `timestamp` as (timestamp, offset).

        Every record at or below that offset has a smaller timestamp, so a search for the first
        record with timestamp >= `timestamp` may start at the batch holding that offset. With
        no such entry: (NO_TIMESTAMP, base_offset), the segment start.
        """
        count = self._entries
        if count == 0:
            return NO_TIMESTAMP, self.base_offset
        timestamps, offsets = self._mapped_columns()
        i = self._search(timestamps, timestamp - 1, count)
        if i < 0:
            return NO_TIMESTAMP, self.base_offset
        return int(timestamps[i]), int(offsets[i]) + self.base_offset

    def sanity_check(self, next_offset: int | None = None) -> None:
        view = self.view()
        if len(view) == 0:
            return
        ts = view["timestamp"].astype(np.int64)
        rel = view["relative_offset"].astype(np.int64)
        if rel[0] < 0:
            raise CorruptIndexError(self.path, f"negative relative offset {int(rel[0])}")
        if len(view) > 1 and (np.any(np.diff(ts) <= 0) or np.any(np.diff(rel) < 0)):
            raise CorruptIndexError(self.path, "timestamps must increase and offsets must not decrease")
        if next_offset is not None and int(rel[-1]) + self.base_offset >= next_offset:
            raise CorruptIndexError(self.path, f"last offset {int(rel[-1]) + self.base_offset} is past the log end {next_offset}")
