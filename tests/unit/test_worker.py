"""One processing round of a shard: order per object, retries, expiry, duplicates, fencing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bucketnotify.delivery.endpoints.errors import RejectedError, UndeliverableError
from bucketnotify.delivery.endpoints.testing import MockEndpoint
from bucketnotify.delivery.model.delivered_ids import DeliveredCache
from bucketnotify.delivery.model.outcomes import DeliveryPolicy, EventOutcome
from bucketnotify.delivery.model.push import Delivery
from bucketnotify.delivery.model.queue import Entry, QueueLimits, QueueName
from bucketnotify.delivery.rounds.worker import (
    PROGRESS_S,
    DeadLetterSink,
    RoundCutShort,
    process_shard,
)
from bucketnotify.delivery.stores.localdir import LocalDirStore
from tests.records import event

QUEUE = QueueName("ns", "topic")
T0 = 1_000_000.0
DEFAULT_POLICY = DeliveryPolicy()


@pytest.fixture()
async def store(tmp_path: Path) -> LocalDirStore:
    s = LocalDirStore(tmp_path)
    await s.create(QUEUE, 1, QueueLimits())
    return s


async def enqueue(store: LocalDirStore, events: list[tuple[str, dict[str, Any]]]) -> None:
    bodies = [(eid, json.dumps(r).encode()) for eid, r in events]
    reservation = await store.reserve(QUEUE, 0, len(events), sum(len(b) for _, b in bodies), T0)
    await store.commit(reservation, bodies, T0)


async def round_(
    store: LocalDirStore,
    endpoint: MockEndpoint,
    now: float,
    policy: DeliveryPolicy = DEFAULT_POLICY,
    owned: bool = True,
    cache: DeliveredCache | None = None,
    dead_letter: DeadLetterSink | None = None,
) -> Any:
    return await process_shard(
        dead_letter=dead_letter,
        store=store,
        queue=QUEUE,
        shard=0,
        endpoint=endpoint,
        policy=policy,
        delivered=cache or DeliveredCache(),
        still_owned=lambda: owned,
        now=now,
    )


def numbers(deliveries: list[Delivery]) -> list[int]:
    return [d.record["n"] for d in deliveries]


async def test_everything_delivered_is_removed_and_order_per_object_holds(
    store: LocalDirStore,
) -> None:
    await enqueue(store, [(f"e{i}", event("k1" if i % 2 else "k2", n=i)) for i in range(6)])
    endpoint = MockEndpoint()
    result = await round_(store, endpoint, T0)
    assert result.delivered == 6
    assert await store.list(QUEUE, 0) == []
    k1 = [d.record["n"] for d in endpoint.delivered if d.record["s3"]["object"]["key"] == "k1"]
    assert k1 == [1, 3, 5]
    # Each wave carries at most one event per object.
    for batch in endpoint.batches:
        keys = [d.record["s3"]["object"]["key"] for d in batch]
        assert len(keys) == len(set(keys))


async def test_a_failed_event_holds_back_later_events_of_its_object_only(
    store: LocalDirStore,
) -> None:
    await enqueue(
        store, [("a1", event("a", n=1)), ("b1", event("b", n=1)), ("a2", event("a", n=2))]
    )

    def handler(delivery: Delivery) -> None:
        if delivery.record["s3"]["object"]["key"] == "a":
            raise RejectedError("503 from endpoint")

    policy = DeliveryPolicy(retry_sleep_s=30)
    result = await round_(store, MockEndpoint(handler), T0, policy)
    assert (result.delivered, result.failed) == (1, 1)
    left = await store.list(QUEUE, 0)
    assert [e.event_id for e in left] == ["a1", "a2"]
    assert left[0].attempts == 1 and left[0].not_before == T0 + 30

    ok = MockEndpoint()
    early = await round_(store, ok, T0 + 10, policy)
    assert early.delivered == 0, "retried before retrySleepDuration"
    await round_(store, ok, T0 + 31, policy)
    assert numbers(ok.delivered) == [1, 2]
    assert await store.list(QUEUE, 0) == []


async def test_max_retries_allows_one_plus_max_retries_attempts(store: LocalDirStore) -> None:
    await enqueue(store, [("x", event("x", n=1))])
    endpoint = MockEndpoint.failing(RejectedError("down"))
    policy = DeliveryPolicy(max_retries=2)
    for i in range(3):
        result = await round_(store, endpoint, T0 + i, policy)
        assert result.failed == 1
    result = await round_(store, endpoint, T0 + 3, policy)
    assert result.expired == 1
    assert len(endpoint.batches) == 3
    assert await store.list(QUEUE, 0) == []


async def test_time_to_live_expires_and_zero_means_forever(store: LocalDirStore) -> None:
    await enqueue(store, [("x", event("x", n=1))])
    down = MockEndpoint.failing(RejectedError("down"))
    assert (await round_(store, down, T0 + 10**6, DeliveryPolicy())).failed == 1
    result = await round_(store, down, T0 + 61, DeliveryPolicy(time_to_live_s=60))
    assert result.expired == 1 and await store.list(QUEUE, 0) == []


async def test_undeliverable_is_dropped_not_retried(store: LocalDirStore) -> None:
    await enqueue(store, [("x", event("x", n=1)), ("y", event("x", n=2))])

    def handler(delivery: Delivery) -> None:
        if delivery.record["n"] == 1:
            raise UndeliverableError("message too large")

    endpoint = MockEndpoint(handler)
    result = await round_(store, endpoint, T0)
    assert result.expired == 1
    await round_(store, endpoint, T0 + 1)
    assert numbers(endpoint.delivered) == [2]


async def test_duplicates_from_the_gateway_are_delivered_once(store: LocalDirStore) -> None:
    cache = DeliveredCache()
    await enqueue(store, [("same", event("k", n=1)), ("same", event("k", n=1))])
    endpoint = MockEndpoint()
    result = await round_(store, endpoint, T0, cache=cache)
    await enqueue(store, [("same", event("k", n=1))])
    again = await round_(store, endpoint, T0 + 1, cache=cache)
    assert len(endpoint.delivered) == 1
    assert result.duplicates + again.duplicates == 2
    assert await store.list(QUEUE, 0) == []


async def test_a_fenced_replica_removes_nothing(store: LocalDirStore) -> None:
    await enqueue(store, [("x", event("x", n=1))])
    result = await round_(store, MockEndpoint(), T0, owned=False)
    assert result.fenced
    assert [e.event_id for e in await store.list(QUEUE, 0)] == ["x"]


async def test_dropped_events_go_to_the_dead_letter_sink_before_removal(
    store: LocalDirStore,
) -> None:
    await enqueue(store, [("x", event("x", n=1)), ("y", event("y", n=2))])

    def handler(delivery: Delivery) -> None:
        if delivery.record["n"] == 1:
            raise UndeliverableError("message too large")

    taken: list[Entry] = []

    async def sink(drops: Sequence[EventOutcome]) -> set[str]:
        taken.extend(d.entry for d in drops)
        return set()

    result = await round_(store, MockEndpoint(handler), T0, dead_letter=sink)
    assert (result.delivered, result.expired, result.dead_lettered) == (1, 0, 1)
    assert [(e.event_id, json.loads(e.body)["n"]) for e in taken] == [("x", 1)]
    assert await store.list(QUEUE, 0) == []


async def test_a_failing_dead_letter_sink_keeps_the_events(store: LocalDirStore) -> None:
    await enqueue(store, [("x", event("x", n=1))])

    async def refuse(drops: Sequence[EventOutcome]) -> set[str]:
        raise LookupError("no such topic")

    policy = DeliveryPolicy(time_to_live_s=60)
    down = MockEndpoint.failing(RejectedError("down"))
    result = await round_(store, down, T0 + 61, policy, dead_letter=refuse)
    assert (result.expired, result.dead_lettered) == (0, 0)
    assert "no such topic" in result.errors[-1]
    assert [e.event_id for e in await store.list(QUEUE, 0)] == ["x"], "kept, not lost"
    taken: list[Entry] = []

    async def sink(drops: Sequence[EventOutcome]) -> set[str]:
        taken.extend(d.entry for d in drops)
        return set()

    result = await round_(store, down, T0 + 62, policy, dead_letter=sink)
    assert result.dead_lettered == 1 and [e.event_id for e in taken] == ["x"]
    assert await store.list(QUEUE, 0) == []


def outcomes(result: Any) -> list[tuple[str, str, int, str | None]]:
    """(outcome, event id, attempts, error) of each EventOutcome, in order."""
    return [(o.outcome.value, o.entry.event_id, o.attempts, o.error) for o in result.outcomes]


async def test_each_push_and_each_drop_is_one_outcome_with_its_attempts(
    store: LocalDirStore,
) -> None:
    """Outcomes (the stuff of delivery records) count what the round's counters count:
    delivered and failed per push, attempts including that push; expired with no push."""
    await enqueue(store, [("ok", event("a", n=1)), ("bad", event("b", n=2))])

    def handler(delivery: Delivery) -> None:
        if delivery.record["n"] == 2:
            raise RejectedError("503 from endpoint")

    policy = DeliveryPolicy(max_retries=1)
    first = await round_(store, MockEndpoint(handler), T0, policy)
    assert outcomes(first) == [
        ("delivered", "ok", 1, None),
        ("failed", "bad", 1, "503 from endpoint"),
    ]
    second = await round_(store, MockEndpoint(handler), T0 + 1, policy)
    assert outcomes(second) == [("failed", "bad", 2, "503 from endpoint")]
    third = await round_(store, MockEndpoint(handler), T0 + 2, policy)
    assert outcomes(third) == [("expired", "bad", 2, "maxRetries 1 used up after 2 attempts")]
    assert (first.delivered, first.failed + second.failed, third.expired) == (1, 2, 1)
    delivered = first.outcomes[0]
    assert delivered.record == event("a", n=1) and delivered.entry.ingest_time == T0


async def test_time_to_live_names_its_reason(store: LocalDirStore) -> None:
    await enqueue(store, [("x", event("x", n=1))])
    result = await round_(store, MockEndpoint(), T0 + 61, DeliveryPolicy(time_to_live_s=60))
    assert outcomes(result) == [("expired", "x", 0, "timeToLive of 60 s passed")]


async def test_undeliverable_is_rejected_and_duplicates_are_outcomes(
    store: LocalDirStore,
) -> None:
    await enqueue(store, [("big", event("x", n=1)), ("d", event("y", n=2)), ("d", event("y", n=2))])

    def handler(delivery: Delivery) -> None:
        if delivery.record["n"] == 1:
            raise UndeliverableError("message too large")

    result = await round_(store, MockEndpoint(handler), T0)
    assert sorted(outcomes(result)) == [
        ("delivered", "d", 1, None),
        ("duplicate", "d", 0, None),
        ("rejected", "big", 1, "message too large"),
    ]
    assert (result.delivered, result.rejected, result.duplicates) == (1, 1, 1)


async def test_dead_lettered_outcomes_only_when_the_sink_took_them(
    store: LocalDirStore,
) -> None:
    await enqueue(store, [("x", event("x", n=1)), ("y", event("y", n=2))])

    def handler(delivery: Delivery) -> None:
        raise UndeliverableError("message too large")

    async def take(drops: Sequence[EventOutcome]) -> set[str]:
        return set()

    async def refuse(drops: Sequence[EventOutcome]) -> set[str]:
        raise LookupError("no such topic")

    refused = await round_(store, MockEndpoint(handler), T0, dead_letter=refuse)
    # The pushes were refused, the events stay: two failed attempts, as push_failed counts.
    assert sorted(outcomes(refused)) == [
        ("failed", "x", 1, "message too large"),
        ("failed", "y", 1, "message too large"),
    ]
    taken = await round_(store, MockEndpoint(handler), T0 + 1, dead_letter=take)
    assert sorted(outcomes(taken)) == [
        ("dead_lettered", "x", 1, "message too large"),
        ("dead_lettered", "y", 1, "message too large"),
    ]
    assert await store.list(QUEUE, 0) == []


async def test_a_drop_the_sink_had_no_room_for_is_lost_and_counted_so(
    store: LocalDirStore,
) -> None:
    """A dead-letter queue at its bounds: the drop happens (the entry leaves the queue) and
    counts as lost, not as dead-lettered."""
    await enqueue(store, [("x", event("x", n=1)), ("y", event("y", n=2))])

    def handler(delivery: Delivery) -> None:
        raise UndeliverableError("message too large")

    async def room_for_y(drops: Sequence[EventOutcome]) -> set[str]:
        return {d.entry.id for d in drops if d.entry.event_id == "x"}

    result = await round_(store, MockEndpoint(handler), T0, dead_letter=room_for_y)
    assert (result.expired, result.dead_lettered, result.rejected) == (1, 1, 2)
    assert sorted(outcomes(result)) == [
        ("dead_lettered", "y", 1, "message too large"),
        ("rejected", "x", 1, "message too large"),
    ]
    assert await store.list(QUEUE, 0) == []


async def test_a_failed_push_keeps_its_first_and_last_failure_in_the_entry(
    store: LocalDirStore,
) -> None:
    await enqueue(store, [("x", event("x", n=1))])
    down = MockEndpoint.failing(RejectedError("503 Service Unavailable"))
    await round_(store, down, T0)
    (first,) = await store.list(QUEUE, 0)
    assert first.attempts == 1 and first.last_error == "503 Service Unavailable"
    assert first.first_failure == first.last_failure > 0
    await round_(store, down, first.not_before + 1)
    (second,) = await store.list(QUEUE, 0)
    assert second.attempts == 2 and second.first_failure == first.first_failure
    assert second.last_failure >= first.last_failure


async def test_a_fenced_round_has_push_outcomes_but_no_drops(store: LocalDirStore) -> None:
    """Fenced: the pushes happened (and are counted), the removals did not."""
    await enqueue(store, [("a", event("a", n=1)), ("b", event("b", n=2)), ("c", event("c", n=3))])

    def handler(delivery: Delivery) -> None:
        if delivery.record["n"] == 2:
            raise UndeliverableError("message too large")
        if delivery.record["n"] == 3:
            raise RejectedError("503")

    result = await round_(store, MockEndpoint(handler), T0, owned=False)
    assert result.fenced
    assert sorted(outcomes(result)) == [
        ("delivered", "a", 1, None),
        ("failed", "b", 1, "message too large"),
        ("failed", "c", 1, "503"),
    ]


def test_the_delivered_cache_keeps_the_newest_and_gives_the_last_added_in_order() -> None:
    cache = DeliveredCache(size=5)
    for n in range(8):
        cache.add(f"ev-{n}")
    cache.add("ev-4")  # seen again: it becomes the newest
    assert "ev-2" not in cache and "ev-3" in cache
    assert cache.recent(3) == ["ev-6", "ev-7", "ev-4"]
    assert cache.recent(100) == ["ev-3", "ev-5", "ev-6", "ev-7", "ev-4"]
    assert cache.added == 9


async def test_a_long_round_removes_what_it_delivered_as_it_goes(store: LocalDirStore) -> None:
    """A round that lasts (a backlog, a slow or hanging endpoint) removes what the endpoint
    took every PROGRESS_S. Killed in the middle (here: cancelled), it leaves for the next
    owner only what was acknowledged in its last PROGRESS_S, not the whole round."""
    await enqueue(store, [(f"e{i}", event(f"k{i}", n=i)) for i in range(300)])
    taken = 0
    hang = asyncio.Event()  # never set: pushes after the 192nd never end

    async def then_hang(delivery: Delivery) -> None:
        nonlocal taken
        if taken >= 192:
            await hang.wait()
        taken += 1

    endpoint = MockEndpoint(then_hang)
    task = asyncio.create_task(round_(store, endpoint, T0))
    await asyncio.sleep(3 * PROGRESS_S)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    delivered = {d.id for d in endpoint.delivered}
    left = {e.id for e in await store.list(QUEUE, 0, 1000)}
    assert len(delivered) == 192
    assert not delivered & left, "acknowledged more than PROGRESS_S before the cut, yet queued"
    assert len(left) == 300 - 192


async def test_a_failed_removal_mid_round_is_retried_at_the_rounds_end(
    tmp_path: Path,
) -> None:
    class FlakyStore(LocalDirStore):
        failures = 1

        async def remove(self, queue: QueueName, shard: int, entry_ids: Sequence[str]) -> None:
            if self.failures:
                self.failures -= 1
                raise OSError("store away for a moment")
            await super().remove(queue, shard, entry_ids)

    store = FlakyStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    await enqueue(store, [(f"e{i}", event(f"k{i}", n=i)) for i in range(200)])

    async def slow(delivery: Delivery) -> None:
        await asyncio.sleep(0.2)

    result = await round_(store, MockEndpoint(slow), T0)
    assert result.delivered == 200
    assert store.failures == 0, "a removal was tried mid-round"
    assert await store.list(QUEUE, 0) == []


async def test_a_round_cut_short_still_says_what_it_left(tmp_path: Path) -> None:
    """What a round leaves (``left``, ``oldest_left``: the health report's figures) is known
    of a round whose removal failed too: everything it listed is still queued."""

    class AwayStore(LocalDirStore):
        async def remove(self, queue: QueueName, shard: int, entry_ids: Sequence[str]) -> None:
            raise OSError("store away")

    store = AwayStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    await enqueue(store, [(f"e{i}", event(f"k{i}", n=i)) for i in range(3)])
    with pytest.raises(RoundCutShort) as cut:
        await round_(store, MockEndpoint(), T0)
    assert cut.value.result.delivered == 3
    assert (cut.value.result.left, cut.value.result.oldest_left) == (3, T0)
