"""Kubernetes reads and writes the operator makes besides kopf's own: Secrets, annotations.

An adapter (kubernetes_asyncio): the only module of the operator that calls the API server
directly.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from yarl import URL

from bucketnotify import logs
from bucketnotify.api.common import GROUP, VERSION, CARef

__all__ = ["WATCHED_LABEL", "Kube", "SecretMissing", "connect", "current_namespace"]

log = logging.getLogger(__name__)

POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

LABELLED_REMEMBERED = 4096
"""Secrets whose label version ``Kube`` remembers (the watch event follows within a second)."""

WATCHED_LABEL = f"{GROUP}/watched"
"""On the Secrets the operator watches: only these reach it, not every Secret of the cluster
(a cluster holds thousands, Helm's releases among them, up to 1 MiB each). The operator puts
it on the Secrets it creates and on every Secret a Topic makes it read."""


class SecretMissing(Exception):
    """A referenced Secret or key does not exist (message names which, never a value)."""


def _kubeconfig() -> str | None:
    """The kubeconfig file to use; None in a pod without $KUBECONFIG (its service account).

    Outside a pod ~/.kube/config, as kubectl does, so the CLI works on a workstation.
    """
    # The library only logs a missing file and then fails on an empty configuration, with
    # a message about a missing key that sends people looking in the wrong place.
    if os.environ.get("KUBECONFIG"):
        path = os.environ["KUBECONFIG"]
        if not any(Path(p).is_file() for p in path.split(os.pathsep)):
            raise config.ConfigException("no file of $KUBECONFIG exists")
        return path
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    home = Path.home() / ".kube" / "config"
    if not home.is_file():
        raise config.ConfigException(f"no $KUBECONFIG, no {home}, and not in a pod")
    return str(home)


async def connect() -> client.ApiClient:
    """An API client from $KUBECONFIG when set, otherwise the pod's service account."""
    path = _kubeconfig()
    if path is None:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(config_file=path)
    configuration = client.Configuration.get_default_copy()
    # Not the library's 100: each connection keeps a 256 KiB TLS buffer, and a burst of
    # writes (a Topic's notifications re-synced at once) would open them all and keep them.
    configuration.connection_pool_maxsize = 16
    _proxy_from_env(configuration)
    api = client.ApiClient(configuration)
    _without_env_lookups(api)
    return api


def _proxy_from_env(configuration: client.Configuration) -> None:
    """$HTTPS_PROXY / $NO_PROXY for the API server, read once here instead of per request."""
    if configuration.proxy or not configuration.host:
        return
    with contextlib.suppress(LookupError):
        proxy, auth = get_env_proxy_for_url(URL(configuration.host))
        configuration.proxy = str(proxy)
        if auth is not None:
            configuration.proxy_headers = {"Proxy-Authorization": auth.encode()}


def _without_env_lookups(api: client.ApiClient) -> None:
    """The library's session looks up the proxy and ~/.netrc again for every request
    (``trust_env=True``), each in a thread of the loop's shared default executor: two
    queued jobs per API call, which queued Lease renewals behind store I/O. The proxy is
    set once by ``_proxy_from_env``; the API server takes certificates or tokens, never
    netrc. So the same connection pool goes on in a session that does neither."""
    rest = api.rest_client
    session: aiohttp.ClientSession = rest.pool_manager
    connector = session.connector
    session.detach()  # hands the pool over without closing it
    rest.pool_manager = aiohttp.ClientSession(
        connector=connector,
        trust_env=False,
        # As the library's own: a watch event of a large object fits (etcd's bound 1.5 MiB).
        read_bufsize=2**21,
    )


def current_namespace() -> str:
    """The namespace kubectl would use: the kubeconfig context's, the pod's, else default."""
    path = _kubeconfig()
    if path is None:
        try:
            return POD_NAMESPACE_FILE.read_text().strip() or "default"
        except OSError:
            return "default"
    _, current = config.list_kube_config_contexts(config_file=path)
    namespace = ((current or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"


class Kube:
    def __init__(self, api: client.ApiClient, *, label_secrets: bool = False) -> None:
        """``label_secrets``: put ``WATCHED_LABEL`` on every Secret read (the operator's)."""
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._label_secrets = label_secrets
        self._label_refused = False
        self._labelled: OrderedDict[tuple[str, str], str] = OrderedDict()
        """(namespace, name) -> the resourceVersion our label patch made, the latest ones."""

    async def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        try:
            secret = await self._core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise SecretMissing(f"Secret {namespace}/{name} does not exist") from None
            raise
        if self._label_secrets and WATCHED_LABEL not in (secret.metadata.labels or {}):
            await self._label_secret(namespace, name, secret.metadata.resource_version)
        raw: dict[str, str] = secret.data or {}
        data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
        # Whatever a driver or a URL later echoes of these, the logs will not show it.
        logs.remember_secrets(v for k, v in data.items() if logs.secret_key_name(k))
        return data

    def labelled_by_us(self, namespace: str, name: str, resource_version: str | None) -> bool:
        """Whether this version of the Secret is the one our label made: its data is what
        the reader just had, so its watch event asks for no re-sync (a Secret shared by a
        thousand Topics would otherwise re-sync them all once, at its first read)."""
        return resource_version is not None and self._labelled.get((namespace, name)) == (
            resource_version
        )

    async def _label_secret(self, namespace: str, name: str, read_version: str) -> None:
        """Label a Secret the operator reads, so that its changes reach the operator's watch.

        Its data is left alone (a merge patch of one label), so the writer that owns the
        Secret (a GitOps tool, a secrets controller) keeps it; one that replaces the Secret
        wholesale drops the label, and the next read (the drift check) puts it back."""
        labels = {WATCHED_LABEL: "true"}
        try:
            try:
                # Only the version read: a change since then must reach the watch as one.
                patched = await self._patch_secret(
                    namespace, name, {"labels": labels, "resourceVersion": read_version}
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise
                await self._patch_secret(namespace, name, {"labels": labels})
                return
            self._labelled[(namespace, name)] = str(patched.metadata.resource_version)
            self._labelled.move_to_end((namespace, name))
            while len(self._labelled) > LABELLED_REMEMBERED:
                self._labelled.popitem(last=False)
        except ApiException as exc:
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
        return await self._core.patch_namespaced_secret(
            name,
            namespace,
            {"metadata": metadata},
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
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
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=name,
                labels={"app.kubernetes.io/managed-by": "bucketnotify", WATCHED_LABEL: "true"},
                owner_references=[
                    client.V1OwnerReference(
                        api_version=owner["apiVersion"],
                        kind=owner["kind"],
                        name=owner["metadata"]["name"],
                        uid=owner["metadata"]["uid"],
                    )
                ],
            ),
            string_data={key: secrets.token_urlsafe(32)},
        )
        try:
            await self._core.create_namespaced_secret(namespace, body)
        except ApiException as exc:
            if exc.status != 409:  # another writer was first: use theirs
                raise
        return await self.secret_key(namespace, name, key)

    async def cluster_uid(self) -> str:
        """The UID of the kube-system namespace: made once per cluster and never changed, the
        usual identity of a cluster."""
        namespace = await self._core.read_namespace("kube-system")
        return str(namespace.metadata.uid)

    async def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One of our custom objects, or None when it does not exist."""
        try:
            obj: dict[str, Any] = await self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

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
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def exists(self, kind: str, namespace: str, name: str) -> bool:
        """Whether a Topic, Secret or ConfigMap of this name exists (its content unread)."""
        reads: dict[str, Callable[[], Awaitable[Any]]] = {
            "Topic": lambda: self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "topics", name
            ),
            # Only the metadata: the webhook has no business with a Secret's data.
            "Secret": lambda: self._core.read_namespaced_secret(
                name, namespace, _preload_content=False
            ),
            "ConfigMap": lambda: self._core.read_namespaced_config_map(
                name, namespace, _preload_content=False
            ),
        }
        try:
            response = await reads[kind]()
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        # Unread (_preload_content=False), the answer is the raw response: its status was
        # not checked for us.
        status = getattr(response, "status", 200)
        if hasattr(response, "release"):
            response.release()
        if status == 404:
            return False
        if status >= 400:
            raise ApiException(status=status, reason=f"reading {kind} {namespace}/{name}")
        return True

    async def annotate(
        self, plural: str, namespace: str, name: str, annotations: dict[str, Any]
    ) -> None:
        await self._merge_patch(plural, namespace, name, {"metadata": {"annotations": annotations}})

    async def _merge_patch(
        self, plural: str, namespace: str, name: str, body: dict[str, Any], *, status: bool = False
    ) -> None:
        """A JSON merge patch of one of our custom objects (``status``: of its status)."""
        patch = (
            self._custom.patch_namespaced_custom_object_status
            if status
            else self._custom.patch_namespaced_custom_object
        )
        await patch(
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            body,
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
        )

    async def config_map_key(self, namespace: str, name: str, key: str) -> str:
        try:
            config_map = await self._core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise SecretMissing(f"ConfigMap {namespace}/{name} does not exist") from None
            raise
        data: dict[str, str] = config_map.data or {}
        if key not in data:
            raise SecretMissing(f"ConfigMap {namespace}/{name} has no key {key!r}")
        return data[key]

    async def ca_bundle(self, namespace: str, ref: CARef) -> str:
        """The PEM bundle a ``caRef`` names (a ConfigMap or a Secret key)."""
        if ref.kind == "Secret":
            return await self.secret_key(namespace, ref.name, ref.key)
        return await self.config_map_key(namespace, ref.name, ref.key)
