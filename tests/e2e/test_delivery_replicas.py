"""The delivery service as several real processes: spread, failover, crashed writers.

Everything is real: replicas as separate `bucketnotify delivery` processes sharing the S3
queue store on Ceph RGW, Leases on the apiserver, the operator, the gateway pushing through
a balancer (a Service's part) to the ingest, and an HTTP endpoint.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from bucketnotify.delivery.model.event import shard_of
from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.peers.leases import LeaseSettings
from bucketnotify.delivery.peers.ownership import partition_of
from bucketnotify.delivery.rounds.shard_loops import HANDOVER_POLL_ROUNDS
from devstack.servers.recording import RecordingHttpServer
from tests.delivery import DeliveryCluster, StartCluster, post_events, scrape, sync_topics
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import StartOperator
from tests.processes import free_port
from tests.resources import apply, condition
from tests.s3 import s3_client
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

PARTITIONS = 32  # the default
SHARDS = 11  # the default


def delivered(receiver: RecordingHttpServer, into: list[tuple[str, float]]) -> list[str]:
    """Take the newly acknowledged records as (key, time) into ``into``; their keys."""
    keys = []
    for request in receiver.received():
        if request.status != 200:
            continue
        for record in json.loads(request.body)["Records"]:
            keys.append(record["s3"]["object"]["key"])
            into.append((keys[-1], request.time))
    return keys


def spread(holders: dict[int, str]) -> list[int]:
    return sorted(collections.Counter(holders.values()).values())


def keys_by_owner(
    holders: dict[int, str], queue: QueueName, bucket: str, count: int
) -> dict[str, list[str]]:
    """Up to ``count`` object keys (obj-000, obj-001, ...) per replica whose shard it owns."""
    keys: dict[str, list[str]] = collections.defaultdict(list)
    for i in range(200):
        key = f"obj-{i:03d}"
        owner = holders.get(partition_of(queue, shard_of(bucket, key, SHARDS), PARTITIONS))
        if owner is not None and len(keys[owner]) < count:
            keys[owner].append(key)
    return keys


def two_replicas(
    cluster: DeliveryCluster,
    start_operator: StartOperator,
    b_only: dict[str, str] | None = None,
    **settings: str,
) -> None:
    """Replicas a and b with 16 partitions each (``b_only``: settings of b besides
    ``settings``), and the operator pointing the gateway at a alone."""
    cluster.start("replica-a", **settings)
    cluster.start("replica-b", **settings, **(b_only or {}))
    wait_until(
        cluster.holders,
        lambda h: len(h) == PARTITIONS and spread(h) == [16, 16],
        30,
        "32 partitions spread 16/16 over two replicas",
    )
    start_operator(ingest_url=f"http://127.0.0.1:{cluster.ports['replica-a']}")


def replica_metric(cluster: DeliveryCluster, replica: str, sample: str, **labels: str) -> float:
    """One series of one replica's ``GET /metrics``; 0 when it has none yet."""
    found = scrape(f"http://127.0.0.1:{cluster.ports[replica]}/metrics")
    return found.get((sample, frozenset(labels.items())), 0.0)


def test_three_replicas_spread_evenly_and_a_killed_owner_loses_nothing(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    cluster = delivery_cluster("s3")
    for i in range(3):
        cluster.start(f"replica-{i}")
    balancer = cluster.front()
    wait_until(
        cluster.holders,
        lambda h: len(h) == PARTITIONS and spread(h) == [10, 11, 11],
        30,
        "32 partitions spread 10/11/11 over three replicas",
    )
    wait_until(
        lambda: cluster.metric("bucketnotify_lease_partitions_owned"),
        lambda owned: owned == PARTITIONS,
        30,
        "the replicas' bucketnotify_lease_partitions_owned to sum to PARTITIONS",
    )
    start_operator(ingest_url=balancer.url)
    s3 = s3_client(rgw)
    bucket = f"ko-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    events = 600
    keys = [f"obj-{i:04d}" for i in range(events)]
    # Gateway topics (and their persistent queues) are per tenant, not per namespace: a
    # name of its own keeps other tests' leftovers out of this topic's gateway queue.
    topic = f"durable-{uuid.uuid4().hex[:8]}"
    # A slow endpoint keeps batches in flight, so the kill lands in the middle of one.
    with RecordingHttpServer(delay_s=0.1) as receiver:
        apply(
            kubectl,
            namespace,
            "Topic",
            topic,
            {"endpoint": {"http": {"url": receiver.url}}, "persistent": True},
        )
        condition(kubectl, namespace, "topic", topic)
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            "n",
            {
                "bucket": bucket,
                "topicRef": {"name": topic},
                "testEvent": False,
                "events": ["s3:ObjectCreated:Put"],
            },
        )
        condition(kubectl, namespace, "bucketnotification", "n")

        got: list[tuple[str, float]] = []
        with ThreadPoolExecutor(4) as writers:
            puts = writers.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=b"x" * 100), keys)
            wait_until(
                lambda: (delivered(receiver, got), len(got))[1],
                lambda n: n >= events // 3,
                120,
                "a third of the events delivered",
            )
            queue = QueueName(namespace, topic)
            holders = cluster.holders()
            owner_of = {s: holders.get(partition_of(queue, s, PARTITIONS)) for s in range(SHARDS)}
            victim = collections.Counter(owner_of.values()).most_common(1)[0][0]
            assert victim is not None
            victim_shards = {s for s, owner in owner_of.items() if owner == victim}
            killed_at = time.time()
            cluster.kill(victim)
            list(puts)  # every PUT succeeded
        pending_at_kill = {k for k in keys if shard_of(bucket, k, SHARDS) in victim_shards} - {
            k for k, _ in got
        }
        assert pending_at_kill, "the killed replica had nothing left to deliver: no failover"

        wait_until(
            lambda: (delivered(receiver, got), {k for k, _ in got})[1],
            lambda seen: seen == set(keys),
            120,
            "every event delivered after the kill",
        )
        # Every entry removed: no push of them is still to come, so every duplicate is in.
        wait_until(
            lambda: cluster.queued(QueueName(namespace, topic), SHARDS),
            lambda left: left == [],
            60,
            "every entry removed",
        )
        delivered(receiver, got)

    counts = collections.Counter(k for k, _ in got)
    duplicates = sum(n - 1 for n in counts.values())
    resumed = min(
        t for k, t in got if k in pending_at_kill and t > killed_at + 0.5
    )  # the killed replica's own answers were in flight for up to 0.1 s
    print(
        f"\nkilled {victim} owning shards {sorted(victim_shards)} with "
        f"{len(pending_at_kill)} events pending; its shards resumed after "
        f"{resumed - killed_at:.1f} s; {duplicates} duplicates of {events} events"
    )
    assert set(counts) == set(keys), "no event lost"
    # Only entries the dead owner pushed and never removed can go out twice; every other
    # gateway re-send is recognised by the shard's owner.
    duplicated_shards = {shard_of(bucket, k, SHARDS) for k, n in counts.items() if n > 1}
    assert duplicated_shards <= victim_shards, "duplicates outside the killed replica's shards"
    # How fast is bench.failover's figure (printed above); that they took over at all is the
    # behaviour: every event arrived, and the survivors hold every partition.
    wait_until(
        cluster.holders,
        lambda h: len(h) == PARTITIONS and spread(h) == [16, 16] and victim not in h.values(),
        30,
        "the survivors share every partition",
    )
    # The gauge is set by each replica's survey (every STATS_INTERVAL_SECONDS): once the
    # survivors' next surveys ran, it sums to PARTITIONS over them.
    wait_until(
        lambda: cluster.metric("bucketnotify_lease_partitions_owned"),
        lambda owned: owned == PARTITIONS,
        90,
        "the survivors' bucketnotify_lease_partitions_owned to sum to PARTITIONS",
    )

    def exporting_queue_length() -> set[str]:
        return {
            name
            for name, program in cluster.replicas.items()
            if program.process.poll() is None
            and any(
                sample == "persistent_topic_len" and ("topic", topic) in series
                for sample, series in scrape(f"http://127.0.0.1:{cluster.ports[name]}/metrics")
            )
        }

    # Only the owner of shard 0 exports the queue's gauges (the others drop the series),
    # once its survey ran (every STATS_INTERVAL_SECONDS, 30 s).
    shard_0_owner = cluster.holders()[partition_of(QueueName(namespace, topic), 0, PARTITIONS)]
    wait_until(
        exporting_queue_length,
        lambda names: names == {shard_0_owner},
        90,
        f"persistent_topic_len of {topic} from {shard_0_owner} alone",
    )


CRASHING_WRITER = """
import asyncio, os, signal, time
from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.stores.s3 import S3Store
from bucketnotify.gateway.connection import GatewayConnection

async def main():
    store = S3Store(GatewayConnection(*os.environ["GATEWAY"].split(" ")), os.environ["BUCKET"])
    await store.reserve(QueueName(*os.environ["QUEUE"].split("/")), 0, 2, 100, time.time())
    os.kill(os.getpid(), signal.SIGKILL)  # between reserve and commit

asyncio.run(main())
"""


def test_a_writer_killed_between_reserve_and_commit_leaks_no_reservation(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    cluster = delivery_cluster("s3")
    # Every event queued: a direct push would not need the room the dead writer holds.
    cluster.start(
        "replica-1",
        reservation_timeout_seconds="3",
        stats_interval_seconds="1",
        direct_delivery="false",
    )
    port = cluster.ports["replica-1"]
    start_operator(ingest_url=f"http://127.0.0.1:{port}")
    with RecordingHttpServer() as receiver:
        apply(
            kubectl,
            namespace,
            "Topic",
            "small",
            {
                "endpoint": {"http": {"url": receiver.url}},
                "persistent": True,
                "delivery": {"handoff": "sync", "shards": 1, "maxQueueEntries": 2},
            },
        )
        condition(kubectl, namespace, "topic", "small")
        secret = kubectl.get("secret", "small-ingest-token", namespace)
        token = base64.b64decode(secret["data"]["token"]).decode()
        ingest = f"http://127.0.0.1:{port}/v1/topics/{namespace}/small/{token}"
        wait_until(
            lambda: post_events(ingest, ["first"]),
            lambda status: status == 200,
            30,
            "the replica serves the topic",
        )
        wait_until(receiver.received, bool, 20, "the first event delivered")

        bucket = cluster.env["BUCKETNOTIFY_DELIVERY_STORE"].removeprefix("s3://")
        writer = subprocess.run(
            [sys.executable, "-c", CRASHING_WRITER],
            env={
                **os.environ,
                "GATEWAY": " ".join(
                    rgw[k] for k in ("RGW_ENDPOINT", "RGW_ACCESS_KEY", "RGW_SECRET_KEY")
                ),
                "BUCKET": bucket,
                "QUEUE": f"{namespace}/small",
            },
            capture_output=True,
            text=True,
            check=False,
        )
        assert writer.returncode == -9, writer.stderr
        s3 = s3_client(rgw)
        markers = f"queues/data/{namespace}/small/reservations/"

        def leaked() -> int:
            listed = s3.list_objects_v2(Bucket=bucket, Prefix=markers)
            return int(listed.get("KeyCount", 0))

        assert leaked() == 1
        # The dead writer's reservation fills the queue: refused, and nothing enqueued.
        assert [post_events(ingest, [f"refused-{i}"]) for i in range(3)] == [503, 503, 503]
        # After the reservation timeout it no longer counts, and the sweep removes it.
        wait_until(leaked, lambda n: n == 0, 20, "the abandoned reservation reclaimed")
        assert post_events(ingest, ["accepted"]) == 200
        arrived = wait_until(
            lambda: [r for q in receiver.received() for r in json.loads(q.body)["Records"]],
            bool,
            20,
            "the accepted event delivered",
        )
        wait_until(
            lambda: cluster.queued(QueueName(namespace, "small"), 1),
            lambda left: left == [],
            30,
            "the accepted event removed",
        )
        arrived += [r for q in receiver.received() for r in json.loads(q.body)["Records"]]
    assert [r["s3"]["object"]["key"] for r in arrived] == ["accepted"]
    log = cluster.replicas["replica-1"].log()
    assert "reclaimed 1 abandoned reservations" in log


def test_endpoint_outages_retry_until_delivered_or_expire_as_configured(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    cluster = delivery_cluster("dir")
    cluster.start("replica-1")
    port = cluster.ports["replica-1"]
    start_operator(ingest_url=f"http://127.0.0.1:{port}")
    s3 = s3_client(rgw)
    with (
        RecordingHttpServer(status=503) as recovering,
        RecordingHttpServer(status=503) as down,
        RecordingHttpServer() as parking,
    ):
        apply(
            kubectl,
            namespace,
            "Topic",
            "parking",
            {"endpoint": {"http": {"url": f"{parking.url}/parking"}}, "persistent": True},
        )
        dead_letter = {"handoff": "sync", "deadLetterTopic": "parking"}
        topics = {
            "recovers": (recovering, {"retrySleepDuration": 1}),
            "retries": (down, {"retrySleepDuration": 1, "maxRetries": 2}),
            "ttl": (down, {"retrySleepDuration": 1, "timeToLive": 3}),
            "dead": (down, {"retrySleepDuration": 1, "maxRetries": 1, "delivery": dead_letter}),
        }
        condition(kubectl, namespace, "topic", "parking")
        buckets = sync_topics(kubectl, namespace, s3, topics)
        keys = ["a", "b", "c"]
        for name in topics:
            for key in keys:
                s3.put_object(Bucket=buckets[name], Key=key, Body=b"x")

        attempts: collections.Counter[tuple[str, str]] = collections.Counter()
        ok: collections.Counter[tuple[str, str]] = collections.Counter()
        late: collections.defaultdict[str, float] = collections.defaultdict(float)
        """Per ttl key: how long after the event its latest attempt came."""

        def observe() -> collections.Counter[tuple[str, str]]:
            for receiver in (recovering, down, parking):
                for request in receiver.received():
                    for record in json.loads(request.body)["Records"]:
                        key = record["s3"]["object"]["key"]
                        attempts[(request.path.strip("/"), key)] += 1
                        if request.path.strip("/") == "ttl":
                            event_time = dt.datetime.fromisoformat(record["eventTime"])
                            late[key] = max(late[key], request.time - event_time.timestamp())
                        if request.status == 200:
                            ok[(request.path.strip("/"), key)] += 1
            return attempts

        # Down: every topic retries.
        wait_until(
            observe,
            lambda a: all(a[("recovers", k)] >= 2 for k in keys),
            30,
            "retries while the endpoint answers 503",
        )
        recovering.status = 200
        wait_until(
            observe,
            lambda _: all(ok[(t, k)] for t in ("recovers", "parking") for k in keys),
            30,
            "delivery after recovery, and to the dead-letter topic",
        )
        # maxRetries 2 = three attempts; timeToLive 3 s with a retry a second: a few.
        wait_until(
            observe,
            lambda a: all(a[("retries", k)] >= 3 and a[("dead", k)] >= 2 for k in keys),
            30,
            "maxRetries used up",
        )
        # Nothing more may come once the entries are dropped (removed from their queues).
        wait_until(
            lambda: [
                key
                for name in (*topics, "parking")
                for key in cluster.queued(QueueName(namespace, name), SHARDS)
            ],
            lambda left: left == [],
            30,
            "every entry delivered or dropped",
        )
        observe()
        settled = dict(attempts)
        time.sleep(2)  # a retry timer would fire within retrySleepDuration (1 s)
        observe()
    assert dict(attempts) == settled, "attempts after the events were dropped"
    assert ok == {(t, k): 1 for t in ("recovers", "parking") for k in keys}, "each once"
    assert [attempts[("dead", k)] for k in keys] == [2, 2, 2], "1 + maxRetries, then parked"
    assert [attempts[("retries", k)] for k in keys] == [3, 3, 3], "1 + maxRetries attempts"
    # timeToLive 3 s: tried, and never once the 3 s had passed (a round checks the age
    # before it pushes; the second is for the push to reach the endpoint).
    assert all(attempts[("ttl", k)] >= 1 for k in keys)
    assert all(late[k] < 3 + 1 for k in keys), f"attempts after timeToLive: {dict(late)}"
    log = cluster.replicas["replica-1"].log()
    lost = {name: 0 for name in ("retries", "ttl", "dead")}
    for line in log.splitlines():
        for name in lost:
            if f"{namespace}/{name} shard" in line and " lost " in line:
                lost[name] += int(line.split(" lost ")[1].split()[0])
    assert lost == {"retries": 3, "ttl": 3, "dead": 0}, "dropped events counted lost"


def test_metrics_count_a_known_workload_exactly(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    """Through the gateway, the ingest and a real replica: 5 events to an endpoint that
    acknowledges, 3 to one that is down with maxRetries 2 (3 attempts each, then lost).
    Every delivery metric has its exact value; the operator counts its reconciles. Events
    are queued (direct delivery off), so each is committed once: whether one goes directly
    depends on whether its shard's first round has run (see the next test)."""
    cluster = delivery_cluster("dir")
    cluster.start("replica-1", stats_interval_seconds="0.5", direct_delivery="false")
    port = cluster.ports["replica-1"]
    operator_port = free_port()
    start_operator(ingest_url=f"http://127.0.0.1:{port}", metrics_port=str(operator_port))
    s3 = s3_client(rgw)
    keys = {"up": [f"k{i}" for i in range(5)], "down": [f"k{i}" for i in range(3)]}
    with RecordingHttpServer() as up, RecordingHttpServer(status=503) as down:
        topics = {
            "up": (up, {}),
            "down": (down, {"retrySleepDuration": 1, "maxRetries": 2}),
        }
        buckets = sync_topics(kubectl, namespace, s3, topics)
        for name, names in keys.items():
            for key in names:
                s3.put_object(Bucket=buckets[name], Key=key, Body=b"x")

        url = f"http://127.0.0.1:{port}/metrics"
        up_labels = {"namespace": namespace, "topic": "up"}
        down_labels = {"namespace": namespace, "topic": "down"}

        def get(found: dict[Any, float], name: str, **labels: str) -> float | None:
            return found.get((name, frozenset(labels.items())))

        wait_until(
            lambda: scrape(url),
            lambda m: (
                get(m, "pubsub_push_ok_total", **up_labels) == 5
                and get(m, "pubsub_event_lost_total", **down_labels) == 3
                and get(m, "persistent_topic_len", **up_labels) == 0
                and get(m, "persistent_topic_len", **down_labels) == 0
            ),
            40,
            "every event delivered or lost",
        )
        # Every entry delivered or dropped and removed: no round has anything left to count.
        wait_until(
            lambda: [
                key
                for name in ("up", "down")
                for key in cluster.queued(QueueName(namespace, name), SHARDS)
            ],
            lambda left: left == [],
            30,
            "every entry removed",
        )
        found = scrape(url)
    expected = {
        ("pubsub_event_triggered_total", "up"): 5,
        ("pubsub_event_triggered_total", "down"): 3,
        ("pubsub_push_ok_total", "up"): 5,
        ("pubsub_push_ok_total", "down"): 0,
        ("pubsub_push_failed_total", "up"): 0,
        ("pubsub_push_failed_total", "down"): 9,
        ("pubsub_event_lost_total", "up"): 0,
        ("pubsub_event_lost_total", "down"): 3,
        ("bucketnotify_push_retries_total", "down"): 9,
        ("bucketnotify_event_dead_lettered_total", "down"): 0,
        ("bucketnotify_duplicates_suppressed_total", "up"): 0,
        ("pubsub_push_pending", "up"): 0,
        ("pubsub_push_pending", "down"): 0,
        ("persistent_topic_len", "up"): 0,
        ("persistent_topic_len", "down"): 0,
        ("persistent_topic_size", "up"): 0,
        ("persistent_topic_size", "down"): 0,
        ("bucketnotify_ingest_commit_seconds_count", "up"): 5,
        ("bucketnotify_ingest_commit_seconds_count", "down"): 3,
        ("bucketnotify_delivery_latency_seconds_count", "up"): 5,
        ("bucketnotify_delivery_latency_seconds_count", "down"): 0,
        ("bucketnotify_push_seconds_count", "up"): 5,
        ("bucketnotify_push_seconds_count", "down"): 9,
    }
    actual = {
        (name, topic): get(found, name, namespace=namespace, topic=topic)
        for name, topic in expected
    }
    assert actual == expected
    assert get(found, "bucketnotify_ingest_requests_total", code="200") == 8
    assert get(found, "bucketnotify_lease_partitions_owned", replica="replica-1") == PARTITIONS

    ops = scrape(f"http://127.0.0.1:{operator_port}/metrics")
    for kind in ("topic", "notification"):
        runs = {
            labels: v
            for (name, labels), v in ops.items()
            if name == "bucketnotify_reconcile_total"
            and ("kind", kind) in labels
            and ("action", "change") in labels
        }
        assert runs.get(
            frozenset({("kind", kind), ("action", "change"), ("result", "success")}), 0
        ) >= len(topics), runs
        timed = get(ops, "bucketnotify_reconcile_seconds_count", kind=kind, action="change")
        assert timed == sum(runs.values()), "every run is timed once"


def test_direct_delivery_answers_a_put_only_once_the_endpoint_has_its_event(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    """A replica alone on the dir:// store, hand-off sync: each PUT returns after the
    endpoint acknowledged its event (the ingest pushed it before answering the gateway),
    and nothing was committed to the queue for it."""
    cluster = delivery_cluster("dir")
    cluster.start("replica-1")
    port = cluster.ports["replica-1"]
    start_operator(ingest_url=f"http://127.0.0.1:{port}")
    s3 = s3_client(rgw)
    url = f"http://127.0.0.1:{port}/metrics"
    labels = {"namespace": namespace, "topic": "up"}

    def count(found: dict[Any, float], name: str) -> float:
        return found.get((name, frozenset(labels.items())), 0.0)

    with RecordingHttpServer() as up:
        (bucket,) = sync_topics(kubectl, namespace, s3, {"up": (up, {})}).values()
        # Delivered once, the Topic's shards have had their first round (they start
        # together): from then on they are known to be empty.
        s3.put_object(Bucket=bucket, Key="warm-up", Body=b"x")
        wait_until(up.received, bool, 30, "the warm-up event")
        time.sleep(1)
        before = scrape(url)
        for i in range(5):
            s3.put_object(Bucket=bucket, Key=f"k{i}", Body=b"x")
            got = [json.loads(r.body)["Records"][0]["s3"]["object"]["key"] for r in up.received()]
            assert got == [f"k{i}"], "the PUT returned before its event reached the endpoint"
        after = scrape(url)
    delta = {
        name: count(after, name) - count(before, name)
        for name in (
            "pubsub_event_triggered_total",
            "bucketnotify_events_direct_total",
            "pubsub_push_ok_total",
            "bucketnotify_ingest_commit_seconds_count",
        )
    }
    assert delta == {
        "pubsub_event_triggered_total": 5,
        "bucketnotify_events_direct_total": 5,
        "pubsub_push_ok_total": 5,
        "bucketnotify_ingest_commit_seconds_count": 0,
    }


def test_on_a_shared_store_requests_for_another_replicas_shard_go_directly_through_it(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    """Two replicas on the s3:// store, the gateway pushing every event to replica a: the
    requests for b's shards are handed to b, which pushes them itself. Each PUT returns
    once the endpoint has its event, and nothing is committed to the queue store (no
    gateway request besides the upload's)."""
    cluster = delivery_cluster("s3")
    two_replicas(cluster, start_operator)
    s3 = s3_client(rgw)
    topic = f"handed-{uuid.uuid4().hex[:8]}"
    labels = {"namespace": namespace, "topic": topic}
    with RecordingHttpServer() as receiver:
        bucket = sync_topics(kubectl, namespace, s3, {topic: (receiver, {})})[topic]
        keys = keys_by_owner(cluster.holders(), QueueName(namespace, topic), bucket, 4)
        assert all(len(keys[r]) == 4 for r in ("replica-a", "replica-b")), keys
        # Every shard's loop has started (the replicas read the Topics every 3 s), run
        # through the hand-over window of a shard just taken and found it empty: events
        # may go directly.
        time.sleep(3 + HANDOVER_POLL_ROUNDS * LeaseSettings.renew_interval_s + 2)
        got: list[tuple[str, float]] = []
        for key in keys["replica-b"] + keys["replica-a"]:
            s3.put_object(Bucket=bucket, Key=key, Body=b"x")
            assert delivered(receiver, got)[-1:] == [key], (
                f"the PUT of {key} returned before its event reached the endpoint"
            )
    assert [k for k, _ in got] == keys["replica-b"] + keys["replica-a"], "once each, in order"

    def metric(replica: str, name: str, **more: str) -> float:
        return replica_metric(cluster, replica, name, **more)

    assert metric("replica-a", "bucketnotify_ingest_forwarded_total", outcome="ok") == 4
    assert metric("replica-b", "bucketnotify_ingest_forwarded_total", outcome="ok") == 0
    for replica in ("replica-a", "replica-b"):
        assert metric(replica, "bucketnotify_events_direct_total", **labels) == 4, replica
        assert metric(replica, "bucketnotify_ingest_commit_seconds_count", **labels) == 0
    # Counted once, where the gateway's requests arrived.
    assert metric("replica-a", "bucketnotify_ingest_requests_total", code="200") == 8
    assert metric("replica-b", "bucketnotify_ingest_requests_total", code="200") == 0


def test_an_event_committed_by_a_replica_that_does_not_own_its_shard_wakes_the_owner(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    """Empty shards are not polled: the gateway pushes every event to replica a, and the
    events of shards replica b owns reach the endpoint because a wakes b. Polling and the
    queue survey are both set to 10 minutes, so nothing else could deliver them in time.
    Direct delivery is off, so a commits b's events instead of handing them to b (the next
    test), as it does when b does not answer in time."""
    cluster = delivery_cluster("s3")
    slow = {
        "idle_poll_max_seconds": "600",
        "stats_interval_seconds": "600",
        "direct_delivery": "false",
    }
    two_replicas(cluster, start_operator, **slow)
    s3 = s3_client(rgw)
    topic = f"woken-{uuid.uuid4().hex[:8]}"
    with RecordingHttpServer() as receiver:
        buckets = sync_topics(kubectl, namespace, s3, {topic: (receiver, {})})
        bucket = buckets[topic]
        keys = keys_by_owner(cluster.holders(), QueueName(namespace, topic), bucket, 4)
        assert all(len(keys[r]) == 4 for r in ("replica-a", "replica-b")), keys
        owner = {key: replica for replica, mine in keys.items() for key in mine}
        # Every shard's first round has found it empty: from now on they wait to be woken.
        time.sleep(3)

        got: list[tuple[str, float]] = []
        for key in keys["replica-b"] + keys["replica-a"]:
            s3.put_object(Bucket=bucket, Key=key, Body=b"x")
            wait_until(
                lambda: (delivered(receiver, got), [k for k, _ in got])[1],
                lambda seen, key=key: key in seen,  # type: ignore[misc]
                15,
                f"{key} (owned by {owner[key]}) delivered",
            )
        time.sleep(1)
        delivered(receiver, got)
    assert sorted(k for k, _ in got) == sorted(keys["replica-a"] + keys["replica-b"]), "once each"

    # Wake-ups went from a to b for b's shards (a's own shards are woken in-process).
    assert (
        replica_metric(cluster, "replica-a", "bucketnotify_wakeups_sent_total", outcome="ok") >= 4
    )
    assert replica_metric(cluster, "replica-b", "bucketnotify_wakeups_received_total") >= 4
    assert (
        replica_metric(cluster, "replica-b", "bucketnotify_wakeups_sent_total", outcome="ok") == 0
    )


def test_events_committed_while_shards_move_to_a_new_replica_are_delivered_within_seconds(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    """Replica a holds every partition and takes every push; replica b starts and half of
    the partitions move to it. Until a's next Lease round, a does not know that b holds
    them and wakes nobody for what it commits to their shards. One event per moved shard,
    each committed after b's first round of it and some before a's next round: b polls the
    shards it has just taken, so every event reaches the endpoint within seconds, though
    no later commit wakes b for its shard. Polling of idle shards and the queue survey are
    set to 10 minutes, so nothing else could deliver them in time. Whether an event fell in
    a's window shows in a's wake-ups (none sent for it); b is restarted until one did.
    Direct delivery off: a commits every event (as when b does not answer in time)."""
    cluster = delivery_cluster("s3")
    slow = {
        "idle_poll_max_seconds": "600",
        "stats_interval_seconds": "600",
        "direct_delivery": "false",
    }
    cluster.start("replica-a", **slow)
    wait_until(cluster.holders, lambda h: len(h) == PARTITIONS, 30, "replica a holds everything")
    start_operator(ingest_url=f"http://127.0.0.1:{cluster.ports['replica-a']}")
    s3 = s3_client(rgw)
    topic = f"moving-{uuid.uuid4().hex[:8]}"
    queue = QueueName(namespace, topic)

    def wakeups_sent() -> float:
        return sum(
            replica_metric(cluster, "replica-a", "bucketnotify_wakeups_sent_total", outcome=o)
            for o in ("ok", "refused", "failed")
        )

    with RecordingHttpServer() as receiver:
        bucket = sync_topics(kubectl, namespace, s3, {topic: (receiver, {})})[topic]
        put_at: dict[str, float] = {}
        unwoken = 0
        for attempt in range(5):
            time.sleep(3)  # every shard has found itself empty and waits to be woken
            cluster.start("replica-b", **slow)
            holders = wait_until(
                cluster.holders,
                lambda h: spread(h) == [16, 16],
                60,
                "16 partitions moved to replica b",
                interval=0.05,
            )
            moved = {
                shard
                for shard in range(SHARDS)
                if holders[partition_of(queue, shard, PARTITIONS)] == "replica-b"
            }
            keys: dict[int, str] = {}
            for i in range(1000):
                key = f"obj-{attempt}-{i:03d}"
                keys.setdefault(shard_of(bucket, key, SHARDS), key)
            time.sleep(0.3)  # b's first round of each shard it took: found empty
            sent = wakeups_sent()
            for shard in sorted(moved):
                s3.put_object(Bucket=bucket, Key=keys[shard], Body=b"x")
                put_at[keys[shard]] = time.time()
                time.sleep(0.15)
            time.sleep(1)  # wake-ups go out in the background
            unwoken += len(moved) - round(wakeups_sent() - sent)
            if unwoken:
                break
            cluster.kill("replica-b", signal.SIGTERM)  # hands its partitions back
            cluster.replicas["replica-b"].process.wait(30)
            wait_until(cluster.holders, lambda h: spread(h) == [32], 30, "a holds all again")
        assert unwoken, "no event was committed before replica a learnt the new holder"

        got: list[tuple[str, float]] = []
        wait_until(
            lambda: (delivered(receiver, got), len(got))[1],
            lambda n: n >= len(put_at),
            30,
            f"the {len(put_at)} events delivered",
        )
        time.sleep(1)
        delivered(receiver, got)
    assert sorted(k for k, _ in got) == sorted(put_at), "once each"
    late = {k: round(at - put_at[k], 1) for k, at in got if at - put_at[k] > 10}
    assert not late, f"delivered more than 10 s after the PUT: {late}"


def test_events_whose_wake_up_was_lost_are_found_by_the_survey(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    """Replica b advertises an address where nothing listens (127.0.0.2: loopback, but not
    its listen address), so every wake-up a sends it fails. Polling is off (10 minutes);
    the survey (every 2 s) still finds b's events and they are delivered, once each.
    Direct delivery off: a commits every event (with it on, a would first try to hand
    b's requests to b, fail the same way and commit them after all)."""
    cluster = delivery_cluster("s3")
    slow = {
        "idle_poll_max_seconds": "600",
        "stats_interval_seconds": "2",
        "direct_delivery": "false",
    }
    two_replicas(cluster, start_operator, {"advertise_host": "127.0.0.2"}, **slow)
    s3 = s3_client(rgw)
    topic = f"surveyed-{uuid.uuid4().hex[:8]}"
    with RecordingHttpServer() as receiver:
        buckets = sync_topics(kubectl, namespace, s3, {topic: (receiver, {})})
        bucket = buckets[topic]
        keys = keys_by_owner(cluster.holders(), QueueName(namespace, topic), bucket, 4)["replica-b"]
        assert len(keys) == 4
        time.sleep(3)  # b's shards have found themselves empty and wait to be woken
        for key in keys:
            s3.put_object(Bucket=bucket, Key=key, Body=b"x")
        got: list[tuple[str, float]] = []
        wait_until(
            lambda: (delivered(receiver, got), len(got))[1],
            lambda n: n >= len(keys),
            30,
            "replica b's events delivered after a survey",
        )
        time.sleep(1)
        delivered(receiver, got)
    assert sorted(k for k, _ in got) == sorted(keys), "once each"
    failed = replica_metric(
        cluster, "replica-a", "bucketnotify_wakeups_sent_total", outcome="failed"
    )
    assert failed >= 1, "a's wake-ups to b failed"
