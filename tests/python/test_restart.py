"""The daemon is SIGKILLed and started again, on the same gRPC port and data directory, while
Google's client publishes and a streaming subscriber runs: the clients reconnect by themselves,
and every message whose publish future resolved is delivered."""

import threading
import time

from google.cloud import pubsub_v1
from google.cloud.pubsub_v1 import types

from helpers import Receiver, create_subscription, create_topic
from ringpost_daemon import Daemon

# Deliveries before the kill, and after the restart, that show the stream flowing each time.
DELIVERIES_BEFORE_KILL = 200
DELIVERIES_AFTER_RESTART = 200
# How long the daemon stays down: long enough that the clients see it gone.
DOWN_SECONDS = 1.0
PUBLISH_PAUSE_SECONDS = 0.005
# Publishes in flight at the kill retry until the daemon is back; this bounds the wait for them.
PUBLISH_RESOLVE_SECONDS = 90
DELIVERY_WAIT_SECONDS = 90


class PublishLoop:
    """Publishes numbered messages from a thread of its own until stopped, keeping every future."""

    def __init__(self, publisher, topic):
        self.publisher, self.topic = publisher, topic
        self.futures = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="publish-loop", daemon=True)

    def _run(self):
        index = 0
        while not self.stopping.is_set():
            data = f"m-{index}".encode()
            self.futures[data] = self.publisher.publish(self.topic, data)
            index += 1
            time.sleep(PUBLISH_PAUSE_SECONDS)

    def stop(self):
        self.stopping.set()
        self.thread.join()

    def resolved(self):
        """The payloads whose publish succeeded, after waiting for those still pending."""
        deadline = time.monotonic() + PUBLISH_RESOLVE_SECONDS
        resolved, failed = set(), []
        for data, future in list(self.futures.items()):
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
                resolved.add(data)
            except Exception as error:  # noqa: BLE001 - a failed publish owes no delivery
                failed.append((data, error))
        return resolved, failed


def test_subscriber_survives_sigkill_and_restart(monkeypatch, names):
    daemon = Daemon("restart").start()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", daemon.grpc_address)
    publisher = pubsub_v1.PublisherClient(batch_settings=types.BatchSettings(max_messages=20, max_latency=0.01))
    subscriber = pubsub_v1.SubscriberClient()
    passed = False
    try:
        topic, subscription = names.topic(), names.subscription()
        create_topic(publisher, topic)
        create_subscription(subscriber, subscription, topic)
        loop = PublishLoop(publisher, topic)
        with Receiver(subscriber, subscription) as receiver:
            loop.thread.start()
            receiver.wait_for(lambda: len(receiver.snapshot()) >= DELIVERIES_BEFORE_KILL, "deliveries before the kill")

            daemon.kill()
            time.sleep(DOWN_SECONDS)
            daemon.start()
            restarted_at = len(receiver.snapshot())
            receiver.wait_for(
                lambda: len(receiver.snapshot()) >= restarted_at + DELIVERIES_AFTER_RESTART,
                "deliveries after the restart (the streaming pull did not come back)",
                timeout=DELIVERY_WAIT_SECONDS,
            )
            loop.stop()
            resolved, failed = loop.resolved()
            assert resolved, f"no publish resolved; failures: {failed[:3]}"
            receiver.wait_for_data(resolved, timeout=DELIVERY_WAIT_SECONDS)
        print(f"\n{len(resolved)} publishes resolved, {len(failed)} failed, {len(receiver.snapshot())} deliveries")
        passed = True
    finally:
        publisher.stop()
        subscriber.close()
        if not passed:
            daemon.stop()
            print(f"\nringpostd's directory (kept): {daemon.directory}\n{daemon.log_tail()}")
        else:
            daemon.remove()
