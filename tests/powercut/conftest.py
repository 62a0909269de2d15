"""holdfs mounts for the power-cut tests: skipped, with the reason, where this machine cannot
mount one (no /dev/fuse, no libfuse 2, no permission)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from .mount import HoldMount, MountUnavailable, is_mounted


@pytest.fixture
def holdfs(tmp_path: Path) -> Iterator[HoldMount]:
    """holdfs mounted on tmp_path/mnt over tmp_path/backing; cut (and unmounted) at the end."""
    mount = HoldMount(tmp_path / "backing", tmp_path / "mnt", tmp_path / "holdfs.log")
    try:
        mount.mount()
    except MountUnavailable as exc:
        pytest.skip(f"cannot mount the power-cut FUSE layer (tests/powercut/holdfs.py) here: {exc}")
    try:
        yield mount
    finally:
        mount.cut()
        assert not is_mounted(mount.mountpoint)
