"""The log manager: log dirs, topic metadata replayed from __metadata-0, checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from engine import reader
from engine.checkpoints import format_checkpoint, read_checkpoint, write_checkpoint
from engine.errors import (
    DataDirLockedError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTopicNameError,
    PartitionNotFoundError,
    PartitionOfflineError,
    StorageError,
    TopicExistsError,
    TopicNotFoundError,
)
from engine.log_dirs import parse_clean_shutdown, read_properties
from engine.log_manager import EngineConfig, open_engine
from engine.metadata import METADATA_TOPIC
from engine.partition_log import prepare_batches
from engine.records import encode_batch

T0 = 1_700_000_000_000


def cfg(*dirs: Path, **kw) -> EngineConfig:
    return EngineConfig(log_dirs=tuple(dirs), **kw)


async def produce(engine, topic: str, partition: int, values: list[bytes]) -> int:
    log = engine.partition(topic, partition)
    batch = encode_batch(0, [(b"k%d" % i, v, T0, []) for i, v in enumerate(values)])
    return (await log.append(prepare_batches(batch, log.config))).base_offset


def values_of(engine, topic: str, partition: int) -> list[bytes]:
    log = engine.partition(topic, partition)
    return [r.value for r in reader.read_records(log.view, log.log_start_offset, 10**6, 10**8).records]


async def test_topics_survive_restart_through_the_metadata_log(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        await engine.create_topic("orders", 2, {"cleanup.policy": "compact", "segment.bytes": 1000})
        await engine.create_topic("gone", 1)
        await engine.alter_topic_configs("orders", {"retention.ms": 1000, "segment.bytes": None})
        await engine.add_partitions("orders", 4)
        await produce(engine, "orders", 3, [b"a", b"b"])
        await produce(engine, "gone", 0, [b"x"])
        await engine.delete_topic("gone")
        assert not (tmp_path / "gone-0").exists() or not (tmp_path / "gone-0").is_dir()
    async with open_engine(cfg(tmp_path)) as engine:
        assert sorted(engine.topics) == ["__consumer_offsets", METADATA_TOPIC, "orders"]
        orders = engine.topic("orders")
        assert len(orders.partitions) == 4
        assert orders.meta.overrides == {"cleanup.policy": "compact", "retention.ms": "1000"}
        assert orders.config.compact and orders.config.segment_bytes == 1_073_741_824
        assert values_of(engine, "orders", 3) == [b"a", b"b"]
        with pytest.raises(TopicNotFoundError):
            engine.topic("gone")
        # metadata events are plain records in an internal topic
        events = values_of(engine, METADATA_TOPIC, 0)
        assert [e.split(b'"type":"')[1].split(b'"')[0] for e in events] == [
            b"topic_created",  # __consumer_offsets, on first start
            b"topic_created", b"topic_created", b"configs_altered", b"partitions_added", b"topic_deleted",
        ]
    assert not [p for p in os.listdir(tmp_path) if p.startswith("gone")]


async def test_recreated_topic_starts_empty(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        await engine.create_topic("t", 1)
        await produce(engine, "t", 0, [b"old"])
        await engine.delete_topic("t")
        await engine.create_topic("t", 1)
        assert values_of(engine, "t", 0) == []
    async with open_engine(cfg(tmp_path)) as engine:
        assert values_of(engine, "t", 0) == []


async def test_leftover_directory_of_a_deleted_topic_is_removed_at_start(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        state = await engine.create_topic("t", 1)
        await produce(engine, "t", 0, [b"old"])
        topic_id = state.meta.topic_id
    # simulate a crash after the topic_deleted event but before the directory was renamed
    (tmp_path / "t-0").rename(tmp_path / "keep")
    async with open_engine(cfg(tmp_path)) as engine:
        await engine.delete_topic("t")
    (tmp_path / "keep").rename(tmp_path / "t-0")
    assert topic_id in (tmp_path / "t-0" / "partition.metadata").read_text()
    async with open_engine(cfg(tmp_path)) as engine:
        assert "t" not in engine.topics
    assert not (tmp_path / "t-0").exists()


async def test_validation_errors_change_nothing(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        for name in ["", ".", "..", "a" * 250, "bad name", "ü"]:
            with pytest.raises(InvalidTopicNameError):
                await engine.create_topic(name, 1)
        with pytest.raises(InvalidConfigError, match="unknown"):
            await engine.create_topic("t", 1, {"no.such.config": 1})
        with pytest.raises(InvalidConfigError, match=r"\[14, "):
            await engine.create_topic("t", 1, {"segment.bytes": 1})
        with pytest.raises(InvalidConfigError):
            await engine.create_topic("t", 1, {"cleanup.policy": "sometimes"})
        with pytest.raises(InvalidConfigError):
            await engine.create_topic("t", 1, {"min.cleanable.dirty.ratio": 2})
        with pytest.raises(InvalidPartitionsError):
            await engine.create_topic("t", 0)
        assert "t" not in engine.topics and not (tmp_path / "t-0").exists()
        await engine.create_topic("t", 2)
        with pytest.raises(TopicExistsError):
            await engine.create_topic("t", 1)
        await engine.create_topic("a.b", 1)
        with pytest.raises(InvalidTopicNameError, match="collides"):
            await engine.create_topic("a_b", 1)
        for reserved in (METADATA_TOPIC, "__consumer_offsets", "__cluster_metadata", "__transaction_state"):
            with pytest.raises(InvalidTopicNameError, match="reserved"):
                await engine.create_topic(reserved, 1)
        with pytest.raises(InvalidPartitionsError, match="only grow"):
            await engine.add_partitions("t", 2)
        with pytest.raises(InvalidRequestError):
            await engine.delete_topic(METADATA_TOPIC)
        with pytest.raises(PartitionNotFoundError):
            engine.partition("t", 2)
        events_before = engine.image.events
        with pytest.raises(InvalidConfigError):
            await engine.alter_topic_configs("t", {"retention.ms": "soon"})
        assert engine.image.events == events_before


async def test_a_second_engine_on_the_same_dir_is_refused(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)):
        with pytest.raises(DataDirLockedError, match=f"pid {os.getpid()}"):
            async with open_engine(cfg(tmp_path)):
                pass
    async with open_engine(cfg(tmp_path)):  # released on close
        pass


async def test_meta_properties_and_checkpoints_in_kafka_format(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path, node_id=3)) as engine:
        await engine.create_topic("t", 2)
        await produce(engine, "t", 1, [b"a", b"b", b"c"])
        await engine.partition("t", 1).delete_records(1)
        assert read_checkpoint(tmp_path / "log-start-offset-checkpoint")[("t", 1)] == 1  # durable at once
    props = read_properties(tmp_path / "meta.properties")
    assert props["version"] == "1" and props["node.id"] == "3" and len(props["cluster.id"]) == 22
    recovery = read_checkpoint(tmp_path / "recovery-point-offset-checkpoint")
    assert recovery[("t", 1)] == 3 and recovery[("t", 0)] == 0
    text = (tmp_path / "recovery-point-offset-checkpoint").read_text()
    assert text.startswith("0\n4\n") and text.endswith("\n") and "t 1 3\n" in text
    assert (tmp_path / "cleaner-offset-checkpoint").read_bytes() == b"0\n0\n"
    assert (tmp_path / ".kafka_cleanshutdown").exists()
    async with open_engine(cfg(tmp_path, node_id=3)) as engine:
        assert not (tmp_path / ".kafka_cleanshutdown").exists()  # removed once loaded
        assert engine.partition("t", 1).log_start_offset == 1


def test_checkpoint_format_edge_cases(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.write_bytes(b"")
    assert read_checkpoint(path) == {}  # a 0-byte file means no entries (seen in Kafka dirs)
    assert read_checkpoint(tmp_path / "missing") == {}
    write_checkpoint(path, {("a-b.c", 0): 5, ("x", 12): 0})
    assert read_checkpoint(path) == {("a-b.c", 0): 5, ("x", 12): 0}
    assert format_checkpoint({}) == "0\n0\n"
    assert not (tmp_path / "cp.tmp").exists()


async def test_partitions_spread_over_log_dirs(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    async with open_engine(cfg(*dirs)) as engine:
        await engine.create_topic("t", 5)
        await produce(engine, "t", 4, [b"x"])
    counts = {d.name: sorted(p.name for p in d.iterdir() if p.name.startswith("t-")) for d in dirs}
    assert sorted(len(v) for v in counts.values()) == [1, 2, 2] or sorted(len(v) for v in counts.values()) == [2, 2, 1]
    assert (dirs[0] / "__metadata-0").exists()
    clusters = {read_properties(d / "meta.properties")["cluster.id"] for d in dirs}
    assert len(clusters) == 1
    async with open_engine(cfg(*dirs)) as engine:
        assert values_of(engine, "t", 4) == [b"x"]


async def test_unclean_start_recovers_every_partition(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        await engine.create_topic("t", 2, {"segment.bytes": 500})
        for i in range(30):
            await produce(engine, "t", i % 2, [b"v%d" % i * 20])
    (tmp_path / ".kafka_cleanshutdown").unlink()
    write_checkpoint(tmp_path / "recovery-point-offset-checkpoint", {})  # as if never checkpointed
    async with open_engine(cfg(tmp_path)) as engine:
        stats = engine.load_stats["t-0"]
        assert stats.scanned_segments == len(engine.partition("t", 0).view.segments)
        assert values_of(engine, "t", 0) == [b"v%d" % i * 20 for i in range(0, 30, 2)]


async def test_concurrent_topic_operations_are_serialised(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        results = []

        async def create(i: int) -> None:
            try:
                await engine.create_topic("same", 1)
                results.append("ok")
            except TopicExistsError:
                results.append("exists")

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(create, i)
        assert sorted(results) == ["exists"] * 4 + ["ok"]


async def test_group_offsets_are_durable_and_follow_their_topic(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        await engine.create_topic("t", 2)
        await engine.create_topic("u", 1)
        await engine.groups.commit("g1", [("t", 0, 5, "m"), ("t", 1, 7, ""), ("u", 0, 1, "")])
        await engine.groups.commit("g1", [("t", 0, 6, "again")])
        await engine.groups.commit("g2", [("t", 1, 3, "")])
        with pytest.raises(InvalidRequestError):
            await engine.groups.commit("", [("t", 0, 1, "")])
        with pytest.raises(InvalidRequestError):
            await engine.groups.commit("g", [("t", 0, 1, "x" * 5000)])
        with pytest.raises(InvalidRequestError):
            await engine.delete_topic("__consumer_offsets")
    async with open_engine(cfg(tmp_path)) as engine:
        got = [(c.topic, c.partition, c.offset, c.metadata) for c in engine.groups.fetch("g1")]
        assert got == [("t", 0, 6, "again"), ("t", 1, 7, ""), ("u", 0, 1, "")]
        assert engine.groups.groups() == ["g1", "g2"]
        await engine.delete_topic("t")  # its committed offsets go with it
        assert [(c.topic, c.offset) for c in engine.groups.fetch("g1")] == [("u", 1)]
        assert engine.groups.fetch("g2") == []
        assert await engine.groups.delete("g1") == 1
    async with open_engine(cfg(tmp_path)) as engine:
        assert engine.groups.groups() == []
        assert engine.topic("__consumer_offsets").config.compact


async def test_the_server_partition_limit(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path, max_partitions=5)) as engine:
        await engine.create_topic("a", 3)
        with pytest.raises(InvalidPartitionsError, match="limit of 5"):
            await engine.create_topic("b", 3)
        with pytest.raises(InvalidPartitionsError, match="limit of 5"):
            await engine.add_partitions("a", 6)
        await engine.add_partitions("a", 5)
        assert "b" not in engine.topics


async def test_partition_directories_hold_kafkas_partition_files(tmp_path: Path) -> None:
    """leader-epoch-checkpoint (eventlog writes leader epoch 0 into every batch) and
    partition.metadata without a final newline, as a Kafka broker leaves them."""
    async with open_engine(cfg(tmp_path)) as engine:
        state = await engine.create_topic("t", 2)
        await produce(engine, "t", 0, [b"a", b"b", b"c"])
        await engine.partition("t", 0).delete_records(2)
        topic_id = state.meta.topic_id
    for p in (0, 1):
        directory = tmp_path / f"t-{p}"
        assert (directory / "partition.metadata").read_bytes() == f"version: 0\ntopic_id: {topic_id}".encode()
        assert (directory / "leader-epoch-checkpoint").read_bytes() == b"0\n1\n0 0\n"
    # a directory written before these files existed, with the old partition.metadata (final
    # newline): it still names the topic, and the checkpoint starts at the log start offset
    directory = tmp_path / "t-0"
    (directory / "leader-epoch-checkpoint").unlink()
    (directory / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id}\n")
    async with open_engine(cfg(tmp_path)) as engine:
        assert engine.partition("t", 0).log_start_offset == 2
    assert (directory / "leader-epoch-checkpoint").read_bytes() == b"0\n1\n0 2\n"
    assert not list(tmp_path.rglob("*.tmp"))
# -- offline partitions (issue 11: a segment file the server may not write stopped the start) ----


async def test_a_partition_that_fails_to_load_goes_offline_alone(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        await engine.create_topic("a", 2)
        await engine.create_topic("b", 1)
        for p in (0, 1):
            await produce(engine, "a", p, [b"x", b"y", b"z"])
        await engine.partition("a", 0).delete_records(1)
        await produce(engine, "b", 0, [b"b1"])
    active = sorted((tmp_path / "a-0").glob("*.log"))[-1]
    aside = active.with_name("aside")
    os.replace(active, aside)
    active.mkdir()  # a .log the loader can stat but never open for appends (EISDIR)
    try:
        async with open_engine(cfg(tmp_path)) as engine:
            with pytest.raises(PartitionOfflineError, match="partition a-0 is offline") as caught:
                engine.partition("a", 0)
            assert (caught.value.topic, caught.value.partition) == ("a", 0)
            assert [o.name for o in engine.offline_partitions()] == ["a-0"]
            assert "a-0" not in [log.name for log in engine.all_partitions()]
            assert len(engine.topic("a").partitions) == 2 and len(engine.topic("a").online_partitions) == 1
            assert values_of(engine, "a", 1) == [b"x", b"y", b"z"]
            await produce(engine, "b", 0, [b"b2"])
            assert values_of(engine, "b", 0) == [b"b1", b"b2"]
            await engine.checkpoint()  # its checkpoint entries are kept for when it loads again
            assert read_checkpoint(tmp_path / "recovery-point-offset-checkpoint")[("a", 0)] == 3
            assert read_checkpoint(tmp_path / "log-start-offset-checkpoint")[("a", 0)] == 1
        tails = parse_clean_shutdown((tmp_path / ".kafka_cleanshutdown").read_bytes())
        assert ("a", 0) not in tails and ("a", 1) in tails  # it is recovered as after a crash next time
    finally:
        active.rmdir()
        os.replace(aside, active)
    async with open_engine(cfg(tmp_path)) as engine:
        assert engine.load_stats["a-0"].scanned_segments == 1
        assert engine.partition("a", 0).log_start_offset == 1
        assert values_of(engine, "a", 0) == [b"y", b"z"]
        assert not engine.offline_partitions()


async def test_a_topic_with_an_offline_partition_can_be_deleted(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        await engine.create_topic("a", 2)
        await produce(engine, "a", 0, [b"x"])
    active = sorted((tmp_path / "a-0").glob("*.log"))[-1]
    active.unlink()
    active.mkdir()
    async with open_engine(cfg(tmp_path)) as engine:
        assert [o.name for o in engine.offline_partitions()] == ["a-0"]
        await engine.delete_topic("a")
        assert not engine.offline_partitions()
        await engine.create_topic("a", 1)
        assert engine.partition("a", 0).high_watermark == 0
    async with open_engine(cfg(tmp_path)) as engine:
        assert not engine.offline_partitions() and engine.partition("a", 0).high_watermark == 0


async def test_a_data_dir_replaced_under_a_running_server_gets_nothing_more_from_it(tmp_path: Path) -> None:
    """Seen while soaking: a server left running after its data dir was removed kept writing
    its checkpoints by path into the new data dir of the next server, whose recovery then
    believed those recovery points and left offset gaps after a crash."""
    data = tmp_path / "data"
    async with open_engine(cfg(data, checkpoint_interval_ms=100)) as engine:
        await engine.create_topic("t", 1)
        await produce(engine, "t", 0, [b"a"])
        os.rename(data, tmp_path / "removed")
        data.mkdir()  # another server's data dir now, at the same path
        theirs = b"0\n1\nt 0 7\n"
        (data / "recovery-point-offset-checkpoint").write_bytes(theirs)
        log = engine.partition("t", 0)
        with anyio.fail_after(10):
            while log.failed is None:
                await anyio.sleep(0.02)
        with pytest.raises(StorageError):
            await produce(engine, "t", 0, [b"b"])
        assert values_of(engine, "t", 0) == [b"a"], "reads go on"
    assert sorted(p.name for p in data.iterdir()) == ["recovery-point-offset-checkpoint"]
    assert (data / "recovery-point-offset-checkpoint").read_bytes() == theirs


# -- leader epochs of partitions imported from Kafka ---------------------------------------------

# a Kafka partition of 10 batches of 5 records (offsets 0..49), written by leaders of epochs 0
# (offsets 0-9), 1 (10-24), 3 (25-39; epoch 2 wrote nothing) and 4 (40-49), whose broker was
# then elected leader in epoch 5 and stopped before any write: the checkpoint Kafka leaves
KAFKA_EPOCHS = {0: 0, 5: 0, 10: 1, 15: 1, 20: 1, 25: 3, 30: 3, 35: 3, 40: 4, 45: 4}
KAFKA_CHECKPOINT = "0\n5\n0 0\n1 10\n3 25\n4 40\n5 50\n"


def _kafka_partition(directory: Path, checkpoint: str | None) -> None:
    from ..app.kafka_dirs import write_partition

    batches = [
        (0, [(b"k", b"v%d" % (b + i), T0 + b + i, []) for i in range(5)]) for b in KAFKA_EPOCHS
    ]
    write_partition(directory, [batches[:6], batches[6:]])
    for log in sorted(directory.glob("*.log")):
        data = bytearray(log.read_bytes())
        position = 0
        while position < len(data):  # partitionLeaderEpoch is outside the CRC
            base = int.from_bytes(data[position : position + 8], "big")
            data[position + 12 : position + 16] = KAFKA_EPOCHS[base].to_bytes(4, "big")
            position += int.from_bytes(data[position + 8 : position + 12], "big") + 12
        log.write_bytes(bytes(data))
    if checkpoint is None:
        (directory / "leader-epoch-checkpoint").unlink()
    else:
        (directory / "leader-epoch-checkpoint").write_text(checkpoint)


def _epochs_of_batches(directory: Path) -> dict[int, int]:
    out = {}
    for log in sorted(directory.glob("*.log")):
        data = log.read_bytes()
        position = 0
        while position < len(data):
            base = int.from_bytes(data[position : position + 8], "big")
            out[base] = int.from_bytes(data[position + 12 : position + 16], "big")
            position += int.from_bytes(data[position + 8 : position + 12], "big") + 12
    return out


async def test_an_imported_partition_keeps_kafkas_leader_epochs_and_writes_in_the_latest(
    tmp_path: Path,
) -> None:
    """The outside check: Kafka's leader-epoch-checkpoint had 4 entries, the imported one 1
    (`0 <log start>`), and eventlog then wrote epoch 0 after batches of epoch 4, which Kafka's
    cache would take for a new, lower epoch and truncate its history to. Now the history comes
    along, trimmed as Kafka's own loader trims it (the epoch-5 entry at the log end holds no
    record; the first entry moves up to the log start), and new batches carry epoch 4. Where
    Kafka's file is missing or damaged, the history comes from the batches' epochs."""
    kafka = tmp_path / "kafka"
    _kafka_partition(kafka / "t-0", KAFKA_CHECKPOINT)
    _kafka_partition(kafka / "t-1", None)
    _kafka_partition(kafka / "t-2", "0\n3\n0 0\n1 10\n")  # torn: says 3 entries, holds 2
    data = tmp_path / "data"
    kept = "0\n4\n0 3\n1 10\n3 25\n4 40\n"
    derived = "0\n4\n0 0\n1 10\n3 25\n4 40\n"
    async with open_engine(cfg(data)) as engine:
        sources = {p: kafka / f"t-{p}" for p in range(3)}
        await engine.adopt_topic("t", sources, log_start_offsets={0: 3})
        for p in range(3):
            assert engine.partition("t", p).leader_epoch == 4
            await produce(engine, "t", p, [b"new"])
    expected = {0: kept, 1: derived, 2: derived}
    for p in range(3):
        assert (data / f"t-{p}" / "leader-epoch-checkpoint").read_text() == expected[p], p
        assert _epochs_of_batches(data / f"t-{p}")[50] == 4  # eventlog's batch: the latest epoch
    # Kafka's file as it was
    assert (kafka / "t-0" / "leader-epoch-checkpoint").read_text() == KAFKA_CHECKPOINT
    # after a restart the same, and a damaged file of ours is rebuilt from the batches' epochs
    (data / "t-1" / "leader-epoch-checkpoint").write_text("0\n1\nfour 40\n")
    async with open_engine(cfg(data)) as engine:
        assert [engine.partition("t", p).leader_epoch for p in range(3)] == [4, 4, 4]
        await produce(engine, "t", 0, [b"again"])
    assert _epochs_of_batches(data / "t-0")[51] == 4
    for p in range(3):
        assert (data / f"t-{p}" / "leader-epoch-checkpoint").read_text() == expected[p], p
    assert not list(data.rglob("*.tmp"))


async def test_a_partition_eventlog_creates_writes_in_epoch_0(tmp_path: Path) -> None:
    async with open_engine(cfg(tmp_path)) as engine:
        await engine.create_topic("t", 1)
        assert engine.partition("t", 0).leader_epoch == 0
        await produce(engine, "t", 0, [b"a", b"b"])
    assert _epochs_of_batches(tmp_path / "t-0") == {0: 0}
    # a damaged checkpoint of a partition of ours: rebuilt from its batches (epoch 0 from 0)
    (tmp_path / "t-0" / "leader-epoch-checkpoint").write_bytes(b"\x00garbage")
    async with open_engine(cfg(tmp_path)) as engine:
        assert engine.partition("t", 0).leader_epoch == 0
    assert (tmp_path / "t-0" / "leader-epoch-checkpoint").read_text() == "0\n1\n0 0\n"


async def test_an_interrupted_import_leaves_nothing_kafka_would_refuse(tmp_path: Path) -> None:
    """`<topic>-<partition>.importing` (import-kafka's staging, left by a crash before the
    topic was registered) is no topic-partition to Kafka, which would refuse the log dir: the
    next start removes it."""
    async with open_engine(cfg(tmp_path)):
        pass
    staging = tmp_path / "orders-0.importing"
    staging.mkdir()
    (staging / "00000000000000000000.log").write_bytes(b"")
    async with open_engine(cfg(tmp_path)) as engine:
        assert "orders" not in engine.topics
    assert not staging.exists()
