"""A BucketNotification's bucket from an ObjectBucketClaim (``bucketRef``): which bucket, on
which gateway, with whose keys; and its Id taken off that bucket once the claim is gone.

Rook's bucket provisioner (lib-bucket-provisioner) binds a claim by making a bucket and a
gateway user that owns it, then a ConfigMap and a Secret named as the claim, in its
namespace: the ConfigMap says where (``BUCKET_HOST``, ``BUCKET_PORT``, ``BUCKET_NAME``,
``BUCKET_REGION``), the Secret holds the owner's keys (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``). Only a bucket's owner may write its notification configuration,
so the notification is written with those keys; its topic stays its Topic's (any user of the
tenant may name it: Ceph 16 to 20 need no topic policy for that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bucketnotify.api.common import GatewayRef, NotReconcilable, parse_model
from bucketnotify.api.notification import BucketNotificationSpec, BucketRef
from bucketnotify.api.topic import TopicSpec
from bucketnotify.controller.bucket_writes import BucketLocks
from bucketnotify.controller.topics import gateway_connection
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.errors import GatewayAccessDenied, GatewayError, GatewayNotFound
from bucketnotify.gateway.pool import GatewayPool
from bucketnotify.kube.objects import Kube, SecretMissing
from bucketnotify.settings import OperatorSettings

__all__ = [
    "CLAIM_NOT_BOUND",
    "CLAIM_NOT_FOUND",
    "ClaimedBucket",
    "Left",
    "claimed_bucket",
    "claimed_from",
    "leave_claimed_bucket",
]

CLAIM_NOT_FOUND = "BucketClaimNotFound"
CLAIM_NOT_BOUND = "BucketClaimNotBound"
INVALID_CLAIM = "InvalidBucketClaim"

ACCESS_KEY, SECRET_KEY = "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"
WHERE = ("BUCKET_NAME", "BUCKET_HOST", "BUCKET_PORT")


@dataclass(frozen=True)
class ClaimedBucket:
    bucket: str
    connection: GatewayConnection
    """The claim's gateway, with the bucket owner's keys."""


async def claimed_bucket(kube: Kube, namespace: str, ref: BucketRef) -> ClaimedBucket:
    """The bucket of a bound claim; NotReconcilable while it is not bound (retried, so a
    claim bound later is followed) or when it is gone."""
    name = ref.object_bucket_claim
    where = f"ObjectBucketClaim {namespace}/{name}"
    claim = await kube.object_bucket_claim(namespace, name)
    if claim is None:
        raise NotReconcilable(
            CLAIM_NOT_FOUND,
            f"{where} does not exist (or this cluster serves no ObjectBucketClaims)",
            retry=True,
        )
    if claim["metadata"].get("deletionTimestamp"):
        raise NotReconcilable(CLAIM_NOT_FOUND, f"{where} is being deleted", retry=True)
    phase = (claim.get("status") or {}).get("phase")
    if phase != "Bound":
        raise NotReconcilable(
            CLAIM_NOT_BOUND,
            f"{where} is {phase or 'not bound yet'}: waiting for its bucket",
            retry=True,
        )
    try:
        config = await kube.config_map_data(namespace, name)
        keys = await kube.secret_data(namespace, name)
    except SecretMissing as exc:
        # The provisioner writes them right after binding: a moment's wait, not an error.
        raise NotReconcilable(
            CLAIM_NOT_BOUND, f"{where} is Bound but {exc}: waiting for its provisioner", retry=True
        ) from None
    return claimed_from(where, ref, config, keys)


def claimed_from(
    where: str, ref: BucketRef, config: dict[str, str], keys: dict[str, str]
) -> ClaimedBucket:
    """The bucket and connection a bound claim's ConfigMap (``config``) and Secret
    (``keys``) describe."""
    missing = [k for k in WHERE if not config.get(k)] + [
        k for k in (ACCESS_KEY, SECRET_KEY) if not keys.get(k)
    ]
    if missing:
        raise NotReconcilable(
            INVALID_CLAIM,
            f"{where}: its ConfigMap and Secret lack {', '.join(missing)}"
            " (as Rook's bucket provisioner writes them)",
            retry=True,
        )
    port = config["BUCKET_PORT"].strip()
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise NotReconcilable(
            INVALID_CLAIM, f"{where}: BUCKET_PORT {port!r} is not a port number", retry=True
        )
    scheme = ref.scheme or ("https" if int(port) == 443 else "http")
    host = config["BUCKET_HOST"].strip()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return ClaimedBucket(
        config["BUCKET_NAME"],
        GatewayConnection(
            f"{scheme}://{host}:{port}",
            keys[ACCESS_KEY],
            keys[SECRET_KEY],
            config.get("BUCKET_REGION") or "default",
            "ceph",
        ),
    )


@dataclass(frozen=True)
class Left:
    """What became of a notification's Id on the bucket of a claim that is gone."""

    gone: bool
    """Off the bucket (removed, or gone with it)."""
    final: bool
    """Nothing more this operator can do: gone, or kept on a bucket it may not change."""
    message: str


async def leave_claimed_bucket(
    kube: Kube,
    settings: OperatorSettings,
    locks: BucketLocks,
    gateways: GatewayPool,
    namespace: str,
    spec: dict[str, Any],
    applied: dict[str, Any],
) -> Left:
    """Take this notification's Id off the bucket its claim named, now that the claim and
    its keys are gone, as far as that can be done.

    With Rook's default reclaim policy (Delete) the provisioner deleted the bucket and the
    Id with it. A bucket it kept (Retain) is changed only by its owner, whose keys went
    with the claim: the Topic's or the operator's gateway user is tried, which may; where
    it may not (it cannot even read the bucket's configuration), no later try would do
    better, and the message says how to remove the Id by hand."""
    bucket, config_id = applied.get("bucket"), applied["id"]
    if not bucket:
        return Left(False, True, f"Id {config_id} may stay on the claim's bucket (not known)")
    parsed = parse_model(BucketNotificationSpec, spec)
    ref: GatewayRef | None = None
    if parsed.topic_ref is not None:
        topic = await kube.get_object("topics", namespace, parsed.topic_ref.name)
        if topic is not None:
            ref = TopicSpec.model_validate(topic["spec"]).gateway_ref
    by_hand = f"remove it with the bucket owner's keys (DELETE /{bucket}?notification={config_id})"
    try:
        connection = await gateway_connection(kube, namespace, ref, settings)
    except (SecretMissing, NotReconcilable) as exc:
        return Left(False, True, f"Id {config_id} stays on bucket {bucket} ({exc}): {by_hand}")
    gateway = await gateways.get(connection)
    try:
        async with locks(connection, bucket):
            entries = await gateway.read(gateway.notifications.list, bucket)
            if not any(c.id == config_id and c.topic_arn == applied["topicArn"] for c in entries):
                return Left(True, True, f"Id {config_id} is no longer on bucket {bucket}")
            await gateway.write(
                gateway.notifications.delete, bucket, config_id, [applied["topicArn"]]
            )
    except GatewayNotFound:
        return Left(True, True, f"bucket {bucket} is gone, and Id {config_id} with it")
    except GatewayAccessDenied:
        return Left(
            False,
            True,
            f"Id {config_id} stays on bucket {bucket}, which outlived its claim: gateway user"
            f" {connection.access_key} may not change it; {by_hand}",
        )
    except GatewayError as exc:
        return Left(False, False, f"Id {config_id} on bucket {bucket} not removed yet: {exc}")
    return Left(True, True, f"Id {config_id} removed from bucket {bucket}")
