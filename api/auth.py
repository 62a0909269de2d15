"""Bearer-token authentication and role/prefix authorization.

The auth file (EVENTLOG_AUTH_FILE) is JSON:

    {"tokens": [
      {"name": "ops",       "token": "…",                "role": "admin"},
      {"name": "billing",   "token_sha256": "<hex>",     "role": "producer", "topics": ["billing."]},
      {"name": "analytics", "token": "…",                "role": "consumer", "topics": ["billing.", "orders"],
                                                          "groups": ["analytics-"]}
    ]}

A token is given in clear ("token") or as the hex SHA-256 of it ("token_sha256", so the file
need not hold secrets). `topics` and `groups` are name prefixes; omitted means all. An
optional "quota": {"produce_bytes_per_sec": int, "fetch_bytes_per_sec": int} overrides the
server's default quotas for that token (api/quotas.py).

    role       may
    admin      everything, internal topics (__metadata, __consumer_offsets) and snapshots included
    producer   write (produce) and describe its topics; list the groups with offsets of its
               topics; monitor
    consumer   read (fetch, stream, offsets, segments) and describe its topics, commit and
               fetch offsets of its groups for its topics; monitor

A prefix never covers an internal topic (engine.metadata.INTERNAL_TOPICS): their records are
every group's offsets and every topic's metadata, so only an admin reads, describes, lists or sees metrics of them (group
offsets stay readable through /v1/groups, by group and topic prefix). Listings show only what
the prefixes cover: /v1/groups lists the groups a token's group prefixes cover that have
offsets committed on a topic its topic prefixes cover.

Every request but GET /healthz needs `Authorization: Bearer <token>` when the file is set:
401 `unauthorized` without a valid one, 403 `forbidden` when the role or the prefixes do not
cover the request: both checked by the request policy (api/policy.py) before a route's handler
runs, the right being the one the route declares with its require() dependency.
Without an auth file every request acts as an anonymous admin.

The file is reloaded while the server runs (AuthFileWatcher): a valid new version replaces the
whole token table at once, in the one Authenticator the request policy holds (api/policy.py); a
version that cannot be read or is invalid leaves the table as it was (and is logged), so a
mistake never locks everyone out nor opens the server. Requests already authenticated (an open
event stream, a long-poll) keep the principal they started with.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Awaitable, Callable

import aiofiles
import aiofiles.os
import anyio
import orjson
from anyio.abc import TaskStatus
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from engine.metadata import INTERNAL_TOPICS

from .errors import ApiError

logger = logging.getLogger("eventlog.auth")

ROLES = {
    "admin": frozenset({"admin", "write", "read", "describe", "group", "monitor"}),
    "producer": frozenset({"write", "describe", "monitor"}),
    "consumer": frozenset({"read", "describe", "group", "monitor"}),
}


@dataclass(frozen=True)
class Principal:
    name: str
    role: str
    topics: tuple[str, ...] = ("",)
    groups: tuple[str, ...] = ("",)
    # the token's own quotas (bytes/s); None: the server's default (api/quotas.py)
    produce_bytes_per_sec: int | None = None
    fetch_bytes_per_sec: int | None = None

    def may(self, action: str) -> bool:
        return action in ROLES[self.role]

    def covers_topic(self, topic: str) -> bool:
        """An admin covers every topic; any other role the user topics its prefixes cover
        (an empty prefix included), never an internal one."""
        if self.role == "admin":
            return True
        return topic not in INTERNAL_TOPICS and any(topic.startswith(p) for p in self.topics)

    def covers_group(self, group: str) -> bool:
        return self.role == "admin" or any(group.startswith(p) for p in self.groups)

    def allows(self, action: str, *, topic: str | None = None, group: str | None = None) -> bool:
        """Whether this principal may do `action` (on `topic`, on `group`): the one rule of
        rights, which HTTP's routes (check_access, Policy.authorize) and the Kafka listener
        (broker/) both ask."""
        return (
            self.may(action)
            and (topic is None or self.covers_topic(topic))
            and (group is None or self.covers_group(group))
        )


ANONYMOUS_ADMIN = Principal("anonymous", "admin")


class AuthConfigError(ValueError):
    """Raised when the auth file cannot be read or holds an invalid entry."""


class Authenticator:
    """Token -> principal, by SHA-256 digest (constant-time comparison). The table is replaced
    whole (replace()), never changed in place: a request sees the old table or the new one."""

    def __init__(self, principals: dict[bytes, Principal], source: bytes | None = None) -> None:
        self._by_digest = principals
        # the SHA-256 of the file's bytes the table came from (None: not from a file)
        self.source_sha256 = hashlib.sha256(source).digest() if source is not None else None

    @classmethod
    def from_file(cls, path: Path) -> Authenticator:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise AuthConfigError(f"auth file {path}: {exc}") from exc
        return cls(parse_auth_file(data, path), data)

    @property
    def token_count(self) -> int:
        return len(self._by_digest)

    def replace(self, principals: dict[bytes, Principal], source: bytes) -> None:
        """Use `principals` (parse_auth_file's) from now on; `source`: the bytes they came from."""
        self._by_digest = principals
        self.source_sha256 = hashlib.sha256(source).digest()

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal for an Authorization header; ApiError 401 if there is none."""
        if not authorization:
            raise _unauthorized("missing Authorization: Bearer <token>")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("expected Authorization: Bearer <token>")
        digest = hashlib.sha256(token.strip().encode()).digest()
        for known, principal in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                return principal
        raise _unauthorized("unknown token")


def parse_auth_file(data: bytes, path: Path) -> dict[bytes, Principal]:
    """The token table of an auth file's bytes (the format above), by token digest. Raises
    AuthConfigError, naming `path` and the offending entry, for anything invalid: no entry at
    all, an unknown role, a short token, bad hex, a token twice, a bad prefix list or quota."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise AuthConfigError(f"auth file {path}: {exc}") from exc
    entries = doc.get("tokens") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise AuthConfigError(f"auth file {path}: expected {{\"tokens\": [...]}} with at least one entry")
    principals: dict[bytes, Principal] = {}
    for i, entry in enumerate(entries):
        where = f"auth file {path}, tokens[{i}]"
        if not isinstance(entry, dict):
            raise AuthConfigError(f"{where}: expected an object")
        role = entry.get("role")
        if role not in ROLES:
            raise AuthConfigError(f"{where}: role must be one of {', '.join(ROLES)}")
        if "token" in entry and isinstance(entry["token"], str) and len(entry["token"]) >= 8:
            digest = hashlib.sha256(entry["token"].encode()).digest()
        elif isinstance(entry.get("token_sha256"), str):
            try:
                digest = bytes.fromhex(entry["token_sha256"])
            except ValueError:
                raise AuthConfigError(f"{where}: token_sha256 is not hex") from None
            if len(digest) != 32:
                raise AuthConfigError(f"{where}: token_sha256 must be 64 hex digits")
        else:
            raise AuthConfigError(f"{where}: needs \"token\" (at least 8 characters) or \"token_sha256\"")
        topics = _prefixes(entry.get("topics"), where, "topics")
        groups = _prefixes(entry.get("groups"), where, "groups")
        if digest in principals:
            raise AuthConfigError(f"{where}: the same token appears twice")
        quota = _quota(entry.get("quota"), where)
        principals[digest] = Principal(str(entry.get("name", f"token-{i}")), role, topics, groups, **quota)
    return principals


class AuthFileWatcher:
    """Reloads the auth file into its Authenticator while the server runs (run(), a lifespan
    task of each server process, every shard of a family its own).

    A check (check()): stat the file; when its (device, inode, size, mtime, ctime) differ from
    the last check's, or the last check could not use it, read it; when its bytes differ from
    those the table came from, parse it and replace the table. Both file operations go through
    aiofiles (a worker thread), never blocking the event loop. The outcomes:

        unchanged     nothing happens (a touch, or the same bytes written again)
        valid         the table is replaced whole; logged at info
        unusable      missing, unreadable, not JSON, or an invalid entry: the table stays as it
                      was; logged at error once per version of the file (the next checks read
                      it again, quietly, until it changes)

    run() checks once at once (a change made while the server started is not missed), then
    every `interval_ms`, and whenever request() asks (SIGHUP); interval_ms 0: only then.
    An editor that rewrites the file in place may be caught half-written: that version is
    unusable and the next check finds the whole one. Replacing the file by a rename is atomic.
    """

    def __init__(self, authenticator: Authenticator, path: Path, interval_ms: int) -> None:
        self.authenticator = authenticator
        self.path = path
        self.interval_ms = interval_ms
        self._seen: tuple[int, ...] | None = None  # the stat signature of the last usable check
        self._failed: bytes | None = None  # the digest of the last unusable version logged
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: anyio.Event | None = None

    def request(self) -> None:
        """Check now (from any thread, or a signal handler); ignored before run() started."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            loop.call_soon_threadsafe(wake.set)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = anyio.Event()
        task_status.started()
        interval_s = self.interval_ms / 1000 if self.interval_ms else math.inf
        while True:
            await self.check()
            with anyio.move_on_after(interval_s):
                await self._wake.wait()
            self._wake = anyio.Event()  # a request() from here on wakes the next wait

    async def check(self) -> bool | None:
        """One check: True if the table was replaced, False if the file is unusable (the table
        kept), None if nothing changed."""
        try:
            st = await aiofiles.os.stat(self.path)
        except OSError as exc:
            return self._unusable(f"auth file {self.path}: {exc}", str(exc).encode())
        signature = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if signature == self._seen:
            return None
        try:
            # shielded: a cancel (shutdown) while the worker thread opens the file would leave
            # the file it opens unclosed
            with anyio.CancelScope(shield=True):
                async with aiofiles.open(self.path, "rb") as f:
                    data = await f.read()
        except OSError as exc:
            return self._unusable(f"auth file {self.path}: {exc}", str(exc).encode())
        digest = hashlib.sha256(data).digest()
        if digest == self.authenticator.source_sha256:
            self._seen, self._failed = signature, None
            return None
        try:
            principals = parse_auth_file(data, self.path)
        except AuthConfigError as exc:
            return self._unusable(str(exc), data)
        self.authenticator.replace(principals, data)
        self._seen, self._failed = signature, None
        logger.info("auth file %s reloaded: %d token(s)", self.path, len(principals))
        return True

    def _unusable(self, reason: str, version: bytes) -> bool:
        self._seen = None  # read it again next time, whatever its stat says
        digest = hashlib.sha256(version).digest()
        if digest != self._failed:
            self._failed = digest
            logger.error("%s; keeping the %d token(s) loaded before", reason, self.authenticator.token_count)
        return False


def _prefixes(value: Any, where: str, what: str) -> tuple[str, ...]:
    if value is None:
        return ("",)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AuthConfigError(f"{where}: {what} must be a list of name prefixes")
    return tuple(value)


def _quota(value: Any, where: str) -> dict[str, int | None]:
    if value is None:
        return {}
    names = ("produce_bytes_per_sec", "fetch_bytes_per_sec")
    if not isinstance(value, dict) or not set(value) <= set(names):
        raise AuthConfigError(f"{where}: quota must be an object with {' and/or '.join(names)}")
    for name, rate in value.items():
        if rate is not None and (type(rate) is not int or rate < 1):
            raise AuthConfigError(f"{where}: quota.{name} must be a positive integer (bytes per second)")
    return {name: value.get(name) for name in names}


def _unauthorized(detail: str) -> ApiError:
    return ApiError(401, "unauthorized", detail, headers={"WWW-Authenticate": 'Bearer realm="eventlog"'})


# -- route dependencies ------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False, description="a token from the server's EVENTLOG_AUTH_FILE")


def principal_of(request: Request) -> Principal:
    return getattr(request.state, "principal", ANONYMOUS_ADMIN)


def require(action: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the caller may do `action`, on the path's topic and group if any."""

    async def check(  # async: no threadpool hop for a dictionary lookup
        request: Request, _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> Principal:
        return authorize(request, action)

    check.eventlog_right = action  # type: ignore[attr-defined]  # the policy checks it first (api/policy.py)
    return check


def authorize(request: Request, action: str) -> Principal:
    """The caller's principal if it may do `action` on the path's topic and group (if any);
    ApiError 403 otherwise. What require(action) checks, for routes outside FastAPI's."""
    principal = principal_of(request)
    # the path's topic, or the one a query names (?topic= filters group offsets)
    check_access(principal, action, request.path_params.get("topic"), request.query_params.get("topic"))
    group = request.path_params.get("group")
    if group is not None and not principal.covers_group(group):
        raise ApiError(403, "forbidden", f"{principal.name!r} has no access to group {group!r}")
    return principal


def check_access(principal: Principal, action: str, *topics: str | None) -> None:
    """ApiError 403 unless `principal` may do `action` on each of `topics` (None: no topic)."""
    if not principal.allows(action):
        raise ApiError(403, "forbidden", f"role {principal.role!r} may not {action}")
    for topic in topics:
        if topic is not None and not principal.allows(action, topic=topic):
            raise ApiError(403, "forbidden", f"{principal.name!r} has no access to topic {topic!r}")


Admin = Annotated[Principal, Depends(require("admin"))]
Writer = Annotated[Principal, Depends(require("write"))]
Reader = Annotated[Principal, Depends(require("read"))]
Describer = Annotated[Principal, Depends(require("describe"))]
GroupMember = Annotated[Principal, Depends(require("group"))]
Monitor = Annotated[Principal, Depends(require("monitor"))]
