"""`eventlog import-kafka`: adopt a Kafka broker's partition directories into a data dir."""

from __future__ import annotations

from pathlib import Path

import anyio
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engine import kafka_import, kafka_state
from engine.errors import EngineError
from engine.groups import CommittedOffset, validate_group
from engine.log_manager import LogManager, open_engine
from engine.metadata import CONSUMER_OFFSETS_TOPIC

from .settings import Settings

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def run_import(settings: Settings, kafka_log_dir: Path, topics: list[str] | None, *, link: bool) -> int:
    try:
        return anyio.run(_run, settings, kafka_log_dir, topics, link)
    except EngineError as exc:
        err.print(f"[red]import failed:[/red] {escape(str(exc))}")
        return 1


def _pairs(configs: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in configs.items())


async def _run(settings: Settings, kafka_log_dir: Path, topics: list[str] | None, link: bool) -> int:
    found = kafka_import.discover(kafka_log_dir, topics)
    if not found.topics and not found.consumer_offsets:
        err.print(f"no topic partition directories found in {kafka_log_dir}")
        return 1
    starts = kafka_import.kafka_log_start_offsets(kafka_log_dir)
    source = await anyio.to_thread.run_sync(kafka_state.read_topic_configs, kafka_log_dir) if found.topics else None
    offsets = (
        await anyio.to_thread.run_sync(kafka_state.read_committed_offsets, found.consumer_offsets)
        if found.consumer_offsets else None
    )
    table = Table("topic", "partition", "segments", "offsets", "bytes", "truncated bytes", title="imported")
    notes: list[str] = []
    problems = 0
    async with open_engine(settings.engine_config()) as engine:
        for topic in found.topics:
            configs = kafka_import.topic_overrides(source.configs.get(topic.name) if source else None)
            state, stats = await engine.adopt_topic(
                topic.name,
                topic.partitions,
                link=link,
                log_start_offsets={p: starts.get((topic.name, p), 0) for p in topic.partitions},
                configs=configs.overrides,
            )
            if configs.carried:
                notes.append(f"{topic.name}: from __cluster_metadata: {_pairs(configs.carried)}")
            if configs.retention_off:
                notes.append(f"{topic.name}: retention off: {_pairs(configs.retention_off)}")
            if configs.not_carried:
                notes.append(f"{topic.name}: not carried: {_pairs(configs.not_carried)}")
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
        merged = await _merge_offsets(engine, offsets) if offsets is not None else None
    if found.topics:
        out.print(table)
        if source is None:
            out.print(
                f"no {kafka_state.METADATA_DIR} in {kafka_log_dir} (a ZooKeeper-era broker keeps topic configs in "
                "ZooKeeper): each topic is imported with retention off"
            )
        else:
            for problem in source.problems:
                err.print(f"[yellow]{kafka_state.METADATA_DIR}:[/yellow] {escape(problem)}")
            if source.undecodable:
                err.print(f"[yellow]{kafka_state.METADATA_DIR}:[/yellow] {source.undecodable} record(s) could not be decoded")
        for note in notes:
            out.print(note)
        out.print("change a topic's configs with PATCH /v1/topics/<topic>/configs")
    if merged is not None:
        out.print(merged)
    elif CONSUMER_OFFSETS_TOPIC in found.internal_skipped:
        out.print(f"{CONSUMER_OFFSETS_TOPIC} not imported: name it (--topics {CONSUMER_OFFSETS_TOPIC}) to merge its committed offsets")
    if found.topics:
        out.print(
            f"{len(found.topics)} topic(s) imported into {settings.data_dir}; "
            f"torn or corrupt tails truncated in {problems} partition(s)"
        )
    return 0


async def _merge_offsets(engine: LogManager, offsets: kafka_state.KafkaOffsets) -> str:
    """Merge Kafka's committed offsets into eventlog's group store; a line saying what it did."""
    assert engine.groups is not None
    for problem in offsets.problems:
        err.print(f"[yellow]{CONSUMER_OFFSETS_TOPIC}:[/yellow] {escape(problem)}")
    usable: list[CommittedOffset] = []
    invalid = 0
    for c in offsets.commits:
        try:
            validate_group(c.group)
        except EngineError:
            invalid += 1
            continue
        usable.append(CommittedOffset(c.group, c.topic, c.partition, c.offset, c.metadata, c.commit_timestamp))
    stored = await engine.groups.merge(usable)
    groups = len({c.group for c in usable})
    line = f"{CONSUMER_OFFSETS_TOPIC}: {stored} committed offset(s) of {groups} group(s) merged into eventlog's group store"
    extra = []
    if offsets.skipped:
        extra.append(f"{offsets.skipped} group metadata record(s) skipped")
    if offsets.uncommitted:
        extra.append(f"{offsets.uncommitted} transactional commit(s) aborted or never completed, left out")
    if invalid:
        extra.append(f"{invalid} with a group id eventlog does not accept, left out")
    if offsets.undecodable:
        extra.append(f"{offsets.undecodable} record(s) could not be decoded")
    missing = sorted({c.topic for c in usable if c.topic not in engine.topics})
    if missing:
        extra.append(f"for topics not in this data dir: {', '.join(missing)}")
    return line + (f" ({'; '.join(extra)})" if extra else "")
