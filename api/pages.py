"""The headers of the pages this server serves to browsers: the web console (console.py) and the
API's documents, /docs and /redoc (docs.py). One policy, built here for all of them.

    Content-Security-Policy  nothing is allowed but what is named: scripts from this server
                             (and, for a page with inline scripts, exactly those, by their
                             SHA-256: never 'unsafe-inline' for scripts), styles from this
                             server (inline ones only where a page's library injects them),
                             images from this server or data: URLs, requests to this server
                             only, no <base>, no form posts, and no framing (frame-ancestors).
    X-Frame-Options          DENY: framing refused by browsers older than frame-ancestors.
    X-Content-Type-Options   nosniff; Referrer-Policy no-referrer.

The browser tests (tests/console) load each page in Chromium under these headers and fail on
any CSP violation it reports.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable

_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def inline_scripts(html: str) -> list[str]:
    """The bodies of the inline <script> elements of `html` (those with no attribute)."""
    return _INLINE_SCRIPT.findall(html)


def script_hash(source: str) -> str:
    """`source`'s CSP hash source ('sha256-<base64>'), which allows exactly that inline script."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


def policy(
    *, scripts: Iterable[str] = (), inline_styles: bool = False, blob_workers: bool = False,
) -> str:
    """The Content-Security-Policy of a page: `scripts`, the inline scripts it runs besides
    this server's files; `inline_styles`, whether <style> elements and style attributes are
    allowed (a library that injects its styles); `blob_workers`, whether it may start a worker
    from a blob: URL (ReDoc's search)."""
    hashes = sorted({script_hash(source) for source in scripts})
    directives = [
        "default-src 'none'",
        " ".join(["script-src 'self'", *hashes]),
        "style-src 'self' 'unsafe-inline'" if inline_styles else "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
    ]
    if blob_workers:
        directives.append("worker-src 'self' blob:")
    directives += ["base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'"]
    return "; ".join(directives)


def headers(page_policy: str, cache_control: str) -> dict[str, str]:
    """The headers of a page, or of an asset it loads, under `page_policy`."""
    return {
        "Content-Security-Policy": page_policy,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": cache_control,
    }
