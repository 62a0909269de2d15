#!/usr/bin/env bash
# Device follow-up (2026-11-26): one-record appends at --processes 1 profiled with py-spy, then the
# small-wrk cells at N = 2 and 4. Run after bench/capacity/run.sh on the same warm machine (it
# reuses /tmp/capacity-site and /tmp/capacity-debs), with .device carried (py-spy copied into it).
set -u
export PYTHONPATH=/tmp/capacity-site:$PWD PATH=/tmp/capacity-debs/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/capacity-debs/usr/lib/x86_64-linux-gnu
python3 --version; python3 -c "import uvloop, httptools, orjson; print('uvloop', uvloop.__version__)"
nproc; grep -m1 'model name' /proc/cpuinfo
D=/var/tmp/prof; rm -rf $D; mkdir -p $D; PORT=28080
taskset -c 0-11 python3 -m app.cli serve --host 127.0.0.1 --port $PORT --data-dir $D/data --processes 1 > $D/log 2>&1 &
SP=$!
python3 - <<'PY'
import time, urllib.request, json
for _ in range(300):
    try:
        urllib.request.urlopen("http://127.0.0.1:28080/readyz"); break
    except Exception: time.sleep(0.1)
r = urllib.request.Request("http://127.0.0.1:28080/v1/topics", data=json.dumps({"name": "t", "partitions": 100}).encode(), method="POST", headers={"content-type": "application/json"})
print(urllib.request.urlopen(r).status)
PY
taskset -c 12-15 wrk -t4 -c100 -d9s --latency -s bench/capacity/extra/small.lua http://127.0.0.1:$PORT > $OUT/wrk1.out &
W=$!
sleep 2; timeout 20 ${PY_SPY:-.device/py-spy} record -p $SP -d 5 --idle --threads -f raw -o $OUT/prof1.txt -r 200 > $OUT/pyspy.log 2>&1
wait $W; grep -E "Requests/sec| 50%| 99%" $OUT/wrk1.out
kill $SP; wait $SP; tail -5 $D/log; rm -rf $D
PEERS=0 PROCESSES=2,4 CELL_SECONDS=4 ONLY=small OUT="$OUT/cap2" bash bench/capacity/run.sh 2>&1 | grep small-wrk | cut -c1-330
