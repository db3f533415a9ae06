"""A topic's publish limit met through Google's own publisher: a burst of ten times the limit,
sent in small requests, is slowed and refused by the daemon (RESOURCE_EXHAUSTED with a
RetryInfo), and the client's default retry for Publish brings every message in, each stored
once.

What the client does at the limit (google-cloud-pubsub 2.44, google-api-core 2.44): its default
retry for Publish covers RESOURCE_EXHAUSTED and backs off exponentially with full jitter (a
sleep drawn from 0 to 0.1 s, then 0 to 0.4 s, times 4 each try up to 60 s), for 600 s in all,
each attempt with a 60 s timeout; it does not read the RetryInfo. The daemon holds a publish up
to 5 s (PUBLISH_HOLD_MAX) before refusing it, so every attempt ends well within that timeout,
and the burst resolves without error at about the topic's rate (measured: 9.0 s in four runs
of seven, at most 22.9 s, with about 80 refusals of its 50 requests; 24 to 50 s in four runs,
with about 175 refusals, when the hold was 1 s, each refusal meeting more of the client's
growing backoff)."""

import os
import socket
import time
import urllib.request

from google.cloud import pubsub_v1

from helpers import create_subscription, create_topic, pull_nothing, pull_until
from ringpost_daemon import Daemon

# The topic's publish limit in messages a second, and the burst sent at once: ten times it.
LIMIT_MESSAGES_PER_SECOND = 50
BURST_MESSAGES = 10 * LIMIT_MESSAGES_PER_SECOND
# Messages in one Publish request: small requests, so that the burst is many requests, some
# admitted, some held and some refused at any moment.
BATCH_MESSAGES = 10
# How long the burst's futures may take: the rate needs about 9 s for it, the client's jittered
# backoff may add to the last retries (a sleep up to 25.6 s on the fifth), and the daemon is a
# debug build on a loaded machine. A frozen or refusing daemon ends it with a failed future.
BURST_SECONDS_MAX = 120
# The bucket takes a second's worth at once; the rest of the burst comes at the rate, so the
# burst cannot resolve sooner than this (a margin below the exact figure for the clock).
BURST_SECONDS_MIN = 0.8 * (BURST_MESSAGES - LIMIT_MESSAGES_PER_SECOND) / LIMIT_MESSAGES_PER_SECOND


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def metric_sum(monitoring, name, **labels):
    """The sum over every shard of `name` (with `labels`, when given) in the daemon's /metrics."""
    with urllib.request.urlopen(f"http://{monitoring}/metrics", timeout=10) as response:
        body = response.read().decode()
    total = 0.0
    for line in body.splitlines():
        if not line.startswith(name + "{"):
            continue
        series, value = line.rsplit(" ", 1)
        if all(f'{key}="{wanted}"' in series for key, wanted in labels.items()):
            total += float(value)
    return total


def test_a_burst_of_ten_times_the_publish_limit_is_slowed_retried_and_delivered_once(names):
    monitoring = f"127.0.0.1:{free_port()}"
    daemon = Daemon(
        "flow",
        extra_args=["--publish-messages-per-second-topic-max", str(LIMIT_MESSAGES_PER_SECOND)],
        http_listen=monitoring,
    ).start()
    saved = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = daemon.grpc_address
    publisher = subscriber = None
    try:
        # Nothing but the batch size is set: the publisher's default retry is what is checked.
        publisher = pubsub_v1.PublisherClient(batch_settings=pubsub_v1.types.BatchSettings(max_messages=BATCH_MESSAGES))
        subscriber = pubsub_v1.SubscriberClient()
        topic, subscription = names.topic(), names.subscription()
        create_topic(publisher, topic)
        create_subscription(subscriber, subscription, topic)

        payloads = [f"burst-{index:04}".encode() for index in range(BURST_MESSAGES)]
        started = time.monotonic()
        pending = [publisher.publish(topic, payload) for payload in payloads]
        failed = []
        message_ids = []
        for payload, future in zip(payloads, pending):
            try:
                message_ids.append(future.result(timeout=BURST_SECONDS_MAX))
            except Exception as error:  # noqa: BLE001 - every failure is reported together
                failed.append((payload, error))
        elapsed = time.monotonic() - started
        refused = metric_sum(monitoring, "ringpost_publishes_refused_by_limit_total", limit="messages_rate")
        slowed = metric_sum(monitoring, "ringpost_publishes_slowed_total")
        print(f"\n{BURST_MESSAGES} messages at {LIMIT_MESSAGES_PER_SECOND}/s in requests of {BATCH_MESSAGES}: "
              f"resolved in {elapsed:.1f} s, {slowed:.0f} requests slowed, {refused:.0f} refused")

        assert not failed, f"{len(failed)} of {BURST_MESSAGES} publishes failed, e.g. {failed[0]!r}"
        assert len(set(message_ids)) == BURST_MESSAGES, "a message id given twice"
        # The limit was met: requests were held and refused, and the burst took the rate's time.
        assert slowed >= 1, "no publish was slowed: the topic's limit was not applied"
        assert refused >= 1, "no publish was refused: the burst never went past the 5 s hold"
        assert elapsed >= BURST_SECONDS_MIN, f"the burst resolved in {elapsed:.1f} s, faster than the limit allows"

        # Every acknowledged message is stored once: pulled back, no payload twice, none more.
        received = pull_until(subscriber, subscription, BURST_MESSAGES, timeout=BURST_SECONDS_MAX)
        data = [item.message.data for item in received]
        assert sorted(data) == payloads, "the pulled messages are not the burst, each once"
        assert sorted(item.message.message_id for item in received) == sorted(message_ids)
        pull_nothing(subscriber, subscription, seconds=1)
    finally:
        if saved is None:
            del os.environ["PUBSUB_EMULATOR_HOST"]
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = saved
        if publisher is not None:
            publisher.stop()
        if subscriber is not None:
            subscriber.close()
        daemon.remove()
