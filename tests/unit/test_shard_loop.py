"""A shard's loop between rounds: what it reads from the store while it has nothing to do."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import kopf

from bucketnotify.apiserver import ApiClient
from bucketnotify.delivery.endpoints.testing import MockEndpoint
from bucketnotify.delivery.ingest import event_id
from bucketnotify.delivery.ownership import Ownership
from bucketnotify.delivery.queue import Entry, QueueLimits, QueueName
from bucketnotify.delivery.service import DELIVERED_SAVE_S, DeliveryService
from bucketnotify.delivery.stores.localdir import LocalDirStore
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
    loop = asyncio.create_task(service._shard_loop(("ns", "t"), 0))
    try:
        await until(delivered(3), 5, "a, b and c delivered")
        await asyncio.sleep(5 * service.timings.round_interval_s)
        assert store.lists == 1

        async def saved() -> bool:
            return set(first) <= set(await store.load_delivered(queue, 0))

        await until(saved, DELIVERED_SAVE_S + 2, "the delivered identities saved")
        assert store.lists == 1

        await commit("d")
        service._wake_local(queue, 0)
        await until(delivered(4), 5, "d delivered")
        await asyncio.sleep(5 * service.timings.round_interval_s)
        assert store.lists == 2
    finally:
        service._stopping = True
        service._wake_local(queue, 0)
        await asyncio.wait_for(loop, 10)
        await api.close()
