"""Request validation against a real server: raw batches (offset range, transactions), topic
names Kafka reserves, strict JSON integers, the request head's size, and the memory a
compression bomb can make the server use."""

from __future__ import annotations

import socket
import struct
import zlib

import httpx
import pytest
from crc32c import crc32c

from ..engine.helpers import patch_last_offset_delta
from ..kafka_oracle import build_batch
from .test_api import RAW, assert_problem
from .test_security import _problem_of, _read_response

T0 = 1_700_000_000_000


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


def _high_watermark(client: httpx.Client, topic: str, partition: int = 0) -> int:
    return client.get(f"/v1/topics/{topic}").json()["partitions"][partition]["high_watermark"]


def _with_last_offset_delta(batch: bytes, delta: int) -> bytes:
    return bytes(patch_last_offset_delta(bytearray(batch), delta))


def _produce_raw(client: httpx.Client, topic: str, body: bytes) -> httpx.Response:
    return client.post(f"/v1/topics/{topic}/partitions/0/records", content=body, headers={"content-type": RAW})


# -- raw batches ------------------------------------------------------------------------------------


def test_a_batch_claiming_2_31_offsets_for_one_record_is_refused(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t"})
    batch = _with_last_offset_delta(build_batch([(b"k", b"v", T0, [])]), 2**31 - 1)
    problem = assert_problem(_produce_raw(client, "t", batch), 400, "corrupt_batch")
    assert "Inconsistent batch offset range [0, 2147483647] and count of records 1" in problem["detail"]
    assert _high_watermark(client, "t") == 0
    ok = _produce_raw(client, "t", build_batch([(b"k", b"v", T0, [])]))
    assert ok.status_code == 200 and ok.json()["base_offset"] == 0


def test_transactional_batches_are_refused_until_transactions_exist(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t"})
    batch = build_batch([(b"k", b"v", T0, [])], transactional=True, producer_id=5, producer_epoch=0, base_sequence=0)
    problem = assert_problem(_produce_raw(client, "t", batch), 400, "transactions_unsupported")
    assert "transactional" in problem["detail"]
    assert _high_watermark(client, "t") == 0


# -- topic names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["__cluster_metadata", "__transaction_state", "__share_group_state", "__consumer_offsets", "__metadata"])
def test_topic_names_kafka_reserves_are_refused(client: httpx.Client, name: str) -> None:
    problem = assert_problem(client.post("/v1/topics", json={"name": name}), 422, "invalid_topic_name")
    assert "reserved" in problem["detail"] or "internal" in problem["detail"]
    assert name not in [t["name"] for t in client.get("/v1/topics?internal=true").json()["topics"]] or name in (
        "__consumer_offsets", "__metadata"
    )


def test_other_double_underscore_names_stay_allowed_as_in_kafka(client: httpx.Client) -> None:
    assert client.post("/v1/topics", json={"name": "__my_events"}).status_code == 201


# -- strict integers --------------------------------------------------------------------------------


@pytest.mark.parametrize("partitions", ["3", 3.0, True])
def test_partitions_must_be_a_json_integer(client: httpx.Client, partitions: object) -> None:
    assert_problem(client.post("/v1/topics", json={"name": "t", "partitions": partitions}), 422, "validation_error")
    assert client.get("/v1/topics").json()["topics"] == []


def test_request_integers_are_strict_everywhere(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 2})
    client.post("/v1/topics/t/records", json={"records": [{"value": "a", "partition": 0}, {"value": "b", "partition": 1}]})
    # a JSON true is not the number 1 (lax parsing made it retention.ms = 1)
    assert_problem(client.post("/v1/topics", json={"name": "u", "configs": {"retention.ms": True}}), 422, "validation_error")
    assert_problem(client.patch("/v1/topics/t/configs", json={"configs": {"retention.ms": True}}), 422, "validation_error")
    assert_problem(client.post("/v1/topics/t/partitions", json={"count": "4"}), 422, "validation_error")
    assert_problem(client.post("/v1/topics/t/partitions/0/delete-records", json={"before_offset": "1"}), 422, "validation_error")
    assert_problem(client.post("/v1/topics/t/partitions/0/delete-records", json={"before_offset": True}), 422, "validation_error")
    commit = {"offsets": [{"topic": "t", "partition": 0, "offset": "1"}]}
    assert_problem(client.post("/v1/groups/g/offsets", json=commit), 422, "validation_error")
    commit = {"offsets": [{"topic": "t", "partition": True, "offset": 1}]}
    assert_problem(client.post("/v1/groups/g/offsets", json=commit), 422, "validation_error")
    assert_problem(
        client.post("/v1/topics/t/partitions/1/records", json={"records": [{"value": "x", "partition": True}]}),
        422, "validation_error",
    )
    # nothing changed
    detail = client.get("/v1/topics/t").json()
    assert len(detail["partitions"]) == 2 and "retention.ms" not in detail["overrides"]
    assert [p["log_start_offset"] for p in detail["partitions"]] == [0, 0]
    assert [p["high_watermark"] for p in detail["partitions"]] == [1, 1]
    assert client.get("/v1/groups/g/offsets").json()["offsets"] == []
    # and the right types still work
    assert client.post("/v1/topics/t/partitions", json={"count": 3}).status_code == 200
    assert client.post("/v1/groups/g/offsets", json={"offsets": [{"topic": "t", "partition": 0, "offset": 1}]}).status_code == 200
    assert client.post("/v1/topics", json={"name": "u", "configs": {"retention.ms": 1000, "min.cleanable.dirty.ratio": 0.3}}).status_code == 201


# -- the request head -------------------------------------------------------------------------------


def _send_and_read(port: int, request: bytes) -> tuple[int, dict]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        return _problem_of(_read_response(s))


def test_a_70_kb_header_is_431_not_routed(server) -> None:
    """The issue's case on the real server: the whole head arrives at once and the parser
    completes it in one go (tests/app/test_server_limits.py has the other shapes, on both of
    uvicorn's parsers)."""
    head = b"GET /v1/topics/nope HTTP/1.1\r\nhost: x\r\nx-padding: " + b"p" * 70_000 + b"\r\n\r\n"
    status, problem = _send_and_read(server.port, head)
    assert (status, problem["code"]) == (431, "headers_too_large")
    with server.client() as c:  # a head just under the limit is served
        assert c.get("/v1/topics", headers={"x-padding": "p" * 60_000}).status_code == 200


# -- compression bombs ------------------------------------------------------------------------------


def _vm_hwm_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _zigzag(value: int) -> bytes:
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _gzip_batch(prefix: bytes, zeros: int) -> bytes:
    """A one-record gzip batch whose records block is `prefix` and then `zeros` zero bytes,
    compressed piecewise (nothing that size is held here either)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [z.compress(prefix)]
    piece = bytes(1 << 20)
    parts += [z.compress(piece) for _ in range(zeros >> 20)]
    parts += [z.compress(bytes(zeros & ((1 << 20) - 1))), z.flush()]
    out = bytearray(61) + b"".join(parts)
    struct.pack_into(">qiib", out, 0, 0, len(out) - 12, 0, 2)
    struct.pack_into(">hiqqqhii", out, 21, 1, 0, T0, T0, -1, -1, -1, 1)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


BOMB_RSS_BOUND = 64 << 20
"""How far the server's peak RSS may rise while it refuses the bombs: the bodies it holds
(4 MiB), one inflated chunk and what the allocator keeps around, with room to spare. The server
before the fix rose by about 400 MiB (a batch inflated whole, up to 256 MiB, then copied)."""


def test_a_gzip_bomb_is_refused_without_inflating_it(server) -> None:
    gib = 1 << 30
    zeros = _gzip_batch(b"", gib)  # 1 GiB of zeros: the first record's length is 0
    body = b"\x00" + _zigzag(0) + _zigzag(0) + _zigzag(1) + b"k" + _zigzag(gib)
    valid = _gzip_batch(_zigzag(len(body) + gib + 1) + body, gib + 1)  # one valid 1 GiB record
    assert len(zeros) < 1_048_588 and len(valid) < 1_048_588  # within max.message.bytes
    pid = server.proc.pid
    with server.client() as c:
        c.post("/v1/topics", json={"name": "t"})
        warm = build_batch([(b"k", b"v" * 100, T0, [])] * 10, codec=1)
        assert _produce_raw(c, "t", warm).status_code == 200
        before = _vm_hwm_bytes(pid)
        assert_problem(_produce_raw(c, "t", zeros), 400, "corrupt_batch")
        problem = assert_problem(_produce_raw(c, "t", valid * 4), 413, "request_too_large")  # 4 GiB claimed
        assert "EVENTLOG_MAX_INFLATED_BYTES_PER_REQUEST" in problem["detail"]
        risen = _vm_hwm_bytes(pid) - before
        assert risen < BOMB_RSS_BOUND, f"the server's peak RSS rose by {risen >> 20} MiB"
        assert _high_watermark(c, "t") == 10
