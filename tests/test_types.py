"""The type gate: mypy, configured in pyproject.toml ([tool.mypy]), over api/ and broker/.

They are checked against the engine's typed face (engine/interface.py: Engine, Topic,
Partition, Groups), which mypy in turn holds every engine implementation to (a LogManager, a
PartitionLog and a FollowedPartition, GroupOffsets and RemoteGroups): a transport that uses
what a follower shard's partition lacks, or an engine change that takes away what a router
uses, fails here. The engine's and the workers' own findings are not reported (they are read
for their types only).

Today's offenders are listed in tests/types_ratchet.json (file -> error code -> count), as
tests/lint_ratchet.json lists ruff's (tests/ratchet.py says how a ratchet works): a file may not
gain an error of any code, and the ratchet may only shrink (`make types-ratchet` writes it from
the tree). mypy keeps its incremental cache in .mypy_cache: a run after the first takes seconds.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

from tests.ratchet import ROOT, Counts, Ratchet, count

RATCHET = Ratchet(Path(__file__).with_name("types_ratchet.json"))


@functools.cache
def errors() -> Counts:
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
    findings = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    # (a line not JSON is a summary line, should mypy print one; notes explain the error before)
    return count((f["file"], f["code"]) for f in findings if f["severity"] == "error")


def test_no_file_gains_a_type_error() -> None:
    worse = RATCHET.worse(errors())
    assert not worse, (
        "new type errors (`.venv/bin/mypy` shows them; fix them, the ratchet only shrinks):\n"
        + "\n".join(worse)
    )


def test_the_ratchet_only_shrinks() -> None:
    stale = RATCHET.stale(errors())
    assert not stale, (
        "type errors were mended: shrink the ratchet with `make types-ratchet`\n" + "\n".join(stale)
    )


if __name__ == "__main__":  # make types-ratchet
    RATCHET.write(errors())
