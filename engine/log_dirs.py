"""A log directory's own files: the lock, meta.properties, the clean-shutdown marker.

    .lock                     flock()ed by the process that owns the dir; holds its pid
    meta.properties           Java properties: version=1, node.id, cluster.id, directory.id
    .shards.lock              flock()ed by a shard of a family while it merges its entries into
                              a checkpoint or the clean-shutdown marker (eventlog serve --processes)
    .kafka_cleanshutdown      present only between a clean shutdown and the next start; JSON
                              saying what it covers, per partition (format_clean_shutdown)
    recovery-point-offset-checkpoint, log-start-offset-checkpoint, cleaner-offset-checkpoint
                              see checkpoints.py

Blocking; used by the log manager at start-up and shutdown.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import orjson

from . import filenames
from .checkpoints import CHECKPOINT_NAMES, read_checkpoint, write_checkpoint
from .errors import DataDirError, DataDirLockedError
from .fileutil import fsync_dir, make_dirs, replace_file
from .metadata import new_topic_id

logger = logging.getLogger("eventlog.engine")

LOCK_FILE = ".lock"
META_PROPERTIES = "meta.properties"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
FAMILY_LOCK_FILE = ".shards.lock"  # serialises shared-file rewrites among a family's shards
CLEAN_SHUTDOWN_VERSION = 1


@dataclass(frozen=True, slots=True)
class CleanTail:
    """What the clean-shutdown marker says of one partition: its last (active) segment's base
    offset and size in bytes, and its log end offset, as they were when it closed cleanly."""

    base_offset: int
    size: int
    log_end_offset: int


def format_clean_shutdown(tails: dict[tuple[str, int], CleanTail]) -> bytes:
    """The marker's content: {"version": 1, "partitions": {"<topic>-<n>": {"base_offset": ..,
    "size": .., "log_end_offset": ..}, ...}}, one entry per partition that closed cleanly."""
    partitions = {
        filenames.partition_dir_name(topic, p): {"base_offset": t.base_offset, "size": t.size, "log_end_offset": t.log_end_offset}
        for (topic, p), t in sorted(tails.items())
    }
    return orjson.dumps({"version": CLEAN_SHUTDOWN_VERSION, "partitions": partitions}) + b"\n"


def parse_clean_shutdown(data: bytes) -> dict[tuple[str, int], CleanTail] | None:
    """The partitions a marker covers; None when it does not say (an empty marker, as older
    eventlog versions wrote, or Kafka's {"version": 0, "brokerEpoch": ..}): every partition
    counts as clean. Raises ValueError for anything else that does not parse."""
    if not data.strip():
        return None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if "partitions" not in doc:
        return None
    if doc.get("version") != CLEAN_SHUTDOWN_VERSION or not isinstance(doc["partitions"], dict):
        raise ValueError(f"unknown version {doc.get('version')!r}")
    tails = {}
    for name, entry in doc["partitions"].items():
        tp = filenames.parse_partition_dir(name)
        fields = [entry.get(k) if isinstance(entry, dict) else None for k in ("base_offset", "size", "log_end_offset")]
        if tp is None or not all(type(v) is int and v >= 0 for v in fields):
            raise ValueError(f"bad entry for {name!r}: {entry!r}")
        tails[tp] = CleanTail(*fields)
    return tails


def read_properties(path: Path) -> dict[str, str]:
    props = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def write_properties(path: Path, props: dict[str, str]) -> None:
    lines = ["#", f"#{time.strftime('%a %b %d %H:%M:%S UTC %Y', time.gmtime())}"]
    lines += [f"{k}={v}" for k, v in props.items()]
    replace_file(path, ("\n".join(lines) + "\n").encode("utf-8"))


class LogDir:
    """One entry of log.dirs, locked for the lifetime of this object."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None
        self.meta: dict[str, str] = {}
        self.had_clean_shutdown = False
        self.created = False  # this start made the dir's meta.properties: nothing to recover
        # what the marker covers; None: it did not say (every partition counts as clean)
        self.clean_tails: dict[tuple[str, int], CleanTail] | None = None

    def open(self, node_id: int, cluster_id: str | None, *, family_lock_fd: int | None = None) -> None:
        """Create if needed, take the lock, read or write meta.properties, and note (then
        remove) the clean-shutdown marker. Raises DataDirLockedError or DataDirError.

        A shard of a family (eventlog serve --processes N) passes `family_lock_fd`: the
        descriptor of the lock its supervisor took (and handed down), so it takes no lock of
        its own; the family holds the dir until its last process exits.

        A new log dir inside a log dir (its parent holds meta.properties) is refused: Kafka
        would refuse the parent for holding it, and it is what starting on a volume laid out
        for an older image (the data dir at the volume's root, now one level down) would make:
        an empty dir, served as if the data were gone."""
        parent_meta = self.path.parent / META_PROPERTIES
        if not (self.path / META_PROPERTIES).exists() and parent_meta.exists():
            raise DataDirError(
                self.path,
                f"its parent is a log dir ({parent_meta} exists): a log dir inside another is "
                f"refused; use the parent as the data dir, or move its contents down into this "
                f"dir (docs/OPERATIONS.md, \"Where snapshots live\")",
            )
        try:
            make_dirs(self.path)  # durable: a power cut must not take the dir back
        except OSError as exc:
            raise DataDirError(self.path, f"cannot create: {exc}") from exc
        if family_lock_fd is None:
            self._lock()
        else:
            self._lock_fd = family_lock_fd
            self._family_locked = True
        meta_path = self.path / META_PROPERTIES
        if meta_path.exists():
            self.meta = read_properties(meta_path)
            if self.meta.get("node.id", str(node_id)) != str(node_id):
                raise DataDirError(self.path, f"belongs to node.id {self.meta['node.id']}, this server is {node_id}")
            if cluster_id is not None and self.meta.get("cluster.id") not in (None, cluster_id):
                raise DataDirError(
                    self.path, f"belongs to cluster {self.meta.get('cluster.id')}, the other dirs to {cluster_id}"
                )
        else:
            self.meta = {
                "version": "1",
                "node.id": str(node_id),
                "cluster.id": cluster_id or new_topic_id(),
                "directory.id": new_topic_id(),
            }
            write_properties(meta_path, self.meta)
            self.created = True
        for name in CHECKPOINT_NAMES:
            if not (self.path / name).exists():
                write_checkpoint(self.path / name, {})
        self._read_clean_shutdown()

    @property
    def cluster_id(self) -> str:
        return self.meta["cluster.id"]

    @property
    def lock_fd(self) -> int | None:
        """The descriptor holding the lock (a supervisor hands it to its shards); None when not open."""
        return self._lock_fd

    def _read_clean_shutdown(self) -> None:
        marker = self.path / CLEAN_SHUTDOWN_FILE
        try:
            data = marker.read_bytes()
        except FileNotFoundError:
            self.had_clean_shutdown = False
            return
        except OSError as exc:
            raise DataDirError(self.path, f"cannot read {CLEAN_SHUTDOWN_FILE}: {exc}") from exc
        self.had_clean_shutdown = True
        try:
            self.clean_tails = parse_clean_shutdown(data)
        except ValueError as exc:
            logger.warning("%s: %s is unreadable (%s); every partition is recovered as after a crash", self.path, CLEAN_SHUTDOWN_FILE, exc)
            self.clean_tails = {}

    def was_clean(self, tp: tuple[str, int]) -> bool:
        """Whether partition `tp` closed cleanly last time: the marker exists and covers it."""
        return self.had_clean_shutdown and (self.clean_tails is None or tp in self.clean_tails)

    def clean_tail(self, tp: tuple[str, int]) -> CleanTail | None:
        """What the marker says of `tp`'s files (None: it does not say)."""
        return None if self.clean_tails is None else self.clean_tails.get(tp)

    def clear_clean_shutdown(self) -> None:
        """Called once the dir is loaded: from now on a crash must be treated as unclean."""
        marker = self.path / CLEAN_SHUTDOWN_FILE
        if marker.exists():
            marker.unlink()
            fsync_dir(self.path)

    def mark_clean_shutdown(self, tails: dict[tuple[str, int], CleanTail]) -> None:
        """Written last at shutdown, atomically, naming each partition of this dir that closed
        cleanly (format_clean_shutdown); a partition it does not name is recovered next time."""
        self.check_still_ours()
        replace_file(self.path / CLEAN_SHUTDOWN_FILE, format_clean_shutdown(tails))

    @contextlib.contextmanager
    def _family_files(self) -> Iterator[None]:
        """Held while a shard of a family rewrites a file the whole family shares (a
        checkpoint, the clean-shutdown marker): read, merge its own entries, write."""
        fd = os.open(self.path / FAMILY_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def merge_checkpoint(
        self, name: str, entries: dict[tuple[str, int], int], mine: Callable[[tuple[str, int]], bool]
    ) -> None:
        """A shard's write of a shared checkpoint: the entries of partitions other shards own
        stay as they are in the file, this shard's are replaced by `entries`."""
        self.check_still_ours()
        with self._family_files():
            kept = {tp: v for tp, v in read_checkpoint(self.path / name).items() if not mine(tp)}
            write_checkpoint(self.path / name, kept | entries)

    def merge_clean_shutdown(self, tails: dict[tuple[str, int], CleanTail], mine: Callable[[tuple[str, int]], bool]) -> None:
        """A shard's part of the clean-shutdown marker: the shards write theirs one after the
        other as they close; a shard that never writes (killed) leaves its partitions out, and
        the next start recovers those."""
        self.check_still_ours()
        marker = self.path / CLEAN_SHUTDOWN_FILE
        with self._family_files():
            try:
                existing = parse_clean_shutdown(marker.read_bytes()) or {}
            except (FileNotFoundError, ValueError):
                existing = {}
            kept = {tp: t for tp, t in existing.items() if not mine(tp)}
            replace_file(marker, format_clean_shutdown(kept | tails))

    def read_checkpoint(self, name: str) -> dict[tuple[str, int], int]:
        return read_checkpoint(self.path / name)

    def write_checkpoint(self, name: str, entries: dict[tuple[str, int], int]) -> None:
        self.check_still_ours()
        write_checkpoint(self.path / name, entries)

    def check_still_ours(self) -> None:
        """Raise DataDirError unless the directory at our path is still the one we locked.

        Files are written by path. If the directory was removed or replaced while the server
        ran (`rm -rf data` and a new server started on a new `data`), this process would write
        its checkpoints into the other server's directory: seen in a test harness, where a
        stray server's recovery points made the new one leave offset gaps after a crash."""
        held = os.fstat(self._lock_fd) if self._lock_fd is not None else None
        try:
            now = os.stat(self.path / LOCK_FILE)
        except OSError:
            now = None
        if held is None or now is None or (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino):
            raise DataDirError(
                self.path, "was removed or replaced while this server ran (its lock file is not the one this "
                "process holds): nothing more is written there; stop this server",
            )

    def _lock(self) -> None:
        path = self.path / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise DataDirLockedError(
                self.path, f"already in use by another eventlog process (pid {holder}); stop it or pick another --data-dir"
            ) from None
        try:  # the holder's pid, for the message above; a full disk must not stop a start
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        self._lock_fd = fd

    def unlock(self) -> None:
        if getattr(self, "_family_locked", False):  # the supervisor's lock: not ours to drop
            self._lock_fd = None
            return
        if self._lock_fd is not None:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self._lock_fd)
                self._lock_fd = None
