"""The CLI's commands that talk to a running server (`eventlog snapshot --url`, `eventlog groups
reset-offsets`): one JSON POST with an optional bearer token, its refusal told as the problem's
code and detail."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class RemoteError(Exception):
    """The server refused the request (`code: detail`) or could not be reached."""


def post_json(
    url: str, path: str, body: dict[str, Any], token: str | None, *, timeout: float,
    unreachable: str = "",
) -> dict[str, Any]:
    """POST `body` to url + path and return the JSON answer. `unreachable` is added to the
    message when nothing answers (what the user may do instead)."""
    request = urllib.request.Request(
        f"{url.rstrip('/')}{path}", data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            problem = json.loads(exc.read())
            why = f"{problem.get('code', exc.code)}: {problem.get('detail', exc.reason)}"
        except ValueError:
            why = f"{exc.code}: {exc.reason}"
        raise RemoteError(why) from None
    except urllib.error.URLError as exc:
        raise RemoteError(f"cannot reach {url}: {exc.reason}{unreachable}") from None
