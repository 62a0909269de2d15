"""`python -m bench.soak --minutes N --kill-every M [--seed S] [--out bench/results/soak.json]`

Exit status 0 when nothing was lost, duplicated or otherwise wrong; 1 otherwise (the failures
are printed and written to the results file); 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from pathlib import Path

from ..harness import REPO
from ..servers import run_async
from . import report
from .runner import SoakConfig, run_soak


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, required=True, help="how long the load runs")
    parser.add_argument("--kill-every", type=float, required=True, metavar="SECONDS",
                        help="seconds of load between SIGKILLs (each jittered by x0.75-1.25)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the kill times and the load (default 1)")
    parser.add_argument("--min-restarts", type=int, default=0,
                        help="keep going past --minutes until this many fault cycles were survived")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "soak.json",
                        help="results file; the plot goes next to it as .png (default bench/results/soak.json)")
    parser.add_argument("--work-dir", type=Path, default=REPO / "bench" / "work" / "soak",
                        help="the data dir and server log (default bench/work/soak, emptied first)")
    parser.add_argument("--processes", type=int, default=1,
                        help="eventlog serve --processes (default 1); with 2 or more the faults rotate: SIGKILL of "
                             "the server, SIGKILL of one shard, SIGSTOP of one shard")
    parser.add_argument("--keep", action="store_true", help="keep the work dir afterwards (default: removed on success)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.kill_every <= 0:
        parser.error("--minutes and --kill-every must be positive")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    cfg = SoakConfig(minutes=args.minutes, kill_every=args.kill_every, seed=args.seed,
                     work_dir=args.work_dir, min_restarts=args.min_restarts, processes=args.processes, log=log)
    document = run_async(run_soak, cfg)
    command = shlex.join([sys.executable, "-m", "bench.soak", *argv])
    report.write(document, args.out, command, args.work_dir)
    report.plot(document, args.out.with_suffix(".png"))
    r = document["results"]
    summary = {k: r[k] for k in ("passed", "duration_seconds", "faults_by_kind", "restarts_survived", "shard_stops_resumed",
                                 "answered_503_during_shard_faults", "requests_per_second_total",
                                 "records_acknowledged", "records_verified", "records_expired",
                                 "records_in_doubt", "lost", "duplicated", "queue_acked",
                                 "queue_dead_lettered", "queue_lost", "failure_counts")}
    log(f"results in {args.out}: {json.dumps(summary)}")
    for failure in r["failures"]:
        print(f"FAILURE {failure['kind']}: {failure['detail']}", file=sys.stderr)
    if r["passed"] and not args.keep:
        import shutil

        shutil.rmtree(args.work_dir, ignore_errors=True)
    return 0 if r["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
