"""Connection balance in a shard family: a shard with more connections than another hands a new
one over, socket and all.

Each shard listens on its own SO_REUSEPORT socket, and the kernel spreads new connections over
the group by a hash of their addresses: at random, in effect. 64 connections from one client
came out 37 / 27, and 4 came out 3 / 1 or 4 / 0 as often as 2 / 2. A request's work lands on
the shard that holds its connection (it parses and encodes; the owners only append), so the
shard with more connections runs out of core while the other waits on it: with 37 / 27 the
family used 1.67 of the 2 cores. So a shard that accepts a connection while another shard has
fewer (counting the ones already handed to it and not yet taken) passes the accepted socket's
descriptor to that shard over a Unix datagram socket (SCM_RIGHTS) before reading a byte of it,
and closes its own copy; the other shard serves it from the first byte as if it had accepted it.
The client sees nothing: the connection is the same TCP connection. Ties stay where they are,
so connections arriving one by one come out even.

Per shard, in the run dir:

    shard-<i>.handoff   a Unix datagram socket: each message is one descriptor, and as the
                        payload the sending shard's index (one byte) and its token's name
    handoff-<pid>-<n>   a token per connection handed over, made by the sender before it sends:
                        whoever removes it has the connection. The receiver removes it as it
                        takes the descriptor; a sender that finds it still there RECLAIM_S
                        later (the receiver stopped or died with the descriptor queued) removes
                        it and serves the connection itself, from a copy of the descriptor it
                        kept, so a connection handed to a shard that stops is not left waiting
    shard-<i>.conns     N + 1 little-endian int64: the shard's open HTTP connections, then how
                        many it has taken from each shard so far; written by shard i only

A shard compares its own count with count_j + (sent to j - taken by j from it) for each other
shard j: what it sent and j has not taken yet counts as j's. A shard that is not answering (the
partition table: not serving, down, or its heartbeat silent; engine/shards.py) is not a
candidate, so nothing is handed to a stopped or hung shard; nor is one whose files are missing,
or whose socket refuses (not started, or gone); any failure keeps the connection where it is. A
shard started again (a new pid in the table) writes new files: the others map them afresh and
count what they sent it from zero. Not with TLS: the handshake has already run on the accepting
shard by the time the application protocol sees the connection, so with TLS a connection stays
with the shard that accepted it.
"""

from __future__ import annotations

import array
import asyncio
import logging
import mmap
import os
import socket
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.shards import PartitionTable, table_path

logger = logging.getLogger("eventlog.app")


HANDOFF_BEAT_S = 0.35  # a shard whose last heartbeat is older is handed no connection
RECLAIM_S = 0.5  # a connection handed over and not taken by then is taken back
TOKEN_PREFIX = "handoff-"


def _unlink(path: Path) -> bool:
    """Remove `path`; True if this call removed it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def handoff_path(run_dir: Path, shard: int) -> Path:
    return run_dir / f"shard-{shard}.handoff"


def counts_path(run_dir: Path, shard: int) -> Path:
    return run_dir / f"shard-{shard}.conns"


class Balancer:
    """This shard's side of the hand-over: decides, sends, and takes what others send."""

    def __init__(self, run_dir: Path, index: int, count: int) -> None:
        self.run_dir = run_dir
        self.index = index
        self.count = count
        self.closing = False
        self.sent = [0] * count  # handed to each shard so far
        self.handed_off = 0
        self.adopted = 0
        self.reclaimed = 0  # handed over, not taken in time, served here after all
        self._tokens = 0
        self._peers: dict[int, tuple[int, np.ndarray]] = {}  # (pid, their counts), mapped once they exist
        self._table = PartitionTable(table_path(run_dir), count)
        path = counts_path(run_dir, index)
        # a new file, never the previous process's truncated: others may have that one mapped
        # (and a mapping of a file cut short faults when read)
        fresh = path.with_name(f"{path.name}.{os.getpid()}")
        with open(fresh, "wb") as f:
            f.truncate(8 * (count + 1))
        os.replace(fresh, path)
        self._own_map = self._map(path, writable=True)
        self._own = np.frombuffer(self._own_map, dtype="<i8")
        self._inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        inbox = handoff_path(run_dir, index)
        inbox.unlink(missing_ok=True)
        self._inbox.bind(str(inbox))
        self._inbox.setblocking(False)
        self._outbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._outbox.setblocking(False)
        self._adopt: Callable[[socket.socket], Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _map(self, path: Path, writable: bool) -> mmap.mmap:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            return mmap.mmap(fd, 8 * (self.count + 1), access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)

    def start(self, adopt: Callable[[socket.socket], Any]) -> None:
        """Take handed-over connections from now on: `adopt(sock)` serves one (a coroutine)."""
        self._adopt = adopt
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._inbox.fileno(), self._receive)

    def close(self) -> None:
        """Stop handing over and taking (shutdown): what is still queued is closed by the kernel."""
        if self.closing:
            return
        self.closing = True
        if self._loop is not None:
            self._loop.remove_reader(self._inbox.fileno())
        self._inbox.close()
        self._outbox.close()
        handoff_path(self.run_dir, self.index).unlink(missing_ok=True)

    def publish(self, connections: int) -> None:
        self._own[0] = connections

    # -- handing over --------------------------------------------------------------------------

    def _peer(self, shard: int) -> np.ndarray | None:
        """Shard `shard`'s counts, if it is answering (its current process's file) and beat
        within HANDOFF_BEAT_S: a connection handed to a shard that has just stopped would wait
        until it is killed, so a shard whose loop missed a few beats gets none."""
        if not self._table.answering(shard, HANDOFF_BEAT_S):
            return None
        pid = self._table.pid(shard)
        known = self._peers.get(shard)
        if known is not None and known[0] == pid:
            return known[1]
        try:
            counts = np.frombuffer(self._map(counts_path(self.run_dir, shard), writable=False), dtype="<i8")
        except (OSError, ValueError):
            return None
        self._peers[shard] = (pid, counts)
        self.sent[shard] = 0  # a new process: it has taken nothing of ours yet
        return counts

    def target(self, local: int) -> int | None:
        """The shard with the fewest connections if it has fewer than `local` (this shard's,
        before the new one); None to keep the connection."""
        best, fewest = None, local
        for shard in range(self.count):
            if shard == self.index:
                continue
            counts = self._peer(shard)
            if counts is None:
                continue
            pending = self.sent[shard] - int(counts[1 + self.index])
            theirs = int(counts[0]) + max(0, pending)
            if theirs < fewest:
                best, fewest = shard, theirs
        return best

    def hand_off(self, transport: asyncio.BaseTransport, local: int) -> bool:
        """Pass a just-accepted connection to a shard with fewer; True if it went (the caller
        then drops its copy without a word)."""
        if self.closing or transport.get_extra_info("sslcontext") is not None:
            return False
        shard = self.target(local)
        if shard is None:
            return False
        sock = transport.get_extra_info("socket")
        if sock is None or self._loop is None:
            return False
        self._tokens += 1
        token = f"{TOKEN_PREFIX}{os.getpid()}-{self._tokens}"
        try:
            os.close(os.open(self.run_dir / token, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        except OSError:
            return False
        kept = -1
        try:
            kept = os.dup(sock.fileno())
            self._outbox.sendmsg(
                [bytes((self.index,)) + token.encode("ascii")],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [sock.fileno()]))],
                0,
                str(handoff_path(self.run_dir, shard)),
            )
        except OSError:  # not started, gone, or its queue is full: keep it
            if kept >= 0:
                os.close(kept)
            _unlink(self.run_dir / token)
            return False
        self.sent[shard] += 1
        self.handed_off += 1
        self._loop.call_later(RECLAIM_S, self._settle, shard, token, kept)
        return True

    def _settle(self, shard: int, token: str, kept: int) -> None:
        """RECLAIM_S after a hand-over: the token gone means the other shard took the
        connection (our spare descriptor goes); still there, it did not (it stopped, or died,
        with the descriptor in its queue): removing the token makes the connection ours again,
        and this shard serves it. Whoever removes the token first has the connection."""
        if self.closing or not _unlink(self.run_dir / token):
            os.close(kept)
            return
        self.sent[shard] -= 1
        self.reclaimed += 1
        sock = socket.socket(fileno=kept)
        sock.setblocking(False)
        asyncio.ensure_future(self._serve(sock))

    # -- taking over ---------------------------------------------------------------------------

    def _receive(self) -> None:
        while not self.closing:
            try:
                payload, fds, _flags, _addr = socket.recv_fds(self._inbox, 128, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                logger.exception("connection hand-over: receive failed")
                return
            for fd in fds:
                sock = socket.socket(fileno=fd)
                if not payload or payload[0] >= self.count or self._adopt is None:
                    sock.close()
                    continue
                token = payload[1:].decode("ascii", "replace")
                if not token.startswith(TOKEN_PREFIX) or "/" in token or not _unlink(self.run_dir / token):
                    sock.close()  # its sender took it back (we were too slow), or not ours
                    continue
                self._own[1 + payload[0]] += 1
                self.adopted += 1
                sock.setblocking(False)
                asyncio.ensure_future(self._serve(sock))

    async def _serve(self, sock: socket.socket) -> None:
        assert self._adopt is not None
        try:
            await self._adopt(sock)
        except OSError:  # the client went away meanwhile
            sock.close()
