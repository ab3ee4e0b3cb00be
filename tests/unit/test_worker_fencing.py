"""A round that loses its shard part-way (the replica was paused past its Lease) starts no
push beyond the window already under way, and removes nothing: the next owner has the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bucketnotify.delivery.endpoints.testing import MockEndpoint
from bucketnotify.delivery.model.delivered_ids import DeliveredCache
from bucketnotify.delivery.model.outcomes import DeliveryPolicy
from bucketnotify.delivery.model.push import Delivery
from bucketnotify.delivery.model.queue import QueueLimits, QueueName
from bucketnotify.delivery.rounds.worker import FENCE_WINDOW, process_shard
from bucketnotify.delivery.stores.localdir import LocalDirStore
from tests.records import event

QUEUE = QueueName("ns", "topic")
T0 = 1_000_000.0


@pytest.fixture()
async def store(tmp_path: Path) -> LocalDirStore:
    s = LocalDirStore(tmp_path)
    await s.create(QUEUE, 1, QueueLimits())
    return s


async def test_ownership_lost_during_the_first_window_stops_the_round_and_removes_nothing(
    store: LocalDirStore,
) -> None:
    events = 3 * FENCE_WINDOW + 5
    reservation = await store.reserve(QUEUE, 0, events, 10_000_000, T0)
    await store.commit(
        reservation,
        [(f"e{i}", json.dumps(event(f"k{i}")).encode()) for i in range(events)],
        T0,
    )
    owner = {"now": True}

    def acknowledge_then_lose(delivery: Delivery) -> None:
        # The first window is under way while the Lease goes to another replica.
        owner["now"] = False

    endpoint = MockEndpoint(acknowledge_then_lose)
    result = await process_shard(
        store=store,
        queue=QUEUE,
        shard=0,
        endpoint=endpoint,
        policy=DeliveryPolicy(),
        delivered=DeliveredCache(),
        still_owned=lambda: owner["now"],
        now=T0,
    )
    assert result.fenced
    assert len(endpoint.delivered) == FENCE_WINDOW, "the window under way, then stop"
    assert result.delivered == FENCE_WINDOW
    # Nothing removed: the next owner lists every entry (and sends the window again).
    assert len(await store.list(QUEUE, 0, 10 * events)) == events


async def test_a_round_that_keeps_its_shard_pushes_everything(store: LocalDirStore) -> None:
    events = 2 * FENCE_WINDOW + 1
    reservation = await store.reserve(QUEUE, 0, events, 10_000_000, T0)
    await store.commit(
        reservation,
        [(f"e{i}", json.dumps(event(f"k{i}")).encode()) for i in range(events)],
        T0,
    )
    endpoint = MockEndpoint()
    result = await process_shard(
        store=store,
        queue=QUEUE,
        shard=0,
        endpoint=endpoint,
        policy=DeliveryPolicy(),
        delivered=DeliveredCache(),
        still_owned=lambda: True,
        now=T0,
    )
    assert not result.fenced
    assert len(endpoint.delivered) == events
    assert await store.list(QUEUE, 0, 10 * events) == []
