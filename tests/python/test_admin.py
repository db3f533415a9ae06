"""Administration through Google's client: topics, subscriptions and snapshots are created,
read, listed (across pages), updated and deleted, with Pub/Sub's error codes."""

import pytest
from google.api_core import exceptions
from google.protobuf import duration_pb2

from conftest import PROJECT
from helpers import create_subscription, create_topic, publish_all, pull_until


def test_topic_lifecycle(publisher, names):
    topic = names.topic()
    created = create_topic(
        publisher, topic, labels={"team": "storage"}, message_retention_duration=duration_pb2.Duration(seconds=3600)
    )
    assert created.name == topic
    assert dict(created.labels) == {"team": "storage"}

    fetched = publisher.get_topic(request={"topic": topic})
    assert fetched.name == topic
    assert dict(fetched.labels) == {"team": "storage"}
    assert fetched.message_retention_duration.total_seconds() == 3600

    with pytest.raises(exceptions.AlreadyExists):
        create_topic(publisher, topic)

    updated = publisher.update_topic(
        request={"topic": {"name": topic, "labels": {"team": "queues", "tier": "1"}}, "update_mask": {"paths": ["labels"]}}
    )
    assert dict(updated.labels) == {"team": "queues", "tier": "1"}
    assert dict(publisher.get_topic(request={"topic": topic}).labels) == {"team": "queues", "tier": "1"}

    publisher.delete_topic(request={"topic": topic})
    with pytest.raises(exceptions.NotFound):
        publisher.get_topic(request={"topic": topic})
    with pytest.raises(exceptions.NotFound):
        publisher.delete_topic(request={"topic": topic})


def test_list_topics_across_pages(publisher, names):
    topics = {names.topic(f"listed-{index}") for index in range(5)}
    for topic in topics:
        create_topic(publisher, topic)
    pager = publisher.list_topics(request={"project": names.project, "page_size": 2})
    listed = [topic.name for topic in pager]
    assert topics <= set(listed)
    assert len(listed) == len(set(listed)), "a topic was listed twice across pages"
    assert all(name.startswith(f"projects/{PROJECT}/topics/") for name in listed)


def test_unsupported_topic_fields_are_refused(publisher, names):
    with pytest.raises(exceptions.InvalidArgument):
        create_topic(publisher, names.topic(), kms_key_name="projects/p/locations/l/keyRings/r/cryptoKeys/k")
    with pytest.raises(exceptions.InvalidArgument):
        publisher.get_topic(request={"topic": "projects/test-project/topics/9-starts-with-a-digit"})
    with pytest.raises(exceptions.InvalidArgument):
        publisher.update_topic(request={"topic": {"name": names.topic()}, "update_mask": {"paths": []}})


def test_subscription_lifecycle(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    created = create_subscription(
        subscriber,
        subscription,
        topic,
        ack_deadline_seconds=20,
        retain_acked_messages=True,
        message_retention_duration=duration_pb2.Duration(seconds=7200),
        labels={"owner": "python"},
    )
    assert created.name == subscription
    assert created.topic == topic
    assert created.ack_deadline_seconds == 20

    fetched = subscriber.get_subscription(request={"subscription": subscription})
    assert fetched.topic == topic
    assert fetched.ack_deadline_seconds == 20
    assert fetched.retain_acked_messages
    assert fetched.message_retention_duration.total_seconds() == 7200
    assert dict(fetched.labels) == {"owner": "python"}

    with pytest.raises(exceptions.AlreadyExists):
        create_subscription(subscriber, subscription, topic)
    with pytest.raises(exceptions.NotFound):
        create_subscription(subscriber, names.subscription("orphan"), names.topic("missing"))

    updated = subscriber.update_subscription(
        request={
            "subscription": {"name": subscription, "ack_deadline_seconds": 30, "labels": {"owner": "rust"}},
            "update_mask": {"paths": ["ack_deadline_seconds", "labels"]},
        }
    )
    assert updated.ack_deadline_seconds == 30
    assert dict(updated.labels) == {"owner": "rust"}
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.update_subscription(
            request={"subscription": {"name": subscription, "filter": "attributes.a = \"b\""}, "update_mask": {"paths": ["filter"]}}
        )

    listed = [item.name for item in subscriber.list_subscriptions(request={"project": names.project, "page_size": 1})]
    assert subscription in listed
    of_topic = list(publisher.list_topic_subscriptions(request={"topic": topic}))
    assert of_topic == [subscription]

    subscriber.delete_subscription(request={"subscription": subscription})
    with pytest.raises(exceptions.NotFound):
        subscriber.get_subscription(request={"subscription": subscription})


def test_subscription_outlives_its_topic(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    create_subscription(subscriber, subscription, topic)
    publisher.delete_topic(request={"topic": topic})
    assert subscriber.get_subscription(request={"subscription": subscription}).topic == "_deleted-topic_"


def test_unsupported_subscription_fields_are_refused(publisher, subscriber, names):
    topic = names.topic()
    create_topic(publisher, topic)
    with pytest.raises(exceptions.InvalidArgument):
        create_subscription(
            subscriber, names.subscription("bigquery"), topic, bigquery_config={"table": "project.dataset.table"}
        )
    with pytest.raises(exceptions.InvalidArgument):
        create_subscription(subscriber, names.subscription("bad-filter"), topic, filter="attributes.color = ")


def test_snapshot_lifecycle(publisher, subscriber, names):
    topic, subscription, snapshot = names.topic(), names.subscription(), names.snapshot()
    create_topic(publisher, topic)
    create_subscription(subscriber, subscription, topic)
    created = subscriber.create_snapshot(request={"name": snapshot, "subscription": subscription, "labels": {"k": "v"}})
    assert created.name == snapshot
    assert created.topic == topic
    assert dict(created.labels) == {"k": "v"}

    assert subscriber.get_snapshot(request={"snapshot": snapshot}).topic == topic
    with pytest.raises(exceptions.AlreadyExists):
        subscriber.create_snapshot(request={"name": snapshot, "subscription": subscription})
    assert snapshot in [item.name for item in subscriber.list_snapshots(request={"project": names.project})]
    assert list(publisher.list_topic_snapshots(request={"topic": topic})) == [snapshot]

    updated = subscriber.update_snapshot(
        request={"snapshot": {"name": snapshot, "labels": {"k": "w"}}, "update_mask": {"paths": ["labels"]}}
    )
    assert dict(updated.labels) == {"k": "w"}

    subscriber.delete_snapshot(request={"snapshot": snapshot})
    with pytest.raises(exceptions.NotFound):
        subscriber.get_snapshot(request={"snapshot": snapshot})


def test_detach_subscription(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    create_subscription(subscriber, subscription, topic)
    publish_all(publisher, topic, [b"before"])
    pull_until(subscriber, subscription, 1)

    publisher.detach_subscription(request={"subscription": subscription})
    assert subscriber.get_subscription(request={"subscription": subscription}).detached
    assert subscription not in list(publisher.list_topic_subscriptions(request={"topic": topic}))
    with pytest.raises(exceptions.FailedPrecondition):
        subscriber.pull(request={"subscription": subscription, "max_messages": 1}, timeout=5, retry=None)
