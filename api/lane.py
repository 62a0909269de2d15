"""The hot lane: produce requests, partition event streams and queue leases and settles served
in one pass, ahead of FastAPI's router.

A one-record produce spent most of its event-loop time in layers, not in the append: ASGI
middlewares each wrapping receive and send in a closure, then Starlette's router and FastAPI's
dependency solving (docs/PERFORMANCE.md, issue 13). The lane takes the two produce routes, the
per-key append and the partition stream before the router and parses them by hand; everything
else is the request policy's (api/policy.py), the same object, with the same Rules, that wraps
the documented routes:

    1. Policy.admit: the declared size (400, 413), the bearer token (401), the produce or fetch
       quota (429 before the body is read), the engine open (503), the right to write or read
       the topic (403); then, the lane's own, the partition known (404, before the body);
    2. Policy.body: the body within request_timeout_ms (408) and max_request_bytes (413), its
       bytes counted against the quota (Policy.account);
    3. the produce itself (api/records.py, engine/produce.py), its answer or its problem+json
       (Policy.problem: api/errors.problem_for, the exception handlers' mapping);
    4. Policy.observe: metrics by route template, the access line; the in-flight gauge.

An event stream goes the same way: admit, then api/sse.py's core (the one the documented stream
routes use) with PartitionEvents: one coroutine per subscriber waiting on the partition's data
event, parked with the partition's pusher once caught up (api/tail.py), and a second, idle
until the client leaves, that ends it.

A queue's lease, ack, release, reject and renew (api/queues.py) go the same way: admit (the
right to consume the topic, 401/403; a lease under the fetch quota, 429; the engine open), the
body, then the engine's call and its answer written by the functions the routes use
(queues.lease_answer, queues.settle_answer); a lease's answer bytes count against the fetch
quota, as the routes' do. The body is taken when the call's own model (LeaseRequest, LeasesRequest
and its kin) validates what orjson parsed; any other body (not JSON, another content type, a
field against its rules) goes on to the documented route with the bytes already read, which
answers it as FastAPI does (400, 422), under the policy again: the lane then neither counts nor
observes it.

A request the lane does not take whole goes on to the router, where the documented routes
answer it under the same policy (their OpenAPI document is unchanged): another method, a
partition that is not plain decimal digits (FastAPI's 422), a lease's key_format or
value_format that is not a format, a path that is not one of these.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.datastructures import QueryParams
from starlette.types import Message, Receive, Scope, Send

from engine.interface import Engine
from engine.produce import ProduceService

from . import keys, queues, records, sse
from .auth import ANONYMOUS_ADMIN
from .conditions import key_condition
from .errors import ServerPaths
from .keys import key_answer, path_key
from .policy import Disconnected, Policy, Rule, first_headers, length_and_authorization
from .quotas import FETCH, PRODUCE
from .records import (
    REPLAYED_HEADER,
    _offsets_body,
    _plain_int,
    check_json_body,
    produce_service,
    produce_to_partition_body,
    stream_start,
)
from .responses import PartsResponse
from .schemas import Format, LeaseRequest

logger = logging.getLogger("eventlog.api")

TOPIC_ROUTE = "/v1/topics/{topic}/records"
PARTITION_ROUTE = "/v1/topics/{topic}/partitions/{partition}/records"
STREAM_ROUTE = PARTITION_ROUTE + "/stream"
KEY_ROUTE = "/v1/topics/{topic}/keys/{key:path}/records"  # the template FastAPI's route has
QUEUE_ROUTE = "/v1/topics/{topic}/queues/{queue}/"  # + lease, ack, release, reject, renew
QUEUE_CALLS = ("lease", *queues.SETTLE_BODIES)
_QUEUE_HEADERS = (b"content-length", b"content-type", b"authorization")
_FORMATS = frozenset(f.value for f in Format)
_PREFIX = "/v1/topics/"
_JSON_HEADERS = [(b"content-type", b"application/json")]
_REPLAYED = (REPLAYED_HEADER.lower().encode(), b"true")


class HotLane:
    """Serves the produce routes of `app` (a FastAPI app built by app.main.create_app)."""

    def __init__(self, app: Any, policy: Policy, *, max_inflated_bytes: int) -> None:
        self.state = app.state
        self.policy = policy
        self.metrics = policy.metrics
        self.max_inflated_bytes = max_inflated_bytes
        # the documented routes' own Rules (what they declare), read once
        wanted = {(TOPIC_ROUTE, "POST"), (PARTITION_ROUTE, "POST"), (KEY_ROUTE, "POST"), (STREAM_ROUTE, "GET")}
        wanted |= {(QUEUE_ROUTE + call, "POST") for call in QUEUE_CALLS}
        self.rules: dict[str, Rule] = {
            route.path: Policy.rule(route)
            for route in (*records.router.routes, *keys.router.routes, *queues.router.routes)
            if any((route.path, m) in wanted for m in route.methods)
        }
        self.app = app

    def match(self, scope: Scope) -> tuple[Any, tuple[Any, ...]] | None:
        """(handler, its arguments) for a request the lane takes; None for the stack."""
        method = scope["method"]
        path: str = scope["path"]
        if not path.startswith(_PREFIX) or method not in ("POST", "GET"):
            return None
        parts = path[len(_PREFIX):].split("/")
        n = len(parts)
        if method == "POST":
            if n == 2:
                if parts[1] == "records" and parts[0]:
                    return self.serve, (parts[0], None)
            elif n >= 4 and parts[1] == "keys" and parts[-1] == "records" and parts[0]:
                key_format = _key_format(scope.get("query_string", b""))
                if key_format is not None:
                    return self.serve, (parts[0], None, "/".join(parts[2:-1]), key_format)
            elif n == 4 and parts[1] == "partitions" and parts[3] == "records" and parts[0]:
                partition = _plain_int(parts[2], 0, None)
                if partition is not None:
                    return self.serve, (parts[0], partition)
            elif n == 4 and parts[1] == "queues" and parts[3] in QUEUE_CALLS:
                if parts[0] and parts[2]:
                    return self._queue_args(scope, parts[0], parts[2], parts[3])
        elif n == 5 and parts[4] == "stream" and parts[3] == "records" and parts[1] == "partitions" and parts[0]:
            partition = _plain_int(parts[2], 0, None)
            if partition is not None:
                return self._stream_args(scope, parts[0], partition)
        return None

    def _stream_args(self, scope: Scope, topic: str, partition: int) -> tuple[Any, tuple[Any, ...]] | None:
        """The stream's parameters, when each reads as FastAPI would read it unconverted (see
        records._FastRoute); None leaves the request to the documented route."""
        offset = None
        kf = vf = "string"
        query = scope.get("query_string", b"")
        if query:
            given = QueryParams(query)
            text = given.get("offset")
            if text is not None:
                offset = _plain_int(text, 0, None)
                if offset is None:
                    return None
            kf = given.get("key_format", kf)
            vf = given.get("value_format", vf)
            if kf not in _FORMATS or vf not in _FORMATS:
                return None
        last_event_id = None
        for name, value in scope["headers"]:
            if name == b"last-event-id":
                text = value.decode("latin-1")
                last_event_id = -1 if text == "-1" else _plain_int(text, 0, None)
                if last_event_id is None:
                    return None
                break
        return self.stream, (topic, partition, offset, kf, vf, last_event_id)

    def _queue_args(
        self, scope: Scope, topic: str, queue: str, call: str
    ) -> tuple[Any, tuple[Any, ...]] | None:
        """A queue call's parameters: a lease's formats when each reads as FastAPI reads it (the
        settle routes read no query); None leaves the request to the documented route."""
        kf = vf = "string"
        query = scope.get("query_string", b"")
        if query and call == "lease":
            given = QueryParams(query)
            kf = given.get("key_format", kf)
            vf = given.get("value_format", vf)
            if kf not in _FORMATS or vf not in _FORMATS:
                return None
        return self.queue, (topic, queue, call, kf, vf)

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, topic: str, partition: int | None,
        key_text: str | None = None, key_format: str = "string",
    ) -> None:
        started = time.perf_counter()
        policy = self.policy
        metrics = self.metrics
        metrics.in_flight += 1
        route = KEY_ROUTE if key_text is not None else TOPIC_ROUTE if partition is None else PARTITION_ROUTE
        principal = ANONYMOUS_ADMIN
        quota_on = False
        received = [0]  # body bytes taken so far (Policy.body counts them), for the quota
        status = 500
        sent = 0
        try:
            length = content_type = authorization = idempotency_key = if_match = if_none_match = None
            for name, value in scope["headers"]:
                if name == b"content-length":
                    length = length or value
                elif name == b"content-type":
                    content_type = content_type or value
                elif name == b"authorization":
                    authorization = authorization or value
                elif name == b"idempotency-key":
                    idempotency_key = idempotency_key or value
                elif name == b"if-match":
                    if_match = if_match or value
                elif name == b"if-none-match":
                    if_none_match = if_none_match or value
            declared, principal, quota_on = policy.admit(
                self.rules[route], "POST", scope["path"], length, authorization, {"topic": topic}, scope.get("query_string", b""),
            )
            service = produce_service(self.state.engine)
            if key_text is not None:  # a per-key append (api/keys.py, append_key_records)
                status, sent = await self._append_key(
                    scope, receive, send, service, topic, key_text, key_format, declared, started, received, content_type,
                    principal.name, idempotency_key, if_match, if_none_match,
                )
                return
            if partition is not None:
                service.partition(topic, partition)  # before reading the body
            if partition is None:
                check_json_body(content_type.decode("latin-1") if content_type is not None else None)
            body = await policy.body(receive, declared, started, received)
            key = idempotency_key.decode("latin-1") if idempotency_key is not None else None
            if partition is None:
                parts, replayed = await service.produce_json(
                    topic, body, principal=principal.name, idempotency_key=key, answer=_offsets_body,
                )
                response = PartsResponse(parts, media_type="application/json", headers={REPLAYED_HEADER: "true"} if replayed else None)
                status = 200
                sent = int(response.headers["content-length"])
                await response(scope, receive, send)
                return
            payload, replayed = await produce_to_partition_body(
                service, topic, partition, content_type.decode("latin-1") if content_type is not None else "application/json",
                body, principal.name, key, if_match.decode("latin-1") if if_match is not None else None,
                self.max_inflated_bytes,
            )
            answer = orjson.dumps(payload)
            # the offset a follow-up conditional append expects (If-Match)
            headers = [*_JSON_HEADERS, (b"content-length", b"%d" % len(answer)), (b"etag", b'"%d"' % (payload["last_offset"] + 1))]
            if replayed:
                headers.append(_REPLAYED)
            status = 200
            sent = len(answer)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": answer})
        except Disconnected:
            status = 499  # nginx's "client closed request": nothing was answered, or written
        except Exception as exc:
            response = policy.problem(exc, scope)
            status = response.status_code
            sent = len(response.body)
            await response(scope, receive, send)
        finally:
            metrics.in_flight -= 1
            if quota_on and received[0]:
                policy.account(principal, PRODUCE, received[0])
            policy.observe(scope, route, status, started, sent, principal)

    async def queue(
        self, scope: Scope, receive: Receive, send: Send, topic: str, queue: str, call: str,
        kf: str, vf: str,
    ) -> None:
        """A queue's lease or settle call (api/queues.py's routes, their answers written by the
        same functions). A body the call's model does not take as it is (not JSON, another
        content type, a field missing its rules) goes on to the documented route, which answers
        it as FastAPI does (its 400 or 422), under the policy again."""
        started = time.perf_counter()
        policy = self.policy
        metrics = self.metrics
        metrics.in_flight += 1
        route = QUEUE_ROUTE + call
        principal = ANONYMOUS_ADMIN
        quota_on = False  # a lease's answer counts against the fetch quota (api/quotas.py)
        status = 500
        sent = 0
        handed_on: bytearray | None = None  # a body for the documented route
        try:
            length, content_type, authorization = first_headers(scope, _QUEUE_HEADERS)
            declared, principal, quota_on = policy.admit(
                self.rules[route], "POST", scope["path"], length, authorization,
                {"topic": topic, "queue": queue}, scope.get("query_string", b""),
            )
            body = await policy.body(receive, declared, started, [0])
            model = LeaseRequest if call == "lease" else queues.SETTLE_BODIES[call]
            given = _plain_body(model, content_type, body)
            if given is None:
                handed_on = body
            else:
                engine: Engine = self.state.engine  # open: admit checked it
                if call == "lease":
                    answer = await queues.lease_answer(
                        engine, metrics, topic, queue, given, kf, vf
                    )
                else:
                    answer = await queues.settle_answer(engine, topic, queue, call, given)
                status = 200
                sent = len(answer)
                headers = [(b"content-length", b"%d" % sent), *_JSON_HEADERS]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": answer})
        except Disconnected:
            status = 499
        except Exception as exc:
            response = policy.problem(exc, scope)
            status = response.status_code
            sent = len(response.body)
            await response(scope, receive, send)
        finally:
            metrics.in_flight -= 1
            if handed_on is None:
                if quota_on:
                    policy.account(principal, FETCH, sent)
                policy.observe(scope, route, status, started, sent, principal)
        if handed_on is not None:  # (the route counts and observes it, once)
            await self._route(scope, _replay(handed_on, receive), send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request through FastAPI's stack, where EventlogApp.__call__ sends what the lane
        does not take (not back to the lane)."""
        await FastAPI.__call__(self.app, scope, receive, send)

    async def _append_key(
        self, scope: Scope, receive: Receive, send: Send, service: ProduceService, topic: str, key_text: str, key_format: str,
        declared: int, started: float, received: list[int], content_type: bytes | None, principal: str,
        idempotency_key: bytes | None, if_match: bytes | None, if_none_match: bytes | None,
    ) -> tuple[int, int]:
        """What keys.append_key_records does, in the same order; (status, bytes sent)."""
        data = path_key(key_text, key_format)
        check_json_body(content_type.decode("latin-1") if content_type is not None else None)
        service.partition(topic, 0)  # the topic exists, and is not internal, before the body is read
        body = await self.policy.body(receive, declared, started, received)
        condition = key_condition(
            if_match.decode("latin-1") if if_match is not None else None,
            if_none_match.decode("latin-1") if if_none_match is not None else None,
        )
        done = await service.produce_key(
            topic, data, body, principal=principal,
            idempotency_key=idempotency_key.decode("latin-1") if idempotency_key is not None else None,
            condition=condition,
        )
        answer = key_answer(done)
        headers = [*_JSON_HEADERS, (b"content-length", b"%d" % len(answer)), (b"etag", b'"%d"' % done.offsets[-1])]
        if done.replayed:
            headers.append(_REPLAYED)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
        return 200, len(answer)

    async def stream(
        self, scope: Scope, receive: Receive, send: Send, topic: str, partition: int, offset: int | None, kf: str, vf: str,
        last_event_id: int | None,
    ) -> None:
        started = time.perf_counter()
        policy = self.policy
        metrics = self.metrics
        metrics.in_flight += 1
        principal = ANONYMOUS_ADMIN
        status = 500
        sent = 0
        try:
            try:
                length, authorization = length_and_authorization(scope)
                _declared, principal, quota_on = policy.admit(
                    self.rules[STREAM_ROUTE], "GET", scope["path"], length, authorization, {"topic": topic},
                    scope.get("query_string", b""),
                )
                engine: Engine = self.state.engine  # open: admit checked it
                log = engine.partition(topic, partition)
                offset = stream_start(log, offset, last_event_id)
            except Exception as exc:
                response = policy.problem(exc, scope)
                status = response.status_code
                sent = len(response.body)
                await response(scope, receive, send)
                return
            status = 200
            events = sse.PartitionEvents(engine, log, offset, kf, vf, metrics.fetched_records.labels(topic))
            stream = await sse.run(
                scope, receive, send, events, policy=policy, throttled=principal if quota_on else None,
                paths=ServerPaths.for_state(self.state),
            )
            sent = stream.sent
        finally:
            metrics.in_flight -= 1
            policy.observe(scope, STREAM_ROUTE, status, started, sent, principal)


def _key_format(query: bytes) -> str | None:
    """The key_format of a per-key append's query when it is all the query holds and names a
    format as FastAPI would read it (else None: the documented route answers)."""
    if not query:
        return "string"
    given = QueryParams(query)
    if set(given.keys()) != {"key_format"} or len(given.getlist("key_format")) != 1:
        return None
    value = given["key_format"]
    return value if value in _FORMATS else None


def _plain_body(model: type[BaseModel], content_type: bytes | None, body: bytearray) -> Any:
    """`body` as `model` where FastAPI's route would take it so: a JSON content type (or none),
    JSON (orjson's, RFC 8259's: whatever it parses, the json module parses alike), the model's
    validation of it passed; None for anything else (the route answers it)."""
    if content_type is not None and content_type != b"application/json":
        return None
    try:
        return model.model_validate(orjson.loads(body))
    except (orjson.JSONDecodeError, ValidationError):
        return None


def _replay(body: bytearray, receive: Receive) -> Receive:
    """`receive` for the route: the body already read, then the client's own messages."""
    pending = [{"type": "http.request", "body": bytes(body), "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
