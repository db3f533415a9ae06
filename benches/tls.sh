#!/usr/bin/env bash
# The cost of TLS: W1 (batches of 1000 and of 1) and W2 against a standalone ringpostd, in
# plaintext and over TLS, interleaved pair by pair (plaintext then TLS, PAIRS times) so that the
# machine's drift falls on both alike; prints each run's throughput and the ratio TLS/plaintext
# of the medians. The certificate authority and the daemon's certificate are made here with
# openssl, for 127.0.0.1, in the output directory.
#
#   benches/tls.sh             three pairs, QUICK sizes
#   PAIRS=5 QUICK=0 benches/tls.sh
#   BENCH_BIN=path DAEMON_BIN=path benches/tls.sh   those builds instead of this tree's
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PAIRS=${PAIRS:-3}
QUICK=${QUICK:-1}
DATA_PARENT=${DATA_PARENT:-/var/tmp}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/ringpost-tls.XXXXXX")}
mkdir -p "$OUT"
if [ "$QUICK" = 1 ]; then W1=1000000; W1_SINGLE=200000; W2=400000; else W1=2000000; W1_SINGLE=250000; W2=1000000; fi
if [ -z "${BENCH_BIN:-}" ] || [ -z "${DAEMON_BIN:-}" ]; then
  echo "== building ringpost-bench and ringpostd (release)"
  cargo build --release -q -p ringpost-tools -p ringpost-daemon --manifest-path "$ROOT/Cargo.toml"
fi
BENCH_BIN=${BENCH_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ringpost-bench}
DAEMON_BIN=${DAEMON_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ringpostd}
source "$HERE/standalone.sh"

# A CA and a certificate for 127.0.0.1 signed by it (ECDSA P-256, as most deployments use).
CERTS=$OUT/certs
mkdir -p "$CERTS"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=ringpost bench CA" \
  -keyout "$CERTS/ca.key" -out "$CERTS/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$CERTS/server.key" -out "$CERTS/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' >"$CERTS/san.ext"
openssl x509 -req -in "$CERTS/server.csr" -CA "$CERTS/ca.pem" -CAkey "$CERTS/ca.key" -CAcreateserial -days 2 \
  -extfile "$CERTS/san.ext" -out "$CERTS/server.pem" 2>/dev/null

run() { # side (plain|tls), label, workload arguments...
  local side=$1 label=$2; shift 2
  local client=() daemon_args=
  if [ "$side" = tls ]; then
    client=(--ca "$CERTS/ca.pem")
    daemon_args="--tls-cert $CERTS/server.pem --tls-key $CERTS/server.key"
  fi
  DAEMON_ARGS=$daemon_args with_standalone_daemon "$DAEMON_BIN" "$DATA_PARENT" "$OUT/$label.daemon.log" \
    "$BENCH_BIN" --server @SERVER@ "${client[@]}" "$@" --json "$OUT/$label.json" >"$OUT/$label.txt" 2>"$OUT/$label.log" \
    || echo "   $label: FAILED: $(tail -n 1 "$OUT/$label.log")"
  sync; sleep 1
}

for pair in $(seq 1 "$PAIRS"); do
  for side in plain tls; do
    echo "== pair $pair, $side"
    run "$side" "W1_batch1000.$pair.$side" publish --messages $W1 --publishers 4 --batch 1000 --inflight 4
    run "$side" "W1_batch1_K64.$pair.$side" publish --messages $W1_SINGLE --publishers 4 --batch 1 --inflight 64
    run "$side" "W2_e2e.$pair.$side" e2e --messages $W2 --publishers 4
  done
done
python3 - "$OUT" "$PAIRS" <<'PY'
import json, os, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
print(f"{'workload':16} {'plaintext':>30} {'TLS':>30}   TLS/plaintext (medians)")
for label in ["W1_batch1000", "W1_batch1_K64", "W2_e2e"]:
    key = "msgs_per_sec" if label.startswith("W1") else "deliveries_per_sec"
    row = {}
    for side in ["plain", "tls"]:
        values = []
        for pair in range(1, pairs + 1):
            try:
                with open(os.path.join(out, f"{label}.{pair}.{side}.json")) as file:
                    values.append(json.load(file).get(key))
            except (OSError, ValueError):
                pass
        row[side] = [v for v in values if v]
    cells = " ".join(f"{' '.join(f'{v:.0f}' for v in row[side]):>30}" for side in ["plain", "tls"])
    ratio = f"{statistics.median(row['tls']) / statistics.median(row['plain']):.3f}" if row["plain"] and row["tls"] else "-"
    print(f"{label:16} {cells}   {ratio}")
print(f"(each run's files: {out})")
PY
