#!/usr/bin/env bash
# Installs libfaketime (Debian's `faketime`) for the clock test (T11, tests/tests/it/clocks.rs),
# which runs the nodes with their wall clocks offset and stepped. Idempotent: a no-op when the
# library is there, so .ci/run and the test itself can both call it. Needs root and apt.
set -euo pipefail
if ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1; then
    exit 0
fi
command -v apt-get >/dev/null 2>&1 || { echo "tests/clocks/setup.sh: no apt-get; install libfaketime" >&2; exit 1; }
# Two runs at once wait for each other rather than fight over dpkg's lock.
exec 9>/var/tmp/ringpost-faketime-setup.lock
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
if ! ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1; then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime >/dev/null
fi
