"""One Prometheus exposition for a shard family: the shards' own expositions, summed.

Every shard keeps its own registry (api.observability.Metrics) and renders it with
prometheus-client's text format. A scrape of `/metrics` on any shard answers for the whole
family: merge_expositions([own, *peers]) parses each text and adds up samples with the same
name and labels:

* counters, histograms (every `_bucket` with its `le`, `_sum`, `_count`) and untyped samples:
  summed, so `rate()` over the family works as over one process;
* gauges: summed. Requests in flight and partition waiters are per-shard counts, so their sum
  is the family's; per-partition gauges (high watermark, size, segments, offline) come only from
  the partition's owner shard, so the sum of one term is that value. One exception: a gauge
  whose sum would mean nothing and whose largest value is the answer to the question it asks
  (MAX_GAUGES: the duration of the last cleanup pass);
* `X_created` (the creation time prometheus-client writes as a gauge next to each counter and
  histogram): the earliest, so the family's counter looks as old as its oldest shard's;
* summary quantiles cannot be added up and are dropped (the registries have no summaries).

HELP and TYPE come from the first text that declares the family; families keep the order in
which they first appear, and so do the samples within a family, grouped by their labels
without `le` so a histogram's buckets stay together. The result is rendered by
prometheus_client.generate_latest from a collector, so it is the same text format the parser
reads back; merging one text gives that text again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

# gauges whose family value is the largest shard's, not the sum: a duration, facts every shard
# reports alike (the filesystem's free bytes, the build, the interpreter), per-process limits
MAX_GAUGES = frozenset({
    "eventlog_cleanup_last_pass_seconds", "eventlog_log_dir_free_bytes", "eventlog_log_dir_total_bytes",
    "eventlog_build_info", "python_info", "process_start_time_seconds", "process_max_fds",
    # the shard family's health: every shard reads it from the same table
    "eventlog_shard_up", "eventlog_shard_crash_looping", "eventlog_shard_restarts",
    # a queue's oldest unacknowledged record: each shard reports its own partitions' oldest
    "eventlog_queue_oldest_unacked_age_seconds",
})

_Labels = tuple[tuple[str, str], ...]


@dataclass
class _Family:
    name: str
    documentation: str
    type: str
    # labels without "le" -> (sample name, all labels) -> value; dicts keep first-seen order
    groups: dict[_Labels, dict[tuple[str, _Labels], float]] = field(default_factory=dict)

    def add(self, sample_name: str, labels: dict[str, str], value: float) -> None:
        if self.type == "summary" and "quantile" in labels:
            return
        group = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        key = (sample_name, tuple(sorted(labels.items())))
        samples = self.groups.setdefault(group, {})
        if key not in samples:
            samples[key] = value
        elif sample_name.endswith("_created"):
            samples[key] = min(samples[key], value)
        elif self.name in MAX_GAUGES:
            samples[key] = max(samples[key], value)
        else:
            samples[key] += value

    def metric(self) -> Metric:
        metric = Metric(self.name, self.documentation, self.type)
        for samples in self.groups.values():
            for (sample_name, labels), value in samples.items():
                metric.add_sample(sample_name, dict(labels), value)
        return metric


class _Merged:
    """A collector yielding the merged families (what generate_latest renders)."""

    def __init__(self, families: list[_Family]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.metric()


def merge_expositions(texts: list[bytes]) -> bytes:
    """The Prometheus text exposition of the sum of `texts` (each one shard's
    generate_latest output); see the module docstring for what is added and what is not.
    An empty list gives an empty exposition. Raises ValueError if a text does not parse, or
    if two texts give one family different types."""
    families: dict[str, _Family] = {}
    for text in texts:
        for parsed in text_string_to_metric_families(text.decode("utf-8")):
            family = families.get(parsed.name)
            if family is None:
                family = families[parsed.name] = _Family(
                    parsed.name, parsed.documentation, parsed.type
                )
            elif family.type != parsed.type:
                raise ValueError(
                    f"metric family {parsed.name}: type {parsed.type} here, {family.type} before"
                )
            for sample in parsed.samples:
                family.add(sample.name, sample.labels, sample.value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(list(families.values())))
    return generate_latest(registry)
