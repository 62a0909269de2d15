"""Point-in-time snapshots of partitions: hard links of closed segments, a copy of the active
segment's durable prefix, and a manifest.json that says what the snapshot holds.

    <root>/<id>/manifest.json
    <root>/<id>/<topic>-<partition>/<base>.log, .index, .timeindex

The root is never inside a log dir: Kafka's LogManager.loadLogs takes every directory of a log
dir for a partition and refuses to start on one whose name is not `<topic>-<partition>` (or a
`-delete`, `-future`, `-stray` one), so a data dir must hold nothing else to stay one Kafka can
open. The default root is beside the first log dir, `<log dir>.snapshots` (default_root): on
its filesystem as long as the log dir is not itself a mount point, so segments are linked,
not copied. Roots of older versions, `<log dir>/snapshots`, are moved out at start-up
(move_legacy); placement_problems says when a root is inside a log dir or on another
filesystem (links then fail with EXDEV and segments are copied: _link_or_copy).

A snapshot of a partition is taken from one LogView (the published segment list, log start
offset and high watermark), captured while the partition's files lock is held, so that no
retention or compaction swap renames a segment between the capture and the links:

1. Under PartitionLog.files_lock: capture the view; hard-link each closed segment's three files
   (copy them if the snapshot root is on another filesystem); open the active segment.
2. Outside the lock: copy the active segment's first `active_end` bytes (everything below the
   high watermark, all of it durable) with copy_file_range, and build its indexes with the
   same placement rule as the writer.
3. fsync the files and directories, then write manifest.json (temp file, fsync, rename): a
   snapshot directory without a manifest is an unfinished one, removed by `list_snapshots`'
   caller or at the next start.

Before step 1, under a process-wide lock, the request is checked against SnapshotLimits and
its directory is made (a reservation): the count of finished and in-flight snapshots, and the
bytes snapshots hold on their own (see `usage`) plus what this one is estimated to add (the
active segments' durable prefixes and their indexes, and every closed segment when the root
is on another filesystem). Over a cap: SnapshotLimitError, and nothing is written. Any
OSError while taking the snapshot removes its directory (the space it took is given back)
and is raised as StorageFullError (ENOSPC, EDQUOT) or StorageError.

Closed segments never change in place, so a link is as good as a copy: records compacted or
deleted after the snapshot stay in it, records written after it never show. Cost grows with
the number of segments (three links each), not with bytes, except for the active segment's
prefix. Producers never wait: the lock is only the one retention and compaction take to swap
segments, and appends do not take it.

Bytes a snapshot holds on its own: a file under the root whose every link is under the root
(st_nlink links, all seen there; counted once per inode, by its allocated blocks): copies,
and hard links whose live segment retention or compaction has since removed. Links that the
live log still shares cost the disk nothing more and do not count.

Manifest (format_version 1; analytics/ reads it):
    {"format_version": 1, "snapshot_id", "created_at" (ISO 8601 UTC), "created_ms",
     "topics": [{"name", "topic_id", "internal", "cleanup_policy", "configs": {kafka name: str},
       "partitions": [{"partition", "dir", "log_start_offset", "high_watermark",
         "segments": [{"file", "base_offset", "last_offset", "size_bytes", "index_file",
                       "time_index_file", "copied"}]}]}]}
A copy uploaded to shared storage (analytics/upload.py) gives each segment an "object" (its
path from the manifest's directory) and drops the index file names; readers follow "object".
"""

from __future__ import annotations

import datetime as dt
import errno
import logging
import os
import re
import secrets
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson

from . import filenames
from .errors import SnapshotLimitError, SnapshotNotFoundError, StorageError
from .fileutil import fsync_dir, make_dirs, replace_file, storage_error
from .index_builder import IndexBuilder
from .partition_log import PartitionLog
from .scan import scan_headers
from .segments import LogView

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_ID_RE = re.compile(r"^\d{8}T\d{9}Z-[0-9a-f]{6}$")
ROOT_SUFFIX = ".snapshots"  # the default root: <first log dir>.snapshots
LEGACY_DIR = "snapshots"  # the default root of older versions: <first log dir>/snapshots

logger = logging.getLogger("eventlog.engine")


def default_root(log_dir: Path) -> Path:
    """Where snapshots go unless told: `<log dir>.snapshots`, beside the (first) log dir, on
    its filesystem unless the log dir is a mount point, and outside it (see the module
    docstring). Absolute, so that it names one place whatever the working directory."""
    absolute = Path(os.path.abspath(log_dir))
    return absolute.parent / (absolute.name + ROOT_SUFFIX)


def placement_problems(root: Path, log_dirs: Sequence[Path]) -> list[str]:
    """What is wrong with `root` as the snapshot root of a server on `log_dirs`, for the
    operator's log at start-up: inside a log dir (Kafka will refuse to open it), or on another
    filesystem than a log dir (that log dir's segments are copied into each snapshot instead
    of linked: the disk space of a full copy, and the time)."""
    problems = []
    resolved = root.resolve()
    try:
        root_dev = os.stat(_existing(root)).st_dev
    except OSError:
        root_dev = None
    for log_dir in log_dirs:
        if resolved.is_relative_to(log_dir.resolve()):
            problems.append(
                f"the snapshot dir {root} is inside the log dir {log_dir}: Apache Kafka refuses "
                f"to start on a log dir holding a directory that is not a topic-partition; set "
                f"EVENTLOG_SNAPSHOT_DIR outside it (the default is {default_root(log_dir)})"
            )
        elif root_dev is not None and log_dir.is_dir() and os.stat(log_dir).st_dev != root_dev:
            problems.append(
                f"the snapshot dir {root} is on another filesystem than the log dir {log_dir}: "
                f"snapshots copy its segments instead of hard-linking them; put "
                f"EVENTLOG_SNAPSHOT_DIR on its filesystem, outside it (a log dir that is a mount "
                f"point has no such place: mount the volume one level up)"
            )
    return problems


@dataclass(frozen=True, slots=True)
class LegacyMove:
    """What move_legacy did: snapshots moved to the root, unfinished ones removed, and entries
    left in the old directory, each with why."""

    moved: list[str]
    removed: list[str]
    left: dict[str, str]


def move_legacy(legacy: Path, root: Path) -> LegacyMove:
    """Move the snapshots an older version kept in `legacy` (`<log dir>/snapshots`, inside the
    log dir, where Kafka refuses it) into `root`, at start-up with the log dir locked: each
    finished snapshot directory is renamed (hard links stay links: nothing is copied); an
    unfinished or half-deleted one is removed, as remove_unfinished does at every start; the
    old directory goes once empty. What cannot be renamed stays where it is, listed in `left`
    with why: another filesystem (EXDEV: `root` is not beside the log dir, or the log dir is a
    mount point), a snapshot of the same id in `root`, anything that is not a snapshot. It
    stays readable there (`eventlog nightly --snapshot`, `upload-snapshot` take a path), and
    the caller tells the operator. Safe to run from several processes at once (a shard
    family): a snapshot another one moved meanwhile is skipped. Raises OSError."""
    moved: list[str] = []
    left: dict[str, str] = {}
    if not legacy.is_dir() or legacy.resolve() == root.resolve():
        return LegacyMove(moved, [], left)
    removed = remove_unfinished(legacy)
    for entry in sorted(os.scandir(legacy), key=lambda e: e.name):
        if not (entry.is_dir(follow_symlinks=False) and _ID_RE.match(entry.name)):
            left[entry.name] = "not a snapshot"
            continue
        if (root / entry.name).exists():
            left[entry.name] = f"{root / entry.name} exists"
            continue
        make_dirs(root)
        try:
            os.rename(entry.path, root / entry.name)
        except FileNotFoundError:
            continue  # moved by another process of the family
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EEXIST, errno.ENOTEMPTY):
                raise
            left[entry.name] = exc.strerror or str(exc)
            continue
        moved.append(entry.name)
    if moved:
        fsync_dir(root)
        fsync_dir(legacy)
    if not left:
        try:
            legacy.rmdir()
            fsync_dir(legacy.parent)
        except FileNotFoundError:
            pass  # removed by another process of the family
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    return LegacyMove(moved, removed, left)


def new_snapshot_id(now_ms: int) -> str:
    stamp = dt.datetime.fromtimestamp(now_ms / 1000, dt.UTC)
    return f"{stamp:%Y%m%dT%H%M%S}{now_ms % 1000:03d}Z-{secrets.token_hex(3)}"


def iso_ms(now_ms: int) -> str:
    stamp = dt.datetime.fromtimestamp(now_ms / 1000, dt.UTC)
    return f"{stamp:%Y-%m-%dT%H:%M:%S}.{now_ms % 1000:03d}Z"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What the manifest says of a topic (the caller reads it off the log manager)."""

    name: str
    topic_id: str
    internal: bool
    configs: dict[str, str]
    partitions: Sequence[PartitionLog]


@dataclass(frozen=True, slots=True)
class SnapshotLimits:
    """Caps on snapshots under one root (app/settings.py derives them from its settings).

    max_bytes caps the bytes snapshots hold on their own; without it, max_disk_fraction of
    the size of the root's filesystem does (resolved at each request). Neither: no cap."""

    max_count: int | None = None
    max_bytes: int | None = None
    max_disk_fraction: float | None = None

    def bytes_limit(self, root: Path) -> int | None:
        if self.max_bytes is not None:
            return self.max_bytes
        if self.max_disk_fraction is None:
            return None
        st = os.statvfs(_existing(root))
        return int(st.f_blocks * st.f_frsize * self.max_disk_fraction)


@dataclass(frozen=True, slots=True)
class SnapshotUsage:
    count: int  # finished snapshots
    bytes: int  # disk space they hold on their own


def topic_infos(engine: Any, names: Sequence[str]) -> list[TopicInfo]:
    """TopicInfo of each named topic of a LogManager (TopicNotFoundError for an unknown one)."""
    infos = []
    for name in dict.fromkeys(names):
        state = engine.topic(name)
        online = state.online_partitions
        if len(online) < len(state.partitions):  # an offline partition serves nothing, so has nothing to show
            logger.warning("snapshot of %s leaves out its offline partition(s)", name)
        infos.append(TopicInfo(name, state.meta.topic_id, state.meta.internal, state.config.to_kafka(), online))
    return infos


async def take_snapshot(
    root: Path, topics: Sequence[TopicInfo], now_ms: int, limits: SnapshotLimits | None = None
) -> dict[str, Any]:
    """Snapshot `topics` under `root`; returns the manifest. SnapshotLimitError before anything
    is written when it would pass a cap of `limits`; StorageFullError or StorageError (its
    directory removed) when the file system fails it."""
    snapshot_id = new_snapshot_id(now_ms)
    target = root / snapshot_id
    try:
        needed = await anyio.to_thread.run_sync(_estimate, root, topics)
        await anyio.to_thread.run_sync(_reserve, root, target, limits or SnapshotLimits(), needed)
    except OSError as exc:
        raise _storage_error(exc, target) from exc
    try:
        manifest_topics = []
        for topic in topics:
            parts = []
            for log in topic.partitions:
                parts.append(await snapshot_partition(log, target))
            configs = topic.configs
            manifest_topics.append({
                "name": topic.name,
                "topic_id": topic.topic_id,
                "internal": topic.internal,
                "cleanup_policy": configs.get("cleanup.policy", "delete"),
                "configs": configs,
                "partitions": parts,
            })
        manifest = {
            "format_version": FORMAT_VERSION,
            "snapshot_id": snapshot_id,
            "created_at": iso_ms(now_ms),
            "created_ms": now_ms,
            "topics": manifest_topics,
        }
        await anyio.to_thread.run_sync(_write_manifest, target, manifest)
        return manifest
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(shutil.rmtree, target, True)
        if isinstance(exc, OSError):
            raise _storage_error(exc, target) from exc
        raise
    finally:
        with _reservations_lock:
            _reservations.pop(target, None)


def _storage_error(exc: OSError, path: Path) -> StorageError:
    """An OSError of a snapshot's file operations as the engine's error (fileutil's one
    translation: a full disk is StorageFullError)."""
    return storage_error(exc, path, "snapshot failed, nothing was kept")


# -- limits: the reservation --------------------------------------------------------------------

# snapshot directories being written in this process -> the bytes they were estimated to add;
# the walk skips them and counts the estimate instead (two requests cannot both take the last room)
_reservations: dict[Path, int] = {}
_reservations_lock = threading.Lock()


def _reserve(root: Path, target: Path, limits: SnapshotLimits, needed: int) -> None:
    """Check `limits` and make the snapshot's directory, atomically with respect to other
    snapshots of this process. SnapshotLimitError (nothing made) over a cap."""
    with _reservations_lock:
        in_flight = {t: n for t, n in _reservations.items() if t.parent == root}
        used = usage(root, skip=in_flight)
        count = used.count + len(in_flight)
        held = used.bytes + sum(in_flight.values())
        max_bytes = limits.bytes_limit(root)
        if limits.max_count is not None and count + 1 > limits.max_count:
            raise SnapshotLimitError("count", count, held, needed, limits.max_count, max_bytes)
        if max_bytes is not None and held + needed > max_bytes:
            raise SnapshotLimitError("bytes", count, held, needed, limits.max_count, max_bytes)
        make_dirs(root)  # beside the log dir: its parent fsynced too, as a log dir's is
        target.mkdir()
        try:
            fsync_dir(root)
        except OSError:
            target.rmdir()
            raise
        _reservations[target] = needed


def usage(root: Path, skip: Sequence[Path] | dict[Path, int] = ()) -> SnapshotUsage:
    """Finished snapshots under `root`, and the bytes everything under it (unfinished and
    half-deleted directories included, `skip` not) holds on its own: each inode once, by its
    allocated blocks, when all its links are under the root."""
    if not root.is_dir():
        return SnapshotUsage(0, 0)
    count = 0
    inodes: dict[tuple[int, int], list[int]] = {}  # (dev, ino) -> [st_nlink, links seen, bytes]
    for entry in os.scandir(root):
        if not entry.is_dir(follow_symlinks=False) or Path(entry.path) in skip:
            continue
        if _ID_RE.match(entry.name) and os.path.exists(os.path.join(entry.path, MANIFEST)):
            count += 1
        for dirpath, _dirnames, names in os.walk(entry.path):
            for name in names:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # a snapshot being deleted meanwhile
                seen = inodes.get((st.st_dev, st.st_ino))
                if seen is None:
                    inodes[(st.st_dev, st.st_ino)] = [st.st_nlink, 1, st.st_blocks * 512]
                else:
                    seen[1] += 1
    return SnapshotUsage(count, sum(size for nlink, seen, size in inodes.values() if seen >= nlink))


def _estimate(root: Path, topics: Sequence[TopicInfo]) -> int:
    """Bytes a snapshot of `topics` taken now would hold on its own: each active segment's
    durable prefix and its two indexes, and, when `root` is on another filesystem than a
    partition (copies, not links), its closed segments and their indexes too."""
    root_dev = os.stat(_existing(root)).st_dev
    block = os.statvfs(_existing(root)).f_frsize or 4096
    total = 0
    for topic in topics:
        for log in topic.partitions:
            view = log.view
            interval = max(log.config.index_interval_bytes, 1)
            copied = [view.active_end] if view.active_end else []
            if os.stat(log.directory).st_dev != root_dev:
                copied += [s.size for s in view.segments[:-1] if s.size]
            for size in copied:
                entries = size // interval + 1
                total += sum(-(-n // block) * block for n in (size, 8 * entries, 12 * entries))
    return total


def _existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


async def snapshot_partition(log: PartitionLog, target: Path) -> dict[str, Any]:
    """Link or copy one partition into the snapshot directory `target`: by its owner (in a
    shard family a partition another shard owns is snapshotted by that shard)."""
    if getattr(log, "owner", None) is not None:  # follower.FollowedPartition
        return await log._call("snapshot", target)  # type: ignore[attr-defined]
    directory = target / filenames.partition_dir_name(log.topic, log.partition)
    async with log.files_lock:
        view = log.view
        closed = await anyio.to_thread.run_sync(_link_closed, view, directory)
        active = view.active
        handle = active.open_handle() if view.active_end else None
    entries = closed
    if handle is not None:
        entry = await anyio.to_thread.run_sync(
            _copy_active, handle, active.base_offset, view.active_end, directory, log.config
        )
        entries.append(entry)
    await anyio.to_thread.run_sync(fsync_dir, directory)
    return {
        "partition": log.partition,
        "dir": directory.name,
        "log_start_offset": view.log_start_offset,
        "high_watermark": view.high_watermark,
        "segments": entries,
    }


def _segment_entry(base: int, last_offset: int, size: int, copied: bool) -> dict[str, Any]:
    return {
        "file": filenames.log_file(Path(), base).name,
        "base_offset": base,
        "last_offset": last_offset,
        "size_bytes": size,
        "index_file": filenames.index_file(Path(), base).name,
        "time_index_file": filenames.time_index_file(Path(), base).name,
        "copied": copied,
    }


def _link_or_copy(source: Path, dest: Path) -> bool:
    """Hard-link; copy when the snapshot root is on another filesystem. True if copied."""
    try:
        os.link(source, dest)
        return False
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
    shutil.copyfile(source, dest)
    with open(dest, "rb") as f:
        os.fsync(f.fileno())
    return True


def _link_closed(view: LogView, directory: Path) -> list[dict[str, Any]]:
    directory.mkdir()
    entries = []
    for segment in view.segments[:-1]:
        if segment.size == 0:
            continue
        # a closed segment's indexes are verified (and rebuilt if damaged) before linking
        segment.offset_index  # noqa: B018
        copied = False
        for source in (segment.log_path, segment.offset_index.path, segment.time_index.path):
            copied |= _link_or_copy(source, directory / source.name.removesuffix(segment.suffix))
        entries.append(_segment_entry(segment.base_offset, segment.next_offset - 1, segment.size, copied))
    return entries


def _copy_active(handle, base: int, size: int, directory: Path, config) -> dict[str, Any]:
    log_path, index_path, time_path = filenames.segment_files(directory, base)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _copy_prefix(handle.fd, fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    builder = IndexBuilder(base, config.index_interval_bytes, config.segment_index_bytes)
    last_offset = base - 1
    read_fd = os.open(log_path, os.O_RDONLY)
    try:
        for header in scan_headers(read_fd, 0, size):
            builder.add(header.last_offset, header.position, header.size, header.max_timestamp)
            last_offset = header.last_offset
    finally:
        os.close(read_fd)
    offset_index, time_index = builder.write_closed(index_path, time_path, config.segment_index_bytes)
    offset_index.release()
    time_index.release()
    return _segment_entry(base, last_offset, size, True)


def _copy_prefix(source: int, dest: int, size: int) -> None:
    """The first `size` bytes of `source` into `dest`: copy_file_range, or sendfile where the
    kernel refuses it (EXDEV: another filesystem, as a snapshot dir elsewhere is)."""
    copied = 0
    in_kernel = True
    while copied < size:
        if in_kernel:
            try:
                n = os.copy_file_range(source, dest, size - copied, copied, copied)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                in_kernel = False
                continue
        else:
            os.lseek(dest, copied, os.SEEK_SET)
            n = os.sendfile(dest, source, copied, size - copied)
        if n == 0:
            raise OSError(errno.EIO, f"short copy of the active segment at {copied} of {size} bytes")
        copied += n


def _write_manifest(target: Path, manifest: dict[str, Any]) -> None:
    replace_file(target / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))


# -- listing and deleting ---------------------------------------------------------------------


def read_manifest(root: Path, snapshot_id: str) -> dict[str, Any]:
    """The manifest of a finished snapshot. Raises SnapshotNotFoundError if there is none and
    StorageError if it is not a manifest (damaged, or not written by this module)."""
    if not _ID_RE.match(snapshot_id):
        raise SnapshotNotFoundError(snapshot_id)
    try:
        return _load_manifest(root / snapshot_id / MANIFEST)
    except FileNotFoundError:
        raise SnapshotNotFoundError(snapshot_id) from None


def list_snapshots(root: Path) -> list[dict[str, Any]]:
    """Manifests of finished snapshots, oldest first; StorageError if one is damaged."""
    if not root.is_dir():
        return []
    out = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_dir() and _ID_RE.match(entry.name):
            try:
                out.append(_load_manifest(Path(entry.path, MANIFEST)))
            except FileNotFoundError:
                continue  # being written, or left by a crash (remove_unfinished)
    return out


def _load_manifest(path: Path) -> dict[str, Any]:
    """Parse a manifest and check the fields summary() relies on (StorageError otherwise)."""
    data = path.read_bytes()
    try:
        manifest = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise StorageError(path, f"manifest is not JSON: {exc}") from None
    ok = (
        isinstance(manifest, dict)
        and manifest.get("format_version") == FORMAT_VERSION
        and isinstance(manifest.get("snapshot_id"), str)
        and isinstance(manifest.get("created_at"), str)
        and isinstance(manifest.get("topics"), list)
        and all(_topic_ok(t) for t in manifest["topics"])
    )
    if not ok:
        raise StorageError(path, "not a format_version 1 snapshot manifest")
    return manifest


def _topic_ok(topic: Any) -> bool:
    return (
        isinstance(topic, dict)
        and isinstance(topic.get("name"), str)
        and isinstance(topic.get("partitions"), list)
        and all(
            isinstance(p, dict)
            and all(type(p.get(k)) is int for k in ("partition", "log_start_offset", "high_watermark"))
            and isinstance(p.get("segments"), list)
            and all(isinstance(s, dict) and type(s.get("size_bytes")) is int for s in p["segments"])
            for p in topic["partitions"]
        )
    )


def delete_snapshot(root: Path, snapshot_id: str) -> None:
    """Remove the snapshot's directory: its own links and copies; the live files keep theirs."""
    read_manifest(root, snapshot_id)
    target = root / snapshot_id
    try:
        os.replace(target, root / f".{snapshot_id}.deleting")
        fsync_dir(root)
        shutil.rmtree(root / f".{snapshot_id}.deleting")
    except OSError as exc:
        raise StorageError(target, f"deleting the snapshot failed ({exc.strerror or exc})") from exc


def remove_unfinished(root: Path) -> list[str]:
    """At start-up: snapshot dirs without a manifest, and half-deleted ones, go."""
    removed = []
    if not root.is_dir():
        return removed
    for entry in os.scandir(root):
        if not entry.is_dir():
            continue
        unfinished = _ID_RE.match(entry.name) and not Path(entry.path, MANIFEST).exists()
        if unfinished or entry.name.endswith(".deleting"):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def summary(manifest: dict[str, Any], root: Path) -> dict[str, Any]:
    """The API's view of a manifest: per-partition totals instead of segment lists."""
    partitions = []
    for topic in manifest["topics"]:
        for part in topic["partitions"]:
            partitions.append({
                "topic": topic["name"],
                "partition": part["partition"],
                "log_start_offset": part["log_start_offset"],
                "high_watermark": part["high_watermark"],
                "segments": len(part["segments"]),
                "size_bytes": sum(s["size_bytes"] for s in part["segments"]),
            })
    return {
        "id": manifest["snapshot_id"],
        "path": str(root / manifest["snapshot_id"]),
        "created_at": manifest["created_at"],
        "topics": [t["name"] for t in manifest["topics"]],
        "partitions": partitions,
    }
