"""`python -m bench [--quick] [--only NAME,...]`: run the benchmarks, write results and plots.

For each benchmark: bench/results/NAME.json (command line, date, machine, parameters,
numbers, summary rows) and NAME.png; then summary.md, the table of every results file in
the directory. --quick writes to bench/results/quick/ instead, so a quick run never replaces
the reference numbers of a full run; a full run of the default directory also refreshes the
results table in bench/README.md. Scratch data goes to bench/work/ (gitignored) and is
deleted as each benchmark ends. --engine-ref REF measures engine/ as committed at REF instead
of the working tree (useful while someone is editing it, or to compare two commits).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

from . import BENCHMARKS
from .harness import (
    REPO,
    Context,
    CpuWitness,
    command_line,
    engine_from_commit,
    format_table,
    working_tree_engine,
    write_report,
)

BENCH_DIR = REPO / "bench"
README = BENCH_DIR / "README.md"
TABLE_START = "<!-- results-table:start (written by python -m bench) -->"
TABLE_END = "<!-- results-table:end -->"

# Scratch space each benchmark needs at most, in GB (full, quick); checked before starting.
SPACE_GB = {
    "append": (2.5, 1),
    "read": (2.5, 1),
    "lookup": (1.5, 0.5),
    "restart": (11.5, 1.5),
    "http_produce": (3, 1),
    "http_raw": (4, 1.5),
    "http_fetch": (1, 0.5),
    "compaction": (2, 0.5),
    "snapshot": (2.5, 0.6),
    "spark": (1.5, 0.5),
    "http_shards": (1.5, 0.5),
    "http_small": (1, 0.5),
    "http_fanout": (0.5, 0.5),
    "http_keys": (2.5, 0.5),
    "groups": (0.5, 0.5),
    "kafka_small": (3, 1),  # deleted topics linger file.delete.delay.ms (60 s): a few cells
    "kafka_consume": (2.5, 0.8),
    "keys_compaction": (2, 0.5),
    "scale": (8.5, 1),  # its largest active segment: 4 GB (EVENTLOG_BENCH_SCALE_DATA_GB=16: 16)
    "queues": (1, 0.5),
    "first_hour": (1.5, 0.5),  # a clone, its venv (<= 400 MB) and pip's cache (per run, deleted)
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: the whole suite in a couple of minutes"
    )
    parser.add_argument(
        "--only",
        default=",".join(BENCHMARKS),
        help=f"comma-separated subset of {','.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=BENCH_DIR / "work",
        help="scratch data (default bench/work)",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="default bench/results, or bench/results/quick with --quick",
    )
    parser.add_argument(
        "--plot-only",
        action="store_true",
        help="redraw the PNGs and tables from existing JSON files",
    )
    parser.add_argument(
        "--engine-ref",
        metavar="GIT_REF",
        help="measure engine/ as of this commit (extracted under the work dir), not the working tree",
    )
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    default_results = BENCH_DIR / "results" / ("quick" if args.quick else "")
    results_dir = (args.results_dir or default_results).resolve()
    work_dir = args.work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.plot_only:
        for name in names:
            if (results_dir / f"{_stem(name)}.json").exists():
                _plot(_module(name), results_dir / f"{_stem(name)}.json")
        _write_tables(results_dir, update_readme=not args.quick and args.results_dir is None)
        return 0

    ctx = Context(quick=args.quick, work_dir=work_dir, results_dir=results_dir, argv=argv)
    ctx.engine_source = (
        engine_from_commit(args.engine_ref, work_dir) if args.engine_ref else working_tree_engine()
    )

    # each benchmark deletes its data before the next starts: the largest one sets the need
    needed = max(SPACE_GB[n][1 if args.quick else 0] for n in names)
    free = shutil.disk_usage(work_dir).free / 1e9
    if free < needed * 1.2:
        print(
            f"not enough space in {work_dir}: {free:.1f} GB free, the largest benchmark needs ~{needed:.1f} GB",
            file=sys.stderr,
        )
        return 2

    ctx.log(
        f"{command_line(argv)}: {', '.join(names)} ({'quick' if args.quick else 'full'} run) -> {results_dir}"
    )
    ctx.log(f"engine: {ctx.engine_source}")
    suite_start = time.perf_counter()
    failed = []
    for name in names:
        module = _module(name)
        ctx.log(f"== {name}: {module.TITLE}")
        start = time.perf_counter()
        load_before = [round(x, 2) for x in os.getloadavg()]
        witness = CpuWitness()
        try:
            report = module.run(ctx)
        except Exception:  # noqa: BLE001 -- report it, run the others, exit non-zero
            traceback.print_exc()
            failed.append(name)
            continue
        elapsed = time.perf_counter() - start
        # other processes share the CPUs and the disk: the load says whether they were busy
        report["load_average_before"] = load_before
        report["cpu_during_run"] = witness.report()
        path = write_report(ctx, _stem(name), report, elapsed)
        _plot(module, path)
        ctx.log(
            f"== {name} done in {elapsed:.0f} s -> {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"
        )
    total = time.perf_counter() - suite_start
    _write_tables(
        results_dir, update_readme=not args.quick and args.results_dir is None and not failed
    )
    ctx.log(
        f"suite finished in {total:.0f} s ({total / 60:.1f} min){'; FAILED: ' + ', '.join(failed) if failed else ''}"
    )
    return 1 if failed else 0


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"bench.{name}")


def _stem(name: str) -> str:
    """The file stem of a benchmark's results: its module's NAME (http_shards writes
    shards.json), the module name when it has none."""
    return getattr(_module(name), "NAME", name)


def _plot(module: ModuleType, json_path: Path) -> None:
    """Draw the PNG from the JSON file, so a plot always shows what the file says."""
    document = json.loads(json_path.read_text())
    module.plot(document, json_path.with_suffix(".png"))


def _write_tables(results_dir: Path, *, update_readme: bool) -> None:
    """summary.md from every results file in `results_dir`; optionally the README table."""
    reports = []
    for name in BENCHMARKS:
        path = results_dir / f"{_stem(name)}.json"
        if path.exists():
            reports.append(json.loads(path.read_text()))
    if not reports:
        return
    header = "| benchmark | mode | date | elapsed | engine | CPU stolen by host / used by others | command |"
    lines = [header, "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in reports:
        engine = r.get("engine", {})
        commit = (engine.get("commit") or engine.get("head_commit") or "?")[:10]
        if engine.get("engine_dirty"):
            commit += " + uncommitted"
        cpu = r.get("cpu_during_run", {})
        # (a report written by a benchmark's own main before it went through the harness has
        # no mode, time or provenance: the table says so rather than failing)
        elapsed = f"{r['elapsed_seconds']:.0f} s" if "elapsed_seconds" in r else "?"
        lines.append(
            f"| {r['benchmark']} | {r.get('mode', '?')} | {r['date']} | {elapsed} | {commit} "
            f"| {cpu.get('steal_seconds', '?')} s / {cpu.get('cpu_seconds_other_processes', '?')} s "
            f"| `{r['command']}` |"
        )
    provenance = "\n".join(lines)
    table = format_table(reports)
    (results_dir / "summary.md").write_text(
        f"# Benchmark results ({results_dir.name})\n\nWritten by `python -m bench`; see bench/README.md.\n\n"
        f"{table}\n\n{provenance}\n"
    )
    if update_readme and README.exists():
        text = README.read_text()
        if TABLE_START in text and TABLE_END in text:
            head, rest = text.split(TABLE_START, 1)
            _, tail = rest.split(TABLE_END, 1)
            README.write_text(f"{head}{TABLE_START}\n{table}\n\n{provenance}\n{TABLE_END}{tail}")


if __name__ == "__main__":
    sys.exit(main())
