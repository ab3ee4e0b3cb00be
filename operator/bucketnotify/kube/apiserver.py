"""A small client of the Kubernetes API server: JSON in, JSON out, over one aiohttp session.

Not kubernetes_asyncio: importing it loads a class for every API and model of Kubernetes
(about 63 MiB of resident memory and 0.3 s, half of what the operator holds when idle), and
kopf imports it as soon as it is installed. The operator and the delivery service read
and write a handful of kinds (Secrets, ConfigMaps, Events, Leases, their own objects) as
plain dicts, which is all this module does.

Credentials come from $KUBECONFIG (or ~/.kube/config) or the pod's service account, as
kubectl finds them, and are read again when they expire: the service account token every
minute (the kubelet rotates it), an exec plugin's token at its expirationTimestamp, and
any of them after a 401.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import logging
import os
import random
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import kopf
import yaml

from bucketnotify.proxies import env_proxy

__all__ = [
    "ApiClient",
    "ApiError",
    "ConfigError",
    "connect",
    "connection_info",
    "current_namespace",
    "deployment_reference",
    "lease_path",
    "log_retried",
    "micro_time",
    "object_path",
    "proxy_for",
    "transient",
]

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

TOKEN_REREAD_S = 60.0
"""How long a service account token read from its file is used (as client-go does)."""

CONNECTIONS = 16
"""Connections kept to the API server: each holds a 256 KiB TLS buffer, and a burst of
writes (a Topic's notifications re-synced at once) would otherwise open many and keep them."""
LEASE_CONNECTIONS = 2
"""Connections of the Lease renewals' own client. Not the handlers' client: with thousands
of objects reconciling, a renewal queued behind their requests for a free connection, timed
out and the operator lost its leadership (measured at 5,000 BucketNotifications)."""

DEFAULT_TIMEOUT_S = 60.0
"""A request without a timeout of its own: an API server that never answers must not hold
a handler (or a Lease round) forever."""
WATCH_TIMEOUT_S = 300
"""How long the API server keeps one watch open before it ends it; the watcher then goes on
from where it was."""

RELOAD_RETRY_S = 10.0
"""After a failed re-read of expired credentials, how long the old ones go on being used."""

THROTTLED_RETRIES = 5
"""How often a request the API server refused with 429 (API Priority and Fairness
throttling, or storage still initialising: the request was not processed, so sending it
again is safe, POST included) is sent again before the caller gets the ``ApiError``, as
client-go does; never past the request's own timeout."""
THROTTLED_PAUSE_S = 1.0
"""The longest pause before a throttled request goes again (the API server's Retry-After,
when shorter; with jitter, so that many callers refused at once do not come back at once)."""

MERGE_PATCH = "application/merge-patch+json"

log = logging.getLogger(__name__)


class ConfigError(Exception):
    """No usable kubeconfig or service account (the message says what is missing)."""


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        self.status = status
        self.reason = reason
        self.body = body
        try:
            message = json.loads(body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        self.message = str(message or reason)
        """The API server's own sentence (a Status message), else the HTTP reason."""
        super().__init__(f"{status} {reason}: {self.message}")


def object_path(
    group: str,
    version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The path of a collection or object; group "" is the core API (``/api/v1``)."""
    path = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace is not None:
        path += f"/namespaces/{namespace}"
    path += f"/{plural}"
    if name is not None:
        path += f"/{name}"
    if subresource is not None:
        path += f"/{subresource}"
    return path


def lease_path(namespace: str, name: str | None = None) -> str:
    return object_path("coordination.k8s.io", "v1", "leases", namespace, name)


def micro_time(moment: dt.datetime) -> str:
    """A MicroTime (a Lease's renewTime): RFC 3339 in UTC with microseconds."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- credentials ----------------------------------------------------------------------------


def _kubeconfig_paths() -> list[Path] | None:
    """The kubeconfig files to use; None in a pod without $KUBECONFIG (its service account).

    Outside a pod ~/.kube/config, as kubectl does, so the CLI works on a workstation.
    """
    if os.environ.get("KUBECONFIG"):
        paths = [Path(p).expanduser() for p in os.environ["KUBECONFIG"].split(os.pathsep) if p]
        found = [p for p in paths if p.is_file()]
        if not found:
            raise ConfigError("no file of $KUBECONFIG exists")
        return found
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    home = Path.home() / ".kube" / "config"
    if not home.is_file():
        raise ConfigError(f"no $KUBECONFIG, no {home}, and not in a pod")
    return [home]


@dataclass
class _Context:
    cluster: dict[str, Any]
    user: dict[str, Any]
    namespace: str | None
    cluster_base: Path
    user_base: Path
    """The directories of the files that defined them: relative paths start there."""


def _current_context(paths: list[Path]) -> _Context:
    """The current context of the merged files (the first file naming a thing wins)."""
    current: str | None = None
    sections: dict[str, dict[str, tuple[dict[str, Any], Path]]] = {
        "contexts": {},
        "clusters": {},
        "users": {},
    }
    for path in paths:
        try:
            document = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from None
        current = current or document.get("current-context")
        for section, found in sections.items():
            for item in document.get(section) or []:
                key = section[:-1]  # "contexts" -> "context"
                found.setdefault(item.get("name"), (item.get(key) or {}, path.parent))
    if not current:
        raise ConfigError("the kubeconfig sets no current-context")
    try:
        context, _ = sections["contexts"][current]
        cluster, cluster_base = sections["clusters"][context["cluster"]]
        user, user_base = sections["users"][context["user"]]
    except KeyError as exc:
        raise ConfigError(f"the kubeconfig's current context {current!r} lacks {exc}") from None
    return _Context(cluster, user, context.get("namespace"), cluster_base, user_base)


def _relative_to(base: Path, value: str | None) -> str | None:
    if not value:
        return None
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else base / path)


def _exec_credential(spec: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """Run a kubeconfig's exec plugin (as kubectl does) and return its ``status``."""
    command = [str(spec.get("command", ""))] + [str(a) for a in spec.get("args") or []]
    env = {**os.environ, **{e["name"]: e["value"] for e in spec.get("env") or []}}
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {
            "apiVersion": spec.get("apiVersion", "client.authentication.k8s.io/v1"),
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
    )
    try:
        # What the kubeconfig says to run, as kubectl runs it: the user's own file.
        done = subprocess.run(  # noqa: S603
            command, env=env, cwd=base, capture_output=True, text=True, timeout=60, check=True
        )
        status: dict[str, Any] = json.loads(done.stdout)["status"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        # Its stderr may hold anything, a token among it: only what failed is said.
        raise ConfigError(f"the kubeconfig's exec plugin {command[0]!r} failed: {exc}") from None
    return status


def connection_info(paths: list[Path] | Literal["find"] | None = "find") -> kopf.ConnectionInfo:
    """The API server and credentials kubectl would use, as kopf describes a connection
    (so kopf's own requests log in with exactly these). ``paths``: the kubeconfig files
    (None: the pod's service account), found as kubectl finds them unless given."""
    if paths == "find":
        paths = _kubeconfig_paths()
    if paths is None:
        return _service_account()
    context = _current_context(paths)
    cluster, user, base = context.cluster, context.user, context.user_base
    if not cluster.get("server"):
        raise ConfigError("the kubeconfig's current cluster has no server")
    token = user.get("token")
    if user.get("tokenFile"):
        try:
            token = Path(_relative_to(base, user["tokenFile"]) or "").read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the kubeconfig's tokenFile: {exc}") from None
    certificate_data = user.get("client-certificate-data")
    key_data = user.get("client-key-data")
    expiration: dt.datetime | None = None
    if user.get("exec"):
        status = _exec_credential(user["exec"], base)
        token = status.get("token") or token
        certificate_data = status.get("clientCertificateData") or certificate_data
        key_data = status.get("clientKeyData") or key_data
        if status.get("expirationTimestamp"):
            expiration = dt.datetime.fromisoformat(status["expirationTimestamp"])
    elif user.get("auth-provider"):
        raise ConfigError(
            "the kubeconfig's user uses an auth-provider, which is not supported;"
            " use a token, a client certificate or an exec plugin"
        )
    return kopf.ConnectionInfo(
        server=str(cluster["server"]).rstrip("/"),
        ca_path=_relative_to(context.cluster_base, cluster.get("certificate-authority")),
        ca_data=cluster.get("certificate-authority-data"),
        insecure=cluster.get("insecure-skip-tls-verify"),
        certificate_path=_relative_to(base, user.get("client-certificate")),
        certificate_data=certificate_data,
        private_key_path=_relative_to(base, user.get("client-key")),
        private_key_data=key_data,
        username=user.get("username"),
        password=user.get("password"),
        token=token,
        default_namespace=context.namespace,
        proxy_url=cluster.get("proxy-url"),
        expiration=expiration,
    )


def _service_account() -> kopf.ConnectionInfo:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ConfigError("not in a pod: $KUBERNETES_SERVICE_HOST is not set")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    try:
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the service account token: {exc}") from None
    ca = SERVICE_ACCOUNT / "ca.crt"
    try:
        namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip() or None
    except OSError:
        namespace = None
    return kopf.ConnectionInfo(
        server=f"https://{host}:{port}",
        ca_path=str(ca) if ca.is_file() else None,
        token=token,
        default_namespace=namespace,
        # The kubelet rotates the token in its file; reading it again is cheap.
        expiration=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=TOKEN_REREAD_S),
    )


def current_namespace() -> str:
    """The namespace kubectl would use: the kubeconfig context's, the pod's, else default."""
    paths = _kubeconfig_paths()
    if paths is None:
        try:
            return (SERVICE_ACCOUNT / "namespace").read_text().strip() or "default"
        except OSError:
            return "default"
    return _current_context(paths).namespace or "default"


def _expired(info: kopf.ConnectionInfo) -> bool:
    if info.expiration is None:
        return False
    expiration = info.expiration
    if expiration.tzinfo is None:
        expiration = expiration.replace(tzinfo=dt.UTC)
    # A little early, so a token is not sent in the second it lapses.
    return dt.datetime.now(dt.UTC) >= expiration - dt.timedelta(seconds=10)


# --- the client -----------------------------------------------------------------------------


class ApiClient:
    """Requests to one API server; ``close()`` (or ``async with``) ends the session."""

    def __init__(
        self,
        info: kopf.ConnectionInfo,
        reload: Callable[[], kopf.ConnectionInfo] | None = None,
        *,
        connections: int = CONNECTIONS,
    ) -> None:
        """``reload``: reads the credentials again (after their expiration or a 401); None:
        they never change. ``connections``: at most this many at once; further requests
        wait for one (their timeout runs meanwhile)."""
        self._info = info
        self._reload = reload
        self.server = info.server
        proxy = proxy_for(info)
        # trust_env=False: aiohttp would look up the proxy and ~/.netrc again for every
        # request, each in a thread of the loop's shared default executor, which queued
        # Lease renewals behind store I/O. The proxy is read once above; the API server
        # takes certificates or tokens, never netrc.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, ssl=info.as_ssl_context()),
            proxy=proxy,
            trust_env=False,
            # A watch event or LIST page of large objects fits (etcd's bound is 1.5 MiB).
            read_bufsize=2**21,
        )
        self._watch_session: aiohttp.ClientSession | None = None
        self._refresh = asyncio.Lock()
        self._reload_after = 0.0
        """After a failed re-read, when to try again (monotonic)."""

    @property
    def info(self) -> kopf.ConnectionInfo:
        return self._info

    async def close(self) -> None:
        await self._session.close()
        if self._watch_session is not None:
            await self._watch_session.close()

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _stale(self) -> bool:
        return _expired(self._info) and time.monotonic() >= self._reload_after

    async def _headers(self, *, renew: bool = False) -> dict[str, str]:
        if self._reload is not None and (renew or self._stale()):
            async with self._refresh:
                if renew or self._stale():  # not if a request before us just did it
                    await self._reload_credentials(self._reload)
        return self._info.as_http_headers()

    async def _reload_credentials(self, reload: Callable[[], kopf.ConnectionInfo]) -> None:
        try:
            # The TLS context (CA, client certificate) stays the session's own.
            self._info = await asyncio.to_thread(reload)
        except ConfigError as exc:
            # A token file being replaced, a plugin that failed once: the credentials in
            # hand may still be good, and a 401 says when not.
            log.warning("reading the Kubernetes credentials again failed: %s", exc)
            self._reload_after = time.monotonic() + RELOAD_RETRY_S

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        request_timeout: float | None = None,
    ) -> Any:
        """The answer's JSON (None when empty); ``ApiError`` for an error status,
        ``aiohttp.ClientError`` or ``TimeoutError`` when the API server is unreachable."""
        data = None if body is None else json.dumps(body)
        timeout = request_timeout or DEFAULT_TIMEOUT_S
        deadline = time.monotonic() + timeout
        renewed, throttled = False, 0
        while True:
            headers = {
                **await self._headers(renew=renewed),
                "Accept": accept,
                "Content-Type": content_type,
            }
            async with self._session.request(
                method,
                self.server + path,
                params=params,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=max(0.1, deadline - time.monotonic())),
            ) as response:
                text = await response.text()
                status, reason = response.status, response.reason or ""
                retry_after = response.headers.get("Retry-After")
            if status == 401 and not renewed and self._reload is not None:
                renewed = True  # a rotated or lapsed token: read the credentials again once
                continue
            if status == 429 and throttled < THROTTLED_RETRIES:
                pause = _throttled_pause(retry_after)
                if time.monotonic() + pause < deadline:
                    throttled += 1
                    await asyncio.sleep(pause)
                    continue
            if status >= 400:
                raise ApiError(status, reason, text)
            return json.loads(text) if text else None

    async def get(self, path: str, **kwargs: Any) -> Any:
        return await self.request("GET", path, **kwargs)

    async def watch(
        self, path: str, resource_version: str, *, timeout_s: int = WATCH_TIMEOUT_S
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch events of a collection after ``resource_version`` (``type`` and
        ``object``; bookmarks included), until the API server ends the watch after about
        ``timeout_s``. ``ApiError`` for an error status (a 410 comes as an ERROR event
        instead, when the version is too old), ``aiohttp.ClientError`` or ``TimeoutError``
        when the stream breaks.

        Watches have a connection each, outside the ``connections`` bound of requests: a
        replica scoped to many namespaces holds one per namespace for as long as it runs."""
        if self._watch_session is None:
            self._watch_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=self._info.as_ssl_context()),
                proxy=proxy_for(self._info),
                trust_env=False,
                read_bufsize=2**21,
            )
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_s),
        }
        headers = {**await self._headers(), "Accept": "application/json"}
        async with self._watch_session.get(
            self.server + path,
            params=params,
            headers=headers,
            # No total: the stream lasts timeout_s; a silent one (bookmarks come every
            # minute) is a broken connection.
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=DEFAULT_TIMEOUT_S, sock_read=timeout_s + 90
            ),
        ) as response:
            if response.status >= 400:
                raise ApiError(response.status, response.reason or "", await response.text())
            async for line in response.content:
                if line.strip():
                    event: dict[str, Any] = json.loads(line)
                    yield event

    async def create(self, path: str, body: Any, **kwargs: Any) -> Any:
        return await self.request("POST", path, body=body, **kwargs)

    async def replace(self, path: str, body: Any, **kwargs: Any) -> Any:
        return await self.request("PUT", path, body=body, **kwargs)

    async def merge_patch(self, path: str, body: Any, **kwargs: Any) -> Any:
        return await self.request("PATCH", path, body=body, content_type=MERGE_PATCH, **kwargs)

    async def delete(self, path: str, **kwargs: Any) -> Any:
        return await self.request("DELETE", path, **kwargs)


def _throttled_pause(retry_after: str | None) -> float:
    try:
        asked = float(retry_after) if retry_after else THROTTLED_PAUSE_S
    except ValueError:
        asked = THROTTLED_PAUSE_S
    return min(max(asked, 0.0), THROTTLED_PAUSE_S) * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, no secret


TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
"""What the API server answers while it starts (429 "storage is (re)initializing"), is
overloaded or sits behind a proxy that lost it: asking again later works."""


def transient(exc: BaseException) -> bool:
    """True for a failure that asking the API server again later gets over: one of
    ``TRANSIENT_STATUSES``, a connection that failed or a timeout. Loops that retry log these
    as one WARNING line; anything else needs a person and keeps its traceback."""
    if isinstance(exc, ApiError):
        return exc.status in TRANSIENT_STATUSES
    return isinstance(exc, aiohttp.ClientConnectionError | TimeoutError | ConnectionError)


def log_retried(
    logger: logging.Logger,
    what: str,
    exc: BaseException,
    also: tuple[type[BaseException], ...] = (),
) -> None:
    """Log a failure that its loop tries again later: a ``transient`` one (or one of
    ``also``: another service's unavailability) as one WARNING line without traceback,
    anything else as an ERROR with its traceback."""
    if transient(exc) or isinstance(exc, also):
        logger.warning("%s, trying again later: %s", what, str(exc) or type(exc).__name__)
    else:
        logger.error(what, exc_info=exc)


def proxy_for(info: kopf.ConnectionInfo) -> str | None:
    """The kubeconfig's proxy-url, else $HTTPS_PROXY / $NO_PROXY for the API server (read
    once, not per request)."""
    if info.proxy_url:
        return info.proxy_url
    return env_proxy(info.server)


async def deployment_reference(api: ApiClient, namespace: str, name: str) -> dict[str, str] | None:
    """An ownerReference to the Deployment ``namespace/name``, for objects that must go when
    it goes (Kubernetes' garbage collector deletes them); None, with a WARNING saying what is
    left behind, when it cannot be read."""
    try:
        deployment = await api.get(object_path("apps", "v1", "deployments", namespace, name))
    except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
        log.warning(
            "cannot read the Deployment %s/%s (%s): the Leases written now stay when it is"
            " deleted; delete them by hand after an uninstall",
            namespace,
            name,
            str(exc) or type(exc).__name__,
        )
        return None
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": name,
        "uid": deployment["metadata"]["uid"],
    }


async def connect(connections: int = CONNECTIONS) -> ApiClient:
    """A client of the API server from $KUBECONFIG when set, otherwise the pod's service
    account (``ConfigError`` when neither is usable). It reads its credentials again from
    the same place, whatever $KUBECONFIG says later."""
    paths = _kubeconfig_paths()
    info = await asyncio.to_thread(connection_info, paths)
    return ApiClient(info, functools.partial(connection_info, paths), connections=connections)
