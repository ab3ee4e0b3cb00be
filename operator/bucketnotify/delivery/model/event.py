"""An S3 event record's identity, its object and its shard: the one place each is worked out,
for the ingest, the rounds, the endpoints, the delivery records and the dead-letter sink.

"Event" here is the S3 event the gateway sends (one entry of its ``Records``), never a
Kubernetes Event.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

__all__ = ["event_id", "event_shard", "object_of", "shard_of"]


def object_of(record: Mapping[str, Any]) -> tuple[str, str]:
    """(bucket, key) of an event record; empty strings where the record has none."""
    s3 = record.get("s3") or {}
    return (
        str((s3.get("bucket") or {}).get("name", "")),
        str((s3.get("object") or {}).get("key", "")),
    )


def shard_of(bucket: str, key: str, shards: int) -> int:
    """The shard of an object's events: stable across processes and releases (not hash())."""
    digest = hashlib.blake2b(f"{bucket}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def event_id(record: Mapping[str, Any]) -> str:
    """The identity of an event: the gateway sends some events twice, with equal fields."""
    s3 = record.get("s3") or {}
    parts = [
        str((record.get("responseElements") or {}).get("x-amz-request-id", "")),
        str((s3.get("bucket") or {}).get("name", "")),
        str((s3.get("object") or {}).get("key", "")),
        str(s3.get("configurationId", "")),
        str(record.get("eventName", "")),
        str((s3.get("object") or {}).get("sequencer", "")),
    ]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def event_shard(record: Mapping[str, Any], shards: int) -> int:
    """The shard of an event record's object among ``shards``."""
    return shard_of(*object_of(record), shards)
