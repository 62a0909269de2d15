"""Mounting holdfs (holdfs.py) for a test, and cutting its power."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HOLDFS = Path(__file__).resolve().parent / "holdfs.py"


def is_mounted(path: Path) -> bool:
    """Whether something is mounted on `path` (os.path.ismount says no for a FUSE mount whose
    daemon is dead: its stat fails with ENOTCONN)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")  # \040 for a space
            if point == target:
                return True
    return False


class MountUnavailable(Exception):
    """This machine cannot mount holdfs; the message says why (for pytest.skip)."""


def why_no_fuse() -> str | None:
    """None when a holdfs mount may work here, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (the FUSE module is not loaded, or the container was not given the device)"
    try:
        import fuse  # noqa: F401 -- fusepy, from the dev extra; loads libfuse 2 at import
    except ImportError:
        return "fusepy is not installed (the dev extra: pip install -e '.[dev]')"
    except OSError as exc:
        return f"fusepy cannot load libfuse 2 ({exc}): apt-get install libfuse2 (tests/install-test-peers.sh)"
    if os.geteuid() != 0 and not any(os.access(Path(d) / "fusermount", os.X_OK) for d in os.get_exec_path()):
        return "not root, and no fusermount to mount as a user (Debian's fuse package)"
    return None


class HoldMount:
    """holdfs over `backing`, mounted on `mountpoint` by a helper process; the helper's output
    goes to `log`."""

    def __init__(self, backing: Path, mountpoint: Path, log: Path) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.log = log
        self.proc: subprocess.Popen | None = None
        backing.mkdir(parents=True, exist_ok=True)
        mountpoint.mkdir(parents=True, exist_ok=True)

    def mount(self, timeout: float = 15.0) -> HoldMount:
        """Mount, and wait until the mount answers. Raises MountUnavailable when the helper
        cannot mount (its output says why)."""
        reason = why_no_fuse()
        if reason is not None:
            raise MountUnavailable(reason)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(HOLDFS), str(self.backing), str(self.mountpoint)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise MountUnavailable(
                    f"holdfs exited with status {self.proc.returncode}: {self.log.read_text(errors='replace')[-600:].strip()}"
                )
            if is_mounted(self.mountpoint):
                try:
                    os.listdir(self.mountpoint)
                    return self
                except OSError:
                    pass
            time.sleep(0.02)
        self.cut()
        raise MountUnavailable(f"holdfs did not mount within {timeout} s: {self.log.read_text(errors='replace')[-600:]}")

    def cut(self) -> None:
        """The power cut: the daemon is killed with everything it held in memory, and the dead
        mount goes. What was made durable is in `backing`; mount() again to see it."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None
        self._unmount()

    def _unmount(self) -> None:
        for argv in (["umount", str(self.mountpoint)], ["umount", "-l", str(self.mountpoint)],
                     ["fusermount", "-u", "-z", str(self.mountpoint)]):
            if not is_mounted(self.mountpoint):
                return
            try:
                subprocess.run(argv, capture_output=True, timeout=30, check=False)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if is_mounted(self.mountpoint):
            raise RuntimeError(f"cannot unmount {self.mountpoint}")
