"""A queue's leases read the log in whole batches (engine/queues.py, Queues._lease_partition):
the reader decodes a batch whole, so a read that stopped at a record count inside a batch
decoded the rest for nothing, and the next lease's read decoded that batch again."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.log_manager import EngineConfig, open_engine
from engine.partition_log import prepare_batches
from engine.queues import QueueSettings
from engine.records import encode_batch

from .helpers import FakeClock

BATCH = 1000


@pytest.mark.parametrize("value_bytes", [256, 60])  # a batch over the read's budget; under it
async def test_leases_of_100_read_each_batch_once(tmp_path: Path, value_bytes: int) -> None:
    async with open_engine(EngineConfig(log_dirs=(tmp_path,)), FakeClock()) as engine:
        await engine.create_topic("jobs", 1)
        log = engine.partition("jobs", 0)
        for b in range(4):
            batch = encode_batch(0, [(None, b"%d" % (b * BATCH + i) + b"x" * value_bytes, 1, ())
                                     for i in range(BATCH)])
            await log.append(prepare_batches(batch, log.config))
        await engine.queues.create("jobs", "w", QueueSettings())
        starts: list[int] = []
        read = log.read_records

        async def reading(offset: int, max_records: int, max_bytes: int):  # noqa: ANN202
            if max_records > 1:  # (not the expiry loop's look at the window's first record)
                starts.append(offset)
            return await read(offset, max_records, max_bytes)

        log.read_records = reading  # type: ignore[method-assign]
        got = []
        while len(got) < 4 * BATCH:
            leased = await engine.queues.lease("jobs", "w", 100)
            assert leased
            got += leased
            results = await engine.queues.settle("jobs", "w", "ack", [r.lease for r in leased])
            assert {s for _l, s in results} == {"acked"}
        assert [r.offset for r in got] == list(range(4 * BATCH))
        assert all(r.value.startswith(b"%dx" % r.offset) for r in got)
        # every read began where a batch begins, and none read a batch a second time
        assert starts and all(o % BATCH == 0 for o in starts), starts
        assert len(starts) == len(set(starts)), starts



def test_a_lease_string_is_urlsafe_base64_of_its_fields_unpadded() -> None:
    """encode_lease (one per record leased) writes what base64.urlsafe_b64encode did, and
    LeaseId.decode reads it back, for the fields' extremes too."""
    import base64
    import struct

    from engine.queues import LeaseId, encode_lease

    cases = [
        (b"\x00" * 8, 0, 0, 0, 0),
        (b"\xff" * 8, 2**32 - 1, 2**63 - 1, 2**32 - 1, 2**64 - 1),
        (b"\xfb\xff\xbf" * 2 + b"ab", 7, 123_456_789, 3, 0xDEADBEEF),  # (base64's + and /)
    ]
    for fields in cases:
        text = encode_lease(*fields)
        raw = struct.pack(">8sIqIQ", *fields)
        assert text == base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        assert text == LeaseId(*fields).encode()
        assert len(text) == 43 and LeaseId.decode(text) == LeaseId(*fields)
    assert "-" in text and "_" in text  # (the last case: the url-safe alphabet)
