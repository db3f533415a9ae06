#!/usr/bin/env bash
# Replicated Ringpost side by side on one machine: three ringpostd nodes on loopback, topics of
# three replicas (a publish is acknowledged once two nodes hold it durably), W1 and W2; in the
# same run a single node, for what replication costs; and, when NATS_CLUSTER_RUN names its
# runner, three NATS JetStream servers with streams of three replicas (which acknowledge before
# fsync). Prints one table of msgs/s and p99s with the ratios the issue asks for.
#
#   benches/cluster.sh              full run (about 5 minutes on 2 cores)
#   QUICK=1 benches/cluster.sh      smoke run
#   OUT=dir benches/cluster.sh      keep the JSON and logs in dir
#   NATS_CLUSTER_RUN=path           the NATS cluster runner (prints RESULT lines); without it,
#                                   Ringpost alone
#   SHARDS=n                        forwarder shards per node (default 1: three nodes share two
#                                   cores)
#   SOURCES_SHARDS=n                forwarder shards per node of the sources rows (default 3)
#   ONLY=sources                    the sources rows alone
#
# The sources rows: one R=3 topic of three publish sources beside three R=3 topics, W1 with
# batches of 1000, on three nodes of SOURCES_SHARDS shards each. A topic's sources are each on a
# shard of their own on every replica, so three sources of three replicas want 9 forwarder
# shards: three per node, more shards than this machine's two cores (each shard a thread that
# polls), which is what those rows measure here.
#
# The three nodes share this machine's cores and its one disk: each byte is carried three times
# over loopback and written three times to the same device, so a third of one node's rate is
# the ceiling of R=3 here.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
QUICK=${QUICK:-0}
SHARDS=${SHARDS:-1}
SOURCES_SHARDS=${SOURCES_SHARDS:-3}
ONLY=${ONLY:-}
NATS_CLUSTER_RUN=${NATS_CLUSTER_RUN:-}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/ringpost-cluster-bench.XXXXXX")}
DATA_PARENT=${DATA_PARENT:-/var/tmp}
mkdir -p "$OUT"
ulimit -n 65536 2>/dev/null || true

if [ "$QUICK" = 1 ]; then W1=100000; W1_BATCH=300000; W2=100000; else W1=500000; W1_BATCH=2000000; W2=500000; fi

echo "== building ringpostd and ringpost-bench (release)"
cargo build --release -q -p ringpost-daemon -p ringpost-tools --manifest-path "$ROOT/Cargo.toml"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}/release
DAEMON=$TARGET/ringpostd
BIN=$TARGET/ringpost-bench

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
# A run of SHARDS + 1 free ports for a router and its forwarders.
free_run() {
  python3 - "$SHARDS" <<'PY'
import socket, sys, random
shards = int(sys.argv[1])
while True:
    first = random.randint(20000, 60000)
    sockets = []
    try:
        for port in range(first, first + shards + 1):
            s = socket.socket(); s.bind(("127.0.0.1", port)); sockets.append(s)
        print(first); break
    except OSError:
        pass
    finally:
        for s in sockets: s.close()
PY
}

PIDS=(); DIRS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null; done
  for d in "${DIRS[@]:-}"; do [ -n "$d" ] && rm -rf "$d"; done
  PIDS=(); DIRS=()
  true
}
trap cleanup EXIT

start_cluster() {
  local cluster="" routers=() i
  CLUSTER_PORTS=(); ROUTERS=()
  for i in 1 2 3; do CLUSTER_PORTS+=("$(free_port)"); ROUTERS+=("$(free_run)"); done
  for i in 0 1 2; do cluster="$cluster${cluster:+,}127.0.0.1:${CLUSTER_PORTS[$i]}"; done
  for i in 0 1 2; do
    local dir; dir=$(mktemp -d "$DATA_PARENT/ringpost-cluster-bench.XXXXXX"); DIRS+=("$dir")
    "$DAEMON" --node-id $((i + 1)) --cluster "$cluster" --listen "127.0.0.1:${ROUTERS[$i]}" --data-dir "$dir" \
      --shards "$SHARDS" --no-pin --grpc-listen off --http-listen off >"$OUT/node$((i + 1)).log" 2>&1 &
    PIDS+=("$!")
  done
  for _ in $(seq 300); do
    if [ "$(grep -l 'serving on' "$OUT"/node*.log 2>/dev/null | wc -l)" = 3 ]; then return 0; fi
    sleep 0.1
  done
  echo "the cluster did not start; see $OUT/node*.log" >&2
  return 1
}

run() { # label, server, ringpost-bench workload arguments...
  local label=$1 server=$2; shift 2
  local started=$SECONDS
  if "$BIN" --server "$server" "$@" --json "$OUT/$label.json" >"$OUT/$label.txt" 2>"$OUT/$label.log"; then
    echo "   $label: done in $((SECONDS - started)) s"
  else
    echo "   $label: FAILED after $((SECONDS - started)) s: $(tail -n 1 "$OUT/$label.log")"
  fi
  sync; sleep 1
}

workloads() { # prefix, server
  run "$1_W1_batch1_K64" "$2" publish --messages $W1 --publishers 4 --batch 1 --inflight 64
  run "$1_W1_batch1000" "$2" publish --messages $W1_BATCH --publishers 4 --batch 1000 --inflight 4
  run "$1_W2_batch1_K64" "$2" e2e --messages $W2 --publishers 4 --batch 1 --inflight 64
}

if [ "$ONLY" != sources ]; then
echo "== Ringpost, three nodes, topics of three replicas (data in $DATA_PARENT), results in $OUT"
start_cluster
workloads R3 "127.0.0.1:${ROUTERS[0]}"
cleanup
fi

# One R=3 topic of three sources beside three R=3 topics, on a cluster of SOURCES_SHARDS shards
# per node (see the header), each row on a fresh cluster.
sources_rows() {
  local shards=$SHARDS label args
  SHARDS=$SOURCES_SHARDS
  for label in R3_W1_topic_3sources R3_W1_3topics; do
    case $label in *sources) args=(--sources 3) ;; *) args=(--topics 3) ;; esac
    start_cluster
    run "$label" "127.0.0.1:${ROUTERS[0]}" publish --messages $W1_BATCH --publishers 4 --batch 1000 --inflight 4 "${args[@]}"
    cleanup
  done
  SHARDS=$shards
}
echo "== Ringpost, three nodes of $SOURCES_SHARDS shards: one R=3 topic of three sources, three R=3 topics"
sources_rows

if [ "$ONLY" != sources ]; then
echo "== Ringpost, one node, in the same run"
dir=$(mktemp -d "$DATA_PARENT/ringpost-cluster-bench.XXXXXX"); DIRS+=("$dir")
port=$(free_run)
"$DAEMON" --listen "127.0.0.1:$port" --data-dir "$dir" --shards "$SHARDS" --no-pin --grpc-listen off --http-listen off \
  >"$OUT/single.log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 100); do grep -q 'serving on' "$OUT/single.log" && break; sleep 0.1; done
workloads R1 "127.0.0.1:$port"
cleanup

if [ -n "$NATS_CLUSTER_RUN" ] && [ -f "$NATS_CLUSTER_RUN" ]; then
  echo "== NATS JetStream, three servers, streams of three replicas ($NATS_CLUSTER_RUN)"
  # Judged by its RESULT lines: the runner may exit non-zero after printing them (its summary
  # table wants workloads this script does not run).
  QUICK=$QUICK OUT="$OUT/nats" bash "$NATS_CLUSTER_RUN" >"$OUT/nats.log" 2>&1 || true
  if grep -q '^RESULT' "$OUT/nats.log"; then
    echo "   done"
  else
    echo "   FAILED: $(tail -n 1 "$OUT/nats.log")"
  fi
else
  echo "== NATS JetStream: skipped (NATS_CLUSTER_RUN names no runner script)"
fi
fi

echo
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, disk $(df -h --output=source,fstype "$DATA_PARENT" | tail -n 1 | tr -s ' '), QUICK=$QUICK, $SHARDS shard(s) per node"
python3 - "$OUT" "$SOURCES_SHARDS" <<'PY'
import json, os, re, sys
out = sys.argv[1]
def load(label):
    try:
        with open(os.path.join(out, label + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
nats = {}
results = os.path.join(out, "nats", "results.txt")
if os.path.exists(results):
    for line in open(results):
        if line.startswith("RESULT "):
            fields = dict(re.findall(r"(\S+?)=(\S+)", line))
            nats[fields.get("label", "")] = fields
def nats_rate(prefix):
    for label, fields in nats.items():
        if prefix and label.startswith(prefix) and "pub_msgs_s" in fields:
            return float(fields["pub_msgs_s"])
    return None
show = lambda v: f"{v:12,.0f}" if v else f"{'-':>12}"
ratio = lambda x, y: f"{x / y:8.2f}" if x and y else f"{'-':>8}"
print(f"{'workload':16} {'R=3 msg/s':>12} {'R=1 msg/s':>12} {'R3/R1':>8} {'NATS R=3':>12} {'R3/NATS':>8} {'R=3 ack p99':>12} {'R=3 e2e p99':>12}")
for workload, nats_prefix in (("W1_batch1_K64", "W1_pub_K64"), ("W1_batch1000", None), ("W2_batch1_K64", "W2_e2e_K64")):
    r3, r1 = load("R3_" + workload), load("R1_" + workload)
    a = r3 and r3.get("msgs_per_sec")
    b = r1 and r1.get("msgs_per_sec")
    n = nats_rate(nats_prefix)
    ack = r3 and r3.get("publish_ack_us", {}).get("p99")
    e2e = r3 and (r3.get("e2e_us") or {}).get("p99")
    print(f"{workload:16} {show(a)} {show(b)} {ratio(a, b)} {show(n)} {ratio(a, n)} {str(ack or '-'):>12} {str(e2e or '-'):>12}")
a, b = load("R3_W1_topic_3sources"), load("R3_W1_3topics")
a, b = a and a.get("msgs_per_sec"), b and b.get("msgs_per_sec")
print(f"R=3 W1_batch1000, one topic of 3 sources {show(a).strip()} msg/s against 3 topics {show(b).strip()}: {ratio(a, b).strip()}"
      f" ({sys.argv[2]} shards per node)")
PY
