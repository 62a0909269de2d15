"""The auth file reloaded while the server runs (api/auth.py, AuthFileWatcher): a new token works
and a removed one is refused without a restart, an unusable file keeps the tokens before it,
SIGHUP checks at once, and every shard of a family reloads on its own."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from api.auth import Authenticator, AuthFileWatcher
from api.errors import ApiError
from app.settings import Settings

from ..conftest import ServerProcess, pid_alive, wait_until
from .test_api import assert_problem

OPS, OLD, NEW = "ops-token-00000000", "old-token-11111111", "new-token-22222222"


def write_auth(path: Path, *entries: tuple[str, str, str], in_place: bool = False) -> None:
    """(name, token, role) entries; by default as an operator should: a new file renamed over
    the old one (atomic). in_place: truncated and written, as `cat > file` does."""
    text = json.dumps({"tokens": [{"name": n, "token": t, "role": r} for n, t, r in entries]})
    if in_place:
        path.write_text(text)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


FIRST = [("ops", OPS, "admin"), ("old", OLD, "producer")]
SECOND = [("ops", OPS, "admin"), ("new", NEW, "producer")]


def status_of(url: str, token: str) -> int:
    """GET /readyz (any role) with `token` on a new connection (in a family: any shard)."""
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=30) as c:
        return c.get("/readyz").status_code


# -- one check, on real files -------------------------------------------------------------------


def _principal(authenticator: Authenticator, token: str) -> str | None:
    try:
        return authenticator.authenticate(f"Bearer {token}").name
    except ApiError:
        return None


async def test_a_check_replaces_the_table_only_with_a_valid_new_version(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="eventlog.auth")
    path = tmp_path / "auth.json"
    write_auth(path, *FIRST)
    authenticator = Authenticator.from_file(path)
    watcher = AuthFileWatcher(authenticator, path, interval_ms=0)

    def errors() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]

    assert await watcher.check() is None  # the bytes it was loaded from
    os.utime(path, ns=(1, 1))  # a touch: read again, same bytes
    assert await watcher.check() is None
    write_auth(path, *FIRST)  # the same bytes, a new inode
    assert await watcher.check() is None
    write_auth(path, *SECOND)
    assert await watcher.check() is True
    assert (_principal(authenticator, NEW), _principal(authenticator, OLD)) == ("new", None)
    assert await watcher.check() is None

    path.write_text('{"tokens": [{"name": "ops", "token": "ops-tok')  # caught half-written
    assert await watcher.check() is False
    assert await watcher.check() is False  # read again, logged once
    assert len(errors()) == 1 and "keeping the 2 token(s) loaded before" in errors()[0]
    for broken in ('{"tokens": []}', '{"tokens": [{"token": "long-enough-token", "role": "root"}]}'):
        path.write_text(broken)
        assert await watcher.check() is False
    path.unlink()
    assert await watcher.check() is False
    assert await watcher.check() is False
    assert len(errors()) == 4 and "No such file" in errors()[-1]
    assert (_principal(authenticator, OPS), _principal(authenticator, NEW)) == ("ops", "new")  # never locked out
    with pytest.raises(ApiError):
        authenticator.authenticate("Bearer long-enough-token")  # never opened

    write_auth(path, *SECOND)  # back as it was loaded: nothing to do, nothing logged
    assert await watcher.check() is None
    write_auth(path, *FIRST)
    assert await watcher.check() is True
    assert (_principal(authenticator, OLD), _principal(authenticator, NEW)) == ("old", None)
    assert len(errors()) == 4


@pytest.mark.parametrize("value, valid", [(0, True), (100, True), (1000, True), (1, False), (99, False), (-1, False)])
def test_the_reload_interval_is_0_or_at_least_100_ms(value: int, valid: bool) -> None:
    if valid:
        assert Settings(auth_reload_ms=value).auth_reload_ms == value
    else:
        with pytest.raises(ValidationError, match="auth_reload_ms"):
            Settings(auth_reload_ms=value)


# -- a real server ------------------------------------------------------------------------------


def test_a_running_server_reloads_the_file(tmp_path: Path) -> None:
    """Every 100 ms: a token added works and one removed is refused, through the middleware
    and the hot lane alike; a broken file, or none, keeps the tokens before it."""
    auth = tmp_path / "auth.json"
    write_auth(auth, *FIRST)
    env = {"EVENTLOG_AUTH_FILE": str(auth), "EVENTLOG_AUTH_RELOAD_MS": "100"}
    server = ServerProcess(tmp_path / "data", processes=1, env=env).start(token=OPS)
    try:
        with server.client(OPS) as admin:
            assert admin.post("/v1/topics", json={"name": "t"}).status_code == 201
        produce = {"records": [{"value": "v"}]}
        assert status_of(server.url, NEW) == 401
        with server.client(OLD) as old:
            assert old.post("/v1/topics/t/records", json=produce).status_code == 200

            write_auth(auth, *SECOND)
            wait_until(lambda: status_of(server.url, NEW) == 200, what="the new token accepted")
            assert status_of(server.url, OLD) == 401
            # a connection opened before: its next request is checked against the new table
            assert_problem(old.post("/v1/topics/t/records", json=produce), 401, "unauthorized")
        with server.client(NEW) as new:
            assert new.post("/v1/topics/t/records", json=produce).status_code == 200  # the hot lane

        auth.write_text("{not json", encoding="utf-8")
        wait_until(lambda: "keeping the 2 token(s) loaded before" in server.log(), what="the broken file refused")
        auth.unlink()
        wait_until(lambda: "No such file" in server.log(), what="the missing file refused")
        assert (status_of(server.url, NEW), status_of(server.url, OLD), status_of(server.url, OPS)) == (200, 401, 200)

        write_auth(auth, *FIRST, in_place=True)
        wait_until(lambda: status_of(server.url, OLD) == 200, what="the old token back")
        assert status_of(server.url, NEW) == 401
    finally:
        assert server.stop() == 0, server.log()


def test_sighup_checks_the_file_at_once(tmp_path: Path) -> None:
    """EVENTLOG_AUTH_RELOAD_MS=0: no polling; SIGHUP reloads, and does not stop the server."""
    auth = tmp_path / "auth.json"
    write_auth(auth, *FIRST)
    env = {"EVENTLOG_AUTH_FILE": str(auth), "EVENTLOG_AUTH_RELOAD_MS": "0"}
    server = ServerProcess(tmp_path / "data", processes=1, env=env).start(token=OPS)
    try:
        write_auth(auth, *SECOND)
        assert status_of(server.url, NEW) == 401
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: status_of(server.url, NEW) == 200, what="the new token accepted after SIGHUP")
        assert status_of(server.url, OLD) == 401 and server.proc.poll() is None
    finally:
        assert server.stop() == 0, server.log()


def _reloaded_on(server: ServerProcess, shard: int) -> int:
    return sum(f" shard-{shard} eventlog.auth: " in line and " reloaded: " in line for line in server.log().splitlines())


@pytest.mark.parametrize("how", ["polling", "sighup"])
def test_every_shard_of_a_family_reloads(tmp_path: Path, how: str) -> None:
    """`eventlog serve --processes 2`: each shard watches the file itself (polling), and SIGHUP
    to the supervisor reaches every shard (no polling)."""
    auth = tmp_path / "auth.json"
    write_auth(auth, *FIRST)
    env = {"EVENTLOG_AUTH_FILE": str(auth), "EVENTLOG_AUTH_RELOAD_MS": "100" if how == "polling" else "0"}
    server = ServerProcess(tmp_path / "data", processes=2, env=env).start(token=OPS)
    try:
        # new connections, which the family spreads over its shards
        assert [status_of(server.url, OLD) for _ in range(20)] == [200] * 20
        write_auth(auth, *SECOND)
        if how == "sighup":
            assert server.proc is not None
            server.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: _reloaded_on(server, 0) and _reloaded_on(server, 1), what="both shards reloading")
        assert [status_of(server.url, NEW) for _ in range(20)] == [200] * 20
        assert [status_of(server.url, OLD) for _ in range(20)] == [401] * 20
        assert all(pid_alive(pid) for pid in server.shard_pids()) and len(server.shard_pids()) == 2
        if how == "sighup":
            assert "SIGHUP: forwarded to 2 shard(s)" in server.log()
    finally:
        assert server.stop() == 0, server.log()
