"""Big JSON bodies and answers in slices, so that no request holds the event loop for long.

The server is one event loop; work that grows with a request runs in worker threads
(engine/produce.py and api/records.py decide which). Threads share the GIL, though, and a long C call holds it:
orjson parsing or writing a whole 19 MB document (~0.4 s), a list of a million objects freed
at once, a cyclic garbage collection walking them. Each of those would stop the loop as surely
as running inline. So big documents are parsed and written a slice at a time, big lists freed
a slice at a time, and the cyclic collector paused while a big request is worked on; between
slices the loop gets its turn (the interpreter hands the GIL over every few ms).
"""

from __future__ import annotations

import contextlib
import gc
import re
import threading
import time
from typing import Any, Callable, Iterator

import orjson

# about how much of a body one orjson call parses, and how many items one call writes
JSON_SLICE_BYTES = 1024 * 1024
JSON_SLICE_ITEMS = 5000

_RECORDS_HEAD = re.compile(rb"\s*\{\s*\"records\"\s*:\s*\[\s*")
_RECORD_SEPARATOR = re.compile(rb"\}\s*,\s*\{")


def loads_in_slices(body: bytes | bytearray, slice_bytes: int = JSON_SLICE_BYTES) -> dict[str, Any] | None:
    """orjson.loads(body) one slice of records at a time, for a body whose first member is
    "records", an array of objects: orjson holds the GIL for a whole call (~0.4 s for 19 MB of
    small records), which would stop the event loop even from a worker thread.

    The array is cut about every `slice_bytes` after a `}` followed by `,` and `{` where the
    brackets counted from the slice's start balance (a record's end, unless a string holds
    brackets), and each slice is parsed as an array of its own; the members after the array
    (from the last `]`) are parsed as an object of their own. A cut inside a string or a nested
    value leaves a slice that does not parse, so when every part parses the whole is valid JSON
    and the result is what orjson.loads(body) gives. Returns None when the body does not split
    that way (the caller parses it whole, which also words the error of a body that is not JSON).
    """
    head = _RECORDS_HEAD.match(body)
    end = body.rfind(b"]")
    if head is None or end < head.end():
        return None
    tail = body[end + 1 :]
    if b'"records"' in tail:  # a second records member: orjson keeps the last one
        return None
    try:
        doc = orjson.loads(b'{"records":[]' + tail)
    except orjson.JSONDecodeError:
        return None
    records: list[Any] = []
    start = head.end()
    while start < end:
        cut = _record_end(body, start, start + slice_bytes, end) if start + slice_bytes < end else None
        stop = cut.start() + 1 if cut is not None else end
        try:
            records += orjson.loads(b"[" + body[start:stop] + b"]")
        except orjson.JSONDecodeError:
            return None
        start = cut.end() - 1 if cut is not None else end
    doc["records"] = records
    return doc


def _record_end(body: bytes | bytearray, start: int, at: int, end: int) -> re.Match[bytes] | None:
    """The first `}`, `,`, `{` at or after `at` (before `end`) where the brackets of
    body[start:] up to the `}` balance; None if there is none."""
    depth = 0
    counted = start
    while True:
        cut = _RECORD_SEPARATOR.search(body, at, end)
        if cut is None:
            return None
        stop = cut.start() + 1
        depth += (
            body.count(b"{", counted, stop) + body.count(b"[", counted, stop)
            - body.count(b"}", counted, stop) - body.count(b"]", counted, stop)
        )
        if depth == 0:
            return cut
        counted = stop
        at = cut.end() - 1


def dumps_parts(
    items: list[Any], convert: Callable[[list[Any]], list[Any]], head: bytes, tail: dict[str, Any],
    weigh: Callable[[Any], int] | None = None,
) -> list[bytes]:
    """orjson.dumps({<head>: convert(items), **tail}) (head is '{"name":'), in parts: one
    orjson call per JSON_SLICE_ITEMS items, or per JSON_SLICE_BYTES of them by `weigh` (see
    responses.PartsResponse)."""
    rest = b"," + orjson.dumps(tail)[1:] if tail else b"}"
    slices = _slices(items, weigh)
    if len(slices) == 1:
        return [head + orjson.dumps(convert(slices[0])) + rest]
    parts = [head]
    for i, chunk in enumerate(slices):
        part = orjson.dumps(convert(chunk))
        parts.append((b"[" if i == 0 else b",") + part[1:-1])
    parts.append(b"]" + rest)
    return parts


def _slices(items: list[Any], weigh: Callable[[Any], int] | None) -> list[list[Any]]:
    if weigh is None:
        return [items[i : i + JSON_SLICE_ITEMS] for i in range(0, len(items), JSON_SLICE_ITEMS)] or [items]
    out = []
    start = size = 0
    for i, item in enumerate(items):
        if i > start and (i - start >= JSON_SLICE_ITEMS or size >= JSON_SLICE_BYTES):
            out.append(items[start:i])
            start, size = i, 0
        size += weigh(item)
    out.append(items[start:])
    return out


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False
_gc_paused_since = 0.0
# big requests back to back keep the collector paused; past this it runs again (a stall now
# and then) rather than let cyclic garbage grow for ever
GC_PAUSE_MAX_S = 60.0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a big request is worked on (process-wide,
    counted across requests). A big request makes millions of objects without cycles; a
    collection meanwhile, or the first one after they all survived it, walks them all, holding
    the GIL (and so the event loop) for a tenth of a second or more each time. Reference
    counting frees them as usual, and they are gone before the collector is back."""
    global _gc_pauses, _gc_was_enabled, _gc_paused_since
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            _gc_paused_since = time.monotonic()
            gc.disable()
        elif _gc_was_enabled and time.monotonic() - _gc_paused_since > GC_PAUSE_MAX_S:
            gc.enable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


def free_in_slices(items: list[Any]) -> None:
    """Empty a big list a slice at a time: freeing a million objects in one call (a list's
    last reference going, list.clear()) holds the GIL until the last one is gone."""
    while items:
        del items[-JSON_SLICE_ITEMS:]
