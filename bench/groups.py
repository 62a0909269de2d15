"""Consumer groups at scale: one group's offsets and a page of the listing, 10 to 100,000 groups.

What is measured. For each number of groups N (10, 1,000, 10,000, 100,000; --quick stops at
10,000), a fresh data dir whose __consumer_offsets holds N groups, each with an offset on each
of the 4 partitions of one topic (written with GroupOffsets.merge, 200 offsets per durable
batch), then:

* in-process, on the engine's GroupOffsets: fetch(group) of a uniformly random group, and
  groups_page(1000, after) from a uniformly random group name (what GET /v1/groups does
  without a filter), each call timed with time.perf_counter_ns;
* over HTTP, against `eventlog serve` (one process, default settings) on the same data dir:
  GET /v1/groups/{group}/offsets of a random group, and GET /v1/groups?limit=1000&after=...
  from a random group name (its bytes too), with one keep-alive httpx client, timed around
  the whole request.

Goal (issue 28): one group's offsets <= 2 ms (p50) at 100,000 groups, and a page of the
listing bounded (its bytes do not grow with N). Before the index, fetch scanned every stored
offset: p50 0.5 ms at 10 groups, 0.9 ms at 1,000, 9.8 ms at 10,000, and GET /v1/groups answered
every group (10.4 ms and 90 KB at 10,000).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import anyio

from engine.groups import CommittedOffset
from engine.log_manager import EngineConfig, open_engine

from .harness import Context, percentiles_us, remove_tree, summary_row, time_each

NAME = "groups"
TITLE = "consumer groups: one group's offsets and a page of GET /v1/groups, 10 to 100,000 groups"

PARTITIONS = 4
PAGE = 1000
GOAL_P50_MS = 2.0
SEED = 28


def params(quick: bool) -> dict[str, Any]:
    return {
        "groups": [10, 1_000, 10_000] if quick else [10, 1_000, 10_000, 100_000],
        "partitions_per_group": PARTITIONS,
        "engine_samples": 2_000 if quick else 10_000,
        "http_samples": 200 if quick else 1_000,
        "page_limit": PAGE,
        "seed": SEED,
    }


def run(ctx: Context) -> dict[str, Any]:
    p = params(ctx.quick)
    results = {}
    for n in p["groups"]:
        results[str(n)] = _measure(ctx, p, n)
    top = results[str(p["groups"][-1])]
    fetch_ms = top["http_fetch"]["p50_us"] / 1000 if top.get("http_fetch") else None
    rows = [
        summary_row(
            f"one group's offsets p50 over HTTP (engine fetch p50), {p['groups'][-1]:,} groups",
            f"{fetch_ms:.2f} ms ({top['engine_fetch']['p50_us']:.1f} us)" if fetch_ms else "n/a",
            f"{results['10']['http_fetch']['p50_us'] / 1000:.2f} ms at 10 groups"
            if results["10"].get("http_fetch")
            else "n/a",
            fetch_ms / GOAL_P50_MS if fetch_ms else None,
            "p50 / 2 ms <= 1",
            fetch_ms <= GOAL_P50_MS if fetch_ms else None,
        ),
        summary_row(
            f"GET /v1/groups?limit={PAGE} p50 and bytes, {p['groups'][-1]:,} groups",
            f"{top['http_page']['p50_us'] / 1000:.2f} ms, {top['http_page_bytes']:,} B"
            if top.get("http_page")
            else "n/a",
            f"engine groups_page p50 {top['engine_page']['p50_us']:.0f} us"
            if top.get("engine_page")
            else "n/a",
            None,
            "(informational)",
            None,
        ),
    ]
    return {"params": p, "results": results, "summary": rows}


def _measure(ctx: Context, p: dict[str, Any], n: int) -> dict[str, Any]:
    work = ctx.scratch(f"{NAME}-{n}")
    rng = random.Random(SEED + n)
    names = [f"group-{i:07d}" for i in range(n)]
    out: dict[str, Any] = {"groups": n, "offsets": n * PARTITIONS}
    try:
        begin = time.perf_counter()
        out |= anyio.run(_engine_side, work, names, p, rng)
        ctx.log(
            f"groups {n:,}: filled and measured in-process in {time.perf_counter() - begin:.1f} s"
        )
        out |= _http_side(ctx, work, names, p, rng)
        ctx.log(f"groups {n:,}: " + _p50s(out))
    finally:
        remove_tree(work)
    return out


async def _engine_side(work: Path, names: list[str], p: dict[str, Any], rng: random.Random) -> dict:
    async with open_engine(EngineConfig(log_dirs=(work / "data",))) as engine:
        await engine.create_topic("orders", PARTITIONS)
        groups = engine.groups
        step = 50_000
        begin = time.perf_counter()
        for first in range(0, len(names), step):
            await groups.merge(
                CommittedOffset(g, "orders", q, 1000 + q, "", 1_700_000_000_000)
                for g in names[first : first + step]
                for q in range(PARTITIONS)
            )
        fill_s = time.perf_counter() - begin
        assert len(groups.fetch(names[-1])) == PARTITIONS
        samples = p["engine_samples"]
        picks = [rng.choice(names) for _ in range(samples)]
        fetch = time_each(groups.fetch, picks)
        has_page = hasattr(groups, "groups_page")  # not before the index (--engine-ref)
        page = time_each(lambda g: groups.groups_page(PAGE, g), picks) if has_page else None
    return {
        "fill_seconds": round(fill_s, 2),
        "engine_fetch": percentiles_us(fetch),
        "engine_page": percentiles_us(page) if page else None,
    }


def _http_side(
    ctx: Context, work: Path, names: list[str], p: dict[str, Any], rng: random.Random
) -> dict:
    import httpx

    from .servers import EventlogServer

    if ctx.engine_source.get("extracted_to"):
        # --engine-ref: api/ is the working tree's, which an older engine/ may not serve
        return {"http_fetch": None, "http_page": None}
    server = EventlogServer(ctx, work)
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            started = time.perf_counter()
            # the first request after start-up also measures nothing: warm the routes
            client.get(f"/v1/groups/{names[0]}/offsets").raise_for_status()
            probe = client.get("/v1/groups", params={"limit": PAGE})
            if probe.status_code != 200:  # an engine without groups_page (--engine-ref)
                return {"http_fetch": None, "http_page": None, "server": server.facts()}
            picks = [rng.choice(names) for _ in range(p["http_samples"])]

            def fetch(g: str) -> None:
                r = client.get(f"/v1/groups/{g}/offsets")
                assert r.status_code == 200 and len(r.json()["offsets"]) == PARTITIONS, r.text

            sizes = []

            def page(g: str) -> None:
                r = client.get("/v1/groups", params={"limit": PAGE, "after": g})
                assert r.status_code == 200, r.text
                sizes.append(len(r.content))

            http_fetch = time_each(fetch, picks)
            http_page = time_each(page, picks)
            first = len(probe.content)
            ctx.log(f"groups: HTTP samples in {time.perf_counter() - started:.1f} s")
    finally:
        server.stop()
    return {
        "http_fetch": percentiles_us(http_fetch),
        "http_page": percentiles_us(http_page),
        "http_page_bytes": first,  # the first page: a full one whenever N >= the limit
        "http_page_bytes_max": max(sizes),
        "server": server.facts(),
    }


def _p50s(out: dict[str, Any]) -> str:
    def p50(key: str, unit: float, name: str) -> str:
        r = out.get(key)
        return (
            f"{name} {r['p50_us'] / unit:.3g} {'ms' if unit > 1 else 'us'}" if r else f"{name} n/a"
        )

    return (
        ", ".join(
            [
                p50("engine_fetch", 1, "engine fetch p50"),
                p50("engine_page", 1, "engine page p50"),
                p50("http_fetch", 1000, "HTTP fetch p50"),
                p50("http_page", 1000, "HTTP page p50"),
            ]
        )
        + f", page bytes {out.get('http_page_bytes')}"
    )


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    results = report["results"]
    ns = [int(k) for k in results]
    fig, ax = plt.subplots(figsize=(8, 5))
    series = [
        ("http_fetch", "GET /v1/groups/{group}/offsets", "tab:blue", "-"),
        ("http_page", f"GET /v1/groups?limit={PAGE}&after=…", "tab:orange", "-"),
        ("engine_fetch", "engine fetch(group)", "tab:blue", "--"),
        ("engine_page", f"engine groups_page({PAGE}, after)", "tab:orange", "--"),
    ]
    for key, label, color, style in series:
        points = [
            (n, results[str(n)][key]["p50_us"] / 1000) for n in ns if results[str(n)].get(key)
        ]
        if points:
            ax.plot(
                *zip(*points, strict=True),
                marker="o",
                color=color,
                linestyle=style,
                label=f"{label} p50",
            )
    ax.axhline(GOAL_P50_MS, color="red", linestyle=":", label="goal: one group's offsets <= 2 ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"groups (each with {PARTITIONS} committed offsets)")
    ax.set_ylabel("p50 latency, ms (log scale)")
    ax.set_title(TITLE, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
