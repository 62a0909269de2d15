"""The web console: a single page served by the service itself at `/` and `/console`.

Plain files, no build step and no library: `console_assets/index.html`, `console.css` and
`console.js` (an ES module that draws every view from the public API with fetch, the same
requests a curl user makes). Nothing is loaded from elsewhere, so it works offline; the page's
Content-Security-Policy (pages.py) allows only this server's own scripts, styles and requests,
and no framing.

With an auth file, the page and its assets are open (they hold no data); the page asks for a
token, keeps it in the tab's session storage (shared with /docs) and sends it as
`Authorization: Bearer <token>`. `GET /v1/whoami` tells the page what the token may do, and it
hides or disables the rest. docs/CONSOLE.md shows every view.
"""

from __future__ import annotations

from pathlib import Path

import aiofiles
import anyio
from fastapi import APIRouter, HTTPException
from starlette.responses import RedirectResponse, Response

from . import pages
from .policy import PolicyRoute

ASSETS_PREFIX = "/console/assets"
PUBLIC_PATHS = frozenset({"/", "/console", "/console/"})  # with ASSETS_PREFIX/*: open even with auth on
_DIR = Path(__file__).parent / "console_assets"
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
# the page runs only its own module and talks only to this server; it may not be framed (pages.py)
_POLICY = pages.policy()
# the page names its assets; a new version is fetched at once
_HEADERS = pages.headers(_POLICY, "no-cache")

router = APIRouter(include_in_schema=False, route_class=PolicyRoute)
_loaded: dict[str, bytes] = {}


async def _read(name: str) -> bytes:
    """An asset's bytes, read once without holding the event loop (aiofiles: a worker thread)."""
    data = _loaded.get(name)
    if data is None:
        # shielded: a client gone while the worker thread opens the file would leave it unclosed
        with anyio.CancelScope(shield=True):
            async with aiofiles.open(_DIR / name, "rb") as f:
                data = _loaded[name] = await f.read()
    return data


@router.get("/")
async def root() -> Response:
    return RedirectResponse("/console", status_code=302)


@router.get("/console")
@router.get("/console/")
async def page() -> Response:
    return Response(await _read("index.html"), media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get(ASSETS_PREFIX + "/{name}")
async def asset(name: str) -> Response:
    kind = ASSETS.get(name)
    if kind is None:
        raise HTTPException(404, "Not Found")
    return Response(await _read(name), media_type=kind, headers=_HEADERS)
