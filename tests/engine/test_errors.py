"""Engine errors cross process boundaries (compaction passes run in a worker process)."""

from __future__ import annotations

import pickle

import pytest

from engine import errors as e


@pytest.mark.parametrize("error", [
    e.StorageFullError("/data/t-0/0.log", "append failed: No space left on device"),
    e.TooManyOpenFilesError("/data/t-0", "cannot create segment: Too many open files"),
    e.OpenFilesLimitError(40, 21, 320),
    e.OffsetOutOfRangeError(5, 10, 20),
    e.CorruptBatchError("CRC mismatch", 61),
    e.TopicNotFoundError("orders"),
])
def test_every_engine_error_survives_pickling(error: e.EngineError) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error) and vars(again) == vars(error)
