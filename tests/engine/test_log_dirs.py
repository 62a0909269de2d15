"""The clean-shutdown marker: what it covers, per partition, and what an old one means."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from engine import filenames
from engine.log_dirs import CLEAN_SHUTDOWN_FILE, CleanTail, LogDir, format_clean_shutdown, parse_clean_shutdown
from engine.log_manager import EngineConfig, open_engine
from engine.partition_log import prepare_batches
from engine.records import encode_batch

T0 = 1_700_000_000_000


def test_marker_format_round_trips() -> None:
    tails = {("orders", 0): CleanTail(0, 228, 4), ("a-b.c", 12): CleanTail(100, 0, 100)}
    data = format_clean_shutdown(tails)
    assert orjson.loads(data) == {
        "version": 1,
        "partitions": {
            "a-b.c-12": {"base_offset": 100, "size": 0, "log_end_offset": 100},
            "orders-0": {"base_offset": 0, "size": 228, "log_end_offset": 4},
        },
    }
    assert parse_clean_shutdown(data) == tails
    assert parse_clean_shutdown(format_clean_shutdown({})) == {}  # covers nothing: no partition is clean


@pytest.mark.parametrize("data", [b"", b"\n", b'{"version":0,"brokerEpoch":17}'])
def test_a_marker_that_does_not_say_means_every_partition_is_clean(data: bytes) -> None:
    """Older eventlog versions wrote an empty marker; Kafka writes its broker epoch."""
    assert parse_clean_shutdown(data) is None


@pytest.mark.parametrize("data", [
    b"\x00\x01", b"[]", b'{"version": 2, "partitions": {}}', b'{"version": 1, "partitions": {"t-0": {"size": 1}}}',
    b'{"version": 1, "partitions": {"nodash": {"base_offset": 0, "size": 0, "log_end_offset": 0}}}',
    b'{"version": 1, "partitions": {"t-0": {"base_offset": -1, "size": 0, "log_end_offset": 0}}}',
])
def test_a_damaged_marker_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_clean_shutdown(data)


@pytest.mark.parametrize(("data", "clean"), [(None, False), (b"", True), (b"garbage", False), (None, "covered")])
def test_log_dir_reads_the_marker(tmp_path: Path, data: bytes | None, clean) -> None:
    if clean == "covered":
        data = format_clean_shutdown({("t", 0): CleanTail(5, 10, 7)})
    if data is not None:
        (tmp_path / CLEAN_SHUTDOWN_FILE).write_bytes(data)
    d = LogDir(tmp_path)
    d.open(0, None)
    try:
        assert d.was_clean(("t", 0)) is bool(clean)
        assert d.was_clean(("t", 1)) is (clean is True)  # an entry-less marker covers every partition
        assert d.clean_tail(("t", 0)) == (CleanTail(5, 10, 7) if clean == "covered" else None)
    finally:
        d.unlock()


async def test_the_marker_names_what_each_partition_left(tmp_path: Path) -> None:
    async with open_engine(EngineConfig(log_dirs=(tmp_path,))) as engine:
        await engine.create_topic("t", 2, {"segment.bytes": 200})
        log = engine.partition("t", 1)
        for i in range(5):
            await log.append(prepare_batches(encode_batch(0, [(b"k", b"v%d" % i * 30, T0, [])]), log.config))
    tails = parse_clean_shutdown((tmp_path / CLEAN_SHUTDOWN_FILE).read_bytes())
    assert tails is not None and {("t", 0), ("t", 1), ("__metadata", 0), ("__consumer_offsets", 0)} <= set(tails)
    active = sorted((tmp_path / "t-1").glob("*.log"))[-1]
    assert tails[("t", 1)] == CleanTail(int(active.name[:20]), active.stat().st_size, 5)
    assert tails[("t", 0)] == CleanTail(0, 0, 0)
    assert filenames.parse_segment_file(active.name) is not None


async def test_a_new_log_dir_inside_a_log_dir_is_refused(tmp_path: Path) -> None:
    """A volume written by the older image holds its data dir at its root; the new image's data
    dir is one level down. Starting there must not serve an empty dir as if the data were gone
    (nor make the volume's root a log dir Kafka refuses for holding another)."""
    from engine.errors import DataDirError

    async with open_engine(EngineConfig(log_dirs=(tmp_path,))) as engine:
        await engine.create_topic("t", 1)
    with pytest.raises(DataDirError, match="its parent is a log dir"):
        async with open_engine(EngineConfig(log_dirs=(tmp_path / "data",))):
            pass
    assert not (tmp_path / "data").exists()
    # once the operator has moved the data down, it opens, topics and all
    (tmp_path / "data").mkdir()
    for entry in list(tmp_path.iterdir()):
        if entry.name != "data":
            entry.rename(tmp_path / "data" / entry.name)
    async with open_engine(EngineConfig(log_dirs=(tmp_path / "data",))) as engine:
        assert "t" in engine.topics
