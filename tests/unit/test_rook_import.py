"""``bucketnotify import rook``: Rook's notification objects, shaped as Rook's ceph.rook.io/v1
types and its samples make them, printed as ours. Run as the installed command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from bucketnotify.api.notification import BucketNotificationSpec
from bucketnotify.api.topic import TopicSpec

BIN = Path(sys.executable).parent
ROOK = "ceph.rook.io/v1"
NS = "team-a"


def rook_topic(name: str, endpoint: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": ROOK,
        "kind": "CephBucketTopic",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "objectStoreName": "my-store",
            "objectStoreNamespace": "rook-ceph",
            "endpoint": endpoint,
            **spec,
        },
    }


def claim(name: str, labels: dict[str, str], bucket: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"generateBucketName": "ceph-bkt", "storageClassName": "rook-bucket"}
    if bucket:
        spec["bucketName"] = bucket  # set by the provisioner once the claim is bound
    return {
        "apiVersion": "objectbucket.io/v1alpha1",
        "kind": "ObjectBucketClaim",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": spec,
    }


ROOK_OBJECTS: list[dict[str, Any]] = [
    rook_topic(
        "my-topic",
        {
            "http": {
                "uri": "http://my-notification-endpoint:8080",
                "disableVerifySSL": True,
                "sendCloudEvents": True,
            }
        },
        opaqueData="my@email.com",
        persistent=True,
    ),
    rook_topic(
        "orders",
        {"amqp": {"uri": "amqp://rabbit:5672/vhost1", "exchange": "ex", "ackLevel": "routeable"}},
    ),
    rook_topic("secret-amqp", {"amqp": {"uri": "amqp://u:p@rabbit:5672/", "exchange": "ex"}}),
    rook_topic("audit", {"kafka": {"uri": "kafka://kafka:9092", "useSSL": False}}),
    {
        "apiVersion": ROOK,
        "kind": "CephBucketNotification",
        "metadata": {"name": "my-notification", "namespace": NS},
        "spec": {
            "topic": "my-topic",
            "events": ["s3:ObjectCreated:Put", "s3:ObjectCreated:Copy"],
            "filter": {
                "keyFilters": [
                    {"name": "prefix", "value": "hello"},
                    {"name": "suffix", "value": ".png"},
                    {"name": "regex", "value": "[a-z]*\\.*"},
                ],
                "metadataFilters": [{"name": "x-amz-meta-color", "value": "blue"}],
                "tagFilters": [{"name": "team", "value": "a"}],
            },
        },
    },
    {
        "apiVersion": ROOK,
        "kind": "CephBucketNotification",
        "metadata": {"name": "unbound", "namespace": NS},
        "spec": {"topic": "audit"},
    },
    claim(
        "text",
        {"bucket-notification-my-notification": "my-notification", "other": "x"},
        "ceph-bkt-1111",
    ),
    claim("image", {"bucket-notification-my-notification": "my-notification"}, "ceph-bkt-2222"),
    claim("pending", {"bucket-notification-my-notification": "my-notification"}, None),
]


def import_rook(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "rook.yaml"
    # As kubectl get -o yaml prints several objects: a List.
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": ROOK_OBJECTS}))
    return subprocess.run(
        [str(BIN / "bucketnotify"), "import", "rook", "-f", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_rooks_topics_and_notifications_become_ours_and_what_cannot_is_named(
    tmp_path: Path,
) -> None:
    done = import_rook(tmp_path, "--gateway-secret", "rook-ceph-object-user-my-store-team")
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(done.stdout)}
    assert set(objects) == {
        ("Topic", "my-topic"),
        ("Topic", "orders"),
        ("Topic", "audit"),
        ("BucketNotification", "my-notification-text"),
        ("BucketNotification", "my-notification-image"),
        ("BucketNotification", "my-notification-pending"),
    }
    for (kind, _), obj in objects.items():
        assert obj["apiVersion"] == "bucketnotify.io/v1alpha1"
        assert obj["metadata"]["namespace"] == NS
        model = TopicSpec if kind == "Topic" else BucketNotificationSpec
        model.model_validate(obj["spec"])  # what the operator (and the CRD) would take
    assert objects["Topic", "my-topic"]["spec"] == {
        "endpoint": {
            "http": {
                "url": "http://my-notification-endpoint:8080",
                "verifySSL": False,
                "cloudEvents": True,
            }
        },
        "persistent": True,
        "opaqueData": "my@email.com",
        "gatewayRef": {"secretName": "rook-ceph-object-user-my-store-team"},
    }
    assert objects["Topic", "orders"]["spec"]["endpoint"]["amqp"] == {
        "url": "amqp://rabbit:5672/vhost1",
        "exchange": "ex",
        "ackLevel": "routable",
    }
    assert objects["Topic", "audit"]["spec"]["endpoint"]["kafka"] == {
        "url": "kafka://kafka:9092",
        "useSSL": False,
    }
    text = objects["BucketNotification", "my-notification-text"]["spec"]
    assert text == {
        "bucketRef": {"objectBucketClaim": "text"},
        "topicRef": {"name": "my-topic"},
        "events": ["s3:ObjectCreated:Put", "s3:ObjectCreated:Copy"],
        "filter": {
            "key": {"prefix": "hello", "suffix": ".png", "regex": "[a-z]*\\.*"},
            "metadata": [{"name": "x-amz-meta-color", "value": "blue"}],
            "tags": [{"name": "team", "value": "a"}],
        },
    }
    assert objects["BucketNotification", "my-notification-image"]["spec"]["bucketRef"] == {
        "objectBucketClaim": "image"
    }
    # A claim not bound yet is named all the same: the notification waits for its bucket.
    assert objects["BucketNotification", "my-notification-pending"]["spec"]["bucketRef"] == {
        "objectBucketClaim": "pending"
    }
    # Not converted, each named with what to do; the password never printed.
    assert done.returncode == 1
    warnings = done.stderr.splitlines()
    assert len(warnings) == 2, done.stderr
    assert any(
        "CephBucketTopic team-a/secret-amqp" in w and "credentialsRef" in w for w in warnings
    )
    assert any(
        "CephBucketNotification team-a/unbound" in w and "bucket-notification-unbound=unbound" in w
        for w in warnings
    )
    assert "u:p@" not in done.stdout + done.stderr


def test_nothing_of_rooks_in_the_input_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    done = subprocess.run(
        [str(BIN / "bucketnotify"), "import", "rook", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "no CephBucketTopic or CephBucketNotification in the input" in done.stderr
    missing = subprocess.run(
        [str(BIN / "bucketnotify"), "import", "rook", "-f", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: cannot read") and "No such file" in missing.stderr
