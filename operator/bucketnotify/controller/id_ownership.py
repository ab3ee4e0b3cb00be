"""Exactly one owner per (gateway, bucket, notification Id).

A bucket holds one entry per Id; two writers of one Id overwrite each other at every drift
repair, and each reports itself in sync. Two places decide who may write, one for each way
two writers meet:

- **In the cluster**: BucketNotifications of this operator naming one bucket and Id on one
  gateway, in any namespace. The one already holding it wins, else the oldest (ties by
  namespace and name, so every retry decides alike); the others are ``IdConflict`` and never
  write. Once the owner is gone, the next one takes the Id on its next retry.
- **On the gateway**: an entry the bucket already has names its topic, and every gateway
  topic a bucketnotify operator makes carries that operator's owner id (the topic attribute
  ``OWNER``, ``OperatorSettings.owner_id``). An entry whose topic carries another owner is
  another operator's (another cluster on the same gateway) and is never taken. An entry
  whose topic has no mark, or no longer exists, was made outside bucketnotify: it is taken
  only with ``spec.adoptExisting``, or when this notification held the Id before (a hand
  edit of our entry is drift, and is repaired).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["EntryHolder", "IdClaim", "cluster_refusal", "gateway_refusal", "id_owner"]

REASON = "IdConflict"


@dataclass(frozen=True)
class IdClaim:
    """A BucketNotification wanting an Id on a bucket; ``holds`` when it has written it."""

    namespace: str
    name: str
    created: str
    """metadata.creationTimestamp (RFC 3339, so it sorts as text)."""
    holds: bool


@dataclass(frozen=True)
class EntryHolder:
    """An entry with the Id on the bucket, as the gateway shows it."""

    topic_arn: str
    owner: str | None
    """The ``OWNER`` mark of the entry's topic; None when unmarked or the topic is gone."""


def id_owner(claims: Iterable[IdClaim]) -> IdClaim:
    """Of several claims to one Id, the one that gets it."""
    return min(claims, key=lambda c: (not c.holds, c.created, c.namespace, c.name))


def cluster_refusal(me: IdClaim, rivals: Iterable[IdClaim], bucket: str, id: str) -> str | None:
    """None when ``me`` owns the Id among this operator's claims; else why not."""
    owner = id_owner([me, *rivals])
    if owner == me:
        return None
    return (
        f"Id {id!r} on bucket {bucket} belongs to BucketNotification"
        f" {owner.namespace}/{owner.name}; give this one another spec.id, or delete that one"
        " and this one takes the Id over"
    )


def gateway_refusal(
    holders: Iterable[EntryHolder],
    *,
    bucket: str,
    id: str,
    owner_id: str | None,
    held_before: bool,
    adopt: bool,
) -> str | None:
    """None when the entries with the Id that the bucket has may be replaced by ours; else
    why not. ``holders`` leaves out entries that name one of our own topics."""
    for holder in holders:
        if holder.owner is not None and holder.owner == owner_id:
            continue  # a topic of this operator: the cluster check has decided
        if holder.owner is not None:
            return (
                f"Id {id!r} on bucket {bucket} belongs to another bucketnotify operator"
                f" (owner {holder.owner}, topic {holder.topic_arn}), which keeps it: give this"
                " notification another spec.id"
            )
        if held_before or adopt:
            continue
        return (
            f"bucket {bucket} already has an Id {id!r} that bucketnotify did not make (topic"
            f" {holder.topic_arn}); set spec.adoptExisting: true to take it over, or give"
            " this notification another spec.id"
        )
    return None
