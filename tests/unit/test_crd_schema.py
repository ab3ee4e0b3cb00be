"""The generated CRD schemas are structural and match the models the operator parses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bucketnotify.api.crd import crd, structural
from bucketnotify.api.crds import ALL, TOPIC
from bucketnotify.api.topic import Topic, TopicSpec

FORBIDDEN_IN_STRUCTURAL = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "const"}


def walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


@pytest.mark.parametrize("info", ALL, ids=lambda i: i.kind)
def test_schema_has_only_structural_keywords(info: Any) -> None:
    schema = crd(info)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        if path.endswith(".properties"):
            continue  # keys here are field names, not keywords
        bad = FORBIDDEN_IN_STRUCTURAL & node.keys()
        assert not bad, f"{path} uses {bad}"
        assert node.get("default", "absent") is not None, f"{path} has a null default"


def test_optional_fields_are_not_required_and_defaults_are_the_references() -> None:
    spec = structural(TopicSpec)
    assert spec["required"] == ["endpoint"]
    amqp = spec["properties"]["endpoint"]["properties"]["amqp"]
    assert set(amqp["required"]) == {"url", "exchange"}
    assert amqp["properties"]["ackLevel"]["default"] == "broker"
    assert amqp["properties"]["verifySSL"]["default"] is True
    kafka = spec["properties"]["endpoint"]["properties"]["kafka"]
    assert kafka["properties"]["useSSL"]["default"] is False
    assert kafka["properties"]["ackLevel"]["enum"] == ["none", "broker"]
    assert spec["properties"]["persistent"]["default"] is False


def test_policy_is_kept_as_free_json() -> None:
    policy = structural(TopicSpec)["properties"]["policy"]
    assert policy["type"] == "object"
    assert policy["x-kubernetes-preserve-unknown-fields"] is True


def test_printer_columns_show_arn_persistence_endpoint_and_readiness() -> None:
    columns = {c["name"]: c["jsonPath"] for c in TOPIC.printer_columns}
    assert columns["ARN"] == ".status.arn"
    assert columns["Persistent"] == ".spec.persistent"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'


def installed_crds() -> dict[str, dict[str, Any]]:
    """The CRDs as the chart and the tests install them (crds/, which `make crds-check`
    keeps equal to what the models generate)."""
    root = Path(__file__).resolve().parents[2] / "crds"
    return {
        doc["spec"]["names"]["kind"]: doc
        for doc in (yaml.safe_load(p.read_text()) for p in sorted(root.glob("*.yaml")))
    }


def test_kubectl_names_both_kinds_by_the_category_and_their_short_names() -> None:
    names = {kind: crd["spec"]["names"] for kind, crd in installed_crds().items()}
    assert {kind: n["categories"] for kind, n in names.items()} == {
        "Topic": ["bucketnotify"],
        "BucketNotification": ["bucketnotify"],
    }
    assert names["Topic"]["shortNames"] == ["bntopic"]
    assert names["BucketNotification"]["shortNames"] == ["bnn", "bucketnotif"]


def test_wide_output_of_a_notification_shows_its_topic_arn() -> None:
    """`kubectl get bnn` shows columns of priority 0; `-o wide` adds those of priority 1."""
    (version,) = installed_crds()["BucketNotification"]["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Topic ARN"]["jsonPath"] == ".spec.topicARN"
    assert columns["Topic ARN"]["priority"] == 1
    assert "priority" not in columns["Bucket"]


def test_model_reads_an_object_as_the_api_server_stores_it() -> None:
    obj = {
        "spec": {
            "endpoint": {
                "kafka": {
                    "url": "kafka://b:9092",
                    "brokers": ["c:9093"],
                    "useSSL": True,
                    "ackLevel": "none",
                    "sasl": {"mechanism": "SCRAM-SHA-512", "credentialsRef": {"secretName": "k"}},
                }
            },
            "persistent": True,
            "timeToLive": 60,
            "opaqueData": "team-a",
        }
    }
    parsed = Topic.model_validate(obj)
    assert parsed.spec.endpoint.kind == "kafka"
    kafka = parsed.spec.endpoint.kafka
    assert kafka is not None and kafka.sasl is not None
    assert kafka.use_ssl is True
    assert kafka.sasl.credentials_ref.password_key == "password"
    assert parsed.spec.time_to_live == 60
