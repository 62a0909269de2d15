"""engine/snapshots.py on real files: what snapshots hold on their own, the caps, and a failed
snapshot leaving nothing behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from engine import snapshots
from engine.errors import SnapshotLimitError, StorageError, StorageFullError
from engine.log_manager import EngineConfig, open_engine
from engine.partition_log import prepare_batches
from engine.records import encode_batch

T0 = 1_700_000_000_000


async def produce(engine, topic: str, count: int, size: int) -> None:
    log = engine.partition(topic, 0)
    for i in range(count):
        batch = encode_batch(0, [(b"k%d" % i, b"v" * size, T0, [])])
        await log.append(prepare_batches(batch, log.config))


def blocks(path: Path) -> int:
    return path.stat().st_blocks * 512


def snapshot_files(root: Path, snapshot_id: str) -> list[Path]:
    return sorted(p for p in (root / snapshot_id).rglob("*") if p.is_file())


async def test_usage_counts_copies_and_orphaned_links_once_never_shared_links(tmp_path: Path) -> None:
    data, root = tmp_path / "data", tmp_path / "data" / "snapshots"
    async with open_engine(EngineConfig(log_dirs=(data,))) as engine:
        await engine.create_topic("t", 1, {"segment.bytes": 2000})
        await produce(engine, "t", 30, 200)  # closed segments and an active one
        infos = snapshots.topic_infos(engine, ["t"])
        first = await snapshots.take_snapshot(root, infos, T0)
        second = await snapshots.take_snapshot(root, infos, T0 + 1)
    copies = [p for sid in (first["snapshot_id"], second["snapshot_id"]) for p in snapshot_files(root, sid) if p.stat().st_nlink == 1]
    assert copies, "the active segment and its indexes are copied"
    # two snapshots share the links of the live closed segments: those cost nothing
    used = snapshots.usage(root)
    assert used == snapshots.SnapshotUsage(2, sum(blocks(p) for p in copies))
    # the live closed segments go (retention, compaction): both snapshots now hold them alone,
    # and each inode counts once although two snapshots link it
    live = data / "t-0"
    closed = [p for p in snapshot_files(root, first["snapshot_id"]) if p.stat().st_nlink == 3]
    assert closed
    for path in closed:
        (live / path.name).unlink()
    orphans = sum(blocks(p) for p in closed)
    assert snapshots.usage(root) == snapshots.SnapshotUsage(2, used.bytes + orphans)
    # a half-deleted snapshot still holds its bytes, but is no longer a snapshot
    os.replace(root / second["snapshot_id"], root / f".{second['snapshot_id']}.deleting")
    assert snapshots.usage(root) == snapshots.SnapshotUsage(1, used.bytes + orphans)


async def test_caps_refuse_before_anything_is_written(tmp_path: Path) -> None:
    data, root = tmp_path / "data", tmp_path / "data" / "snapshots"
    async with open_engine(EngineConfig(log_dirs=(data,))) as engine:
        await engine.create_topic("t", 1)
        await produce(engine, "t", 50, 1000)  # ~50 KB, all in the active segment
        infos = snapshots.topic_infos(engine, ["t"])
        await snapshots.take_snapshot(root, infos, T0, snapshots.SnapshotLimits(max_count=1))
        listing = sorted(os.listdir(root))
        with pytest.raises(SnapshotLimitError) as refused:
            await snapshots.take_snapshot(root, infos, T0 + 1, snapshots.SnapshotLimits(max_count=1))
        assert (refused.value.limit, refused.value.count, refused.value.max_count) == ("count", 1, 1)
        held = snapshots.usage(root).bytes
        with pytest.raises(SnapshotLimitError) as refused:
            await snapshots.take_snapshot(root, infos, T0 + 2, snapshots.SnapshotLimits(max_bytes=held + 10_000))
        e = refused.value
        assert (e.limit, e.held_bytes, e.max_bytes) == ("bytes", held, held + 10_000)
        assert e.needed_bytes >= 50_000
        # a fraction of the filesystem: the same check, the limit resolved from statvfs
        st = os.statvfs(root)
        with pytest.raises(SnapshotLimitError) as refused:
            tiny = (held + 1) / (st.f_blocks * st.f_frsize)
            await snapshots.take_snapshot(root, infos, T0 + 3, snapshots.SnapshotLimits(max_disk_fraction=tiny))
        assert refused.value.max_bytes == int(st.f_blocks * st.f_frsize * tiny)
        assert sorted(os.listdir(root)) == listing
        # within the caps: taken
        await snapshots.take_snapshot(root, infos, T0 + 4, snapshots.SnapshotLimits(max_count=2, max_bytes=10 * held))
        assert snapshots.usage(root).count == 2


async def test_a_failed_snapshot_is_a_storage_error_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    """The OSError translation: ENOSPC and EDQUOT are StorageFullError, anything else a
    StorageError, and the snapshot's directory is gone either way. (The real full disk:
    tests/api/test_snapshots.py, on a small tmpfs.)"""
    data, root = tmp_path / "data", tmp_path / "data" / "snapshots"
    async with open_engine(EngineConfig(log_dirs=(data,))) as engine:
        await engine.create_topic("t", 1)
        await produce(engine, "t", 5, 100)
        infos = snapshots.topic_infos(engine, ["t"])
        for code, raised in ((errno.ENOSPC, StorageFullError), (errno.EDQUOT, StorageFullError), (errno.EIO, StorageError)):
            def failing_write(target: Path, manifest: dict, code: int = code) -> None:
                (target / "manifest.json.tmp").write_bytes(b"partial")
                raise OSError(code, os.strerror(code))

            monkeypatch.setattr(snapshots, "_write_manifest", failing_write)
            with pytest.raises(raised) as failed:
                await snapshots.take_snapshot(root, infos, T0)
            assert type(failed.value) is raised and isinstance(failed.value.__cause__, OSError)
            assert os.listdir(root) == []


# -- where the root is: beside the log dir, never in it ------------------------------------------


def test_the_default_root_is_beside_the_log_dir_and_placement_is_checked(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert snapshots.default_root(Path("data")) == tmp_path / "data.snapshots"
    assert snapshots.default_root(Path("/srv/kafka-logs/")) == Path("/srv/kafka-logs.snapshots")
    data = tmp_path / "data"
    data.mkdir()
    assert snapshots.placement_problems(snapshots.default_root(data), [data]) == []
    (inside,) = snapshots.placement_problems(data / "snapshots", [data])
    assert "inside the log dir" in inside and "Apache Kafka refuses" in inside


async def test_legacy_snapshots_are_moved_and_stay_readable_where_they_cannot_be(
    tmp_path: Path, monkeypatch
) -> None:
    """Snapshots of older versions, inside the log dir: renamed into the root (links stay
    links); where the rename fails (another filesystem: EXDEV) they stay, untouched and
    readable where they are, and are listed as left, with why."""
    data = tmp_path / "data"
    legacy, root = data / snapshots.LEGACY_DIR, snapshots.default_root(data)
    async with open_engine(EngineConfig(log_dirs=(data,))) as engine:
        await engine.create_topic("t", 1, {"segment.bytes": 2000})
        await produce(engine, "t", 30, 200)
        manifest = await snapshots.take_snapshot(legacy, snapshots.topic_infos(engine, ["t"]), T0)
    sid = manifest["snapshot_id"]
    files = snapshot_files(legacy, sid)

    def cross_device(src, dst) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "rename", cross_device)
    kept = snapshots.move_legacy(legacy, root)
    assert (kept.moved, kept.left) == ([], {sid: os.strerror(errno.EXDEV)})
    assert snapshots.list_snapshots(legacy) == [manifest] and snapshot_files(legacy, sid) == files
    monkeypatch.undo()
    inodes = {p.name: p.stat().st_ino for p in files}
    moved = snapshots.move_legacy(legacy, root)
    assert (moved.moved, moved.left) == ([sid], {}) and not legacy.exists()
    assert snapshots.list_snapshots(root) == [manifest]
    assert {p.name: p.stat().st_ino for p in snapshot_files(root, sid)} == inodes
    # nothing left to do
    assert snapshots.move_legacy(legacy, root) == snapshots.LegacyMove([], [], {})
