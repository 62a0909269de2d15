"""`python -m bench.produce_cpu`: the CPU of a JSON produce on the event loop, stage by stage.

No server, no disk: the request of http_produce (500 records, keys key-NNNNNNN never repeated,
100-byte values, a topic of 4 partitions, default topic config) run through the produce
service's stages (engine/produce.py) the way a request runs them, minus the appends. Each stage
is timed over 300 distinct bodies, best of 5 passes; the reference implementations the service
replaced (murmur2 key by key, the Python record encoder) are timed next to them. Prints a table
and writes bench/results/produce_cpu.json. Single-threaded and short (~10 s): run it on a quiet
machine, and compare figures from one run only.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from engine import produce, records
from engine.config import LogConfig
from engine.partition_log import AppendResult
from engine.partitioner import murmur2, partitions_for_keys

from .harness import git

RESULTS = Path(__file__).resolve().parent / "results"
RECORDS = 500
PARTITIONS = 4


class _Partition:
    topic = "t"
    partition = 0
    config = LogConfig()


def _bodies(n: int) -> list[bytes]:
    rng = random.Random(500)
    values = [base64.b64encode(rng.randbytes(75)).decode()[:100] for _ in range(RECORDS)]
    return [
        orjson.dumps({"records": [{"key": f"key-{b * RECORDS + i:07d}", "value": v} for i, v in enumerate(values)]})
        for b in range(n)
    ]


def _best(fn: Callable[[Any], Any], inputs: list[Any], passes: int = 5) -> float:
    """Best per-call seconds of fn over `inputs`, of `passes` passes (after one warm-up pass)."""
    for x in inputs[:20]:
        fn(x)
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        for x in inputs:
            fn(x)
        best = min(best, (time.perf_counter() - start) / len(inputs))
    return best


def measure() -> dict[str, float]:
    bodies = _bodies(300)
    docs = [orjson.loads(b) for b in bodies]
    parsed = [produce.parse_records(d, "t", PARTITIONS, fixed_partition=None, now=1) for d in docs]
    keys = [[k for k, _v, _ts, _h in recs] for _p, recs in parsed]
    groups = []
    for placed, recs in parsed:
        by: dict[int, list[tuple]] = {}
        for p, r in zip(placed, recs):
            by.setdefault(p, []).append(r)
        groups.append(by)
    log = _Partition()

    def whole(body: bytes) -> Any:
        placed, recs = produce.parse_records(produce.parse_body(body), "t", PARTITIONS, fixed_partition=None, now=1)
        by: dict[int, list[tuple]] = {}
        for p, r in zip(placed, recs):
            by.setdefault(p, []).append(r)
        batches = {p: produce.encode_batches(rs, log) for p, rs in by.items()}
        results = {p: AppendResult(0, len(rs) - 1, -1, (0,)) for p, rs in by.items()}
        prepared = produce._PreparedJson(placed, recs, batches, None, -1, 1)
        return produce.ProduceService._answer(prepared, results, lambda o: orjson.dumps({"offsets": o}))

    def python_encode(by: dict[int, list[tuple]]) -> None:
        native, records._CBuilder = records._CBuilder, None
        try:
            for rs in by.values():
                records.encode_batch(0, rs)
        finally:
            records._CBuilder = native

    def parse_without_placing(doc: dict) -> Any:  # every record given partition 0: no hashing
        return produce.parse_records(doc, "t", PARTITIONS, fixed_partition=0, now=1)

    return {
        "orjson.loads of the body": _best(orjson.loads, bodies),
        "parse_records (check, encode strings, place; incl. murmur2)": _best(
            lambda d: produce.parse_records(d, "t", PARTITIONS, fixed_partition=None, now=1), docs
        ),
        "parse_records without placement (fixed partition)": _best(parse_without_placing, docs),
        "murmur2 of the 500 keys: partitions_for_keys (numpy)": _best(lambda ks: partitions_for_keys(ks, PARTITIONS), keys),
        "murmur2 of the 500 keys: key by key (Python, the reference)": _best(
            lambda ks: [(murmur2(k) & 0x7FFFFFFF) % PARTITIONS for k in ks], keys
        ),
        "encode_batch, 4 batches: aiokafka's C builder": _best(
            lambda by: [records.encode_batch(0, rs) for rs in by.values()], groups
        ),
        "encode_batch, 4 batches: Python encoder (the reference)": _best(python_encode, groups),
        "whole request: parse, check, place, encode, validate, answer": _best(whole, bodies),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.produce_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "produce_cpu.json")
    args = parser.parse_args(argv)
    stages = measure()
    for name, seconds in stages.items():
        print(f"{seconds * 1e6:9.1f} us/request {seconds * 1e6 / RECORDS:7.3f} us/record  {name}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python -m bench.produce_cpu",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "head_commit": git("rev-parse", "HEAD"),
        "tree_dirty": bool(git("status", "--porcelain", "--", "engine")),
        "records_per_request": RECORDS,
        "partitions": PARTITIONS,
        "us_per_request": {k: round(v * 1e6, 1) for k, v in stages.items()},
    }, indent=2) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
