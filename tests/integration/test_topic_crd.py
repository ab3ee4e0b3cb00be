"""The Topic CRD refuses bad objects at apply time with a message that says what to fix."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.kubectl import Kubectl

pytestmark = pytest.mark.usefixtures("crds")

HTTP = {"http": {"url": "http://127.0.0.1:9999/events"}}


def topic(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "bucketnotify.io/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


# (case id, spec, what the API server must say)
BAD_TOPICS: list[tuple[str, dict[str, Any], str]] = [
    ("no-endpoint-section", {"persistent": False}, "spec.endpoint: Required value"),
    ("empty-endpoint", {"endpoint": {}}, "set exactly one endpoint: http, amqp or kafka"),
    (
        "two-endpoints",
        {"endpoint": {**HTTP, "kafka": {"url": "kafka://127.0.0.1:9092"}}},
        "set exactly one endpoint: http, amqp or kafka",
    ),
    (
        "http-with-amqp-scheme",
        {"endpoint": {"http": {"url": "amqp://broker"}}},
        "url must start with http:// or https://",
    ),
    (
        "amqp-with-http-scheme",
        {"endpoint": {"amqp": {"url": "http://broker", "exchange": "ex"}}},
        "url must start with amqp:// or amqps://",
    ),
    (
        "kafka-with-http-scheme",
        {"endpoint": {"kafka": {"url": "https://broker:9092"}}},
        "url must start with kafka://",
    ),
    (
        "kafka-routable-ack",
        {"endpoint": {"kafka": {"url": "kafka://b:9092", "ackLevel": "routable"}}},
        'Unsupported value: "routable": supported values: "none", "broker"',
    ),
    (
        "amqp-unknown-ack",
        {"endpoint": {"amqp": {"url": "amqp://b", "exchange": "ex", "ackLevel": "all"}}},
        'Unsupported value: "all": supported values: "none", "broker", "routable"',
    ),
    (
        "amqp-missing-exchange",
        {"endpoint": {"amqp": {"url": "amqp://b"}}},
        "spec.endpoint.amqp.exchange: Required value",
    ),
    (
        "negative-time-to-live",
        {"endpoint": HTTP, "persistent": True, "timeToLive": -1},
        "spec.timeToLive in body should be greater than or equal to 0",
    ),
    (
        "negative-retry-sleep",
        {"endpoint": HTTP, "persistent": True, "retrySleepDuration": -5},
        "spec.retrySleepDuration in body should be greater than or equal to 0",
    ),
    (
        "negative-max-retries",
        {"endpoint": HTTP, "persistent": True, "maxRetries": -1},
        "spec.maxRetries in body should be greater than or equal to 0",
    ),
    (
        "amqp-inline-credentials",
        {"endpoint": {"amqp": {"url": "amqp://user:pw@broker/", "exchange": "ex"}}},
        "url must not contain user:password@; put credentials in credentialsRef (a Secret)",
    ),
    (
        "kafka-inline-credentials",
        {"endpoint": {"kafka": {"url": "kafka://user:pw@broker:9092"}}},
        "url must not contain user:password@; put credentials in credentialsRef (a Secret)",
    ),
    (
        "http-ca-without-tls",
        {"endpoint": {"http": {"url": "http://x", "caRef": {"name": "ca"}}}},
        "caRef needs an https:// url",
    ),
    (
        "kafka-ca-without-ssl",
        {"endpoint": {"kafka": {"url": "kafka://b:9092", "caRef": {"name": "ca"}}}},
        "caRef needs useSSL: true",
    ),
    (
        "http-client-certificate-without-tls",
        {
            "endpoint": {"http": {"url": "http://x", "clientCertificateRef": {"secretName": "c"}}},
            "persistent": True,
        },
        "clientCertificateRef needs an https:// url",
    ),
    (
        "amqp-client-certificate-without-tls",
        {
            "endpoint": {
                "amqp": {
                    "url": "amqp://b",
                    "exchange": "ex",
                    "clientCertificateRef": {"secretName": "c"},
                }
            },
            "persistent": True,
        },
        "clientCertificateRef needs an amqps:// url",
    ),
    (
        "kafka-client-certificate-without-ssl",
        {
            "endpoint": {
                "kafka": {"url": "kafka://b:9092", "clientCertificateRef": {"secretName": "c"}}
            },
            "persistent": True,
        },
        "clientCertificateRef needs useSSL: true",
    ),
    (
        "client-certificate-on-non-persistent",
        {
            "endpoint": {
                "kafka": {
                    "url": "kafka://b:9093",
                    "useSSL": True,
                    "clientCertificateRef": {"secretName": "c"},
                }
            }
        },
        "clientCertificateRef needs persistent: true: a Topic the gateway pushes itself",
    ),
    (
        "retries-on-non-persistent",
        {"endpoint": HTTP, "maxRetries": 3},
        "timeToLive, maxRetries, retrySleepDuration and delivery apply only to persistent topics",
    ),
    (
        "unknown-sasl-mechanism",
        {
            "endpoint": {
                "kafka": {
                    "url": "kafka://b:9092",
                    "sasl": {"mechanism": "MD5", "credentialsRef": {"secretName": "s"}},
                }
            }
        },
        'spec.endpoint.kafka.sasl.mechanism: Unsupported value: "MD5"',
    ),
    (
        "bad-broker-entry",
        {"endpoint": {"kafka": {"url": "kafka://b:9092", "brokers": ["b2 9092"]}}},
        "spec.endpoint.kafka.brokers[0] in body should match",
    ),
    (
        "gateway-name-with-slash",
        {"endpoint": HTTP, "name": "a/b"},
        "spec.name in body should match",
    ),
    (
        "vhost-twice",
        {"endpoint": {"amqp": {"url": "amqp://b/v1", "exchange": "ex", "vhost": "v2"}}},
        "set the vhost either in the url path or in vhost, not both",
    ),
    (
        "endpoint-topic-on-non-persistent",
        {"endpoint": HTTP, "endpointTopic": "other"},
        "endpointTopic needs persistent: true",
    ),
    (
        "bad-handoff",
        {"endpoint": HTTP, "persistent": True, "delivery": {"handoff": "later"}},
        'spec.delivery.handoff: Unsupported value: "later"',
    ),
]


@pytest.mark.parametrize(
    ("spec", "message"),
    [pytest.param(spec, message, id=case) for case, spec, message in BAD_TOPICS],
)
def test_bad_topic_is_refused_with_a_clear_message(
    kubectl: Kubectl, namespace: str, spec: dict[str, Any], message: str
) -> None:
    result = kubectl.apply(topic("bad", namespace, spec), check=False)
    assert result.returncode != 0, f"the API server accepted a bad Topic: {spec}"
    assert message in result.stderr
    assert kubectl.run("get", "topics", "-n", namespace, "-o", "name").stdout == ""


def test_good_topic_gets_the_reference_defaults(kubectl: Kubectl, namespace: str) -> None:
    """Omitted options take the gateway's defaults: verify-ssl true, ack level broker."""
    spec = {
        "endpoint": {"amqp": {"url": "amqps://broker:5671", "exchange": "ex"}},
        "persistent": True,
        "timeToLive": 0,
    }
    kubectl.apply(topic("good", namespace, spec))
    stored = kubectl.get("topic", "good", namespace)["spec"]
    # What was applied (a 0 kept, not pruned as empty) plus the defaults, and nothing else.
    defaults = {"ackLevel": "broker", "verifySSL": True}
    assert stored["endpoint"] == {"amqp": {**spec["endpoint"]["amqp"], **defaults}}
    assert {k: v for k, v in stored.items() if k != "endpoint"} == {
        "persistent": True,
        "timeToLive": 0,
    }


def test_gateway_name_is_immutable(kubectl: Kubectl, namespace: str) -> None:
    spec = {"endpoint": HTTP, "name": "first"}
    kubectl.apply(topic("renamed", namespace, spec))
    changed = copy.deepcopy(spec)
    changed["name"] = "second"
    result = kubectl.apply(topic("renamed", namespace, changed), check=False)
    assert result.returncode != 0
    assert "name is immutable: create a new Topic to use another gateway name" in result.stderr


@pytest.mark.parametrize("kind", ["Topic", "BucketNotification"])
def test_conditions_of_two_field_managers_merge_by_type_under_server_side_apply(
    kubectl: Kubectl, namespace: str, kind: str
) -> None:
    """``status.conditions`` is a list keyed by ``type``: another controller that applies a
    condition of its own (server-side apply, its own field manager) adds it beside ours
    instead of replacing the list, and one that applies our condition's type conflicts."""
    spec: dict[str, Any] = (
        {"endpoint": HTTP}
        if kind == "Topic"
        else {"bucket": "ssa-bucket", "topicRef": {"name": "t"}, "testEvent": False}
    )
    kubectl.apply(
        {
            "apiVersion": "bucketnotify.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": "ssa", "namespace": namespace},
            "spec": spec,
        }
    )

    def condition(type: str, status: str) -> dict[str, str]:
        return {
            "type": type,
            "status": status,
            "reason": "Tested",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }

    def apply_status(manager: str, *conditions: dict[str, str]) -> tuple[int, str]:
        obj = {
            "apiVersion": "bucketnotify.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": "ssa", "namespace": namespace},
            "status": {"conditions": list(conditions)},
        }
        result = kubectl.run(
            "apply", "--server-side", "--subresource=status", f"--field-manager={manager}",
            "-f", "-", stdin=json.dumps(obj), check=False,
        )  # fmt: skip
        return result.returncode, result.stderr

    assert apply_status("bucketnotify", condition("Ready", "True")) == (0, "")
    assert apply_status("backup-controller", condition("BackedUp", "True")) == (0, "")
    stored = kubectl.get(kind.lower(), "ssa", namespace)["status"]["conditions"]
    assert {c["type"]: c["status"] for c in stored} == {"Ready": "True", "BackedUp": "True"}
    code, err = apply_status("backup-controller", condition("Ready", "False"))
    assert code != 0 and "conflict" in err.lower(), err
    stored = kubectl.get(kind.lower(), "ssa", namespace)["status"]["conditions"]
    assert {c["type"]: c["status"] for c in stored} == {"Ready": "True", "BackedUp": "True"}
