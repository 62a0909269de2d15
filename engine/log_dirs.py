"""A log directory's own files: the lock, meta.properties, the clean-shutdown marker.

    .lock                     flock()ed by the process that owns the dir; holds its pid
    meta.properties           Java properties: version=1, node.id, cluster.id, directory.id
    .kafka_cleanshutdown      present only between a clean shutdown and the next start
    recovery-point-offset-checkpoint, log-start-offset-checkpoint, cleaner-offset-checkpoint
                              see checkpoints.py

Blocking; used by the log manager at start-up and shutdown.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from .checkpoints import CHECKPOINT_NAMES, read_checkpoint, write_checkpoint
from .errors import DataDirError, DataDirLockedError
from .fileutil import fsync_dir, replace_file
from .metadata import new_topic_id

LOCK_FILE = ".lock"
META_PROPERTIES = "meta.properties"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


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

    def open(self, node_id: int, cluster_id: str | None) -> None:
        """Create if needed, take the lock, read or write meta.properties, and note (then
        remove) the clean-shutdown marker. Raises DataDirLockedError or DataDirError."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataDirError(self.path, f"cannot create: {exc}") from exc
        self._lock()
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
        for name in CHECKPOINT_NAMES:
            if not (self.path / name).exists():
                write_checkpoint(self.path / name, {})
        self.had_clean_shutdown = (self.path / CLEAN_SHUTDOWN_FILE).exists()

    @property
    def cluster_id(self) -> str:
        return self.meta["cluster.id"]

    def clear_clean_shutdown(self) -> None:
        """Called once the dir is loaded: from now on a crash must be treated as unclean."""
        marker = self.path / CLEAN_SHUTDOWN_FILE
        if marker.exists():
            marker.unlink()
            fsync_dir(self.path)

    def mark_clean_shutdown(self) -> None:
        marker = self.path / CLEAN_SHUTDOWN_FILE
        with open(marker, "wb") as f:
            os.fsync(f.fileno())
        fsync_dir(self.path)

    def read_checkpoint(self, name: str) -> dict[tuple[str, int], int]:
        return read_checkpoint(self.path / name)

    def write_checkpoint(self, name: str, entries: dict[tuple[str, int], int]) -> None:
        write_checkpoint(self.path / name, entries)

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
        if self._lock_fd is not None:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self._lock_fd)
                self._lock_fd = None
