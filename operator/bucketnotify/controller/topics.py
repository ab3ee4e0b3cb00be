"""Reconcile one Topic into the gateway: resolve its Secrets, build, upsert, report.

Plain async functions with explicit arguments; ``handlers`` registers them with kopf.
Gateway calls go through the ``GatewayPool``: in a worker thread, so one slow gateway does
not stall the loop, and writes one at a time per gateway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bucketnotify.api.common import (
    ROOK_USER_SECRET_KEYS,
    GatewayRef,
    GatewaySecretKeys,
    NotReconcilable,
    parse_model,
)
from bucketnotify.api.topic import (
    INGEST_TOKEN_KEY,
    PERSISTENT_NAME_MAX,
    PERSISTENT_NAME_MESSAGE,
    Credentials,
    TopicSpec,
    ingest_token_secret,
)
from bucketnotify.controller.conditions import ready_status
from bucketnotify.controller.topic_builder import (
    GATEWAY_TOPIC_NAME,
    OWNER,
    PUSH_ENDPOINT,
    NameClaim,
    TopicBuildError,
    arn_topic_name,
    check_gateway_name,
    differences,
    gateway_attributes,
    gateway_topic_name,
    ingest_endpoint,
)
from bucketnotify.gateway.connection import GATEWAY_KINDS, GatewayConnection
from bucketnotify.gateway.errors import (
    GatewayError,
    GatewayForeignTopic,
    GatewayInvalidArgument,
)
from bucketnotify.gateway.pool import GatewayPool
from bucketnotify.gateway.release import GatewayRelease
from bucketnotify.kube.objects import Kube, SecretMissing
from bucketnotify.settings import OperatorSettings

logger = logging.getLogger(__name__)

__all__ = ["Outcome", "delete_topic", "parse_model", "reconcile_topic"]


@dataclass(frozen=True)
class Outcome:
    """What a reconcile found: the status to write and whether to retry soon."""

    status: dict[str, Any]
    ready: bool
    reason: str
    message: str
    retry: bool = False
    repaired: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        current: dict[str, Any],
        *,
        generation: int | None,
        ready: bool,
        reason: str,
        message: str,
        retry: bool = False,
        repaired: list[str] | None = None,
        **fields: Any,
    ) -> Outcome:
        """The outcome and the status it writes: ``current`` with Ready set and ``fields``."""
        status = ready_status(
            current, generation=generation, ready=ready, reason=reason, message=message, **fields
        )
        return cls(status, ready, reason, message, retry, repaired or [])


TOPICS_NEED_SNS = (
    "the gateway is Huawei OBS (gateway kind obs), which has no SNS API to make topics on:"
    " make the SMN topic in OBS and name it in a BucketNotification's topicARN"
    " (urn:smn:<region>:<project id>:<topic>) instead of a Topic"
)


def gateway_secret_keys(ref: GatewayRef, data: dict[str, str]) -> GatewaySecretKeys:
    """The key names to read: those ``ref`` gives, else ours, else Rook's where the Secret
    has Rook's (a CephObjectStoreUser's Secret) and none of ours."""
    if ref.keys is not None:
        return ref.keys
    ours = GatewaySecretKeys()
    rooks = ROOK_USER_SECRET_KEYS
    if ours.endpoint not in data and all(
        k in data for k in (rooks.endpoint, rooks.access_key, rooks.secret_key)
    ):
        return rooks
    return ours


async def gateway_connection(
    kube: Kube, namespace: str, ref: GatewayRef | None, settings: OperatorSettings
) -> GatewayConnection:
    """The connection named by ``ref``, or the operator's default one."""
    if ref is not None:
        data = await kube.secret_data(namespace, ref.secret_name)
        keys = gateway_secret_keys(ref, data)
        wanted = (keys.endpoint, keys.access_key, keys.secret_key)
        missing = [k for k in wanted if not data.get(k)]
        if missing:
            raise SecretMissing(
                f"gateway Secret {namespace}/{ref.secret_name} lacks {', '.join(missing)}"
                + ("" if ref.keys else " (or Rook's Endpoint, AccessKey, SecretKey)")
            )
        kind = data.get("kind") or "ceph"
        if kind not in GATEWAY_KINDS:
            raise NotReconcilable(
                "InvalidGatewaySecret",
                f"gateway Secret {namespace}/{ref.secret_name}: kind must be one of"
                f" {', '.join(GATEWAY_KINDS)}, not {kind!r}",
            )
        return GatewayConnection(
            data[keys.endpoint],
            data[keys.access_key],
            data[keys.secret_key],
            data.get(keys.region) or "default",
            kind,
        )
    if not (
        settings.gateway_endpoint and settings.gateway_access_key and settings.gateway_secret_key
    ):
        raise NotReconcilable(
            "NoGateway",
            "no gatewayRef and the operator has no default gateway"
            " (BUCKETNOTIFY_GATEWAY_ENDPOINT, _ACCESS_KEY, _SECRET_KEY)",
        )
    return GatewayConnection(
        settings.gateway_endpoint,
        settings.gateway_access_key,
        settings.gateway_secret_key.get_secret_value(),
        settings.gateway_region,
        settings.gateway_kind,
    )


async def endpoint_credentials(kube: Kube, namespace: str, spec: TopicSpec) -> Credentials | None:
    return await kube.endpoint_credentials(namespace, spec.endpoint)


def parse_spec(spec: dict[str, Any]) -> TopicSpec:
    return parse_model(TopicSpec, spec)


ClaimsOf = Callable[[str], list[NameClaim]]


def _no_claims(_name: str) -> list[NameClaim]:
    return []


async def _desired(
    kube: Kube,
    name: str,
    namespace: str,
    raw_spec: dict[str, Any],
    settings: OperatorSettings,
    owner: dict[str, Any] | None,
    arn: str | None,
    claims_of: ClaimsOf,
    gateways: GatewayPool,
) -> tuple[TopicSpec, GatewayConnection, str, dict[str, str], GatewayRelease]:
    spec = parse_spec(raw_spec)
    created = str(((owner or {}).get("metadata") or {}).get("creationTimestamp") or "")
    try:
        topic_name = gateway_topic_name(namespace, name, spec, arn, created, claims_of)
    except TopicBuildError as exc:
        raise NotReconcilable(exc.reason, str(exc), retry=True) from None
    try:
        connection = await gateway_connection(kube, namespace, spec.gateway_ref, settings)
        credentials = await endpoint_credentials(kube, namespace, spec)
        # Read for its presence only: the delivery service presents it (a persistent Topic
        # is the only kind that may name one), and a missing one must show here too.
        await kube.endpoint_client_certificate(namespace, spec.endpoint)
    except SecretMissing as exc:
        # Retried: the operator watches only the Secrets it labelled, so a Secret created
        # after its Topic (unlabelled) reaches no handler; the retry reads it.
        raise NotReconcilable("SecretNotFound", str(exc), retry=True) from None
    if connection.kind == "obs":
        raise NotReconcilable("Unsupported", TOPICS_NEED_SNS)
    ingest = None
    if spec.persistent and len(name) > PERSISTENT_NAME_MAX:
        # Stored before the CRD had the rule that refuses it now.
        raise NotReconcilable("InvalidSpec", PERSISTENT_NAME_MESSAGE)
    if spec.persistent and settings.ingest_url and owner is not None:
        # The token Secret belongs to the Topic: deleting the Topic deletes it.
        token = await kube.ensure_token_secret(
            namespace, ingest_token_secret(name), INGEST_TOKEN_KEY, owner
        )
        ingest = ingest_endpoint(settings.ingest_url, namespace, name, token)
    release = await gateways.release(connection)
    try:
        if spec.name:
            check_gateway_name(spec.name, release)
        attributes = gateway_attributes(
            spec,
            credentials=credentials,
            allow_cleartext_secrets=settings.allow_cleartext_secrets,
            ingest_url=ingest,
            gateway_endpoint=connection.endpoint,
            owner_id=settings.owner_id,
            release=release,
        )
    except TopicBuildError as exc:
        raise NotReconcilable(exc.reason, str(exc)) from None
    return spec, connection, topic_name, attributes, release


async def reconcile_topic(
    *,
    kube: Kube,
    settings: OperatorSettings,
    gateways: GatewayPool,
    name: str,
    namespace: str,
    spec: dict[str, Any],
    status: dict[str, Any],
    generation: int | None,
    owner: dict[str, Any] | None = None,
    only_if_drifted: bool = False,
    claims_of: ClaimsOf = _no_claims,
) -> Outcome:
    """Make the gateway topic equal to the spec (``owner``: the Topic object, which owns the
    ingest token Secret of a persistent Topic; ``claims_of(name)``: the Topics wanting a
    gateway topic name, which settles who of them gets it).

    With ``only_if_drifted`` (the drift timer) the gateway is read first and written only
    when it differs, so a quiet cluster costs one read per Topic and interval, most of them
    answered by the gateway's last topic listing (``TopicListing``).
    """
    arn = status.get("arn")
    endpoint_kind: str | None = None
    gateway_release: str | None = status.get("gatewayRelease")

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
            arn=arn,
            endpointKind=endpoint_kind,
            gatewayRelease=gateway_release,
        )

    try:
        parsed, connection, topic_name, attributes, release = await _desired(
            kube, name, namespace, spec, settings, owner, arn, claims_of, gateways
        )
        if release.learned_from != "unreachable":
            gateway_release = release.name
        endpoint_kind = parsed.endpoint.kind
        gateway = await gateways.get(connection)
        repaired: list[str] = []
        held = arn is not None and arn_topic_name(arn) == topic_name
        # Ceph ignores the ARN's region; before 20.2 also its account, and 20.2 matches the
        # account, which is empty for a user outside an account. So a topic not made yet can
        # be looked for by its name (docs/gateway-compatibility.md).
        probe = (
            arn if arn is not None and held else f"arn:aws:sns:{connection.region}::{topic_name}"
        )
        if only_if_drifted:
            current = await gateway.listing.find(arn_topic_name(probe), probe)
        else:
            current = await gateway.read(gateway.topics.get, probe)
        marked_by = current.endpoint_args.get(OWNER) if current is not None else None
        if marked_by and marked_by != settings.owner_id:
            # Another cluster's operator on the same gateway: the two would overwrite each
            # other's endpoint, and each take the other's notification Ids for its own.
            raise NotReconcilable(
                "NameConflict",
                f"gateway topic {topic_name!r} belongs to another bucketnotify operator (owner"
                f" {marked_by}); set spec.name to a name of its own",
                retry=True,
            )
        if only_if_drifted and held:
            if current is None:
                repaired = ["topic"]
            else:
                # EndpointArgs echoes values unescaped (an "&" in opaqueData splits it);
                # the OpaqueData attribute is the value itself. Ceph 20 keeps only the
                # attributes it does not know there: persistent, OpaqueData, Policy and the
                # queue's limits are fields of their own.
                args = {
                    **current.endpoint_args,
                    **current.queue_limits,
                    "OpaqueData": current.opaque_data,
                    "persistent": "true" if current.persistent else "false",
                }
                if current.policy:
                    args["Policy"] = current.policy
                repaired = differences(attributes, current.endpoint_address, args)
            if not repaired:
                return outcome(True, "Synced", f"gateway topic {arn} is in sync")
        try:
            arn = await gateway.write(gateway.topics.upsert, topic_name, attributes)
        except GatewayInvalidArgument as exc:
            moved = _name_after_refusal(
                namespace, name, parsed, topic_name, owner, claims_of, release
            )
            if moved is None:
                raise GatewayInvalidArgument(
                    str(exc) + _credentials_hint(attributes, connection.endpoint)
                ) from None
            # The Topic's bucket notifications follow the new ARN at their next drift check;
            # the old gateway topic stays until then, so no event in between goes nowhere.
            logger.warning(
                "the gateway refused gateway topic name %r of Topic %s/%s (%s): moving it to %r",
                topic_name,
                namespace,
                name,
                exc,
                moved,
            )
            topic_name = moved
            arn = await gateway.write(gateway.topics.upsert, topic_name, attributes)
            repaired = ["name"]
        finally:
            # Even a failed write may have changed it.
            gateway.listing.forget(topic_name)
        if (
            held
            and arn is not None
            and probe != arn
            and arn_topic_name(arn) == arn_topic_name(probe) == topic_name
        ):
            # Same name, another ARN: the gateway user now lives in an account (Ceph 19+),
            # whose CreateTopic made the account's topic. The old one is the user's still,
            # and notifications may name it until their next check: left, and said.
            logger.warning(
                "gateway topic of Topic %s/%s is now %s (its gateway user's account changed);"
                " the topic it had, %s, is left on the gateway: delete it as that user once"
                " the Topic's BucketNotifications name the new one",
                namespace,
                name,
                arn,
                probe,
            )
    except NotReconcilable as exc:
        refused = outcome(False, exc.reason, str(exc), retry=exc.retry)
        if exc.reason == "NameConflict" and status.get("arn"):
            # The gateway topic is another Topic's: deleting this one must not remove it.
            refused.status["arn"] = None
        return refused
    except GatewayForeignTopic as exc:
        refused = outcome(
            False,
            exc.reason,
            f"the gateway topic belongs to another gateway user ({exc}); set spec.name to a"
            " name of its own, or give gatewayRef that user's keys",
            retry=True,
        )
        # Not this Topic's: deleting the Topic must not try to remove it.
        refused.status["arn"] = None
        return refused
    except GatewayError as exc:
        return outcome(False, exc.reason, str(exc), retry=True)
    return outcome(True, "Synced", f"gateway topic {arn} is in sync", repaired=repaired)


def _name_after_refusal(
    namespace: str,
    name: str,
    spec: TopicSpec,
    refused: str,
    owner: dict[str, Any] | None,
    claims_of: ClaimsOf,
    release: GatewayRelease,
) -> str | None:
    """The name a Topic moves to when the gateway refused the one it held, or None.

    Only a name the operator chose once (``<namespace>.<name>``, the default of the
    development builds before 0.1.0.dev0, which 0.1.0.dev0 keeps) moves; ``spec.name`` is
    the user's and stays refused with the gateway's reason. Ceph 19+ refuses the names
    16.2 and 18 took.
    """
    # Only a release that refuses such names (a refusal for another reason, credentials
    # over plain HTTP say, must not move the Topic); unknown: the refusal may be the name's.
    if release.major is not None and not release.refuses_dotted_topic_names:
        return None
    if spec.name or GATEWAY_TOPIC_NAME.fullmatch(refused):
        return None
    created = str(((owner or {}).get("metadata") or {}).get("creationTimestamp") or "")
    try:
        moved = gateway_topic_name(namespace, name, spec, None, created, claims_of)
    except TopicBuildError:
        return None
    return moved if moved != refused else None


def _credentials_hint(attributes: dict[str, str], gateway_endpoint: str) -> str:
    # Ceph answers a bare 400 (its log says "sending password over insecure transport"):
    # without this the user cannot tell why an allowed cleartext Topic is refused.
    if gateway_endpoint.startswith("https://"):
        return ""
    if urlsplit(attributes.get(PUSH_ENDPOINT, "")).password is None:
        return ""
    return (
        " (the push-endpoint carries broker credentials and the gateway connection is not"
        " HTTPS: Ceph refuses credentials on a request that did not reach it over HTTPS;"
        " use an https:// gateway or persistent: true)"
    )


async def delete_topic(
    *,
    kube: Kube,
    settings: OperatorSettings,
    gateways: GatewayPool,
    namespace: str,
    spec: dict[str, Any],
    status: dict[str, Any],
) -> None:
    """Delete the gateway topic this Topic created; gone already is fine.

    Raises GatewayError (retry) or NotReconcilable (cannot even say which gateway).
    """
    arn = status.get("arn")
    if not arn:
        return  # never created on the gateway
    parsed = parse_spec(spec)
    try:
        connection = await gateway_connection(kube, namespace, parsed.gateway_ref, settings)
    except SecretMissing as exc:
        raise NotReconcilable("SecretNotFound", str(exc)) from None
    gateway = await gateways.get(connection)
    try:
        await gateway.write(gateway.topics.delete, arn)
    finally:
        gateway.listing.forget(arn_topic_name(arn))
