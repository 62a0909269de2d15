"""Kafka's default partitioner: the vectors of ../shared/KAFKA-FORMAT.md."""

from __future__ import annotations

import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from engine.partitioner import murmur2, partition_for_key

VECTORS = [
    (b"21", -973932308, 0, 0),
    (b"foobar", -790332482, 0, 6),
    (b"abc", 479470107, 0, 3),
    (b"a-little-bit-long-string", -985981536, 2, 8),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971, 2, 5),
    (b"", 275646681, 0, 9),
    (b"user-42", 1459644460, 1, 4),
]


@pytest.mark.parametrize(("key", "java", "p3", "p12"), VECTORS)
def test_murmur2_matches_javas_and_placement(key: bytes, java: int, p3: int, p12: int) -> None:
    assert murmur2(key) == java
    assert partition_for_key(key, 3) == p3
    assert partition_for_key(key, 12) == p12


@pytest.mark.parametrize(("key", "partition"), [(b"", 681), (b"a", 524), (b"ab", 434), (b"abc", 107), (b"123456789", 566), (b"\x00 ", 742)])
def test_thousand_partition_vectors(key: bytes, partition: int) -> None:
    assert partition_for_key(key, 1000) == partition


def test_agrees_with_kafka_python_on_many_keys() -> None:
    import random

    rng = random.Random(7)
    for _ in range(2000):
        key = rng.randbytes(rng.randrange(0, 40))
        assert murmur2(key) & 0xFFFFFFFF == kafka_python_murmur2(key) & 0xFFFFFFFF
