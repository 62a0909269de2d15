"""Reading Kafka's internal topics for import: KRaft topic configs and committed offsets."""

from __future__ import annotations

from pathlib import Path

from engine.kafka_import import topic_overrides
from engine.kafka_state import read_committed_offsets, read_topic_configs

from ..app.kafka_dirs import (
    KRAFT_OFFSETS,
    _records,
    config_record,
    metadata_record,
    write_kafka_log_dir,
    write_kraft_log_dir,
    write_raw_partition,
)


def test_topic_configs_of_live_topics_from_the_snapshot_and_the_log(tmp_path: Path) -> None:
    write_kraft_log_dir(tmp_path / "k")
    found = read_topic_configs(tmp_path / "k")
    assert found is not None and not found.problems and found.undecodable == 0
    assert found.configs == {
        "orders": {"cleanup.policy": "compact,delete", "min.insync.replicas": "2", "retention.ms": "86400000", "segment.bytes": "1048576"},
    }
    write_kafka_log_dir(tmp_path / "zk")
    assert read_topic_configs(tmp_path / "zk") is None, "a ZooKeeper-era dir has no metadata log"


def test_bad_metadata_records_are_counted_and_a_torn_tail_ends_the_file(tmp_path: Path) -> None:
    write_kraft_log_dir(tmp_path / "k")
    log = tmp_path / "k" / "__cluster_metadata-0" / "00000000000000000005.log"
    more = tmp_path / "more"
    write_raw_partition(more, [_records([
        metadata_record(4, 0, b"\x02\x05abc"),  # a ConfigRecord cut short
        b"\x00\x04",  # frame version 0 (Kafka 2.8's preview)
        config_record(2, "orders", "retention.ms", "1000"),
    ])], base=100)
    log.write_bytes(log.read_bytes() + (more / f"{100:020d}.log").read_bytes() + b"\x00\x00\x00")
    found = read_topic_configs(tmp_path / "k")
    assert found.undecodable == 2
    assert found.configs["orders"]["retention.ms"] == "1000"
    assert len(found.problems) == 1 and "00000000000000000005.log" in found.problems[0]


def test_committed_offsets_latest_per_key_tombstones_and_transactions(tmp_path: Path) -> None:
    write_kraft_log_dir(tmp_path / "k")
    dirs = sorted((tmp_path / "k").glob("__consumer_offsets-*"))
    offsets = read_committed_offsets(dirs)
    got = {(c.group, c.topic, c.partition): (c.offset, c.metadata, c.commit_timestamp) for c in offsets.commits}
    assert got == KRAFT_OFFSETS
    assert (offsets.skipped, offsets.uncommitted, offsets.undecodable) == (1, 2, 0)


def test_imported_overrides() -> None:
    got = topic_overrides({"retention.ms": "5", "segment.bytes": "1", "min.insync.replicas": "2", "cleanup.policy": "delete,compact"})
    assert got.carried == {"cleanup.policy": "compact,delete", "retention.ms": "5"}
    assert got.retention_off == {"retention.bytes": "-1"}
    assert set(got.not_carried) == {"segment.bytes", "min.insync.replicas"}
    assert got.overrides == {"retention.bytes": "-1", "cleanup.policy": "compact,delete", "retention.ms": "5"}
    none = topic_overrides(None)
    assert none.overrides == none.retention_off == {"retention.ms": "-1", "retention.bytes": "-1"}
