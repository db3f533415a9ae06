#!/usr/bin/env bash
# Google Cloud Pub/Sub's gRPC API beside the native protocol: W1 (publish, batches of 100 and of
# 1000) and W2 (publish and one streaming subscriber that acknowledges), closed loop, and
# publish-ack latency at an offered 10,000 msg/s open loop, against a standalone ringpostd,
# native then gRPC in each pair (PAIRS times) so that the machine's drift falls on both alike.
# Prints each run's figure and the ratio gRPC/native of the medians. The gRPC client is tonic,
# from ringpost-bench itself (`--grpc`); acknowledgements go as unary calls, as the Python and
# Node clients send them.
#
#   benches/grpc.sh             three pairs, QUICK sizes
#   PAIRS=5 QUICK=0 benches/grpc.sh
#   BENCH_BIN=path DAEMON_BIN=path benches/grpc.sh   those builds instead of this tree's
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PAIRS=${PAIRS:-3}
QUICK=${QUICK:-1}
DATA_PARENT=${DATA_PARENT:-/var/tmp}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/ringpost-grpc.XXXXXX")}
mkdir -p "$OUT"
if [ "$QUICK" = 1 ]; then W1=400000; W2=200000; OPEN=50000; else W1=1000000; W2=500000; OPEN=150000; fi
if [ -z "${BENCH_BIN:-}" ] || [ -z "${DAEMON_BIN:-}" ]; then
  echo "== building ringpost-bench and ringpostd (release)"
  cargo build --release -q -p ringpost-tools -p ringpost-daemon --manifest-path "$ROOT/Cargo.toml"
fi
BENCH_BIN=${BENCH_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ringpost-bench}
DAEMON_BIN=${DAEMON_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ringpostd}
source "$HERE/standalone.sh"
# A free port for the gRPC API, asked of the kernel once; the daemon of each run binds it.
GRPC_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

run() { # side (native|grpc), label, workload arguments...
  local side=$1 label=$2; shift 2
  local client=()
  if [ "$side" = grpc ]; then client=(--grpc --grpc-server "127.0.0.1:$GRPC_PORT"); fi
  DAEMON_ARGS="--grpc-listen 127.0.0.1:$GRPC_PORT" with_standalone_daemon "$DAEMON_BIN" "$DATA_PARENT" \
    "$OUT/$label.daemon.log" \
    "$BENCH_BIN" --server @SERVER@ "${client[@]}" "$@" --json "$OUT/$label.json" >"$OUT/$label.txt" 2>"$OUT/$label.log" \
    || echo "   $label: FAILED: $(tail -n 1 "$OUT/$label.log")"
  sync; sleep 1
}

for pair in $(seq 1 "$PAIRS"); do
  for side in native grpc; do
    echo "== pair $pair, $side"
    run "$side" "W1_batch100.$pair.$side" publish --messages $W1 --publishers 4 --batch 100 --inflight 8
    run "$side" "W1_batch1000.$pair.$side" publish --messages $W1 --publishers 4 --batch 1000 --inflight 4
    run "$side" "W2_e2e.$pair.$side" e2e --messages $W2 --publishers 4
    run "$side" "open_10k.$pair.$side" publish --messages $OPEN --publishers 4 --batch 10 --rate 10000
  done
done
python3 - "$OUT" "$PAIRS" <<'PY'
import json, os, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
def figure(label, data):
    if label.startswith("open"):
        return (data.get("publish_ack_us") or {}).get("p99")
    return data.get("msgs_per_sec") if label.startswith("W1") else data.get("deliveries_per_sec")
print(f"{'workload':16} {'native':>30} {'gRPC':>30}   gRPC/native (medians)")
for label in ["W1_batch100", "W1_batch1000", "W2_e2e", "open_10k"]:
    row = {}
    for side in ["native", "grpc"]:
        values = []
        for pair in range(1, pairs + 1):
            try:
                with open(os.path.join(out, f"{label}.{pair}.{side}.json")) as file:
                    values.append(figure(label, json.load(file)))
            except (OSError, ValueError):
                pass
        row[side] = [v for v in values if v]
    cells = " ".join(f"{' '.join(f'{v:.0f}' for v in row[side]):>30}" for side in ["native", "grpc"])
    ratio = f"{statistics.median(row['grpc']) / statistics.median(row['native']):.3f}" if row["native"] and row["grpc"] else "-"
    unit = "(publish-ack p99, us)" if label.startswith("open") else "(msgs/s)"
    print(f"{label:16} {cells}   {ratio} {unit}")
print(f"(each run's files: {out})")
PY
