"""The direct pushes of ``delivery.rounds.direct``: an event for an empty shard pushed by the ingest
itself, judged as a round would judge it (``delivery.model.outcomes``) and counted where the rounds
count theirs (``delivery.recorded.accounting``). A push that failed leaves the event to be queued;
``queued`` then counts that push as the event's first attempt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bucketnotify.delivery.model.delivered_ids import DeliveredCache
from bucketnotify.delivery.model.outcomes import (
    EventOutcome,
    RoundResult,
    dropped,
    judge,
    not_dropped,
)
from bucketnotify.delivery.model.push import Delivery
from bucketnotify.delivery.model.queue import Entry, QueueName, QueueStore
from bucketnotify.delivery.recorded.accounting import Accounting
from bucketnotify.delivery.rounds.dead_letters import DeadLetters
from bucketnotify.delivery.rounds.direct import ShardGate
from bucketnotify.delivery.rounds.worker import ERROR_KEPT, LIST_BATCH
from bucketnotify.delivery.topics.table import TopicKey, TopicRuntime
from bucketnotify.records import Outcome

__all__ = ["DirectPusher"]

log = logging.getLogger(__name__)


class DirectPusher:
    """Pushes an event for an empty shard itself, judging the push as a round would
    (``outcomes.judge``), and counts it where the rounds count theirs (``Accounting``)."""

    def __init__(
        self,
        *,
        topics: dict[TopicKey, TopicRuntime],
        store: QueueStore,
        accounting: Accounting,
        gate: ShardGate,
        allowed: Callable[[QueueName, int], bool],
        dead_letters: DeadLetters,
        save_soon: Callable[[TopicRuntime, int, DeliveredCache], None],
    ) -> None:
        self._topics = topics
        self._store = store
        self._accounting = accounting
        self.gate = gate
        self.allowed = allowed
        self._dead_letters = dead_letters
        self._save_soon = save_soon
        self._direct_failed: dict[tuple[QueueName, int, str], EventOutcome] = {}
        """Failed direct pushes of events being committed, recorded once they are."""

    async def push(
        self,
        queue: QueueName,
        shard: int,
        record: dict[str, Any],
        event_id: str,
        body: bytes,
        ingest_time: float,
    ) -> bool:
        runtime = self._topics.get((queue.namespace, queue.topic))
        if runtime is None or runtime.queue != queue or runtime.endpoint is None:
            return False
        delivered = runtime.delivered.setdefault(shard, DeliveredCache())
        entry = Entry(id=event_id, event_id=event_id, body=body, ingest_time=ingest_time)
        result = RoundResult(listed=1)
        if event_id in delivered:
            # The gateway sent it again (or retried a request it had no answer to).
            result.duplicates = 1
            result.outcomes.append(EventOutcome(Outcome.DUPLICATE, entry, record, 0, time.time()))
        else:
            endpoint = self._accounting.metered(runtime.endpoint, queue)
            (outcome,) = await endpoint.send([Delivery(entry.id, record, body)])
            verdict = judge(entry, record, outcome, time.time())
            if verdict.outcome is Outcome.DELIVERED:
                result.delivered = 1
                result.latencies.append(verdict.at - ingest_time)
                delivered.add(event_id)
                result.outcomes.append(verdict)
                self._save_soon(runtime, shard, delivered)
            elif verdict.outcome is Outcome.FAILED or not await self._drop(
                runtime, verdict, result
            ):
                # Recorded once it is queued (``queued``), with the ingest time it gets there.
                result.failed = 1
                if verdict.error:
                    result.errors.append(verdict.error)
                failed = not_dropped(verdict)
                if failed is not None:
                    self._direct_failed[(queue, shard, event_id)] = failed
        self._accounting.direct(queue, shard, runtime.endpoint_kind, result)
        return not result.failed

    async def _drop(
        self, runtime: TopicRuntime, refused: EventOutcome, result: RoundResult
    ) -> bool:
        """A direct push that retrying cannot help: the event goes to the dead-letter topic,
        or is lost, as a round would drop it; False when the dead-letter topic refuses it
        (then it is queued, and the rounds offer it again)."""
        sink = self._dead_letters.sink(runtime)
        taken = sink is not None
        if sink is None:
            result.expired = 1
        else:
            try:
                taken = refused.entry.id not in await sink([refused])
            except Exception as exc:
                log.warning(
                    "%s: the dead letters refused an undeliverable event, queueing it: %s",
                    runtime.queue,
                    exc,
                )
                return False
            result.dead_lettered, result.expired = (1, 0) if taken else (0, 1)
        result.rejected = 1
        if refused.error:
            result.errors.append(refused.error)
        outcome = dropped(refused, dead_lettered=taken)
        result.outcomes.append(replace(outcome, at=time.time()))
        return True

    async def queued(self, queue: QueueName, shard: int, event_id: str, committed: bool) -> None:
        failed = self._direct_failed.pop((queue, shard, event_id), None)
        runtime = self._topics.get((queue.namespace, queue.topic))
        if failed is None or not committed or runtime is None or runtime.queue != queue:
            return  # no push was made (no endpoint), or nothing was queued
        try:
            entries = await self._store.list(queue, shard, LIST_BATCH)
            found = [e for e in entries if e.event_id == event_id and not e.attempts]
            if not found:
                return
            # As a round would have written it back: maxRetries and the retry delay count
            # the direct push.
            entry = replace(
                found[-1],
                attempts=1,
                not_before=time.time() + runtime.policy.retry_delay(1),
                first_failure=failed.at,
                last_failure=failed.at,
                last_error=(failed.error or "")[:ERROR_KEPT],
            )
            await self._store.update(queue, shard, [entry])
            self._accounting.metrics.push_retries.labels(queue.namespace, queue.topic).inc()
        except Exception as exc:
            log.warning(
                "%s shard %d: the failed direct push of a queued event is not counted as an"
                " attempt (it gets one more): %s",
                queue,
                shard,
                exc,
            )
            return
        # Dated when queued: a record's outcome never comes before its ingest time.
        queued = replace(failed, entry=entry, at=max(failed.at, entry.ingest_time))
        self._accounting.record(queue, shard, runtime.endpoint_kind, RoundResult(outcomes=[queued]))
