#!/bin/sh
# Installs what the browser tests drive when it is missing: Debian's chromium (tests/console/,
# through Playwright's Python package from the dev extra; Playwright's own browser download is
# never used). Idempotent; does nothing when chromium is present. Needs root or passwordless
# sudo and Debian's package mirror; without them it says so and the browser tests skip with
# the reason.
set -eu
if command -v chromium >/dev/null 2>&1 || [ -n "${EVENTLOG_CHROMIUM:-}" ]; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "no chromium and no apt-get: the browser tests (tests/console) are skipped" >&2
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
    echo "no chromium and no root to install it: the browser tests (tests/console) are skipped" >&2
    exit 0
fi
echo "installing chromium for the browser tests" >&2
if ! { $sudo apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null; }; then
    echo "apt-get could not install chromium: the browser tests (tests/console) are skipped" >&2
fi
exit 0
