"""`python -m bench.performance_table`: the goals of every benchmark in one table and one plot.

Reads bench/results/*.json (each benchmark's summary rows: metric, measured, reference, the
ratio to its peer, the goal, met or not) and writes:

* the table between the two marker comments of docs/PERFORMANCE.md (the prose around them is
  kept as it is, so re-running this script after a benchmark refreshes only the numbers);
* bench/results/performance.png: every ratio as a bar (log axis) with its goal as a red mark.

A row is a goal when the benchmark set one (`passed` is true or false). The moonshot rows of
http_produce (JSON produce from wrk against redis-benchmark, the C clients) are informational
in the benchmark; the issue set them a goal of >= 1, so they are listed as such, marked
moonshot. Each row names the command that produced its file and the commit it measured
(`+dirty` when the measured code had uncommitted changes).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "PERFORMANCE.md"
PLOT = RESULTS / "performance.png"
START = "<!-- performance-table:start (written by python -m bench.performance_table) -->"
END = "<!-- performance-table:end -->"

# benchmarks in the order of the issues that set their goals
ORDER = ("append", "read", "lookup", "restart", "http_raw", "http_produce", "compaction", "snapshot", "spark")
MOONSHOT_GOAL = ">= 1.0 (moonshot)"
_GOAL = re.compile(r"(>=|<=)\s*([0-9]+(?:\.[0-9]+)?)")


def parse_goal(goal: str) -> tuple[str, float] | None:
    """The first comparison in a goal text: '>= 0.8' -> ('>=', 0.8); 'MB/s / 100 >= 1' ->
    ('>=', 1.0); None when there is none ('(informational)')."""
    match = _GOAL.search(goal)
    return (match.group(1), float(match.group(2))) if match else None


def commit_of(report: dict[str, Any]) -> str:
    """The commit the report measured: --engine-ref's, else HEAD of the working tree, with
    '+dirty' when engine/ (or workers/, for compaction) had uncommitted changes."""
    engine = report.get("engine") or {}
    commit = engine.get("commit") or engine.get("head_commit") or "?"
    dirty = bool(engine.get("engine_dirty"))
    workers = (report.get("params") or {}).get("workers_source") or {}
    dirty = dirty or bool(workers.get("workers_dirty"))
    return commit[:10] + ("+dirty" if dirty else "")


def goal_rows(results_dir: Path) -> list[dict[str, Any]]:
    """Every summary row with a goal, from every results file, in ORDER then name order."""
    files = sorted(results_dir.glob("*.json"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p.stem))
    rows = []
    for path in files:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{path}: not a results file ({exc})") from None
        if "summary" not in report or "benchmark" not in report:
            continue
        for row in report["summary"]:
            goal, passed = row.get("goal", ""), row.get("passed")
            moonshot = row.get("metric", "").startswith("moonshot")
            if passed is None and not moonshot:
                continue
            if moonshot:
                goal = MOONSHOT_GOAL
            parsed = parse_goal(goal)
            ratio = row.get("ratio")
            if passed is None and parsed is not None and ratio is not None:
                op, target = parsed
                passed = ratio >= target if op == ">=" else ratio <= target
            rows.append(
                {
                    "benchmark": report["benchmark"],
                    "metric": row["metric"],
                    "measured": row.get("measured", ""),
                    "reference": row.get("reference", ""),
                    "ratio": ratio,
                    "goal": goal,
                    "goal_parsed": parsed,
                    "passed": passed,
                    "moonshot": moonshot,
                    "command": report.get("command", "").replace(f"{REPO}/", ""),
                    "commit": commit_of(report),
                    "date": (report.get("date") or "")[:10],
                }
            )
    return rows


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def format_ratio(ratio: float | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio:.3g}" if ratio < 10 else f"{ratio:,.0f}"


def table_markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| # | benchmark | goal (metric) | measured | reference (same run) | ratio | goal | met | command | commit, date |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = []
    for i, r in enumerate(rows, 1):
        met = "yes" if r["passed"] else "**no**"
        lines.append(
            f"| {i} | {r['benchmark']} | {_cell(r['metric'])} | {_cell(r['measured'])} | {_cell(r['reference'])} | "
            f"{format_ratio(r['ratio'])} | {_cell(r['goal'])} | {met} | `{_cell(r['command'])}` | "
            f"{r['commit']}, {r['date']} |"
        )
    met = sum(1 for r in rows if r["passed"])
    return head + "\n".join(lines) + f"\n\n{met} of {len(rows)} goals met. Plot: `bench/results/performance.png`.\n"


def replace_between_markers(text: str, body: str) -> str:
    """`text` with what lies between START and END replaced by `body`; the markers are added at
    the end when missing. Everything outside them is kept byte for byte."""
    block = f"{START}\n{body}{END}"
    if START in text and END in text:
        before, rest = text.split(START, 1)
        _old, after = rest.split(END, 1)
        return before + block + after
    return text.rstrip("\n") + "\n\n" + block + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["ratio"] is not None and r["goal_parsed"] is not None]
    fig, ax = plt.subplots(figsize=(15, 0.38 * len(shown) + 1.8))
    ys = list(range(len(shown)))[::-1]
    for y, r in zip(ys, shown):
        color = "tab:green" if r["passed"] else "tab:red"
        ax.barh(y, r["ratio"], 0.7, color=color, alpha=0.45 if r["moonshot"] else 0.8)
        op, target = r["goal_parsed"]
        ax.plot([target, target], [y - 0.45, y + 0.45], color="black", linewidth=2.2)
        ax.annotate(
            f" {format_ratio(r['ratio'])} ({op} {target:g})", (r["ratio"], y), va="center", fontsize=7.5
        )
    labels = [f"{i}. {r['benchmark']}: {r['metric'][:100]}" for i, r in enumerate(rows, 1) if r in shown]
    ax.set_yticks(ys, labels, fontsize=7.5)
    ax.set_xscale("log")
    ax.set_xlim(min(0.01, min(r["ratio"] for r in shown) / 2), max(10, max(r["ratio"] for r in shown) * 3))
    ax.set_xlabel("ratio to the peer (log); black mark: the goal (green met, red not; pale: moonshot)")
    ax.set_title("every performance goal: measured ratio against its goal (docs/PERFORMANCE.md)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.performance_table", description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--plot", type=Path, default=None, help="default: performance.png in the results dir")
    args = parser.parse_args(argv)
    rows = goal_rows(args.results_dir)
    if not rows:
        print(f"no results with goals in {args.results_dir}", file=sys.stderr)
        return 1
    text = args.doc.read_text() if args.doc.exists() else "# Performance\n"
    args.doc.write_text(replace_between_markers(text, table_markdown(rows)))
    plot(rows, args.plot or args.results_dir / "performance.png")
    print(f"{len(rows)} goals ({sum(1 for r in rows if r['passed'])} met) -> {args.doc}, {args.plot or args.results_dir / 'performance.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
