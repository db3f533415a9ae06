"""Subscribing through Google's client: flow control, nacks and redelivery with delivery_attempt,
dead letters, filters, and the unary Pull with its ack deadline."""

import threading
import time

import pytest
from google.api_core import exceptions
from google.cloud.pubsub_v1 import types

from helpers import (
    Receiver,
    create_subscription,
    create_topic,
    publish_all,
    pull,
    pull_nothing,
    pull_until,
    wait_for,
)

FLOW_CONTROL_MESSAGES = 5
FLOW_CONTROLLED_TOTAL = 40
# Pub/Sub's smallest max_delivery_attempts: five deliveries, then the dead-letter topic.
MAX_DELIVERY_ATTEMPTS = 5
# Pub/Sub's smallest ack deadline.
ACK_DEADLINE_SECONDS = 10


def test_flow_control_bounds_outstanding_messages(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    create_subscription(subscriber, subscription, topic)
    payloads = [f"m-{index}".encode() for index in range(FLOW_CONTROLLED_TOTAL)]
    publish_all(publisher, topic, payloads)

    # The callback holds each message; the test acks them in rounds. With max_messages=5 the
    # client never has more than five unacked messages handed to callbacks.
    held = []
    lock = threading.Lock()

    def hold(message):
        with lock:
            held.append(message)

    def outstanding():
        with lock:
            return len(held)

    flow_control = types.FlowControl(max_messages=FLOW_CONTROL_MESSAGES)
    acked = set()
    with Receiver(subscriber, subscription, handle=hold, flow_control=flow_control) as receiver:
        while len(acked) < FLOW_CONTROLLED_TOTAL:
            receiver.wait_for(lambda: outstanding() > 0, f"a message after {len(acked)} acks")
            # Give the stream time to hand over more than it should, had it a mind to.
            time.sleep(0.3)
            with lock:
                batch, held[:] = list(held), []
            assert len(batch) <= FLOW_CONTROL_MESSAGES, f"{len(batch)} messages outstanding at once"
            for message in batch:
                acked.add(message.data)
                message.ack()
    assert acked == set(payloads)


def test_nack_redelivers_with_delivery_attempt(publisher, subscriber, names):
    topic, dead_letters, subscription = names.topic(), names.topic("dead"), names.subscription()
    create_topic(publisher, topic)
    create_topic(publisher, dead_letters)
    create_subscription(
        subscriber,
        subscription,
        topic,
        dead_letter_policy={"dead_letter_topic": dead_letters, "max_delivery_attempts": MAX_DELIVERY_ATTEMPTS},
    )
    publish_all(publisher, topic, [b"try-me"])

    def nack_twice(message):
        if message.delivery_attempt < 3:
            message.nack()
        else:
            message.ack()

    with Receiver(subscriber, subscription, handle=nack_twice) as receiver:
        receiver.wait_for(lambda: len(receiver.snapshot()) >= 3, "the third delivery")
        receiver.stays(lambda: len(receiver.snapshot()) == 3, 1.0, "the acked message was delivered again")
    attempts = [message.delivery_attempt for message in receiver.snapshot()]
    assert attempts == [1, 2, 3]
    assert len({message.message_id for message in receiver.snapshot()}) == 1


def test_delivery_attempt_is_absent_without_dead_letter_policy(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    create_subscription(subscriber, subscription, topic)
    publish_all(publisher, topic, [b"once"])

    deliveries = []

    def nack_first(message):
        deliveries.append(message)
        if len(deliveries) == 1:
            message.nack()
        else:
            message.ack()

    with Receiver(subscriber, subscription, handle=nack_first) as receiver:
        receiver.wait_for(lambda: len(receiver.snapshot()) >= 2, "the redelivery after a nack")
    assert [message.delivery_attempt for message in receiver.snapshot()[:2]] == [None, None]


def test_dead_letters(publisher, subscriber, names):
    topic, dead_letters = names.topic(), names.topic("dead")
    subscription, dead_subscription = names.subscription(), names.subscription("dead")
    create_topic(publisher, topic)
    create_topic(publisher, dead_letters)
    create_subscription(subscriber, dead_subscription, dead_letters)
    create_subscription(
        subscriber,
        subscription,
        topic,
        dead_letter_policy={"dead_letter_topic": dead_letters, "max_delivery_attempts": MAX_DELIVERY_ATTEMPTS},
    )
    [message_id] = publish_all(publisher, topic, [b"poison"], kind="poison")

    with Receiver(subscriber, subscription, handle=lambda message: message.nack()) as receiver:
        [dead] = pull_until(subscriber, dead_subscription, 1)
        receiver.stays(
            lambda: len(receiver.snapshot()) == MAX_DELIVERY_ATTEMPTS,
            1.0,
            "a dead-lettered message was delivered again on its subscription",
        )
    assert [message.delivery_attempt for message in receiver.snapshot()] == list(range(1, MAX_DELIVERY_ATTEMPTS + 1))
    assert dead.message.data == b"poison"
    attributes = dict(dead.message.attributes)
    assert attributes["kind"] == "poison"
    # Pub/Sub names the subscription by its id; its full name would do as well.
    assert attributes["CloudPubSubDeadLetterSourceSubscription"] in (subscription, subscription.rsplit("/", 1)[1])
    assert attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == str(MAX_DELIVERY_ATTEMPTS)
    assert attributes["CloudPubSubDeadLetterSourceMessageId"] == message_id


def test_filters(publisher, subscriber, names):
    topic = names.topic()
    red, not_blue = names.subscription("red"), names.subscription("not-blue")
    create_topic(publisher, topic)
    create_subscription(subscriber, red, topic, filter='attributes.color = "red"')
    create_subscription(subscriber, not_blue, topic, filter='NOT attributes.color = "blue" AND hasPrefix(attributes.shape, "sq")')
    assert subscriber.get_subscription(request={"subscription": red}).filter == 'attributes.color = "red"'
    publish_all(publisher, topic, [b"red-square"], color="red", shape="square")
    publish_all(publisher, topic, [b"blue-square"], color="blue", shape="square")
    publish_all(publisher, topic, [b"red-circle"], color="red", shape="circle")
    publish_all(publisher, topic, [b"plain-square"], shape="square")
    publish_all(publisher, topic, [b"last"], color="red", shape="squiggle")

    # Each subscription's last match comes last: once it arrived, nothing else is on its way.
    red_data = [item.message.data for item in pull_until(subscriber, red, 3)]
    assert sorted(red_data) == [b"last", b"red-circle", b"red-square"]
    pull_nothing(subscriber, red, seconds=1)
    not_blue_data = [item.message.data for item in pull_until(subscriber, not_blue, 3)]
    assert sorted(not_blue_data) == [b"last", b"plain-square", b"red-square"]
    pull_nothing(subscriber, not_blue, seconds=1)


def test_unary_pull_modack_and_deadline(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    create_subscription(subscriber, subscription, topic, ack_deadline_seconds=ACK_DEADLINE_SECONDS)
    [message_id] = publish_all(publisher, topic, [b"lease"])
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.pull(request={"subscription": subscription, "max_messages": 0}, timeout=5, retry=None)

    [first] = pull_until(subscriber, subscription, 1, acknowledge=False)
    assert first.message.message_id == message_id
    # A deadline of zero hands the message back at once.
    subscriber.modify_ack_deadline(request={"subscription": subscription, "ack_ids": [first.ack_id], "ack_deadline_seconds": 0})
    [second] = pull_until(subscriber, subscription, 1, acknowledge=False)
    assert second.message.message_id == message_id

    # Not acknowledged, the lease ends with the ack deadline and the message comes back.
    leased_at = time.monotonic()
    [third] = pull_until(subscriber, subscription, 1, acknowledge=False, timeout=ACK_DEADLINE_SECONDS + 30)
    assert third.message.message_id == message_id
    assert time.monotonic() - leased_at >= ACK_DEADLINE_SECONDS - 1, "redelivered before the ack deadline"
    subscriber.acknowledge(request={"subscription": subscription, "ack_ids": [third.ack_id]})
    # An ack id already used, or one the daemon never gave, is ignored as Pub/Sub ignores it.
    subscriber.acknowledge(request={"subscription": subscription, "ack_ids": [third.ack_id]})
    pull_nothing(subscriber, subscription)
