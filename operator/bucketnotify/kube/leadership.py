"""Leader election for the operator: only the holder of a Lease runs kopf.

As client-go's leader election: a candidate takes the Lease when it is free, released, or
its record (holder and renewTime) has not changed for the lease duration by the local
clock (so clocks need not agree); the leader renews every retry period and stops once it
could not renew for the renew deadline, which is shorter than the lease duration, so two
leaders never act at once. Writes replace the Lease at the resourceVersion read, so of two
candidates only one gets it. An unreachable API server is a failed attempt: a follower
tries again, a leader until its renew deadline. A failure of kopf ends the process with
status 1; a graceful stop hands the Lease back so a follower takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from bucketnotify.kube.apiserver import (
    ApiClient,
    ApiError,
    deployment_reference,
    lease_path,
    micro_time,
)
from bucketnotify.settings import OperatorSettings

__all__ = ["lead", "release"]

log = logging.getLogger("bucketnotify")

# What an unreachable or hanging API server raises instead of an ApiError.
_UNREACHABLE = (aiohttp.ClientError, TimeoutError)


class _LeaderLease:
    def __init__(
        self,
        api: ApiClient,
        settings: OperatorSettings,
        identity: str,
        owner: dict[str, str] | None = None,
    ) -> None:
        self._api = api
        self._owner = owner
        """The ownerReference the Lease carries (the operator's Deployment), or None."""
        self._settings = settings
        self._identity = identity
        self._path = lease_path(settings.leader_election_namespace, settings.leader_election_lease)
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        """The other holder's record as last seen, and the monotonic time it last changed."""

    async def attempt(self) -> bool:
        """One try to take or renew the Lease; True when this replica holds it now."""
        try:
            return await self._attempt()
        except ApiError as exc:
            log.warning("the leader Lease: the API server answered %s: %s", exc.status, exc.message)
        except _UNREACHABLE as exc:
            log.warning(
                "the leader Lease: the API server is unreachable: %s",
                str(exc) or type(exc).__name__,
            )
        return False

    async def _attempt(self) -> bool:
        settings = self._settings
        # One attempt must leave time to act on its answer before the renew deadline.
        timeout = settings.retry_period_seconds
        now = micro_time(dt.datetime.now(dt.UTC))
        try:
            lease = await self._api.get(self._path, request_timeout=timeout)
        except ApiError as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": settings.leader_election_lease,
                    "namespace": settings.leader_election_namespace,
                    **({"ownerReferences": [self._owner]} if self._owner else {}),
                },
                "spec": {
                    "holderIdentity": self._identity,
                    "leaseDurationSeconds": settings.lease_duration_seconds,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            return await self._write("POST", lease_path(settings.leader_election_namespace), body)
        spec: dict[str, Any] = lease.setdefault("spec", {})
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        duration = spec.get("leaseDurationSeconds") or settings.lease_duration_seconds
        if holder and holder != self._identity and time.monotonic() - self._observed_at < duration:
            return False  # another replica leads and renews
        if self._owner and not lease["metadata"].get("ownerReferences"):
            # Made while no owner was set (the setting came later): an uninstall takes it
            # too now.
            lease["metadata"]["ownerReferences"] = [self._owner]
        if holder != self._identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = (spec.get("leaseTransitions") or 0) + 1
        spec.update(
            holderIdentity=self._identity,
            leaseDurationSeconds=settings.lease_duration_seconds,
            renewTime=now,
        )
        return await self._write("PUT", self._path, lease)

    async def _write(self, method: str, path: str, body: dict[str, Any]) -> bool:
        try:
            await self._api.request(
                method, path, body=body, request_timeout=self._settings.retry_period_seconds
            )
        except ApiError as exc:
            if exc.status == 409:  # another candidate wrote first
                return False
            raise
        return True


async def lead(
    api: ApiClient,
    settings: OperatorSettings,
    identity: str,
    operator: Any,
    stop: asyncio.Event,
    leading: Callable[[bool], None] = lambda _: None,
) -> None:
    """Run ``operator`` (kopf's coroutine) while this replica holds the leader Lease; return
    once ``stop`` is set and the Lease is handed back. SystemExit(1) when the Lease was
    lost or the operator failed. ``leading`` is told when it starts and stops leading."""
    owner = None
    if settings.leader_election_owner:
        owner = await deployment_reference(
            api, settings.leader_election_namespace, settings.leader_election_owner
        )
    lease = _LeaderLease(api, settings, identity, owner)
    log.info("waiting for the leader Lease %s as %s", settings.leader_election_lease, identity)
    while True:
        # The renew deadline runs from when the winning request was sent, not answered.
        renewed = time.monotonic()
        if await lease.attempt():
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.retry_period_seconds)
        if stop.is_set():
            if inspect.iscoroutine(operator):
                operator.close()  # never started
            return
    log.info(
        "acquired the leader Lease %s; leading as %s", settings.leader_election_lease, identity
    )
    leading(True)
    try:
        await _run_while_leading(api, settings, identity, operator, stop, lease, renewed)
    finally:
        leading(False)


async def _run_while_leading(
    api: ApiClient,
    settings: OperatorSettings,
    identity: str,
    operator: Any,
    stop: asyncio.Event,
    lease: _LeaderLease,
    renewed: float,
) -> None:
    running: asyncio.Future[Any] = asyncio.ensure_future(operator)
    stopping_since: float | None = None
    while not running.done():
        # kopf stops on ``stop`` (its stop flag); it may finish its handlers meanwhile, as
        # long as the Lease is still ours, up to the renew deadline.
        if stop.is_set():
            stopping_since = stopping_since or time.monotonic()
            if time.monotonic() - stopping_since > settings.renew_deadline_seconds:
                break
        deadline = renewed + settings.renew_deadline_seconds
        pause = min(settings.retry_period_seconds, deadline - time.monotonic())
        await asyncio.wait({running}, timeout=max(0.0, pause))
        if running.done():
            break
        sent = time.monotonic()
        renewed_now = False
        if sent < deadline:
            # A hanging API server must not carry the attempt past the deadline: the
            # leader would then act after a follower may have taken the Lease.
            with contextlib.suppress(TimeoutError):
                renewed_now = await asyncio.wait_for(lease.attempt(), deadline - sent)
        if renewed_now:
            renewed = sent
        elif time.monotonic() >= deadline:
            # Stops before the Lease can expire (renew deadline < lease duration), so a new
            # leader never overlaps with it.
            log.error("lost the leader Lease %s; stopping", settings.leader_election_lease)
            stop.set()
            running.cancel()
            raise SystemExit(1)
    failed = False
    if running.done() and not running.cancelled() and running.exception() is not None:
        log.error("the operator failed", exc_info=running.exception())
        failed = True
    # kopf replaces our signal handlers once it runs; its end is our cue to stop.
    stop.set()
    await release(api, settings, identity)
    if failed:
        raise SystemExit(1)


async def release(api: ApiClient, settings: OperatorSettings, identity: str) -> None:
    """Hand the leader Lease back if ``identity`` holds it, so a follower takes over at once
    instead of after the lease duration; a failure only costs that wait."""
    path = lease_path(settings.leader_election_namespace, settings.leader_election_lease)
    try:
        lease = await api.get(path, request_timeout=settings.retry_period_seconds)
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != identity:
            return
        spec["holderIdentity"] = ""
        spec["leaseDurationSeconds"] = 1
        lease["spec"] = spec
        await api.replace(path, lease, request_timeout=settings.retry_period_seconds)
        log.info("released the leader Lease %s", settings.leader_election_lease)
    except ApiError as exc:
        log.warning("could not release the leader Lease: %s", exc.reason)
    except _UNREACHABLE as exc:
        # The API server is away: the Lease expires on its own.
        log.warning("could not release the leader Lease: %s", exc)
