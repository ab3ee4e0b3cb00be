"""The dir store's disk fills up under a replica: the ingest answers 503 (which the gateway
retries), the queue holds exactly what was acknowledged and nothing half-written, and once
deliveries free space the ingest takes events again and every acknowledged one arrives once.

The disk is a tmpfs of its own (root mounts it, as CI runs), small enough to fill in seconds.
"""

from __future__ import annotations

import collections
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bucketnotify.delivery.model.queue import QueueName
from devstack.programs import free_port
from devstack.servers.recording import RecordingHttpServer
from tests.delivery import push_records, queued_keys, wait_ready
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.processes import Program
from tests.resources import apply, token_secret
from tests.waiting import wait_until

# The test applies a Topic: the CRDs must be there even when this file runs alone.
pytestmark = pytest.mark.usefixtures("crds")

DISK = "256k"
SHARDS = 2
PAD = "x" * 1500  # a key of ~1.5 KB: a record of ~3 KB (key and sequencer)


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "queues"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def queued(disk: Path, queue: QueueName) -> list[str]:
    return queued_keys(f"dir://{disk}", queue, SHARDS, {})


def test_a_full_disk_answers_503_keeps_what_was_acknowledged_and_recovers(
    kube: LocalService, kubectl: Kubectl, namespace: str, small_disk: Path
) -> None:
    port = free_port()
    replica = Program(
        ["delivery"],
        {
            "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
            "BUCKETNOTIFY_DELIVERY_STORE": f"dir://{small_disk}",
            "BUCKETNOTIFY_DELIVERY_LISTEN_PORT": str(port),
            "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": namespace,
            "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([namespace]),
            "BUCKETNOTIFY_DELIVERY_REFRESH_INTERVAL_SECONDS": "1",
            "BUCKETNOTIFY_DELIVERY_RECORDS": "off",
        },
    )
    try:
        with RecordingHttpServer(status=500) as receiver:
            apply(
                kubectl,
                namespace,
                "Topic",
                "full",
                {
                    "endpoint": {"http": {"url": f"{receiver.url}/full"}},
                    "persistent": True,
                    "delivery": {"shards": SHARDS},
                },
            )
            token = token_secret(kubectl, namespace, "full")
            wait_ready(port, replica)
            acknowledged: list[str] = []
            answers = collections.Counter()
            for n in range(400):
                keys = [f"k{n:03d}-{i}-{PAD}" for i in range(4)]
                status = push_records(port, namespace, "full", token, keys)
                answers[status] += 1
                if status == 200:
                    acknowledged += keys
                elif status == 503 and answers[503] >= 3:
                    break
            assert answers[503] >= 3, f"the disk never filled: {answers}"
            assert set(answers) == {200, 503}, f"only 200 and 503 answers: {answers}"
            assert acknowledged, "nothing fit at all"
            # Nothing half-written: the queue reads back, holding exactly what was answered 200.
            queue = QueueName(namespace, "full")
            assert sorted(queued(small_disk, queue)) == sorted(acknowledged)
            assert "out of space" in replica.log()

            receiver.status = 200  # deliveries remove entries and free the disk
            seen: list[str] = []

            def arrived() -> list[str]:
                for request in receiver.received():
                    if request.status == 200:
                        seen.extend(
                            r["s3"]["object"]["key"] for r in json.loads(request.body)["Records"]
                        )
                return seen

            wait_until(
                arrived, lambda s: set(acknowledged) <= set(s), 120, "every acknowledged event"
            )
            later = [f"after-{i}" for i in range(4)]
            wait_until(
                lambda: push_records(port, namespace, "full", token, later),
                lambda status: status == 200,
                60,
                "the ingest to take events again once space returned",
            )
            wait_until(arrived, lambda s: set(later) <= set(s), 60, "the events sent after")
            # Late copies (a push made again after a removal the full disk refused) come
            # before their entry is removed: once the queue is empty, all are in.
            wait_until(lambda: queued(small_disk, queue), lambda k: k == [], 60, "an empty queue")
            counts = collections.Counter(arrived())
            assert [k for k, c in counts.items() if c > 1] == [], "delivered twice"
            assert set(counts) == set(acknowledged) | set(later)
    finally:
        replica.stop()
        print(f"--- delivery log ---\n{replica.log()[-3000:]}")
