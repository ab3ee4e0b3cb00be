"""The replica's health report, written to its ConfigMap in the Leases' namespace for the
operator to read (``bucketnotify.delivery_health``).

One write every report interval, and one more when the partitions this replica owns
change (at its start and at a hand-over: the operator must not see shards without a
replica only because the report is older than the move); the size of the report grows with
the Topics served, the number of writes does not. Reports of replicas that died stay behind
until a live replica deletes them, ten intervals after their last write (like member
Leases, ``peers.gone_members``).

RBAC: ``create``, ``update``, ``list`` and ``delete`` on ``configmaps`` in the Leases'
namespace.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from bucketnotify.delivery.recorded.health import DeliveryHealth
from bucketnotify.delivery_health import DATA_KEY, REPORT_LABEL, Report, report_name, report_of
from bucketnotify.kube.apiserver import ApiClient, ApiError, log_retried, object_path

__all__ = ["HealthReports"]

log = logging.getLogger(__name__)

GONE_AFTER_INTERVALS = 10
SWEEP_EVERY = 10
"""Reports: every this many writes, the stale reports of others are looked for."""


class HealthReports:
    """Writes this replica's report when it is due (``tick``)."""

    def __init__(
        self,
        api: ApiClient,
        health: DeliveryHealth,
        *,
        namespace: str,
        group: str,
        identity: str,
        interval_s: float,
        owner: dict[str, str] | None = None,
    ) -> None:
        self._api = api
        self._health = health
        self._namespace, self._group, self._identity = namespace, group, identity
        self.interval_s = interval_s
        self._owner = owner
        self._name = report_name(group, identity)
        self._last: float | None = None
        self._last_owned: set[int] | None = None
        self._writes = 0

    async def tick(self, owned: set[int], partitions: int, *, min_gap_s: float) -> None:
        """Write the report if its interval is up, or if ``owned`` changed since the last
        one (then no sooner than ``min_gap_s`` after it). Failures are logged, never
        raised: the next tick tries again."""
        now = time.time()
        due = self._last is None or now - self._last >= self.interval_s
        moved = owned != self._last_owned and (self._last is None or now - self._last >= min_gap_s)
        if not (due or moved):
            return
        report = self._health.report(
            replica=self._identity,
            interval=self.interval_s,
            partitions=partitions,
            owned=owned,
            now=now,
        )
        try:
            await self._write(report)
        except Exception as exc:
            log_retried(log, "writing the delivery health report failed", exc)
            return
        self._last, self._last_owned = now, set(owned)
        self._writes += 1
        if self._writes % SWEEP_EVERY == 1:
            try:
                await self._sweep(now)
            except Exception as exc:
                log_retried(log, "deleting stale delivery health reports failed", exc)

    async def withdraw(self) -> None:
        """At a graceful stop, after the Leases were handed back: the report goes (the new
        owners' reports speak for the shards). Never raises."""
        if self._last is None:
            return
        try:
            await self._api.delete(object_path("", "v1", "configmaps", self._namespace, self._name))
        except Exception as exc:
            if not (isinstance(exc, ApiError) and exc.status == 404):
                log_retried(log, "deleting this replica's health report failed", exc)

    def _body(self, report: Report) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": self._name,
            "namespace": self._namespace,
            "labels": {REPORT_LABEL: self._group},
            "annotations": {"bucketnotify.io/replica": self._identity},
        }
        if self._owner is not None:
            metadata["ownerReferences"] = [self._owner]
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {DATA_KEY: report.model_dump_json(exclude_defaults=True)},
        }

    async def _write(self, report: Report) -> None:
        path = object_path("", "v1", "configmaps", self._namespace, self._name)
        try:
            await self._api.replace(path, self._body(report))
        except ApiError as exc:
            if exc.status != 404:
                raise
            await self._api.create(
                object_path("", "v1", "configmaps", self._namespace), self._body(report)
            )

    async def _sweep(self, now: float) -> None:
        listed = await self._api.get(
            object_path("", "v1", "configmaps", self._namespace),
            params={"labelSelector": f"{REPORT_LABEL}={self._group}"},
        )
        for item in listed.get("items", []):
            name = item["metadata"]["name"]
            if name == self._name:
                continue
            report = report_of(item)
            if report is None:
                continue  # not ours to judge: someone else's ConfigMap with our label
            if now - report.updated > GONE_AFTER_INTERVALS * report.interval:
                try:
                    await self._api.delete(
                        object_path("", "v1", "configmaps", self._namespace, name)
                    )
                    log.info("deleted the health report of replica %s (gone)", report.replica)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
