"""Queue-shard ownership through real Leases: even spread, fencing, fast takeover."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from bucketnotify.delivery.endpoints.testing import MockEndpoint
from bucketnotify.delivery.model.event import event_id
from bucketnotify.delivery.model.push import Delivery
from bucketnotify.delivery.model.queue import QueueLimits, QueueName
from bucketnotify.delivery.model.timings import ServiceTimings
from bucketnotify.delivery.peers.ownership import (
    LeaseSettings,
    Ownership,
    ShardHolder,
    partition_of,
)
from bucketnotify.delivery.service import DeliveryService
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.kube.apiserver import ApiClient, lease_path
from tests.delivery import one_shard_runtime
from tests.kubeapi import api_client
from tests.localservices import LocalService
from tests.records import event

FAST = dict(partitions=12, lease_duration_s=4, renew_interval_s=1.0, renew_deadline_s=2.5)


@pytest.fixture()
async def api(kube: LocalService) -> AsyncIterator[ApiClient]:
    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        yield api


async def settle(replicas: list[Ownership], rounds: int = 4) -> None:
    for _ in range(rounds):
        for replica in replicas:
            await replica.tick()


def holders(replicas: list[Ownership]) -> dict[int, list[str]]:
    seen: dict[int, list[str]] = {}
    for replica in replicas:
        for partition in replica.owned():
            seen.setdefault(partition, []).append(replica.identity)
    return seen


async def test_three_replicas_spread_evenly_and_never_share_a_partition(
    api: ApiClient, namespace: str
) -> None:
    settings = LeaseSettings(namespace=namespace, **FAST)  # type: ignore[arg-type]
    replicas = [Ownership(api, f"r{i}", settings) for i in range(3)]
    await settle(replicas)
    owned = holders(replicas)
    assert sorted(owned) == list(range(12)), "every partition has an owner"
    assert all(len(who) == 1 for who in owned.values()), f"a partition has two owners: {owned}"
    assert sorted(len(r.owned()) for r in replicas) == [4, 4, 4]


async def test_a_newcomer_gets_its_share_and_a_clean_stop_hands_over_at_once(
    api: ApiClient, namespace: str
) -> None:
    settings = LeaseSettings(namespace=namespace, **FAST)  # type: ignore[arg-type]
    first = Ownership(api, "first", settings)
    await settle([first])
    assert len(first.owned()) == 12
    second = Ownership(api, "second", settings)
    await settle([first, second])
    assert sorted(len(r.owned()) for r in (first, second)) == [6, 6]
    assert all(len(who) == 1 for who in holders([first, second]).values())

    await first.stop(release=True)
    await second.tick()
    assert len(second.owned()) == 12, "released leases are taken without waiting for expiry"


async def test_a_silent_replica_is_fenced_before_its_partitions_move(
    api: ApiClient, namespace: str
) -> None:
    """A replica that stops renewing (crash, SIGSTOP, lost API server) stops owning after
    the renew deadline, before the lease duration lets another replica take over."""
    settings = LeaseSettings(namespace=namespace, **FAST)  # type: ignore[arg-type]
    silent, survivor = Ownership(api, "silent", settings), Ownership(api, "survivor", settings)
    await settle([silent, survivor])
    taken = silent.owned()
    assert len(taken) == 6

    went_silent = time.monotonic()
    # Only a bound for a fence that never comes (a hang would otherwise last until the
    # suite's timeout); what is asserted is the order: fenced first, taken after. The time a
    # failover takes end to end is bench.failover's figure (gap in deliveries per kill).
    never = went_silent + 10 * settings.lease_duration_s
    while silent.owned():
        assert time.monotonic() < never, "a replica that stopped renewing still owns"
        await asyncio.sleep(0.1)
    print(f"\nfenced {time.monotonic() - went_silent:.1f} s after its last renewal")

    await survivor.tick()
    assert not (survivor.owned() & taken), "taken over before the silent replica's lease expired"

    deadline = time.monotonic() + settings.lease_duration_s + 3
    while not taken <= survivor.owned():
        assert time.monotonic() < deadline, "the survivor never took over the silent partitions"
        await asyncio.sleep(0.5)
        await survivor.tick()
    assert len(survivor.owned()) == 12


async def test_after_an_outage_longer_than_the_lease_every_replica_keeps_its_partitions(
    api: ApiClient, namespace: str
) -> None:
    """No round reaches the API server for longer than the lease duration (an outage seen
    by all): when they get through again, one after the other, every Lease looks expired,
    yet no partition changes hands, since each move repeats the events in flight on it."""
    settings = LeaseSettings(namespace=namespace, **FAST)  # type: ignore[arg-type]
    replicas = [Ownership(api, f"r{i}", settings) for i in range(3)]
    await settle(replicas)
    before = {r.identity: r.owned() for r in replicas}
    assert sorted(len(p) for p in before.values()) == [4, 4, 4]

    await asyncio.sleep(settings.lease_duration_s + 1)
    assert not any(r.owned() for r in replicas), "fenced during the outage"
    for _ in range(3):
        for replica in replicas:
            await replica.tick()
        assert {r.identity: r.owned() for r in replicas} == before

    # A replica that does not come back is taken over once the pause is over.
    survivors = replicas[:2]
    deadline = time.monotonic() + settings.lease_duration_s * 2 + 3
    while len(holders(survivors)) < settings.partitions:
        assert time.monotonic() < deadline, "the partitions of the dead replica stay orphaned"
        await asyncio.sleep(0.5)
        for replica in survivors:
            await replica.tick()
    assert all(len(who) == 1 for who in holders(survivors).values())


async def test_one_renewal_that_hangs_does_not_fence_the_other_partitions(
    api: ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals go out together: a call stuck on one partition's Lease (a slow API server,
    a stalled connection) fences that partition alone, not every one renewed after it."""
    settings = LeaseSettings(
        namespace=namespace,
        partitions=6,
        lease_duration_s=8,
        renew_interval_s=1.0,
        renew_deadline_s=4.0,
    )
    replica = Ownership(api, "r", settings)
    await settle([replica], rounds=2)
    assert replica.owned() == set(range(6))
    stuck = next(iter(replica._held))  # renewed first when renewals take turns
    stuck_lease = lease_path(namespace, f"{settings.group}-partition-{stuck}")
    real = api.request
    forever = asyncio.Event()

    async def request(method: str, path: str, **kwargs: Any) -> Any:
        # A write of that Lease (a renewal replaces it) never gets an answer.
        if method in ("PUT", "PATCH") and path == stuck_lease:
            await forever.wait()
        return await real(method, path, **kwargs)

    # This replica's only client: every call of it goes through request().
    monkeypatch.setattr(api, "request", request)
    # The replica's own renewal loop, as the delivery service runs it.
    await replica.start()
    try:
        watch_until = time.monotonic() + 3 * settings.renew_deadline_s
        fenced_at = None
        while time.monotonic() < watch_until:
            owned = replica.owned()
            others = set(range(6)) - {stuck}
            assert others <= owned, f"partitions {sorted(others - owned)} fenced with {stuck}"
            if stuck not in owned and fenced_at is None:
                fenced_at = time.monotonic()
            await asyncio.sleep(0.1)
        assert fenced_at is not None, "the partition whose renewal hangs was never fenced"
        assert stuck not in replica.owned()
    finally:
        forever.set()
        await replica.stop(release=False)


async def members(api: ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    listed = await api.get(
        lease_path(namespace), params={"labelSelector": "bucketnotify.io/lease-role=member"}
    )
    return {lease["spec"]["holderIdentity"]: lease for lease in listed["items"]}


async def test_no_member_lease_outlives_its_replica(api: ApiClient, namespace: str) -> None:
    """Each replica that ever ran (every pod a rollout or a crash replaced) left its member
    Lease behind for good. A clean stop deletes its own; a replica that died is deleted by a
    survivor once its Lease stayed expired for five lease durations, not before."""
    settings = LeaseSettings(
        namespace=namespace,
        partitions=4,
        lease_duration_s=2,
        renew_interval_s=0.5,
        renew_deadline_s=1.5,
    )
    survivor, stopped, dead = (Ownership(api, name, settings) for name in ("s", "stopped", "dead"))
    await settle([survivor, stopped, dead], rounds=2)
    assert set(await members(api, namespace)) == {"s", "stopped", "dead"}

    await stopped.stop(release=True)
    assert set(await members(api, namespace)) == {"s", "dead"}

    # `dead` is never called again, as a killed process. Its Lease expires after 2 s and is
    # kept while it might be a paused replica. Judged against its last renewal as the Lease
    # records it, by the wall clock the replicas judge it by: a look that ended before the
    # Lease could be gone must find it, however long the machine took to get there.
    spec = (await members(api, namespace))["dead"]["spec"]
    renewed = dt.datetime.fromisoformat(spec["renewTime"])
    gone_at = (
        (renewed if renewed.tzinfo else renewed.replace(tzinfo=dt.UTC)).timestamp()
        + spec["leaseDurationSeconds"]
        + settings.member_gone_after_s
    )
    while True:
        await survivor.tick()
        found = await members(api, namespace)
        if time.time() >= gone_at:
            break
        assert "dead" in found, "deleted before it was gone long enough"
        await asyncio.sleep(settings.renew_interval_s)
    # Only how long the test waits for the deletion: a survivor's round deletes it.
    deadline = time.monotonic() + 60
    while "dead" in await members(api, namespace):
        assert time.monotonic() < deadline, "the dead replica's member Lease was never deleted"
        await survivor.tick()
        await asyncio.sleep(settings.renew_interval_s)
    assert set(await members(api, namespace)) == {"s"}
    assert len(survivor.owned()) == 4


async def test_every_lease_names_its_owner_old_ones_too(api: ApiClient, namespace: str) -> None:
    """With an owner (the chart's Deployment), each Lease written carries its ownerReference,
    so Kubernetes' garbage collector deletes them all with it; the partition Leases written
    before the owner was set get it when a replica of the upgrade takes them."""
    plain = LeaseSettings(namespace=namespace, **FAST)  # type: ignore[arg-type]
    before = Ownership(api, "before", plain)
    await settle([before], rounds=1)
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": str(uuid4())}
    owned = LeaseSettings(namespace=namespace, owner=owner, **FAST)  # type: ignore[arg-type]
    await before.stop(release=True)
    upgraded = Ownership(api, "after", owned)
    await settle([upgraded], rounds=2)
    assert len(upgraded.owned()) == 12
    listed = await api.get(lease_path(namespace))
    assert len(listed["items"]) == 13  # 12 partitions and the member
    for lease in listed["items"]:
        assert lease["metadata"].get("ownerReferences") == [owner], lease["metadata"]["name"]


async def test_owners_push_directly_only_while_every_member_hands_requests_over(
    api: ApiClient, namespace: str
) -> None:
    """What each member Lease says decides it: a replica of a release before forwarding (or
    with direct delivery off, or no address) joining makes the others stop pushing directly,
    and a restart of it with direct delivery on lets them again."""
    settings = LeaseSettings(namespace=namespace, **FAST)  # type: ignore[arg-type]
    first = Ownership(api, "first", settings, address="10.0.0.1:8080", hands_over=True)
    await settle([first])
    assert first.all_hand_over()
    old = Ownership(api, "old", settings, address="10.0.0.2:8080")
    await settle([first, old])
    assert first.members == 2
    assert not first.all_hand_over(), "a member that commits untold joined"
    assert not old.all_hand_over()
    restarted = Ownership(api, "old", settings, address="10.0.0.2:8081", hands_over=True)
    await settle([first, restarted])
    assert first.all_hand_over() and restarted.all_hand_over()
    queue = QueueName("ns", "t")
    others = {first.owner_address(queue, shard) for shard in range(100)} - {None}
    assert others == {"10.0.0.2:8081"}, "the restarted replica's new address is the one used"
    silent = Ownership(api, "silent", settings, hands_over=True)
    await settle([first, restarted, silent])
    assert not first.all_hand_over(), "a member without an address cannot be handed requests"


async def test_a_partition_handed_to_a_newcomer_waits_for_its_round_to_remove_what_it_pushed(
    api: ApiClient, namespace: str, tmp_path: Path
) -> None:
    """A newcomer joins while the only replica is pushing an event of a partition it is to
    hand back (the highest goes first). The hand-back waits for that round: it removes the
    event it pushed, and only then is the Lease released. A round stopped before its
    removals would leave the event for the newcomer to push a second time."""
    # Leases far longer than the test's steps: what is judged is the order, and a round
    # fenced by a slow machine (past the renew deadline) would remove nothing either.
    settings = LeaseSettings(
        namespace=namespace,
        partitions=12,
        lease_duration_s=60,
        renew_interval_s=1.0,
        renew_deadline_s=45,
    )
    first = Ownership(api, "first", settings)
    store = LocalDirStore(tmp_path)
    service = DeliveryService(
        api=api,
        store=store,
        ownership=first,
        namespaces=[],
        # Longer than any step of the test: the round is cut only if the wait never ends.
        timings=ServiceTimings(drain_timeout_s=60),
    )
    await settle([first])
    assert first.owned() == set(range(12))
    queue = next(
        q
        for i in itertools.count()
        if partition_of(q := QueueName(namespace, f"t{i}"), 0, settings.partitions) == 11
    )
    await store.create(queue, 1, QueueLimits())
    record = event("photo.jpg")
    reservation = await store.reserve(queue, 0, 1, 10_000, 0)
    await store.commit(reservation, [(event_id(record), json.dumps(record).encode())], 0)

    pushing, answer = asyncio.Event(), asyncio.Event()

    async def endpoint_answers_when_told(delivery: Delivery) -> None:
        pushing.set()
        await answer.wait()

    endpoint = MockEndpoint(endpoint_answers_when_told)
    service.topics[(queue.namespace, queue.topic)] = one_shard_runtime(queue, endpoint)
    handing_back = asyncio.Event()
    holder = first.holder
    assert holder is not None, "the service waits for its rounds at a hand-back"
    rounds: ShardHolder = holder

    class Noted:
        async def before_release(self, partition: int) -> None:
            handing_back.set()
            await rounds.before_release(partition)

    first.holder = Noted()
    service.loops.supervise()
    second = Ownership(api, "second", settings)
    hand_back: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(pushing.wait(), 30)
        await second.tick()  # a member now: the fair share is 6
        hand_back = asyncio.create_task(first.tick())
        await asyncio.wait_for(handing_back.wait(), 30)
        lease = await api.get(lease_path(namespace, f"{settings.group}-partition-11"))
        assert lease["spec"]["holderIdentity"] == "first", "released before the round ended"
        assert not hand_back.done()

        answer.set()
        await asyncio.wait_for(hand_back, 30)
        assert [d.record["s3"]["object"]["key"] for d in endpoint.delivered] == ["photo.jpg"]
        assert await store.list(queue, 0) == [], "the round ended without removing the event"
        lease = await api.get(lease_path(namespace, f"{settings.group}-partition-11"))
        assert lease["spec"].get("holderIdentity") in ("", None), "not released after the round"
        await second.tick()
        assert 11 in second.owned()
    finally:
        answer.set()
        if hand_back is not None:
            await asyncio.wait_for(hand_back, 30)
        await service.loops.stop()
        await second.stop()
        await first.stop()
