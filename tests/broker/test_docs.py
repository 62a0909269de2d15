"""docs/KAFKA.md's table of served APIs is the listener's own table (broker/protocol.APIS)."""

from __future__ import annotations

import re
from pathlib import Path

import broker.apis  # noqa: F401  (registers every API)
from broker.protocol import APIS

DOC = Path(__file__).resolve().parents[2] / "docs" / "KAFKA.md"


def test_the_documented_apis_are_the_served_ones() -> None:
    text = DOC.read_text()
    table = text[text.index("<!-- api-table:start") : text.index("<!-- api-table:end")]
    documented = {
        int(key): (name, int(low), int(high))
        for key, name, low, high in re.findall(
            r"^\| (\d+) \| (\w+) \| (\d+)–(\d+) \|$", table, re.M
        )
    }
    served = {a.key: (a.name, a.min_version, a.max_version) for a in APIS.values()}
    assert documented == served
