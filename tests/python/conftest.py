"""Fixtures of the Python suite: one ringpostd for the whole session (each test names its own
topics and subscriptions), Google's publisher and subscriber clients pointed at it through
PUBSUB_EMULATOR_HOST, and names unique to each test."""

import os
import re
import uuid

import pytest
from google.cloud import pubsub_v1

from ringpost_daemon import Daemon

PROJECT = "test-project"


@pytest.fixture(scope="session")
def daemon(request):
    daemon = Daemon("suite").start()
    # The clients read the variable when they are made: every client of the session is made
    # after this, by the fixtures below or by a test.
    os.environ["PUBSUB_EMULATOR_HOST"] = daemon.grpc_address
    yield daemon
    if request.session.testsfailed:
        # Left for whoever reads the failure: the log and the data that produced it.
        daemon.stop()
        print(f"\nringpostd's directory (kept): {daemon.directory}\n{daemon.log_tail()}")
    else:
        daemon.remove()


@pytest.fixture(scope="session")
def publisher(daemon):
    client = pubsub_v1.PublisherClient()
    yield client
    client.stop()


@pytest.fixture(scope="session")
def subscriber(daemon):
    client = pubsub_v1.SubscriberClient()
    yield client
    client.close()


class Names:
    """Resource names unique to one test, so that the tests share a daemon without meeting."""

    def __init__(self, test_name):
        self.prefix = re.sub(r"[^a-z0-9-]", "-", test_name.lower())[:40] + "-" + uuid.uuid4().hex[:8]
        self.project = f"projects/{PROJECT}"

    def topic(self, suffix="topic"):
        return f"projects/{PROJECT}/topics/{self.prefix}-{suffix}"

    def subscription(self, suffix="subscription"):
        return f"projects/{PROJECT}/subscriptions/{self.prefix}-{suffix}"

    def snapshot(self, suffix="snapshot"):
        return f"projects/{PROJECT}/snapshots/{self.prefix}-{suffix}"


@pytest.fixture
def names(request):
    return Names(request.node.name)
