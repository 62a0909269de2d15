"""Queues written by the layout before their definitions were metadata events (each queue a
["q", topic, queue] record of the one-partition __queue_state) keep every acknowledgement,
dead letter and delivery count when a newer server starts on them: in process, and as a family
of 2 shards.

The data dir is tests/api/fixtures/queues_one_partition/data, written once by the code before
the change (tests/api/fixtures/make_queues_one_partition.py says how), with what that code
answered in expected.json: the delivery count each record was last leased with, and whether it
was acknowledged, dead-lettered, released or left leased at the stop.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from engine import queues as queues_module
from engine.log_manager import EngineConfig, open_engine
from engine.metadata import METADATA_TOPIC, QUEUE_STATE_TOPIC

FIXTURE = Path(__file__).parent / "fixtures" / "queues_one_partition"
EXPECTED = orjson.loads((FIXTURE / "expected.json").read_bytes())
RECORDS = 12  # per partition of "jobs"
Q = "/v1/topics/jobs/queues/work"


def _copy(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data)
    return data


def _finished() -> set[str]:
    return {w for w, s in EXPECTED["states"].items() if s in ("acked", "dead")}


def _check_lease(leased: dict[str, int]) -> None:
    """Every record not acknowledged or dead-lettered was leased again, with its count + 1
    (1 when never leased); none of the others was."""
    everything = {f"{p}/{o}" for p in range(3) for o in range(RECORDS)}
    assert set(leased) == everything - _finished()
    for where, count in leased.items():
        assert count == EXPECTED["counts"].get(where, 0) + 1, where


def _figures(partitions: list[dict], fields: tuple[str, ...]) -> list[dict]:
    return [{k: p[k] for k in fields} for p in partitions]


async def test_definitions_move_to_the_metadata_log_once_and_counts_stay(tmp_path: Path) -> None:
    """In process: both queues come back, now queue_created events of __metadata-0, their "q"
    records tombstoned; a crash between the events and the tombstones (the tombstones' append
    failing) does the move again without a second event; figures and counts as written."""
    data = _copy(tmp_path)
    real_append = queues_module._append

    async def failing(log, items, now):
        if any(k.startswith(b'["q"') for k, _v in items):
            raise OSError("crash before the tombstones")
        await real_append(log, items, now)

    queues_module._append = failing
    try:
        with pytest.raises(BaseException):  # noqa: B017 -- the open fails, as a crash would
            async with open_engine(EngineConfig(log_dirs=(data,))):
                pass
    finally:
        queues_module._append = real_append
    for _start in range(2):
        async with open_engine(EngineConfig(log_dirs=(data,))) as engine:
            assert sorted(engine.image.queues) == [("jobs", "late"), ("jobs", "work")]
            meta_log = engine.partition(METADATA_TOPIC, 0)
            events = [
                orjson.loads(r.value)
                for r in (await meta_log.read_records(0, 1000, 1 << 20)).records
            ]
            created = [e["queue"] for e in events if e["type"] == "queue_created"]
            assert sorted(created) == ["late", "work"]  # (once, though moved twice)
            state = engine.partition(QUEUE_STATE_TOPIC, 0)
            latest: dict[bytes, bytes | None] = {}
            for r in (await state.read_records(0, 10_000, 1 << 22)).records:
                latest[bytes(r.key)] = r.value
            assert [v for k, v in latest.items() if k.startswith(b'["q"')] == [None, None]
            info = engine.queues.describe("jobs", "work")
            fields = ("partition", "start_offset", "acked", "dead_lettered")
            assert _figures(list(info.partitions), fields) == EXPECTED["work"]
            late = engine.queues.describe("jobs", "late")
            assert _figures(list(late.partitions), ("partition", "start_offset")) == (
                EXPECTED["late"]
            )
    async with open_engine(EngineConfig(log_dirs=(data,))) as engine:
        leased: dict[str, int] = {}
        while got := await engine.queues.lease("jobs", "work", 100):
            for r in got:
                assert f"{r.partition}/{r.offset}" not in leased
                leased[f"{r.partition}/{r.offset}"] = r.delivery_count
            await engine.queues.settle("jobs", "work", "ack", [r.lease for r in got])
        _check_lease(leased)
    async with open_engine(EngineConfig(log_dirs=(data,))) as engine:
        assert await engine.queues.lease("jobs", "work", 100) == []  # every ack durable
        parts = engine.queues.describe("jobs", "work").partitions
        assert sum(p["acked"] for p in parts) + sum(p["dead_lettered"] for p in parts) == (
            3 * RECORDS
        )


@pytest.mark.slow
@pytest.mark.parametrize("shards", [1, 2], ids=lambda n: f"N={n}")
def test_a_server_on_the_one_partition_layout_keeps_acks_and_delivery_counts(
    server_factory, tmp_path: Path, shards: int
) -> None:
    """`eventlog serve` (one process, and a family of 2) on the old layout's data dir: the
    queues' settings, every partition's acknowledged and dead-lettered counts and start offset,
    and each record's next delivery count (+1) are what the old code left; the dead letters
    it wrote are there once."""
    server = server_factory(data_dir=_copy(tmp_path))
    server.processes = shards
    server.start(timeout=60)
    with server.client() as c:
        r = c.get(Q)
        assert r.status_code == 200, r.text
        info = r.json()
        assert (info["ordering"], info["max_deliveries"], info["dead_letter_topic"]) == (
            "key", 5, "jobs.dead"
        )
        fields = ("partition", "start_offset", "acked", "dead_lettered")
        assert _figures(info["partitions"], fields) == EXPECTED["work"]
        assert c.get("/v1/topics/jobs/queues").json()["queues"] == ["late", "work"]
        leased: dict[str, int] = {}
        while True:
            got = c.post(Q + "/lease", json={"max_records": 100}).json()["records"]
            if not got:
                break
            for rec in got:
                leased[f"{rec['partition']}/{rec['offset']}"] = rec["delivery_count"]
            answer = c.post(Q + "/ack", json={"leases": [rec["lease"] for rec in got]}).json()
            assert {x["status"] for x in answer["results"]} == {"acked"}
        _check_lease(leased)
        dead = c.get("/v1/topics/jobs.dead/partitions/0/records", params={"offset": 0}).json()
        assert len(dead["records"]) == EXPECTED["dead_letters"]
    assert "Traceback" not in server.log()
    assert server.stop() == 0
