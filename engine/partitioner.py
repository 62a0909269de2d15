"""Kafka's default partitioner for keyed records: murmur2 of the key bytes.

    partition = (murmur2(key) & 0x7fffffff) % num_partitions

Same placement as the Java client and kafka-python, so a team can mix producers. Keyless
records are not hashed; the API spreads them (round robin per request). Pure.
"""

from __future__ import annotations


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
