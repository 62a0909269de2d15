"""The in-process harness (tests/inprocess.py) against a bare ASGI app: lifespan, request chunks,
streaming with backpressure, disconnects, read timeouts, failures, shutdown."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import httpx
import pytest

from .conftest import wait_until
from .inprocess import ASGITransport, AppRunner


class Probe:
    """An ASGI app that records what the harness does to it."""

    def __init__(self, fail_start: bool = False) -> None:
        self.fail_start = fail_start
        self.lifespan: list[str] = []
        self.disconnected = threading.Event()
        self.chunks: list[tuple[bytes, bool]] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                self.lifespan.append(message["type"])
                if message["type"] == "lifespan.startup":
                    if self.fail_start:
                        await send({"type": "lifespan.startup.failed", "message": "no"})
                        raise RuntimeError("refused to start")
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if path == "/echo":
            while True:
                message = await receive()
                self.chunks.append((message["body"], message["more_body"]))
                if not message["more_body"]:
                    break
            await _answer(send, 200, b"%d" % sum(len(body) for body, _ in self.chunks))
        elif path == "/stream":
            await receive()  # the (empty) request
            await send({"type": "http.response.start", "status": 200, "headers": []})
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    assert (await receive())["type"] == "http.disconnect"
                    self.disconnected.set()
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                for i in range(10**9):
                    await send({"type": "http.response.body", "body": b"%d\n" % i, "more_body": True})
                    # as a real stream waits for its next data (a send after a disconnect
                    # returns at once, as uvicorn's does)
                    await anyio.lowlevel.checkpoint()
        elif path == "/hang":
            await receive()
            assert (await receive())["type"] == "http.disconnect"
            self.disconnected.set()
        elif path == "/boom":
            raise ValueError("before the answer")
        elif path == "/silent":
            pass
        elif path == "/late-boom":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"part", "more_body": True})
            raise ValueError("after the answer began")


async def _answer(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def probe() -> Iterator[tuple[Probe, httpx.Client]]:
    app = Probe()
    runner = AppRunner(app)
    runner.start()
    try:
        with httpx.Client(base_url="http://testserver", transport=ASGITransport(runner), timeout=10) as client:
            yield app, client
    finally:
        runner.stop()
    assert app.lifespan == ["lifespan.startup", "lifespan.shutdown"]


def test_a_request_body_arrives_in_the_clients_chunks(probe) -> None:
    app, client = probe
    assert client.post("/echo", content=iter([b"ab", b"", b"cde"])).text == "5"
    assert app.chunks == [(b"ab", True), (b"cde", False)]
    app.chunks.clear()
    assert client.get("/echo").text == "0"
    assert app.chunks == [(b"", False)]


def test_a_stream_is_read_as_it_comes_and_closing_it_is_a_disconnect(probe) -> None:
    app, client = probe
    with client.stream("GET", "/stream") as response:
        lines = response.iter_lines()
        assert [next(lines) for _ in range(3)] == ["0", "1", "2"]
    assert app.disconnected.wait(10)


def test_a_read_timeout_is_a_timeout_and_a_disconnect(probe) -> None:
    app, client = probe
    with pytest.raises(httpx.ReadTimeout):
        client.get("/hang", timeout=0.2)  # the client gives up after its read timeout
    assert app.disconnected.wait(10)


def test_an_app_that_fails_is_a_500_or_a_broken_response(probe, caplog: pytest.LogCaptureFixture) -> None:
    _app, client = probe
    for path in ("/boom", "/silent"):
        r = client.get(path)
        assert (r.status_code, r.text) == (500, "Internal Server Error")
    with pytest.raises(httpx.RemoteProtocolError):
        client.get("/late-boom")
    assert [r.message for r in caplog.records if r.name == "tests.inprocess"] == [
        "the app raised on GET /boom", "the app returned without a response to GET /silent",
        "the app raised on GET /late-boom",
    ]


def test_a_failed_start_raises_the_apps_own_error() -> None:
    app = Probe(fail_start=True)
    with pytest.raises(RuntimeError, match="refused to start"):
        AppRunner(app).start()


def test_stop_cancels_requests_still_open_after_the_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.inprocess.GRACE_S", 0.2)
    app = Probe()
    runner = AppRunner(app)
    runner.start()
    errors: list[BaseException] = []

    def hang() -> None:
        with httpx.Client(base_url="http://testserver", transport=ASGITransport(runner), timeout=30) as client:
            try:
                client.get("/hang")
            except httpx.HTTPError as exc:
                errors.append(exc)

    thread = threading.Thread(target=hang)
    thread.start()
    wait_until(lambda: runner.requests, what="the request reaching the app")
    runner.stop()  # waits 0.2 s for /hang, cancels it, then shuts the app down
    thread.join(10)
    assert app.lifespan == ["lifespan.startup", "lifespan.shutdown"]
    assert not thread.is_alive() and errors
