"""Upload a snapshot to shared storage, incrementally (`eventlog snapshot --to URI`,
`eventlog upload-snapshot DIR --to URI`).

The target is a URI of any pyarrow filesystem (s3://bucket/prefix, hdfs://..., storage.py) or a
local directory (a mount every executor sees). Under it:

    <target>/segments/<topic id>/<partition>/<base offset>-<size>-<digest>.log
    <target>/snapshots/<snapshot id>/manifest.json

A segment object holds bytes [0, size_bytes) of one snapshot segment and is named after what
identifies those bytes, as the segment cache names its files (cache.segment_name: base offset,
size, CRC-32C of the first and last 4 KiB). A closed segment never changes, so it is uploaded
once whatever number of snapshots hold it; a partition's newest segment, still growing when a
snapshot was taken, is uploaded again for each new size, and a segment compaction rewrote has
other bytes and so another name. Objects already there are not sent again: one listing per
partition, an object of the same name and size counts as there.

Steps, and what a crash at each leaves:

1. Upload the missing segment objects (several at once). On an object store (S3, GCS) an
   object appears whole when its upload completes; elsewhere (local, HDFS) it is written
   under a temporary name and renamed. A crash leaves whole objects no manifest names yet:
   the next upload finds them and skips them.
2. Write the manifest, last: the snapshot's own, with each segment given an `object` field, its
   path relative to the manifest's directory (`../../segments/...`; source.segment_location
   reads it), and without the index file names (indexes are not uploaded: readers do not need
   them). Readers see a snapshot only once its manifest is there.

Objects no manifest names any more (the older sizes of active segments, the segments of
snapshot manifests deleted from the target) stay until `eventlog prune-upload` removes them
(prune.py).
Needs pyarrow (the `spark` extra), not pyspark.
"""

from __future__ import annotations

import copy
import json
import os
import posixpath
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow.fs

from . import storage
from .cache import segment_digest, segment_name

__all__ = ["UploadResult", "upload_snapshot"]

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
PARALLEL = 8  # objects uploaded at once
_CHUNK = 8 << 20
_OBJECT_STORES = {"s3", "gcs"}  # filesystems whose objects appear whole: no directories, no renames


@dataclass
class UploadResult:
    snapshot_id: str
    manifest: str  # the uploaded manifest's location (without a URI query)
    uploaded: int = 0  # segment objects sent
    uploaded_bytes: int = 0
    skipped: int = 0  # segment objects already there
    skipped_bytes: int = 0


def upload_snapshot(snapshot_dir: str, target: str, *, parallel: int = PARALLEL,
                    progress: Callable[[str], None] | None = None) -> UploadResult:
    """Upload the local snapshot directory `snapshot_dir` (with its manifest.json) under
    `target` (module docstring). ValueError when the directory is not a finished snapshot;
    OSError (pyarrow's, naming the path) when the storage fails."""
    snapshot_dir = os.path.abspath(str(snapshot_dir).removeprefix("file://"))
    try:
        with open(os.path.join(snapshot_dir, MANIFEST), "rb") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{snapshot_dir} is not a finished snapshot (no {MANIFEST})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{snapshot_dir}: manifest format_version {manifest.get('format_version')!r}, "
                         f"expected {FORMAT_VERSION}")
    fs, root = _filesystem(target)
    object_store = fs.type_name in _OBJECT_STORES
    uploaded = copy.deepcopy(manifest)
    result = UploadResult(manifest["snapshot_id"], "")
    sends: list[tuple[str, int, str]] = []  # (local file, size, destination)
    kept: list[tuple[str, int, str]] = []  # the same, for objects already there
    for topic in uploaded["topics"]:
        topic_id = str(topic.get("topic_id") or topic["name"])
        for part in topic["partitions"]:
            folder = posixpath.join("segments", topic_id, str(part["partition"]))
            present = _listing(fs, f"{root}/{folder}")
            for seg in part["segments"]:
                local = storage.join(snapshot_dir, seg["object"]) if seg.get("object") else \
                    os.path.join(snapshot_dir, part["dir"], seg["file"])
                seg.pop("index_file", None)
                seg.pop("time_index_file", None)
                size = int(seg["size_bytes"])
                if size == 0:  # readers skip it; nothing to send
                    continue
                name = segment_name(int(seg["base_offset"]), size, segment_digest(local, size)) + ".log"
                seg["object"] = posixpath.join("..", "..", folder, name)
                if present.get(name) == size:
                    kept.append((local, size, f"{root}/{folder}/{name}"))
                else:
                    present[name] = size  # a segment two partitions share (never) or listed twice: once
                    sends.append((local, size, f"{root}/{folder}/{name}"))
    lock = threading.Lock()

    def send(item: tuple[str, int, str]) -> None:
        local, size, dest = item
        _put(fs, dest, object_store, lambda out: _copy_prefix(local, size, out))
        with lock:
            result.uploaded += 1
            result.uploaded_bytes += size
            if progress is not None:
                progress(f"uploaded {dest} ({size} bytes)")

    if sends:
        with ThreadPoolExecutor(max(1, min(parallel, len(sends)))) as pool:
            list(pool.map(send, sends))  # the first failure is raised here
    # the objects skipped as already there are looked at again just before the manifest names
    # them: a prune-upload that ran meanwhile may have removed one no other manifest named
    # (what is sent again now is new, so a prune's grace period spares it)
    if kept:
        infos = fs.get_file_info([dest for _, _, dest in kept])
        again = [item for item, info in zip(kept, infos, strict=True)
                 if info.type != pyarrow.fs.FileType.File or info.size != item[1]]
        for item in again:
            send(item)
        for _local, size, _dest in (item for item in kept if item not in again):
            result.skipped += 1
            result.skipped_bytes += size
    data = json.dumps(uploaded, indent=2).encode() + b"\n"
    manifest_path = f"{root}/snapshots/{manifest['snapshot_id']}/{MANIFEST}"
    _put(fs, manifest_path, object_store, lambda out: out.write(data))
    result.manifest = storage.display(storage.join(target if storage.is_uri(target) else root,
                                                   "snapshots", manifest["snapshot_id"], MANIFEST))
    return result


def _filesystem(target: str):
    """(pyarrow FileSystem, root path in it) of a URI or a local directory. On S3, opening a
    file for writing is delayed to its first bytes, so that an object smaller than a part goes
    in one PUT (else: three requests, a multipart upload)."""
    target = str(target)
    if storage.is_uri(target) and storage.scheme(target) == "s3" and "allow_delayed_open" not in target:
        target = storage.with_query(target, allow_delayed_open="true")
    fs, path = storage.resolve(target)
    if fs is None:
        from pyarrow import fs as pafs

        fs = pafs.LocalFileSystem()
    return fs, path.rstrip("/")


def _listing(fs, folder: str) -> dict[str, int]:
    """Name -> size of the files right under `folder` ({} when it is absent)."""
    from pyarrow import fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    return {posixpath.basename(i.path): i.size for i in infos if i.type == pafs.FileType.File}


def _put(fs, dest: str, object_store: bool, write: Callable) -> None:
    """Write a whole object/file: directly on an object store, else under a temporary name in
    the same directory and renamed."""
    if object_store:
        with fs.open_output_stream(dest) as out:
            write(out)
        return
    parent = posixpath.dirname(dest)
    fs.create_dir(parent, recursive=True)
    temporary = f"{parent}/.{posixpath.basename(dest)}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with fs.open_output_stream(temporary) as out:
            write(out)
        fs.move(temporary, dest)
    except BaseException:
        try:
            fs.delete_file(temporary)
        except OSError:
            pass
        raise


def _copy_prefix(local: str, size: int, out) -> None:
    """Bytes [0, size) of the local file (a growing file's later bytes are left out)."""
    with open(local, "rb") as f:
        left = size
        while left:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                raise OSError(f"{local}: ends {left} bytes short of the manifest's size_bytes {size}")
            out.write(chunk)
            left -= len(chunk)
