"""Topics and BucketNotifications with hostile values, applied to the real apiserver with the
operator running against the real gateway.

Huge strings, control characters and names that are not names are refused at apply time
by the CRD schema, with the field and what to fix; values the schema cannot judge (regexes
the gateway would never match, spec names another Topic owns) get a Ready=False condition
and an Event; values that are merely unusual (unicode, markup, quotes) reach the gateway
unchanged and stay in sync. The operator never crashes.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from bucketnotify.gateway.notifications import NotificationClient
from bucketnotify.gateway.topics import TopicClient
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import DRIFT_INTERVAL_S
from tests.processes import Program
from tests.resources import API, apply, condition
from tests.s3 import connection, s3_client

pytestmark = pytest.mark.usefixtures("crds")

HTTP = {"http": {"url": "http://127.0.0.1:9/hook"}}
HUGE = "x" * 100_000
UNUSUAL = "\"'><script>&amp;</Value>\u202e🔥 日本 \\ %00 ${jndi:ldap://x} ; rm -rf /"


def refused(kubectl: Kubectl, kind: str, name: str, namespace: str, spec: dict[str, Any]) -> str:
    result = kubectl.apply(
        {
            "apiVersion": API,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        },
        check=False,
    )
    assert result.returncode != 0, f"{kind} {name} was accepted"
    return result.stderr


# (what, kind, metadata.name, spec, what the apiserver must say)
REFUSED_AT_APPLY: list[tuple[str, str, str, dict[str, Any], str]] = [
    ("huge gateway name", "Topic", "t", {"endpoint": HTTP, "name": HUGE}, "spec.name: Too long"),
    (
        "name with a slash",
        "Topic",
        "t",
        {"endpoint": HTTP, "name": "../../etc"},
        "spec.name in body should match",
    ),
    (
        "huge url",
        "Topic",
        "t",
        {"endpoint": {"http": {"url": "http://h/" + HUGE}}},
        "spec.endpoint.http.url: Too long",
    ),
    (
        "huge opaque data",
        "Topic",
        "t",
        {"endpoint": HTTP, "opaqueData": HUGE},
        "spec.opaqueData: Too long",
    ),
    (
        "huge exchange",
        "Topic",
        "t",
        {"endpoint": {"amqp": {"url": "amqp://b", "exchange": HUGE}}},
        "spec.endpoint.amqp.exchange: Too long",
    ),
    (
        "injection as object name",
        "Topic",
        "a;rm -rf",
        {"endpoint": HTTP},
        "a lowercase RFC 1123 subdomain",
    ),
    (
        "unicode object name",
        "Topic",
        "tópico",
        {"endpoint": HTTP},
        "a lowercase RFC 1123 subdomain",
    ),
    (
        "huge regex",
        "BucketNotification",
        "n",
        {"bucket": "abc", "topicRef": {"name": "t"}, "filter": {"key": {"regex": HUGE}}},
        "spec.filter.key.regex: Too long",
    ),
    (
        "newline in a prefix",
        "BucketNotification",
        "n",
        {"bucket": "abc", "topicRef": {"name": "t"}, "filter": {"key": {"prefix": "a\nb"}}},
        "spec.filter.key.prefix in body should match",
    ),
    (
        "NUL in a tag value",
        "BucketNotification",
        "n",
        {
            "bucket": "abc",
            "topicRef": {"name": "t"},
            "filter": {"tags": [{"name": "a", "value": "\u0000"}]},
        },
        "spec.filter.tags[0].value in body should match",
    ),
    (
        "unicode bucket",
        "BucketNotification",
        "n",
        {"bucket": "bücket", "topicRef": {"name": "t"}},
        "spec.bucket in body should match",
    ),
    (
        "too many metadata rules",
        "BucketNotification",
        "n",
        {
            "bucket": "abc",
            "topicRef": {"name": "t"},
            "filter": {"metadata": [{"name": f"x-amz-meta-{i}", "value": "v"} for i in range(100)]},
        },
        "spec.filter.metadata: Too many",
    ),
]


@pytest.mark.parametrize(
    ("what", "kind", "name", "spec", "message"),
    REFUSED_AT_APPLY,
    ids=[c[0] for c in REFUSED_AT_APPLY],
)
def test_hostile_values_are_refused_at_apply_time(
    kubectl: Kubectl,
    namespace: str,
    what: str,
    kind: str,
    name: str,
    spec: dict[str, Any],
    message: str,
) -> None:
    assert message in refused(kubectl, kind, name, namespace, spec)


def test_the_operator_refuses_what_the_schema_cannot_judge_and_keeps_running(
    kubectl: Kubectl, namespace: str, operator: Program, rgw: LocalService
) -> None:
    gateway = connection(rgw)
    s3 = s3_client(rgw)
    bucket = f"hostile-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)

    # Unusual but valid: markup, quotes, bidi override, emoji reach the gateway unchanged.
    apply(kubectl, namespace, "Topic", "odd", {"endpoint": HTTP, "opaqueData": UNUSUAL})
    arn = condition(kubectl, namespace, "topic", "odd")["arn"]
    on_gateway = TopicClient(gateway).get(arn)
    assert on_gateway is not None and on_gateway.opaque_data == UNUSUAL

    bad_regexes = {
        "open": "(",
        "reversed-range": "[z-a]",
        "bad-repeat": "a{2,1}",
        "lookbehind": "(?<=a)b",
        "inline-flag": "(?i)abc",
        "nothing-to-repeat": "*",
    }
    for name, regex in bad_regexes.items():
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            name,
            {
                "bucket": bucket,
                "topicRef": {"name": "odd"},
                "testEvent": False,
                "filter": {"key": {"regex": regex}},
            },
        )
    odd_id = "id \"'><&/?#é🔥"
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        "odd-values",
        {
            "bucket": bucket,
            "topicRef": {"name": "odd"},
            "id": odd_id,
            "testEvent": False,
            "filter": {
                "key": {"prefix": " <&>\"' ", "suffix": "🔥\u202e"},
                "metadata": [{"name": "x-amz-meta-é", "value": UNUSUAL}],
                "tags": [{"name": "<tag>", "value": " spaced "}],
            },
        },
    )
    for name in bad_regexes:
        status = condition(kubectl, namespace, "bucketnotification", name, "False", "InvalidFilter")
        message = next(c for c in status["conditions"] if c["type"] == "Ready")["message"]
        assert message.startswith("filter.key.regex "), message
    applied = condition(kubectl, namespace, "bucketnotification", "odd-values")["applied"]
    assert applied["id"] == odd_id
    with NotificationClient(gateway) as notifications:
        configs = notifications.list(bucket)
    assert [c.id for c in configs] == [odd_id], "only the valid one reached the bucket"
    (config,) = configs
    assert {r.value for r in config.key_filters} == {" <&>\"' ", "🔥\u202e"}
    assert [(r.name, r.value) for r in config.tag_filters] == [("<tag>", " spaced ")]

    # In sync: several drift checks later nothing was "repaired" (which would mean the
    # gateway's answer never compares equal to the spec).
    time.sleep(3 * DRIFT_INTERVAL_S)
    events = json.loads(kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout)
    reasons = [e["reason"] for e in events["items"]]
    assert "DriftRepaired" not in reasons, [
        e["message"] for e in events["items"] if e["reason"] == "DriftRepaired"
    ]
    assert reasons.count("InvalidFilter") == len(bad_regexes), "one Warning per refused object"
    assert operator.process.poll() is None, "the operator is still running"

    kubectl.run("delete", "bucketnotification", "odd-values", "-n", namespace, "--timeout=60s")
    with NotificationClient(gateway) as notifications:
        assert notifications.list(bucket) == []
