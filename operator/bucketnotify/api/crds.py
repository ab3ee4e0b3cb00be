"""The CRDs this project ships; ``python -m bucketnotify.api.crds DIR`` writes them as YAML."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from bucketnotify.api.crd import CrdInfo, crd, ready_columns
from bucketnotify.api.notification import BucketNotificationSpec, BucketNotificationStatus
from bucketnotify.api.topic import (
    PERSISTENT_NAME_MAX,
    PERSISTENT_NAME_MESSAGE,
    TopicSpec,
    TopicStatus,
)

__all__ = ["ALL", "BUCKET_NOTIFICATION", "TOPIC", "main", "render"]

TOPIC = CrdInfo(
    kind="Topic",
    plural="topics",
    short_names=["bntopic"],
    spec_model=TopicSpec,
    status_model=TopicStatus,
    description="A gateway topic: where the notifications of a bucket are pushed.",
    object_rules=[
        {
            "rule": "!has(self.spec.persistent) || !self.spec.persistent"
            f" || size(self.metadata.name) <= {PERSISTENT_NAME_MAX}",
            "message": PERSISTENT_NAME_MESSAGE,
        }
    ],
    printer_columns=[
        {"name": "ARN", "type": "string", "jsonPath": ".status.arn"},
        {"name": "Persistent", "type": "boolean", "jsonPath": ".spec.persistent"},
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpointKind"},
        {
            "name": "Gateway",
            "type": "string",
            "jsonPath": ".status.gatewayRelease",
            "priority": 1,
        },
        *ready_columns(
            {
                "name": "Delivering",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Delivering")].status',
            },
            {"name": "Backlog", "type": "integer", "jsonPath": ".status.delivery.backlogEvents"},
            {"name": "Oldest", "type": "date", "jsonPath": ".status.delivery.oldestPendingTime"},
            {
                "name": "Delivery",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Delivering")].reason',
                "priority": 1,
            },
            {
                "name": "Last Failure",
                "type": "date",
                "jsonPath": ".status.delivery.lastFailureTime",
                "priority": 1,
            },
            {
                "name": "Dead Letters",
                "type": "integer",
                "jsonPath": ".status.delivery.deadLetters",
                "priority": 1,
            },
        ),
    ],
)

BUCKET_NOTIFICATION = CrdInfo(
    kind="BucketNotification",
    plural="bucketnotifications",
    short_names=["bnn", "bucketnotif"],
    spec_model=BucketNotificationSpec,
    status_model=BucketNotificationStatus,
    description="One notification configuration (one Id) on one bucket.",
    printer_columns=[
        {"name": "Bucket", "type": "string", "jsonPath": ".status.bucket"},
        {"name": "Topic", "type": "string", "jsonPath": ".spec.topicRef.name"},
        {"name": "Topic ARN", "type": "string", "jsonPath": ".spec.topicARN", "priority": 1},
        {"name": "Id", "type": "string", "jsonPath": ".status.applied.id", "priority": 1},
        *ready_columns(),
    ],
)

ALL = [TOPIC, BUCKET_NOTIFICATION]


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-schemas out in full: anchors and aliases confuse readers and diffs."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(info: CrdInfo) -> str:
    manifest: dict[str, Any] = crd(info)
    header = "# Generated from operator/bucketnotify/api by `make crds`; do not edit.\n"
    return header + yaml.dump(manifest, Dumper=_PlainDumper, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bucketnotify.api.crds OUTPUT_DIR", file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    for info in ALL:
        (out / f"{info.plural}.bucketnotify.io.yaml").write_text(render(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
