"""Applying our custom resources and waiting for their Ready condition."""

from __future__ import annotations

import json
import secrets
from typing import Any

from bucketnotify.api.topic import ingest_token_secret
from tests.kubectl import Kubectl
from tests.waiting import wait_until

API = "bucketnotify.io/v1alpha1"


def apply(kubectl: Kubectl, namespace: str, kind: str, name: str, spec: dict[str, Any]) -> None:
    kubectl.apply(
        {
            "apiVersion": API,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
    )


def gateway_secret(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    endpoint: str,
    access_key: str,
    secret_key: str,
    **more: str,
) -> None:
    """A Secret a ``gatewayRef`` names: the gateway's endpoint and a user's keys (and
    ``more`` keys: region, kind)."""
    kubectl.run(
        "create", "secret", "generic", name, "-n", namespace,
        f"--from-literal=endpoint={endpoint}",
        f"--from-literal=accessKey={access_key}",
        f"--from-literal=secretKey={secret_key}",
        *(f"--from-literal={key}={value}" for key, value in more.items()),
    )  # fmt: skip


def rook_user_secret(
    kubectl: Kubectl, namespace: str, endpoint: str, access_key: str, secret_key: str
) -> str:
    """The Secret Rook makes for a CephObjectStoreUser (its name, type, labels and keys
    ``Endpoint``, ``AccessKey``, ``SecretKey``), as a ``gatewayRef`` may name it; its name."""
    name = "rook-ceph-object-user-my-store-team"
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    "app": "rook-ceph-rgw",
                    "user": "team",
                    "rook_cluster": namespace,
                    "rook_object_store": "my-store",
                },
            },
            "type": "kubernetes.io/rook",
            "stringData": {"AccessKey": access_key, "SecretKey": secret_key, "Endpoint": endpoint},
        }
    )
    return name


def condition(
    kubectl: Kubectl,
    namespace: str,
    kind: str,
    name: str,
    status: str = "True",
    reason: str | None = None,
    timeout: float = 40,
) -> dict[str, Any]:
    """Wait until the object's Ready condition has ``status`` (and ``reason``); its status."""

    def observe() -> dict[str, Any]:
        got: dict[str, Any] = kubectl.get(kind, name, namespace).get("status") or {}
        return got

    def done(st: dict[str, Any]) -> bool:
        ready = {c["type"]: c for c in st.get("conditions", [])}.get("Ready", {})
        return ready.get("status") == status and (reason is None or ready.get("reason") == reason)

    return wait_until(observe, done, timeout, f"{kind} {name} Ready={status} {reason or ''}")


def credentials_secret(
    kubectl: Kubectl, namespace: str, name: str, username: str, password: str
) -> None:
    """A broker credentials Secret (keys ``username``, ``password``) as a Topic's
    ``credentialsRef`` names it."""
    kubectl.run(
        "create", "secret", "generic", name, "-n", namespace,
        f"--from-literal=username={username}", f"--from-literal=password={password}",
    )  # fmt: skip


def token_secret(kubectl: Kubectl, namespace: str, topic: str) -> str:
    """The ingest token Secret the operator would make for a persistent Topic; its token
    (for tests that run a replica without the operator)."""
    token = secrets.token_urlsafe(24)
    kubectl.run(
        "create", "secret", "generic", ingest_token_secret(topic), "-n", namespace,
        f"--from-literal=token={token}",
    )  # fmt: skip
    return token


def object_events(kubectl: Kubectl, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    """The Events on one object, oldest first."""
    listed = json.loads(kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout)
    found = [
        e
        for e in listed["items"]
        if e["involvedObject"].get("kind") == kind and e["involvedObject"]["name"] == name
    ]
    return sorted(found, key=lambda e: e["metadata"]["creationTimestamp"])
