"""Conditional appends over HTTP: If-Match / If-None-Match in, typed conditions to the engine
(engine/conditions.py), the engine's one refusal out as 409 or 412.

One ETag grammar for every header and route (docs/API.md, "Conditional and idempotent
appends"). An ETag here is an offset, and the same offset whatever the representation:

    *           any version (If-Match: the partition: no condition; a key: it has records)
    "42"  42    the offset 42 (quotes optional; `-1`, quoted or not: a key with no records)
    W/"42"      the same as "42": the weak marker is ignored. A proxy that compresses an answer
                (nginx's gzip) weakens its ETag, and the offset it names is exact whatever the
                bytes' encoding, so a client echoing it back means that offset.

Surrounding whitespace is ignored; anything else (a list of tags, a word, a signed number
other than -1, whitespace inside the quotes) is 422 validation_error, and nothing is written.

A failed condition raises one engine error whatever named it; the answer is chosen here: an
ExpectedOffset from If-Match fails a precondition (412 offset_mismatch), the JSON body's
expected_offset alone is a conflict (409 offset_mismatch, engine_problem's mapping).
"""

from __future__ import annotations

import re
from typing import Final, Literal

from engine.conditions import ExpectedOffset, KeyAt, KeyCondition, KeyHasRecords, KeyIsNew
from engine.errors import ConditionConflictError, InvalidFieldError, OffsetMismatchError

from .errors import ApiError

ANY: Final = "*"

_ETAG = re.compile(r'(?:W/)?("?)(-1|[0-9]+)\1')
_PARTITION_IF_MATCH = 'If-Match: must be an offset, e.g. "42" (or *)'
_KEY_IF_MATCH = (
    'If-Match: must be the key\'s ETag, an offset such as "42" ("-1": no records yet), or *'
)


def parse_etag(text: str) -> int | Literal["*"]:
    """The offset one header's ETag names (-1 possible), or ANY for `*`; ValueError otherwise."""
    text = text.strip()
    if text == ANY:
        return ANY
    match = _ETAG.fullmatch(text)
    if match is None:
        raise ValueError(f"not an ETag: {text!r}")
    return int(match.group(2))


def partition_condition(if_match: str | None) -> ExpectedOffset | None:
    """A partition append's condition from If-Match: the partition's next offset (`*`: none)."""
    if if_match is None:
        return None
    try:
        tag = parse_etag(if_match)
    except ValueError:
        raise InvalidFieldError(_PARTITION_IF_MATCH) from None
    if tag == ANY:
        return None
    if tag < 0:
        raise InvalidFieldError(_PARTITION_IF_MATCH)
    return ExpectedOffset(tag)


def key_condition(if_match: str | None, if_none_match: str | None) -> KeyCondition | None:
    """A per-key append's condition from If-Match (the key's latest offset; `"-1"`: none; `*`:
    some) or If-None-Match (`*` only: the key has none)."""
    if if_match is not None and if_none_match is not None:
        raise InvalidFieldError("If-Match and If-None-Match: give one of them")
    if if_none_match is not None:
        try:
            tag = parse_etag(if_none_match)
        except ValueError:
            tag = None
        if tag != ANY:
            raise InvalidFieldError("If-None-Match: only * (the key has no records) is supported")
        return KeyIsNew()
    if if_match is None:
        return None
    try:
        tag = parse_etag(if_match)
    except ValueError:
        raise InvalidFieldError(_KEY_IF_MATCH) from None
    if tag == ANY:
        return KeyHasRecords()
    return KeyIsNew() if tag == -1 else KeyAt(tag)


def refused(
    exc: OffsetMismatchError | ConditionConflictError, condition: ExpectedOffset | None
) -> Exception:
    """What a partition append refused by its condition answers. With a condition from If-Match:
    a mismatch is a failed precondition (412, the same code and fields as the body's 409), and a
    body naming another offset says which two disagree; without one, the engine's error."""
    if condition is None:
        return exc
    if isinstance(exc, ConditionConflictError):
        return InvalidFieldError("If-Match and expected_offset disagree")
    return ApiError(
        412, "offset_mismatch", str(exc),
        expected_offset=exc.expected, high_watermark=exc.high_watermark,
    )
