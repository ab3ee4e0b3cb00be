"""A Topic's dead-letter Topic: where its dropped events (past ``timeToLive`` or
``maxRetries``) are committed before they leave its queue, each to the shard of its object
(``delivery.model.event``), by the rounds and the direct pushes alike."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Protocol

from bucketnotify.delivery.model.event import event_shard
from bucketnotify.delivery.model.queue import Entry, QueueName
from bucketnotify.delivery.rounds.worker import DeadLetterSink
from bucketnotify.delivery.topics.ingest_tokens import TopicKey
from bucketnotify.delivery.topics.table import TopicRuntime

__all__ = ["DeadLetters", "QueueCommitter"]


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

    def __init__(self, topics: Mapping[TopicKey, TopicRuntime]) -> None:
        self._topics = topics
        self.committer: QueueCommitter | None = None
        """Set by the service once the ingest exists (the ingest's direct pushes need the
        rounds, and so these sinks, first)."""

    def sink(self, runtime: TopicRuntime) -> DeadLetterSink | None:
        """Where the dropped events of ``runtime`` go; None without a dead-letter Topic."""
        if runtime.dead_letter is None:
            return None
        key = (runtime.queue.namespace, runtime.dead_letter)

        async def sink(entries: Sequence[Entry]) -> None:
            target = self._topics.get(key)
            if target is None or target.draining:
                raise LookupError(f"{key[0]}/{key[1]} is not a persistent Topic")
            if self.committer is None:
                raise LookupError("the ingest does not take commits yet")
            by_shard: dict[int, list[tuple[str, bytes]]] = {}
            for entry in entries:
                shard = event_shard(json.loads(entry.body), target.shards)
                by_shard.setdefault(shard, []).append((entry.event_id, entry.body))
            await self.committer.commit(target.queue, by_shard)

        return sink
