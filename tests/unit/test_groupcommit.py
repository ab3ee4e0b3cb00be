"""Group commit: concurrent requests share writes, and each keeps its own guarantees."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bucketnotify.delivery.ingest.groupcommit import MAX_WRITES, Events, GroupCommit
from bucketnotify.delivery.ingest.handler import Ingest
from bucketnotify.delivery.model.event import event_id
from bucketnotify.delivery.model.queue import Entry, QueueFull, QueueLimits, QueueName, Reservation
from bucketnotify.delivery.service import build_app
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.topics.ingest_tokens import IngestTopic
from tests.records import event

QUEUE = QueueName("team-a", "orders")
TOKEN = "t0ken-0123456789"
URL = f"/v1/topics/{QUEUE.namespace}/{QUEUE.topic}/{TOKEN}"


def ev(name: str) -> tuple[str, bytes]:
    return (name, name.encode())


class Writes:
    """The write a GroupCommit drives, recording each call; the first one waits for
    ``release`` so that requests pile up behind it."""

    def __init__(self, room: int = 1000) -> None:
        self.calls: list[Events] = []
        self.release = asyncio.Event()
        self.room = room
        self.fail_next: Exception | None = None

    async def __call__(self, queue: QueueName, events: Events) -> float:
        self.calls.append(events)
        number = len(self.calls)
        if number == 1:
            await self.release.wait()
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        if sum(len(e) for e in events.values()) > self.room:
            raise QueueFull("no room")
        return float(number)  # stands for the ingest time: which write it was


async def test_requests_waiting_for_a_write_go_together_in_request_order() -> None:
    writes = Writes()
    groups = GroupCommit(writes, max_writes=1)
    first = asyncio.create_task(groups.commit(QUEUE, {0: [ev("a1")]}))
    await asyncio.sleep(0.01)  # the first write is under way
    later = [
        asyncio.create_task(groups.commit(QUEUE, {0: [ev("b1"), ev("b2")], 1: [ev("b3")]})),
        asyncio.create_task(groups.commit(QUEUE, {1: [ev("c1")]})),
        asyncio.create_task(groups.commit(QUEUE, {0: [ev("d1")]})),
    ]
    await asyncio.sleep(0.05)
    assert not any(t.done() for t in [first, *later])  # nobody answered before its write
    writes.release.set()
    assert await first == 1.0
    assert await asyncio.gather(*later) == [2.0, 2.0, 2.0]
    assert writes.calls[1] == {0: [ev("b1"), ev("b2"), ev("d1")], 1: [ev("b3"), ev("c1")]}


async def test_requests_do_not_wait_while_fewer_writes_than_the_bound_are_under_way() -> None:
    writes = Writes()
    groups = GroupCommit(writes, max_writes=2)
    first = asyncio.create_task(groups.commit(QUEUE, {0: [ev("a")]}))
    await asyncio.sleep(0.01)  # the first write is under way
    second = await groups.commit(QUEUE, {0: [ev("b")]})  # while the first is stuck
    assert second == 2.0
    third = asyncio.create_task(groups.commit(QUEUE, {0: [ev("c")]}))
    await asyncio.sleep(0.05)
    assert not first.done()
    assert third.done()
    writes.release.set()
    assert await first == 1.0


async def test_a_group_that_does_not_fit_is_tried_request_by_request() -> None:
    """One large request must not make the smaller ones that fit fail with it."""
    writes = Writes(room=2)
    groups = GroupCommit(writes, max_writes=1)
    first = asyncio.create_task(groups.commit(QUEUE, {0: [ev("a")]}))
    await asyncio.sleep(0.01)  # the first write is under way
    big = asyncio.create_task(groups.commit(QUEUE, {0: [ev("x1"), ev("x2"), ev("x3")]}))
    small = asyncio.create_task(groups.commit(QUEUE, {1: [ev("s1"), ev("s2")]}))
    writes.release.set()
    await first
    with pytest.raises(QueueFull):
        await big
    assert await small == 4.0
    assert len(writes.calls) == 4  # the first, the group, then each alone


async def test_a_failed_write_fails_every_request_in_it_and_the_next_group_goes_on() -> None:
    writes = Writes()
    groups = GroupCommit(writes, max_writes=1)
    first = asyncio.create_task(groups.commit(QUEUE, {0: [ev("a")]}))
    await asyncio.sleep(0.01)  # the first write is under way
    group = [asyncio.create_task(groups.commit(QUEUE, {0: [ev(f"g{n}")]})) for n in range(3)]
    writes.fail_next = OSError("disk gone")
    writes.release.set()
    with pytest.raises(OSError):
        await first
    assert await asyncio.gather(*group) == [2.0] * 3
    assert await groups.commit(QUEUE, {0: [ev("later")]}) == 3.0
    await groups.aclose()


async def test_a_group_stops_at_its_bounds() -> None:
    writes = Writes()
    groups = GroupCommit(writes, max_writes=1, max_events=3)
    first = asyncio.create_task(groups.commit(QUEUE, {0: [ev("a")]}))
    await asyncio.sleep(0.01)  # the first write is under way
    rest = [asyncio.create_task(groups.commit(QUEUE, {0: [ev(f"r{n}")] * 2})) for n in range(3)]
    writes.release.set()
    await first
    await asyncio.gather(*rest)
    assert [sum(len(e) for e in c.values()) for c in writes.calls] == [1, 2, 2, 2]


class HeldStore(LocalDirStore):
    """A directory store whose writes wait until ``arrived`` is set, recording the events of
    each commit: the ingest requests pile up behind the first writes, as under load."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.arrived = asyncio.Event()
        self.commits: list[int] = []

    async def reserve(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation:
        await self.arrived.wait()
        return await super().reserve(queue, shard, entries, size, now)

    async def commit(
        self, reservation: Reservation, events: Sequence[tuple[str, bytes]], now: float
    ) -> list[Entry]:
        self.commits.append(len(events))
        return await super().commit(reservation, events, now)


class CountingIngest(Ingest):
    def __init__(self, store: HeldStore, topics: dict[tuple[str, str], IngestTopic]) -> None:
        super().__init__(store, topics)
        self.requests = 0
        self._all_in = store.arrived

    async def commit(self, queue: QueueName, by_shard: dict[int, list[tuple[str, bytes]]]) -> float:
        self.requests += 1
        if self.requests == REQUESTS:
            self._all_in.set()
        return await super().commit(queue, by_shard)


REQUESTS = 40


async def test_concurrent_ingest_requests_share_batch_files(tmp_path: Path) -> None:
    """The point of it all: fewer batch files (fsyncs) than requests, every event once.

    All 40 requests arrive while the first writes are held: at most MAX_WRITES writes start
    with what had arrived, and everything else goes together in the next one."""
    store = HeldStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    ingest = CountingIngest(store, {("team-a", "orders"): IngestTopic(QUEUE, TOKEN, 1)})
    client: TestClient[Any, Any]
    async with TestClient(TestServer(build_app(ingest))) as client:
        responses = await asyncio.gather(
            *(client.post(URL, json={"Records": [event(f"key{i}")]}) for i in range(REQUESTS))
        )
    assert [r.status for r in responses] == [200] * REQUESTS
    listed = await store.list(QUEUE, 0)
    assert sorted(e.event_id for e in listed) == sorted(
        event_id(event(f"key{i}")) for i in range(REQUESTS)
    )
    assert sum(store.commits) == REQUESTS
    assert len(store.commits) <= MAX_WRITES + 1, store.commits
    files = os.listdir(tmp_path / QUEUE.namespace / QUEUE.topic / "shard-0")
    assert len(files) == len(store.commits)
