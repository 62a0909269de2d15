"""merge_expositions: a shard family's /metrics, the sum of its shards' registries."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics_merge import MAX_GAUGES, merge_expositions
from api.observability import Metrics


def _shard(requests: int, latencies: list[float], fsyncs: list[float], records: dict[str, int], in_flight: int) -> Metrics:
    m = Metrics()
    for _ in range(requests):
        m.requests.labels("/v1/topics/{topic}/records", "POST", "200").inc()
    for seconds in latencies:
        m.latency.labels("/v1/topics/{topic}/records", "POST").observe(seconds)
    for seconds in fsyncs:
        m.fsync.observe(seconds)
    for topic, n in records.items():
        m.produced_records.labels(topic).inc(n)
    m.in_flight = in_flight
    return m


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, as prometheus-client's parser reads it back."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"sample {key} twice"
            out[key] = s.value
    return out


def _types(text: bytes) -> list[str]:
    return [line.split()[2] for line in text.decode().splitlines() if line.startswith("# TYPE ")]


ROUTE = (("method", "POST"), ("route", "/v1/topics/{topic}/records"))


def test_two_shards_sum_counters_histograms_and_gauges() -> None:
    a = _shard(3, [0.0003, 0.004, 0.2], [0.0002, 0.002], {"orders": 1500}, in_flight=2)
    b = _shard(5, [0.004, 0.004, 0.004, 7.0, 50.0], [0.03], {"orders": 500, "clicks": 7}, in_flight=1)
    ta, tb = generate_latest(a.registry), generate_latest(b.registry)
    merged = merge_expositions([ta, tb])
    got, sa, sb = _samples(merged), _samples(ta), _samples(tb)

    assert got[("eventlog_http_requests_total", (*ROUTE[:1], *ROUTE[1:], ("status", "200")))] == 8
    assert got[("eventlog_produce_records_total", (("topic", "orders"),))] == 2000
    assert got[("eventlog_produce_records_total", (("topic", "clicks"),))] == 7  # only shard b has it
    assert got[("eventlog_http_requests_in_flight", ())] == 3
    hist = "eventlog_http_request_duration_seconds"
    assert got[(f"{hist}_count", ROUTE)] == 8
    assert got[(f"{hist}_sum", ROUTE)] == pytest.approx(0.2043 + 57.012)
    buckets = {dict(k[1])["le"]: v for k, v in got.items() if k[0] == f"{hist}_bucket"}
    assert buckets["0.0005"] == 1 and buckets["0.005"] == 5 and buckets["0.25"] == 6
    assert buckets["10.0"] == 7 and buckets["30.0"] == 7 and buckets["+Inf"] == 8
    assert got[("eventlog_fsync_seconds_count", ())] == 3
    assert got[("eventlog_fsync_seconds_bucket", (("le", "0.0025"),))] == 2
    assert got[("eventlog_fsync_seconds_bucket", (("le", "+Inf"),))] == 3

    # every other sample: the sum of both shards', creation times the earliest, and the gauges
    # that are facts of the machine or of each process (MAX_GAUGES) the largest
    for key in set(sa) | set(sb):
        if key[0] in MAX_GAUGES:
            assert got[key] == max(v for v in (sa.get(key), sb.get(key)) if v is not None), key
        elif key[0].endswith("_created"):
            assert got[key] == min(v for v in (sa.get(key), sb.get(key)) if v is not None)
        else:
            assert got[key] == pytest.approx(sa.get(key, 0.0) + sb.get(key, 0.0)), key
    assert set(got) == set(sa) | set(sb)
    # HELP and TYPE once per family, the same families and types as one shard's
    assert _types(merged) == _types(ta)
    assert len([x for x in merged.splitlines() if x.startswith(b"# HELP ")]) == len(_types(ta))


def test_one_text_comes_back_unchanged() -> None:
    text = generate_latest(_shard(2, [0.01], [0.001], {"t": 10}, in_flight=1).registry)
    assert merge_expositions([text]) == text
    assert merge_expositions([]) == b""


def test_histogram_buckets_stay_together_per_label_set() -> None:
    """A label set only the second shard has: its buckets, count and sum follow each other, and
    the buckets ascend, as the text format wants."""
    a = Metrics()
    a.latency.labels("/a", "GET").observe(0.1)
    b = Metrics()
    b.latency.labels("/b", "GET").observe(0.1)
    b.latency.labels("/a", "GET").observe(1.0)
    merged = merge_expositions([generate_latest(a.registry), generate_latest(b.registry)]).decode()
    hist = "eventlog_http_request_duration_seconds_"
    lines = [x for x in merged.splitlines() if x.startswith(hist) and not x.startswith(f"{hist}created")]
    routes = [x.split('route="')[1].split('"')[0] for x in lines]
    assert routes == sorted(routes, key=routes.index)  # /a's lines, then /b's
    assert routes.count("/a") == routes.count("/b")
    a_buckets = [float(x.split('le="')[1].split('"')[0]) for x in lines if 'route="/a"' in x and "_bucket" in x]
    assert a_buckets == sorted(a_buckets)
    assert 'eventlog_http_request_duration_seconds_count{method="GET",route="/a"} 2.0' in merged


def test_gauges_that_are_not_sums() -> None:
    """The last cleanup pass's duration: the longest; per-partition gauges from their owner."""
    shard_a = (
        b"# HELP eventlog_cleanup_last_pass_seconds duration of the last pass\n"
        b"# TYPE eventlog_cleanup_last_pass_seconds gauge\n"
        b'eventlog_cleanup_last_pass_seconds{worker="compaction"} 2.5\n'
        b"# HELP eventlog_partition_high_watermark next offset to be written\n"
        b"# TYPE eventlog_partition_high_watermark gauge\n"
        b'eventlog_partition_high_watermark{partition="0",topic="t"} 40.0\n'
    )
    shard_b = (
        b"# HELP eventlog_cleanup_last_pass_seconds duration of the last pass\n"
        b"# TYPE eventlog_cleanup_last_pass_seconds gauge\n"
        b'eventlog_cleanup_last_pass_seconds{worker="compaction"} 0.5\n'
        b"# HELP eventlog_partition_high_watermark next offset to be written\n"
        b"# TYPE eventlog_partition_high_watermark gauge\n"
        b'eventlog_partition_high_watermark{partition="1",topic="t"} 7.0\n'
    )
    got = _samples(merge_expositions([shard_a, shard_b]))
    assert got == {
        ("eventlog_cleanup_last_pass_seconds", (("worker", "compaction"),)): 2.5,
        ("eventlog_partition_high_watermark", (("partition", "0"), ("topic", "t"))): 40.0,
        ("eventlog_partition_high_watermark", (("partition", "1"), ("topic", "t"))): 7.0,
    }


def test_conflicting_types_are_refused() -> None:
    counter = b"# HELP x things\n# TYPE x counter\nx_total 1.0\n"
    gauge = b"# HELP x things\n# TYPE x gauge\nx 1.0\n"
    with pytest.raises(ValueError, match="type gauge here, counter before"):
        merge_expositions([counter, gauge])


@pytest.mark.in_process_only  # sets the apps' peers in this process
def test_metrics_route_answers_for_the_family(app_factory, tmp_path: Path) -> None:
    """Two real apps, each with its own engine and partitions: the first one's /metrics, with
    the second as its peer, sums their counters and shows both one's partition gauges."""
    own = app_factory(tmp_path / "own").start()
    peer = app_factory(tmp_path / "peer").start()
    with own.client() as c, peer.client() as p:
        assert c.post("/v1/topics", json={"name": "a", "partitions": 1}).status_code == 201
        assert p.post("/v1/topics", json={"name": "b", "partitions": 2}).status_code == 201
        assert c.post("/v1/topics/a/records", json={"records": [{"value": "x"}] * 3}).status_code == 200
        assert p.post("/v1/topics/b/records", json={"records": [{"value": "y", "partition": 1}] * 4}).status_code == 200
        alone = c.get("/metrics").text
        assert 'topic="b"' not in alone  # no peers set: the app's own registry, as before

        async def peer_metrics() -> list[bytes]:
            return [generate_latest(peer.app.state.metrics.registry)]

        own.app.state.peer_metrics = peer_metrics
        text = c.get("/metrics").text
        commits = [
            _samples(generate_latest(s.app.state.metrics.registry))[("eventlog_group_commit_records_count", ())]
            for s in (own, peer)
        ]
    got = _samples(text.encode())
    created = ("method", "POST"), ("route", "/v1/topics"), ("status", "201")
    assert got[("eventlog_http_requests_total", created)] == 2
    assert got[("eventlog_produce_records_total", (("topic", "a"),))] == 3
    assert got[("eventlog_produce_records_total", (("topic", "b"),))] == 4
    assert got[("eventlog_partition_high_watermark", (("partition", "0"), ("topic", "a")))] == 3
    assert got[("eventlog_partition_high_watermark", (("partition", "1"), ("topic", "b")))] == 4
    assert got[("eventlog_partition_high_watermark", (("partition", "0"), ("topic", "b")))] == 0
    assert got[("eventlog_http_requests_in_flight", ())] == 1  # this scrape, on the own app
    assert commits[0] >= 1 and commits[1] >= 1  # records and the topic's metadata event
    assert got[("eventlog_group_commit_records_count", ())] == sum(commits)
