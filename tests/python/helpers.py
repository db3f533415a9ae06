"""What the tests share: waiting with a deadline, a streaming subscriber that records what its
callback saw, and unary pulls until a count arrives."""

import threading
import time
import warnings
from concurrent import futures

from google.api_core import exceptions

# How long a test waits for what should happen in well under a second: generous, because the
# daemon is a debug build sharing two cores with other tests.
WAIT_SECONDS = 30
# How long a unary Pull may wait for messages before the client gives up on it: longer than the
# server holds an empty Pull (about 10 s), so that the server, not a cancellation, ends the wait
# and no message is leased to a call the client has abandoned.
PULL_TIMEOUT_SECONDS = 15
POLL_SECONDS = 0.05
# Between the immediate Pulls that check that nothing comes.
NOTHING_POLL_SECONDS = 0.2


def wait_for(predicate, what, timeout=WAIT_SECONDS):
    """Waits until `predicate()` is true; fails naming `what` when it stays false."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_SECONDS)


def create_topic(publisher, topic, **fields):
    return publisher.create_topic(request={"name": topic, **fields})


def create_subscription(subscriber, subscription, topic, **fields):
    return subscriber.create_subscription(request={"name": subscription, "topic": topic, **fields})


def publish_all(publisher, topic, payloads, timeout=WAIT_SECONDS, **attributes):
    """Publishes each payload (bytes) and returns the message ids, once every publish resolved."""
    pending = [publisher.publish(topic, payload, **attributes) for payload in payloads]
    return [future.result(timeout=timeout) for future in pending]


class Receiver:
    """`subscriber.subscribe(...)` on one subscription, recording every delivery the callback
    saw, in order. `handle(message)` decides what to do with each (default: ack). A callback
    that raises fails the test at the next wait, and so does a stream that ends by itself."""

    def __init__(self, subscriber, subscription, handle=None, flow_control=None):
        self.subscriber = subscriber
        self.subscription = subscription
        self.handle = handle or (lambda message: message.ack())
        self.flow_control = flow_control or ()
        self.lock = threading.Lock()
        self.messages = []
        self.errors = []
        self.future = None

    def __enter__(self):
        self.future = self.subscriber.subscribe(self.subscription, self._callback, flow_control=self.flow_control)
        return self

    def __exit__(self, *exception):
        self.future.cancel()
        try:
            self.future.result(timeout=WAIT_SECONDS)
        except (futures.CancelledError, futures.TimeoutError):
            pass
        return False

    def _callback(self, message):
        with self.lock:
            self.messages.append(message)
        try:
            self.handle(message)
        except Exception as error:  # noqa: BLE001 - recorded to fail the test, not lost in a log
            with self.lock:
                self.errors.append(error)
            raise

    def snapshot(self):
        with self.lock:
            return list(self.messages)

    def data(self):
        return [message.data for message in self.snapshot()]

    def check(self):
        """Fails if the callback raised or the stream ended (it should run until cancelled)."""
        with self.lock:
            if self.errors:
                raise AssertionError(f"the callback raised: {self.errors[0]!r}") from self.errors[0]
        if self.future.done():
            raise AssertionError(f"the streaming pull ended by itself: {self.future.exception()!r}")

    def wait_for(self, predicate, what, timeout=WAIT_SECONDS):
        def checked():
            self.check()
            return predicate()

        wait_for(checked, what, timeout)

    def wait_for_data(self, expected, timeout=WAIT_SECONDS):
        """Waits until every payload in `expected` was delivered at least once."""
        expected = set(expected)
        self.wait_for(
            lambda: expected <= set(self.data()),
            MissingPayloads(expected, self.data),
            timeout,
        )

    def stays(self, predicate, seconds, what):
        """Checks that `predicate()` holds throughout `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check()
            assert predicate(), what
            time.sleep(POLL_SECONDS)


class MissingPayloads:
    """A description of a wait for payloads that says, when it fails, how many had arrived."""

    def __init__(self, expected, data):
        self.expected = expected
        self.data = data

    def __str__(self):
        arrived = self.expected & set(self.data())
        missing = sorted(self.expected - arrived)[:5]
        return f"{len(self.expected)} messages (arrived: {len(arrived)}; missing e.g. {missing})"


def pull(subscriber, subscription, max_messages=100, timeout=PULL_TIMEOUT_SECONDS):
    """One unary Pull; an empty answer, or none in `timeout`, is an empty list."""
    try:
        response = subscriber.pull(
            request={"subscription": subscription, "max_messages": max_messages},
            timeout=timeout,
            retry=None,
        )
    except exceptions.DeadlineExceeded:
        return []
    return list(response.received_messages)


def pull_until(subscriber, subscription, count, timeout=WAIT_SECONDS, acknowledge=True):
    """Pulls until `count` messages arrived (acknowledging them unless told not to)."""
    received = []
    deadline = time.monotonic() + timeout
    while len(received) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"pulled {len(received)} of {count} messages in {timeout} s")
        batch = pull(subscriber, subscription, max_messages=count - len(received))
        if batch and acknowledge:
            subscriber.acknowledge(request={"subscription": subscription, "ack_ids": [m.ack_id for m in batch]})
        received.extend(batch)
    return received


def pull_nothing(subscriber, subscription, seconds=2):
    """Checks that no message comes for `seconds`, with Pulls that answer at once
    (return_immediately, deprecated but served): a waiting Pull abandoned by the client could
    still be handed a message that a later step of the test expects."""
    deadline = time.monotonic() + seconds
    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            response = subscriber.pull(
                request={"subscription": subscription, "max_messages": 10, "return_immediately": True},
                timeout=PULL_TIMEOUT_SECONDS,
                retry=None,
            )
        data = [item.message.data for item in response.received_messages]
        assert not data, f"expected no message, pulled {data}"
        if time.monotonic() > deadline:
            return
        time.sleep(NOTHING_POLL_SECONDS)
