"""`eventlog snapshot`: ask the running server for a snapshot, or take one of a stopped data dir."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engine import snapshots
from engine.errors import EngineError
from engine.log_manager import open_engine
from engine.metadata import INTERNAL_TOPICS

from .remote import RemoteError, post_json
from .settings import Settings
from .snapshot_root import prepare_snapshot_root

logger = logging.getLogger("eventlog.app")
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def run_snapshot(
    settings: Settings, topics: list[str] | None, *, url: str | None, token: str | None, to: str | None = None
) -> int:
    """With `url`, POST /v1/snapshots to the server there (an admin's token); without, open the
    data dir (which must not be in use by a server: the data dir's lock says so) and snapshot it
    directly, under the same caps (settings.snapshot_limits()). With `to`, then upload it there
    (analytics/upload.py): the snapshot's files must be readable here, so with `url` this runs
    where the server's snapshot dir is (its settings: --data-dir, EVENTLOG_SNAPSHOT_DIR)."""
    if to is not None and (problem := _upload_unavailable()) is not None:
        err.print(f"[red]snapshot --to:[/red] {escape(problem)}")
        return 2
    try:
        if url is not None:
            summary = _remote(url, topics, token)
        else:
            summary = anyio.run(_local, settings, topics)
    except (EngineError, RemoteError) as exc:
        err.print(f"[red]snapshot failed:[/red] {escape(str(exc))}")
        return 1
    table = Table("topic", "partition", "offsets", "segments", "bytes", title=f"snapshot {summary['id']}")
    for p in summary["partitions"]:
        table.add_row(
            p["topic"], str(p["partition"]), f"{p['log_start_offset']}..{p['high_watermark']}",
            str(p["segments"]), str(p["size_bytes"]),
        )
    out.print(table)
    # the server answers the path from its data dir (or its EVENTLOG_SNAPSHOT_DIR); here it is whole
    out.print(summary["path"] if url is None else f"{summary['path']} (on the server, from its data dir or its snapshot dir)")
    if to is None:
        return 0
    directory = Path(summary["path"]) if url is None else settings.snapshot_root / summary["id"]
    if not (directory / snapshots.MANIFEST).is_file():
        err.print(
            f"[red]snapshot --to:[/red] snapshot {escape(summary['id'])} was taken, but its files are not here "
            f"({escape(str(directory))}): the server keeps them in its snapshot dir. Run this where that dir is "
            f"readable, with the server's --data-dir (or EVENTLOG_SNAPSHOT_DIR), or there: eventlog "
            f"upload-snapshot <snapshot dir> --to {escape(to)}"
        )
        return 1
    return run_upload(directory, to)


def run_upload(directory: Path, to: str) -> int:
    """`eventlog upload-snapshot DIR --to URI`: upload a finished snapshot directory."""
    problem = _upload_unavailable()
    if problem is not None:
        err.print(f"[red]upload failed:[/red] {escape(problem)}")
        return 2
    from analytics.upload import upload_snapshot

    result, code = _storage_call("upload", lambda: upload_snapshot(str(directory), to))
    if code:
        return code
    out.print(
        f"uploaded snapshot {result.snapshot_id}: {result.uploaded} segment objects sent ({result.uploaded_bytes} "
        f"bytes), {result.skipped} already there ({result.skipped_bytes} bytes)", markup=False,
    )
    out.print(json.dumps({"manifest": result.manifest, "uploaded": result.uploaded, "skipped": result.skipped}),
              markup=False)
    return 0


def _storage_call(what: str, call: Callable[[], Any]) -> tuple[Any, int]:
    """(call(), 0); or (None, exit code) once the failure is printed: 2 for bad input
    (ValueError), 1 when the storage failed (OSError: run it again)."""
    try:
        return call(), 0
    except ValueError as exc:
        err.print(f"[red]{what} failed:[/red] {escape(str(exc))}")
        return None, 2
    except OSError as exc:
        err.print(f"[red]{what} failed:[/red] {escape(str(exc))}")
        return None, 1


def run_prune(root: str, keep: int | None, *, dry_run: bool, grace_ms: int) -> int:
    """`eventlog prune-upload URI`: drop all but the newest `keep` snapshots of an upload root, then
    the segment objects no remaining manifest names (analytics/prune.py)."""
    problem = _upload_unavailable()
    if problem is not None:
        err.print(f"[red]prune failed:[/red] {escape(problem)}")
        return 2
    from analytics.prune import prune_upload

    def progress(line: str) -> None:
        out.print(line, markup=False)

    result, code = _storage_call(
        "prune", lambda: prune_upload(root, keep=keep, dry_run=dry_run, grace_ms=grace_ms, progress=progress)
    )
    if code:
        return code
    verb = "would remove" if dry_run else "removed"
    left = f"; left {len(result.unfinished_left)} unfinished snapshots and {result.objects_young} unnamed objects " \
        f"younger than {grace_ms} ms (uploads in progress)" if result.unfinished_left or result.objects_young else ""
    out.print(
        f"{'dry run: ' if dry_run else ''}{result.root}: {verb} {len(result.snapshots_removed)} snapshots "
        f"({len(result.kept)} kept), {len(result.unfinished_removed)} unfinished snapshots, "
        f"{len(result.objects_removed)} segment objects ({result.bytes_removed} bytes){left}", markup=False,
    )
    out.print(json.dumps({
        "root": result.root, "dry_run": dry_run, "kept": len(result.kept),
        "snapshots_removed": len(result.snapshots_removed), "unfinished_removed": len(result.unfinished_removed),
        "objects_removed": len(result.objects_removed), "bytes_removed": result.bytes_removed,
    }), markup=False)
    return 0


def _upload_unavailable() -> str | None:
    """Why uploads cannot run here (pyarrow missing), or None."""
    try:
        import pyarrow.fs  # noqa: F401
    except ImportError:
        return "uploading needs pyarrow: pip install 'eventlog[spark]' (or pyarrow)"
    return None


def _remote(url: str, topics: list[str] | None, token: str | None) -> dict:
    return post_json(
        url, "/v1/snapshots", {"topics": topics} if topics is not None else {}, token, timeout=600,
        unreachable=" (without --url, a stopped data dir is snapshotted)",
    )


async def _local(settings: Settings, topics: list[str] | None) -> dict:
    root = settings.snapshot_root
    async with open_engine(settings.engine_config()) as engine:
        await anyio.to_thread.run_sync(prepare_snapshot_root, settings)
        names = topics if topics is not None else sorted(n for n in engine.topics if n not in INTERNAL_TOPICS)
        infos = snapshots.topic_infos(engine, names)
        manifest = await snapshots.take_snapshot(root, infos, engine.clock(), settings.snapshot_limits())
    return snapshots.summary(manifest, root)
