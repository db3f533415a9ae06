#!/usr/bin/env bash
# Fetches promtool (Prometheus's checker of rule files and metrics) for the monitoring tests:
# Debian's `prometheus` package is downloaded, not installed (nothing is started or
# configured), and its promtool extracted to tests/monitoring/.promtool/promtool. Idempotent:
# a no-op when it is there. Prints the path.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target="$here/.promtool"
if [[ -x "$target/promtool" ]]; then
    echo "$target/promtool"
    exit 0
fi
command -v apt-get >/dev/null 2>&1 || { echo "tests/monitoring/setup.sh: no apt-get to fetch promtool with" >&2; exit 1; }
exec 9>"$here/.promtool.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
if [[ ! -x "$target/promtool" ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && apt-get download -q prometheus >/dev/null 2>&1) || {
        apt-get update -q >/dev/null && (cd "$work" && apt-get download -q prometheus >/dev/null)
    }
    dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
    mkdir -p "$target"
    install -m 0755 "$work/root/usr/bin/promtool" "$target/promtool.tmp"
    mv "$target/promtool.tmp" "$target/promtool"
fi
echo "$target/promtool"
