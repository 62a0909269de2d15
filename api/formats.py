"""Key, value and header value formats: string (UTF-8), base64, json."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from .errors import ApiError

FORMATS = ("string", "base64", "json")


def encode(value: Any, fmt: str, what: str) -> bytes | None:
    """A JSON-side value to record bytes. None stays None (null key / tombstone)."""
    if value is None:
        return None
    if fmt == "string":
        if not isinstance(value, str):
            raise ApiError(422, "validation_error", f"{what}: expected a string for format 'string'")
        return value.encode("utf-8", "surrogatepass")
    if fmt == "base64":
        if not isinstance(value, str):
            raise ApiError(422, "validation_error", f"{what}: expected a base64 string")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(422, "validation_error", f"{what}: not valid base64") from None
    if fmt == "json":
        return orjson.dumps(value)
    raise ApiError(422, "validation_error", f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")


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
