"""The operator keeps each BucketNotification's Id on its bucket, and only that Id."""

from __future__ import annotations

import json
import queue
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bucketnotify.gateway.notifications import FilterRule, NotificationClient, NotificationConfig
from devstack.programs import free_port
from devstack.servers.recording import HttpReceiver, RecordingHttpServer
from devstack.servers.tcpproxy import TcpProxy
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import DRIFT_INTERVAL_S, StartOperator
from tests.processes import Program
from tests.resources import apply, condition, gateway_secret
from tests.s3 import connection, s3_client, sns_client
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")


@pytest.fixture(scope="module")
def s3(rgw: LocalService) -> Any:
    return s3_client(rgw)


@pytest.fixture(scope="module")
def notifications(rgw: LocalService) -> NotificationClient:
    return NotificationClient(connection(rgw))


@pytest.fixture()
def receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as r:
        yield r


@pytest.fixture()
def bucket(s3: Any) -> str:
    name = f"bn-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def http_topic(kubectl: Kubectl, namespace: str, name: str, url: str) -> None:
    apply(kubectl, namespace, "Topic", name, {"endpoint": {"http": {"url": url}}})
    condition(kubectl, namespace, "topic", name)


def test_notification_is_applied_with_every_filter_and_sends_a_test_event(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    receiver: HttpReceiver,
    notifications: NotificationClient,
    bucket: str,
    s3: Any,
) -> None:
    http_topic(kubectl, namespace, "hook", receiver.url)
    spec = {
        "bucket": bucket,
        "topicRef": {"name": "hook"},
        "events": ["s3:ObjectCreated:*"],
        "filter": {
            "key": {"prefix": "img/", "suffix": ".jpg"},
            "metadata": [
                {"name": "x-amz-meta-color", "value": "red"},
                {"name": "x-amz-meta-size", "value": "big"},
            ],
            "tags": [{"name": "env", "value": "prod"}, {"name": "team", "value": "a"}],
        },
    }
    apply(kubectl, namespace, "BucketNotification", "photos", spec)
    status = condition(kubectl, namespace, "bucketnotification", "photos")
    assert status["applied"]["id"] == "photos"
    assert status["applied"]["topicArn"].endswith(f":{namespace}_hook")

    test_event = receiver.bodies.get(timeout=20)
    assert test_event["Event"] == "s3:TestEvent"
    assert test_event["Bucket"] == bucket
    wait_until(
        lambda: kubectl.get("bucketnotification", "photos", namespace)["status"],
        lambda st: st.get("testEventSent") is True,
        20,
        "testEventSent",
    )
    listed = json.loads(kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout)
    (sent,) = [
        e
        for e in listed["items"]
        if e["involvedObject"].get("kind") == "BucketNotification"
        and e["involvedObject"]["name"] == "photos"
        and e["reason"] == "TestEventSent"
    ]
    assert sent["type"] == "Normal"
    assert sent["message"] == "s3:TestEvent sent to the HTTP endpoint of Topic hook"

    on_gateway = notifications.get(bucket, "photos")
    assert on_gateway is not None
    assert {(r.name, r.value) for r in on_gateway.key_filters} == {
        ("prefix", "img/"),
        ("suffix", ".jpg"),
    }
    assert [(r.name, r.value) for r in on_gateway.metadata_filters] == [
        ("x-amz-meta-color", "red"),
        ("x-amz-meta-size", "big"),
    ]
    assert [(r.name, r.value) for r in on_gateway.tag_filters] == [("env", "prod"), ("team", "a")]

    # Filtered out (no metadata; one metadata rule of two; one tag rule of two), then a
    # match: the first record must be the match.
    both = {"color": "red", "size": "big"}
    s3.put_object(Bucket=bucket, Key="img/plain.jpg", Body=b"x", Tagging="env=prod&team=a")
    s3.put_object(
        Bucket=bucket, Key="img/half.jpg", Body=b"x", Metadata={"color": "red"},
        Tagging="env=prod&team=a",
    )  # fmt: skip
    s3.put_object(Bucket=bucket, Key="img/tag.jpg", Body=b"x", Metadata=both, Tagging="env=prod")
    s3.put_object(
        Bucket=bucket, Key="img/red.jpg", Body=b"x", Metadata=both, Tagging="env=prod&team=a"
    )
    (record,) = receiver.next_records()
    assert record["s3"]["object"]["key"] == "img/red.jpg"
    assert record["s3"]["configurationId"] == "photos"


def test_foreign_configuration_survives_reconcile_and_delete(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    receiver: HttpReceiver,
    notifications: NotificationClient,
    bucket: str,
    s3: Any,
    rgw: LocalService,
) -> None:
    """A configuration created directly on the gateway is never touched by the operator."""
    http_topic(kubectl, namespace, "hook", receiver.url)
    topic_arn = kubectl.get("topic", "hook", namespace)["status"]["arn"]
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "TopicConfigurations": [
                {"Id": "foreign", "TopicArn": topic_arn, "Events": ["s3:ObjectRemoved:*"]}
            ]
        },
    )
    for name in ("mine-a", "mine-b"):
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            name,
            {
                "bucket": bucket,
                "topicRef": {"name": "hook"},
                "testEvent": False,
                "events": ["s3:ObjectCreated:Put"],
            },
        )
    for name in ("mine-a", "mine-b"):
        condition(kubectl, namespace, "bucketnotification", name)
    ids = {c.id for c in notifications.list(bucket)}
    assert ids == {"foreign", "mine-a", "mine-b"}

    kubectl.run("delete", "bucketnotification", "mine-a", "-n", namespace, "--timeout=30s")
    assert {c.id for c in notifications.list(bucket)} == {"foreign", "mine-b"}


def test_drift_of_the_id_on_the_bucket_is_repaired(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    receiver: HttpReceiver,
    notifications: NotificationClient,
    bucket: str,
) -> None:
    """An Id deleted, then an Id changed on the gateway, is put back as the spec says, each
    time with a DriftRepaired Event."""
    http_topic(kubectl, namespace, "hook", receiver.url)
    spec = {
        "bucket": bucket,
        "topicRef": {"name": "hook"},
        "testEvent": False,
        "events": ["s3:ObjectCreated:Put", "s3:ObjectRemoved:Delete"],
        "filter": {"key": {"prefix": "in/"}},
    }
    apply(kubectl, namespace, "BucketNotification", "n", spec)
    status = condition(kubectl, namespace, "bucketnotification", "n")
    wanted = NotificationConfig(
        "n",
        status["applied"]["topicArn"],
        ("s3:ObjectCreated:Put", "s3:ObjectRemoved:Delete"),
        key_filters=(FilterRule("prefix", "in/"),),
    )
    assert notifications.get(bucket, "n") == wanted

    notifications.delete(bucket, "n")
    wait_until(
        lambda: notifications.get(bucket, "n"),
        lambda c: c == wanted,
        5 * DRIFT_INTERVAL_S,
        "the deleted Id to be re-applied as the spec says",
    )
    wait_until(
        lambda: drift_repairs(kubectl, namespace, "n"),
        lambda n: n == 1,
        10,
        "a DriftRepaired Event",
    )

    notifications.put(bucket, replace(wanted, events=("s3:ObjectCreated:*",), key_filters=()))
    wait_until(
        lambda: notifications.get(bucket, "n"),
        lambda c: c == wanted,
        5 * DRIFT_INTERVAL_S,
        "the changed Id to be repaired",
    )
    # The same Event, its count patched: at most every 30 s after its last write.
    wait_until(
        lambda: drift_repairs(kubectl, namespace, "n"),
        lambda n: n == 2,
        40,
        "a second DriftRepaired occurrence",
    )
    assert ready(kubectl, namespace, "n")["status"] == "True"


def drift_repairs(kubectl: Kubectl, namespace: str, name: str) -> int:
    """How many times a DriftRepaired Event of the object was posted (its count)."""
    events = json.loads(
        kubectl.run(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={name},reason=DriftRepaired",
            "-o",
            "json",
        ).stdout
    )["items"]
    return sum(int(e.get("count") or 1) for e in events)


def ready(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    status = kubectl.get("bucketnotification", name, namespace)["status"]
    found: dict[str, Any] = {c["type"]: c for c in status["conditions"]}["Ready"]
    return found


def test_invalid_regex_is_caught_before_the_gateway(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    receiver: HttpReceiver,
    notifications: NotificationClient,
    bucket: str,
) -> None:
    """The gateway accepts any regex in the configuration and aborts at the next upload
    when it does not compile (Ceph 16.2); the operator refuses such a regex, ``img{``
    included, which Python's re would take."""
    http_topic(kubectl, namespace, "hook", receiver.url)
    for name, regex, words in [
        ("unbalanced", "img/(.*\\.jpg", "never closed"),
        ("lookbehind", "(?<=img/).*", "group kind"),
        ("open-brace", "img{", "not followed by a count"),
    ]:
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            name,
            {"bucket": bucket, "topicRef": {"name": "hook"}, "filter": {"key": {"regex": regex}}},
        )
        status = condition(kubectl, namespace, "bucketnotification", name, "False", "InvalidFilter")
        assert words in status["conditions"][0]["message"]
    assert notifications.list(bucket) == []


def test_missing_bucket_and_unready_topic_wait_then_recover(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    receiver: HttpReceiver,
    s3: Any,
    notifications: NotificationClient,
) -> None:
    later = f"bn-{uuid.uuid4().hex[:12]}"
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        "early",
        {"bucket": later, "topicRef": {"name": "hook"}, "testEvent": False},
    )
    condition(kubectl, namespace, "bucketnotification", "early", "False", "TopicNotFound")
    # A Topic that cannot be Ready: persistent, and this operator has no ingest URL.
    apply(
        kubectl,
        namespace,
        "Topic",
        "hook",
        {"endpoint": {"http": {"url": receiver.url}}, "persistent": True},
    )
    condition(kubectl, namespace, "topic", "hook", "False", "DeliveryNotConfigured")
    condition(kubectl, namespace, "bucketnotification", "early", "False", "TopicNotReady")
    http_topic(kubectl, namespace, "hook", receiver.url)
    condition(kubectl, namespace, "bucketnotification", "early", "False", "BucketNotFound")
    s3.create_bucket(Bucket=later)
    condition(kubectl, namespace, "bucketnotification", "early")
    assert notifications.get(later, "early") is not None
    # Each wait was a retry kopf logs as "failed temporarily": an expected wait is a
    # WARNING, never an ERROR (kopf's own level), so that ERROR means "needs a person".
    waits = [
        json.loads(line)
        for line in operator.log().splitlines()
        if "failed temporarily" in line and f'"namespace": "{namespace}"' in line
    ]
    assert waits, "no retried wait in the operator's log"
    assert {wait["severity"] for wait in waits} == {"warning"}


def test_credentials_that_do_not_own_the_bucket_say_so(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    receiver: HttpReceiver,
    bucket: str,
    rgw: LocalService,
) -> None:
    http_topic(kubectl, namespace, "hook", receiver.url)
    gateway_secret(
        kubectl,
        namespace,
        "other-user",
        rgw["RGW_ENDPOINT"],
        rgw["RGW_OTHER_ACCESS_KEY"],
        rgw["RGW_OTHER_SECRET_KEY"],
    )
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        "not-mine",
        {
            "bucket": bucket,
            "topicRef": {"name": "hook"},
            "gatewayRef": {"secretName": "other-user"},
        },
    )
    status = condition(
        kubectl, namespace, "bucketnotification", "not-mine", "False", "AccessDenied"
    )
    message = status["conditions"][0]["message"]
    assert rgw["RGW_OTHER_ACCESS_KEY"] in message and bucket in message
    assert rgw["RGW_OTHER_SECRET_KEY"] not in json.dumps(status)


def test_a_notification_without_gateway_ref_uses_its_topics(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    receiver: HttpReceiver,
    rgw: LocalService,
) -> None:
    """A Topic on another user's gateway account (``gatewayRef``); a BucketNotification
    naming no gateway goes to its Topic's: it is written with that user's credentials on
    that user's bucket (the operator's own user may not touch it) and its events arrive."""
    other = connection(rgw, other=True).s3()
    bucket = f"bn-other-{uuid.uuid4().hex[:10]}"
    other.create_bucket(Bucket=bucket)
    gateway_secret(
        kubectl,
        namespace,
        "other-user",
        rgw["RGW_ENDPOINT"],
        rgw["RGW_OTHER_ACCESS_KEY"],
        rgw["RGW_OTHER_SECRET_KEY"],
    )
    try:
        apply(
            kubectl,
            namespace,
            "Topic",
            "theirs",
            {
                "endpoint": {"http": {"url": receiver.url}},
                "gatewayRef": {"secretName": "other-user"},
            },
        )
        condition(kubectl, namespace, "topic", "theirs")
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            "follows",
            {"bucket": bucket, "topicRef": {"name": "theirs"}, "testEvent": False},
        )
        condition(kubectl, namespace, "bucketnotification", "follows")
        configured = other.get_bucket_notification_configuration(Bucket=bucket)
        assert [c["Id"] for c in configured["TopicConfigurations"]] == ["follows"]

        other.put_object(Bucket=bucket, Key="theirs.txt", Body=b"x")
        (record,) = receiver.next_records()
        assert (record["s3"]["configurationId"], record["s3"]["object"]["key"]) == (
            "follows",
            "theirs.txt",
        )
    finally:
        kubectl.run("delete", "bucketnotification", "follows", "-n", namespace, "--wait=true")
        for item in other.list_objects_v2(Bucket=bucket).get("Contents", []):
            other.delete_object(Bucket=bucket, Key=item["Key"])
        other.delete_bucket(Bucket=bucket)


def test_a_deletion_gives_up_with_a_warning_when_its_gateway_is_gone(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    receiver: HttpReceiver,
    rgw: LocalService,
    bucket: str,
    notifications: NotificationClient,
) -> None:
    """Deleting a BucketNotification whose gateway went away retries, then releases the
    object with an ``OrphanedOnGateway`` Warning naming the Id left on the gateway."""
    start_operator(delete_give_up_after_seconds="4")
    target = urlsplit(rgw["RGW_ENDPOINT"])
    assert target.hostname is not None and target.port is not None
    proxy = TcpProxy(target.hostname, target.port)
    gateway_secret(
        kubectl, namespace, "gw-gone", proxy.url, rgw["RGW_ACCESS_KEY"], rgw["RGW_SECRET_KEY"]
    )
    proxy.start()
    http_topic(kubectl, namespace, "hook", receiver.url)
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        "orphan",
        {
            "bucket": bucket,
            "topicRef": {"name": "hook"},
            "gatewayRef": {"secretName": "gw-gone"},
            "testEvent": False,
        },
    )
    condition(kubectl, namespace, "bucketnotification", "orphan")
    proxy.stop()

    kubectl.run("delete", "bucketnotification", "orphan", "-n", namespace, "--timeout=60s")
    warnings = [
        event
        for event in json.loads(kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout)[
            "items"
        ]
        if event["reason"] == "OrphanedOnGateway"
    ]
    assert len(warnings) == 1, warnings
    assert warnings[0]["type"] == "Warning"
    assert warnings[0]["involvedObject"]["name"] == "orphan"
    assert "notification Id orphan" in warnings[0]["message"]
    assert "DELETE /<bucket>?notification=<id>" in warnings[0]["message"]
    # The gateway was unreachable: the Id is left there, as the Warning says.
    assert notifications.get(bucket, "orphan") is not None
    notifications.delete(bucket, "orphan")


def test_topic_change_is_carried_to_its_notifications(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    bucket: str,
    s3: Any,
) -> None:
    """The gateway applies a topic change only to re-written notifications: the operator
    re-writes them, so events follow the Topic to its new endpoint."""
    with HttpReceiver() as old, HttpReceiver() as new:
        http_topic(kubectl, namespace, "hook", old.url)
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            "n",
            {"bucket": bucket, "topicRef": {"name": "hook"}, "testEvent": False},
        )
        condition(kubectl, namespace, "bucketnotification", "n")
        s3.put_object(Bucket=bucket, Key="one", Body=b"1")
        assert old.next_records()[0]["s3"]["object"]["key"] == "one"

        before = kubectl.get("bucketnotification", "n", namespace)["metadata"]["resourceVersion"]
        apply(kubectl, namespace, "Topic", "hook", {"endpoint": {"http": {"url": new.url}}})
        wait_until(
            lambda: kubectl.get("bucketnotification", "n", namespace)["metadata"],
            lambda meta: (
                meta["resourceVersion"] != before
                and "bucketnotify.io/topic-resync" in meta.get("annotations", {})
            ),
            30,
            "the notification to be re-applied",
        )
        condition(kubectl, namespace, "bucketnotification", "n")

        def delivered_to_new() -> bool:
            key = f"probe-{uuid.uuid4().hex[:6]}"
            s3.put_object(Bucket=bucket, Key=key, Body=b"2")
            try:
                return new.next_records(timeout=3)[0]["s3"]["object"]["key"] == key
            except queue.Empty:
                return False

        wait_until(delivered_to_new, bool, 30, "events at the Topic's new endpoint")


def test_a_topic_made_on_the_gateway_is_used_by_arn_and_never_deleted(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    rgw: LocalService,
    receiver: HttpReceiver,
    notifications: NotificationClient,
    bucket: str,
    s3: Any,
) -> None:
    """spec.topicARN: a topic another team made through the gateway's SNS API. The
    notification is Ready once the gateway has it, events flow to its endpoint, and deleting
    the notification removes its Id but leaves the topic."""
    sns = sns_client(rgw)
    name = f"made-by-hand-{uuid.uuid4().hex[:8]}"
    arn = sns.create_topic(Name=name, Attributes={"push-endpoint": receiver.url})["TopicArn"]
    try:
        missing = arn.replace(name, f"{name}-missing")
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            "lost",
            {"bucket": bucket, "topicARN": missing},
        )
        status = condition(kubectl, namespace, "bucketnotification", "lost", "False")
        (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
        assert ready["reason"] == "TopicNotFound"
        assert missing in ready["message"]
        assert notifications.get(bucket, "lost") is None
        kubectl.run("delete", "bucketnotification", "lost", "-n", namespace)

        spec = {"bucket": bucket, "topicARN": arn, "events": ["s3:ObjectCreated:*"]}
        apply(kubectl, namespace, "BucketNotification", "by-arn", spec)
        status = condition(kubectl, namespace, "bucketnotification", "by-arn")
        assert status["applied"]["topicArn"] == arn
        on_gateway = notifications.get(bucket, "by-arn")
        assert on_gateway is not None and on_gateway.topic_arn == arn

        s3.put_object(Bucket=bucket, Key="by-arn.txt", Body=b"x")
        (record,) = receiver.next_records()
        assert record["s3"]["object"]["key"] == "by-arn.txt"
        assert record["s3"]["configurationId"] == "by-arn"

        kubectl.run("delete", "bucketnotification", "by-arn", "-n", namespace, "--timeout=60s")
        assert notifications.get(bucket, "by-arn") is None
        assert sns.get_topic_attributes(TopicArn=arn)["Attributes"]["TopicArn"] == arn
    finally:
        s3.delete_object(Bucket=bucket, Key="by-arn.txt")
        sns.delete_topic(TopicArn=arn)


def counting_gateway(kubectl: Kubectl, namespace: str, rgw: LocalService) -> TcpProxy:
    """A started proxy to the gateway that records what is sent through it, and the gateway
    Secret ``gw-counted`` pointing at it (for a ``gatewayRef``)."""
    target = urlsplit(rgw["RGW_ENDPOINT"])
    assert target.hostname is not None and target.port is not None
    proxy = TcpProxy(target.hostname, target.port)
    proxy.start()
    gateway_secret(
        kubectl, namespace, "gw-counted", proxy.url, rgw["RGW_ACCESS_KEY"], rgw["RGW_SECRET_KEY"]
    )
    return proxy


def test_notifications_of_one_bucket_applied_together_are_written_together(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    receiver: HttpReceiver,
    rgw: LocalService,
    bucket: str,
    notifications: NotificationClient,
) -> None:
    """Eight BucketNotifications of one bucket applied at once: each is Ready with its own
    Id on the bucket, and the operator wrote the bucket's configuration fewer times than
    there are notifications (those that waited for the bucket were written together)."""
    proxy = counting_gateway(kubectl, namespace, rgw)
    metrics_port = free_port()
    start_operator(metrics_port=str(metrics_port))
    http_topic(kubectl, namespace, "hook", receiver.url)
    names = [f"together-{i}" for i in range(8)]
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "bucketnotify.io/v1alpha1",
                    "kind": "BucketNotification",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "bucket": bucket,
                        "topicRef": {"name": "hook"},
                        "gatewayRef": {"secretName": "gw-counted"},
                        "events": ["s3:ObjectCreated:*"],
                        "filter": {"key": {"prefix": f"{name}/"}},
                        "testEvent": False,
                    },
                }
                for name in names
            ],
        }
    )
    for name in names:
        condition(kubectl, namespace, "bucketnotification", name)
    stored = {config.id: config for config in notifications.list(bucket)}
    assert sorted(stored) == names
    assert all(stored[n].key_filters == (FilterRule("prefix", f"{n}/"),) for n in names)
    sent = proxy.sent()
    puts = sent.count(f"PUT /{bucket}?notification HTTP/1.1".encode())
    gets = sent.count(f"GET /{bucket}?notification HTTP/1.1".encode())
    proxy.stop()
    print(f"{len(names)} notifications of one bucket written in {puts} PUTs")
    assert 1 <= puts < len(names)
    # The operator's own count of the same (the Topic's gateway topic is no bucket write).
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as answer:
        families = list(text_string_to_metric_families(answer.read().decode()))
    samples = {s.name: s.value for family in families for s in family.samples}
    assert samples["bucketnotify_bucket_writes_total"] == puts
    assert samples["bucketnotify_bucket_write_notifications_total"] == len(names)
    # Its count of requests by operation: the bucket's through the proxy, exactly; the
    # Topic's went to the default gateway, beside the proxy.
    requests = {
        s.labels["operation"]: s.value
        for family in families
        for s in family.samples
        if s.name == "bucketnotify_gateway_requests_total"
    }
    assert requests["PutBucketNotificationConfiguration"] == puts
    assert requests["GetBucketNotificationConfiguration"] == gets >= 1
    assert requests["CreateTopic"] >= 1


def test_drift_checks_of_one_bucket_share_its_reads(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    receiver: HttpReceiver,
    rgw: LocalService,
    bucket: str,
    notifications: NotificationClient,
) -> None:
    """Six BucketNotifications of one bucket, checked for drift every 3 s: the bucket is
    read about once per interval, not once per notification, and drift is still repaired."""
    proxy = counting_gateway(kubectl, namespace, rgw)
    start_operator()
    http_topic(kubectl, namespace, "hook", receiver.url)
    names = [f"checked-{i}" for i in range(6)]
    for name in names:
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            name,
            {
                "bucket": bucket,
                "topicRef": {"name": "hook"},
                "gatewayRef": {"secretName": "gw-counted"},
                "events": ["s3:ObjectCreated:*"],
                "filter": {"key": {"prefix": f"{name}/"}},
                "testEvent": False,
            },
        )
    for name in names:
        condition(kubectl, namespace, "bucketnotification", name)

    read = f"GET /{bucket}?notification".encode()
    before = proxy.sent().count(read)
    window = 6 * DRIFT_INTERVAL_S
    time.sleep(window)
    reads = proxy.sent().count(read) - before
    print(f"{len(names)} notifications of one bucket: {reads} reads in {window} s")
    # Without sharing: 6 x 6 = 36 reads. Each shared read is reused for one interval, so
    # about one per interval, and a second when a check falls just past the reuse.
    assert 1 <= reads <= 2 * window // DRIFT_INTERVAL_S

    notifications.delete(bucket, "checked-3")
    wait_until(
        lambda: notifications.get(bucket, "checked-3"),
        lambda found: found is not None,
        5 * DRIFT_INTERVAL_S,
        "the deleted Id put back by a drift check",
    )
    proxy.stop()


def test_a_failed_push_of_a_gateway_delivered_topic_does_not_fail_the_put_and_is_gone(
    kubectl: Kubectl, namespace: str, operator: Program, bucket: str, s3: Any
) -> None:
    """A non-persistent Topic is delivered by the gateway inside the S3 request. A push
    that fails (the endpoint answers 500) does not fail the upload, and the gateway never
    sends that event again: once the endpoint answers 200, only later uploads arrive. Who
    cannot lose an event uses a persistent Topic."""
    with RecordingHttpServer(status=500) as endpoint:
        http_topic(kubectl, namespace, "hook", f"{endpoint.url}/hook")
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            "n",
            {
                "bucket": bucket,
                "topicRef": {"name": "hook"},
                "testEvent": False,
                "events": ["s3:ObjectCreated:Put"],
            },
        )
        condition(kubectl, namespace, "bucketnotification", "n")
        answered = s3.put_object(Bucket=bucket, Key="while-failing", Body=b"x")
        assert answered["ResponseMetadata"]["HTTPStatusCode"] == 200
        pushes: list[tuple[int, str]] = []

        def seen() -> list[tuple[int, str]]:
            for request in endpoint.received():
                for record in json.loads(request.body)["Records"]:
                    pushes.append((request.status, record["s3"]["object"]["key"]))
            return pushes

        wait_until(seen, lambda p: (500, "while-failing") in p, 20, "the failed push")
        endpoint.status = 200
        s3.put_object(Bucket=bucket, Key="after", Body=b"x")
        wait_until(seen, lambda p: (200, "after") in p, 20, "the next upload's push")
        # Anything the gateway would send again would come within this.
        time.sleep(3)
        assert seen() == [(500, "while-failing"), (200, "after")]
