"""The shard family's supervisor: `eventlog serve --processes N`, N >= 2.

The supervisor serves nothing itself. It holds what the family shares, for its whole life:

    log dirs   opened once (LogDir.open: the flock, meta.properties; never the clean-shutdown
               marker, which the shards' engines own); every shard inherits each lock's
               descriptor, so a dir stays locked until the last process of the family is gone
    socket     the listening socket (host, port, backlog), made here and inherited by every
               shard, which accept on it; connections wait in its queue while a family restarts
    run dir    a private directory per family start (mkdtemp "eventlog-shards-<pid>-*", 0700,
               <pid> the supervisor's): the shards' Unix sockets and shared memory; removed
               once that family is gone. The supervisor holds a flock on RUN_DIR_LOCK in it;
               a SIGKILLed one cannot remove its dir, so the next supervisor on this machine
               removes every run dir whose lock nobody holds

A shard is `python -m app.shard` (app/shard.py) in a process group of its own, with

    EVENTLOG_SHARD           JSON {"index", "count", "run_dir", "listen_fd", "lock_fds",
                             "ready_fd", "supervisor_pid"}: lock_fds in the order of
                             Settings.effective_log_dirs, every descriptor inherited
    EVENTLOG_SHARD_SETTINGS  Settings.to_json() of the supervisor's settings (flags included)

Life of a family:

    start     all N shards at once (their engines wait for one another: engine/shards.py).
              Each writes one byte to its ready pipe once it serves; when all have, the
              supervisor logs "ready: N shards on URL". A shard that exits before it is ready
              (the engine refused the data dir, say) stops the family: the others get SIGTERM,
              and SIGKILL STARTING_GRACE_S later if they are still starting (waiting for the
              dead one, they would otherwise sit out their watchdog); the supervisor exits 1.
              Start-up failures do not restart.
    a death   a ready shard that exits (a crash, SIGKILL, the OOM killer) stops the family the
              same way, then a new family starts on the same socket and locks, with a new run
              dir; a family that served less than FAMILY_STABLE_S first waits (0.5 s, doubling
              up to 10 s). Restarts are counted in the log.
    SIGTERM,  forwarded to every shard as SIGTERM; a second signal is forwarded as it came
    SIGINT    (a second SIGINT makes the shards drop open connections). The supervisor waits
              for all: exit 0 when every shard exited 0, else 1. Shards still running
              KILL_SLACK_S after their own watchdog (server.shutdown_watchdog_s) are killed.
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

from .server import CannotStart, shutdown_watchdog_s
from .settings import Settings

logger = logging.getLogger("eventlog.supervisor")

SHARD_ENV = "EVENTLOG_SHARD"
SHARD_SETTINGS_ENV = "EVENTLOG_SHARD_SETTINGS"
RUN_DIR_PREFIX = "eventlog-shards-"
RUN_DIR_LOCK = ".supervisor.lock"
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
# blocked in a new shard until its handlers are in place (app/shard.py)
SPAWN_BLOCKED = STOP_SIGNALS | {signal.SIGHUP}
# a family that served this long before a shard died restarts at once
FAMILY_STABLE_S = 10.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
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
    included) is refused, and only then joins a SO_REUSEPORT group: each shard adds a
    listening socket of its own to it (app/shard.py), and the kernel spreads new connections
    over the group by address hash. One socket shared by every shard instead would let the
    first shard to wake accept a whole burst of connections (seen: 64 of 64 on one shard),
    leaving the others idle. This socket stays in the group while a family restarts, so
    connections made meanwhile wait in its queue for the new shards, which accept on it too."""
    try:
        infos = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CannotStart(f"cannot listen on {settings.host}:{settings.port}: {exc}", 1) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)  # exclusive: no SO_REUSEPORT yet
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
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
    index: int
    proc: subprocess.Popen
    ready_fd: int | None  # our end of its ready pipe; None once closed
    ready: bool = False

    @property
    def running(self) -> bool:
        return self.proc.returncode is None


@dataclass
class _FamilyEnd:
    """How a family ended: `why` is "signal" (SIGTERM/SIGINT: the supervisor exits), "startup"
    (a shard exited before it was ready) or "died" (a ready shard exited: restart)."""

    why: str
    clean: bool  # every shard exited 0 without being killed
    served_s: float  # from ready to the first exit; 0 if never ready
    message: str = ""


class Supervisor:
    def __init__(self, settings: Settings, dirs: list[LogDir], listener: socket.socket) -> None:
        self.settings = settings
        self.dirs = dirs
        self.listener = listener
        host, port = listener.getsockname()[:2]
        scheme = "https" if settings.ssl_certfile is not None else "http"
        self.url = f"{scheme}://{_host_port(host, port)}"
        self.restarts = 0
        self._signals: list[int] = []
        self._reload = False  # SIGHUP came: to forward to the shards
        self._wake_r = -1
        self._wake_w = -1
        self._selector: selectors.BaseSelector | None = None

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
        try:
            return self._run()
        finally:
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

    def _run(self) -> int:
        backoff_s = 0.0
        first = True
        while True:
            if backoff_s:
                logger.info("starting a new family in %.1f s", backoff_s)
                if self._pause(backoff_s):
                    logger.info("stopped before the new family started")
                    return 0
            end = self._run_family()
            if end.why == "signal":
                logger.info("every shard stopped%s", "" if end.clean else "; not cleanly")
                return 0 if end.clean else 1
            if end.why == "startup":
                if first:
                    raise CannotStart(end.message, 1)
                logger.error("%s; giving up", end.message)
                return 1
            first = False
            self.restarts += 1
            if end.served_s >= FAMILY_STABLE_S:
                backoff_s = 0.0
            else:
                backoff_s = min(BACKOFF_MAX_S, backoff_s * 2) if backoff_s else BACKOFF_FIRST_S
            logger.warning("restarting the shard family (restart %d)", self.restarts)

    def _pause(self, seconds: float) -> bool:
        """Wait `seconds`; True if SIGTERM or SIGINT came meanwhile."""
        deadline = time.monotonic() + seconds
        while not self._signals:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._wait(left)
        self._signals.clear()
        return True

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

    # -- one family ----------------------------------------------------------------------------

    def _run_family(self) -> _FamilyEnd:
        run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-"))  # mode 0700
        lock_fd = os.open(run_dir / RUN_DIR_LOCK, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        shards: list[_Shard] = []
        try:
            for index in range(self.settings.processes):
                shards.append(self._spawn(index, run_dir))
            return self._watch(shards)
        finally:
            for shard in shards:  # still running: after an error in this process, or stuck
                if shard.running:
                    shard.proc.kill()
                    try:
                        shard.proc.wait(KILL_SLACK_S)
                    except subprocess.TimeoutExpired:
                        pass
                self._close_ready(shard)
            shutil.rmtree(run_dir, ignore_errors=True)
            os.close(lock_fd)

    def _spawn(self, index: int, run_dir: Path) -> _Shard:
        ready_r, ready_w = os.pipe()
        lock_fds = [d.lock_fd for d in self.dirs]
        assert all(fd is not None for fd in lock_fds)
        identity = {
            "index": index,
            "count": self.settings.processes,
            "run_dir": str(run_dir),
            "listen_fd": self.listener.fileno(),
            "lock_fds": lock_fds,
            "ready_fd": ready_w,
            "supervisor_pid": os.getpid(),
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
        shard = _Shard(index, proc, ready_r)
        assert self._selector is not None
        self._selector.register(ready_r, selectors.EVENT_READ, shard)
        logger.info("shard %d started (pid %d)", index, proc.pid)
        return shard

    def _close_ready(self, shard: _Shard) -> None:
        if shard.ready_fd is not None:
            assert self._selector is not None
            self._selector.unregister(shard.ready_fd)
            os.close(shard.ready_fd)
            shard.ready_fd = None

    def _watch(self, shards: list[_Shard]) -> _FamilyEnd:
        """Serve until the family ends: a signal, a start-up failure, a death."""
        end: _FamilyEnd | None = None
        ready_at: float | None = None
        stop_deadline: float | None = None  # SIGTERM sent; SIGKILL at this time
        stop_grace_s = 0.0  # ... which is this long after the SIGTERM
        kill_deadline: float | None = None  # SIGKILL sent; stop waiting at this time
        killed = False
        while any(s.running for s in shards):
            now = time.monotonic()
            deadline = kill_deadline or stop_deadline
            woken = self._wait(None if deadline is None else max(0.0, deadline - now))
            for shard in woken:
                self._read_ready(shard)
            if ready_at is None and end is None and all(s.ready for s in shards):
                ready_at = time.monotonic()
                logger.info("ready: %d shards on %s", len(shards), self.url)
            for shard in shards:
                if not shard.running or shard.proc.poll() is None:
                    continue
                self._read_ready(shard)  # a byte written just before it exited counts
                self._close_ready(shard)
                how = describe_exit(shard.proc.returncode)
                if end is not None:
                    log = logger.info if shard.proc.returncode == 0 else logger.warning
                    log("shard %d (pid %d) %s", shard.index, shard.proc.pid, how)
                    continue
                grace_s = self._stop_wait_s()
                if not shard.ready:
                    message = f"shard {shard.index} (pid {shard.proc.pid}) {how} before it was ready"
                    logger.error("%s; stopping the others", message)
                    end = _FamilyEnd("startup", False, 0.0, message)
                    if not any(s.ready for s in shards if s.running):
                        grace_s = STARTING_GRACE_S
                else:
                    served = time.monotonic() - ready_at if ready_at is not None else 0.0
                    logger.error(
                        "shard %d (pid %d) %s after %.1f s of serving; stopping the others to restart the family",
                        shard.index, shard.proc.pid, how, served,
                    )
                    end = _FamilyEnd("died", False, served)
                stop_deadline, stop_grace_s = self._terminate(shards, signal.SIGTERM, grace_s), grace_s
            if self._reload:
                self._reload = False
                if end is None:  # a family stopping has no use for it
                    running = [s for s in shards if s.running]
                    logger.info("SIGHUP: forwarded to %d shard(s) (they check the auth file)", len(running))
                    for s in running:
                        s.proc.send_signal(signal.SIGHUP)
            while self._signals:
                sig = self._signals.pop(0)
                name = signal.Signals(sig).name
                running = sum(s.running for s in shards)
                if end is not None and end.why == "signal":
                    logger.info("%s again: forwarded to %d shard(s)", name, running)
                    self._terminate(shards, sig, 0.0)
                    continue
                logger.info("%s: stopping %d shard(s)", name, running)
                end = _FamilyEnd("signal", False, end.served_s if end is not None else 0.0)
                deadline = self._terminate(shards, signal.SIGTERM, self._stop_wait_s())
                if stop_deadline is None:  # a stop already under way keeps its time
                    stop_deadline, stop_grace_s = deadline, self._stop_wait_s()
            now = time.monotonic()
            if kill_deadline is None and stop_deadline is not None and now >= stop_deadline:
                left = [s for s in shards if s.running]
                if left:
                    logger.error(
                        "shard(s) %s still running after SIGTERM and %.0f s; killing them",
                        ", ".join(f"{s.index} (pid {s.proc.pid})" for s in left), stop_grace_s,
                    )
                    for s in left:
                        s.proc.kill()
                    killed = True
                kill_deadline = now + KILL_SLACK_S
            elif kill_deadline is not None and now >= kill_deadline:
                stuck = [s for s in shards if s.running]
                logger.error(
                    "shard(s) %s outlived SIGKILL by %.0f s (stuck in the kernel?); leaving them",
                    ", ".join(f"{s.index} (pid {s.proc.pid})" for s in stuck), KILL_SLACK_S,
                )
                break
        assert end is not None
        clean = not killed and all(s.proc.returncode == 0 for s in shards)
        return _FamilyEnd(end.why, clean, end.served_s, end.message)

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
                shard.proc.send_signal(sig)  # does nothing once reaped; a zombie takes signals
        return time.monotonic() + grace_s
