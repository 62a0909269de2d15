"""Fault injection for tests: named crash points, and I/O errors or delays in the file layer.

Crash points

`EVENTLOG_CRASH_AT=<point>[,<point>...]` (read once, at import) makes `crash_point(name)` send
SIGKILL to its own process when it reaches a listed point (a shard of a family to its supervisor
first: the whole server dies); `<point>@<n>` waits for the n-th time. Unset (always, outside tests), a crash point is one failed truth test.

Points:
    swap.after_swap_rename      replace_segments: new segments renamed .cleaned -> .swap
    swap.after_deleted_rename   replace_segments: old segments renamed to .deleted
    swap.after_live_rename      replace_segments: .swap renamed to live names, list not published
    delete.after_deleted_rename delete_segments: segments renamed to .deleted
    clean.after_cleaned         a compaction pass wrote its .cleaned segments (in its process)
    clean.mid_recopy            a compaction pass is half way through writing a .cleaned segment
    repair.after_cleaned        recovery wrote a repaired segment as .cleaned, not yet renamed
    kafka.produce.after_append  a Kafka Produce request's records are durable, its answer unsent
"""

from __future__ import annotations

import errno as errno_module
import os
import signal
import threading
import time

import orjson

_TARGETS: dict[str, int] = {}
for _item in filter(None, (os.environ.get("EVENTLOG_CRASH_AT") or "").split(",")):
    _name, _, _nth = _item.strip().partition("@")
    _TARGETS[_name] = int(_nth or 1)
_SEEN: dict[str, int] = {}


def crash_point(name: str) -> None:
    if not _TARGETS or name not in _TARGETS:
        return
    _SEEN[name] = _SEEN.get(name, 0) + 1
    if _SEEN[name] >= _TARGETS[name]:
        _supervisor_goes_too()
        os.kill(os.getpid(), signal.SIGKILL)


def _supervisor_goes_too() -> None:
    """A shard of a family (eventlog serve --processes N) takes its supervisor with it, and so
    the whole family (PR_SET_PDEATHSIG): the point is a crash of the server, as in a single
    process. A compaction worker process (its parent is a shard) dies alone."""
    identity = os.environ.get("EVENTLOG_SHARD")
    if not identity:
        return
    supervisor = orjson.loads(identity).get("supervisor_pid")
    if supervisor and os.getppid() == supervisor:
        os.kill(supervisor, signal.SIGKILL)
        # let it be gone (its death SIGKILLs every shard, this one included) before this shard
        # dies: a sibling must not see this one's socket close first and answer a request
        deadline = time.monotonic() + 5
        while os.getppid() == supervisor and time.monotonic() < deadline:
            time.sleep(0.001)


# ---------------------------------------------------------------------------------------------
# I/O faults
#
# `EVENTLOG_FAULTS_FILE=<path>` (read at import) names a JSON file of rules that the engine's
# file layer (engine/fileutil.py: write, fsync and read of segment data) consults before each
# call. The file is re-read whenever it changes, so a test can inject and lift faults in a
# running server by rewriting it. Unset (always, outside tests), a check is one truth test.
#
#     {"rules": [{"op": "write" | "fsync" | "read" | "syncfs",
#                 "path": "orders-0/",          substring of the file's path ("" = any)
#                 "errno": "ENOSPC" | "EIO" | ..., or
#                 "delay_ms": 200,              sleep first (a slow disk), then do the call
#                 "times": 3}]}                 fire this often, then stop (default: always)

FAULTS_FILE = os.environ.get("EVENTLOG_FAULTS_FILE") or None
IO_OPS = ("write", "fsync", "read", "syncfs")
_rules: list[dict] = []
_rules_version: int | None = None
_rules_lock = threading.Lock()


def _load_rules() -> list[dict]:
    global _rules, _rules_version
    assert FAULTS_FILE is not None
    try:
        version = os.stat(FAULTS_FILE).st_mtime_ns
    except FileNotFoundError:
        version = None
    if version == _rules_version:
        return _rules
    with _rules_lock:
        rules: list[dict] = []
        if version is not None:
            try:
                with open(FAULTS_FILE, "rb") as f:
                    doc = orjson.loads(f.read() or b"{}")
                rules = [dict(r) for r in doc.get("rules", [])]
            except (OSError, orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                return _rules  # being rewritten: keep the old rules until it parses
        _rules, _rules_version = rules, version
        return rules


def fault_pending(op: str, fd: int) -> bool:
    """Whether a rule would act on `op` on `fd` now (nothing consumed, nothing slept): a file a
    rule targets is synced on its own, where the rule acts (engine/commits.py)."""
    if FAULTS_FILE is None:
        return False
    rules = _load_rules()
    if not rules:
        return False
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        path = ""
    return any(r.get("op") == op and r.get("path", "") in path and r.get("times", -1) != 0 for r in rules)


def io_fault(op: str, fd: int) -> None:
    """Called by the file layer before `op` on `fd`: sleeps and/or raises OSError as the rules
    say. A no-op unless EVENTLOG_FAULTS_FILE is set."""
    if FAULTS_FILE is None:
        return
    rules = _load_rules()
    if not rules:
        return
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        path = ""
    for rule in rules:
        if rule.get("op") != op or rule.get("path", "") not in path:
            continue
        with _rules_lock:
            times = rule.get("times", -1)
            if times == 0:
                continue
            if times > 0:
                rule["times"] = times - 1
        if rule.get("delay_ms"):
            time.sleep(rule["delay_ms"] / 1000)
        name = rule.get("errno")
        if name:
            code = getattr(errno_module, name, errno_module.EIO)
            raise OSError(code, f"{os.strerror(code)} (injected)", path)
