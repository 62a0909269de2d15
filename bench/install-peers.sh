#!/bin/sh
# Installs the benchmark peers from Debian's packages when they are missing: redis-server and
# redis-benchmark (Redis Streams), nats-server (JetStream), wrk (the C load generator) and kcat
# (librdkafka in C: bench/kafka_consume.py's consumer without Python).
# Idempotent; does nothing when all are present. Needs root or passwordless sudo.
set -eu
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v redis-benchmark >/dev/null 2>&1 || missing="$missing redis-tools"
command -v nats-server >/dev/null 2>&1 || missing="$missing nats-server"
command -v wrk >/dev/null 2>&1 || missing="$missing wrk"
command -v kcat >/dev/null 2>&1 || missing="$missing kcat"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; else
    echo "bench peers missing ($missing) and no root: the benchmarks that need them are skipped" >&2
    exit 0
fi
echo "installing bench peers:$missing" >&2
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
