"""The shard loops: one task per (queue, shard) this replica owns, which runs its rounds.

A shard whose round left entries behind (a failed push, a retry time not reached) is polled
again after ``round_interval_s``, backing off to ``idle_max_s`` while its entries all wait
for a retry; one found empty, or whose round delivered everything it listed, is not polled
at all (every poll of the S3 store is a LIST request, and hundreds of idle shards would keep
the gateway busy): it waits to be woken. An ingest commit wakes the shard's task at once, on
this replica directly and on the replica owning the shard by a wake-up request
(``delivery.peers.wakeups``). A shard whose partition was just taken is polled for
``HANDOVER_POLL_ROUNDS`` renew intervals from the take, while the other replicas may still
wake its previous holder. The loops learn of Topic changes from the Topic table they read (a
changed Topic gets fresh loops) and of ownership changes from ``Ownership.changed``; a
partition handed back, or the stop, waits for its rounds to finish their removals.
"""

from __future__ import annotations

import asyncio
import logging
import time

from bucketnotify.delivery.endpoints.base import Endpoint
from bucketnotify.delivery.model.delivered_ids import DeliveredCache
from bucketnotify.delivery.model.outcomes import RoundResult
from bucketnotify.delivery.model.queue import (
    QueueName,
    QueueStore,
    StoreFull,
    StoreRefused,
    StoreUnavailable,
)
from bucketnotify.delivery.model.timings import ServiceTimings
from bucketnotify.delivery.peers.ownership import Ownership, partition_of
from bucketnotify.delivery.peers.wakeups import WakeUps
from bucketnotify.delivery.recorded.accounting import Accounting
from bucketnotify.delivery.rounds.dead_letters import DeadLetters
from bucketnotify.delivery.rounds.delivered import DeliveredIds, woken
from bucketnotify.delivery.rounds.direct import ShardGate
from bucketnotify.delivery.rounds.worker import (
    LIST_BATCH,
    RoundCutShort,
    process_shard,
)
from bucketnotify.delivery.topics.table import TopicKey, TopicRuntime

__all__ = ["HANDOVER_POLL_ROUNDS", "ShardLoops"]

log = logging.getLogger(__name__)


def _settled(result: RoundResult) -> bool:
    """The round left nothing of what it listed (every entry delivered or dropped), and
    listed less than a full batch: the shard was empty when the round ended, but for what
    was committed since."""
    done = result.delivered + result.duplicates + result.expired + result.dead_lettered
    return not result.fenced and result.listed < LIST_BATCH and done == result.listed


HANDOVER_POLL_ROUNDS = 2
"""A shard this replica has just taken is polled every ``idle_max_s`` (and once more at the
end), not left to wait for wake-ups, for this many Lease renew intervals: the other
replicas' view of who holds it is as old as their last Lease round (one renew interval, and
a round may wait for a hand-back's drain), and what they commit before they see the change
wakes the previous holder, or nobody. For the same reason no direct push goes on such a
shard before the round at the end: one could overtake an event of its object that another
replica committed meanwhile."""


class ShardLoops:
    """The task of every owned shard: started, woken, waited for, stopped."""

    def __init__(
        self,
        *,
        topics: dict[TopicKey, TopicRuntime],
        store: QueueStore,
        ownership: Ownership,
        timings: ServiceTimings,
        gate: ShardGate,
        delivered: DeliveredIds,
        accounting: Accounting,
        wakeups: WakeUps,
        dead_letters: DeadLetters,
    ) -> None:
        self._topics = topics
        self._store = store
        self._ownership = ownership
        self._timings = timings
        self._gate = gate
        self._delivered = delivered
        self._accounting = accounting
        self._wakeups = wakeups
        self._dead_letters = dead_letters
        self._loops: dict[tuple[QueueName, int], asyncio.Task[None]] = {}
        self._ended: list[tuple[tuple[QueueName, int], asyncio.Task[None]]] = []
        """Loops that ended since the last supervision (their tasks' done callbacks)."""
        self._partitions: dict[QueueName, tuple[int, ...]] = {}
        self._rescan = True
        """Something changed that may leave an owned shard without a loop (a loop ended, the
        partitions held or a Topic changed): look at every shard at the next supervision."""
        self._scanned: tuple[float, int] = (-1e9, 0)
        """When every shard was last looked at, and how many Topics there were."""
        """Each queue's shards' partitions: hashed once, not at every supervision
        (``supervise`` runs every round interval over every shard)."""
        self._wakes: dict[tuple[QueueName, int], asyncio.Event] = {}
        self.stopping = False
        """Set at the stop: no loop starts, running ones end after their round."""

    def allowed(self, queue: QueueName, shard: int) -> bool:
        """Whether the ingest may push an event of the shard directly (``delivery.rounds.direct``):
        its loop runs here, and no other replica commits to it untold."""
        # Another replica commits to the shard only when it cannot hand the request here
        # (``forwarding``), and tells this owner before the gateway has its answer, so no
        # later event of the object goes directly ahead of the committed one. That needs
        # every replica to be reachable and to work so (its member Lease says both): one
        # without an address, direct delivery or this release would commit untold.
        loop = self._loops.get((queue, shard))
        return (
            not self.stopping
            and (self._ownership.members == 1 or self._ownership.all_hand_over())
            and loop is not None
            and not loop.done()
            and self._ownership.owns_shard(queue, shard)
        )

    def wake(self, queue: QueueName, shard: int) -> None:
        """The shard has entries: its task here starts a round, or its owner is told."""
        self.wake_local(queue, shard)
        if not self._ownership.owns_shard(queue, shard):
            self._wakeups.send(queue, shard)

    async def tell_owners(self, queue: QueueName, shards: list[int]) -> None:
        """After the ingest committed to ``shards``: their owners (other replicas) know
        before the gateway gets its answer (see ``allowed``)."""
        await self._wakeups.tell(queue, shards)

    def wake_local(self, queue: QueueName, shard: int) -> None:
        event = self._wakes.get((queue, shard))
        if event is not None:
            event.set()

    def supervise(self) -> None:
        """Start a loop for every owned shard that has none; loops end by themselves.

        Runs every round interval. Looking at every shard of every Topic each time, at
        5,000 persistent Topics (55,000 shards, each partition hashed and asked for) took
        most of an idle replica's CPU. So every shard is looked at only after something
        changed that can leave one without a loop (a loop ended, the partitions held
        changed, a Topic came, went or changed), and once per renew interval for what
        changes unsaid (a partition whose renewal lapsed and came back); partitions are
        hashed once per queue, and ended loops are reported by their tasks."""
        ended, self._ended = self._ended, []
        for unit, task in ended:
            self._rescan = True
            if self._loops.get(unit) is task:
                del self._loops[unit]
                self._gate.forget(unit)  # a loop that failed or was cancelled did not say so
        if self.stopping:
            return
        if self._ownership.changed.is_set():
            self._ownership.changed.clear()
            self._rescan = True
            # An empty shard's task sleeps until woken: one whose shard moved away must
            # wake to end, or a later take-back would find it still there, asleep.
            for unit in self._loops:
                if not self._ownership.owns_shard(*unit):
                    self.wake_local(*unit)
        now, (scanned_at, topics) = time.monotonic(), self._scanned
        due = now - scanned_at >= self._ownership.settings.renew_interval_s
        if not (self._rescan or due or len(self._topics) != topics):
            return
        self._rescan, self._scanned = False, (now, len(self._topics))
        owns = self._ownership.owns
        owned = {p for p in range(self._ownership.settings.partitions) if owns(p)}
        if not owned:
            return
        for key, runtime in self._topics.items():
            if runtime.endpoint is None:
                continue
            queue = runtime.queue
            for shard, partition in enumerate(self._partitions_of(queue, runtime.shards)):
                if partition in owned and (queue, shard) not in self._loops:
                    self._start(key, queue, shard)

    def _partitions_of(self, queue: QueueName, shards: int) -> tuple[int, ...]:
        found = self._partitions.get(queue)
        if found is None or len(found) != shards:
            total = self._ownership.settings.partitions
            found = tuple(partition_of(queue, shard, total) for shard in range(shards))
            self._partitions[queue] = found
        return found

    def _start(self, key: TopicKey, queue: QueueName, shard: int) -> None:
        unit = (queue, shard)
        task = asyncio.create_task(self._shard_loop(key, shard), name=f"shard {queue}#{shard}")
        self._loops[unit] = task
        task.add_done_callback(lambda done: self._ended.append((unit, done)))

    async def _shard_loop(self, key: TopicKey, shard: int) -> None:
        # Bound to the runtime it started with: a changed Topic gets fresh loops.
        runtime = self._topics[key]
        endpoint = runtime.endpoint
        assert endpoint is not None
        queue = runtime.queue
        wake = self._wakes.setdefault((queue, shard), asyncio.Event())
        delay = self._timings.round_interval_s
        delivered = runtime.delivered.setdefault(shard, DeliveredCache())
        # The other replicas learn that this one holds the shard at their next Lease round:
        # until then their commits wake the previous holder, or nobody. Poll meanwhile.
        awake_until = (
            self._ownership.taken_at(queue, shard)
            + HANDOVER_POLL_ROUNDS * self._ownership.settings.renew_interval_s
        )
        await self._delivered.load(runtime, shard, delivered)
        while not self.stopping:
            if self._topics.get(key) is not runtime or not self._ownership.owns_shard(queue, shard):
                break
            wake.clear()
            # Within the window another replica may still commit to the shard and tell the
            # previous holder, not this one: no round then opens the shard to direct pushes,
            # which could overtake such an event of the same object.
            taking_over = time.monotonic() < awake_until and self._ownership.members > 1
            result = await self.process(runtime, endpoint, shard, opens_direct=not taking_over)
            await self._delivered.save(runtime, shard, delivered)
            if result is not None and result.listed >= LIST_BATCH and not result.failed:
                continue  # a backlog: go on at once
            if result is not None and _settled(result) and self._ownership.address:
                left = awake_until - time.monotonic()
                if left > 0:
                    await woken(wake, min(left, self._timings.idle_max_s))
                    delay = self._timings.round_interval_s
                    continue
                if taking_over:
                    continue  # the window is over: this round may open the shard
                # Nothing left that it listed, and nothing committed since the listing (that
                # would have woken it): no polling. A commit, a wake-up, the survey, an
                # ownership or Topic change or the stop wakes it. (Without an address nobody
                # could send this replica wake-ups: it polls, below.)
                await self._delivered.idle(runtime, shard, delivered, wake)
                delay = self._timings.round_interval_s
                continue
            progress = result is not None and (
                result.delivered or result.expired or result.dead_lettered or result.duplicates
            )
            if progress:
                delay = self._timings.round_interval_s
            else:
                # Nothing to do, or only failures: poll, and hit the endpoint, less often.
                delay = min(
                    max(delay, self._timings.round_interval_s) * 2, self._timings.idle_max_s
                )
            await woken(wake, delay)
            if wake.is_set():
                delay = self._timings.round_interval_s
        self._gate.forget((queue, shard))
        await self._delivered.save(runtime, shard, delivered, final=True)

    async def process(
        self, runtime: TopicRuntime, endpoint: Endpoint, shard: int, opens_direct: bool = True
    ) -> RoundResult | None:
        """One round; with ``opens_direct``, one that leaves the shard empty lets the ingest
        push its next event directly (``delivery.rounds.direct``)."""
        queue = runtime.queue
        mark = await self._gate.round_starts((queue, shard))
        result = await self._round(runtime, endpoint, shard)
        left_empty = opens_direct and result is not None and _settled(result)
        self._gate.round_ended((queue, shard), mark, left_empty)
        return result

    async def _round(
        self, runtime: TopicRuntime, endpoint: Endpoint, shard: int
    ) -> RoundResult | None:
        queue = runtime.queue
        try:
            try:
                result = await process_shard(
                    store=self._store,
                    queue=queue,
                    shard=shard,
                    endpoint=self._accounting.metered(endpoint, queue),
                    policy=runtime.policy,
                    delivered=runtime.delivered.setdefault(shard, DeliveredCache()),
                    still_owned=lambda: self._ownership.may_remove(queue, shard),
                    now=time.time(),
                    dead_letter=self._dead_letters.sink(runtime),
                )
            except RoundCutShort as cut:
                # What the round did before the store failed is counted and recorded once;
                # the next round neither pushes nor counts it again.
                self._accounting.round(queue, shard, runtime.endpoint_kind, cut.result)
                raise cut.cause from None
        except (StoreUnavailable, StoreRefused) as exc:
            # Away or overloaded: expected in an outage, and the next round tries again. One
            # line, not a traceback per shard and round; ERROR when a person has to look.
            log.log(
                logging.ERROR if isinstance(exc, StoreRefused) else logging.WARNING,
                "round of %s shard %d: queue store %s: %s",
                queue,
                shard,
                "refused" if isinstance(exc, StoreRefused) else "unavailable",
                exc,
            )
            return None
        except StoreFull:
            # The dir store's disk is full: its removals rewrite batch files. What was
            # delivered is remembered and not pushed again; the next round retries.
            log.warning("round of %s shard %d: the queue store is out of space", queue, shard)
            return None
        except Exception:
            log.exception("round of %s shard %d failed", queue, shard)
            return None
        self._accounting.round(queue, shard, runtime.endpoint_kind, result)
        return result

    def units_of(self, queue: QueueName) -> list[tuple[QueueName, int]]:
        return [u for u in self._loops if u[0] == queue]

    async def wait_loops(self, units: list[tuple[QueueName, int]]) -> None:
        tasks = [self._loops[u] for u in units if u in self._loops]
        for unit in units:
            self.wake(*unit)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self._timings.drain_timeout_s)
            for task in pending:
                # A round stuck on an endpoint: cancelling it before its removals means
                # the next owner sends those entries again (a duplicate, never a loss).
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    async def release(self, queue: QueueName) -> None:
        """End the loops of ``queue``: their rounds finish first (``topics``' ``ShardRunner``)."""
        self._partitions.pop(queue, None)
        self._rescan = True  # changed or gone: a changed Topic's new loops start next
        await self.wait_loops(self.units_of(queue))

    async def before_release(self, partition: int) -> None:
        """Ownership hands ``partition`` back: let its running rounds finish first (they
        stop on their own, as the partition is no longer owned)."""
        units = [
            u
            for u in self._loops
            if partition_of(u[0], u[1], self._ownership.settings.partitions) == partition
        ]
        await self.wait_loops(units)

    async def stop(self) -> None:
        """No more loops; the running ones finish their rounds (their removals) first."""
        self.stopping = True
        await self.wait_loops(list(self._loops))
