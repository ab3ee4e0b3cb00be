"""Forwarding: a request for a shard another replica owns goes to that owner, and is
handled where it arrived whenever the owner does not answer 200 in time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bucketnotify.delivery.ingest.handler import Ingest
from bucketnotify.delivery.model.event import event_id
from bucketnotify.delivery.model.queue import QueueLimits, QueueName
from bucketnotify.delivery.peers.forwarding import FORWARDED_HEADER, Forwarder, forward_expired
from bucketnotify.delivery.service import build_app
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.topics.ingest_tokens import IngestTopic
from bucketnotify.metrics import DeliveryMetrics
from devstack.programs import free_port
from tests.records import event

QUEUE = QueueName("team-a", "orders")
TOKEN = "t0ken-0123456789"
URL = f"/v1/topics/team-a/orders/{TOKEN}"


@dataclass
class Replica:
    client: TestClient[Any, Any]
    store: LocalDirStore
    metrics: DeliveryMetrics
    told: list[list[int]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.client.host}:{self.client.port}"

    async def queued(self) -> set[str]:
        return {e.event_id for e in await self.store.list(QUEUE, 0)}

    def counted(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture()
async def replicas(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """``await replica(owner_at)``: an ingest on a store of its own (to tell whose commit is
    whose), forwarding to the address ``owner_at()`` gives."""
    clients: list[TestClient[Any, Any]] = []
    forwarders: list[Forwarder] = []

    async def make(
        owner_at: Callable[[], str | None] = lambda: None, timeout_s: float = 2.0
    ) -> Replica:
        store = LocalDirStore(tmp_path / f"r{len(clients)}")
        await store.create(QUEUE, 1, QueueLimits(max_entries=2))
        metrics = DeliveryMetrics()
        forwarder = Forwarder(lambda queue, shard: owner_at(), metrics, timeout_s=timeout_s)
        told: list[list[int]] = []

        async def tell(queue: QueueName, shards: list[int]) -> None:
            told.append(shards)

        ingest = Ingest(
            store,
            {("team-a", "orders"): IngestTopic(QUEUE, TOKEN, 1)},
            metrics=metrics,
            forwarder=forwarder,
            tell_owners=tell,
        )
        client = TestClient(TestServer(build_app(ingest)))
        await client.start_server()
        clients.append(client)
        forwarders.append(forwarder)
        return Replica(client, store, metrics, told)

    yield make
    for forwarder in forwarders:
        await forwarder.aclose()
    for client in clients:
        await client.close()


async def test_a_request_for_another_owners_shard_is_committed_by_that_owner(
    replicas: Callable[..., Any],
) -> None:
    owner: Replica = await replicas()
    other: Replica = await replicas(lambda: owner.address)
    record = event("a")
    response = await other.client.post(URL, json={"Records": [record]})
    assert response.status == 200
    assert await response.json() == {"committed": 1}
    assert await owner.queued() == {event_id(record)}
    assert await other.queued() == set()
    assert other.told == [], "nothing committed here, nobody to tell"
    assert other.counted("bucketnotify_ingest_forwarded_total", outcome="ok") == 1
    # Counted once, where the gateway's request arrived.
    assert other.counted("bucketnotify_ingest_requests_total", code="200") == 1
    assert owner.counted("bucketnotify_ingest_requests_total", code="200") == 0


async def test_an_owner_that_cannot_be_reached_leaves_the_request_to_its_receiver(
    replicas: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    gone = f"127.0.0.1:{free_port()}"
    other: Replica = await replicas(lambda: gone)
    first, second = event("a"), event("b")
    with caplog.at_level(logging.WARNING):
        assert (await other.client.post(URL, json={"Records": [first]})).status == 200
        assert (await other.client.post(URL, json={"Records": [second]})).status == 200
    assert await other.queued() == {event_id(first), event_id(second)}
    assert other.told == [[0], [0]], "the owner is told of each commit before the answer"
    # The second request was not sent to the owner that had just failed.
    assert other.counted("bucketnotify_ingest_forwarded_total", outcome="failed") == 1
    assert "forwarded to the replica at" in caplog.text
    assert TOKEN not in caplog.text


async def test_an_owner_that_refuses_leaves_the_request_to_its_receiver(
    replicas: Callable[..., Any],
) -> None:
    owner: Replica = await replicas()
    other: Replica = await replicas(lambda: owner.address)
    # The owner's queue holds two at most: the third request is refused there (503).
    for key in ("a", "b"):
        assert (await owner.client.post(URL, json={"Records": [event(key)]})).status == 200
    record = event("c")
    assert (await other.client.post(URL, json={"Records": [record]})).status == 200
    assert await other.queued() == {event_id(record)}
    assert other.counted("bucketnotify_ingest_forwarded_total", outcome="refused") == 1


async def test_an_owner_that_answers_too_late_is_not_waited_for(
    replicas: Callable[..., Any],
) -> None:
    """A frozen owner: the receiver commits the event itself after its timeout."""
    stalled = web.Application()
    reached, thawed, answered = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def frozen_owner(request: web.Request) -> web.Response:
        reached.set()
        # It answers only once the test lets it (or after a while, so that a receiver that
        # does wait for it fails the test instead of hanging it).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(thawed.wait(), 60)
        answered.set()
        return web.Response()

    stalled.router.add_post("/{tail:.*}", frozen_owner)
    async with TestClient(TestServer(stalled)) as frozen:
        other: Replica = await replicas(lambda: f"{frozen.host}:{frozen.port}", timeout_s=0.3)
        record = event("a")
        answer = await other.client.post(URL, json={"Records": [record]})
        # The order, not a duration: the request reached the owner, and the gateway had its
        # 200 while the owner still held it unanswered.
        assert reached.is_set(), "the request was not forwarded"
        assert not answered.is_set(), "the receiver waited for the frozen owner's answer"
        assert answer.status == 200
        thawed.set()
    assert await other.queued() == {event_id(record)}
    assert other.counted("bucketnotify_ingest_forwarded_total", outcome="failed") == 1


async def test_a_forwarded_request_is_handled_where_it_arrives_not_sent_on(
    replicas: Callable[..., Any],
) -> None:
    """Two replicas that each think the other owns the shard (their Lease views differ for a
    moment) do not pass a request back and forth."""
    addresses: dict[str, str] = {}
    first: Replica = await replicas(lambda: addresses["second"])
    second: Replica = await replicas(lambda: addresses["first"])
    addresses.update(first=first.address, second=second.address)
    record = event("a")
    assert (await first.client.post(URL, json={"Records": [record]})).status == 200
    assert await second.queued() == {event_id(record)}
    assert await first.queued() == set()


async def test_a_forwarded_request_its_sender_gave_up_on_is_refused_unread(
    replicas: Callable[..., Any],
) -> None:
    """An owner paused past the sender's timeout finds the request in its socket when it
    resumes: the sender has committed the events by then, so it does nothing."""
    owner: Replica = await replicas()
    sent_at = time.time() - 10
    response = await owner.client.post(
        URL, json={"Records": [event("a")]}, headers={FORWARDED_HEADER: f"{sent_at:.3f} 5"}
    )
    assert response.status == 504
    assert await owner.queued() == set()


def test_a_forward_header_that_is_not_ours_counts_as_expired() -> None:
    assert forward_expired("yesterday")
    assert forward_expired("")
    assert not forward_expired(f"{time.time():.3f} 5")
    assert forward_expired("100.0 5", now=106.0)
