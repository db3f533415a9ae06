#!/usr/bin/env bash
# What one scrape of /metrics costs a daemon: the daemon's CPU time per scrape (from
# /proc/PID/stat, every thread of it), the scrape's size and its wall time, measured over
# SCRAPES back-to-back scrapes of a standalone release ringpostd holding TOPICS topics of one
# subscription each, each with one message waiting. A scrape every second takes the daemon's
# CPU time per scrape, per second, of the machine's cores: that is what scraping costs the hot
# path at most, measured far below the run-to-run spread of a throughput A/B.
#
#   benches/scrape_cost.sh                     1,000 topics (as many as one scrape exports), 300 scrapes
#   TOPICS=100 SCRAPES=1000 benches/scrape_cost.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
TOPICS=${TOPICS:-1000}
SCRAPES=${SCRAPES:-300}
DATA_PARENT=${DATA_PARENT:-/var/tmp}
ulimit -n 65536 2>/dev/null || true

cargo build --release -q -p ringpost-daemon -p ringpost-tools --manifest-path "$ROOT/Cargo.toml"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}/release
directory=$(mktemp -d "$DATA_PARENT/ringpost-scrape.XXXXXX")
log="$directory.log"
"$TARGET/ringpostd" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --grpc-listen off \
  --data-dir "$directory" >"$log" 2>&1 &
daemon=$!
cleanup() {
  kill "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  rm -rf "$directory" "$log"
}
trap cleanup EXIT
server= metrics=
for _ in $(seq 100); do
  server=$( (grep -o 'serving on [0-9.:]*' "$log" || true) | cut -d' ' -f3)
  metrics=$( (grep -o 'metrics on http://[0-9.:]*/metrics' "$log" || true) | cut -d' ' -f3)
  [ -n "$server" ] && [ -n "$metrics" ] && break
  sleep 0.1
done
[ -n "$metrics" ] || { echo "the daemon did not start:"; cat "$log"; exit 1; }

echo "== $TOPICS topics, one subscription and one message each"
cli() { "$TARGET/ringpost" --server "$server" "$@" >/dev/null; }
for index in $(seq "$TOPICS"); do
  cli topic create "scraped-$index"
  cli sub create "scraped-$index-sub" --topic "scraped-$index"
  cli publish "scraped-$index" "waiting"
done

ticks() { awk '{print $14 + $15}' "/proc/$daemon/stat"; }
bytes=$(curl -s "$metrics" | wc -c)
series=$(curl -s "$metrics" | grep -vc '^#')
before=$(ticks)
started=$(date +%s%N)
for _ in $(seq "$SCRAPES"); do curl -s -o /dev/null "$metrics"; done
elapsed_ns=$(($(date +%s%N) - started))
after=$(ticks)
python3 - "$SCRAPES" "$((after - before))" "$(getconf CLK_TCK)" "$elapsed_ns" "$bytes" "$series" "$(nproc)" <<'PY'
import sys
scrapes, ticks, hertz, elapsed_ns, size, series, cores = map(int, sys.argv[1:])
cpu_ms = ticks / hertz * 1000 / scrapes
print(f"scrapes {scrapes}, {size} bytes and {series} samples each")
print(f"wall time per scrape {elapsed_ns / scrapes / 1e6:.2f} ms (curl included)")
print(f"daemon CPU per scrape {cpu_ms:.2f} ms (all its threads; {ticks} ticks of 1/{hertz} s)")
print(f"a scrape every second takes {cpu_ms / 1000 / cores * 100:.3f}% of the machine's {cores} cores")
PY
