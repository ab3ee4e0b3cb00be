"""Delivery records: the schema, version 1, shared by the delivery service and the Spark job.

One record per event outcome. The delivery service writes them in batches as gzip-compressed
JSON lines, one object per batch, under ``<prefix>/v1/date=YYYY-MM-DD/hour=HH/`` (UTC hour of
``outcome_time``). ``docs/records.md`` explains each field; ``FIELDS`` below is the one
definition both the writer and the reader (spark/) use, so they cannot drift apart.

Readers must be idempotent: a batch may be written twice (a retried upload) and the same
outcome may be recorded twice, so ``record_id`` is the identity to deduplicate on. A record
can land in a later batch than its outcome (late record); its partition is still the hour
of ``outcome_time``.

This module imports nothing but the standard library: the Spark driver loads it on its own.
"""

from __future__ import annotations

import enum
import json
import time
import uuid
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Final

__all__ = [
    "FIELDS",
    "SCHEMA_VERSION",
    "DeliveryRecord",
    "Field",
    "Outcome",
    "partition_of",
]

SCHEMA_VERSION: Final = 1


class Outcome(enum.StrEnum):
    INGESTED = "ingested"
    """Committed to the topic's queue by the ingest (the event was triggered)."""
    DELIVERED = "delivered"
    """Acknowledged by the endpoint."""
    FAILED = "failed"
    """One push attempt failed; the event stays queued for a retry."""
    EXPIRED = "expired"
    """Dropped after ``timeToLive`` or ``maxRetries``: lost (unless dead-lettered)."""
    REJECTED = "rejected"
    """Dropped because retrying cannot help (e.g. too large for the broker): lost."""
    DEAD_LETTERED = "dead_lettered"
    """Dropped from this topic and committed to its dead-letter topic's queue, or kept as a
    dead letter in the store (a redrive may bring it back: later records follow)."""
    DUPLICATE = "duplicate"
    """A copy of an already delivered event (the gateway re-sent it), removed unsent."""


TERMINAL_OUTCOMES: Final = frozenset(
    {Outcome.DELIVERED, Outcome.EXPIRED, Outcome.REJECTED, Outcome.DEAD_LETTERED}
)
"""The outcomes that end an event's life in a queue (``duplicate`` ends a copy's)."""


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    """``string``, ``long`` or ``double`` (JSON string, integer, number)."""
    nullable: bool
    doc: str


FIELDS: Final[tuple[Field, ...]] = (
    Field("schema_version", "long", False, "Version of this schema: 1."),
    Field("record_id", "string", False, "Unique id of this record; deduplicate on it."),
    Field("outcome", "string", False, "One of the Outcome values."),
    Field("namespace", "string", False, "Namespace of the Topic."),
    Field("topic", "string", False, "Name of the Topic resource."),
    Field("bucket", "string", False, "Bucket of the object (s3.bucket.name)."),
    Field("key", "string", False, "Object key (s3.object.key)."),
    Field("event_name", "string", False, "eventName, e.g. ObjectCreated:Put."),
    Field("configuration_id", "string", False, "s3.configurationId: the notification's Id."),
    Field("event_id", "string", False, "Identity of the event; a re-sent copy has the same."),
    Field("event_time", "double", True, "eventTime at the gateway, epoch seconds (UTC)."),
    Field("ingest_time", "double", False, "When the ingest committed it, epoch seconds."),
    Field("outcome_time", "double", False, "When the outcome happened, epoch seconds."),
    Field(
        "attempts",
        "long",
        False,
        "Push attempts made, counting the one this record is about (0 for ingested).",
    ),
    Field("endpoint_kind", "string", True, "http, amqp or kafka; null for ingested."),
    Field("shard", "long", False, "Queue shard of the object."),
    Field("replica", "string", False, "Identity of the delivery replica that wrote it."),
    Field("error", "string", True, "Why a push failed or the event was dropped (redacted)."),
)


@dataclass(frozen=True)
class DeliveryRecord:
    outcome: Outcome
    namespace: str
    topic: str
    bucket: str
    key: str
    event_name: str
    configuration_id: str
    event_id: str
    event_time: float | None
    ingest_time: float
    outcome_time: float
    attempts: int
    endpoint_kind: str | None
    shard: int
    replica: str
    error: str | None = None
    record_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def of_event(
        cls,
        event: dict[str, Any],
        *,
        outcome: Outcome,
        namespace: str,
        topic: str,
        event_id: str,
        ingest_time: float,
        attempts: int,
        endpoint_kind: str | None,
        shard: int,
        replica: str,
        error: str | None = None,
        outcome_time: float | None = None,
    ) -> DeliveryRecord:
        """The record of an outcome of ``event`` (one S3 event record as the gateway sent it)."""
        s3 = event.get("s3") or {}
        return cls(
            outcome=outcome,
            namespace=namespace,
            topic=topic,
            bucket=str((s3.get("bucket") or {}).get("name", "")),
            key=str((s3.get("object") or {}).get("key", "")),
            event_name=str(event.get("eventName", "")),
            configuration_id=str(s3.get("configurationId", "")),
            event_id=event_id,
            event_time=_epoch(event.get("eventTime")),
            ingest_time=ingest_time,
            outcome_time=time.time() if outcome_time is None else outcome_time,
            attempts=attempts,
            endpoint_kind=endpoint_kind,
            shard=shard,
            replica=replica,
            error=error,
        )

    def to_json(self) -> str:
        # Every field is a plain value: asdict's recursive copy cost twice the encoding.
        values = {name: getattr(self, name) for name in _RECORD_FIELDS}
        return json.dumps(values, separators=(",", ":"), ensure_ascii=False)


_RECORD_FIELDS = tuple(f.name for f in fields(DeliveryRecord))


def partition_of(outcome_time: float) -> str:
    """``date=YYYY-MM-DD/hour=HH`` of an outcome time (UTC)."""
    at = datetime.fromtimestamp(outcome_time, UTC)
    return f"date={at:%Y-%m-%d}/hour={at:%H}"


def _epoch(value: object) -> float | None:
    # The gateway writes e.g. "2026-11-22T06:41:32.123Z"; anything else is kept as unknown
    # rather than guessed.
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
