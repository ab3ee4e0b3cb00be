"""Dead letters kept in the queue store: what each keeps, which ones a command takes, and a
redrive that moves them back (on the real local-directory store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bucketnotify.admin.dead_letters import (
    Selection,
    Stopped,
    choose,
    describe,
    parse_time,
    purge,
    redrive,
)
from bucketnotify.delivery.model.dead_letters import (
    SHARDS,
    TALLY_SHARD,
    DeadLetter,
    dead_letter_queue,
    tallies,
    topic_queue_of,
)
from bucketnotify.delivery.model.event import event_shard
from bucketnotify.delivery.model.outcomes import EventOutcome
from bucketnotify.delivery.model.queue import Entry, QueueLimits, QueueName
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery_health import Backlog, Report, TopicHealth, delivery_status, merge
from bucketnotify.records import Outcome
from tests.records import event

QUEUE = QueueName("shop", "orders")
KEPT = dead_letter_queue(QUEUE)
T0 = 1_800_000_000.0


def test_the_dead_letter_queue_has_a_name_no_topic_can_have() -> None:
    assert QueueName("shop", "orders_dead-letters") == KEPT
    assert topic_queue_of(KEPT) == QUEUE
    assert topic_queue_of(QUEUE) is None


def test_a_dead_letter_keeps_the_event_byte_for_byte_and_why_it_was_dropped() -> None:
    body = json.dumps(event("a/b", eventTime="2026-12-07T10:00:00.000Z")).encode() + b"\xff"
    entry = Entry(
        id="1",
        event_id="e1",
        body=body,
        ingest_time=T0,
        attempts=3,
        first_failure=T0 + 1,
        last_failure=T0 + 3,
        last_error="503 Service Unavailable",
    )
    expired = EventOutcome(Outcome.EXPIRED, entry, {}, 3, T0 + 9, "timeToLive of 5 s passed")
    letter = DeadLetter.of(expired)
    back = DeadLetter.decode(Entry(id="x", event_id="e1", body=letter.encode(), ingest_time=0))
    assert back == letter
    assert back.body == body
    assert (back.outcome, back.reason, back.attempts) == (
        "expired",
        "timeToLive of 5 s passed",
        3,
    )
    assert (back.first_failure, back.last_failure, back.dropped_at) == (T0 + 1, T0 + 3, T0 + 9)
    assert back.last_error == "503 Service Unavailable"


def test_a_refused_event_is_rejected_with_the_endpoints_answer() -> None:
    entry = Entry(id="1", event_id="e1", body=b"{}", ingest_time=T0)
    refused = EventOutcome(Outcome.REJECTED, entry, {}, 1, T0 + 2, "message too large")
    letter = DeadLetter.of(refused)
    assert (letter.outcome, letter.reason, letter.last_error) == (
        "rejected",
        "message too large",
        "message too large",
    )
    assert letter.first_failure == letter.last_failure == T0 + 2


def test_an_entry_that_is_no_dead_letter_is_refused() -> None:
    with pytest.raises(ValueError, match="not a dead letter"):
        DeadLetter.decode(Entry(id="x", event_id="e", body=b"{}", ingest_time=0))


def test_times_are_rfc3339_or_a_duration_ago() -> None:
    assert parse_time("2026-12-07T10:00:00Z", T0) == 1796637600.0
    assert parse_time("30m", T0) == T0 - 1800
    assert parse_time("1.5h", T0) == T0 - 5400
    with pytest.raises(ValueError, match="no time zone"):
        parse_time("2026-12-07T10:00:00", T0)
    with pytest.raises(ValueError, match="neither an RFC 3339 time"):
        parse_time("yesterday", T0)


async def kept_store(tmp_path: Path, keys: list[str]) -> LocalDirStore:
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 3, QueueLimits())
    await store.create(KEPT, SHARDS, QueueLimits())
    for n, key in enumerate(keys):
        entry = Entry(
            id=str(n), event_id=f"id-{key}", body=json.dumps(event(key)).encode(), ingest_time=T0
        )
        dropped = EventOutcome(Outcome.EXPIRED, entry, {}, 2, T0 + 10 * n, "timeToLive")
        body = DeadLetter.of(dropped).encode()
        reservation = await store.reserve(KEPT, 0, 1, len(body), T0)
        await store.commit(reservation, [(entry.event_id, body)], T0)
    return store


async def test_a_selection_takes_by_prefix_time_and_count(tmp_path: Path) -> None:
    store = await kept_store(tmp_path, ["a/1", "b/1", "a/2", "a/3"])

    async def keys(selection: Selection) -> list[str]:
        return [c.letter.event_id for c in await choose(store, KEPT, selection)]

    assert await keys(Selection()) == ["id-a/1", "id-b/1", "id-a/2", "id-a/3"]
    assert await keys(Selection(prefix="a/")) == ["id-a/1", "id-a/2", "id-a/3"]
    assert await keys(Selection(since=T0 + 10, until=T0 + 30)) == ["id-b/1", "id-a/2"]
    assert await keys(Selection(prefix="a/", count=2)) == ["id-a/1", "id-a/2"]
    (one,) = await choose(store, KEPT, Selection(prefix="b/"))
    assert (await keys(Selection(ids=(one.entry.id,)))) == ["id-b/1"]
    shown = describe(one)
    assert shown["eventId"] == "id-b/1" and shown["event"] == event("b/1")


async def test_a_redrive_moves_each_into_its_objects_shard_and_leaves_a_tally(
    tmp_path: Path,
) -> None:
    store = await kept_store(tmp_path, ["a/1", "b/1", "a/2"])
    chosen = await choose(store, KEPT, Selection(prefix="a/"))
    moved = await redrive(store, kept=KEPT, into=QUEUE, shards=3, letters=chosen, rate=None)
    assert moved == 2
    for key in ("a/1", "a/2"):
        shard = event_shard(event(key), 3)
        found = [e for e in await store.list(QUEUE, shard) if e.event_id == f"id-{key}"]
        assert [json.loads(e.body) for e in found] == [event(key)], "moved once, unchanged"
    left = await choose(store, KEPT, Selection())
    assert [c.letter.event_id for c in left] == ["id-b/1"]
    assert tallies(await store.list(KEPT, TALLY_SHARD)) == {"redriven": 2}
    assert await purge(store, kept=KEPT, letters=left) == 1
    assert await choose(store, KEPT, Selection()) == []
    assert tallies(await store.list(KEPT, TALLY_SHARD)) == {"redriven": 2, "purged": 1}


async def test_a_redrive_into_a_full_queue_stops_and_says_how_far_it_came(
    tmp_path: Path,
) -> None:
    store = await kept_store(tmp_path, ["a/1", "a/2", "a/3"])
    await store.create(QUEUE, 3, QueueLimits(max_entries=1))
    chosen = await choose(store, KEPT, Selection())
    with pytest.raises(Stopped) as stopped:
        await redrive(store, kept=KEPT, into=QUEUE, shards=3, letters=chosen, rate=1000)
    assert stopped.value.moved == 1
    assert len(await choose(store, KEPT, Selection())) == 2, "the rest stay dead letters"


def test_the_status_counts_dead_letters_and_dates_a_discard() -> None:
    report = Report(
        replica="r",
        updated=T0,
        interval=30,
        partitions=1,
        owned=[0],
        topics={
            "shop/orders": TopicHealth(
                backlog=Backlog(events=0, bytes=0, at=T0, dead_letters=7),
                dead_letters_discarded=T0 - 60,
            )
        },
    )
    status = delivery_status(merge("shop", "orders", 1, [report], T0))
    assert status["deadLetters"] == 7
    assert status["deadLettersDiscardedTime"] == "2027-01-15T07:59:00Z"


async def test_a_drop_kept_twice_is_listed_once_and_moved_with_its_copy(tmp_path: Path) -> None:
    """A replica killed between keeping a drop and removing it from the Topic's queue keeps
    it again at the next round: one dead letter to the user, both entries gone with it."""
    store = await kept_store(tmp_path, ["a/1", "a/1", "b/1"])
    chosen = await choose(store, KEPT, Selection())
    assert [(c.letter.event_id, len(c.copies)) for c in chosen] == [("id-a/1", 1), ("id-b/1", 0)]
    await redrive(store, kept=KEPT, into=QUEUE, shards=3, letters=chosen[:1], rate=None)
    shard = event_shard(event("a/1"), 3)
    assert [e.event_id for e in await store.list(QUEUE, shard)] == ["id-a/1"]
    assert [c.letter.event_id for c in await choose(store, KEPT, Selection())] == ["id-b/1"]
