"""The whole path of an event under a steady stream of S3 writes, for the fault tests.

A ``Pipeline`` is the system as a user runs it: the operator, delivery replicas behind a
balancer (a Service's part), Topics with both hand-off modes and a bucket notifying each,
all as real processes against a real apiserver and gateway, which may be ones of the test's
own that it kills and starts again. A ``Stream`` writes objects at a steady rate and keeps
what the gateway acknowledged; a target reads what reached the endpoint. ``settle`` then says
what a user relies on: every acknowledged write delivered, and how many twice.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import aio_pika
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from devstack.gateway import gateway_settings
from devstack.servers.recording import RecordingHttpServer
from tests.delivery import DeliveryCluster
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.processes import Program
from tests.resources import apply, condition
from tests.s3 import s3_client

HANDOFFS = ("sync", "persistent")


class Stream:
    """Writers PUTting objects round-robin into ``buckets`` at ``per_second`` in all.

    A write counts as acknowledged only when the gateway answered 200; one that failed or
    timed out is kept apart (its event may or may not exist, as for any client).

    With ``versions`` > 1 each object is written that many times in a row, each write one
    byte longer, so that the order of one object's events can be checked: a write is then
    known by ``write_id`` (its key and version), here and to an ``HttpTarget(versioned=True)``.
    """

    def __init__(
        self,
        rgw: LocalService,
        buckets: list[str],
        per_second: float,
        writers: int = 2,
        versions: int = 1,
    ) -> None:
        # One attempt and short timeouts: a write during an outage fails now, and the
        # stream keeps its pace instead of queueing retries. A retried PUT is a second
        # event of the key (botocore's legacy "max_attempts": 1 allowed one retry: a PUT
        # held 20 s by a sync push to a frozen replica was sent again and counted as a
        # delivery duplicate).
        self._s3 = s3_client(
            rgw,
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=2,
            read_timeout=20,
        )
        self._buckets = buckets
        self.writers = writers
        self._interval = writers / per_second
        self._versions = versions
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.acked: dict[str, list[str]] = {b: [] for b in buckets}
        self.unacked: dict[str, list[str]] = {b: [] for b in buckets}
        self.written_at: dict[str, tuple[float, float]] = {}
        """Key → when its PUT was sent and when it was answered (time.time())."""
        self.in_flight: dict[str, tuple[str, float]] = {}
        """Key → its bucket and when it was sent, while its PUT waits for its answer."""
        self._threads = [
            threading.Thread(target=self._write, args=(w,), daemon=True) for w in range(writers)
        ]

    def __enter__(self) -> Stream:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def acked_count(self) -> int:
        with self._lock:
            return sum(map(len, self.acked.values()))

    def unanswered(self, sent_before: float = float("inf")) -> list[tuple[str, str]]:
        """(bucket, key) of the writes sent (before ``sent_before``) and not yet answered."""
        with self._lock:
            return [(b, write) for write, (b, sent) in self.in_flight.items() if sent < sent_before]

    def _write(self, writer: int) -> None:
        n = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            written, version = divmod(n, self._versions)
            bucket = self._buckets[written % len(self._buckets)]
            key = f"w{writer}-{written:06d}"
            write = key if self._versions == 1 else write_id(key, version)
            sent = time.time()
            with self._lock:
                self.in_flight[write] = (bucket, sent)
            try:
                self._s3.put_object(Bucket=bucket, Key=key, Body=b"x" * (BODY + version))
                ok = True
            except Exception:  # any failure means "not acknowledged"
                ok = False
            with self._lock:
                (self.acked if ok else self.unacked)[bucket].append(write)
                self.written_at[write] = (sent, time.time())
                del self.in_flight[write]
            n += 1
            next_at += self._interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))


BODY = 64
"""The size of an object's first write; each further version of it is one byte longer."""


def write_id(key: str, version: int) -> str:
    """One write of a versioned stream: the object's key and which of its writes."""
    return f"{key}~{version}"


def object_of(write: str) -> str:
    """The object key of a write (of a versioned stream or not)."""
    return write.rpartition("~")[0] or write


def out_of_order(arrived: list[str], acked: list[str]) -> list[str]:
    """The acknowledged writes of a versioned stream whose event first arrived after the
    event of a later write of the same object. Repeats count at their first arrival: a
    repeat of an older write after a newer one is a duplicate, not a reordering."""
    acknowledged = set(acked)
    first: set[str] = set()
    newest: dict[str, int] = {}
    late = []
    for write in arrived:
        if write not in acknowledged or write in first:
            continue
        first.add(write)
        key, _, version = write.rpartition("~")
        if int(version) < newest.get(key, -1):
            late.append(write)
        newest[key] = max(int(version), newest.get(key, -1))
    return late


class Target(Protocol):
    """The endpoint end: where a Topic pushes and which object keys arrived there."""

    def endpoint(self, topic: str) -> dict[str, Any]:
        """The Topic spec fields that point it here."""
        ...

    def keys(self, topic: str) -> list[str]:
        """Every object key delivered for ``topic`` so far, repeats included."""
        ...


class HttpTarget:
    """An HTTP receiver with a path per topic; ``versioned``: what arrived is named by
    ``write_id`` (key and version, from the object's size), for a versioned ``Stream``."""

    def __init__(self, receiver: RecordingHttpServer, versioned: bool = False) -> None:
        self._receiver = receiver
        self._versioned = versioned
        self._seen: dict[str, list[str]] = collections.defaultdict(list)
        self.arrivals: dict[str, dict[str, list[float]]] = collections.defaultdict(
            lambda: collections.defaultdict(list)
        )
        """topic → key → when each copy of its event was answered (epoch seconds)."""

    def endpoint(self, topic: str) -> dict[str, Any]:
        return {"endpoint": {"http": {"url": f"{self._receiver.url}/{topic}"}}}

    def keys(self, topic: str) -> list[str]:
        for request in self._receiver.received():
            if request.status == 200:
                records = json.loads(request.body)["Records"]
                name = request.path.strip("/")
                keys = [self._write_of(r["s3"]["object"]) for r in records]
                self._seen[name] += keys
                for key in keys:
                    self.arrivals[name][key].append(request.time)
        return list(self._seen[topic])

    def _write_of(self, obj: dict[str, Any]) -> str:
        key: str = obj["key"]
        return write_id(key, int(obj["size"]) - BODY) if self._versioned else key


class AmqpTarget:
    """A durable queue per topic on ``amq.topic``: what the broker confirmed survives its
    restart and is read here afterwards."""

    def __init__(self, rabbitmq: LocalService) -> None:
        # The Topic names no credentials (the broker's guest, loopback only); we log in as it.
        self._endpoint_url = f"amqp://{rabbitmq['AMQP_HOST']}:{rabbitmq['AMQP_PORT']}"
        self._url = rabbitmq["AMQP_URL"]
        self._seen: dict[str, list[str]] = collections.defaultdict(list)

    def endpoint(self, topic: str) -> dict[str, Any]:
        asyncio.run(self._declare(topic))
        return {
            "endpoint": {
                "amqp": {"url": self._endpoint_url, "exchange": "amq.topic", "ackLevel": "broker"}
            },
            "endpointTopic": topic,
        }

    async def _declare(self, topic: str) -> None:
        connection = await aio_pika.connect(self._url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(f"faults-{topic}", durable=True)
            await queue.bind("amq.topic", routing_key=topic)

    def keys(self, topic: str) -> list[str]:
        # While the broker is away (restarting): what arrived so far.
        with contextlib.suppress(OSError, aio_pika.exceptions.AMQPError):
            asyncio.run(self._drain(topic))
        return list(self._seen[topic])

    async def _drain(self, topic: str) -> None:
        connection = await aio_pika.connect(self._url, timeout=5)
        async with connection:
            channel = await connection.channel()
            queue = await channel.get_queue(f"faults-{topic}")
            while (message := await queue.get(fail=False, timeout=5)) is not None:
                records = json.loads(message.body)["Records"]
                self._seen[topic] += [r["s3"]["object"]["key"] for r in records]
                await message.ack()


class KafkaTarget:
    """A Kafka topic per Topic, read from the start each time (it keeps everything)."""

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap
        self._seen: dict[str, list[str]] = {}

    def endpoint(self, topic: str) -> dict[str, Any]:
        return {
            "endpoint": {"kafka": {"url": f"kafka://{self._bootstrap}", "ackLevel": "broker"}},
            "endpointTopic": topic,
        }

    def keys(self, topic: str) -> list[str]:
        # While the broker is away (restarting) or the topic not made yet: what we saw last.
        with contextlib.suppress(OSError, KafkaError, asyncio.TimeoutError):
            self._seen[topic] = asyncio.run(self._read(topic))
        return list(self._seen.get(topic, []))

    async def _read(self, topic: str) -> list[str]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=self._bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            request_timeout_ms=5000,
        )
        await consumer.start()
        try:
            keys: list[str] = []
            # Everything from the start: until two polls in a row bring nothing new.
            quiet = 0
            while quiet < 2:
                batches = await consumer.getmany(timeout_ms=1000)
                quiet = 0 if batches else quiet + 1
                for messages in batches.values():
                    for message in messages:
                        records = json.loads(message.value or b"{}")["Records"]
                        keys += [r["s3"]["object"]["key"] for r in records]
            return keys
        finally:
            await consumer.stop()


@dataclass
class Pipeline:
    """Operator, replicas and Topics against ``kube`` and ``rgw``; ``close`` stops ours."""

    kube: LocalService
    rgw: LocalService
    replicas: int = 2
    replica_settings: dict[str, str] = field(default_factory=dict)
    store_endpoint: str | None = None
    """Where the replicas reach the gateway that holds their queue store (a proxy a test
    can cut), if not at ``rgw`` directly."""
    store_url: str | None = None
    """The replicas' queue store, if not a bucket of its own on ``rgw`` (``dir://...``)."""
    kubeconfigs: dict[str, str] = field(default_factory=dict)
    """``operator`` / ``delivery``: whose credentials that program uses, if not the admin's."""
    kubectl: Kubectl = field(init=False)
    namespace: str = field(init=False)
    cluster: DeliveryCluster = field(init=False)
    operator: Program | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.kubectl = Kubectl.admin(self.kube)
        # The apiserver may be one of the test's own, so the CRDs go in here, not in a
        # session fixture.
        self.kubectl.install_crds()
        self.namespace = f"f-{uuid.uuid4().hex[:10]}"
        self.kubectl.run("create", "namespace", self.namespace)
        gateway = gateway_settings(self.rgw)
        self.cluster = DeliveryCluster(
            self.kubectl,
            self.namespace,
            {
                "KUBECONFIG": self.kubeconfigs.get("delivery", self.kube["KUBECONFIG_ADMIN"]),
                "BUCKETNOTIFY_DELIVERY_STORE": (
                    self.store_url or f"s3://bnq-{uuid.uuid4().hex[:12]}"
                ),
                "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": self.namespace,
                "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([self.namespace]),
                **gateway,
                **(
                    {"BUCKETNOTIFY_GATEWAY_ENDPOINT": self.store_endpoint}
                    if self.store_endpoint
                    else {}
                ),
            },
        )
        for i in range(self.replicas):
            self.cluster.start(f"replica-{i}", **self._replica_settings())
        balancer = self.cluster.front()
        self.operator = Program(
            ["operator"],
            {
                "KUBECONFIG": self.kubeconfigs.get("operator", self.kube["KUBECONFIG_ADMIN"]),
                **gateway,
                "BUCKETNOTIFY_NAMESPACES": json.dumps([self.namespace]),
                "BUCKETNOTIFY_LEADER_ELECTION_NAMESPACE": self.namespace,
                "BUCKETNOTIFY_METRICS_PORT": "0",
                "BUCKETNOTIFY_INGEST_URL": balancer.url,
            },
        )

    def replace(self, dead: str, successor: str) -> None:
        """``successor`` in the place of the replica ``dead`` (a new pod of the same
        Deployment: the same settings, behind the same balancer)."""
        self.cluster.replace(dead, successor, **self._replica_settings())

    def _replica_settings(self) -> dict[str, str]:
        # The partitions-owned gauge every second: the apiserver test reads it mid-outage.
        return {"stats_interval_seconds": "1", **self.replica_settings}

    def topics(
        self, target: Target, handoffs: tuple[str, ...] = HANDOFFS, ready_within: float = 40
    ) -> dict[str, str]:
        """A persistent Topic per hand-off mode, each with a bucket notifying it of PUTs,
        all Ready (each waited for up to ``ready_within``). Returns topic → bucket."""
        s3 = s3_client(self.rgw)
        buckets = {}
        for handoff in handoffs:
            topic = f"{handoff}-{uuid.uuid4().hex[:8]}"
            apply(
                self.kubectl,
                self.namespace,
                "Topic",
                topic,
                {"persistent": True, "delivery": {"handoff": handoff}, **target.endpoint(topic)},
            )
            buckets[topic] = f"{topic}-b"
            s3.create_bucket(Bucket=buckets[topic])
        for topic, bucket in buckets.items():
            condition(self.kubectl, self.namespace, "topic", topic, timeout=ready_within)
            apply(
                self.kubectl,
                self.namespace,
                "BucketNotification",
                topic,
                {
                    "bucket": bucket,
                    "topicRef": {"name": topic},
                    "testEvent": False,
                    "events": ["s3:ObjectCreated:Put"],
                },
            )
        for topic in buckets:
            condition(
                self.kubectl, self.namespace, "bucketnotification", topic, timeout=ready_within
            )
        return buckets

    def close(self) -> None:
        if self.operator is not None:
            self.operator.stop()
            print(f"--- operator log ---\n{self.operator.log()[-4000:]}")
        self.cluster.stop()


@dataclass(frozen=True)
class Outcome:
    """What reached the endpoint of one topic, against what the gateway acknowledged."""

    topic: str
    acked: int
    unacked: int
    delivered: int
    duplicates: int
    duplicated: list[str]
    lost: list[str]
    unknown: list[str]

    def line(self) -> str:
        return (
            f"{self.topic}: {self.acked} acknowledged writes ({self.unacked} refused or"
            f" unanswered), {self.delivered} distinct delivered, {len(self.lost)} lost,"
            f" {self.duplicates} duplicates ({1000 * self.duplicates / max(1, self.acked):.1f}"
            f" per 1,000){': ' if self.duplicated else ''}{' '.join(self.duplicated[:12])}"
        )


QUIET_S = 15
"""How long a topic that may lose writes gets no new deliveries before it counts as settled."""


LAST_LOOK_S = 5
"""The least a settled stream is watched for stragglers before it is counted."""


def settle(
    stream: Stream,
    target: Target,
    buckets: dict[str, str],
    timeout: float,
    may_lose: frozenset[str] = frozenset(),
    sweep_until: float = 0.0,
) -> list[Outcome]:
    """Wait until every acknowledged write of every topic was delivered (or ``timeout``),
    then go on looking for copies until ``sweep_until`` (``time.time()``: past the last
    moment the fault could still make something send an event again), ``LAST_LOOK_S`` at
    least, and count. A topic in ``may_lose`` also counts as settled once nothing new
    reached it for ``QUIET_S``: what it lost never comes, and the caller judges the
    losses."""
    deadline = time.monotonic() + timeout
    seen = {t: 0 for t in buckets}
    quiet_since = {t: time.monotonic() for t in buckets}

    def settled(topic: str) -> bool:
        keys = target.keys(topic)
        if not set(stream.acked[buckets[topic]]) - set(keys):
            return True
        if len(keys) != seen[topic]:
            seen[topic], quiet_since[topic] = len(keys), time.monotonic()
        return topic in may_lose and time.monotonic() - quiet_since[topic] > QUIET_S

    while time.monotonic() < deadline and not all([settled(t) for t in buckets]):
        time.sleep(1)
    swept = time.time()
    time.sleep(max(LAST_LOOK_S, sweep_until - swept))
    print(f"looked for late copies for {time.time() - swept:.1f} s after the stream settled")
    outcomes = []
    for topic, bucket in buckets.items():
        keys = target.keys(topic)
        counts = collections.Counter(keys)
        written = set(stream.acked[bucket]) | set(stream.unacked[bucket])
        outcomes.append(
            Outcome(
                topic=topic,
                acked=len(stream.acked[bucket]),
                unacked=len(stream.unacked[bucket]),
                delivered=len(counts),
                duplicates=len(keys) - len(counts),
                duplicated=sorted(k for k, n in counts.items() if n > 1),
                lost=sorted(set(stream.acked[bucket]) - set(counts)),
                unknown=sorted(set(counts) - written),
            )
        )
    for outcome in outcomes:
        print(outcome.line())
    return outcomes
