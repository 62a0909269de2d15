"""bench/performance_table.py: goals read from results files, the table written between the
markers of PERFORMANCE.md with the prose around them kept, the plot drawn."""

from __future__ import annotations

import json
from pathlib import Path

from bench.performance_table import END, START, goal_rows, main, parse_goal, replace_between_markers


def _report(name: str, rows: list[dict], *, dirty: bool = False) -> dict:
    return {
        "benchmark": name,
        "command": "/somewhere/.venv/bin/python -m bench --only " + name,
        "date": "2026-11-23T10:00:00+00:00",
        "engine": {"source": "working tree", "head_commit": "0123456789abcdef", "engine_dirty": dirty},
        "summary": rows,
    }


def _row(metric: str, ratio: float, goal: str, passed: bool | None) -> dict:
    return {"metric": metric, "measured": "m", "reference": "r", "ratio": ratio, "goal": goal, "passed": passed}


def test_parse_goal() -> None:
    assert parse_goal(">= 0.8") == (">=", 0.8)
    assert parse_goal("MB/s / 100 >= 1") == (">=", 1.0)
    assert parse_goal("p99 / 50 us <= 1") == ("<=", 1.0)
    assert parse_goal("<= 1 s: nothing before the recovery point is read") == ("<=", 1.0)
    assert parse_goal("(informational)") is None


def test_goal_rows_keep_goals_and_moonshots_only(tmp_path: Path) -> None:
    (tmp_path / "append.json").write_text(json.dumps(_report("append", [
        _row("a goal met", 1.4, ">= 0.8", True),
        _row("informational", 0.3, "(informational)", None),
    ])))
    (tmp_path / "http_produce.json").write_text(json.dumps(_report("http_produce", [
        _row("moonshot: wrk vs redis-benchmark", 0.2, "(informational)", None),
        _row("a goal missed", 1.5, ">= 2.0", False),
    ], dirty=True)))
    (tmp_path / "profile.json").write_text(json.dumps({"scenarios": {}}))  # not a benchmark: skipped
    rows = goal_rows(tmp_path)
    assert [(r["benchmark"], r["metric"], r["passed"]) for r in rows] == [
        ("append", "a goal met", True),
        ("http_produce", "moonshot: wrk vs redis-benchmark", False),
        ("http_produce", "a goal missed", False),
    ]
    assert rows[1]["goal"] == ">= 1.0 (moonshot)"
    assert rows[0]["commit"] == "0123456789" and rows[2]["commit"] == "0123456789+dirty"


def test_the_table_replaces_only_what_lies_between_the_markers(tmp_path: Path) -> None:
    doc = f"# Performance\n\nprose before\n\n{START}\nold table\n{END}\n\nprose after\n"
    out = replace_between_markers(doc, "new table\n")
    assert out == f"# Performance\n\nprose before\n\n{START}\nnew table\n{END}\n\nprose after\n"
    assert replace_between_markers(out, "new table\n") == out  # idempotent
    assert replace_between_markers("# P\n", "t\n") == f"# P\n\n{START}\nt\n{END}\n"  # markers added


def test_main_writes_the_table_and_the_plot(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "read.json").write_text(json.dumps(_report("read", [_row("fetch", 0.7, ">= 0.5", True)])))
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text(f"intro\n{START}\n{END}\nwhy\n")
    assert main(["--results-dir", str(results), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("why\n")
    assert "| 1 | read | fetch | m | r | 0.7 | >= 0.5 | yes | `/somewhere/.venv/bin/python -m bench --only read` |" in text
    assert "1 of 1 goals met" in text
    assert (results / "performance.png").stat().st_size > 0
    assert main(["--results-dir", str(tmp_path / "empty"), "--doc", str(doc)]) == 1
