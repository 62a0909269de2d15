"""What the processes of `eventlog` share before any of them serves: the log format, the
exception that ends a start with an exit status, and how long a server's shutdown may take.

Apart from app/server.py, which imports uvicorn, FastAPI and every router (about half a
CPU-second), so that the commands that never serve (snapshot, nightly, dump-log, ...) and a
shard family's supervisor, which serves nothing itself, start without them (issue 24)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import Settings


def configure_logging(level: str, process: str | None = None) -> None:
    """Log lines on stderr; `process` ("supervisor", "shard-1") names the process of a family."""
    tag = f" {process}" if process else ""
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s %(levelname)s{tag} %(name)s: %(message)s",
        stream=sys.stderr,
    )


class CannotStart(Exception):
    """Raised when serve() could not start: `status` is the exit status to end with."""

    def __init__(self, message: str | None, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


# beyond the two shutdown_timeout_ms waits: checkpoints, the clean-shutdown markers
SHUTDOWN_SLACK_S = 10.0


def shutdown_watchdog_s(settings: Settings) -> float:
    """How long after SIGTERM a server may still be shutting down: requests get
    shutdown_timeout_ms, then the partition writers as long again, then the slack."""
    return 2 * settings.shutdown_timeout_ms / 1000 + SHUTDOWN_SLACK_S
