"""Delivery replicas as real processes behind a balancer, the way a Service spreads them.

The gateway pushes to one ingest URL; in a cluster that is a Service in front of every
replica. Here a round-robin TCP balancer plays that part: a connection goes to the next
replica that accepts it, so a killed replica drops out as its endpoint would.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bucketnotify.delivery.ownership import LeaseSettings
from bucketnotify.delivery.queue import QueueName
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.processes import Program


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Balancer:
    """Round-robin TCP forwarding to ``ports``, skipping those that refuse connections."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self._next = itertools.cycle(range(len(ports)))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        for _ in self.ports:
            port = self.ports[next(self._next)]
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()
            return
        client.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


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
        self.balancer = Balancer(list(self.ports.values()))
        return self.balancer

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.replicas[name].process.send_signal(sig)
        if sig == signal.SIGKILL:
            self.replicas[name].process.wait()

    def metric(self, sample: str) -> float:
        """``sample`` (e.g. ``pubsub_push_failed_total``) summed over the running replicas'
        ``GET /metrics``."""
        total = 0.0
        for name, program in self.replicas.items():
            if program.process.poll() is not None:
                continue
            url = f"http://127.0.0.1:{self.ports[name]}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
            for family in text_string_to_metric_families(text):
                total += sum(s.value for s in family.samples if s.name == sample)
        return total

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
                "BUCKETNOTIFY_GATEWAY_ENDPOINT": rgw["RGW_ENDPOINT"],
                "BUCKETNOTIFY_GATEWAY_ACCESS_KEY": rgw["RGW_ACCESS_KEY"],
                "BUCKETNOTIFY_GATEWAY_SECRET_KEY": rgw["RGW_SECRET_KEY"],
            },
        )
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()


def push_records(port: int, namespace: str, topic: str, token: str, keys: list[str]) -> int:
    """Push records of these object keys to a replica's ingest, as the gateway does; the HTTP
    status (0: nothing listens there yet)."""
    body = json.dumps(
        {
            "Records": [
                {
                    "eventName": "ObjectCreated:Put",
                    "s3": {"bucket": {"name": "b"}, "object": {"key": k, "sequencer": k}},
                }
                for k in keys
            ]
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/topics/{namespace}/{topic}/{token}", data=body, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError:
        return 0


class OwnsEverything:
    """An Ownership stand-in for a replica alone: every shard is its own."""

    identity = "replica-0"
    before_release = None
    settings = LeaseSettings(namespace="default")
    joined = True

    def owns_shard(self, queue: QueueName, shard: int) -> bool:
        return True

    def owned(self) -> set[int]:
        return set(range(32))
