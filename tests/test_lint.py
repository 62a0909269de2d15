"""The lint gate: ruff, with the rules pyproject.toml selects, over every tracked Python file.

Today's offenders are listed in tests/lint_ratchet.json (file -> rule -> count; tests/ratchet.py
says how a ratchet works): a file may not gain an offence of any rule, and the ratchet may only
shrink (`make lint-ratchet` writes it from the tree).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.ratchet import ROOT, Counts, Ratchet, count

RATCHET = Ratchet(Path(__file__).with_name("lint_ratchet.json"))


def offences() -> Counts:
    """{file: {rule: count}} of ruff's findings over the tree, as the ratchet keeps them."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "json", "--exit-zero",
         "--no-cache", "."],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return count((f["filename"], f["code"]) for f in json.loads(done.stdout))


def test_no_file_gains_a_lint_offence() -> None:
    worse = RATCHET.worse(offences())
    assert not worse, (
        "new lint offences (`.venv/bin/ruff check FILE` shows them; fix them, the ratchet only "
        "shrinks):\n" + "\n".join(worse)
    )


def test_the_ratchet_only_shrinks() -> None:
    stale = RATCHET.stale(offences())
    assert not stale, (
        "offences were mended: shrink the ratchet with `make lint-ratchet`\n" + "\n".join(stale)
    )


if __name__ == "__main__":  # make lint-ratchet
    RATCHET.write(offences())
