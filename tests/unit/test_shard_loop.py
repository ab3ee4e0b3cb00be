"""A shard's loop between rounds: what it reads from the store while it has nothing to do."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import kopf
import pytest

from bucketnotify.delivery.endpoints.errors import RejectedError
from bucketnotify.delivery.endpoints.testing import MockEndpoint
from bucketnotify.delivery.model.event import event_id
from bucketnotify.delivery.model.push import Delivery
from bucketnotify.delivery.model.queue import Entry, QueueLimits, QueueName
from bucketnotify.delivery.model.timings import ServiceTimings
from bucketnotify.delivery.peers.ownership import LeaseSettings, Ownership
from bucketnotify.delivery.rounds.delivered import DELIVERED_SAVE_S
from bucketnotify.delivery.rounds.shard_loops import HANDOVER_POLL_ROUNDS
from bucketnotify.delivery.service import DeliveryService
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.kube.apiserver import ApiClient
from bucketnotify.settings import DeliveryServiceSettings
from tests.delivery import OwnsEverything, one_shard_runtime
from tests.kubeapi import UNREACHABLE
from tests.records import event


async def until(done: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not await done():
        assert time.monotonic() < deadline, f"timed out after {within_s} s waiting for {what}"
        await asyncio.sleep(0.05)


class CountingStore(LocalDirStore):
    lists = 0

    async def list(self, queue: QueueName, shard: int, max_entries: int = 1024) -> list[Entry]:
        self.lists += 1
        return await super().list(queue, shard, max_entries)


class Wakeable(OwnsEverything):
    address = "127.0.0.1:1"
    """Others could wake it: it does not poll."""

    settings = LeaseSettings(namespace="default", renew_interval_s=0.0)
    """Its peers learn at once that it holds a shard: no hand-over window to poll through."""


class JustTook(Wakeable):
    settings = LeaseSettings(namespace="default", renew_interval_s=2.0)
    """Its peers learn that it holds a shard up to two seconds later: a hand-over window of
    a few seconds, which a busy machine does not use up before the test's first commit."""


async def test_a_shard_that_delivered_all_it_listed_waits_to_be_woken(tmp_path: Path) -> None:
    """One round delivers what was committed; then the shard reads the store again only
    when woken (it listed once more, 0.2 s later, before), and the identities it delivered
    are in the store within the periodic save's interval although no round followed."""
    store = CountingStore(tmp_path)
    api = ApiClient(kopf.ConnectionInfo(server=UNREACHABLE))
    service = DeliveryService(
        api=api, store=store, ownership=cast(Ownership, Wakeable()), namespaces=[]
    )
    queue = QueueName("ns", "t")
    await store.create(queue, 1, QueueLimits())
    endpoint = MockEndpoint()
    runtime = one_shard_runtime(queue, endpoint)
    service.topics[("ns", "t")] = runtime

    async def commit(*keys: str) -> list[str]:
        records = [event(k) for k in keys]
        reservation = await store.reserve(queue, 0, len(records), 10_000, 0)
        await store.commit(reservation, [(event_id(r), json.dumps(r).encode()) for r in records], 0)
        return [event_id(r) for r in records]

    def delivered(count: int) -> Callable[[], Awaitable[bool]]:
        async def done() -> bool:
            return len(endpoint.delivered) == count

        return done

    first = await commit("a", "b", "c")
    loop = asyncio.create_task(service.loops._shard_loop(("ns", "t"), 0))
    try:
        await until(delivered(3), 5, "a, b and c delivered")
        await asyncio.sleep(5 * service.timings.round_interval_s)
        assert store.lists == 1

        async def saved() -> bool:
            return set(first) <= set(await store.load_delivered(queue, 0))

        # Saved by the idle shard's timer (no round follows that could save them): a wait
        # far longer than the interval still tells it from never.
        await until(saved, 10 * DELIVERED_SAVE_S, "the delivered identities saved")
        assert store.lists == 1

        await commit("d")
        service.loops.wake_local(queue, 0)
        await until(delivered(4), 5, "d delivered")
        await asyncio.sleep(5 * service.timings.round_interval_s)
        assert store.lists == 2
    finally:
        service.loops.stopping = True
        service.loops.wake_local(queue, 0)
        await asyncio.wait_for(loop, 10)
        await api.close()


async def test_a_shard_just_taken_polls_until_its_peers_know_who_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For two renew intervals after the partition was taken, what another replica commits
    without waking it (its wake-up went to the previous holder) is found by polling; after
    that the shard waits to be woken again."""
    store = CountingStore(tmp_path)
    api = ApiClient(kopf.ConnectionInfo(server=UNREACHABLE))
    ownership = JustTook()
    service = DeliveryService(
        api=api, store=store, ownership=cast(Ownership, ownership), namespaces=[]
    )
    queue = QueueName("ns", "t")
    await store.create(queue, 1, QueueLimits())
    # What happened in order: the deliveries, and each time the loop stopped polling to wait
    # to be woken. Their order is what is judged, not how long any of it took.
    happened: list[str] = []
    went_idle: list[float] = []

    def push(delivery: Delivery) -> None:
        happened.append(f"delivered {delivery.record['s3']['object']['key']}")

    endpoint = MockEndpoint(push)
    service.topics[("ns", "t")] = one_shard_runtime(queue, endpoint)
    window_ends = ownership.taken_at(queue, 0) + (
        HANDOVER_POLL_ROUNDS * ownership.settings.renew_interval_s
    )
    idle = service.loops._delivered.idle

    async def idling(*args: Any) -> None:
        happened.append("idle")
        went_idle.append(time.monotonic())
        await idle(*args)

    monkeypatch.setattr(service.loops._delivered, "idle", idling)

    async def commit(key: str) -> None:
        record = event(key)
        reservation = await store.reserve(queue, 0, 1, 10_000, 0)
        await store.commit(reservation, [(event_id(record), json.dumps(record).encode())], 0)

    def delivered(count: int) -> Callable[[], Awaitable[bool]]:
        async def done() -> bool:
            return len(endpoint.delivered) == count

        return done

    async def listed() -> bool:
        return store.lists >= 1

    async def idled() -> bool:
        return bool(went_idle)

    loop = asyncio.create_task(service.loops._shard_loop(("ns", "t"), 0))
    try:
        await until(listed, 30, "the first round")
        await commit("a")  # no wake-up reaches this replica
        await until(delivered(1), 30, "a found by polling")
        await until(idled, 30, "the shard waiting to be woken")
        assert happened == ["delivered a", "idle"], "stopped polling before a was found"
        assert went_idle[0] >= window_ends, "stopped polling within the hand-over window"
        lists = store.lists
        await commit("b")
        # Longer than the polls' interval: a poll would have found b.
        await asyncio.sleep(2 * service.timings.idle_max_s)
        assert len(endpoint.delivered) == 1, "polled after the hand-over window"
        assert store.lists == lists

        service.loops.wake_local(queue, 0)
        await until(delivered(2), 30, "b delivered once woken")
        assert happened[:3] == ["delivered a", "idle", "delivered b"]
    finally:
        service.loops.stopping = True
        service.loops.wake_local(queue, 0)
        await asyncio.wait_for(loop, 10)
        await api.close()


class TimedStore(LocalDirStore):
    """Notes when each listing happened and how many entries it returned."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listings: list[tuple[float, int]] = []

    async def list(self, queue: QueueName, shard: int, max_entries: int = 1024) -> list[Entry]:
        found = await super().list(queue, shard, max_entries)
        self.listings.append((time.monotonic(), len(found)))
        return found


async def loop_of(
    tmp_path: Path, endpoint: MockEndpoint, keys: list[str], timings: ServiceTimings
) -> tuple[TimedStore, DeliveryService, asyncio.Task[None], ApiClient]:
    store = TimedStore(tmp_path)
    api = ApiClient(kopf.ConnectionInfo(server=UNREACHABLE))
    service = DeliveryService(
        api=api,
        store=store,
        ownership=cast(Ownership, Wakeable()),
        namespaces=[],
        timings=timings,
    )
    queue = QueueName("ns", "t")
    await store.create(queue, 1, QueueLimits())
    records = [event(k) for k in keys]
    reservation = await store.reserve(queue, 0, len(records), 10_000_000, 0)
    await store.commit(reservation, [(event_id(r), json.dumps(r).encode()) for r in records], 0)
    service.topics[("ns", "t")] = one_shard_runtime(queue, endpoint)
    return store, service, asyncio.create_task(service.loops._shard_loop(("ns", "t"), 0)), api


async def stop(service: DeliveryService, loop: asyncio.Task[None], api: ApiClient) -> None:
    service.loops.stopping = True
    service.loops.wake_local(QueueName("ns", "t"), 0)
    await asyncio.wait_for(loop, 10)
    await api.close()


async def test_a_round_lists_up_to_1024_entries_and_a_full_one_is_followed_at_once(
    tmp_path: Path,
) -> None:
    """A backlog of 1,500 is listed 1,024 then 476, the second listing without the poll
    interval between (the interval is made long here, so waiting for it would show)."""
    endpoint = MockEndpoint()
    keys = [f"k{i:04}" for i in range(1500)]
    store, service, loop, api = await loop_of(
        tmp_path, endpoint, keys, ServiceTimings(round_interval_s=30, idle_max_s=30)
    )
    try:

        async def all_delivered() -> bool:
            return len(endpoint.delivered) == 1500

        await until(all_delivered, 20, "the backlog delivered, well before a 30 s poll")
        assert [n for _, n in store.listings[:2]] == [1024, 476]
        assert len(store.listings) == 2, "the short listing settled the shard: no poll"
    finally:
        await stop(service, loop, api)


async def test_failing_rounds_back_off_from_the_round_interval_to_idle_poll_max(
    tmp_path: Path,
) -> None:
    """While every push fails the shard is polled again after twice the round interval, then
    twice that, up to ``IDLE_POLL_MAX_SECONDS`` and no further: eight listings come within
    seconds (doubling without the cap would space the eighth 25 s from the first), none
    sooner than the back-off allows."""
    assert DeliveryServiceSettings().idle_poll_max_seconds == ServiceTimings().idle_max_s == 1.0
    assert ServiceTimings().round_interval_s == 0.2
    timings = ServiceTimings(round_interval_s=0.1, idle_max_s=0.5)
    store, service, loop, api = await loop_of(
        tmp_path, MockEndpoint.failing(RejectedError("answered 503")), ["a"], timings
    )
    try:

        async def eight() -> bool:
            return len(store.listings) >= 8

        await until(eight, 20, "eight listings of the failing shard")
        times = [t for t, _ in store.listings[:8]]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # Lower bounds only (a busy machine makes gaps longer, never shorter): 0.2, 0.4, then
        # the cap; the cap itself is what let eight listings come in time.
        assert gaps[0] >= 0.2 - 0.02 and gaps[1] >= 0.4 - 0.02
        assert all(g >= 0.5 - 0.02 for g in gaps[2:]), gaps
    finally:
        await stop(service, loop, api)
