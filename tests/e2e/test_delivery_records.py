"""Delivery records of a known workload add up to the same numbers as the metrics.

Everything is real: the gateway pushes each PUT (hand-off sync) to a `bucketnotify delivery`
replica, which delivers to HTTP endpoints and writes its records to a bucket on the same
gateway (or a directory); the operator makes the Topics. The admin CLI's stats and dump are
compared with the queue while events wait in it.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import gzip
import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.records import FIELDS, partition_of
from devstack.servers.recording import RecordingHttpServer
from tests.delivery import StartCluster, post_records, scrape, sync_topics
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import StartOperator
from tests.processes import run_cli
from tests.records import s3_record
from tests.s3 import s3_client
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

Counts = dict[tuple[str, str], int]
"""(topic, outcome) → records."""


def read_s3_records(s3: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """Every record under ``prefix``; checks each sits in the partition of its outcome."""
    found = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            for line in gzip.decompress(body).decode().splitlines():
                record = json.loads(line)
                assert obj["Key"].startswith(f"{prefix}{partition_of(record['outcome_time'])}/")
                found.append(record)
    return found


def read_dir_records(root: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((root / "v1").rglob("*.jsonl.gz")) if (root / "v1").exists() else []:
        for line in gzip.decompress(path.read_bytes()).decode().splitlines():
            record = json.loads(line)
            assert str(path.parent.relative_to(root / "v1")) == partition_of(record["outcome_time"])
            found.append(record)
    return found


def counts(records: list[dict[str, Any]]) -> Counts:
    return dict(collections.Counter((r["topic"], r["outcome"]) for r in records))


def answers(receiver: RecordingHttpServer, into: Counts) -> Counts:
    """Take the receiver's new requests into (path, status) → count."""
    for request in receiver.received():
        key = (request.path.strip("/"), str(request.status))
        into[key] = into.get(key, 0) + 1
    return into


def cli(settings: dict[str, str], *args: str) -> Any:
    """``bucketnotify`` with the replicas' settings (kubeconfig, store, Lease namespace)."""
    result = asyncio.run(run_cli(settings, *args))
    assert result.code == 0, result.err
    return result.json()


def test_records_add_up_to_the_metrics_of_a_known_workload(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    """Through the gateway, the ingest and a real replica writing records to a bucket on the
    gateway: 5 events delivered at once and one sent twice (a duplicate), 3 failing until the
    endpoint recovers, 3 expiring after maxRetries 2, 2 after timeToLive 3 s, 2 refused for
    good (413). The records count exactly what happened and what the metrics count."""
    records_bucket = f"bnr-{uuid.uuid4().hex[:12]}"
    cluster = delivery_cluster("dir")
    store = cluster.env["BUCKETNOTIFY_DELIVERY_STORE"]
    cluster.start(
        "replica-1",
        stats_interval_seconds="0.5",
        records=f"s3://{records_bucket}/records",
        records_flush_seconds="1",
    )
    port = cluster.ports["replica-1"]
    start_operator(ingest_url=f"http://127.0.0.1:{port}")
    s3 = s3_client(rgw)
    keys = {"up": 5, "flaky": 3, "retries": 3, "ttl": 2, "big": 2}
    seen: Counts = {}
    with (
        RecordingHttpServer() as up,
        RecordingHttpServer(status=503) as flaky,
        RecordingHttpServer(status=503) as down,
        RecordingHttpServer(status=413) as big,
    ):
        receivers = (up, flaky, down, big)
        topics = {
            "up": (up, {}),
            "flaky": (flaky, {"retrySleepDuration": 1}),
            "retries": (down, {"retrySleepDuration": 1, "maxRetries": 2}),
            "ttl": (down, {"retrySleepDuration": 1, "timeToLive": 3}),
            "big": (big, {}),
        }
        buckets = sync_topics(kubectl, namespace, s3, topics)
        for name, n in keys.items():
            for i in range(n):
                s3.put_object(Bucket=buckets[name], Key=f"k{i}", Body=b"x")
        # The same event twice in one push: the second copy is suppressed.
        token = kubectl.get("secret", "up-ingest-token", namespace)["data"]["token"]
        ingest = f"http://127.0.0.1:{port}/v1/topics/{namespace}/up/"
        ingest += base64.b64decode(token).decode()
        twice = s3_record(bucket=buckets["up"], key="dup", request_id="dup-request")
        assert post_records(ingest, [twice, twice]) == 200

        # While the flaky endpoint is down its events wait: the CLI shows the queue as is.
        wait_until(
            lambda: answers(flaky, seen),
            lambda a: a.get(("flaky", "503"), 0) >= 2 * keys["flaky"],
            40,
            "the flaky topic's events retried",
        )
        queue = QueueName(namespace, "flaky")
        local = LocalDirStore(Path(store.removeprefix("dir://")))
        stats = cli(cluster.env, "topic", "stats", "flaky", "-n", namespace, "-o", "json")
        dump = cli(cluster.env, "topic", "dump", "flaky", "-n", namespace)
        in_store = asyncio.run(local.stats(queue, 0))
        listed = [
            (shard, e.event_id)
            for shard in range(11)
            for e in asyncio.run(local.list(queue, shard))
        ]
        assert stats["entries"] == in_store.entries == keys["flaky"]
        assert stats["bytes"] == in_store.bytes
        assert {s["shard"]: s["entries"] for s in stats["shards"]} == {
            s: v.entries for s, v in in_store.shards.items()
        }
        assert {s["owner"] for s in stats["shards"]} == {"replica-1"}
        assert sorted((d["shard"], d["eventId"]) for d in dump) == sorted(listed)
        assert sorted(d["event"]["s3"]["object"]["key"] for d in dump) == ["k0", "k1", "k2"]
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        # The replica asked the default gateway its release at start, as the operator does.
        gateway = frozenset({("gateway", rgw["RGW_ENDPOINT"]), ("release", rgw["CEPH_RELEASE"])})
        assert scrape(metrics_url).get(("bucketnotify_gateway_info", gateway)) == 1
        wait_until(
            lambda: scrape(metrics_url),
            lambda m: get(m, "persistent_topic_len", namespace, "flaky") == keys["flaky"],
            20,
            "the queue length gauge of the flaky topic",
        )

        flaky.status = 200
        wait_until(
            lambda: scrape(metrics_url),
            lambda m: (
                get(m, "pubsub_push_ok_total", namespace, "up") == 6
                and get(m, "pubsub_push_ok_total", namespace, "flaky") == 3
                and get(m, "pubsub_event_lost_total", namespace, "retries") == 3
                and get(m, "pubsub_event_lost_total", namespace, "ttl") == 2
                and get(m, "pubsub_event_lost_total", namespace, "big") == 2
                and all(get(m, "persistent_topic_len", namespace, t) == 0 for t in keys)
            ),
            60,
            "every event delivered or lost",
        )
        for receiver in receivers:
            answers(receiver, seen)
        settled = dict(seen)
        time.sleep(3)  # nothing more may be pushed
    for receiver in receivers:
        answers(receiver, seen)
    assert seen == settled, "pushes after every event was delivered or dropped"

    # The numbers the endpoints saw (failed attempts of the flaky and ttl topics depend on
    # timing; the receivers counted them).
    expected: Counts = {
        ("up", "ingested"): 7,
        ("up", "delivered"): 6,
        ("up", "duplicate"): 1,
        ("flaky", "ingested"): 3,
        ("flaky", "failed"): seen[("flaky", "503")],
        ("flaky", "delivered"): 3,
        ("retries", "ingested"): 3,
        ("retries", "failed"): 9,
        ("retries", "expired"): 3,
        ("ttl", "ingested"): 2,
        ("ttl", "failed"): seen[("ttl", "503")],
        ("ttl", "expired"): 2,
        ("big", "ingested"): 2,
        ("big", "rejected"): 2,
    }
    # What timing decides, bounded by what the workload guarantees: the flaky events were
    # refused at least twice each (waited for above), each ttl event at least once.
    timed = {("flaky", "503"), ("ttl", "503")}
    assert {k: v for k, v in seen.items() if k not in timed} == {
        ("up", "200"): 6,
        ("flaky", "200"): 3,
        ("retries", "503"): 9,
        ("big", "413"): 2,
    }
    assert seen[("flaky", "503")] >= 2 * keys["flaky"]
    assert seen[("ttl", "503")] >= keys["ttl"]
    total = sum(expected.values())
    metrics = wait_until(
        lambda: scrape(metrics_url),
        lambda m: m.get(("bucketnotify_records_written_total", frozenset())) == total,
        20,
        f"{total} records written",
    )
    records = read_s3_records(s3, records_bucket, "records/v1/")
    print(f"\n{total} records: {sorted(expected.items())}")
    assert len({r["record_id"] for r in records}) == len(records) == total
    assert counts(records) == expected

    # The records add up to the metrics.
    def metric(name: str, topic: str) -> float | None:
        return get(metrics, name, namespace, topic)

    def n(topic: str, *outcomes: str) -> int:
        return sum(expected.get((topic, o), 0) for o in outcomes)

    for topic in keys:
        assert {
            "triggered": metric("pubsub_event_triggered_total", topic),
            "push_ok": metric("pubsub_push_ok_total", topic),
            "push_failed": metric("pubsub_push_failed_total", topic),
            "retries": metric("bucketnotify_push_retries_total", topic),
            "lost": metric("pubsub_event_lost_total", topic),
            "dead_lettered": metric("bucketnotify_event_dead_lettered_total", topic),
            "duplicates": metric("bucketnotify_duplicates_suppressed_total", topic),
            "latencies": metric("bucketnotify_delivery_latency_seconds_count", topic),
        } == {
            "triggered": n(topic, "ingested"),
            "push_ok": n(topic, "delivered"),
            "push_failed": n(topic, "failed", "rejected"),
            "retries": n(topic, "failed"),
            "lost": n(topic, "expired", "rejected"),
            "dead_lettered": n(topic, "dead_lettered"),
            "duplicates": n(topic, "duplicate"),
            "latencies": n(topic, "delivered"),
        }, topic
    assert metrics[("bucketnotify_records_dropped_total", frozenset())] == 0

    # Each record says what happened to its event.
    assert {f.name for f in FIELDS} == set(records[0])
    by_event: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for record in records:
        by_event[record["event_id"]].append(record)
        assert record["namespace"] == namespace and record["replica"] == "replica-1"
        assert record["endpoint_kind"] == (None if record["outcome"] == "ingested" else "http")
        assert record["bucket"] == buckets[record["topic"]]
        assert record["ingest_time"] <= record["outcome_time"]
    assert len(by_event) == sum(keys.values()) + 1
    for history in by_event.values():
        history.sort(key=lambda r: (r["outcome_time"], r["attempts"]))
        outcomes = [r["outcome"] for r in history]
        topic = history[0]["topic"]
        assert outcomes[0] == "ingested", history
        assert len({r["ingest_time"] for r in history}) == 1, "one commit, one ingest time"
        pushes = [r["attempts"] for r in history if r["outcome"] in ("failed", "delivered")]
        assert pushes == list(range(1, len(pushes) + 1)), history
        if topic == "retries":
            assert outcomes == ["ingested", "failed", "failed", "failed", "expired"]
            assert history[-1]["attempts"] == 3
            assert history[-1]["error"] == "maxRetries 2 used up after 3 attempts"
            assert all("503" in str(r["error"]) for r in history if r["outcome"] == "failed")
        elif topic == "ttl":
            assert outcomes[-1] == "expired" and history[-1]["error"] == (
                "timeToLive of 3 s passed"
            )
            assert history[-1]["attempts"] == outcomes.count("failed") >= 1
        elif topic == "big":
            assert outcomes == ["ingested", "rejected"] and "413" in history[-1]["error"]
        elif history[0]["key"] == "dup":
            assert sorted(outcomes) == ["delivered", "duplicate", "ingested", "ingested"]
        else:
            assert outcomes[-1] == "delivered" and outcomes.count("delivered") == 1
            assert history[-1]["error"] is None


def test_a_graceful_stop_writes_the_buffered_records(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
    tmp_path: Path,
) -> None:
    """Records wait for the flush interval (ten minutes here); SIGTERM writes them, into a
    directory (the embedded mode)."""
    records = tmp_path / "records"
    cluster = delivery_cluster("dir")
    cluster.start("replica-1", records=f"dir://{records}", records_flush_seconds="600")
    start_operator(ingest_url=f"http://127.0.0.1:{cluster.ports['replica-1']}")
    s3 = s3_client(rgw)
    with RecordingHttpServer() as receiver:
        buckets = sync_topics(kubectl, namespace, s3, {"quiet": (receiver, {})})
        for i in range(3):
            s3.put_object(Bucket=buckets["quiet"], Key=f"k{i}", Body=b"x")
        got: Counts = {}
        wait_until(
            lambda: answers(receiver, got),
            lambda a: a == {("quiet", "200"): 3},
            40,
            "three events delivered",
        )
        assert read_dir_records(records) == [], "nothing written before the interval"
        cluster.replicas["replica-1"].stop(signal.SIGTERM)
    assert cluster.replicas["replica-1"].process.returncode == 0
    written = read_dir_records(records)
    assert counts(written) == {("quiet", "ingested"): 3, ("quiet", "delivered"): 3}
    assert list((records / ".tmp").iterdir()) == []


def get(found: dict[Any, float], name: str, namespace: str, topic: str) -> float | None:
    return found.get((name, frozenset({("namespace", namespace), ("topic", topic)})))
