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
import logging
import signal
import time
from collections.abc import Callable

from aiohttp import web

from bucketnotify.delivery.ingest.draining import ConnectionDrain
from bucketnotify.delivery.ingest.handler import MAX_BODY_BYTES, Ingest
from bucketnotify.delivery.model.queue import QueueStore, StoreUnavailable
from bucketnotify.delivery.model.timings import ServiceTimings
from bucketnotify.delivery.peers.forwarding import Forwarder
from bucketnotify.delivery.peers.ownership import LeaseSettings, Ownership
from bucketnotify.delivery.peers.wakeups import WAKE_PATH, WakeUps, parse_wake
from bucketnotify.delivery.recorded.accounting import Accounting
from bucketnotify.delivery.recorded.delivery_records import Recorder, RecordWriter
from bucketnotify.delivery.recorded.health import DeliveryHealth
from bucketnotify.delivery.recorded.health_reports import HealthReports
from bucketnotify.delivery.recorded.kube_events import COMPONENT, TopicEvents
from bucketnotify.delivery.recorded.record_targets import records_target_for
from bucketnotify.delivery.rounds.dead_letters import DeadLetters
from bucketnotify.delivery.rounds.delivered import DeliveredIds
from bucketnotify.delivery.rounds.direct import ShardGate
from bucketnotify.delivery.rounds.direct_push import DirectPusher
from bucketnotify.delivery.rounds.shard_loops import ShardLoops
from bucketnotify.delivery.stores.open import StoreConfigError, open_store
from bucketnotify.delivery.topics.ingest_tokens import IngestTopic, TopicKey
from bucketnotify.delivery.topics.lifecycle import QueueLifecycle
from bucketnotify.delivery.topics.table import TopicRuntime, TopicTable
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.release import asked_release, release_named
from bucketnotify.kube.apiserver import (
    LEASE_CONNECTIONS,
    ApiClient,
    connect,
    deployment_reference,
    log_retried,
)
from bucketnotify.kube.event_recorder import EventRecorder
from bucketnotify.metrics import DeliveryMetrics
from bucketnotify.probes import probes_app
from bucketnotify.settings import DeliveryServiceSettings, OperatorSettings, default_identity

__all__ = ["DeliveryService", "ServiceTimings", "TopicRuntime", "build_app", "run_replica"]

log = logging.getLogger(__name__)
process_log = logging.getLogger("bucketnotify")
"""The process's own lines (where it listens, the records' target, the gateway's release),
under the program's logger as the operator's are."""

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
        self.health = DeliveryHealth()
        """What this replica knows of each Topic's delivery (``delivery.recorded.health``)."""
        self.accounting = Accounting(self.metrics, self.events, recorder, self.health)
        leases = ownership.settings
        self.reports = HealthReports(
            api,
            self.health,
            namespace=leases.namespace,
            group=leases.group,
            identity=ownership.identity,
            interval_s=timings.health_report_interval_s,
            owner=leases.owner,
        )
        self.topics: dict[TopicKey, TopicRuntime] = {}
        """The Topics served: the table fills it, the shard loops and direct pushes read it."""
        self._loaded = False
        """The Topic table was read once: until then each request costs an API call."""
        self._stop: asyncio.Event | None = None
        self._wakeups = WakeUps(ownership.owner_address, self.metrics)
        self.gate = ShardGate()
        """Order between the ingest's direct pushes, commits and rounds (``direct``)."""
        self.delivered = DeliveredIds(store)
        self.dead_letters = DeadLetters(self.topics, store, self.metrics, self.health)
        self.loops = ShardLoops(
            topics=self.topics,
            store=store,
            ownership=ownership,
            timings=timings,
            gate=self.gate,
            delivered=self.delivered,
            accounting=self.accounting,
            wakeups=self._wakeups,
            dead_letters=self.dead_letters,
        )
        ownership.holder = self.loops
        self.table = TopicTable(
            api=api,
            store=store,
            namespaces=namespaces,
            metrics=self.metrics,
            events=self.events,
            health=self.health,
            topics=self.topics,
            runner=self.loops,
            secret_refresh_s=timings.secret_refresh_s,
            token_overlap_s=timings.token_overlap_s,
            reservation_timeout_s=timings.reservation_timeout_s,
            allow_cleartext_secrets=allow_cleartext_secrets,
        )
        self.ingest_topics = self.table.ingest_topics
        self.lifecycle = QueueLifecycle(
            table=self.table,
            store=store,
            ownership=ownership,
            metrics=self.metrics,
            kube=self.table.kube,
            runner=self.loops,
            health=self.health,
        )
        self.direct = DirectPusher(
            topics=self.topics,
            store=store,
            accounting=self.accounting,
            gate=self.gate,
            allowed=self.loops.allowed,
            dead_letters=self.dead_letters,
            save_soon=self.delivered.save_soon,
        )
        self.forwarder = Forwarder(ownership.owner_address, self.metrics) if direct else None
        self.ingest = self._ingest(store, recorder, direct)
        self.dead_letters.committer = self.ingest

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

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        await self._ownership.start()
        last_refresh = last_sweep = last_stats = -1e9
        watching = asyncio.create_task(self.table.watch.run(), name="topic watch")
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
                # The store sizes its reservations' headroom by the writers; it is told, it
                # never asks the replicas.
                self._store.writers = self._ownership.writers
                self.loops.supervise()
                if self._ownership.joined:
                    await self.reports.tick(
                        self._ownership.owned(),
                        self._ownership.settings.partitions,
                        min_gap_s=self._ownership.settings.renew_interval_s,
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.timings.round_interval_s)
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            # Rounds finish their removals before the Leases are handed back, so the next
            # owner starts from what this replica actually delivered.
            await self.loops.stop()
            # The loops' last saves covered what was delivered directly too.
            await self.delivered.aclose()
            await self._wakeups.aclose()
            if self.forwarder is not None:
                await self.forwarder.aclose()
            await self._ownership.stop(release=True)
            await self.reports.withdraw()
            await self.table.aclose()
            await self.events.aclose()


def build_app(ingest: Ingest, unready: Callable[[], str | None] = lambda: None) -> web.Application:
    """The replica's HTTP server: the ingest, ``GET /metrics``, ``GET /healthz`` (the event
    loop answers) and ``GET /readyz``, which answers 503 with the reason ``unready()``
    gives, 200 once it gives None."""
    app = probes_app(ingest.metrics.exposition, unready, client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/v1/topics/{namespace}/{topic}/{token}", ingest.handle)
    return app


DRAIN_MAX_S = 2.0
DRAIN_QUIET_S = 0.5
"""A stopping replica's listener stays open while requests still come on kept-alive
connections, each answered with ``Connection: close`` (``delivery.ingest.draining``): at most
DRAIN_MAX_S, and no longer than DRAIN_QUIET_S after the last request."""


async def run_replica(settings: DeliveryServiceSettings, operator: OperatorSettings) -> None:
    """One delivery replica, from its settings until SIGTERM or SIGINT: the rooms built
    and wired (``DeliveryService``), the ingest served, then drained and closed in order."""
    # Closed on every way out, a bad store setting included (see run_operator). The Leases
    # have a client of their own: a renewal must not wait behind Topic reads.
    async with await connect() as api, await connect(LEASE_CONNECTIONS) as leases:
        await _serve(settings, operator, api, leases)


async def _serve(
    settings: DeliveryServiceSettings,
    operator: OperatorSettings,
    api: ApiClient,
    leases: ApiClient,
) -> None:
    identity = settings.identity or default_identity()
    store = await open_store(settings, operator)
    metrics = DeliveryMetrics()
    # Beside the start, not before it: a gateway that does not answer must not hold it up.
    announcing = asyncio.create_task(
        _announce_gateway_release(operator, metrics), name="gateway release"
    )
    writer = _record_writer(settings, operator, identity, metrics)
    owner = None
    if settings.lease_owner:
        owner = await deployment_reference(leases, settings.lease_namespace, settings.lease_owner)
    ownership = Ownership(
        leases,
        identity,
        LeaseSettings.of(settings, owner),
        address=settings.advertised_address,
        hands_over=settings.direct_delivery,
    )
    service = DeliveryService(
        api=api,
        store=store,
        ownership=ownership,
        namespaces=settings.namespaces,
        timings=ServiceTimings.of(settings),
        metrics=metrics,
        recorder=Recorder(writer, identity) if writer is not None else None,
        allow_cleartext_secrets=settings.allow_cleartext_secrets,
        direct=settings.direct_delivery,
    )
    stop = asyncio.Event()
    drain = ConnectionDrain()

    def stopping() -> None:
        stop.set()
        drain.closing = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping)
    app = service.app()
    app.middlewares.append(drain.middleware)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.listen_host, settings.listen_port).start()
    process_log.info(
        "delivery replica %s: ingest and /metrics on %s:%d",
        identity,
        settings.listen_host,
        settings.listen_port,
    )
    if writer is not None:
        await writer.start()
    try:
        await service.run(stop)
    finally:
        announcing.cancel()
        if runner.server is not None:
            await drain.drain(runner.server, max_s=DRAIN_MAX_S, quiet_s=DRAIN_QUIET_S)
        await runner.cleanup()
        await store.aclose()
        if writer is not None:
            # Last: the rounds and the ingest are done, so every record is in the buffer.
            await writer.aclose()


async def _announce_gateway_release(operator: OperatorSettings, metrics: DeliveryMetrics) -> None:
    """Log and export the Ceph release of the default gateway, whose persistent queues hand
    events to the replicas (and which holds an s3:// store), as the operator does for its
    gateways: the first thing to know when its pushes look different."""
    endpoint = operator.gateway_endpoint
    if not endpoint or operator.gateway_kind != "ceph":
        return
    if operator.gateway_release:
        release = release_named(operator.gateway_release)
    else:
        # Anonymous requests: no keys needed, only the endpoint and the CA it trusts.
        connection = GatewayConnection(endpoint, "", "", operator.gateway_region)
        release = await asyncio.to_thread(asked_release, connection)
    if release.learned_from == "unreachable":
        process_log.warning("gateway %s did not answer: its Ceph release is not known", endpoint)
    else:
        process_log.info(
            "gateway %s runs Ceph %s (from its %s)", endpoint, release.name, release.learned_from
        )
    metrics.gateway_info.labels(endpoint, release.name).set(1)


def _record_writer(
    settings: DeliveryServiceSettings,
    operator: OperatorSettings,
    identity: str,
    metrics: DeliveryMetrics,
) -> RecordWriter | None:
    """The writer of delivery records (BUCKETNOTIFY_DELIVERY_RECORDS); None when off."""
    try:
        target = records_target_for(settings.records, settings.store, operator)
    except StoreConfigError as exc:
        raise SystemExit(str(exc)) from None
    except OSError as exc:
        raise SystemExit(
            f"BUCKETNOTIFY_DELIVERY_RECORDS: cannot write to {exc.filename}: {exc.strerror}"
        ) from None
    if target is None:
        process_log.info("delivery records: off")
        return None
    process_log.info("delivery records: to %s", target)
    return RecordWriter(
        target,
        replica=identity,
        metrics=metrics,
        flush_interval_s=settings.records_flush_seconds,
        batch_size=settings.records_batch_size,
        max_buffered=settings.records_buffer_max,
    )


STORE_AWAY = (StoreUnavailable,)
"""Failures of the queue store that its next sweep or survey gets over."""
