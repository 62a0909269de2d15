"""The snapshot root at start-up (prepare_snapshot_root): a step of every server's start and of
an offline `eventlog snapshot`.

Apart from app/snapshot.py, the command, whose tables and error lines import rich: a server
starts without it (issue 24)."""

from __future__ import annotations

import logging

from engine import snapshots

from .settings import Settings

logger = logging.getLogger("eventlog.app")


def prepare_snapshot_root(settings: Settings, warn: bool = True) -> None:
    """At start-up, with the log dirs locked: move the snapshots an older version kept inside
    the first log dir out to the snapshot root, remove unfinished ones, and (`warn`: once per
    family) say what is wrong with where the root is (engine/snapshots.py)."""
    root = settings.snapshot_root
    moved = snapshots.move_legacy(settings.legacy_snapshot_root, root)
    if moved.moved:
        logger.info("moved %d snapshot(s) out of the log dir, from %s to %s: %s", len(moved.moved),
                    settings.legacy_snapshot_root, root, ", ".join(moved.moved))
    if moved.left and warn:
        logger.warning(
            "%s stays in the log dir (Apache Kafka will not start on that log dir until it is "
            "moved or deleted; its snapshots stay readable by path): %s",
            settings.legacy_snapshot_root, "; ".join(f"{n}: {w}" for n, w in moved.left.items()),
        )
    removed = moved.removed + snapshots.remove_unfinished(root)
    if removed:
        logger.info("removed unfinished snapshots: %s", ", ".join(removed))
    if warn:
        for problem in snapshots.placement_problems(root, settings.effective_log_dirs):
            logger.warning("%s", problem)
