"""Key, value and header value formats of fetched records: string (UTF-8), base64, json.

Produced records are encoded by the produce service (engine/produce.py, encode_value)."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from .errors import ApiError

FORMATS = ("string", "base64", "json")


def decode(data: bytes | None, fmt: str, what: str, offset: int) -> Any:
    """Record bytes to the JSON-side value in `fmt`."""
    if data is None:
        return None
    if fmt == "string":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(
                422, "not_utf8",
                f"{what} at offset {offset} is not UTF-8; ask for {what.split()[0]}_format=base64",
                offset=offset,
            ) from None
    if fmt == "base64":
        return base64.b64encode(data).decode("ascii")
    if fmt == "json":
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ApiError(
                422, "not_json", f"{what} at offset {offset} is not JSON; ask for base64 or string", offset=offset
            ) from None
    raise ApiError(422, "validation_error", f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
