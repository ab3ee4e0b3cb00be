"""One event to push, and what became of it: what every endpoint kind takes and returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bucketnotify import compact_json

__all__ = ["Delivery", "PushOutcome", "event_body"]


@dataclass(frozen=True)
class Delivery:
    """One event to push."""

    id: str
    """The queue entry id; outcomes refer to it."""
    record: dict[str, Any]
    """One S3 event record; pushed as ``{"Records": [record]}``, like the gateway does."""
    queued: bytes | None = None
    """The record as queued (the ingest's compact UTF-8 JSON of it): when given, the push
    wraps these bytes instead of encoding ``record`` again (docs/performance-notes.md)."""

    @property
    def body(self) -> bytes:
        """What every endpoint kind carries: ``{"Records":[record]}``, compact UTF-8."""
        if self.queued is None:
            return event_body(self.record)
        return b'{"Records":[' + self.queued + b"]}"


@dataclass(frozen=True)
class PushOutcome:
    """What became of one delivery."""

    id: str
    """The ``Delivery.id`` this outcome is for."""
    ok: bool
    """The endpoint acknowledged the event at the topic's ack level."""
    retryable: bool
    """False only when retrying cannot help (e.g. the message is too large)."""
    error: str | None = None
    """Why it failed, short; never contains credentials. None when ``ok``."""


def event_body(record: dict[str, Any]) -> bytes:
    """The JSON every endpoint kind carries: ``{"Records":[record]}``, compact UTF-8."""
    return compact_json.dumps({"Records": [record]})
