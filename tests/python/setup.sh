#!/usr/bin/env bash
# Makes tests/python/.venv, a virtualenv with the pinned packages of requirements.txt, for the
# Python suite (Google's own Pub/Sub client against ringpostd). Idempotent: a virtualenv made
# from the same requirements is left as it is, so .ci/run and the Rust test that runs the
# suite can both call it. Quiet when it works; when it fails, it says what failed and exits
# non-zero.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
requirements="$here/requirements.txt"
# The stamp records which requirements the virtualenv was made from: a changed pin remakes it.
stamp="$venv/.requirements.sha256"

fail() {
    echo "tests/python/setup.sh: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || fail "python3 is not installed"
wanted="$(sha256sum "$requirements" | cut -d' ' -f1)"

# Two runs at once (cargo test beside .ci/run, say) would build the same directory: the second
# waits for the first, then finds the virtualenv made.
exec 9>"$here/.venv.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$wanted" ]]; then
    exit 0
fi

python3 -m venv --clear "$venv" || fail "python3 -m venv $venv failed (is the venv module installed?)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --requirement "$requirements" \
    || fail "pip install -r $requirements failed"
"$venv/bin/python" -m pip check --disable-pip-version-check >/dev/null \
    || fail "the pinned packages conflict: $("$venv/bin/python" -m pip check 2>&1)"
"$venv/bin/python" -c "import google.cloud.pubsub_v1, pytest, jwt" \
    || fail "the virtualenv cannot import google.cloud.pubsub_v1, pytest and jwt"
echo "$wanted" >"$stamp"
