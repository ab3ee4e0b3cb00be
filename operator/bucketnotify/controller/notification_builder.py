"""What to put on a bucket for a BucketNotification: pure functions of the spec.

The gateway accepts any key regex in the configuration and compiles it only at the next
upload, where an invalid one aborts radosgw (Ceph 16.2): the operator checks regexes with
``gateway.key_regex`` before they reach the gateway.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from bucketnotify.api.notification import BucketNotificationSpec
from bucketnotify.gateway.key_regex import regex_problem
from bucketnotify.gateway.notifications import FilterRule, NotificationConfig

__all__ = ["desired_configuration", "regex_problem", "same_configuration", "test_event"]


def desired_configuration(
    spec: BucketNotificationSpec, config_id: str, topic_arn: str
) -> NotificationConfig:
    key_rules: list[FilterRule] = []
    metadata: tuple[FilterRule, ...] = ()
    tags: tuple[FilterRule, ...] = ()
    if spec.filter is not None:
        key = spec.filter.key
        if key is not None:
            for kind in ("prefix", "suffix", "regex"):
                value = getattr(key, kind)
                if value is not None:
                    key_rules.append(FilterRule(kind, value))
        metadata = tuple(FilterRule(r.name, r.value) for r in spec.filter.metadata)
        tags = tuple(FilterRule(r.name, r.value) for r in spec.filter.tags)
    return NotificationConfig(
        id=config_id,
        topic_arn=topic_arn,
        events=tuple(spec.events),
        key_filters=tuple(key_rules),
        metadata_filters=metadata,
        tag_filters=tags,
    )


def test_event(bucket: str, now: dt.datetime) -> dict[str, Any]:
    """The s3:TestEvent message AWS sends when a configuration is set up."""
    return {
        "Service": "Amazon S3",
        "Event": "s3:TestEvent",
        "Time": now.isoformat().replace("+00:00", "Z"),
        "Bucket": bucket,
        "RequestId": uuid.uuid4().hex,
        "HostId": "bucketnotify-operator",
    }


def _normalised(config: NotificationConfig) -> NotificationConfig:
    return NotificationConfig(
        id=config.id,
        topic_arn=config.topic_arn,
        events=tuple(sorted(config.events)),
        key_filters=tuple(sorted(config.key_filters, key=lambda r: (r.name, r.value))),
        metadata_filters=tuple(sorted(config.metadata_filters, key=lambda r: (r.name, r.value))),
        tag_filters=tuple(sorted(config.tag_filters, key=lambda r: (r.name, r.value))),
    )


def same_configuration(a: NotificationConfig, b: NotificationConfig) -> bool:
    """Equal up to the order of events and rules, which the gateway need not keep."""
    return _normalised(a) == _normalised(b)
