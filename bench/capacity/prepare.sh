#!/usr/bin/env bash
# Builds .device/ (git-ignored) in the repository root: what bench/capacity/run.sh needs on a
# machine without a package registry.
#   .device/whl/    wheels of every package the server needs at run time (pyproject.toml's
#                   dependencies and theirs, pinned to this .venv's versions by pins.py) and
#                   redis-py + hiredis, for CPython $PY_VERSION (default 3.12) on x86_64 Linux
#   .device/debs/   Debian packages of wrk, redis-server, redis-tools (redis-benchmark,
#                   redis-cli), kcat (with librdkafka1, libyajl2; it also needs libssl3,
#                   libsasl2-2, liblz4-1, libzstd1 from the image, else the Kafka consume cell
#                   skips it) and the libraries they need that a CUDA/Ubuntu image may lack
#   .device/subscribers  bench/fanout/subscribers.c built with gcc (the fan-out cells' client)
#   .device/pins.txt, .device/SOURCE (the commit and whether engine/ api/ app/ workers/ differ)
# Usage, from the repository root after `make install`: bash bench/capacity/prepare.sh
# Needs network access here (PyPI, the Debian mirror: run `apt-get update` first if
# apt-get download cannot find a package). Re-run it after a dependency changes.
set -eu
cd "$(dirname "$0")/../.."
PY_VERSION=${PY_VERSION:-3.12}
[ -x .venv/bin/python ] || { echo "no .venv: run make install first" >&2; exit 2; }
rm -rf .device
mkdir -p .device/whl .device/debs
.venv/bin/python bench/capacity/pins.py "$PY_VERSION" > .device/pins.txt
platforms=""
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_34_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64 linux_x86_64; do
    platforms="$platforms --platform $p"
done
# shellcheck disable=SC2086  # $platforms is a list of options
.venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp $platforms -d .device/whl -r .device/pins.txt
(cd .device/debs && apt-get download wrk libluajit-5.1-2 libluajit-5.1-common redis-server redis-tools \
    libjemalloc2 liblzf1 kcat librdkafka1 libyajl2 >/dev/null)
# the fan-out cells' client (the device machine has no compiler); static, so any glibc runs it
gcc -O2 -Wall -static -o .device/subscribers bench/fanout/subscribers.c 2>/dev/null \
    || gcc -O2 -Wall -o .device/subscribers bench/fanout/subscribers.c
{
    echo "commit $(git rev-parse HEAD)"
    [ -z "$(git status --porcelain -- engine api app workers)" ] || echo "with uncommitted changes in engine/ api/ app/ workers/"
    echo "prepared $(date -u +%Y-%m-%dT%H:%M:%SZ) for CPython $PY_VERSION"
} > .device/SOURCE
echo "$(ls .device/whl | wc -l) wheels, $(ls .device/debs | wc -l) Debian packages: $(du -sh .device | cut -f1) in .device/"
