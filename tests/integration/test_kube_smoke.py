"""The local control plane is a real kube-apiserver: CRDs, custom objects, Leases, RBAC."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.kubeapi import api_client
from tests.localservices import LocalService

GROUP = "smoke.bucketnotify.io"


@pytest.fixture()
async def admin(kube: LocalService) -> AsyncIterator[client.ApiClient]:
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


async def install_crd(admin: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(admin)
    try:
        await ext.create_custom_resource_definition(widget_crd())  # type: ignore[arg-type]
    except ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = await ext.read_custom_resource_definition(f"widgets.{GROUP}")
        conditions = crd.status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        await asyncio.sleep(0.2)
    pytest.fail("the Widget CRD never became Established")


async def test_custom_resource_round_trip_and_schema_validation(
    admin: client.ApiClient, namespace: str
) -> None:
    """A CRD with OpenAPI and CEL rules is served; good objects persist, bad ones are refused."""
    await install_crd(admin)
    custom = client.CustomObjectsApi(admin)
    body = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "w1"}}
    await custom.create_namespaced_custom_object(
        GROUP, "v1", namespace, "widgets", {**body, "spec": {"size": 3}}
    )
    got = await custom.get_namespaced_custom_object(GROUP, "v1", namespace, "widgets", "w1")
    assert got["spec"] == {"size": 3}
    assert got["metadata"]["generation"] == 1

    await custom.patch_namespaced_custom_object_status(
        GROUP,
        "v1",
        namespace,
        "widgets",
        "w1",
        {"status": {"observedGeneration": 1}},
        _content_type="application/merge-patch+json",
    )
    got = await custom.get_namespaced_custom_object(GROUP, "v1", namespace, "widgets", "w1")
    assert got["status"] == {"observedGeneration": 1}

    with pytest.raises(ApiException) as refused:
        await custom.create_namespaced_custom_object(
            GROUP, "v1", namespace, "widgets", {**body, "spec": {"size": 11}}
        )
    assert refused.value.status == 422
    assert "size is at most 10" in refused.value.body


async def test_lease_create_renew_and_conflict(admin: client.ApiClient, namespace: str) -> None:
    """Leases renew with optimistic concurrency: a stale writer gets 409, never a silent win."""
    coordination = client.CoordinationV1Api(admin)
    now = dt.datetime.now(dt.UTC)
    lease = await coordination.create_namespaced_lease(
        namespace,
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="shard-0"),
            spec=client.V1LeaseSpec(
                holder_identity="replica-a",
                lease_duration_seconds=15,
                acquire_time=now,
                renew_time=now,
            ),
        ),
    )
    stale_version = lease.metadata.resource_version

    lease.spec.renew_time = now + dt.timedelta(seconds=5)
    renewed = await coordination.replace_namespaced_lease("shard-0", namespace, lease)
    assert renewed.spec.holder_identity == "replica-a"
    assert renewed.spec.renew_time > now
    assert renewed.metadata.resource_version != stale_version

    takeover = client.V1Lease(
        metadata=client.V1ObjectMeta(name="shard-0", resource_version=stale_version),
        spec=client.V1LeaseSpec(holder_identity="replica-b", lease_duration_seconds=15),
    )
    with pytest.raises(ApiException) as conflict:
        await coordination.replace_namespaced_lease("shard-0", namespace, takeover)
    assert conflict.value.status == 409
    current = await coordination.read_namespaced_lease("shard-0", namespace)
    assert current.spec.holder_identity == "replica-a"


async def test_rbac_refuses_a_user_without_rights_until_granted(
    kube: LocalService, admin: client.ApiClient, namespace: str
) -> None:
    """RBAC is really enforced: a user without a binding is refused, a Role grants exactly that."""
    async with api_client(kube["KUBECONFIG_NOBODY"]) as nobody:
        with pytest.raises(ApiException) as refused:
            await client.CoordinationV1Api(nobody).list_namespaced_lease(namespace)
        assert refused.value.status == 403
        assert "bucketnotify-nobody" in refused.value.body

        rbac = client.RbacAuthorizationV1Api(admin)
        await rbac.create_namespaced_role(
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="lease-reader"),
                rules=[
                    client.V1PolicyRule(
                        api_groups=["coordination.k8s.io"], resources=["leases"], verbs=["list"]
                    )
                ],
            ),
        )
        await rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="lease-reader"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name="lease-reader"
                ),
                subjects=[
                    client.RbacV1Subject(
                        kind="User",
                        name="bucketnotify-nobody",
                        api_group="rbac.authorization.k8s.io",
                    )
                ],
            ),
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                await client.CoordinationV1Api(nobody).list_namespaced_lease(namespace)
                break
            except ApiException as exc:
                # The RBAC authorizer reads bindings from an informer cache: allow it to catch up.
                if exc.status != 403 or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

        # The grant is exactly "list leases in this namespace": writing one is still refused.
        with pytest.raises(ApiException) as still_refused:
            await client.CoordinationV1Api(nobody).create_namespaced_lease(
                namespace, client.V1Lease(metadata=client.V1ObjectMeta(name="x"))
            )
        assert still_refused.value.status == 403
