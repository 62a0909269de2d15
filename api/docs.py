"""The API's interactive documents, offline: `/docs` (Swagger UI) and `/redoc` (ReDoc).

FastAPI's own pages load their scripts from a CDN, so without internet they are blank. These
pages load them from the server: the files of the `fastapi-offline` package (a maintained
bundle of Swagger UI's and ReDoc's release files), served at /static/docs/. Nothing else of
that package is used.

The pages and their assets are sent under pages.py's Content-Security-Policy, as the console's:
the scripts of /static/docs/ and the pages' own inline scripts (by their SHA-256), inline styles
(Swagger UI's and ReDoc's components inject theirs), ReDoc's search worker (a blob: URL),
requests to this server only, and no framing (frame-ancestors 'none', X-Frame-Options DENY).

With an auth file, the pages and their assets are open (they hold no data) and `/openapi.json`
is not: each page has one token field, kept in the browser's session storage, and sends it as
`Authorization: Bearer <token>` when it fetches the document (and, in Swagger UI, with every
request tried from the page). The page fetches the document itself before it starts Swagger UI
or ReDoc: answered without a token (no auth file), the field stays hidden; refused (401/403),
the field is all the page shows, with what to do, until a token is given (not Swagger UI's red
"Failed to load API definition"). Swagger UI's own Authorize dialog is hidden: one field sets
the token, and the request interceptor sends it.
"""

from __future__ import annotations

from pathlib import Path

import aiofiles
import anyio
from fastapi import APIRouter, HTTPException
from fastapi.openapi.docs import get_swagger_ui_oauth2_redirect_html
from starlette.responses import HTMLResponse, Response

from . import pages
from .policy import PolicyRoute

ASSETS_PREFIX = "/static/docs"
PUBLIC_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})  # open even with auth on


def _assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}

router = APIRouter(include_in_schema=False, route_class=PolicyRoute)

_TOKEN_BAR = """<form id="eventlog-token" hidden style="font: 14px sans-serif; padding: 8px 16px;
 background: #f4f4f4; border-bottom: 1px solid #ddd">
 <p id="eventlog-token-why" style="margin: 0 0 6px"></p>
 <label>Bearer token (kept for this browser tab)
 <input id="eventlog-token-input" type="password" size="40" autocomplete="off"></label>
 <button id="eventlog-token-apply" type="submit">Use</button>
</form>
<script>
function eventlogToken() { return sessionStorage.getItem("eventlog-token") || ""; }
function eventlogHeaders() {
  var token = eventlogToken();
  return token ? {"Authorization": "Bearer " + token} : {};
}
document.getElementById("eventlog-token-input").value = eventlogToken();
document.getElementById("eventlog-token").onsubmit = function (event) {
  event.preventDefault();
  sessionStorage.setItem("eventlog-token", document.getElementById("eventlog-token-input").value.trim());
  location.reload();
};
function eventlogAsk(why) {
  document.getElementById("eventlog-token-why").textContent = why;
  document.getElementById("eventlog-token").hidden = false;
  document.getElementById("eventlog-token-input").focus();
}
// The document, fetched with the token if one is set; `render` gets it. Without a token and
// answered: no auth file, no field. Refused: the field, and what to do, instead of the page.
function eventlogLoad(render) {
  var token = eventlogToken();
  if (token) document.getElementById("eventlog-token").hidden = false;
  fetch("/openapi.json", {headers: eventlogHeaders()}).then(function (r) {
    if (r.status === 401 || r.status === 403) {
      eventlogAsk(token
        ? "The server refused this token (" + r.status + "): give another to load the API document."
        : "This server has an auth file: give a bearer token to load the API document.");
      return;
    }
    if (!r.ok) throw new Error("/openapi.json answered " + r.status);
    return r.json().then(render);
  }).catch(function (e) { eventlogAsk(e.message); });
}
</script>"""


_SWAGGER_UI = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>eventlog - Swagger UI</title>
<link rel="stylesheet" href="{ASSETS_PREFIX}/swagger-ui.css">
<link rel="icon" type="image/png" href="{ASSETS_PREFIX}/favicon.png">
<style>.swagger-ui .auth-wrapper, .swagger-ui .authorization__btn,
 .swagger-ui .scheme-container:not(:has(select)) {{ display: none; }}</style></head>
<body>{_TOKEN_BAR}
<div id="swagger-ui"></div>
<script src="{ASSETS_PREFIX}/swagger-ui-bundle.js"></script>
<script>
eventlogLoad(function (spec) {{
  SwaggerUIBundle({{
    spec: spec, dom_id: "#swagger-ui", deepLinking: true, showExtensions: true,
    oauth2RedirectUrl: location.origin + "/docs/oauth2-redirect",
    requestInterceptor: function (request) {{
      var headers = eventlogHeaders();
      for (var name in headers) {{ if (!request.headers[name]) request.headers[name] = headers[name]; }}
      return request;
    }},
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
    layout: "BaseLayout"
  }});
}});
</script></body></html>"""

_REDOC = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>eventlog - ReDoc</title>
<link rel="icon" type="image/png" href="{ASSETS_PREFIX}/favicon.png"></head>
<body style="margin: 0">{_TOKEN_BAR}
<div id="redoc"></div>
<script src="{ASSETS_PREFIX}/redoc.standalone.js"></script>
<script>
eventlogLoad(function (spec) {{ Redoc.init(spec, {{}}, document.getElementById("redoc")); }});
</script></body></html>"""

_OAUTH2_REDIRECT = bytes(get_swagger_ui_oauth2_redirect_html().body).decode()

# one policy for the three pages and their assets: their inline scripts, by hash (pages.py)
_PAGES = (_SWAGGER_UI, _REDOC, _OAUTH2_REDIRECT)
POLICY = pages.policy(
    scripts=[js for page in _PAGES for js in pages.inline_scripts(page)],
    inline_styles=True,
    blob_workers=True,
)
_PAGE_HEADERS = pages.headers(POLICY, "no-cache")
_ASSET_HEADERS = pages.headers(POLICY, "public, max-age=86400")


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    return HTMLResponse(_SWAGGER_UI, headers=_PAGE_HEADERS)


@router.get("/docs/oauth2-redirect")
async def swagger_ui_redirect() -> HTMLResponse:
    return HTMLResponse(_OAUTH2_REDIRECT, headers=_PAGE_HEADERS)


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    return HTMLResponse(_REDOC, headers=_PAGE_HEADERS)


_loaded: dict[str, bytes] = {}  # the assets read so far (~2.8 MB in all): they never change
# The one thing a bundle fetches from elsewhere: ReDoc's menu shows Redocly's logo from their CDN
# (hidden when it does not load). The policy would block it, a violation on every load: it is
# pointed at an image that fails at once instead, as with no internet; the link stays.
_OFFSITE = {"redoc.standalone.js": ((b'"https://cdn.redoc.ly/redoc/logo-mini.svg"', b'"data:,"'),)}


@router.get(ASSETS_PREFIX + "/{name}")
async def asset(name: str) -> Response:
    kind = ASSETS.get(name)
    if kind is None:
        raise HTTPException(404, "Not Found")
    data = _loaded.get(name)
    if data is None:  # read once, without holding the event loop (aiofiles: a worker thread)
        with anyio.CancelScope(shield=True):  # a cancel mid-open would leave the file unclosed
            async with aiofiles.open(_assets_dir() / name, "rb") as f:
                data = await f.read()
            for offsite, local in _OFFSITE.get(name, ()):
                data = data.replace(offsite, local)
            _loaded[name] = data
    return Response(data, media_type=kind, headers=_ASSET_HEADERS)
