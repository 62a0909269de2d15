"""Kafka's request and response framing, and the table of the APIs this listener serves.

Every message is read and written by `kio`, whose classes are generated from Kafka's own JSON
message schemas (clients/src/main/resources/common/message/); nothing here spells a message's
fields by hand. What this module adds is the framing Kafka puts around them:

    request   int32 size, then the request header (v1, or v2 with tagged fields when the API's
              version is flexible), then the request body
    response  int32 size, then the response header (v0, or v1 when flexible; ApiVersions
              answers with v0 always, so a client that does not know our versions can read it),
              then the response body

An API is served when a module registers a handler for it with `@serves(...)`. ApiVersions
advertises exactly the registered APIs and versions (what is not served is not advertised); a
request for any other API or version closes the connection, as Kafka's broker does when it
cannot parse a request, except ApiVersions itself, which answers UNSUPPORTED_VERSION in v0 so
the client can retry with a version we have.

Versions: kio's schemas are Kafka 4's, which dropped the oldest versions of several APIs
(Produce below v3, Fetch below v4, ...); every client this project tests sends newer ones.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

API_VERSIONS_KEY = 18
SIZE = struct.Struct(">i")
KEY_AND_VERSION = struct.Struct(">hhi")  # api key, api version, correlation id

Handler = Callable[[Any, Any], Awaitable[Any]]  # (Call, request) -> response, or None: no answer


@dataclass(frozen=True, slots=True)
class Api:
    """One served API: its key, name, the versions served, and the handler."""

    key: int
    name: str  # Kafka's name (ApiKeys), as metrics and the access log show it
    min_version: int
    max_version: int
    handler: Handler
    # the quota and right it needs are the handler's own business (topics differ per partition)
    # served in order: a connection's next request starts once this one is admitted (its
    # appends queued: broker/listener.py), so pipelined appends keep their order
    ordered: bool = False


APIS: dict[int, Api] = {}


def serves(
    key: int, name: str, min_version: int, max_version: int, *, ordered: bool = False
) -> Callable[[Handler], Handler]:
    """Register `handler` as the server of API `key`, versions min..max (both served by kio);
    `ordered`: see Api.ordered (the handler calls call.admit() once its effects are queued)."""

    def register(handler: Handler) -> Handler:
        if key in APIS:
            raise RuntimeError(f"API {key} ({name}) registered twice")
        for version in (min_version, max_version):
            load_request_schema(key, version)  # (raises if kio has no such version)
        APIS[key] = Api(key, name, min_version, max_version, handler, ordered)
        return handler

    return register


class BadRequest(Exception):
    """A request that cannot be parsed: the connection closes (Kafka's InvalidRequestException)."""


@dataclass(frozen=True, slots=True)
class Request:
    """A parsed request: header fields, the body entity, and the body's response class."""

    api: Api
    version: int
    correlation_id: int
    client_id: str | None
    body: Any
    flexible: bool


@cache
def _request_codec(key: int, version: int) -> tuple[Any, bool, Any]:
    cls = load_request_schema(key, version)
    return entity_reader(cls), bool(cls.__flexible__), cls


@cache
def response_class(key: int, version: int) -> Any:
    """kio's response class of API `key` at `version`."""
    return load_response_schema(key, version)


@cache
def _writer(cls: Any) -> Any:
    return entity_writer(cls)


_HEADER_V1 = entity_reader(RequestHeaderV1)
_HEADER_V2 = entity_reader(RequestHeaderV2)


def peek(frame: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request frame, before it is parsed."""
    if len(frame) < KEY_AND_VERSION.size:
        raise BadRequest(f"a request of {len(frame)} bytes has no header")
    return KEY_AND_VERSION.unpack_from(frame, 0)


def parse(frame: bytes | bytearray | memoryview) -> Request:
    """The request in `frame` (without its size prefix). Raises BadRequest for an API or
    version not served, or bytes that do not parse."""
    key, version, correlation_id = peek(frame)
    api = APIS.get(key)
    if api is None or not api.min_version <= version <= api.max_version:
        raise BadRequest(f"API {key} version {version} is not served")
    reader, flexible, _cls = _request_codec(key, version)
    try:
        header, size = (_HEADER_V2 if flexible else _HEADER_V1)(frame, 0)
        body, _ = reader(frame, size)
    except Exception as exc:  # kio raises several kinds for malformed input
        raise BadRequest(f"{api.name} v{version}: {exc}") from exc
    # Bytes after the body are ignored, as Kafka's request parsing ignores them (it reads the
    # fields and never asks for the end): librdkafka since 2.x sends Metadata v9+ for all
    # topics with the 4-byte placeholder of the topics' count, of which the first is the
    # compact null and the other 3 trail (librdkafka#5049), so refusing them would close every
    # AdminClient's list_topics connection.
    return Request(api, version, correlation_id, header.client_id, body, flexible)


def encode_response(
    key: int, version: int, correlation_id: int, body: Any, flexible: bool
) -> memoryview:
    """The framed response: size, header (v1 when flexible, but v0 for ApiVersions), body; a
    view of the buffer it was written in (a Fetch answer's record bytes are copied once, into
    it, and not again before the socket)."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    if flexible and key != API_VERSIONS_KEY:
        _writer(ResponseHeaderV1)(out, ResponseHeaderV1(correlation_id=correlation_id))
    else:
        _writer(ResponseHeaderV0)(out, ResponseHeaderV0(correlation_id=correlation_id))
    _writer(type(body))(out, body)
    data = out.getbuffer()
    SIZE.pack_into(data, 0, len(data) - 4)
    return data


# -- building responses across versions --------------------------------------------------------
#
# kio has one class per version of each message; a field exists in some versions only. A
# handler names every field it knows, and make() keeps those the version has, so one handler
# serves every version (as Kafka's own *ResponseData builders ignore fields a version lacks).


@cache
def _fields(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def make(cls: Any, **values: Any) -> Any:
    """An instance of kio class `cls` from the `values` its version has."""
    names = _fields(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def has(cls: Any, name: str) -> bool:
    """Whether `cls` (this version) has the field `name`."""
    return name in _fields(cls)


def nested(cls: Any, name: str) -> Any:
    """The class `name` of the same schema module and version as `cls` (a response's parts)."""
    return getattr(sys.modules[cls.__module__], name)


def ms(n: int) -> datetime.timedelta:
    """A duration field (kio's timedelta_i32) of `n` milliseconds."""
    return datetime.timedelta(milliseconds=n)


NO_THROTTLE = datetime.timedelta(0)
