"""FileRangeResponse: zero-copy where the ASGI server offers it, one read otherwise."""

from __future__ import annotations

import os
from pathlib import Path

from api.responses import ZEROCOPY, FileRangeResponse


async def _run(response: FileRangeResponse, extensions: dict) -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request"}

    async def send(message: dict) -> None:
        sent.append(message)

    await response({"type": "http", "extensions": extensions}, receive, send)
    return sent


async def test_zerocopy_when_the_server_offers_it(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    with open(path, "rb") as f:
        reads = []

        async def read() -> bytes:
            reads.append(1)
            return os.pread(f.fileno(), 4, 3)

        response = FileRangeResponse(f, 3, 4, read, media_type="application/x", headers={"x-a": "1"})
        sent = await _run(response, {ZEROCOPY: {}})
        assert sent[0]["type"] == "http.response.start" and (b"content-length", b"4") in sent[0]["headers"]
        assert sent[1] == {"type": ZEROCOPY, "file": f, "offset": 3, "count": 4, "more_body": False}
        assert not reads  # the bytes never came through Python
        sent = await _run(FileRangeResponse(f, 3, 4, read, media_type="application/x", headers={}), {})
        assert sent[1] == {"type": "http.response.body", "body": b"3456", "more_body": False}
