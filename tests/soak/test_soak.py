"""The soak under faults (bench/soak): a short run with SIGKILLs, a disk-full and a slow-fsync
phase through the real module, and the verifier shown to catch what it exists to catch (a lost
tail, a duplicate, a phantom, a wrong table view, a refused record in the log, a conditional
writer's sequence with a gap or a repeat), so a passing soak means something."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

from bench.soak.load import Stats
from bench.soak.model import AGGREGATES, FULL, LEDGER, PLAIN, TABLE, Model, content, record_id
from bench.soak.phases import FaultState, Phase
from bench.soak.queue import LOCK_MS, QueueModel
from bench.soak.queue import check as check_queue
from bench.soak.verify import Found, check_partition, check_sequences, check_table, verify_api

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_short_soak_loses_and_duplicates_nothing_across_kills(tmp_path: Path, processes: int) -> None:
    """At --processes 2 the faults rotate: SIGKILL of the server, SIGKILL of one shard, SIGSTOP
    of one shard (held until the supervisor kills it at its heartbeat deadline); each shard is
    restarted alone while the other serves on under the same pid."""
    out = tmp_path / "soak.json"
    cmd = [
        sys.executable, "-m", "bench.soak", "--minutes", "0.75", "--kill-every", "8", "--min-restarts", "4",
        "--seed", "7", "--out", str(out), "--work-dir", str(tmp_path / "work"), "--processes", str(processes),
    ]
    done = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.exists(), done.stdout + done.stderr
    r = json.loads(out.read_text())["results"]
    assert r["lost"] == 0 and r["duplicated"] == 0, r["failures"]
    assert r["failures"] == [] and r["passed"], r["failures"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert r["restarts_survived"] >= 4
    faults = r["faults_by_kind"]
    if processes == 1:
        assert faults == {"server_kill": r["faults"]}, faults
    else:
        # the rotation's first four: server, shard SIGKILL, shard SIGSTOP (held), server
        assert faults["server_kill"] >= 2 and faults["shard_kill"] >= 1 and faults["shard_stop"] >= 1, faults
        single = [c for c in r["cycles"] if c["fault"] != "server_kill"]
        assert r["shards_restarted_alone"] == len(single) - r["shard_stops_resumed"], r["cycles"]
        for c in single:
            victim = c["killed"].removeprefix("shard ")
            others = {i: pid for i, pid in c["shard"]["pids_before"].items() if i != victim}
            assert {i: c["shard"]["pids_after"].get(i) for i in others} == others, c  # the live shard kept its pid
            if c["fault"] == "shard_stop":
                assert c["outcome"] == "restarted alone" and c["shard"]["silent_s"] and c["shard"]["killed_s"], c
        assert r["answered_503_during_shard_faults"] > 0  # requests met the shard down, and were retried
    assert r["records_verified"] > 0 and r["final_disk"]["verified"] > 0  # through the API, and on disk
    assert r["final_exit_status"] == 0
    # every kind of load ran, and the maintenance endpoints did work
    for kind in ("produce_json", "produce_small", "produce_raw", "produce_table", "produce_full", "produce_idempotent",
                 "produce_conditional", "fetch", "fetch_raw", "long_poll", "sse_event",
                 "retention_run", "compaction_run", "snapshot"):
        assert r["operations"].get(kind, 0) > 0, kind
    assert r["records_expired"] > 0  # retention removed acknowledged records, and they were exempt
    # idempotent and conditional producers: every request answered at last, each record of them
    # found exactly once at the offsets its (possibly replayed) answer gave
    x = r["exact"]
    assert x["retries"] > 0 and x["unresolved"] == 0 and x["resolved"] == x["in_doubt"], x
    assert x["records"] == x["records_answered"] == x["records_verified_exactly_once"] > 0, x
    assert x["sequenced_records"] > 0 and x["conflicts_409"] > 0, x
    # the disk-full phase refused appends to its partition, reads went on, appends came back
    f = r["fault_phases"]
    assert f["disk_full_phases"] >= 1 and f["slow_fsync_phases"] >= 1, f
    assert f["disk_full_produce_507"] > 0 and f["disk_full_accepted"] == 0 and f["disk_full_reads_ok"] > 0, f
    assert all(p["resumed_after_seconds"] is not None for p in f["phases"] if p["kind"] == "disk_full"), f
    assert r["records_refused_507"] > 0
    # the queue workers (issue 26): drained at the end, every record acknowledged or
    # dead-lettered once, and the run met redeliveries and dead letters
    assert r["queue_lost"] == 0 and r["queue_acked"] > 0 and r["queue_redelivered"] > 0, r["queue"]
    assert r["queue_acked"] + r["queue_dead_lettered"] == r["queue_records"] > 0, r["queue"]
    assert r["queue"]["order_checked_keys"] > 0 and r["queue"]["reject_rejected"] > 0, r["queue"]
    assert out.with_suffix(".png").stat().st_size > 0


def _plain(model: Model, offsets: range, partition: int = 0) -> list:
    records = []
    for offset in offsets:
        rid = record_id(1, offset)
        model.ack(PLAIN, partition, offset, rid)
        records.append((offset, rid, *content(PLAIN, rid)))
    return records


def _check(model: Model, records: list, log_start: int = 0, hw: int | None = None) -> Counter:
    found = Found()
    hw = hw if hw is not None else (records[-1][0] + 1 if records else log_start)
    check_partition(model, PLAIN, 0, records, log_start, hw, found, set(), "test")
    return found.counts


def test_verifier_passes_an_exact_log_and_counts_writes_in_doubt() -> None:
    model = Model()
    records = _plain(model, range(5))
    doubtful = record_id(2, 0)
    model.doubt(PLAIN, [doubtful])
    records.append((5, doubtful, *content(PLAIN, doubtful)))
    counts = _check(model, records)
    assert model.failures == []
    assert counts["verified"] == 5 and counts["in_doubt_present"] == 1


@pytest.mark.parametrize(
    ("damage", "kind"),
    [
        (lambda recs: recs[:-1], "lost"),  # the last acknowledged record is gone
        (lambda recs: recs[:2] + recs[3:], "gap"),  # one from the middle
        (lambda recs: recs + [(5, recs[0][1], *recs[0][2:])], "duplicated"),  # an id twice
        (lambda recs: recs + [(5, record_id(9, 9), *content(PLAIN, record_id(9, 9)))], "phantom"),
        (lambda recs: recs[:1] + [(1, recs[1][1], b"other", recs[1][3])] + recs[2:], "corrupt"),
    ],
)
def test_verifier_catches_damage(damage, kind: str) -> None:
    model = Model()
    records = damage(_plain(model, range(5)))
    _check(model, records, hw=5 if kind != "duplicated" and kind != "phantom" else 6)
    assert kind in {f.kind for f in model.failures}, model.failures


def test_a_record_answered_507_must_not_be_in_the_log() -> None:
    model = Model()
    written = record_id(1, 0)
    model.ack(FULL, 0, 0, written)
    refused = record_id(2, 0)
    model.refuse(FULL, [refused])
    found = Found()
    records = [(0, written, *content(FULL, written)), (1, refused, *content(FULL, refused))]
    check_partition(model, FULL, 0, records, 0, 2, found, set(), "test")
    assert [f.kind for f in model.failures] == ["refused_written"], model.failures


def test_a_resolved_request_is_judged_as_acknowledged() -> None:
    """In doubt, then answered by a retry: from then on its records must be exactly there."""
    model = Model()
    ids = [record_id(1, i) for i in range(3)]
    model.doubt(PLAIN, ids)
    model.resolve(PLAIN, ids)
    for offset, rid in enumerate(ids):
        model.ack(PLAIN, 0, offset, rid)
    assert model.in_doubt[PLAIN] == set() and model.counts["in_doubt_resolved"] == 3
    _check(model, [(0, ids[0], *content(PLAIN, ids[0])), (1, ids[1], *content(PLAIN, ids[1]))], hw=2)
    assert [f.kind for f in model.failures] == ["lost"], model.failures  # no longer excused as in doubt


@pytest.mark.parametrize(
    ("seqs", "ok"),
    [
        ([0, 1, 2, 3], True),
        ([0, 1, 3], False),  # a gap
        ([0, 1, 1, 2], False),  # a repeat
        ([0, 2, 1], False),  # out of order
        ([1, 2], False),  # the first is missing
    ],
)
def test_conditional_writer_sequence_must_be_gapless(seqs: list[int], ok: bool) -> None:
    model = Model()
    model.sequenced[(LEDGER, 0)].update({1, 2})
    other = [record_id(2, i) for i in range(3)]  # the other writer's records interleave
    rids = [record_id(1, s) for s in seqs]
    mixed = [rid for pair in zip(rids, other, strict=False) for rid in pair] + rids[len(other):]
    records = [(offset, rid, *content(LEDGER, rid)) for offset, rid in enumerate(mixed)]
    found = Found()
    check_sequences(model, LEDGER, 0, records, found, "test")
    assert (model.failures == []) == ok, model.failures
    assert [f.kind for f in model.failures] == ([] if ok else ["sequence"])


def test_disk_full_phase_judgement() -> None:
    """Inside a disk-full phase the full topic must refuse (a replay may answer); a 507 with no
    rule in force is a failure; a request spanning the phase's edge may get either."""
    model, stats, faults = Model(), Stats(), FaultState()
    before = faults.mark()
    faults.open_window()
    faults.phase = phase = Phase(kind="disk_full", rule={}, started=0.0)
    inside = faults.mark()
    faults.judge(inside, FULL, 507, False, 0.0, model, stats)
    faults.judge(inside, FULL, 200, True, 0.0, model, stats)  # a replay writes nothing
    faults.judge(before, FULL, 507, False, 0.0, model, stats)  # started before the rule: may be refused
    assert model.failures == [] and (phase.produce_507, phase.replayed) == (1, 1)
    faults.judge(inside, FULL, 200, False, 0.0, model, stats)
    assert [f.kind for f in model.failures] == ["accepted_while_full"]
    faults.judge(inside, PLAIN, 507, False, 0.0, model, stats)  # the rule is on another directory
    faults.phase = None
    faults.close_window()
    after = faults.mark()
    faults.judge(inside, FULL, 507, False, 0.0, model, stats)  # spanned the lift: allowed
    faults.judge(after, FULL, 507, False, 0.0, model, stats)  # no rule in force
    assert [f.kind for f in model.failures] == ["accepted_while_full", "unexpected_507", "unexpected_507"]
    faults.judge(after, FULL, 200, False, 5.0, model, stats)
    assert faults.fresh_full_append_started == 5.0  # appends resumed


def test_two_acks_for_one_offset_are_a_duplicate() -> None:
    model = Model()
    model.ack(PLAIN, 0, 7, record_id(1, 1))
    model.ack(PLAIN, 0, 7, record_id(2, 1))
    assert [f.kind for f in model.failures] == ["duplicated"]


def _table_write(model: Model, offset: int, want_tombstone: bool) -> int:
    seq = 0
    while True:  # the first id whose content is (not) a tombstone
        rid = record_id(3, offset * 1000 + seq)
        if (content(TABLE, rid)[1] is None) == want_tombstone:
            model.ack(TABLE, 0, offset, rid)
            return rid
        seq += 1


def test_table_view_must_hold_each_keys_latest_acknowledged_value() -> None:
    model = Model()
    old = _table_write(model, 0, False)
    key = content(TABLE, old)[0]
    new = record_id(4, 1)
    while content(TABLE, new)[0] != key or content(TABLE, new)[1] is None:
        new += 1
    model.ack(TABLE, 0, 1, new)
    found = Found()
    found.latest[key] = (0, old, content(TABLE, old)[1])  # compaction kept the older value
    check_table(model, found, "test")
    assert [f.kind for f in model.failures] == ["table_mismatch"]

    model.failures.clear()
    found.latest[key] = (1, new, content(TABLE, new)[1])
    check_table(model, found, "test")
    assert model.failures == []


@pytest.mark.blocks_loop  # starts and kills its server with blocking calls, as test code may
async def test_verifier_finds_an_acknowledged_tail_that_disappeared_from_disk(server_factory, tmp_path: Path) -> None:
    """A real server, SIGKILLed; the tail of its segment cut off (a disk that lost acknowledged
    bytes); after the restart recovery truncates there, and verify_api reports the loss."""
    server = server_factory().start()
    model = Model()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        assert (await client.post("/v1/topics", json={"name": PLAIN, "partitions": 1})).status_code == 201
        for n in range(3):
            ids = [record_id(1, n * 10 + i) for i in range(5)]
            body = {"records": [{"key": None if (k := content(PLAIN, rid)[0]) is None else k.decode(),
                                 "value": content(PLAIN, rid)[1].decode(),
                                 "headers": [{"key": "id", "value": str(rid)}]} for rid in ids]}
            r = await client.post(f"/v1/topics/{PLAIN}/records", json=body)
            assert r.status_code == 200
            for rid, placed in zip(ids, r.json()["offsets"], strict=True):
                model.ack(PLAIN, placed["partition"], placed["offset"], rid)
    server.kill()
    segment = server.data_dir / f"{PLAIN}-0" / f"{0:020d}.log"
    size = segment.stat().st_size
    os.truncate(segment, size - 10)  # into the last batch: 5 acknowledged records gone
    server.start()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        counts = await verify_api(client, model, {PLAIN: 1}, "after the cut")
    assert counts["verified"] == 10
    lost = [f for f in model.failures if f.kind == "lost"]
    assert len(lost) == 5 and all("is missing" in f.detail for f in lost), model.failures


def _leased(q: QueueModel, model: Model, offset: int, count: int, start: int) -> dict:
    """A lease answer's record of the aggregates topic (id 5 << 40 | offset), as a worker got it."""
    rid = record_id(5, offset)
    record = {"partition": 0, "offset": offset, "key": content(AGGREGATES, rid)[0].decode(),
              "headers": [{"key": "id", "value": str(rid)}], "delivery_count": count,
              "lease": f"l{offset}-{count}", "lease_expires_at": start + LOCK_MS}
    q.leased(model, [record])
    return record


def _produced(model: Model, n: int) -> None:
    for offset in range(n):
        model.ack(AGGREGATES, 0, offset, record_id(5, offset))


def test_queue_verifier_passes_acks_dead_letters_and_acks_in_doubt() -> None:
    model, q = Model(), QueueModel()
    _produced(model, 3)
    r0 = _leased(q, model, 0, 1, 1000)
    q.settled(model, "ack", [r0], [{"lease": r0["lease"], "status": "acked"}], 1100)
    r1 = _leased(q, model, 1, 1, 1200)
    q.settled(model, "ack", [r1], None, 1300)  # its answer lost: acknowledged in doubt
    r2 = _leased(q, model, 2, 2, 1400)  # delivery 1 leased unseen (a lease whose answer was lost)
    q.unseen_slots += 1
    dead = [{"headers": {"id": str(record_id(5, 2)), "eventlog.source.topic": AGGREGATES,
                         "eventlog.source.partition": "0", "eventlog.source.offset": "2",
                         "eventlog.delivery.count": "2", "eventlog.dead.reason": "rejected"}}]
    q.settled(model, "reject", [r2], [{"lease": r2["lease"], "status": "rejected"}], 1500)
    counts = check_queue(model, q, dead)
    assert model.failures == [], model.failures
    assert (counts["acked"], counts["acked_in_doubt"], counts["dead_lettered"]) == (2, 1, 1), counts


def test_queue_verifier_catches_a_lost_record_a_double_ack_and_a_broken_order() -> None:
    model, q = Model(), QueueModel()
    _produced(model, 3)
    r0 = _leased(q, model, 0, 1, 1000)
    q.settled(model, "ack", [r0], [{"lease": r0["lease"], "status": "acked"}], 1100)
    again = _leased(q, model, 0, 2, 1200)  # handed out again after its ack was answered
    q.settled(model, "ack", [again], [{"lease": again["lease"], "status": "acked"}], 1300)
    _leased(q, model, 1, 1, 2000)  # leased, never settled, never dead-lettered: lost
    check_queue(model, q, [])
    kinds = {f.kind for f in model.failures}
    assert {"queue_double_ack", "queue_redelivered_after_ack", "queue_lost"} <= kinds, kinds
    assert "queue_lost" in {f.kind for f in model.failures if f"id {record_id(5, 2)} " in f.detail}



@pytest.mark.parametrize("settled_at", [1100, 3000])
def test_queue_verifier_catches_a_key_leased_past_an_earlier_record(settled_at: int) -> None:
    """Offsets 0 and 12 share a key (agg-0): 12 may be leased (at 1200) only once 0's lease
    ended."""
    model, q = Model(), QueueModel()
    _produced(model, 13)
    first = _leased(q, model, 0, 1, 1000)
    q.settled(model, "ack", [first], [{"lease": first["lease"], "status": "acked"}], settled_at)
    later = _leased(q, model, 12, 1, 1200)
    assert first["key"] == later["key"]
    check_queue(model, q, [])
    broken = "queue_order" in {f.kind for f in model.failures}
    assert broken == (settled_at > 1200), model.failures
