"""Where a Topic's dropped events (past ``timeToLive`` or ``maxRetries``, or refused for
good) go before they leave its queue, for the rounds and the direct pushes alike:

- its dead-letter Topic's queue, each to the shard of its object (``delivery.model.event``);
- its own dead-letter queue in the store (``spec.delivery.deadLetters.keep``), with why it
  was dropped (``delivery.model.dead_letters``). That queue has bounds of its own: a drop
  past them is discarded, and that is never silent (counted, logged once per episode, and
  in the Topic's status by way of the health report).

A sink that raises took nothing: the round keeps the events queued and offers them again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from bucketnotify.delivery.model.dead_letters import SHARDS, DeadLetter, append, dead_letter_queue
from bucketnotify.delivery.model.event import event_shard
from bucketnotify.delivery.model.outcomes import EventOutcome
from bucketnotify.delivery.model.queue import QueueFull, QueueName, QueueNotFound, QueueStore
from bucketnotify.delivery.recorded.health import DeliveryHealth
from bucketnotify.delivery.rounds.worker import DeadLetterSink
from bucketnotify.delivery.topics.ingest_tokens import TopicKey
from bucketnotify.delivery.topics.table import TopicRuntime
from bucketnotify.metrics import DeliveryMetrics

__all__ = ["DeadLetters", "QueueCommitter"]

log = logging.getLogger(__name__)


class QueueCommitter(Protocol):
    """Commits events to a queue, all shards or none, in order with the direct pushes and
    together with concurrent commits: what the ingest does for the gateway's requests
    (``delivery.ingest``'s ``Ingest`` implements it), the one call from the rounds to the
    room above them."""

    async def commit(
        self, queue: QueueName, by_shard: dict[int, list[tuple[str, bytes]]]
    ) -> float: ...


class DeadLetters:
    """The dead-letter sinks of the Topics served."""

    def __init__(
        self,
        topics: Mapping[TopicKey, TopicRuntime],
        store: QueueStore,
        metrics: DeliveryMetrics,
        health: DeliveryHealth,
    ) -> None:
        self._topics = topics
        self._store = store
        self._metrics = metrics
        self._health = health
        self._full: dict[QueueName, float] = {}
        """Dead-letter queues that discarded a drop and have not kept one since, with when
        (monotonic) the discard was said."""
        self.committer: QueueCommitter | None = None
        """Set by the service once the ingest exists (the ingest's direct pushes need the
        rounds, and so these sinks, first)."""

    def sink(self, runtime: TopicRuntime) -> DeadLetterSink | None:
        """Where the dropped events of ``runtime`` go; None when they are lost."""
        if runtime.dead_letter is None and runtime.kept_dead_letters is None:
            return None

        async def sink(drops: Sequence[EventOutcome]) -> set[str]:
            if runtime.dead_letter is not None:
                await self._to_topic(runtime, runtime.dead_letter, drops)
            if runtime.kept_dead_letters is None:
                return set()
            discarded = await self._keep(runtime, drops)
            # Also handed to a dead-letter Topic: not lost, whatever the store kept.
            return set() if runtime.dead_letter is not None else discarded

        return sink

    async def _to_topic(
        self, runtime: TopicRuntime, name: str, drops: Sequence[EventOutcome]
    ) -> None:
        key = (runtime.queue.namespace, name)
        target = self._topics.get(key)
        if target is None or target.draining:
            raise LookupError(f"{key[0]}/{key[1]} is not a persistent Topic")
        if self.committer is None:
            raise LookupError("the ingest does not take commits yet")
        by_shard: dict[int, list[tuple[str, bytes]]] = {}
        for drop in drops:
            entry = drop.entry
            shard = event_shard(json.loads(entry.body), target.shards)
            by_shard.setdefault(shard, []).append((entry.event_id, entry.body))
        await self.committer.commit(target.queue, by_shard)

    async def _keep(self, runtime: TopicRuntime, drops: Sequence[EventOutcome]) -> set[str]:
        """Commit the drops to the Topic's dead-letter queue; the entry ids of those its
        bounds had no room for."""
        assert runtime.kept_dead_letters is not None
        started = time.monotonic()
        queue = dead_letter_queue(runtime.queue)
        letters = [(d.entry.id, d.entry.event_id, DeadLetter.of(d).encode()) for d in drops]
        try:
            await self._commit(queue, letters)
            discarded: list[str] = []
        except QueueNotFound:
            # Not made yet by this replica (the Topic's settings changed while another
            # served it): made now, with its bounds.
            await self._store.create(queue, SHARDS, runtime.kept_dead_letters)
            discarded = await self._one_by_one(queue, letters)
        except QueueFull:
            discarded = await self._one_by_one(queue, letters)
        kept = len(letters) - len(discarded)
        namespace, topic = runtime.queue.namespace, runtime.queue.topic
        if kept:
            self._metrics.dead_letters_kept.labels(namespace, topic).inc(kept)
        if discarded:
            self._metrics.dead_letters_discarded.labels(namespace, topic).inc(len(discarded))
            self._health.dead_letters_discarded(runtime.queue, time.time())
            if queue not in self._full:
                self._full[queue] = time.monotonic()
                limits = runtime.kept_dead_letters
                log.warning(
                    "%s: dead letters discarded: the kept ones reached their bounds"
                    " (spec.delivery.deadLetters maxEntries %d, maxBytes %d); purge or"
                    " redrive them (bucketnotify dead-letters), or raise the bounds;"
                    " said once until one is kept again",
                    runtime.queue,
                    limits.max_entries,
                    limits.max_bytes,
                )
        elif kept and self._full.get(queue, started) < started:
            # Only a keep that began after the discard was said ends the episode: shards
            # keep and discard at once, and one that reserved its room first may finish
            # after another shard found none.
            del self._full[queue]
        return set(discarded)

    async def _commit(self, queue: QueueName, letters: Sequence[tuple[str, str, bytes]]) -> None:
        await append(self._store, queue, 0, [(event_id, body) for _, event_id, body in letters])

    async def _one_by_one(
        self, queue: QueueName, letters: Sequence[tuple[str, str, bytes]]
    ) -> list[str]:
        """Each that fits: a full dead-letter queue still takes the small ones."""
        discarded = []
        for letter in letters:
            try:
                await self._commit(queue, [letter])
            except QueueFull:
                discarded.append(letter[0])
        return discarded
