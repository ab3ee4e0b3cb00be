"""Metrics count exactly what happened: a known workload through the ingest and the rounds."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import kopf
from aiohttp.test_utils import TestClient, TestServer

from bucketnotify.delivery.endpoints.errors import RejectedError, UndeliverableError
from bucketnotify.delivery.endpoints.testing import MockEndpoint
from bucketnotify.delivery.ingest.handler import Ingest
from bucketnotify.delivery.model.event import event_id
from bucketnotify.delivery.model.outcomes import DeliveryPolicy
from bucketnotify.delivery.model.push import Delivery
from bucketnotify.delivery.model.queue import QueueLimits, QueueName
from bucketnotify.delivery.recorded.delivery_records import Recorder, RecordWriter
from bucketnotify.delivery.service import build_app
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.topics.ingest_tokens import IngestTopic
from bucketnotify.gateway.errors import GatewayServerError
from bucketnotify.kube.apiserver import ApiClient
from bucketnotify.metrics import DeliveryMetrics, OperatorMetrics
from tests.delivery import Samples, lone_service, one_shard_runtime, samples
from tests.kubeapi import UNREACHABLE
from tests.records import event

TOKEN = "t0ken-0123456789"


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


async def test_the_ingest_counts_committed_events_and_answers(tmp_path: Path) -> None:
    """pubsub_event_triggered counts committed events only; refused requests count by code."""
    store = LocalDirStore(tmp_path)
    queue = QueueName("ns", "t")
    await store.create(queue, 2, QueueLimits(max_entries=4))
    metrics = DeliveryMetrics()
    ingest = Ingest(store, {("ns", "t"): IngestTopic(queue, TOKEN, 2)}, metrics=metrics)
    url = f"/v1/topics/ns/t/{TOKEN}"
    async with TestClient(TestServer(build_app(ingest))) as http:
        ok = await http.post(url, json={"Records": [event("a"), event("b"), event("c")]})
        assert ok.status == 200
        assert (await http.post(url, json={"Records": [event("d")]})).status == 200
        wrong = await http.post("/v1/topics/ns/t/wrong", json={"Records": [event("e")]})
        assert wrong.status == 403
        full = await http.post(
            url, json={"Records": [event("f", sequencer=str(i)) for i in range(3)]}
        )
        assert full.status == 503
        scraped = await http.get("/metrics")
        assert scraped.status == 200
        found = samples(await scraped.text())
    t = {"namespace": "ns", "topic": "t"}
    assert value(found, "pubsub_event_triggered_total", **t) == 4
    assert value(found, "bucketnotify_ingest_commit_seconds_count", **t) == 2
    assert value(found, "bucketnotify_ingest_requests_total", code="200") == 2
    assert value(found, "bucketnotify_ingest_requests_total", code="403") == 1
    assert value(found, "bucketnotify_ingest_requests_total", code="503") == 1


async def test_rounds_count_pushes_losses_retries_and_duplicates_exactly(tmp_path: Path) -> None:
    """5 events acknowledged (one of them sent twice by the gateway), 3 failing with
    maxRetries 2, 1 undeliverable: every counter, gauge and histogram count is exact."""
    store = LocalDirStore(tmp_path)
    metrics = DeliveryMetrics()
    api = ApiClient(kopf.ConnectionInfo(server=UNREACHABLE))
    service = lone_service(api, store, metrics=metrics)
    queue = QueueName("ns", "t")
    await store.create(queue, 1, QueueLimits())
    metrics.add_topic("ns", "t")

    def handler(delivery: Delivery) -> None:
        key = delivery.record["s3"]["object"]["key"]
        if key.startswith("down"):
            raise RejectedError("503")
        if key == "huge":
            raise UndeliverableError("too large")

    endpoint = MockEndpoint(handler)
    runtime = one_shard_runtime(queue, endpoint, DeliveryPolicy(max_retries=2, retry_sleep_s=0))
    service.topics[("ns", "t")] = runtime
    events = [event(f"ok{i}") for i in range(5)]
    events += [event(f"down{i}") for i in range(3)] + [event("huge")]
    events.append(events[0])  # the gateway sent it twice
    reservation = await store.reserve(queue, 0, len(events), 100_000, 0)
    await store.commit(reservation, [(event_id(r), json.dumps(r).encode()) for r in events], 0)
    for _ in range(5):
        await service.loops.process(runtime, endpoint, 0)
    await service.survey()
    await api.close()

    found = samples(metrics.exposition().decode())
    t = {"namespace": "ns", "topic": "t"}
    assert value(found, "pubsub_push_ok_total", **t) == 5
    # down*: 3 attempts each (1 + maxRetries); huge: 1 attempt, not retried.
    assert value(found, "pubsub_push_failed_total", **t) == 3 * 3 + 1
    assert value(found, "bucketnotify_push_retries_total", **t) == 3 * 3
    assert value(found, "pubsub_event_lost_total", **t) == 3 + 1
    assert value(found, "bucketnotify_event_dead_lettered_total", **t) == 0
    assert value(found, "bucketnotify_duplicates_suppressed_total", **t) == 1
    assert value(found, "pubsub_push_pending", **t) == 0
    assert value(found, "bucketnotify_push_seconds_count", **t) == 5 + 3 * 3 + 1
    assert value(found, "bucketnotify_delivery_latency_seconds_count", **t) == 5
    assert value(found, "persistent_topic_len", **t) == 0
    assert value(found, "persistent_topic_size", **t) == 0
    assert value(found, "bucketnotify_lease_partitions_owned", replica="replica-0") == 32


async def test_a_removed_topic_stops_being_exported() -> None:
    """Label sets of a deleted Topic go away: cardinality follows the Topics that exist."""
    metrics = DeliveryMetrics()
    metrics.add_topic("ns", "gone")
    metrics.set_queue_stats("ns", "gone", 3, 30)
    assert "gone" in metrics.exposition().decode()
    metrics.remove_topic("ns", "gone")
    assert "gone" not in metrics.exposition().decode()


def test_registries_are_per_instance() -> None:
    """Two processes' worth of metrics in one interpreter do not collide."""
    a, b = OperatorMetrics(), OperatorMetrics()
    a.reconcile.labels("topic", "change", "success").inc()
    assert 'result="success"' in a.exposition().decode()
    assert 'result="success"' not in b.exposition().decode()


class KeptRecords:
    """A records target that keeps what is written, for a test to read."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    async def write(self, path: str, body: bytes) -> None:
        self.written.append(body)


async def test_a_round_cut_short_by_the_store_counts_its_pushes_once_and_no_drop(
    tmp_path: Path,
) -> None:
    """The queue store fails while removing what a round pushed (docs/records.md): the
    pushes that round made are counted and recorded, its drops are not (they did not
    happen); the next round removes the delivered entries without pushing or counting them
    again, and makes and counts the drop. Dead letters are counted once."""

    class FailingRemovals(LocalDirStore):
        failing = True

        async def remove(self, queue: QueueName, shard: int, entry_ids: Sequence[str]) -> None:
            if self.failing:
                raise GatewayServerError("SlowDown: the queue store's gateway is busy")
            await super().remove(queue, shard, entry_ids)

    store = FailingRemovals(tmp_path)
    metrics = DeliveryMetrics()
    kept = KeptRecords()
    writer = RecordWriter(kept, replica="replica-0", metrics=metrics)
    api = ApiClient(kopf.ConnectionInfo(server=UNREACHABLE))
    service = lone_service(api, store, metrics=metrics, recorder=Recorder(writer, "replica-0"))
    queue, parking = QueueName("ns", "t"), QueueName("ns", "parking")
    for q in (queue, parking):
        await store.create(q, 1, QueueLimits())
        metrics.add_topic(q.namespace, q.topic)

    def handler(delivery: Delivery) -> None:
        if delivery.record["s3"]["object"]["key"] == "huge":
            raise UndeliverableError("too large")

    endpoint = MockEndpoint(handler)
    runtime = replace(one_shard_runtime(queue, endpoint), dead_letter="parking")
    service.topics[("ns", "t")] = runtime
    parking_endpoint = MockEndpoint()
    parking_runtime = one_shard_runtime(parking, parking_endpoint)
    service.topics[("ns", "parking")] = parking_runtime
    events = [event("a"), event("b"), event("huge")]
    reservation = await store.reserve(queue, 0, len(events), 100_000, 0)
    await store.commit(reservation, [(event_id(r), json.dumps(r).encode()) for r in events], 0)
    t = {"namespace": "ns", "topic": "t"}
    counted = (
        "pubsub_push_ok_total",
        "pubsub_push_failed_total",
        "pubsub_event_lost_total",
        "bucketnotify_event_dead_lettered_total",
        "bucketnotify_duplicates_suppressed_total",
        "bucketnotify_delivery_latency_seconds_count",
    )

    def counts() -> dict[str, float]:
        found = samples(metrics.exposition().decode())
        return {name.split("_", 1)[1]: value(found, name, **t) for name in counted}

    async def outcomes() -> list[tuple[str, str]]:
        assert await writer.flush()
        return sorted(
            (record["outcome"], record["key"])
            for body in kept.written
            for record in map(json.loads, gzip.decompress(body).decode().splitlines())
        )

    try:
        first = await service.loops.process(runtime, endpoint, 0)
        after_first = (counts(), await outcomes(), len(await store.list(queue, 0)))
        store.failing = False
        second = await service.loops.process(runtime, endpoint, 0)
        after_second = (counts(), await outcomes(), await store.list(queue, 0))
        parked = await store.list(parking, 0)
        parking_result = await service.loops.process(parking_runtime, parking_endpoint, 0)
    finally:
        await service.events.aclose()
        await api.close()

    assert first is None  # cut short
    assert after_first == (
        {
            "push_ok_total": 2,
            "push_failed_total": 1,  # huge, refused for good: a failed attempt, not a drop
            "event_lost_total": 0,
            "event_dead_lettered_total": 0,
            "duplicates_suppressed_total": 0,
            "delivery_latency_seconds_count": 2,
        },
        [("delivered", "a"), ("delivered", "b"), ("failed", "huge")],
        3,  # nothing was removed
    )
    assert second is not None
    assert after_second == (
        {
            "push_ok_total": 2,  # a and b neither pushed nor counted again
            "push_failed_total": 2,
            "event_lost_total": 0,
            "event_dead_lettered_total": 1,
            "duplicates_suppressed_total": 0,
            "delivery_latency_seconds_count": 2,
        },
        [("dead_lettered", "huge"), ("delivered", "a"), ("delivered", "b"), ("failed", "huge")],
        [],
    )
    assert sorted(d.record["s3"]["object"]["key"] for d in endpoint.delivered) == ["a", "b"]
    # The dead letter is in the parking topic's queue, not lost: the cut round had handed it
    # over before its removals failed, so it is there twice with one identity, and the
    # parking topic pushes it once.
    assert {e.event_id for e in parked} == {event_id(event("huge"))}
    assert parking_result is not None and parking_result.delivered == 1
    assert [d.record["s3"]["object"]["key"] for d in parking_endpoint.delivered] == ["huge"]
    # Handed over, not pushed by the gateway: the parking topic counts it as delivered, not
    # as triggered (the gateway's events are counted once, by the topic they came to).
    found = samples(metrics.exposition().decode())
    on_parking = {"namespace": "ns", "topic": "parking"}
    assert value(found, "pubsub_event_triggered_total", **on_parking) == 0
    assert value(found, "pubsub_push_ok_total", **on_parking) == 1
