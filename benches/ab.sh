#!/usr/bin/env bash
# A/B check of a change: runs the workloads W1 (batches of 1000 and of 1), W2, W3 and W5 with two
# builds of ringpost-bench, interleaved pair by pair (A then B, PAIRS times) so that the machine's
# drift falls on both alike, and prints each workload's throughput for A and B in every pair and
# the ratio B/A of the medians.
#
#   benches/ab.sh BASE_BENCH_BIN NEW_BENCH_BIN           three pairs, QUICK sizes
#   PAIRS=5 QUICK=0 ONLY="W1 W2" benches/ab.sh A B       more pairs, full sizes, fewer workloads
#   B_ARGS="--scrape-every 1000" benches/ab.sh BIN BIN    one build, B with more options (here:
#                                                         /metrics read every second)
#
# Build the base in a worktree of the base commit: git worktree add /tmp/base <commit> &&
# (cd /tmp/base && cargo build --release -p ringpost-tools).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${1:?the base ringpost-bench}
NEW=${2:?the new ringpost-bench}
PAIRS=${PAIRS:-3}
export QUICK=${QUICK:-1}
export ONLY=${ONLY:-W1_batch1000 W1_batch1_K64 W2_e2e W3_fanout10 W5_backlog}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/ringpost-ab.XXXXXX")}
mkdir -p "$OUT"
for pair in $(seq 1 "$PAIRS"); do
  for side in A B; do
    if [ "$side" = A ]; then bin=$BASE; args=${A_ARGS:-}; else bin=$NEW; args=${B_ARGS:-}; fi
    echo "== pair $pair, $side ($bin $args)"
    BENCH_BIN=$bin BENCH_ARGS=$args OUT="$OUT/$pair$side" bash "$HERE/run.sh" >"$OUT/$pair$side.txt" 2>&1 || true
  done
done
python3 - "$OUT" "$PAIRS" <<'PY'
import json, os, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
labels = os.environ["ONLY"].split()
keys = {"W1": "msgs_per_sec"}
print(f"{'workload':16} " + " ".join(f"{'A'+str(p):>10} {'B'+str(p):>10}" for p in range(1, pairs + 1)) + "   B/A (medians)")
for label in labels:
    key = keys.get(label[:2], "deliveries_per_sec")
    row = {"A": [], "B": []}
    for pair in range(1, pairs + 1):
        for side in "AB":
            try:
                with open(os.path.join(out, f"{pair}{side}", label + ".json")) as file:
                    row[side].append(json.load(file).get(key))
            except (OSError, ValueError):
                row[side].append(None)
    cells = " ".join(f"{(a or 0):>10.0f} {(b or 0):>10.0f}" for a, b in zip(row["A"], row["B"]))
    a = [v for v in row["A"] if v]; b = [v for v in row["B"] if v]
    ratio = f"{statistics.median(b) / statistics.median(a):.3f}" if a and b else "-"
    print(f"{label:16} {cells}   {ratio}")
print(f"(each run's files: {out})")
PY
