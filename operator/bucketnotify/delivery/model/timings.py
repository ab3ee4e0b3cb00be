"""How often the delivery service does what it does: one set of timings for its parts."""

from __future__ import annotations

from dataclasses import dataclass

from bucketnotify.delivery.model.queue import QueueLimits

__all__ = ["ServiceTimings"]


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
