"""A push subscription made with Google's client delivers to a receiver written with Python's
http.server: the wrapped body field for field, a 500 retried and a 204 acknowledging, and the
request's OIDC token verified by PyJWT against the keys the daemon serves."""

import base64
import datetime
import http.server
import json
import os
import queue
import socket
import threading
import time

import jwt
from google.cloud import pubsub_v1

from ringpost_daemon import Daemon

# Generous: a debug build beside other tests; a working daemon pushes within a second.
PUSH_WAIT_SECONDS = 30
SERVICE_ACCOUNT = "pusher@test-project.iam.gserviceaccount.com"
AUDIENCE = "https://receiver.test/push"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Receiver:
    """Answers 500 to the first push of each message and 204 to the next, recording each."""

    def __init__(self):
        self.requests = queue.Queue()
        seen = set()
        requests = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                message_id = json.loads(body)["message"]["messageId"]
                status = 204 if message_id in seen else 500
                seen.add(message_id)
                requests.put((self.path, self.headers, body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *arguments):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/push"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def next(self):
        return self.requests.get(timeout=PUSH_WAIT_SECONDS)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_push_reaches_a_python_receiver_wrapped_retried_and_signed(names):
    monitoring = f"127.0.0.1:{free_port()}"
    daemon = Daemon("push", http_listen=monitoring).start()
    receiver = Receiver()
    saved = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = daemon.grpc_address
    try:
        publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
        topic, subscription = names.topic(), names.subscription()
        publisher.create_topic(request={"name": topic})
        subscriber.create_subscription(
            request={
                "name": subscription,
                "topic": topic,
                "push_config": {
                    "push_endpoint": receiver.endpoint,
                    "oidc_token": {"service_account_email": SERVICE_ACCOUNT, "audience": AUDIENCE},
                },
                "retry_policy": {"minimum_backoff": {"seconds": 1}, "maximum_backoff": {"seconds": 2}},
            }
        )
        message_id = publisher.publish(topic, b"hello push", k="v").result(timeout=PUSH_WAIT_SECONDS)

        failed = receiver.next()
        acknowledged = receiver.next()
        assert (failed[3], acknowledged[3]) == (500, 204), "the 500 is retried, the 204 ends it"
        path, headers, body, _ = acknowledged
        assert path == "/push"
        assert headers.get("Content-Type", "").startswith("application/json"), dict(headers)
        envelope = json.loads(body)
        message = envelope["message"]
        assert base64.b64decode(message["data"]) == b"hello push"
        assert message["attributes"] == {"k": "v"}
        assert message["messageId"] == message["message_id"] == message_id
        assert message["publishTime"] == message["publish_time"]
        published = datetime.datetime.fromisoformat(message["publishTime"].replace("Z", "+00:00"))
        assert abs((datetime.datetime.now(datetime.timezone.utc) - published).total_seconds()) < 600
        assert "orderingKey" not in message, "no ordering key was given"
        assert envelope["subscription"].endswith("/subscriptions/" + subscription.rsplit("/", 1)[1])
        assert "deliveryAttempt" not in envelope, "only with a dead-letter policy"

        scheme, token = headers["Authorization"].split(" ", 1)
        assert scheme == "Bearer"
        key = jwt.PyJWKClient(f"http://{monitoring}/oauth2/v3/certs").get_signing_key_from_jwt(token)
        claims = jwt.decode(token, key.key, algorithms=["RS256"], audience=AUDIENCE, issuer="https://accounts.google.com")
        assert claims["email"] == SERVICE_ACCOUNT and claims["email_verified"] is True
        assert claims["exp"] - claims["iat"] == 3600

        # Acknowledged by the 204: pushed no more.
        time.sleep(3)
        assert receiver.requests.empty(), receiver.requests.get()
    finally:
        if saved is None:
            del os.environ["PUBSUB_EMULATOR_HOST"]
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = saved
        receiver.close()
        daemon.remove()
