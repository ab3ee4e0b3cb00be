"""The lifecycle of a replica's queues, beside their delivery: sweeps and surveys.

- a persistent Topic gets its queue (``create`` is idempotent, so every replica does it);
- a Topic that stops being persistent keeps being delivered from its queue until the queue
  is empty at two sweeps in a row, then the queue is deleted: switching modes loses
  nothing;
- a deleted Topic takes its queue with it (pending events are counted lost, as
  ``radosgw-admin topic rm`` does); so do queues left in the store by Topics deleted while
  no replica ran.
- expired reservations (a writer crashed between reserve and commit) are reclaimed by the
  owner of the queue's shard 0 when its survey finds them.

A survey also sets a queue's length and size gauges (exported only by the owner of its shard
0, so a sum over replicas counts each queue once) and wakes the shards holding entries,
which bounds how long a lost wake-up delays an event.
"""

from __future__ import annotations

import logging
import time
from dataclasses import astuple

from bucketnotify.delivery.model.dead_letters import (
    DEAD_LETTERS_SHARD,
    TALLY_SHARD,
    dead_letter_queue,
    tallies,
    topic_queue_of,
)
from bucketnotify.delivery.model.queue import QueueName, QueueStats, QueueStore
from bucketnotify.delivery.peers.ownership import Ownership
from bucketnotify.delivery.recorded.health import DeliveryHealth
from bucketnotify.delivery.topics.table import ShardRunner, TopicKey, TopicRuntime, TopicTable
from bucketnotify.kube.objects import Kube
from bucketnotify.metrics import DeliveryMetrics

__all__ = ["DRAINED_SWEEPS", "OWN_SURVEY_EVERY", "QueueLifecycle"]

log = logging.getLogger(__name__)

DRAINED_SWEEPS = 2
"""A draining queue is deleted when this many sweeps in a row found it empty."""

OWN_SURVEY_EVERY = 4
"""Every this many surveys a replica also looks at the queues whose shard 0 another owns,
for its own shards (see ``QueueLifecycle.survey``)."""


class QueueLifecycle:
    def __init__(
        self,
        *,
        table: TopicTable,
        store: QueueStore,
        ownership: Ownership,
        metrics: DeliveryMetrics,
        kube: Kube,
        runner: ShardRunner,
        health: DeliveryHealth,
    ) -> None:
        self._table = table
        self._health = health
        self._store = store
        self._ownership = ownership
        self.metrics = metrics
        self._kube = kube
        self._runner = runner
        self._surveys = 0

    async def sweep(self) -> None:
        """Delete drained and orphaned queues."""
        now = time.time()
        self._table.stored = set(await self._store.queues())
        for key, runtime in list(self._table.topics.items()):
            if not self._ownership.owns_shard(runtime.queue, 0):
                continue
            if runtime.draining:
                stats = await self._store.stats(runtime.queue, now)
                if stats.entries or stats.reservations:
                    runtime.empty_sweeps = 0
                    continue
                # Empty twice in a row, a sweep interval apart: another replica that had
                # not seen the change yet (it lists the Topics every few seconds) may still
                # have been committing to it at the first look, and an S3 store's commit
                # far below the bounds leaves no reservation marker to see.
                runtime.empty_sweeps += 1
                if runtime.empty_sweeps >= DRAINED_SWEEPS:
                    await self._table.retire(key, reason="its Topic is no longer persistent")
        # Queues of Topics deleted while no replica was running, and their dead letters. A
        # Topic that is no longer persistent keeps its dead letters (to redrive or purge).
        orphans = {
            topic_queue_of(q) or q for q in self._table.stored if self._table.in_scope(q.namespace)
        }
        for queue in orphans:
            if (queue.namespace, queue.topic) in self._table.topics:
                continue
            if await self._kube.get_object("topics", queue.namespace, queue.topic) is None:
                await self._table.retire(
                    (queue.namespace, queue.topic), reason="its Topic is gone", dead_letters=True
                )

    async def survey(self) -> None:
        """Look at each queue whose shard 0 this replica owns, once, all together
        (``QueueStore.glance_many``: one listing per namespace on the S3 store, not a LIST
        per queue): set its gauges, reclaim expired reservations, wake the shards holding
        entries (a wake-up may have been lost). Drop the gauges of the other queues (their
        owner exports them). Queues where it owns other shards only it looks at every
        ``OWN_SURVEY_EVERY`` surveys, for its own shards: a wake-up from the shard-0 owner
        can be lost too (a network policy that keeps the replicas apart)."""
        self.metrics.partitions_owned.labels(self._ownership.identity).set(
            len(self._ownership.owned())
        )
        self._surveys += 1
        own_turn = self._surveys % OWN_SURVEY_EVERY == 0
        looked: list[tuple[TopicKey, TopicRuntime, bool]] = []
        wanted: list[QueueName] = []
        for key, runtime in list(self._table.topics.items()):
            queue = runtime.queue
            lead = self._ownership.owns_shard(queue, 0)
            if not lead:
                self.metrics.drop_queue_stats(*key)
                owned = any(self._ownership.owns_shard(queue, s) for s in range(runtime.shards))
                if not (own_turn and owned):
                    continue
            looked.append((key, runtime, lead))
            wanted.append(queue)
            if lead and self._keeps_dead_letters(runtime):
                wanted.append(dead_letter_queue(queue))
        if not looked:
            return
        now = time.time()
        glanced = await self._store.glance_many(wanted, now)
        for key, runtime, lead in looked:
            queue = runtime.queue
            stats = glanced[queue]
            for shard, held in stats.shards.items():
                if held.entries:
                    if lead:
                        self._runner.wake(queue, shard)
                    elif self._ownership.owns_shard(queue, shard):
                        self._runner.wake_local(queue, shard)
            if not lead:
                continue
            self.metrics.set_queue_stats(*key, stats.entries, stats.bytes)
            dead_letters = await self._dead_letters(
                queue, glanced.get(dead_letter_queue(queue)), now
            )
            self._health.backlog(queue, stats.entries, stats.bytes, now, dead_letters)
            if stats.expired:
                reclaimed = await self._store.reclaim(queue, now)
                if reclaimed:
                    log.warning("%s: reclaimed %d abandoned reservations", queue, reclaimed)

    def _keeps_dead_letters(self, runtime: TopicRuntime) -> bool:
        """Whether the Topic has a dead-letter queue to look at: it keeps dead letters, or
        kept some before (to redrive or purge)."""
        return bool(runtime.kept_dead_letters) or dead_letter_queue(runtime.queue) in (
            self._table.stored
        )

    async def _dead_letters(
        self, queue: QueueName, stats: QueueStats | None, now: float
    ) -> int | None:
        """How many dead letters ``queue``'s Topic keeps (its gauges set) from their
        queue's ``stats``; None when it has no dead-letter queue."""
        if stats is None:
            self.metrics.drop_dead_letter_stats(queue.namespace, queue.topic)
            return None
        kept = dead_letter_queue(queue)
        held = stats.shards.get(DEAD_LETTERS_SHARD)
        entries, size = (held.entries, held.bytes) if held else (0, 0)
        self.metrics.set_dead_letter_stats(queue.namespace, queue.topic, entries, size)
        if stats.expired:
            await self._store.reclaim(kept, now)
        counted = stats.shards.get(TALLY_SHARD)
        if counted is not None and counted.entries:
            await self._count_tallies(queue, kept)
        return entries

    async def _count_tallies(self, queue: QueueName, kept: QueueName) -> None:
        """What the admin CLI redrove and purged, into this replica's counters; removed
        once counted (a crash in between counts them twice: a metric, not an event)."""
        found = await self._store.list(kept, TALLY_SHARD, 1024)
        for what, amount in tallies(found).items():
            if what == "redriven":
                self.metrics.dead_letters_redriven.labels(*astuple(queue)).inc(amount)
            elif what == "purged":
                self.metrics.dead_letters_purged.labels(*astuple(queue)).inc(amount)
        await self._store.remove(kept, TALLY_SHARD, [e.id for e in found])
