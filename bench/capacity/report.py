"""`python -m bench.capacity.report FILE.jsonl [FILE.jsonl ...]`: the capacity run's JSON lines
(bench/capacity/load.py; several files when the run was split over calls on one machine) ->
bench/results/capacity-<host>.json and .png.

The JSON keeps every line (the machine, each cell, each server's exit) and adds, per N, the best
cell of each kind with the server cores it used (best among the cells during which other work
used less than a quarter of a core, where there are such: on a shared machine), the peers' best figures, and the issue's goals
for a 16-core machine as summary rows: judged (met or not) on a machine with 16 CPUs or more,
informational on a smaller one, where client and server share too few cores for them to mean
anything.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
GOAL_CORES = 8
GOAL_REDIS_EVERYSEC = 1.0
GOAL_REDIS_ALWAYS = 2.0
GOAL_DD = 0.8
GOAL_FETCH_MB_S = 3000
GOAL_SMALL_REDIS = 1.0  # issue 13: one-record appends >= 1.0 x Redis AOF always on 16 cores
GOAL_SMALL_APPENDS = 60_000
GOAL_FANOUT_P50_MS = 5.0  # issue 13: 1,000 SSE subscribers, a record every 10 ms
GOAL_FANOUT_P99_MS = 20.0
GOAL_FANOUT_KB = 20.0
GOAL_KAFKA_REDIS = 1.0  # issue 25: Kafka produce of 256 B records >= 1.0 x Redis AOF always -P 16
GOAL_KAFKA_HTTP = 10.0  # ... and >= 10 x our own HTTP one-record appends
GOAL_KAFKA_CONSUME = 0.3  # issue 25: librdkafka reading 1 GB >= 0.3 x cat of the segment files
JUDGED_FROM_CPUS = 16


def load(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    machines, cells = [], []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                (machines if record.get("cell") == "machine" else cells).append(record)
    if not machines:
        raise SystemExit("no machine line: not the output of bench/capacity/load.py")
    hosts = {m["host"] for m in machines}
    if len(hosts) > 1:
        raise SystemExit(f"lines from several machines ({', '.join(sorted(hosts))}): one report per machine")
    return machines, cells


QUIET_CORES = 0.25


def _best(cells: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The best of `cells` by `key`, among those during which other work used less than
    QUIET_CORES (all of them on a dedicated machine); among all when none was that quiet."""
    quiet = [c for c in cells if c.get("other_cores", 0.0) < QUIET_CORES]
    return max(quiet or cells, key=lambda c: c[key]) if cells else None


def _fanout(cell: dict[str, Any]) -> dict[str, Any]:
    return {"p50_ms": cell["p50_us"] / 1000, "p99_ms": cell["p99_us"] / 1000,
            **{k: cell[k] for k in ("kb_per_subscriber", "exactly_once_in_order", "server_cores", "subscribers")}}


def _consume(passes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per reader of the kafka-consume cell (cat, kcat, python): the median MB/s of its passes,
    and each consumer's ratio to cat's median (cat's seconds / the consumer's)."""
    if not passes:
        return None
    out: dict[str, Any] = {"file_bytes": passes[0].get("file_bytes")}
    for reader in ("cat", "kcat", "python"):
        runs = [c for c in passes if c.get("reader") == reader]
        if runs:
            rates = [c["mb_per_s"] for c in runs]
            cores = [c["server_cores"] for c in runs]
            out[reader] = {"median_mb_per_s": round(statistics.median(rates), 1), "mb_per_s": rates,
                           "server_cores": round(statistics.median(cores), 2)}
    if "cat" in out:
        for reader in ("kcat", "python"):
            if reader in out:
                ratio = out[reader]["median_mb_per_s"] / out["cat"]["median_mb_per_s"]
                out[reader]["ratio_to_cat"] = round(ratio, 4)
    return out


def summarize(machines: list[dict[str, Any]], cells: list[dict[str, Any]]) -> dict[str, Any]:
    def of(**match: Any) -> list[dict[str, Any]]:
        return [c for c in cells if all(c.get(k) == v for k, v in match.items())]

    counts = sorted({c["processes"] for c in of(system="eventlog") if "processes" in c and "cell" in c})
    by_n: dict[str, Any] = {}
    for n in counts:
        row: dict[str, Any] = {}
        for kind, key in (("json-wrk", "records_per_s"), ("json-python", "records_per_s"),
                          ("raw-produce", "mb_per_s"), ("raw-fetch", "mb_per_s"),
                          ("small-wrk", "appends_per_s"), ("kafka-produce", "records_per_s")):
            best = _best(of(system="eventlog", processes=n, cell=kind), key)
            if best is not None:
                shape = ("partitions", "connections", "client_processes", "p99_ms",
                         "producer_processes", "lost")
                row[kind] = {key: best[key], "server_cores": best["server_cores"],
                             "other_cores": best.get("other_cores"),
                             **{k: best[k] for k in shape if k in best}}
        fan = of(system="eventlog", processes=n, cell="fanout-sse")
        if fan:
            row["fanout-sse"] = _fanout(fan[-1])
        passes = of(system="eventlog", processes=n, cell="kafka-consume")
        consume = _consume([c for c in passes if "mb_per_s" in c])
        if consume:
            row["kafka-consume"] = consume
        eventlog_cells = [c for c in of(system="eventlog", processes=n) if "server_cores" in c]
        row["max_server_cores"] = max((c["server_cores"] for c in eventlog_cells), default=None)
        row["lost_records"] = sum(c.get("lost", 0) for c in eventlog_cells)
        by_n[str(n)] = row
    peers: dict[str, Any] = {}
    for aof in ("everysec", "always"):
        for kind in ("xadd-redis-benchmark", "xadd-python"):
            best = _best([c for c in of(system="redis", aof=aof, cell=kind) if "records_per_s" in c], "records_per_s")
            if best is not None:
                peers[f"redis {aof} {kind}"] = {"records_per_s": best["records_per_s"], "server_cores": best["server_cores"],
                                                "other_cores": best.get("other_cores"),
                                                **{k: best[k] for k in ("connections", "client_processes") if k in best}}
    for aof in ("everysec", "always"):
        best = _best([c for c in of(system="redis", aof=aof, cell="small-redis-benchmark") if "appends_per_s" in c],
                     "appends_per_s")
        if best is not None:
            peers[f"redis {aof} small-redis-benchmark"] = {
                k: best.get(k) for k in ("appends_per_s", "p50_ms", "p99_ms", "server_cores", "other_cores", "connections")
            }
    found = [c for c in of(system="redis", cell="kafka-redis-benchmark") if "appends_per_s" in c]
    best = _best(found, "appends_per_s")
    if best is not None:
        keys = ("appends_per_s", "p50_ms", "p99_ms", "server_cores", "other_cores", "connections",
                "pipeline")
        peers["redis always kafka-redis-benchmark"] = {k: best.get(k) for k in keys}
    fan = of(system="redis", cell="fanout-redis-pubsub")
    if fan:
        peers["redis pubsub fanout"] = _fanout(fan[-1])
    for kind in ("dd-write", "page-cache-read"):
        rates = [c["mb_per_s"] for c in of(system="dd", cell=kind)]
        if rates:
            peers[kind] = {"median_mb_per_s": round(statistics.median(rates), 1), "mb_per_s": rates}
    return {
        "processes_measured": counts,
        "by_processes": by_n,
        "peers": peers,
        "errors": of(cell="error"),
        "server_exits": [{"processes": c["processes"], "exit_status": c["exit_status"]} for c in of(cell="server-exit")],
        "skipped": [c for c in cells if c.get("cell") == "skipped" or "skipped" in c],
    }


def goals(machine: dict[str, Any], s: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals for a 16-core machine, judged only on one that has 16 CPUs or more."""
    judged = machine["cpus"]["cpus"] >= JUDGED_FROM_CPUS
    suffix = "" if judged else f" (goal for {JUDGED_FROM_CPUS} cores; informational on {machine['cpus']['cpus']})"
    by, peers = s["by_processes"], s["peers"]
    rows = []

    def row(metric: str, measured: str, reference: str, ratio: float | None, goal: str, op_target: float) -> None:
        passed = None if (not judged or ratio is None) else ratio >= op_target
        rows.append({"metric": metric, "measured": measured, "reference": reference,
                     "ratio": None if ratio is None else round(ratio, 3), "goal": goal + suffix, "passed": passed})

    def best_over_n(kind: str, key: str) -> tuple[str, dict[str, Any]] | None:
        found = [(n, r[kind]) for n, r in by.items() if kind in r]
        return max(found, key=lambda x: x[1][key]) if found else None

    cores = max(((n, r["max_server_cores"]) for n, r in by.items() if r["max_server_cores"] is not None),
                key=lambda x: x[1], default=None)
    if cores:
        row("server cores used under load (most of any cell)", f"{cores[1]:.2f} cores at N = {cores[0]}",
            f"{GOAL_CORES} cores", cores[1] / GOAL_CORES, f"cores / {GOAL_CORES} >= 1", 1.0)
    json_best = best_over_n("json-wrk", "records_per_s")
    for aof, target in (("everysec", GOAL_REDIS_EVERYSEC), ("always", GOAL_REDIS_ALWAYS)):
        peer = peers.get(f"redis {aof} xadd-redis-benchmark")
        if json_best and peer:
            n, cell = json_best
            row(f"JSON produce from wrk (best cell), records/s vs Redis XADD AOF {aof}",
                f"{cell['records_per_s']:,}/s at N = {n} ({cell['server_cores']:.2f} cores)",
                f"redis-benchmark -P 500, AOF {aof}: {peer['records_per_s']:,}/s",
                cell["records_per_s"] / peer["records_per_s"], f">= {target}", target)
    raw = best_over_n("raw-produce", "mb_per_s")
    if raw and "dd-write" in peers:
        n, cell = raw
        dd = peers["dd-write"]["median_mb_per_s"]
        row("raw produce of ~1 MiB batches (best cell), MB/s vs dd conv=fdatasync",
            f"{cell['mb_per_s']:,} MB/s at N = {n}", f"dd: {dd:,} MB/s", cell["mb_per_s"] / dd, f">= {GOAL_DD}", GOAL_DD)
    small = best_over_n("small-wrk", "appends_per_s")
    peer = peers.get("redis always small-redis-benchmark")
    if small and peer:
        n, cell = small
        row("one-record appends over 100 partitions (best cell), appends/s vs Redis XADD AOF always, no pipelining",
            f"{cell['appends_per_s']:,}/s at N = {n}, p99 {cell.get('p99_ms')} ms ({cell['server_cores']:.2f} cores)",
            f"redis-benchmark -r 100: {peer['appends_per_s']:,}/s, p99 {peer.get('p99_ms')} ms",
            cell["appends_per_s"] / peer["appends_per_s"], f">= {GOAL_SMALL_REDIS}", GOAL_SMALL_REDIS)
        row("one-record appends (best cell), appends/s", f"{cell['appends_per_s']:,}/s at N = {n}",
            f"{GOAL_SMALL_APPENDS:,}/s (the Durable Streams reference server's published 55-76 k on 4 CPUs)",
            cell["appends_per_s"] / GOAL_SMALL_APPENDS, f"appends/s / {GOAL_SMALL_APPENDS:,} >= 1", 1.0)
        if cell.get("p99_ms") and peer.get("p99_ms"):
            row("one-record appends (best cell), p99 vs 2 x Redis's p99 (less is better: ratio = 2 x Redis / ours)",
                f"p99 {cell['p99_ms']} ms", f"2 x Redis p99 = {2 * peer['p99_ms']:.2f} ms",
                2 * peer["p99_ms"] / cell["p99_ms"], "ours <= 2 x Redis's", 1.0)
    fans = [(n, r["fanout-sse"]) for n, r in by.items() if "fanout-sse" in r]
    if fans:
        def meets(c: dict[str, Any]) -> bool:
            return (c["exactly_once_in_order"] and c["p50_ms"] <= GOAL_FANOUT_P50_MS and c["p99_ms"] <= GOAL_FANOUT_P99_MS
                    and c["kb_per_subscriber"] <= GOAL_FANOUT_KB)

        # a cell meeting every goal first, then exactly once, then the lowest p50
        n, cell = min(fans, key=lambda x: (not meets(x[1]), not x[1]["exactly_once_in_order"], x[1]["p50_ms"]))
        peer = peers.get("redis pubsub fanout")
        ref = f"Redis pub/sub (no fsync): p50 {peer['p50_ms']:.2f} ms, p99 {peer['p99_ms']:.2f} ms" if peer else "-"
        once = "exactly once in order" if cell["exactly_once_in_order"] else "NOT exactly once in order"
        row(f"SSE fan-out, {cell['subscribers']:,} subscribers, a record every 10 ms (best N): delivery p50",
            f"p50 {cell['p50_ms']:.2f} ms at N = {n}, {once}", ref, GOAL_FANOUT_P50_MS / cell["p50_ms"],
            f"p50 <= {GOAL_FANOUT_P50_MS:.0f} ms (ratio = goal / ours)", 1.0)
        row("SSE fan-out (same cell): delivery p99", f"p99 {cell['p99_ms']:.2f} ms", ref,
            GOAL_FANOUT_P99_MS / cell["p99_ms"], f"p99 <= {GOAL_FANOUT_P99_MS:.0f} ms (ratio = goal / ours)", 1.0)
        row("SSE fan-out (same cell): server memory per subscriber (RSS growth: a lower bound on a server whose heap "
            "other cells grew first)", f"{cell['kb_per_subscriber']:.1f} KB",
            f"Redis: {peer['kb_per_subscriber']:.1f} KB" if peer else "-", GOAL_FANOUT_KB / max(cell["kb_per_subscriber"], 0.01),
            f"<= {GOAL_FANOUT_KB:.0f} KB (ratio = goal / ours)", 1.0)
    kafka = best_over_n("kafka-produce", "records_per_s")
    peer = peers.get("redis always kafka-redis-benchmark")
    if kafka and peer:
        n, cell = kafka
        row("Kafka produce, 256 B records over 100 partitions, acks=all (best cell), records/s "
            "vs Redis XADD AOF always -P 16",
            f"{cell['records_per_s']:,}/s at N = {n}, {cell.get('producer_processes')} producer "
            f"processes ({cell['server_cores']:.2f} cores)",
            f"redis-benchmark -c 100 -P 16 -r 100: {peer['appends_per_s']:,}/s",
            cell["records_per_s"] / peer["appends_per_s"], f">= {GOAL_KAFKA_REDIS}",
            GOAL_KAFKA_REDIS)
    if kafka and small:
        row("Kafka produce (best cell) vs HTTP one-record appends (best small-wrk cell)",
            f"{kafka[1]['records_per_s']:,}/s at N = {kafka[0]}",
            f"HTTP one-record POSTs from wrk: {small[1]['appends_per_s']:,}/s at N = {small[0]}",
            kafka[1]["records_per_s"] / small[1]["appends_per_s"], f">= {GOAL_KAFKA_HTTP}",
            GOAL_KAFKA_HTTP)
    consumes = [(n, r["kafka-consume"]) for n, r in by.items() if "kafka-consume" in r]
    reader = "kcat" if any("kcat" in c for _n, c in consumes) else "python"
    consumes = [(n, c) for n, c in consumes if reader in c and "ratio_to_cat" in c[reader]]
    if consumes:
        n, cell = max(consumes, key=lambda x: x[1][reader]["ratio_to_cat"])
        name = "kcat (librdkafka in C)" if reader == "kcat" else "confluent-kafka (Python)"
        gb = cell["file_bytes"] / 1e9
        row(f"Kafka consume of {gb:.1f} GB from the start (best N), {name}, MB/s vs cat of the "
            "segment files (warm page cache)",
            f"{cell[reader]['median_mb_per_s']:,} MB/s at N = {n} "
            f"({cell[reader]['server_cores']:.2f} cores)",
            f"cat > /dev/null: {cell['cat']['median_mb_per_s']:,} MB/s",
            cell[reader]["ratio_to_cat"], f">= {GOAL_KAFKA_CONSUME}", GOAL_KAFKA_CONSUME)
    fetch = best_over_n("raw-fetch", "mb_per_s")
    if fetch:
        n, cell = fetch
        cache = peers.get("page-cache-read", {}).get("median_mb_per_s")
        row("raw fetch of 1 MiB (best cell), MB/s", f"{cell['mb_per_s']:,} MB/s at N = {n}",
            f"{GOAL_FETCH_MB_S:,} MB/s" + (f" (page cache read by dd: {cache:,} MB/s)" if cache else ""),
            cell["mb_per_s"] / GOAL_FETCH_MB_S, f"MB/s / {GOAL_FETCH_MB_S} >= 1", 1.0)
    return rows


def plot(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    r = document["results"]
    cells = r["cells"]
    ns = r["processes_measured"]
    peers = r["peers"]
    thousands = FuncFormatter(lambda v, _pos: f"{v / 1000:,.0f}k")
    fig, axes = plt.subplots(2, 2, figsize=(15, 10.5))

    def series(kind: str, key: str, **match: Any) -> list[float | None]:
        out = []
        for n in ns:
            found = [c for c in cells if c.get("system") == "eventlog" and c.get("processes") == n
                     and c.get("cell") == kind and all(c.get(k) == v for k, v in match.items())]
            best = _best(found, key)
            out.append(best[key] if best else None)
        return out

    ax = axes[0][0]
    for partitions, color in ((4, "tab:blue"), (16, "tab:cyan")):
        ax.plot(ns, series("json-wrk", "records_per_s", partitions=partitions), "-o", color=color,
                label=f"eventlog, wrk, {partitions} partitions (best of 4-64 connections)")
    ax.plot(ns, series("json-python", "records_per_s"), "-s", color="tab:purple", label="eventlog, Python client processes")
    for name, style, label in (("redis everysec xadd-redis-benchmark", "--", "Redis XADD -P 500, AOF everysec"),
                               ("redis always xadd-redis-benchmark", ":", "Redis XADD -P 500, AOF always"),
                               ("redis everysec xadd-python", "-.", "Redis XADD, redis-py processes")):
        if name in peers:
            ax.axhline(peers[name]["records_per_s"], linestyle=style, color="tab:red", label=label)
    ax.set_title("JSON produce, 500 x 100 B records/request")
    ax.set_ylabel("records/s")
    ax.yaxis.set_major_formatter(thousands)

    ax = axes[0][1]
    for kind, color in (("json-wrk", "tab:blue"), ("json-python", "tab:purple"), ("raw-produce", "tab:green"),
                        ("raw-fetch", "tab:orange")):
        ax.plot(ns, series(kind, "server_cores"), "-o", color=color, label=f"{kind} (most of its cells)")
    ax.plot(ns, ns, ":", color="grey", label="N cores")
    if document["machine"]["cpus"]["cpus"] >= JUDGED_FROM_CPUS:
        ax.axhline(GOAL_CORES, color="red", linestyle="--", label=f"goal: {GOAL_CORES} cores")
    ax.set_title(f"server cores used (supervisor + shards); {document['machine']['cpus']['how']}", fontsize=9)
    ax.set_ylabel("cores")

    ax = axes[1][0]
    ax.plot(ns, series("raw-produce", "mb_per_s"), "-o", color="tab:green", label="eventlog raw produce, ~1 MiB batches")
    if "dd-write" in peers:
        dd = peers["dd-write"]["median_mb_per_s"]
        ax.axhline(dd, color="black", linestyle="--", label=f"dd conv=fdatasync ({dd:,.0f} MB/s)")
        ax.axhline(GOAL_DD * dd, color="red", linestyle=":", label=f"goal {GOAL_DD} x dd")
    ax.set_title("raw produce")
    ax.set_ylabel("MB/s")

    ax = axes[1][1]
    ax.plot(ns, series("raw-fetch", "mb_per_s"), "-o", color="tab:orange", label="eventlog raw fetch, 1 MiB")
    ax.axhline(GOAL_FETCH_MB_S, color="red", linestyle=":", label=f"goal {GOAL_FETCH_MB_S / 1000:g} GB/s")
    if "page-cache-read" in peers:
        cache = peers["page-cache-read"]["median_mb_per_s"]
        ax.axhline(cache, color="black", linestyle="--", label=f"page cache read, dd ({cache:,.0f} MB/s)")
    ax.set_yscale("log")
    ax.set_title("raw fetch (warm page cache)")
    ax.set_ylabel("MB/s")
    for ax in axes.flat:
        ax.set_xlabel("--processes N")
        ax.set_xticks(ns)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        if ax.get_yscale() == "linear":
            ax.set_ylim(0, None)
    m = document["machine"]
    fig.suptitle(f"capacity on {m['host']}: {m['cpus']['cpus']} CPUs ({m['cpu_model']}), "
                 f"{m['cell_seconds']} s cells, {document['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl", type=Path, nargs="+")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    machines, cells = load(args.jsonl)
    machine = machines[0]
    host = re.sub(r"[^A-Za-z0-9._-]+", "-", machine["host"])
    summary = summarize(machines, cells)
    document = {
        "benchmark": f"capacity-{host}",
        "command": " ; ".join(m["command"] for m in machines),
        "report_command": shlex.join([sys.executable, "-m", "bench.capacity.report", *map(str, args.jsonl)]),
        "date": machine["date"],
        "reported": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": f"{machine['cell_seconds']} s cells",
        "machine": {k: v for k, v in machine.items() if k not in ("cell", "command", "date")},
        "runs": [{"command": m["command"], "date": m["date"], "processes": m["processes_measured"]} for m in machines],
        "results": {**summary, "cells": cells},
        "summary": goals(machine, summary),
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"capacity-{host}.json"
    out.write_text(json.dumps(document, indent=2) + "\n")
    plot(document, out.with_suffix(".png"))
    print(f"{out} and {out.with_suffix('.png').name}")
    units = (("records_per_s", "rec/s"), ("appends_per_s", "appends/s"), ("median_mb_per_s", "MB/s"), ("mb_per_s", "MB/s"))

    def figure(v: dict[str, Any]) -> str:
        if "p50_ms" in v and "kb_per_subscriber" in v:
            return f"p50 {v['p50_ms']:.2f} ms, p99 {v['p99_ms']:.2f} ms, {v['kb_per_subscriber']} KB/subscriber"
        return next((f"{v[key]:,} {unit}" for key, unit in units if v.get(key) is not None), "?")

    def describe(kind: str, v: dict[str, Any]) -> str:
        if kind == "kafka-consume":  # one figure per reader
            readers = [r for r in ("cat", "kcat", "python") if r in v]
            rates = [f"{r} {v[r]['median_mb_per_s']:,} MB/s" for r in readers]
            return "kafka-consume " + ", ".join(rates)
        return f"{kind} {figure(v)} at {v['server_cores']:.2f} cores"

    for n, row in summary["by_processes"].items():
        parts = [describe(kind, v) for kind, v in row.items() if isinstance(v, dict)]
        print(f"N = {n}: " + "; ".join(parts))
    for name, peer in summary["peers"].items():
        print(f"{name}: {figure(peer)}")
    for r in document["summary"]:
        print(f"{r['metric']}: {r['measured']} / {r['reference']} = {r['ratio']} ({r['goal']}; met: {r['passed']})")
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
