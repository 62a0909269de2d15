"""Coverage-guided fuzzing of the same readers with atheris (libFuzzer), for long runs.

Not collected by pytest and not a dependency: atheris installs from PyPI as a binary wheel for
CPython 3.11 on x86-64 Linux (`pip install atheris`). Run from the repository root:

    python -m tests.fuzz.atheris_targets TARGET [CORPUS_DIR] [libFuzzer flags]
    python -m tests.fuzz.atheris_targets batches /tmp/corpus-batches -max_total_time=600 -timeout=10 -rss_limit_mb=2048

TARGET is one of TARGETS below. An empty (or missing) CORPUS_DIR is seeded with valid inputs
(batches of every codec, a checkpoint, a manifest, metadata events), since random bytes rarely
pass the first check. Each target allows only the project's errors, as tests/fuzz does; any
other exception is a crash, which libFuzzer reports and saves as crash-<sha1> for replay
(`python -m tests.fuzz.atheris_targets TARGET crash-<sha1>`). libFuzzer's -rss_limit_mb and
-malloc_limit_mb catch huge allocations, -timeout a hang.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["engine", "analytics"]):
    from analytics.decoder import SnapshotCorruptError, decode_segment_rows
    from engine import compression
    from engine.checkpoints import format_checkpoint, read_checkpoint
    from engine.errors import CorruptBatchError, StorageError
    from engine.format import iter_batches, scan_valid_prefix
    from engine.metadata import MetadataImage, decode_event, encode_event
    from engine.records import (
        check_records_framing,
        decode_records,
        encode_batch,
        find_record_at_or_after,
    )
    from engine.snapshots import read_manifest

from .support import CODECS, fix_crc

_SCRATCH = Path(tempfile.mkdtemp(prefix="eventlog-atheris-"))
_SNAPSHOT_ID = "20260101T000000000Z-00a0f1"


def _batches(data: bytes) -> None:
    """First byte: fix the CRC (odd) or not; the rest: batches for every batch reader."""
    if not data:
        return
    buf = bytearray(data[1:])
    if data[0] & 1:
        fix_crc(buf)
    scan_valid_prefix(buf)
    try:
        for header in iter_batches(buf):
            check_records_framing(buf, header)
            decode_records(buf, header)
            find_record_at_or_after(buf, header, header.base_timestamp + data[0], 0)
    except CorruptBatchError:
        pass


def _decompress(data: bytes) -> None:
    if not data:
        return
    try:
        compression.decompress(CODECS[data[0] % len(CODECS)], data[1:], 1 << 24)
    except CorruptBatchError:
        pass


def _decoder(data: bytes) -> None:
    if not data:
        return
    buf = bytearray(data[1:])
    if data[0] & 1:
        fix_crc(buf)
    path = _SCRATCH / "00000000000000000000.log"
    path.write_bytes(buf)
    try:
        decode_segment_rows(path, len(buf))
    except SnapshotCorruptError:
        pass


def _checkpoint(data: bytes) -> None:
    path = _SCRATCH / "recovery-point-offset-checkpoint"
    path.write_bytes(data)
    try:
        read_checkpoint(path)
    except StorageError:
        pass


def _manifest(data: bytes) -> None:
    (_SCRATCH / _SNAPSHOT_ID).mkdir(exist_ok=True)
    (_SCRATCH / _SNAPSHOT_ID / "manifest.json").write_bytes(data)
    try:
        read_manifest(_SCRATCH, _SNAPSHOT_ID)
    except StorageError:
        pass


def _metadata(data: bytes) -> None:
    try:
        event = decode_event(data)
    except StorageError:
        return
    MetadataImage().apply(event)


TARGETS = {
    "batches": _batches,
    "decompress": _decompress,
    "decoder": _decoder,
    "checkpoint": _checkpoint,
    "manifest": _manifest,
    "metadata": _metadata,
}


def _seeds(target: str) -> list[bytes]:
    records = [(b"k%d" % i, b"value %d" % i, 1_000 + i, [("h", b"x")]) for i in range(5)]
    batches = [bytes(encode_batch(0, records, compression_type=codec)) for codec in CODECS]
    if target in ("batches", "decoder"):
        return [b"\x00" + b for b in batches] + [b"\x01" + b"".join(batches)]
    if target == "decompress":
        return [bytes([codec]) + compression.compress(codec, b"".join(batches)) for codec in CODECS[1:]]
    if target == "checkpoint":
        return [format_checkpoint({("orders", 0): 10, ("events", 3): 0}).encode()]
    if target == "manifest":
        return [(b'{"format_version": 1, "snapshot_id": "%s", "created_at": "2026-01-01T00:00:00Z", "topics": '
                 b'[{"name": "orders", "partitions": [{"partition": 0, "log_start_offset": 0, '
                 b'"high_watermark": 3, "segments": [{"size_bytes": 10}]}]}]}' % _SNAPSHOT_ID.encode())]
    return [encode_event("topic_created", "orders", "id", 1, partitions=3, configs={})[1]]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(f"usage: python -m tests.fuzz.atheris_targets {{{','.join(TARGETS)}}} [CORPUS_DIR] [libFuzzer flags]")
    target = argv[1]
    args = [argv[0], *argv[2:]]
    corpus = next((a for a in argv[2:] if not a.startswith("-")), None)
    if corpus is not None and not Path(corpus).is_file():
        os.makedirs(corpus, exist_ok=True)
        if not os.listdir(corpus):
            for i, seed in enumerate(_seeds(target)):
                Path(corpus, f"seed-{i}").write_bytes(seed)
    atheris.Setup(args, TARGETS[target])
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
