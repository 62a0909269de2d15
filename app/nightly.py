"""`eventlog nightly`: the nightly Spark job on a local session, with a progress display."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def run_nightly_cli(
    snapshot: str, out_dir: str, topics: list[str] | None, *, master: str, memory: str, full: bool = False,
    schemas: list[str] | None = None,
) -> int:
    from analytics.nightly import (
        check_out,
        parse_schemas,
        resolve_snapshot,
        run_nightly,
        snapshot_topics,
    )
    from analytics.schemas import load_value_schema

    try:
        check_out(out_dir)
        by_topic = parse_schemas(schemas or [])
        for text in by_topic.values():  # a bad schema fails here, before Spark starts
            load_value_schema(Path(text) if Path(text).is_file() else text)
    except ValueError as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        return 2
    from analytics.session import local_session

    target = Path(out_dir.removeprefix("file://"))
    try:
        snapshot = resolve_snapshot(snapshot)
    except OSError as exc:  # FileNotFoundError, or the storage's error (credentials, endpoint)
        err.print(f"[red]{escape(str(exc))}[/red]")
        return 2

    try:
        names = {t["name"] for t in snapshot_topics(snapshot, topics)}
        unknown = sorted(set(by_topic) - names)
        if unknown:
            raise ValueError(f"--schema names topics this run does not read: {', '.join(unknown)}")
    except ValueError as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        return 2
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=False) as progress:
        current = progress.add_task("starting Spark", total=None)
        spark = local_session("eventlog-nightly", master=master, memory=memory)

        def step(description: str) -> None:
            nonlocal current
            progress.update(current, completed=1, total=1)
            current = progress.add_task(description, total=None)

        try:
            result = run_nightly(spark, snapshot, target, topics=topics, step=step, full=full, schemas=by_topic)
        finally:
            progress.update(current, completed=1, total=1)
            spark.stop()
    print_summary(out, result, target)
    return 0


# the width a summary is printed at where stdout is no terminal (a log, a pipe): rich would cut
# it to 80 columns, folding paths and titles; a table takes only the width its cells need
UNBOUNDED_WIDTH = 10_000


def print_summary(console: Console, result: Any, target: Path) -> None:
    """The run's table, its daily counts and where _SUMMARY.json is: whole lines where
    stdout is not a terminal, the terminal's width where it is."""
    if not console.is_terminal:
        console = Console(file=console.file, highlight=False, soft_wrap=True, width=UNBOUNDED_WIDTH)
    kind = "incremental" if result.incremental else "full"
    table = Table("topic", "compacted", "offsets read", "lost to retention", "table rows", "output",
                  title=f"nightly: snapshot {result.snapshot_id}, run {result.run} ({kind})")
    for t in result.topics:
        table.add_row(
            t.topic, "yes" if t.compacted else "no", str(t.offsets_read), str(t.offsets_lost),
            "" if t.table_rows is None else f"{t.table_rows}{' (rebuilt)' if t.rebuilt and result.incremental else ''}",
            t.table_path or "",
        )
    console.print(table)
    daily = target / "daily"
    console.print(f"daily counts: {result.daily_rows} rows in {daily}; {result.seconds} s")
    console.print(json.dumps({"summary": str(target / "_SUMMARY.json")}))
