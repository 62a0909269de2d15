"""The type gate: mypy, configured in pyproject.toml ([tool.mypy]), over api/ and broker/.

They are checked against the engine's typed face (engine/interface.py: Engine, Topic,
Partition, Groups), which mypy in turn holds every engine implementation to (a LogManager, a
PartitionLog and a FollowedPartition, GroupOffsets and RemoteGroups): a transport that uses
what a follower shard's partition lacks, or an engine change that takes away what a router
uses, fails here. The engine's and the workers' own findings are not reported (they are read
for their types only).

Today's offenders are listed in tests/types_ratchet.json (file -> error code -> count), as
tests/lint_ratchet.json lists ruff's: a file may not gain an error of any code, and the ratchet
may only shrink. A change that removes errors must shrink it too (`make types-ratchet` writes it
from the tree), so what was mended cannot come back unseen. A new module starts clean: it has
no entry. mypy keeps its incremental cache in .mypy_cache: a run after the first takes seconds.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RATCHET = Path(__file__).with_name("types_ratchet.json")


@functools.cache
def errors() -> dict[str, dict[str, int]]:
    """{file: {error code: count}} of mypy's errors over what pyproject.toml names, as the
    ratchet keeps them (run once per session: both tests read the same findings)."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--output", "json"],
        cwd=ROOT, capture_output=True, text=True,
    )
    # 0: no errors, 1: errors found; anything else (2) is mypy failing to run at all
    assert done.returncode in (0, 1), (
        f"mypy failed to run ({done.returncode}):\n{done.stderr}{done.stdout}"
    )
    counts: Counter[tuple[str, str]] = Counter()
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue  # (a summary line, should mypy print one)
        finding = json.loads(line)
        if finding["severity"] != "error":
            continue  # notes explain the error before them
        path = Path(finding["file"]).resolve().relative_to(ROOT).as_posix()
        counts[(path, finding["code"] or "syntax")] += 1
    out: dict[str, dict[str, int]] = {}
    for (path, code), n in sorted(counts.items()):
        out.setdefault(path, {})[code] = n
    return out


def _allowed() -> dict[str, dict[str, int]]:
    return json.loads(RATCHET.read_text())


def test_no_file_gains_a_type_error() -> None:
    allowed = _allowed()
    worse = [
        f"{path}: {code} {n} (allowed {allowed.get(path, {}).get(code, 0)})"
        for path, codes in errors().items()
        for code, n in codes.items()
        if n > allowed.get(path, {}).get(code, 0)
    ]
    assert not worse, (
        "new type errors (`.venv/bin/mypy` shows them; fix them, the ratchet only shrinks):\n"
        + "\n".join(worse)
    )


def test_the_ratchet_only_shrinks() -> None:
    found = errors()
    stale = [
        f"{path}: {code} allowed {n}, found {found.get(path, {}).get(code, 0)}"
        for path, codes in _allowed().items()
        for code, n in codes.items()
        if n > found.get(path, {}).get(code, 0)
    ]
    assert not stale, (
        "type errors were mended: shrink the ratchet with `make types-ratchet`\n" + "\n".join(stale)
    )


if __name__ == "__main__":  # make types-ratchet
    RATCHET.write_text(json.dumps(errors(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {RATCHET.relative_to(ROOT)}")
