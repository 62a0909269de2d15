"""holdfs: a FUSE filesystem that holds every change in memory until it is made durable, for
power-cut tests (tests/powercut/test_power_cut.py).

    python tests/powercut/holdfs.py BACKING MOUNTPOINT

A passthrough over BACKING in which nothing is durable before the application asks for it the
way POSIX says it must, and a power cut is the daemon's death: SIGKILL it, unmount the dead
mount (`umount -l`), mount again over the same BACKING, and only what was made durable is
there. Between those points everything lives in this process's memory; BACKING holds exactly
the durable state at every instant (each step that changes it is atomic or ordered so), so the
cut can come at any moment, even in the middle of an fsync.

The durability model (conservative: what POSIX promises, less than ext4 gives):

- File data and size. write() and truncate() change the file in memory (4 KiB pages over the
  durable bytes). fsync() and fdatasync() of the file write its pages and size through to its
  durable copy (BACKING/data/<inode>, then fdatasync of that). Nothing else makes them durable:
  not close(), not a sync(2) or syncfs(2) of the mount (the kernel asks a FUSE daemon nothing
  for those: syncfs returns 0, which is the behaviour issue 23 found), not time passing. A
  shared writable mmap is the same: its pages reach the daemon as writes, durable at fsync.
- Directory entries (create, mkdir, link, unlink, rmdir, rename). They change the namespace in
  memory; fsync of a directory makes that directory's entries durable as they are then (the
  names, and which inode each names; an inode first named durably this way has no durable data
  until its own fsync). fsync of a file does not make its name durable, and a rename is
  durable only where its directories were fsynced: a rename within one directory followed by
  an fsync of it is atomic; across two directories, each side's fsync makes its own side
  durable (POSIX; on ext4 one journal commit would carry both). This is what Kafka assumes
  (Utils.atomicMoveWithFallback, flushDir after creating or renaming files) and eventlog
  follows (engine/fileutil.py: replace_file, fsync_dir, make_dirs).
- Attributes other than the size (mode, times) are not modelled: modes are kept, times are
  the backing file's after a remount.

The durable namespace is BACKING/state.json, written atomically (temp file, fsync, rename, fsync
of BACKING) at each directory fsync: the inode of each durable directory entry, per directory.
At mount, everything not reachable from the root through durable entries is deleted.

Inode numbers are this layer's own, stable across remounts as on a disk filesystem, and readdir
gives each entry's (d_ino = st_ino; use_ino). Without that libfuse gives readdir 0xffffffff and
numbers a file anew when the kernel forgets it: a shard family's readers tell a segment file
from a replaced one by its inode (engine/follower.py: stat at the listing, fstat once opened),
and answered 500 `the listed segment file is gone` when they compared readdir's d_ino.

Hard links are supported; symlinks, special files, xattrs and locks are not (file locks are the
kernel's local ones: the daemon implements neither lock operation).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import threading
import time
from pathlib import Path

PAGE = 4096
ROOT = 1


def _error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class Inode:
    __slots__ = ("id", "is_dir", "mode", "entries", "size", "floor", "pages", "version", "nlink", "opens",
                 "mtime_ns", "sync_lock", "fd", "low", "gone")

    def __init__(self, id: int, is_dir: bool, mode: int) -> None:
        self.id = id
        self.is_dir = is_dir
        self.mode = mode
        self.entries: dict[str, int] = {}  # a directory's names, as they are now
        self.size = 0  # a file's size now
        # bytes below `floor` not in a dirty page are the durable copy's; from it up, zeros
        # (the lowest size the file had since its last fsync, and never above the durable size)
        self.floor = 0
        self.pages: dict[int, bytearray] = {}  # dirty pages, full PAGE each
        self.version = 0  # bumped by every change of the data or size
        self.nlink = 0
        self.opens = 0
        self.mtime_ns = time.time_ns()
        self.sync_lock = threading.Lock()  # one fsync of this file at a time
        self.fd = -1  # the durable copy, opened on first need
        self.low = 0  # the lowest size since the fsync in progress took its snapshot
        self.gone = False  # forgotten while an fsync of it ran: that fsync closes `fd`


class HoldFS:
    """The operations fusepy calls (`__call__(name, *args)`); every one under one lock but the
    syncs, which do their disk I/O outside it."""

    use_ns = True
    flag_nullpath_ok = True  # operations on an unlinked open file come with a null path

    def __init__(self, backing: Path) -> None:
        self.backing = backing
        self.data = backing / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.mutex = threading.RLock()
        self.state_lock = threading.Lock()
        self.state_seq = 0
        self.state_written = 0
        self._load()

    # -- durable state -------------------------------------------------------------------------

    def _load(self) -> None:
        """The durable state, and the namespace in memory made from it; everything unreachable
        from the root deleted."""
        path = self.backing / "state.json"
        if path.exists():
            state = json.loads(path.read_text())
        else:
            state = {"next_id": ROOT + 1, "inodes": {str(ROOT): [True, 0o755]}, "dirs": {str(ROOT): {}}}
        kinds = {int(k): (v[0], v[1]) for k, v in state["inodes"].items()}
        dirs = {int(k): {n: int(c) for n, c in v.items()} for k, v in state["dirs"].items()}
        self.inodes: dict[int, Inode] = {}
        self.durable_kinds: dict[int, tuple[bool, int]] = {}
        self.durable_dirs: dict[int, dict[str, int]] = {}
        todo = [ROOT]
        while todo:
            id = todo.pop()
            if id in self.inodes:  # a second link
                self.inodes[id].nlink += 1
                continue
            is_dir, mode = kinds[id]
            node = self.inodes[id] = Inode(id, is_dir, mode)
            node.nlink = 1
            self.durable_kinds[id] = (is_dir, mode)
            if is_dir:
                node.entries = dict(dirs.get(id, {}))
                self.durable_dirs[id] = dict(node.entries)
                todo.extend(node.entries.values())
            else:
                try:
                    st = os.stat(self.data / str(id))
                except FileNotFoundError:
                    pass
                else:
                    node.size = node.floor = st.st_size
                    node.mtime_ns = st.st_mtime_ns
        self.inodes[ROOT].nlink = 2
        seen = [int(p.name) for p in self.data.iterdir() if p.name.isdigit()]
        self.next_id = max([state["next_id"], *(i + 1 for i in seen)])
        for id in seen:
            if id not in self.inodes:
                os.unlink(self.data / str(id))
        self._write_state(self._state_payload())

    def _state_payload(self) -> tuple[int, bytes]:
        """(sequence, the durable state as JSON); under self.mutex."""
        self.state_seq += 1
        state = {
            "next_id": self.next_id,
            "inodes": {str(k): [d, m] for k, (d, m) in self.durable_kinds.items()},
            "dirs": {str(k): v for k, v in self.durable_dirs.items()},
        }
        return self.state_seq, json.dumps(state).encode()

    def _write_state(self, payload: tuple[int, bytes]) -> None:
        """Write the durable state atomically, unless a later one was written already (it holds
        every change this one does)."""
        seq, data = payload
        with self.state_lock:
            if seq <= self.state_written:
                return
            tmp = self.backing / "state.json.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.backing / "state.json")
            dfd = os.open(self.backing, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            self.state_written = seq

    def _durably_named(self) -> set[int]:
        return {c for entries in self.durable_dirs.values() for c in entries.values()}

    def _forget(self, node: Inode) -> None:
        """An inode no name and no open file holds any more: its memory goes; its durable copy
        too unless a durable entry still names it (a cut would bring that name back)."""
        if node.nlink > 0 or node.opens > 0 or node.id not in self.inodes:
            return
        del self.inodes[node.id]
        if node.sync_lock.acquire(blocking=False):  # (an fsync in flight closes it when done)
            try:
                if node.fd >= 0:
                    os.close(node.fd)
                    node.fd = -1
            finally:
                node.sync_lock.release()
        else:
            node.gone = True
        if node.id not in self._durably_named():
            self.durable_kinds.pop(node.id, None)
            self.durable_dirs.pop(node.id, None)
            try:
                os.unlink(self.data / str(node.id))
            except FileNotFoundError:
                pass

    # -- the namespace ---------------------------------------------------------------------------

    def _lookup(self, path: str) -> Inode:
        node = self.inodes[ROOT]
        for name in path.split("/"):
            if not name:
                continue
            if not node.is_dir:
                raise _error(errno.ENOTDIR)
            child = node.entries.get(name)
            if child is None:
                raise _error(errno.ENOENT)
            node = self.inodes[child]
        return node

    def _parent(self, path: str) -> tuple[Inode, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head or "/")
        if not parent.is_dir:
            raise _error(errno.ENOTDIR)
        return parent, name

    def _node(self, path: str | None, fh: int | None) -> Inode:
        if fh:
            node = self.inodes.get(fh)
            if node is not None:
                return node
        if path is None:
            raise _error(errno.EBADF)
        return self._lookup(path)

    def _new(self, is_dir: bool, mode: int) -> Inode:
        node = Inode(self.next_id, is_dir, mode)
        self.next_id += 1
        self.inodes[node.id] = node
        return node

    # -- fusepy's entry point ----------------------------------------------------------------------

    def __call__(self, op: str, *args):
        method = getattr(self, op, None)
        if method is None:
            raise _error(errno.ENOSYS)
        if op in ("fsync", "fsyncdir"):
            return method(*args)
        with self.mutex:
            return method(*args)

    def init(self, path: str) -> None:
        return None

    def destroy(self, path: str) -> None:
        return None

    def access(self, path: str, amode: int) -> int:
        self._lookup(path)
        return 0

    def getattr(self, path: str | None, fh: int | None = None) -> dict:
        node = self._node(path, fh)
        now = node.mtime_ns
        return {
            "st_ino": node.id,  # stable, as a disk filesystem's (use_ino): shards compare them
            "st_mode": (stat.S_IFDIR if node.is_dir else stat.S_IFREG) | node.mode,
            "st_nlink": max(node.nlink, 1 if node.opens else 0) + (1 if node.is_dir else 0),
            "st_size": 4096 if node.is_dir else node.size,
            "st_blocks": (node.size + 511) // 512,
            "st_uid": os.getuid(),
            "st_gid": os.getgid(),
            "st_atime": now,
            "st_mtime": now,
            "st_ctime": now,
        }

    def statfs(self, path: str) -> dict:
        st = os.statvfs(self.backing)
        return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                                              "f_ffree", "f_favail", "f_namemax")}

    def chmod(self, path: str, mode: int) -> int:
        self._lookup(path).mode = mode & 0o7777
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._lookup(path)
        return 0

    def utimens(self, path: str, times=None) -> int:
        node = self._lookup(path)
        node.mtime_ns = times[1] if times else time.time_ns()
        return 0

    def opendir(self, path: str) -> int:
        node = self._lookup(path)
        if not node.is_dir:
            raise _error(errno.ENOTDIR)
        node.opens += 1
        return node.id

    def releasedir(self, path: str | None, fh: int) -> int:
        node = self.inodes.get(fh)
        if node is not None:
            node.opens -= 1
            self._forget(node)
        return 0

    def readdir(self, path: str | None, fh: int) -> list:
        """Names with their inode numbers (readdir's d_ino, the same as stat's st_ino)."""
        node = self._node(path, fh)
        entries: list = [".", ".."]
        for name, id in node.entries.items():
            child = self.inodes[id]
            entries.append((name, {"st_ino": id, "st_mode": stat.S_IFDIR if child.is_dir else stat.S_IFREG}, 0))
        return entries

    def mkdir(self, path: str, mode: int) -> int:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _error(errno.EEXIST)
        node = self._new(True, mode & 0o7777)
        node.nlink = 1
        parent.entries[name] = node.id
        parent.mtime_ns = time.time_ns()
        return 0

    def rmdir(self, path: str) -> int:
        parent, name = self._parent(path)
        node = self._lookup(path)
        if not node.is_dir:
            raise _error(errno.ENOTDIR)
        if node.entries:
            raise _error(errno.ENOTEMPTY)
        del parent.entries[name]
        node.nlink -= 1
        self._forget(node)
        return 0

    def create(self, path: str, mode: int, fi=None) -> int:
        parent, name = self._parent(path)
        existing = parent.entries.get(name)
        if existing is not None:
            node = self.inodes[existing]
        else:
            node = self._new(False, mode & 0o7777)
            node.nlink = 1
            parent.entries[name] = node.id
            parent.mtime_ns = time.time_ns()
        node.opens += 1
        return node.id

    def open(self, path: str, flags: int) -> int:
        node = self._lookup(path)
        node.opens += 1
        return node.id

    def release(self, path: str | None, fh: int) -> int:
        node = self.inodes.get(fh)
        if node is not None:
            node.opens -= 1
            self._forget(node)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0  # close(2): nothing becomes durable

    def unlink(self, path: str) -> int:
        parent, name = self._parent(path)
        node = self._lookup(path)
        if node.is_dir:
            raise _error(errno.EISDIR)
        del parent.entries[name]
        parent.mtime_ns = time.time_ns()
        node.nlink -= 1
        self._forget(node)
        return 0

    def link(self, target: str, source: str) -> int:
        node = self._lookup(source)
        if node.is_dir:
            raise _error(errno.EPERM)
        parent, name = self._parent(target)
        if name in parent.entries:
            raise _error(errno.EEXIST)
        parent.entries[name] = node.id
        node.nlink += 1
        return 0

    def rename(self, old: str, new: str) -> int:
        old_parent, old_name = self._parent(old)
        new_parent, new_name = self._parent(new)
        node = self._lookup(old)
        if (new.rstrip("/") + "/").startswith(old.rstrip("/") + "/") and node.is_dir and new != old:
            raise _error(errno.EINVAL)
        replaced_id = new_parent.entries.get(new_name)
        if replaced_id == node.id:
            return 0
        if replaced_id is not None:
            replaced = self.inodes[replaced_id]
            if replaced.is_dir and not node.is_dir:
                raise _error(errno.EISDIR)
            if node.is_dir and not replaced.is_dir:
                raise _error(errno.ENOTDIR)
            if replaced.is_dir and replaced.entries:
                raise _error(errno.ENOTEMPTY)
        del old_parent.entries[old_name]
        new_parent.entries[new_name] = node.id
        old_parent.mtime_ns = new_parent.mtime_ns = time.time_ns()
        if replaced_id is not None:
            replaced.nlink -= 1
            self._forget(replaced)
        return 0

    # -- file data ---------------------------------------------------------------------------------

    def _durable_fd(self, node: Inode) -> int:
        if node.fd < 0:
            node.fd = os.open(self.data / str(node.id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return node.fd

    def _page(self, node: Inode, n: int) -> bytearray:
        """Page n as the file holds it now (for a write to change)."""
        page = node.pages.get(n)
        if page is None:
            page = bytearray(PAGE)
            start = n * PAGE
            if start < node.floor:
                got = os.pread(self._durable_fd(node), min(PAGE, node.floor - start), start)
                page[: len(got)] = got
            node.pages[n] = page
        return page

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        node = self._node(path, fh)
        end = min(offset + size, node.size)
        out = bytearray()
        position = offset
        while position < end:
            n, at = divmod(position, PAGE)
            take = min(PAGE - at, end - position)
            page = node.pages.get(n)
            if page is not None:
                out += page[at : at + take]
            elif position < node.floor:
                durable = min(take, node.floor - position)
                got = os.pread(self._durable_fd(node), durable, position)
                out += got + bytes(take - len(got))
            else:
                out += bytes(take)
            position += take
        return bytes(out)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        node = self._node(path, fh)
        position, view = offset, memoryview(data)
        while view:
            n, at = divmod(position, PAGE)
            take = min(PAGE - at, len(view))
            self._page(node, n)[at : at + take] = view[:take]
            view = view[take:]
            position += take
        node.size = max(node.size, offset + len(data))
        node.version += 1
        node.mtime_ns = time.time_ns()
        return len(data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        node = self._node(path, fh)
        if node.is_dir:
            raise _error(errno.EISDIR)
        if length < node.size:
            node.floor = min(node.floor, length)
            node.low = min(node.low, length)
            for n in [n for n in node.pages if n * PAGE >= length]:
                del node.pages[n]
            n, at = divmod(length, PAGE)
            if at and n in node.pages:
                node.pages[n][at:] = bytes(PAGE - at)
        node.size = length
        node.version += 1
        node.mtime_ns = time.time_ns()
        return 0

    # -- what makes things durable ---------------------------------------------------------------

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        """The file's data and size, as they were when the call came, written through to its
        durable copy and fdatasync'ed there. Writes that come meanwhile stay in memory."""
        with self.mutex:
            node = self._node(path, fh)
        if node.is_dir:
            return self.fsyncdir(path, datasync, fh)
        with node.sync_lock:
            with self.mutex:
                version, size, floor = node.version, node.size, node.floor
                pages = {n: bytes(p) for n, p in node.pages.items() if n * PAGE < size}
                fd = self._durable_fd(node)
                node.low = size
            try:
                # cut below the lowest size since the last sync first, then grow to the size
                # now: the bytes between hold zeros, as the file reads
                os.ftruncate(fd, floor)
                os.ftruncate(fd, size)
                for n in sorted(pages):
                    os.pwrite(fd, pages[n][: size - n * PAGE], n * PAGE)
                os.fdatasync(fd)
                with self.mutex:
                    # the durable copy is the file as it was at the snapshot: below the lowest
                    # size since then, what no dirty page covers is the copy's
                    node.floor = node.low
                    if node.version == version:  # nothing changed meanwhile: no page is dirty
                        node.pages.clear()
            finally:
                if node.gone and node.fd >= 0:
                    os.close(node.fd)
                    node.fd = -1
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        """The directory's entries as they are now become durable (not its files' data)."""
        with self.mutex:
            node = self._node(path, fh)
            self.durable_dirs[node.id] = dict(node.entries)
            self.durable_kinds[node.id] = (True, node.mode)
            for child_id in node.entries.values():
                child = self.inodes[child_id]
                self.durable_kinds[child_id] = (child.is_dir, child.mode)
                if child.is_dir:
                    self.durable_dirs.setdefault(child_id, {})
            # inodes this fsync stopped naming, that nothing else holds
            named = self._durably_named()
            for id in [i for i in self.durable_kinds if i not in named and i != ROOT and i not in self.inodes]:
                self.durable_kinds.pop(id)
                self.durable_dirs.pop(id, None)
                try:
                    os.unlink(self.data / str(id))
                except FileNotFoundError:
                    pass
            payload = self._state_payload()
        self._write_state(payload)
        return 0


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: holdfs.py BACKING MOUNTPOINT", file=sys.stderr)
        return 2
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    from fuse import FUSE  # fusepy: needs libfuse 2 (Debian's libfuse2)

    backing, mountpoint = Path(argv[1]), argv[2]
    FUSE(
        HoldFS(backing), mountpoint, foreground=True, nothreads=False, fsname="holdfs", subtype="holdfs",
        hard_remove=True, big_writes=True, max_write=131072, use_ino=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
