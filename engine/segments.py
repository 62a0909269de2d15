"""The published, immutable state of a partition that readers work from.

The writer builds a new LogView after every change (group commit, roll, delete-records,
segment deletion or replacement) and swaps it in with one attribute assignment, so a reader
that took a view keeps a consistent picture without any lock: a tuple of segments ordered by
base offset, the offsets, and how far the last segment may be read.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from .segment import LogSegment


@dataclass(frozen=True, slots=True)
class LogView:
    segments: tuple[LogSegment, ...]
    base_offsets: tuple[int, ...]
    log_start_offset: int
    high_watermark: int
    active_end: int  # readable bytes of the last segment: everything below the high watermark

    @classmethod
    def build(
        cls, segments: tuple[LogSegment, ...], log_start_offset: int, high_watermark: int, active_end: int
    ) -> LogView:
        return cls(segments, tuple(s.base_offset for s in segments), log_start_offset, high_watermark, active_end)

    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.high_watermark

    def end_position(self, index: int) -> int:
        """Readable size of segment `index`: its size if closed, active_end if last."""
        if index == len(self.segments) - 1:
            return self.active_end
        return self.segments[index].size

    def segment_index_for(self, offset: int) -> int:
        """Index of the segment that would hold `offset`: greatest base offset <= offset (0 if
        `offset` is below every base offset)."""
        return max(bisect_right(self.base_offsets, offset) - 1, 0)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments[:-1]) + self.active_end
