"""What depends on the gateway's Ceph release, as measured on 16.2, 18.2 and 20.2 (the
compatibility tier checks the same rules against the real gateways)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bucketnotify.api.notification import EVENT_TYPES
from bucketnotify.api.topic import TopicSpec
from bucketnotify.controller.topic_builder import QUEUE_WITHOUT_LIMITS, gateway_attributes
from bucketnotify.gateway.errors import (
    GatewayAccessDenied,
    GatewayForeignTopic,
    error_for_response,
)
from bucketnotify.gateway.notifications import NotificationConfig
from bucketnotify.gateway.release import GatewayRelease
from bucketnotify.gateway.topics import RAW_BODY, GatewayTopic, next_token

PACIFIC = GatewayRelease("pacific", "admin-info")
REEF = GatewayRelease("reef", "admin-info")
TENTACLE = GatewayRelease("tentacle", "server-header")
UNKNOWN = GatewayRelease("unknown", "unreachable")

LIFECYCLE = [e for e in EVENT_TYPES if e.startswith(("s3:ObjectLifecycle:", "s3:ObjectSynced:"))]
AWS_NAMES = [
    e for e in EVENT_TYPES if e.startswith(("s3:Replication:", "s3:LifecycleExpiration:"))
] + ["s3:LifecycleTransition"]
ORIGINAL = [e for e in EVENT_TYPES if e.startswith(("s3:ObjectCreated:", "s3:ObjectRemoved:"))]


def test_every_api_event_belongs_to_one_of_the_measured_families() -> None:
    assert sorted(ORIGINAL + LIFECYCLE + AWS_NAMES) == sorted(EVENT_TYPES)
    assert len(ORIGINAL) == 8


def test_each_release_refuses_the_events_it_does_not_have_and_names_them_in_order() -> None:
    assert PACIFIC.refused_events(ORIGINAL) == []
    assert PACIFIC.refused_events(["s3:ObjectCreated:Put", *LIFECYCLE]) == LIFECYCLE
    assert REEF.refused_events(ORIGINAL + LIFECYCLE) == []
    assert REEF.refused_events(AWS_NAMES) == AWS_NAMES
    assert TENTACLE.refused_events(EVENT_TYPES) == []
    # A gateway whose release is not known decides itself; its refusal then shows.
    assert UNKNOWN.refused_events(EVENT_TYPES) == []


def test_ceph_20_reports_noncurrent_in_the_spelling_18_refuses_and_it_reads_as_ours() -> None:
    for kind in ("Expiration", "Transition"):
        sent = NotificationConfig(
            "n", "arn:aws:sns:default::t", (f"s3:ObjectLifecycle:{kind}:Noncurrent",)
        )
        read = NotificationConfig(
            "n", "arn:aws:sns:default::t", (f"s3:ObjectLifecycle:{kind}:NonCurrent",)
        )
        assert read == sent


def _persistent(handoff: str) -> TopicSpec:
    return TopicSpec.model_validate(
        {
            "endpoint": {"http": {"url": "https://hooks/x"}},
            "persistent": True,
            "delivery": {"handoff": handoff},
        }
    )


def _attributes(spec: TopicSpec, release: GatewayRelease | None) -> dict[str, str]:
    return gateway_attributes(
        spec,
        credentials=None,
        allow_cleartext_secrets=False,
        ingest_url="http://ingest/v1/topics/ns/t/token",
        gateway_endpoint="https://gateway",
        release=release,
    )


@pytest.mark.parametrize("release", [PACIFIC, REEF, UNKNOWN, None], ids=str)
def test_queue_limits_are_only_sent_where_the_gateways_queue_acts_on_them(
    release: GatewayRelease | None,
) -> None:
    attributes = _attributes(_persistent("persistent"), release)
    assert not set(QUEUE_WITHOUT_LIMITS) & set(attributes)


def test_on_ceph_20_the_gateways_own_queue_never_drops_an_event_for_the_ingest() -> None:
    """A gateway-wide rgw_topic_persistency_* default would expire events on their way to
    the delivery service, where timeToLive, maxRetries and the dead letter belong."""
    attributes = _attributes(_persistent("persistent"), TENTACLE)
    assert attributes["time_to_live"] == "0"
    assert attributes["max_retries"] == "0"
    assert attributes["persistent"] == "true"
    # handoff: sync keeps no gateway queue: nothing to limit.
    assert not set(QUEUE_WITHOUT_LIMITS) & set(_attributes(_persistent("sync"), TENTACLE))


def _endpoint(**fields: Any) -> dict[str, str]:
    endpoint = {
        "EndpointAddress": "http://ingest/x",
        "EndpointArgs": "Version=2010-03-31",
        "EndpointTopic": "t",
        "HasStoredSecret": False,
        "Persistent": True,
        **fields,
    }
    return {"TopicArn": "arn:aws:sns:default::t", "Name": "t", "EndPoint": json.dumps(endpoint)}


def test_ceph_20s_own_limit_fields_are_read_and_its_none_means_unset() -> None:
    set_ = GatewayTopic.from_attributes(
        _endpoint(TimeToLive="0", MaxRetries="3", RetrySleepDuration="None")
    )
    assert set_.queue_limits == {"time_to_live": "0", "max_retries": "3"}
    unset = GatewayTopic.from_attributes(
        _endpoint(TimeToLive="None", MaxRetries="None", RetrySleepDuration="None")
    )
    assert unset.queue_limits == {}
    # 16.2 and 18.2 have no such fields (18.2 keeps the values among EndpointArgs).
    assert GatewayTopic.from_attributes(_endpoint()).queue_limits == {}


def test_another_users_topic_is_a_name_conflict_and_other_denials_stay_denials() -> None:
    foreign = error_for_response(
        "GetTopicAttributes arn:aws:sns:default::t",
        403,
        "AuthorizationError",
        "Topic was created by another user.",
    )
    assert isinstance(foreign, GatewayForeignTopic)
    assert foreign.reason == "NameConflict"
    assert "Topic was created by another user." in str(foreign)
    denied = error_for_response("CreateTopic t", 403, "AuthorizationError", "")
    assert isinstance(denied, GatewayAccessDenied)
    assert not isinstance(denied, GatewayForeignTopic)
    assert denied.reason == "GatewayAccessDenied"


def test_the_next_page_is_found_where_ceph_20_writes_it_and_where_aws_does() -> None:
    ceph20 = (
        b'<ListTopicsResponse xmlns="https://sns.amazonaws.com/doc/2010-03-31/">'
        b"<ListTopicsResult><Topics><member><TopicArn>arn:aws:sns:default::a</TopicArn>"
        b"</member></Topics></ListTopicsResult><ResponseMetadata><RequestId>r</RequestId>"
        b"</ResponseMetadata><NextToken>4:8f:topics::topic.%3ab:head</NextToken>"
        b"</ListTopicsResponse>"
    )
    assert next_token({"Topics": [], RAW_BODY: ceph20}) == "4:8f:topics::topic.%3ab:head"
    assert next_token({"NextToken": "t2", RAW_BODY: b"<x/>"}) == "t2"
    last = ceph20.replace(b"<NextToken>4:8f:topics::topic.%3ab:head</NextToken>", b"")
    assert next_token({"Topics": [], RAW_BODY: last}) is None
    assert next_token({"Topics": []}) is None
