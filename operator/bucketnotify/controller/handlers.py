"""Every kopf registration of the operator, each delegating to a plain function.

The operator's memo holds ``settings`` (OperatorSettings) and ``kube`` (Kube); ``cli``
creates both before kopf starts.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import kopf

from bucketnotify.api.common import GROUP, VERSION
from bucketnotify.controller.topic_builder import referenced_secrets
from bucketnotify.controller.topics import (
    NotReconcilable,
    delete_topic,
    parse_spec,
    reconcile_topic,
)
from bucketnotify.gateway.errors import GatewayError

__all__ = ["register_drift_timer"]

TOPICS = (GROUP, VERSION, "topics")
RESYNC_ANNOTATION = f"{GROUP}/secret-resync"
# Backoff for a Topic whose gateway failed: a flapping gateway is not hammered, and a gateway
# that comes back is noticed within a minute even between drift checks.
RETRY_DELAY_S = 15


def _ns(namespace: str | None) -> str:
    # Topics are namespaced: kopf types namespace as optional only for cluster-scoped kinds.
    assert namespace is not None
    return namespace


def _write(patch: kopf.Patch, status: dict[str, Any]) -> None:
    for key, value in status.items():
        patch.status[key] = value


@kopf.on.create(*TOPICS)
@kopf.on.update(*TOPICS)
@kopf.on.resume(*TOPICS)
async def topic_changed(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    name: str,
    namespace: str | None,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    reason: str,
    **_: Any,
) -> None:
    outcome = await reconcile_topic(
        kube=memo.kube,
        settings=memo.settings,
        name=name,
        namespace=_ns(namespace),
        spec=dict(spec),
        status=dict(status),
        generation=meta.get("generation"),
    )
    _write(patch, outcome.status)
    if outcome.ready:
        kopf.info(body, reason="Synced", message=outcome.message)
        return
    kopf.warn(body, reason=outcome.reason, message=outcome.message)
    if outcome.retry:
        raise kopf.TemporaryError(outcome.message, delay=RETRY_DELAY_S)


async def topic_drift(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    name: str,
    namespace: str | None,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    was_ready = (status.get("conditions") or [{}])[-1].get("status") == "True"
    outcome = await reconcile_topic(
        kube=memo.kube,
        settings=memo.settings,
        name=name,
        namespace=_ns(namespace),
        spec=dict(spec),
        status=dict(status),
        generation=meta.get("generation"),
        only_if_drifted=True,
    )
    _write(patch, outcome.status)
    if outcome.repaired:
        kopf.warn(
            body,
            reason="DriftRepaired",
            message="the gateway topic differed from the spec and was rewritten: "
            + ", ".join(outcome.repaired),
        )
    if outcome.ready and not was_ready:
        kopf.info(body, reason="Recovered", message=outcome.message)
    elif not outcome.ready and was_ready:
        kopf.warn(body, reason=outcome.reason, message=outcome.message)


def register_drift_timer(registry: kopf.OperatorRegistry, interval: float) -> None:
    """The drift check, at the configured interval (known only once settings are read)."""
    kopf.timer(*TOPICS, interval=interval, idle=min(5.0, interval), registry=registry)(topic_drift)


@kopf.on.delete(*TOPICS)
async def topic_deleted(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    namespace: str | None,
    memo: kopf.Memo,
    started: dt.datetime,
    **_: Any,
) -> None:
    settings = memo.settings
    try:
        await delete_topic(
            kube=memo.kube,
            settings=settings,
            namespace=_ns(namespace),
            spec=dict(spec),
            status=dict(status),
        )
    except (GatewayError, NotReconcilable) as exc:
        waited = (dt.datetime.now(dt.UTC) - started.replace(tzinfo=dt.UTC)).total_seconds()
        if waited < settings.delete_give_up_after_seconds:
            raise kopf.TemporaryError(
                f"cannot delete the gateway topic yet: {exc}", delay=5
            ) from None
        # Bounded: a gateway gone for good must not keep the object forever.
        kopf.warn(
            body,
            reason="OrphanedOnGateway",
            message=f"gave up deleting gateway topic {status.get('arn')} after {waited:.0f}s"
            f" ({exc}); remove it with `radosgw-admin topic rm` if the gateway returns",
        )
        return
    kopf.info(body, reason="Deleted", message=f"gateway topic {status.get('arn')} deleted")


@kopf.index(*TOPICS)
def topics_by_secret(namespace: str | None, name: str, spec: kopf.Spec, **_: Any) -> dict[Any, str]:
    """(namespace, Secret name) → names of the Topics that read it."""
    try:
        secrets = referenced_secrets(parse_spec(dict(spec)))
    except NotReconcilable:
        return {}
    return {(namespace, secret): name for secret in secrets}


@kopf.on.event("", "v1", "secrets")
async def secret_changed(
    event: kopf.RawEvent,
    namespace: str | None,
    name: str,
    meta: kopf.Meta,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """A created or rotated Secret re-syncs every Topic that references it."""
    topics_by_secret: kopf.Index[Any, str] = kwargs["topics_by_secret"]
    if event.get("type") not in {"ADDED", "MODIFIED"}:
        return  # the initial listing: resume handlers sync everything anyway
    for topic in topics_by_secret.get((namespace, name), []):
        await memo.kube.annotate(
            "topics",
            namespace,
            topic,
            {RESYNC_ANNOTATION: f"{name}@{meta.get('resourceVersion')}"},
        )
