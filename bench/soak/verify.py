"""Checking the log against the model: through the API after each restart, and on disk with
kafka-python (an independent decoder) while the server is dead and after the last shutdown.

check_partition() is the one judgement, fed either by JSON fetches or by decoded segment files:
* offsets strictly increase; in topics without compaction they are contiguous from the log
  start to the high watermark;
* every record carries an id header, no id appears twice (in any partition), and its key and
  value are the id's (model.content);
* a record at an acknowledged offset has the acknowledged id; any other record is a write in
  doubt (counted), else a phantom or a duplicate (failure);
* every acknowledged offset at or above the log start is there ("verified"); below it, it is
  "expired" in topics whose retention or compaction may remove it, "lost" elsewhere;
* every record a reader saw (still unacknowledged, i.e. in doubt) is where the reader saw it;
* no record of a request answered 507 storage_full is there ("refused_written").
check_sequences() judges the conditional producers' partition: each writer's records, in offset
order, carry its sequence numbers 0, 1, 2, ... with no gap and no repeat.
The compacted topic is judged by its table view instead (check_table): the latest record per
key in the log equals the latest acknowledged one, or a write in doubt after it.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.kafka_oracle import decode_all

from .model import AGGREGATES, EXPIRES, GAPS, TABLE, Model, content

_SEGMENT = re.compile(r"^\d{20}\.log$")
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")
_LOG_OVERHEAD = 12


@dataclass
class Found:
    """What one pass over a topic's partitions found (records as (offset, id, key, value))."""

    counts: Counter = field(default_factory=Counter)
    latest: dict[bytes, tuple[int, int | None, bytes | None]] = field(default_factory=dict)  # table view


def check_partition(model: Model, topic: str, partition: int, records: Iterable[tuple[int, int | None, bytes | None, bytes | None]],
                    log_start: int, high_watermark: int, found: Found, ids_seen: set[int], source: str) -> None:
    where = f"{source}: {topic}/{partition}"
    acked = model.acked.get((topic, partition), {})
    present: set[int] = set()
    previous = None
    c = found.counts
    for offset, rid, key, value in records:
        if offset < log_start:
            continue  # below the log start in a segment that still holds it: not part of the log
        if previous is not None and offset <= previous:
            model.fail("duplicated", f"{where}: offset {offset} after {previous}")
            continue
        expected_next = log_start if previous is None else previous + 1
        if offset != expected_next and not GAPS[topic]:
            model.fail("gap", f"{where}: offset {offset} where {expected_next} was due")
        previous = offset
        present.add(offset)
        c["records_read"] += 1
        if rid is None:
            model.fail("phantom", f"{where}: offset {offset} has no id header")
            continue
        if rid in ids_seen:
            model.fail("duplicated", f"{where}: id {rid} appears again at offset {offset}")
            continue
        ids_seen.add(rid)
        if (key, value) != content(topic, rid):
            model.fail("corrupt", f"{where}: offset {offset}: key/value are not id {rid}'s")
        if topic == TABLE and key is not None:
            found.latest[key] = (offset, rid, value)
        want = acked.get(offset)
        if want == rid:
            c["verified"] += 1
            if rid >> 40 in model.exact_writers:
                c["exact_verified"] += 1
        elif want is not None:
            model.fail("lost", f"{where}: offset {offset} holds id {rid}, acknowledged id {want}")
        elif rid in model.refused[topic]:
            model.fail("refused_written", f"{where}: offset {offset}: id {rid} was answered 507 storage_full, "
                                          "yet it is in the log")
        elif rid in model.in_doubt[topic]:
            c["in_doubt_present"] += 1
        elif rid in model.acked_ids:
            model.fail("duplicated", f"{where}: id {rid} at offset {offset}, acknowledged at {model.acked_ids[rid]}")
        else:
            model.fail("phantom", f"{where}: offset {offset}: id {rid} was never written")
    if previous is not None and previous + 1 != high_watermark and not GAPS[topic]:
        model.fail("gap", f"{where}: last offset {previous}, high watermark {high_watermark}")
    for offset, rid in acked.items():
        if offset in present:
            continue
        if offset < log_start and EXPIRES[topic]:
            c["expired"] += 1
        elif topic == TABLE:
            c["compacted"] += 1  # judged by the table view
        else:
            model.fail("lost", f"{where}: acknowledged offset {offset} (id {rid}) is missing "
                               f"(log start {log_start}, high watermark {high_watermark})")
    for offset, rid in model.seen.get((topic, partition), {}).items():
        if offset not in present and not (offset < log_start and EXPIRES[topic]) and topic != TABLE:
            model.fail("lost", f"{where}: offset {offset} (id {rid}, read by a reader) is missing")


def check_sequences(model: Model, topic: str, partition: int, records: Iterable[tuple[int, int | None, Any, Any]],
                    found: Found, source: str) -> None:
    """The conditional producers' partition: each sequenced writer's records, in offset order,
    are its sequence numbers 0, 1, 2, ... (the low 40 bits of the id): no gap, no repeat, no
    reordering. (Whether each is at its acknowledged offset is check_partition's.)"""
    writers = model.sequenced.get((topic, partition))
    if not writers:
        return
    seqs: dict[int, list[int]] = {w: [] for w in writers}
    for _offset, rid, _key, _value in sorted(records, key=lambda r: r[0]):
        if rid is not None and rid >> 40 in seqs:
            seqs[rid >> 40].append(rid & ((1 << 40) - 1))
    for writer, got in seqs.items():
        if got != list(range(len(got))):
            bad = next(i for i, s in enumerate(got) if s != i)
            model.fail("sequence", f"{source}: {topic}/{partition} writer {writer}: record {bad} of its sequence "
                                   f"is number {got[bad]} ({got[max(0, bad - 2) : bad + 3]} around it)")
        found.counts["sequenced_records"] += len(got)


def check_table(model: Model, found: Found, source: str) -> None:
    """The compacted topic's latest value per key against the model's."""
    acked_latest: dict[bytes, tuple[int, int]] = {}
    for (topic, _partition), log in model.acked.items():
        if topic != TABLE:
            continue
        for offset, rid in log.items():
            key = content(TABLE, rid)[0]
            if key not in acked_latest or offset > acked_latest[key][0]:
                acked_latest[key] = (offset, rid)
    doubt_by_key: dict[bytes, set[int]] = defaultdict(set)
    for rid in model.in_doubt[TABLE]:
        doubt_by_key[content(TABLE, rid)[0]].add(rid)
    c = found.counts
    for key in set(acked_latest) | set(found.latest):
        have = found.latest.get(key)
        want = acked_latest.get(key)
        if have is not None and want is not None and have[1] == want[1]:
            c["table_keys_equal"] += 1
        elif have is not None and have[1] in doubt_by_key[key] and (want is None or have[0] > want[0]):
            c["table_keys_in_doubt"] += 1  # a write in doubt landed after the acknowledged one
        elif have is None and (want is None or content(TABLE, want[1])[1] is None):
            c["table_keys_equal"] += 1  # deleted in both: the tombstone itself may be gone
        elif have is None and any(content(TABLE, r)[1] is None for r in doubt_by_key[key]):
            c["table_keys_in_doubt"] += 1  # a tombstone in doubt deleted it
        else:
            model.fail("table_mismatch", f"{source}: key {key.decode()}: log has {have}, model has {want}")


# -- through the API ------------------------------------------------------------------------


async def verify_api(client: httpx.AsyncClient, model: Model, partitions: dict[str, int], label: str) -> Counter:
    found = Found()
    ids_seen: set[int] = set()
    table_read = True
    for topic, count in partitions.items():
        for partition in range(count):
            try:
                records, log_start, hw = await _read_all(client, topic, partition)
            except Unreadable as exc:  # a finding; the partition cannot be judged this time
                model.fail("unexpected_status", f"{label} (API): {topic}/{partition}: {exc}")
                found.counts["partitions_unreadable"] += 1
                table_read = table_read and topic != TABLE
                continue
            check_partition(model, topic, partition, records, log_start, hw, found, ids_seen, f"{label} (API)")
            check_sequences(model, topic, partition, records, found, f"{label} (API)")
            if topic == AGGREGATES:
                await check_key_index(client, model, topic, records, found, f"{label} (API)")
    if table_read:
        check_table(model, found, f"{label} (API)")
    found.counts.pop("compacted", None)
    return found.counts


async def check_key_index(client: httpx.AsyncClient, model: Model, topic: str, records: list, found: Found,
                          source: str) -> None:
    """Each key's history through the key index equals the partition's records with that key
    (the partition was just read whole), and its ETag is the latest one's offset."""
    by_key: dict[bytes, list[int]] = defaultdict(list)
    for offset, _rid, key, _value in records:
        if key is not None:
            by_key[key].append(offset)
    for key, offsets in by_key.items():
        r = await client.get(f"/v1/topics/{topic}/keys/{key.decode()}/records", params={"max_records": 10_000})
        if r.status_code != 200:
            model.fail("key_index", f"{source}: {topic} key {key!r}: {r.status_code} {r.text[:300]}")
            continue
        got = [rec["offset"] for rec in r.json()["records"]]
        if got != offsets or r.headers.get("etag") != f'"{offsets[-1]}"':
            model.fail("key_index", f"{source}: {topic} key {key!r}: the key index gives {got[:10]}... "
                                    f"(ETag {r.headers.get('etag')}), the partition {offsets[:10]}...")
        found.counts["keys_checked"] += 1


class Unreadable(Exception):
    """A fetch of the verification answered neither 200 nor 416."""


async def _read_all(client: httpx.AsyncClient, topic: str, partition: int) -> tuple[list, int, int]:
    """Every record from the log start to the high watermark, with the final log start."""
    url = f"/v1/topics/{topic}/partitions/{partition}/records"
    out: list[tuple[int, int | None, bytes | None, bytes | None]] = []
    position = None
    log_start = 0
    while True:
        params: dict[str, Any] = {"max_records": 20_000, "max_bytes": 16 << 20}
        if position is not None:
            params["offset"] = position
        r = await client.get(url, params=params)
        if r.status_code == 416:  # retention moved the log start while we read
            body = r.json()
            position = max(position or 0, body["log_start_offset"])
            continue
        if r.status_code != 200:
            raise Unreadable(f"fetch from offset {position} answered {r.status_code}: {r.text[:500]}")
        body = r.json()
        log_start = max(log_start, body["log_start_offset"])
        for rec in body["records"]:
            ids = [h["value"] for h in rec["headers"] if h["key"] == "id"]
            key = None if rec["key"] is None else rec["key"].encode()
            value = None if rec["value"] is None else rec["value"].encode()
            out.append((rec["offset"], int(ids[0]) if ids else None, key, value))
        if not body["records"] and (body["next_offset"] >= body["high_watermark"] or body["next_offset"] == position):
            return out, log_start, body["high_watermark"]  # the end, or only removed records left before it
        position = body["next_offset"]


# -- on disk --------------------------------------------------------------------------------


@dataclass
class DiskCache:
    """Segment files already decoded, by (path, inode, size, mtime): closed ones never change."""

    done: set[tuple[str, int, int, int]] = field(default_factory=set)


def decode_files(data_dir: Path, model: Model, cache: DiskCache | None, *, strict: bool,
                 label: str) -> tuple[Counter, dict[tuple[str, int], list]]:
    """Decode every live segment (NNN.log) of every partition dir with kafka-python.

    strict=False (a killed server): the newest segment of a partition may end in a torn batch.
    Returns counts and, with strict=True, each partition's records."""
    counts: Counter = Counter()
    records: dict[tuple[str, int], list] = {}
    for entry in sorted(os.scandir(data_dir), key=lambda e: e.name):
        match = _PARTITION_DIR.match(entry.name)
        if not entry.is_dir() or not match:
            continue
        topic, partition = match.group(1), int(match.group(2))
        segments = sorted(n for n in os.listdir(entry.path) if _SEGMENT.match(n))
        out = records.setdefault((topic, partition), [])
        for i, name in enumerate(segments):
            path = os.path.join(entry.path, name)
            try:
                st = os.stat(path)
                signature = (path, st.st_ino, st.st_size, st.st_mtime_ns)
                if cache is not None and signature in cache.done and not strict:
                    counts["files_unchanged"] += 1
                    continue
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            valid = _whole_batches(data)
            if valid < len(data):
                if strict or i != len(segments) - 1:
                    model.fail("corrupt_file", f"{label}: {path}: {len(data) - valid} bytes after the last whole batch")
                else:
                    counts["torn_tail_bytes"] += len(data) - valid
            try:
                batches, decoded = decode_all(data[:valid])
            except Exception as exc:  # noqa: BLE001 -- any decoder complaint is a finding
                model.fail("corrupt_file", f"{label}: {path}: kafka-python: {exc!r}")
                continue
            counts["files_decoded"] += 1
            counts["batches_decoded"] += len(batches)
            counts["records_decoded"] += len(decoded)
            if cache is not None and valid == len(data):
                cache.done.add(signature)
            if strict:
                for r in decoded:
                    ids = [v for k, v in r.headers if k == "id"]
                    out.append((r.offset, int(ids[0]) if ids else None, r.key, r.value))
    return counts, records


def _whole_batches(data: bytes) -> int:
    """Bytes of `data` covered by whole batches, by their length fields."""
    position = 0
    while len(data) - position >= _LOG_OVERHEAD:
        length = int.from_bytes(data[position + 8 : position + 12], "big", signed=True)
        if length <= 0 or position + _LOG_OVERHEAD + length > len(data):
            break
        position += _LOG_OVERHEAD + length
    return position


def verify_disk_final(data_dir: Path, model: Model, partitions: dict[str, int]) -> Counter:
    """After the clean shutdown: every file decodes whole, and each partition's records, from
    the checkpointed log start, pass check_partition as the API's did."""
    counts, records = decode_files(data_dir, model, None, strict=True, label="final (disk)")
    starts = _read_checkpoint(data_dir / "log-start-offset-checkpoint")
    found = Found()
    ids_seen: set[int] = set()
    for topic, count in partitions.items():
        for partition in range(count):
            recs = sorted(records.get((topic, partition), []))
            log_start = max(starts.get((topic, partition), 0), recs[0][0] if recs and not GAPS[topic] else 0)
            hw = recs[-1][0] + 1 if recs else log_start
            check_partition(model, topic, partition, recs, log_start, hw, found, ids_seen, "final (disk)")
            check_sequences(model, topic, partition, recs, found, "final (disk)")
    check_table(model, found, "final (disk)")
    found.counts.pop("compacted", None)
    counts.update(found.counts)
    return counts


def _read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines[2:]:
        parts = line.split()
        if len(parts) == 3:
            out[(parts[0], int(parts[1]))] = int(parts[2])
    return out


# -- snapshots ------------------------------------------------------------------------------


def check_snapshot(path: Path, topics: list[str], partitions: dict[str, int],
                   floor: dict[tuple[str, int], int], model: Model) -> None:
    """A snapshot's manifest lists the asked topics, every partition, a high watermark covering
    every record acknowledged before it was asked for, and files of the listed sizes; its
    copied (active) segments decode and hold what readers of the live log see."""
    import orjson

    where = f"snapshot {path.name}"
    manifest = orjson.loads((path / "manifest.json").read_bytes())
    listed = sorted(t["name"] for t in manifest["topics"])
    if listed != sorted(topics):
        model.fail("snapshot", f"{where}: topics {listed}, asked for {sorted(topics)}")
        return
    for t in manifest["topics"]:
        name = t["name"]
        if [p["partition"] for p in t["partitions"]] != list(range(partitions[name])):
            model.fail("snapshot", f"{where}: {name} partitions {[p['partition'] for p in t['partitions']]}")
            continue
        if t["cleanup_policy"] != ("compact" if name == TABLE else "delete"):
            model.fail("snapshot", f"{where}: {name} cleanup_policy {t['cleanup_policy']}")
        for p in t["partitions"]:
            hw, start = p["high_watermark"], p["log_start_offset"]
            if hw < floor[(name, p["partition"])] or start > hw:
                model.fail("snapshot", f"{where}: {name}/{p['partition']} log start {start}, high watermark {hw}, "
                                       f"acknowledged before the request: {floor[(name, p['partition'])]}")
            bases = [s["base_offset"] for s in p["segments"]]
            if bases != sorted(bases):
                model.fail("snapshot", f"{where}: {name}/{p['partition']} segments out of order")
            for s in p["segments"]:
                file = path / p["dir"] / s["file"]
                if not file.exists() or file.stat().st_size < s["size_bytes"]:
                    model.fail("snapshot", f"{where}: {file} missing or shorter than {s['size_bytes']}")
                    continue
                if not s["copied"]:
                    continue
                try:
                    _batches, decoded = decode_all(file.read_bytes()[: s["size_bytes"]])
                except Exception as exc:  # noqa: BLE001
                    model.fail("corrupt_file", f"{where}: {file}: kafka-python: {exc!r}")
                    continue
                for r in decoded:
                    if start <= r.offset < hw:
                        ids = [v for k, v in r.headers if k == "id"]
                        model.observe(name, p["partition"], r.offset, int(ids[0]) if ids else None, where)
