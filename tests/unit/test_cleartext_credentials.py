"""Broker credentials never cross a connection without TLS unless the admin allows it: to the
broker (persistent Topics too, where our delivery service connects), and to the gateway (a
non-persistent Topic hands them over inside CreateTopic's push-endpoint)."""

from __future__ import annotations

from typing import Any

import pytest

from bucketnotify.api.topic import Credentials, TopicSpec, broker_cleartext_refusal
from bucketnotify.controller.topic_builder import TopicBuildError, gateway_attributes

SECRET = Credentials("alice", "p4ss-word")
INGEST = "http://delivery:8085/v1/topics/ns/t/token"


def build(spec: dict[str, Any], *, allow: bool = False, gateway: str = "https://gw") -> Any:
    return gateway_attributes(
        TopicSpec.model_validate(spec),
        credentials=SECRET,
        allow_cleartext_secrets=allow,
        ingest_url=INGEST,
        gateway_endpoint=gateway,
    )


def amqp(url: str) -> dict[str, Any]:
    return {"amqp": {"url": url, "exchange": "ex", "credentialsRef": {"secretName": "s"}}}


def kafka(ssl: bool) -> dict[str, Any]:
    return {
        "kafka": {
            "url": "kafka://b:9092",
            "useSSL": ssl,
            "sasl": {"credentialsRef": {"secretName": "s"}},
        }
    }


@pytest.mark.parametrize(
    ("endpoint", "advice"),
    [(amqp("amqp://b"), "an amqps:// url"), (kafka(False), "useSSL: true")],
)
@pytest.mark.parametrize("persistent", [True, False])
def test_credentials_to_a_broker_without_tls_are_refused(
    endpoint: dict[str, Any], advice: str, persistent: bool
) -> None:
    with pytest.raises(TopicBuildError) as refused:
        build({"endpoint": endpoint, "persistent": persistent})
    assert refused.value.reason == "CleartextCredentials"
    assert advice in str(refused.value)
    assert SECRET.password not in str(refused.value)
    assert build({"endpoint": endpoint, "persistent": persistent}, allow=True)


def test_a_non_persistent_topic_does_not_hand_credentials_to_a_plain_http_gateway() -> None:
    spec = {"endpoint": amqp("amqps://b")}
    with pytest.raises(TopicBuildError) as refused:
        build(spec, gateway="http://gw:8080")
    assert refused.value.reason == "CleartextCredentials"
    assert "(http://gw:8080) is not HTTPS" in str(refused.value)
    assert SECRET.password not in str(refused.value)
    assert "alice:p4ss-word@" in build(spec)["push-endpoint"], "over https they go"
    assert build(spec, gateway="http://gw:8080", allow=True)


def test_a_persistent_topic_keeps_credentials_from_a_plain_http_gateway() -> None:
    attributes = build({"endpoint": amqp("amqps://b"), "persistent": True}, gateway="http://gw")
    assert attributes["push-endpoint"] == INGEST
    assert all(SECRET.password not in value for value in attributes.values())


@pytest.mark.parametrize(
    ("endpoint", "refused"),
    [
        (amqp("amqp://mq:5672"), True),
        (amqp("amqps://mq:5671"), False),
        (kafka(ssl=False), True),
        (kafka(ssl=True), False),
        ({"http": {"url": "http://hook"}}, False),
    ],
)
def test_the_delivery_service_asks_the_same_question_of_a_spec(
    endpoint: dict[str, Any], refused: bool
) -> None:
    spec = TopicSpec.model_validate({"endpoint": endpoint, "persistent": True})
    refusal = broker_cleartext_refusal(spec)
    assert (refusal is not None) == refused
    if refusal is not None:
        assert "without TLS" in refusal
