"""A delivery replica paused (SIGSTOP) past its Lease, then resumed (SIGCONT), is fenced.

Real processes: two `bucketnotify delivery` replicas sharing the S3 queue store on Ceph RGW,
their Leases on the apiserver, the operator, a slow HTTP endpoint. While the owner of the
Topic's one shard is stopped, the other replica takes the shard over and delivers every
event; once resumed, the old owner must neither remove entries of a shard it no longer owns
nor go on pushing the rest of the batch it had listed.
"""

from __future__ import annotations

import base64
import collections
import json
import re
import signal
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.peers.ownership import partition_of
from bucketnotify.delivery.rounds.worker import FENCE_WINDOW
from devstack.servers.recording import RecordingHttpServer
from tests.delivery import StartCluster, post_events
from tests.kubectl import Kubectl
from tests.operator import StartOperator
from tests.resources import apply, condition
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

PARTITIONS = 2  # one each: the Topic's one shard has exactly one owner to pause
# Short Leases so the test is quick; interval < deadline < duration, and the hand-back drain
# (3 s) fits in deadline - interval.
LEASES = {
    "partitions": str(PARTITIONS),
    "lease_duration_seconds": "8",
    "renew_interval_seconds": "1",
    "renew_deadline_seconds": "5",
    # Every event queued: what is fenced is a round's pushes. (With direct delivery the
    # owner would push the requests' events itself, behind a 1-s endpoint, one by one.)
    "direct_delivery": "false",
}
EVENTS = 400
PUSH_DELAY_S = 1.0  # 64 pushes under way take a second: the pause lands mid-batch


def received(receiver: RecordingHttpServer, into: list[tuple[str, float]]) -> int:
    """Take the newly acknowledged records as (key, time) into ``into``; how many there are."""
    for request in receiver.received():
        if request.status != 200:
            continue
        for record in json.loads(request.body)["Records"]:
            into.append((record["s3"]["object"]["key"], request.time))
    return len(into)


def fenced_rounds(log: str, queue: QueueName) -> list[tuple[int, int]]:
    """(delivered, failed) of every round the replica logged as fenced for ``queue``."""
    pattern = re.compile(
        rf"{re.escape(str(queue))} shard 0: delivered (\d+) failed (\d+) .*\(fenced\)"
    )
    return [(int(m[1]), int(m[2])) for m in pattern.finditer(log)]


def test_a_replica_paused_past_its_lease_is_fenced_when_it_resumes(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
) -> None:
    cluster = delivery_cluster("s3")
    for name in ("replica-a", "replica-b"):
        cluster.start(name, **LEASES)
    wait_until(
        cluster.holders,
        lambda h: len(h) == PARTITIONS and len(set(h.values())) == 2,
        60,
        "one partition each",
    )
    start_operator(ingest_url=f"http://127.0.0.1:{cluster.ports['replica-a']}")
    topic = f"paused-{uuid.uuid4().hex[:8]}"
    queue = QueueName(namespace, topic)
    with RecordingHttpServer(delay_s=PUSH_DELAY_S) as receiver:
        apply(
            kubectl,
            namespace,
            "Topic",
            topic,
            {
                "endpoint": {"http": {"url": receiver.url}},
                "persistent": True,
                "delivery": {"handoff": "sync", "shards": 1},
            },
        )
        condition(kubectl, namespace, "topic", topic)
        secret = kubectl.get("secret", f"{topic}-ingest-token", namespace)
        token = base64.b64decode(secret["data"]["token"]).decode()

        victim = cluster.holders()[partition_of(queue, 0, PARTITIONS)]
        (survivor,) = set(cluster.replicas) - {victim}
        ingest = f"http://127.0.0.1:{cluster.ports[survivor]}/v1/topics/{namespace}/{topic}/{token}"
        wait_until(
            lambda: post_events(ingest, ["warm-up"]),
            lambda status: status == 200,
            30,
            "the replica serves the Topic",
        )
        keys = [f"k{i:04d}" for i in range(EVENTS)]
        batches = [keys[i : i + 50] for i in range(0, EVENTS, 50)]
        with ThreadPoolExecutor(len(batches)) as posting:
            statuses = list(
                posting.map(
                    lambda b: post_events(ingest, b),
                    batches,
                )
            )
        assert statuses == [200] * len(batches), "every event committed"

        got: list[tuple[str, float]] = []
        # Pause it with pushes in flight, past its first window: mid-round, mid-batch.
        wait_until(
            lambda: (received(receiver, got), receiver.in_flight),
            lambda seen: seen[0] > FENCE_WINDOW and seen[1] > 0,
            60,
            "the owner pushing past its first window",
        )
        cluster.kill(victim, signal.SIGSTOP)
        stopped_at = time.time()
        try:
            wait_until(
                cluster.holders,
                lambda h: h.get(partition_of(queue, 0, PARTITIONS)) == survivor,
                60,
                "the other replica to take the shard over",
            )
            taken_at = time.time()
            wait_until(
                lambda: (received(receiver, got), {k for k, _ in got})[1],
                lambda seen: set(keys) <= seen,
                180,
                "every event delivered by the new owner",
            )
            # Quiet: the new owner has removed what it delivered and pushes nothing more.
            wait_until(
                lambda: (received(receiver, got), time.time() - max(t for _, t in got))[1],
                lambda idle: idle > 3,
                60,
                "the endpoint idle",
            )
        finally:
            cluster.kill(victim, signal.SIGCONT)
        resumed_at = time.time()
        # Its Lease rounds notice the loss, the share is rebalanced, its rounds fence.
        wait_until(
            lambda: fenced_rounds(cluster.replicas[victim].log(), queue),
            bool,
            30,
            "the resumed replica to log its round as fenced",
        )
        time.sleep(5)
        received(receiver, got)
        after_resume = [k for k, t in got if t > resumed_at]

        # Still healthy after the rebalance: new events go through whoever owns the shard now.
        more = [f"late-{i}" for i in range(20)]
        assert post_events(ingest, more) == 200
        wait_until(
            lambda: (received(receiver, got), {k for k, _ in got})[1],
            lambda seen: set(more) <= seen,
            60,
            "events after the resume delivered",
        )

    counts = collections.Counter(k for k, _ in got if k in set(keys))
    duplicates = sum(n - 1 for n in counts.values())
    rounds = fenced_rounds(cluster.replicas[victim].log(), queue)
    fenced_pushes = sum(d + f for d, f in rounds)
    print(
        f"\npaused {victim} for {resumed_at - stopped_at:.1f} s; {survivor} took the shard"
        f" after {taken_at - stopped_at:.1f} s; {duplicates} duplicates of {EVENTS} events;"
        f" fenced rounds (delivered, failed): {rounds}; pushes after the resume:"
        f" {len(after_resume)}"
    )
    assert set(counts) == set(keys), "no event lost"
    assert max(counts.values()) <= 2, "an event went out more than twice"
    # Only what the paused owner pushed in its last round and could not remove goes twice.
    assert duplicates <= fenced_pushes, (duplicates, rounds)
    # Resumed, it sends at most the pushes that were under way, not the rest of its batch.
    assert len(after_resume) <= FENCE_WINDOW, after_resume[:10]
    with urllib.request.urlopen(
        f"http://127.0.0.1:{cluster.ports[victim]}/metrics", timeout=10
    ) as answer:
        assert answer.status == 200, "the resumed replica still answers"
    assert cluster.replicas[victim].process.poll() is None
