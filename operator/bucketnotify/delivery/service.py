"""The delivery service process: ingest, queue processing and Lease ownership together.

The parts, each in its own module, wired here:

- ``delivery.topic_table``: the Topics served, their queues and endpoints (and
  ``delivery.ingest_tokens``, the tokens the ingest checks);
- ``delivery.ingest``: the gateway's pushes committed to the queues;
- the shard loops: here;
- ``delivery.lifecycle``: the queues' sweeps and surveys;
- ``delivery.direct`` and ``delivery.direct_push``: an event for an empty shard pushed
  before the ingest answers; ``delivery.forwarding``: a request for another replica's
  shard handed to that owner;
- ``delivery.delivered``: the delivered identities kept for a shard's next owner;
- ``delivery.accounting``: every round and direct push counted, recorded, announced, logged;
- ``delivery.ownership``: the Leases that say which replica runs which shard.

Processing: one task per owned (queue, shard). A shard whose round left entries behind (a
failed push, a retry time not reached) is polled again after ``round_interval_s``, backing
off to ``idle_max_s`` while its entries all wait for a retry; one found empty, or whose
round delivered everything it listed, is not polled at all (every poll of the S3 store is a
LIST request, and hundreds of idle shards would keep the gateway busy): it waits to be
woken. An ingest commit wakes the shard's task at once, on this replica directly and on the
replica owning the shard by a wake-up request (``delivery.wakeups``). A shard just taken is
polled for ``HANDOVER_POLL_ROUNDS`` renew intervals first, while the other replicas may
still wake its previous holder. A lost wake-up is caught by the survey: every
``stats_interval_s`` the owner of a queue's shard 0 looks at the whole queue (one LIST on
the S3 store) and wakes every shard holding entries; every ``OWN_SURVEY_EVERY`` surveys each
replica also looks at the queues where it owns other shards, in case its peers cannot reach
it. So an event waits for its owner no longer than a wake-up takes, at worst
``stats_interval_s``, and ``OWN_SURVEY_EVERY`` times that when the replicas cannot reach
each other.

Metrics, delivery records and Kubernetes Events: see ``delivery.accounting``; a queue's
length and size come from the survey every ``stats_interval_s`` and are exported only by the
owner of its shard 0, so a sum over replicas counts each queue once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from bucketnotify.apiserver import ApiClient, log_retried
from bucketnotify.delivery.accounting import Accounting
from bucketnotify.delivery.delivered import DeliveredIds, woken
from bucketnotify.delivery.direct import ShardGate
from bucketnotify.delivery.direct_push import DirectPusher
from bucketnotify.delivery.endpoints.base import Endpoint, object_of
from bucketnotify.delivery.events import COMPONENT, TopicEvents
from bucketnotify.delivery.forwarding import Forwarder
from bucketnotify.delivery.ingest import Ingest, IngestTopic, build_app
from bucketnotify.delivery.lifecycle import QueueLifecycle
from bucketnotify.delivery.outcomes import RoundResult
from bucketnotify.delivery.ownership import Ownership, partition_of
from bucketnotify.delivery.queue import (
    Entry,
    QueueLimits,
    QueueName,
    QueueStore,
    StoreFull,
    StoreRefused,
    StoreUnavailable,
    shard_of,
)
from bucketnotify.delivery.recording import Recorder
from bucketnotify.delivery.topic_table import TopicKey, TopicRuntime, TopicTable
from bucketnotify.delivery.wakeups import WAKE_PATH, WakeUps, parse_wake
from bucketnotify.delivery.worker import (
    LIST_BATCH,
    DeadLetterSink,
    DeliveredCache,
    RoundCutShort,
    process_shard,
)
from bucketnotify.event_recorder import EventRecorder
from bucketnotify.metrics import DeliveryMetrics

__all__ = ["DeliveryService", "ServiceTimings", "TopicRuntime"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceTimings:
    refresh_interval_s: float = 3.0
    """How often the persistent Topics are listed."""
    secret_refresh_s: float = 30.0
    """How often the Secrets of a known, unchanged Topic are read again."""
    token_overlap_s: float = 600.0
    """How long a replaced ingest token is still taken: the gateway pushes with it until the
    operator has rewritten the gateway topic (seconds, or longer while the operator is
    down)."""
    round_interval_s: float = 0.2
    """Poll interval of a shard that had work."""
    idle_max_s: float = 1.0
    """Longest poll interval of a shard whose entries all wait for their retry time (an
    empty shard is not polled: it is woken)."""
    sweep_interval_s: float = 30.0
    """How often orphaned or drained queues are deleted."""
    reservation_timeout_s: float = QueueLimits.reservation_timeout_s
    """A reservation not committed for this long (its writer died) is reclaimed."""
    drain_timeout_s: float = 3.0
    """How long a hand-back or a shutdown waits for running rounds to finish. A hand-back
    waits inside the Lease round, so this must stay below renew deadline - renew interval
    (8 - 3 s by default), or the replica would fence itself meanwhile."""
    stats_interval_s: float = 30.0
    """How often the owner of a queue's shard 0 surveys the queue (one LIST on the S3
    store): the length and size gauges, expired reservations reclaimed, and shards with
    entries woken, which bounds how long a lost wake-up delays an event."""


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
wakes the previous holder, or nobody."""


class DeliveryService:
    def __init__(
        self,
        *,
        api: ApiClient,
        store: QueueStore,
        ownership: Ownership,
        namespaces: list[str],
        timings: ServiceTimings = ServiceTimings(),
        metrics: DeliveryMetrics | None = None,
        recorder: Recorder | None = None,
        events: TopicEvents | None = None,
        allow_cleartext_secrets: bool = False,
        direct: bool = False,
    ) -> None:
        self.metrics = metrics if metrics is not None else DeliveryMetrics()
        self._store = store
        self._ownership = ownership
        ownership.before_release = self.before_release
        self.timings = timings
        self.events = events or TopicEvents(
            EventRecorder(api, component=COMPONENT, instance=ownership.identity)
        )
        """Kubernetes Events on the Topics (delivery.events)."""
        self.accounting = Accounting(self.metrics, self.events, recorder)
        self.table = TopicTable(
            api=api,
            store=store,
            namespaces=namespaces,
            metrics=self.metrics,
            events=self.events,
            release=lambda queue: self._wait_loops(self._units_of(queue)),
            secret_refresh_s=timings.secret_refresh_s,
            token_overlap_s=timings.token_overlap_s,
            reservation_timeout_s=timings.reservation_timeout_s,
            allow_cleartext_secrets=allow_cleartext_secrets,
        )
        self.topics = self.table.topics
        self.ingest_topics = self.table.ingest_topics
        self._loops: dict[tuple[QueueName, int], asyncio.Task[None]] = {}
        self._wakes: dict[tuple[QueueName, int], asyncio.Event] = {}
        self._stopping = False
        self._loaded = False
        """The Topic table was read once: until then each request costs an API call."""
        self._stop: asyncio.Event | None = None
        self._wakeups = WakeUps(ownership.owner_address, self.metrics)
        self.gate = ShardGate()
        """Order between the ingest's direct pushes, commits and rounds (``direct``)."""
        self.delivered = DeliveredIds(store)
        self.lifecycle = QueueLifecycle(
            table=self.table,
            store=store,
            ownership=ownership,
            metrics=self.metrics,
            kube=self.table.kube,
            wake=self._wake,
            wake_local=self._wake_local,
        )
        self.direct = DirectPusher(
            topics=self.topics,
            store=store,
            accounting=self.accounting,
            gate=self.gate,
            allowed=self.allowed,
            dead_letter_sink=self._dead_letter_sink,
            save_soon=self.delivered.save_soon,
        )
        self.forwarder = Forwarder(ownership.owner_address, self.metrics) if direct else None
        self.ingest = Ingest(
            store,
            self.ingest_topics,
            self.table.resolve,
            # With direct delivery, other owners are told before the answer (tell_owners).
            self._wake_local if direct else self._wake,
            self.metrics,
            recorder,
            recheck=self.table.tokens.recheck,
            direct=self.direct if direct else None,
            forwarder=self.forwarder,
            tell_owners=self._tell_owners if direct else None,
        )

    async def refresh(self) -> None:
        """Bring the Topic table in line with the Topics that exist now."""
        await self.table.refresh()

    async def resolve(self, namespace: str, name: str) -> IngestTopic | None:
        """Look up one Topic now (it may have become Ready since the last refresh)."""
        return await self.table.resolve(namespace, name)

    async def recheck_token(
        self, namespace: str, name: str, since: float | None = None
    ) -> IngestTopic | None:
        """See ``IngestTokens.recheck``."""
        return await self.table.tokens.recheck(namespace, name, since)

    def app(self) -> web.Application:
        app = build_app(self.ingest, self.unready)
        app.middlewares.append(self.events.ingest_middleware)
        app.router.add_post(WAKE_PATH, self._on_wake)
        return app

    async def _on_wake(self, request: web.Request) -> web.Response:
        """Another replica committed to shards this one may own (``delivery.wakeups``)."""
        try:
            shards = parse_wake(await request.json())
        except ValueError:
            shards = None
        if shards is None:
            return web.Response(status=400, text='expected {"shards": [[namespace, topic, n]]}')
        self.metrics.wakeups_received.inc(len(shards))
        for queue, shard in shards:
            # Entries this replica did not commit: no direct push before a round took them.
            self.gate.committed_elsewhere((queue, shard))
            self._wake_local(queue, shard)
        return web.Response(status=204)

    def unready(self) -> str | None:
        """Why a Service should not send this replica requests now, or None.

        Not before the first read of the Topics (a request would wait for its own lookup,
        while the gateway's sync push is waiting), and not once stopping (the Service
        takes the replica out before it goes)."""
        if self._stop is not None and self._stop.is_set():
            return "stopping"
        if not self._loaded:
            return "the Topics were not read yet"
        if not self._ownership.joined:
            return "its member Lease was not written yet"
        return None

    # --- Topics ---------------------------------------------------------------------------

    async def sweep(self) -> None:
        await self.lifecycle.sweep()

    async def survey(self) -> None:
        await self.lifecycle.survey()

    # --- direct delivery (delivery.direct) ---------------------------------------------------

    def allowed(self, queue: QueueName, shard: int) -> bool:
        # Another replica commits to the shard only when it cannot hand the request here
        # (``forwarding``), and tells this owner before the gateway has its answer, so no
        # later event of the object goes directly ahead of the committed one. That needs
        # every replica to be reachable and to work so (its member Lease says both): one
        # without an address, direct delivery or this release would commit untold.
        loop = self._loops.get((queue, shard))
        return (
            not self._stopping
            and (self._ownership.members == 1 or self._ownership.all_hand_over())
            and loop is not None
            and not loop.done()
            and self._ownership.owns_shard(queue, shard)
        )

    # --- processing -----------------------------------------------------------------------

    def _wake(self, queue: QueueName, shard: int) -> None:
        """The shard has entries: its task here starts a round, or its owner is told."""
        self._wake_local(queue, shard)
        if not self._ownership.owns_shard(queue, shard):
            self._wakeups.send(queue, shard)

    async def _tell_owners(self, queue: QueueName, shards: list[int]) -> None:
        """After the ingest committed to ``shards``: their owners (other replicas) know
        before the gateway gets its answer (see ``allowed``)."""
        await self._wakeups.tell(queue, shards)

    def _wake_local(self, queue: QueueName, shard: int) -> None:
        event = self._wakes.get((queue, shard))
        if event is not None:
            event.set()

    def _supervise(self) -> None:
        """Start a loop for every owned shard that has none; loops end by themselves."""
        for done in [k for k, task in self._loops.items() if task.done()]:
            del self._loops[done]
            self.gate.forget(done)  # a loop that failed or was cancelled did not say so
        if self._stopping:
            return
        if self._ownership.changed.is_set():
            self._ownership.changed.clear()
            # An empty shard's task sleeps until woken: one whose shard moved away must
            # wake to end, or a later take-back would find it still there, asleep.
            for unit in self._loops:
                if not self._ownership.owns_shard(*unit):
                    self._wake_local(*unit)
        for key, runtime in self.topics.items():
            if runtime.endpoint is None:
                continue
            for shard in range(runtime.shards):
                unit = (runtime.queue, shard)
                if unit not in self._loops and self._ownership.owns_shard(runtime.queue, shard):
                    self._loops[unit] = asyncio.create_task(
                        self._shard_loop(key, shard), name=f"shard {runtime.queue}#{shard}"
                    )

    async def _shard_loop(self, key: TopicKey, shard: int) -> None:
        # Bound to the runtime it started with: a changed Topic gets fresh loops.
        runtime = self.topics[key]
        endpoint = runtime.endpoint
        assert endpoint is not None
        queue = runtime.queue
        wake = self._wakes.setdefault((queue, shard), asyncio.Event())
        delay = self.timings.round_interval_s
        delivered = runtime.delivered.setdefault(shard, DeliveredCache())
        # The other replicas learn that this one holds the shard at their next Lease round:
        # until then their commits wake the previous holder, or nobody. Poll meanwhile.
        awake_until = (
            time.monotonic() + HANDOVER_POLL_ROUNDS * self._ownership.settings.renew_interval_s
        )
        await self.delivered.load(runtime, shard, delivered)
        while not self._stopping:
            if self.topics.get(key) is not runtime or not self._ownership.owns_shard(queue, shard):
                break
            wake.clear()
            result = await self._process(runtime, endpoint, shard)
            await self.delivered.save(runtime, shard, delivered)
            if result is not None and result.listed >= LIST_BATCH and not result.failed:
                continue  # a backlog: go on at once
            if result is not None and _settled(result) and self._ownership.address:
                left = awake_until - time.monotonic()
                if left > 0:
                    await woken(wake, min(left, self.timings.idle_max_s))
                    delay = self.timings.round_interval_s
                    continue
                # Nothing left that it listed, and nothing committed since the listing (that
                # would have woken it): no polling. A commit, a wake-up, the survey, an
                # ownership or Topic change or the stop wakes it. (Without an address nobody
                # could send this replica wake-ups: it polls, below.)
                await self.delivered.idle(runtime, shard, delivered, wake)
                delay = self.timings.round_interval_s
                continue
            progress = result is not None and (
                result.delivered or result.expired or result.dead_lettered or result.duplicates
            )
            if progress:
                delay = self.timings.round_interval_s
            else:
                # Nothing to do, or only failures: poll, and hit the endpoint, less often.
                delay = min(max(delay, self.timings.round_interval_s) * 2, self.timings.idle_max_s)
            await woken(wake, delay)
            if wake.is_set():
                delay = self.timings.round_interval_s
        self.gate.forget((queue, shard))
        await self.delivered.save(runtime, shard, delivered, final=True)

    async def _process(
        self, runtime: TopicRuntime, endpoint: Endpoint, shard: int
    ) -> RoundResult | None:
        queue = runtime.queue
        mark = await self.gate.round_starts((queue, shard))
        result = await self._round(runtime, endpoint, shard)
        self.gate.round_ended((queue, shard), mark, result is not None and _settled(result))
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
                    endpoint=self.accounting.metered(endpoint, queue),
                    policy=runtime.policy,
                    delivered=runtime.delivered.setdefault(shard, DeliveredCache()),
                    still_owned=lambda: self._ownership.owns_shard(queue, shard),
                    now=time.time(),
                    dead_letter=self._dead_letter_sink(runtime),
                )
            except RoundCutShort as cut:
                # What the round did before the store failed is counted and recorded once;
                # the next round neither pushes nor counts it again.
                self.accounting.round(queue, shard, runtime.endpoint_kind, cut.result)
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
        self.accounting.round(queue, shard, runtime.endpoint_kind, result)
        return result

    def _dead_letter_sink(self, runtime: TopicRuntime) -> DeadLetterSink | None:
        if runtime.dead_letter is None:
            return None
        key = (runtime.queue.namespace, runtime.dead_letter)

        async def sink(entries: Sequence[Entry]) -> None:
            target = self.topics.get(key)
            if target is None or target.draining:
                raise LookupError(f"{key[0]}/{key[1]} is not a persistent Topic")
            by_shard: dict[int, list[tuple[str, bytes]]] = {}
            for entry in entries:
                shard = shard_of(*object_of(json.loads(entry.body)), target.shards)
                by_shard.setdefault(shard, []).append((entry.event_id, entry.body))
            await self.ingest.commit(target.queue, by_shard)

        return sink

    def _units_of(self, queue: QueueName) -> list[tuple[QueueName, int]]:
        return [u for u in self._loops if u[0] == queue]

    async def _wait_loops(self, units: list[tuple[QueueName, int]]) -> None:
        tasks = [self._loops[u] for u in units if u in self._loops]
        for unit in units:
            self._wake(*unit)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.timings.drain_timeout_s)
            for task in pending:
                # A round stuck on an endpoint: cancelling it before its removals means
                # the next owner sends those entries again (a duplicate, never a loss).
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    async def before_release(self, partition: int) -> None:
        """Ownership hands ``partition`` back: let its running rounds finish first (they
        stop on their own, as the partition is no longer owned)."""
        units = [
            u
            for u in self._loops
            if partition_of(u[0], u[1], self._ownership.settings.partitions) == partition
        ]
        await self._wait_loops(units)

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        await self._ownership.start()
        last_refresh = last_sweep = last_stats = -1e9
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now - last_refresh > self.timings.refresh_interval_s:
                    try:
                        await self.refresh()
                        self._loaded = True
                    except Exception as exc:
                        log_retried(log, "refreshing the topic table failed", exc)
                    last_refresh = now
                if now - last_sweep > self.timings.sweep_interval_s:
                    try:
                        await self.sweep()
                    except Exception as exc:
                        log_retried(log, "sweeping the queues failed", exc, STORE_AWAY)
                    last_sweep = now
                if now - last_stats > self.timings.stats_interval_s:
                    try:
                        await self.survey()
                    except Exception as exc:
                        log_retried(log, "surveying the queues failed", exc, STORE_AWAY)
                    last_stats = now
                self._supervise()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.timings.round_interval_s)
        finally:
            # Rounds finish their removals before the Leases are handed back, so the next
            # owner starts from what this replica actually delivered.
            self._stopping = True
            await self._wait_loops(list(self._loops))
            # The loops' last saves covered what was delivered directly too.
            await self.delivered.aclose()
            await self._wakeups.aclose()
            if self.forwarder is not None:
                await self.forwarder.aclose()
            await self._ownership.stop(release=True)
            await self.table.aclose()
            await self.events.aclose()


STORE_AWAY = (StoreUnavailable,)
"""Failures of the queue store that its next sweep or survey gets over."""
