"""Applying our custom resources and waiting for their Ready condition."""

from __future__ import annotations

from typing import Any

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


def condition(
    kubectl: Kubectl,
    namespace: str,
    kind: str,
    name: str,
    status: str = "True",
    reason: str | None = None,
) -> dict[str, Any]:
    """Wait until the object's Ready condition has ``status`` (and ``reason``); its status."""

    def observe() -> dict[str, Any]:
        got: dict[str, Any] = kubectl.get(kind, name, namespace).get("status") or {}
        return got

    def done(st: dict[str, Any]) -> bool:
        ready = {c["type"]: c for c in st.get("conditions", [])}.get("Ready", {})
        return ready.get("status") == status and (reason is None or ready.get("reason") == reason)

    return wait_until(observe, done, 40, f"{kind} {name} Ready={status} {reason or ''}")
