"""Reconcile one BucketNotification: its own Id on its bucket, nothing else.

Writes to one bucket's configuration are serialised inside the operator (``BucketLocks``)
because the client reads, merges and writes the whole configuration: two Ids written at once
would otherwise race and one would be lost. The notifications of a bucket that wait for its
lock are written together, in one read and one write (``bucket_writes``). Writes to one
gateway are serialised as well, and retried on a 5xx (``GatewayPool``), because Ceph 16
stores the copy of the topic each notification makes among the tenant's topics.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from bucketnotify.api.common import GatewayRef, NotReconcilable, parse_model
from bucketnotify.api.notification import BucketNotificationSpec
from bucketnotify.api.topic import TopicSpec
from bucketnotify.controller.bucket_claims import (
    CLAIM_NOT_FOUND,
    claimed_bucket,
    leave_claimed_bucket,
)
from bucketnotify.controller.bucket_writes import AGAIN, BucketLocks
from bucketnotify.controller.conditions import ready_condition
from bucketnotify.controller.id_ownership import (
    REASON as ID_CONFLICT,
)
from bucketnotify.controller.id_ownership import (
    EntryHolder,
    IdClaim,
    cluster_refusal,
    gateway_refusal,
    id_owner,
)
from bucketnotify.controller.notification_builder import (
    desired_configuration,
    regex_problem,
    same_configuration,
    test_event,
)
from bucketnotify.controller.topic_builder import OWNER
from bucketnotify.controller.topics import (
    TOPICS_NEED_SNS,
    Outcome,
    gateway_connection,
)
from bucketnotify.delivery.endpoints.http import EndpointError, post_json
from bucketnotify.gateway import obs
from bucketnotify.gateway.connection import GatewayConnection, same_endpoint
from bucketnotify.gateway.errors import (
    GatewayAccessDenied,
    GatewayError,
    GatewayForeignTopic,
    GatewayInvalidArgument,
    GatewayNotFound,
)
from bucketnotify.gateway.notifications import NotificationConfig
from bucketnotify.gateway.pool import Gateway, GatewayPool
from bucketnotify.kube.apiserver import ApiError
from bucketnotify.kube.objects import Kube, SecretMissing
from bucketnotify.settings import OperatorSettings

log = logging.getLogger(__name__)

__all__ = ["BucketLocks", "delete_notification", "reconcile_notification", "same_gateway"]


@dataclass(frozen=True)
class Resolved:
    spec: BucketNotificationSpec
    bucket: str
    config_id: str
    topic_arn: str
    connection: GatewayConnection
    external: bool
    """The topic is a gateway topic named by topicARN, not a Topic of ours."""


def parse_spec(spec: dict[str, Any]) -> BucketNotificationSpec:
    return parse_model(BucketNotificationSpec, spec)


async def resolve(
    kube: Kube,
    settings: OperatorSettings,
    name: str,
    namespace: str,
    raw: dict[str, Any],
    seen_topic: dict[str, Any] | None = None,
) -> Resolved:
    """What the notification's spec names, its Topic read from the API server, or taken as
    ``seen_topic`` (the Topic as the operator's watch last showed it) when given."""
    spec = parse_spec(raw)
    if spec.filter is not None and spec.filter.key is not None and spec.filter.key.regex:
        problem = regex_problem(spec.filter.key.regex)
        if problem:
            raise NotReconcilable("InvalidFilter", problem)
    if spec.topic_ref is None:
        # topicARN: whether the gateway has it is checked under the bucket lock.
        assert spec.topic_arn is not None  # the schema asks for exactly one of them
        bucket, connection = await _bucket_and_connection(kube, settings, namespace, spec, None)
        return Resolved(spec, bucket, spec.id or name, spec.topic_arn, connection, external=True)
    topic = seen_topic or await kube.get_object("topics", namespace, spec.topic_ref.name)
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
    bucket, connection = await _bucket_and_connection(
        kube, settings, namespace, spec, topic_spec.gateway_ref
    )
    if connection.kind == "obs":
        raise NotReconcilable("Unsupported", TOPICS_NEED_SNS)
    return Resolved(spec, bucket, spec.id or name, arn, connection, external=False)


async def _bucket_and_connection(
    kube: Kube,
    settings: OperatorSettings,
    namespace: str,
    spec: BucketNotificationSpec,
    topic_ref: GatewayRef | None,
) -> tuple[str, GatewayConnection]:
    """The bucket and whose keys write to it: its claim's (bucketRef), else gatewayRef's,
    else the Topic's (``topic_ref``), else the operator's."""
    if spec.bucket_ref is not None:
        claimed = await claimed_bucket(kube, namespace, spec.bucket_ref)
        return claimed.bucket, claimed.connection
    assert spec.bucket is not None  # the schema asks for exactly one of them
    return spec.bucket, await _connection(kube, settings, namespace, spec.gateway_ref or topic_ref)


async def _connection(
    kube: Kube, settings: OperatorSettings, namespace: str, ref: GatewayRef | None
) -> GatewayConnection:
    try:
        return await gateway_connection(kube, namespace, ref, settings)
    except SecretMissing as exc:
        raise NotReconcilable("SecretNotFound", str(exc)) from None


async def same_gateway(
    kube: Kube, settings: OperatorSettings, rivals: list[IdClaim], connection: GatewayConnection
) -> list[IdClaim]:
    """The ``rivals`` whose notifications go to the gateway of ``connection`` (a bucket name
    is the same bucket only on the same gateway). A rival whose gateway cannot be told
    counts as on it: an Id given to two writers is worse than one held back."""
    found = []
    for rival in rivals:
        endpoint = None
        with contextlib.suppress(Exception):
            obj = await kube.get_object("bucketnotifications", rival.namespace, rival.name)
            if obj is not None:
                theirs = await resolve_gateway(kube, settings, rival.namespace, obj["spec"])
                endpoint = theirs.endpoint
        if endpoint is None or same_endpoint(endpoint, connection.endpoint):
            found.append(rival)
    return found


async def resolve_gateway(
    kube: Kube, settings: OperatorSettings, namespace: str, raw: dict[str, Any]
) -> GatewayConnection:
    """The gateway a notification's spec goes to: its gatewayRef, else its Topic's, else
    the operator's."""
    spec = parse_spec(raw)
    if spec.bucket_ref is not None:
        return (await claimed_bucket(kube, namespace, spec.bucket_ref)).connection
    ref: GatewayRef | None = spec.gateway_ref
    if ref is None and spec.topic_ref is not None:
        topic = await kube.get_object("topics", namespace, spec.topic_ref.name)
        if topic is not None:
            ref = TopicSpec.model_validate(topic["spec"]).gateway_ref
    return await gateway_connection(kube, namespace, ref, settings)


def _gateway_failure(
    exc: GatewayError, bucket: str, connection: GatewayConnection
) -> NotReconcilable:
    if isinstance(exc, GatewayNotFound):
        return NotReconcilable(
            "BucketNotFound", f"bucket {bucket} does not exist: {exc}", retry=True
        )
    if isinstance(exc, GatewayForeignTopic):
        return NotReconcilable(
            "AccessDenied",
            f"the topic belongs to another gateway user ({exc}): use that user's keys in"
            " gatewayRef, or a topic of this one",
            retry=True,
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
    claim: IdClaim | None = None,
    rivals: list[IdClaim] | None = None,
    seen_topic: dict[str, Any] | None = None,
) -> tuple[Outcome, dict[str, Any] | None]:
    """Put this notification's Id on its bucket; returns the outcome and, when one should be
    sent now, the test event to send.

    Only when the Id is this notification's (``id_ownership``): ``claim`` is its own claim
    and ``rivals`` the other BucketNotifications of the operator naming the same bucket and
    Id; an Id held by another, or found on the bucket made by someone else, is
    ``IdConflict`` and nothing is written. ``seen_topic``: its Topic as the operator's
    watch last showed it (a drift check's), else the Topic is read.

    Every call but a drift check writes the Id, even when the bucket holds it as desired:
    the gateway keeps a copy of the topic (endpoint, token, credentials) in each
    notification and refreshes it only when the notification is written, so a topic change
    reaches the bucket only this way (the operator annotates the notifications of a changed
    Topic). A write of the same Id and topic replaces the copy in place (measured on Ceph
    16.2): no event falls between a delete and a create.
    """
    applied = status.get("applied")
    bucket: str | None = spec.get("bucket") or status.get("bucket")

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
            bucket=bucket,
        )

    try:
        resolved = await resolve(kube, settings, name, namespace, spec, seen_topic)
        bucket = resolved.bucket
        desired = desired_configuration(resolved.spec, resolved.config_id, resolved.topic_arn)
        repaired: list[str] = []
        if claim is not None and rivals:
            same = await same_gateway(kube, settings, rivals, resolved.connection)
            refusal = cluster_refusal(claim, same, bucket, desired.id)
            if refusal is not None:
                raise NotReconcilable(ID_CONFLICT, refusal, retry=True)
        mine = {desired.topic_arn, *([applied["topicArn"]] if applied else [])}
        try:
            gateway = await gateways.get(resolved.connection)
            if resolved.connection.kind == "obs":
                # OBS checks the SMN topic itself when the configuration is written.
                refused = obs.problem(desired)
                if refused is not None:
                    raise NotReconcilable("Unsupported", refused)
            else:
                await _refuse_events_the_release_lacks(gateways, resolved.connection, desired)
                if (
                    resolved.external
                    and await gateway.read(gateway.topics.get, desired.topic_arn) is None
                ):
                    raise NotReconcilable(
                        "TopicNotFound",
                        f"the gateway has no topic {desired.topic_arn} (topicARN): create it"
                        " there first, or use topicRef to a Topic of this namespace",
                        retry=True,
                    )

            async def decide(configuration: list[NotificationConfig]) -> bool:
                """Whether to write ``desired``, seen the bucket's configuration."""
                entries = [c for c in configuration if c.id == desired.id]
                holders = [
                    EntryHolder(e.topic_arn, await _owner_of(gateway, e.topic_arn))
                    for e in entries
                    if e.topic_arn not in mine
                ]
                refusal = gateway_refusal(
                    holders,
                    bucket=bucket,
                    id=desired.id,
                    owner_id=settings.owner_id,
                    held_before=bool(applied and applied.get("id") == desired.id),
                    adopt=resolved.spec.adopt_existing,
                )
                if refusal is not None:
                    raise NotReconcilable(ID_CONFLICT, refusal, retry=True)
                current = entries[0] if entries else None
                if only_if_drifted:
                    if current is not None and same_configuration(current, desired):
                        return False
                    repaired.append("configuration" if current else "missing configuration")
                return True

            key = locks.key(resolved.connection, bucket)
            written = await locks.batches.submit(
                key,
                BucketWrite(desired, decide, drift_check=only_if_drifted),
                functools.partial(_write_batch, locks, gateway, key, bucket),
            )
            if not written:
                in_sync = f"Id {desired.id} on bucket {bucket} is in sync"
                return outcome(True, "Synced", in_sync), None
        except GatewayError as exc:
            raise _gateway_failure(exc, bucket, resolved.connection) from None
    except NotReconcilable as exc:
        if exc.reason == ID_CONFLICT:
            applied = None  # the Id on the bucket is not this notification's (any more)
        message = str(exc)
        if exc.reason == CLAIM_NOT_FOUND and applied:
            left = await leave_claimed_bucket(
                kube, settings, locks, gateways, namespace, spec, applied
            )
            message = f"{message}; {left.message}"
            if left.gone:
                applied = None
        return outcome(False, exc.reason, message, retry=exc.retry), None
    applied = {
        "id": desired.id,
        "topicArn": desired.topic_arn,
        "events": list(desired.events),
        "bucket": bucket,
    }
    result = outcome(
        True, "Synced", f"Id {desired.id} on bucket {bucket} is in sync", repaired=repaired
    )
    event = None
    # A topic named by ARN has an endpoint the operator does not know: no test event.
    if resolved.spec.test_event and not resolved.external and not status.get("testEventSent"):
        event = test_event(bucket, dt.datetime.now(dt.UTC))
    return result, event


@dataclass(frozen=True)
class BucketWrite:
    """One notification's request to write its Id, in a batch of its bucket's."""

    desired: NotificationConfig
    decide: Callable[[list[NotificationConfig]], Awaitable[bool]]
    """Whether ``desired`` is to be written, seen the bucket's configuration (or raises
    NotReconcilable)."""
    drift_check: bool = False
    """Only looking for drift: may be decided on a recent read (``BucketLocks.recent``)."""


async def _write_batch(
    locks: BucketLocks,
    gateway: Gateway,
    key: Hashable,
    bucket: str,
    requests: list[BucketWrite],
) -> list[bool | BaseException | object]:
    """One read of the bucket's configuration (a recent one for drift checks alone), each
    request decided on it, one write of the Ids to write; a refused write is retried one Id
    at a time, so that each request gets its own answer. Answers: written (True), in sync
    (False), or the exception."""
    configuration: list[NotificationConfig] | None = None
    if all(r.drift_check for r in requests):
        configuration = locks.recent(key)
    if configuration is None:
        configuration = await gateway.read(gateway.notifications.list, bucket)
        locks.remember(key, configuration)
    answers: list[bool | BaseException | object] = []
    ids: set[str] = set()
    for request in requests:
        if request.desired.id in ids:
            answers.append(AGAIN)  # two requests for one Id: the later waits for this write
            continue
        ids.add(request.desired.id)
        try:
            answers.append(await request.decide(configuration))
        except (NotReconcilable, GatewayError) as exc:
            answers.append(exc)
    writes = [r.desired for r, a in zip(requests, answers, strict=True) if a is True]
    if writes:
        locks.forget(key)
    if len(writes) > 1:
        try:
            await gateway.write(gateway.notifications.put_many, bucket, writes)
            locks.wrote(len(writes))
            return answers
        except GatewayError:
            pass  # which Id it was: each on its own below
    for index, (request, answer) in enumerate(zip(requests, answers, strict=True)):
        if answer is True:
            try:
                await gateway.write(gateway.notifications.put, bucket, request.desired)
                locks.wrote(1)
            except GatewayError as exc:
                answers[index] = exc
    return answers


async def _refuse_events_the_release_lacks(
    gateways: GatewayPool, connection: GatewayConnection, desired: NotificationConfig
) -> None:
    """NotReconcilable ``Unsupported`` naming the events the gateway's Ceph release does not
    take: the gateway would refuse the whole configuration with a bare InvalidArgument."""
    release = await gateways.release(connection)
    refused = release.refused_events(desired.events)
    if refused:
        raise NotReconcilable(
            "Unsupported",
            f"this gateway runs Ceph {release.name}, which has no event "
            + ", ".join(refused)
            + ": remove it from spec.events, or use a gateway of a later release"
            " (docs/gateway-compatibility.md)",
        )


async def _owner_of(gateway: Gateway, topic_arn: str) -> str | None:
    """The owner mark of a gateway topic; None when it has none or is gone (or, on OBS,
    cannot be read: SMN topics are never ours)."""
    if gateway.connection.kind == "obs":
        return None
    try:
        topic = await gateway.read(gateway.topics.get, topic_arn)
    except GatewayForeignTopic:
        return None  # another gateway user's (Ceph 19+): never ours
    return None if topic is None else topic.endpoint_args.get(OWNER) or None


async def send_test_event(
    kube: Kube, namespace: str, spec: dict[str, Any], event: dict[str, Any]
) -> str:
    """Send ``event`` through the notification's Topic; returns what happened, for an Event.

    Only non-persistent HTTP topics can be reached from the operator today; AMQP, Kafka and
    persistent topics get their test event once the delivery service carries them.
    """
    parsed = parse_spec(spec)
    if parsed.topic_ref is None:
        raise EndpointError("test events reach only Topics of this namespace, not a topicARN")
    topic = await kube.get_object("topics", namespace, parsed.topic_ref.name)
    if topic is None:
        raise EndpointError("the Topic is gone")
    topic_spec = TopicSpec.model_validate(topic["spec"])
    http = topic_spec.endpoint.http
    if topic_spec.persistent or http is None:
        raise EndpointError("test events reach only non-persistent HTTP topics for now")
    await post_json(http.url, event, verify=http.verify_ssl)
    return f"s3:TestEvent sent to the HTTP endpoint of Topic {parsed.topic_ref.name}"


async def _topic_spec_and_arn(
    kube: Kube, namespace: str, name: str, seen: dict[str, Any] | None = None
) -> tuple[dict[str, Any], str | None] | None:
    """A Topic's spec and ARN, None when it is gone. Only these: a deletion then waits for
    its bucket's lock, and with a thousand deletions waiting at once, whole Topic objects
    (managedFields and all) held about 8 MiB at the operator's peak.

    ``seen``: the Topic as its last watch event showed it, used when the API server refuses
    the read (403): a namespace deleted whole takes the operator's Role along while its
    notifications still wait for their cleanup. Refused and not seen (the Topic's own
    cleanup ended first and took it out of the index), it counts as gone: the notification's
    ``applied`` status still names the topic its Id was written with (seen on the one-node
    cluster: the namespace hung in Terminating, the read refused every retry)."""
    try:
        topic = await kube.get_object("topics", namespace, name)
    except ApiError as exc:
        if exc.status != 403:
            raise
        topic = seen
    if topic is None:
        return None
    spec: dict[str, Any] = topic["spec"]
    return spec, (topic.get("status") or {}).get("arn")


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
    claim: IdClaim | None = None,
    rivals: list[IdClaim] | None = None,
    seen_topic: dict[str, Any] | None = None,
) -> None:
    """Remove this notification's Id (only it) from its bucket, and the copy of its topic
    Ceph made for it; return only once a read shows both gone. A bucket already gone is fine.

    Never another's entry: one that names a topic of neither this notification nor its
    Topic is left alone, and so is the Id when one of ``rivals`` (other BucketNotifications
    naming the bucket and Id) owns it rather than ``claim``, this notification.

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
    if parsed.topic_arn is not None:
        topic_arns.add(parsed.topic_arn)
    found = None
    if parsed.topic_ref is not None:
        found = await _topic_spec_and_arn(kube, namespace, parsed.topic_ref.name, seen_topic)
    if found is not None:
        topic_spec, topic_arn = found
        if ref is None:
            ref = TopicSpec.model_validate(topic_spec).gateway_ref
        if topic_arn:
            topic_arns.add(topic_arn)
    try:
        if parsed.bucket_ref is not None:
            claimed = await claimed_bucket(kube, namespace, parsed.bucket_ref)
            bucket, connection = claimed.bucket, claimed.connection
        else:
            assert parsed.bucket is not None  # the schema asks for bucket or bucketRef
            bucket = parsed.bucket
            connection = await gateway_connection(kube, namespace, ref, settings)
    except SecretMissing as exc:
        if not applied:
            return
        raise NotReconcilable("SecretNotFound", str(exc)) from None
    except NotReconcilable:
        if not applied:
            return
        if parsed.bucket_ref is not None:
            # The claim went first, its keys with it: only its bucket's name is left.
            left = await leave_claimed_bucket(
                kube, settings, locks, gateways, namespace, spec, applied
            )
            if not left.final:
                raise NotReconcilable(CLAIM_NOT_FOUND, left.message) from None
            if not left.gone:
                # Nobody will have the owner's keys later: waiting would only hold the
                # object back; the condition said the same while it lived.
                log.warning("BucketNotification %s/%s deleted: %s", namespace, name, left.message)
            return
        raise
    if claim is not None and rivals:
        same = await same_gateway(kube, settings, rivals, connection)
        if same and id_owner([claim, *same]) != claim:
            return  # the Id is a rival's to keep
    gateway = await gateways.get(connection)
    async with locks(connection, bucket):
        try:
            entries = await gateway.read(gateway.notifications.list, bucket)
            if any(c.id == config_id and c.topic_arn not in topic_arns for c in entries):
                return  # the Id is someone else's now (or always was)
            await gateway.write(gateway.notifications.delete, bucket, config_id, sorted(topic_arns))
        except GatewayNotFound:
            pass  # a bucket that is gone took its configuration (and Ceph its copies) along
        except (GatewayAccessDenied, GatewayInvalidArgument):
            if applied:
                raise
