"""Kafka's default partitioner for keyed records: murmur2 of the key bytes.

    partition = (murmur2(key) & 0x7fffffff) % num_partitions

Same placement as the Java client and kafka-python, so a team can mix producers. Keyless
records are not hashed; the produce service spreads them (round robin). Pure, safe from any
thread.

partitions_for_keys() places a request's keys at once: murmur2 over a numpy matrix of the keys
(one row each, zero-padded), a column of 4 bytes at a time, so the per-key Python loop (about
1.1 us for an 11-byte key) becomes a few numpy operations per 4 bytes of the longest key.
"""

from __future__ import annotations

import numpy as np


_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as a signed 32-bit int, like Java's Utils.murmur2."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


_CACHE: dict[bytes, int] = {}
_CACHE_LIMIT = 1 << 16


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's placement. Hashes of recent keys are cached (producers repeat their keys); the
    cache is a plain dict, emptied when full, so a miss costs little more than the hash."""
    h = _CACHE.get(key)
    if h is None:
        h = murmur2(key) & 0x7FFFFFFF
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = h
    return h % num_partitions


# keys above this many bytes are hashed one at a time (a row of the matrix is as wide as the
# longest key); requests of fewer keys than MIN_VECTOR_KEYS too (numpy's set-up would dominate)
MAX_VECTOR_KEY_BYTES = 64
MIN_VECTOR_KEYS = 16
_M32 = np.uint32(_M)


def partitions_for_keys(keys: list[bytes], num_partitions: int) -> list[int]:
    """[partition_for_key(key, num_partitions) for key in keys], hashed together."""
    n = len(keys)
    if n < MIN_VECTOR_KEYS:
        return [partition_for_key(k, num_partitions) for k in keys]
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=n)
    long = lengths > MAX_VECTOR_KEY_BYTES
    if long.any():
        out = [0] * n
        short = np.flatnonzero(~long).tolist()
        for i, p in zip(short, partitions_for_keys([keys[i] for i in short], num_partitions)):
            out[i] = p
        for i in np.flatnonzero(long).tolist():
            out[i] = partition_for_key(keys[i], num_partitions)
        return out
    hashes = _murmur2_rows(keys, lengths) & np.uint32(0x7FFFFFFF)
    return (hashes % np.uint32(num_partitions)).tolist()


def _murmur2_rows(keys: list[bytes], lengths: np.ndarray) -> np.ndarray:
    """murmur2 of each key as uint32 (two's complement of murmur2()), keys of at most
    MAX_VECTOR_KEY_BYTES."""
    n = len(keys)
    longest = int(lengths.max())
    if longest == int(lengths.min()):  # one length (a producer's keys usually share a format)
        return _murmur2_same_length(b"".join(keys), n, longest)
    # room for 3 tail bytes after the last whole word of the longest key: padding is zeros, so
    # the tail is always bytes end, end+1, end+2 (zero past a key's end)
    width = (longest // 4 + 1) * 4
    matrix = np.zeros((n, width), dtype=np.uint8)
    matrix[np.arange(width) < lengths[:, None]] = np.frombuffer(b"".join(keys), dtype=np.uint8)
    words = matrix.view("<u4")
    blocks = lengths // 4
    with np.errstate(over="ignore"):
        h = np.uint32(0x9747B28C) ^ lengths.astype(np.uint32)
        for j in range(width // 4 - 1):
            k = words[:, j] * _M32
            k ^= k >> np.uint32(24)
            k *= _M32
            mixed = (h * _M32) ^ k
            h = np.where(blocks > j, mixed, h)
        end = blocks * 4
        rows = np.arange(n)
        tail = (
            matrix[rows, end].astype(np.uint32)
            | (matrix[rows, end + 1].astype(np.uint32) << np.uint32(8))
            | (matrix[rows, end + 2].astype(np.uint32) << np.uint32(16))
        )
        h = np.where((lengths & 3) > 0, (h ^ tail) * _M32, h)
        h ^= h >> np.uint32(13)
        h *= _M32
        h ^= h >> np.uint32(15)
    return h


def _murmur2_same_length(joined: bytes, n: int, length: int) -> np.ndarray:
    """_murmur2_rows for n keys of `length` bytes each, concatenated in `joined`."""
    rows = np.frombuffer(joined, dtype=np.uint8).reshape(n, length) if length else np.zeros((n, 0), dtype=np.uint8)
    whole = length // 4
    words = np.ascontiguousarray(rows[:, : whole * 4]).view("<u4")
    with np.errstate(over="ignore"):
        h = np.full(n, (0x9747B28C ^ length) & _MASK, dtype=np.uint32)
        for j in range(whole):
            k = words[:, j] * _M32
            k ^= k >> np.uint32(24)
            k *= _M32
            h *= _M32
            h ^= k
        rest = length & 3
        if rest:
            tail = rows[:, whole * 4].astype(np.uint32)
            if rest >= 2:
                tail |= rows[:, whole * 4 + 1].astype(np.uint32) << np.uint32(8)
            if rest == 3:
                tail |= rows[:, whole * 4 + 2].astype(np.uint32) << np.uint32(16)
            h ^= tail
            h *= _M32
        h ^= h >> np.uint32(13)
        h *= _M32
        h ^= h >> np.uint32(15)
    return h
