"""The shard family's shared state: who owns a partition, the partition table in shared
memory, and the channel between shards.

eventlog serve --processes N runs N shard processes over one data dir (docs/ARCHITECTURE.md,
"The paths", each at N shards). Every partition has one owner shard (owner_of), its single
writer. The others read its files directly and learn how far they may read from the partition table: a file in
the family's private run dir, mapped by every shard, holding per partition its high
watermark, log start offset, active segment (base offset, readable end) and a generation
that moves whenever its segment list changes. Wake-ups, forwarded appends and everything
else that needs the owner travel over the channel: one Unix socket per shard, frames of
pickled tuples, batches as bytes.

Partition table layout (little-endian; a file of HEADER_BYTES + count * REGION_SLOTS * 64):

    shard header, 64 bytes per shard (up to MAX_SHARDS):
        u64 state      0 starting, 1 loaded (its partitions take requests), 2 serving
        u64 pid        the shard process that wrote state (a restarted shard has a new one)
        u64 beat_ns    CLOCK_MONOTONIC of the shard's last heartbeat (its event loop's, every
                       BEAT_S): the supervisor kills a shard whose beat is older than its
                       deadline, and everyone treats one whose beat is older than SILENT_S as
                       not answering
        u64 health     written by the supervisor only: DOWN (exited, a new process on the way),
                       SILENT (beats stopped: not answering), CRASH_LOOP (dying again and again)
        u64 restarts   written by the supervisor only: how many times it restarted this shard
        24 bytes unused
    then one region of REGION_SLOTS slots per shard, written only by that shard:
        slot (64 bytes): u64 seq, u64 key, i64 high_watermark, i64 log_start_offset,
                         u64 generation, i64 active_base_offset, i64 active_end, u64 flags

A slot is found by its key (a 64-bit hash of topic id and partition, never 0) with linear
probing in its owner's region. Each slot is a seqlock: the owner makes seq odd, writes the
fields, makes seq even; a reader retries until it reads the same even seq before and after.
flags: LIVE (the owner serves it), DELETED (its topic is gone; the slot is a tombstone),
CHANGING (segment files are being renamed: readers keep their previous segment list).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import itertools
import logging
import mmap
import os
import pickle
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from .errors import EngineError, ShardUnavailableError
from .metadata import INTERNAL_TOPICS, QUEUE_STATE_TOPIC

logger = logging.getLogger("eventlog.engine")

MAX_SHARDS = 256
HEADER_BYTES = MAX_SHARDS * 64
# slots per shard: the partitions one shard can own (its region is sparse: pages appear as
# slots are used, 4 MiB at most). 65,536 so that a family of 2 holds 50,000 partitions with
# room for linear probing (issue 28; it was 16,384: a shard owning more could not start)
REGION_SLOTS = 65_536
SLOT = struct.Struct("<QQqqQqqQ")
SLOT_BYTES = 64
SHARD_HEADER = struct.Struct("<QQ")
_U64 = struct.Struct("<Q")

LIVE = 1
DELETED = 2
CHANGING = 4  # the owner is renaming segment files: keep reading the previous list

STARTING, LOADED, SERVING = 0, 1, 2
READ_PATIENCE_S = 2.0  # a slot half written this long: its owner died mid-write

# the shard header's health bits (the supervisor's word on a shard)
DOWN = 1  # exited; the supervisor starts it again
SILENT = 2  # alive, but its event loop has not beaten for a while: not answering
CRASH_LOOP = 4  # it died soon after each of its last starts
UNAVAILABLE = DOWN | SILENT
BEAT_S = 0.1  # how often a shard's event loop stamps beat_ns
# a shard whose last beat is older than this is not answering: calls to it fail at once
# (503), the connection balancer hands it nothing; the supervisor kills it later, at its
# deadline (Settings.shard_heartbeat_timeout_ms)
SILENT_S = 2.0


def owner_of(topic: str, partition: int, count: int) -> int:
    """The shard that owns (topic, partition) in a family of `count`: internal topics live on
    shard 0 (it writes the metadata log and holds the group offsets), but for __queue_state,
    whose partition k is shard k's (each shard persists the queue windows of the partitions it
    owns there: engine/queues.py); a user topic's partitions go round the shards from a place
    its name picks, so a topic's partitions spread evenly whatever their number."""
    if count <= 1:
        return 0
    if topic == QUEUE_STATE_TOPIC:
        return partition % count
    if topic in INTERNAL_TOPICS:
        return 0
    return (zlib.crc32(topic.encode("utf-8")) + partition) % count


def slot_key(topic: str, topic_id: str, partition: int) -> int:
    digest = hashlib.blake2b(f"{topic}\0{topic_id}\0{partition}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") | 1


@dataclass(frozen=True, slots=True)
class SlotState:
    high_watermark: int
    log_start_offset: int
    generation: int
    active_base: int
    active_end: int
    flags: int

    @property
    def live(self) -> bool:
        return bool(self.flags & LIVE)

    @property
    def deleted(self) -> bool:
        return bool(self.flags & DELETED)


class PartitionTable:
    """The shared-memory partition table of one family (see the module's doc)."""

    def __init__(self, path: Path, count: int) -> None:
        self.path = path
        self.count = count
        size = HEADER_BYTES + count * REGION_SLOTS * SLOT_BYTES
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # sparse: pages appear as slots are used
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._slots: dict[tuple[int, int], int] = {}  # (shard, key) -> slot index (found or claimed)

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:  # a reader still holds a view; the mapping goes with the process
            pass

    # -- shard states -------------------------------------------------------------------------

    def set_state(self, shard: int, state: int) -> None:
        SHARD_HEADER.pack_into(self._map, shard * 64, state, os.getpid())

    def state(self, shard: int) -> int:
        return SHARD_HEADER.unpack_from(self._map, shard * 64)[0]

    def pid(self, shard: int) -> int:
        return SHARD_HEADER.unpack_from(self._map, shard * 64)[1]

    def begin(self, shard: int) -> None:
        """A shard process starts: its header says so (starting, its pid, a first beat)."""
        self.set_state(shard, STARTING)
        self.beat(shard)

    def beat(self, shard: int) -> None:
        _U64.pack_into(self._map, shard * 64 + 16, time.monotonic_ns())

    def beat_age_s(self, shard: int, now_ns: int | None = None) -> float:
        """Seconds since the shard's last heartbeat (its event loop's)."""
        beat = _U64.unpack_from(self._map, shard * 64 + 16)[0]
        return ((now_ns if now_ns is not None else time.monotonic_ns()) - beat) / 1e9

    def health(self, shard: int) -> int:
        return _U64.unpack_from(self._map, shard * 64 + 24)[0]

    def set_health(self, shard: int, health: int) -> None:
        _U64.pack_into(self._map, shard * 64 + 24, health)

    def restarts(self, shard: int) -> int:
        return _U64.unpack_from(self._map, shard * 64 + 32)[0]

    def set_restarts(self, shard: int, restarts: int) -> None:
        _U64.pack_into(self._map, shard * 64 + 32, restarts)

    def unavailable(self, shard: int) -> str | None:
        """Why calls to `shard` cannot be answered now (None: they can): it exited and is
        being restarted, or its event loop stopped beating (a stopped or hung process)."""
        health = self.health(shard)
        if health & DOWN:
            return "it exited; the supervisor is restarting it"
        if health & SILENT or self.beat_age_s(shard) > SILENT_S:
            return "it is not answering (no heartbeat)"
        return None

    def answering(self, shard: int, within_s: float = SILENT_S) -> bool:
        """Serving, neither down nor silent, and beating within `within_s`: new work may go
        to it."""
        return self.state(shard) == SERVING and self.unavailable(shard) is None and self.beat_age_s(shard) <= within_s

    async def wait_states(self, state: int, timeout_s: float, shards: range | None = None) -> None:
        """Wait until every shard (of `shards`) reached `state` or beyond."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        for shard in shards if shards is not None else range(self.count):
            while self.state(shard) < state:
                if asyncio.get_running_loop().time() > deadline:
                    raise ShardUnavailableError(shard, "did not finish starting in time")
                await asyncio.sleep(0.01)

    # -- slots --------------------------------------------------------------------------------

    def _offset(self, shard: int, index: int) -> int:
        return HEADER_BYTES + (shard * REGION_SLOTS + index) * SLOT_BYTES

    def claim(self, shard: int, key: int) -> int:
        """The slot of `key` in `shard`'s region (the caller is that shard), claimed if new."""
        found = self._slots.get((shard, key))
        if found is not None:
            return found
        start = key % REGION_SLOTS
        tombstone = None
        for i in range(REGION_SLOTS):
            index = (start + i) % REGION_SLOTS
            _seq, k, *_rest, flags = SLOT.unpack_from(self._map, self._offset(shard, index))
            if k == key:
                self._slots[(shard, key)] = index
                return index
            if k == 0:
                index = tombstone if tombstone is not None else index
                self._write(shard, index, key, 0, 0, 0, 0, 0, 0)
                self._slots[(shard, key)] = index
                return index
            if flags & DELETED and tombstone is None:
                tombstone = index
        if tombstone is not None:
            self._write(shard, tombstone, key, 0, 0, 0, 0, 0, 0)
            self._slots[(shard, key)] = tombstone
            return tombstone
        raise EngineError(
            f"the partition table of shard {shard} is full ({REGION_SLOTS} partitions): "
            "run more processes (eventlog serve --processes, EVENTLOG_PROCESSES)"
        )

    def _write(self, shard: int, index: int, key: int, hw: int, start: int, gen: int, base: int, end: int, flags: int) -> None:
        at = self._offset(shard, index)
        seq = struct.unpack_from("<Q", self._map, at)[0]
        struct.pack_into("<Q", self._map, at, seq + 1 | 1)  # odd: being written
        SLOT.pack_into(self._map, at, seq + 1 | 1, key, hw, start, gen, base, end, flags)
        struct.pack_into("<Q", self._map, at, (seq | 1) + 1)  # even again

    def publish(self, shard: int, index: int, key: int, state: SlotState) -> None:
        self._write(
            shard, index, key, state.high_watermark, state.log_start_offset, state.generation,
            state.active_base, state.active_end, state.flags,
        )

    def generation(self, shard: int, index: int) -> int:
        """The slot's generation as it stands (0 for a new slot), seqlock or not: for the
        owner, which alone writes it."""
        return SLOT.unpack_from(self._map, self._offset(shard, index))[4]

    def find(self, shard: int, key: int) -> int | None:
        """The slot index of `key` in `shard`'s region, None if the owner has not claimed it."""
        found = self._slots.get((shard, key))
        if found is not None:
            return found
        start = key % REGION_SLOTS
        for i in range(REGION_SLOTS):
            index = (start + i) % REGION_SLOTS
            k = struct.unpack_from("<Q", self._map, self._offset(shard, index) + 8)[0]
            if k == key:
                self._slots[(shard, key)] = index
                return index
            if k == 0:
                return None
        return None

    def read(self, shard: int, index: int, key: int) -> SlotState | None:
        """A consistent copy of the slot; None if it no longer holds `key`.

        The owner's write is three stores; a reader that finds it half done retries, first at
        once, then (the owner was preempted mid-write on a busy machine) sleeping a little
        between tries, for up to READ_PATIENCE_S before it calls the owner unavailable."""
        at = self._offset(shard, index)
        unpack = SLOT.unpack_from
        deadline = None
        tries = 0
        while True:
            seq, k, hw, start, gen, base, end, flags = unpack(self._map, at)
            if not seq & 1 and struct.unpack_from("<Q", self._map, at)[0] == seq:
                if k != key:
                    return None
                return SlotState(hw, start, gen, base, end, flags)
            tries += 1
            if tries < 1000:
                continue
            now = time.monotonic()
            if deadline is None:
                deadline = now + READ_PATIENCE_S
            elif now > deadline:
                raise ShardUnavailableError(shard, "its partition table slot stayed half written")
            time.sleep(0.0001)


# -- the channel ----------------------------------------------------------------------------

FRAME = struct.Struct("!I")
Handler = Callable[..., Awaitable[Any]]


def table_path(run_dir: Path) -> Path:
    """The family's partition table (the supervisor creates it before any shard starts)."""
    return run_dir / "partitions.table"


def socket_path(run_dir: Path, shard: int) -> Path:
    return run_dir / f"shard-{shard}.sock"


Reply = Callable[[bool, Any], None]  # (ok, result or error)


class _Frames:
    """Frames off a stream: a 4-byte length, then a pickled tuple. Parsed as the bytes arrive,
    in the protocol's data_received: no task wakes to read them."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buffer = self._buffer
        buffer += data
        out = []
        position = 0
        end = len(buffer)
        view = memoryview(buffer)
        try:
            while end - position >= 4:
                (size,) = FRAME.unpack_from(buffer, position)
                if end - position - 4 < size:
                    break
                out.append(pickle.loads(view[position + 4:position + 4 + size]))
                position += 4 + size
        finally:
            view.release()
        if position:
            del buffer[:position]
        return out


class _Peer:
    """One outgoing connection to another shard, with its requests in flight: a future (call)
    or a function (call_soon) per request id."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future | Reply] = {}
        # (deadline, request id) in the order sent: the sweep fails what is overdue
        self.deadlines: collections.deque[tuple[float, int]] = collections.deque()
        self.connecting: asyncio.Lock = asyncio.Lock()
        self.writable = asyncio.Event()
        self.writable.set()
        # a peer whose connection broke has died (a Unix socket does not drop a live peer): its
        # calls fail at once until the supervisor has started it again (a new pid, serving)
        self.dead = False
        self.pid = 0  # the process this connection reached (the table's word when it was made)

    @property
    def connected(self) -> bool:
        return self.transport is not None and not self.dead


class _Replies(asyncio.Protocol):
    """The reading side of an outgoing connection: answers complete their requests as they are
    parsed."""

    def __init__(self, channel: "ShardChannel", peer: _Peer) -> None:
        self.channel = channel
        self.peer = peer
        self.frames = _Frames()

    def data_received(self, data: bytes) -> None:
        try:
            replies = self.frames.feed(data)
        except Exception:
            logger.exception("shard channel to shard %d: bad reply", self.peer.shard)
            if self.peer.transport is not None:
                self.peer.transport.close()
            return
        pending = self.peer.pending
        for rid, ok, value in replies:
            waiter = pending.pop(rid, None)
            if waiter is None:
                continue
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_result(value) if ok else waiter.set_exception(value)
            else:
                _call_back(waiter, ok, value)

    def pause_writing(self) -> None:
        self.peer.writable.clear()

    def resume_writing(self) -> None:
        self.peer.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.peer.dead = True
        self.peer.writable.set()
        self.channel._fail(self.peer, "connection lost")


class _Requests(asyncio.Protocol):
    """The serving side of a connection from another shard: a note runs as it is parsed; a
    request with a quick handler (one that answers through a reply function, e.g. an append
    queued to its partition's writer) starts as it is parsed too; any other runs as a task."""

    def __init__(self, channel: "ShardChannel") -> None:
        self.channel = channel
        self.frames = _Frames()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.channel._serving.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.channel._serving.discard(self)

    def data_received(self, data: bytes) -> None:
        channel = self.channel
        try:
            messages = self.frames.feed(data)
        except Exception:
            logger.exception("shard channel: bad request")
            assert self.transport is not None
            self.transport.close()
            return
        for rid, kind, args in messages:
            if rid == 0:  # a note: its handler is a plain function
                handler = channel.handlers.get(kind)
                if handler is not None:
                    try:
                        handler(*args)
                    except Exception:
                        logger.exception("shard note %s failed", kind)
                continue
            quick = channel.quick_handlers.get(kind)
            if quick is not None:
                reply = functools.partial(self.reply, rid, kind)
                try:
                    quick(reply, *args)
                except Exception as exc:
                    reply(False, exc)
                continue
            channel._spawn(self._answer(rid, kind, channel.handlers.get(kind), args))

    async def _answer(self, rid: int, kind: str, handler: Handler | None, args: tuple) -> None:
        try:
            if handler is None:
                raise EngineError(f"shard {self.channel.index} has no handler for {kind!r}")
            self.reply(rid, kind, True, await handler(*args))
        except asyncio.CancelledError:
            self.reply(rid, kind, False, ShardUnavailableError(self.channel.index, "shutting down"))
        except Exception as exc:
            self.reply(rid, kind, False, exc)

    def reply(self, rid: int, kind: str, ok: bool, value: Any) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        try:
            _send(transport, (rid, ok, value))
        except Exception as exc:
            logger.exception("shard call %s: answer does not pickle", kind)
            _send(transport, (rid, False, EngineError(f"{kind}: {type(exc).__name__}: {exc}")))


class ShardChannel:
    """Requests and one-way notes between the shards of a family, over Unix sockets.

    call(shard, kind, *args) runs the (async) handler registered for `kind` on that shard and
    returns its result (or raises its error: engine errors pickle). call_soon(shard, kind,
    reply, *args) sends the same request and calls reply(ok, result or error) when the answer
    comes, from the protocol that reads it (no task wakes in between). A kind may also have a
    quick handler on the serving side, quick(reply, *args), which starts the work as the
    request is read and answers through reply. note(shard, kind, *args) sends without waiting;
    a note's handler is a plain function, run as the note is read.

    Failures (ShardUnavailableError, 503 `unavailable`): a peer that goes away fails its
    requests in flight at once, and new ones until its supervisor has started it again (the
    table shows it serving under a new pid; the next call connects to the new process). A
    peer that stops answering (its heartbeat in the table is older than SILENT_S, or the
    supervisor marked it SILENT or DOWN) fails its requests in flight at the next sweep and new
    ones at once. Every request has a deadline (`timeout_s`, the request timeout): the sweep,
    run with each heartbeat, fails what is overdue.

    Both ends are protocols that parse frames in data_received: a forwarded append is queued
    to its writer in the same loop step that reads it, and its answer completes the request
    in the step that reads the answer. (With streams and a task per request, each hop cost a
    loop turn, and a loop busy parsing produce bodies makes a turn milliseconds long.)
    """

    def __init__(
        self, run_dir: Path, index: int, count: int, table: PartitionTable | None = None, timeout_s: float = 30.0,
    ) -> None:
        self.run_dir = run_dir
        self.index = index
        self.count = count
        self.table = table
        self.timeout_s = timeout_s
        self.handlers: dict[str, Handler] = {}
        self.quick_handlers: dict[str, Callable[..., None]] = {}
        self._peers = {i: _Peer(i) for i in range(count) if i != index}
        self._ids = itertools.count(1)
        self._server: asyncio.AbstractServer | None = None
        self._serving: set[_Requests] = set()
        self._tasks: set[asyncio.Task] = set()
        self.closing = False

    async def start(self) -> None:
        path = socket_path(self.run_dir, self.index)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Requests(self), path=str(path))

    async def close(self) -> None:
        self.closing = True
        if self._server is not None:
            self._server.close()
        for peer in self._peers.values():
            if peer.transport is not None:
                peer.transport.close()
            self._fail(peer, "shutting down")
        for served in list(self._serving):
            if served.transport is not None:
                served.transport.close()
        for task in list(self._tasks):
            task.cancel()

    # -- calling ------------------------------------------------------------------------------

    async def _connected(self, peer: _Peer) -> asyncio.Transport:
        if peer.connected:
            assert peer.transport is not None
            return peer.transport
        async with peer.connecting:
            if peer.connected:
                assert peer.transport is not None
                return peer.transport
            self._check_usable(peer)
            path = str(socket_path(self.run_dir, peer.shard))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.timeout_s
            while True:
                try:
                    transport, _ = await loop.create_unix_connection(lambda: _Replies(self, peer), path)
                    break
                except (FileNotFoundError, ConnectionRefusedError) as exc:
                    if loop.time() > deadline:
                        raise ShardUnavailableError(peer.shard, f"cannot connect: {exc}") from None
                    await asyncio.sleep(0.02)
                    self._check_usable(peer)
            peer.transport = transport  # type: ignore[assignment]
            peer.pid = self.table.pid(peer.shard) if self.table is not None else 0
            return peer.transport  # type: ignore[return-value]

    def _check_usable(self, peer: _Peer) -> None:
        """Raise ShardUnavailableError if a request to `peer` cannot be answered now. A peer
        that died is usable again once the table shows its new process serving."""
        if self.closing:
            raise ShardUnavailableError(peer.shard, "shutting down")
        table = self.table
        if peer.dead:
            if table is None or not table.answering(peer.shard) or table.pid(peer.shard) == peer.pid:
                raise ShardUnavailableError(peer.shard, "it exited; the supervisor is restarting it")
            peer.dead = False  # its new process serves: the next request connects to it
            peer.transport = None
        if table is not None:
            why = table.unavailable(peer.shard)
            if why is not None:
                raise ShardUnavailableError(peer.shard, why)

    async def call(self, shard: int, kind: str, *args: Any, timeout_s: float | None = None) -> Any:
        """The handler's result on `shard`; ShardUnavailableError if the shard is gone, not
        answering, or the answer is not there within `timeout_s` (default: the channel's)."""
        peer = self._peers[shard]
        if peer.connected:
            self._check_usable(peer)
        transport = await self._connected(peer)
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        peer.pending[rid] = future
        _send(transport, (rid, kind, args))
        try:
            async with asyncio.timeout(timeout_s if timeout_s is not None else self.timeout_s):
                if not peer.writable.is_set():
                    await peer.writable.wait()
                return await future
        except TimeoutError:
            raise ShardUnavailableError(shard, f"no answer to {kind!r} in time") from None
        finally:
            peer.pending.pop(rid, None)

    def call_soon(self, shard: int, kind: str, reply: Reply, *args: Any) -> None:
        """Send a request now (if connected: else once connected) and call reply(ok, value) as
        its answer is read; a peer that is gone, not answering or too slow (the channel's
        timeout) answers ShardUnavailableError."""
        peer = self._peers[shard]
        try:
            self._check_usable(peer)
        except ShardUnavailableError as exc:
            _call_back(reply, False, exc)
            return
        if not peer.connected:
            self._spawn(self._call_later(peer, kind, reply, args))
            return
        assert peer.transport is not None
        rid = next(self._ids)
        peer.pending[rid] = reply
        peer.deadlines.append((time.monotonic() + self.timeout_s, rid))
        _send(peer.transport, (rid, kind, args))

    def sweep(self) -> None:
        """Fail the requests that can no longer be answered in time: all of a peer that is not
        answering (the table's word), and any past its deadline. Run with each heartbeat."""
        now = time.monotonic()
        for peer in self._peers.values():
            if not peer.pending:
                peer.deadlines.clear()
                continue
            why = self.table.unavailable(peer.shard) if self.table is not None else None
            if why is not None:
                peer.deadlines.clear()
                self._fail(peer, why)
                continue
            deadlines, pending = peer.deadlines, peer.pending
            while deadlines:  # answers come in order, mostly: the answered go from the front
                deadline, rid = deadlines[0]
                if rid in pending and deadline > now:
                    break
                deadlines.popleft()
                waiter = pending.pop(rid, None)
                if waiter is not None and not isinstance(waiter, asyncio.Future):
                    _call_back(waiter, False, ShardUnavailableError(peer.shard, "no answer in time"))

    async def _call_later(self, peer: _Peer, kind: str, reply: Reply, args: tuple) -> None:
        try:
            await self._connected(peer)
        except ShardUnavailableError as exc:
            _call_back(reply, False, exc)
            return
        self.call_soon(peer.shard, kind, reply, *args)

    def note(self, shard: int, kind: str, *args: Any) -> None:
        """Send without waiting for an answer (a wake-up); lost if the peer is not connected
        yet (the next note or the reader's own timeout covers it)."""
        peer = self._peers[shard]
        if not peer.connected:
            self._spawn(self._note_later(peer, kind, args))
            return
        assert peer.transport is not None
        _send(peer.transport, (0, kind, args))

    async def _note_later(self, peer: _Peer, kind: str, args: tuple) -> None:
        try:
            transport = await self._connected(peer)
        except ShardUnavailableError:
            return
        _send(transport, (0, kind, args))

    def _fail(self, peer: _Peer, why: str) -> None:
        pending, peer.pending = peer.pending, {}
        for waiter in pending.values():
            error = ShardUnavailableError(peer.shard, why)
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_exception(error)
            else:
                _call_back(waiter, False, error)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _call_back(reply: Reply, ok: bool, value: Any) -> None:
    try:
        reply(ok, value)
    except Exception:
        logger.exception("shard channel: reply callback failed")


def _send(transport: asyncio.WriteTransport, message: tuple) -> None:
    data = pickle.dumps(message, protocol=5)
    if len(data) < 65536:  # one write; a big one goes as it is rather than copied onto the head
        transport.write(FRAME.pack(len(data)) + data)
    else:
        transport.writelines((FRAME.pack(len(data)), data))
