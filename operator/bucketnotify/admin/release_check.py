"""``bucketnotify release check``: does an installed release work? What the chart's
``helm test`` runs (``templates/tests/``), and what a person can run after an install.

Each check says what it saw, in order:

- ``leader``: the operator's leader Lease is held and renewed within its duration (one
  operator replica reconciles);
- ``webhook``: a BucketNotification whose key regex the gateway cannot compile, created
  with ``dryRun``, is refused by our admission webhook with its own message (the API
  server reaches the operator pods over the chart's Service and certificate); nothing is
  stored;
- ``topic``: a throw-away Topic becomes Ready (the operator reconciles it on the gateway),
  is deleted, and is gone (the operator removed its gateway topic and its finalizer).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from dataclasses import dataclass
from typing import Any

from bucketnotify.admin.cluster import Cluster
from bucketnotify.admin.errors import AdminError, NotFound
from bucketnotify.admin.views import is_ready

__all__ = ["Check", "check_release"]

REFUSED_REGEX = "images)"
"""A ')' that closes no group: the CRD schema takes it, the webhook refuses it."""
WEBHOOK_SAYS = "outside the gateway's regex dialect"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.detail}\n"


async def check_release(
    cluster: Cluster,
    *,
    namespace: str,
    leader_lease: str | None,
    lease_namespace: str | None,
    webhook: bool,
    topic: bool,
    ready_within_s: float,
) -> list[Check]:
    """The checks asked for: the throw-away objects in ``namespace``, the operator's Lease
    in ``lease_namespace`` (default: the same)."""
    checks = []
    if leader_lease:
        checks.append(await _leader(cluster, lease_namespace or namespace, leader_lease))
    if webhook:
        checks.append(await _webhook(cluster, namespace))
    if topic:
        checks.append(await _topic(cluster, namespace, ready_within_s))
    return checks


async def _leader(cluster: Cluster, namespace: str, name: str) -> Check:
    try:
        lease = await cluster.lease(namespace, name)
    except NotFound:
        return Check("leader", False, f"no Lease {namespace}/{name}: is the operator running?")
    spec = lease.get("spec") or {}
    holder, renewed = spec.get("holderIdentity"), spec.get("renewTime")
    if not holder or not renewed:
        return Check("leader", False, f"Lease {name} is held by nobody")
    age = (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(renewed)).total_seconds()
    duration = spec.get("leaseDurationSeconds") or 0
    if age > duration:
        return Check(
            "leader", False, f"{holder} last renewed {age:.0f} s ago, past the {duration} s"
        )
    return Check("leader", True, f"{holder} leads (renewed {age:.0f} s ago)")


async def _webhook(cluster: Cluster, namespace: str) -> Check:
    body = _object(
        "BucketNotification",
        namespace,
        f"release-check-{uuid.uuid4().hex[:8]}",
        {
            "bucket": "release-check",
            "topicRef": {"name": "release-check"},
            "filter": {"key": {"regex": REFUSED_REGEX}},
        },
    )
    try:
        await cluster.create("notification", namespace, body, dry_run=True)
    except AdminError as exc:
        if WEBHOOK_SAYS in str(exc):
            return Check("webhook", True, "refused a key regex the gateway cannot compile")
        return Check("webhook", False, f"the API server said: {exc}")
    return Check(
        "webhook", False, "a key regex the gateway cannot compile was taken: no webhook called"
    )


async def _topic(cluster: Cluster, namespace: str, ready_within_s: float) -> Check:
    timeout = ready_within_s
    name = f"release-check-{uuid.uuid4().hex[:8]}"
    spec = {"endpoint": {"http": {"url": "http://127.0.0.1:9/release-check"}}}
    await cluster.create("topic", namespace, _object("Topic", namespace, name, spec))
    started = time.monotonic()
    try:
        while not is_ready(obj := await cluster.get("topic", namespace, name)):
            if time.monotonic() - started > timeout:
                conditions = (obj.get("status") or {}).get("conditions") or []
                return Check(
                    "topic", False, f"{name} not Ready after {timeout:.0f} s: {conditions}"
                )
            await asyncio.sleep(1)
        ready_s = time.monotonic() - started
    finally:
        await cluster.delete("topic", namespace, name)
    while time.monotonic() - started < 2 * timeout:
        try:
            await cluster.get("topic", namespace, name)
        except NotFound:
            return Check("topic", True, f"{name} Ready in {ready_s:.0f} s, then deleted and gone")
        await asyncio.sleep(1)
    return Check("topic", False, f"{name} still there {2 * timeout:.0f} s after its delete")


def _object(kind: str, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "bucketnotify.io/v1alpha1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "bucketnotify-release-check"},
        },
        "spec": spec,
    }
