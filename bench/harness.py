"""What every benchmark shares: the run context, machine facts, timing, dd, results files.

A benchmark module exposes

    NAME: str                      file stem of its results (NAME.json, NAME.png)
    TITLE: str                     one line for logs and the summary table
    run(ctx: Context) -> dict      measures; returns {"params": ..., "results": ...,
                                   "summary": [row, ...]} (rows: see summary_row())
    plot(report: dict, path: Path) draws report["results"] into one PNG

and __main__ wraps each report with the command line, the date, the machine and the elapsed
time (write_report), so a results file says by itself how it was produced.

Units: MB = 10**6 bytes and MiB = 2**20 bytes, as dd prints them; latencies in microseconds.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot imports in the benchmark modules

REPO = Path(__file__).resolve().parent.parent
MB = 1_000_000
MiB = 1 << 20


@dataclass
class Context:
    """One invocation of `python -m bench`: where to work, how big, where results go."""

    quick: bool
    work_dir: Path  # scratch data, on the filesystem being measured (gitignored)
    results_dir: Path
    argv: list[str]
    engine_source: dict[str, Any] = field(default_factory=dict)  # which engine/ was measured

    def scratch(self, name: str) -> Path:
        """A fresh, empty directory under the work dir (removed first if it exists)."""
        path = self.work_dir / name
        remove_tree(path)
        path.mkdir(parents=True)
        return path

    def log(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def remove_tree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


# -- machine facts ------------------------------------------------------------------------------


def command_line(argv: list[str]) -> str:
    """The command as one would retype it from the repo root."""
    return shlex.join([sys.executable, "-m", "bench", *argv])


def machine_facts(work_dir: Path) -> dict[str, Any]:
    """CPU, memory, Python, kernel, and the filesystem the benchmarks write to."""
    facts: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_total_bytes": _meminfo_bytes("MemTotal"),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "kernel": platform.release(),
        "work_dir": str(work_dir),
        "filesystem": filesystem_of(work_dir),
        "disk_free_bytes": shutil.disk_usage(work_dir).free,
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "packages": package_versions("numpy", "anyio", "crc32c", "matplotlib"),
    }
    return facts


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _meminfo_bytes(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def filesystem_of(path: Path) -> dict[str, str | None]:
    """Mount point, device, type and options of the filesystem holding `path` (/proc/mounts:
    the longest mount point that is a prefix of the resolved path)."""
    target = str(path.resolve())
    best: dict[str, str | None] = {
        "mount_point": None,
        "device": None,
        "type": None,
        "options": None,
    }
    best_len = -1
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        device, mount_point, fstype, options = parts[:4]
        mount_point = mount_point.replace("\\040", " ")
        prefix = mount_point.rstrip("/") + "/"
        if (target == mount_point or target.startswith(prefix)) and len(mount_point) > best_len:
            best = {
                "mount_point": mount_point,
                "device": device,
                "type": fstype,
                "options": options,
            }
            best_len = len(mount_point)
    return best


def package_versions(*names: str) -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def git(*args: str) -> str | None:
    """Output of a git command in the repo, None if git or the repo is not there."""
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def working_tree_engine() -> dict[str, Any]:
    """Provenance of the engine/ in the working tree: HEAD and whether engine/ differs."""
    dirty = git("status", "--porcelain", "--", "engine")
    return {
        "source": "working tree",
        "head_commit": git("rev-parse", "HEAD"),
        "engine_dirty": bool(dirty) if dirty is not None else None,
    }


def engine_from_commit(ref: str, work_dir: Path) -> dict[str, Any]:
    """Extract engine/ as of git `ref` into the work dir and put it first on sys.path, so the
    benchmarks measure that commit even while the working tree is being edited (or to
    compare two commits). Must run before anything imports `engine`."""
    if "engine" in sys.modules:
        raise RuntimeError("engine was imported before --engine-ref could take effect")
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    if not commit:
        raise SystemExit(f"--engine-ref: {ref!r} is not a commit of {REPO}")
    root = work_dir / f"engine-{commit[:12]}"
    if not (root / "engine" / "__init__.py").exists():
        remove_tree(root)
        root.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", commit, "engine"], cwd=REPO, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    sys.path.insert(0, str(root))
    import engine

    assert Path(engine.__file__).resolve().is_relative_to(root.resolve()), engine.__file__
    return {"source": "git commit", "ref": ref, "commit": commit, "extracted_to": str(root)}


class CpuWitness:
    """CPU time the rest of the machine used while a benchmark ran: /proc/stat's busy time
    minus this process's (and its children's, e.g. dd) own. Other work on a 2-core machine
    shows up as latency outliers and lower throughput, so every report carries this."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float, float]:
        import resource

        ticks = os.sysconf("SC_CLK_TCK")
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except OSError:
            fields = [0] * 8
        user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
        own = sum(
            getattr(resource.getrusage(who), f)
            for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
            for f in ("ru_utime", "ru_stime")
        )
        return time.monotonic(), (user + nice + system + irq + softirq) / ticks, steal / ticks, own

    def report(self) -> dict[str, float]:
        t0, busy0, steal0, own0 = self._start
        t1, busy1, steal1, own1 = self._read()
        return {
            "wall_seconds": round(t1 - t0, 1),
            "cpu_seconds_all": round(busy1 - busy0, 1),
            "cpu_seconds_this_process": round(own1 - own0, 1),
            "cpu_seconds_other_processes": round(max(0.0, (busy1 - busy0) - (own1 - own0)), 1),
            "steal_seconds": round(steal1 - steal0, 1),
        }


# -- measuring ----------------------------------------------------------------------------------


def time_each(fn: Any, args: list[Any]) -> list[int]:
    """Time fn(arg) for each arg with perf_counter_ns; returns the durations in ns."""
    clock = time.perf_counter_ns
    out = []
    for arg in args:
        start = clock()
        fn(arg)
        out.append(clock() - start)
    return out


def percentiles_us(samples_ns: list[int]) -> dict[str, float]:
    """p50, p90, p99, p99.9 and max of nanosecond samples, in microseconds (nearest rank)."""
    ordered = sorted(samples_ns)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[min(n - 1, max(0, int(q * n + 0.999999) - 1))] / 1000

    return {
        "count": n,
        "mean_us": round(sum(ordered) / n / 1000, 3),
        "p50_us": rank(0.50),
        "p90_us": rank(0.90),
        "p99_us": rank(0.99),
        "p999_us": rank(0.999),
        "max_us": ordered[-1] / 1000,
    }


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


_DD_RATE = re.compile(r"(\d+) bytes .* copied, ([0-9.]+) s")


def dd_write(directory: Path, count_mib: int) -> dict[str, float]:
    """`dd if=/dev/zero of=FILE bs=1M count=N conv=fdatasync`: sequential write bandwidth of the
    filesystem with one fdatasync at the end, the physical limit an fsyncing log is held to.

    The file is new (deleted before and after), so blocks are freshly allocated, as for a new
    segment. Returns dd's own bytes and seconds (its time includes the fdatasync) and the
    wall time measured around the process.
    """
    path = directory / "dd.bin"
    path.unlink(missing_ok=True)
    cmd = ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count_mib}", "conv=fdatasync"]
    start = time.perf_counter()
    done = subprocess.run(
        cmd, capture_output=True, text=True, check=True, env={**os.environ, "LC_ALL": "C"}
    )
    wall = time.perf_counter() - start
    path.unlink(missing_ok=True)
    match = _DD_RATE.search(done.stderr)
    if match:
        size, seconds = int(match.group(1)), float(match.group(2))
    else:  # an unexpected dd dialect: fall back to our own clock
        size, seconds = count_mib * MiB, wall
    return {
        "command": shlex.join(cmd),
        "bytes": size,
        "seconds": seconds,
        "wall_seconds": round(wall, 6),
        "mb_per_s": round(size / seconds / MB, 1),
    }


def evict_page_cache(paths: Iterable[Path]) -> int:
    """Drop the cached pages of `paths` (files, or directories walked recursively) with
    posix_fadvise(DONTNEED); returns the bytes of the files it was applied to.

    Needs no privilege, unlike /proc/sys/vm/drop_caches, and evicts only clean pages, so the
    data must have been fsynced first. Inodes and directory entries stay cached, and a
    virtual disk may still be cached by its host: "cold" means cold in this kernel's page
    cache, nothing more.
    """
    total = 0
    for path in paths:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for file in files:
            try:
                fd = os.open(file, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def pread_files(paths: Iterable[Path], chunk_bytes: int = MiB) -> int:
    """Read every file start to end with os.pread in `chunk_bytes` chunks; returns bytes read."""
    total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            position = 0
            while True:
                data = os.pread(fd, chunk_bytes, position)
                if not data:
                    break
                position += len(data)
            total += position
        finally:
            os.close(fd)
    return total


# -- reporting ----------------------------------------------------------------------------------


def summary_row(
    metric: str, measured: str, reference: str, ratio: float | None, goal: str, passed: bool | None
) -> dict[str, Any]:
    """One line of the results table: what was measured, against what, and the goal."""
    return {
        "metric": metric,
        "measured": measured,
        "reference": reference,
        "ratio": None if ratio is None else round(ratio, 3),
        "goal": goal,
        "passed": passed,
    }


def write_report(ctx: Context, name: str, report: dict[str, Any], elapsed_s: float) -> Path:
    """Write results_dir/NAME.json: provenance first, then what the benchmark returned."""
    ctx.results_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "command": command_line(ctx.argv),
        # run from `make bench`: the make command line that leads to `command`
        "make_command": (
            f"make bench BENCH_ARGS={shlex.quote(shlex.join(ctx.argv))}"
            if os.environ.get("MAKELEVEL")
            else None
        ),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "quick" if ctx.quick else "full",
        "elapsed_seconds": round(elapsed_s, 1),
        "engine": ctx.engine_source,
        "machine": machine_facts(ctx.work_dir),
        **report,
    }
    path = ctx.results_dir / f"{name}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def format_table(reports: list[dict[str, Any]]) -> str:
    """The Markdown table of every summary row of `reports` (already loaded JSON documents)."""
    lines = [
        "| benchmark | metric | measured | reference (same run) | ratio | goal | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for report in reports:
        for row in report.get("summary", []):
            ratio = "" if row["ratio"] is None else f"{row['ratio']:.3g}"
            met = {True: "yes", False: "**no**", None: ""}[row["passed"]]
            lines.append(
                f"| {report['benchmark']} | {row['metric']} | {row['measured']} | {row['reference']} "
                f"| {ratio} | {row['goal']} | {met} |"
            )
    return "\n".join(lines)
