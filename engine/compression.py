"""Batch compression codecs, as Kafka's clients write them.

    0 none
    1 gzip    RFC 1952 stream (one or more members)
    2 snappy  xerial framing: b"\\x82SNAPPY\\x00", int32 version, int32 compatible version,
              then blocks of [int32 length][raw snappy block]; raw snappy without the
              framing header is accepted on decode, as Kafka's SnappyInputStream does
    3 lz4     LZ4 frame format with independent blocks (Kafka does not read linked blocks)
    4 zstd    zstd frames, content size optional (Java's zstd-jni streams omit it)

Only the concatenated records of a batch are compressed; the 61-byte header stays plain.

Decompression is bounded: a records block that inflates past MAX_RECORDS_BYTES is corrupt
(a few KiB of zstd can claim gigabytes), and so is a raw snappy block whose length preamble
is more than snappy's best ratio allows; neither is allocated first and checked after.
decompress() returns a whole block (reads: one batch at a time); inflate_chunks() yields it in
pieces of about INFLATE_CHUNK_BYTES (produce validation walks the records as they come, so a
bomb costs one piece of memory, not the block).
Pure functions, safe from any thread.
"""

from __future__ import annotations

import gzip
import io
import struct
import threading
import zlib
from typing import Iterator

import cramjam
import lz4.frame
import zstandard

from .errors import CorruptBatchError, InflateLimitError

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

CODECS = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024  # SnappyOutputStream's default block size
_BE_I32 = struct.Struct(">i")

MAX_RECORDS_BYTES = 256 * 1024 * 1024
"""The most a batch's records block may inflate to; past it the batch is corrupt."""

INFLATE_CHUNK_BYTES = 1024 * 1024
"""inflate_chunks()'s piece size (a raw snappy block comes whole: at most 22 x its size)."""

# A snappy copy element writes at most 64 bytes from 3 input bytes (literals never expand),
# so no valid raw block inflates to more than 22 times its size (plus a short literal).
_SNAPPY_MAX_RATIO = 22
_SNAPPY_SLACK = 64

# python-zstandard objects must not be used by two threads at once (shared, they corrupt
# output and crash the process: the soak found it), and codecs run in worker threads: one each
_zstd = threading.local()


def _zstd_compressor() -> zstandard.ZstdCompressor:
    c = getattr(_zstd, "compressor", None)
    if c is None:
        c = _zstd.compressor = zstandard.ZstdCompressor(level=3)
    return c


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_zstd, "decompressor", None)
    if d is None:
        d = _zstd.decompressor = zstandard.ZstdDecompressor()
    return d


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    if codec == SNAPPY:
        return _snappy_xerial_compress(data)
    if codec == LZ4:
        return lz4.frame.compress(data, block_linked=False, content_checksum=False)
    if codec == ZSTD:
        return _zstd_compressor().compress(data)
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes | bytearray | memoryview, max_bytes: int = MAX_RECORDS_BYTES) -> bytes:
    """Inflate a batch's records block; raises CorruptBatchError on bad input, or when the
    result would exceed `max_bytes` (checked while inflating, never after)."""
    try:
        if codec == NONE:
            return bytes(data)
        if codec == GZIP:
            return _gzip_decompress(data, max_bytes)
        if codec == SNAPPY:
            return _snappy_decompress(data, max_bytes)
        if codec == LZ4:
            # the one-shot lz4.frame.decompress() allocates the frame's declared content size
            # up front; the streaming decompressor allocates at most max_length
            decompressor = lz4.frame.LZ4FrameDecompressor()
            out = decompressor.decompress(data, max_length=max_bytes + 1)
            _check_size(codec, len(out), max_bytes)
            if not decompressor.eof:
                raise CorruptBatchError("cannot decompress lz4 records: the frame is truncated")
            return out
        if codec == ZSTD:
            with _zstd_decompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as r:
                out = r.read(max_bytes + 1)
            _check_size(codec, len(out), max_bytes)
            return out
    except CorruptBatchError:
        raise
    except MemoryError:
        raise  # not the input's fault: the limit above keeps blocks far below any real memory
    except (OSError, EOFError, zlib.error, RuntimeError, ValueError, zstandard.ZstdError) as exc:
        raise CorruptBatchError(f"cannot decompress {NAMES.get(codec, codec)} records: {exc}") from exc
    except Exception as exc:  # cramjam raises its own DecompressionError type
        raise CorruptBatchError(f"cannot decompress {NAMES.get(codec, codec)} records: {exc}") from exc
    raise CorruptBatchError(f"unknown compression codec {codec}")


def inflate_chunks(
    codec: int, data: bytes | bytearray | memoryview, max_bytes: int = MAX_RECORDS_BYTES,
    chunk_bytes: int = INFLATE_CHUNK_BYTES,
) -> Iterator[bytes | bytearray]:
    """Inflate a compressed records block in pieces of at most `chunk_bytes` (a raw snappy block
    whole), never holding more than one piece. Raises CorruptBatchError on bad input, and
    InflateLimitError as soon as the pieces add up past `max_bytes`. Close the generator
    (or exhaust it) in the thread that started it: zstd's decompressor is per thread."""
    chunker = _CHUNKERS.get(codec)
    if chunker is None:
        raise CorruptBatchError(f"unknown compression codec {codec}")
    name = NAMES[codec]
    pieces = chunker(data, max_bytes, chunk_bytes)
    total = 0
    try:
        for piece in pieces:
            total += len(piece)
            _check_size(codec, total, max_bytes)
            if piece:
                yield piece
    except CorruptBatchError:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # zlib.error, zstandard.ZstdError, RuntimeError, cramjam's own type
        raise CorruptBatchError(f"cannot decompress {name} records: {exc}") from exc
    finally:
        pieces.close()


def _gzip_chunks(data: bytes | bytearray | memoryview, max_bytes: int, chunk_bytes: int) -> Iterator[bytes]:
    rest = bytes(data)
    while True:
        rest = rest.lstrip(b"\x00")  # zero padding after the last member
        if not rest:
            return
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header and trailer
        pending = rest
        while not inflater.eof:
            out = inflater.decompress(pending, chunk_bytes)
            pending = inflater.unconsumed_tail
            if not out and not pending and not inflater.eof:
                raise CorruptBatchError("cannot decompress gzip records: the stream is truncated")
            yield out
        rest = inflater.unused_data


def _lz4_chunks(data: bytes | bytearray | memoryview, max_bytes: int, chunk_bytes: int) -> Iterator[bytes]:
    decompressor = lz4.frame.LZ4FrameDecompressor()
    yield decompressor.decompress(data, max_length=chunk_bytes)
    while not decompressor.eof:
        if decompressor.needs_input:
            raise CorruptBatchError("cannot decompress lz4 records: the frame is truncated")
        yield decompressor.decompress(b"", max_length=chunk_bytes)


def _zstd_chunks(data: bytes | bytearray | memoryview, max_bytes: int, chunk_bytes: int) -> Iterator[bytes]:
    with _zstd_decompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
        while piece := reader.read(chunk_bytes):
            yield piece


def _snappy_chunks(data: bytes | bytearray | memoryview, max_bytes: int, chunk_bytes: int) -> Iterator[bytearray]:
    view = memoryview(data)
    if bytes(view[:8]) != _XERIAL_MAGIC:
        yield _snappy_raw_into(view, 0, max_bytes)
        return
    position, end, before = 16, len(view), 0
    while position < end:
        if end - position < 4:
            raise CorruptBatchError("truncated xerial snappy block length")
        (length,) = _BE_I32.unpack_from(view, position)
        position += 4
        if length < 0 or position + length > end:
            raise CorruptBatchError("xerial snappy block runs past the end")
        block = _snappy_raw_into(view[position : position + length], before, max_bytes)
        before += len(block)
        position += length
        yield block


def _snappy_raw_into(block: memoryview, before: int, max_bytes: int) -> bytearray:
    """One raw snappy block into a buffer of its checked, declared size."""
    out = bytearray(_snappy_declared(block, before, max_bytes))
    written = cramjam.snappy.decompress_raw_into(block, out)
    if written != len(out):
        raise CorruptBatchError(f"cannot decompress snappy records: {written} bytes, the block declares {len(out)}")
    return out


def _check_size(codec: int, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise InflateLimitError(str(NAMES.get(codec, codec)), max_bytes)


def _gzip_decompress(data: bytes | bytearray | memoryview, max_bytes: int) -> bytes:
    """gzip.decompress() with a bound: one or more members, zero padding after the last."""
    out = bytearray()
    rest = bytes(data)
    while True:
        rest = rest.lstrip(b"\x00")
        if not rest:
            return bytes(out)
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header and trailer
        out += inflater.decompress(rest, max_bytes + 1 - len(out))
        _check_size(GZIP, len(out), max_bytes)
        if not inflater.eof:
            raise CorruptBatchError("cannot decompress gzip records: the stream is truncated")
        rest = inflater.unused_data


def _snappy_xerial_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    out = bytearray(_XERIAL_HEADER)
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK]))
        out += _BE_I32.pack(len(block))
        out += block
    return bytes(out)


def _snappy_decompress(data: bytes | bytearray | memoryview, max_bytes: int) -> bytes:
    """xerial-framed or raw snappy, each block checked before it is inflated (_snappy_chunks)."""
    return b"".join(_snappy_chunks(data, max_bytes, 0))


def _snappy_declared(block: memoryview, before: int, max_bytes: int) -> int:
    """The length a raw snappy block's preamble (a varint) declares, once it is plausible for
    the block's size and within `max_bytes` after `before` bytes."""
    declared = 0
    for i in range(min(len(block), 5)):
        declared |= (block[i] & 0x7F) << (7 * i)
        if block[i] < 0x80:
            break
    else:
        raise CorruptBatchError("cannot decompress snappy records: bad length preamble")
    if declared > _SNAPPY_MAX_RATIO * len(block) + _SNAPPY_SLACK:
        raise CorruptBatchError(f"cannot decompress snappy records: a {len(block)}-byte block claims {declared} bytes")
    _check_size(SNAPPY, before + declared, max_bytes)
    return declared


NAMES = {value: name for name, value in CODECS.items()}
_CHUNKERS = {GZIP: _gzip_chunks, SNAPPY: _snappy_chunks, LZ4: _lz4_chunks, ZSTD: _zstd_chunks}
