#!/usr/bin/env bash
# Device follow-up (2026-11-26): fdatasync of 10 files against one syncfs, one-record appends with
# EVENTLOG_SHARED_SYNC on and off at --processes 1, the small-wrk cells at N = 4 and 16 with it off.
# With .device carried: bash bench/capacity/extra/shared_sync.sh. Writes under $OUT.
set -u
export PYTHONPATH=/tmp/capacity-site:$PWD PATH=/tmp/capacity-debs/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/capacity-debs/usr/lib/x86_64-linux-gnu
if [ ! -d /tmp/capacity-site ]; then python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target /tmp/capacity-site .device/whl/*.whl 2>&1 | grep -v WARN | tail -2; mkdir -p /tmp/capacity-debs; for f in .device/debs/*.deb; do dpkg -x "$f" /tmp/capacity-debs; done; fi
df -hT /var/tmp | tail -1
python3 - <<'PY'
import os, time, ctypes
libc = ctypes.CDLL(None, use_errno=True)
d = "/var/tmp/synctest"; os.makedirs(d, exist_ok=True)
fds = [os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY | os.O_APPEND) for i in range(10)]
for name in ("fdatasync", "syncfs"):
    t = []
    for k in range(100):
        for fd in fds: os.write(fd, b"x" * 300)
        t0 = time.perf_counter()
        if name == "fdatasync":
            for fd in fds: os.fdatasync(fd)
        else:
            libc.syncfs(fds[0])
        t.append(time.perf_counter() - t0)
    t.sort(); print(name, "10 files: p50 %.2f ms p90 %.2f ms" % (t[50]*1e3, t[90]*1e3))
PY
for SS in true false; do
D=/var/tmp/prof; rm -rf $D; mkdir -p $D; PORT=28080
EVENTLOG_SHARED_SYNC=$SS taskset -c 0-11 python3 -m app.cli serve --host 127.0.0.1 --port $PORT --data-dir $D/data --processes 1 > $D/log 2>&1 &
SP=$!
python3 - <<'PY'
import time, urllib.request, json
for _ in range(300):
    try:
        urllib.request.urlopen("http://127.0.0.1:28080/readyz"); break
    except Exception: time.sleep(0.1)
r = urllib.request.Request("http://127.0.0.1:28080/v1/topics", data=json.dumps({"name": "t", "partitions": 100}).encode(), method="POST", headers={"content-type": "application/json"})
urllib.request.urlopen(r)
PY
taskset -c 12-15 wrk -t4 -c100 -d6s --latency -s bench/capacity/extra/small.lua http://127.0.0.1:$PORT > $OUT/wrk-$SS.out
echo "shared_sync=$SS $(grep -E 'Requests/sec' $OUT/wrk-$SS.out) p50 $(grep ' 50%' $OUT/wrk-$SS.out) p99 $(grep ' 99%' $OUT/wrk-$SS.out)"
python3 -c "
import urllib.request
for l in urllib.request.urlopen('http://127.0.0.1:28080/metrics').read().decode().splitlines():
    if l.startswith('eventlog_commit') : print(l)
"
kill $SP; wait $SP
done
rm -rf /var/tmp/prof
EVENTLOG_SHARED_SYNC=false PEERS=0 PROCESSES=4,16 CELL_SECONDS=4 ONLY=small OUT="$OUT/cap3" bash bench/capacity/run.sh 2>&1 | grep small-wrk | cut -c1-330
