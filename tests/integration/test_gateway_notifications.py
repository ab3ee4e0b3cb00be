"""NotificationClient against the real gateway: round trips, other Ids, errors, filtering."""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bucketnotify.gateway.errors import (
    GatewayAccessDenied,
    GatewayInvalidArgument,
    GatewayNotFound,
    GatewayUnreachable,
)
from bucketnotify.gateway.notifications import (
    FilterRule,
    NotificationClient,
    NotificationConfig,
    copy_topic_arn,
)
from bucketnotify.gateway.topics import TopicClient
from devstack.servers.recording import HttpReceiver
from tests.localservices import LocalService
from tests.s3 import DEAD_ENDPOINT, connection, release_of, unique


@pytest.fixture()
def client(rgw: LocalService) -> Iterator[NotificationClient]:
    notifications = NotificationClient(connection(rgw))
    yield notifications
    notifications.close()


@pytest.fixture()
def s3(rgw: LocalService) -> Any:
    return connection(rgw).s3()


class Topics:
    """Makes topics and deletes them all at the end of the test."""

    def __init__(self, client: TopicClient) -> None:
        self.client = client
        self.made: list[str] = []

    def make(self, endpoint: str = DEAD_ENDPOINT) -> str:
        arn = self.client.upsert(unique("nt"), {"push-endpoint": endpoint})
        self.made.append(arn)
        return arn


@pytest.fixture()
def topics(rgw: LocalService) -> Iterator[Topics]:
    made = Topics(TopicClient(connection(rgw)))
    yield made
    for arn in made.made:
        made.client.delete(arn)


@pytest.fixture()
def topic_arn(topics: Topics) -> str:
    return topics.make()


@pytest.fixture()
def bucket(s3: Any, client: NotificationClient) -> Iterator[str]:
    name = unique("nb")
    s3.create_bucket(Bucket=name)
    yield name
    for config in client.list(name):
        client.delete(name, config.id)
    # One object at a time: a multi-object delete aborts this radosgw on a bucket that has
    # notifications (docs/gateway-compatibility.md).
    for item in s3.list_objects_v2(Bucket=name).get("Contents", []):
        s3.delete_object(Bucket=name, Key=item["Key"])
    s3.delete_bucket(Bucket=name)


def test_round_trip_with_key_metadata_and_tag_filters(
    client: NotificationClient, bucket: str, topic_arn: str
) -> None:
    config = NotificationConfig(
        id="all-filters",
        topic_arn=topic_arn,
        events=("s3:ObjectCreated:*", "s3:ObjectRemoved:Delete"),
        key_filters=(
            FilterRule("regex", r"^images/.*\.png$"),
            FilterRule("suffix", ".png"),
            FilterRule("prefix", "images/"),
        ),
        metadata_filters=(
            FilterRule("x-amz-meta-size", "large"),
            FilterRule("x-amz-meta-color", "blue"),
        ),
        tag_filters=(FilterRule("team", "a"), FilterRule("env", "prod")),
    )

    client.put(bucket, config)

    assert client.get(bucket, "all-filters") == config
    assert client.list(bucket) == [config]


def test_a_gateway_with_a_private_ca_is_reached_over_https_with_aws_ca_bundle(
    rgw: LocalService,
    bucket: str,
    topic_arn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CA given as boto3 takes it (``AWS_CA_BUNDLE``, what the chart's
    ``gateway.caConfigMap`` sets) is the one notifications are verified with too; without
    it, every BucketNotification of such a gateway failed (ConnectError)."""
    monkeypatch.setenv("AWS_CA_BUNDLE", rgw["RGW_CA_PEM"])
    config = NotificationConfig(id="over-tls", topic_arn=topic_arn, events=("s3:ObjectCreated:*",))
    tls = dataclasses.replace(connection(rgw), endpoint=rgw["RGW_TLS_ENDPOINT"])
    with NotificationClient(tls) as over_tls:
        over_tls.put(bucket, config)
        assert over_tls.get(bucket, "over-tls") == config
        over_tls.delete(bucket, "over-tls", [topic_arn])
        assert over_tls.list(bucket) == []
    monkeypatch.delenv("AWS_CA_BUNDLE")
    with NotificationClient(tls) as unverified, pytest.raises(GatewayUnreachable):
        unverified.list(bucket)


def test_no_events_means_the_gateways_default(
    client: NotificationClient, s3: Any, bucket: str, topic_arn: str
) -> None:
    config = NotificationConfig(id="default-events", topic_arn=topic_arn, events=())

    client.put(bucket, config)

    assert client.get(bucket, "default-events") == config
    # What the gateway itself reports: all Created and all Removed events.
    (stored,) = s3.get_bucket_notification_configuration(Bucket=bucket)["TopicConfigurations"]
    assert stored["Events"] == ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]


def test_what_the_gateway_rewrites_still_compares_equal(
    client: NotificationClient, s3: Any, bucket: str, topic_arn: str
) -> None:
    """Events keep their order and repeats; aliases and empty key rules are normalised."""
    as_given = NotificationConfig(
        "kept-order",
        topic_arn,
        ("s3:ObjectRemoved:Delete", "s3:ObjectCreated:Put", "s3:ObjectCreated:Put"),
    )
    alias = NotificationConfig(
        "alias", topic_arn, ("OBJECT_CREATE",), key_filters=(FilterRule("prefix", ""),)
    )
    assert alias.events == ("s3:ObjectCreated:*",)
    assert alias.key_filters == ()

    client.put(bucket, as_given)
    client.put(bucket, alias)

    assert client.get(bucket, "kept-order") == as_given
    assert client.get(bucket, "alias") == alias


def test_repeated_metadata_names_are_refused_before_sending(
    client: NotificationClient, bucket: str, topic_arn: str
) -> None:
    config = NotificationConfig(
        "twice",
        topic_arn,
        (),
        metadata_filters=(FilterRule("x-amz-meta-a", "1"), FilterRule("x-amz-meta-a", "2")),
    )

    # The gateway would keep the first rule only: the config would never compare equal.
    with pytest.raises(GatewayInvalidArgument, match="x-amz-meta-a"):
        client.put(bucket, config)

    assert client.list(bucket) == []


def test_put_keeps_other_ids_and_replaces_its_own(
    client: NotificationClient, s3: Any, bucket: str, topic_arn: str
) -> None:
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "TopicConfigurations": [
                {"Id": "foreign", "TopicArn": topic_arn, "Events": ["s3:ObjectRemoved:*"]}
            ]
        },
    )
    foreign = client.get(bucket, "foreign")
    assert foreign == NotificationConfig("foreign", topic_arn, ("s3:ObjectRemoved:*",))
    first = NotificationConfig("ours-1", topic_arn, ("s3:ObjectCreated:Put",))
    second = NotificationConfig("ours-2", topic_arn, ("s3:ObjectCreated:Copy",))

    client.put(bucket, first)
    client.put(bucket, second)
    changed = NotificationConfig(
        "ours-1",
        topic_arn,
        ("s3:ObjectCreated:Post",),
        key_filters=(FilterRule("prefix", "in/"),),
    )
    client.put(bucket, changed)

    by_id = {config.id: config for config in client.list(bucket)}
    assert by_id == {"foreign": foreign, "ours-1": changed, "ours-2": second}
    assert len(client.list(bucket)) == 3


def test_put_many_writes_several_ids_at_once_and_keeps_the_others(
    client: NotificationClient, bucket: str, topics: Topics, topic_arn: str
) -> None:
    """One write for several Ids: a new one, a changed one, one moved to another topic;
    an Id not named stays as it was."""
    other_topic = topics.make()
    kept = NotificationConfig("kept", topic_arn, ("s3:ObjectRemoved:*",))
    client.put(bucket, kept)
    client.put(bucket, NotificationConfig("changed", topic_arn, ("s3:ObjectCreated:Put",)))
    client.put(bucket, NotificationConfig("moved", topic_arn, ()))
    batch = [
        NotificationConfig("new", topic_arn, (), key_filters=(FilterRule("suffix", ".jpg"),)),
        NotificationConfig("changed", topic_arn, ("s3:ObjectCreated:Copy",)),
        NotificationConfig("moved", other_topic, ()),
    ]

    client.put_many(bucket, batch)

    listed = client.list(bucket)
    assert sorted(listed, key=lambda c: c.id) == sorted([kept, *batch], key=lambda c: c.id)


def test_put_many_with_a_missing_topic_is_refused_and_names_it(
    client: NotificationClient, bucket: str, topic_arn: str
) -> None:
    """The caller puts the Ids one at a time after such a refusal, to find whose it is."""
    missing = f"arn:aws:sns:default::{unique('no-topic')}"
    batch = [
        NotificationConfig("fine", topic_arn, ()),
        NotificationConfig("lost", missing, ()),
    ]

    with pytest.raises(GatewayNotFound, match="NoSuchKey") as caught:
        client.put_many(bucket, batch)

    assert missing in str(caught.value)
    assert all(c.id != "lost" for c in client.list(bucket))
    with pytest.raises(ValueError, match="distinct"):
        client.put_many(bucket, [batch[0], batch[0]])


def test_put_moves_an_id_to_another_topic(
    client: NotificationClient, bucket: str, topics: Topics
) -> None:
    old_topic, new_topic = topics.make(), topics.make()
    client.put(bucket, NotificationConfig("moving", old_topic, ("s3:ObjectCreated:*",)))

    moved = NotificationConfig("moving", new_topic, ("s3:ObjectCreated:*",))
    client.put(bucket, moved)

    # Ceph 16 would keep the entry for the old topic beside the new one.
    assert client.list(bucket) == [moved]


def test_put_succeeds_beside_a_foreign_entry_whose_topic_is_gone(
    client: NotificationClient, s3: Any, bucket: str, topics: Topics, topic_arn: str
) -> None:
    gone = topics.make()
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "TopicConfigurations": [{"Id": "orphan", "TopicArn": gone, "Events": []}]
        },
    )
    topics.client.delete(gone)
    ours = NotificationConfig("ours", topic_arn, ("s3:ObjectCreated:*",))

    # Re-sending the orphan makes the gateway answer 404 NoSuchKey for its topic.
    client.put(bucket, ours)

    assert client.get(bucket, "ours") == ours
    assert client.get(bucket, "orphan") == NotificationConfig("orphan", gone, ())


def test_the_gateways_own_answer_to_a_put_naming_a_deleted_topic(
    rgw: LocalService, s3: Any, bucket: str, topics: Topics, topic_arn: str
) -> None:
    """docs/gateway-compatibility.md: every release answers 404 ``NoSuchKey``; 20.2 applies
    nothing of that PUT, 18.2 and 16.2 the entries before the one naming the deleted topic
    (why our client re-sends a foreign entry whose topic is gone, above)."""
    gone = topics.make()
    topics.client.delete(gone)
    entries = [
        {"Id": "before", "TopicArn": topic_arn, "Events": ["s3:ObjectCreated:*"]},
        {"Id": "orphan", "TopicArn": gone, "Events": ["s3:ObjectCreated:*"]},
    ]
    with pytest.raises(s3.exceptions.ClientError) as refused:
        s3.put_bucket_notification_configuration(
            Bucket=bucket, NotificationConfiguration={"TopicConfigurations": entries}
        )
    assert refused.value.response["Error"]["Code"] == "NoSuchKey"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    stored = s3.get_bucket_notification_configuration(Bucket=bucket)
    ids = sorted(c["Id"] for c in stored.get("TopicConfigurations", []))
    release = release_of(rgw)
    assert ids == ([] if (release.major or 0) >= 20 else ["before"]), release


def test_put_on_a_missing_topic_is_not_found(client: NotificationClient, bucket: str) -> None:
    arn = f"arn:aws:sns:default::{unique('no-topic')}"

    with pytest.raises(GatewayNotFound, match="NoSuchKey") as caught:
        client.put(bucket, NotificationConfig("lost", arn, ()))

    assert arn in str(caught.value)
    assert client.list(bucket) == []


def test_delete_removes_only_its_id(
    client: NotificationClient, s3: Any, bucket: str, topic_arn: str
) -> None:
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "TopicConfigurations": [
                {"Id": "foreign", "TopicArn": topic_arn, "Events": ["s3:ObjectCreated:*"]}
            ]
        },
    )
    client.put(bucket, NotificationConfig("ours", topic_arn, ("s3:ObjectCreated:*",)))

    client.delete(bucket, "ours")

    assert [config.id for config in client.list(bucket)] == ["foreign"]
    assert client.get(bucket, "ours") is None
    client.delete(bucket, "ours")  # gone already: not an error
    client.delete(bucket, "never-there")
    assert [config.id for config in client.list(bucket)] == ["foreign"]


def test_delete_refuses_an_empty_id(client: NotificationClient, bucket: str) -> None:
    # The gateway would take an empty Id for "all of them".
    with pytest.raises(ValueError, match="empty"):
        client.delete(bucket, "")


def test_a_missing_bucket_is_not_found(client: NotificationClient, topic_arn: str) -> None:
    missing = unique("missing")
    config = NotificationConfig("x", topic_arn, ())
    calls: list[Callable[[], object]] = [
        lambda: client.list(missing),
        lambda: client.get(missing, "x"),
        lambda: client.put(missing, config),
        lambda: client.delete(missing, "x"),
    ]
    for call in calls:
        with pytest.raises(GatewayNotFound, match="bucket does not exist") as caught:
            call()
        assert missing in str(caught.value)


def test_an_unknown_event_is_refused(
    rgw: LocalService, client: NotificationClient, s3: Any, bucket: str, topic_arn: str
) -> None:
    config = NotificationConfig("bad-event", topic_arn, ("s3:ObjectCreated:Teleport",))

    with pytest.raises(GatewayInvalidArgument, match="InvalidArgument") as caught:
        client.put(bucket, config)

    assert "s3:ObjectCreated:Teleport" in str(caught.value)
    assert caught.value.reason == "GatewayRefused"
    assert client.list(bucket) == []

    # The gateway's own answer (docs/gateway-compatibility.md): 400 InvalidArgument on every
    # release; a message naming the Id on 20.2, none on 18.2 and 16.2 (so our message names
    # the event itself, above).
    with pytest.raises(s3.exceptions.ClientError) as refused:
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "TopicConfigurations": [
                    {"Id": "bad-event", "TopicArn": topic_arn, "Events": list(config.events)}
                ]
            },
        )
    error = refused.value.response["Error"]
    assert error["Code"] == "InvalidArgument"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    release = release_of(rgw)
    if (release.major or 0) >= 20:
        assert "bad-event" in error.get("Message", ""), error
    else:
        assert not error.get("Message"), (release, error)


def test_another_user_is_denied(
    rgw: LocalService, client: NotificationClient, bucket: str, topic_arn: str
) -> None:
    client.put(bucket, NotificationConfig("owned", topic_arn, ()))
    other = NotificationClient(connection(rgw, other=True))
    calls: list[Callable[[], object]] = [
        lambda: other.list(bucket),
        lambda: other.get(bucket, "owned"),
        lambda: other.put(bucket, NotificationConfig("intruder", topic_arn, ())),
        lambda: other.delete(bucket, "owned"),
    ]
    for call in calls:
        with pytest.raises(GatewayAccessDenied) as caught:
            call()
        assert rgw["RGW_OTHER_SECRET_KEY"] not in str(caught.value)
    other.close()
    assert [config.id for config in client.list(bucket)] == ["owned"]


def test_a_wrong_secret_is_denied_without_showing_it(rgw: LocalService, bucket: str) -> None:
    secret = "wrong" + uuid.uuid4().hex
    wrong = NotificationClient(connection(rgw, secret=secret))
    with pytest.raises(GatewayAccessDenied) as caught:
        wrong.list(bucket)
    wrong.close()
    assert secret not in str(caught.value)
    assert "Signature=" not in str(caught.value)


def test_an_unreachable_gateway(rgw: LocalService, topic_arn: str) -> None:
    nowhere = NotificationClient(
        dataclasses.replace(connection(rgw), endpoint="http://127.0.0.1:1")
    )
    with pytest.raises(GatewayUnreachable):
        nowhere.list("any-bucket")
    with pytest.raises(GatewayUnreachable):
        nowhere.put("any-bucket", NotificationConfig("x", topic_arn, ()))
    with pytest.raises(GatewayUnreachable):
        nowhere.delete("any-bucket", "x")
    nowhere.close()


@pytest.fixture()
def receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as r:
        yield r


def test_metadata_and_tag_filters_filter(
    client: NotificationClient, s3: Any, bucket: str, topics: Topics, receiver: HttpReceiver
) -> None:
    """Events reach the endpoint only for objects whose metadata or tags match."""
    arn = topics.make(receiver.url)
    created = ("s3:ObjectCreated:*",)
    client.put(
        bucket,
        NotificationConfig(
            "blue-only", arn, created, metadata_filters=(FilterRule("x-amz-meta-color", "blue"),)
        ),
    )
    client.put(
        bucket, NotificationConfig("team-a", arn, created, tag_filters=(FilterRule("team", "a"),))
    )

    # The gateway pushes before it answers the PUT (the topic is not persistent): had it
    # sent anything for the objects that do not match, it would be queued ahead of the rest.
    s3.put_object(Bucket=bucket, Key="plain", Body=b"x")
    s3.put_object(Bucket=bucket, Key="red", Body=b"x", Metadata={"color": "red"})
    s3.put_object(Bucket=bucket, Key="team-b", Body=b"x", Tagging="team=b")
    s3.put_object(Bucket=bucket, Key="blue", Body=b"x", Metadata={"color": "blue"})
    s3.put_object(Bucket=bucket, Key="team-a", Body=b"x", Tagging="team=a")

    (first,) = receiver.next_records()
    assert (first["s3"]["configurationId"], first["s3"]["object"]["key"]) == ("blue-only", "blue")
    (second,) = receiver.next_records()
    assert (second["s3"]["configurationId"], second["s3"]["object"]["key"]) == (
        "team-a",
        "team-a",
    )


def test_delete_removes_the_topic_copy_a_failed_delete_left(
    rgw: LocalService, client: NotificationClient, bucket: str, topics: Topics, topic_arn: str
) -> None:
    """Ceph 16 and 18 make a topic ``<id>_<topic>`` for each notification (20 makes none);
    a DELETE answered 500 after removing the bucket's entry left it behind, and a second
    DELETE found nothing."""
    client.put(bucket, NotificationConfig("copied", topic_arn, ()))
    copy = copy_topic_arn(topic_arn, "copied")
    assert (topics.client.get(copy) is not None) == release_of(rgw).makes_topic_copies
    client.delete(bucket, "copied")
    assert topics.client.get(copy) is None
    # The state such a DELETE leaves: the entry gone, the copy there (made as the PUT does).
    topics.client.upsert(copy.rpartition(":")[2], {"push-endpoint": DEAD_ENDPOINT})

    client.delete(bucket, "copied")
    assert topics.client.get(copy) is not None  # the bucket no longer says which copy

    client.delete(bucket, "copied", [topic_arn])
    assert topics.client.get(copy) is None
    assert client.list(bucket) == []


def test_the_gateways_own_answers_to_plain_s3_configurations(
    rgw: LocalService, s3: Any, bucket: str, topics: Topics, receiver: HttpReceiver
) -> None:
    """The gateway facts our client is built on, shown with a plain S3 client (no
    NotificationClient): a PUT keeps the Ids it does not name (AWS would replace the whole
    configuration); an empty configuration is refused with MalformedXML, changing nothing,
    on 16.2, and deletes every Id on 18.2 and 20.2 (our client never sends one)."""
    arn = topics.make(receiver.url)

    def ids() -> list[str]:
        got = s3.get_bucket_notification_configuration(Bucket=bucket)
        return sorted(c["Id"] for c in got.get("TopicConfigurations", []))

    for config_id in ("first", "second"):
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "TopicConfigurations": [
                    {"Id": config_id, "TopicArn": arn, "Events": ["s3:ObjectCreated:*"]}
                ]
            },
        )
    assert ids() == ["first", "second"]

    # Both Ids notify: the gateway pushed for each before it answered the PUT.
    s3.put_object(Bucket=bucket, Key="any-key", Body=b"x")
    records = receiver.next_records()
    with contextlib.suppress(queue.Empty):
        while True:
            records += receiver.next_records(timeout=2)
    assert sorted(r["s3"]["configurationId"] for r in records) == ["first", "second"]

    if (release_of(rgw).major or 0) >= 18:
        s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={})
        assert ids() == []
        return
    with pytest.raises(s3.exceptions.ClientError) as refused:
        s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={})
    assert refused.value.response["Error"]["Code"] == "MalformedXML"
    assert ids() == ["first", "second"]
