"""A Python data source that only reads Parquet files with pyarrow and yields their batches:
the most a Python data source can hand Spark per second (bench/spark.py measures it next to
spark.read.parquet of the same files). Not used outside the benchmark."""

from __future__ import annotations

import os

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition


class _File(InputPartition):
    def __init__(self, path: str) -> None:
        self.path = path


class ParquetFloorSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "parquet-floor"

    def schema(self) -> str:
        from analytics.decoder import SPARK_DDL

        return SPARK_DDL

    def reader(self, schema) -> DataSourceReader:
        return _Reader(self.options["path"])


class _Reader(DataSourceReader):
    def __init__(self, root: str) -> None:
        self.root = root

    def partitions(self) -> list[_File]:
        return [_File(os.path.join(d, f)) for d, _, files in os.walk(self.root) for f in sorted(files) if f.endswith(".parquet")]

    def read(self, partition: _File):
        import pyarrow.parquet as pq

        yield from pq.ParquetFile(partition.path).iter_batches(batch_size=65536)
