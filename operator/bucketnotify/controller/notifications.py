"""Reconcile one BucketNotification: its own Id on its bucket, nothing else.

Writes to one bucket's configuration are serialised inside the operator (``BucketLocks``)
because the client reads, merges and writes the whole configuration: two Ids written at once
would otherwise race and one would be lost. Writes to one gateway are serialised as well, and
retried on a 5xx (``GatewayPool``), because Ceph 16 stores the copy of the topic each
notification makes among the tenant's topics.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from bucketnotify.api.common import GatewayRef
from bucketnotify.api.notification import BucketNotificationSpec
from bucketnotify.api.topic import TopicSpec
from bucketnotify.controller.conditions import ready_condition
from bucketnotify.controller.notification_builder import (
    desired_configuration,
    regex_problem,
    same_configuration,
    test_event,
)
from bucketnotify.controller.topics import (
    NotReconcilable,
    Outcome,
    gateway_connection,
    parse_model,
)
from bucketnotify.delivery.endpoints.http import EndpointError, post_json
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.errors import (
    GatewayAccessDenied,
    GatewayError,
    GatewayInvalidArgument,
    GatewayNotFound,
)
from bucketnotify.gateway.pool import GatewayPool
from bucketnotify.kube import Kube, SecretMissing
from bucketnotify.settings import OperatorSettings

__all__ = ["BucketLocks", "delete_notification", "reconcile_notification"]


class BucketLocks:
    """One asyncio lock per (gateway, bucket)."""

    def __init__(self) -> None:
        self._locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)

    def __call__(self, connection: GatewayConnection, bucket: str) -> asyncio.Lock:
        return self._locks[(connection.endpoint, bucket)]


@dataclass(frozen=True)
class Resolved:
    spec: BucketNotificationSpec
    config_id: str
    topic_arn: str
    topic_spec: TopicSpec
    connection: GatewayConnection


def parse_spec(spec: dict[str, Any]) -> BucketNotificationSpec:
    return parse_model(BucketNotificationSpec, spec)


async def resolve(
    kube: Kube, settings: OperatorSettings, name: str, namespace: str, raw: dict[str, Any]
) -> Resolved:
    spec = parse_spec(raw)
    if spec.filter is not None and spec.filter.key is not None and spec.filter.key.regex:
        problem = regex_problem(spec.filter.key.regex)
        if problem:
            raise NotReconcilable("InvalidFilter", problem)
    topic = await kube.get_object("topics", namespace, spec.topic_ref.name)
    if topic is None:
        raise NotReconcilable(
            "TopicNotFound", f"Topic {namespace}/{spec.topic_ref.name} does not exist", retry=True
        )
    topic_status = topic.get("status") or {}
    ready = ready_condition(list(topic_status.get("conditions") or []))
    arn = topic_status.get("arn")
    if not arn or ready is None or ready.get("status") != "True":
        raise NotReconcilable(
            "TopicNotReady", f"Topic {namespace}/{spec.topic_ref.name} is not Ready yet", retry=True
        )
    topic_spec = TopicSpec.model_validate(topic["spec"])
    ref: GatewayRef | None = spec.gateway_ref or topic_spec.gateway_ref
    try:
        connection = await gateway_connection(kube, namespace, ref, settings)
    except SecretMissing as exc:
        raise NotReconcilable("SecretNotFound", str(exc)) from None
    return Resolved(spec, spec.id or name, arn, topic_spec, connection)


def _gateway_failure(
    exc: GatewayError, bucket: str, connection: GatewayConnection
) -> NotReconcilable:
    if isinstance(exc, GatewayNotFound):
        return NotReconcilable(
            "BucketNotFound", f"bucket {bucket} does not exist: {exc}", retry=True
        )
    if isinstance(exc, GatewayAccessDenied):
        return NotReconcilable(
            "AccessDenied",
            f"gateway user {connection.access_key} may not configure bucket {bucket}"
            f" (not its owner?): {exc}",
            retry=True,
        )
    return NotReconcilable(exc.reason, str(exc), retry=True)


async def reconcile_notification(
    *,
    kube: Kube,
    settings: OperatorSettings,
    locks: BucketLocks,
    gateways: GatewayPool,
    name: str,
    namespace: str,
    spec: dict[str, Any],
    status: dict[str, Any],
    generation: int | None,
    only_if_drifted: bool = False,
    recreate: bool = False,
) -> tuple[Outcome, dict[str, Any] | None]:
    """Put this notification's Id on its bucket; returns the outcome and, when one should be
    sent now, the test event to send.

    ``recreate`` deletes the Id before writing it: the gateway keeps a copy of the topic in
    each notification, refreshed only when the notification is created, so a topic change
    reaches the bucket only this way. Events in the moment between the two requests are
    not notified.
    """
    applied = status.get("applied")

    def outcome(
        ready: bool,
        reason: str,
        message: str,
        retry: bool = False,
        repaired: list[str] | None = None,
    ) -> Outcome:
        return Outcome.of(
            status,
            generation=generation,
            ready=ready,
            reason=reason,
            message=message,
            retry=retry,
            repaired=repaired,
            applied=applied,
        )

    try:
        resolved = await resolve(kube, settings, name, namespace, spec)
        bucket = resolved.spec.bucket
        desired = desired_configuration(resolved.spec, resolved.config_id, resolved.topic_arn)
        repaired: list[str] = []
        async with locks(resolved.connection, bucket):
            try:
                gateway = await gateways.get(resolved.connection)
                client = gateway.notifications
                # put() reads the bucket's configuration itself; a read here only serves
                # the drift check and re-creation.
                current = None
                if only_if_drifted or recreate:
                    current = await gateway.read(client.get, bucket, resolved.config_id)
                if current is not None and same_configuration(current, desired) and only_if_drifted:
                    return outcome(
                        True, "Synced", f"Id {desired.id} on bucket {bucket} is in sync"
                    ), None
                if only_if_drifted:
                    repaired = ["configuration" if current else "missing configuration"]
                if recreate and current is not None:
                    # The ARN given: a retry after a failed first try no longer sees the entry.
                    await gateway.write(client.delete, bucket, desired.id, [current.topic_arn])
                await gateway.write(client.put, bucket, desired)
            except GatewayError as exc:
                raise _gateway_failure(exc, bucket, resolved.connection) from None
    except NotReconcilable as exc:
        return outcome(False, exc.reason, str(exc), retry=exc.retry), None
    applied = {"id": desired.id, "topicArn": desired.topic_arn, "events": list(desired.events)}
    result = outcome(
        True, "Synced", f"Id {desired.id} on bucket {bucket} is in sync", repaired=repaired
    )
    event = None
    if resolved.spec.test_event and not status.get("testEventSent"):
        event = test_event(bucket, dt.datetime.now(dt.UTC))
    return result, event


async def send_test_event(
    kube: Kube, namespace: str, spec: dict[str, Any], event: dict[str, Any]
) -> str:
    """Send ``event`` through the notification's Topic; returns what happened, for an Event.

    Only non-persistent HTTP topics can be reached from the operator today; AMQP, Kafka and
    persistent topics get their test event once the delivery service carries them.
    """
    parsed = parse_spec(spec)
    topic = await kube.get_object("topics", namespace, parsed.topic_ref.name)
    if topic is None:
        raise EndpointError("the Topic is gone")
    topic_spec = TopicSpec.model_validate(topic["spec"])
    http = topic_spec.endpoint.http
    if topic_spec.persistent or http is None:
        raise EndpointError("test events reach only non-persistent HTTP topics for now")
    await post_json(http.url, event, verify=http.verify_ssl)
    return f"s3:TestEvent sent to the HTTP endpoint of Topic {parsed.topic_ref.name}"


async def delete_notification(
    *,
    kube: Kube,
    settings: OperatorSettings,
    locks: BucketLocks,
    gateways: GatewayPool,
    name: str,
    namespace: str,
    spec: dict[str, Any],
    status: dict[str, Any],
) -> None:
    """Remove this notification's Id (only it) from its bucket, and the copy of its topic
    Ceph made for it; return only once a read shows both gone. A bucket already gone is fine.

    Also when the notification never became Ready: a PUT answered with a 5xx may have put
    the Id or the copy in place (the benchmark found such leftovers), and a later failure of
    another kind (its Topic deleted first) does not undo that. The look costs reads only when
    nothing is there. Without an ``applied`` status, what cannot be resolved or is refused
    (no gateway, a bucket of another user) had nothing written to it, and ends the deletion.
    """
    applied = status.get("applied")
    try:
        parsed = parse_spec(spec)
    except NotReconcilable:
        if not applied:
            return
        raise
    config_id = applied["id"] if applied else parsed.id or name
    # The copies to look for: the bucket's entries name their topics, but an entry that an
    # earlier, failed DELETE removed does not, nor does a PUT that failed halfway.
    topic_arns = {applied["topicArn"]} if applied else set()
    ref = parsed.gateway_ref
    topic = await kube.get_object("topics", namespace, parsed.topic_ref.name)
    if topic is not None:
        if ref is None:
            ref = TopicSpec.model_validate(topic["spec"]).gateway_ref
        if (topic.get("status") or {}).get("arn"):
            topic_arns.add(topic["status"]["arn"])
    try:
        connection = await gateway_connection(kube, namespace, ref, settings)
    except SecretMissing as exc:
        if not applied:
            return
        raise NotReconcilable("SecretNotFound", str(exc)) from None
    except NotReconcilable:
        if not applied:
            return
        raise
    gateway = await gateways.get(connection)
    async with locks(connection, parsed.bucket):
        try:
            await gateway.write(
                gateway.notifications.delete, parsed.bucket, config_id, sorted(topic_arns)
            )
        except GatewayNotFound:
            pass  # a bucket that is gone took its configuration (and Ceph its copies) along
        except (GatewayAccessDenied, GatewayInvalidArgument):
            if applied:
                raise
