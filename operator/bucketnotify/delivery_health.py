"""Whether a persistent Topic's events flow: the replicas' health reports, and the Topic's
``status.delivery`` and ``Delivering`` condition the operator makes of them.

Both programs use this module: the delivery replicas write reports, the operator reads
them. A Topic's shards spread over every replica (a partition each), so no replica knows
the whole of a Topic; the operator, the one writer of Topic status, puts the pieces
together:

- each replica writes one ConfigMap (``report_name``) every ``interval``: the partitions
  it owns, and for every Topic it served since it started the last successful push, the
  last failure (time and a short reason, never a secret), since when its pushes fail
  without a success, and for each shard it owns what its last round left (the oldest
  entry's commit time, the entries left waiting); the owner of a Topic's shard 0 adds the
  queue's backlog from its survey (entries and bytes of every shard);
- a report older than two intervals (and ``REPORT_SLACK_S``) is a dead replica's and is
  ignored; a shard whose partition no fresh report claims has no replica;
- the operator merges the fresh reports per Topic (``merge``), judges the condition
  (``judge``), and writes the status only when the condition or a figure changed beyond
  its rounding (``significant``), at most once per Topic and interval.

Reports name Topics, shards and times only: never an event, a URL or a credential.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DATA_KEY",
    "GATEWAY_DELIVERS",
    "LEASE_GROUP",
    "REASON_MAX",
    "REPORT_LABEL",
    "REPORT_SLACK_S",
    "Backlog",
    "Delivering",
    "Report",
    "ShardHealth",
    "TopicDelivery",
    "TopicHealth",
    "delivery_status",
    "judge",
    "merge",
    "partition_of",
    "report_name",
    "report_of",
    "significant",
]

LEASE_GROUP = "bucketnotify-delivery"
"""The prefix of the delivery replicas' Lease names, and the value of their reports' label."""
REPORT_LABEL = "bucketnotify.io/delivery-health"
"""On every report ConfigMap; its value is the replicas' Lease group."""
DATA_KEY = "report.json"
REPORT_SLACK_S = 15.0
"""A report is fresh for two of its intervals and this much more: the write of a replica
that is busy, or was throttled by the API server, may come late."""
REASON_MAX = 200
"""Characters of a failure's reason kept (an endpoint's answer can be a whole page)."""
TIME_STEP_S = 60.0
"""A time in ``status.delivery`` is written again when it moved by this much or more."""


def partition_of(namespace: str, topic: str, shard: int, partitions: int) -> int:
    """The ownership partition of a Topic's shard (the delivery service's Leases)."""
    digest = hashlib.blake2b(f"{namespace}/{topic}/{shard}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def report_name(group: str, identity: str) -> str:
    """The ConfigMap of one replica's report: its identity may be any string (a pod name, a
    host name and pid), the name must be a DNS label."""
    return f"{group}-health-{hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ShardHealth(_Model):
    oldest: float | None = None
    """Commit time (epoch s) of the oldest entry the shard's last round left; None: none."""
    waiting: int = Field(default=0, ge=0)
    """Entries the last round left in the shard (failed, waiting for their retry time, or
    behind an earlier event of their object that waits)."""


class Backlog(_Model):
    events: int = Field(ge=0)
    bytes: int = Field(ge=0)
    at: float
    """When the survey looked (epoch s)."""
    dead_letters: int | None = Field(default=None, ge=0)
    """Dead letters kept in the Topic's dead-letter queue; None when it keeps none."""


class TopicHealth(_Model):
    last_success: float | None = None
    last_failure: float | None = None
    failure: str | None = Field(default=None, max_length=REASON_MAX)
    failing_since: float | None = None
    """The first failed push after this replica's last success; None while pushes succeed."""
    shards: dict[int, ShardHealth] = Field(default_factory=dict)
    backlog: Backlog | None = None
    dead_letters_discarded: float | None = None
    """The last time this replica discarded a dead letter (the kept ones at their bounds)."""


class Report(_Model):
    replica: str
    updated: float
    interval: float = Field(gt=0)
    partitions: int = Field(ge=1)
    owned: list[int] = Field(default_factory=list)
    topics: dict[str, TopicHealth] = Field(default_factory=dict)
    """By ``namespace/name``."""

    def fresh(self, now: float) -> bool:
        return now - self.updated <= 2 * self.interval + REPORT_SLACK_S


def report_of(config_map: dict[str, Any]) -> Report | None:
    """The report a ConfigMap holds, or None when it holds none (someone else's ConfigMap
    with our label, or a report this release cannot read)."""
    try:
        return Report.model_validate(json.loads((config_map.get("data") or {})[DATA_KEY]))
    except (KeyError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


@dataclass(frozen=True)
class TopicDelivery:
    """What the fresh reports together say of one Topic."""

    reported: bool
    """Some fresh report exists (a delivery replica is alive)."""
    unserved: list[int] = field(default_factory=list)
    """Shards whose partition no fresh report claims."""
    backlog_events: int | None = None
    backlog_bytes: int | None = None
    oldest: float | None = None
    waiting: int = 0
    last_success: float | None = None
    last_failure: float | None = None
    failure: str | None = None
    failing_since: float | None = None
    dead_letters: int | None = None
    dead_letters_discarded: float | None = None


def merge(
    namespace: str, topic: str, shards: int, reports: list[Report], now: float
) -> TopicDelivery:
    """One Topic's delivery from every replica's report (stale ones left out)."""
    fresh = sorted((r for r in reports if r.fresh(now)), key=lambda r: r.updated)
    if not fresh:
        return TopicDelivery(reported=False, unserved=list(range(shards)))
    key = f"{namespace}/{topic}"
    unserved: list[int] = []
    oldest: float | None = None
    waiting = 0
    for shard in range(shards):
        # The newest report that claims the shard's partition speaks for the shard: during a
        # hand-over both the old and the new owner may claim it.
        owner = next(
            (
                r
                for r in reversed(fresh)
                if partition_of(namespace, topic, shard, r.partitions) in r.owned
            ),
            None,
        )
        if owner is None:
            unserved.append(shard)
            continue
        held = owner.topics.get(key)
        figures = held.shards.get(shard) if held is not None else None
        if figures is None:
            continue
        waiting += figures.waiting
        if figures.oldest is not None and (oldest is None or figures.oldest < oldest):
            oldest = figures.oldest
    seen = [r.topics[key] for r in fresh if key in r.topics]
    backlogs = [h.backlog for h in seen if h.backlog is not None]
    backlog = max(backlogs, key=lambda b: b.at) if backlogs else None
    if backlog is not None and backlog.events == 0:
        oldest, waiting = None, 0  # the survey saw the queue empty after those rounds
    last_success = max((h.last_success for h in seen if h.last_success), default=None)
    failures = [h for h in seen if h.last_failure is not None]
    last = max(failures, key=lambda h: h.last_failure or 0.0) if failures else None
    failing = [h.failing_since for h in seen if h.failing_since is not None]
    failing_since: float | None = None
    last_failure = last.last_failure if last is not None else None
    if (
        failing
        and last_failure is not None
        and (last_success is None or last_failure > last_success)
    ):
        # Failing since the first failure after the latest success anywhere: a replica whose
        # pushes fail while another's succeed does not make the endpoint fail.
        failing_since = max(min(failing), last_success or 0.0)
    return TopicDelivery(
        reported=True,
        unserved=unserved,
        backlog_events=backlog.events if backlog else None,
        backlog_bytes=backlog.bytes if backlog else None,
        oldest=oldest,
        waiting=waiting,
        last_success=last_success,
        last_failure=last_failure,
        failure=last.failure if last else None,
        failing_since=failing_since,
        dead_letters=backlog.dead_letters if backlog else None,
        dead_letters_discarded=max(
            (h.dead_letters_discarded for h in seen if h.dead_letters_discarded), default=None
        ),
    )


@dataclass(frozen=True)
class Delivering:
    """The ``Delivering`` condition: status, reason, message."""

    status: str
    reason: str
    message: str


GATEWAY_DELIVERS = Delivering(
    "Unknown",
    "GatewayDelivers",
    "the gateway pushes this Topic's events itself and tells nothing of their delivery;"
    " set persistent: true to have the delivery service deliver them and report here",
)


def judge(
    delivery: TopicDelivery, *, failing_after_s: float, max_pending_age_s: float, now: float
) -> Delivering:
    """The condition of a persistent Topic, the first of these that holds: no replica
    serves it, its endpoint has failed for ``failing_after_s``, its oldest pending event
    is older than ``max_pending_age_s``; else True."""
    if not delivery.reported:
        return Delivering(
            "False",
            "NoReplica",
            "no delivery replica reports: is the delivery service running? events wait in"
            " the gateway's queue (handoff persistent) or are lost (handoff sync)",
        )
    if delivery.unserved:
        return Delivering(
            "False",
            "NoReplica",
            f"no delivery replica serves shards {_shards(delivery.unserved)} of this Topic;"
            " their events wait until one does (are replicas starting, or failing to renew"
            " their Leases?)",
        )
    if delivery.failing_since is not None and now - delivery.failing_since >= failing_after_s:
        return Delivering(
            "False",
            "EndpointFailing",
            f"no push has succeeded for {_age(now - delivery.failing_since)}"
            f" (last failure: {delivery.failure or 'no acknowledgement'}); the events stay"
            " queued and are retried: check the endpoint, its address and credentials",
        )
    if delivery.oldest is not None and now - delivery.oldest >= max_pending_age_s:
        return Delivering(
            "False",
            "BacklogTooOld",
            f"the oldest pending event waits for {_age(now - delivery.oldest)}, longer than"
            f" spec.delivery.maxPendingAge ({_age(max_pending_age_s)}): the endpoint is slow"
            " or refuses some events",
        )
    # One reason for True whether events wait or not: a Topic with a trickle of events goes
    # between the two at every survey, and each would be a status write and an Event.
    if delivery.backlog_events:
        return Delivering("True", "Delivering", "pushes succeed; events are pending")
    return Delivering("True", "Delivering", "pushes succeed; no event is waiting")


def delivery_status(delivery: TopicDelivery) -> dict[str, Any]:
    """``status.delivery`` (fields not known are left out)."""
    status: dict[str, Any] = {
        "backlogEvents": delivery.backlog_events,
        "backlogBytes": delivery.backlog_bytes,
        "oldestPendingTime": _time(delivery.oldest),
        "retrying": delivery.waiting,
        "lastSuccessTime": _time(delivery.last_success),
        "lastFailureTime": _time(delivery.last_failure),
        "lastFailureReason": delivery.failure,
        "failingSince": _time(delivery.failing_since),
        "unservedShards": delivery.unserved or None,
        "deadLetters": delivery.dead_letters,
        "deadLettersDiscardedTime": _time(delivery.dead_letters_discarded),
    }
    return {k: v for k, v in status.items() if v is not None}


def significant(status: dict[str, Any]) -> dict[str, Any]:
    """What of ``status.delivery`` a write is worth: counts to two significant digits,
    times to ``TIME_STEP_S`` (an exact failure reason and the set of shards without a
    replica). Two statuses with the same figures here are the same to a reader."""
    out: dict[str, Any] = {}
    for key, value in status.items():
        if key.endswith("Time") or key == "failingSince":
            out[key] = math.floor(_epoch(value) / TIME_STEP_S)
        elif isinstance(value, int) and not isinstance(value, bool):
            out[key] = _two_digits(value)
        else:
            out[key] = value
    return out


def _two_digits(value: int) -> int:
    if value < 100:
        return value
    scale: int = 10 ** (len(str(value)) - 2)
    return (value + scale // 2) // scale * scale


def _time(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _shards(shards: list[int]) -> str:
    listed = ", ".join(map(str, shards[:10]))
    return listed + (f" and {len(shards) - 10} more" if len(shards) > 10 else "")
