"""What becomes of an event: one push's verdict, expiry, and what a drop makes of it.

The one place these are decided, for the shard rounds (``worker``) and for the ingest's
direct pushes (``direct_push``) alike:

- ``judge``: a push acknowledged is DELIVERED; one another attempt may fix is FAILED (the
  entry waits for its next attempt); one retrying cannot help (too large for the broker,
  say) is REJECTED, and dropped at once.
- ``DeliveryPolicy.retry_delay``: the pause before the next attempt, fixed or growing
  exponentially with jitter;
- ``expiry``: ``maxRetries`` counts retries, so an entry gets 1 + maxRetries attempts in all
  (the gateway's own check drops it one attempt early); ``timeToLive`` counts from the
  ingest; 0 is unlimited for both, as on the gateway.
- ``dropped`` / ``not_dropped``: a dropped event (expired or rejected) goes to the Topic's
  dead-letter topic if it has one and that takes it, else is lost; one the dead-letter
  topic refuses is not dropped but stays queued, so nothing is lost silently.

``RoundResult`` counts them per round (or per direct push) for the metrics, the Kubernetes
Events and the delivery records, which therefore add up to the same numbers.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from bucketnotify.api.topic import DeliverySettings
from bucketnotify.delivery.model.push import PushOutcome
from bucketnotify.delivery.model.queue import Entry
from bucketnotify.records import Outcome

__all__ = [
    "DeliveryPolicy",
    "EventOutcome",
    "RoundResult",
    "dropped",
    "expiry",
    "judge",
    "not_dropped",
]


@dataclass(frozen=True)
class DeliveryPolicy:
    time_to_live_s: int = 0
    max_retries: int = 0
    retry_sleep_s: int = 0
    backoff: Literal["fixed", "exponential"] = "fixed"
    max_retry_sleep_s: int = DeliverySettings.model_fields["max_retry_sleep_duration"].default
    """The longest pause of the exponential backoff, before its jitter."""

    def retry_delay(self, attempts: int, draw: Callable[[], float] = random.random) -> float:
        """Seconds before the next attempt of an event whose ``attempts``-th push failed.

        Fixed: ``retry_sleep_s``. Exponential: ``retry_sleep_s`` (at least 1 s) times
        2^(attempts - 1), at most ``max_retry_sleep_s``, of which the second half is drawn
        at random ("equal jitter": a pause never falls below half its step, so the steps
        still grow to the cap, while the events that failed together spread out)."""
        if self.backoff == "fixed":
            return float(self.retry_sleep_s)
        step = min(
            float(self.max_retry_sleep_s),
            max(self.retry_sleep_s, 1) * 2.0 ** min(max(attempts, 1) - 1, 30),
        )
        return step / 2 + draw() * step / 2


@dataclass(frozen=True)
class EventOutcome:
    """What became of one queue entry in a round: the stuff of one delivery record."""

    outcome: Outcome
    entry: Entry
    record: dict[str, Any]
    """The event as the gateway sent it."""
    attempts: int
    """Push attempts made, counting this round's push of it if there was one."""
    at: float
    """Epoch seconds of the outcome."""
    error: str | None = None


@dataclass
class RoundResult:
    listed: int = 0
    delivered: int = 0
    failed: int = 0
    """Failed pushes that will be retried."""
    rejected: int = 0
    """Failed pushes that retrying cannot help (also counted in ``expired`` or
    ``dead_lettered``)."""
    retried: int = 0
    """Entries written back for another attempt (``failed`` unless fenced)."""
    expired: int = 0
    """Dropped (expired or undeliverable) and lost."""
    dead_lettered: int = 0
    """Dropped and handed to the dead-letter topic."""
    duplicates: int = 0
    fenced: bool = False
    cut_short: bool = False
    """The queue store failed to remove what the round pushed and dropped: its pushes
    happened, its drops and removals did not (``RoundCutShort``)."""
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    """Seconds from the ingest to the acknowledgement of each delivered entry."""
    outcomes: list[EventOutcome] = field(default_factory=list)
    left: int = 0
    """Listed entries the round left in the shard (failed, waiting for their retry time or
    behind a waiting event of their object); of a full batch, more may follow them."""
    oldest_left: float | None = None
    """The commit time of the oldest of those."""

    @property
    def drops_stand(self) -> bool:
        """Its drops (expired, dead-lettered, duplicates) and write-backs happened: neither
        fenced nor cut short."""
        return not (self.fenced or self.cut_short)


def judge(entry: Entry, record: dict[str, Any], outcome: PushOutcome, at: float) -> EventOutcome:
    """What one push made of its event: the one decision of the rounds and of the direct
    path. DELIVERED; FAILED when another attempt may succeed (the entry waits for it);
    REJECTED when retrying cannot help (e.g. too large for the broker), which the caller
    drops at once: to the dead-letter topic if it takes it, else lost."""
    if outcome.ok:
        return EventOutcome(Outcome.DELIVERED, entry, record, entry.attempts + 1, at)
    kind = Outcome.FAILED if outcome.retryable else Outcome.REJECTED
    return EventOutcome(kind, entry, record, entry.attempts + 1, at, outcome.error)


def expiry(entry: Entry, policy: DeliveryPolicy, now: float) -> str | None:
    """Why ``entry`` has expired, or None while it has not."""
    if policy.time_to_live_s and now - entry.ingest_time > policy.time_to_live_s:
        return f"timeToLive of {policy.time_to_live_s} s passed"
    if policy.max_retries and entry.attempts > policy.max_retries:
        return f"maxRetries {policy.max_retries} used up after {entry.attempts} attempts"
    return None


def dropped(outcome: EventOutcome, dead_lettered: bool) -> EventOutcome:
    """A drop (of an EXPIRED entry or a REJECTED push) that happened: DEAD_LETTERED when the
    dead-letter topic took the event, else as it was, and the event is lost."""
    return replace(outcome, outcome=Outcome.DEAD_LETTERED) if dead_lettered else outcome


def not_dropped(outcome: EventOutcome) -> EventOutcome | None:
    """What to record of an event whose drop did not happen (the dead-letter topic refused
    it, or the round was fenced or cut short) and which therefore stays queued: a REJECTED
    push was one more failed attempt (FAILED); an EXPIRED entry has nothing to record until
    it is dropped (None); anything else is recorded as it is."""
    if outcome.outcome is Outcome.REJECTED:
        return replace(outcome, outcome=Outcome.FAILED)
    if outcome.outcome is Outcome.EXPIRED:
        return None
    return outcome
