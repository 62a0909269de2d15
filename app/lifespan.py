"""The FastAPI lifespan: open the engine (recovery first), start the cleanup workers, serve,
close cleanly."""

from __future__ import annotations

import asyncio
import gc
import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, AsyncIterator

import anyio
from fastapi import FastAPI

from api.observability import Metrics
from engine.errors import EngineError, ShardUnavailableError
from engine.log_manager import LogManager, open_engine
from workers.manager import Workers

from . import loopwatch
from .settings import Settings
from .snapshot_root import prepare_snapshot_root

# broker/ (the Kafka listener: kio's message classes, ~0.15 CPU-seconds to import, more where
# kio finds hypothesis installed) is imported by start_kafka, only when kafka_port is set: a
# server with EVENTLOG_KAFKA_PORT=0, as most of the test suite's, starts without it (issue 24)
if TYPE_CHECKING:
    from broker.listener import Broker, KafkaListener

logger = logging.getLogger("eventlog.app")


def make_lifespan(settings: Settings, metrics: Metrics):
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            async with open_engine(settings.engine_config()) as engine, anyio.create_task_group() as tg:
                app.state.engine = engine
                app.state.loop = asyncio.get_running_loop()
                first = engine.shard_index == 0
                await anyio.to_thread.run_sync(prepare_snapshot_root, settings, first)
                workers = Workers(engine, settings.worker_settings())
                app.state.workers = workers
                metrics.attach(engine, workers)
                if engine.channel is not None:
                    _serve_family(app, engine, workers, metrics)
                tg.start_soon(workers.run)
                if settings.loop_block_warn_ms:
                    tg.start_soon(loopwatch.watch, settings.loop_block_warn_ms / 1000)
                kafka = await start_kafka(app, settings, engine)
                # Everything built at start-up lives as long as the process: keep it out of
                # the cyclic GC's full collections, which would otherwise walk it each time.
                gc.collect()
                gc.freeze()
                # Requests allocate many short-lived containers; collecting the young generation
                # every 700 allocations cost ~9% of the produce path (perf, bench/README.md).
                gc.set_threshold(50_000, 20, 20)
                try:
                    yield
                finally:
                    app.state.shutting_down = True
                    if kafka is not None:
                        await kafka.close()
                    app.state.access_log.flush()
                    engine.begin_shutdown()
                    tg.cancel_scope.cancel()  # the workers stop before the engine closes
        except EngineError as exc:
            from broker.listener import KafkaListenError  # (a failed start: its cost is moot)

            if app.state.engine is None or isinstance(exc, KafkaListenError):
                app.state.startup_error = exc
                logger.error("cannot start: %s", exc)
            raise

    return lifespan


async def start_kafka(app: FastAPI, settings: Settings, engine: LogManager) -> KafkaListener | None:
    """The Kafka listener of this process (broker/listener.py): broker `shard index`, on
    kafka_port + index; None when kafka_port is 0."""
    if not settings.kafka_port:
        return None
    from broker.coordinator import GroupCoordinator
    from broker.listener import Broker, KafkaListener, KafkaListenError, bind
    from broker.produce import ProducerIds

    index, count = engine.shard_index, max(engine.shard_count, 1)
    host = settings.kafka_bind_host
    port = settings.kafka_port + index
    try:
        sock = bind(host, port, settings.backlog)
    except OSError as exc:
        raise KafkaListenError(host, port, exc) from None
    ids = [d.meta["cluster.id"] for d in engine.dirs if d.meta.get("cluster.id")]
    cluster_id = ids[0] if ids else "eventlog"
    broker = Broker(
        app.state, index, count, settings.kafka_advertised, settings.kafka_port, cluster_id,
        producer_ids=ProducerIds(index),
    )
    if index == broker.coordinator_id:
        broker.coordinator = GroupCoordinator()
        broker.coordinator.start()
    app.state.kafka = broker
    _share_group_members(app, engine, broker)
    listener = KafkaListener(broker, sock)
    await listener.start()
    logger.info("Kafka listener on %s:%d (broker %d of %d)", host, port, index, count)
    return listener


def _share_group_members(app: FastAPI, engine: LogManager, broker: Broker) -> None:
    """`app.state.group_members(group)` -> (state, live members) from the Kafka group
    coordinator, which lives on shard 0 (the other shards ask it through the channel): what
    an HTTP offset reset refuses a group with live members by (api/groups.py)."""
    coordinator = broker.coordinator
    channel = engine.channel

    async def members_here(group: str) -> tuple[str, int]:
        if coordinator is None:
            return "Dead", 0
        (described,) = await coordinator.describe_groups([group])
        return described.state, len(described.members)

    if coordinator is not None:
        app.state.group_members = members_here
        if channel is not None:
            channel.handlers["group_members"] = members_here
    elif channel is not None:
        async def members_there(group: str) -> tuple[str, int]:
            return tuple(await channel.call(broker.coordinator_id, "group_members", group))

        app.state.group_members = members_there


def _serve_family(app: FastAPI, engine: LogManager, workers: Workers, metrics: Metrics) -> None:
    """A shard of a family: answer the other shards' requests for this shard's workers and
    metrics, and gather theirs for /metrics."""
    from prometheus_client import generate_latest

    channel = engine.channel
    assert channel is not None

    async def run_retention(topic: str | None, partition: int | None = None) -> list:
        return list(await workers.run_retention(topic, partition)) if topic is None or topic in engine.topics else []

    async def run_compaction(topic: str | None, partition: int | None = None) -> list:
        return list(await workers.run_compaction(topic, partition)) if topic is None or topic in engine.topics else []

    async def maintenance(topic: str, partition: int) -> dict:
        return workers.maintenance(topic, partition)

    async def own_metrics() -> bytes:
        return generate_latest(metrics.registry)

    async def peer_metrics() -> list[bytes]:
        """The other shards' expositions; a shard that is down or not answering is left out
        (its health is in every shard's own: eventlog_shard_up)."""
        out = []
        for shard in range(engine.shard_count):
            if shard != engine.shard_index:
                try:
                    out.append(await channel.call(shard, "metrics"))
                except ShardUnavailableError:
                    continue
        return out

    quotas = app.state.quotas
    recorded: dict[tuple[str, str], int] = {}

    def pass_on(name: str, kind: str, n: int) -> None:
        if not recorded:
            asyncio.get_running_loop().call_soon(send_recorded)
        recorded[(name, kind)] = recorded.get((name, kind), 0) + n

    def send_recorded() -> None:
        items = [(name, kind, n) for (name, kind), n in recorded.items()]
        recorded.clear()
        for shard in range(engine.shard_count):
            if shard != engine.shard_index:
                channel.note(shard, "quota", items)

    def quota_note(items: list) -> None:
        for name, kind, n in items:
            quotas.record_remote(name, kind, n)

    quotas.on_record = pass_on
    channel.handlers.update({
        "run_retention": run_retention, "run_compaction": run_compaction, "maintenance": maintenance, "metrics": own_metrics, "quota": quota_note,
    })
    app.state.peer_metrics = peer_metrics
