"""A persistent Topic's queue lives and dies with it (docs/operator.md, Queue lifecycle).

Real everything: the operator and a delivery replica as subprocesses, the apiserver, Ceph
RGW pushing to the ingest, the local-directory queue store, an HTTP endpoint that refuses
until the test lets it answer.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from devstack.servers.recording import RecordingHttpServer
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import StartOperator
from tests.processes import Program
from tests.resources import apply, condition
from tests.s3 import s3_client
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")


def pending(queues: Path, namespace: str, topic: str) -> int | None:
    """Entries in the queue's shard directories; None once the queue is gone."""
    directory = queues / namespace / topic
    if not directory.exists():
        return None
    return sum(1 for shard in directory.glob("shard-*") for f in shard.iterdir() if f.is_file())


def persistent_topic(
    kubectl: Kubectl, namespace: str, url: str, persistent: bool = True
) -> tuple[str, dict[str, Any]]:
    name = f"q-{uuid.uuid4().hex[:8]}"
    spec = {
        "endpoint": {"http": {"url": url}},
        "persistent": persistent,
        "delivery": {"handoff": "sync", "shards": 2},
    }
    apply(kubectl, namespace, "Topic", name, spec)
    condition(kubectl, namespace, "topic", name)
    return name, spec


def notify(kubectl: Kubectl, namespace: str, rgw: LocalService, topic: str) -> str:
    bucket = f"{topic}-b"
    s3_client(rgw).create_bucket(Bucket=bucket)
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        topic,
        {"bucket": bucket, "topicRef": {"name": topic}, "testEvent": False},
    )
    condition(kubectl, namespace, "bucketnotification", topic)
    return bucket


def test_deleting_a_persistent_topic_deletes_its_queue_and_logs_what_was_lost(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    replica: tuple[Program, int],
    queues: Path,
    rgw: LocalService,
) -> None:
    program, port = replica
    start_operator(ingest_url=f"http://127.0.0.1:{port}")
    with RecordingHttpServer(status=503) as endpoint:
        topic, _ = persistent_topic(kubectl, namespace, endpoint.url)
        bucket = notify(kubectl, namespace, rgw, topic)
        s3 = s3_client(rgw)
        for i in range(5):
            s3.put_object(Bucket=bucket, Key=f"k{i}", Body=b"x")
        wait_until(lambda: pending(queues, namespace, topic), lambda n: n == 5, 30, "5 queued")
        wait_until(endpoint.received, bool, 30, "a refused push")  # they were tried

        kubectl.run("delete", "bucketnotification,topic", topic, "-n", namespace)
        wait_until(
            lambda: pending(queues, namespace, topic), lambda n: n is None, 30, "queue deleted"
        )
    lost = re.findall(
        rf"queue {namespace}/{topic} deleted \(([^)]*)\): (\d+) events lost", program.log()
    )
    assert [int(n) for _, n in lost] == [5], program.log()[-3000:]


def test_a_topic_made_non_persistent_drains_its_queue_then_deletes_it(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    replica: tuple[Program, int],
    queues: Path,
    rgw: LocalService,
) -> None:
    program, port = replica
    start_operator(ingest_url=f"http://127.0.0.1:{port}")
    with RecordingHttpServer(status=503) as endpoint:
        topic, spec = persistent_topic(kubectl, namespace, endpoint.url)
        bucket = notify(kubectl, namespace, rgw, topic)
        s3 = s3_client(rgw)
        for i in range(4):
            s3.put_object(Bucket=bucket, Key=f"queued-{i}", Body=b"x")
        wait_until(lambda: pending(queues, namespace, topic), lambda n: n == 4, 30, "4 queued")

        apply(kubectl, namespace, "Topic", topic, {**spec, "persistent": False, "delivery": None})
        condition(kubectl, namespace, "topic", topic)
        # Still there while the endpoint refuses: draining, not dropping.
        assert pending(queues, namespace, topic) == 4
        endpoint.received()
        endpoint.status = 200
        wait_until(
            lambda: pending(queues, namespace, topic), lambda n: n is None, 60, "drained, deleted"
        )
        delivered = [
            record["s3"]["object"]["key"]
            for request in endpoint.received()
            if request.status == 200
            for record in json.loads(request.body)["Records"]
        ]
    assert sorted(delivered) == [f"queued-{i}" for i in range(4)]
    assert f"queue {namespace}/{topic} deleted: its Topic is no longer persistent" in program.log()
    assert "events lost" not in program.log()
