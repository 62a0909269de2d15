"""The lint gate: ruff, with the rules pyproject.toml selects, over every tracked Python file.

Today's offenders are listed in tests/lint_ratchet.json (file -> rule -> count), as Kafka's
checkstyle keeps a suppressions file: a file may not gain an offence of any rule, and the
ratchet may only shrink. A change that removes offences must shrink it too (`make
lint-ratchet` writes it from the tree), so what was mended cannot come back unseen. A new
module starts clean: it has no entry.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RATCHET = Path(__file__).with_name("lint_ratchet.json")


def offences() -> dict[str, dict[str, int]]:
    """{file: {rule: count}} of ruff's findings over the tree, as the ratchet keeps them."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "json", "--exit-zero", "--no-cache", "."],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    counts: Counter[tuple[str, str]] = Counter()
    for finding in json.loads(done.stdout):
        path = Path(finding["filename"]).resolve().relative_to(ROOT).as_posix()
        counts[(path, finding["code"] or "syntax")] += 1
    out: dict[str, dict[str, int]] = {}
    for (path, code), n in sorted(counts.items()):
        out.setdefault(path, {})[code] = n
    return out


def _allowed() -> dict[str, dict[str, int]]:
    return json.loads(RATCHET.read_text())


def test_no_file_gains_a_lint_offence() -> None:
    allowed = _allowed()
    worse = [
        f"{path}: {code} {n} (allowed {allowed.get(path, {}).get(code, 0)})"
        for path, codes in offences().items()
        for code, n in codes.items()
        if n > allowed.get(path, {}).get(code, 0)
    ]
    assert not worse, (
        "new lint offences (`.venv/bin/ruff check FILE` shows them; fix them, the ratchet only shrinks):\n"
        + "\n".join(worse)
    )


def test_the_ratchet_only_shrinks() -> None:
    found = offences()
    stale = [
        f"{path}: {code} allowed {n}, found {found.get(path, {}).get(code, 0)}"
        for path, codes in _allowed().items()
        for code, n in codes.items()
        if n > found.get(path, {}).get(code, 0)
    ]
    assert not stale, "offences were mended: shrink the ratchet with `make lint-ratchet`\n" + "\n".join(stale)


if __name__ == "__main__":  # make lint-ratchet
    RATCHET.write_text(json.dumps(offences(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {RATCHET.relative_to(ROOT)}")
