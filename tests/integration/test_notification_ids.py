"""Exactly one owner per (gateway, bucket, notification Id).

Two BucketNotifications naming one Id on one bucket used to be both Ready while the bucket
held one entry, rewritten by each drift repair in turn; an Id already on the bucket, made by
someone else, was silently taken over. Real operator processes, apiserver and gateway.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.notifications import NotificationClient, NotificationConfig
from bucketnotify.gateway.topics import TopicClient
from devstack.servers.recording import HttpReceiver
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import DRIFT_INTERVAL_S, StartOperator
from tests.resources import apply, condition
from tests.s3 import connection, s3_client

pytestmark = pytest.mark.usefixtures("crds")


@pytest.fixture()
def gateway(rgw: LocalService) -> GatewayConnection:
    return connection(rgw)


@pytest.fixture()
def notifications(gateway: GatewayConnection) -> NotificationClient:
    return NotificationClient(gateway)


@pytest.fixture()
def bucket(rgw: LocalService) -> str:
    name = f"ids-{uuid.uuid4().hex[:12]}"
    s3_client(rgw).create_bucket(Bucket=name)
    return name


@pytest.fixture()
def other_namespace(kubectl: Kubectl) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl.run("create", "namespace", name)
    return name


def topic(kubectl: Kubectl, namespace: str, name: str, url: str) -> str:
    """A Ready HTTP Topic; its ARN."""
    apply(kubectl, namespace, "Topic", name, {"endpoint": {"http": {"url": url}}})
    arn: str = condition(kubectl, namespace, "topic", name)["arn"]
    return arn


def notify(
    kubectl: Kubectl, namespace: str, name: str, bucket: str, topic: str, **extra: Any
) -> None:
    spec = {"bucket": bucket, "topicRef": {"name": topic}, "testEvent": False, **extra}
    apply(kubectl, namespace, "BucketNotification", name, spec)


def entries(notifications: NotificationClient, bucket: str, id: str) -> list[str]:
    """The topic ARNs of the bucket's entries with ``id``."""
    return [c.topic_arn for c in notifications.list(bucket) if c.id == id]


def ready(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    status = kubectl.get("bucketnotification", name, namespace).get("status") or {}
    found: dict[str, Any] = {c["type"]: c for c in status.get("conditions", [])}["Ready"]
    return found


def warnings(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    events = json.loads(
        kubectl.run(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={name},type=Warning",
            "-o",
            "json",
        ).stdout
    )["items"]
    return [e["reason"] for e in events]


def test_one_id_on_one_bucket_has_one_owner_and_the_next_takes_over(
    kubectl: Kubectl,
    namespace: str,
    other_namespace: str,
    start_operator: StartOperator,
    notifications: NotificationClient,
    gateway: GatewayConnection,
    bucket: str,
) -> None:
    start_operator(namespaces=json.dumps([namespace, other_namespace]))
    with HttpReceiver() as receiver:
        first_arn = topic(kubectl, namespace, "first", receiver.url)
        second_arn = topic(kubectl, other_namespace, "second", receiver.url)
        notify(kubectl, namespace, "a", bucket, "first", id="shared")
        condition(kubectl, namespace, "bucketnotification", "a")

        # Same gateway user, another namespace, another Topic; and one beside the owner on
        # the owner's very Topic, the case where the entry alone cannot tell them apart.
        notify(kubectl, other_namespace, "b", bucket, "second", id="shared")
        notify(kubectl, namespace, "c", bucket, "first", id="shared")
        for ns, name in ((other_namespace, "b"), (namespace, "c")):
            status = condition(
                kubectl, ns, "bucketnotification", name, status="False", reason="IdConflict"
            )
            assert (
                f"belongs to BucketNotification {namespace}/a"
                in ready(kubectl, ns, name)["message"]
            )
            assert "applied" not in status or status["applied"] is None
            assert "IdConflict" in warnings(kubectl, ns, name)

        # No fight: drift checks of all three leave the owner's entry alone.
        time.sleep(4 * DRIFT_INTERVAL_S)
        assert entries(notifications, bucket, "shared") == [first_arn]
        assert ready(kubectl, namespace, "a")["status"] == "True"
        assert ready(kubectl, other_namespace, "b")["reason"] == "IdConflict"

        # The default owner mark: this cluster's kube-system namespace UID.
        uid = kubectl.run(
            "get", "namespace", "kube-system", "-o", "jsonpath={.metadata.uid}"
        ).stdout.strip()
        marked = TopicClient(gateway).get(first_arn)
        assert marked is not None and marked.endpoint_args.get("bucketnotify-owner") == uid

        # Deleting a notification that never held the Id leaves the owner's entry.
        kubectl.run("delete", "bucketnotification", "c", "-n", namespace, "--timeout=30s")
        assert entries(notifications, bucket, "shared") == [first_arn]

        # The owner goes: the next one takes the Id over.
        kubectl.run("delete", "bucketnotification", "a", "-n", namespace, "--timeout=30s")
        status = condition(kubectl, other_namespace, "bucketnotification", "b")
        assert status["applied"]["topicArn"] == second_arn
        assert entries(notifications, bucket, "shared") == [second_arn]


def test_an_id_made_outside_bucketnotify_is_taken_only_when_asked(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    notifications: NotificationClient,
    gateway: GatewayConnection,
    bucket: str,
) -> None:
    start_operator()
    with HttpReceiver() as receiver:
        # Made by hand: a topic without an owner mark and an entry naming it.
        hand_arn = TopicClient(gateway).upsert(
            f"hand-{uuid.uuid4().hex[:8]}", {"push-endpoint": receiver.url}
        )
        for id in ("legacy", "kept"):
            notifications.put(bucket, NotificationConfig(id, hand_arn, ("s3:ObjectCreated:*",)))
        mine = topic(kubectl, namespace, "mine", receiver.url)

        notify(kubectl, namespace, "legacy", bucket, "mine")
        condition(kubectl, namespace, "bucketnotification", "legacy", "False", "IdConflict")
        message = ready(kubectl, namespace, "legacy")["message"]
        assert "bucketnotify did not make" in message and "adoptExisting" in message
        assert entries(notifications, bucket, "legacy") == [hand_arn]

        notify(kubectl, namespace, "legacy", bucket, "mine", adoptExisting=True)
        condition(kubectl, namespace, "bucketnotification", "legacy")
        assert entries(notifications, bucket, "legacy") == [mine]

        # Refused, then deleted: the hand-made entry stays.
        notify(kubectl, namespace, "kept", bucket, "mine")
        condition(kubectl, namespace, "bucketnotification", "kept", "False", "IdConflict")
        kubectl.run("delete", "bucketnotification", "kept", "-n", namespace, "--timeout=30s")
        assert entries(notifications, bucket, "kept") == [hand_arn]


def test_two_operators_on_one_gateway_never_share_an_id(
    kubectl: Kubectl,
    namespace: str,
    other_namespace: str,
    start_operator: StartOperator,
    notifications: NotificationClient,
    gateway: GatewayConnection,
    bucket: str,
) -> None:
    """Two clusters on one gateway, as two operators with their own owner ids."""
    start_operator(owner_id="cluster-a")
    start_operator(
        owner_id="cluster-b",
        namespaces=json.dumps([other_namespace]),
        leader_election_namespace=other_namespace,
    )
    with HttpReceiver() as receiver:
        a_arn = topic(kubectl, namespace, "a-topic", receiver.url)
        topic(kubectl, other_namespace, "b-topic", receiver.url)
        notify(kubectl, namespace, "n", bucket, "a-topic", id="x")
        condition(kubectl, namespace, "bucketnotification", "n")

        # Even adoptExisting does not take another operator's Id.
        notify(kubectl, other_namespace, "n", bucket, "b-topic", id="x", adoptExisting=True)
        condition(kubectl, other_namespace, "bucketnotification", "n", "False", "IdConflict")
        message = ready(kubectl, other_namespace, "n")["message"]
        assert "another bucketnotify operator (owner cluster-a" in message
        time.sleep(3 * DRIFT_INTERVAL_S)
        assert entries(notifications, bucket, "x") == [a_arn]
        assert ready(kubectl, namespace, "n")["status"] == "True"

        # Its deletion leaves the other operator's entry.
        kubectl.run("delete", "bucketnotification", "n", "-n", other_namespace, "--timeout=30s")
        assert entries(notifications, bucket, "x") == [a_arn]

        # Nor does it take the other's gateway topic by naming it.
        a_name = a_arn.rsplit(":", 1)[-1]
        spec = {"name": a_name, "endpoint": {"http": {"url": f"{receiver.url}/b"}}}
        apply(kubectl, other_namespace, "Topic", "same-name", spec)
        condition(kubectl, other_namespace, "topic", "same-name", "False", "NameConflict")
        message = {
            c["type"]: c
            for c in kubectl.get("topic", "same-name", other_namespace)["status"]["conditions"]
        }["Ready"]["message"]
        assert "another bucketnotify operator (owner cluster-a)" in message
        kept = TopicClient(gateway).get(a_arn)
        assert kept is not None and kept.endpoint_address == receiver.url
        kubectl.run("delete", "topic", "same-name", "-n", other_namespace, "--timeout=30s")
        assert TopicClient(gateway).get(a_arn) is not None
