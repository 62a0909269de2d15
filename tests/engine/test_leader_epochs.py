"""LogReads.leader_epochs / end_offset_for_epoch: Kafka's LeaderEpochFileCache.endOffsetFor over
a partition's leader-epoch-checkpoint, what OffsetForLeaderEpoch and Metadata answer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from engine.checkpoints import write_leader_epoch_checkpoint
from engine.log_reads import LogReads


def _reads(directory: Path, end: int) -> LogReads:
    reads = LogReads()
    reads.directory = directory
    reads.view = SimpleNamespace(high_watermark=end)  # type: ignore[assignment]
    return reads


def test_an_imported_history_answers_as_kafka_does(tmp_path: Path) -> None:
    write_leader_epoch_checkpoint(tmp_path, [(0, 0), (2, 100), (4, 250)])
    reads = _reads(tmp_path, 400)
    assert reads.current_leader_epoch == 4
    assert reads.end_offset_for_epoch(4) == (4, 400)  # the latest: the log end
    assert reads.end_offset_for_epoch(2) == (2, 250)  # ends where epoch 4 starts
    assert reads.end_offset_for_epoch(3) == (2, 250)  # not an epoch: the largest below it
    assert reads.end_offset_for_epoch(1) == (0, 100)
    assert reads.end_offset_for_epoch(0) == (0, 100)
    assert reads.end_offset_for_epoch(5) == (-1, -1)  # past the latest: unknown
    assert reads.end_offset_for_epoch(-1) == (-1, -1)


def test_a_partition_without_a_checkpoint_is_in_epoch_0(tmp_path: Path) -> None:
    reads = _reads(tmp_path, 7)
    assert reads.leader_epochs == [(0, 0)]
    assert reads.current_leader_epoch == 0
    assert reads.end_offset_for_epoch(0) == (0, 7)
    assert reads.end_offset_for_epoch(1) == (-1, -1)
