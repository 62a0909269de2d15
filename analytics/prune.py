"""Remove from an upload root what no snapshot needs any more (`eventlog prune-upload URI`).

An upload root (upload.py) holds

    <root>/segments/<topic id>/<partition>/<base offset>-<size>-<digest>.log
    <root>/snapshots/<snapshot id>/manifest.json

and an upload adds to it without ever removing: the older sizes of a partition's newest segment
stay, and so do the segments of snapshots whose manifests were deleted. A snapshot directory
with a manifest is finished; one without is unfinished (an upload writing its manifest on a
filesystem with directories, or one that crashed there). Snapshot ids begin with the time they
were taken (engine/snapshots.py, new_snapshot_id), so they sort oldest first.

Steps, and what a crash at each leaves:

1. Plan, removing nothing: list snapshots/; keep the newest `keep` finished snapshots (all of
   them without `keep`) and read their manifests: the objects they name (`object` fields,
   relative to their directory) are kept. A kept manifest that cannot be read, or that names
   local files rather than objects, stops the run here. List segments/: every file no kept
   manifest names is removed, unless it was written within `grace_ms` (pyarrow's mtime;
   a file without one is kept).
2. Remove each dropped snapshot's manifest, then the rest of its directory: readers stop
   seeing it before any of its objects goes. A crash leaves directories without a manifest
   and objects no manifest names: a later run removes them (steps 3 and 4).
3. Remove unfinished snapshot directories whose newest file is older than `grace_ms` (on an
   object store an empty directory marker has no time: it counts as old; nothing an upload
   writes under snapshots/ appears there before it is whole).
4. Remove the objects of step 1, several at once. A crash leaves some: a later run removes them.

Concurrent uploads: an upload writes its segment objects first and its manifest last, so an
object it sent within `grace_ms` is kept although no manifest names it yet; `grace_ms` must
exceed the longest upload. An upload skips the objects already there, and one of those that
this removes while the upload runs (named by no kept manifest) is seen gone when the upload
looks at its skipped objects again, just before its manifest, and sent again
(analytics/upload.py). Left: the moment between that look and the manifest; to rule it out,
run this when no upload runs. Readers that already planned a dropped snapshot fail when its
objects go: keep more snapshots than running jobs can be behind.

Directories left empty under segments/ (filesystems with directories) are not removed: an
upload creates its partition's directory before writing into it. Needs pyarrow, not pyspark.
"""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from . import storage
from .upload import FORMAT_VERSION, MANIFEST, PARALLEL, _filesystem

__all__ = ["GRACE_MS", "PruneResult", "prune_upload"]

GRACE_MS = 3_600_000  # objects and unfinished snapshots younger than this are a running upload's
_DATA_DIR_MARKER = "meta.properties"  # engine: every data dir has one; an upload root never


@dataclass
class PruneResult:
    root: str  # the upload root (without a URI query)
    dry_run: bool
    kept: list[str] = field(default_factory=list)  # finished snapshots kept, oldest first
    snapshots_removed: list[str] = field(default_factory=list)  # finished, beyond `keep`
    unfinished_removed: list[str] = field(default_factory=list)  # no manifest, older than grace
    unfinished_left: list[str] = field(default_factory=list)  # no manifest, younger: uploads
    objects_removed: list[tuple[str, int]] = field(default_factory=list)  # (path under root, size)
    objects_young: int = 0  # objects no kept manifest names, left: written within grace

    @property
    def bytes_removed(self) -> int:
        return sum(size for _, size in self.objects_removed)


def prune_upload(target: str, *, keep: int | None = None, dry_run: bool = False, grace_ms: int = GRACE_MS,
                 now_ms: int | None = None, parallel: int = PARALLEL,
                 progress: Callable[[str], None] | None = None) -> PruneResult:
    """Prune the upload root `target` (a URI or a directory, as upload_snapshot's) in the steps of
    the module docstring. `keep`: finished snapshots kept, newest first (None: all; 0: none).
    `dry_run`: plan and report, remove nothing. `now_ms`: the clock (tests). `progress` gets a
    line per snapshot or object removed (or, dry, that would be). ValueError when `target` is
    absent or not an upload root, or a kept manifest is unreadable (nothing removed then);
    OSError (pyarrow's, naming the path) when the storage fails."""
    if keep is not None and keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    if grace_ms < 0:
        raise ValueError(f"grace_ms must be >= 0, got {grace_ms}")
    from pyarrow import fs as pafs

    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    cutoff_ns = (now_ms - grace_ms) * 1_000_000
    shown = storage.display(storage.normalize(target))
    fs, root = _filesystem(target)
    _check_root(fs, root, shown)
    result = PruneResult(shown, dry_run)
    say = progress or (lambda line: None)
    verb = "would remove" if dry_run else "removed"

    # 1. plan
    snapshots = _snapshot_dirs(fs, f"{root}/snapshots")
    finished = sorted(i for i, (has_manifest, _) in snapshots.items() if has_manifest)
    result.kept = finished if keep is None else finished[len(finished) - keep:] if keep else []
    result.snapshots_removed = finished[: len(finished) - len(result.kept)]
    named: set[str] = set()
    for snapshot_id in result.kept:
        named |= _objects_named(fs, root, snapshot_id, shown)
    for snapshot_id, (has_manifest, newest_ns) in sorted(snapshots.items()):
        if not has_manifest:
            old = newest_ns is None or newest_ns < cutoff_ns
            (result.unfinished_removed if old else result.unfinished_left).append(snapshot_id)
    objects = fs.get_file_info(pafs.FileSelector(f"{root}/segments", recursive=True, allow_not_found=True))
    doomed: list[str] = []
    for info in sorted(objects, key=lambda i: i.path):
        if info.type != pafs.FileType.File or posixpath.normpath(info.path) in named:
            continue
        if info.mtime_ns is None or info.mtime_ns >= cutoff_ns:
            result.objects_young += 1
            continue
        doomed.append(info.path)
        result.objects_removed.append((info.path[len(root) + 1:], info.size))

    # 2. dropped snapshots: the manifest first
    for snapshot_id in result.snapshots_removed:
        if not dry_run:
            folder = f"{root}/snapshots/{snapshot_id}"
            _delete(fs.delete_file, f"{folder}/{MANIFEST}")
            _delete(fs.delete_dir, folder)
        say(f"{verb} snapshot {snapshot_id}")
    # 3. unfinished snapshot directories, past the grace period
    for snapshot_id in result.unfinished_removed:
        if not dry_run:
            _delete(fs.delete_dir, f"{root}/snapshots/{snapshot_id}")
        say(f"{verb} unfinished snapshot {snapshot_id} (no {MANIFEST})")
    # 4. objects no kept manifest names
    if not dry_run and doomed:
        with ThreadPoolExecutor(max(1, min(parallel, len(doomed)))) as pool:
            list(pool.map(lambda path: _delete(fs.delete_file, path), doomed))  # the first failure is raised
    for name, size in result.objects_removed:
        say(f"{verb} {name} ({size} bytes)")
    return result


def _check_root(fs, root: str, shown: str) -> None:
    """ValueError unless `root` is a directory (prefix) with snapshots/ or segments/ under it."""
    from pyarrow import fs as pafs

    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        raise ValueError(f"{shown}: no such upload root (nothing there)")
    if info.type != pafs.FileType.Directory:
        raise ValueError(f"{shown}: not an upload root (a file)")
    names = {posixpath.basename(i.path): i.type for i in fs.get_file_info(pafs.FileSelector(root))}
    if _DATA_DIR_MARKER in names:
        raise ValueError(f"{shown}: not an upload root (a data dir: it has {_DATA_DIR_MARKER})")
    if names.get("snapshots") != pafs.FileType.Directory and names.get("segments") != pafs.FileType.Directory:
        hint = "; an upload root is the URI given to --to, the parent of this snapshots/" \
            if posixpath.basename(root) == "snapshots" else "; it is the URI given to snapshot --to or upload-snapshot --to"
        raise ValueError(f"{shown}: not an upload root (no snapshots/ or segments/ under it{hint})")


def _snapshot_dirs(fs, folder: str) -> dict[str, tuple[bool, int | None]]:
    """Snapshot id -> (has a manifest, newest mtime in ns of the directory and what it holds,
    None when none is known), from one recursive listing of `folder`."""
    from pyarrow import fs as pafs

    dirs: dict[str, tuple[bool, int | None]] = {}
    for info in fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True)):
        relative = info.path[len(folder) + 1:]
        snapshot_id, _, rest = relative.partition("/")
        if not rest and info.type != pafs.FileType.Directory:
            continue  # a file right under snapshots/: no snapshot's
        has_manifest, newest = dirs.get(snapshot_id, (False, None))
        has_manifest |= rest == MANIFEST and info.type == pafs.FileType.File
        if info.mtime_ns is not None:
            newest = info.mtime_ns if newest is None else max(newest, info.mtime_ns)
        dirs[snapshot_id] = (has_manifest, newest)
    return dirs


def _objects_named(fs, root: str, snapshot_id: str, shown: str) -> set[str]:
    """The paths (in `fs`, normalized) of the objects a kept snapshot's manifest names."""
    folder = f"{root}/snapshots/{snapshot_id}"
    where = f"{shown}/snapshots/{snapshot_id}/{MANIFEST}"
    try:
        with fs.open_input_stream(f"{folder}/{MANIFEST}") as f:
            manifest = json.loads(f.read())
        if manifest.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}")
        named, local = set(), None
        for part in (p for t in manifest["topics"] for p in t["partitions"]):
            for seg in part["segments"]:
                if seg.get("object"):
                    named.add(posixpath.normpath(posixpath.join(folder, str(seg["object"]))))
                elif int(seg["size_bytes"]) > 0:
                    local = local or f"{part['dir']}/{seg['file']}"
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{where}: cannot read it ({exc!r}); nothing removed: repair or delete that snapshot") from None
    if local is not None:
        raise ValueError(f"{where}: names local files ({local}), not uploaded objects: not an upload root "
                         f"(snapshot --to and upload-snapshot --to make one)")
    return named


def _delete(remove: Callable[[str], None], path: str) -> None:
    """fs.delete_file or fs.delete_dir, done already (a concurrent prune) counting as done."""
    try:
        remove(path)
    except FileNotFoundError:
        pass
