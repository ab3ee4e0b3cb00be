"""What the operator sends to the gateway for each kind of Topic (pure functions)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from bucketnotify.api.topic import Credentials, TopicSpec, endpoint_topic_name
from bucketnotify.controller.conditions import set_condition
from bucketnotify.controller.topic_builder import (
    TopicBuildError,
    differences,
    gateway_attributes,
    ingest_endpoint,
    referenced_secrets,
)
from bucketnotify.gateway.release import GatewayRelease


def build(
    spec: dict[str, Any], credentials: Credentials | None = None, **kw: Any
) -> dict[str, str]:
    options: dict[str, Any] = {
        "allow_cleartext_secrets": False,
        "ingest_url": None,
        "gateway_endpoint": "https://gateway",
        **kw,
    }
    return gateway_attributes(TopicSpec.model_validate(spec), credentials=credentials, **options)


def test_http_topic_carries_the_reference_attributes() -> None:
    attributes = build(
        {
            "endpoint": {"http": {"url": "https://hooks/x", "verifySSL": False}},
            "opaqueData": "od",
            "policy": {"Version": "2012-10-17", "Statement": []},
        }
    )
    assert attributes == {
        "push-endpoint": "https://hooks/x",
        "verify-ssl": "false",
        "cloudevents": "false",
        "OpaqueData": "od",
        "Policy": '{"Statement":[],"Version":"2012-10-17"}',
        "persistent": "false",
    }


def test_amqp_credentials_are_url_encoded_into_the_push_endpoint_over_tls() -> None:
    attributes = build(
        {
            "endpoint": {
                "amqp": {
                    "url": "amqps://broker:5671",
                    "exchange": "ex",
                    "vhost": "prod/eu",
                    "credentialsRef": {"secretName": "s"},
                }
            }
        },
        Credentials("al ice", "p@ss:w/rd"),
    )
    assert attributes["push-endpoint"] == "amqps://al%20ice:p%40ss%3Aw%2Frd@broker:5671/prod%2Feu"
    assert attributes["amqp-exchange"] == "ex"
    assert attributes["amqp-ack-level"] == "broker"


@pytest.mark.parametrize(
    ("endpoint", "fix"),
    [
        (
            {"amqp": {"url": "amqp://b", "exchange": "e", "credentialsRef": {"secretName": "s"}}},
            "amqps://",
        ),
        (
            {"kafka": {"url": "kafka://b:9092", "sasl": {"credentialsRef": {"secretName": "s"}}}},
            "useSSL: true",
        ),
    ],
)
def test_credentials_without_tls_are_refused_unless_allowed(
    endpoint: dict[str, Any], fix: str
) -> None:
    credentials = Credentials("u", "topsecret")
    with pytest.raises(TopicBuildError) as refused:
        build({"endpoint": endpoint}, credentials)
    assert refused.value.reason == "CleartextCredentials"
    assert fix in str(refused.value)
    assert "topsecret" not in str(refused.value)
    allowed = build({"endpoint": endpoint}, credentials, allow_cleartext_secrets=True)
    assert "u:topsecret@" in allowed["push-endpoint"]


def test_kafka_options_map_to_gateway_names() -> None:
    attributes = build(
        {
            "endpoint": {
                "kafka": {
                    "url": "kafka://b1:9092",
                    "brokers": ["b2:9092", "b3"],
                    "useSSL": True,
                    "ackLevel": "none",
                    "sasl": {"mechanism": "SCRAM-SHA-512", "credentialsRef": {"secretName": "k"}},
                }
            }
        },
        Credentials("u", "p"),
    )
    assert attributes["push-endpoint"] == "kafka://u:p@b1:9092"
    assert attributes["kafka-brokers"] == "b2:9092,b3"
    assert attributes["use-ssl"] == "true"
    assert attributes["kafka-ack-level"] == "none"
    assert attributes["mechanism"] == "SCRAM-SHA-512"


def test_persistent_topic_points_the_gateway_at_the_ingest_and_keeps_credentials_away() -> None:
    spec = {
        "endpoint": {
            "kafka": {
                "url": "kafka://b:9092",
                "useSSL": True,
                "sasl": {"credentialsRef": {"secretName": "k"}},
            }
        },
        "persistent": True,
        "maxRetries": 5,
        "delivery": {"handoff": "sync"},
    }
    ingest = ingest_endpoint("http://delivery:8080/", "team-a", "orders", "tok")
    attributes = build(spec, Credentials("u", "secret"), ingest_url=ingest)
    assert attributes == {
        "push-endpoint": "http://delivery:8080/v1/topics/team-a/orders/tok",
        "persistent": "false",
    }
    spec["delivery"] = {"handoff": "persistent"}
    assert build(spec, ingest_url=ingest)["persistent"] == "true"
    with pytest.raises(TopicBuildError) as refused:
        build(spec)
    assert refused.value.reason == "DeliveryNotConfigured"


def test_gateway_side_ca_is_refused_for_non_persistent_topics() -> None:
    with pytest.raises(TopicBuildError) as refused:
        build({"endpoint": {"http": {"url": "https://h", "caRef": {"name": "ca"}}}})
    assert refused.value.reason == "Unsupported"


def test_referenced_secrets_cover_gateway_credentials_and_ca() -> None:
    spec = TopicSpec.model_validate(
        {
            "endpoint": {
                "amqp": {
                    "url": "amqps://b",
                    "exchange": "e",
                    "credentialsRef": {"secretName": "creds"},
                    "caRef": {"kind": "Secret", "name": "ca"},
                }
            },
            "gatewayRef": {"secretName": "gw"},
        }
    )
    assert referenced_secrets(spec) == {"creds", "ca", "gw"}


def test_differences_name_the_drifted_attributes() -> None:
    desired = {"push-endpoint": "http://a", "OpaqueData": "x", "verify-ssl": "true"}
    assert differences(desired, "http://a", {"OpaqueData": "x", "verify-ssl": "true"}) == []
    assert differences(desired, "http://b", {"OpaqueData": "y"}) == [
        "push-endpoint",
        "OpaqueData",
        "verify-ssl",
    ]


def test_condition_keeps_transition_time_while_status_is_unchanged() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    first = set_condition(
        [], type="Ready", status="False", reason="A", message="m", generation=1, now=t0
    )
    later = set_condition(
        first,
        type="Ready",
        status="False",
        reason="B",
        message="n",
        generation=2,
        now=t0 + dt.timedelta(hours=1),
    )
    assert later[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert later[0]["reason"] == "B"
    flipped = set_condition(
        later,
        type="Ready",
        status="True",
        reason="Synced",
        message="",
        generation=2,
        now=t0 + dt.timedelta(hours=2),
    )
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T02:00:00Z"
    assert len(flipped) == 1


def test_a_condition_is_replaced_where_it_stands_so_two_writers_agree_on_the_order() -> None:
    """Ready (the reconciles) and Delivering (the delivery status loop) are written apart:
    setting one keeps the other's place, so the list a writer computes for an unchanged
    condition equals the stored one and nothing is written."""
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def ready(conditions: list[dict[str, Any]], status: str = "True") -> list[dict[str, Any]]:
        return set_condition(
            conditions, type="Ready", status=status, reason="Synced", message="", generation=1,
            now=t0,
        )  # fmt: skip

    stored = set_condition(
        ready([]), type="Delivering", status="True", reason="Delivering", message="",
        generation=1, now=t0,
    )  # fmt: skip
    assert [c["type"] for c in stored] == ["Ready", "Delivering"]
    assert ready(stored) == stored
    flipped = ready(stored, "False")
    assert [c["type"] for c in flipped] == ["Ready", "Delivering"]
    assert flipped[0]["status"] == "False" and flipped[1] == stored[1]


def test_cloud_events_on_a_non_persistent_topic_are_left_to_a_gateway_that_sends_them() -> None:
    """Ceph 16 accepts cloudevents=true and sends no ce-* headers; 18 and later send them."""
    http = {"http": {"url": "https://hooks/x", "cloudEvents": True}}
    pacific = GatewayRelease("pacific", "admin-info")
    with pytest.raises(TopicBuildError) as refused:
        build({"endpoint": http}, release=pacific)
    assert refused.value.reason == "Unsupported"
    assert "this gateway runs Ceph pacific" in str(refused.value)
    assert "needs a gateway of Ceph 18 or later" in str(refused.value)
    for release in (GatewayRelease("reef", "admin-info"), GatewayRelease("tentacle", "setting")):
        assert build({"endpoint": http}, release=release)["cloudevents"] == "true"
    ingest = "http://ingest/v1/topics/ns/t/token"
    persistent = build({"endpoint": http, "persistent": True}, ingest_url=ingest, release=pacific)
    assert persistent["push-endpoint"] == ingest


def test_amqp_confirms_are_not_left_to_a_gateway_whose_own_amqp_client_aborts() -> None:
    """Ceph 18.2's radosgw aborts when its own push waits for a broker's confirm; ackLevel
    none, a persistent Topic (the delivery service confirms) and other releases are written."""
    reef = GatewayRelease("reef", "admin-info")
    for ack in ("broker", "routable"):
        amqp = {"amqp": {"url": "amqp://mq", "exchange": "ex", "ackLevel": ack}}
        with pytest.raises(TopicBuildError) as refused:
            build({"endpoint": amqp}, release=reef)
        assert refused.value.reason == "Unsupported"
        assert "this gateway runs Ceph reef" in str(refused.value)
        assert "persistent: true" in str(refused.value)
        assert "ackLevel: none" in str(refused.value)
        for release in (
            GatewayRelease("pacific", "admin-info"),
            GatewayRelease("tentacle", "server-header"),
            GatewayRelease("unknown", "unreachable"),
            None,
        ):
            assert build({"endpoint": amqp}, release=release)["amqp-ack-level"] == ack
        ingest = "http://ingest/v1/topics/ns/t/token"
        persistent = build({"endpoint": amqp, "persistent": True}, ingest_url=ingest, release=reef)
        assert persistent["push-endpoint"] == ingest
    unconfirmed = {"amqp": {"url": "amqp://mq", "exchange": "ex", "ackLevel": "none"}}
    assert build({"endpoint": unconfirmed}, release=reef)["amqp-ack-level"] == "none"


def test_a_persistent_topics_endpoint_topic_is_endpoint_topic_else_spec_name_else_its_name() -> (
    None
):
    """The routing key or Kafka topic the delivery service sends a persistent Topic's events
    with: not namespace-qualified, as it names something on the user's own broker."""
    amqp = {"amqp": {"url": "amqps://rabbit", "exchange": "x"}}
    base = {"endpoint": amqp, "persistent": True}
    named = TopicSpec.model_validate({**base, "name": "orders-v2"})
    routed = TopicSpec.model_validate({**base, "name": "orders-v2", "endpointTopic": "eu.orders"})
    assert endpoint_topic_name("orders", TopicSpec.model_validate(base)) == "orders"
    assert endpoint_topic_name("orders", named) == "orders-v2"
    assert endpoint_topic_name("orders", routed) == "eu.orders"
