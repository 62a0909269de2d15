"""A ratchet over a checker's findings (tests/test_lint.py: ruff; tests/test_types.py: mypy),
as Kafka's checkstyle keeps a suppressions file.

The ratchet file lists today's offenders, {file: {code: count}}: a file may not gain a finding
of any code, and the file may only shrink. A change that removes findings must shrink it too
(its `make` target writes it from the tree), so what was mended cannot come back unseen. A new
module starts clean: it has no entry.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
Counts = dict[str, dict[str, int]]


def count(findings: Iterable[tuple[str, str | None]]) -> Counts:
    """{file relative to the repository: {code: count}} of (file name, code) findings; a
    finding with no code is a syntax error."""
    counts: Counter[tuple[str, str]] = Counter()
    for filename, code in findings:
        path = Path(filename).resolve().relative_to(ROOT).as_posix()
        counts[(path, code or "syntax")] += 1
    out: Counts = {}
    for (path, code), n in sorted(counts.items()):
        out.setdefault(path, {})[code] = n
    return out


class Ratchet:
    def __init__(self, path: Path) -> None:
        self.path = path

    def allowed(self) -> Counts:
        return json.loads(self.path.read_text())

    def worse(self, found: Counts) -> list[str]:
        """Each file and code with more findings than the ratchet allows."""
        allowed = self.allowed()
        return [
            f"{path}: {code} {n} (allowed {allowed.get(path, {}).get(code, 0)})"
            for path, codes in found.items()
            for code, n in codes.items()
            if n > allowed.get(path, {}).get(code, 0)
        ]

    def stale(self, found: Counts) -> list[str]:
        """Each file and code the ratchet allows more of than are found: it must shrink."""
        return [
            f"{path}: {code} allowed {n}, found {found.get(path, {}).get(code, 0)}"
            for path, codes in self.allowed().items()
            for code, n in codes.items()
            if n > found.get(path, {}).get(code, 0)
        ]

    def write(self, found: Counts) -> None:
        self.path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {self.path.relative_to(ROOT)}")
