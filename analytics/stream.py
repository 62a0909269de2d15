"""The `eventlog` Structured Streaming source: micro-batches over successive snapshots or over
the live data dir of a running server.

    analytics.register(spark)
    stream = (spark.readStream.format("eventlog").option("topics", "orders")
              .option("maxOffsetsPerTrigger", "100000").load("/data/snapshots"))
    stream.writeStream.format("parquet").option("checkpointLocation", "/ckpt").start("/out")

Schema and rows: the batch source's (SPARK_DDL; Arrow batches from analytics.decoder). Offsets
are Spark's Kafka source's: `{"orders": {"0": 1234, "1": 99}}`, each partition's next offset
to read; a micro-batch reads [start, end) of every partition, each offset exactly once.

Typed columns: the batch source's options and code (source.py, docs/ANALYTICS.md "Typed
values"): `key_format`, `header_format`, `value_format`, `value_schema`, `mode` (PERMISSIVE,
DROPMALFORMED, FAILFAST), `columnNameOfCorruptRecord`, or a user `.schema(...)`.
source.row_format checks the schema once, on the driver; source.typed_batches converts each
micro-batch's decoder batches in the tasks. So a malformed record is what it is in a batch
read: PERMISSIVE gives a null value and its raw bytes in `_corrupt_record`, DROPMALFORMED drops
it, FAILFAST fails the query with MalformedRecordError naming topic, partition and offset.

Inference. The value type of `value_format` json is not inferred unless asked: a stream's
schema must not change between micro-batches, and what a sample finds depends on when it is
taken. Without value_schema or `.schema(...)` the stream fails saying so (at load(); over one
snapshot directory, at start(): EventlogDataSource.schema() infers there as for a batch read,
which it cannot tell from a stream, and the reader refuses what it inferred), unless option
`schemaInference` is "true". Spark's file streams ask the same, with the conf
spark.sql.streaming.schemaInference, which a Python data source cannot read. Asked, the type is
inferred once, at load(), by infer_stream_value_type: up to `value_sample_records` values per
topic of what the input holds then (each partition's first and last records, from its log
start, whatever startingOffsets says); and again at each restart, when it may differ.

Two inputs (`input`, default `auto`: `live` when the path holds `meta.properties` or a
recovery-point checkpoint, else `snapshots`). The option was once named `mode`, which typed
reads use for Spark's JSON modes: a `mode` of auto, live or snapshots still chooses the input
(and is not a typing mode); any other `mode` is the typed values'; `input` and such a `mode`
must agree.

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
from .source import (
    STREAM_INPUTS,
    infer_sampled,
    non_null_values,
    row_format,
    typed_batches,
    typing_options,
)
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
from .values import MODES

__all__ = [
    "DataLossError",
    "EventlogStreamReader",
    "LiveSlice",
    "PartitionRange",
    "SnapshotSlice",
    "from_json",
    "infer_stream_value_type",
    "initial_offsets",
    "next_end",
    "plan_ranges",
    "rate_limit",
    "stream_input",
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
    manifest cache and the logEnd walk positions live there) and pickles another, options and
    row format only, into each task. Given the schema (Spark always gives it), construction
    reads no snapshot or log files (a value_schema naming a file is read, as for batch reads).

    `schema`: the user's `.schema(...)`, or what EventlogDataSource.schema() made of the
    options, `inferred` saying whether it inferred the value type (refused unless option
    schemaInference is true); None (a reader made directly, not by Spark): that schema, made
    here."""

    def __init__(self, options: dict[str, str], schema=None, *, inferred: bool = False) -> None:
        options = {str(k).lower(): v for k, v in options.items()}
        path = options.get("path")
        if not path:
            raise ValueError("eventlog: give a directory: spark.readStream.format('eventlog').load(path)")
        for name in _BATCH_ONLY:
            if name in options and not (name == "compacted" and str(options[name]).strip().lower() == "false"):
                raise ValueError(f"eventlog: option {name} is for batch reads only, not for readStream")
        self.path = storage.normalize(path)
        self.topics = _topics(options)
        self.starting = options.get("startingoffsets")
        self.fail_on_data_loss = _flag(options.get("failondataloss", "true"), "failOnDataLoss")
        limit = options.get("maxoffsetspertrigger", options.get("maxrecordspertrigger"))
        self.max_offsets = None if limit is None else _positive(limit, "maxOffsetsPerTrigger")
        self.input = stream_input(options, self.path)
        self.live_end = _live_end(options)
        self.schema_inference = _flag(options.get("schemainference", "false"), "schemaInference")
        if schema is None:
            from .source import EventlogDataSource

            made = EventlogDataSource(options)
            schema, inferred = made.schema(), made.inferred
        if inferred and not self.schema_inference:
            raise ValueError(_needs_schema(self.path))
        self._format = row_format(typing_options(options), schema)  # None: the decoder's batches as they are
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
            self._source = _open_source(self.path, self.input, self.topics, self.live_end)
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
        return typed_batches(read_slice(partition, _reporter(self.fail_on_data_loss)), self._format)

    def commit(self, end: dict) -> None:
        """Nothing to release: the source holds no state outside Spark's checkpoint."""


# ---------------------------------------------------------------------------------------------
# options


def stream_input(options: dict[str, str], path: str) -> str:
    """The input, "live" or "snapshots": option `input` (auto, live, snapshots; default auto:
    live when `path` holds meta.properties or a recovery-point checkpoint). `mode` was its
    name: a `mode` of auto, live or snapshots still chooses the input (source.typing_options
    then hides it from typing); any other `mode` is the typed values' (PERMISSIVE,
    DROPMALFORMED, FAILFAST). ValueError for other values, or an input and a mode that differ."""

    def given(name: str) -> str | None:
        text = options.get(name)
        return str(text).strip().lower() if text is not None and str(text).strip() else None

    chosen, mode = given("input"), given("mode")
    if chosen is not None and chosen not in STREAM_INPUTS:
        raise ValueError(f"eventlog: input must be auto, live or snapshots; got {options.get('input')!r}")
    if mode is not None and mode not in STREAM_INPUTS:
        if mode.upper() not in MODES:
            raise ValueError(f"eventlog: mode must be {', '.join(MODES)} (typed values), or auto, live or snapshots "
                             f"(the input; option input is its name now); got {options.get('mode')!r}")
        mode = None
    if chosen is not None and mode is not None and chosen != mode:
        raise ValueError(f"eventlog: option input {chosen} and option mode {mode} (input's old name) disagree; "
                         "give input only")
    chosen = chosen or mode or "auto"
    if chosen == "auto":
        live = not storage.is_uri(path) and any(
            os.path.exists(os.path.join(path, n)) for n in ("meta.properties", RECOVERY_POINT))
        chosen = "live" if live else "snapshots"
    if chosen == "live" and storage.is_uri(path):
        raise ValueError("eventlog: input live reads a data dir on this machine's filesystem, not a URI; "
                         "snapshots uploaded there are read with input snapshots")
    return chosen


def _topics(options: dict[str, str]) -> tuple[str, ...] | None:
    wanted = options.get("topics")
    return tuple(t.strip() for t in wanted.split(",") if t.strip()) if wanted and wanted.strip() else None


def _live_end(options: dict[str, str]) -> str:
    live_end = str(options.get("liveend", "checkpoint")).strip().lower()
    if live_end not in ("checkpoint", "logend"):
        raise ValueError(f"eventlog: liveEnd must be checkpoint or logEnd; got {live_end!r}")
    return live_end


def _open_source(path: str, chosen: str, topics: tuple[str, ...] | None, live_end: str):
    if chosen == "live":
        return LiveSource(path, topics, live_end == "logend")
    return SnapshotSource(path, topics)


# ---------------------------------------------------------------------------------------------
# the value type of a stream without a schema


def _needs_schema(path: str) -> str:
    return (
        "eventlog: a stream's value type is not inferred unless you ask: give option value_schema (a Spark "
        "DDL string such as 'id INT, status STRING', a JSON Schema, or the path of a file holding either) or "
        ".schema(...); or set option schemaInference to true to infer it once, when the query starts, from "
        f"what {storage.display(path)} holds then (inferred again at each restart, so it may differ between "
        "runs; as Spark's file streams do with spark.sql.streaming.schemaInference)"
    )


def infer_stream_value_type(options: dict[str, str], records: int):
    """EventlogDataSource.schema()'s inference for a path that is not a snapshot (a directory of
    snapshots, a live data dir; options lower case): refused (ValueError) unless option
    schemaInference is true; then source.infer_sampled over what the input holds now, each
    partition from its log start to its end (whatever startingOffsets says: a stream starting
    at `latest` still needs a type). Offsets gone while sampling are skipped."""
    path = storage.normalize(options["path"])
    if not _flag(options.get("schemainference", "false"), "schemaInference"):
        raise ValueError(_needs_schema(path))
    source = _open_source(path, stream_input(options, path), _topics(options), _live_end(options))
    view = source.view()

    def report(message: str) -> None:
        logger.warning("eventlog: while sampling values to infer their type: %s (not sampled)", message)

    def sample(tp: TP, head: int, tail: int):
        r = view[tp]
        taken = dict(_values(source, tp, r.log_start, r.end, head, report))
        taken.update(_values(source, tp, max(r.log_start, r.end - tail), r.end, tail, report))
        return taken.values()

    return infer_sampled(sorted(view), records, sample)


def _values(source, tp: TP, begin: int, end: int, count: int, report) -> Iterator[tuple[int, bytes]]:
    """(offset, value) of the first `count` non-null values in offsets [begin, end)."""
    if begin >= end:
        return
    yield from non_null_values((batch for part in source.slices([(tp, begin, end)], report)
                                for batch in read_slice(part, report)), count)


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
