"""The soak's results file (JSON, with provenance) and its plot (operations per second over
time, faults marked by kind, verification pauses and fault phases shaded, 507 answers and
retries of exact writers drawn)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..harness import git, machine_facts
from ..servers import server_source

# what the plot draws, by the operation kinds load.Stats counts
PLOT_GROUPS = {
    "produce requests": (("produce_json", "produce_raw", "produce_table", "produce_full",
                          "produce_idempotent", "produce_conditional"), "tab:blue"),
    "507 storage_full answers": (("storage_full_507",), "black"),
    "exact writers' retries": (("exact_retry",), "tab:brown"),
    "fetch + long-poll requests": (("fetch", "fetch_raw", "long_poll"), "tab:orange"),
    "SSE events": (("sse_event",), "tab:green"),
    "records acknowledged / 10": (("records_acked",), "tab:purple"),
}
SCALE = {"records acknowledged / 10": 0.1}
FAULT_LINES = {  # a cycle's fault: its line's label and color
    "server_kill": ("SIGKILL of the server", "red"),
    "shard_kill": ("SIGKILL of one shard", "magenta"),
    "shard_stop": ("SIGSTOP of one shard (killed at its deadline)", "darkviolet"),
    "shard_stop_cont": ("SIGSTOP of one shard, then SIGCONT", "teal"),
}


def write(document: dict[str, Any], out: Path, command: str, work_dir: Path) -> None:
    doc = {
        "benchmark": "soak",
        "command": command,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD"),
        "server_source": server_source(),
        "machine": machine_facts(work_dir),
        **document,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


def plot(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = document["results"]
    seconds = [t for t, _ in r["timeline"]]
    fig, ax = plt.subplots(figsize=(11, 5))
    for label, (kinds, color) in PLOT_GROUPS.items():
        scale = SCALE.get(label, 1.0)
        ys = [sum(ops.get(k, 0) for k in kinds) * scale for _, ops in r["timeline"]]
        ax.plot(seconds, _smooth(ys), label=label, linewidth=1, color=color)
    drawn: set[str] = set()
    for i, cycle in enumerate(r["cycles"]):
        label, color = FAULT_LINES.get(cycle.get("fault", "server_kill"), ("fault", "red"))
        ax.axvline(cycle["kill_at"], color=color, linewidth=0.8, label=None if label in drawn else label)
        drawn.add(label)
        ax.axvspan(cycle["verify_started"], cycle["verify_started"] + cycle["verify_seconds"],
                   color="grey", alpha=0.25, linewidth=0, label="writers held: verifying" if i == 0 else None)
    shaded: set[str] = set()
    for phase in r.get("fault_phases", {}).get("phases", []):
        label = "disk full (ENOSPC on soak-full-0)" if phase["kind"] == "disk_full" else "slow fsync"
        color = "orange" if phase["kind"] == "disk_full" else "gold"
        ax.axvspan(phase["started"], phase["started"] + phase["seconds"], color=color, alpha=0.3, linewidth=0,
                   label=None if label in shaded else label)
        shaded.add(label)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("per second (3 s moving average)")
    verdict = "passed" if r["passed"] else "FAILED"
    x = r.get("exact", {})
    ax.set_title(
        f"soak: {r['duration_seconds']:.0f} s, {r.get('faults', r['restarts_survived'])} faults survived "
        f"({', '.join(f'{n} {k}' for k, n in r.get('faults_by_kind', {}).items())}), "
        f"{r['records_acknowledged']:,} records acknowledged, lost {r['lost']}, duplicated {r['duplicated']} ({verdict})\n"
        f"idempotent/conditional requests in doubt {x.get('in_doubt', 0)}, resolved {x.get('resolved', 0)} "
        f"({x.get('resolved_by_replay', 0)} by replay); {r.get('records_refused_507', 0):,} records refused 507 in "
        f"{r.get('fault_phases', {}).get('disk_full_phases', 0)} disk-full phases",
        fontsize=10,
    )
    ax.legend(loc="upper right", fontsize=8)
    ax.set_xlim(0, max(seconds) if seconds else 1)
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(ys: list[float], width: int = 3) -> list[float]:
    out = []
    for i in range(len(ys)):
        window = ys[max(0, i - width + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out
