"""Metrics and the access log.

The request policy (api/policy.py) counts every request in eventlog_http_requests_in_flight
(open long-polls and event streams included) and afterwards in eventlog_http_requests_total and
_request_duration_seconds by route template, method and status, and leaves one JSON access-log
line on the eventlog.access logger (AccessLog).

Metrics (prometheus-client, one registry per app) also cover the engine: group-commit sizes
and fsync latency via the log manager's hooks, produce/fetch counters from the routes, and
per-partition gauges (high watermark, log start offset, size, offline) and the damaged batches
met (eventlog_corrupt_batches_total, where="recovery" or "read") read at scrape time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import random
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.commits import CommitBatcher, batcher_for
from engine.groups import GroupOffsets
from engine.interface import Engine
from engine.shards import CRASH_LOOP

if TYPE_CHECKING:
    from engine.partition_log import PartitionLog
    from workers.manager import Workers

access_logger = logging.getLogger("eventlog.access")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
COMMIT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
RECORD_BUCKETS = (1, 10, 100, 500, 1000, 5000, 10_000, 50_000, 100_000)


# no `X_created` series next to each counter and histogram (prometheus-client's default): they
# double the exposition and nothing here reads them
disable_created_metrics()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # the process's CPU, memory and descriptors; the interpreter and its garbage collector
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)
        build = Gauge("eventlog_build_info", "1, with the version of eventlog and of Python as labels", ["version", "python"],
                      registry=r)
        build.labels(_version(), platform.python_version()).set(1)
        self.requests = Counter("eventlog_http_requests", "HTTP requests", ["route", "method", "status"], registry=r)
        self.latency = Histogram(
            "eventlog_http_request_duration_seconds", "HTTP request latency", ["route", "method"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        # the Kafka listener's requests (broker/listener.py), by API and error code (0: none)
        self.kafka_requests = Counter(
            "eventlog_kafka_requests", "Kafka protocol requests", ["api", "error"], registry=r
        )
        self.kafka_latency = Histogram(
            "eventlog_kafka_request_duration_seconds", "Kafka protocol request latency", ["api"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.produced_records = Counter("eventlog_produce_records", "records appended", ["topic"], registry=r)
        self.produced_bytes = Counter("eventlog_produce_bytes", "record-batch bytes appended", ["topic"], registry=r)
        self.fetched_records = Counter("eventlog_fetch_records", "records returned by fetches", ["topic"], registry=r)
        self.fetched_bytes = Counter("eventlog_fetch_bytes", "record-batch bytes read by fetches", ["topic"], registry=r)
        self.commit_requests = Histogram(
            "eventlog_group_commit_requests", "append requests per group commit", buckets=COMMIT_BUCKETS, registry=r
        )
        self.commit_records = Histogram(
            "eventlog_group_commit_records", "records per group commit", buckets=RECORD_BUCKETS, registry=r
        )
        self.throttled = Counter(
            "eventlog_quota_throttled_requests", "requests refused (or stream chunks delayed) over a quota", ["kind"],
            registry=r,
        )
        for kind in ("produce", "fetch"):
            self.throttled.labels(kind)
        self.fsync = Histogram("eventlog_fsync_seconds", "fdatasync latency of group commits", buckets=FSYNC_BUCKETS, registry=r)
        self.in_flight = 0  # requests being handled; the request policy counts them on the event loop
        r.register(_InFlightCollector(self))
        r.register(_StreamCollector())
        self._engine: Engine | None = None
        self._workers: Workers | None = None

    def attach(self, engine: Engine, workers: Workers | None = None) -> None:
        """Observe a log manager (its commits, fsyncs, and partitions at scrape time) and the
        cleanup workers' figures."""
        self._engine = engine
        self._workers = workers
        engine.commit_hooks.append(self._on_commit)
        engine.fsync_hooks.append(self._on_fsync)
        self.registry.register(_PartitionCollector(self))
        self.registry.register(_CommitJobCollector(batcher_for(asyncio.get_running_loop())))
        if workers is not None:
            self.registry.register(_WorkerCollector(workers))
        if getattr(engine, "table", None) is not None:
            self.registry.register(_ShardCollector(engine))
        self.registry.register(_QueueCollector(engine))

    def _on_commit(self, log: PartitionLog, requests: int, records: int, size: int) -> None:
        self.commit_requests.observe(requests)
        self.commit_records.observe(records)
        self.produced_records.labels(log.topic).inc(records)
        self.produced_bytes.labels(log.topic).inc(size)

    def _on_fsync(self, _log: PartitionLog, seconds: float) -> None:
        self.fsync.observe(seconds)


class _ShardCollector:
    """A shard family's health, as the supervisor keeps it in the partition table: every shard
    reads the same table, so /metrics takes the largest of their answers (metrics_merge)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self):  # noqa: ANN201 -- prometheus-client's collector protocol
        table = self.engine.table
        assert table is not None  # registered for a shard family only (Metrics.attach)
        up = GaugeMetricFamily(
            "eventlog_shard_up", "1 if the shard serves and answers, 0 while it is down, restarting or silent",
            labels=["shard"],
        )
        looping = GaugeMetricFamily(
            "eventlog_shard_crash_looping", "1 while the shard dies again soon after each start", labels=["shard"]
        )
        restarts = CounterMetricFamily(
            "eventlog_shard_restarts", "times the supervisor started the shard again", labels=["shard"]
        )
        for shard in range(self.engine.shard_count):
            labels = [str(shard)]
            up.add_metric(labels, 1 if table.answering(shard) else 0)
            looping.add_metric(labels, 1 if table.health(shard) & CRASH_LOOP else 0)
            restarts.add_metric(labels, table.restarts(shard))
        return [up, looping, restarts]


class _QueueCollector:
    """Each queue's figures (engine/queues.py Queues.figures): a shard of a family reports
    those of the partitions it owns (engine/shard_queues.py), and the family's exposition sums
    them (api/metrics_merge.py; the oldest unacknowledged age: the largest)."""

    GAUGES = (
        ("available", "records of the queue that may be leased now or once their delay ends"),
        ("leased", "records leased and not yet settled"),
        ("lag", "records between the queue's first unsettled offset and the partitions' ends"),
        (
            "oldest_unacked_age_seconds",
            "age of the oldest record not yet acknowledged or dead-lettered (0: none)",
        ),
    )
    COUNTERS = (
        ("acked", "records acknowledged"),
        ("dead_lettered", "records sent to the dead-letter topic or archived"),
        ("redeliveries", "leases of a record delivered before (since the server started)"),
        ("lost_to_retention", "records retention deleted before the queue settled them"),
    )

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self):  # noqa: ANN201 -- prometheus-client's collector protocol
        queues = getattr(self.engine, "queues", None)
        figures: list[tuple[str, str, dict[str, int]]] = getattr(queues, "figures", list)()
        labels = ["topic", "queue"]
        families = [
            GaugeMetricFamily(f"eventlog_queue_{name}", doc, labels=labels)
            for name, doc in self.GAUGES
        ] + [
            CounterMetricFamily(f"eventlog_queue_{name}", doc, labels=labels)
            for name, doc in self.COUNTERS
        ]
        names = [name for name, _doc in self.GAUGES + self.COUNTERS]
        for topic, queue, totals in figures:
            age_s = totals.get("oldest_unacked_age_ms", 0) / 1000
            row: dict[str, float] = {**totals, "oldest_unacked_age_seconds": age_s}
            for family, name in zip(families, names, strict=True):
                family.add_metric([topic, queue], row.get(name, 0))
        return families


class _InFlightCollector:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):  # noqa: ANN201 -- prometheus-client's collector protocol
        gauge = GaugeMetricFamily(
            "eventlog_http_requests_in_flight", "requests being handled, long-polls and event streams included"
        )
        gauge.add_metric([], self.metrics.in_flight)
        return [gauge]


class _CommitJobCollector:
    """How the group commits of many partitions went to the commit threads (engine/commits.py):
    jobs, and the commits they carried (commits / jobs: how many went together)."""

    def __init__(self, batcher: CommitBatcher) -> None:
        self.batcher = batcher

    def collect(self):  # noqa: ANN201 -- prometheus-client's collector protocol
        jobs = CounterMetricFamily("eventlog_commit_jobs", "jobs of group commits sent to a commit thread together")
        jobs.add_metric([], self.batcher.jobs)
        carried = CounterMetricFamily("eventlog_commit_job_commits", "group commits carried by those jobs")
        carried.add_metric([], self.batcher.commits)
        syncs = CounterMetricFamily("eventlog_commit_shared_syncs", "syncfs calls that made many partitions' commits durable at once")
        syncs.add_metric([], self.batcher.shared_syncs)
        covered = CounterMetricFamily("eventlog_commit_shared_sync_flushes", "partition flushes those syncfs calls stood for")
        covered.add_metric([], self.batcher.shared_flushes)
        return [jobs, carried, syncs, covered]


class _StreamCollector:
    """How event streams share their work (api/tail.py): chunks read and encoded, and chunks
    the pushers wrote to parked subscribers (each write of one chunk to many counts once)."""

    def collect(self):  # noqa: ANN201 -- prometheus-client's collector protocol
        from .tail import FANOUT, TAILS

        encoded = CounterMetricFamily(
            "eventlog_stream_chunks_encoded", "event-stream chunks read and encoded (once for all their subscribers)"
        )
        encoded.add_metric([], TAILS.reads)
        pushed = CounterMetricFamily(
            "eventlog_stream_chunks_pushed", "event-stream chunks written to parked subscribers by their partition's pusher"
        )
        pushed.add_metric([], FANOUT.pushed)
        from .records import ANSWERS

        reused = CounterMetricFamily(
            "eventlog_fetch_answers_reused", "small JSON fetch answers given again, the log unchanged since they were made"
        )
        reused.add_metric([], ANSWERS.reused)
        return [encoded, pushed, reused]


class _PartitionCollector:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):  # noqa: ANN201 -- prometheus-client's collector protocol
        engine = self.metrics._engine
        hw = GaugeMetricFamily("eventlog_partition_high_watermark", "next offset to be written", labels=["topic", "partition"])
        start = GaugeMetricFamily("eventlog_partition_log_start_offset", "first readable offset", labels=["topic", "partition"])
        size = GaugeMetricFamily("eventlog_partition_size_bytes", "bytes in the partition's segments", labels=["topic", "partition"])
        segments = GaugeMetricFamily("eventlog_partition_segments", "segments in the partition", labels=["topic", "partition"])
        offline = GaugeMetricFamily(
            "eventlog_partition_offline", "1 if the partition could not be loaded at start-up and serves nothing",
            labels=["topic", "partition"],
        )
        corrupt = CounterMetricFamily(
            "eventlog_corrupt_batches", "damaged batches dropped by recovery or refused by reads",
            labels=["topic", "partition", "where"],
        )
        waiters = GaugeMetricFamily(
            "eventlog_partition_waiters", "long-poll fetches and event streams waiting for new records", labels=["topic", "partition"]
        )
        lag = GaugeMetricFamily(
            "eventlog_consumer_group_lag", "high watermark minus the group's committed offset",
            labels=["group", "topic", "partition"],
        )
        free = GaugeMetricFamily("eventlog_log_dir_free_bytes", "free bytes on the filesystem of each log dir "
                                 "(0: the data dir or the first of EVENTLOG_LOG_DIRS)", labels=["log_dir"])
        total = GaugeMetricFamily("eventlog_log_dir_total_bytes", "size of the filesystem of each log dir", labels=["log_dir"])
        if engine is not None:
            _group_lag(engine, lag)
            for i, d in enumerate(getattr(engine, "dirs", ())):
                try:
                    st = os.statvfs(d.path)
                except OSError:
                    continue
                free.add_metric([str(i)], st.f_bavail * st.f_frsize)
                total.add_metric([str(i)], st.f_blocks * st.f_frsize)
            for log in engine.all_partitions():
                view = log.view
                labels = [log.topic, str(log.partition)]
                hw.add_metric(labels, view.high_watermark)
                start.add_metric(labels, view.log_start_offset)
                size.add_metric(labels, view.size_bytes)
                segments.add_metric(labels, len(view.segments))
                waiters.add_metric(labels, log.waiters)
                offline.add_metric(labels, 0)
                for where, n in log.corrupt_batches.items():
                    corrupt.add_metric([*labels, where], n)
            # in a shard family: what requests met on partitions other shards own (/metrics sums
            # the shards, so every shard reports its own waiters and refused reads)
            for followed in getattr(engine, "followed_partitions", list)():
                labels = [followed.topic, str(followed.partition)]
                waiters.add_metric(labels, followed.waiters)
                corrupt.add_metric([*labels, "read"], followed.corrupt_batches["read"])
            for part in engine.offline_partitions():
                offline.add_metric([part.topic, str(part.partition)], 1)
        return [hw, start, size, segments, offline, corrupt, waiters, lag, free, total]


def _group_lag(engine: Engine, lag: GaugeMetricFamily) -> None:
    """Each committed offset's lag, from the process that holds the group offsets (the only
    one, or shard 0 of a family: a family's /metrics sums its shards)."""
    groups = getattr(engine, "groups", None)
    if not isinstance(groups, GroupOffsets):
        return  # another shard holds them
    for c in groups.committed():
        group, topic, partition = c.group, c.topic, c.partition
        try:
            high_watermark = engine.partition(topic, partition).high_watermark
        except Exception:  # noqa: BLE001 -- a deleted topic, an offline partition: no lag to show
            continue
        lag.add_metric([group, topic, str(partition)], max(0, high_watermark - c.offset))


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("eventlog")
    except Exception:  # noqa: BLE001 -- not installed as a package
        return "unknown"


class _WorkerCollector:
    """The retention deleter's and the compactor's figures (workers.manager.WorkerFigures)."""

    def __init__(self, workers: Workers) -> None:
        self.workers = workers

    def collect(self):  # noqa: ANN201 -- prometheus-client's collector protocol
        f = self.workers.figures
        passes = CounterMetricFamily("eventlog_cleanup_passes", "cleanup passes by worker and outcome", labels=["worker", "outcome"])
        for (worker, outcome), n in sorted(f.passes.items()):
            passes.add_metric([worker, outcome], n)
        reclaimed = CounterMetricFamily("eventlog_cleanup_reclaimed_bytes", "bytes given back by cleanup", labels=["worker"])
        for worker in ("retention", "compaction"):
            reclaimed.add_metric([worker], f.bytes_reclaimed.get(worker, 0))
        deleted = CounterMetricFamily("eventlog_retention_deleted_segments", "segments deleted by retention")
        deleted.add_metric([], f.segments_deleted)
        removed = CounterMetricFamily("eventlog_compaction_removed_records", "records dropped by compaction")
        removed.add_metric([], f.records_removed)
        duration = GaugeMetricFamily("eventlog_cleanup_last_pass_seconds", "duration of the last pass", labels=["worker"])
        for worker, seconds in sorted(f.last_duration_s.items()):
            duration.add_metric([worker], seconds)
        ratio = GaugeMetricFamily(
            "eventlog_compaction_dirty_ratio", "dirty bytes / (clean + dirty bytes) of compacted partitions",
            labels=["topic", "partition"],
        )
        for (topic, partition), value in sorted(f.dirty_ratio.items()):
            ratio.add_metric([topic, str(partition)], value)
        return [passes, reclaimed, deleted, removed, duration, ratio]


class AccessLog:
    """The access log, kept off the request path: a request leaves its line's fields here, and
    they are formatted and written to the eventlog.access logger together, from the event loop,
    FLUSH_S after the first of them (or at once when FLUSH_LINES are waiting, and at shutdown).
    A line shows a request at most FLUSH_S late. `sample` (0 < sample <= 1) is the fraction of
    answers below 400 written; every error is written."""

    FLUSH_S = 0.25
    FLUSH_LINES = 512

    def __init__(self, enabled: bool, sample: float = 1.0) -> None:
        self.enabled = enabled
        self.sample = sample
        self._pending: list[tuple] = []
        self._timer: asyncio.TimerHandle | None = None
        self._random = random.Random()

    def add(
        self, method: str, path: str, query: bytes, route: str, status: int, elapsed_s: float, bytes_out: int,
        client: Any, principal: str,
    ) -> None:
        if not self.enabled:
            return
        if status < 400 and self.sample < 1.0 and self._random.random() >= self.sample:
            return
        pending = self._pending
        pending.append((method, path, query, route, status, elapsed_s, bytes_out, client, principal))
        if len(pending) >= self.FLUSH_LINES:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.FLUSH_S, self.flush)
            except RuntimeError:  # no loop running (not on asyncio): at once
                self.flush()

    def flush(self) -> None:
        """Write every waiting line now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        lines, self._pending = self._pending, []
        for method, path, query, route, status, elapsed_s, bytes_out, client, principal in lines:
            access_logger.info(
                orjson.dumps({
                    "method": method,
                    "path": path,
                    "query": query.decode("latin-1"),
                    "route": route,
                    "status": status,
                    "ms": round(elapsed_s * 1000, 3),
                    "bytes_out": bytes_out,
                    "client": (client or ("-",))[0],
                    "principal": principal,
                }).decode()
            )
