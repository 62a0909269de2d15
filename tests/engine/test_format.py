from __future__ import annotations

import pytest
from crc32c import crc32c

from engine.errors import CorruptBatchError
from engine.format import (
    HEADER_SIZE,
    LOG_APPEND_TIME,
    compute_crc,
    iter_batches,
    parse_header,
    set_base_offset,
    set_log_append_time,
    validate_batch,
)
from engine.records import decode_batch, encode_batch

# docs/FORMAT.md, "Test vectors": the golden batch
GOLDEN = bytes.fromhex(
    "0000000000000005 00000044 00000000 02 16c8334a 0000 00000000"
    "0000018bcfe56800 0000018bcfe56800 ffffffffffffffff ffff ffffffff 00000001"
    "24 00 00 00 06 6b6579 0a 76616c7565 02 02 68 02 31".replace(" ", "")
)
# Two null-key records, CRC 0x27132472 (docs/FORMAT.md, "Test vectors"). The hex first
# written down for it had one stray '0' nibble after lastOffsetDelta (155 hex digits for 77
# bytes); this is the 77-byte batch its CRC fits.
TWO_NULL_KEYS = bytes.fromhex(
    "0000000000000000000000410000000002271324720000000000010000018bcfe568000000018bcfe56801"
    "ffffffffffffffffffffffffffff000000020e000000010261000e00020201026200"
)


def test_crc32c_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_golden_batch_encodes_byte_for_byte() -> None:
    batch = encode_batch(5, [(b"key", b"value", 1700000000000, [("h", b"1")])])
    assert len(batch) == 80
    assert bytes(batch) == GOLDEN


def test_two_null_key_records_vector() -> None:
    batch = encode_batch(0, [(None, b"a", 1700000000000, []), (None, b"b", 1700000000001, [])])
    assert len(batch) == 77
    assert bytes(batch) == TWO_NULL_KEYS
    assert parse_header(batch).crc == 0x27132472


def test_golden_header_fields() -> None:
    h = validate_batch(GOLDEN)
    assert (h.base_offset, h.last_offset, h.records_count, h.size) == (5, 5, 1, 80)
    assert (h.base_timestamp, h.max_timestamp) == (1700000000000, 1700000000000)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1)
    _, records = decode_batch(GOLDEN)
    assert [(r.offset, r.key, r.value, r.headers) for r in records] == [(5, b"key", b"value", (("h", b"1"),))]


def test_rewriting_base_offset_keeps_the_crc_valid() -> None:
    buf = bytearray(GOLDEN)
    set_base_offset(buf, 0, 123456789012, leader_epoch=7)
    h = validate_batch(buf)
    assert (h.base_offset, h.partition_leader_epoch, h.crc) == (123456789012, 7, 0x16C8334A)


def test_log_append_time_rewrite_recomputes_crc() -> None:
    buf = bytearray(GOLDEN)
    set_log_append_time(buf, 0, len(buf), 1800000000000)
    h = validate_batch(buf)
    assert h.timestamp_type == LOG_APPEND_TIME
    assert h.max_timestamp == 1800000000000
    _, records = decode_batch(buf)
    assert records[0].timestamp == 1800000000000  # every record reports maxTimestamp


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b.__setitem__(16, 1), "magic"),
        (lambda b: b.__setitem__(70, b[70] ^ 0x01), "CRC mismatch"),
        (lambda b: b.__setitem__(slice(8, 12), (20).to_bytes(4, "big")), "batchLength"),
        (lambda b: b.__setitem__(slice(8, 12), (1000).to_bytes(4, "big")), "runs past the end"),
        (lambda b: b.__setitem__(slice(23, 27), (-1).to_bytes(4, "big", signed=True)), "negative"),
    ],
)
def test_validate_rejects_damaged_batches(mutate, reason: str) -> None:
    buf = bytearray(GOLDEN)
    mutate(buf)
    with pytest.raises(CorruptBatchError, match=reason):
        validate_batch(buf)


def test_validate_rejects_short_input() -> None:
    with pytest.raises(CorruptBatchError, match="header needs 61"):
        validate_batch(GOLDEN[:HEADER_SIZE - 1])
    with pytest.raises(CorruptBatchError, match="empty body"):
        list(iter_batches(b""))


def test_iter_batches_walks_concatenated_batches() -> None:
    a = encode_batch(0, [(b"a", b"1", 1, [])])
    b = encode_batch(0, [(b"b", b"2", 2, []), (b"c", b"3", 3, [])])
    headers = list(iter_batches(bytes(a + b)))
    assert [h.position for h in headers] == [0, len(a)]
    assert [h.records_count for h in headers] == [1, 2]
    assert compute_crc(a + b, len(a), len(b)) == headers[1].crc
