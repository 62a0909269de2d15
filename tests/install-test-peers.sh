#!/bin/sh
# Installs what some tests drive when it is missing, from Debian's packages: chromium for the
# browser tests (tests/console/, through Playwright's Python package from the dev extra;
# Playwright's own browser download is never used), libfuse2 for the power-cut tests
# (tests/powercut/: fusepy, from the dev extra, loads it to mount their FUSE layer), and kcat
# for the Kafka client tests (tests/broker/; the Python clients come from the dev extra).
# From npm, where node and npm are present: KafkaJS, at the version tests/broker/js's lock file
# pins, for the same tests (`npm ci` there; without node they skip with the reason).
# Idempotent; does nothing when everything is present. Debian's packages need root or
# passwordless sudo and Debian's package mirror; without them it says so and those tests skip
# with the reason.
set -eu
kafkajs_dir="$(dirname "$0")/broker/js"
if [ ! -e "$kafkajs_dir/node_modules/kafkajs/package.json" ]; then
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "no node or npm: the KafkaJS tests (tests/broker) are skipped" >&2
    else
        echo "installing KafkaJS (npm ci in $kafkajs_dir) for the KafkaJS tests (tests/broker)" >&2
        if ! (cd "$kafkajs_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null); then
            echo "npm could not install KafkaJS: the KafkaJS tests (tests/broker) are skipped" >&2
        fi
    fi
fi
need=""
if ! command -v chromium >/dev/null 2>&1 && [ -z "${EVENTLOG_CHROMIUM:-}" ]; then need="chromium"; fi
have_fuse=""
for lib in /usr/lib/*/libfuse.so.2 /lib/*/libfuse.so.2 /usr/lib/libfuse.so.2 /usr/lib64/libfuse.so.2; do
    if [ -e "$lib" ]; then have_fuse=1; fi
done
if [ -z "$have_fuse" ]; then need="$need libfuse2"; fi
if ! command -v kcat >/dev/null 2>&1; then need="$need kcat"; fi
if [ -z "$need" ]; then exit 0; fi

which_tests() {
    case "$1" in
        chromium) echo "the browser tests (tests/console)" ;;
        libfuse2) echo "the power-cut tests (tests/powercut)" ;;
        kcat) echo "the kcat tests (tests/broker)" ;;
    esac
}

if ! command -v apt-get >/dev/null 2>&1; then
    for pkg in $need; do echo "no $pkg and no apt-get: $(which_tests "$pkg") are skipped" >&2; done
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
    for pkg in $need; do echo "no $pkg and no root to install it: $(which_tests "$pkg") are skipped" >&2; done
    exit 0
fi
if ! $sudo apt-get update -qq >/dev/null; then
    echo "apt-get update failed: $(for pkg in $need; do which_tests "$pkg"; done | paste -sd' ' -) may be skipped" >&2
fi
for pkg in $need; do
    echo "installing $pkg for $(which_tests "$pkg")" >&2
    if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$pkg" >/dev/null; then
        echo "apt-get could not install $pkg: $(which_tests "$pkg") are skipped" >&2
    fi
done
exit 0
