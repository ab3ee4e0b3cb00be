"""Leader election for the operator: only the holder of a Lease runs kopf.

kubernetes_asyncio's ``LeaderElection`` runs the leading coroutine as a task nobody awaits
and ends its loop on the first unreachable API server; this module keeps both from turning
into silent exits: a leader renews until its renew deadline as client-go's would, a failure
of kopf ends the process with status 1, and a follower that lost the API server tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from bucketnotify.settings import OperatorSettings

__all__ = ["lead", "release"]

log = logging.getLogger("bucketnotify")

# What an unreachable or hanging API server raises instead of an ApiException.
_UNREACHABLE = (aiohttp.ClientError, TimeoutError)


class _PatientLeaseLock(LeaseLock):
    """A LeaseLock for which an unreachable API server is a failed attempt, as a refusal
    is: the election then retries until the renew deadline instead of ending at once."""

    async def get(self, name: str, namespace: str) -> Any:
        try:
            return await super().get(name, namespace)
        except _UNREACHABLE as exc:
            log.warning("reading the leader Lease failed: %s", exc)
            refusal = ApiException(status=503, reason=str(exc))
            # The election reads the status code from the body of what get() returns.
            refusal.body = b'{"code": 503}'
            return False, refusal

    async def create(
        self, name: str, namespace: str, election_record: LeaderElectionRecord
    ) -> bool:
        try:
            return bool(await super().create(name, namespace, election_record))
        except _UNREACHABLE as exc:
            log.warning("creating the leader Lease failed: %s", exc)
            return False

    async def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        try:
            return bool(await super().update(name, namespace, updated_record))
        except _UNREACHABLE as exc:
            log.warning("renewing the leader Lease failed: %s", exc)
            return False


async def lead(
    api: client.ApiClient,
    settings: OperatorSettings,
    identity: str,
    operator: Any,
    stop: asyncio.Event,
) -> None:
    """Run ``operator`` (kopf's coroutine) while this replica holds the leader Lease; return
    once ``stop`` is set and the Lease is handed back. SystemExit(1) when the Lease was
    lost, the election broke while leading, or the operator failed."""
    lost = asyncio.Event()
    led = asyncio.Event()
    finished = asyncio.Event()
    failed: list[BaseException] = []

    async def leading() -> None:
        led.set()
        try:
            await operator
        except Exception as exc:
            # The election runs this as a task whose result nobody reads: kept here, the
            # failure ends the process with a non-zero status instead of vanishing.
            log.exception("the operator failed")
            failed.append(exc)
        finally:
            # kopf replaces our signal handlers once it runs; its end is our cue to stop.
            finished.set()
            stop.set()

    async def stopped() -> None:
        # A leader that could not renew stops before its Lease can expire (renew deadline <
        # lease duration), so a new leader never overlaps with it.
        log.error("lost the leader Lease %s; stopping", settings.leader_election_lease)
        lost.set()

    lock = _PatientLeaseLock(
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
    stopping = asyncio.create_task(stop.wait())
    broken: BaseException | None = None
    while True:
        election = asyncio.create_task(leaderelection.LeaderElection(config).run())
        await asyncio.wait({election, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if lost.is_set():
            stopping.cancel()
            raise SystemExit(1)
        broken = election.exception() if election.done() and not election.cancelled() else None
        if broken is None or led.is_set():
            break
        # kubernetes_asyncio's election ends on an unreachable API server instead of trying
        # again. A follower leads nothing, so it just tries again; a leader stops below.
        log.warning(
            "the leader election failed (%s); trying again in %d s",
            broken,
            settings.retry_period_seconds,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(stopping), settings.retry_period_seconds)
        if stop.is_set():
            break
    if broken is not None and led.is_set():
        # The leader cannot renew any more: kopf stops before the Lease can expire.
        log.error("the leader election failed (%s); stopping", broken)
        stop.set()
    # Graceful stop: kopf finishes its handlers (stop flag), then the Lease is handed back so
    # another replica takes over at once instead of after the lease duration.
    if led.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), timeout=settings.renew_deadline_seconds)
    election.cancel()
    stopping.cancel()
    await release(api, settings, identity)
    if failed or (broken is not None and led.is_set()):
        raise SystemExit(1)


async def release(api: client.ApiClient, settings: OperatorSettings, identity: str) -> None:
    """Hand the leader Lease back if ``identity`` holds it, so a follower takes over at once
    instead of after the lease duration; a failure only costs that wait."""
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
    except _UNREACHABLE as exc:
        # The API server is away: the Lease expires on its own.
        log.warning("could not release the leader Lease: %s", exc)
