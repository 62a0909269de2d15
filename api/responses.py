"""Responses beyond Starlette's: a range of a segment file (zero-copy where the server allows
it), and a body sent in parts.


ASGI servers that implement the `http.response.zerocopysend` extension (it appears in
scope["extensions"]) get the file descriptor, offset and count, and can sendfile() the batches
from the page cache to the socket without them passing through Python. Elsewhere (uvicorn
today) the range is read, from the page cache on the event loop when it is there
(preadv2 RWF_NOWAIT), else in a worker thread, and sent as one body.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

ZEROCOPY = "http.response.zerocopysend"


class FileRangeResponse(Response):
    def __init__(
        self,
        file: Any,  # an object with fileno(), kept open for as long as the response lives
        offset: int,
        count: int,
        read: Callable[[], Awaitable[bytes | memoryview]],
        *,
        media_type: str,
        headers: dict[str, str],
    ) -> None:
        super().__init__(b"", media_type=media_type, headers=headers)
        self.file = file
        self.offset = offset
        self.count = count
        self._read = read
        self.headers["content-length"] = str(count)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.count and ZEROCOPY in scope.get("extensions", {}):
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await send({"type": ZEROCOPY, "file": self.file, "offset": self.offset, "count": self.count, "more_body": False})
            return
        # read before the status goes out, so a failed read is still a clean error response
        body = await self._read() if self.count else b""
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    @property
    def bytes_sent(self) -> int:
        return self.count


class PartsResponse(Response):
    """A body given as parts, sent one `http.response.body` message each (Content-Length is
    their total). A big JSON answer (a million offsets: ~50 MB) is never joined into one bytes
    object: each join or copy of it would hold the GIL, and so the event loop, for tens of ms;
    and the transport's flow control paces the parts."""

    def __init__(self, parts: list[bytes], *, media_type: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(b"", media_type=media_type, headers=headers)
        self.parts = parts
        self.headers["content-length"] = str(sum(len(p) for p in parts))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        parts = self.parts
        for i, part in enumerate(parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < len(parts) - 1})
            parts[i] = b""
        if not parts:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
