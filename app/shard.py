"""One shard of a family: `python -m app.shard`, started by app/supervisor.py only.

What it gets from its supervisor (app/supervisor.py says how the family lives):

    EVENTLOG_SHARD           JSON {"index": 0.., "count": N, "run_dir": "/tmp/eventlog-shards-..",
                             "listen_fd": fd, "lock_fds": [fd, ..], "ready_fd": fd,
                             "supervisor_pid": pid, "rejoin": bool, "new_dirs": [bool, ..]};
                             lock_fds and new_dirs follow Settings.effective_log_dirs; rejoin:
                             started again alone, into a family that has served; new_dirs:
                             the supervisor made that dir on this start
    EVENTLOG_SHARD_SETTINGS  the supervisor's Settings.to_json()

It dies with its supervisor (PR_SET_PDEATHSIG, set before anything else; a supervisor gone
before that is noticed through the parent pid), builds the same Settings, with engine_config()
carrying ShardSpec(index, count, run_dir, lock_fds), and serves as `eventlog serve` does, on
the inherited listening socket. Once it serves it writes one byte to ready_fd. It starts
with SIGTERM, SIGINT and SIGHUP blocked (its supervisor's doing); the stops that come while it
starts are kept and honoured once the server runs, a SIGHUP then is ignored (the server's
first check of the auth file finds what it would have). Exit status as
eventlog serve: 0 after a clean shutdown, 1 when it could not start (its error on stderr).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from types import FrameType

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def main() -> int:
    _die_with_parent()
    identity = json.loads(os.environ["EVENTLOG_SHARD"])
    if os.getppid() != identity["supervisor_pid"]:  # it died before the prctl took
        return 1
    early: list[int] = []

    def keep(sig: int, frame: FrameType | None) -> None:
        early.append(sig)

    signal.signal(signal.SIGTERM, keep)
    signal.signal(signal.SIGINT, keep)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the server takes it (an auth file check)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})  # blocked by the supervisor

    import logging
    import socket
    from pathlib import Path

    from engine.log_manager import ShardSpec

    from .server import serve
    from .settings import Settings
    from .startup import CannotStart, configure_logging

    index = identity["index"]
    listen_fd = identity["listen_fd"]
    lock_fds = tuple(identity["lock_fds"])
    ready_fd = identity["ready_fd"]
    for fd in (listen_fd, ready_fd, *lock_fds):  # ours; not for processes this one starts
        os.set_inheritable(fd, False)
    settings = Settings.from_json(os.environ["EVENTLOG_SHARD_SETTINGS"])
    settings = settings.for_shard(ShardSpec(
        index, identity["count"], Path(identity["run_dir"]), lock_fds, rejoin=identity.get("rejoin", False),
        call_timeout_s=settings.request_timeout_ms / 1000,
        new_dirs=tuple(identity.get("new_dirs", ())),
    ))
    configure_logging(settings.log_level, f"shard-{index}")

    def ready() -> None:
        os.write(ready_fd, b"R")
        os.close(ready_fd)

    # Every shard accepts on the family's one listening socket: a shard that is stopped or
    # hung accepts nothing, so no new connection waits on it (a socket of its own in a
    # SO_REUSEPORT group would keep taking its share of them). Which shard wakes first takes a
    # connection; the balancer (app/balance.py) evens the counts out.
    listener = socket.socket(fileno=listen_fd)
    try:
        serve(settings, sockets=[listener], on_started=ready, early_signals=early)
    except CannotStart as exc:
        if exc.message is not None:
            print(f"eventlog: cannot start: {exc.message}", file=sys.stderr, flush=True)
        logging.shutdown()
        return exc.status
    return 0


if __name__ == "__main__":
    sys.exit(main())
