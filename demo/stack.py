"""The demo's processes on this machine: an HTTP receiver, two delivery replicas sharing a
queue store on the gateway, and the operator; started and waited for until they work."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demo.console import DemoError, Ticker, info, step
from demo.processes import STATE_DIR, State, wait_listening
from devstack.gateway import gateway_settings
from devstack.programs import BIN, free_port
from devstack.services import Service

__all__ = ["NAMESPACE", "PARTITIONS", "QUEUE_BUCKET", "Stack", "metric_lines", "start_stack"]

NAMESPACE = "bucketnotify-demo"
QUEUE_BUCKET = "bucketnotify-demo-queues"
REPLICAS = ("replica-1", "replica-2")
PARTITIONS = 32


@dataclass(frozen=True)
class Stack:
    received: Path
    """The JSON-lines file of the HTTP receiver."""
    receiver_url: str
    replicas: list[dict[str, Any]]
    operator: dict[str, Any]
    delivery_env: dict[str, str]
    """What a delivery replica is given; the admin CLI reads the queue store with it too."""


def start_stack(state: State, kube: Service, rgw: Service) -> Stack:
    step("An HTTP endpoint for the events")
    received = STATE_DIR / "received.jsonl"
    received.write_text("")
    port = free_port()
    receiver = state.spawn(
        "receiver",
        [
            str(BIN / "python"),
            "-m",
            "devstack.servers.arrivals",
            f"--port={port}",
            f"--journal={received}",
        ],
        {},
        port=port,
    )
    wait_listening(receiver)
    receiver_url = f"http://127.0.0.1:{port}/events"
    info(f"{receiver_url} appends every event to {received}")

    step("Two delivery replicas sharing a queue store on the gateway")
    delivery_env = {
        "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
        "BUCKETNOTIFY_DELIVERY_STORE": f"s3://{QUEUE_BUCKET}",
        "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": NAMESPACE,
        "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([NAMESPACE]),
        "BUCKETNOTIFY_DELIVERY_PARTITIONS": str(PARTITIONS),
        # Records every second instead of every 5 s: the report step waits for them.
        "BUCKETNOTIFY_DELIVERY_RECORDS_FLUSH_SECONDS": "1",
        "BUCKETNOTIFY_DELIVERY_STATS_INTERVAL_SECONDS": "2",
        # The local RabbitMQ and Kafka have no TLS (the operator is told the same).
        "BUCKETNOTIFY_DELIVERY_ALLOW_CLEARTEXT_SECRETS": "true",
        "BUCKETNOTIFY_LOG_FORMAT": "plain",
        **gateway_settings(rgw),
    }
    replicas = []
    for identity in REPLICAS:
        port = free_port()
        env = {
            **delivery_env,
            "BUCKETNOTIFY_DELIVERY_IDENTITY": identity,
            "BUCKETNOTIFY_DELIVERY_LISTEN_PORT": str(port),
        }
        replicas.append(state.spawn(identity, [str(BIN / "bucketnotify"), "delivery"], env, port))
    for proc in replicas:
        wait_listening(proc)
        info(f"{proc['name']}: ingest and /metrics on http://127.0.0.1:{proc['port']}")
    info(f"queues in s3://{QUEUE_BUCKET}, delivery records in s3://{QUEUE_BUCKET}/records")

    step("The operator")
    info(
        "BUCKETNOTIFY_ALLOW_CLEARTEXT_SECRETS=true: the local RabbitMQ and Kafka have no TLS."
        " For this local demo only; never on a cluster"
    )
    port = free_port()
    operator_env = {
        "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
        **gateway_settings(rgw),
        "BUCKETNOTIFY_NAMESPACES": json.dumps([NAMESPACE]),
        "BUCKETNOTIFY_LEADER_ELECTION_NAMESPACE": NAMESPACE,
        # No Service spreads the ingest here: the gateway pushes to replica-1, which
        # commits to the shared store; replica-2 delivers the shards it owns.
        "BUCKETNOTIFY_INGEST_URL": f"http://127.0.0.1:{replicas[0]['port']}",
        "BUCKETNOTIFY_METRICS_PORT": str(port),
        "BUCKETNOTIFY_ALLOW_CLEARTEXT_SECRETS": "true",
        "BUCKETNOTIFY_LOG_FORMAT": "plain",
    }
    operator = state.spawn("operator", [str(BIN / "bucketnotify"), "operator"], operator_env, port)
    wait_listening(operator)
    info(f"operator: /metrics on http://127.0.0.1:{port}")
    _wait_balanced(replicas)
    return Stack(received, receiver_url, replicas, operator, delivery_env)


def metric_lines(port: int, families: tuple[str, ...]) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return [line for line in text.splitlines() if line.startswith(families)]


def _wait_balanced(replicas: list[dict[str, Any]], timeout: float = 90) -> None:
    """Until the replicas share the ownership Leases: events are uploaded once both work."""
    ticker = Ticker("the replicas are sharing the Leases")
    deadline = time.monotonic() + timeout
    owned: dict[str, float] = {}
    while time.monotonic() < deadline:
        owned = {
            p["name"]: sum(
                float(line.rsplit(" ", 1)[1])
                for line in metric_lines(p["port"], ("bucketnotify_lease_partitions_owned",))
            )
            for p in replicas
        }
        # Fair shares (16/16): while a replica still hands partitions over, an event of
        # such a partition waits for the hand-over.
        shares = list(owned.values())
        if sum(shares) == PARTITIONS and max(shares) - min(shares) <= 1:
            split = ", ".join(f"{name} {n:.0f}" for name, n in owned.items())
            info(f"ownership Leases: {split} of {PARTITIONS} partitions")
            return
        ticker.tick(str(owned))
        time.sleep(0.5)
    raise DemoError(
        f"the replicas do not share the {PARTITIONS} Leases after {timeout:.0f} s ({owned});"
        f" see their logs in {STATE_DIR}"
    )
