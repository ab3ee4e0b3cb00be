"""Property-based tests of the CR models and of the filter rules sent to the gateway.

Arbitrary input to a model either validates or raises pydantic's ValidationError (which the
operator turns into a condition naming the fields), never another exception; valid specs
survive a round trip through their wire form; filter rules with any unicode survive the
XML the gateway is sent and reads back, or the operator would see drift forever.
"""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bucketnotify.api.common import NotReconcilable, parse_model
from bucketnotify.api.notification import EVENT_TYPES, BucketNotificationSpec
from bucketnotify.api.topic import TopicSpec
from bucketnotify.gateway.notifications import (
    FilterRule,
    NotificationConfig,
    parse_configuration,
    render_configuration,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=25,
)

# Objects shaped like specs, with any value in any field: most are invalid somewhere deep.
TOPIC_KEYS = ["name", "endpoint", "persistent", "timeToLive", "maxRetries", "policy", "delivery"]
ENDPOINT_KEYS = ["url", "exchange", "verifySSL", "useSSL", "sasl", "brokers", "caRef", "vhost"]
topic_like = st.fixed_dictionaries(
    {},
    optional={
        **{key: json_values for key in TOPIC_KEYS},
        "endpoint": st.dictionaries(
            st.sampled_from(["http", "amqp", "kafka", "other"]),
            st.dictionaries(st.sampled_from(ENDPOINT_KEYS), json_values, max_size=5) | json_values,
            max_size=2,
        ),
    },
)
notification_like = st.fixed_dictionaries(
    {},
    optional={
        "bucket": json_values,
        "topicRef": st.dictionaries(st.just("name"), json_values) | json_values,
        "events": st.lists(st.sampled_from([*EVENT_TYPES, "s3:Nope", ""]), max_size=4)
        | json_values,
        "filter": st.fixed_dictionaries(
            {},
            optional={
                "key": st.dictionaries(st.sampled_from(["prefix", "suffix", "regex"]), json_values),
                "metadata": st.lists(
                    st.dictionaries(st.sampled_from(["name", "value"]), json_values)
                ),
                "tags": json_values,
            },
        ),
        "id": json_values,
    },
)


@settings(max_examples=200)
@given(st.one_of(topic_like, json_values))
def test_any_topic_input_validates_or_raises_a_validation_error(raw: Any) -> None:
    try:
        spec = TopicSpec.model_validate(raw)
    except ValidationError as exc:
        assert exc.errors(), "a refusal names what is wrong"
        return
    assert TopicSpec.model_validate(spec.model_dump(by_alias=True)) == spec


@settings(max_examples=200)
@given(st.one_of(notification_like, json_values))
def test_any_notification_input_validates_or_raises_a_validation_error(raw: Any) -> None:
    try:
        spec = BucketNotificationSpec.model_validate(raw)
    except ValidationError as exc:
        assert exc.errors()
        return
    assert BucketNotificationSpec.model_validate(spec.model_dump(by_alias=True)) == spec


# Notifications valid by construction (every constraint the model checks), so that the round
# trip runs on every draw, not on the rare arbitrary input that happens to validate (the
# test above saw none in 600 draws). Topics: ``valid_topics`` below.
dns_names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?", fullmatch=True)
printable = st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cc", "Cs")), max_size=40)
nonempty_printable = printable.filter(bool)
rule_dicts = st.lists(
    st.fixed_dictionaries({"name": nonempty_printable, "value": printable}),
    max_size=4,
    unique_by=lambda rule: rule["name"],
)
valid_notification = st.fixed_dictionaries(
    {
        "bucket": st.from_regex(r"[a-z0-9][a-z0-9.-]{1,30}[a-z0-9]", fullmatch=True),
        "topicRef": st.fixed_dictionaries({"name": dns_names}),
    },
    optional={
        "id": nonempty_printable,
        "events": st.lists(st.sampled_from(EVENT_TYPES), unique=True, max_size=4),
        "filter": st.fixed_dictionaries(
            {},
            optional={
                "key": st.fixed_dictionaries(
                    {}, optional={"prefix": nonempty_printable, "suffix": nonempty_printable}
                ),
                "metadata": rule_dicts.map(
                    lambda rs: [{**r, "name": f"x-amz-meta-{r['name']}"} for r in rs]
                ),
                "tags": rule_dicts,
            },
        ),
        "testEvent": st.booleans(),
        "adoptExisting": st.booleans(),
    },
)


@given(valid_notification)
def test_a_valid_notification_survives_its_wire_form(raw: dict[str, Any]) -> None:
    spec = BucketNotificationSpec.model_validate(raw)
    wire = spec.model_dump(by_alias=True, exclude_none=True)
    assert BucketNotificationSpec.model_validate(wire) == spec
    for field in ("bucket", "topicRef", "id", "events", "testEvent", "adoptExisting"):
        if field in raw:
            assert wire[field] == raw[field], field


SECRET = "hunter2-do-not-show"


@given(topic_like)
def test_an_invalid_spec_becomes_a_condition_naming_fields_not_values(raw: dict[str, Any]) -> None:
    """The operator's message goes to status and Events: it must not echo values."""
    poisoned = {**raw, "opaqueData": {"secret": SECRET}, "name": SECRET + "\n"}
    with pytest.raises(NotReconcilable) as refused:
        parse_model(TopicSpec, poisoned)
    assert refused.value.reason == "InvalidSpec"
    assert str(refused.value).startswith("spec is invalid at: ")
    assert SECRET not in str(refused.value)


# Valid specs, built from the fields' own rules.
names = st.from_regex(r"\A[A-Za-z0-9_.-]{1,40}\Z")
hosts = st.from_regex(r"\A[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?\Z")
http_endpoint = st.builds(
    lambda scheme, host, path, verify, ce: {
        "http": {"url": f"{scheme}://{host}/{path}", "verifySSL": verify, "cloudEvents": ce}
    },
    st.sampled_from(["http", "https"]),
    hosts,
    st.text(string.ascii_letters + "/-_", max_size=20),
    st.booleans(),
    st.booleans(),
)
amqp_endpoint = st.builds(
    lambda host, exchange, ack: {
        "amqp": {"url": f"amqp://{host}:5672", "exchange": exchange, "ackLevel": ack}
    },
    hosts,
    st.text(min_size=1, max_size=30),
    st.sampled_from(["none", "broker", "routable"]),
)
kafka_endpoint = st.builds(
    lambda host, brokers, ssl: {
        "kafka": {"url": f"kafka://{host}", "brokers": brokers, "useSSL": ssl}
    },
    hosts,
    st.lists(hosts.map(lambda h: f"{h}:9092"), max_size=3),
    st.booleans(),
)
valid_topics = st.builds(
    lambda name, endpoint, opaque, policy: {
        "endpoint": endpoint,
        **({"name": name} if name else {}),
        **({"opaqueData": opaque} if opaque is not None else {}),
        **({"policy": policy} if policy is not None else {}),
    },
    st.none() | names,
    http_endpoint | amqp_endpoint | kafka_endpoint,
    st.none() | st.text(max_size=100),
    st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
)


@given(valid_topics)
def test_a_valid_topic_survives_its_wire_form(raw: dict[str, Any]) -> None:
    spec = TopicSpec.model_validate(raw)
    wire = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert TopicSpec.model_validate(wire) == spec
    ((kind, given_endpoint),) = raw["endpoint"].items()
    assert wire["endpoint"][kind] | given_endpoint == wire["endpoint"][kind], "fields kept"
    for field in ("name", "opaqueData", "policy"):
        if field in raw:
            assert wire[field] == raw[field], field


# What the API lets through (no control characters) and XML can carry (no surrogates, no
# U+FFFE/U+FFFF); spaces at either end included: the gateway keeps them.
xml_text = st.text(
    st.characters(blacklist_categories=["Cs", "Cc"], blacklist_characters=["\ufffe", "\uffff"]),
    min_size=1,
    max_size=30,
)
rules = st.lists(st.builds(FilterRule, xml_text, xml_text), max_size=3, unique_by=lambda r: r.name)
configs = st.builds(
    NotificationConfig,
    id=xml_text,
    topic_arn=names.map(lambda n: f"arn:aws:sns:default::{n}"),
    events=st.lists(st.sampled_from(EVENT_TYPES), max_size=3).map(tuple),
    key_filters=st.lists(
        st.builds(FilterRule, st.sampled_from(["prefix", "suffix", "regex"]), xml_text),
        max_size=3,
        unique_by=lambda r: r.name,
    ).map(tuple),
    metadata_filters=rules.map(tuple),
    tag_filters=rules.map(tuple),
)


@settings(max_examples=150)
@given(st.lists(configs, min_size=1, max_size=3))
def test_filter_rules_with_any_text_survive_the_gateway_xml(sent: list[NotificationConfig]) -> None:
    """What ``put`` renders, ``get`` parses back equal: anything else is endless drift."""
    assert parse_configuration(render_configuration(sent)) == sent
