"""Gateway topic names across namespaces (real apiserver, real RGW).

The bug this pins down: the gateway topic name was ``spec.name or metadata.name`` inside one
gateway tenant, so Topics ``a/orders`` and ``b/orders`` wrote one gateway topic (and its
persistent queue), each overwriting the other's endpoint.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import pytest

from bucketnotify.gateway.topics import GatewayTopic, TopicClient
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import StartOperator
from tests.resources import apply, condition
from tests.s3 import connection, release_of, s3_client
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

# The operator retries a Topic in NameConflict this often (handlers.RETRY_DELAY_S), plus
# margin for a loaded machine.
TAKE_OVER_S = 15 + 30


@pytest.fixture()
def gateway(rgw: LocalService) -> TopicClient:
    return TopicClient(connection(rgw))


@pytest.fixture()
def other_namespace(kubectl: Kubectl) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl.run("create", "namespace", name)
    return name


def http(path: str) -> dict[str, Any]:
    return {"endpoint": {"http": {"url": f"http://127.0.0.1:9/{path}"}}}


def on_gateway(gateway: TopicClient, arn: str) -> GatewayTopic:
    found = gateway.get(arn)
    assert found is not None, f"no gateway topic {arn}"
    return found


def as_an_older_release_left_it(kubectl: Kubectl, namespace: str, name: str, arn: str) -> None:
    """The Topic's status as a development build before 0.1.0.dev0 wrote it (and
    0.1.0.dev0 kept it): its gateway topic."""
    kubectl.run(
        "patch", "topic", name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"arn": arn}}),
    )  # fmt: skip


def ready_condition(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})


def test_same_topic_name_in_two_namespaces_gives_two_gateway_topics(
    kubectl: Kubectl,
    namespace: str,
    other_namespace: str,
    start_operator: StartOperator,
    gateway: TopicClient,
) -> None:
    start_operator(namespaces=json.dumps([namespace, other_namespace]))
    for ns in (namespace, other_namespace):
        apply(kubectl, ns, "Topic", "orders", http(ns))
    arns = {
        ns: condition(kubectl, ns, "topic", "orders")["arn"] for ns in (namespace, other_namespace)
    }
    for ns, arn in arns.items():
        assert arn.endswith(f":{ns}_orders")
        assert on_gateway(gateway, arn).endpoint_address == f"http://127.0.0.1:9/{ns}"
    assert arns[namespace] != arns[other_namespace]

    kubectl.run("delete", "topic", "orders", "-n", other_namespace, "--timeout=60s")
    assert gateway.get(arns[other_namespace]) is None
    assert on_gateway(gateway, arns[namespace]).endpoint_address.endswith(f"/{namespace}")


def test_an_explicit_name_owned_by_another_topic_is_refused_not_shared(
    kubectl: Kubectl,
    namespace: str,
    other_namespace: str,
    start_operator: StartOperator,
    gateway: TopicClient,
) -> None:
    start_operator(namespaces=json.dumps([namespace, other_namespace]))
    shared = f"shared-{uuid.uuid4().hex[:8]}"
    apply(kubectl, namespace, "Topic", "first", {**http("first"), "name": shared})
    arn = condition(kubectl, namespace, "topic", "first")["arn"]
    assert arn.endswith(f":{shared}")

    apply(kubectl, other_namespace, "Topic", "second", {**http("second"), "name": shared})
    status = condition(kubectl, other_namespace, "topic", "second", "False", "NameConflict")
    message = ready_condition(status)["message"]
    assert f"'{shared}' belongs to Topic {namespace}/first" in message
    assert "set spec.name" in message
    assert "arn" not in status
    events = kubectl.run("get", "events", "-n", other_namespace, "-o", "json").stdout
    assert "NameConflict" in events
    assert on_gateway(gateway, arn).endpoint_address == "http://127.0.0.1:9/first"

    # Deleting the refused Topic leaves the owner's gateway topic alone.
    kubectl.run("delete", "topic", "second", "-n", other_namespace, "--timeout=60s")
    assert on_gateway(gateway, arn).endpoint_address == "http://127.0.0.1:9/first"

    # Once the owner is gone, a waiting claimant takes the name over.
    apply(kubectl, other_namespace, "Topic", "third", {**http("third"), "name": shared})
    condition(kubectl, other_namespace, "topic", "third", "False", "NameConflict")
    kubectl.run("delete", "topic", "first", "-n", namespace, "--timeout=60s")
    wait_until(
        lambda: (kubectl.get("topic", "third", other_namespace).get("status") or {}).get("arn"),
        lambda found: found is not None and found.endswith(f":{shared}"),
        TAKE_OVER_S,
        "the waiting Topic to take the freed name over",
    )
    condition(kubectl, other_namespace, "topic", "third")
    wait_until(
        lambda: on_gateway(gateway, arn).endpoint_address,
        lambda address: address == "http://127.0.0.1:9/third",
        30,
        "the gateway topic to carry the new owner's endpoint",
    )
    kubectl.run("delete", "topic", "third", "-n", other_namespace, "--timeout=60s")


def test_topics_of_an_older_release_keep_their_gateway_topic_and_sharers_are_separated(
    kubectl: Kubectl,
    namespace: str,
    other_namespace: str,
    start_operator: StartOperator,
    gateway: TopicClient,
) -> None:
    """Upgrade: Topics made when the default name was the bare metadata.name. One that had
    its gateway topic alone keeps it (its routing key, its notifications); two that shared
    one: the older keeps it, the younger moves to ``<namespace>_<name>``."""
    name = f"legacy-{uuid.uuid4().hex[:8]}"
    arn = gateway.upsert(name, {"push-endpoint": "http://127.0.0.1:9/old"})
    for ns in (namespace, other_namespace):
        apply(kubectl, ns, "Topic", name, http(ns))
        as_an_older_release_left_it(kubectl, ns, name, arn)
        time.sleep(1.1)  # creationTimestamp has whole seconds: make the order plain
    start_operator(namespaces=json.dumps([namespace, other_namespace]))

    older = condition(kubectl, namespace, "topic", name)
    younger = wait_until(
        lambda: kubectl.get("topic", name, other_namespace).get("status") or {},
        lambda st: (
            st.get("arn", "").endswith(f":{other_namespace}_{name}")
            and ready_condition(st)["status"] == "True"
        ),
        60,
        "the younger sharer moved to a name of its own",
    )
    assert older["arn"] == arn
    assert on_gateway(gateway, arn).endpoint_address == f"http://127.0.0.1:9/{namespace}"
    assert on_gateway(gateway, younger["arn"]).endpoint_address == (
        f"http://127.0.0.1:9/{other_namespace}"
    )
    for ns in (namespace, other_namespace):
        kubectl.run("delete", "topic", name, "-n", ns, "--timeout=60s")
    assert gateway.get(arn) is None


def test_a_topic_holding_a_dotted_name_keeps_it_where_the_gateway_takes_it_and_moves_where_not(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    gateway: TopicClient,
    rgw: LocalService,
) -> None:
    """Upgrade: Topics made when the default name was ``<namespace>.<name>``. Ceph 16.2 and
    18.2 take the name, so the Topic keeps its gateway topic; Ceph 19+ refuses it (AWS's
    characters only), so the Topic moves to ``<namespace>_<name>`` and is Ready there."""
    name = f"dotted-{uuid.uuid4().hex[:8]}"
    legacy = f"arn:aws:sns:default::{namespace}.{name}"
    apply(kubectl, namespace, "Topic", name, http(namespace))
    as_an_older_release_left_it(kubectl, namespace, name, legacy)
    start_operator(namespaces=json.dumps([namespace]))

    kept = not release_of(rgw).refuses_dotted_topic_names
    wanted = legacy if kept else f"arn:aws:sns:default::{namespace}_{name}"
    status = wait_until(
        lambda: kubectl.get("topic", name, namespace).get("status") or {},
        lambda st: st.get("arn") == wanted and ready_condition(st).get("status") == "True",
        60,
        f"the Topic Ready on {wanted}",
    )
    assert status["gatewayRelease"] == rgw["CEPH_RELEASE"]
    assert on_gateway(gateway, wanted).endpoint_address == f"http://127.0.0.1:9/{namespace}"
    kubectl.run("delete", "topic", name, "-n", namespace, "--timeout=60s")
    assert gateway.get(wanted) is None


def test_a_spec_name_with_a_dot_is_taken_or_refused_as_the_gateways_release_says(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    gateway: TopicClient,
    rgw: LocalService,
) -> None:
    """Ceph 16.2 and 18.2 take ``orders.v2``; Ceph 19+ would answer 400 InvalidArgument, so
    the operator refuses it with the gateway's rule and writes nothing."""
    name = f"orders.v2-{uuid.uuid4().hex[:8]}"
    start_operator(namespaces=json.dumps([namespace]))
    apply(kubectl, namespace, "Topic", "named", {**http(namespace), "name": name})
    arn = f"arn:aws:sns:default::{name}"
    if release_of(rgw).refuses_dotted_topic_names:
        status = condition(kubectl, namespace, "topic", "named", "False", "InvalidSpec")
        message = ready_condition(status)["message"]
        assert f"gateway topic name {name!r}: this gateway (Ceph {rgw['CEPH_RELEASE']})" in message
        assert "takes only letters, digits, '_' and '-'" in message
        assert gateway.get(arn) is None
    else:
        assert condition(kubectl, namespace, "topic", "named")["arn"] == arn
        assert on_gateway(gateway, arn).endpoint_address == f"http://127.0.0.1:9/{namespace}"
    kubectl.run("delete", "topic", "named", "-n", namespace, "--timeout=60s")
    assert gateway.get(arn) is None


def test_the_longest_default_name_is_taken_by_the_gateway_with_a_notification_on_it(
    kubectl: Kubectl, start_operator: StartOperator, gateway: TopicClient, rgw: LocalService
) -> None:
    """``<namespace>_<name>`` at its longest (a 63-character namespace, a 253-character
    name: 317 characters) is more than Ceph 19+ takes (256), so it ends in a digest of the
    whole; the gateway topic is made and a BucketNotification on it is Ready. A persistent
    Topic's name is shorter (its ingest token Secret is ``<name>-ingest-token``): 240
    characters work, 241 are refused at apply time. (Ceph 16.2 takes names of 1,569
    characters and crashes on a notification naming a topic of 1,570 or more.)"""
    namespace = f"t-{uuid.uuid4().hex}".ljust(63, "n")
    kubectl.run("create", "namespace", namespace)
    longest, persistent = "o" * 253, "p" * 240
    # Persistent Topics point the gateway at the ingest; nothing is pushed here.
    start_operator(namespaces=json.dumps([namespace]), ingest_url="http://127.0.0.1:9")
    apply(kubectl, namespace, "Topic", longest, http("long"))
    apply(kubectl, namespace, "Topic", persistent, {**http("long"), "persistent": True})
    refused = kubectl.apply(
        {
            "apiVersion": "bucketnotify.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "p" * 241, "namespace": namespace},
            "spec": {**http("long"), "persistent": True},
        },
        check=False,
    )
    assert refused.returncode != 0
    assert "a persistent Topic's name is at most 240 characters" in refused.stderr
    arns = {
        name: condition(kubectl, namespace, "topic", name)["arn"] for name in (longest, persistent)
    }
    for name, arn in arns.items():
        gateway_name = arn.rsplit(":", 1)[1]
        # 317 and 304 characters: cut to 256 with a digest of the whole at the end.
        assert re.fullmatch(rf"{namespace}_{name[:100]}[a-z]+-[0-9a-f]{{12}}", gateway_name)
        assert len(gateway_name) == 256
        assert on_gateway(gateway, arn).endpoint_address  # read back from the gateway
    bucket = f"long-{uuid.uuid4().hex[:10]}"
    connection(rgw).s3().create_bucket(Bucket=bucket)
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        "long",
        {"bucket": bucket, "topicRef": {"name": longest}, "testEvent": False},
    )
    applied = condition(kubectl, namespace, "bucketnotification", "long")["applied"]
    assert applied["topicArn"] == arns[longest]


def test_a_moved_sharers_bucket_notifications_follow_it_to_its_new_gateway_topic(
    kubectl: Kubectl,
    namespace: str,
    other_namespace: str,
    start_operator: StartOperator,
    gateway: TopicClient,
    rgw: LocalService,
) -> None:
    """Upgrade: the younger of two Topics that shared one bare-named gateway topic moves to
    ``<namespace>_<name>``; its BucketNotification, written by the older release with the
    shared ARN, follows it: the bucket's notification and the ``applied`` status name the
    new ARN, and the older sharer's own notification keeps the shared one."""
    name = f"moving-{uuid.uuid4().hex[:8]}"
    arn = gateway.upsert(name, {"push-endpoint": "http://127.0.0.1:9/old"})
    s3 = s3_client(rgw)
    buckets = {ns: f"{name}-{i}" for i, ns in enumerate((namespace, other_namespace))}
    events = ["s3:ObjectCreated:*"]
    for ns, bucket in buckets.items():
        apply(kubectl, ns, "Topic", name, http(ns))
        as_an_older_release_left_it(kubectl, ns, name, arn)
        # The bucket's notification as the older release wrote it: the shared ARN.
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "TopicConfigurations": [{"Id": name, "TopicArn": arn, "Events": events}]
            },
        )
        apply(
            kubectl,
            ns,
            "BucketNotification",
            name,
            {"bucket": bucket, "topicRef": {"name": name}, "testEvent": False, "events": events},
        )
        kubectl.run(
            "patch", "bucketnotification", name, "-n", ns, "--subresource=status",
            "--type=merge", "-p",
            json.dumps({"status": {"applied": {"id": name, "topicArn": arn, "events": events}}}),
        )  # fmt: skip
        time.sleep(1.1)  # creationTimestamp has whole seconds: make the order plain
    start_operator(namespaces=json.dumps([namespace, other_namespace]))

    moved = f"arn:aws:sns:default::{other_namespace}_{name}"

    def on_bucket(bucket: str) -> list[str]:
        found = s3.get_bucket_notification_configuration(Bucket=bucket)
        return [c["TopicArn"] for c in found.get("TopicConfigurations", []) if c["Id"] == name]

    wait_until(
        lambda: on_bucket(buckets[other_namespace]),
        lambda arns: arns == [moved],
        60,
        "the younger sharer's notification on its new gateway topic",
    )
    status = condition(kubectl, other_namespace, "bucketnotification", name)
    assert status["applied"]["topicArn"] == moved
    assert kubectl.get("topic", name, other_namespace)["status"]["arn"] == moved
    # The older sharer kept the shared gateway topic, and its notification with it.
    assert on_bucket(buckets[namespace]) == [arn]
    assert condition(kubectl, namespace, "bucketnotification", name)["applied"]["topicArn"] == arn
    for ns in (namespace, other_namespace):
        kubectl.run("delete", "bucketnotification", name, "-n", ns, "--timeout=60s")
        kubectl.run("delete", "topic", name, "-n", ns, "--timeout=60s")
    assert gateway.get(arn) is None and gateway.get(moved) is None
