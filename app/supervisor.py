"""The shard family's supervisor: `eventlog serve --processes N`, N >= 2.

The supervisor serves nothing itself. It holds what the family shares, for its whole life:

    log dirs   opened once (LogDir.open: the flock, meta.properties; never the clean-shutdown
               marker, which the shards' engines own); every shard inherits each lock's
               descriptor, so a dir stays locked until the last process of the family is gone
    socket     the listening socket (host, port, backlog), made here and inherited by every
               shard, which all accept on it; connections wait in its queue for a live shard
    run dir    a private directory (mkdtemp "eventlog-shards-<pid>-*", 0700, <pid> the
               supervisor's): the shards' Unix sockets and the partition table in shared
               memory (created here; the supervisor reads the shards' heartbeats in it and
               writes their health); removed when the supervisor exits. The supervisor
               holds a flock on RUN_DIR_LOCK in it; a SIGKILLed one cannot remove its dir, so
               the next supervisor on this machine removes every run dir whose lock nobody
               holds

A shard is `python -m app.shard` (app/shard.py) in a process group of its own, with

    EVENTLOG_SHARD           JSON {"index", "count", "run_dir", "listen_fd", "lock_fds",
                             "ready_fd", "supervisor_pid", "rejoin", "new_dirs"}: lock_fds and
                             new_dirs in the order of Settings.effective_log_dirs, every
                             descriptor inherited
    EVENTLOG_SHARD_SETTINGS  Settings.to_json() of the supervisor's settings (flags included)

Life of a family:

    start     all N shards at once (their engines wait for one another: engine/shards.py).
              Each writes one byte to its ready pipe once it serves; when all have, the
              supervisor logs "ready: N shards on URL". A shard that exits with an error status
              before the family was ever ready (the engine refused the data dir, a bad
              setting: nothing a restart gets past) stops the family: the others get SIGTERM,
              and SIGKILL STARTING_GRACE_S later if they are still starting; the supervisor
              exits 1. A shard killed by a signal while the family starts is started again.
    a death   a shard that exits (a crash, SIGKILL, the OOM killer) is started again alone,
              in the same run dir, with "rejoin": it recovers its own partitions and waits
              for no other shard. The others serve on: reads of every partition, appends to
              their own; requests that need the dead shard answer 503 `unavailable` at once
              (its health in the partition table says DOWN until its new process is ready).
              A shard that served SHARD_STABLE_S starts again at once; one that died sooner
              waits 0.5 s, doubling up to 10 s; CRASH_LOOP_DEATHS quick deaths in a row are a
              crash loop: one critical log line, and the CRASH_LOOP bit (a gauge in every
              shard's /metrics) until it serves SHARD_STABLE_S. The supervisor never gives up.
    silence   every shard's event loop stamps a heartbeat in the partition table every
              BEAT_S. Past SILENT_S without one (a SIGSTOP, a hung loop) the supervisor marks
              it SILENT: the others fail its calls at once and hand it no connection (every
              shard accepts on the one listening socket, so a stopped shard takes none itself).
              Past Settings.shard_heartbeat_timeout_ms it is killed with SIGKILL, which is a
              death as above. A shard that beats again before that is marked answering.
    SIGTERM,  forwarded to every shard as SIGTERM; a second signal is forwarded as it came
    SIGINT    (a second SIGINT makes the shards drop open connections). The supervisor waits
              for all: exit 0 when every shard exited 0, else 1. Shards still running
              KILL_SLACK_S after their own watchdog (startup.shutdown_watchdog_s) are killed.
    SIGHUP    forwarded to every running shard: each checks the auth file at once (shards also
              check it on their own every EVENTLOG_AUTH_RELOAD_MS); never a stop
    SIGKILL   of the supervisor: every shard has PR_SET_PDEATHSIG = SIGKILL and dies with it,
              so no orphan keeps the port or the locks.

Single-threaded: signals and child exits wake one selector loop (signal.set_wakeup_fd).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from engine.errors import DataDirError
from engine.log_dirs import LogDir
from engine.shards import CRASH_LOOP, DOWN, SILENT, SILENT_S, PartitionTable, table_path

from .settings import Settings
from .startup import CannotStart, shutdown_watchdog_s

logger = logging.getLogger("eventlog.supervisor")

SHARD_ENV = "EVENTLOG_SHARD"
SHARD_SETTINGS_ENV = "EVENTLOG_SHARD_SETTINGS"
RUN_DIR_PREFIX = "eventlog-shards-"
RUN_DIR_LOCK = ".supervisor.lock"
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
# blocked in a new shard until its handlers are in place (app/shard.py)
SPAWN_BLOCKED = STOP_SIGNALS | {signal.SIGHUP}
# a shard that served this long before it died starts again at once; one that dies sooner
# waits BACKOFF_FIRST_S, doubling each time up to BACKOFF_MAX_S
SHARD_STABLE_S = 10.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
CRASH_LOOP_DEATHS = 3  # quick deaths in a row that make a crash loop (logged, and a gauge)
HEARTBEAT_CHECK_S = 0.25  # how often the shards' heartbeats are looked at
# a shard process has this long (or the heartbeat timeout, if longer) to beat for the first time
FIRST_BEAT_GRACE_S = 30.0
# beyond a shard's own shutdown watchdog, before the supervisor kills it; and after SIGKILL,
# how long to wait for the kernel to reap it (a process stuck in the kernel outlives SIGKILL)
KILL_SLACK_S = 5.0
# after a shard failed to start: how long the others, still starting, get after SIGTERM
STARTING_GRACE_S = 2.0


def supervise(settings: Settings) -> int:
    """Run a shard family until SIGTERM or SIGINT; the exit status. Raises CannotStart when the
    family cannot begin: a log dir locked or broken, the address in use, a bad auth file."""
    if settings.auth_file is not None:
        from api.auth import AuthConfigError, Authenticator

        try:
            Authenticator.from_file(settings.auth_file)
        except AuthConfigError as exc:
            raise CannotStart(str(exc), 2) from None
    dirs = open_log_dirs(settings)
    remove_stale_run_dirs()
    try:
        listener = listen(settings)
    except BaseException:
        for d in dirs:
            d.unlock()
        raise
    try:
        return Supervisor(settings, dirs, listener).run()
    finally:
        listener.close()
        for d in dirs:
            d.unlock()


def open_log_dirs(settings: Settings) -> list[LogDir]:
    """Every log dir opened and locked, as the engine's LogManager._open_dirs does (the first
    dir's cluster id is expected of the others). Raises CannotStart."""
    cluster_id = None
    opened: list[LogDir] = []
    try:
        for path in settings.effective_log_dirs:
            d = LogDir(path)
            d.open(settings.node_id, cluster_id)
            opened.append(d)
            cluster_id = d.cluster_id
    except DataDirError as exc:
        for d in opened:
            d.unlock()
        raise CannotStart(str(exc), 1) from None
    except BaseException:
        for d in opened:
            d.unlock()
        raise
    return opened


def remove_stale_run_dirs(tmp: Path | None = None) -> list[Path]:
    """Remove the run dirs whose supervisor is gone (SIGKILLed: its shards died with it): those
    whose RUN_DIR_LOCK nobody holds. The dirs removed."""
    removed = []
    for entry in (tmp or Path(tempfile.gettempdir())).glob(f"{RUN_DIR_PREFIX}*"):
        try:
            fd = os.open(entry / RUN_DIR_LOCK, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # not a run dir of ours (or not one at all), or another user's
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its supervisor is running
            continue
        else:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        finally:
            os.close(fd)
    if removed:
        logger.info("removed the run dirs of supervisors no longer running: %s", ", ".join(p.name for p in removed))
    return removed


def listen(settings: Settings) -> socket.socket:
    """The family's listening socket on host:port (IPv6 for an IPv6 host), inheritable.
    Raises CannotStart when the address is in use or cannot be had.

    It is bound without SO_REUSEPORT, so a port any other socket holds (another family's
    included) is refused. Every shard accepts on this one socket (app/shard.py): a shard that
    is stopped or hung accepts nothing, so no new connection waits on it, and connections made
    while a shard restarts wait in the queue only until a live shard accepts them. The first
    shard to wake may accept a whole burst (seen: 64 of 64 on one shard); the balancer
    (app/balance.py) hands each connection on to the shard with the fewest as it is accepted.
    (A socket of its own per shard in a SO_REUSEPORT group spread connections by address hash
    instead, but kept giving a stopped shard its share of them, which then hung.)"""
    try:
        infos = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CannotStart(f"cannot listen on {settings.host}:{settings.port}: {exc}", 1) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)  # exclusive: no SO_REUSEPORT
        sock.listen(settings.backlog)
    except OSError as exc:
        sock.close()
        raise CannotStart(f"cannot listen on {_host_port(settings.host, settings.port)}: {exc.strerror or exc}", 1) from None
    sock.set_inheritable(True)
    return sock


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe_exit(returncode: int) -> str:
    """'exited with status 1', 'was killed by SIGKILL'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


@dataclass(eq=False)
class _Shard:
    """One shard's place in the family, across its processes."""

    index: int
    proc: subprocess.Popen | None = None  # its current process; None while it waits to restart
    ready_fd: int | None = None  # our end of the current process's ready pipe; None once closed
    ready: bool = False  # the current process serves
    started_at: float = 0.0  # when the current process started
    ready_at: float | None = None  # when it was ready
    restart_at: float | None = None  # dead: when to start it again
    backoff_s: float = 0.0  # the wait before the next restart, if this one dies young
    quick_deaths: int = 0  # deaths in a row, each within SHARD_STABLE_S of its start
    restarts: int = 0
    silent_since: float | None = None  # no heartbeat for SILENT_S: noted (logged once)
    looping: bool = False  # crash loop: logged once, until it serves SHARD_STABLE_S again
    killed_silent: bool = False  # the supervisor killed it for its silence

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class Supervisor:
    def __init__(self, settings: Settings, dirs: list[LogDir], listener: socket.socket) -> None:
        self.settings = settings
        self.dirs = dirs
        self.listener = listener
        host, port = listener.getsockname()[:2]
        scheme = "https" if settings.ssl_certfile is not None else "http"
        self.url = f"{scheme}://{_host_port(host, port)}"
        self.restarts = 0
        self.heartbeat_timeout_s = settings.shard_heartbeat_timeout_ms / 1000
        self._signals: list[int] = []
        self._reload = False  # SIGHUP came: to forward to the shards
        self._wake_r = -1
        self._wake_w = -1
        self._selector: selectors.BaseSelector | None = None
        self._table: PartitionTable | None = None
        self._run_dir: Path | None = None
        self._served = False  # every shard was ready at once, at least once: restarts rejoin

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        previous_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-"))  # mode 0700
        lock_fd = os.open(run_dir / RUN_DIR_LOCK, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        self._run_dir = run_dir
        self._table = PartitionTable(table_path(run_dir), self.settings.processes)
        shards = [_Shard(i) for i in range(self.settings.processes)]
        try:
            return self._watch(shards)
        finally:
            for shard in shards:  # still running: after an error in this process, or stuck
                if shard.running:
                    assert shard.proc is not None
                    shard.proc.kill()
                    try:
                        shard.proc.wait(KILL_SLACK_S)
                    except subprocess.TimeoutExpired:
                        pass
                self._close_ready(shard)
            self._table.close()
            shutil.rmtree(run_dir, ignore_errors=True)
            os.close(lock_fd)
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGHUP:
            self._reload = True
        elif sig != signal.SIGCHLD:
            self._signals.append(sig)

    def _wait(self, timeout: float | None) -> list[_Shard]:
        """Sleep until a signal, a child's exit or a ready byte (or `timeout`); the shards
        whose ready pipe had something."""
        assert self._selector is not None
        woken = []
        for key, _ in self._selector.select(timeout):
            if key.fd == self._wake_r:
                try:
                    while os.read(self._wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            else:
                woken.append(key.data)
        return woken

    # -- the family ----------------------------------------------------------------------------

    def _watch(self, shards: list[_Shard]) -> int:
        """Start every shard, then keep each running until a signal: a shard that dies is
        started again alone, one that stops beating is killed (and so started again). Returns
        the exit status; raises CannotStart when a shard cannot start the first time."""
        for shard in shards:
            self._spawn(shard)
        stopping: str | None = None  # "signal", or "startup" (a shard could not start at all)
        startup_error = ""
        stop_deadline: float | None = None  # SIGTERM sent; SIGKILL at this time
        stop_grace_s = 0.0
        kill_deadline: float | None = None  # SIGKILL sent; stop waiting at this time
        killed = False
        while stopping is None or any(s.running for s in shards):
            now = time.monotonic()
            timeouts = [HEARTBEAT_CHECK_S] if stopping is None else []
            timeouts += [s.restart_at - now for s in shards if s.restart_at is not None and stopping is None]
            if stop_deadline is not None or kill_deadline is not None:
                timeouts.append((kill_deadline or stop_deadline or now) - now)  # type: ignore[operator]
            for shard in self._wait(max(0.0, min(timeouts)) if timeouts else None):
                self._read_ready(shard)
            for shard in shards:
                if shard.running and not shard.ready and shard.ready_fd is not None:
                    self._read_ready(shard)
            self._note_ready(shards, stopping)
            for shard in shards:
                if shard.proc is None or shard.proc.returncode is not None or shard.proc.poll() is None:
                    continue
                self._read_ready(shard)  # a byte written just before it exited counts
                self._close_ready(shard)
                how = describe_exit(shard.proc.returncode)
                if stopping is not None:
                    log = logger.info if shard.proc.returncode == 0 else logger.warning
                    log("shard %d (pid %d) %s", shard.index, shard.proc.pid, how)
                    continue
                if not self._served and not shard.ready and shard.proc.returncode > 0:
                    # it refused to start (a data dir it may not use, a bad setting): no
                    # restart gets past that; the others, still starting, stop too
                    startup_error = f"shard {shard.index} (pid {shard.proc.pid}) {how} before it was ready"
                    logger.error("%s; stopping the others", startup_error)
                    stopping = "startup"
                    grace_s = STARTING_GRACE_S if not any(s.ready for s in shards if s.running) else self._stop_wait_s()
                    stop_deadline, stop_grace_s = self._terminate(shards, signal.SIGTERM, grace_s), grace_s
                    continue
                self._died(shard, how)
            if stopping is None:
                self._check_heartbeats(shards)
                self._restart_due(shards)
            if self._reload:
                self._reload = False
                if stopping is None:
                    running = [s for s in shards if s.running]
                    logger.info("SIGHUP: forwarded to %d shard(s) (they check the auth file)", len(running))
                    for s in running:
                        assert s.proc is not None
                        s.proc.send_signal(signal.SIGHUP)
            while self._signals:
                sig = self._signals.pop(0)
                name = signal.Signals(sig).name
                running = sum(s.running for s in shards)
                if stopping == "signal":
                    logger.info("%s again: forwarded to %d shard(s)", name, running)
                    self._terminate(shards, sig, 0.0)
                    continue
                logger.info("%s: stopping %d shard(s)", name, running)
                stopping = "signal"
                for s in shards:
                    s.restart_at = None
                deadline = self._terminate(shards, signal.SIGTERM, self._stop_wait_s())
                if stop_deadline is None:  # a stop already under way keeps its time
                    stop_deadline, stop_grace_s = deadline, self._stop_wait_s()
            now = time.monotonic()
            if kill_deadline is None and stop_deadline is not None and now >= stop_deadline:
                left = [s for s in shards if s.running]
                if left:
                    logger.error(
                        "shard(s) %s still running after SIGTERM and %.0f s; killing them",
                        ", ".join(f"{s.index} (pid {s.proc.pid})" for s in left if s.proc), stop_grace_s,
                    )
                    for s in left:
                        assert s.proc is not None
                        s.proc.kill()
                    killed = True
                kill_deadline = now + KILL_SLACK_S
            elif kill_deadline is not None and now >= kill_deadline:
                stuck = [s for s in shards if s.running]
                logger.error(
                    "shard(s) %s outlived SIGKILL by %.0f s (stuck in the kernel?); leaving them",
                    ", ".join(f"{s.index} (pid {s.proc.pid})" for s in stuck if s.proc), KILL_SLACK_S,
                )
                break
        if stopping == "startup":
            raise CannotStart(startup_error, 1)
        clean = not killed and all(s.proc is not None and s.proc.returncode == 0 for s in shards)
        logger.info("every shard stopped%s", "" if clean else "; not cleanly")
        return 0 if clean else 1

    def _note_ready(self, shards: list[_Shard], stopping: str | None) -> None:
        """Shards that became ready: the table says they take work again; the family's first
        all-ready is logged, and so is each restarted shard's return."""
        assert self._table is not None
        now = time.monotonic()
        for shard in shards:
            if shard.ready and shard.ready_at is None and shard.running:
                shard.ready_at = now
                self._table.set_health(shard.index, self._table.health(shard.index) & ~DOWN)
                if shard.restarts:
                    logger.warning(
                        "shard %d (pid %d) is back after restart %d (%.1f s to start)",
                        shard.index, shard.proc.pid if shard.proc else 0, shard.restarts, now - shard.started_at,
                    )
            if (
                shard.looping and shard.ready_at is not None and shard.running
                and now - shard.ready_at >= SHARD_STABLE_S
            ):
                shard.looping = False
                shard.quick_deaths = 0
                shard.backoff_s = 0.0
                self._table.set_health(shard.index, self._table.health(shard.index) & ~CRASH_LOOP)
                logger.warning("shard %d served %.0f s: no longer crash-looping", shard.index, SHARD_STABLE_S)
        if not self._served and stopping is None and all(s.ready and s.running for s in shards):
            self._served = True
            logger.info("ready: %d shards on %s", len(shards), self.url)

    def _died(self, shard: _Shard, how: str) -> None:
        """A shard's process ended on its own (or by our SIGKILL for its silence): mark it down
        and start it again alone, at once or after its back-off."""
        assert self._table is not None and shard.proc is not None
        now = time.monotonic()
        lived = now - shard.started_at
        served = f"after {now - shard.ready_at:.1f} s of serving" if shard.ready_at is not None else "before it was ready"
        why = " (killed for not answering)" if shard.killed_silent else ""
        self._table.set_health(shard.index, (self._table.health(shard.index) | DOWN) & ~SILENT)
        if lived < SHARD_STABLE_S:
            shard.quick_deaths += 1
            shard.backoff_s = min(BACKOFF_MAX_S, shard.backoff_s * 2) if shard.backoff_s else BACKOFF_FIRST_S
        else:
            shard.quick_deaths = 0
            shard.backoff_s = 0.0
        wait_s = shard.backoff_s if shard.quick_deaths else 0.0
        shard.restart_at = now + wait_s
        logger.error(
            "shard %d (pid %d) %s %s%s; restarting it alone%s; the other shards serve on",
            shard.index, shard.proc.pid, how, served, why, f" in {wait_s:.1f} s" if wait_s else "",
        )
        if shard.quick_deaths >= CRASH_LOOP_DEATHS and not shard.looping:
            shard.looping = True
            self._table.set_health(shard.index, self._table.health(shard.index) | CRASH_LOOP)
            logger.critical(
                "shard %d is crash-looping: %d deaths in a row, each within %.0f s of its start; restarting "
                "it every %.0f s at most until it serves %.0f s (its partitions answer 503 meanwhile)",
                shard.index, shard.quick_deaths, SHARD_STABLE_S, BACKOFF_MAX_S, SHARD_STABLE_S,
            )

    def _restart_due(self, shards: list[_Shard]) -> None:
        now = time.monotonic()
        for shard in shards:
            if shard.restart_at is not None and now >= shard.restart_at:
                shard.restart_at = None
                shard.restarts += 1
                self.restarts += 1
                assert self._table is not None
                self._table.set_restarts(shard.index, shard.restarts)
                self._spawn(shard)

    def _check_heartbeats(self, shards: list[_Shard]) -> None:
        """A running shard whose event loop stopped beating: marked SILENT in the table after
        SILENT_S (nothing more is sent to it), killed after the heartbeat timeout (and started
        again as after any death)."""
        assert self._table is not None
        table = self._table
        now = time.monotonic()
        now_ns = time.monotonic_ns()
        for shard in shards:
            if not shard.running or shard.killed_silent:
                continue
            assert shard.proc is not None
            if table.pid(shard.index) != shard.proc.pid:
                # not beating yet (importing, or it never will): allowed the first beat's grace
                age = now - shard.started_at
                if age > max(FIRST_BEAT_GRACE_S, self.heartbeat_timeout_s):
                    self._kill_silent(shard, age)
                continue
            age = table.beat_age_s(shard.index, now_ns)
            if age > self.heartbeat_timeout_s:
                self._kill_silent(shard, age)
            elif age > SILENT_S:
                if shard.silent_since is None:
                    shard.silent_since = now
                    table.set_health(shard.index, table.health(shard.index) | SILENT)
                    logger.error(
                        "shard %d (pid %d) is not answering: no heartbeat for %.1f s; it gets no new work, "
                        "and is killed at %.0f s", shard.index, shard.proc.pid, age, self.heartbeat_timeout_s,
                    )
            elif shard.silent_since is not None:
                table.set_health(shard.index, table.health(shard.index) & ~SILENT)
                logger.warning(
                    "shard %d (pid %d) answers again after %.1f s of silence",
                    shard.index, shard.proc.pid, now - shard.silent_since,
                )
                shard.silent_since = None

    def _kill_silent(self, shard: _Shard, age: float) -> None:
        assert shard.proc is not None and self._table is not None
        logger.error(
            "shard %d (pid %d) gave no heartbeat for %.1f s (deadline %.1f s): killing it",
            shard.index, shard.proc.pid, age, self.heartbeat_timeout_s,
        )
        self._table.set_health(shard.index, self._table.health(shard.index) | SILENT)
        shard.killed_silent = True
        shard.proc.kill()

    def _spawn(self, shard: _Shard) -> None:
        assert self._run_dir is not None
        ready_r, ready_w = os.pipe()
        lock_fds = [d.lock_fd for d in self.dirs]
        assert all(fd is not None for fd in lock_fds)
        identity = {
            "index": shard.index,
            "count": self.settings.processes,
            "run_dir": str(self._run_dir),
            "listen_fd": self.listener.fileno(),
            "lock_fds": lock_fds,
            "ready_fd": ready_w,
            "supervisor_pid": os.getpid(),
            "rejoin": self._served,
            # the dirs this supervisor made: a family's first start is no unclean shutdown
            # (a shard started again after the family served recovers what it left)
            "new_dirs": [d.created and not self._served for d in self.dirs],
        }
        env = {**os.environ, SHARD_ENV: json.dumps(identity), SHARD_SETTINGS_ENV: self.settings.to_json()}
        # The shard starts with SIGTERM, SIGINT (and SIGHUP) blocked (a signal mask survives
        # fork and exec) and unblocks them once its handler notes them: a stop sent while it
        # starts is kept for its server, not the death of a process that never got to close
        # anything.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SPAWN_BLOCKED)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "app.shard"],
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(self.listener.fileno(), ready_w, *lock_fds),  # type: ignore[arg-type]
                process_group=0,  # the terminal's Ctrl-C reaches the supervisor only
            )
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            os.close(ready_w)
        os.set_blocking(ready_r, False)
        shard.proc = proc
        shard.ready_fd = ready_r
        shard.ready = False
        shard.ready_at = None
        shard.started_at = time.monotonic()
        shard.silent_since = None
        shard.killed_silent = False
        assert self._selector is not None
        self._selector.register(ready_r, selectors.EVENT_READ, shard)
        logger.info("shard %d started (pid %d)%s", shard.index, proc.pid, f", restart {shard.restarts}" if shard.restarts else "")

    def _close_ready(self, shard: _Shard) -> None:
        if shard.ready_fd is not None:
            assert self._selector is not None
            self._selector.unregister(shard.ready_fd)
            os.close(shard.ready_fd)
            shard.ready_fd = None

    def _read_ready(self, shard: _Shard) -> None:
        if shard.ready_fd is None:
            return
        try:
            data = os.read(shard.ready_fd, 64)
        except BlockingIOError:
            return
        if data:
            if not shard.ready:
                shard.ready = True
                logger.debug("shard %d is ready", shard.index)
        else:  # it closed its end: ready was written before, or it is exiting
            self._close_ready(shard)

    def _stop_wait_s(self) -> float:
        """How long a shard may take to stop after SIGTERM before it is killed."""
        return shutdown_watchdog_s(self.settings) + KILL_SLACK_S

    def _terminate(self, shards: list[_Shard], sig: int, grace_s: float) -> float:
        """Send `sig` to every running shard; the time by which they must be gone."""
        for shard in shards:
            if shard.running:
                assert shard.proc is not None
                shard.proc.send_signal(sig)  # does nothing once reaped; a zombie takes signals
        return time.monotonic() + grace_s
