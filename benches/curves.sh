#!/usr/bin/env bash
# Scaling curves: Ringpost's throughput and latency versus message size (64 B - 1 MiB),
# publishers (1 - 64), topics (1 - 10,000) and subscriptions (1 - 100), and the daemon's
# resident memory versus idle topics and versus a stored backlog; each throughput curve beside
# the disk's durable-write ceiling and the loopback TCP ceiling measured in the same run.
# ringpost-bench measures every point and draws every chart (SVG) and table (Markdown).
#
#   benches/curves.sh             every curve (about 7 minutes on 2 cores)
#   QUICK=1 benches/curves.sh     fewer, shorter points (about 1.5 minutes)
#   OUT=dir benches/curves.sh     keep the JSON, logs, charts and curves.md in dir
#   DRAW=1 OUT=dir benches/curves.sh   only redraw the charts and tables of a run kept in dir
#
# Throughput points run an embedded daemon on a scratch directory under /var/tmp, one point at
# a time, as benches/run.sh does. Memory points run a standalone ringpostd, so that the load
# generator's own memory is not counted, and a fresh one per point.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
QUICK=${QUICK:-0}
DRAW=${DRAW:-0}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/ringpost-curves.XXXXXX")}
DATA_PARENT=/var/tmp
mkdir -p "$OUT"
# 10,000 topics keep up to two files open each (see benches/run.sh).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

if [ "$QUICK" = 1 ]; then
  SIZES="64 1024 16384 262144 1048576"; SIZE_BYTES=$((128 << 20))
  PUBLISHERS="1 4 16 64"; PUBLISHER_MESSAGES=200000
  TOPICS="1 100 1000"; TOPIC_MESSAGES=50000
  SUBSCRIPTIONS="1 10 100"; DELIVERIES=300000
  IDLE_TOPICS="100 1000"; BACKLOGS="10000 100000"
  LOOPBACK_BYTES=256MiB; DISK_BYTES=64MiB
else
  SIZES="64 256 1024 4096 16384 65536 262144 1048576"; SIZE_BYTES=$((512 << 20))
  PUBLISHERS="1 2 4 8 16 32 64"; PUBLISHER_MESSAGES=500000
  TOPICS="1 10 100 1000 10000"; TOPIC_MESSAGES=100000
  SUBSCRIPTIONS="1 3 10 30 100"; DELIVERIES=1000000
  IDLE_TOPICS="100 1000 5000 10000"; BACKLOGS="10000 100000 1000000"
  LOOPBACK_BYTES=1GiB; DISK_BYTES=256MiB
fi
DESCRIPTORS=$(ulimit -n)
if [ "$DESCRIPTORS" != unlimited ]; then
  fits=$((DESCRIPTORS * 3 / 4 - 2000))
  TOPICS=$(for topics in $TOPICS; do [ "$topics" -le "$fits" ] && echo "$topics"; done | xargs)
  IDLE_TOPICS=$(for topics in $IDLE_TOPICS; do [ "$topics" -le "$fits" ] && echo "$topics"; done | xargs)
fi

echo "== building ringpost-bench and ringpostd (release)"
cargo build --release -q -p ringpost-tools -p ringpost-daemon --manifest-path "$ROOT/Cargo.toml"
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/ringpost-bench
DAEMON=${CARGO_TARGET_DIR:-$ROOT/target}/release/ringpostd

point() { # label, ringpost-bench arguments...
  local label=$1; shift
  if "$BIN" "$@" --json "$OUT/$label.json" >"$OUT/$label.txt" 2>"$OUT/$label.log"; then
    echo "   $label"
  else
    echo "   $label: FAILED: $(tail -n 1 "$OUT/$label.log")"
    rm -f "$OUT/$label.json"
  fi
  sync; sleep 1
}

source "$HERE/standalone.sh"
standalone_point() { # label, ringpost-bench workload arguments...
  local label=$1; shift
  # `point` reports its own failures; a failure here is the daemon's.
  with_standalone_daemon "$DAEMON" "$DATA_PARENT" "$OUT/$label.daemon.log" \
    point "$label" --server @SERVER@ "$@" ||
    echo "   $label: FAILED: the daemon did not start ($(tail -n 1 "$OUT/$label.daemon.log"))"
}

if [ "$DRAW" != 1 ]; then
echo "== ceilings"
"$BIN" loopback --bytes "$LOOPBACK_BYTES" --json "$OUT/loopback.json" >"$OUT/loopback.txt"
"$BIN" --data-dir "$DATA_PARENT" disk --block-sizes 1MiB --bytes-per-size "$DISK_BYTES" \
  --json "$OUT/disk.json" >"$OUT/disk.txt" 2>"$OUT/disk.log"
fi
read -r DISK_MB LOOPBACK_1_MB LOOPBACK_4_MB < <(python3 -c '
import json, sys
disk = json.load(open(sys.argv[1]))["results"][0]["mb_per_sec"]
loopback = {r["connections"]: r["mb_per_sec"] for r in json.load(open(sys.argv[2]))["results"]}
print(round(disk), round(loopback.get(1, 0)), round(loopback.get(4, 0)))' "$OUT/disk.json" "$OUT/loopback.json")
echo "   disk 1 MiB write+fdatasync $DISK_MB MB/s; loopback TCP $LOOPBACK_1_MB MB/s (1 connection), $LOOPBACK_4_MB MB/s (4)"
CEILINGS=(--ceiling "disk: 1 MiB write+fdatasync=$DISK_MB" --ceiling "loopback TCP, 1 connection=$LOOPBACK_1_MB"
  --ceiling "loopback TCP, 4 connections=$LOOPBACK_4_MB")
# The same ceilings in 1 KiB messages per second, for the charts of 1 KiB workloads.
CEILINGS_1KIB=(--ceiling "disk ceiling in 1 KiB msgs=$((DISK_MB * 1000000 / 1024))"
  --ceiling "loopback ceiling (1 connection) in 1 KiB msgs=$((LOOPBACK_1_MB * 1000000 / 1024))")

if [ "$DRAW" != 1 ]; then
echo "== message size (4 publishers, batches of up to 1000 or 4 MiB)"
for size in $SIZES; do
  batch=$(( (4 << 20) / size )); [ "$batch" -gt 1000 ] && batch=1000; [ "$batch" -lt 1 ] && batch=1
  messages=$(( SIZE_BYTES / size )); [ "$messages" -gt 2000000 ] && messages=2000000
  [ "$messages" -lt 500 ] && messages=500
  point "size_$size" --embedded publish --size "$size" --messages "$messages" \
    --publishers 4 --batch "$batch" --inflight 4
done

echo "== publishers (1 KiB, batches of 100, 8 in flight each)"
for publishers in $PUBLISHERS; do
  point "publishers_$publishers" --embedded publish --size 1024 \
    --messages "$PUBLISHER_MESSAGES" --publishers "$publishers" --batch 100 --inflight 8
done

echo "== topics (one subscription each, requests of 10 messages)"
for topics in $TOPICS; do
  point "topics_$topics" --embedded topics --topics "$topics" \
    --messages "$TOPIC_MESSAGES" --publishers 4
done

echo "== subscriptions (one topic, each subscription receives every message)"
for subscriptions in $SUBSCRIPTIONS; do
  messages=$(( DELIVERIES / subscriptions )); [ "$messages" -gt 200000 ] && messages=200000
  point "subscriptions_$subscriptions" --embedded fanout \
    --subscriptions "$subscriptions" --messages "$messages" --publishers 4
done

echo "== resident memory: idle topics (standalone ringpostd)"
for topics in $IDLE_TOPICS; do
  standalone_point "idle_topics_$topics" topics --topics "$topics" --messages 1000 --settle-seconds 15
done

echo "== resident memory: stored backlog (standalone ringpostd, batches of 100)"
for messages in $BACKLOGS; do
  standalone_point "backlog_$messages" backlog --messages "$messages" --publishers 4 --batch 100
done
fi

echo "== charts and tables"
chart() { # name, title, x key, x label, y label, y keys (key=Name;...), prefix, extra flags...
  local name=$1 title=$2 x=$3 x_label=$4 y_label=$5 ys=$6 prefix=$7; shift 7
  local files=("$OUT"/"$prefix"_*.json) y_flags=()
  IFS=";" read -r -a y_list <<<"$ys"
  for y in "${y_list[@]}"; do y_flags+=(--y "$y"); done
  if [ ! -e "${files[0]}" ]; then
    echo "### $title" >>"$OUT/curves.md"; echo >>"$OUT/curves.md"; echo "no points (every run failed)" >>"$OUT/curves.md"
    return
  fi
  {
    echo "### $title"
    echo
    echo "![$title]($name.svg)"
    echo
    "$BIN" curve --title "$title" --x "$x" --x-label "$x_label" --y-label "$y_label" "${y_flags[@]}" \
      --svg "$OUT/$name.svg" "$@" "${files[@]}"
    echo
  } >>"$OUT/curves.md"
}
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, kernel $(uname -r)," \
    "disk $(df -h --output=source,fstype,size "$DATA_PARENT" | tail -n 1 | tr -s ' '), QUICK=$QUICK."
  echo "Ceilings in the same run: disk 1 MiB O_DIRECT write+fdatasync $DISK_MB MB/s;" \
    "loopback TCP (1 MiB writes) $LOOPBACK_1_MB MB/s on 1 connection, $LOOPBACK_4_MB MB/s on 4."
  echo
} >"$OUT/curves.md"
chart size_mb "Publish MB/s versus message size (durable acks, 4 publishers)" size "message size (bytes)" \
  "MB/s" "mb_per_sec=Ringpost MB/s" size --x-log --y-log "${CEILINGS[@]}"
chart size_msgs "Publish msgs/s and ack p99 versus message size" size "message size (bytes)" \
  "msgs/s; µs" "msgs_per_sec=msgs/s;publish_ack_us.p99=ack p99 per request (µs)" size --x-log --y-log
chart publishers "Publish msgs/s and ack p99 versus publishers (1 KiB, batches of 100)" publishers \
  "publishers" "msgs/s; µs" "msgs_per_sec=msgs/s;publish_ack_us.p99=ack p99 per request (µs)" publishers \
  --x-log --y-log "${CEILINGS_1KIB[@]}"
chart topics "Published msgs/s and e2e p99 versus topics (1 KiB, requests of 10)" topics "topics" \
  "msgs/s; µs" "msgs_per_sec=published msgs/s;e2e_us.p99=e2e p99 (µs)" topics --x-log --y-log \
  "${CEILINGS_1KIB[@]}"
chart subscriptions "Deliveries/s and e2e p99 versus subscriptions (fan-out, 1 KiB)" subscriptions \
  "subscriptions" "deliveries/s; µs" "deliveries_per_sec=deliveries/s;e2e_us.p99=e2e p99 (µs)" \
  subscriptions --x-log --y-log "${CEILINGS_1KIB[@]}"
chart idle_topics "Resident memory versus idle topics (standalone ringpostd)" topics "idle topics" \
  "bytes" "resident_idle_bytes=resident bytes;resident_before_bytes=resident bytes, no topics" idle_topics \
  --x-log
chart backlog "Resident memory versus stored backlog (standalone ringpostd, 1 KiB)" messages \
  "messages stored" "bytes" "resident_stored_bytes=resident bytes with the backlog stored" backlog --x-log
echo "results in $OUT; charts and tables in $OUT/curves.md"
