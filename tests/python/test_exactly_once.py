"""Exactly-once delivery through Google's client: an ack succeeds only for the current delivery,
the client's futures say so, and the unary calls carry Pub/Sub's ErrorInfo for the ids that
failed."""

import pytest
from google.api_core import exceptions
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus

from helpers import WAIT_SECONDS, Receiver, create_subscription, create_topic, publish_all, pull_nothing, pull_until

ERROR_REASON = "EXACTLY_ONCE_ACKID_FAILURE"
PERMANENT_INVALID = "PERMANENT_FAILURE_INVALID_ACK_ID"


def exactly_once_subscription(publisher, subscriber, names):
    topic, subscription = names.topic(), names.subscription()
    create_topic(publisher, topic)
    create_subscription(subscriber, subscription, topic, enable_exactly_once_delivery=True)
    assert subscriber.get_subscription(request={"subscription": subscription}).enable_exactly_once_delivery
    return topic, subscription


def test_streaming_ack_of_a_stale_delivery_fails(publisher, subscriber, names):
    topic, subscription = exactly_once_subscription(publisher, subscriber, names)
    publish_all(publisher, topic, [b"once"])
    nacks = []

    def nack_first(message):
        # The first delivery is handed back; the second is kept for the test to acknowledge.
        if not nacks:
            nacks.append(message.nack_with_response().result(timeout=WAIT_SECONDS))

    with Receiver(subscriber, subscription, handle=nack_first) as receiver:
        receiver.wait_for(lambda: len(receiver.snapshot()) >= 2, "the redelivery after a nack")
        first, second = receiver.snapshot()[:2]
        assert nacks == [AcknowledgeStatus.SUCCESS]
        assert first.message_id == second.message_id
        assert first.ack_id != second.ack_id

        with pytest.raises(AcknowledgeError) as failure:
            first.ack_with_response().result(timeout=WAIT_SECONDS)
        assert failure.value.error_code == AcknowledgeStatus.INVALID_ACK_ID
        assert second.ack_with_response().result(timeout=WAIT_SECONDS) == AcknowledgeStatus.SUCCESS
        receiver.stays(lambda: len(receiver.snapshot()) == 2, 2.0, "an acknowledged message was delivered again")


def test_unary_acks_report_failed_ids(publisher, subscriber, names):
    topic, subscription = exactly_once_subscription(publisher, subscriber, names)
    publish_all(publisher, topic, [b"unary"])
    [first] = pull_until(subscriber, subscription, 1, acknowledge=False)
    subscriber.modify_ack_deadline(request={"subscription": subscription, "ack_ids": [first.ack_id], "ack_deadline_seconds": 0})
    [second] = pull_until(subscriber, subscription, 1, acknowledge=False)
    assert second.message.message_id == first.message.message_id

    # The handed-back delivery's ack id no longer acknowledges; the current one does, in the
    # same request: the error names only the id that failed, and the client's future of the
    # other succeeds. Sending that acknowledgement again (a client retrying one whose answer it
    # lost) succeeds without effect: the message is acknowledged, which is what success promises.
    with pytest.raises(exceptions.GoogleAPICallError) as failure:
        subscriber.acknowledge(request={"subscription": subscription, "ack_ids": [first.ack_id]})
    assert_ack_id_failure(failure.value, first.ack_id)
    with pytest.raises(exceptions.GoogleAPICallError) as failure:
        subscriber.acknowledge(request={"subscription": subscription, "ack_ids": [first.ack_id, second.ack_id]})
    assert_ack_id_failure(failure.value, first.ack_id)
    assert second.ack_id not in failure.value.metadata
    subscriber.acknowledge(request={"subscription": subscription, "ack_ids": [second.ack_id]})
    pull_nothing(subscriber, subscription)


def assert_ack_id_failure(error, ack_id):
    """The error carries Pub/Sub's ErrorInfo naming `ack_id` as permanently invalid, which is
    what the client reads (`_get_ack_errors`) to fail the ack's future."""
    assert error.reason == ERROR_REASON, f"{error!r} has no ErrorInfo with reason {ERROR_REASON}: {error.details}"
    assert error.domain == "pubsub.googleapis.com"
    assert error.metadata.get(ack_id, "").startswith(PERMANENT_INVALID), error.metadata
