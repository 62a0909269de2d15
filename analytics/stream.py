"""The `eventlog` Structured Streaming source: micro-batches over successive snapshots or over
the live data dir of a running server.

    analytics.register(spark)
    stream = (spark.readStream.format("eventlog").option("topics", "orders")
              .option("maxOffsetsPerTrigger", "100000").load("/data/snapshots"))
    stream.writeStream.format("parquet").option("checkpointLocation", "/ckpt").start("/out")

Schema and rows: the batch source's (SPARK_DDL; Arrow batches from analytics.decoder). Offsets
are Spark's Kafka source's: `{"orders": {"0": 1234, "1": 99}}`, each partition's next offset
to read; a micro-batch reads [start, end) of every partition, each offset exactly once.

Two inputs (`mode`, default `auto`: `live` when the path holds `meta.properties` or a
recovery-point checkpoint, else `snapshots`):

* `snapshots`: a directory of snapshot directories (or one snapshot). Finished snapshots (those
  with manifest.json) are ordered by their manifests' created_ms. A partition's latest offset
  is its high watermark in the newest snapshot holding it (a snapshot may hold some topics
  only, and leaves out offline partitions). A micro-batch reads each offset from the newest
  snapshot holding it, among the snapshots with the same topic_id (a topic deleted and created
  again is another topic). The directory may be a URI (`s3://bucket/prefix/snapshots`, where
  `eventlog snapshot --to` uploads: storage.py); `auto` is then `snapshots`.
* `live`: the server's log dir (`<data dir>`, or one of its log dirs; union two streams for
  two log dirs). Nothing is asked of the server. A partition's end is, with `liveEnd`:
  - `checkpoint` (default): its entry in `recovery-point-offset-checkpoint`, which the server
    rewrites every EVENTLOG_CHECKPOINT_INTERVAL_MS (60 s by default) and at shutdown. Every
    offset below it was fsynced and acknowledged, and recovery never truncates below it, so a
    batch is never read that a crash could take back. The price: the stream lags the log by up
    to that interval.
  - `logEnd`: the end of the last whole batch of the active segment whose framing and CRC-32C
    check (recovery's torn-tail rule). No lag, but a batch whose group commit is still in
    flight counts: if that commit's fsync then fails (disk full: the server undoes it) or the
    machine loses power before it, the stream has read records the server never acknowledged.
  The log start comes from the segment files and `log-start-offset-checkpoint`. Tasks list
  the partition directory again when they read, and read a segment that retention or
  compaction has renamed to `.deleted` until the server unlinks it (file.delete.delay.ms,
  60 s); compacted segments give what the cleaner kept. stream_sources.py has the details.

Data loss (`failOnDataLoss`, default true, as in Spark's Kafka source, with its wording): the
query fails with DataLossError when offsets a micro-batch should read are gone: below the log
start (retention, delete-records) or in no snapshot any more; a segment file removed between
planning and reading; a partition that went away ("... are gone"); a partition whose offsets
went back ("offset was changed from A to B"; then the partition is read again from its log
start); a partition that appeared after the query started at an offset other than 0 ("Added
partition ... starts from X instead of 0"). With `false` the source logs a warning, skips what
is lost and goes on, as Kafka's does. On a first start without any data yet (no snapshot, no
partition), partitions found later start from their log start without a report.

Admission control: `maxOffsetsPerTrigger` (Kafka's name; `maxRecordsPerTrigger` is an alias)
caps the offsets one micro-batch takes, over all partitions: never more than the cap; every
partition with a backlog gets at least one offset when the cap allows, and the rest is shared
in proportion to the backlogs (largest remainder). Offsets, not records: compaction gaps and
transaction markers count. Trigger.AvailableNow is supported (several capped micro-batches up
to the offsets available when the query started); Trigger.Once reads everything.

Other options: `topics` (comma-separated; default every topic except internal ones, which in a
live dir are those named `__*`; a named topic that does not exist yet is waited for);
`startingOffsets` for a new query (default `earliest`, unlike Kafka's `latest`): `earliest`,
`latest`, one number, or JSON as in the batch source (-2 earliest, -1 latest; unnamed
partitions start at earliest; offsets clamp to the log); a restarted query continues from its
checkpoint. The batch-only options (`endingOffsets`, `compacted`, `startingTimestamp`,
`endingTimestamp`) are refused.

Re-running a micro-batch after a failure reads the same offsets; for a compacted topic the
newest snapshot (or the live log) may by then hold fewer of them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from . import storage
from .decoder import ARROW_SCHEMA, SPARK_DDL
from .stream_sources import (
    RECOVERY_POINT,
    TP,
    LiveSlice,
    LiveSource,
    Offsets,
    PartitionRange,
    SnapshotSlice,
    SnapshotSource,
    read_slice,
)

__all__ = [
    "DataLossError",
    "EventlogStreamReader",
    "LiveSlice",
    "PartitionRange",
    "SnapshotSlice",
    "from_json",
    "initial_offsets",
    "next_end",
    "plan_ranges",
    "rate_limit",
    "to_json",
]

logger = logging.getLogger("eventlog.analytics.stream")

EARLIEST, LATEST = -2, -1
_BATCH_ONLY = ("endingoffsets", "compacted", "startingtimestamp", "endingtimestamp")


class DataLossError(Exception):
    """Raised when offsets a micro-batch should read are gone (failOnDataLoss=true)."""


# ---------------------------------------------------------------------------------------------
# offsets and planning (pure)


def to_json(offsets: Offsets) -> dict:
    """{"topic": {"partition": offset}}, topics and partitions sorted (Spark compares offsets
    as JSON text, so the same offsets must always print the same)."""
    out: dict = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_json(offsets: dict) -> Offsets:
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}


def initial_offsets(view: dict[TP, PartitionRange], starting: str | None) -> Offsets:
    """Where a new query starts, per startingOffsets (module docstring), clamped to the log."""
    text = (starting or "earliest").strip()
    table: dict[TP, int] = {}
    default = EARLIEST
    if text.lower() in ("earliest", "latest"):
        default = EARLIEST if text.lower() == "earliest" else LATEST
    elif text.lstrip("-").isdigit():
        default = int(text)
    else:
        try:
            spec = json.loads(text)
            exact = all(type(o) is int for parts in spec.values() for o in parts.values())
            table = from_json(spec)
        except (ValueError, AttributeError, TypeError):
            exact = False
        if not exact:
            raise ValueError(f"eventlog: startingOffsets must be earliest, latest, a number or JSON like "
                             f'{{"orders": {{"0": 23, "1": -2}}}}; got {text!r}')
        unknown = sorted(tp for tp in table if tp not in view)
        if unknown:
            raise ValueError(f"eventlog: startingOffsets names {', '.join(f'{t}-{p}' for t, p in unknown)}, "
                             "which the source does not hold")
    out = {}
    for tp, r in view.items():
        value = table.get(tp, default)
        if value < EARLIEST:
            raise ValueError(f"eventlog: startingOffsets: {value} is not an offset (-2 = earliest, -1 = latest)")
        value = r.log_start if value == EARLIEST else r.end if value == LATEST else value
        out[tp] = min(max(value, r.log_start), r.end)
    return out


def next_end(start: Offsets, view: dict[TP, PartitionRange], max_offsets: int | None,
             target: Offsets | None = None) -> Offsets:
    """latestOffset: the next micro-batch's end. Each partition of `view` from its begin (its
    start offset; its log start when new, when the start is below it, or when the partition's
    end went below the start) to its end, capped at `target` (Trigger.AvailableNow; partitions
    it lacks wait) and by rate_limit. Partitions of `start` missing from `view` are left out
    (plan_ranges reports them); an empty view (nothing listed) changes nothing."""
    if not view:
        return dict(start)
    begins: Offsets = {}
    ends: Offsets = {}
    for tp, r in view.items():
        if target is not None and tp not in target:
            if tp in start:
                begins[tp] = ends[tp] = start[tp]
            continue
        begin = start.get(tp, r.log_start)
        if begin > r.end:
            begin = r.log_start
        begin = max(begin, r.log_start)
        end = r.end if target is None else max(begin, min(r.end, target[tp]))
        begins[tp], ends[tp] = begin, end
    return rate_limit(begins, ends, max_offsets)


def rate_limit(begins: Offsets, ends: Offsets, max_offsets: int | None) -> Offsets:
    """Ends such that sum(end - begin) <= max_offsets: each partition with a backlog gets one
    offset first (the largest backlogs first when the cap is below their number), the rest in
    proportion to the backlogs, leftovers by largest remainder, ties by (topic, partition)."""
    sizes = {tp: ends[tp] - begins[tp] for tp in ends if ends[tp] > begins[tp]}
    total = sum(sizes.values())
    if max_offsets is None or total <= max_offsets:
        return dict(ends)
    out = {tp: ends[tp] if tp not in sizes else begins[tp] for tp in ends}
    order = sorted(sizes, key=lambda tp: (-sizes[tp], tp))
    if max_offsets < len(order):
        for tp in order[:max_offsets]:
            out[tp] += 1
        return out
    rest = max_offsets - len(order)
    pool = total - len(order)  # > rest, since total > max_offsets
    shares = {tp: divmod(rest * (sizes[tp] - 1), pool) for tp in order}
    leftover = rest - sum(q for q, _ in shares.values())
    lucky = sorted(order, key=lambda tp: (-shares[tp][1], tp))[:leftover]
    for tp in order:
        out[tp] += 1 + shares[tp][0] + (tp in lucky)
    return out


def plan_ranges(start: Offsets, end: Offsets, view: dict[TP, PartitionRange],
                report) -> list[tuple[TP, int, int]]:
    """partitions(): the (partition, from, until) ranges of a micro-batch, non-empty ones only;
    `report(message)` is called for what Kafka's source reports as data loss (it raises, or
    logs and returns)."""
    gone = sorted(set(start) - set(end))
    if gone:
        report(f"{_names(gone)} are gone. Some data may have been missed")
    ranges = []
    for tp, until in sorted(end.items()):
        r = view.get(tp)
        if tp in start:
            begin = start[tp]
        else:
            begin = r.log_start if r is not None else until
            if start and begin != 0:
                report(f"Added partition {_names([tp])} starts from {begin} instead of 0. Some data may have been missed")
        if until < begin:
            report(f"Partition {_names([tp])}'s offset was changed from {begin} to {until}, "
                   "some data may have been missed")
            begin = min(r.log_start if r is not None else until, until)
        if begin < until:
            ranges.append((tp, begin, until))
    return ranges


def _names(tps) -> str:
    return ", ".join(f"{topic}-{partition}" for topic, partition in tps)


def _reporter(fail: bool):
    def report(message: str) -> None:
        if fail:
            raise DataLossError(
                f"eventlog: {message}. If you don't want your streaming query to fail on such cases, "
                'set the source option "failOnDataLoss" to "false".'
            )
        logger.warning("eventlog: %s (failOnDataLoss=false: skipped)", message)

    return report


# ---------------------------------------------------------------------------------------------
# the reader


class EventlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """spark.readStream.format("eventlog").load(path); options in the module docstring.

    Spark makes one on the driver for offsets and planning (a long-lived Python worker: the
    manifest cache and the logEnd walk positions live there) and pickles another, options only,
    into each task; construction reads no files."""

    def __init__(self, options: dict[str, str], schema=None) -> None:
        if schema is not None:
            from pyspark.sql.pandas.types import to_arrow_schema

            if not to_arrow_schema(schema, timezone="UTC").equals(ARROW_SCHEMA):
                raise ValueError(f"eventlog: the stream's schema is fixed ({SPARK_DDL}); got {schema.simpleString()}")
        options = {str(k).lower(): v for k, v in options.items()}
        path = options.get("path")
        if not path:
            raise ValueError("eventlog: give a directory: spark.readStream.format('eventlog').load(path)")
        for name in _BATCH_ONLY:
            if name in options and not (name == "compacted" and str(options[name]).strip().lower() == "false"):
                raise ValueError(f"eventlog: option {name} is for batch reads only, not for readStream")
        self.path = storage.normalize(path)
        wanted = options.get("topics")
        self.topics = tuple(t.strip() for t in wanted.split(",") if t.strip()) if wanted and wanted.strip() else None
        self.starting = options.get("startingoffsets")
        self.fail_on_data_loss = _flag(options.get("failondataloss", "true"), "failOnDataLoss")
        limit = options.get("maxoffsetspertrigger", options.get("maxrecordspertrigger"))
        self.max_offsets = None if limit is None else _positive(limit, "maxOffsetsPerTrigger")
        mode = str(options.get("mode", "auto")).strip().lower()
        if mode == "auto":
            live = not storage.is_uri(self.path) and any(
                os.path.exists(os.path.join(self.path, n)) for n in ("meta.properties", RECOVERY_POINT))
            mode = "live" if live else "snapshots"
        if mode not in ("live", "snapshots"):
            raise ValueError(f"eventlog: mode must be auto, live or snapshots; got {mode!r}")
        if mode == "live" and storage.is_uri(self.path):
            raise ValueError("eventlog: mode live reads a data dir on this machine's filesystem, not a URI; "
                             "snapshots uploaded there are read with mode snapshots")
        self.mode = mode
        live_end = str(options.get("liveend", "checkpoint")).strip().lower()
        if live_end not in ("checkpoint", "logend"):
            raise ValueError(f"eventlog: liveEnd must be checkpoint or logEnd; got {live_end!r}")
        self.live_end = live_end
        self._source = None
        self._target: Offsets | None = None
        self._latest: Offsets | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_source"] = None  # caches stay on the driver
        return state

    @property
    def source(self):
        if self._source is None:
            if self.mode == "live":
                self._source = LiveSource(self.path, self.topics, self.live_end == "logend")
            else:
                self._source = SnapshotSource(self.path, self.topics)
        return self._source

    def initialOffset(self) -> dict:
        return to_json(initial_offsets(self.source.view(), self.starting))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_offsets is None else ReadMaxRows(self.max_offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {tp: r.end for tp, r in self.source.view().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        view = self.source.view(begin)
        self._latest = {tp: r.end for tp, r in view.items()}
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return to_json(next_end(begin, view, cap, self._target))

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else to_json(self._latest)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        source = self.source
        report = _reporter(self.fail_on_data_loss)
        ranges = plan_ranges(from_json(start), from_json(end), source.view(), report)
        return source.slices(ranges, report)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_slice(partition, _reporter(self.fail_on_data_loss))

    def commit(self, end: dict) -> None:
        """Nothing to release: the source holds no state outside Spark's checkpoint."""


def _flag(text, option: str) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"eventlog: {option} must be true or false; got {text!r}")
    return value == "true"


def _positive(text, option: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"eventlog: {option} must be a positive number of offsets; got {text!r}")
    return value
