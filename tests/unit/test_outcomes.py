"""What becomes of an event (``delivery.model.outcomes``), the one decision the shard rounds and
the direct pushes share: delivered, tried again, refused for good, expired, dropped to the
dead-letter topic or lost, or kept queued when the dead-letter topic refuses."""

from __future__ import annotations

from bucketnotify.delivery.model.outcomes import (
    DeliveryPolicy,
    EventOutcome,
    dropped,
    expiry,
    judge,
    not_dropped,
)
from bucketnotify.delivery.model.push import PushOutcome
from bucketnotify.delivery.model.queue import Entry
from bucketnotify.records import Outcome


def test_one_decision_per_push_for_the_rounds_and_the_direct_path() -> None:
    """``judge``: acknowledged is delivered; a failure another attempt may fix is tried
    again; one retrying cannot help is refused for good (the caller drops it, to the
    dead-letter topic or lost). Every push counts as an attempt; errors are kept."""
    entry = Entry(id="e", event_id="id", body=b"{}", ingest_time=1.0, attempts=2)
    record = {"s3": {}}
    delivered = judge(entry, record, PushOutcome("e", ok=True, retryable=True), 5.0)
    failed = judge(entry, record, PushOutcome("e", False, True, "answered 503"), 5.0)
    refused = judge(entry, record, PushOutcome("e", False, False, "too large"), 5.0)
    assert (delivered.outcome, delivered.attempts, delivered.error) == (Outcome.DELIVERED, 3, None)
    assert (failed.outcome, failed.attempts, failed.error) == (Outcome.FAILED, 3, "answered 503")
    assert (refused.outcome, refused.error) == (Outcome.REJECTED, "too large")
    assert {v.at for v in (delivered, failed, refused)} == {5.0}


def test_an_entry_expires_by_its_time_to_live_or_its_retries_and_not_before() -> None:
    policy = DeliveryPolicy(time_to_live_s=60, max_retries=3)
    young = Entry(id="e", event_id="id", body=b"{}", ingest_time=100.0, attempts=3)
    assert expiry(young, policy, now=160.0) is None
    assert expiry(young, policy, now=160.5) == "timeToLive of 60 s passed"
    tried = Entry(id="e", event_id="id", body=b"{}", ingest_time=100.0, attempts=4)
    assert expiry(tried, policy, now=101.0) == "maxRetries 3 used up after 4 attempts"
    # 0 means unlimited, as in the reference.
    assert expiry(tried, DeliveryPolicy(), now=10_000.0) is None


def _outcome(kind: Outcome) -> EventOutcome:
    entry = Entry(id="e", event_id="id", body=b"{}", ingest_time=1.0, attempts=1)
    return EventOutcome(kind, entry, {"s3": {}}, 2, 5.0, "why")


def test_a_drop_goes_to_the_dead_letter_topic_that_takes_it_else_the_event_is_lost() -> None:
    for kind in (Outcome.EXPIRED, Outcome.REJECTED):
        taken = dropped(_outcome(kind), dead_lettered=True)
        assert (taken.outcome, taken.attempts, taken.error) == (Outcome.DEAD_LETTERED, 2, "why")
        assert dropped(_outcome(kind), dead_lettered=False).outcome is kind  # lost


def test_a_drop_the_dead_letter_topic_refused_keeps_the_event_queued() -> None:
    """Nothing is lost silently: a refused push stays as one more failed attempt, an expired
    entry records nothing until it is dropped for real."""
    kept = not_dropped(_outcome(Outcome.REJECTED))
    assert kept is not None and (kept.outcome, kept.error) == (Outcome.FAILED, "why")
    assert not_dropped(_outcome(Outcome.EXPIRED)) is None
    failed = _outcome(Outcome.FAILED)
    assert not_dropped(failed) == failed
