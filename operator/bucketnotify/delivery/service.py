"""The delivery service process: ingest, queue processing and Lease ownership together.

The rooms (``bucketnotify.delivery`` lists them in the order an event passes them) are
built and wired here, and nowhere else: the Topic table (``topics``), the ingest
(``ingest``), the shard loops and direct pushes (``rounds``), the Leases and the other
replicas (``peers``), and what is counted, recorded and announced (``recorded``).

Lost wake-ups (``delivery.rounds.shard_loops`` says how shards are woken) are caught by the
survey: every ``stats_interval_s`` the owner of a queue's shard 0 looks at the whole queue (one LIST
on the S3 store) and wakes every shard holding entries; every ``OWN_SURVEY_EVERY`` surveys
each replica also looks at the queues where it owns other shards, in case its peers cannot
reach it. So an event waits for its owner no longer than a wake-up takes, at worst
``stats_interval_s``, and ``OWN_SURVEY_EVERY`` times that when the replicas cannot reach
each other.

Metrics, delivery records and Kubernetes Events: see ``delivery.recorded.accounting``; a
queue's length and size come from the survey every ``stats_interval_s`` and are exported only by the
owner of its shard 0, so a sum over replicas counts each queue once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence

from aiohttp import web

from bucketnotify.apiserver import ApiClient, log_retried
from bucketnotify.delivery.ingest.handler import Ingest, build_app
from bucketnotify.delivery.model.event import event_shard
from bucketnotify.delivery.model.queue import Entry, QueueStore, StoreUnavailable
from bucketnotify.delivery.model.timings import ServiceTimings
from bucketnotify.delivery.peers.forwarding import Forwarder
from bucketnotify.delivery.peers.ownership import Ownership
from bucketnotify.delivery.peers.wakeups import WAKE_PATH, WakeUps, parse_wake
from bucketnotify.delivery.recorded.accounting import Accounting
from bucketnotify.delivery.recorded.delivery_records import Recorder
from bucketnotify.delivery.recorded.kube_events import COMPONENT, TopicEvents
from bucketnotify.delivery.rounds.delivered import DeliveredIds
from bucketnotify.delivery.rounds.direct import ShardGate
from bucketnotify.delivery.rounds.direct_push import DirectPusher
from bucketnotify.delivery.rounds.shard_loops import ShardLoops
from bucketnotify.delivery.rounds.worker import DeadLetterSink
from bucketnotify.delivery.topics.ingest_tokens import IngestTopic
from bucketnotify.delivery.topics.lifecycle import QueueLifecycle
from bucketnotify.delivery.topics.table import TopicRuntime, TopicTable
from bucketnotify.event_recorder import EventRecorder
from bucketnotify.metrics import DeliveryMetrics

__all__ = ["DeliveryService", "ServiceTimings", "TopicRuntime"]

log = logging.getLogger(__name__)

_DEFAULT_TIMINGS = ServiceTimings()


class DeliveryService:
    def __init__(
        self,
        *,
        api: ApiClient,
        store: QueueStore,
        ownership: Ownership,
        namespaces: list[str],
        timings: ServiceTimings = _DEFAULT_TIMINGS,
        metrics: DeliveryMetrics | None = None,
        recorder: Recorder | None = None,
        events: TopicEvents | None = None,
        allow_cleartext_secrets: bool = False,
        direct: bool = False,
    ) -> None:
        self.metrics = metrics if metrics is not None else DeliveryMetrics()
        self._store = store
        self._ownership = ownership
        self.timings = timings
        self.events = events or TopicEvents(
            EventRecorder(api, component=COMPONENT, instance=ownership.identity)
        )
        """Kubernetes Events on the Topics (delivery.recorded.kube_events)."""
        self.accounting = Accounting(self.metrics, self.events, recorder)
        self.table = TopicTable(
            api=api,
            store=store,
            namespaces=namespaces,
            metrics=self.metrics,
            events=self.events,
            release=lambda queue: self.loops.wait_loops(self.loops.units_of(queue)),
            secret_refresh_s=timings.secret_refresh_s,
            token_overlap_s=timings.token_overlap_s,
            reservation_timeout_s=timings.reservation_timeout_s,
            allow_cleartext_secrets=allow_cleartext_secrets,
        )
        self.topics = self.table.topics
        self.ingest_topics = self.table.ingest_topics
        self._loaded = False
        """The Topic table was read once: until then each request costs an API call."""
        self._stop: asyncio.Event | None = None
        self._wakeups = WakeUps(ownership.owner_address, self.metrics)
        self.gate = ShardGate()
        """Order between the ingest's direct pushes, commits and rounds (``direct``)."""
        self.delivered = DeliveredIds(store)
        self.loops = ShardLoops(
            topics=self.topics,
            store=store,
            ownership=ownership,
            timings=timings,
            gate=self.gate,
            delivered=self.delivered,
            accounting=self.accounting,
            wakeups=self._wakeups,
            dead_letter_sink=self._dead_letter_sink,
        )
        ownership.before_release = self.loops.before_release
        self.lifecycle = QueueLifecycle(
            table=self.table,
            store=store,
            ownership=ownership,
            metrics=self.metrics,
            kube=self.table.kube,
            wake=self.loops.wake,
            wake_local=self.loops.wake_local,
        )
        self.direct = DirectPusher(
            topics=self.topics,
            store=store,
            accounting=self.accounting,
            gate=self.gate,
            allowed=self.loops.allowed,
            dead_letter_sink=self._dead_letter_sink,
            save_soon=self.delivered.save_soon,
        )
        self.forwarder = Forwarder(ownership.owner_address, self.metrics) if direct else None
        self.ingest = self._ingest(store, recorder, direct)

    def _ingest(self, store: QueueStore, recorder: Recorder | None, direct: bool) -> Ingest:
        return Ingest(
            store,
            self.ingest_topics,
            self.table.resolve,
            # With direct delivery, other owners are told before the answer (tell_owners).
            self.loops.wake_local if direct else self.loops.wake,
            self.metrics,
            recorder,
            recheck=self.table.tokens.recheck,
            direct=self.direct if direct else None,
            forwarder=self.forwarder,
            tell_owners=self.loops.tell_owners if direct else None,
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
        """Another replica committed to shards this one may own (``delivery.peers.wakeups``)."""
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
            self.loops.wake_local(queue, shard)
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
                shard = event_shard(json.loads(entry.body), target.shards)
                by_shard.setdefault(shard, []).append((entry.event_id, entry.body))
            await self.ingest.commit(target.queue, by_shard)

        return sink

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
                self.loops.supervise()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.timings.round_interval_s)
        finally:
            # Rounds finish their removals before the Leases are handed back, so the next
            # owner starts from what this replica actually delivered.
            await self.loops.stop()
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
