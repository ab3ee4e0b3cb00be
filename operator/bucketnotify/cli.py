"""Command-line entry points: ``bucketnotify operator``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import kopf
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from bucketnotify.controller import handlers
from bucketnotify.controller.notifications import BucketLocks
from bucketnotify.delivery.ownership import LeaseSettings, Ownership
from bucketnotify.delivery.queue import QueueStore
from bucketnotify.delivery.service import DeliveryService, ServiceTimings
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.stores.s3 import S3Store
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.kube import Kube, connect
from bucketnotify.settings import DeliveryServiceSettings, OperatorSettings

__all__ = ["main"]

log = logging.getLogger("bucketnotify")


def _configure_kopf(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Leader election (a Lease) decides who acts, so kopf's own peering objects are not used.
    settings.peering.standalone = True
    settings.posting.level = logging.INFO
    # Progress annotations keep handler state while status belongs to our handlers. Their own
    # domain: kopf leaves its annotations out of diffs, and our bucketnotify.io/ resync
    # markers must trigger update handlers.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="kopf.bucketnotify.io"
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.bucketnotify.io", key="last-handled-configuration"
    )


async def run_operator(settings: OperatorSettings) -> None:
    api = await connect()
    registry = kopf.get_default_registry()
    kopf.on.startup(registry=registry)(_configure_kopf)
    handlers.register_drift_timer(registry, settings.drift_interval_seconds)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    operator = kopf.operator(
        registry=registry,
        memo=kopf.Memo(settings=settings, kube=Kube(api), bucket_locks=BucketLocks()),
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=True,
        stop_flag=stop,
    )
    try:
        if settings.leader_election:
            await _lead(api, settings, operator, stop)
        else:
            await operator
    finally:
        await api.close()


async def _lead(
    api: client.ApiClient, settings: OperatorSettings, operator: Any, stop: asyncio.Event
) -> None:
    identity = f"{socket.gethostname()}-{os.getpid()}"
    lost = asyncio.Event()
    finished = asyncio.Event()

    async def leading() -> None:
        try:
            await operator
        finally:
            # kopf replaces our signal handlers once it runs; its end is our cue to stop.
            finished.set()
            stop.set()

    async def stopped() -> None:
        # A leader that could not renew stops before its Lease can expire (renew deadline <
        # lease duration), so a new leader never overlaps with it.
        log.error("lost the leader Lease %s; stopping", settings.leader_election_lease)
        lost.set()

    lock = LeaseLock(
        settings.leader_election_lease, settings.leader_election_namespace, identity, api
    )
    config = electionconfig.Config(
        lock,
        lease_duration=settings.lease_duration_seconds,
        renew_deadline=settings.renew_deadline_seconds,
        retry_period=settings.retry_period_seconds,
        onstarted_leading=leading,
        onstopped_leading=stopped,
    )
    log.info("waiting for the leader Lease %s as %s", settings.leader_election_lease, identity)
    election = asyncio.create_task(leaderelection.LeaderElection(config).run())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({election, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if lost.is_set():
        raise SystemExit(1)
    # Graceful stop: kopf finishes its handlers (stop flag), then the Lease is handed back so
    # another replica takes over at once instead of after the lease duration.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(finished.wait(), timeout=settings.renew_deadline_seconds)
    election.cancel()
    stopping.cancel()
    await _release(api, settings, identity)


async def _release(api: client.ApiClient, settings: OperatorSettings, identity: str) -> None:
    leases = client.CoordinationV1Api(api)
    try:
        lease = await leases.read_namespaced_lease(
            settings.leader_election_lease, settings.leader_election_namespace
        )
        if lease.spec.holder_identity != identity:
            return
        lease.spec.holder_identity = ""
        lease.spec.lease_duration_seconds = 1
        await leases.replace_namespaced_lease(
            settings.leader_election_lease, settings.leader_election_namespace, lease
        )
        log.info("released the leader Lease %s", settings.leader_election_lease)
    except ApiException as exc:
        log.warning("could not release the leader Lease: %s", exc.reason)


async def run_delivery(settings: DeliveryServiceSettings, operator: OperatorSettings) -> None:
    api = await connect()
    identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
    store = await _store(settings, operator)
    ownership = Ownership(
        api,
        identity,
        LeaseSettings(
            namespace=settings.lease_namespace,
            partitions=settings.partitions,
            lease_duration_s=settings.lease_duration_seconds,
            renew_interval_s=settings.renew_interval_seconds,
            renew_deadline_s=settings.renew_deadline_seconds,
        ),
    )
    service = DeliveryService(
        api=api,
        store=store,
        ownership=ownership,
        namespaces=settings.namespaces,
        timings=ServiceTimings(
            refresh_interval_s=settings.refresh_interval_seconds,
            secret_refresh_s=settings.secret_refresh_seconds,
            idle_max_s=settings.idle_poll_max_seconds,
            sweep_interval_s=settings.sweep_interval_seconds,
            reservation_timeout_s=settings.reservation_timeout_seconds,
        ),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(service.app())
    await runner.setup()
    await web.TCPSite(runner, settings.listen_host, settings.listen_port).start()
    log.info(
        "delivery replica %s: ingest on %s:%d", identity, settings.listen_host, settings.listen_port
    )
    try:
        await service.run(stop)
    finally:
        await runner.cleanup()
        await api.close()


async def _store(settings: DeliveryServiceSettings, operator: OperatorSettings) -> QueueStore:
    scheme, _, rest = settings.store.partition("://")
    if scheme == "dir" and rest.startswith("/"):
        return LocalDirStore(Path(rest))
    if scheme == "s3" and rest:
        if not (
            operator.gateway_endpoint
            and operator.gateway_access_key
            and operator.gateway_secret_key
        ):
            raise SystemExit(
                "an s3:// store needs BUCKETNOTIFY_GATEWAY_ENDPOINT, _ACCESS_KEY, _SECRET_KEY"
            )
        connection = GatewayConnection(
            operator.gateway_endpoint,
            operator.gateway_access_key,
            operator.gateway_secret_key.get_secret_value(),
            operator.gateway_region,
        )
        store = S3Store(connection, rest)
        await store.ensure_bucket()
        return store
    raise SystemExit(
        f"BUCKETNOTIFY_DELIVERY_STORE={settings.store!r}: use dir:///absolute/path or s3://bucket"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bucketnotify")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "operator", help="reconcile Topics into the gateway (settings: BUCKETNOTIFY_* env)"
    )
    commands.add_parser(
        "delivery",
        help="serve the ingest and deliver persistent Topics (BUCKETNOTIFY_DELIVERY_* env)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "operator":
        asyncio.run(run_operator(OperatorSettings()))
    elif args.command == "delivery":
        asyncio.run(run_delivery(DeliveryServiceSettings(), OperatorSettings()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
