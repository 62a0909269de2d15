"""Background workers over the engine: the retention deleter and the key-based compactor.

Each will be a pure one-pass function over a partition plus a thin loop that schedules it. The
engine already provides what they need: PartitionLog.delete_segments (retention) and
PartitionLog.replace_segments with LogSegment.create(..., suffix=".cleaned") (compaction), whose
crash recovery is in engine/recovery.py. Coming with the workers issue.
"""
