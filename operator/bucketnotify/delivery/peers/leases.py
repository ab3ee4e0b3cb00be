"""The Lease objects of queue ownership: their names, labels and annotations, their
settings, how a holder and an expiry are read from one, and who holds each partition
(for ``delivery.peers.ownership``, which takes and renews them, and for people looking on)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.model.timings import setting_default
from bucketnotify.delivery_health import LEASE_GROUP
from bucketnotify.delivery_health import partition_of as shared_partition_of
from bucketnotify.kube.apiserver import ApiClient, lease_path
from bucketnotify.settings import DeliveryServiceSettings

__all__ = [
    "ADDRESS_ANNOTATION",
    "GROUP_LABEL",
    "HANDS_OVER_ANNOTATION",
    "ROLE_LABEL",
    "Lease",
    "LeaseHolder",
    "LeaseSettings",
    "lease_annotation",
    "lease_expired",
    "lease_holder",
    "lease_labels",
    "member_annotations",
    "partition_holders",
    "partition_lease_name",
    "partition_of",
    "utc_now",
]

ROLE_LABEL = "bucketnotify.io/lease-role"
GROUP_LABEL = "bucketnotify.io/lease-group"
ADDRESS_ANNOTATION = "bucketnotify.io/address"
"""On a member Lease: ``host:port`` where the replica's ingest (and ``/v1/wake``) listens."""
HANDS_OVER_ANNOTATION = "bucketnotify.io/hands-over"
"""On a member Lease, ``"true"``: the replica hands requests for other replicas' shards to
their owner, and tells the owner before answering when it commits to one instead
(``delivery.peers.forwarding``). Owners push directly only while every member says so: a replica
without it (direct delivery off, or a release before it) commits to their shards untold."""


def partition_of(queue: QueueName, shard: int, partitions: int) -> int:
    return shared_partition_of(queue.namespace, queue.topic, shard, partitions)


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    """Namespace of the Leases (the delivery service's own)."""
    group: str = LEASE_GROUP
    """Prefix of the Lease names; replicas of one deployment share it."""
    partitions: int = setting_default("partitions")
    """Ownership units; more than the replicas you will ever run, so shares stay even."""
    lease_duration_s: int = setting_default("lease_duration_seconds")
    """A dead replica's partitions expire after this long (the gateway: 90 s) and are taken
    at the survivors' next renewal."""
    renew_interval_s: float = setting_default("renew_interval_seconds")
    """How often leases are renewed and the spread is rebalanced."""
    renew_deadline_s: float = setting_default("renew_deadline_seconds")
    """A replica stops processing a partition this long after its last renewal; shorter
    than lease_duration_s so two owners never overlap."""
    owner: dict[str, str] | None = None
    """An ownerReference every Lease written carries (the Deployment of the replicas): when
    it is deleted, Kubernetes' garbage collector deletes the Leases, so an uninstall leaves
    none behind."""

    @classmethod
    def of(cls, settings: DeliveryServiceSettings, owner: dict[str, str] | None) -> LeaseSettings:
        """The Lease settings a replica's settings ask for, ``owner`` the reference to its
        Deployment (read from the API server) or None."""
        return cls(
            namespace=settings.lease_namespace,
            owner=owner,
            partitions=settings.partitions,
            lease_duration_s=settings.lease_duration_seconds,
            renew_interval_s=settings.renew_interval_seconds,
            renew_deadline_s=settings.renew_deadline_seconds,
        )

    @property
    def member_gone_after_s(self) -> float:
        """How long a member Lease stays expired before a live replica deletes it: a replica
        that died (a pod that is gone) must not leave one behind for good, and one only
        paused (or cut off from the API server) has had five lease durations to renew."""
        return 5.0 * self.lease_duration_s


def partition_lease_name(group: str, partition: int) -> str:
    return f"{group}-partition-{partition}"


Lease = dict[str, Any]
"""A coordination.k8s.io/v1 Lease as the API server sends it."""


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def lease_holder(lease: Lease) -> str:
    return str(lease.get("spec", {}).get("holderIdentity") or "")


def lease_expired(lease: Lease, now: dt.datetime) -> bool:
    spec = lease.get("spec", {})
    if not spec.get("holderIdentity") or not spec.get("renewTime"):
        return True
    renewed = dt.datetime.fromisoformat(spec["renewTime"])
    if renewed.tzinfo is None:
        renewed = renewed.replace(tzinfo=dt.UTC)
    return renewed + dt.timedelta(seconds=spec.get("leaseDurationSeconds") or 0) < now


def lease_annotation(lease: Lease, key: str) -> str | None:
    annotations: dict[str, str] = lease["metadata"].get("annotations") or {}
    return annotations.get(key)


def member_annotations(address: str | None, hands_over: bool) -> dict[str, str]:
    """The annotations of a member Lease: where its replica listens, and whether it hands
    requests over; nothing without an address (nobody could reach it)."""
    if not address:
        return {}
    said = {ADDRESS_ANNOTATION: address}
    if hands_over:
        said[HANDS_OVER_ANNOTATION] = "true"
    return said


def lease_labels(lease: Lease) -> dict[str, str]:
    return lease["metadata"].get("labels") or {}


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds one partition Lease, judged as the replicas judge it."""

    identity: str
    """The holder; empty when it was handed back."""
    expired: bool
    """True when anyone may take it: released, or not renewed within its duration."""


async def partition_holders(
    api: ApiClient, settings: LeaseSettings, *, request_timeout: float | None = None
) -> dict[int, LeaseHolder]:
    """The holders of the partition Leases that exist (one LIST), for people looking on."""
    listed = await api.get(
        lease_path(settings.namespace),
        params={"labelSelector": f"{GROUP_LABEL}={settings.group},{ROLE_LABEL}=partition"},
        request_timeout=request_timeout,
    )
    now = utc_now()
    names = {partition_lease_name(settings.group, p): p for p in range(settings.partitions)}
    return {
        names[lease["metadata"]["name"]]: LeaseHolder(
            lease_holder(lease), lease_expired(lease, now)
        )
        for lease in listed["items"]
        if lease["metadata"]["name"] in names
    }
