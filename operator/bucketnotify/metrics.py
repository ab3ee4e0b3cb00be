"""Every Prometheus metric of the delivery service and of the operator, in one place.

Each process makes its own ``CollectorRegistry`` (``DeliveryMetrics()`` or
``OperatorMetrics()``), not prometheus_client's global one, so tests and embedders can run
several in one interpreter. The names the reference (the gateway's perf counters) has keep
its names and meaning; the rest are ``bucketnotify_*``. Labels are bounded: ``namespace``
and ``topic`` (one per Topic), ``replica``, ``kind``, ``action``, ``result``, ``reason``
and ``code`` (small fixed sets); never an object key or an event id.

docs/metrics.md lists every metric with its type, labels and meaning.

This module imports nothing of ours: every layer may use it.
"""

from __future__ import annotations

import contextlib
import platform
from importlib.metadata import version

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["CONTENT_TYPE_LATEST", "DeliveryMetrics", "OperatorMetrics"]

TOPIC = ("namespace", "topic")

# Seconds: a local commit takes milliseconds, an S3 commit tens of them.
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Seconds: from a sub-second hand-off to retries over hours.
LATENCY_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
PUSH_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RECONCILE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def build_info(registry: CollectorRegistry) -> None:
    """``bucketnotify_build_info``: what runs, for alerts and dashboards across an upgrade."""
    Gauge(
        "bucketnotify_build_info",
        "1, labelled with the version of bucketnotify and of the Python running it.",
        ("version", "python"),
        registry=registry,
    ).labels(version("bucketnotify"), platform.python_version()).set(1)


class DeliveryMetrics:
    """The metrics of one delivery replica."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        build_info(r)
        # Counters are created without the _total suffix so the reference's names stay
        # exactly as they are (prometheus_client exposes "<name>_total" for counters).
        self.event_triggered = Counter(
            "pubsub_event_triggered",
            "Events the gateway pushed to the ingest and that were committed to the queue (or "
            "delivered directly, see bucketnotify_events_direct).",
            TOPIC,
            registry=r,
        )
        self.events_direct = Counter(
            "bucketnotify_events_direct",
            "Events the ingest delivered to the endpoint itself before answering, without "
            "queueing them (direct delivery).",
            TOPIC,
            registry=r,
        )
        self.event_lost = Counter(
            "pubsub_event_lost",
            "Events dropped without being delivered (timeToLive, maxRetries or "
            "undeliverable) and not handed to a dead-letter topic.",
            TOPIC,
            registry=r,
        )
        self.event_dead_lettered = Counter(
            "bucketnotify_event_dead_lettered",
            "Events dropped from a topic and committed to its dead-letter topic's queue or kept"
            " as dead letters in the store.",
            TOPIC,
            registry=r,
        )
        self.push_ok = Counter(
            "pubsub_push_ok",
            "Push attempts the endpoint acknowledged.",
            TOPIC,
            registry=r,
        )
        self.push_failed = Counter(
            "pubsub_push_failed",
            "Push attempts that failed (retryable or not).",
            TOPIC,
            registry=r,
        )
        self.push_pending = Gauge(
            "pubsub_push_pending",
            "Pushes handed to an endpoint and not acknowledged or failed yet.",
            TOPIC,
            registry=r,
        )
        self.push_retries = Counter(
            "bucketnotify_push_retries",
            "Failed pushes whose entry was kept in the queue for another attempt.",
            TOPIC,
            registry=r,
        )
        self.duplicates = Counter(
            "bucketnotify_duplicates_suppressed",
            "Queue entries removed unsent because their event was already delivered.",
            TOPIC,
            registry=r,
        )
        self.topic_len = Gauge(
            "persistent_topic_len",
            "Entries in a topic's queue, exported by the replica owning its shard 0.",
            TOPIC,
            registry=r,
        )
        self.topic_size = Gauge(
            "persistent_topic_size",
            "Bytes of the entries in a topic's queue, exported by the replica owning its shard 0.",
            TOPIC,
            registry=r,
        )
        self.dead_letters = Gauge(
            "bucketnotify_dead_letters",
            "Dead letters kept in a topic's dead-letter queue (spec.delivery.deadLetters.keep),"
            " exported by the replica owning the topic's shard 0.",
            TOPIC,
            registry=r,
        )
        self.dead_letters_size = Gauge(
            "bucketnotify_dead_letters_size",
            "Bytes of the dead letters kept for a topic.",
            TOPIC,
            registry=r,
        )
        self.dead_letters_kept = Counter(
            "bucketnotify_dead_letters_kept",
            "Dropped events kept as dead letters in the topic's dead-letter queue.",
            TOPIC,
            registry=r,
        )
        self.dead_letters_discarded = Counter(
            "bucketnotify_dead_letters_discarded",
            "Dropped events not kept because the topic's dead letters reached"
            " spec.delivery.deadLetters maxEntries or maxBytes (lost, unless a dead-letter"
            " topic took them).",
            TOPIC,
            registry=r,
        )
        self.dead_letters_redriven = Counter(
            "bucketnotify_dead_letters_redriven",
            "Dead letters moved back into the topic's queue by `bucketnotify dead-letters"
            " redrive` (counted from its tallies by the replica owning the topic's shard 0).",
            TOPIC,
            registry=r,
        )
        self.dead_letters_purged = Counter(
            "bucketnotify_dead_letters_purged",
            "Dead letters removed for good by `bucketnotify dead-letters purge`.",
            TOPIC,
            registry=r,
        )
        self.ingest_commit_seconds = Histogram(
            "bucketnotify_ingest_commit_seconds",
            "Time to reserve and commit one ingest request's events to the queue.",
            TOPIC,
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.ingest_requests = Counter(
            "bucketnotify_ingest_requests",
            "Requests to the ingest, by HTTP status code of the answer.",
            ("code",),
            registry=r,
        )
        self.delivery_latency_seconds = Histogram(
            "bucketnotify_delivery_latency_seconds",
            "From the ingest commit of an event to the endpoint's acknowledgement.",
            TOPIC,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.push_seconds = Histogram(
            "bucketnotify_push_seconds",
            "Duration of the push wave a push went out in (one observation per push).",
            TOPIC,
            buckets=PUSH_BUCKETS,
            registry=r,
        )
        self.ingest_forwarded = Counter(
            "bucketnotify_ingest_forwarded",
            "Ingest requests this replica sent on to the owner of their shard (outcome: ok,"
            " the owner answered; refused or failed, this replica handled them itself).",
            ("outcome",),
            registry=r,
        )
        self.wakeups_sent = Counter(
            "bucketnotify_wakeups_sent",
            "Shards this replica told their owner about after committing to them "
            "(outcome: ok, refused, failed; a lost one waits for the queue survey).",
            ("outcome",),
            registry=r,
        )
        self.wakeups_received = Counter(
            "bucketnotify_wakeups_received",
            "Shards other replicas told this one about (those it owns start a round).",
            registry=r,
        )
        self.partitions_owned = Gauge(
            "bucketnotify_lease_partitions_owned",
            "Ownership partitions (Leases) this replica holds.",
            ("replica",),
            registry=r,
        )
        self.records_written = Counter(
            "bucketnotify_records_written",
            "Delivery records written to the records store.",
            registry=r,
        )
        self.records_dropped = Counter(
            "bucketnotify_records_dropped",
            "Delivery records dropped unwritten because the buffer was full (oldest first).",
            registry=r,
        )
        self.records_write_failures = Counter(
            "bucketnotify_records_write_failures",
            "Batch writes to the records store that failed (the batch is kept and retried).",
            registry=r,
        )
        self.records_buffered = Gauge(
            "bucketnotify_records_buffered",
            "Delivery records in memory waiting to be written.",
            registry=r,
        )
        self.gateway_info = Gauge(
            "bucketnotify_gateway_info",
            "1 for the default gateway, labelled with its endpoint and the Ceph release it"
            " runs as learned from it at start (unknown: it did not answer) or set.",
            ("gateway", "release"),
            registry=r,
        )

    _per_topic = (
        "event_triggered",
        "events_direct",
        "event_lost",
        "event_dead_lettered",
        "dead_letters_kept",
        "dead_letters_discarded",
        "dead_letters_redriven",
        "dead_letters_purged",
        "push_ok",
        "push_failed",
        "push_pending",
        "push_retries",
        "duplicates",
        "ingest_commit_seconds",
        "delivery_latency_seconds",
        "push_seconds",
    )

    def add_topic(self, namespace: str, topic: str) -> None:
        """Export a Topic's series from the start (at 0), not only after its first event."""
        for name in self._per_topic:
            getattr(self, name).labels(namespace, topic)

    def remove_topic(self, namespace: str, topic: str) -> None:
        """Stop exporting a Topic's series (the Topic is gone: bounded cardinality)."""
        for name in (
            *self._per_topic,
            "topic_len",
            "topic_size",
            "dead_letters",
            "dead_letters_size",
        ):
            metric = getattr(self, name)
            with contextlib.suppress(KeyError):
                metric.remove(namespace, topic)

    def set_queue_stats(self, namespace: str, topic: str, entries: int, size: int) -> None:
        self.topic_len.labels(namespace, topic).set(entries)
        self.topic_size.labels(namespace, topic).set(size)

    def set_dead_letter_stats(self, namespace: str, topic: str, entries: int, size: int) -> None:
        self.dead_letters.labels(namespace, topic).set(entries)
        self.dead_letters_size.labels(namespace, topic).set(size)

    def drop_dead_letter_stats(self, namespace: str, topic: str) -> None:
        for metric in (self.dead_letters, self.dead_letters_size):
            with contextlib.suppress(KeyError):
                metric.remove(namespace, topic)

    def drop_queue_stats(self, namespace: str, topic: str) -> None:
        """Another replica owns the queue's shard 0 now and exports its length."""
        self.drop_dead_letter_stats(namespace, topic)
        for metric in (self.topic_len, self.topic_size):
            with contextlib.suppress(KeyError):
                metric.remove(namespace, topic)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class OperatorMetrics:
    """The metrics of one operator process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        build_info(r)
        self.reconcile = Counter(
            "bucketnotify_reconcile",
            "Handler runs, by kind (topic, notification), action (change, drift, delete) "
            "and result (success, not_ready, retry, error).",
            ("kind", "action", "result"),
            registry=r,
        )
        self.reconcile_errors = Counter(
            "bucketnotify_reconcile_errors",
            "Handler runs that did not end ready, by kind and reason (the Ready condition's "
            "reason, or the exception's class).",
            ("kind", "reason"),
            registry=r,
        )
        self.bucket_writes = Counter(
            "bucketnotify_bucket_writes",
            "Writes of a bucket's notification configuration (one PUT each).",
            registry=r,
        )
        self.bucket_write_notifications = Counter(
            "bucketnotify_bucket_write_notifications",
            "BucketNotifications written by those writes: over bucket_writes, the mean"
            " number written together.",
            registry=r,
        )
        self.gateway_requests = Counter(
            "bucketnotify_gateway_requests",
            "HTTP requests the operator sent to its gateways, by operation (ListTopics,"
            " CreateTopic, GetBucketNotificationConfiguration...), retries included: over a"
            " drift interval with nothing changing, what the drift checks cost the gateway.",
            ("operation",),
            registry=r,
        )
        self.leader = Gauge(
            "bucketnotify_operator_leader",
            "1 while this operator replica holds the leader Lease and reconciles, else 0;"
            " summed over the replicas, 1 (none: nothing is reconciled).",
            registry=r,
        )
        self.gateway_info = Gauge(
            "bucketnotify_gateway_info",
            "1 for each gateway the operator talks to, labelled with its endpoint and the Ceph"
            " release it runs (pacific, reef, tentacle...) as learned from it or set.",
            ("gateway", "release"),
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "bucketnotify_reconcile_seconds",
            "Duration of one handler run.",
            ("kind", "action"),
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
