"""How often the delivery service does what it does: one set of timings for its parts.

Each default is the setting's (``DeliveryServiceSettings``), written there once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bucketnotify.settings import DeliveryServiceSettings


def setting_default(name: str) -> Any:
    """The default of the delivery setting ``name``: a part's own default repeats none."""
    return DeliveryServiceSettings.model_fields[name].default


__all__ = ["ServiceTimings"]


@dataclass(frozen=True)
class ServiceTimings:
    refresh_interval_s: float = setting_default("refresh_interval_seconds")
    """How often the persistent Topics are listed."""
    secret_refresh_s: float = setting_default("secret_refresh_seconds")
    """How often the Secrets of a known, unchanged Topic are read again."""
    token_overlap_s: float = setting_default("token_overlap_seconds")
    """How long a replaced ingest token is still taken: the gateway pushes with it until the
    operator has rewritten the gateway topic (seconds, or longer while the operator is
    down)."""
    round_interval_s: float = 0.2
    """Poll interval of a shard that had work."""
    idle_max_s: float = setting_default("idle_poll_max_seconds")
    """Longest poll interval of a shard whose entries all wait for their retry time (an
    empty shard is not polled: it is woken)."""
    sweep_interval_s: float = setting_default("sweep_interval_seconds")
    """How often orphaned or drained queues are deleted."""
    reservation_timeout_s: float = setting_default("reservation_timeout_seconds")
    """A reservation not committed for this long (its writer died) is reclaimed."""
    drain_timeout_s: float = 3.0
    """How long a hand-back or a shutdown waits for running rounds to finish. A hand-back
    waits inside the Lease round, so this must stay below renew deadline - renew interval
    (8 - 3 s by default), or the replica would fence itself meanwhile."""
    stats_interval_s: float = setting_default("stats_interval_seconds")
    """How often the owner of a queue's shard 0 surveys the queue (one LIST on the S3
    store): the length and size gauges, expired reservations reclaimed, and shards with
    entries woken, which bounds how long a lost wake-up delays an event."""

    health_report_interval_s: float = setting_default("health_report_interval_seconds")
    """How often the replica writes its delivery health report (``delivery_health``)."""

    @classmethod
    def of(cls, settings: DeliveryServiceSettings) -> ServiceTimings:
        """The timings a replica's settings ask for."""
        return cls(
            refresh_interval_s=settings.refresh_interval_seconds,
            secret_refresh_s=settings.secret_refresh_seconds,
            token_overlap_s=settings.token_overlap_seconds,
            idle_max_s=settings.idle_poll_max_seconds,
            sweep_interval_s=settings.sweep_interval_seconds,
            reservation_timeout_s=settings.reservation_timeout_seconds,
            stats_interval_s=settings.stats_interval_seconds,
            health_report_interval_s=settings.health_report_interval_seconds,
        )
