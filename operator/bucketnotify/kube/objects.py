"""Kubernetes reads and writes the operator's reconcilers make besides kopf's own: Secrets,
ConfigMaps, ObjectBucketClaims, our objects and their annotations.

An adapter over ``apiserver``. The other callers of the API server each own one concern:
``leadership`` (the operator's leader Lease), ``event_recorder`` (Events),
``delivery.peers.ownership`` (partition and member Leases), ``delivery.topics.table`` (the Topics
and token Secrets a replica serves) and ``admin.cluster`` (the admin CLI's reads).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from bucketnotify import logs
from bucketnotify.api.common import GROUP, VERSION, CARef
from bucketnotify.api.topic import ClientCertificate, Credentials, Endpoint
from bucketnotify.kube.apiserver import (
    ApiClient,
    ApiError,
    connect,
    current_namespace,
    object_path,
)

__all__ = ["WATCHED_LABEL", "Kube", "SecretMissing", "connect", "current_namespace"]

log = logging.getLogger(__name__)

LABELLED_REMEMBERED = 4096
"""Secrets whose label version ``Kube`` remembers (the watch event follows within a second)."""

WATCHED_LABEL = f"{GROUP}/watched"
"""On the Secrets the operator watches: only these reach it, not every Secret of the cluster
(a cluster holds thousands, Helm's releases among them, up to 1 MiB each). The operator puts
it on the Secrets it creates and on every Secret a Topic makes it read."""


CLAIM_GROUP, CLAIM_VERSION = "objectbucket.io", "v1alpha1"
"""ObjectBucketClaims, as Rook (lib-bucket-provisioner) serves them."""

METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
"""Asks the API server for an object's metadata alone (its data never leaves the server)."""


def _path(plural: str, namespace: str, name: str, subresource: str | None = None) -> str:
    return object_path(GROUP, VERSION, plural, namespace, name, subresource)


def _core_path(plural: str, namespace: str, name: str | None = None) -> str:
    return object_path("", "v1", plural, namespace, name)


class SecretMissing(Exception):
    """A referenced Secret or key does not exist (message names which, never a value)."""


class Kube:
    def __init__(self, api: ApiClient, *, label_secrets: bool = False) -> None:
        """``label_secrets``: put ``WATCHED_LABEL`` on every Secret read (the operator's)."""
        self._api = api
        self._label_secrets = label_secrets
        self._label_refused = False
        self._labelled: OrderedDict[tuple[str, str], str] = OrderedDict()
        """(namespace, name) -> the resourceVersion our label patch made, the latest ones."""
        self._labelling: dict[tuple[str, str], asyncio.Event] = {}
        """(namespace, name) -> set when the label patch under way has its answer."""
        self._listed: Mapping[str, Mapping[str, dict[str, Any]]] = {}
        """Secrets already listed, by namespace and name (``reading_from``)."""

    async def list_secrets(self, namespace: str) -> dict[str, dict[str, Any]]:
        """The Secrets of ``namespace`` labelled ``WATCHED_LABEL`` by name, from the API
        server's watch cache: one request where re-reading the Secrets of thousands of
        Topics would make one each. Only ours: a namespace may hold Helm's releases and
        others of up to 1 MiB each."""
        listed = await self._api.get(
            _core_path("secrets", namespace),
            params={"resourceVersion": "0", "labelSelector": f"{WATCHED_LABEL}=true"},
        )
        items: list[dict[str, Any]] = listed.get("items") or []
        return {item["metadata"]["name"]: item for item in items}

    def reading_from(self, listed: Mapping[str, Mapping[str, dict[str, Any]]]) -> Kube:
        """A view of this client whose Secret reads in the namespaces of ``listed``
        (namespace -> name -> Secret, from ``list_secrets``) answer from it; a Secret the
        list did not hold (not labelled, or too new for the watch cache) and every other
        read go to the API server."""
        view = copy.copy(self)
        view._listed = listed
        return view

    async def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        secret = self._listed.get(namespace, {}).get(name)
        if secret is None:
            try:
                secret = await self._api.get(_core_path("secrets", namespace, name))
            except ApiError as exc:
                if exc.status == 404:
                    raise SecretMissing(f"Secret {namespace}/{name} does not exist") from None
                raise
        metadata = secret["metadata"]
        if self._label_secrets and WATCHED_LABEL not in (metadata.get("labels") or {}):
            await self._label_secret(namespace, name, metadata["resourceVersion"])
        raw: dict[str, str] = secret.get("data") or {}
        data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
        # Whatever a driver or a URL later echoes of these, the logs will not show it.
        logs.remember_secrets(v for k, v in data.items() if logs.secret_key_name(k))
        return data

    async def labelled_by_us(self, namespace: str, name: str, resource_version: str | None) -> bool:
        """Whether this version of the Secret is the one our label (or our creation of an
        ingest token Secret) made: its data is what the reader just had, so its watch event
        asks for no re-sync (a Secret shared by a thousand Topics would otherwise re-sync
        them all once, at its first read).

        The watch event can arrive before the label patch's own answer (both are on their
        way at once), so a patch (or creation) under way is waited for: only its answer
        says which version it made."""
        pending = self._labelling.get((namespace, name))
        if pending is not None:
            await pending.wait()
        return resource_version is not None and self._labelled.get((namespace, name)) == (
            resource_version
        )

    async def _label_secret(self, namespace: str, name: str, read_version: str) -> None:
        """Label a Secret the operator reads, so that its changes reach the operator's watch.

        Its data is left alone (a merge patch of one label), so the writer that owns the
        Secret (a GitOps tool, a secrets controller) keeps it; one that replaces the Secret
        wholesale drops the label, and the next read (the drift check) puts it back."""
        key = (namespace, name)
        answered = self._labelling[key] = asyncio.Event()
        try:
            await self._label_secret_once(namespace, name, read_version)
        finally:
            if self._labelling.get(key) is answered:
                del self._labelling[key]
            answered.set()

    async def _label_secret_once(self, namespace: str, name: str, read_version: str) -> None:
        labels = {WATCHED_LABEL: "true"}
        try:
            try:
                # Only the version read: a change since then must reach the watch as one.
                patched = await self._patch_secret(
                    namespace, name, {"labels": labels, "resourceVersion": read_version}
                )
            except ApiError as exc:
                if exc.status != 409:
                    raise
                await self._patch_secret(namespace, name, {"labels": labels})
                return
            self._remember_ours(namespace, name, str(patched["metadata"]["resourceVersion"]))
        except ApiError as exc:
            if exc.status == 404:
                return  # deleted since the read: its re-creation is another story
            if exc.status != 403:
                raise
            if not self._label_refused:
                self._label_refused = True
                log.warning(
                    "may not patch Secrets (RBAC), so cannot label %s/%s %s=true: a change to"
                    " a Secret a Topic uses reaches its gateway topic only at the next drift"
                    " check; grant the operator patch on secrets, or label the Secrets",
                    namespace,
                    name,
                    WATCHED_LABEL,
                )

    async def _patch_secret(self, namespace: str, name: str, metadata: dict[str, Any]) -> Any:
        return await self._api.merge_patch(
            _core_path("secrets", namespace, name), {"metadata": metadata}
        )

    async def secret_key(self, namespace: str, name: str, key: str) -> str:
        data = await self.secret_data(namespace, name)
        if key not in data:
            raise SecretMissing(f"Secret {namespace}/{name} has no key {key!r}")
        return data[key]

    async def ensure_token_secret(
        self, namespace: str, name: str, key: str, owner: dict[str, Any]
    ) -> str:
        """The token in Secret ``name``, creating the Secret (owned by ``owner``) if needed."""
        try:
            return await self.secret_key(namespace, name, key)
        except SecretMissing:
            pass
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/managed-by": "bucketnotify", WATCHED_LABEL: "true"},
                "ownerReferences": [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner["kind"],
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            },
            "stringData": {key: secrets.token_urlsafe(32)},
        }
        # The Secret's own ADDED watch event must not re-sync the Topic that is making it:
        # the token goes to the gateway in this very reconcile (at 5,000 persistent Topics
        # that was 5,000 reconciles more, each with an Event and its gateway writes).
        made = self._labelling[(namespace, name)] = asyncio.Event()
        try:
            created = await self._api.create(_core_path("secrets", namespace), body)
            self._remember_ours(namespace, name, str(created["metadata"]["resourceVersion"]))
        except ApiError as exc:
            if exc.status != 409:  # another writer was first: use theirs
                raise
        finally:
            if self._labelling.get((namespace, name)) is made:
                del self._labelling[(namespace, name)]
            made.set()
        return await self.secret_key(namespace, name, key)

    def _remember_ours(self, namespace: str, name: str, resource_version: str) -> None:
        """This version of the Secret is what our own write made (``labelled_by_us``)."""
        self._labelled[(namespace, name)] = resource_version
        self._labelled.move_to_end((namespace, name))
        while len(self._labelled) > LABELLED_REMEMBERED:
            self._labelled.popitem(last=False)

    async def cluster_uid(self) -> str:
        """The UID of the kube-system namespace: made once per cluster and never changed, the
        usual identity of a cluster."""
        namespace = await self._api.get(object_path("", "v1", "namespaces", name="kube-system"))
        return str(namespace["metadata"]["uid"])

    async def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One of our custom objects, or None when it does not exist."""
        try:
            obj: dict[str, Any] = await self._api.get(_path(plural, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def object_bucket_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """An ObjectBucketClaim (objectbucket.io, Rook's bucket provisioner), or None when
        it, or its resource, does not exist."""
        path = object_path(CLAIM_GROUP, CLAIM_VERSION, "objectbucketclaims", namespace, name)
        try:
            claim: dict[str, Any] = await self._api.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return claim

    async def config_map_data(self, namespace: str, name: str) -> dict[str, str]:
        try:
            config_map = await self._api.get(_core_path("configmaps", namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                raise SecretMissing(f"ConfigMap {namespace}/{name} does not exist") from None
            raise
        data: dict[str, str] = config_map.get("data") or {}
        return data

    async def patch_status(
        self,
        plural: str,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None,
    ) -> bool:
        """Merge ``status`` into one of our custom objects if it is still at
        ``resource_version``; False when it changed since (or is gone): what was decided on
        the old version is not written over the new."""
        body: dict[str, Any] = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            await self._merge_patch(plural, namespace, name, body, status=True)
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def remove_finalizer(
        self, plural: str, namespace: str, name: str, finalizer: str, finalizers: list[str]
    ) -> bool:
        """Remove ``finalizer`` from one of our objects whose finalizers were ``finalizers``
        when read; False when they changed since (or it is gone): a JSON patch that tests the
        entry first, so a finalizer another controller added meanwhile is never lost."""
        if finalizer not in finalizers:
            return True
        at = f"/metadata/finalizers/{finalizers.index(finalizer)}"
        try:
            await self._api.request(
                "PATCH",
                _path(plural, namespace, name),
                body=[{"op": "test", "path": at, "value": finalizer}, {"op": "remove", "path": at}],
                content_type="application/json-patch+json",
            )
        except ApiError as exc:
            # 422: the test failed (the list moved); 404: gone already.
            if exc.status in (404, 409, 422):
                return False
            raise
        return True

    async def config_maps(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The ConfigMaps of ``namespace`` with these labels (a label selector)."""
        listed = await self._api.get(
            _core_path("configmaps", namespace), params={"labelSelector": selector}
        )
        items: list[dict[str, Any]] = listed.get("items") or []
        return items

    async def exists(self, kind: str, namespace: str, name: str) -> bool:
        """Whether a Topic, Secret or ConfigMap of this name exists (its content unread)."""
        paths = {
            "Topic": _path("topics", namespace, name),
            "Secret": _core_path("secrets", namespace, name),
            "ConfigMap": _core_path("configmaps", namespace, name),
        }
        try:
            # Only the metadata: the webhook has no business with a Secret's data.
            await self._api.get(paths[kind], accept=METADATA_ONLY)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def annotate(
        self, plural: str, namespace: str, name: str, annotations: dict[str, Any]
    ) -> None:
        await self._merge_patch(plural, namespace, name, {"metadata": {"annotations": annotations}})

    async def _merge_patch(
        self, plural: str, namespace: str, name: str, body: dict[str, Any], *, status: bool = False
    ) -> None:
        """A JSON merge patch of one of our custom objects (``status``: of its status)."""
        await self._api.merge_patch(
            _path(plural, namespace, name, "status" if status else None), body
        )

    async def config_map_key(self, namespace: str, name: str, key: str) -> str:
        data = await self.config_map_data(namespace, name)
        if key not in data:
            raise SecretMissing(f"ConfigMap {namespace}/{name} has no key {key!r}")
        return data[key]

    async def endpoint_credentials(self, namespace: str, endpoint: Endpoint) -> Credentials | None:
        """The user name and password an endpoint's ``credentialsRef`` names; None when it
        names none. Raises ``SecretMissing`` for a missing Secret or key."""
        found = endpoint.credentials_ref()
        if found is None:
            return None
        ref = found[0]
        data = await self.secret_data(namespace, ref.secret_name)
        for key in (ref.username_key, ref.password_key):
            if key not in data:
                raise SecretMissing(f"Secret {namespace}/{ref.secret_name} has no key {key!r}")
        return Credentials(data[ref.username_key], data[ref.password_key])

    async def endpoint_client_certificate(
        self, namespace: str, endpoint: Endpoint
    ) -> ClientCertificate | None:
        """The certificate, key and key password an endpoint's ``clientCertificateRef``
        names; None when it names none. Raises ``SecretMissing`` for a missing Secret or
        key."""
        found = endpoint.client_certificate_ref()
        if found is None:
            return None
        ref = found[0]
        data = await self.secret_data(namespace, ref.secret_name)
        keys = [ref.certificate_key, ref.private_key_key]
        if ref.key_password_key is not None:
            keys.append(ref.key_password_key)
        for key in keys:
            if key not in data:
                raise SecretMissing(f"Secret {namespace}/{ref.secret_name} has no key {key!r}")
        password = data[ref.key_password_key] if ref.key_password_key is not None else None
        return ClientCertificate(data[ref.certificate_key], data[ref.private_key_key], password)

    async def endpoint_ca(self, namespace: str, endpoint: Endpoint) -> str | None:
        """The PEM bundle an endpoint's ``caRef`` names; None for the system's CAs."""
        found = endpoint.ca_ref()
        return await self.ca_bundle(namespace, found[0]) if found is not None else None

    async def ca_bundle(self, namespace: str, ref: CARef) -> str:
        """The PEM bundle a ``caRef`` names (a ConfigMap or a Secret key)."""
        if ref.kind == "Secret":
            return await self.secret_key(namespace, ref.name, ref.key)
        return await self.config_map_key(namespace, ref.name, ref.key)
