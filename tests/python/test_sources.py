"""A topic of two publish sources (one on each of the daemon's two shards) through Google's own
clients, which know nothing of sources: the publisher's requests spread over both (each
ordering key's to its key's source), and one streaming subscriber and unary pulls each receive
every message once, each key's in order."""

import collections
import subprocess

from google.cloud import pubsub_v1
from google.cloud.pubsub_v1 import types

from helpers import Receiver, create_subscription, pull_nothing, pull_until
from ringpost_daemon import binary_path

KEYS = [f"key-{index:02}" for index in range(20)]
PER_KEY = 20
UNORDERED = 200
# A message id's source is in the bits above its offset (MESSAGE_ID_OFFSET_BITS).
MESSAGE_ID_OFFSET_BITS = 52


def create_topic_of_sources(daemon, topic, sources):
    """Creates `topic` with `sources` publish sources through the CLI (the gRPC API has no
    field for them)."""
    ringpost = binary_path().with_name("ringpost")
    name = topic.rsplit("/", 1)[1]
    command = [str(ringpost), "--server", daemon.router_address, "topic", "create", name, "--sources", str(sources)]
    created = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, f"{command}: {created.stderr}"


def test_a_topic_of_two_sources_is_one_topic_to_googles_clients(daemon, subscriber, names):
    topic = names.topic()
    streamed, pulled = names.subscription("streamed"), names.subscription("pulled")
    create_topic_of_sources(daemon, topic, 2)
    create_subscription(subscriber, streamed, topic, enable_message_ordering=True)
    create_subscription(subscriber, pulled, topic)
    publisher = pubsub_v1.PublisherClient(
        publisher_options=types.PublisherOptions(enable_message_ordering=True),
        batch_settings=types.BatchSettings(max_messages=10, max_latency=0.01),
    )
    try:
        keyed = [
            (publisher.publish(topic, f"{key}-{sequence}".encode(), ordering_key=key), key)
            for sequence in range(PER_KEY)
            for key in KEYS
        ]
        plain = [publisher.publish(topic, f"plain-{index}".encode()) for index in range(UNORDERED)]
        key_sources = collections.defaultdict(set)
        for future, key in keyed:
            key_sources[key].add(int(future.result(timeout=60)) >> MESSAGE_ID_OFFSET_BITS)
        plain_sources = {int(future.result(timeout=60)) >> MESSAGE_ID_OFFSET_BITS for future in plain}
    finally:
        publisher.stop()
    assert all(len(sources) == 1 for sources in key_sources.values()), f"a key on two sources: {key_sources}"
    assert set().union(*key_sources.values()) == {0, 1}, "every key went to one source"
    assert plain_sources == {0, 1}, f"unordered publishes went to {plain_sources} only"

    expected = {f"{key}-{sequence}".encode() for key in KEYS for sequence in range(PER_KEY)}
    expected |= {f"plain-{index}".encode() for index in range(UNORDERED)}
    flow_control = types.FlowControl(max_messages=10)
    with Receiver(subscriber, streamed, flow_control=flow_control) as receiver:
        receiver.wait_for_data(expected, timeout=90)
    data = receiver.data()
    assert len(data) == len(expected), f"{len(data) - len(expected)} delivered twice"
    sequences = collections.defaultdict(list)
    for message in receiver.snapshot():
        if message.ordering_key:
            key, sequence = message.data.decode().rsplit("-", 1)
            assert message.ordering_key == key
            sequences[key].append(int(sequence))
    for key in KEYS:
        assert sequences[key] == list(range(PER_KEY)), f"key {key} arrived as {sequences[key]}"

    received = pull_until(subscriber, pulled, len(expected), timeout=90)
    assert sorted(message.message.data for message in received) == sorted(expected)
    pull_nothing(subscriber, pulled, seconds=1)
