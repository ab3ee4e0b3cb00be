"""The BucketNotification CRD refuses bad objects at apply time with a clear message."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bucketnotify.api.notification import EVENT_TYPES
from tests.kubectl import Kubectl

pytestmark = pytest.mark.usefixtures("crds")

BASE: dict[str, Any] = {"bucket": "photos", "topicRef": {"name": "t"}}


def notification(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "bucketnotify.io/v1alpha1",
        "kind": "BucketNotification",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "no-topic",
        {"bucket": "photos"},
        "set exactly one of topicRef (a Topic of this namespace) and topicARN",
    ),
    (
        "topicRef-and-topicARN",
        {**BASE, "topicARN": "arn:aws:sns:default::other"},
        "set exactly one of topicRef (a Topic of this namespace) and topicARN",
    ),
    (
        "not-an-arn",
        {"bucket": "photos", "topicARN": "other"},
        "spec.topicARN in body should match",
    ),
    (
        "urn-without-project",
        {"bucket": "photos", "topicARN": "urn:smn:region::topic"},
        "spec.topicARN in body should match",
    ),
    (
        "no-bucket",
        {"topicRef": {"name": "t"}},
        "set exactly one of bucket (a bucket name) and bucketRef",
    ),
    ("bad-bucket-name", {**BASE, "bucket": "Bad_Bucket"}, "spec.bucket in body should match"),
    (
        "unknown-event",
        {**BASE, "events": ["s3:ObjectCreated:Bogus"]},
        'Unsupported value: "s3:ObjectCreated:Bogus"',
    ),
    (
        "event-without-prefix",
        {**BASE, "events": ["ObjectCreated:Put"]},
        'Unsupported value: "ObjectCreated:Put"',
    ),
    (
        "duplicate-event",
        {**BASE, "events": ["s3:ObjectCreated:Put", "s3:ObjectCreated:Put"]},
        'Duplicate value: "s3:ObjectCreated:Put"',
    ),
    (
        "overlapping-created",
        {**BASE, "events": ["s3:ObjectCreated:*", "s3:ObjectCreated:Copy"]},
        "events overlap: s3:ObjectCreated:* already covers every s3:ObjectCreated: event",
    ),
    (
        "overlapping-removed",
        {**BASE, "events": ["s3:ObjectRemoved:Delete", "s3:ObjectRemoved:*"]},
        "events overlap: s3:ObjectRemoved:* already covers every s3:ObjectRemoved: event",
    ),
    (
        "overlapping-lifecycle",
        {**BASE, "events": ["s3:ObjectLifecycle:*", "s3:ObjectLifecycle:Expiration:*"]},
        "events overlap: s3:ObjectLifecycle:* already covers every s3:ObjectLifecycle: event",
    ),
    (
        "overlapping-expiration",
        {
            **BASE,
            "events": [
                "s3:ObjectLifecycle:Expiration:*",
                "s3:ObjectLifecycle:Expiration:Noncurrent",
            ],
        },
        "events overlap: s3:ObjectLifecycle:Expiration:* already covers",
    ),
    (
        # Ceph's docs spell it so; Ceph 18 refuses that spelling, every release takes ours.
        "noncurrent-spelled-as-cephs-docs",
        {**BASE, "events": ["s3:ObjectLifecycle:Transition:NonCurrent"]},
        'Unsupported value: "s3:ObjectLifecycle:Transition:NonCurrent"',
    ),
    (
        # Ceph 18 and 20 take it and store it as s3:UnknownEvent.
        "abort-multipart-upload",
        {**BASE, "events": ["s3:ObjectLifecycle:Expiration:AbortMultipartUpload"]},
        'Unsupported value: "s3:ObjectLifecycle:Expiration:AbortMultipartUpload"',
    ),
    (
        "empty-key-filter",
        {**BASE, "filter": {"key": {}}},
        "filter.key needs at least one of prefix, suffix or regex",
    ),
    (
        "duplicate-metadata-rule",
        {
            **BASE,
            "filter": {
                "metadata": [
                    {"name": "x-amz-meta-color", "value": "red"},
                    {"name": "x-amz-meta-color", "value": "blue"},
                ]
            },
        },
        "Duplicate value",
    ),
    (
        "duplicate-tag-rule",
        {
            **BASE,
            "filter": {"tags": [{"name": "env", "value": "a"}, {"name": "env", "value": "b"}]},
        },
        "Duplicate value",
    ),
    (
        "metadata-without-prefix",
        {**BASE, "filter": {"metadata": [{"name": "color", "value": "red"}]}},
        "metadata filter names start with x-amz-meta-",
    ),
]


@pytest.mark.parametrize(
    ("spec", "message"), [pytest.param(spec, msg, id=case) for case, spec, msg in BAD]
)
def test_bad_notification_is_refused_with_a_clear_message(
    kubectl: Kubectl, namespace: str, spec: dict[str, Any], message: str
) -> None:
    result = kubectl.apply(notification("bad", namespace, spec), check=False)
    assert result.returncode != 0, f"the API server accepted {spec}"
    assert message in result.stderr
    assert kubectl.run("get", "bucketnotifications", "-n", namespace, "-o", "name").stdout == ""


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "bucket",
            "other",
            "bucket and bucketRef are immutable: create a new BucketNotification instead",
        ),
        ("id", "other-id", "id is immutable: create a new BucketNotification instead"),
    ],
)
def test_bucket_and_id_are_immutable(
    kubectl: Kubectl, namespace: str, field: str, value: str, message: str
) -> None:
    spec = {**BASE, "id": "first"}
    kubectl.apply(notification("n", namespace, spec))
    changed = copy.deepcopy(spec)
    changed[field] = value
    result = kubectl.apply(notification("n", namespace, changed), check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_every_filter_kind_and_event_is_accepted(kubectl: Kubectl, namespace: str) -> None:
    spec = {
        **BASE,
        "events": [
            "s3:ObjectCreated:Put",
            "s3:ObjectCreated:Post",
            "s3:ObjectCreated:Copy",
            "s3:ObjectCreated:CompleteMultipartUpload",
            "s3:ObjectRemoved:Delete",
            "s3:ObjectRemoved:DeleteMarkerCreated",
        ],
        "filter": {
            "key": {"prefix": "img/", "suffix": ".jpg", "regex": "img/[0-9]+\\.jpg"},
            "metadata": [{"name": "x-amz-meta-color", "value": "red"}],
            "tags": [{"name": "env", "value": "prod"}],
        },
    }
    kubectl.apply(notification("all", namespace, spec))
    stored = kubectl.get("bucketnotification", "all", namespace)["spec"]
    # Everything applied is stored as it was (no field pruned by the schema), plus the
    # defaults of what was left out.
    assert stored == {**spec, "testEvent": True, "adoptExisting": False}
    # Every single event of every release at once (the gateway's release decides later).
    singles = [event for event in EVENT_TYPES if not event.endswith("*")]
    kubectl.apply(notification("every-event", namespace, {**BASE, "events": singles}))
    stored = kubectl.get("bucketnotification", "every-event", namespace)["spec"]
    assert stored["events"] == singles


def test_a_topic_arn_may_be_an_sns_arn_or_an_smn_urn(kubectl: Kubectl, namespace: str) -> None:
    """Ceph's SNS ARNs and Huawei OBS's SMN topic URNs are both taken as written."""
    arns = {
        "sns": "arn:aws:sns:default::orders",
        "smn": "urn:smn:exampleRegion:d745b885f14941369b2d2138e7a65bef:obs_test",
    }
    for name, arn in arns.items():
        kubectl.apply(notification(name, namespace, {"bucket": "photos", "topicARN": arn}))
        assert kubectl.get("bucketnotification", name, namespace)["spec"]["topicARN"] == arn
