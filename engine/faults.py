"""Named crash points, for crash tests: the process kills itself at a chosen step.

`EVENTLOG_CRASH_AT=<point>[,<point>...]` (read once, at import) makes `crash_point(name)` send
SIGKILL to its own process when it reaches a listed point; `<point>@<n>` waits for the n-th
time. Unset (always, outside tests), a crash point is one failed truth test.

Points:
    swap.after_swap_rename      replace_segments: new segments renamed .cleaned -> .swap
    swap.after_deleted_rename   replace_segments: old segments renamed to .deleted
    swap.after_live_rename      replace_segments: .swap renamed to live names, list not published
    delete.after_deleted_rename delete_segments: segments renamed to .deleted
    clean.after_cleaned         a compaction pass wrote its .cleaned segments (in its process)
    clean.mid_recopy            a compaction pass is half way through writing a .cleaned segment
"""

from __future__ import annotations

import os
import signal

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
        os.kill(os.getpid(), signal.SIGKILL)
