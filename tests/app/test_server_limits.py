"""The request-head limits of app/server.py, on both of uvicorn's HTTP parsers (the server uses
httptools when installed; h11 is its fallback): a real uvicorn server in a thread."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from app.main import create_app
from app.server import protocol_class, uvicorn_config
from app.settings import Settings

from ..api.test_security import _read_response
from ..conftest import free_port

LIMIT = 8192




def _status_and_code(response: bytes) -> tuple[int, str | None]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        return status, json.loads(body).get("code")
    except ValueError:
        return status, None


@pytest.fixture(params=["httptools", "h11"])
def port(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[int]:
    settings = Settings(data_dir=tmp_path / "data", port=free_port(), max_header_bytes=LIMIT)
    config = uvicorn_config(create_app(settings), settings)
    config.http = protocol_class(settings, request.param)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(600):
            if server.started:
                break
            thread.join(0.05)
        assert server.started, "uvicorn did not start"
        yield settings.port
    finally:
        server.should_exit = True
        thread.join(30)


def _exchange(port: int, *requests: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for r in requests:
            s.sendall(r)
        return _read_response(s)


def _get(path: bytes = b"/v1/topics", extra: bytes = b"", close: bool = True) -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\nhost: x\r\n" + extra + (b"connection: close\r\n" if close else b"") + b"\r\n"


def test_a_head_within_the_limit_is_served(port: int) -> None:
    assert _status_and_code(_exchange(port, _get(extra=b"x-pad: " + b"p" * (LIMIT - 200) + b"\r\n")))[0] == 200


@pytest.mark.parametrize("shape", ["one_header", "many_headers", "long_url"])
def test_a_head_over_the_limit_sent_at_once_is_431(port: int, shape: str) -> None:
    if shape == "one_header":
        request = _get(b"/v1/topics/nope", b"x-pad: " + b"p" * (LIMIT + 100) + b"\r\n")
    elif shape == "many_headers":
        request = _get(b"/v1/topics/nope", b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(LIMIT // 100)))
    else:
        request = _get(b"/v1/topics/" + b"n" * (LIMIT + 100))
    assert _status_and_code(_exchange(port, request)) == (431, "headers_too_large")


def test_a_head_over_the_limit_after_a_keep_alive_request_is_431(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(_get(close=False))
        first = b""
        while not first.endswith(b"}"):
            first += s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        s.sendall(_get(b"/v1/topics/nope", b"x-pad: " + b"p" * (LIMIT + 100) + b"\r\n"))
        assert _status_and_code(_read_response(s)) == (431, "headers_too_large")


def test_a_head_over_the_limit_in_pieces_is_431(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /v1/topics HTTP/1.1\r\nhost: x\r\n")
        for _ in range(2 * LIMIT // 1000):  # never ending
            try:
                s.sendall(b"x-pad: " + b"p" * 1000 + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
        assert _status_and_code(_read_response(s)) == (431, "headers_too_large")
