"""The log lines a round's lost events get (``delivery.recorded.accounting.log_lost``, what
the shard rounds and the direct pushes both call): one WARNING per lost event naming its bucket and
key, at most ten per round and then one line with the rest's count, and the key escaped
so that a key holding a newline stays on its line."""

from __future__ import annotations

import logging

import pytest

from bucketnotify.delivery.model.outcomes import EventOutcome, RoundResult
from bucketnotify.delivery.model.queue import Entry, QueueName
from bucketnotify.delivery.recorded.accounting import log_lost
from bucketnotify.records import Outcome

QUEUE = QueueName("ns", "orders")


def lost(key: str, outcome: Outcome = Outcome.EXPIRED) -> EventOutcome:
    record = {"s3": {"bucket": {"name": "photos"}, "object": {"key": key}}}
    entry = Entry(id=key, event_id=key, body=b"{}", ingest_time=1.0, attempts=3)
    return EventOutcome(outcome, entry, record, attempts=3, at=2.0, error="answered 500")


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "bucketnotify.delivery.recorded.accounting"]


def test_each_lost_event_is_one_warning_naming_bucket_and_escaped_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    delivered = EventOutcome(
        Outcome.DELIVERED, Entry("d", "d", b"{}", 1.0), {"s3": {}}, attempts=1, at=2.0
    )
    result = RoundResult(
        outcomes=[lost("nl\nkey.txt"), delivered, lost("tab\tand\x00nul", Outcome.REJECTED)]
    )
    with caplog.at_level(logging.DEBUG):
        log_lost(QUEUE, 3, result)
    found = lines(caplog)
    assert [r.levelno for r in found] == [logging.WARNING] * 2
    messages = [r.getMessage() for r in found]
    assert all("\n" not in m and "\t" not in m and "\x00" not in m for m in messages)
    assert "ns/orders shard 3: event lost, bucket 'photos' key 'nl\\nkey.txt'" in messages[0]
    assert "(expired after 3 attempts): answered 500" in messages[0]
    assert "key 'tab\\tand\\x00nul' (rejected after 3 attempts)" in messages[1]


def test_at_most_ten_lost_events_are_named_per_round_then_the_rest_are_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG):
        log_lost(QUEUE, 0, RoundResult(outcomes=[lost(f"k{i}") for i in range(25)]))
    messages = [r.getMessage() for r in lines(caplog)]
    assert len(messages) == 11
    assert [m.split("key ")[1].split(" ")[0] for m in messages[:10]] == [
        f"'k{i}'" for i in range(10)
    ]
    assert messages[10] == "ns/orders shard 0: 15 more events lost this round"

    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        log_lost(QUEUE, 0, RoundResult(outcomes=[lost(f"k{i}") for i in range(10)]))
    assert len(lines(caplog)) == 10, "ten lost: all named, no count line"
