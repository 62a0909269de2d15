"""Fuzzing the metadata log's readers: decode_event() and MetadataImage.apply() over damaged
events, and start-up over a __metadata-0 log with garbage after its last batch."""

from __future__ import annotations

import gc
import os
import struct
import warnings
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from engine import filenames
from engine.errors import EngineError, StorageError
from engine.log_dirs import CLEAN_SHUTDOWN_FILE
from engine.log_manager import EngineConfig, open_engine
from engine.metadata import METADATA_TOPIC, MetadataImage, TopicMeta, decode_event, encode_event
from engine.records import encode_batch

from .support import fuzz_settings, mutated, only


def _event(kind: str, **fields) -> bytes:
    return encode_event(kind, "orders", "id-orders", 1_700_000_000_000, **fields)[1]


VALID_EVENTS = [
    _event("topic_created", partitions=3, configs={"retention.ms": "1000"}),
    _event("configs_altered", partitions=3, configs={}, created_ms=5),
    _event("partitions_added", partitions=4, configs={}, created_ms=5),
    _event("topic_deleted"),
    _event("queue_created", queue="work", id="00112233445566ff", created_ms=5, starts=[0, 4, 9],
           settings={"lock_ms": 30000, "max_deliveries": 5, "ordering": "none",
                     "start": "earliest", "dead_letter_topic": None}),
    _event("queue_deleted", queue="work", id="00112233445566ff"),
]


def _image() -> MetadataImage:
    image = MetadataImage()
    image.topics["orders"] = TopicMeta("orders", "id-orders", 3, {}, 5)
    return image


@pytest.mark.parametrize("value", VALID_EVENTS)
def test_valid_events_apply(value):
    image = _image()
    image.apply(decode_event(value))
    assert image.events == 1


@fuzz_settings(400)
@given(value=mutated(st.sampled_from(VALID_EVENTS)) | st.binary(max_size=64))
@example(value=b"not json")  # was an orjson.JSONDecodeError
@example(value=b'{"v": 1, "type": "topic_created", "topic": "t", "topic_id": "i"}')  # was a KeyError
@example(value=b'{"v": 1, "type": "partitions_added", "topic": "orders", "topic_id": "id-orders", "partitions": "x"}')
@example(value=b'{"v": 1, "type": "configs_altered", "topic": "orders", "topic_id": "id-orders", "configs": [1]}')
@example(value=b'{"v": 1, "type": "resized", "topic": "orders", "topic_id": "id-orders"}')
@example(value=b'{"v": 1, "type": "topic_created", "topic": 5, "topic_id": "i", "partitions": 1}')
@example(value=b'{"v": 1, "type": {"retention.ms": "1000"}}')  # an unhashable type
def test_damaged_events_raise_storage_error(value):
    event, _ = only(StorageError, decode_event, value)
    if event is not None:
        only((), _image().apply, event)  # a decoded event always applies
        only((), MetadataImage().apply, event)


# -- start-up over a damaged metadata log ------------------------------------------------------


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _metadata_log(data_dir: Path) -> Path:
    return filenames.log_file(data_dir / f"{METADATA_TOPIC}-0", 0)


async def _create_topics(data_dir: Path) -> None:
    async with open_engine(EngineConfig(log_dirs=(data_dir,))) as engine:
        await engine.create_topic("orders", 2)
        await engine.create_topic("events", 1)


@pytest.mark.parametrize(
    "tail",
    [
        b"\x00" * 7,
        b"\xff" * 100,
        encode_batch(999, [(b"x", b"y", 0, [])])[:-3],  # a torn last batch
        bytes(range(256)) * 3,
    ],
    ids=["zeros", "ones", "torn-batch", "bytes"],
)
@pytest.mark.parametrize("clean_shutdown", [True, False])
async def test_garbage_after_the_metadata_log(tmp_path: Path, tail: bytes, clean_shutdown: bool) -> None:
    """After a crash (no clean-shutdown marker) the garbage is a torn tail: recovery cuts it
    off and every topic is back. After a clean shutdown too (issue 11; it used to stop the
    start with a CorruptSegmentError): the marker says how long the log was, so the partition
    is recovered as after a crash."""
    await _create_topics(tmp_path)
    log = _metadata_log(tmp_path)
    size = log.stat().st_size
    _append(log, tail)
    if not clean_shutdown:
        os.unlink(tmp_path / CLEAN_SHUTDOWN_FILE)  # as after a crash
    async with open_engine(EngineConfig(log_dirs=(tmp_path,))) as engine:
        assert {"orders", "events"} <= set(engine.topics)
        assert len(engine.topic("orders").partitions) == 2
    assert log.stat().st_size == size


async def _failed_start(data_dir: Path) -> BaseException:
    """The error of an open_engine() that fails. Such a start-up leaves descriptors, mappings
    and streams for the garbage collector (the log manager does not close what it loaded):
    they are collected here, so that their ResourceWarnings do not fail whichever test runs
    next. Only the innermost error is kept, without its traceback."""
    try:
        async with open_engine(EngineConfig(log_dirs=(data_dir,))):
            pass
    except BaseException as exc:  # noqa: BLE001 (an ExceptionGroup from the task group)
        error = _leaf(exc)
        error.__traceback__ = error.__context__ = error.__cause__ = None
        del exc
    else:
        raise AssertionError("open_engine() started")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    return error


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


async def test_a_crc_valid_garbage_event_stops_start_up_with_storage_error(tmp_path: Path) -> None:
    await _create_topics(tmp_path)
    log = _metadata_log(tmp_path)
    data = log.read_bytes()
    next_offset = 0
    position = 0
    while position < len(data):  # the next offset after the last batch
        base, length = struct.unpack_from(">qi", data, position)
        next_offset = base + struct.unpack_from(">i", data, position + 23)[0] + 1
        position += length + 12
    _append(log, encode_batch(next_offset, [(b"orders", b'{"v": 1, "type": "topic_created"}', 0, [])]))
    os.unlink(tmp_path / CLEAN_SHUTDOWN_FILE)
    error = await _failed_start(tmp_path)
    assert isinstance(error, StorageError), repr(error)
    assert "malformed metadata event" in str(error)
    assert isinstance(error, EngineError)
