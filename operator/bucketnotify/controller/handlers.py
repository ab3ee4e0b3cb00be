"""Every kopf registration of the operator, each delegating to a plain function.

The operator's memo holds ``settings`` (OperatorSettings), ``kube`` (Kube),
``bucket_locks`` (BucketLocks), ``gateways`` (GatewayPool: the gateway clients, shared by
every handler), ``object_locks`` (ObjectLocks), ``watched_secrets`` (WatchedSecrets: what
the drift checks read Secrets from), ``events`` (EventRecorder) and ``metrics``
(OperatorMetrics); ``cli`` creates them before kopf starts. Every reconciling handler is
``@_measured``: its count, result and duration go to the metrics. The drift checks are not
kopf timers but one ``DriftLoop`` (see there why), started and stopped with the operator.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, Literal, TypeVar, cast

import kopf

from bucketnotify.api.common import GROUP, VERSION, NotReconcilable
from bucketnotify.api.topic import ingest_token_secret
from bucketnotify.controller.conditions import ready_condition
from bucketnotify.controller.delivery_status import DeliveryStatusLoop
from bucketnotify.controller.drift_loop import DriftLoop
from bucketnotify.controller.events import change_events, drift_events
from bucketnotify.controller.finalizers import OLD_FINALIZER, finalizer_move
from bucketnotify.controller.id_ownership import IdClaim
from bucketnotify.controller.notifications import (
    delete_notification,
    reconcile_notification,
    send_test_event,
)
from bucketnotify.controller.topic_builder import (
    NameClaim,
    arn_topic_name,
    gateway_scope,
    referenced_secrets,
    wanted_gateway_topic_name,
)
from bucketnotify.controller.topics import (
    Outcome,
    delete_topic,
    parse_spec,
    reconcile_topic,
)
from bucketnotify.delivery.endpoints.http import EndpointError
from bucketnotify.gateway.errors import GatewayError
from bucketnotify.kube.apiserver import ApiError, transient
from bucketnotify.kube.event_recorder import EventRecorder, EventType, ObjectRef
from bucketnotify.kube.objects import Kube
from bucketnotify.kube.watched_secrets import WatchedSecrets
from bucketnotify.metrics import OperatorMetrics

__all__ = ["WATCHED_RESOURCES", "register_delivery_status", "register_drift_loop"]

log = logging.getLogger(__name__)

TOPICS = (GROUP, VERSION, "topics")
SECRET_RESYNC = f"{GROUP}/secret-resync"
TOPIC_RESYNC = f"{GROUP}/topic-resync"
NOTIFICATIONS = (GROUP, VERSION, "bucketnotifications")
SECRETS = ("", "v1", "secrets")
WATCHED_RESOURCES = (TOPICS, NOTIFICATIONS, SECRETS)
"""Every resource a handler below is registered for: kopf keeps one watch stream open for
each of them in each watched namespace (``cli`` sizes kopf's connections by it)."""
# kopf's annotations: a handler's progress (and the last spec handled, which the
# development builds before 0.1.0.dev0 kept there and 0.1.0.dev0 leaves unused).
PROGRESS_PREFIX = "kopf.bucketnotify.io/"
DIFF_BASE = f"{PROGRESS_PREFIX}last-handled-configuration"
DIFF_BASE_FIELD = "lastHandledConfiguration"
PENDING = "bucketnotify:pending"
# Backoff for a Topic whose gateway failed: a flapping gateway is not hammered, and a gateway
# that comes back is noticed within a minute even between drift checks.
RETRY_DELAY_S = 15

API_RETRY_DELAY_S = 5
"""A handler the API server refused for now (429: throttled; 5xx; no connection) runs
again this soon, as a wait (kopf's "failed temporarily", a WARNING): without it kopf takes
the ApiError for a failure, logs it at ERROR with its traceback and waits 60 s."""


Handler = TypeVar("Handler", bound=Callable[..., Awaitable[None]])

_not_ready: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "bucketnotify_not_ready", default=None
)


def _measured(kind: str, action: str) -> Callable[[Handler], Handler]:
    """Count and time every run of a handler: success, not_ready (it reported a reason
    with ``_report_not_ready``), retry (kopf.TemporaryError, or the API server refusing it
    for now: ``ApiServerUnavailable``) or error (anything else)."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def measured(*args: Any, **kwargs: Any) -> None:
            metrics = getattr(kwargs.get("memo"), "metrics", None)
            token = _not_ready.set(None)
            started = time.perf_counter()
            result, reason = "success", None
            try:
                await handler(*args, **kwargs)
                reason = _not_ready.get()
                if reason is not None:
                    result = "not_ready"
            except kopf.TemporaryError:
                result, reason = "retry", _not_ready.get() or "TemporaryError"
                raise
            except Exception as exc:
                if transient(exc):
                    result, reason = "retry", "ApiServerUnavailable"
                    raise kopf.TemporaryError(
                        f"the API server did not take a request now: {exc}",
                        delay=API_RETRY_DELAY_S,
                    ) from None
                result, reason = "error", type(exc).__name__
                raise
            finally:
                _not_ready.reset(token)
                if isinstance(metrics, OperatorMetrics):
                    metrics.reconcile.labels(kind, action, result).inc()
                    if reason is not None:
                        metrics.reconcile_errors.labels(kind, reason).inc()
                    metrics.reconcile_seconds.labels(kind, action).observe(
                        time.perf_counter() - started
                    )

        return measured  # type: ignore[return-value]

    return decorate


def _report_not_ready(reason: str) -> None:
    """The handler ends without the object Ready: count it under ``reason``."""
    _not_ready.set(reason)


def _exclusive(plural: str) -> Callable[[Handler], Handler]:
    """The handler runs holding its object's lock (``memo.object_locks``), as drift checks
    of the object do: never two reconciles of one object at once."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def exclusive(*args: Any, **kwargs: Any) -> None:
            locks = kwargs["memo"].object_locks
            async with locks((plural, kwargs["namespace"], kwargs["name"])):
                await handler(*args, **kwargs)

        return exclusive  # type: ignore[return-value]

    return decorate


def _ns(namespace: str | None) -> str:
    # Topics are namespaced: kopf types namespace as optional only for cluster-scoped kinds.
    assert namespace is not None
    return namespace


def _post(memo: kopf.Memo, body: kopf.Body, type: EventType, reason: str, message: str) -> None:
    """An Event on the object, counted into the Event of its series if one is recent (a
    resume of 2,000 objects after each restart, a drift fought every interval, a spec
    edited many times: one Event per object and reason, its count rising)."""
    meta = body.metadata
    obj = ObjectRef(str(body["kind"]), _ns(meta.namespace), str(meta.name), meta.uid)
    events: EventRecorder = memo.events
    events.record(obj, type, reason, message)


def _post_change(
    memo: kopf.Memo,
    body: kopf.Body,
    kind: Literal["topic", "notification"],
    cause: str,
    status: kopf.Status,
    existed: bool,
    outcome: Outcome,
    kwargs: dict[str, Any],
) -> None:
    """Post the Events of a change handler run (``controller.events`` decides which)."""
    for event in change_events(
        kind=kind,
        cause=cause,
        previous=ready_condition(list(status.get("conditions") or [])),
        existed=existed,
        ready=outcome.ready,
        reason=outcome.reason,
        message=outcome.message,
        retry=int(kwargs.get("retry") or 0),
    ):
        _post(memo, body, event.type, event.reason, event.message)


RELEASED_FIELDS = ("applied",)
"""Status fields a reconcile may let go of: absent from its status, they are removed (the
status also holds fields it does not write, kopf's diff base among them)."""


def _write(patch: kopf.Patch, current: kopf.Status, status: dict[str, Any]) -> None:
    # Only what changed: a quiet drift check must not write the object every interval.
    for key, value in status.items():
        if current.get(key) != value:
            patch.status[key] = value
    for key in RELEASED_FIELDS:
        if key in current and key not in status:
            patch.status[key] = None  # a merge patch's null removes it


# The indices are async though they never wait: kopf runs a sync callback in its thread pool,
# which costs more than the callback itself, for every watch event of every object.
@kopf.index(*TOPICS)
async def topics_by_gateway_name(
    namespace: str | None,
    name: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    **_: Any,
) -> dict[Any, NameClaim]:
    """(gateway scope, gateway topic name) → the Topics wanting that name."""
    try:
        parsed = parse_spec(dict(spec))
    except NotReconcilable:
        return {}
    ns = _ns(namespace)
    arn: str | None = status.get("arn")
    wanted = wanted_gateway_topic_name(ns, name, parsed, arn)
    holds = arn is not None and arn_topic_name(arn) == wanted
    created = str(meta.get("creationTimestamp") or "")
    return {(gateway_scope(ns, parsed), wanted): NameClaim(ns, name, created, holds)}


def _claims_of(
    kwargs: dict[str, Any], namespace: str, spec: kopf.Spec
) -> Callable[[str], list[NameClaim]]:
    """The Topics wanting a gateway name in the same gateway scope as this one."""
    index: kopf.Index[Any, NameClaim] = kwargs["topics_by_gateway_name"]
    try:
        scope = gateway_scope(namespace, parse_spec(dict(spec)))
    except NotReconcilable:
        scope = ""
    return lambda gateway_name: list(index.get((scope, gateway_name), []))


async def _reconcile_topic(
    body: kopf.Body, memo: kopf.Memo, kwargs: dict[str, Any], *, only_if_drifted: bool = False
) -> Outcome:
    """One reconciliation of a Topic, for a change or (``only_if_drifted``) a drift check."""
    meta, spec = body.metadata, body.spec
    namespace = _ns(meta.namespace)
    return await reconcile_topic(
        kube=_drift_reader(memo) if only_if_drifted else memo.kube,
        settings=memo.settings,
        gateways=memo.gateways,
        name=meta.name or "",
        namespace=namespace,
        spec=dict(spec),
        status=dict(body.status),
        generation=meta.get("generation"),
        owner=dict(body),
        only_if_drifted=only_if_drifted,
        claims_of=_claims_of(kwargs, namespace, spec),
    )


@kopf.on.create(*TOPICS)
@kopf.on.update(*TOPICS)
@kopf.on.resume(*TOPICS)
@_exclusive("topics")
@_measured("topic", "change")
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
    **kwargs: Any,
) -> None:
    outcome = await _reconcile_topic(body, memo, kwargs)
    _write(patch, status, outcome.status)
    _post_change(memo, body, "topic", reason, status, bool(status.get("arn")), outcome, kwargs)
    if outcome.ready:
        if reason != "resume":
            # A rotated Secret changes the gateway topic without a new generation.
            rotated = (meta.get("annotations") or {}).get(SECRET_RESYNC, "")
            marker = f"{outcome.status.get('arn')}@{meta.get('generation')}@{rotated}"
            await _resync_notifications(memo, _ns(namespace), name, marker, kwargs)
        return
    _report_not_ready(outcome.reason)
    if outcome.retry:
        raise kopf.TemporaryError(outcome.message, delay=RETRY_DELAY_S)


@_measured("topic", "drift")
async def topic_drift(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any) -> None:
    """A Topic's drift check (``_drift_check`` calls it, with the drift loop's indices)."""
    status, namespace, name = body.status, _ns(body.metadata.namespace), body.metadata.name or ""
    outcome = await _reconcile_topic(body, memo, kwargs, only_if_drifted=True)
    _report_drift(memo, body, "topic", patch, status, bool(status.get("arn")), outcome)
    if outcome.ready and outcome.repaired:
        marker = f"{outcome.status.get('arn')}@repaired@{time.time():.3f}"
        await _resync_notifications(memo, namespace, name, marker, kwargs)


async def _resync_notifications(
    memo: kopf.Memo, namespace: str, topic: str, marker: str, kwargs: dict[str, Any]
) -> None:
    """Have every BucketNotification of the Topic written again: the gateway keeps a copy of
    the topic (endpoint, token, credentials) in each notification and refreshes it only
    when the notification is written."""
    notifications: kopf.Index[Any, str] = kwargs["notifications_by_topic"]
    for dependent in notifications.get((namespace, topic), []):
        await memo.kube.annotate(
            "bucketnotifications", namespace, dependent, {TOPIC_RESYNC: marker}
        )


def _report_drift(
    memo: kopf.Memo,
    body: kopf.Body,
    kind: Literal["topic", "notification"],
    patch: kopf.Patch,
    status: kopf.Status,
    existed: bool,
    outcome: Outcome,
) -> None:
    _write(patch, status, outcome.status)
    if not outcome.ready:
        _report_not_ready(outcome.reason)
    for event in drift_events(
        kind=kind,
        previous=ready_condition(list(status.get("conditions") or [])),
        existed=existed,
        ready=outcome.ready,
        reason=outcome.reason,
        message=outcome.message,
        repaired=outcome.repaired,
    ):
        _post(memo, body, event.type, event.reason, event.message)


def _snapshot(body: kopf.Body) -> dict[str, Any]:
    """What a drift check needs of an object, without what makes kopf's bodies large
    (managedFields, kopf's diff base): the top-level fields of spec and status are shared
    with the watch event's body, its metadata is not kept."""
    meta = body.metadata
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {
            key: meta[key]
            for key in (
                "name",
                "namespace",
                "uid",
                "generation",
                "resourceVersion",
                "creationTimestamp",
                "deletionTimestamp",
                "finalizers",
            )
            if key in meta
        },
        "spec": dict(body.spec),
        "status": {k: v for k, v in body.status.items() if k != DIFF_BASE_FIELD},
        # A change handler has a retry due (kopf's progress), or has not yet handled this
        # generation (a new object whose creation waits for its worker): that handler
        # reconciles the object, a drift check meanwhile would only duplicate it.
        PENDING: any(a.startswith(PROGRESS_PREFIX) and a != DIFF_BASE for a in meta.annotations)
        or body.status.get("observedGeneration") != meta.get("generation"),
    }


@kopf.index(*TOPICS)
async def topic_snapshots(
    body: kopf.Body, namespace: str | None, name: str, **_: Any
) -> dict[Any, Any]:
    """(namespace, name) → the Topic as the drift loop checks it."""
    return {(namespace, name): _snapshot(body)}


@kopf.index(*NOTIFICATIONS)
async def notification_snapshots(
    body: kopf.Body, namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[Any, Any]:
    """(bucket, namespace, name) → the BucketNotification as the drift loop checks it (one
    bucket's one after another: their checks share one read of the bucket)."""
    return {(_bucket(spec, body.status), namespace, name): _snapshot(body)}


DRIFT_INDICES = (
    "topics_by_gateway_name",
    "topic_snapshots",
    "notifications_by_topic",
    "notification_snapshots",
    "notifications_by_bucket_id",
)


def _drift_targets(indices: dict[str, Any]) -> list[tuple[str, Any]]:
    topics: kopf.Index[Any, Any] = indices["topic_snapshots"]
    notifications: kopf.Index[Any, Any] = indices["notification_snapshots"]
    return [("topics", key) for key in topics] + [
        ("bucketnotifications", key) for key in sorted(notifications)
    ]


async def _drift_check(memo: kopf.Memo, indices: dict[str, Any], target: Hashable) -> None:
    """Check one object for drift, as kopf would call a timer with it: its latest watch
    event's snapshot, under its lock; the status is written only onto that version."""
    plural, key = cast(tuple[str, Any], target)
    snapshots: kopf.Index[Any, Any] = indices[
        "topic_snapshots" if plural == "topics" else "notification_snapshots"
    ]
    namespace, name = key[-2], key[-1]
    latest = next(iter(snapshots.get(key, [])), None)
    if latest is not None:
        meta = latest["metadata"]
        move = finalizer_move(meta.get("finalizers") or [], bool(meta.get("deletionTimestamp")))
        if move is not None:
            # Outside the object's lock: a deletion handler takes it itself.
            await _move_finalizer(memo, indices, plural, latest, move)
            return
    async with memo.object_locks((plural, namespace, name)):
        # The latest one, taken under the lock: a change handler that ran meanwhile is seen.
        raw = next(iter(snapshots.get(key, [])), None)
        if raw is None or raw["metadata"].get("deletionTimestamp") or raw[PENDING]:
            return
        body = kopf.Body(raw)
        patch = kopf.Patch()
        check = topic_drift if plural == "topics" else notification_drift
        await check(body=body, patch=patch, memo=memo, **indices)
        if patch.get("status"):
            await memo.kube.patch_status(
                plural, namespace, name, dict(patch["status"]), body.metadata.get("resourceVersion")
            )


async def _move_finalizer(
    memo: kopf.Memo, indices: dict[str, Any], plural: str, raw: Any, move: str
) -> None:
    """``controller.finalizers``: drop kopf's old finalizer, first running the deletion as
    kopf would when it alone holds a deleted object."""
    meta = raw["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if move == "delete":
        body = kopf.Body(raw)
        deleted = dt.datetime.fromisoformat(meta["deletionTimestamp"].replace("Z", "+00:00"))
        handler = cast(
            Callable[..., Awaitable[None]],
            topic_deleted if plural == "topics" else notification_deleted,
        )
        try:
            await handler(
                body=body,
                spec=body.spec,
                status=body.status,
                name=name,
                namespace=namespace,
                meta=body.metadata,
                memo=memo,
                started=deleted.replace(tzinfo=None),
                **indices,
            )
        except kopf.TemporaryError as exc:
            log.info(
                "%s %s/%s, deleted under the finalizer of an earlier release: not yet (%s);"
                " tried again at the next drift check",
                plural,
                namespace,
                name,
                exc,
            )
            return
    if await memo.kube.remove_finalizer(
        plural, namespace, name, OLD_FINALIZER, list(meta.get("finalizers") or [])
    ):
        log.info("%s %s/%s: the finalizer of an earlier release removed", plural, namespace, name)


def register_drift_loop(registry: kopf.OperatorRegistry, interval: float) -> None:
    """The drift checks, at the configured interval (known only once settings are read)."""

    async def start(memo: kopf.Memo, **kwargs: Any) -> None:
        indices = {name: kwargs[name] for name in DRIFT_INDICES}
        loop = DriftLoop(
            interval,
            lambda: _drift_targets(indices),
            lambda key: _drift_check(memo, indices, key),
        )
        memo.drift_loop = asyncio.create_task(loop.run(), name="drift loop")

    async def stop(memo: kopf.Memo, **_: Any) -> None:
        task: asyncio.Task[None] | None = getattr(memo, "drift_loop", None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    kopf.on.startup(registry=registry, id="start_drift_loop")(start)
    kopf.on.cleanup(registry=registry, id="stop_drift_loop")(stop)


def register_delivery_status(
    registry: kopf.OperatorRegistry, *, namespace: str, group: str, interval: float
) -> None:
    """The Topics' delivery status from the delivery replicas' reports in ``namespace``
    (``controller.delivery_status``), every ``interval``."""

    async def start(memo: kopf.Memo, **kwargs: Any) -> None:
        snapshots: kopf.Index[Any, Any] = kwargs["topic_snapshots"]

        def topics() -> list[dict[str, Any]]:
            return [snapshot for key in snapshots for snapshot in snapshots.get(key, [])]

        loop = DeliveryStatusLoop(
            memo.kube,
            memo.events,
            namespace=namespace,
            group=group,
            interval_s=interval,
            topics=topics,
        )
        memo.delivery_status = asyncio.create_task(loop.run(), name="delivery status")

    async def stop(memo: kopf.Memo, **_: Any) -> None:
        task: asyncio.Task[None] | None = getattr(memo, "delivery_status", None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    kopf.on.startup(registry=registry, id="start_delivery_status")(start)
    kopf.on.cleanup(registry=registry, id="stop_delivery_status")(stop)


async def _bounded_delete(
    memo: kopf.Memo,
    body: kopf.Body,
    started: dt.datetime,
    *,
    what: str,
    escape: str,
    delete: Coroutine[Any, Any, None],
) -> None:
    """Run ``delete``; retry while the gateway fails, give up (with a Warning) past the limit
    so that a gateway gone for good does not keep the object forever."""
    try:
        await delete
    except (GatewayError, NotReconcilable, ApiError) as exc:
        # A 403: what the deletion must read was refused (a namespace deleted whole took
        # the operator's Role along); retried, and given up on as a gateway gone for good.
        if isinstance(exc, ApiError) and exc.status != 403:
            raise
        waited = (dt.datetime.now(dt.UTC) - started.replace(tzinfo=dt.UTC)).total_seconds()
        if waited < memo.settings.delete_give_up_after_seconds:
            raise kopf.TemporaryError(f"cannot delete the {what} yet: {exc}", delay=5) from None
        _post(
            memo,
            body,
            "Warning",
            "OrphanedOnGateway",
            f"gave up deleting the {what} after {waited:.0f}s ({exc}); {escape}"
            " if the gateway returns",
        )
        return
    _post(memo, body, "Normal", "Deleted", f"{what} deleted")


@kopf.on.delete(*TOPICS)
@_exclusive("topics")
@_measured("topic", "delete")
async def topic_deleted(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    namespace: str | None,
    memo: kopf.Memo,
    started: dt.datetime,
    **_: Any,
) -> None:
    await _bounded_delete(
        memo,
        body,
        started,
        what=f"gateway topic {status.get('arn')}",
        escape="remove it with `radosgw-admin topic rm`",
        delete=delete_topic(
            kube=memo.kube,
            settings=memo.settings,
            gateways=memo.gateways,
            namespace=_ns(namespace),
            spec=dict(spec),
            status=dict(status),
        ),
    )


@kopf.index(*TOPICS)
async def topics_by_secret(
    namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[Any, str]:
    """(namespace, Secret name) → names of the Topics that read it."""
    try:
        parsed = parse_spec(dict(spec))
    except NotReconcilable:
        return {}
    secrets = referenced_secrets(parsed)
    if parsed.persistent:
        # A rotated ingest token must reach the gateway's push-endpoint at once, not at the
        # next drift check: until then the gateway pushes with the token it replaced.
        secrets.add(ingest_token_secret(name))
    return {(namespace, secret): name for secret in secrets}


@kopf.on.event(*SECRETS)
async def secret_changed(
    event: kopf.RawEvent,
    namespace: str | None,
    name: str,
    meta: kopf.Meta,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """A created, rotated or deleted Secret re-syncs every Topic that references it: a
    deleted ingest token is made again at once, a deleted credentials Secret turns its
    Topics ``SecretNotFound`` at once, not at the next drift check. The same for the
    BucketNotifications on an ObjectBucketClaim whose Secret it is: the provisioner makes
    it when the claim is bound and deletes it with the claim.

    Only Secrets labelled ``bucketnotify.io/watched=true`` arrive here (a server-side
    selector, see ``cli._configure_kopf``): the operator labels every Secret it reads."""
    kind = event.get("type")
    # Before the readers are told: the check a change sets off must not read the old one.
    memo.watched_secrets.seen(kind, event.get("object") or {})
    if kind not in {"ADDED", "MODIFIED", "DELETED"}:
        return  # the initial listing: resume handlers sync everything anyway
    if kind != "DELETED" and await memo.kube.labelled_by_us(
        _ns(namespace), name, meta.get("resourceVersion")
    ):
        return  # our label, on the data its reader just used
    readers: tuple[tuple[str, kopf.Index[Any, str]], ...] = (
        ("topics", kwargs["topics_by_secret"]),
        ("bucketnotifications", kwargs["notifications_by_claim"]),
    )
    for plural, index in readers:
        for reader in index.get((namespace, name), []):
            await memo.kube.annotate(
                plural, namespace, reader, {SECRET_RESYNC: f"{name}@{meta.get('resourceVersion')}"}
            )


@kopf.index(*NOTIFICATIONS)
async def notifications_by_claim(
    namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[Any, str]:
    """(namespace, ObjectBucketClaim name, which is also its Secret's) → names of the
    BucketNotifications on its bucket."""
    claim = (spec.get("bucketRef") or {}).get("objectBucketClaim")
    return {(namespace, claim): name} if claim else {}


@kopf.index(*NOTIFICATIONS)
async def notifications_by_topic(
    namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[Any, str]:
    """(namespace, Topic name) → names of the BucketNotifications that use it."""
    topic = (spec.get("topicRef") or {}).get("name")
    return {(namespace, topic): name} if topic else {}


@kopf.index(*NOTIFICATIONS)
async def notifications_by_bucket_id(
    namespace: str | None,
    name: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    **_: Any,
) -> dict[Any, IdClaim]:
    """(bucket, Id) → the BucketNotifications wanting that Id on that bucket (those being
    deleted too: until their finalizer ran, the Id may still be theirs)."""
    claim = _id_claim(_ns(namespace), name, spec, status, meta)
    return {} if claim is None else {claim[0]: claim[1]}


def _id_claim(
    namespace: str, name: str, spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta
) -> tuple[tuple[str, str], IdClaim] | None:
    bucket = _bucket(spec, status)
    if not bucket:
        return None
    config_id = str(spec.get("id") or name)
    applied = status.get("applied") or {}
    created = str(meta.get("creationTimestamp") or "")
    holds = applied.get("id") == config_id
    return (str(bucket), config_id), IdClaim(namespace, name, created, holds)


def _bucket(spec: kopf.Spec, status: kopf.Status) -> str:
    """A notification's bucket: its spec's, or the one its claim named when last resolved
    (bucketRef; empty until then)."""
    return str(spec.get("bucket") or status.get("bucket") or "")


def _rivals(
    kwargs: dict[str, Any],
    namespace: str,
    name: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
) -> tuple[IdClaim | None, list[IdClaim]]:
    """This notification's claim and the other claims to its bucket and Id."""
    claim = _id_claim(namespace, name, spec, status, meta)
    if claim is None:
        return None, []
    index: kopf.Index[Any, IdClaim] = kwargs["notifications_by_bucket_id"]
    key, mine = claim
    others = [c for c in index.get(key, []) if (c.namespace, c.name) != (namespace, name)]
    return mine, others


async def _reconcile_notification(
    body: kopf.Body, memo: kopf.Memo, kwargs: dict[str, Any], *, only_if_drifted: bool = False
) -> tuple[Outcome, dict[str, Any] | None]:
    """One reconciliation of a BucketNotification, for a change or (``only_if_drifted``) a
    drift check; with the test event to send, if the change calls for one."""
    meta, spec, status = body.metadata, body.spec, body.status
    name, namespace = meta.name or "", _ns(meta.namespace)
    claim, rivals = _rivals(kwargs, namespace, name, spec, status, meta)
    return await reconcile_notification(
        kube=_drift_reader(memo) if only_if_drifted else memo.kube,
        settings=memo.settings,
        locks=memo.bucket_locks,
        gateways=memo.gateways,
        name=name,
        namespace=namespace,
        spec=dict(spec),
        status=dict(status),
        generation=meta.get("generation"),
        only_if_drifted=only_if_drifted,
        claim=claim,
        rivals=rivals,
        # A drift check takes its Topic as the watch last showed it: a GET of it for every
        # BucketNotification and interval was most of the operator's load at rest.
        seen_topic=_seen_topic(kwargs, namespace, spec) if only_if_drifted else None,
    )


def _drift_reader(memo: kopf.Memo) -> Kube:
    """The client a drift check reads with: Secrets from the operator's watch of them
    (``kube.watched_secrets``), everything else from the API server."""
    watched: WatchedSecrets = memo.watched_secrets
    kube: Kube = memo.kube
    return kube.reading_from(watched.by_namespace)


@kopf.on.create(*NOTIFICATIONS)
@kopf.on.update(*NOTIFICATIONS)
@kopf.on.resume(*NOTIFICATIONS)
@_exclusive("bucketnotifications")
@_measured("notification", "change")
async def notification_changed(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    name: str,
    namespace: str | None,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    reason: str = "",
    **kwargs: Any,
) -> None:
    outcome, test_event = await _reconcile_notification(body, memo, kwargs)
    new_status = dict(outcome.status)
    _post_change(
        memo, body, "notification", reason, status, bool(status.get("applied")), outcome, kwargs
    )
    if test_event is not None:  # only ever there when Ready
        try:
            sent = await send_test_event(memo.kube, _ns(namespace), dict(spec), test_event)
        except EndpointError as exc:
            _post(memo, body, "Warning", "TestEventNotSent", str(exc))
            new_status["testEventSent"] = False
        else:
            _post(memo, body, "Normal", "TestEventSent", sent)
            new_status["testEventSent"] = True
    _write(patch, status, new_status)
    if not outcome.ready:
        _report_not_ready(outcome.reason)
        if outcome.retry:
            raise kopf.TemporaryError(outcome.message, delay=RETRY_DELAY_S)


@_measured("notification", "drift")
async def notification_drift(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A BucketNotification's drift check (``_drift_check`` calls it)."""
    status = body.status
    outcome, _event = await _reconcile_notification(body, memo, kwargs, only_if_drifted=True)
    _report_drift(memo, body, "notification", patch, status, bool(status.get("applied")), outcome)


def _seen_topic(kwargs: dict[str, Any], namespace: str, spec: kopf.Spec) -> dict[str, Any] | None:
    """The notification's Topic as its last watch event showed it (``topic_snapshots``)."""
    topic = (spec.get("topicRef") or {}).get("name")
    snapshots: kopf.Index[Any, Any] = kwargs["topic_snapshots"]
    found: dict[str, Any] | None = next(iter(snapshots.get((namespace, topic), [])), None)
    return found


@kopf.on.delete(*NOTIFICATIONS)
@_exclusive("bucketnotifications")
@_measured("notification", "delete")
async def notification_deleted(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    name: str,
    namespace: str | None,
    memo: kopf.Memo,
    started: dt.datetime,
    meta: kopf.Meta,
    **kwargs: Any,
) -> None:
    claim, rivals = _rivals(kwargs, _ns(namespace), name, spec, status, meta)
    await _bounded_delete(
        memo,
        body,
        started,
        what=f"notification Id {(status.get('applied') or {}).get('id') or spec.get('id') or name}"
        f" on bucket {_bucket(spec, status) or '(its claim never named one)'}",
        escape="remove it with `DELETE /<bucket>?notification=<id>` and Ceph's copy of its"
        " topic with `radosgw-admin topic rm --topic=<id>_<topic>`",
        delete=delete_notification(
            kube=memo.kube,
            settings=memo.settings,
            locks=memo.bucket_locks,
            gateways=memo.gateways,
            name=name,
            namespace=_ns(namespace),
            spec=dict(spec),
            status=dict(status),
            claim=claim,
            rivals=rivals,
            seen_topic=_seen_topic(kwargs, _ns(namespace), spec),
        ),
    )
