"""Delivery replicas as real processes behind a balancer, the way a Service spreads them,
and what tests send them and read from them: pushes to the ingest, their /metrics.

The gateway pushes to one ingest URL; in a cluster that is a Service in front of every
replica. Here a round-robin TCP balancer plays that part: a connection goes to the next
replica that accepts it, so a killed replica drops out as its endpoint would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bucketnotify.delivery.endpoints.base import Endpoint
from bucketnotify.delivery.model.delivered_ids import DeliveredCache
from bucketnotify.delivery.model.outcomes import DeliveryPolicy
from bucketnotify.delivery.model.queue import QueueName, QueueStore
from bucketnotify.delivery.peers.ownership import LeaseSettings, Ownership
from bucketnotify.delivery.service import DeliveryService, TopicRuntime
from bucketnotify.delivery.stores.open import store_for
from bucketnotify.delivery.stores.s3 import S3Store
from bucketnotify.kube.apiserver import ApiClient
from bucketnotify.settings import OperatorSettings
from devstack.gateway import gateway_settings
from devstack.servers.recording import RecordingHttpServer
from devstack.servers.tcpproxy import Balancer
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import HEALTH_INTERVAL_S
from tests.processes import Program, free_port
from tests.records import event
from tests.resources import apply, condition

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""(sample name, labels) → value."""


def partition_holders(kubectl: Kubectl, namespace: str) -> dict[int, str]:
    """Partition → holder of every partition Lease held and not expired, as replicas judge."""
    listed = json.loads(
        kubectl.run(
            "get",
            "leases",
            "-n",
            namespace,
            "-l",
            "bucketnotify.io/lease-role=partition",
            "-o",
            "json",
        ).stdout
    )
    now = dt.datetime.now(dt.UTC)
    held: dict[int, str] = {}
    for lease in listed["items"]:
        spec = lease["spec"]
        holder, renewed = spec.get("holderIdentity"), spec.get("renewTime")
        if not holder or not renewed:
            continue
        renewed_at = dt.datetime.fromisoformat(renewed.replace("Z", "+00:00"))
        if renewed_at + dt.timedelta(seconds=spec["leaseDurationSeconds"]) < now:
            continue
        held[int(lease["metadata"]["name"].rsplit("-", 1)[1])] = holder
    return held


@dataclass
class DeliveryCluster:
    """Replicas sharing one queue store, their Leases in ``namespace``."""

    kubectl: Kubectl
    namespace: str
    env: dict[str, str]
    replicas: dict[str, Program] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    balancer: Balancer | None = None

    def start(self, name: str, **settings: str) -> Program:
        return self._launch(name, free_port(), settings)

    def replace(self, dead: str, successor: str, **settings: str) -> Program:
        """A new replica on the port of ``dead``, so the balancer sends it what went to the
        dead one, as a new pod takes the place of a crashed one behind the Service."""
        return self._launch(successor, self.ports[dead], settings)

    def _launch(self, name: str, port: int, settings: dict[str, str]) -> Program:
        program = Program(
            ["delivery"],
            {
                **self.env,
                "BUCKETNOTIFY_DELIVERY_LISTEN_PORT": str(port),
                "BUCKETNOTIFY_DELIVERY_IDENTITY": name,
                **{f"BUCKETNOTIFY_DELIVERY_{k.upper()}": v for k, v in settings.items()},
            },
        )
        self.replicas[name] = program
        self.ports[name] = port
        wait_ready(port, program)
        return program

    def front(self) -> Balancer:
        """A balancer over every replica started so far."""
        self.balancer = Balancer(list(self.ports.values())).start()
        return self.balancer

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.replicas[name].process.send_signal(sig)
        if sig == signal.SIGKILL:
            self.replicas[name].process.wait()

    def metric(self, sample: str, **labels: str) -> float:
        """``sample`` (e.g. ``pubsub_push_failed_total``) of the series with ``labels``
        summed over the running replicas' ``GET /metrics``."""
        wanted = set(labels.items())
        total = 0.0
        for name, program in self.replicas.items():
            if program.process.poll() is not None:
                continue
            found = scrape(f"http://127.0.0.1:{self.ports[name]}/metrics")
            total += sum(
                value
                for (sample_name, series), value in found.items()
                if sample_name == sample and wanted <= series
            )
        return total

    def queued(self, queue: QueueName, shards: int) -> list[str]:
        """The object keys of the events still queued in ``queue`` (``queued_keys``)."""
        return queued_keys(self.env["BUCKETNOTIFY_DELIVERY_STORE"], queue, shards, self.env)

    def saved_delivered(self, queue: QueueName, shard: int) -> list[str]:
        """The identities of the events ``shard`` delivered, as saved for its next owner."""

        async def read(store: QueueStore) -> list[str]:
            return list(await store.load_delivered(queue, shard))

        return on_store(self.env["BUCKETNOTIFY_DELIVERY_STORE"], self.env, read)

    def holders(self) -> dict[int, str]:
        """Partition → holder of every partition Lease that is held and not expired."""
        return partition_holders(self.kubectl, self.namespace)

    def stop(self) -> None:
        if self.balancer is not None:
            self.balancer.close()
        for program in self.replicas.values():
            program.stop()
        for name, program in self.replicas.items():
            print(f"--- delivery {name} log ---\n{program.log()[-6000:]}")


def wait_ready(port: int, program: Program, timeout: float = 60) -> None:
    """Until ``GET /readyz`` answers 200, as a Service waits for a pod's readiness probe."""
    deadline = time.monotonic() + timeout
    answer = "no answer"
    while time.monotonic() < deadline:
        if program.process.poll() is not None:
            pytest.fail(f"delivery replica exited:\n{program.log()[-3000:]}")
        url = f"http://127.0.0.1:{port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                assert json.load(response) == {"ready": True}
                return
        except urllib.error.HTTPError as exc:
            answer = f"{exc.code} {exc.read().decode()}"
            assert exc.code == 503, answer
            assert json.loads(answer.split(" ", 1)[1])["ready"] is False, answer
        except OSError as exc:
            answer = str(exc)
        time.sleep(0.1)
    pytest.fail(f"delivery replica on {port} not ready ({answer}):\n{program.log()[-3000:]}")


StartCluster = Callable[..., DeliveryCluster]


T = TypeVar("T")


def on_store(store_url: str, env: dict[str, str], read: Callable[[QueueStore], Awaitable[T]]) -> T:
    """``read`` run on the queue store a replica with ``env`` (its
    ``BUCKETNOTIFY_GATEWAY_*``) uses at ``store_url``."""

    async def run() -> T:
        operator = OperatorSettings(
            gateway_endpoint=env.get("BUCKETNOTIFY_GATEWAY_ENDPOINT"),
            gateway_access_key=env.get("BUCKETNOTIFY_GATEWAY_ACCESS_KEY"),
            gateway_secret_key=cast(Any, env.get("BUCKETNOTIFY_GATEWAY_SECRET_KEY")),
            gateway_region=env.get("BUCKETNOTIFY_GATEWAY_REGION", "default"),
        )
        store = store_for(store_url, operator)
        try:
            return await read(store)
        finally:
            if isinstance(store, S3Store):
                await store.aclose()

    return asyncio.run(run())


def queued_keys(store_url: str, queue: QueueName, shards: int, env: dict[str, str]) -> list[str]:
    """The object keys of the events queued in ``queue`` (``on_store``). An entry is removed
    only after its push was answered: once none is left, no push of them is still to come."""

    async def read(store: QueueStore) -> list[str]:
        entries = []
        for shard in range(shards):
            entries += await store.list(queue, shard, 100_000)
        return [json.loads(e.body)["s3"]["object"]["key"] for e in entries]

    return on_store(store_url, env, read)


@pytest.fixture()
def delivery_cluster(
    kube: LocalService, rgw: LocalService, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> Iterator[StartCluster]:
    """``start(store="s3"|"dir")``: an empty cluster of replicas; add them with ``start``."""
    clusters: list[DeliveryCluster] = []

    def make(store: str = "s3") -> DeliveryCluster:
        url = f"s3://bnq-{uuid.uuid4().hex[:12]}" if store == "s3" else f"dir://{tmp_path}/queues"
        cluster = DeliveryCluster(
            kubectl,
            namespace,
            {
                "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
                "BUCKETNOTIFY_DELIVERY_STORE": url,
                "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": namespace,
                "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([namespace]),
                "BUCKETNOTIFY_DELIVERY_HEALTH_REPORT_INTERVAL_SECONDS": str(HEALTH_INTERVAL_S),
                **gateway_settings(rgw),
            },
        )
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()


def post_records(url: str, records: list[dict[str, Any]], timeout: float = 10) -> int:
    """POST ``{"Records": records}`` to an ingest URL, as the gateway does; the HTTP status."""
    request = urllib.request.Request(  # noqa: S310 - a loopback http:// URL the test built
        url, data=json.dumps({"Records": records}).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def post_events(url: str, keys: list[str]) -> int:
    """POST an event of each object key to an ingest URL; the HTTP status. Each event has a
    request id of its own, so a key posted again is a new event, never a duplicate."""
    return post_records(url, [event(k, request_id=uuid.uuid4().hex) for k in keys])


def push_records(port: int, namespace: str, topic: str, token: str, keys: list[str]) -> int:
    """Push records of these object keys to a replica's ingest, as the gateway does; the HTTP
    status (0: nothing listens there yet). A key's event is the same event each time (its
    identity is the key), so pushing it again is a duplicate."""
    url = f"http://127.0.0.1:{port}/v1/topics/{namespace}/{topic}/{token}"
    try:
        return post_records(url, [event(k, sequencer=k) for k in keys], timeout=20)
    except urllib.error.URLError:
        return 0


def samples(exposition: str) -> Samples:
    """Every sample of a /metrics answer."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def scrape(url: str) -> Samples:
    """Every sample a /metrics endpoint shows."""
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (our http URL)
        return samples(response.read().decode())


def sync_topics(
    kubectl: Kubectl,
    namespace: str,
    s3: Any,
    topics: dict[str, tuple[RecordingHttpServer, dict[str, Any]]],
) -> dict[str, str]:
    """A persistent Topic (hand-off sync, endpoint ``<receiver>/<name>``) per entry, each
    with a bucket of its own notifying it of PUTs; Ready. Returns name → bucket."""
    buckets = {}
    for name, (receiver, settings) in topics.items():
        apply(
            kubectl,
            namespace,
            "Topic",
            name,
            {
                "endpoint": {"http": {"url": f"{receiver.url}/{name}"}},
                "persistent": True,
                "delivery": {"handoff": "sync"},
                **settings,
            },
        )
        buckets[name] = f"{name}-{uuid.uuid4().hex[:10]}"
        s3.create_bucket(Bucket=buckets[name])
    for name in topics:
        condition(kubectl, namespace, "topic", name)
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            name,
            {
                "bucket": buckets[name],
                "topicRef": {"name": name},
                "testEvent": False,
                "events": ["s3:ObjectCreated:Put"],
            },
        )
    for name in topics:
        condition(kubectl, namespace, "bucketnotification", name)
    return buckets


def one_shard_runtime(
    queue: QueueName, endpoint: Endpoint, policy: DeliveryPolicy | None = None
) -> TopicRuntime:
    """What the service holds for a Topic of one shard delivering to ``endpoint``."""
    return TopicRuntime(
        queue=queue,
        shards=1,
        policy=policy or DeliveryPolicy(),
        endpoint=endpoint,
        fingerprint="",
        generation=1,
        secrets_read_at=0,
        delivered={0: DeliveredCache()},
    )


def lone_service(api: ApiClient, store: QueueStore, **settings: Any) -> DeliveryService:
    """A delivery service alone with every shard (``OwnsEverything``), listing no
    namespace: the rounds and the ingest driven by a test."""
    return DeliveryService(
        api=api,
        store=store,
        ownership=cast(Ownership, OwnsEverything()),
        namespaces=[],
        **settings,
    )


class OwnsEverything:
    """An Ownership stand-in for a replica alone: every shard is its own."""

    identity = "replica-0"
    holder = None
    writers = 0
    """Unknown: every reserve scans, as a store told nothing does."""
    settings = LeaseSettings(namespace="default")
    joined = True

    address = None
    """Advertises no address: nobody can wake it, so it polls its empty shards."""
    members = 1

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self._made = time.monotonic()

    def taken_at(self, queue: QueueName, shard: int) -> float:
        """It took every partition when it was made."""
        return self._made

    def owns_shard(self, queue: QueueName, shard: int) -> bool:
        return True

    def may_remove(self, queue: QueueName, shard: int) -> bool:
        return True

    def owner_address(self, queue: QueueName, shard: int) -> str | None:
        return None

    def owned(self) -> set[int]:
        return set(range(32))
