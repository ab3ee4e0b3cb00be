"""Each Topic's ``status.delivery`` and ``Delivering`` condition, from the delivery
replicas' health reports (``bucketnotify.delivery_health``): one loop, every interval.

A round reads the reports (one LIST of ConfigMaps) and goes through the Topics as the drift
loop's index has them (their latest watch event, status included); for each it judges the
condition and writes the status only when the condition's status or reason changed, or a
figure changed beyond its rounding: at most one write per Topic and round, none for a
Topic whose delivery stands still. A write names the Topic's resourceVersion it was
decided on; one that lost to another writer is decided again next round. An Event is posted
on the Topic when its condition changes.

Topics the gateway pushes itself (not persistent) get ``Delivering=Unknown``
(``GatewayDelivers``): nothing is known of their delivery, and ``True`` would be a guess.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from bucketnotify.api.topic import DeliverySettings
from bucketnotify.controller.conditions import find_condition, set_condition
from bucketnotify.delivery_health import (
    GATEWAY_DELIVERS,
    REPORT_LABEL,
    Delivering,
    Report,
    delivery_status,
    judge,
    merge,
    report_of,
    significant,
)
from bucketnotify.kube.apiserver import log_retried
from bucketnotify.kube.event_recorder import EventRecorder, ObjectRef
from bucketnotify.kube.objects import Kube

__all__ = ["CONDITION", "DeliveryStatusLoop", "desired"]

log = logging.getLogger(__name__)

CONDITION = "Delivering"
NOT_READY = Delivering(
    "Unknown",
    "TopicNotReady",
    "the Topic is not Ready (see its Ready condition): the delivery service serves it once it is",
)

EVENT_REASONS = {
    "True": "DeliveryResumed",
    "False": "DeliveryStopped",
    "Unknown": "DeliveryUnknown",
}
"""The Event posted when the condition changes, by its new status."""

Snapshot = dict[str, Any]
"""A Topic as the drift loop's index keeps it (``controller.handlers._snapshot``)."""


def _condition(status: dict[str, Any], type: str) -> dict[str, Any] | None:
    return find_condition(list(status.get("conditions") or []), type)


def desired(
    snapshot: Snapshot, reports: list[Report], now: float
) -> tuple[Delivering, dict[str, Any] | None]:
    """The Topic's Delivering condition and ``status.delivery`` (None: it has none)."""
    spec, status = snapshot["spec"], snapshot.get("status") or {}
    if not spec.get("persistent"):
        return GATEWAY_DELIVERS, None
    ready = _condition(status, "Ready")
    if ready is None or ready.get("status") != "True":
        return NOT_READY, None
    settings = DeliverySettings.model_validate(spec.get("delivery") or {})
    meta = snapshot["metadata"]
    delivery = merge(meta["namespace"], meta["name"], settings.shards, reports, now)
    condition = judge(
        delivery,
        failing_after_s=settings.failing_after,
        max_pending_age_s=settings.max_pending_age,
        now=now,
    )
    return condition, delivery_status(delivery)


def status_patch(
    snapshot: Snapshot, condition: Delivering, delivery: dict[str, Any] | None, now: dt.datetime
) -> dict[str, Any] | None:
    """The status merge patch that brings the Topic to this, or None when what it shows is
    the same to a reader (same condition status and reason, figures within rounding)."""
    status = snapshot.get("status") or {}
    current = _condition(status, CONDITION)
    shown: dict[str, Any] = status.get("delivery") or {}
    same_condition = (
        current is not None
        and current.get("status") == condition.status
        and current.get("reason") == condition.reason
    )
    if same_condition and significant(shown) == significant(delivery or {}):
        return None
    patch: dict[str, Any] = {}
    if delivery is not None or shown:
        # A merge patch merges maps: a figure no longer known is removed by its null.
        patch["delivery"] = {**{k: None for k in shown}, **(delivery or {})} if delivery else None
    if not same_condition:
        patch["conditions"] = set_condition(
            list(status.get("conditions") or []),
            type=CONDITION,
            status=condition.status,
            reason=condition.reason,
            message=condition.message,
            generation=snapshot["metadata"].get("generation"),
            now=now,
        )
    return patch


class DeliveryStatusLoop:
    """Writes the delivery status of every Topic ``topics()`` gives, every ``interval_s``."""

    def __init__(
        self,
        kube: Kube,
        events: EventRecorder,
        *,
        namespace: str,
        group: str,
        interval_s: float,
        topics: Callable[[], Iterable[Snapshot]],
    ) -> None:
        self._kube, self._events = kube, events
        self._namespace, self._group = namespace, group
        self.interval_s = interval_s
        self._topics = topics
        self._announced: dict[tuple[str, str], tuple[str, str]] = {}
        """The condition (status, reason) each Topic's last Event announced."""
        self.writes = 0
        """Status writes made (for the benchmark of the write rate)."""

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.round()
            except Exception as exc:
                log_retried(log, "writing the Topics' delivery status failed", exc)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def reports(self) -> list[Report]:
        reports = []
        for item in await self._kube.config_maps(self._namespace, f"{REPORT_LABEL}={self._group}"):
            report = report_of(item)
            if report is not None:
                reports.append(report)
            else:
                log.warning(
                    "ConfigMap %s/%s is not a delivery health report; ignored",
                    self._namespace,
                    item["metadata"]["name"],
                )
        return reports

    async def round(self) -> None:
        reports = await self.reports()
        now = time.time()
        snapshots = list(self._topics())
        seen = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in snapshots}
        for key in [k for k in self._announced if k not in seen]:
            del self._announced[key]
        for snapshot in snapshots:
            meta = snapshot["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            condition, delivery = desired(snapshot, reports, now)
            patch = status_patch(
                snapshot, condition, delivery, dt.datetime.fromtimestamp(now, dt.UTC)
            )
            if patch is None:
                continue
            written = await self._kube.patch_status(
                "topics", meta["namespace"], meta["name"], patch, meta.get("resourceVersion")
            )
            if not written:
                continue  # changed meanwhile: decided again on its new version next round
            self.writes += 1
            self._announce(snapshot, condition)

    def _announce(self, snapshot: Snapshot, condition: Delivering) -> None:
        meta = snapshot["metadata"]
        key = (meta["namespace"], meta["name"])
        before = self._announced.get(key)
        if before is None:
            current = _condition(snapshot.get("status") or {}, CONDITION)
            if current is not None:
                before = (current.get("status", ""), current.get("reason", ""))
        now_ = (condition.status, condition.reason)
        self._announced[key] = now_
        if before == now_ or (before is None and condition.status != "False"):
            return  # a new Topic delivering (or unknown) is nothing to announce
        self._events.record(
            ObjectRef("Topic", meta["namespace"], meta["name"], meta.get("uid")),
            "Warning" if condition.status == "False" else "Normal",
            EVENT_REASONS[condition.status],
            f"{condition.reason}: {condition.message}",
        )
