"""Kafka's default partitioner: the vectors of docs/FORMAT.md, "Kafka's default partitioner"."""

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


@pytest.mark.parametrize("partitions", [1, 3, 12, 1000, 2**31 - 1])
def test_keys_placed_together_land_where_each_alone_does(partitions: int) -> None:
    import random

    from engine.partitioner import MAX_VECTOR_KEY_BYTES, partitions_for_keys

    rng = random.Random(partitions)
    # every length up to past the vector limit, each length mod 4, empty keys, and the vectors
    keys = [rng.randbytes(rng.randrange(0, MAX_VECTOR_KEY_BYTES + 20)) for _ in range(3000)]
    keys += [v[0] for v in VECTORS] + [b"", b"\xff" * 64, b"\x00" * 3]
    expected = [(kafka_python_murmur2(k) & 0x7FFFFFFF) % partitions for k in keys]
    assert partitions_for_keys(keys, partitions) == expected
    for n in (0, 1, 15, 16, 17):  # below and at the size where numpy takes over
        assert partitions_for_keys(keys[:n], partitions) == expected[:n]
    for length in range(0, 14):  # keys of one length take their own path
        same_length = [rng.randbytes(length) for _ in range(40)]
        assert partitions_for_keys(same_length, partitions) == [partition_for_key(k, partitions) for k in same_length]
