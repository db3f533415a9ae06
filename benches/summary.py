#!/usr/bin/env python3
"""Prints the side-by-side table of benches/run.sh from the files it left in one directory.

Usage: summary.py OUT

OUT holds one ringpost-bench --json file per Ringpost workload (<label>.json), nats/results.txt
with the RESULT lines of the NATS runner (NATS_RUN in run.sh), and disk.json, disk_fresh.json and
disk_read.json from `ringpost-bench disk` (over written blocks, into fallocated space, reads).
A workload that failed or was not run shows a dash; the table is still printed.
"""
import json
import os
import re
import sys

# (row title, Ringpost label, how to read Ringpost, NATS label, how to read NATS)
# Each "how" is (throughput key, p99 key): dotted paths into the JSON, or RESULT keys.
ROWS = [
    ("W1 publish 1 KiB x4, batches of 1000 (ack p99 per request)",
     "W1_batch1000", ("msgs_per_sec", "publish_ack_us.p99"),
     "W1_pub_K64", ("pub_msgs_s", "ack_p99_us")),
    ("W1 publish 1 KiB x4, 1 message per request, 64 in flight",
     "W1_batch1_K64", ("msgs_per_sec", "publish_ack_us.p99"),
     "W1_pub_K64", ("pub_msgs_s", "ack_p99_us")),
    ("W2 end to end, closed loop (delivered/s, e2e p99)",
     "W2_e2e", ("deliveries_per_sec", "e2e_us.p99"),
     "W2_e2e_K64_max", ("deliver_msgs_s", "e2e_p99_us")),
    ("W2 end to end, open loop 10,000 msg/s (delivered/s, e2e p99)",
     "W2_e2e_rate10k", ("deliveries_per_sec", "e2e_us.p99"),
     "W2_e2e_rate10k", ("deliver_msgs_s", "e2e_p99_us")),
    ("W3 fan-out to 10 subscriptions (deliveries/s, e2e p99)",
     "W3_fanout10", ("deliveries_per_sec", "e2e_us.p99"),
     "W3_fanout10_K64_max", ("deliver_msgs_s", "e2e_p99_us")),
    ("W4 {topics} topics, one subscription each (published/s, e2e p99)",
     "W4_topics", ("msgs_per_sec", "e2e_us.p99"),
     None, None),
    ("W4's requests on {topics} topics (published/s, e2e p99)",
     "W4_shape_2topics", ("msgs_per_sec", "e2e_us.p99"),
     None, None),
    ("W5 backlog drain, one subscription (drained/s)",
     "W5_backlog", ("deliveries_per_sec", None),
     "W5_replay", ("deliver_msgs_s", None)),
    ("W2 pushed to a receiver answering 204 (delivered/s, e2e p99)",
     "W2_push", ("deliveries_per_sec", "e2e_us.p99"),
     None, None),
]


def dig(document, path):
    for key in path.split("."):
        if not isinstance(document, dict) or key not in document:
            return None
        document = document[key]
    return document if isinstance(document, (int, float)) else None


def load_ringpost(out, label):
    try:
        with open(os.path.join(out, label + ".json")) as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def load_nats(out):
    results = {}
    try:
        with open(os.path.join(out, "nats", "results.txt")) as file:
            for line in file:
                if line.startswith("RESULT "):
                    fields = dict(re.findall(r"(\S+?)=(\S+)", line))
                    results[fields.get("label", "?")] = fields
    except OSError:
        pass
    return results


def number(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value == value else None  # NaN is "not measured"


def show(value, unit=""):
    return "-" if value is None else f"{value:,.0f}{unit}"


def main():
    out = sys.argv[1]
    nats = load_nats(out)
    lines = [
        "| workload | Ringpost msgs/s | NATS msgs/s | ratio | Ringpost p99 | NATS p99 |",
        "|---|---|---|---|---|---|",
    ]
    lost = duplicates = 0
    checked = []
    for title, label, (rate_key, p99_key), nats_label, nats_keys in ROWS:
        run = load_ringpost(out, label)
        title = title.format(topics=f"{run['topics']:,}" if run and "topics" in run else "many")
        ours_rate = dig(run, rate_key) if run else None
        ours_p99 = dig(run, p99_key) if run and p99_key else None
        theirs_rate = theirs_p99 = None
        if nats_label and nats_label in nats:
            theirs_rate = number(nats[nats_label].get(nats_keys[0]))
            if nats_keys[1]:
                theirs_p99 = number(nats[nats_label].get(nats_keys[1]))
        ratio = f"{ours_rate / theirs_rate:.2f}x" if ours_rate and theirs_rate else "-"
        if run is None:
            title += " (Ringpost run failed: see its log)"
        elif run.get("errors", 0) or run.get("lost", 0):
            title += f" (errors {run.get('errors', 0)}, lost {run.get('lost', 0)})"
        if run and "lost" in run:
            lost += run["lost"]
            duplicates += run.get("duplicates", 0)
            checked.append(label)
        lines.append(f"| {title} | {show(ours_rate)} | {show(theirs_rate)} | {ratio} | "
                     f"{show(ours_p99, ' µs')} | {show(theirs_p99, ' µs')} |")
    print("\n".join(lines))
    print()
    if checked:
        print(f"Ringpost deliveries checked against acknowledged ids ({', '.join(checked)}): "
              f"lost {lost:,}, duplicates {duplicates:,}.")
    push = load_ringpost(out, "W2_push")
    pulled = dig(push, "pull.deliveries_per_sec")
    if push and pulled and dig(push, "push_to_pull") is not None:
        print(f"Push against W2's streaming pull of as many messages, run just before it: "
              f"{push['deliveries_per_sec']:,.0f} against {pulled:,.0f} delivered/s, "
              f"push/pull {push['push_to_pull']:.2f} (the issue's goal: 0.50 or more).")
    w1 = dig(load_ringpost(out, "W1_batch1000"), "msgs_per_sec")
    w4 = dig(load_ringpost(out, "W4_topics"), "msgs_per_sec")
    shape_run = load_ringpost(out, "W4_shape_2topics")
    shape = dig(shape_run, "msgs_per_sec")
    if w1 and w4 and shape:
        shards = dig(shape_run, "forwarders")
        served = f", served by {shards:.0f} forwarder shard(s)" if shards else ""
        print(f"W4 against W1 (batches of 1000): {w4 / w1:.0%}; W4's requests on {shape_run['topics']} topics "
              f"(one message log and one journal per topic{served}, as if the topics shared their logs): "
              f"{shape / w1:.0%}.")
    memory = sorted((run["topics"], run) for run in (
        load_ringpost(out, name[:-len(".json")]) for name in os.listdir(out)
        if name.startswith("W4_memory_") and name.endswith(".json")) if run and run.get("resident_idle_bytes"))
    if memory:
        mib = lambda bytes: f"{bytes / (1024 * 1024):,.1f} MiB"
        cells = [f"{topics:,} topics {mib(run['resident_idle_bytes'])} (empty {mib(run['resident_before_bytes'])})"
                 for topics, run in memory]
        line = "W4 resident memory, standalone ringpostd, idle topics with one subscription each: " + "; ".join(cells)
        if len(memory) > 1:
            (few, first), (many, last) = memory[0], memory[-1]
            slope = (last["resident_idle_bytes"] - first["resident_idle_bytes"]) / (many - few)
            line += f". Each further idle topic: {slope:,.0f} B (slope from {few:,} to {many:,} topics)"
        print(line + ".")
    else:
        print("W4 resident memory: not measured (see W4_memory_*.log).")
    try:
        with open(os.path.join(out, "disk.json")) as file:
            disk = json.load(file)["results"]
        cells = [f"{r['block_bytes'] // 1024:,} KiB {r['mb_per_sec']:,.0f} MB/s "
                 f"({r['writes_per_sec']:,.0f} syncs/s, fdatasync p99 {r['sync_p99_us']:,} µs)" for r in disk]
        print("Disk ceiling (O_DIRECT write + fdatasync, one at a time): " + "; ".join(cells) + ".")
    except (OSError, ValueError, KeyError, TypeError):
        disk = None
        print("Disk ceiling: not measured (see disk.log).")
    try:
        with open(os.path.join(out, "disk_fresh.json")) as file:
            fresh = json.load(file)["results"][0]
        print(f"Into fallocated space, each block once, as a growing log writes: "
              f"{fresh['block_bytes'] // 1024:,} KiB {fresh['mb_per_sec']:,.0f} MB/s "
              f"(fdatasync p99 {fresh['sync_p99_us']:,} µs).")
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        fresh = None
        print("Into fallocated space: not measured (see disk_fresh.log).")
    w1_mb = dig(load_ringpost(out, "W1_batch1000"), "mb_per_sec")
    largest = max(disk, key=lambda r: r["block_bytes"]) if disk else None
    if w1_mb and largest and fresh:
        print(f"W1 (batches of 1000) carried {w1_mb:,.0f} MB/s of payloads: {w1_mb / largest['mb_per_sec']:.0%} of the "
              f"{largest['block_bytes'] // 1024:,} KiB ceiling over written blocks, "
              f"{w1_mb / fresh['mb_per_sec']:.0%} of the one into fallocated space.")
    try:
        with open(os.path.join(out, "disk_read.json")) as file:
            reads = json.load(file)["results"]
        best = max(reads, key=lambda r: r["mb_per_sec"])
        cells = [f"{r['block_bytes'] // 1024:,} KiB {r['mb_per_sec']:,.0f} MB/s (p99 {r['read_p99_us']:,} µs)"
                 for r in reads]
        in_flight = reads[0].get("in_flight", 1)
        print(f"Disk read ceiling (sequential O_DIRECT reads of written blocks, {in_flight} at a time): "
              + "; ".join(cells) + ".")
        w5 = load_ringpost(out, "W5_backlog")
        drained, size = dig(w5, "deliveries_per_sec"), dig(w5, "size")
        if drained and size:
            # A record on disk: its 32-byte header and the payload, 8-byte aligned (record.rs);
            # the bench's messages carry no attributes or ordering key.
            record_bytes = (32 + int(size) + 7) // 8 * 8
            drained_mb = drained * record_bytes / 1e6
            print(f"W5 drained {drained:,.0f} msg/s, {drained_mb:,.0f} MB/s of {record_bytes:,}-byte records, read "
                  f"back past the tail cache with O_DIRECT: {drained_mb / best['mb_per_sec']:.0%} of the read "
                  f"ceiling ({best['block_bytes'] // 1024:,} KiB reads). NATS writes and reads its files through "
                  f"the page cache.")
    except (OSError, ValueError, KeyError, TypeError):
        print("Disk read ceiling: not measured (see disk_read.log).")
    print("Durability differs: NATS 2.9 acknowledges a JetStream publish after write(), before fsync "
          "(it syncs on a timer), while Ringpost acknowledges only once durable "
          "(an O_DSYNC write, or fdatasync).")
    print("Ringpost's W1 ack p99 is per publish request (a batch of up to 1000), NATS's per message; "
          "W2/W3 throughput is messages delivered to subscribers per second (all subscriptions).")


if __name__ == "__main__":
    main()
