"""The local control plane is a real kube-apiserver: CRDs, custom objects, Leases, RBAC."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bucketnotify.kube.apiserver import ApiClient, ApiError, lease_path, micro_time, object_path
from tests.kubeapi import api_client, parse_micro_time
from tests.localservices import LocalService

GROUP = "smoke.bucketnotify.io"
CRDS = object_path("apiextensions.k8s.io", "v1", "customresourcedefinitions")
WIDGET_CRD = object_path(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", name=f"widgets.{GROUP}"
)


@pytest.fixture()
async def admin(kube: LocalService) -> AsyncIterator[ApiClient]:
    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        yield api


def widget_crd() -> dict[str, object]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {
                                        "size": {"type": "integer", "minimum": 1},
                                    },
                                    "x-kubernetes-validations": [
                                        {"rule": "self.size <= 10", "message": "size is at most 10"}
                                    ],
                                },
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


async def install_crd(admin: ApiClient) -> None:
    try:
        await admin.create(CRDS, widget_crd())
    except ApiError as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = await admin.get(WIDGET_CRD)
        conditions = (crd.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        await asyncio.sleep(0.2)
    pytest.fail("the Widget CRD never became Established")


async def test_custom_resource_round_trip_and_schema_validation(
    admin: ApiClient, namespace: str
) -> None:
    """A CRD with OpenAPI and CEL rules is served; good objects persist, bad ones are refused."""
    await install_crd(admin)
    widgets = object_path(GROUP, "v1", "widgets", namespace)
    w1 = object_path(GROUP, "v1", "widgets", namespace, "w1")
    body = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "w1"}}
    await admin.create(widgets, {**body, "spec": {"size": 3}})
    got = await admin.get(w1)
    assert got["spec"] == {"size": 3}
    assert got["metadata"]["generation"] == 1

    await admin.merge_patch(f"{w1}/status", {"status": {"observedGeneration": 1}})
    got = await admin.get(w1)
    assert got["status"] == {"observedGeneration": 1}

    with pytest.raises(ApiError) as refused:
        await admin.create(widgets, {**body, "spec": {"size": 11}})
    assert refused.value.status == 422
    assert "size is at most 10" in refused.value.body


def lease(metadata: dict[str, str], holder: str, **spec: object) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, **spec},
    }


async def test_lease_create_renew_and_conflict(admin: ApiClient, namespace: str) -> None:
    """Leases renew with optimistic concurrency: a stale writer gets 409, never a silent win."""
    now = dt.datetime.now(dt.UTC)
    created = await admin.create(
        lease_path(namespace),
        lease(
            {"name": "shard-0"},
            "replica-a",
            acquireTime=micro_time(now),
            renewTime=micro_time(now),
        ),
    )
    stale_version = created["metadata"]["resourceVersion"]

    created["spec"]["renewTime"] = micro_time(now + dt.timedelta(seconds=5))
    renewed = await admin.replace(lease_path(namespace, "shard-0"), created)
    assert renewed["spec"]["holderIdentity"] == "replica-a"
    assert parse_micro_time(renewed["spec"]["renewTime"]) > now
    assert renewed["metadata"]["resourceVersion"] != stale_version

    takeover = lease({"name": "shard-0", "resourceVersion": stale_version}, "replica-b")
    with pytest.raises(ApiError) as conflict:
        await admin.replace(lease_path(namespace, "shard-0"), takeover)
    assert conflict.value.status == 409
    current = await admin.get(lease_path(namespace, "shard-0"))
    assert current["spec"]["holderIdentity"] == "replica-a"


async def test_rbac_refuses_a_user_without_rights_until_granted(
    kube: LocalService, admin: ApiClient, namespace: str
) -> None:
    """RBAC is really enforced: a user without a binding is refused, a Role grants exactly that."""
    rbac = "rbac.authorization.k8s.io"
    async with api_client(kube["KUBECONFIG_NOBODY"]) as nobody:
        with pytest.raises(ApiError) as refused:
            await nobody.get(lease_path(namespace))
        assert refused.value.status == 403
        assert "bucketnotify-nobody" in refused.value.body

        await admin.create(
            object_path(rbac, "v1", "roles", namespace),
            {
                "apiVersion": f"{rbac}/v1",
                "kind": "Role",
                "metadata": {"name": "lease-reader"},
                "rules": [
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "resources": ["leases"],
                        "verbs": ["list"],
                    }
                ],
            },
        )
        await admin.create(
            object_path(rbac, "v1", "rolebindings", namespace),
            {
                "apiVersion": f"{rbac}/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "lease-reader"},
                "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "lease-reader"},
                "subjects": [{"kind": "User", "name": "bucketnotify-nobody", "apiGroup": rbac}],
            },
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                await nobody.get(lease_path(namespace))
                break
            except ApiError as exc:
                # The RBAC authorizer reads bindings from an informer cache: allow it to catch up.
                if exc.status != 403 or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

        # The grant is exactly "list leases in this namespace": writing one is still refused.
        with pytest.raises(ApiError) as still_refused:
            await nobody.create(lease_path(namespace), {"metadata": {"name": "x"}})
        assert still_refused.value.status == 403
