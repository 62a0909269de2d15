"""The shard family's shared state: who owns a partition, the partition table in shared
memory, and the channel between shards.

eventlog serve --processes N runs N shard processes over one data dir (DESIGN.md, "Using
every core"). Every partition has one owner shard (owner_of), its single writer. The others
read its files directly and learn how far they may read from the partition table: a file in
the family's private run dir, mapped by every shard, holding per partition its high
watermark, log start offset, active segment (base offset, readable end) and a generation
that moves whenever its segment list changes. Wake-ups, forwarded appends and everything
else that needs the owner travel over the channel: one Unix socket per shard, frames of
pickled tuples, batches as bytes.

Partition table layout (little-endian; a file of HEADER_BYTES + count * REGION_SLOTS * 64):

    shard header, 64 bytes per shard (up to MAX_SHARDS):  u64 state, u64 pid, 48 bytes unused
        state: 0 starting, 1 loaded (its partitions take requests), 2 serving
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
from .metadata import INTERNAL_TOPICS

logger = logging.getLogger("eventlog.engine")

MAX_SHARDS = 256
HEADER_BYTES = MAX_SHARDS * 64
REGION_SLOTS = 16_384
SLOT = struct.Struct("<QQqqQqqQ")
SLOT_BYTES = 64
SHARD_HEADER = struct.Struct("<QQ")

LIVE = 1
DELETED = 2
CHANGING = 4  # the owner is renaming segment files: keep reading the previous list

STARTING, LOADED, SERVING = 0, 1, 2
READ_PATIENCE_S = 2.0  # a slot half written this long: its owner died mid-write


def owner_of(topic: str, partition: int, count: int) -> int:
    """The shard that owns (topic, partition) in a family of `count`: internal topics live on
    shard 0 (it writes the metadata log and holds the group offsets); a user topic's
    partitions go round the shards from a place its name picks, so a topic's partitions
    spread evenly whatever their number."""
    if count <= 1 or topic in INTERNAL_TOPICS:
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
        raise EngineError(f"the partition table of shard {shard} is full ({REGION_SLOTS} partitions)")

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


def socket_path(run_dir: Path, shard: int) -> Path:
    return run_dir / f"shard-{shard}.sock"


class _Peer:
    """One outgoing connection to another shard, with its requests in flight."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.writer: asyncio.StreamWriter | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.connecting: asyncio.Lock = asyncio.Lock()
        self.reader_task: asyncio.Task | None = None
        self.broken = False
        # a peer whose connection broke has died (a Unix socket does not drop a live peer): its
        # calls fail at once until the supervisor's new family replaces every shard
        self.dead = False


class ShardChannel:
    """Requests and one-way notes between the shards of a family, over Unix sockets.

    call(shard, kind, *args) runs the (async) handler registered for `kind` on that shard and
    returns its result (or raises its error: engine errors pickle). note(shard, kind, *args)
    sends without waiting; a note's handler is a plain function, run as the note is read. A peer that goes away fails its calls in flight with
    ShardUnavailableError (503 `unavailable`); its supervisor restarts the family.
    """

    def __init__(self, run_dir: Path, index: int, count: int) -> None:
        self.run_dir = run_dir
        self.index = index
        self.count = count
        self.handlers: dict[str, Handler] = {}
        self._peers = {i: _Peer(i) for i in range(count) if i != index}
        self._ids = itertools.count(1)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.closing = False

    async def start(self) -> None:
        path = socket_path(self.run_dir, self.index)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        self._server = await asyncio.start_unix_server(self._serve, path=str(path), limit=1 << 20)

    async def close(self) -> None:
        self.closing = True
        if self._server is not None:
            self._server.close()
        for peer in self._peers.values():
            if peer.writer is not None:
                peer.writer.close()
            self._fail(peer, "shutting down")
        for task in list(self._tasks):
            task.cancel()

    # -- calling ------------------------------------------------------------------------------

    async def _connected(self, peer: _Peer) -> asyncio.StreamWriter:
        if peer.writer is not None and not peer.broken:
            return peer.writer
        async with peer.connecting:
            if peer.writer is not None and not peer.broken:
                return peer.writer
            if self.closing:
                raise ShardUnavailableError(peer.shard, "shutting down")
            if peer.dead:
                raise ShardUnavailableError(peer.shard, "it exited; the family is restarting")
            path = str(socket_path(self.run_dir, peer.shard))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while True:
                try:
                    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
                    break
                except (FileNotFoundError, ConnectionRefusedError) as exc:
                    if loop.time() > deadline:
                        raise ShardUnavailableError(peer.shard, f"cannot connect: {exc}") from None
                    await asyncio.sleep(0.02)
            peer.writer = writer
            peer.broken = False
            peer.reader_task = asyncio.create_task(self._read_replies(peer, reader))
            return writer

    async def call(self, shard: int, kind: str, *args: Any) -> Any:
        peer = self._peers[shard]
        writer = await self._connected(peer)
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        peer.pending[rid] = future
        _send(writer, (rid, kind, args))
        if writer.transport.get_write_buffer_size() > 1 << 20:
            await writer.drain()
        try:
            return await future
        finally:
            peer.pending.pop(rid, None)

    def note(self, shard: int, kind: str, *args: Any) -> None:
        """Send without waiting for an answer (a wake-up); lost if the peer is not connected
        yet (the next note or the reader's own timeout covers it)."""
        peer = self._peers[shard]
        if peer.writer is None or peer.broken:
            task = asyncio.create_task(self._note_later(peer, kind, args))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        _send(peer.writer, (0, kind, args))

    async def _note_later(self, peer: _Peer, kind: str, args: tuple) -> None:
        try:
            writer = await self._connected(peer)
        except ShardUnavailableError:
            return
        _send(writer, (0, kind, args))

    async def _read_replies(self, peer: _Peer, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                rid, ok, value = await _receive(reader)
                future = peer.pending.pop(rid, None)
                if future is None or future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("shard channel to shard %d: bad reply", peer.shard)
        peer.broken = True
        peer.dead = True
        if peer.writer is not None:
            peer.writer.close()
        self._fail(peer, "connection lost")

    def _fail(self, peer: _Peer, why: str) -> None:
        for future in peer.pending.values():
            if not future.done():
                future.set_exception(ShardUnavailableError(peer.shard, why))
        peer.pending.clear()

    # -- serving ------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                rid, kind, args = await _receive(reader)
                handler = self.handlers.get(kind)
                if rid == 0:  # a note: its handler is a plain function, run here (no task each)
                    if handler is not None:
                        try:
                            handler(*args)
                        except Exception:
                            logger.exception("shard note %s failed", kind)
                    continue
                self._spawn(self._answer(writer, rid, kind, handler, args))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, asyncio.CancelledError):
            pass  # the peer went away, or this shard is closing
        finally:
            writer.close()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, writer: asyncio.StreamWriter, rid: int, kind: str, handler: Handler | None, args: tuple) -> None:
        try:
            if handler is None:
                raise EngineError(f"shard {self.index} has no handler for {kind!r}")
            reply = (rid, True, await handler(*args))
        except asyncio.CancelledError:
            reply = (rid, False, ShardUnavailableError(self.index, "shutting down"))
        except Exception as exc:
            reply = (rid, False, exc)
        if writer.is_closing():
            return
        try:
            _send(writer, reply)
        except Exception as exc:
            logger.exception("shard call %s: answer does not pickle", kind)
            _send(writer, (rid, False, EngineError(f"{kind}: {type(exc).__name__}: {exc}")))


def _send(writer: asyncio.StreamWriter, message: tuple) -> None:
    data = pickle.dumps(message, protocol=5)
    if len(data) < 65536:  # one write; a big one goes as it is rather than copied onto the head
        writer.write(FRAME.pack(len(data)) + data)
    else:
        writer.writelines((FRAME.pack(len(data)), data))


async def _receive(reader: asyncio.StreamReader) -> Any:
    head = await reader.readexactly(4)
    (size,) = FRAME.unpack(head)
    return pickle.loads(await reader.readexactly(size))
