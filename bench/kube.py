"""Our custom resources applied with kubectl, as a user would, and waited for."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from typing import Any

from tests.resources import apply

from devstack.kubectl import Kubectl

__all__ = ["Kubectl", "SetupError", "apply", "new_namespace", "wait_ready"]


class SetupError(RuntimeError):
    """A scenario could not be set up; the message says what was last seen."""


def new_namespace(kubectl: Kubectl, prefix: str) -> str:
    # Never deleted: the local control plane has no namespace controller to finish it.
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    kubectl.run("create", "namespace", name)
    return name


def wait_ready(kubectl: Kubectl, namespace: str, kind: str, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = kubectl.get(kind, name, namespace).get("status") or {}
        ready = {c["type"]: c for c in status.get("conditions", [])}.get("Ready", {})
        if ready.get("status") == "True":
            return
        time.sleep(0.3)
    raise SetupError(f"{kind} {namespace}/{name} not Ready after {timeout:.0f} s: {status}")


def wait_lease_held(kubectl: Kubectl, namespace: str, name: str, timeout: float) -> bool:
    """Wait until someone holds the Lease ``name``; False when nobody did in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = kubectl.run("get", "lease", name, "-n", namespace, "-o", "json", check=False)
        if result.returncode == 0 and json.loads(result.stdout)["spec"].get("holderIdentity"):
            return True
        time.sleep(0.3)
    return False


def partition_holders(kubectl: Kubectl, namespace: str) -> Counter[str]:
    """How many partition Leases each delivery replica holds (see delivery/peers/ownership.py)."""
    out = kubectl.run(
        "get", "leases", "-n", namespace, "-l", "bucketnotify.io/lease-role=partition", "-o", "json"
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return Counter(item["spec"].get("holderIdentity") or "" for item in items)


def wait_even_ownership(
    kubectl: Kubectl,
    namespace: str,
    identities: list[str],
    partitions: int,
    timeout: float,
    *,
    stable_s: float = 0.0,
) -> Counter[str]:
    """Wait until ``identities`` hold all ``partitions`` evenly, and have for ``stable_s``;
    the spread last seen.

    Replicas hand partitions over on their renewal ticks; measuring while they still move
    would measure the hand-over, not delivery. So would measuring right after the last
    move: the other replicas learn of it only at their next tick, and a replica polls the
    shards it has just taken for a while (``delivery.rounds.shard_loops.HANDOVER_POLL_ROUNDS``).
    """
    deadline = time.monotonic() + timeout
    even_since: float | None = None
    while True:
        holders = partition_holders(kubectl, namespace)
        counts = [holders.get(i, 0) for i in identities]
        if sum(counts) == partitions and max(counts) - min(counts) <= 1:
            now = time.monotonic()
            even_since = now if even_since is None else even_since
            if now - even_since >= stable_s:
                return holders
        else:
            even_since = None
        if time.monotonic() > deadline:
            raise SetupError(
                f"delivery replicas {identities} did not spread {partitions} partitions "
                f"evenly within {timeout:.0f} s; last seen: {dict(holders)}"
            )
        time.sleep(0.5)
