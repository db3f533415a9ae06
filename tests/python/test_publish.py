"""Publishing through Google's client: its batching, attributes, a backlog too big for one
stream response, and ordering keys delivered in order on an ordered subscription."""

import collections
import datetime

from google.cloud import pubsub_v1
from google.cloud.pubsub_v1 import types

from helpers import Receiver, create_subscription, create_topic, publish_all, pull_until

BATCHED_MESSAGES = 300
ORDERING_KEYS = ("alpha", "beta", "gamma")
MESSAGES_PER_KEY = 60
# Three of these (9 MiB) take at least three of the server's stream responses, each under the
# 4 MiB that a client made through PUBSUB_EMULATOR_HOST accepts: with the emulator's host the
# Python client opens a plain channel with gRPC's default receive limit, so a single message
# above about 4 MiB could not reach it through any server.
LARGE_MESSAGE_BYTES = 3 * 1024 * 1024
LARGE_MESSAGES = 3


def test_batched_publish_with_attributes(daemon, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    # Batches of 25 or whatever gathers in 50 ms: many publishes ride each Publish call.
    batching = types.BatchSettings(max_messages=25, max_latency=0.05)
    publisher = pubsub_v1.PublisherClient(batch_settings=batching)
    try:
        create_topic(publisher, topic)
        create_subscription(subscriber, subscription, topic)
        before = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=5)
        pending = [
            publisher.publish(topic, f"m-{index}".encode(), index=str(index), parity=str(index % 2))
            for index in range(BATCHED_MESSAGES)
        ]
        message_ids = [future.result(timeout=30) for future in pending]
    finally:
        publisher.stop()
    assert len(set(message_ids)) == BATCHED_MESSAGES, "message ids are not unique"
    assert all(message_id.isdigit() for message_id in message_ids), message_ids[:5]

    received = pull_until(subscriber, subscription, BATCHED_MESSAGES)
    by_data = {item.message.data: item.message for item in received}
    assert set(by_data) == {f"m-{index}".encode() for index in range(BATCHED_MESSAGES)}
    for index, message_id in enumerate(message_ids):
        message = by_data[f"m-{index}".encode()]
        assert message.message_id == message_id
        assert dict(message.attributes) == {"index": str(index), "parity": str(index % 2)}
        assert message.publish_time >= before


def test_a_backlog_larger_than_one_response_streams(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    create_subscription(subscriber, subscription, topic)
    large = [bytes([index]) * LARGE_MESSAGE_BYTES for index in range(LARGE_MESSAGES)]
    payloads = [b"small-before", *large, b"small-after"]
    publish_all(publisher, topic, payloads)
    with Receiver(subscriber, subscription) as receiver:
        receiver.wait_for_data(payloads)


def test_ordering_keys_are_delivered_in_order(subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    publisher = pubsub_v1.PublisherClient(
        publisher_options=types.PublisherOptions(enable_message_ordering=True),
        batch_settings=types.BatchSettings(max_messages=10, max_latency=0.01),
    )
    try:
        create_topic(publisher, topic)
        create_subscription(subscriber, subscription, topic, enable_message_ordering=True)
        assert subscriber.get_subscription(request={"subscription": subscription}).enable_message_ordering
        pending = [
            publisher.publish(topic, f"{key}-{sequence}".encode(), ordering_key=key)
            for sequence in range(MESSAGES_PER_KEY)
            for key in ORDERING_KEYS
        ]
        for future in pending:
            future.result(timeout=30)
    finally:
        publisher.stop()

    expected = {f"{key}-{sequence}".encode() for key in ORDERING_KEYS for sequence in range(MESSAGES_PER_KEY)}
    with Receiver(subscriber, subscription) as receiver:
        receiver.wait_for_data(expected)
    sequences = collections.defaultdict(list)
    for message in receiver.snapshot():
        key, sequence = message.data.decode().rsplit("-", 1)
        assert message.ordering_key == key
        sequences[key].append(int(sequence))
    for key in ORDERING_KEYS:
        # A redelivery may repeat a key's messages from some point on, but never goes backwards
        # past one not yet delivered: the first deliveries are in publish order.
        first_seen = list(dict.fromkeys(sequences[key]))
        assert first_seen == list(range(MESSAGES_PER_KEY)), f"key {key} arrived as {sequences[key]}"
