#!/usr/bin/env bash
# The capacity run (bench/capacity/load.py) on this machine, from the repository root.
#
# On a machine without a package registry (the device machine): `bash bench/capacity/prepare.sh`
# here first, then there, with .device carried: `bash bench/capacity/run.sh`. It installs the
# wheels of .device/whl into /tmp/capacity-site and unpacks .device/debs into
# /tmp/capacity-debs when wrk, redis-server or redis-benchmark is missing.
# On a machine with the project's .venv (this one): PYTHON=.venv/bin/python bash bench/capacity/run.sh
#
# Environment: PROCESSES (default 1,2,4,8,16; capped at the CPU count), CELL_SECONDS (10),
# PEERS (1: also Redis and dd; 0: eventlog only), ONLY (json,python,raw,fetch,small,fanout,kafka,consume), CLIENT_CPUS
# (default a quarter of the CPUs), HOST_LABEL (names the results), WORK (scratch dir on the
# disk to measure; default /var/tmp/eventlog-capacity), OUT (where capacity.jsonl and
# capacity.log go; default bench/work/capacity).
# Afterwards, here: .venv/bin/python -m bench.capacity.report OUT/capacity.jsonl [more.jsonl]
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench/work/capacity}
WORK=${WORK:-/var/tmp/eventlog-capacity}
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
    [ -d .device/whl ] || { echo "no .device/whl: run bench/capacity/prepare.sh first, or set PYTHON=.venv/bin/python" >&2; exit 2; }
    PYTHON=python3
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/capacity-site .device/whl/*.whl || exit 1
    export PYTHONPATH="/tmp/capacity-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! { command -v wrk && command -v redis-server && command -v redis-benchmark; } >/dev/null 2>&1; then
    [ -d .device/debs ] || { echo "wrk or redis missing and no .device/debs: run bench/capacity/prepare.sh" >&2; exit 2; }
    mkdir -p /tmp/capacity-debs
    for f in .device/debs/*.deb; do dpkg -x "$f" /tmp/capacity-debs; done
    bin=/tmp/capacity-debs/usr/bin
    [ -e "$bin/redis-server" ] || ln -s redis-check-rdb "$bin/redis-server"
    export PATH="$bin:$PATH" LD_LIBRARY_PATH="/tmp/capacity-debs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "$(nproc) CPUs, $("$PYTHON" --version), wrk: $(command -v wrk), redis-server: $(command -v redis-server)"
peers=""; [ "${PEERS:-1}" = 0 ] && peers="--no-peers"
rm -rf "$WORK"
set -o pipefail
# shellcheck disable=SC2086  # $peers is empty or one option
"$PYTHON" bench/capacity/load.py --work "$WORK" --out "$OUT/capacity.jsonl" \
    --processes "${PROCESSES:-1,2,4,8,16}" --cell-seconds "${CELL_SECONDS:-10}" \
    --only "${ONLY:-json,python,raw,fetch,small,fanout,kafka,consume}" ${CLIENT_CPUS:+--client-cpus "$CLIENT_CPUS"} $peers \
    2>&1 | tee "$OUT/capacity.log"
status=$?
rm -rf "$WORK"
exit $status
