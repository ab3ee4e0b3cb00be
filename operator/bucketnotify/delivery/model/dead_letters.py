"""Dead letters kept in the queue store: what a Topic dropped, readable and sendable again.

A Topic with ``spec.delivery.deadLetters.keep`` has a second queue beside its own, named
``<topic>_dead-letters``: a name no Topic can have (``_`` is not allowed in a Kubernetes
name), so it never meets a Topic's queue. Its shard 0 holds the dead letters (not delivered
in order: a redrive puts each back into the shard of its object), its shard 1 tallies of
what was redriven or purged; it has bounds of its own.

Each entry keeps the event exactly as the gateway sent it (its identity and its bytes, so
``eventTime`` and everything else come back unchanged when it is redriven) and why it was
dropped: the reason, the attempts, the first and last failure and the last push error.
The replicas write them (``delivery.rounds.dead_letters``); the admin CLI lists, shows,
redrives and purges them (``admin.dead_letters``).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bucketnotify.delivery.model.outcomes import EventOutcome
from bucketnotify.delivery.model.queue import Entry, QueueName, QueueStore
from bucketnotify.records import Outcome

__all__ = [
    "DEAD_LETTERS_SHARD",
    "SHARDS",
    "SUFFIX",
    "TALLY_SHARD",
    "DeadLetter",
    "append",
    "dead_letter_queue",
    "tallies",
    "tally",
    "topic_queue_of",
]

SUFFIX = "_dead-letters"
SHARDS = 2
DEAD_LETTERS_SHARD = 0
"""The dead letters themselves."""
TALLY_SHARD = 1
"""Tallies of what the admin CLI redrove or purged, for the replicas to count and remove
(the CLI is not scraped): ``{"what": "redriven"|"purged", "n": count}``."""


def dead_letter_queue(queue: QueueName) -> QueueName:
    """Where the dead letters of Topic queue ``queue`` are kept."""
    return QueueName(queue.namespace, queue.topic + SUFFIX)


def topic_queue_of(queue: QueueName) -> QueueName | None:
    """The Topic queue whose dead letters ``queue`` keeps; None for a Topic's own queue."""
    if not queue.topic.endswith(SUFFIX):
        return None
    return QueueName(queue.namespace, queue.topic.removesuffix(SUFFIX))


@dataclass(frozen=True)
class DeadLetter:
    """One dropped event and why."""

    event_id: str
    body: bytes = field(repr=False)
    """The event record as the gateway sent it, byte for byte."""
    outcome: str
    """``expired`` (timeToLive or maxRetries) or ``rejected`` (the endpoint refused it for
    good: retrying cannot help)."""
    reason: str
    attempts: int
    ingest_time: float
    """When the event was first committed to the Topic's queue (epoch seconds)."""
    dropped_at: float
    first_failure: float | None = None
    last_failure: float | None = None
    last_error: str | None = None
    """The last push's error (redacted by the endpoint: never a credential)."""

    @classmethod
    def of(cls, dropped: EventOutcome) -> DeadLetter:
        entry = dropped.entry
        rejected = dropped.outcome is Outcome.REJECTED
        last_error = dropped.error if rejected else (entry.last_error or None)
        return cls(
            event_id=entry.event_id,
            body=entry.body,
            outcome="rejected" if rejected else "expired",
            reason=(dropped.error or "refused") if rejected else (dropped.error or "expired"),
            attempts=dropped.attempts,
            ingest_time=entry.ingest_time,
            dropped_at=dropped.at,
            first_failure=entry.first_failure or (dropped.at if rejected else None),
            last_failure=dropped.at if rejected else (entry.last_failure or None),
            last_error=last_error,
        )

    def encode(self) -> bytes:
        """The dead-letter queue entry's body: JSON; the event as text (any bytes that are
        not UTF-8 kept through ``surrogateescape``, as the stores keep bodies)."""
        document: dict[str, Any] = {
            "eventId": self.event_id,
            "outcome": self.outcome,
            "reason": self.reason,
            "attempts": self.attempts,
            "ingestTime": self.ingest_time,
            "droppedAt": self.dropped_at,
            "firstFailure": self.first_failure,
            "lastFailure": self.last_failure,
            "lastError": self.last_error,
            "event": self.body.decode("utf-8", "surrogateescape"),
        }
        return json.dumps(document, ensure_ascii=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, entry: Entry) -> DeadLetter:
        """The dead letter an entry of a dead-letter queue holds; ValueError for anything
        else (a foreign write)."""
        try:
            document = json.loads(entry.body)
            return cls(
                event_id=str(document["eventId"]),
                body=str(document["event"]).encode("utf-8", "surrogateescape"),
                outcome=str(document["outcome"]),
                reason=str(document["reason"]),
                attempts=int(document["attempts"]),
                ingest_time=float(document["ingestTime"]),
                dropped_at=float(document["droppedAt"]),
                first_failure=_time(document.get("firstFailure")),
                last_failure=_time(document.get("lastFailure")),
                last_error=document.get("lastError") or None,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"entry {entry.id} is not a dead letter: {exc}") from None

    def record(self) -> dict[str, Any] | None:
        """The event record, or None when its bytes are not a JSON object."""
        try:
            found = json.loads(self.body)
        except ValueError:
            return None
        return found if isinstance(found, dict) else None


def _time(value: Any) -> float | None:
    return None if value is None else float(value)


async def append(
    store: QueueStore, queue: QueueName, shard: int, events: Sequence[tuple[str, bytes]]
) -> None:
    """Reserve room for ``events`` in one shard of a queue and commit them (``QueueFull``
    when there is none): how the replicas keep dead letters and the admin CLI moves and
    tallies them, one writer's small batches that need no group commit."""
    now = time.time()
    reservation = await store.reserve(
        queue, shard, len(events), sum(len(body) for _, body in events), now
    )
    try:
        await store.commit(reservation, events, now)
    except BaseException:
        with contextlib.suppress(Exception):  # else it expires and is reclaimed
            await store.abort(reservation)
        raise


def tally(what: str, amount: int) -> bytes:
    """A tally entry's body: ``amount`` dead letters were ``what`` (redriven, purged)."""
    return json.dumps({"what": what, "n": amount}).encode()


def tallies(entries: Sequence[Entry]) -> dict[str, int]:
    """What tally entries add up to; foreign ones count nothing."""
    counted: dict[str, int] = {}
    for entry in entries:
        try:
            found = json.loads(entry.body)
            what, amount = str(found["what"]), int(found["n"])
        except (ValueError, KeyError, TypeError):
            continue
        counted[what] = counted.get(what, 0) + amount
    return counted
