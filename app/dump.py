"""`eventlog dump-log`: print batches, records and index entries; --verify checks them all."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

from engine import filenames
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
from engine.format import CODEC_NAMES, NO_TIMESTAMP

PROGRESS_MIN_BYTES = 64 * 1024 * 1024

err = Console(stderr=True, highlight=False, soft_wrap=True)


def emit(line: str) -> None:
    """Data lines go straight to stdout: no markup interpretation, and fast for big dumps."""
    sys.stdout.write(line + "\n")


def _batch_line(h) -> str:
    ts_kind = "LogAppendTime" if h.timestamp_type else "CreateTime"
    last_seq = h.base_sequence + h.last_offset_delta if h.base_sequence >= 0 else -1
    return (
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
        f"baseSequence: {h.base_sequence} lastSequence: {last_seq} producerId: {h.producer_id} "
        f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
        f"isTransactional: {str(h.is_transactional).lower()} isControl: {str(h.is_control).lower()} "
        f"position: {h.position} {ts_kind}: {h.max_timestamp} size: {h.size} magic: {h.magic} "
        f"compresscodec: {CODEC_NAMES.get(h.compression, h.compression)} crc: {h.crc}"
    )


def _record_line(r, ts_kind: str, values: bool) -> str:
    line = (
        f"| offset: {r.offset} {ts_kind}: {r.timestamp} "
        f"keySize: {-1 if r.key is None else len(r.key)} valueSize: {-1 if r.value is None else len(r.value)} "
        f"headerKeys: [{', '.join(k for k, _ in r.headers)}]"
    )
    if values:
        line += f" key: {r.key!r} payload: {r.value!r}"
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
                ts_kind = "LogAppendTime" if h.timestamp_type else "CreateTime"
                for r in report.records:
                    emit(_record_line(r, ts_kind, values))
    finally:
        if progress is not None:
            progress.stop()
    return dump


def _sibling_log(path: Path) -> Path:
    parsed = filenames.parse_segment_file(path.name)
    suffix = parsed[2] if parsed else ""
    return filenames.log_file(path.parent, base_offset_of(path), suffix)


def _dump_index(path: Path, *, verify: bool, time_index: bool) -> list[str]:
    emit(f"Dumping {path}")
    entry_size = 12 if time_index else 8
    problems = index_size_problems(path, entry_size)
    entries = read_time_index(path) if time_index else read_offset_index(path)
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
        else:
            problems.append(f"{path}: not a .log, .index or .timeindex file")
    for problem in problems:
        err.print(f"[red]problem:[/red] {escape(problem)}")
    if verify and not problems:
        err.print(f"[green]verified {len(files)} file(s): no problems[/green]")
    return 1 if problems else 0


__all__ = ["run_dump", "NO_TIMESTAMP"]
