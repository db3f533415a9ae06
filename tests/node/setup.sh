#!/usr/bin/env bash
# Installs Google's Node.js Pub/Sub client, at the versions package-lock.json pins, into
# tests/node/node_modules, for the test that runs it against ringpostd's REST API
# (tests/tests/it/node_client.rs). Idempotent: modules installed from the same lock file are
# left as they are. Quiet when it works; when it fails, it says what failed and exits non-zero.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
modules="$here/node_modules"
# The stamp records which lock file the modules were installed from: a changed pin reinstalls.
stamp="$modules/.package-lock.sha256"

fail() {
    echo "tests/node/setup.sh: $*" >&2
    exit 1
}

command -v node >/dev/null 2>&1 || fail "node is not installed"
command -v npm >/dev/null 2>&1 || fail "npm is not installed"
wanted="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"

# Two runs at once (cargo test beside .ci/run, say) would install into the same directory: the
# second waits for the first, then finds the modules installed.
exec 9>"$here/.setup.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

if [[ -d "$modules/@google-cloud/pubsub" && -f "$stamp" && "$(cat "$stamp")" == "$wanted" ]]; then
    exit 0
fi

(cd "$here" && npm ci --no-audit --no-fund --silent) || fail "npm ci in $here failed"
(cd "$here" && node -e "require('@google-cloud/pubsub')") || fail "node cannot load @google-cloud/pubsub"
echo "$wanted" >"$stamp"
