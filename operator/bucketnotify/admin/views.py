"""What the admin commands show, as pure functions of what ``cluster`` read.

Two forms of everything: *documents* (plain JSON values, camelCase keys, for ``-o json`` and
``-o yaml``) and table *rows* (strings, for people). Rows of queue stats are made from the
document, so the table and the JSON cannot disagree.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from bucketnotify.admin.dead_letters import Chosen
from bucketnotify.api.topic import ENDPOINT_KINDS
from bucketnotify.delivery.model.event import object_of
from bucketnotify.delivery.model.queue import Entry, QueueName, QueueStats
from bucketnotify.delivery.peers.ownership import (
    LeaseHolder,
    LeaseSettings,
    partition_lease_name,
    partition_of,
)

__all__ = [
    "DEAD_LETTER_COLUMNS",
    "NOTIFICATION_COLUMNS",
    "STATS_COLUMNS",
    "TOPIC_COLUMNS",
    "clean",
    "dead_letter_row",
    "dump_entry",
    "is_ready",
    "notification_row",
    "stats_document",
    "stats_rows",
    "topic_row",
]

TOPIC_COLUMNS = [
    "NAME",
    "ENDPOINT",
    "PERSISTENT",
    "GATEWAY",
    "READY",
    "REASON",
    "DELIVERING",
    "BACKLOG",
    "OLDEST",
    "AGE",
]
NOTIFICATION_COLUMNS = ["NAME", "BUCKET", "TOPIC", "EVENTS", "FILTERS", "READY", "AGE"]
STATS_COLUMNS = ["SHARD", "ENTRIES", "BYTES", "RESERVATIONS", "PARTITION", "OWNER"]
DEAD_LETTER_COLUMNS = [
    "ID",
    "BUCKET",
    "KEY",
    "EVENT",
    "EVENT TIME",
    "ATTEMPTS",
    "FIRST FAILURE",
    "LAST FAILURE",
    "DROPPED",
    "REASON",
]

NONE = "-"


def clean(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without managedFields: bookkeeping of the API server nobody asked for."""
    metadata = {k: v for k, v in obj.get("metadata", {}).items() if k != "managedFields"}
    return {**obj, "metadata": metadata}


def _timestamp(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="microseconds")[:-6] + "Z"


def age(created: str | None, now: dt.datetime) -> str:
    """kubectl's AGE, to the largest whole unit."""
    if not created:
        return NONE
    then = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _condition(obj: dict[str, Any], type: str) -> dict[str, Any]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type), {})


def _ready(obj: dict[str, Any]) -> dict[str, Any]:
    return _condition(obj, "Ready")


def is_ready(obj: dict[str, Any]) -> bool:
    """The object's Ready condition is True."""
    return _ready(obj).get("status") == "True"


def _name(obj: dict[str, Any], all_namespaces: bool) -> list[str]:
    meta = obj["metadata"]
    return [meta["namespace"], meta["name"]] if all_namespaces else [meta["name"]]


def topic_row(obj: dict[str, Any], now: dt.datetime, all_namespaces: bool) -> list[str]:
    spec = obj.get("spec") or {}
    endpoint = spec.get("endpoint") or {}
    kind = next((k for k in ENDPOINT_KINDS if endpoint.get(k)), NONE)
    ready = _ready(obj)
    status = obj.get("status") or {}
    delivery = status.get("delivery") or {}
    backlog = delivery.get("backlogEvents")
    return [
        *_name(obj, all_namespaces),
        kind,
        "true" if spec.get("persistent") else "false",
        # The gateway's Ceph release: what the Topic may ask of it depends on it.
        status.get("gatewayRelease") or NONE,
        ready.get("status", NONE),
        ready.get("reason", NONE),
        # As kubectl's columns: the Delivering condition, the backlog, the oldest's age.
        _condition(obj, "Delivering").get("status", NONE),
        NONE if backlog is None else str(backlog),
        age(delivery.get("oldestPendingTime"), now) if delivery.get("oldestPendingTime") else NONE,
        age(obj["metadata"].get("creationTimestamp"), now),
    ]


def _events(spec: dict[str, Any]) -> str:
    # Empty means every Created and Removed event; say so rather than show nothing.
    events = spec.get("events") or ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]
    return ",".join(e.removeprefix("s3:") for e in events)


def _filters(spec: dict[str, Any]) -> str:
    rules = spec.get("filter") or {}
    parts = [f"{k}={v}" for k, v in (rules.get("key") or {}).items()]
    parts += [f"{r['name']}={r['value']}" for r in rules.get("metadata") or []]
    parts += [f"tag:{r['name']}={r['value']}" for r in rules.get("tags") or []]
    return ",".join(parts) or NONE


def notification_row(obj: dict[str, Any], now: dt.datetime, all_namespaces: bool) -> list[str]:
    spec = obj.get("spec") or {}
    return [
        *_name(obj, all_namespaces),
        spec.get("bucket") or (obj.get("status") or {}).get("bucket") or NONE,
        (spec.get("topicRef") or {}).get("name") or spec.get("topicARN") or NONE,
        _events(spec),
        _filters(spec),
        _ready(obj).get("status", NONE),
        age(obj["metadata"].get("creationTimestamp"), now),
    ]


def stats_document(
    queue: QueueName,
    stats: QueueStats,
    holders: dict[int, LeaseHolder],
    leases: LeaseSettings,
) -> dict[str, Any]:
    """Per shard: what the queue holds and who owns it (the live holder of its Lease)."""
    shards = []
    for shard, numbers in sorted(stats.shards.items()):
        partition = partition_of(queue, shard, leases.partitions)
        holder = holders.get(partition)
        shards.append(
            {
                "shard": shard,
                "entries": numbers.entries,
                "bytes": numbers.bytes,
                "reservations": numbers.reservations,
                "partition": partition,
                "owner": holder.identity if holder and not holder.expired else None,
                "lease": None
                if holder is None
                else {
                    "name": partition_lease_name(leases.group, partition),
                    "namespace": leases.namespace,
                    "holder": holder.identity,
                    "expired": holder.expired,
                },
            }
        )
    return {
        "topic": str(queue),
        "entries": stats.entries,
        "bytes": stats.bytes,
        "reservations": stats.reservations,
        "shards": shards,
    }


def _owner(shard: dict[str, Any]) -> str:
    lease = shard["lease"]
    if lease is None or not lease["holder"]:
        return NONE  # never taken, or handed back
    if lease["expired"]:
        return f"none (expired: {lease['holder']})"
    return str(lease["holder"])


def stats_rows(document: dict[str, Any]) -> list[list[str]]:
    rows = [
        [
            str(s["shard"]),
            str(s["entries"]),
            str(s["bytes"]),
            str(s["reservations"]),
            str(s["partition"]),
            _owner(s),
        ]
        for s in document["shards"]
    ]
    total = [str(document[k]) for k in ("entries", "bytes", "reservations")]
    return [*rows, ["total", *total, "", ""]]


def dump_entry(shard: int, entry: Entry) -> dict[str, Any]:
    """One pending event: where it is, its delivery state, and the event record itself."""
    document: dict[str, Any] = {
        "shard": shard,
        "id": entry.id,
        "eventId": entry.event_id,
        "attempts": entry.attempts,
        "ingestTime": _timestamp(entry.ingest_time),
        "notBefore": _timestamp(entry.not_before) if entry.not_before else None,
    }
    if entry.first_failure:
        document["firstFailure"] = _timestamp(entry.first_failure)
        document["lastFailure"] = _timestamp(entry.last_failure)
        document["lastError"] = entry.last_error
    try:
        document["event"] = json.loads(entry.body)
    except ValueError:
        # Not JSON (the ingest only stores JSON, so this is someone else's write): as text.
        document["body"] = entry.body.decode("utf-8", "replace")
    return document


def dead_letter_row(chosen: Chosen) -> list[str]:
    """One dead letter for people: where, what, and why it was dropped."""
    letter = chosen.letter
    record = letter.record() or {}
    bucket, key = object_of(record)
    reason = letter.reason
    if letter.last_error and letter.last_error not in reason:
        reason = f"{reason}; last error: {letter.last_error}"
    return [
        chosen.entry.id,
        bucket or NONE,
        key or NONE,
        str(record.get("eventName") or NONE),
        str(record.get("eventTime") or NONE),
        str(letter.attempts),
        _timestamp(letter.first_failure) if letter.first_failure else NONE,
        _timestamp(letter.last_failure) if letter.last_failure else NONE,
        _timestamp(letter.dropped_at),
        " ".join(reason.split())[:120],
    ]
