"""Google's own Python client (google-cloud-pubsub) against Ringpost: publish throughput with the
client's default batching, then streaming-pull-and-ack throughput, and the CPU each side used,
to show which of them bounds the figures.

    bash tests/python/setup.sh
    tests/python/.venv/bin/python benches/python_client.py [--messages 20000] [--bytes 1024]

It starts its own ringpostd (RINGPOSTD, else target/release/ringpostd, else target/debug/)
on free ports with a scratch data directory under /var/tmp, and removes it afterwards.
CPU% is CPU time over wall time during each phase: 100% is one core busy. The python
figure counts every thread of this process (the client's batching, gRPC and callback
threads), the daemon's every thread of ringpostd.
"""

import argparse
import importlib.metadata
import os
import pathlib
import sys
import threading
import time
from concurrent import futures

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "tests" / "python"))

from ringpost_daemon import Daemon, cpu_seconds  # noqa: E402

MESSAGES_DEFAULT = 20_000
MESSAGE_BYTES_DEFAULT = 1024
# Bounds each phase, so that a daemon that stops answering ends the run instead of hanging it.
PHASE_TIMEOUT_SECONDS = 600


def choose_binary():
    if "RINGPOSTD" not in os.environ:
        release = REPOSITORY / "target" / "release" / "ringpostd"
        if release.exists():
            os.environ["RINGPOSTD"] = str(release)
    return os.environ.get("RINGPOSTD", str(REPOSITORY / "target" / "debug" / "ringpostd"))


class Phase:
    """Wall time and both processes' CPU time across one phase."""

    def __init__(self, daemon_pid):
        self.daemon_pid = daemon_pid

    def __enter__(self):
        self.started = time.monotonic()
        self.python_cpu = cpu_seconds(os.getpid())
        self.daemon_cpu = cpu_seconds(self.daemon_pid)
        return self

    def __exit__(self, *exception):
        self.seconds = time.monotonic() - self.started
        self.python_percent = 100 * (cpu_seconds(os.getpid()) - self.python_cpu) / self.seconds
        self.daemon_percent = 100 * (cpu_seconds(self.daemon_pid) - self.daemon_cpu) / self.seconds
        return False


def publish(publisher, topic, payloads):
    """Publishes every payload with the client's default batching; returns when all resolved."""
    pending = [publisher.publish(topic, payload) for payload in payloads]
    for future in pending:
        future.result(timeout=PHASE_TIMEOUT_SECONDS)


def consume(subscriber, subscription, count):
    """Streams from `subscription`, acknowledging each message, until `count` distinct ones came."""
    seen = set()
    lock = threading.Lock()
    done = threading.Event()

    def callback(message):
        message.ack()
        with lock:
            seen.add(message.message_id)
            if len(seen) >= count:
                done.set()

    future = subscriber.subscribe(subscription, callback)
    try:
        if not done.wait(PHASE_TIMEOUT_SECONDS):
            raise RuntimeError(f"received {len(seen)} of {count} messages in {PHASE_TIMEOUT_SECONDS} s")
    finally:
        future.cancel()
        try:
            future.result(timeout=30)
        except futures.CancelledError:
            pass


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=MESSAGES_DEFAULT)
    parser.add_argument("--bytes", type=int, default=MESSAGE_BYTES_DEFAULT)
    arguments = parser.parse_args()
    binary = choose_binary()
    daemon = Daemon("bench").start()
    os.environ["PUBSUB_EMULATOR_HOST"] = daemon.grpc_address
    # Imported once the variable is set, as a program would be run with it.
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    topic = "projects/bench/topics/python-client"
    subscription = "projects/bench/subscriptions/python-client"
    try:
        publisher.create_topic(request={"name": topic})
        subscriber.create_subscription(request={"name": subscription, "topic": topic, "ack_deadline_seconds": 60})
        payloads = [index.to_bytes(8, "big") + bytes(arguments.bytes - 8) for index in range(arguments.messages)]
        with Phase(daemon.pid) as publishing:
            publish(publisher, topic, payloads)
        with Phase(daemon.pid) as subscribing:
            consume(subscriber, subscription, arguments.messages)
    finally:
        publisher.stop()
        subscriber.close()
        daemon.remove()
    print(f"ringpostd: {binary}")
    print(f"{arguments.messages} messages of {arguments.bytes} bytes, google-cloud-pubsub {importlib.metadata.version('google-cloud-pubsub')}")
    print(f"{'phase':<22}{'msgs/s':>10}{'seconds':>9}{'python CPU%':>13}{'ringpostd CPU%':>16}")
    for name, phase in (("publish (batched)", publishing), ("streaming pull + ack", subscribing)):
        rate = arguments.messages / phase.seconds
        print(f"{name:<22}{rate:>10,.0f}{phase.seconds:>9.2f}{phase.python_percent:>13.0f}{phase.daemon_percent:>16.0f}")


if __name__ == "__main__":
    main()
