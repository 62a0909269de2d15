"""Reading eventlog snapshots with Spark: a vectorised Kafka v2 segment decoder and the
`eventlog` PySpark data source.

What other code may use:

    register(spark)                  spark.dataSource.register(EventlogDataSource)
    EventlogDataSource               source.py: spark.read.format("eventlog").load(snapshot dir)
    latest_per_key(df)               source.py: the compacted view in the DataFrame layer
    load(spark, path, cache=, ...)   cache.py: the same rows, read from segments kept as Parquet
    decode_segment, ARROW_SCHEMA,    decoder.py: one segment file -> Arrow record batches
    SPARK_DDL, SnapshotCorruptError
    load_value_schema(ddl or file)   schemas.py: a value schema (Spark DDL or JSON Schema) for typed reads
    MalformedRecordError             values.py: a typed read's FAILFAST error
    upload_snapshot(dir, to)         upload.py: a snapshot to shared storage (s3://...), each segment once
    prune_upload(root, keep=)        prune.py: drop old snapshots and the objects no manifest names

Snapshot paths may be URIs of any pyarrow filesystem (storage.py: s3://, s3a://, hdfs://).

spark.readStream.format("eventlog") is the streaming source (stream.py): successive snapshots or
a live data dir, offsets per partition.

decoder.py imports numpy, pyarrow and engine's pure modules (format, compression, errors), never
pyspark; source.py needs pyspark (the `spark` extra). Names are imported lazily so that
`import analytics.decoder` works without pyspark installed.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ARROW_SCHEMA": "decoder",
    "SPARK_DDL": "decoder",
    "SnapshotCorruptError": "decoder",
    "decode_segment": "decoder",
    "EventlogDataSource": "source",
    "latest_per_key": "source",
    "load": "cache",
    "load_value_schema": "schemas",
    "MalformedRecordError": "values",
    "upload_snapshot": "upload",
    "prune_upload": "prune",
}

__all__ = [
    "ARROW_SCHEMA",
    "SPARK_DDL",
    "EventlogDataSource",
    "MalformedRecordError",
    "SnapshotCorruptError",
    "decode_segment",
    "latest_per_key",
    "load",
    "load_value_schema",
    "prune_upload",
    "register",
    "upload_snapshot",
]


def register(spark) -> None:
    """Make spark.read.format("eventlog") available in this session."""
    from .source import EventlogDataSource

    spark.dataSource.register(EventlogDataSource)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'analytics' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
