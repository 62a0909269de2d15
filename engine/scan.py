"""Walking the batches of a .log file with few, large reads.

BatchScanner reads [start, end) of a file in chunks and yields each batch's header (with its
file position) and, when asked, a memoryview of the whole batch. It stops at the first batch
that fails framing, magic or CRC checks and records why in `error`; `valid_end` is then the
position where the valid prefix ends. That is the torn-tail rule of recovery: a .log file is
valid up to its first invalid batch, and everything after it is dropped.

Blocking (pread); call from a worker thread for anything larger than a few pages.
"""

from __future__ import annotations

import os
from typing import Iterator

from .errors import CorruptBatchError
from .format import HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2, BatchHeader, parse_header, read_prefix, validate_batch

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
HEADER_CHUNK_BYTES = 16 * 1024


class BatchScanner:
    """Iterate the batches of `file` (a descriptor or FileHandle) between `start` and `end`."""

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

    def __iter__(self) -> Iterator[tuple[BatchHeader, memoryview | None]]:
        position = self.start
        end = self.end
        buf = b""
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

    def _read(self, position: int, size: int) -> bytes:
        data = os.pread(self.fd, size, position)
        while len(data) < size:
            more = os.pread(self.fd, size - len(data), position + len(data))
            if not more:
                break
            data += more
        return data

    def _fail(self, position: int, reason: str) -> None:
        self.error = reason
        self.error_position = position

