"""Seek through Google's client: to a time (back, to replay acknowledged messages kept by
retain_acked_messages; forward, to skip everything) and to a snapshot."""

import datetime
import time

from google.protobuf import timestamp_pb2

from helpers import create_subscription, create_topic, publish_all, pull_nothing, pull_until

# Between two batches, so that the second's first publish time is after the first's last.
BATCH_GAP_SECONDS = 0.05


def timestamp(moment):
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(moment)
    return value


def data_of(received):
    return sorted(item.message.data for item in received)


def test_seek_to_time(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    create_subscription(subscriber, subscription, topic, retain_acked_messages=True)
    first = [b"a-0", b"a-1", b"a-2"]
    second = [b"b-0", b"b-1", b"b-2"]

    publish_all(publisher, topic, first)
    received_first = pull_until(subscriber, subscription, len(first))
    time.sleep(BATCH_GAP_SECONDS)
    publish_all(publisher, topic, second)
    received_second = pull_until(subscriber, subscription, len(second))
    assert data_of(received_first) == first
    assert data_of(received_second) == second
    pull_nothing(subscriber, subscription, seconds=1)

    # Back to the second batch's first publish: it comes again, the first batch does not.
    second_start = min(item.message.publish_time for item in received_second)
    subscriber.seek(request={"subscription": subscription, "time": timestamp(second_start)})
    assert data_of(pull_until(subscriber, subscription, len(second))) == second
    pull_nothing(subscriber, subscription, seconds=1)

    # Back to before everything: all of it again.
    first_start = min(item.message.publish_time for item in received_first)
    subscriber.seek(request={"subscription": subscription, "time": timestamp(first_start)})
    assert data_of(pull_until(subscriber, subscription, len(first + second))) == sorted(first + second)

    # Forward past everything, with messages unacknowledged: they are all acknowledged.
    publish_all(publisher, topic, [b"c-0"])
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    subscriber.seek(request={"subscription": subscription, "time": timestamp(future)})
    pull_nothing(subscriber, subscription)


def test_seek_to_snapshot(publisher, subscriber, names):
    topic, subscription, snapshot = names.topic(), names.subscription(), names.snapshot()
    create_topic(publisher, topic)
    create_subscription(subscriber, subscription, topic)

    publish_all(publisher, topic, [b"acked-before"])
    pull_until(subscriber, subscription, 1)
    publish_all(publisher, topic, [b"unacked-before"])
    # The snapshot keeps what the subscription had not acknowledged, and all that comes after.
    subscriber.create_snapshot(request={"name": snapshot, "subscription": subscription})
    publish_all(publisher, topic, [b"after"])
    assert data_of(pull_until(subscriber, subscription, 2)) == [b"after", b"unacked-before"]
    pull_nothing(subscriber, subscription, seconds=1)

    subscriber.seek(request={"subscription": subscription, "snapshot": snapshot})
    assert data_of(pull_until(subscriber, subscription, 2)) == [b"after", b"unacked-before"]
    pull_nothing(subscriber, subscription, seconds=1)
