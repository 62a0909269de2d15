"""The storage engine: Kafka's log layer.

What other packages may use:

    open_engine, EngineConfig, LogManager      log_manager.py: every partition of a server
    PartitionLog, prepare_batches, AppendResult partition_log.py: appends and reads
    reader                                      lock-free reads over a LogView
    LogConfig                                   config.py: topic configs (Kafka names)
    encode_batch, decode_batch, Record          records.py: v2 batches
    errors                                      the error classes API code maps to HTTP
"""

from .config import LogConfig
from .log_manager import EngineConfig, LogManager, open_engine
from .partition_log import AppendResult, PartitionLog, prepare_batches
from .records import Record, decode_batch, encode_batch

__all__ = [
    "AppendResult",
    "EngineConfig",
    "LogConfig",
    "LogManager",
    "PartitionLog",
    "Record",
    "decode_batch",
    "encode_batch",
    "open_engine",
    "prepare_batches",
]
