"""What the operator does differently per Ceph release, against the real gateway of each
(this file runs in the whole suite on 20.2 and in the compatibility tier on 18.2 and 16.2).

Measured on the three releases: which event types a bucket's configuration takes; whether a
topic has an owner other users cannot read, write or delete (19+); whether the gateway's own
persistent queue acts on ``time_to_live`` and ``max_retries`` (20+)."""

from __future__ import annotations

import json
import subprocess

import botocore.exceptions
import pytest

from bucketnotify.api.notification import EVENT_TYPES
from bucketnotify.controller.topic_builder import OWNER
from bucketnotify.gateway.errors import GatewayForeignTopic
from bucketnotify.gateway.notifications import NotificationClient, NotificationConfig
from bucketnotify.gateway.topics import GatewayTopic, TopicClient
from devstack.gateway import ceph_tool, listed_topic_names
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import DRIFT_INTERVAL_S, StartOperator
from tests.resources import apply, condition
from tests.s3 import DEAD_ENDPOINT, connection, release_of, s3_client, sns_client, unique
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")


def test_every_event_the_api_offers_is_taken_exactly_where_the_operator_lets_it_through(
    rgw: LocalService,
) -> None:
    """The operator refuses an event before the gateway sees it (``Unsupported``) only
    where the gateway itself would refuse it, and reads back what it wrote as written."""
    release = release_of(rgw)
    s3, sns = s3_client(rgw), sns_client(rgw)
    bucket = unique("events")
    s3.create_bucket(Bucket=bucket)
    arn = sns.create_topic(Name=unique("events"), Attributes={"push-endpoint": DEAD_ENDPOINT})[
        "TopicArn"
    ]
    taken, refused = [], []
    with NotificationClient(connection(rgw)) as notifications:
        try:
            for event in EVENT_TYPES:
                config = {"Id": "n", "TopicArn": arn, "Events": [event]}
                try:
                    s3.put_bucket_notification_configuration(
                        Bucket=bucket,
                        NotificationConfiguration={"TopicConfigurations": [config]},
                    )
                except botocore.exceptions.ClientError as exc:
                    assert exc.response["Error"]["Code"] == "InvalidArgument", event
                    refused.append(event)
                    continue
                taken.append(event)
                assert notifications.get(bucket, "n") == NotificationConfig("n", arn, (event,))
        finally:
            # The bucket's notifications go with it.
            s3.delete_bucket(Bucket=bucket)
            sns.delete_topic(TopicArn=arn)
    assert refused == release.refused_events(EVENT_TYPES)
    assert taken, "every release takes ObjectCreated and ObjectRemoved"


def test_the_abort_multipart_upload_expiration_event_is_taken_as_unknown_where_not_refused(
    rgw: LocalService,
) -> None:
    """``...:Expiration:AbortMultipartUpload``, in Ceph's docs: 20.2 and 18.2 take it and
    store it as ``s3:UnknownEvent``, 16.2 refuses it. The API does not offer it
    (``test_notification_crd.py``): on no release would it notify anything."""
    release = release_of(rgw)
    s3, sns = s3_client(rgw), sns_client(rgw)
    bucket = unique("abort-mpu")
    s3.create_bucket(Bucket=bucket)
    arn = sns.create_topic(Name=unique("abort-mpu"), Attributes={"push-endpoint": DEAD_ENDPOINT})[
        "TopicArn"
    ]
    config = {
        "Id": "n",
        "TopicArn": arn,
        "Events": ["s3:ObjectLifecycle:Expiration:AbortMultipartUpload"],
    }
    try:
        if (release.major or 0) >= 18:
            s3.put_bucket_notification_configuration(
                Bucket=bucket, NotificationConfiguration={"TopicConfigurations": [config]}
            )
            stored = s3.get_bucket_notification_configuration(Bucket=bucket)
            assert [c["Events"] for c in stored["TopicConfigurations"]] == [["s3:UnknownEvent"]]
        else:
            with pytest.raises(botocore.exceptions.ClientError) as refused:
                s3.put_bucket_notification_configuration(
                    Bucket=bucket, NotificationConfiguration={"TopicConfigurations": [config]}
                )
            assert refused.value.response["Error"]["Code"] == "InvalidArgument"
    finally:
        s3.delete_bucket(Bucket=bucket)
        sns.delete_topic(TopicArn=arn)


def test_radosgw_admin_lists_topics_in_the_shape_of_its_release(rgw: LocalService) -> None:
    """``radosgw-admin topic list`` (what ``devstack.gateway.listed_topic_names`` reads): a
    JSON list of topics on 20.2, ``{"topics": [topic, ...]}`` on 18.2, ``{"topics":
    [{"topic": topic, "subs": [...]}]}`` on 16.2."""
    release = release_of(rgw)
    sns = sns_client(rgw)
    name = unique("listed")
    arn = sns.create_topic(Name=name, Attributes={"push-endpoint": DEAD_ENDPOINT})["TopicArn"]
    try:
        listed = json.loads(
            subprocess.run(
                ceph_tool(rgw, "radosgw-admin", "topic", "list"),
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            ).stdout
        )
    finally:
        sns.delete_topic(TopicArn=arn)
    if (release.major or 0) >= 20:
        assert isinstance(listed, list)
        ours = [t for t in listed if t["name"] == name]
    elif release.major == 18:
        ours = [t for t in listed["topics"] if t["name"] == name]
    else:
        ours = [e["topic"] for e in listed["topics"] if e["topic"]["name"] == name]
        assert all(isinstance(e["subs"], list) for e in listed["topics"])
    assert len(ours) == 1, listed
    assert name in listed_topic_names(json.dumps(listed))


def test_events_a_release_lacks_make_the_notification_unsupported_and_the_others_are_written(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator, rgw: LocalService
) -> None:
    release = release_of(rgw)
    start_operator()
    bucket = unique("events")
    connection(rgw).s3().create_bucket(Bucket=bucket)
    apply(kubectl, namespace, "Topic", "t", {"endpoint": {"http": {"url": DEAD_ENDPOINT}}})
    wanted = {
        "lifecycle": ["s3:ObjectLifecycle:Expiration:Current", "s3:ObjectSynced:*"],
        "replication": ["s3:Replication:*"],
    }
    for name, events in wanted.items():
        spec = {"bucket": bucket, "id": name, "topicRef": {"name": "t"}, "testEvent": False}
        apply(kubectl, namespace, "BucketNotification", name, {**spec, "events": events})
    with NotificationClient(connection(rgw)) as notifications:
        for name, events in wanted.items():
            if release.refused_events(events):
                status = condition(
                    kubectl, namespace, "bucketnotification", name, "False", "Unsupported"
                )
                (ready,) = status["conditions"]
                assert ready["reason"] == "Unsupported"
                assert (
                    f"this gateway runs Ceph {release.name}, which has no event"
                    in (ready["message"])
                )
                assert all(event in ready["message"] for event in events)
                assert notifications.get(bucket, name) is None
            else:
                status = condition(kubectl, namespace, "bucketnotification", name)
                held = notifications.get(bucket, name)
                assert held is not None
                assert held.events == NotificationConfig(name, held.topic_arn, tuple(events)).events


def test_amqp_confirms_are_refused_where_the_gateways_own_amqp_client_aborts(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator, rgw: LocalService
) -> None:
    """Ceph 18.2's radosgw aborts when its own AMQP push waits for a broker's confirm
    (docs/gateway-compatibility.md): there the operator writes no such topic and says how
    to keep the confirms; elsewhere the gateway holds the ack level asked for."""
    release = release_of(rgw)
    start_operator()
    amqp = {"url": "amqp://127.0.0.1:9", "exchange": "events", "ackLevel": "broker"}
    apply(kubectl, namespace, "Topic", "confirmed", {"endpoint": {"amqp": amqp}})
    gateway = TopicClient(connection(rgw))
    # The release measured to abort, named here rather than read from the rule under test.
    if release.name == "reef":
        status = condition(kubectl, namespace, "topic", "confirmed", "False", "Unsupported")
        (ready,) = status["conditions"]
        assert f"this gateway runs Ceph {release.name}" in ready["message"]
        assert "set persistent: true" in ready["message"]
        assert not [arn for arn in gateway.list_arns() if arn.endswith(f"{namespace}_confirmed")]
        return
    arn = condition(kubectl, namespace, "topic", "confirmed")["arn"]
    held = gateway.get(arn)
    assert held is not None and not held.persistent
    assert held.endpoint_args["amqp-ack-level"] == "broker"


def test_a_persistent_topics_gateway_queue_never_expires_events_where_the_gateway_would(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator, rgw: LocalService
) -> None:
    """Ceph 20 drops an entry of its persistent queue past the topic's ``time_to_live`` or
    ``max_retries`` (a gateway-wide default when the topic has none). On the way to our
    ingest that would lose events with no dead letter: the operator sets both to 0 (no
    limit) where the gateway acts on them, and puts them back when changed."""
    release = release_of(rgw)
    start_operator(ingest_url="http://127.0.0.1:9")
    apply(
        kubectl,
        namespace,
        "Topic",
        "queued",
        {"endpoint": {"http": {"url": DEAD_ENDPOINT}}, "persistent": True, "maxRetries": 2},
    )
    arn = condition(kubectl, namespace, "topic", "queued")["arn"]
    gateway = TopicClient(connection(rgw))
    held = gateway.get(arn)
    assert held is not None and held.persistent
    if not release.queues_act_on_limits:
        assert held.queue_limits == {}
        assert "time_to_live" not in held.endpoint_args
        assert "max_retries" not in held.endpoint_args
        return
    # The Topic's maxRetries is the delivery service's, not the gateway's.
    assert held.queue_limits == {"time_to_live": "0", "max_retries": "0"}
    gateway.upsert(
        arn.rsplit(":", 1)[1],
        {
            "push-endpoint": held.endpoint_address,
            "persistent": "true",
            OWNER: held.endpoint_args[OWNER],
            "time_to_live": "60",
            "max_retries": "3",
        },
    )

    def limits() -> GatewayTopic | None:
        return gateway.get(arn)

    wait_until(
        limits,
        lambda t: t is not None and t.queue_limits == {"time_to_live": "0", "max_retries": "0"},
        10 * DRIFT_INTERVAL_S,
        "the gateway queue's limits put back",
    )
    assert "DriftRepaired" in kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout


def test_another_gateway_users_topic_is_a_name_conflict_where_topics_have_owners(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator, rgw: LocalService
) -> None:
    """Ceph 19 and later give each topic an owner (403 "Topic was created by another user."
    to anyone else): the Topic says so and leaves it alone, even when deleted. 16.2 and 18.2
    have no owners: a gateway user of the same tenant overwrites the other's topic."""
    release = release_of(rgw)
    theirs = TopicClient(connection(rgw, other=True))
    name = f"{namespace}_orders"  # the default gateway name of Topic <namespace>/orders
    arn = theirs.upsert(name, {"push-endpoint": "http://127.0.0.1:9/theirs"})
    try:
        start_operator()
        apply(kubectl, namespace, "Topic", "orders", {"endpoint": {"http": {"url": DEAD_ENDPOINT}}})
        if release.major is not None and release.major < 19:
            status = condition(kubectl, namespace, "topic", "orders")
            assert status["arn"] == arn
            overwritten = theirs.get(arn)
            assert overwritten is not None and overwritten.endpoint_address == DEAD_ENDPOINT
            return
        with pytest.raises(GatewayForeignTopic):
            TopicClient(connection(rgw)).get(arn)
        status = condition(kubectl, namespace, "topic", "orders", "False", "NameConflict")
        (ready,) = status["conditions"]
        assert "belongs to another gateway user" in ready["message"]
        assert "Topic was created by another user." in ready["message"]
        assert "spec.name" in ready["message"]
        assert "arn" not in status or status["arn"] is None
        kubectl.run("delete", "topic", "orders", "-n", namespace, "--timeout=30s")
        kept = theirs.get(arn)
        assert kept is not None and kept.endpoint_address == "http://127.0.0.1:9/theirs"
    finally:
        theirs.delete(arn)


def test_a_notification_on_another_gateway_users_topic_says_whose_it_is_where_topics_have_owners(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator, rgw: LocalService
) -> None:
    """A BucketNotification naming (topicARN) a topic another gateway user made: Ceph 19+
    refuses its reads (topic owners), and the notification says whose the topic is rather
    than guess at the bucket's owner; 16.2 and 18.2 let the tenant's users share it."""
    release = release_of(rgw)
    theirs = TopicClient(connection(rgw, other=True))
    arn = theirs.upsert(unique("theirs"), {"push-endpoint": DEAD_ENDPOINT})
    bucket = unique("theirs")
    connection(rgw).s3().create_bucket(Bucket=bucket)
    try:
        start_operator()
        spec = {"bucket": bucket, "topicARN": arn, "testEvent": False}
        apply(kubectl, namespace, "BucketNotification", "n", spec)
        if release.major is not None and release.major < 19:
            assert (
                condition(kubectl, namespace, "bucketnotification", "n")["applied"]["topicArn"]
                == arn
            )
            return
        status = condition(kubectl, namespace, "bucketnotification", "n", "False", "AccessDenied")
        (ready,) = status["conditions"]
        assert "the topic belongs to another gateway user" in ready["message"]
        assert "Topic was created by another user." in ready["message"]
        with NotificationClient(connection(rgw)) as notifications:
            assert notifications.get(bucket, "n") is None
    finally:
        kubectl.run("delete", "bucketnotification", "n", "-n", namespace, "--timeout=60s")
        theirs.delete(arn)
