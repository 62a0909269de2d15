"""The Kafka listener: one per server process (shard i of a family listens on port + i and is
broker i), serving Kafka's wire protocol beside HTTP on the same engine.

A connection is served as Kafka's broker serves one: a request is read, handled and answered
before the next is read (Kafka mutes a channel while its request is in flight), so answers
leave in the order their requests came, and a client's pipelined requests (librdkafka's
max.in.flight) wait in the socket's buffer. Many connections are served at once; their
appends meet in the engine's group commits.

The request policy is api/policy.py's, the same object the HTTP routes use (one policy per
concern): the request size limit (a frame above max_request_bytes closes the connection, as
Kafka's socket.request.max.bytes does), authentication (SASL/PLAIN, the token as the password),
rights (check_access per topic and group), quotas (bytes counted per principal; over its quota
a response carries throttle_time_ms and the connection is muted for that long, as Kafka does,
KIP-219), the engine's state, metrics by API and the access log (Policy.observe_call).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from api.auth import ANONYMOUS_ADMIN, Principal
from engine.errors import EngineError
from engine.shards import owner_of

from . import protocol
from .protocol import API_VERSIONS_KEY, SIZE, BadRequest

if TYPE_CHECKING:
    from api.policy import Policy
    from engine.interface import Engine

    from .coordinator import GroupCoordinator

logger = logging.getLogger("eventlog.kafka")

Buffer = bytes | memoryview  # a framed answer
SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
SASL_KEYS = (SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY)
IDLE_TIMEOUT_S = 600.0  # Kafka's connections.max.idle.ms
CLOSE_GRACE_S = 5.0  # at shutdown: how long a request in progress may finish


@dataclass
class Broker:
    """What every handler of one process needs: who this broker is among the family, the app's
    state (its engine, policy, coordinator) and the advertised address of every broker."""

    state: Any  # the app's state: engine, policy, settings
    node_id: int
    count: int  # brokers (shards) in the family
    host: str  # advertised host
    port: int  # broker 0's port; broker i listens on port + i
    cluster_id: str
    coordinator: GroupCoordinator | None = None  # on the coordinator shard
    producer_ids: Any = None  # broker/produce.py's ProducerIds

    @property
    def policy(self) -> Policy:
        return self.state.policy

    @property
    def engine(self) -> Engine:
        """The engine; LogClosedError while starting or stopping (policy.engine)."""
        return self.state.policy.engine()

    def leader_of(self, topic: str, partition: int) -> int:
        """The broker that writes (topic, partition): its owner shard."""
        return owner_of(topic, partition, self.count) if self.count > 1 else 0

    def brokers(self) -> list[tuple[int, str, int]]:
        """(node id, host, port) of every broker of the family."""
        return [(i, self.host, self.port + i) for i in range(self.count)]

    @property
    def coordinator_id(self) -> int:
        """The broker that coordinates every group: the one holding __consumer_offsets (shard
        0; the group offsets live there, engine/family.py)."""
        return 0


@dataclass
class Connection:
    """One client connection's state: its principal once authenticated."""

    peer: Any
    principal: Principal = ANONYMOUS_ADMIN
    authenticated: bool = False
    mechanism: str | None = None  # chosen by SaslHandshake
    raw_sasl: bool = False  # after SaslHandshake v0: the next frame is the bare SASL message


@dataclass
class Call:
    """One request as its handler sees it."""

    broker: Broker
    connection: Connection
    api_key: int
    version: int
    client_id: str | None
    api_name: str = ""
    throttle_ms: int = 0  # set by a handler over a quota: the response carries it, then the mute
    sent: int = 0  # record bytes answered (fetch), for the access log
    error: int = 0  # the request's overall error (the access log's status)
    close: bool = False  # close the connection once the response is written (a failed SASL)
    notes: dict[str, Any] = field(default_factory=dict)
    # for an API served in order (Produce): resolved once the request's effects have their
    # place (its appends queued); the connection's next request is started only then
    admitted: asyncio.Future[None] | None = None

    def admit(self) -> None:
        """The request's effects are in order: the connection may start its next request."""
        if self.admitted is not None and not self.admitted.done():
            self.admitted.set_result(None)

    @property
    def principal(self) -> Principal:
        return self.connection.principal

    @property
    def response(self) -> Any:
        """kio's response class for this request's API and version."""
        return protocol.response_class(self.api_key, self.version)


class KafkaListener:
    """Accepts Kafka connections on one socket and serves them until closed."""

    def __init__(self, broker: Broker, sock: socket.socket) -> None:
        self.broker = broker
        self.sock = sock
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._states: dict[asyncio.Task[None], _ConnectionState] = {}
        self._closing = False  # no new requests are read

    async def start(self) -> None:
        from . import apis  # noqa: F401  (registers every handler)

        self._server = await asyncio.start_server(self._serve, sock=self.sock, limit=1 << 16)

    async def close(self) -> None:
        """Stop accepting and reading requests; let those in service finish (CLOSE_GRACE_S),
        then close every connection; the group coordinator answers its parked JoinGroups and
        SyncGroups (NOT_COORDINATOR)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        if self.broker.coordinator is not None:
            self.broker.coordinator.close()
        busy = [state.idle.wait() for state in self._states.values() if state.in_flight]
        if busy:
            await asyncio.wait([asyncio.ensure_future(b) for b in busy], timeout=CLOSE_GRACE_S)
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        connection = Connection(writer.get_extra_info("peername"))
        policy = self.broker.policy
        if policy.authenticator is None:
            connection.authenticated = True
        try:
            await self._requests(reader, writer, connection)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        except BadRequest as exc:
            logger.info("kafka connection from %s closed: %s", _peer(connection.peer), exc)
        except asyncio.CancelledError:
            raise
        except Exception:  # a handler's bug: this connection closes, the others go on
            peer = _peer(connection.peer)
            logger.exception("kafka connection from %s closed: request failed", peer)
        finally:
            self._connections.discard(task)
            writer.close()

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: Connection
    ) -> None:
        """Read requests and answer them in order, up to MAX_IN_FLIGHT of them in service at
        once: a client's pipelined requests (librdkafka keeps 5 Produce requests in flight per
        connection) share the group commits their appends meet, instead of one fsync each in
        turn. An API served in order (Produce) starts the next request only once its own
        appends are queued (Call.admitted), so a connection's appends to a partition keep the
        order they were sent in (an idempotent producer's sequences). Until SASL is done,
        requests are served one at a time."""
        state = _ConnectionState()
        answers: asyncio.Queue[_InFlight] = asyncio.Queue(MAX_IN_FLIGHT)
        reading = asyncio.ensure_future(self._read(reader, connection, answers, state))
        writing = asyncio.ensure_future(self._write(writer, connection, answers, state))
        self._states[asyncio.current_task()] = state  # type: ignore[index]
        try:
            await asyncio.wait({reading, writing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reading, writing):
                task.cancel()
            await asyncio.wait({reading, writing})
            self._states.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
        for task in (writing, reading):  # the writer's error first: it is the request's
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _read(
        self, reader: asyncio.StreamReader, connection: Connection,
        answers: asyncio.Queue[_InFlight], state: _ConnectionState,
    ) -> None:
        policy = self.broker.policy
        limit = policy.max_request_bytes
        loop = asyncio.get_running_loop()
        while not self._closing:
            mute = state.mute_until - loop.time()
            if mute > 0:  # muted, as Kafka mutes a throttled channel
                await asyncio.sleep(mute)
            async with asyncio.timeout(IDLE_TIMEOUT_S):
                head = await reader.readexactly(4)
            (size,) = SIZE.unpack(head)
            if size <= 0 or size > limit:
                raise BadRequest(
                    f"a request of {size} bytes (the limit is {limit}, max_request_bytes)"
                )
            while state.in_flight and state.bytes + size > limit:
                # requests in service hold at most max_request_bytes of a connection's memory
                # (as one request may): the next waits for room
                await state.room()
            async with asyncio.timeout(policy.timeout_s):
                frame = await reader.readexactly(size)
            started = time.perf_counter()
            call, answer = self._start(frame, connection)
            state.begin(size)
            await answers.put(_InFlight(started, call, answer))
            waits: set[asyncio.Future[Any]] = {answer}
            if isinstance(call, Call) and call.admitted is not None:
                waits.add(call.admitted)
            elif (
                connection.authenticated
                and not connection.raw_sasl
                and getattr(call, "api_key", None) not in SASL_KEYS
            ):
                continue  # (a SASL request changes how the next frame is read: it waits)
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)

    async def _write(
        self, writer: asyncio.StreamWriter, connection: Connection,
        answers: asyncio.Queue[_InFlight], state: _ConnectionState,
    ) -> None:
        policy = self.broker.policy
        loop = asyncio.get_running_loop()
        while True:
            item = await answers.get()
            call = item.call
            try:
                answer = await item.answer
                if answer is not None:
                    writer.write(answer)
                    await writer.drain()
            finally:
                state.end()
            policy.observe_kafka(
                call.api_name, call.version, call.error, item.started, call.sent, connection.peer,
                connection.principal.name,
            )
            if call.close:
                return
            if call.throttle_ms > 0:
                state.mute_until = max(state.mute_until, loop.time() + call.throttle_ms / 1000)

    def _start(self, frame: bytes, connection: Connection) -> tuple[Any, asyncio.Future[Any]]:
        """The request in `frame` parsed, its handler started: (its Call, the future of its
        framed answer, None for none). Raises BadRequest for a request that does not parse."""
        loop = asyncio.get_running_loop()
        if connection.raw_sasl:
            call, answer = self._raw_sasl(frame, connection)
            return call, _done(loop, answer)
        key, version, correlation_id = protocol.peek(frame)
        if key == API_VERSIONS_KEY and key in protocol.APIS:
            api = protocol.APIS[key]
            if not api.min_version <= version <= api.max_version:
                refused = _Unparsed("ApiVersions", version, ErrorCode.unsupported_version)
                return refused, _done(loop, unsupported(correlation_id))
        request = protocol.parse(frame)
        if not connection.authenticated and key not in (
            API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY,
        ):
            raise BadRequest(f"{request.api.name} before SASL authentication")
        call = Call(self.broker, connection, key, version, request.client_id, request.api.name)
        if request.api.ordered:
            call.admitted = loop.create_future()
        task = asyncio.ensure_future(self._handle(call, request, correlation_id))
        task.add_done_callback(_retrieve)
        return call, task

    async def _handle(
        self, call: Call, request: protocol.Request, correlation_id: int
    ) -> Buffer | None:
        try:
            response = await request.api.handler(call, request.body)
        finally:
            call.admit()
        if response is None:
            return None
        return protocol.encode_response(
            call.api_key, call.version, correlation_id, response, request.flexible
        )

    def _raw_sasl(self, message: bytes, connection: Connection) -> tuple[Any, bytes | None]:
        """KIP-43's flow, after SaslHandshake v0: the frame is the PLAIN message itself, with
        no Kafka header; success is answered with an empty frame (PLAIN has no challenge), a
        failure closes the connection (that flow has no error to send), as Kafka does."""
        from .sasl import authenticate_plain

        connection.raw_sasl = False
        code, why = authenticate_plain(self.broker.policy, connection, message)
        call = _Unparsed("SaslAuthenticate", 0, code, close=code != ErrorCode.none)
        if code != ErrorCode.none:
            logger.info(
                "kafka connection from %s: SASL/PLAIN after SaslHandshake v0 failed: %s",
                _peer(connection.peer), why,
            )
            return call, None
        return call, SIZE.pack(0)


MAX_IN_FLIGHT = 16  # requests of one connection in service at once (librdkafka sends up to 5)


class _ConnectionState:
    """What a connection's reader and writer share: requests in service, the mute's end."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.bytes = 0  # of the requests in service
        self.sizes: collections.deque[int] = collections.deque()
        self.idle = asyncio.Event()
        self.idle.set()
        self.ended = asyncio.Event()  # set when a request leaves service
        self.mute_until = 0.0  # loop time: no request is read before it (a quota's throttle)

    def begin(self, size: int) -> None:
        self.in_flight += 1
        self.bytes += size
        self.sizes.append(size)
        self.idle.clear()

    def end(self) -> None:
        self.in_flight -= 1
        self.bytes -= self.sizes.popleft()  # (answered in the order they began)
        self.ended.set()
        if not self.in_flight:
            self.idle.set()

    async def room(self) -> None:
        """Until a request leaves service."""
        self.ended.clear()
        await self.ended.wait()


@dataclass(frozen=True, slots=True)
class _InFlight:
    started: float  # perf_counter when its bytes were in
    call: Any  # Call, or _Unparsed
    answer: asyncio.Future[Buffer | None]


def _done(
    loop: asyncio.AbstractEventLoop, answer: Buffer | None
) -> asyncio.Future[Buffer | None]:
    future: asyncio.Future[Buffer | None] = loop.create_future()
    future.set_result(answer)
    return future


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Marks a handler's error as seen: the writer raises it when it comes to the request; one
    whose connection closed before is of no one's concern (its client is gone)."""
    if not task.cancelled():
        task.exception()


@dataclass
class _Unparsed:
    """The access log's view of a request answered before it was parsed."""

    api_name: str
    version: int
    error: int
    throttle_ms: int = 0
    sent: int = 0
    close: bool = False


def unsupported(correlation_id: int) -> Buffer:
    """ApiVersions v0's UNSUPPORTED_VERSION answer, with the versions we serve: the client
    retries with one of them (KIP-511)."""
    from .cluster import api_versions_body

    body = api_versions_body(0, ErrorCode.unsupported_version)
    return protocol.encode_response(API_VERSIONS_KEY, 0, correlation_id, body, False)


def _peer(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


class KafkaListenError(EngineError):
    """The Kafka port cannot be listened on (in use, or not allowed): the server does not start."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        super().__init__(
            f"cannot listen for Kafka clients on {host}:{port}: {error.strerror or error} "
            "(EVENTLOG_KAFKA_PORT sets another port; 0 turns the Kafka listener off)"
        )


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening socket on host:port (SO_REUSEADDR, so a restarted shard binds again at once)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
