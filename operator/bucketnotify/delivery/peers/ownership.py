"""Who processes which queue shard: Kubernetes Leases instead of the gateway's cls locks.

The unit a Lease covers is a *partition*: every (queue, shard) pair hashes to one of
``partitions`` (default 32) partitions, and one Lease per partition says which replica owns
all the shards in it. So the number of Leases, and the renewal traffic, does not grow with
the number of topics, while the shards of one hot topic spread over many partitions and so
over many replicas. With the defaults (32 partitions, renew every 3 s) the whole cluster
writes (32 + replicas) Leases per 3 s, about 12 writes a second with 3 replicas, for any
number of topics. Failover takes at most lease duration + renew interval (12 + 3 s).

Each replica also renews a *member* Lease of its own; the live members tell everyone the
fair share, ceil(partitions / members). A replica takes free or expired partitions while it
holds fewer than its share and hands back the excess when it holds more, so ownership
spreads evenly instead of going to the first comer.

Fencing: a replica counts a partition as its own only until ``renew_deadline`` after its
last successful renewal, and the deadline is shorter than the lease duration. The deadline
runs from just before the renewal was sent, when the renewTime it writes was taken, not
from its answer: a renewal that took long must not stretch the deadline past the lease.
A replica that cannot renew (API server unreachable, process paused) therefore stops
removing entries before anyone else may take the partition.

A round renews the held partitions concurrently, each write on its own time, and waits for
them at most ``renew_interval``: a renewal still unanswered then stays in flight on its own
(no second one is sent for that partition) while the rounds go on renewing the others on
schedule. So one slow or stuck call fences only its own partition; if a round waited for
it, the next round would come too late for every other partition as well. Every call has a
timeout of ``renew_deadline``, past which its answer could not keep the partition anyway.

After an API server outage every Lease looks expired, the other replicas' as well as their
member Leases, though they are alive and only waiting to renew. A replica whose rounds
failed for longer than the renew deadline therefore takes nobody's expired partition for
one lease duration after it gets through again: it renews its own, takes only free ones,
and lets the others renew theirs first. Without that pause the first replica back counts
itself alone, takes every partition and hands most of them back a round later, and each
move repeats the events in flight on it. A replica that died during the outage loses its
partitions one lease duration later than it otherwise would.

Peers: a replica started with an ``address`` (where its ingest listens, e.g. the pod IP and
port) puts it on its member Lease. Each round's LIST of the Leases then tells every replica
who holds each partition and where that holder listens (``owner_address``), so an ingest
can hand a request to the owner of its shard (``delivery.peers.forwarding``), or tell that owner
at once when it committed to the shard itself (the wake-ups of ``delivery.peers.wakeups``); and
whether every member does so (``all_hand_over``), which owners need before they push
directly beside other replicas. What it says is as old as the last round (``renew_interval``): after
a hand-over a wake-up may go to the previous holder, or to nobody, which is why the new
holder polls a shard it has just taken for two renew intervals
(``delivery.service.HANDOVER_POLL_ROUNDS``).

Clocks: expiry is judged from the Lease's renewTime against the local clock, so replicas'
clocks must agree to well within a second (NTP), as Kubernetes leader election already
assumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import time
from typing import Any, Protocol

import aiohttp

from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.peers.gone_members import GoneMembers
from bucketnotify.delivery.peers.leases import (
    ADDRESS_ANNOTATION,
    GROUP_LABEL,
    HANDS_OVER_ANNOTATION,
    ROLE_LABEL,
    Lease,
    LeaseHolder,
    LeaseSettings,
    lease_annotation,
    lease_expired,
    lease_holder,
    lease_labels,
    member_annotations,
    partition_holders,
    partition_lease_name,
    partition_of,
    utc_now,
)
from bucketnotify.kube.apiserver import (
    ApiClient,
    ApiError,
    lease_path,
    log_retried,
    micro_time,
    transient,
)

__all__ = [
    "LeaseHolder",
    "LeaseSettings",
    "Ownership",
    "partition_holders",
    "partition_lease_name",
    "partition_of",
]

log = logging.getLogger(__name__)


class ShardHolder(Protocol):
    """What ownership asks of the room that runs the shards (``delivery.rounds``'
    ``ShardLoops`` implements it), the one call from here to a room above."""

    async def before_release(self, partition: int) -> None:
        """Return once no round runs on ``partition`` (no longer owned, still held), so
        that its Lease can be handed back: the next owner starts from what was removed."""
        ...


class Ownership:
    """Holds this replica's member Lease and its share of partition Leases."""

    def __init__(
        self,
        api: ApiClient,
        identity: str,
        settings: LeaseSettings,
        holder: ShardHolder | None = None,
        address: str | None = None,
        hands_over: bool = False,
    ) -> None:
        self.holder = holder
        """Asked while a partition we hand back is no longer owned (no round starts on it)
        but still held, before its Lease is released: the round that was running on it
        finishes its removals (``may_remove``) before the next owner starts. Set by the
        service once the shard loops exist (they need this ownership first)."""
        self.address = address
        """``host:port`` other replicas reach this one at; None: it takes no wake-ups."""
        self.hands_over = hands_over
        """Said on the member Lease (``HANDS_OVER_ANNOTATION``)."""
        self._api = api
        self.identity = identity
        self.settings = settings
        # partition -> monotonic time of the last successful renewal
        self._held: dict[int, float] = {}
        # partition -> monotonic time this replica took it (last time)
        self._taken: dict[int, float] = {}
        # partitions being handed back: no new round starts on them, and the rounds already
        # running finish their removals (fenced as ever) before the Lease goes
        self._releasing: set[int] = set()
        # partition -> its renewal still waiting for an answer
        self._renewing: dict[int, asyncio.Task[None]] = {}
        # partition -> why its renewal failed since the last round (said once a round)
        self._renewals_failed: dict[int, str] = {}
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()
        """Set whenever the set of owned partitions changes."""
        self._holders: dict[int, str] = {}
        """partition -> its live holder, as the last round's LIST showed"""
        self._addresses: dict[str, str] = {}
        """identity -> address, of the live members that advertise one"""
        self._handing_over: set[str] = set()
        """The live members whose Lease says ``HANDS_OVER_ANNOTATION``."""
        self.members = 0
        """Live member Leases at the last round (this replica's own once it joined); 0
        before the first round."""
        # monotonic time of the last round that reached the API server, and until when this
        # replica takes no expired partition because it just got through after an outage
        self._reached: float | None = None
        self._settling_until = 0.0
        self._gone_members = GoneMembers(api, identity, settings)
        self.joined = False
        """True once this replica's member Lease was written: the others count it in the
        fair share from then on. It stays True through an API server outage, when the
        member Lease cannot be renewed but the ingest still commits to the store."""

    # --- what the worker asks -------------------------------------------------------------

    def owns(self, partition: int) -> bool:
        """True while this replica processes ``partition``: it holds the Lease, renewed
        within the deadline, and is not handing it back."""
        return partition not in self._releasing and self._unfenced(partition)

    @property
    def writers(self) -> int:
        """The most replicas that may write to the queue store now: one more than the live
        members seen (one joining now is counted before its Lease shows); 0 (unknown) until
        the first Lease round."""
        return self.members and self.members + 1

    def owns_shard(self, queue: QueueName, shard: int) -> bool:
        return self.owns(partition_of(queue, shard, self.settings.partitions))

    def may_remove(self, queue: QueueName, shard: int) -> bool:
        """True while a round of the shard may remove entries: as ``owns_shard``, and also
        while its partition is being handed back, so that the round running then finishes
        its removals instead of leaving what it pushed to the next owner to push again."""
        return self._unfenced(partition_of(queue, shard, self.settings.partitions))

    def _unfenced(self, partition: int) -> bool:
        renewed = self._held.get(partition)
        return renewed is not None and time.monotonic() - renewed < self.settings.renew_deadline_s

    def owned(self) -> set[int]:
        return {p for p in self._held if self.owns(p)}

    def taken_at(self, queue: QueueName, shard: int) -> float:
        """When this replica last took the shard's partition (monotonic; 0 if never): the
        other replicas may see an older holder for up to a Lease round after that."""
        return self._taken.get(partition_of(queue, shard, self.settings.partitions), 0.0)

    def owner_address(self, queue: QueueName, shard: int) -> str | None:
        """Where the replica holding the shard listens, when that is another live replica
        that advertises an address (as of the last round); None otherwise."""
        holder = self._holders.get(partition_of(queue, shard, self.settings.partitions))
        if holder is None or holder == self.identity:
            return None
        return self._addresses.get(holder)

    def all_hand_over(self) -> bool:
        """Every live member (this one included) advertises an address and hands requests
        over (``HANDS_OVER_ANNOTATION``), as of the last round."""
        reachable = self._handing_over & self._addresses.keys()
        return self.members > 0 and len(reachable) >= self.members

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """The first round, then the loop. A first round the API server refuses for now
        (429 from a throttling API server, a 5xx, no connection) is left to the loop's next
        rounds, as any later round would be: a replica started while the API server is busy
        waits for it instead of exiting. Any other failure (403: no right to the Leases)
        ends the start, with what to fix."""
        try:
            await self.tick()
        except Exception as exc:
            if not transient(exc):
                raise
            log_retried(log, "the first lease round failed", exc)
        self._task = asyncio.create_task(self._loop(), name="lease-ownership")

    async def stop(self, release: bool = True) -> None:
        """Stop renewing; with ``release`` hand every Lease back so others take over at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._cancel_renewals(list(self._renewing))
        if release:
            for partition in list(self._held):
                await self._release(self._partition_name(partition))
            # Gone rather than released: a replica that stopped for good (a pod of a rolled
            # Deployment) leaves no Lease behind, and the others count it out at once.
            await self._delete_member()
        self._held.clear()
        self.changed.set()

    async def _loop(self) -> None:
        # Rounds start every renew_interval counted from the previous start, so a slow round
        # does not push the next renewals later still.
        started = time.monotonic()
        while True:
            await asyncio.sleep(
                max(0.0, started + self.settings.renew_interval_s - time.monotonic())
            )
            started = time.monotonic()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The API server may be away for a while; fencing (owns()) keeps us safe,
                # the next tick tries again.
                log_retried(log, "lease round failed", exc)

    # --- one round ------------------------------------------------------------------------

    def _member_name(self, identity: str) -> str:
        return f"{self.settings.group}-member-{identity}"[:253]

    def _partition_name(self, partition: int) -> str:
        return partition_lease_name(self.settings.group, partition)

    def _body(self, name: str, role: str, holder: str, now: dt.datetime) -> Lease:
        metadata: dict[str, Any] = {
            "name": name,
            "labels": {ROLE_LABEL: role, GROUP_LABEL: self.settings.group},
        }
        if role == "member" and (said := member_annotations(self.address, self.hands_over)):
            metadata["annotations"] = said
        if self.settings.owner is not None:
            metadata["ownerReferences"] = [self.settings.owner]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": self.settings.lease_duration_s,
                "acquireTime": micro_time(now),
                "renewTime": micro_time(now),
            },
        }

    async def tick(self) -> None:
        """Renew what we hold, then take or give partitions towards our fair share."""
        if self._renewals_failed:
            failed, self._renewals_failed = self._renewals_failed, {}
            log.warning(
                "renewing the Leases of partitions %s failed: %s",
                sorted(failed),
                "; ".join(sorted(set(failed.values()))),
            )
        await self._renew_member(utc_now())
        items, now, settling = await self._look()
        members = [
            lease
            for lease in items
            if lease_labels(lease).get(ROLE_LABEL) == "member" and not lease_expired(lease, now)
        ]
        self.members = len(members)
        if not settling:
            await self._gone_members.forget(items, now)
        share = math.ceil(self.settings.partitions / max(1, len(members)))
        partitions = self._see(items, members, now)
        before = set(self._held)
        await self._renew_held(partitions)
        await self._give_back(share)
        await self._take(partitions, share, now, settling)
        if set(self._held) != before:
            log.info("%s owns partitions %s", self.identity, sorted(self._held))
            self.changed.set()

    async def _look(self) -> tuple[list[Lease], dt.datetime, bool]:
        """The group's Leases, when they were read, and whether this replica is settling
        after an API server outage (it takes no expired partition meanwhile)."""
        selector = f"{GROUP_LABEL}={self.settings.group}"
        listed = await self._api.get(
            lease_path(self.settings.namespace),
            params={"labelSelector": selector},
            request_timeout=self._timeout,
        )
        items: list[Lease] = listed["items"]
        now = utc_now()
        reached = time.monotonic()
        if self._reached is not None and reached - self._reached > self.settings.renew_deadline_s:
            self._settling_until = reached + self.settings.lease_duration_s
            log.info(
                "the API server is back after %.0f s: taking no expired partition for %d s",
                reached - self._reached,
                self.settings.lease_duration_s,
            )
        self._reached = reached
        return items, now, reached < self._settling_until

    def _see(self, items: list[Lease], members: list[Lease], now: dt.datetime) -> dict[str, Lease]:
        """The partition Leases by name; the live members' addresses and the partitions'
        holders remembered from them."""
        partitions = {
            lease["metadata"]["name"]: lease
            for lease in items
            if lease_labels(lease).get(ROLE_LABEL) == "partition"
        }
        self._addresses = {
            lease_holder(lease): address
            for lease in members
            if (address := lease_annotation(lease, ADDRESS_ANNOTATION))
        }
        self._handing_over = {
            lease_holder(lease)
            for lease in members
            if lease_annotation(lease, HANDS_OVER_ANNOTATION) == "true"
        }
        numbers = {self._partition_name(p): p for p in range(self.settings.partitions)}
        self._holders = {
            numbers[name]: lease_holder(lease)
            for name, lease in partitions.items()
            if name in numbers and not lease_expired(lease, now)
        }
        return partitions

    async def _renew_held(self, partitions: dict[str, Lease]) -> None:
        """Renew ours, all at once; drop any the API server says someone else holds now."""
        lost = []
        for partition in list(self._held):
            lease = partitions.get(self._partition_name(partition))
            if lease is None or lease_holder(lease) != self.identity:
                self._held.pop(partition, None)
                lost.append(partition)
            elif partition not in self._renewing:
                self._renewing[partition] = asyncio.create_task(
                    self._renew(partition, lease), name=f"lease-renewal-{partition}"
                )
        await self._cancel_renewals(lost)
        if self._renewing:
            await asyncio.wait(self._renewing.values(), timeout=self.settings.renew_interval_s)

    async def _give_back(self, share: int) -> None:
        """Give back what exceeds the fair share (a newcomer joined)."""
        while len(self._held) > share:
            partition = max(self._held)
            await self._cancel_renewals([partition])
            # Still held while its rounds finish (the renew deadline fences them as ever),
            # but no longer owned: its loops end after their round and none starts.
            self._releasing.add(partition)
            try:
                if self.holder is not None:
                    await self.holder.before_release(partition)
            finally:
                self._releasing.discard(partition)
                self._held.pop(partition, None)
            await self._release(self._partition_name(partition))

    async def _take(
        self, partitions: dict[str, Lease], share: int, now: dt.datetime, settling: bool
    ) -> None:
        """Take free or expired partitions up to the fair share."""
        for partition in range(self.settings.partitions):
            if len(self._held) >= share:
                break
            if partition in self._held:
                continue
            name = self._partition_name(partition)
            lease = partitions.get(name)
            sent = time.monotonic()
            if lease is None:
                if await self._create(self._body(name, "partition", self.identity, utc_now())):
                    self._held[partition] = self._taken[partition] = sent
            elif (
                lease_expired(lease, now)
                and not settling
                and await self._write(lease, self.identity, utc_now(), renew=False)
            ):
                self._held[partition] = self._taken[partition] = sent

    @property
    def _timeout(self) -> float:
        return self.settings.renew_deadline_s

    async def _renew(self, partition: int, lease: Lease) -> None:
        """One held partition: renewed (its deadline runs from now), lost, or left as it
        was when the call failed (the deadline runs on from the last renewal)."""
        sent = time.monotonic()
        try:
            renewed = await self._write(lease, self.identity, utc_now(), renew=True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Said once per round for all of them (tick): a throttling API server refuses
            # many renewals of one round, and a line each would bury the rest.
            self._renewals_failed[partition] = str(exc) or type(exc).__name__
            return
        finally:
            if self._renewing.get(partition) is asyncio.current_task():
                del self._renewing[partition]
        if renewed:
            # Only if still ours: a hand-back or stop may have dropped it meanwhile.
            if partition in self._held:
                self._held[partition] = max(self._held[partition], sent)
        else:
            self._held.pop(partition, None)

    async def _cancel_renewals(self, partitions: list[int]) -> None:
        """Forget the renewals in flight for partitions we no longer hold, so a late answer
        cannot touch a partition taken again since."""
        tasks = [task for p in partitions if (task := self._renewing.pop(p, None)) is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _renew_member(self, now: dt.datetime) -> None:
        name = self._member_name(self.identity)
        try:
            lease = await self._api.get(
                lease_path(self.settings.namespace, name), request_timeout=self._timeout
            )
        except ApiError as exc:
            if exc.status != 404:
                raise
            if await self._create(self._body(name, "member", self.identity, now)):
                self.joined = True
            return
        if self.address:
            # A restarted replica of the same name may listen elsewhere now, or run with
            # direct delivery switched.
            metadata = lease["metadata"]
            others = {
                key: value
                for key, value in (metadata.get("annotations") or {}).items()
                if key not in (ADDRESS_ANNOTATION, HANDS_OVER_ANNOTATION)
            }
            metadata["annotations"] = {
                **others,
                **member_annotations(self.address, self.hands_over),
            }
        if await self._write(lease, self.identity, now, renew=True):
            self.joined = True

    async def _create(self, body: Lease) -> bool:
        try:
            await self._api.create(
                lease_path(self.settings.namespace), body, request_timeout=self._timeout
            )
        except ApiError as exc:
            if exc.status == 409:
                return False  # someone else was faster
            raise
        return True

    async def _write(self, lease: Lease, holder: str, now: dt.datetime, *, renew: bool) -> bool:
        """Replace with optimistic concurrency (the resourceVersion read goes with it): a
        concurrent writer makes this return False."""
        spec = lease.setdefault("spec", {})
        owner = self.settings.owner
        if owner is not None and not lease["metadata"].get("ownerReferences"):
            # Written while no owner was set (the setting came later): an uninstall takes
            # it too now.
            lease["metadata"]["ownerReferences"] = [owner]
        if not renew:
            spec["acquireTime"] = micro_time(now)
        spec["holderIdentity"] = holder
        spec["renewTime"] = micro_time(now)
        spec["leaseDurationSeconds"] = self.settings.lease_duration_s
        try:
            await self._api.replace(
                lease_path(self.settings.namespace, lease["metadata"]["name"]),
                lease,
                request_timeout=self._timeout,
            )
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def _delete_member(self) -> None:
        name = self._member_name(self.identity)
        try:
            await self._api.delete(lease_path(self.settings.namespace, name))
        except ApiError as exc:
            if exc.status != 404:
                log.warning("could not delete the member Lease %s: %s", name, exc.reason)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Stopping while the API server is away: the Lease expires and the others
            # count this replica out then (gone_members), as for a crashed one.
            log.warning("could not delete the member Lease %s: %s", name, _why(exc))

    async def _release(self, name: str) -> None:
        try:
            path = lease_path(self.settings.namespace, name)
            lease = await self._api.get(path)
            if lease_holder(lease) != self.identity:
                return
            # An empty holder is free at once for everyone (see _expired).
            lease["spec"]["holderIdentity"] = ""
            await self._api.replace(path, lease)
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("could not release Lease %s: %s", name, exc.reason)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The API server away: the Lease expires instead, and its partition is taken then.
            log.warning("could not release Lease %s: %s", name, _why(exc))


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
