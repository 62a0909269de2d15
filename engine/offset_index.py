"""Sparse offset index for one segment.

Entry format.OFFSET_INDEX_ENTRY (two big-endian int32, 8 bytes): (offset - base_offset, byte
position in .log) of the LAST offset of a batch and the position where that batch STARTS.
Relative offsets strictly increase; positions strictly increase. An entry is added for a batch
when more than index.interval.bytes were appended since the previous entry (checked before
counting the batch), so position 0 never gets one and a segment under ~4 KiB has an empty index.

Not checksummed: recovery rebuilds it from the .log file. Writer task only, except lookup()
and lookup_position(), which are safe from any task or thread.
"""

from __future__ import annotations

import numpy as np

from .errors import CorruptIndexError
from .format import OFFSET_INDEX_DTYPE, OFFSET_INDEX_ENTRY
from .index_file import IndexFile


class OffsetIndex(IndexFile):
    ENTRY_SIZE = OFFSET_INDEX_ENTRY.size
    DTYPE = OFFSET_INDEX_DTYPE

    @classmethod
    def read_entries(cls, data: bytes, base_offset: int) -> list[tuple[int, int]]:
        """(offset, position) of each entry in an offset index file's bytes (decode_entries)."""
        return [(base_offset + rel, pos) for rel, pos in cls.decode_entries(data).tolist()]

    def append(self, offset: int, position: int) -> None:
        """Add (offset, position). Offsets must strictly increase (checked)."""
        relative = offset - self.base_offset
        if self._entries:
            last, _ = self._entry(self._entries - 1)
            if relative <= last:
                raise CorruptIndexError(
                    self.path, f"offset {offset} is not above the last indexed offset {last + self.base_offset}"
                )
        self._append_raw(OFFSET_INDEX_ENTRY.pack(relative, position))

    def entry(self, i: int) -> tuple[int, int]:
        """(offset, position) of entry `i`."""
        rel, pos = self._entry(i)
        return rel + self.base_offset, pos

    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry; (base_offset, 0) when empty."""
        if self._entries == 0:
            return self.base_offset, 0
        return self.entry(self._entries - 1)

    def lookup(self, offset: int) -> tuple[int, int]:
        """Greatest entry with offset <= `offset` as (offset, position).

        Below the first entry, or on an empty index: (base_offset, 0), the segment start.
        Past the last entry: the last entry. The batch containing `offset` starts at or
        after the returned position.
        """
        count = self._entries
        if count == 0:
            return self.base_offset, 0
        offsets, positions = self._mapped_columns()
        i = self._search(offsets, offset - self.base_offset, count)
        if i < 0:
            return self.base_offset, 0
        return int(offsets[i]) + self.base_offset, int(positions[i])

    def lookup_position(self, position: int) -> tuple[int, int]:
        """Greatest entry whose batch starts at or before `position`; (base_offset, 0) if none."""
        count = self._entries
        if count == 0:
            return self.base_offset, 0
        offsets, positions = self._mapped_columns()
        i = self._search(positions, position, count)
        if i < 0:
            return self.base_offset, 0
        return int(offsets[i]) + self.base_offset, int(positions[i])

    def sanity_check(self, log_size: int) -> None:
        """Raise CorruptIndexError unless offsets and positions strictly increase and fit the log."""
        view = self.view()
        if len(view) == 0:
            return
        rel = view["relative_offset"].astype(np.int64)
        pos = view["position"].astype(np.int64)
        if rel[0] < 0 or pos[0] < 0:
            raise CorruptIndexError(self.path, f"first entry ({int(rel[0])}, {int(pos[0])}) is negative")
        if len(view) > 1 and (np.any(np.diff(rel) <= 0) or np.any(np.diff(pos) <= 0)):
            raise CorruptIndexError(self.path, "entries are not strictly increasing")
        if int(pos[-1]) >= log_size:
            raise CorruptIndexError(self.path, f"last position {int(pos[-1])} is past the log size {log_size}")
