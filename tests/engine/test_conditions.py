"""The typed conditions an append takes (engine/conditions.py): what any transport passes."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from engine.conditions import ExpectedOffset, KeyAt, KeyHasRecords, KeyIsNew, key_version
from engine.key_reads import ANY_RECORDS, NO_RECORDS, condition_holds


def test_conditions_are_frozen_values() -> None:
    assert ExpectedOffset(42) == ExpectedOffset(42) and ExpectedOffset(42) != ExpectedOffset(41)
    assert KeyIsNew() == KeyIsNew() and KeyHasRecords() == KeyHasRecords()
    assert KeyAt(0) != KeyIsNew()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExpectedOffset(1).offset = 2  # type: ignore[misc]
    for condition in (ExpectedOffset(7), KeyAt(7), KeyIsNew(), KeyHasRecords()):
        assert pickle.loads(pickle.dumps(condition)) == condition  # crosses to an owner shard as is


@pytest.mark.parametrize("bad", [-1, -2, 1.0, "42", True, None])
def test_offsets_are_non_negative_integers(bad: object) -> None:
    with pytest.raises(ValueError):
        ExpectedOffset(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        KeyAt(bad)  # type: ignore[arg-type]


def test_key_versions_are_what_the_key_index_compares() -> None:
    assert key_version(KeyAt(41)) == 41
    assert key_version(KeyIsNew()) == NO_RECORDS == -1
    assert key_version(KeyHasRecords()) == ANY_RECORDS
    # (key_reads.matches: the partition's check, given the key's latest offset, -1 for none)
    def holds(condition, current: int) -> bool:
        return condition_holds(key_version(condition), current)

    assert holds(KeyIsNew(), -1) and not holds(KeyIsNew(), 3)
    assert holds(KeyHasRecords(), 3) and not holds(KeyHasRecords(), -1)
    assert holds(KeyAt(3), 3) and not holds(KeyAt(3), 4)
    with pytest.raises(TypeError):
        key_version(ExpectedOffset(3))  # type: ignore[arg-type]
