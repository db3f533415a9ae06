"""Push subscriptions' configuration through Google's client: set at creation, shown by
get_subscription, changed by modify_push_config and by update_subscription with the mask
push_config, an empty one making the subscription pull; exactly-once delivery refused beside
it, in both orders, with Pub/Sub's reason. (Pushing itself is not checked here.)"""

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1

from helpers import create_subscription, create_topic

PushConfig = pubsub_v1.types.PushConfig
REFUSAL = "exactly-once delivery is not supported on push subscriptions"


def full_push_config(endpoint):
    return PushConfig(
        push_endpoint=endpoint,
        attributes={"x-goog-version": "v1"},
        oidc_token=PushConfig.OidcToken(service_account_email="pusher@project.iam.example", audience="receiver"),
        no_wrapper=PushConfig.NoWrapper(write_metadata=True),
    )


def shown_push_config(subscriber, subscription):
    return subscriber.get_subscription(request={"subscription": subscription}).push_config


def test_a_push_configuration_is_created_shown_modified_updated_and_removed(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    created = create_subscription(
        subscriber, subscription, topic, push_config=full_push_config("https://receiver.example/push")
    )
    assert created.push_config == full_push_config("https://receiver.example/push")
    shown = shown_push_config(subscriber, subscription)
    assert shown.push_endpoint == "https://receiver.example/push"
    assert shown.oidc_token.service_account_email == "pusher@project.iam.example"
    assert shown.oidc_token.audience == "receiver"
    assert shown.no_wrapper.write_metadata
    assert dict(shown.attributes) == {"x-goog-version": "v1"}

    subscriber.modify_push_config(
        request={"subscription": subscription, "push_config": {"push_endpoint": "http://localhost:8080/push"}}
    )
    assert shown_push_config(subscriber, subscription) == PushConfig(push_endpoint="http://localhost:8080/push")
    subscriber.modify_push_config(request={"subscription": subscription, "push_config": {}})
    assert shown_push_config(subscriber, subscription) == PushConfig(), "an empty configuration: pull"

    updated = subscriber.update_subscription(
        request={
            "subscription": {
                "name": subscription,
                "push_config": {"push_endpoint": "https://receiver.example/updated"},
            },
            "update_mask": {"paths": ["push_config"]},
        }
    )
    assert updated.push_config.push_endpoint == "https://receiver.example/updated"
    updated = subscriber.update_subscription(
        request={"subscription": {"name": subscription, "push_config": {}}, "update_mask": {"paths": ["push_config"]}}
    )
    assert updated.push_config == PushConfig()
    assert shown_push_config(subscriber, subscription) == PushConfig()


def test_a_push_endpoint_is_an_absolute_http_url(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    with pytest.raises(exceptions.InvalidArgument, match="invalid push endpoint"):
        create_subscription(subscriber, subscription, topic, push_config={"push_endpoint": "receiver.example/push"})
    with pytest.raises(exceptions.NotFound):
        subscriber.get_subscription(request={"subscription": subscription})


def test_exactly_once_delivery_is_refused_on_push_subscriptions_in_both_orders(publisher, subscriber, names):
    topic = names.topic()
    create_topic(publisher, topic)
    push = {"push_endpoint": "https://receiver.example/push"}

    with pytest.raises(exceptions.InvalidArgument, match=REFUSAL):
        create_subscription(
            subscriber, names.subscription("both"), topic, push_config=push, enable_exactly_once_delivery=True
        )

    once = names.subscription("once")
    create_subscription(subscriber, once, topic, enable_exactly_once_delivery=True)
    with pytest.raises(exceptions.InvalidArgument, match=REFUSAL):
        subscriber.modify_push_config(request={"subscription": once, "push_config": push})
    with pytest.raises(exceptions.InvalidArgument, match=REFUSAL):
        subscriber.update_subscription(
            request={"subscription": {"name": once, "push_config": push}, "update_mask": {"paths": ["push_config"]}}
        )
    assert shown_push_config(subscriber, once) == PushConfig()

    pushed = names.subscription("pushed")
    create_subscription(subscriber, pushed, topic, push_config=push)
    with pytest.raises(exceptions.InvalidArgument, match=REFUSAL):
        subscriber.update_subscription(
            request={
                "subscription": {"name": pushed, "enable_exactly_once_delivery": True},
                "update_mask": {"paths": ["enable_exactly_once_delivery"]},
            }
        )
    shown = subscriber.get_subscription(request={"subscription": pushed})
    assert not shown.enable_exactly_once_delivery
    assert shown.push_config.push_endpoint == "https://receiver.example/push"
