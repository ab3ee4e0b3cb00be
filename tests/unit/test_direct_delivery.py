"""Direct delivery: an event for an empty shard is pushed before the ingest answers, and
queued only when that push fails, in its object's order."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import kopf
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bucketnotify.delivery.endpoints.errors import RejectedError, UndeliverableError
from bucketnotify.delivery.endpoints.testing import MockEndpoint
from bucketnotify.delivery.model.event import event_id
from bucketnotify.delivery.model.outcomes import DeliveryPolicy
from bucketnotify.delivery.model.push import Delivery
from bucketnotify.delivery.model.queue import Entry, QueueLimits, QueueName
from bucketnotify.delivery.peers.leases import LeaseSettings
from bucketnotify.delivery.peers.ownership import Ownership
from bucketnotify.delivery.recorded.delivery_records import Recorder, RecordWriter
from bucketnotify.delivery.recorded.record_targets import DirTarget
from bucketnotify.delivery.rounds.direct import ShardGate
from bucketnotify.delivery.service import DeliveryService
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.topics.ingest_tokens import IngestTopic
from bucketnotify.kube.apiserver import ApiClient
from tests.delivery import OwnsEverything, one_shard_runtime
from tests.kubeapi import UNREACHABLE
from tests.records import event

QUEUE = QueueName("ns", "t")
TOKEN = "t0ken-0123456789"
URL = f"/v1/topics/ns/t/{TOKEN}"


class CountingStore(LocalDirStore):
    commits = 0
    lists = 0

    async def commit(self, *args: Any, **kwargs: Any) -> list[Entry]:
        self.commits += 1
        return await super().commit(*args, **kwargs)

    async def list(self, *args: Any, **kwargs: Any) -> list[Entry]:
        self.lists += 1
        return await super().list(*args, **kwargs)


class Alone(OwnsEverything):
    address = "127.0.0.1:1"
    """Others could wake it: its empty shard waits to be woken instead of polling."""
    members = 1

    def all_hand_over(self) -> bool:
        return True


class AmongPeers(Alone):
    """One of two replicas that reach each other: the other hands it requests for its
    shards and tells it of its commits (``delivery.peers.forwarding``)."""

    members = 2
    settings = LeaseSettings(namespace="default", renew_interval_s=0.0)
    """Its peer learns at once that it holds a shard: no hand-over window."""


class JustTookAmongPeers(AmongPeers):
    settings = LeaseSettings(namespace="default", renew_interval_s=1.0)
    """Its peer learns that it holds a shard up to a second later."""


class PeerUnreachable(AmongPeers):
    """One of two replicas, the other advertising no address or not handing requests over
    (direct delivery off, or a release before forwarding)."""

    def all_hand_over(self) -> bool:
        return False


@dataclass
class Replica:
    service: DeliveryService
    store: CountingStore
    endpoint: MockEndpoint
    client: TestClient[Any, Any]

    async def post(self, *records: dict[str, Any]) -> int:
        response = await self.client.post(URL, json={"Records": list(records)})
        return response.status

    def keys_delivered(self) -> list[str]:
        return [d.record["s3"]["object"]["key"] for d in self.endpoint.delivered]

    def versions_delivered(self) -> list[tuple[str, str]]:
        return [(d.record["s3"]["object"]["key"], d.record["v"]) for d in self.endpoint.delivered]

    async def queued(self) -> int:
        return (await self.store.stats(QUEUE, 0)).entries


async def until(done: Callable[[], bool | Awaitable[bool]], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while True:
        result = done()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"timed out after {within_s} s waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.fixture()
async def start(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Replica]]]:
    """``await start(handler, ownership=Alone)``: one replica with direct delivery on, its
    shard's loop running."""
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def make(
        handler: Any = None,
        ownership: type[OwnsEverything] = Alone,
        policy: DeliveryPolicy | None = None,
        records: RecordWriter | None = None,
    ) -> Replica:
        store = CountingStore(tmp_path / f"q{len(cleanups)}")
        await store.create(QUEUE, 1, QueueLimits())
        api = ApiClient(kopf.ConnectionInfo(server=UNREACHABLE))
        service = DeliveryService(
            api=api,
            store=store,
            ownership=cast(Ownership, ownership()),
            namespaces=[],
            direct=True,
            recorder=Recorder(records, "replica-0") if records is not None else None,
        )
        endpoint = MockEndpoint(handler) if handler is not None else MockEndpoint()
        service.topics[("ns", "t")] = one_shard_runtime(QUEUE, endpoint, policy)
        service.ingest_topics[("ns", "t")] = IngestTopic(QUEUE, TOKEN, 1)
        service.loops._loops[(QUEUE, 0)] = loop = asyncio.create_task(
            service.loops._shard_loop(("ns", "t"), 0)
        )
        client = TestClient(TestServer(service.app()))
        await client.start_server()

        async def cleanup() -> None:
            await client.close()
            service.loops.stopping = True
            service.loops.wake_local(QUEUE, 0)
            await asyncio.wait_for(loop, 10)
            await api.close()

        cleanups.append(cleanup)
        return Replica(service, store, endpoint, client)

    yield make
    for cleanup in cleanups:
        await cleanup()


async def emptied(replica: Replica) -> None:
    """The shard's first round found it empty: direct pushes may go."""
    await until(lambda: replica.service.gate.is_empty((QUEUE, 0)), 5, "the first round")


async def test_an_event_for_an_empty_shard_is_delivered_before_the_answer_and_never_queued(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    replica = await start()
    await emptied(replica)
    for key in ("a", "b", "c"):
        assert await replica.post(event(key)) == 200
        assert replica.keys_delivered()[-1] == key  # before the answer, not after
    assert replica.store.commits == 0
    assert await replica.queued() == 0
    direct = replica.service.metrics.events_direct.labels("ns", "t")._value.get()
    assert direct == 3
    # Delivered identities are remembered: the gateway's second send of one is not pushed.
    assert await replica.post(event("b")) == 200
    assert replica.keys_delivered() == ["a", "b", "c"]
    assert replica.store.commits == 0


async def test_a_failed_direct_push_queues_the_event_and_a_later_one_of_its_object_waits(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    refused = []

    def refuse_first_a(delivery: Delivery) -> None:
        if delivery.record["v"] == "a1" and not refused:
            refused.append(delivery)
            raise RejectedError("down for a moment")

    replica = await start(refuse_first_a)
    await emptied(replica)
    assert await replica.post(event("a", v="a1", sequencer="1")) == 200
    assert refused and replica.store.commits == 1  # acknowledged because it is queued
    assert await replica.post(event("a", v="a2", sequencer="2")) == 200
    await until(lambda: len(replica.endpoint.delivered) == 2, 5, "a1 and a2 delivered")
    assert replica.versions_delivered() == [("a", "a1"), ("a", "a2")]
    assert await replica.queued() == 0
    # Once a round has emptied the shard, events go directly again.
    await emptied(replica)
    commits = replica.store.commits
    assert await replica.post(event("a", v="a3", sequencer="3")) == 200
    assert replica.versions_delivered()[-1] == ("a", "a3")
    assert replica.store.commits == commits


async def test_a_failed_direct_push_counts_as_the_first_attempt(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    """maxRetries: 1 gives an event 2 attempts in all, the direct push one of them."""

    def refuse(delivery: Delivery) -> None:
        raise RejectedError("down")

    replica = await start(refuse, policy=DeliveryPolicy(max_retries=1))
    await emptied(replica)
    assert await replica.post(event("a")) == 200
    await until(lambda: len(replica.endpoint.batches) >= 2, 5, "the retry from the queue")
    lost = replica.service.metrics.event_lost.labels("ns", "t")
    await until(lambda: lost._value.get() == 1, 5, "the event dropped after 2 attempts")
    assert len(replica.endpoint.batches) == 2
    assert await replica.queued() == 0


async def test_records_of_direct_pushes_tell_the_same_story_as_rounds_do(
    start: Callable[..., Awaitable[Replica]], tmp_path: Path
) -> None:
    """b goes directly; a's direct push fails, so a is queued and delivered by a round; c is
    refused for good and dropped. Each event's records share one ingest time, none comes
    before it, and a's attempts count on from its direct push."""

    def refuse_a_once(delivery: Delivery) -> None:
        key = delivery.record["s3"]["object"]["key"]
        if key == "a" and not refused:
            refused.append(delivery)
            raise RejectedError("down for a moment")
        if key == "c":
            raise UndeliverableError("too large")

    refused: list[Delivery] = []
    writer = RecordWriter(DirTarget(tmp_path / "records"), replica="replica-0")
    replica = await start(refuse_a_once, records=writer)
    await emptied(replica)
    assert await replica.post(event("b")) == 200
    assert await replica.post(event("a")) == 200
    assert await replica.post(event("c")) == 200
    await until(lambda: writer.buffered == 7, 5, "the records of a's round")
    await writer.flush()
    found = [
        json.loads(line)
        for path in sorted((tmp_path / "records" / "v1").rglob("*"))
        if path.is_file()
        for line in gzip.decompress(path.read_bytes()).decode().splitlines()
    ]
    story = {
        key: sorted((r["attempts"], r["outcome"]) for r in found if r["key"] == key)
        for key in "abc"
    }
    assert story == {
        "a": [(0, "ingested"), (1, "failed"), (2, "delivered")],
        "b": [(0, "ingested"), (1, "delivered")],
        # Refused for good: dropped at once, as a round would, not pushed again.
        "c": [(0, "ingested"), (1, "rejected")],
    }
    for key in "abc":
        assert len({r["ingest_time"] for r in found if r["key"] == key}) == 1
    assert all(r["ingest_time"] <= r["outcome_time"] for r in found)
    assert len(replica.endpoint.batches) == 4  # b, a, a again, c
    assert replica.service.metrics.event_lost.labels("ns", "t")._value.get() == 1


def hang_first(fail: bool) -> tuple[asyncio.Event, list[str], Any]:
    """A handler that holds the first push (a1) until released, then fails it or not."""
    release = asyncio.Event()
    attempts: list[str] = []

    async def handler(delivery: Delivery) -> None:
        attempts.append(delivery.record["v"])
        if attempts == ["a1"]:
            await release.wait()
            if fail:
                raise RejectedError("timed out")

    return release, attempts, handler


async def test_a_request_during_a_direct_push_of_its_shard_goes_directly_after_it(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    release, attempts, handler = hang_first(fail=False)
    replica = await start(handler)
    replica.service.gate.wait_budget_s = 30  # a2 waits however slow this machine is
    await emptied(replica)
    first = asyncio.create_task(replica.post(event("a", v="a1", sequencer="1")))
    await until(lambda: attempts == ["a1"], 5, "a1's direct push")
    second = asyncio.create_task(replica.post(event("a", v="a2", sequencer="2")))
    await asyncio.sleep(0.2)
    assert not second.done()
    assert attempts == ["a1"]  # a2 waits for a1's push to end
    release.set()
    assert await first == 200
    assert await second == 200
    assert replica.versions_delivered() == [("a", "a1"), ("a", "a2")]
    assert replica.store.commits == 0


async def test_a_request_waiting_for_a_failed_direct_push_is_queued_after_its_event(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    """a2 arrives while a1's direct push hangs; a1's push then fails. a1 must still reach
    the endpoint before a2: a2 was not queued (nor pushed) until a1 was queued."""
    release, attempts, handler = hang_first(fail=True)
    replica = await start(handler)
    replica.service.gate.wait_budget_s = 30
    await emptied(replica)
    first = asyncio.create_task(replica.post(event("a", v="a1", sequencer="1")))
    await until(lambda: attempts == ["a1"], 5, "a1's direct push")
    second = asyncio.create_task(replica.post(event("a", v="a2", sequencer="2")))
    await asyncio.sleep(0.2)
    assert not second.done()
    release.set()
    assert await first == 200
    assert await second == 200
    assert replica.store.commits == 2
    await until(lambda: len(replica.endpoint.delivered) == 2, 5, "a1 and a2 delivered")
    assert replica.versions_delivered() == [("a", "a1"), ("a", "a2")]
    assert attempts == ["a1", "a1", "a2"]


async def test_requests_behind_a_slow_direct_push_are_queued_not_lined_up(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    """a1's push hangs past the wait budget: b and c, arriving then, are committed and
    answered as soon as a1's push ends, rather than each waiting for the pushes before it;
    the rounds push them."""
    release = {key: asyncio.Event() for key in "abc"}
    attempts: list[str] = []

    async def hold(delivery: Delivery) -> None:
        key = delivery.record["s3"]["object"]["key"]
        attempts.append(key)
        await release[key].wait()

    replica = await start(hold)
    await emptied(replica)
    first = asyncio.create_task(replica.post(event("a")))
    await until(lambda: attempts == ["a"], 5, "a's direct push")
    await asyncio.sleep(replica.service.gate.wait_budget_s * 2)
    later = [asyncio.create_task(replica.post(event(key))) for key in "bc"]
    await asyncio.sleep(0.2)
    assert not any(task.done() for task in later)  # a's push decides a's place first
    release["a"].set()
    assert await first == 200
    # Answered while b's and c's pushes are still held: they were queued, not pushed.
    assert await asyncio.wait_for(asyncio.gather(*later), 5) == [200, 200]
    assert replica.store.commits >= 1
    assert replica.service.metrics.events_direct.labels("ns", "t")._value.get() == 1
    release["b"].set()
    release["c"].set()
    await until(lambda: sorted(replica.keys_delivered()) == ["a", "b", "c"], 5, "b and c")
    assert await replica.queued() == 0


async def empty_gate(budget_s: float) -> tuple[ShardGate, tuple[QueueName, int]]:
    gate = ShardGate(wait_budget_s=budget_s)
    unit = (QUEUE, 0)
    gate.round_ended(unit, await gate.round_starts(unit), left_empty=True)
    return gate, unit


async def direct_push(gate: ShardGate, unit: tuple[QueueName, int], held_s: float) -> None:
    assert await gate.take(unit)
    await asyncio.sleep(held_s)
    gate.give_back(unit)


async def test_a_request_waits_only_for_as_many_pushes_as_fit_the_budget() -> None:
    """Pushes of 0.3 s, a budget of 0.7 s: two requests wait behind the push under way
    (0.3 and 0.6 s ahead), the third would have 0.9 s ahead and is committed instead."""
    gate, unit = await empty_gate(budget_s=0.7)
    await direct_push(gate, unit, held_s=0.3)
    holder = asyncio.create_task(direct_push(gate, unit, held_s=0.3))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(gate.take(unit)) for _ in range(2)]
    await asyncio.sleep(0)
    assert await asyncio.wait_for(gate.take(unit), 0.1) is False
    assert not any(task.done() for task in waiters)
    await holder
    # One waiter holds the shard now; the other waits behind it.
    taken = await asyncio.wait_for(asyncio.wait(waiters, timeout=0.1), 1)
    assert [task.result() for task in taken[0]] == [True]
    gate.give_back(unit)
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1) == [True, True]
    gate.give_back(unit)


async def test_after_a_slow_push_a_request_does_not_wait_for_the_next() -> None:
    gate, unit = await empty_gate(budget_s=0.05)
    await direct_push(gate, unit, held_s=0.2)
    assert await gate.take(unit)  # the first request of an empty shard always goes
    assert await asyncio.wait_for(gate.take(unit), 0.1) is False
    gate.give_back(unit)
    assert await gate.take(unit)


async def test_a_commit_during_a_direct_push_waits_for_it(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    """A commit that is no ingest request of one shard (a dead-letter topic's, a request
    of several shards) waits for the push under way: a1's failure is queued first."""
    release, attempts, handler = hang_first(fail=True)
    replica = await start(handler)
    await emptied(replica)
    first = asyncio.create_task(replica.post(event("a", v="a1", sequencer="1")))
    await until(lambda: attempts == ["a1"], 5, "a1's direct push")
    a2 = event("a", v="a2", sequencer="2")
    commit = asyncio.create_task(
        replica.service.ingest.commit(QUEUE, {0: [(event_id(a2), json.dumps(a2).encode())]})
    )
    await asyncio.sleep(0.2)
    assert not commit.done()
    assert replica.store.commits == 0
    release.set()
    assert await first == 200
    await commit
    await until(lambda: len(replica.endpoint.delivered) == 2, 5, "a1 and a2 delivered")
    assert replica.versions_delivered() == [("a", "a1"), ("a", "a2")]


async def test_a_replica_among_peers_that_reach_it_pushes_directly(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    replica = await start(ownership=AmongPeers)
    await emptied(replica)
    assert await replica.post(event("a")) == 200
    assert replica.keys_delivered() == ["a"]
    assert replica.store.commits == 0


async def test_a_shard_just_taken_queues_until_its_peers_know_who_holds_it(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    """Its previous holder was killed. Until the peer's Lease round shows the new holder,
    the peer commits a request it cannot hand over and tells the dead holder, not this one:
    a1 so committed while this replica's first round found the shard empty must not be
    overtaken by a2 pushed directly. After the window a round opens the shard again."""
    replica = await start(ownership=JustTookAmongPeers)
    await until(lambda: replica.store.lists > 0, 5, "the first round")
    peer = LocalDirStore(replica.store.root)
    a1 = event("a", v="a1", sequencer="1")
    body = json.dumps(a1).encode()
    reservation = await peer.reserve(QUEUE, 0, 1, len(body), time.time())
    await peer.commit(reservation, [(event_id(a1), body)], time.time())  # nobody told
    assert await replica.post(event("a", v="a2", sequencer="2")) == 200
    await until(lambda: len(replica.endpoint.delivered) == 2, 5, "a1 and a2 delivered")
    assert replica.versions_delivered() == [("a", "a1"), ("a", "a2")]
    await emptied(replica)  # the window (2 renew intervals) is over
    assert await replica.post(event("b")) == 200
    assert replica.keys_delivered()[-1] == "b"  # directly again, before the answer


async def test_a_wake_up_from_a_peer_keeps_later_events_behind_what_it_committed(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    """Another replica committed a1 (it could not hand the request over) and told this
    owner before answering; a2, sent only after, must not overtake a1 by a direct push."""
    replica = await start(ownership=AmongPeers)
    await emptied(replica)
    peer = LocalDirStore(replica.store.root)
    a1 = event("a", v="a1", sequencer="1")
    body = json.dumps(a1).encode()
    reservation = await peer.reserve(QUEUE, 0, 1, len(body), time.time())
    await peer.commit(reservation, [(event_id(a1), body)], time.time())
    # The shard's loop is slow to start its round (busy elsewhere): only the wake-up's
    # mark on the gate keeps a2 from going directly.
    wake_loop = replica.service.loops.wake_local
    replica.service.loops.wake_local = lambda queue, shard: None  # type: ignore[method-assign]
    wake = await replica.client.post("/v1/wake", json={"shards": [["ns", "t", 0]]})
    assert wake.status == 204
    assert await replica.post(event("a", v="a2", sequencer="2")) == 200
    replica.service.loops.wake_local = wake_loop  # type: ignore[method-assign]
    wake_loop(QUEUE, 0)
    await until(lambda: len(replica.endpoint.delivered) == 2, 5, "a1 and a2 delivered")
    assert replica.versions_delivered() == [("a", "a1"), ("a", "a2")]
    assert replica.store.commits == 1, "a2 was pushed directly, ahead of a1's round"


async def test_a_replica_whose_peers_cannot_all_be_reached_queues_every_event(
    start: Callable[..., Awaitable[Replica]],
) -> None:
    replica = await start(ownership=PeerUnreachable)
    await emptied(replica)
    assert await replica.post(event("a")) == 200
    assert replica.store.commits == 1
    await until(lambda: replica.keys_delivered() == ["a"], 5, "a delivered by a round")
