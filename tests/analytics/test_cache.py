"""analytics.load with a segment cache: the rows of the data source, from Spark's Parquet reader.

The model is the data source itself (tests/analytics/test_source.py holds it to the snapshot's
records): every option that bounds a read gives the same rows both ways, the cache files are
written once, and pruning keeps only what a snapshot names.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .conftest import Snapshot
from .test_source import FILTERED_OPTIONS, filtered_model, order, spark_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_load_from_the_cache_equals_the_source(spark, snapshot: Snapshot, tmp_path: Path) -> None:
    from analytics import cache

    store = tmp_path / "segments"
    everything = cache.load(spark, snapshot.path, cache=store)
    assert everything.schema == spark.read.format("eventlog").load(str(snapshot.path)).schema
    # the snapshot's log start (orders-0 starts at 7) and high watermark (orders-1's live
    # segment grew after it) cut into cached segments: their rows are filtered out
    assert order(spark_rows(everything)) == order(snapshot.rows)
    files = sorted(store.rglob("*.parquet"))
    assert len(files) == sum(len(p["segments"]) for t in snapshot.manifest["topics"] if not t["internal"] for p in t["partitions"])
    mtimes = {f: f.stat().st_mtime_ns for f in files}
    bounded = cache.load(spark, snapshot.path, cache=store, **FILTERED_OPTIONS)
    assert order(spark_rows(bounded)) == filtered_model(snapshot)
    assert {f: f.stat().st_mtime_ns for f in sorted(store.rglob("*.parquet"))} == mtimes  # nothing rewritten
    # options only the source has go to the source
    compacted = cache.load(spark, snapshot.path, cache=store, compacted="true")
    assert "eventlog" in compacted._jdf.queryExecution().analyzed().toString().lower()


def test_a_changed_segment_gets_a_new_file_and_prune_removes_the_old(snapshot: Snapshot, tmp_path: Path) -> None:
    """Pure Python: a segment compaction rewrote (same base offset and size, other bytes) is not
    taken for the old one."""
    from analytics import cache

    copy = tmp_path / "snap"
    shutil.copytree(snapshot.path, copy)
    store = tmp_path / "segments"
    before, _ = cache.plan(copy, store, {"topics": "events"})
    for segment in before:
        assert cache.build(segment)
        assert not cache.build(segment)  # there already
    log = Path(before[0].path)
    data = bytearray(log.read_bytes())
    data[-1] ^= 0x01  # the same size, other bytes
    log.write_bytes(bytes(data))
    after, _ = cache.plan(copy, store, {"topics": "events"})
    assert after[0].file != before[0].file and [s.file for s in after[1:]] == [s.file for s in before[1:]]
    assert cache.prune(store, [s.file for s in after]) == 1
    assert not os.path.exists(before[0].file)
