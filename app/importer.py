"""`eventlog import-kafka`: adopt a Kafka broker's partition directories into a data dir."""

from __future__ import annotations

from pathlib import Path

import anyio
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engine import kafka_import
from engine.errors import EngineError
from engine.log_manager import open_engine

from .settings import Settings

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def run_import(settings: Settings, kafka_log_dir: Path, topics: list[str] | None, *, link: bool) -> int:
    try:
        return anyio.run(_run, settings, kafka_log_dir, topics, link)
    except EngineError as exc:
        err.print(f"[red]import failed:[/red] {escape(str(exc))}")
        return 1


async def _run(settings: Settings, kafka_log_dir: Path, topics: list[str] | None, link: bool) -> int:
    found = kafka_import.discover(kafka_log_dir, topics)
    if not found:
        err.print(f"no topic partition directories found in {kafka_log_dir}")
        return 1
    starts = kafka_import.kafka_log_start_offsets(kafka_log_dir)
    table = Table("topic", "partition", "segments", "offsets", "bytes", "truncated bytes", title="imported")
    problems = 0
    async with open_engine(settings.engine_config()) as engine:
        for topic in found:
            state, stats = await engine.adopt_topic(
                topic.name,
                topic.partitions,
                link=link,
                log_start_offsets={p: starts.get((topic.name, p), 0) for p in topic.partitions},
            )
            for log in state.partitions:
                st = stats.get(log.partition)
                view = log.view
                table.add_row(
                    topic.name,
                    str(log.partition),
                    str(len(view.segments)),
                    f"{view.log_start_offset}..{view.high_watermark}",
                    str(view.size_bytes),
                    str(st.truncated_bytes if st else 0) if st else "(empty: no directory)",
                )
                if st and st.truncated_bytes:
                    problems += 1
                    for e in st.errors:
                        err.print(f"[yellow]{topic.name}-{log.partition}:[/yellow] {escape(e)}")
    out.print(table)
    out.print(f"{len(found)} topic(s) imported into {settings.data_dir}; torn or corrupt tails truncated in {problems} partition(s)")
    return 0
