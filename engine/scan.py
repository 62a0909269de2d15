"""Walking the batches of a .log file with few, large reads.

BatchScanner reads [start, end) of a file in chunks and yields each batch's header (with its
file position) and, when asked, a memoryview of the whole batch. It stops at the first batch
that fails framing, magic or CRC checks and records why in `error`; `valid_end` is then the
position where the valid prefix ends. Recovery (LogSegment.recover) then asks repair.py where
whole valid batches start again: only the bytes in between are dropped, and a file with none
after them is truncated there (the torn-tail rule).

Blocking (pread); call from a worker thread for anything larger than a few pages.
"""

from __future__ import annotations

import os
from typing import Iterator

from .errors import CorruptBatchError
from .fileutil import pread, preadv
from .format import HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2, BatchHeader, parse_header, read_prefix, validate_batch

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
HEADER_CHUNK_BYTES = 8 * 1024


class BatchScanner:
    """Iterate the batches of `file` (a descriptor or FileHandle) between `start` and `end`.

    With `with_data`, each batch comes with a memoryview of its bytes that stays valid only
    until the iteration moves on (the read buffer is reused).
    """

    def __init__(
        self,
        file: int | object,
        start: int = 0,
        end: int | None = None,
        *,
        with_data: bool = True,
        check_crc: bool = True,
        chunk_bytes: int | None = None,
    ) -> None:
        self._file = file  # keeps a FileHandle (and so its descriptor) alive while scanning
        self.fd = file if isinstance(file, int) else file.fileno()
        self.start = start
        self.end = os.fstat(self.fd).st_size if end is None else end
        self.with_data = with_data
        self.check_crc = check_crc and with_data
        self.chunk_bytes = chunk_bytes or (DEFAULT_CHUNK_BYTES if with_data else HEADER_CHUNK_BYTES)
        self.valid_end = start
        self.error: str | None = None
        self.error_position: int | None = None
        self._buffer: bytearray | None = None

    def __iter__(self) -> Iterator[tuple[BatchHeader, memoryview | None]]:
        position = self.start
        end = self.end
        buf: memoryview | bytes = b""  # the valid part of the last read
        buf_start = position  # file position of buf[0]
        while position < end:
            rel = position - buf_start
            if rel + HEADER_SIZE > len(buf):
                buf = self._read(position, min(self.chunk_bytes, end - position))
                buf_start, rel = position, 0
                if len(buf) < HEADER_SIZE:
                    self._fail(position, f"{len(buf)} bytes left, a batch header needs {HEADER_SIZE}")
                    return
            if self.with_data:
                _base, length = read_prefix(buf, rel)
                size = length + LOG_OVERHEAD
                if length >= 0 and rel + size > len(buf) and position + size <= end:
                    buf = self._read(position, max(size, min(self.chunk_bytes, end - position)))
                    buf_start, rel = position, 0
                try:
                    header = validate_batch(
                        buf, rel, limit=min(len(buf), end - buf_start), check_crc=self.check_crc,
                        file_position=position,
                    )
                except CorruptBatchError as exc:
                    self._fail(position, exc.reason)
                    return
                data = memoryview(buf)[rel : rel + header.size]
            else:
                header = parse_header(buf, rel, position)
                if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or position + header.size > end:
                    self._fail(position, f"batch of {header.size} bytes runs past the end")
                    return
                if header.magic != MAGIC_V2 or header.last_offset_delta < 0 or header.base_offset < 0:
                    self._fail(position, "not a v2 batch header")
                    return
                data = None
            yield header, data
            position += header.size
            self.valid_end = position

    def _read(self, position: int, size: int) -> memoryview:
        """Read into one reused buffer (a new one only when a batch outgrows it): yielded
        views of earlier batches are valid only until the next read."""
        if self._buffer is None or len(self._buffer) < size:
            self._buffer = bytearray(max(size, self.chunk_bytes))
        view = memoryview(self._buffer)
        got = 0
        while got < size:
            n = preadv(self.fd, [view[got:size]], position + got)
            if n <= 0:
                break
            got += n
        return view[:got]

    def _fail(self, position: int, reason: str) -> None:
        self.error = reason
        self.error_position = position


def scan_headers(fd: int, start: int, end: int, chunk_bytes: int = HEADER_CHUNK_BYTES) -> Iterator[BatchHeader]:
    """Headers only, of the batches in [start, end), which must begin on a batch boundary: the
    lean path of every lookup. Reads chunk_bytes at a time and jumps over batch bodies.

    Raises CorruptBatchError (with the position) if the bytes there are not a run of v2 batch
    headers: too short, a length running past `end`, a wrong magic or negative fields.
    """
    position = start
    buf = b""
    buf_start = start
    while position < end:
        rel = position - buf_start
        if rel + HEADER_SIZE > len(buf):
            buf = pread(fd, min(chunk_bytes, end - position), position)
            buf_start, rel = position, 0
            if len(buf) < HEADER_SIZE:
                raise CorruptBatchError(f"{len(buf)} bytes left, a batch header needs {HEADER_SIZE}", position)
        header = parse_header(buf, rel, position)
        size = header.batch_length + LOG_OVERHEAD
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or position + size > end:
            raise CorruptBatchError(f"batch of {size} bytes runs past the end", position)
        if header.magic != MAGIC_V2 or header.last_offset_delta < 0 or header.base_offset < 0:
            raise CorruptBatchError("not a v2 batch header", position)
        yield header
        position += size

