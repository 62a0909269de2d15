"""What every fuzz test shares: example budgets, a guard against hangs and huge allocations,
valid inputs to start from, and the mutations applied to them.

Budgets: EXAMPLES per property in the default run (the whole of tests/fuzz stays under about a
minute on two cores); EVENTLOG_FUZZ_EXAMPLES=N raises it for a long run. The variable is read
at import time, before the autouse fixture that clears EVENTLOG_* from the environment.

The guard (`bounded()`) caps the process's address space at its current size plus
MEMORY_HEADROOM_BYTES and arms a SIGALRM after HANG_SECONDS, for the duration of one call into
the code under test. A reader that tries to allocate gigabytes because of a length field gets a
MemoryError, and one that loops forever gets Hang; neither is a project error, so the property
fails and Hypothesis shrinks the input. HANG_SECONDS is far above what any call here takes: it
detects hangs, it does not measure speed.
"""

from __future__ import annotations

import os
import resource
import signal
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from crc32c import crc32c
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from engine import compression
from engine.format import HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2
from engine.records import RecordInput, encode_batch

EXAMPLES = int(os.environ.get("EVENTLOG_FUZZ_EXAMPLES", "0") or 0) or None
HANG_SECONDS = 30
MEMORY_HEADROOM_BYTES = 1 << 30
MAX_INPUT_BYTES = 64 * 1024

CODECS = [compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD]


def fuzz_settings(default_examples: int) -> settings:
    """Hypothesis settings for one property: `default_examples` unless EVENTLOG_FUZZ_EXAMPLES
    is set; no deadline (a timing check), derandomized so that a run is repeatable, and no
    example database in the checkout."""
    return settings(
        max_examples=EXAMPLES or default_examples,
        deadline=None,
        derandomize=EXAMPLES is None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


class Hang(Exception):
    """Raised by the guard's alarm: the call did not return within HANG_SECONDS."""


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


@contextmanager
def bounded(headroom: int = MEMORY_HEADROOM_BYTES, seconds: int = HANG_SECONDS) -> Iterator[None]:
    """Run the body with at most `headroom` more address space and at most `seconds`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + headroom
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)

    def alarm(_signum: int, _frame: Any) -> None:
        raise Hang(f"no return within {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, previous)


def only(errors: type[BaseException] | tuple[type[BaseException], ...], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, BaseException | None]:
    """Call fn under the guard: (result, None), or (None, the error) if it raised one of
    `errors`. Any other exception propagates and fails the property."""
    with bounded():
        try:
            return fn(*args, **kwargs), None
        except errors as exc:
            return None, exc


# -- valid inputs ------------------------------------------------------------------------------

_bytes_or_null = st.one_of(st.none(), st.binary(max_size=48))
_header = st.tuples(st.text(max_size=8), _bytes_or_null)

records_strategy = st.lists(
    st.builds(
        RecordInput,
        key=_bytes_or_null,
        value=_bytes_or_null,
        timestamp=st.integers(0, 2**41),
        headers=st.lists(_header, max_size=3),
    ),
    min_size=1,
    max_size=12,
)


@st.composite
def valid_batch(draw: st.DrawFn, codecs: list[int] = CODECS) -> tuple[bytearray, list[RecordInput]]:
    """(one encoded v2 batch, the records in it), any codec, sometimes LogAppendTime."""
    records = draw(records_strategy)
    codec = draw(st.sampled_from(codecs))
    append_time = draw(st.one_of(st.none(), st.integers(0, 2**41)))
    base_offset = draw(st.integers(0, 2**40))
    batch = encode_batch(base_offset, records, compression_type=codec, log_append_time=append_time)
    return batch, records


@st.composite
def valid_batches(draw: st.DrawFn, max_batches: int = 4) -> bytearray:
    """Several batches back to back, with increasing offsets, as in a .log file."""
    out = bytearray()
    offset = draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(1, max_batches))):
        batch, records = draw(valid_batch())
        struct.pack_into(">q", batch, 0, offset)
        offset += len(records)
        out += batch
    return out


# -- mutations ---------------------------------------------------------------------------------

# length, count and offset fields of the batch header, and values that break them
HEADER_FIELDS = [(0, ">q"), (8, ">i"), (12, ">i"), (16, ">b"), (21, ">h"), (23, ">i"), (27, ">q"),
                 (35, ">q"), (43, ">q"), (51, ">h"), (53, ">i"), (57, ">i")]
_LIMITS = {">b": 7, ">h": 15, ">i": 31, ">q": 63}


def _interesting(fmt: str) -> st.SearchStrategy[int]:
    bits = _LIMITS[fmt]
    edge = [0, 1, -1, 2, 48, 49, 61, 2**bits - 1, -(2**bits), 2 ** (bits - 1), 255, 65535]
    return st.one_of(
        st.sampled_from([v for v in edge if -(2**bits) <= v < 2**bits]),
        st.integers(-(2**bits), 2**bits - 1),
    )


@st.composite
def _mutation(draw: st.DrawFn, size: int) -> tuple:
    kinds = ["flip", "byte", "truncate", "insert", "delete", "duplicate", "varint"]
    if size >= HEADER_SIZE:
        kinds.append("field")
    kind = draw(st.sampled_from(kinds))
    at = draw(st.integers(0, max(size - 1, 0)))
    if kind == "flip":
        return kind, at, draw(st.integers(0, 7))
    if kind == "byte":
        return kind, at, draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]) | st.integers(0, 255))
    if kind == "truncate":
        return kind, draw(st.integers(0, size))
    if kind == "insert":
        return kind, at, draw(st.binary(min_size=1, max_size=16))
    if kind in ("delete", "duplicate"):
        return kind, at, draw(st.integers(1, 64))
    if kind == "varint":  # a record-level length or count that lies
        value = draw(st.sampled_from([-2, -1, 0, 1, 2**31 - 1, 2**62, -(2**63)]) | st.integers(-(2**63), 2**63 - 1))
        return kind, at, value
    position, fmt = draw(st.sampled_from(HEADER_FIELDS))
    return kind, position, fmt, draw(_interesting(fmt))


def apply_mutation(buf: bytearray, mutation: tuple) -> None:
    kind = mutation[0]
    if kind == "flip":
        if buf:
            buf[mutation[1] % len(buf)] ^= 1 << mutation[2]
    elif kind == "byte":
        if buf:
            buf[mutation[1] % len(buf)] = mutation[2]
    elif kind == "truncate":
        del buf[mutation[1] :]
    elif kind == "insert":
        at = mutation[1] % (len(buf) + 1)
        buf[at:at] = mutation[2]
    elif kind == "delete":
        if buf:
            at = mutation[1] % len(buf)
            del buf[at : at + mutation[2]]
    elif kind == "duplicate":  # a splice of the buffer into itself
        if buf:
            at = mutation[1] % len(buf)
            buf[at:at] = buf[at : at + mutation[2]]
    elif kind == "varint":
        if buf:
            from engine.records import varint_bytes

            at = mutation[1] % len(buf)
            encoded = varint_bytes(mutation[2])
            buf[at : at + len(encoded)] = encoded
    elif kind == "field":
        _, position, fmt, value = mutation
        if len(buf) >= position + struct.calcsize(fmt):
            struct.pack_into(fmt, buf, position, value)
    del buf[MAX_INPUT_BYTES:]


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes | bytearray], max_mutations: int = 4) -> bytearray:
    buf = bytearray(draw(base))
    for _ in range(draw(st.integers(1, max_mutations))):
        apply_mutation(buf, draw(_mutation(len(buf))))
    return buf


def fix_crc(buf: bytearray, position: int = 0) -> None:
    """Make the batch at `position` pass its CRC (and its length fit the buffer), so that the
    mutated bytes reach the record decoders instead of stopping at validate_batch()."""
    if len(buf) - position < HEADER_SIZE:
        return
    struct.pack_into(">i", buf, position + 8, len(buf) - position - LOG_OVERHEAD)
    buf[position + 16] = MAGIC_V2
    struct.pack_into(">I", buf, position + 17, crc32c(bytes(buf[position + 21 :])))


def frame_batch(payload: bytes, *, attributes: int = 0, count: int = 1, base_offset: int = 0,
                base_timestamp: int = 0, max_timestamp: int = 0, last_offset_delta: int | None = None) -> bytearray:
    """A v2 batch around an arbitrary records block, with a correct length and CRC."""
    out = bytearray(HEADER_SIZE) + payload
    delta = max(count - 1, 0) if last_offset_delta is None else last_offset_delta
    struct.pack_into(">qiib", out, 0, base_offset, len(out) - LOG_OVERHEAD, 0, MAGIC_V2)
    struct.pack_into(">hiqqqhii", out, 21, attributes, delta, base_timestamp, max_timestamp, -1, -1, -1, count)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return out


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32, for the header checksum of a hand-edited LZ4 frame descriptor."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    n, i = len(data), 0
    if n >= 16:
        acc = [(seed + p1 + p2) & mask, (seed + p2) & mask, seed & mask, (seed - p1) & mask]
        while i + 16 <= n:
            for lane in range(4):
                word = int.from_bytes(data[i : i + 4], "little")
                acc[lane] = (rotl((acc[lane] + word * p2) & mask, 13) * p1) & mask
                i += 4
        h = (rotl(acc[0], 1) + rotl(acc[1], 7) + rotl(acc[2], 12) + rotl(acc[3], 18)) & mask
    else:
        h = (seed + p5) & mask
    h = (h + n) & mask
    while i + 4 <= n:
        h = (rotl((h + int.from_bytes(data[i : i + 4], "little") * p3) & mask, 17) * p4) & mask
        i += 4
    while i < n:
        h = (rotl((h + data[i] * p5) & mask, 11) * p1) & mask
        i += 1
    h ^= h >> 15
    h = (h * p2) & mask
    h ^= h >> 13
    h = (h * p3) & mask
    h ^= h >> 16
    return h
