"""Fuzzing the raw produce path of a real server: POST mutated Kafka v2 batches with content
type application/vnd.kafka.record-batch.v2. Every answer is a 2xx or a 4xx problem+json with a
stable code, never a 5xx; a refused body writes nothing (high watermark unchanged); what is
accepted can be read back."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from engine.config import LogConfig
from engine.errors import CorruptBatchError, EngineError
from engine.format import iter_batches
from engine.partition_log import prepare_batches
from engine.records import decode_records

from ..conftest import KEPT_ENV, ServerProcess
from .support import fix_crc, fuzz_settings, mutated, valid_batches

RAW = "application/vnd.kafka.record-batch.v2"
TOPICS = {"fuzz": {}, "fuzz-compacted": {"cleanup.policy": "compact"}}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """One server for the module: Hypothesis runs every example in one test call."""
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("EVENTLOG_") and name not in KEPT_ENV:
                mp.delenv(name)
        server = ServerProcess(Path(tmp_path_factory.mktemp("fuzz-produce")) / "data").start()
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for name, configs in TOPICS.items():
            assert c.post("/v1/topics", json={"name": name, "partitions": 1, "configs": configs}).status_code == 201
        yield c
    assert server.stop() == 0, server.log()[-5000:]


def _high_watermark(client: httpx.Client, topic: str) -> int:
    r = client.get(f"/v1/topics/{topic}/partitions/0/offsets")
    assert r.status_code == 200, r.text
    return r.json()["high_watermark"]


def _offer(client: httpx.Client, topic: str, body: bytes) -> None:
    before = _high_watermark(client, topic)
    config = LogConfig(cleanup_policy="compact") if TOPICS[topic] else LogConfig()
    try:
        prepare_batches(bytearray(body), config, topic=topic)
        expected: str | None = None
    except CorruptBatchError:
        expected = "corrupt_batch"
    except EngineError:
        expected = "refused"
    r = client.post(f"/v1/topics/{topic}/partitions/0/records", content=body, headers={"content-type": RAW})
    assert r.status_code < 500, r.text
    event(f"{r.status_code} {r.json().get('code', '') if r.status_code >= 300 else 'stored'}")
    after = _high_watermark(client, topic)
    if r.status_code >= 300:
        assert r.headers["content-type"].startswith("application/problem+json"), r.text
        assert 400 <= r.status_code < 500 and r.json()["code"], r.text
        assert after == before, f"a refused body changed the log: {r.text}"
        if expected == "corrupt_batch":
            assert (r.status_code, r.json()["code"]) == (400, "corrupt_batch"), r.text
        return
    assert expected is None, f"accepted a body the engine refuses ({expected}): {r.text}"
    if r.headers.get("idempotent-replayed") == "true":
        # a mutation gave the batch a producer id and sequence that the partition already
        # holds: an idempotent retry, answered from the log, writes nothing
        assert after == before, r.text
        return
    assert after > before, (r.text, dict(r.headers))
    # what was accepted can be read back, raw and decoded: produce walks every record's fields
    assert _records_decode(body), "accepted a batch whose records do not decode"
    params = {"offset": before, "key_format": "base64", "value_format": "base64"}
    raw = client.get(f"/v1/topics/{topic}/partitions/0/records", params=params, headers={"accept": RAW})
    assert raw.status_code == 200, raw.text
    decoded = client.get(f"/v1/topics/{topic}/partitions/0/records", params=params)
    assert decoded.status_code == 200, decoded.text


def _records_decode(body: bytes) -> bool:
    try:
        for header in iter_batches(body):
            decode_records(body, header)
    except CorruptBatchError:
        return False
    return True


@fuzz_settings(50)
@given(topic=st.sampled_from(sorted(TOPICS)), body=mutated(valid_batches(max_batches=2)), crc=st.booleans())
def test_mutated_raw_batches_get_a_4xx_problem_or_are_stored_whole(client, topic, body, crc):
    if crc:
        fix_crc(body)
    _offer(client, topic, bytes(body))


@fuzz_settings(20)
@given(topic=st.sampled_from(sorted(TOPICS)), body=st.binary(max_size=300))
def test_random_bodies_are_corrupt_batch(client, topic, body):
    _offer(client, topic, body)


def test_valid_raw_batches_are_stored(client):
    """The starting point of the mutations is accepted (keys are set for the compacted topic)."""
    from engine import compression
    from engine.records import encode_batch

    for codec in (compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD):
        body = encode_batch(0, [(b"k", b"v", 1_000, [("h", b"x")])], compression_type=codec)
        for topic in TOPICS:
            before = _high_watermark(client, topic)
            r = client.post(f"/v1/topics/{topic}/partitions/0/records", content=bytes(body), headers={"content-type": RAW})
            assert r.status_code == 200, r.text
            assert _high_watermark(client, topic) == before + 1


def test_a_record_whose_key_overruns_it_is_refused(client):
    """The record's length is right, but its key length (5) points past the record's end. Found
    by the fuzzer: produce checked only record lengths, stored it, and every JSON read from that
    offset was a 400 corrupt_batch; produce now walks every record's fields, as Kafka does."""
    from .support import frame_batch

    body = b"\x00\x00\x00\x0a"  # attributes, timestampDelta, offsetDelta, keyLength 5
    body += b"ab\x00"  # two bytes of key, then what should have been valueLength
    record = bytes([len(body) * 2]) + body
    batch = frame_batch(record, count=1, base_timestamp=1000, max_timestamp=1000)
    before = _high_watermark(client, "fuzz")
    r = client.post("/v1/topics/fuzz/partitions/0/records", content=bytes(batch), headers={"content-type": RAW})
    assert (r.status_code, _high_watermark(client, "fuzz")) == (400, before), r.text


def test_a_header_key_that_is_not_utf8_is_fetched_as_replacement_characters(client):
    """Found by the fuzzer: such a key was stored, and every JSON fetch of it was a 500 (orjson
    cannot encode the surrogate escapes the engine decodes it to). Java's clients show U+FFFD."""
    from engine.records import encode_batch

    batch = encode_batch(0, [(b"k", b"v", 1_000, [("ok\udcff", b"x")])])  # header key b"ok\xff"
    before = _high_watermark(client, "fuzz")
    r = client.post("/v1/topics/fuzz/partitions/0/records", content=bytes(batch), headers={"content-type": RAW})
    assert r.status_code == 200, r.text
    fetched = client.get("/v1/topics/fuzz/partitions/0/records", params={"offset": before, "max_records": 1})
    assert fetched.status_code == 200, fetched.text
    assert fetched.json()["records"][0]["headers"] == [{"key": "ok\ufffd", "value": "x"}]
