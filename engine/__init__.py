"""The storage engine: Kafka's log layer.

What other packages may use:

    open_engine, EngineConfig, LogManager       log_manager.py: every partition of a server
    PartitionLog, prepare_batches, AppendResult partition_log.py: appends and reads
    reader                                      lock-free reads over a LogView
    LogConfig                                   config.py: topic configs (Kafka names)
    encode_batch, decode_batch, Record          records.py: v2 batches (split_records, frame_batch,
                                                encode_record_tails: what compaction re-frames)
    ProduceService                              produce.py: JSON and raw produce (the routers' rules)
    conditions                                  typed conditions of appends (ExpectedOffset,
                                                KeyAt, KeyIsNew, KeyHasRecords)
    slicing                                     big JSON documents and lists off the event loop
    errors                                      the error classes API code maps to HTTP
    interface                                   the above typed: Engine, Topic, Partition, Groups,
                                                the protocols api/ and broker/ are checked against

Names are imported lazily, so `import engine.format` (all analytics/ may use) stays free of
anyio and the rest.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AppendResult": "partition_log",
    "EngineConfig": "log_manager",
    "LogConfig": "config",
    "LogManager": "log_manager",
    "PartitionLog": "partition_log",
    "ProduceService": "produce",
    "Record": "records",
    "decode_batch": "records",
    "encode_batch": "records",
    "open_engine": "log_manager",
    "prepare_batches": "partition_log",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
