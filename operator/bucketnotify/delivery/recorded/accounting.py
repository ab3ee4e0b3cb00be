"""What a round or a direct push did, made visible: counted (``bucketnotify.metrics``),
recorded (``delivery_records``), announced as Kubernetes Events (``kube_events``) and
logged, with one WARNING per event lost.

The rounds (``delivery.rounds.shard_loops``) and the direct pushes
(``delivery.rounds.direct_push``) both report here, so a push counts the same whichever
path made it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from bucketnotify.delivery.endpoints.base import Endpoint
from bucketnotify.delivery.model.event import object_of
from bucketnotify.delivery.model.outcomes import RoundResult
from bucketnotify.delivery.model.push import Delivery, PushOutcome
from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.recorded.delivery_records import Recorder
from bucketnotify.delivery.recorded.health import DeliveryHealth
from bucketnotify.delivery.recorded.kube_events import TopicEvents
from bucketnotify.metrics import DeliveryMetrics
from bucketnotify.records import Outcome

__all__ = ["LOST_NAMED", "Accounting", "Metered", "log_lost"]

log = logging.getLogger(__name__)

LOST_NAMED = 10
"""Lost events named one by one, up to this many per round; a TTL that expires a backlog
must not flood the log."""


class Metered:
    """An endpoint that counts its pushes in flight and times its push waves."""

    def __init__(self, endpoint: Endpoint, metrics: DeliveryMetrics, queue: QueueName) -> None:
        self._endpoint = endpoint
        self._pending = metrics.push_pending.labels(queue.namespace, queue.topic)
        self._seconds = metrics.push_seconds.labels(queue.namespace, queue.topic)

    async def send(self, batch: Sequence[Delivery]) -> list[PushOutcome]:
        self._pending.inc(len(batch))
        started = time.perf_counter()
        try:
            return await self._endpoint.send(batch)
        finally:
            self._pending.dec(len(batch))
            took = time.perf_counter() - started
            for _ in batch:
                self._seconds.observe(took)

    async def aclose(self) -> None:
        await self._endpoint.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Accounting:
    """Counts, records, announces and logs the results of rounds and direct pushes."""

    def __init__(
        self,
        metrics: DeliveryMetrics,
        events: TopicEvents,
        recorder: Recorder | None,
        health: DeliveryHealth | None = None,
    ) -> None:
        self.metrics = metrics
        self.events = events
        self.health = health if health is not None else DeliveryHealth()
        """What the replica's health report says of each Topic (``recorded.health``)."""
        self._recorder = recorder
        """Delivery records of every round (never raises)."""

    def metered(self, endpoint: Endpoint, queue: QueueName) -> Metered:
        return Metered(endpoint, self.metrics, queue)

    def record(
        self, queue: QueueName, shard: int, endpoint_kind: str | None, result: RoundResult
    ) -> None:
        if self._recorder is not None and result.outcomes:
            self._recorder.round(queue, shard, endpoint_kind, result)

    def round(
        self, queue: QueueName, shard: int, endpoint_kind: str | None, result: RoundResult
    ) -> None:
        """Count, record, announce and log what one round did."""
        self.count(queue, result)
        self.events.round_done(queue, result)
        self.health.round_done(queue, shard, result)
        self.record(queue, shard, endpoint_kind, result)
        if (
            result.delivered
            or result.failed
            or result.expired
            or result.dead_lettered
            or result.duplicates
        ):
            # A loss is never routine: WARNING, so that it shows where INFO is filtered out.
            # A round that only delivered is: DEBUG (under load there is one per commit; the
            # metrics and delivery records count them).
            unusual = (
                result.failed or result.dead_lettered or result.duplicates or not result.drops_stand
            )
            log.log(
                logging.WARNING
                if result.expired and result.drops_stand
                else logging.INFO
                if unusual or result.expired
                else logging.DEBUG,
                "%s shard %d: delivered %d failed %d lost %d dead-lettered %d duplicates %d%s%s",
                queue,
                shard,
                result.delivered,
                result.failed,
                result.expired,
                result.dead_lettered,
                result.duplicates,
                " (fenced)" if result.fenced else " (cut short)" if result.cut_short else "",
                f"; first error: {result.errors[0]}" if result.errors else "",
            )
        if result.drops_stand:
            log_lost(queue, shard, result)

    def direct(
        self, queue: QueueName, shard: int, endpoint_kind: str | None, result: RoundResult
    ) -> None:
        """Count, record, announce and log one direct push (a round of one event)."""
        self.count(queue, result)
        self.events.round_done(queue, result)
        self.health.pushed(queue, result)
        self.record(queue, shard, endpoint_kind, result)
        if result.delivered or result.duplicates:
            self.metrics.events_direct.labels(queue.namespace, queue.topic).inc()
        if result.expired:
            log_lost(queue, shard, result)
        if result.failed:
            log.info(
                "%s shard %d: direct push failed, queueing the event: %s",
                queue,
                shard,
                result.errors[0] if result.errors else "no acknowledgement",
            )

    def count(self, queue: QueueName, result: RoundResult) -> None:
        # Only what is not zero: a round is often one event, and every labels() lookup costs
        # (the series exist from add_topic on, at 0).
        m, labels = self.metrics, (queue.namespace, queue.topic)
        counts = [
            (m.push_ok, result.delivered),
            (m.push_failed, result.failed + result.rejected),
        ]
        if result.drops_stand:  # nothing was dropped, removed or written back otherwise
            counts += [
                (m.push_retries, result.retried),
                (m.event_lost, result.expired),
                (m.event_dead_lettered, result.dead_lettered),
                (m.duplicates, result.duplicates),
            ]
        for counter, count in counts:
            if count:
                counter.labels(*labels).inc(count)
        if result.latencies:
            latency = m.delivery_latency_seconds.labels(*labels)
            for seconds in result.latencies:
                latency.observe(seconds)


def log_lost(queue: QueueName, shard: int, result: RoundResult) -> None:
    """One WARNING per event lost this round: its bucket, key (escaped: a key may hold any
    character, a newline included) and why."""
    lost = [o for o in result.outcomes if o.outcome in (Outcome.EXPIRED, Outcome.REJECTED)]
    for outcome in lost[:LOST_NAMED]:
        bucket, key = object_of(outcome.record)
        log.warning(
            "%s shard %d: event lost, bucket %r key %r (%s after %d attempts): %s",
            queue,
            shard,
            bucket,
            key,
            outcome.outcome,
            outcome.attempts,
            outcome.error or "no reason recorded",
        )
    if len(lost) > LOST_NAMED:
        log.warning(
            "%s shard %d: %d more events lost this round", queue, shard, len(lost) - LOST_NAMED
        )
