"""`eventlog dump-log`: print batches, records and index entries; --verify checks them all. A
.log is followed by the offsets recovery dropped within it (its partition's
dropped-offsets-checkpoint), and that file can be dumped too."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

from engine import dropped as dropped_offsets
from engine import filenames, key_index
from engine.control_records import ABORT, COMMIT, TYPE_NAMES, control_type, coordinator_epoch
from engine.dump import (
    LogDump,
    base_offset_of,
    index_size_problems,
    iter_log,
    read_offset_index,
    read_time_index,
    verify_offset_index,
    verify_time_index,
)
from engine.errors import StorageError
from engine.format import CODEC_NAMES, CONTROL_BIT, NO_TIMESTAMP, BatchHeader
from engine.producer_state import last_sequence
from engine.records import Record

PROGRESS_MIN_BYTES = 64 * 1024 * 1024

err = Console(stderr=True, highlight=False, soft_wrap=True)


def emit(line: str) -> None:
    """Data lines go straight to stdout: no markup interpretation, and fast for big dumps."""
    sys.stdout.write(line + "\n")


def _ts_kind(h: BatchHeader) -> str:
    return "LogAppendTime" if h.timestamp_type else "CreateTime"


def _batch_line(h: BatchHeader) -> str:
    """kafka-dump-log.sh's batch line (without its final `isvalid`)."""
    last_seq = last_sequence(h.base_sequence, h.last_offset_delta) if h.base_sequence >= 0 else -1
    horizon = f"OptionalLong[{h.base_timestamp}]" if h.has_delete_horizon else "OptionalLong.empty"
    return (
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
        f"baseSequence: {h.base_sequence} lastSequence: {last_seq} producerId: {h.producer_id} "
        f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
        f"isTransactional: {str(h.is_transactional).lower()} isControl: {str(h.is_control).lower()} "
        f"deleteHorizonMs: {horizon} "
        f"position: {h.position} {_ts_kind(h)}: {h.max_timestamp} size: {h.size} magic: {h.magic} "
        f"compresscodec: {CODEC_NAMES.get(h.compression, h.compression)} crc: {h.crc}"
    )


def _text(data: bytes) -> str:
    """Bytes as Kafka's StringDecoder prints them: UTF-8, invalid bytes as U+FFFD."""
    return data.decode("utf-8", "replace")


def _record_line(r: Record, h: BatchHeader, values: bool) -> str:
    """kafka-dump-log.sh's record line: metadata, a decoded control record, key and payload."""
    sequence = last_sequence(h.base_sequence, r.offset - h.base_offset) if h.base_sequence >= 0 else -1
    line = (
        f"| offset: {r.offset} {_ts_kind(h)}: {r.timestamp} "
        f"keySize: {-1 if r.key is None else len(r.key)} valueSize: {-1 if r.value is None else len(r.value)} "
        f"sequence: {sequence} headerKeys: [{','.join(k for k, _ in r.headers)}]"
    )
    if h.is_control:
        kind = control_type(r.key)
        if kind in (ABORT, COMMIT):
            line += f" endTxnMarker: {TYPE_NAMES[kind]} coordinatorEpoch: {coordinator_epoch(r.value)}"
        else:
            line += f" controlType: {TYPE_NAMES.get(kind, 'UNKNOWN')}({kind if kind is not None else -1})"
    elif values:
        if r.key is not None:
            line += f" key: {_text(r.key)}"
        if r.value is not None:
            line += f" payload: {_text(r.value)}"
    return line


def _dump_log_file(path: Path, *, verify: bool, records: bool, values: bool) -> LogDump:
    size = path.stat().st_size
    dump = LogDump(path, base_offset_of(path), size)
    emit(f"Dumping {path}")
    emit(f"Log starting offset: {dump.base_offset}")
    progress = None
    task = None
    if size >= PROGRESS_MIN_BYTES and err.is_terminal:
        progress = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(), console=err, transient=True)
        progress.start()
        task = progress.add_task(path.name, total=size)
    try:
        advance = (lambda n: progress.advance(task, n)) if progress is not None else None
        for report in iter_log(path, dump, check_crc=True, decode=records or verify, progress=advance):
            h = report.header
            emit(_batch_line(h) + f" isvalid: {'false' if report.error else 'true'}")
            if records and report.records is not None:
                for r in report.records:
                    emit(_record_line(r, h, values))
    finally:
        if progress is not None:
            progress.stop()
    if dump.valid_bytes < dump.size:
        emit(f"Found {dump.size - dump.valid_bytes} invalid bytes at the end of {path.name}")
    _dropped_in_segment(path, dump.base_offset)
    return dump


def _dropped_in_segment(path: Path, base: int) -> None:
    """The offsets recovery dropped within this segment's offsets (from its base offset up to the
    next segment's), from its partition's dropped-offsets-checkpoint when there is one."""
    try:
        ranges = dropped_offsets.read(path.parent)
    except (ValueError, StorageError) as exc:
        emit(f"note: {dropped_offsets.DROPPED_OFFSETS} beside it does not parse ({exc}); recovery rebuilds it")
        return
    if not ranges:
        return
    bases = [b for name in _names(path.parent) if (parsed := filenames.parse_segment_file(name)) and parsed[1] == filenames.LOG_SUFFIX
             and parsed[2] == "" and (b := parsed[0]) > base]
    end = min(bases, default=None)
    mine = tuple(r for r in ranges if r[1] >= base and (end is None or r[0] < end))
    if mine:
        emit(f"Offsets recovery dropped ({dropped_offsets.DROPPED_OFFSETS}): {dropped_offsets.describe(mine)}")


def _names(directory: Path) -> list[str]:
    try:
        return [p.name for p in directory.iterdir()]
    except OSError:
        return []


def _dump_dropped(path: Path, *, verify: bool) -> list[str]:
    """A partition's dropped-offsets-checkpoint (docs/FORMAT.md): its ranges, one a line."""
    emit(f"Dumping {path}")
    try:
        ranges = dropped_offsets.parse(path.read_bytes())
    except ValueError as exc:
        return [f"{path.name}: does not parse ({exc}); recovery rebuilds it from the .damaged files at the next start"]
    if not ranges:
        emit("no offsets dropped")
    for first, last in ranges:
        emit(f"dropped offsets: {first}-{last} ({last - first + 1} offsets)")
    return []


def _sibling_log(path: Path) -> Path:
    parsed = filenames.parse_segment_file(path.name)
    suffix = parsed[2] if parsed else ""
    return filenames.log_file(path.parent, base_offset_of(path), suffix)


def _dump_index(path: Path, *, verify: bool, time_index: bool) -> list[str]:
    emit(f"Dumping {path}")
    problems = index_size_problems(path, time_index)
    entries = read_time_index(path) if time_index else read_offset_index(path)
    if not entries and not time_index:
        emit(f"{path} is empty.")
    for a, b in entries:
        emit(f"timestamp: {a} offset: {b}" if time_index else f"offset: {a} position: {b}")
    if verify:
        log_path = _sibling_log(path)
        if not log_path.exists():
            problems.append(f"{path.name}: cannot verify, {log_path.name} is missing")
        else:
            dump = LogDump(log_path, base_offset_of(log_path), log_path.stat().st_size)
            for _ in iter_log(log_path, dump, check_crc=False, decode=False):
                pass
            check = verify_time_index if time_index else verify_offset_index
            problems += check(entries, dump, path.name)
    return problems


def _dump_key_index(path: Path, *, verify: bool) -> list[str]:
    """A key index's header (docs/FORMAT.md, "Key index"); with verify, its checks and its
    entries against the ones the .log beside it makes."""
    import numpy as np
    from crc32c import crc32c

    data = path.read_bytes()
    emit(f"Dumping {path}")
    if len(data) < key_index.HEADER.size:
        return [f"{path.name}: {len(data)} bytes, shorter than a key index header (it is rebuilt on first use)"]
    magic, version, _flags, base, nxt, logged, count, crc, _ = key_index.HEADER.unpack_from(data)
    emit(f"baseOffset: {base} nextOffset: {nxt} logSize: {logged} entries: {count} bytesPerEntry: {key_index.ENTRY_BYTES}")
    if not verify:
        return []
    problems = []
    body = data[key_index.HEADER.size:]
    if (magic, version) != (key_index.MAGIC, key_index.VERSION):
        return [f"{path.name}: not a key index (magic {magic!r}, version {version})"]
    if len(body) != key_index.ENTRY_BYTES * count or crc32c(body) != crc:
        return [f"{path.name}: damaged (its size or CRC-32C does not match; it is rebuilt on first use)"]
    stored = key_index.ClosedKeys(base, np.frombuffer(body, "<u8", count), np.frombuffer(body, "<u4", count, 8 * count),
                                  np.frombuffer(body, "<u4", count, 12 * count))
    log_path = path.with_name(path.name[: -len(key_index.KEY_INDEX_SUFFIX)] + filenames.LOG_SUFFIX)
    if not log_path.exists():
        return [f"{path.name}: no {log_path.name} beside it (recovery deletes it)"]
    if log_path.stat().st_size != logged:
        emit(f"note: {log_path.name} is {log_path.stat().st_size} bytes, the index was made from {logged}: "
             "not used, rebuilt on first use")
        return problems
    dump = LogDump(log_path, base_offset_of(log_path), logged)
    made = key_index.ActiveKeys(base)
    for report in iter_log(log_path, dump, check_crc=False, decode=True):
        for record in report.records or ():
            if record.key is not None and not report.header.attributes & CONTROL_BIT:
                made.add(key_index.key_hash(record.key), record.offset, report.header.position)
    expected = made.freeze()
    if not all(np.array_equal(getattr(expected, a), getattr(stored, a)) for a in ("hashes", "deltas", "positions")):
        problems.append(f"{path.name}: its entries differ from the keyed records of {log_path.name}")
    return problems


def run_dump(files: list[Path], *, verify: bool, records: bool, values: bool) -> int:
    problems: list[str] = []
    for path in files:
        parsed = filenames.parse_segment_file(path.name)
        kind = parsed[1] if parsed else path.suffix
        if kind == filenames.LOG_SUFFIX:
            problems += _dump_log_file(path, verify=verify, records=records, values=values).problems
        elif kind == filenames.INDEX_SUFFIX:
            problems += _dump_index(path, verify=verify, time_index=False)
        elif kind == filenames.TIME_INDEX_SUFFIX:
            problems += _dump_index(path, verify=verify, time_index=True)
        elif path.name.endswith(key_index.KEY_INDEX_SUFFIX):
            problems += _dump_key_index(path, verify=verify)
        elif path.name == dropped_offsets.DROPPED_OFFSETS:
            problems += _dump_dropped(path, verify=verify)
        else:
            problems.append(f"{path}: not a .log, .index, .timeindex, .keyindex or {dropped_offsets.DROPPED_OFFSETS} file")
    for problem in problems:
        err.print(f"[red]problem:[/red] {escape(problem)}")
    if verify and not problems:
        err.print(f"[green]verified {len(files)} file(s): no problems[/green]")
    return 1 if problems else 0


__all__ = ["run_dump", "NO_TIMESTAMP"]
