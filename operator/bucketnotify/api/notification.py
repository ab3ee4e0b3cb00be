"""The BucketNotification custom resource: one notification configuration (one Id) on one
bucket, pointing at a Topic of the same namespace.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, JsonValue

from bucketnotify.api.common import Condition, GatewayRef, Model, cel_rules, conditions_field

__all__ = [
    "EVENT_TYPES",
    "BucketNotification",
    "BucketNotificationSpec",
    "BucketNotificationStatus",
    "BucketRef",
    "EventType",
    "FilterRule",
    "KeyFilter",
    "MetadataRule",
    "NotificationFilter",
    "TopicRef",
]

EventType = Literal[
    "s3:ObjectCreated:*",
    "s3:ObjectCreated:Put",
    "s3:ObjectCreated:Post",
    "s3:ObjectCreated:Copy",
    "s3:ObjectCreated:CompleteMultipartUpload",
    "s3:ObjectRemoved:*",
    "s3:ObjectRemoved:Delete",
    "s3:ObjectRemoved:DeleteMarkerCreated",
    # Ceph's own, from 18 (Reef). "Noncurrent": 18 refuses the "NonCurrent" of Ceph's docs,
    # 20 takes both and reports "NonCurrent" back.
    "s3:ObjectLifecycle:*",
    "s3:ObjectLifecycle:Expiration:*",
    "s3:ObjectLifecycle:Expiration:Current",
    "s3:ObjectLifecycle:Expiration:Noncurrent",
    "s3:ObjectLifecycle:Expiration:DeleteMarker",
    "s3:ObjectLifecycle:Transition:*",
    "s3:ObjectLifecycle:Transition:Current",
    "s3:ObjectLifecycle:Transition:Noncurrent",
    "s3:ObjectSynced:*",
    "s3:ObjectSynced:Create",
    "s3:ObjectSynced:Delete",
    "s3:ObjectSynced:DeletionMarkerCreated",
    # From 20 (Tentacle; 19 not measured): AWS's names for replication and lifecycle.
    "s3:Replication:*",
    "s3:Replication:Create",
    "s3:Replication:Delete",
    "s3:Replication:DeletionMarkerCreated",
    "s3:LifecycleExpiration:*",
    "s3:LifecycleExpiration:Delete",
    "s3:LifecycleExpiration:DeleteMarkerCreated",
    "s3:LifecycleTransition",
]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)

# A wildcard together with one of the events it covers would deliver nothing more, and reads
# as if it filtered: refuse it so the spec says what it does.
WILDCARD_FAMILIES = (
    "ObjectCreated",
    "ObjectRemoved",
    "ObjectLifecycle",
    "ObjectLifecycle:Expiration",
    "ObjectLifecycle:Transition",
    "ObjectSynced",
    "Replication",
    "LifecycleExpiration",
)
OVERLAP_RULES: list[JsonValue] = [
    {
        "rule": f"!(self.exists(e, e == 's3:{family}:*')"
        f" && self.exists(e, e.startsWith('s3:{family}:') && e != 's3:{family}:*'))",
        "message": f"events overlap: s3:{family}:* already covers every s3:{family}: event;"
        " list either the wildcard or single events",
    }
    for family in WILDCARD_FAMILIES
]


# XML 1.0, in which filters travel to the gateway, cannot carry most control characters and
# turns a carriage return into a newline: refuse them where a person can see why.
NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"


class TopicRef(Model):
    """A Topic in the same namespace."""

    name: str = Field(min_length=1, max_length=253)
    """metadata.name of the Topic."""


class BucketRef(Model):
    """The bucket of an ObjectBucketClaim (Rook's bucket provisioner, lib-bucket-provisioner)
    of the same namespace, instead of `bucket`: its name and the gateway from the claim's
    ConfigMap (BUCKET_NAME, BUCKET_HOST, BUCKET_PORT, BUCKET_REGION), the bucket owner's keys
    from its Secret (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), both named as the claim."""

    object_bucket_claim: str = Field(min_length=1, max_length=253)
    """metadata.name of the ObjectBucketClaim."""
    scheme: Literal["http", "https"] | None = None
    """How to reach BUCKET_HOST:BUCKET_PORT; defaults to https on port 443, else http (the
    claim does not say)."""


class KeyFilter(Model):
    """Filters on the object key; each kind at most once, all must match."""

    model_config = cel_rules(
        {
            "rule": "has(self.prefix) || has(self.suffix) || has(self.regex)",
            "message": "filter.key needs at least one of prefix, suffix or regex",
        }
    )

    prefix: str | None = Field(default=None, min_length=1, max_length=1024, pattern=NO_CONTROL)
    """The key starts with this."""
    suffix: str | None = Field(default=None, min_length=1, max_length=1024, pattern=NO_CONTROL)
    """The key ends with this."""
    regex: str | None = Field(default=None, min_length=1, max_length=1024, pattern=NO_CONTROL)
    """ECMAScript regular expression (the gateway's C++ std::regex) matching the whole key."""


class FilterRule(Model):
    """One name/value rule on object metadata or tags."""

    name: str = Field(min_length=1, max_length=256, pattern=NO_CONTROL)
    """Metadata key (x-amz-meta-...) or tag key."""
    value: str = Field(max_length=1024, pattern=NO_CONTROL)
    """Value the metadata entry or tag must have."""


class MetadataRule(FilterRule):
    """One rule on object metadata."""

    model_config = cel_rules(
        {
            "rule": "self.name.startsWith('x-amz-meta-')",
            "message": "metadata filter names start with x-amz-meta- (the header the object's"
            " metadata was sent in)",
        }
    )


class NotificationFilter(Model):
    """All given filters must match for an event to be sent."""

    key: KeyFilter | None = None
    """Rules on the object key."""
    metadata: list[MetadataRule] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    """Object metadata that must be present with the given values."""
    tags: list[FilterRule] = Field(
        default_factory=list,
        max_length=10,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Object tags that must be present with the given values."""


class BucketNotificationSpec(Model):
    """Desired notification configuration of one bucket, under one Id."""

    model_config = cel_rules(
        {
            "rule": "!has(oldSelf.id) || (has(self.id) && self.id == oldSelf.id)",
            "message": "id is immutable: create a new BucketNotification instead",
        },
        {
            "rule": "has(self.bucket) != has(self.bucketRef)",
            "message": "set exactly one of bucket (a bucket name) and bucketRef (the bucket of"
            " an ObjectBucketClaim)",
        },
        {
            "rule": "has(self.bucket) == has(oldSelf.bucket)"
            " && (!has(self.bucket) || self.bucket == oldSelf.bucket)"
            " && (!has(self.bucketRef) || self.bucketRef == oldSelf.bucketRef)",
            "message": "bucket and bucketRef are immutable: create a new BucketNotification"
            " instead",
        },
        {
            "rule": "!has(self.bucketRef) || !has(self.gatewayRef)",
            "message": "bucketRef takes the gateway and the bucket owner's keys from the claim:"
            " leave gatewayRef out",
        },
        {
            "rule": "has(self.topicRef) != has(self.topicARN)",
            "message": "set exactly one of topicRef (a Topic of this namespace) and topicARN"
            " (a topic already on the gateway)",
        },
    )

    bucket: str | None = Field(
        default=None, min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$"
    )
    """Name of the bucket on the gateway; or bucketRef. Immutable."""
    bucket_ref: BucketRef | None = None
    """The bucket of an ObjectBucketClaim, with its gateway and owner's keys; instead of
    bucket and gatewayRef. Immutable."""
    topic_ref: TopicRef | None = None
    """The Topic the events go to; or topicARN."""
    topic_arn: str | None = Field(
        default=None,
        alias="topicARN",
        max_length=1024,
        pattern=r"^(arn:aws:sns:[^:]*:[^:]*:[^:]+|urn:smn:[^:]*:[^:]+:[^:]+)$",
    )
    """A topic that already exists on the gateway and is not managed here (made by another
    team, by radosgw-admin or through the SNS API), by its ARN; instead of topicRef. The
    operator checks that the gateway has it and never changes or deletes it, and sends it
    no test event (it does not know the topic's endpoint). On a Huawei OBS gateway (gateway
    kind obs), the URN of an SMN topic: urn:smn:<region>:<project id>:<topic>."""
    id: str | None = Field(default=None, min_length=1, max_length=255)
    """Notification configuration Id on the bucket; defaults to metadata.name. Immutable."""
    events: list[EventType] = Field(
        default_factory=list,
        max_length=len(EVENT_TYPES),
        json_schema_extra={
            "x-kubernetes-list-type": "set",
            "x-kubernetes-validations": OVERLAP_RULES,
        },
    )
    """Event types; empty means every ObjectCreated and ObjectRemoved event. Which ones a
    gateway takes depends on its Ceph release (16: ObjectCreated and ObjectRemoved; 18 adds
    ObjectLifecycle and ObjectSynced; 20 adds Replication, LifecycleExpiration and
    LifecycleTransition); one it does not take makes the notification Unsupported."""
    filter: NotificationFilter | None = None
    """Key, metadata and tag filters."""
    test_event: bool = True
    """Send an s3:TestEvent record through the Topic when the configuration first becomes
    Ready, so the wiring can be seen working."""
    gateway_ref: GatewayRef | None = None
    """Gateway connection; defaults to the Topic's (topicRef), then the operator's."""
    adopt_existing: bool = False
    """Take over an entry with this Id that the bucket already has and that no bucketnotify
    operator made (a hand-made configuration being migrated). Without it such an entry is
    left alone and the notification is not Ready (IdConflict). An entry made by another
    bucketnotify operator is never taken."""


class AppliedConfiguration(Model):
    """What the operator last wrote to the bucket."""

    id: str
    topic_arn: str
    events: list[str] = Field(default_factory=list)
    bucket: str | None = None
    """The bucket it was written to (with bucketRef: the claim's, which may go away)."""


class BucketNotificationStatus(Model):
    """Observed state of the notification configuration."""

    observed_generation: int | None = None
    """The metadata.generation last reconciled."""
    conditions: list[Condition] = conditions_field()
    """Ready and the specific conditions."""
    bucket: str | None = None
    """The bucket: spec.bucket, or the one its ObjectBucketClaim names (bucketRef)."""
    applied: AppliedConfiguration | None = None
    """The configuration last applied to the bucket."""
    test_event_sent: bool | None = None
    """Whether the test event went out for the current configuration."""
    last_handled_configuration: str | None = None
    """The spec, labels and annotations the operator last reconciled, as JSON: its change
    handlers diff the next version against it (kopf's diff base; in the status, so that
    recording it is part of the status write rather than another write of the object)."""


class BucketNotification(Model):
    spec: BucketNotificationSpec
    status: BucketNotificationStatus | None = None
