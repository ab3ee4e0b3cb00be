"""Rotating a persistent Topic's ingest token (docs/operator.md, Rotating an ingest token).

Real everything: the operator and a delivery replica as subprocesses, the apiserver, Ceph
RGW pushing to the ingest with hand-off ``sync`` (a push the ingest refuses is an event
lost), an HTTP endpoint that takes everything.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from bucketnotify.delivery.model.queue import QueueName
from devstack.servers.recording import RecordingHttpServer
from tests.delivery import queued_keys
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import StartOperator
from tests.processes import Program
from tests.resources import apply, condition
from tests.s3 import s3_client, sns_client
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

OVERLAP = 8
"""Seconds the replica still takes a replaced token (TOKEN_OVERLAP_SECONDS; 600 by default)."""
REFRESH = 30
"""Seconds between the replica's reads of the token Secrets (SECRET_REFRESH_SECONDS)."""


@pytest.fixture()
def replica_settings() -> dict[str, str]:
    # The Secrets are read again every 30 s (the default): what this test sees within that
    # comes from the replica reading the Secret when a push brings a token it does not hold.
    return {"TOKEN_OVERLAP_SECONDS": str(OVERLAP), "SECRET_REFRESH_SECONDS": str(REFRESH)}


def token_of(kubectl: Kubectl, namespace: str, topic: str) -> str:
    secret = kubectl.get("secret", f"{topic}-ingest-token", namespace)
    return base64.b64decode(secret["data"]["token"]).decode()


def patch_token_secret(
    kubectl: Kubectl, namespace: str, topic: str, string_data: dict[str, str]
) -> None:
    kubectl.run(
        "patch", "secret", f"{topic}-ingest-token", "-n", namespace, "--type=merge",
        "-p", json.dumps({"stringData": string_data}),
    )  # fmt: skip


def push(port: int, namespace: str, topic: str, token: str) -> int:
    """The ingest's status for a push of an empty body with ``token``: 400 means the token
    was taken (the body is checked after it), 403 that it was refused."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/topics/{namespace}/{topic}/{token}", data=b"{}"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - http://127.0.0.1
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def refused(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('bucketnotify_ingest_requests_total{code="403"}')
    )


def test_a_rotated_ingest_token_takes_effect_at_once_and_no_event_is_lost(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    replica: tuple[Program, int],
    queues: Path,
    rgw: LocalService,
) -> None:
    _, port = replica
    # A drift check far away: only the re-sync on the Secret's change can rewrite the topic
    # within the test's 20 s.
    start_operator(ingest_url=f"http://127.0.0.1:{port}", drift_interval_seconds="600")
    topic = f"rot-{uuid.uuid4().hex[:8]}"
    bucket = f"{topic}-b"
    s3 = s3_client(rgw)
    with RecordingHttpServer() as endpoint:
        spec = {
            "endpoint": {"http": {"url": endpoint.url}},
            "persistent": True,
            "delivery": {"handoff": "sync", "shards": 2},
        }
        apply(kubectl, namespace, "Topic", topic, spec)
        arn = condition(kubectl, namespace, "topic", topic)["arn"]
        s3.create_bucket(Bucket=bucket)
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            topic,
            {"bucket": bucket, "topicRef": {"name": topic}, "testEvent": False},
        )
        condition(kubectl, namespace, "bucketnotification", topic)
        old = token_of(kubectl, namespace, topic)

        acked: list[str] = []
        stop = threading.Event()

        def upload() -> None:
            while not stop.is_set():
                key = f"k{len(acked):04d}"
                s3.put_object(Bucket=bucket, Key=key, Body=b"x")
                acked.append(key)
                time.sleep(0.05)

        uploader = threading.Thread(target=upload, daemon=True)
        uploader.start()
        try:
            wait_until(lambda: len(acked), lambda n: n >= 20, 60, "uploads before the rotation")
            new = secrets.token_urlsafe(32)
            patch_token_secret(kubectl, namespace, topic, {"token": new})
            # The operator rewrites the gateway topic at once, not at its next drift check
            # (600 s here): the token Secret is one of the Secrets whose change re-syncs a
            # Topic.
            sns = sns_client(rgw)
            wait_until(
                lambda: sns.get_topic_attributes(TopicArn=arn)["Attributes"]["EndPoint"],
                lambda endpoint_json: new in endpoint_json and old not in endpoint_json,
                20,
                "the gateway pushing with the new token",
            )
            # Within the overlap, a push the gateway made before it was rewritten is taken.
            assert push(port, namespace, topic, old) == 400
            after = len(acked)
            wait_until(lambda: len(acked), lambda n: n >= after + 20, 60, "uploads after it")
        finally:
            stop.set()
            uploader.join(timeout=30)

        keys: list[str] = []

        def delivered() -> list[str]:
            keys.extend(
                record["s3"]["object"]["key"]
                for request in endpoint.received()
                for record in json.loads(request.body)["Records"]
            )
            return keys

        wait_until(delivered, lambda keys: set(acked) <= set(keys), 60, "every upload delivered")
        # Nothing refused (with hand-off sync a refused push is an event lost), nothing twice.
        assert refused(port) == 0
        assert sorted(delivered()) == sorted(acked)

        # The token it replaced is refused once the overlap is over; the new one is taken.
        wait_until(
            lambda: push(port, namespace, topic, old), lambda code: code == 403, OVERLAP + 10, "403"
        )
        assert push(port, namespace, topic, new) == 400
        # The gateway pushes with the new token: its copy of the topic in the bucket's
        # notification was rewritten too, so uploads now are not refused.
        before = refused(port)
        for i in range(5):
            s3.put_object(Bucket=bucket, Key=f"late{i}", Body=b"x")
            acked.append(f"late{i}")
        wait_until(delivered, lambda keys: set(acked) <= set(keys), 60, "late uploads delivered")
        assert refused(port) == before
        assert sorted(delivered()) == sorted(acked)
        # A rotation that keeps the old token as previous-token (for a gateway queue still
        # holding pushes made with it) has it taken again, without waiting for a refresh.
        patch_token_secret(kubectl, namespace, topic, {"previous-token": old})
        # Within a third of a refresh interval: the push made it read the Secret (a busy
        # machine's seconds do not close that gap).
        wait_until(
            lambda: push(port, namespace, topic, old),
            lambda code: code == 400,
            REFRESH / 3,
            "old taken",
        )
        assert push(port, namespace, topic, "not-" + new) == 403
        # Removing previous-token takes effect at the next refresh (SECRET_REFRESH_SECONDS): the
        # replica holds it, so no push makes it read the Secret; its refresh does.
        kubectl.run(
            "patch", "secret", f"{topic}-ingest-token", "-n", namespace, "--type=json",
            "-p", json.dumps([{"op": "remove", "path": "/data/previous-token"}]),
        )  # fmt: skip
        # Refused at all within a few refresh intervals tells the refresh from never,
        # whatever a busy machine adds to one refresh.
        wait_until(
            lambda: push(port, namespace, topic, old),
            lambda code: code == 403,
            3 * REFRESH,
            "old refused after a refresh",
        )
        assert push(port, namespace, topic, new) == 400

        # A deleted token Secret is made again by the operator at once (its deletion
        # re-syncs the Topic, not the next drift check, 600 s away here), the gateway topic
        # gets the new token, and the replica takes it: uploads all along lose nothing.
        before = refused(port)
        stop.clear()
        uploader = threading.Thread(target=upload, daemon=True)
        uploader.start()
        started = len(acked)
        wait_until(lambda: len(acked), lambda n: n >= started + 5, 30, "uploads before it")
        kubectl.run("delete", "secret", f"{topic}-ingest-token", "-n", namespace)
        remade = wait_until(
            lambda: (
                kubectl.run(
                    "get", "secret", f"{topic}-ingest-token", "-n", namespace, check=False
                ).returncode
                == 0
                and token_of(kubectl, namespace, topic)
            ),
            lambda token: bool(token) and token != new,
            30,
            "the token Secret made again",
        )
        wait_until(
            lambda: sns.get_topic_attributes(TopicArn=arn)["Attributes"]["EndPoint"],
            lambda endpoint_json: str(remade) in endpoint_json,
            30,
            "the gateway topic given the remade token",
        )
        wait_until(
            lambda: push(port, namespace, topic, str(remade)),
            lambda code: code == 400,
            10,
            "the remade token taken",
        )
        after = len(acked)
        try:
            wait_until(lambda: len(acked), lambda n: n >= after + 20, 60, "uploads after it")
        finally:
            stop.set()
            uploader.join(timeout=30)
        wait_until(delivered, lambda keys: set(acked) <= set(keys), 60, "uploads delivered")
        assert refused(port) == before
        # Late copies (a push repeated after a slow answer) come before their entry is
        # removed: once the queue is empty, all are in.
        wait_until(
            lambda: queued_keys(f"dir://{queues}", QueueName(namespace, topic), 2, {}),
            lambda left: left == [],
            30,
            "an empty queue",
        )
        assert sorted(delivered()) == sorted(acked), "every upload exactly once"
