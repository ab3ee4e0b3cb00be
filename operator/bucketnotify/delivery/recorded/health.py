"""What this replica knows of each Topic's delivery, for its health report
(``bucketnotify.delivery_health``): the rounds and direct pushes tell it how pushes went
and what each shard's round left, the survey of a queue's shard 0 owner tells it the
backlog. Kept in memory only: a replica that starts knows nothing yet, and its report says
so by leaving the figures out."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bucketnotify.delivery.model.outcomes import RoundResult
from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery_health import (
    REASON_MAX,
    Backlog,
    Report,
    ShardHealth,
    TopicHealth,
    partition_of,
)
from bucketnotify.logs import redact

__all__ = ["DeliveryHealth"]


@dataclass
class _Topic:
    last_success: float | None = None
    last_failure: float | None = None
    failure: str | None = None
    failing_since: float | None = None
    shards: dict[int, ShardHealth] = field(default_factory=dict)
    backlog: Backlog | None = None
    dead_letters_discarded: float | None = None


class DeliveryHealth:
    """Per Topic: the last success, the last failure, since when pushes fail, what each
    shard's last round left, the backlog of the last survey."""

    def __init__(self) -> None:
        self._topics: dict[str, _Topic] = {}

    def _topic(self, queue: QueueName) -> _Topic:
        return self._topics.setdefault(str(queue), _Topic())

    def round_done(self, queue: QueueName, shard: int, result: RoundResult) -> None:
        """After a round of ``shard`` (``left`` and ``oldest_left`` say what it left)."""
        self.pushed(queue, result)
        if not result.fenced:
            self._topic(queue).shards[shard] = ShardHealth(
                oldest=result.oldest_left, waiting=result.left
            )

    def pushed(self, queue: QueueName, result: RoundResult) -> None:
        """After pushes (a round's, or one direct push)."""
        now = time.time()
        topic = self._topic(queue)
        if result.delivered:
            topic.last_success = now
            if not result.failed:
                topic.failing_since = None
        if result.failed:
            topic.last_failure = now
            error = result.errors[0] if result.errors else "no acknowledgement"
            topic.failure = _short(redact(error))
            if topic.failing_since is None and not result.delivered:
                topic.failing_since = now

    def backlog(
        self,
        queue: QueueName,
        events: int,
        size: int,
        at: float,
        dead_letters: int | None = None,
    ) -> None:
        """The survey of the queue (by the owner of its shard 0), and of its dead-letter
        queue if it has one."""
        self._topic(queue).backlog = Backlog(
            events=events, bytes=size, at=at, dead_letters=dead_letters
        )

    def dead_letters_discarded(self, queue: QueueName, at: float) -> None:
        """A dead letter found no room in the Topic's dead-letter queue."""
        self._topic(queue).dead_letters_discarded = at

    def forget(self, queue: QueueName) -> None:
        self._topics.pop(str(queue), None)

    def report(
        self,
        *,
        replica: str,
        interval: float,
        partitions: int,
        owned: set[int],
        now: float,
    ) -> Report:
        """The report of this replica now: shards it no longer owns and backlogs of queues
        whose shard 0 it no longer owns are left out (their new owner speaks for them)."""
        topics: dict[str, TopicHealth] = {}
        for key, topic in self._topics.items():
            namespace, _, name = key.partition("/")
            for shard in [
                s for s in topic.shards if partition_of(namespace, name, s, partitions) not in owned
            ]:
                del topic.shards[shard]
            if partition_of(namespace, name, 0, partitions) not in owned:
                topic.backlog = None
            topics[key] = TopicHealth(
                last_success=topic.last_success,
                last_failure=topic.last_failure,
                failure=topic.failure,
                failing_since=topic.failing_since,
                shards=dict(topic.shards),
                backlog=topic.backlog,
                dead_letters_discarded=topic.dead_letters_discarded,
            )
        return Report(
            replica=replica,
            updated=now,
            interval=interval,
            partitions=partitions,
            owned=sorted(owned),
            topics=topics,
        )


def _short(text: str) -> str:
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 1] + "…"
