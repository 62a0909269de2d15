"""Batch compression codecs, as Kafka's clients write them.

    0 none
    1 gzip    RFC 1952 stream (one or more members)
    2 snappy  xerial framing: b"\\x82SNAPPY\\x00", int32 version, int32 compatible version,
              then blocks of [int32 length][raw snappy block]; raw snappy without the
              framing header is accepted on decode, as Kafka's SnappyInputStream does
    3 lz4     LZ4 frame format with independent blocks (Kafka does not read linked blocks)
    4 zstd    zstd frames, content size optional (Java's zstd-jni streams omit it)

Only the concatenated records of a batch are compressed; the 61-byte header stays plain.
Pure functions, safe from any thread.
"""

from __future__ import annotations

import gzip
import io
import struct
import zlib

import cramjam
import lz4.frame
import zstandard

from .errors import CorruptBatchError

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

_zstd_compressor = zstandard.ZstdCompressor(level=3)
_zstd_decompressor = zstandard.ZstdDecompressor()


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
        return _zstd_compressor.compress(data)
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Inflate a batch's records block; raises CorruptBatchError on bad input."""
    try:
        if codec == NONE:
            return bytes(data)
        if codec == GZIP:
            return gzip.decompress(data)
        if codec == SNAPPY:
            return _snappy_decompress(data)
        if codec == LZ4:
            return lz4.frame.decompress(data)
        if codec == ZSTD:
            with _zstd_decompressor.stream_reader(io.BytesIO(data), read_across_frames=True) as r:
                return r.read()
    except CorruptBatchError:
        raise
    except (OSError, EOFError, zlib.error, RuntimeError, ValueError, zstandard.ZstdError) as exc:
        raise CorruptBatchError(f"cannot decompress {NAMES.get(codec, codec)} records: {exc}") from exc
    except Exception as exc:  # cramjam raises its own DecompressionError type
        raise CorruptBatchError(f"cannot decompress {NAMES.get(codec, codec)} records: {exc}") from exc
    raise CorruptBatchError(f"unknown compression codec {codec}")


def _snappy_xerial_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    out = bytearray(_XERIAL_HEADER)
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK]))
        out += _BE_I32.pack(len(block))
        out += block
    return bytes(out)


def _snappy_decompress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    if bytes(view[:8]) != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    position = 16
    out = bytearray()
    end = len(view)
    while position < end:
        if end - position < 4:
            raise CorruptBatchError("truncated xerial snappy block length")
        (length,) = _BE_I32.unpack_from(view, position)
        position += 4
        if length < 0 or position + length > end:
            raise CorruptBatchError("xerial snappy block runs past the end")
        out += cramjam.snappy.decompress_raw(view[position : position + length])
        position += length
    return bytes(out)


NAMES = {value: name for name, value in CODECS.items()}
