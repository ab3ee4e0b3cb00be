"""What to send to the gateway for a Topic: a pure function of the spec and its Secrets.

The attribute names are the reference's CreateTopic attributes. A non-persistent Topic is a
gateway topic pushing to the user's endpoint; a persistent one pushes to our delivery
service's ingest, which then owns retries, TTL and the endpoint's credentials.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

from bucketnotify.api.topic import (
    AMQP_CONFIRMS_NEED_PERSISTENT,
    CLOUD_EVENTS_NEED_PERSISTENT,
    AmqpEndpoint,
    Credentials,
    KafkaEndpoint,
    TopicSpec,
    broker_cleartext_refusal,
)
from bucketnotify.gateway.release import GatewayRelease

__all__ = [
    "GATEWAY_TOPIC_NAME",
    "OWNER",
    "QUEUE_WITHOUT_LIMITS",
    "NameClaim",
    "TopicBuildError",
    "arn_topic_name",
    "check_gateway_name",
    "default_gateway_topic_name",
    "differences",
    "gateway_attributes",
    "gateway_scope",
    "gateway_topic_name",
    "ingest_endpoint",
    "name_owner",
    "referenced_secrets",
    "wanted_gateway_topic_name",
]

# The topic names Ceph 19+ takes (AWS's rule); 16.2 and 18 take dots too.
TOPIC_NAME_MAX = 256
GATEWAY_TOPIC_NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{TOPIC_NAME_MAX}}}")

# The attributes we set and later compare with what the gateway reports.
PUSH_ENDPOINT = "push-endpoint"
# A persistent gateway topic that never gives up an event (0 = no limit): Ceph 20 acts on them.
QUEUE_WITHOUT_LIMITS = {"time_to_live": "0", "max_retries": "0"}
# Which operator made a gateway topic (OperatorSettings.owner_id). Ceph keeps attributes it
# does not know among the topic's endpoint arguments and reports them back; a bucket's
# notification entry names its topic, so this also says whose a notification Id is.
OWNER = "bucketnotify-owner"


class TopicBuildError(Exception):
    """The spec cannot be turned into a gateway topic; ``reason`` goes to the condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def default_gateway_topic_name(namespace: str, metadata_name: str) -> str:
    """``<namespace>_<name>``, the name's dots as ``_`` too: gateway topics belong to a
    tenant, not a namespace, so the bare name would let ``a/orders`` and ``b/orders`` share
    one gateway topic (and its persistent queue). Ceph 19 and later take only the AWS
    characters (letters, digits, ``_`` and ``-``, at most 256), every release takes these.
    Neither a namespace nor an object name has a ``_``, so the first one splits them and no
    two Topics get one name; a name too long for the rule ends in a digest of the whole."""
    name = f"{namespace}_{metadata_name.replace('.', '_')}"
    if len(name) <= TOPIC_NAME_MAX:
        return name
    digest = hashlib.sha256(f"{namespace}/{metadata_name}".encode()).hexdigest()[:12]
    return f"{name[: TOPIC_NAME_MAX - len(digest) - 1]}-{digest}"


def check_gateway_name(name: str, release: GatewayRelease | None) -> None:
    """TopicBuildError ``InvalidSpec`` when the gateway's release would refuse ``name``
    (Ceph 19+: AWS's characters only), with its rule; the gateway is not asked."""
    if release is None or not release.refuses_dotted_topic_names:
        return
    if not GATEWAY_TOPIC_NAME.fullmatch(name):
        raise TopicBuildError(
            "InvalidSpec",
            f"gateway topic name {name!r}: this gateway (Ceph {release.name}) takes only"
            f" letters, digits, '_' and '-', at most {TOPIC_NAME_MAX} characters; spec.name"
            " is immutable, so create a Topic with a name it takes",
        )


def arn_topic_name(arn: str) -> str:
    """The topic name an ARN (``arn:aws:sns:<zonegroup>:<tenant>:<name>``) ends with."""
    return arn.rsplit(":", 1)[-1]


def wanted_gateway_topic_name(
    namespace: str, metadata_name: str, spec: TopicSpec, arn: str | None
) -> str:
    """The name a Topic asks for before conflicts are settled (see ``gateway_topic_name``)."""
    if spec.name:
        return spec.name
    return arn_topic_name(arn) if arn else default_gateway_topic_name(namespace, metadata_name)


def gateway_scope(namespace: str, spec: TopicSpec) -> str:
    """Which gateway tenant a Topic's name lives in, as far as the operator can tell without
    reading Secrets: the operator's default gateway, or one gatewayRef Secret."""
    return "" if spec.gateway_ref is None else f"{namespace}/{spec.gateway_ref.secret_name}"


@dataclass(frozen=True)
class NameClaim:
    """A Topic wanting a gateway topic name; ``holds`` when it has created it already."""

    namespace: str
    name: str
    created: str
    """metadata.creationTimestamp (RFC 3339, so it sorts as text)."""
    holds: bool


def name_owner(claims: list[NameClaim]) -> NameClaim:
    """Who of several Topics wanting one gateway name gets it: one already holding it (the
    oldest, should several hold it: the development builds before 0.1.0.dev0 let Topics
    share a bare name), else the oldest; ties by
    namespace and name so that every replica and every retry decides alike."""
    return min(claims, key=lambda c: (not c.holds, c.created, c.namespace, c.name))


def gateway_topic_name(
    namespace: str,
    metadata_name: str,
    spec: TopicSpec,
    arn: str | None,
    created: str,
    claims_of: Callable[[str], list[NameClaim]],
) -> str:
    """The gateway topic name of a Topic, or TopicBuildError ``NameConflict``.

    ``spec.name`` when set; else the name of the gateway topic the Topic already has (a
    Topic of a development build before 0.1.0.dev0 keeps its bare or dotted name, as
    0.1.0.dev0 did);
    else ``<namespace>_<name>``. ``claims_of(name)`` lists the Topics wanting a name. A Topic
    that kept a bare name another Topic also held moves to ``<namespace>_<name>``: the two
    overwrote each other's endpoint before. An explicit ``spec.name`` is never moved.
    """
    default = default_gateway_topic_name(namespace, metadata_name)
    wanted = wanted_gateway_topic_name(namespace, metadata_name, spec, arn)
    held = arn is not None and arn_topic_name(arn) == wanted
    me = NameClaim(namespace, metadata_name, created, held)
    others = [c for c in claims_of(wanted) if (c.namespace, c.name) != (namespace, metadata_name)]
    owner = name_owner([me, *others])
    if owner == me:
        return wanted
    if not spec.name and wanted != default:
        return gateway_topic_name(namespace, metadata_name, spec, None, created, claims_of)
    raise TopicBuildError(
        "NameConflict",
        f"gateway topic name {wanted!r} belongs to Topic {owner.namespace}/{owner.name};"
        " set spec.name to a name of its own (or delete the other Topic)",
    )


def referenced_secrets(spec: TopicSpec) -> set[str]:
    """Names of the Secrets (same namespace) whose change must re-sync the Topic."""
    names: set[str] = set()
    if spec.gateway_ref is not None:
        names.add(spec.gateway_ref.secret_name)
    names |= spec.endpoint.secret_names()
    return names


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _with_userinfo(url: str, credentials: Credentials | None) -> str:
    if credentials is None:
        return url
    parts = urlsplit(url)
    userinfo = f"{quote(credentials.username, safe='')}:{quote(credentials.password, safe='')}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}"))


def _refuse_cleartext(
    kind: str, secure: bool, credentials: Credentials | None, allow: bool
) -> None:
    if credentials is not None and not secure and not allow:
        raise TopicBuildError(
            "CleartextCredentials",
            f"{kind} credentials would cross a transport without TLS: use "
            + ("an amqps:// url" if kind == "AMQP" else "useSSL: true")
            + " or ask the operator's admin to allow cleartext secrets",
        )


def _amqp(amqp: AmqpEndpoint, credentials: Credentials | None, allow: bool) -> dict[str, str]:
    secure = amqp.url.startswith("amqps://")
    _refuse_cleartext("AMQP", secure, credentials, allow)
    url = amqp.url
    if amqp.vhost is not None:
        parts = urlsplit(url)
        url = urlunsplit(parts._replace(path="/" + quote(amqp.vhost, safe="")))
    return {
        PUSH_ENDPOINT: _with_userinfo(url, credentials),
        "amqp-exchange": amqp.exchange,
        "amqp-ack-level": amqp.ack_level,
        "verify-ssl": _bool(amqp.verify_ssl),
    }


def _kafka(kafka: KafkaEndpoint, credentials: Credentials | None, allow: bool) -> dict[str, str]:
    _refuse_cleartext("Kafka", kafka.use_ssl, credentials, allow)
    attributes = {
        PUSH_ENDPOINT: _with_userinfo(kafka.url, credentials),
        "use-ssl": _bool(kafka.use_ssl),
        "verify-ssl": _bool(kafka.verify_ssl),
        "kafka-ack-level": kafka.ack_level,
    }
    if kafka.brokers:
        attributes["kafka-brokers"] = ",".join(kafka.brokers)
    if kafka.sasl is not None:
        attributes["mechanism"] = kafka.sasl.mechanism
    return attributes


def ingest_endpoint(ingest_url: str, namespace: str, name: str, token: str) -> str:
    """The delivery service's ingest URL of one persistent Topic (the token is its last
    path segment: the gateway keeps the push-endpoint URL whole, query strings included)."""
    base = ingest_url.rstrip("/")
    return f"{base}/v1/topics/{quote(namespace, safe='')}/{quote(name, safe='')}/{token}"


def _refuse_cleartext_to_gateway(
    credentials: Credentials | None, gateway_endpoint: str, allow: bool
) -> None:
    # The reference: user and password "must be provided only over HTTPS"; the gateway
    # refuses them otherwise, but only after the request carried them in the clear.
    if credentials is not None and not gateway_endpoint.startswith("https://") and not allow:
        raise TopicBuildError(
            "CleartextCredentials",
            f"the gateway connection ({gateway_endpoint}) is not HTTPS, and a non-persistent"
            " topic hands the broker credentials to the gateway: use an https:// gateway,"
            " persistent: true (the credentials then stay with the delivery service) or ask"
            " the operator's admin to allow cleartext secrets",
        )


def gateway_attributes(
    spec: TopicSpec,
    *,
    credentials: Credentials | None,
    allow_cleartext_secrets: bool,
    ingest_url: str | None,
    gateway_endpoint: str,
    owner_id: str | None = None,
    release: GatewayRelease | None = None,
) -> dict[str, str]:
    """The CreateTopic attributes for ``spec``; ``ingest_url`` is the Topic's own ingest,
    ``gateway_endpoint`` the URL the operator sends them to, ``owner_id`` the operator's
    mark (``OWNER``), ``release`` the gateway's Ceph release (None: not known).

    Credentials that would cross a transport without TLS (to the broker, or inside the
    CreateTopic request to the gateway) are refused unless ``allow_cleartext_secrets``.
    """
    common: dict[str, str] = {OWNER: owner_id} if owner_id else {}
    if spec.opaque_data is not None:
        common["OpaqueData"] = spec.opaque_data
    if spec.policy is not None:
        common["Policy"] = json.dumps(spec.policy, separators=(",", ":"), sort_keys=True)

    if spec.persistent:
        if not ingest_url:
            raise TopicBuildError(
                "DeliveryNotConfigured",
                "persistent topics are delivered by the delivery service, and the operator"
                " has no ingest URL (set BUCKETNOTIFY_INGEST_URL)",
            )
        # Our delivery service, not the gateway, talks to the broker: the same rule holds
        # (and the delivery service checks it again, see broker_cleartext_refusal).
        if credentials is not None and not allow_cleartext_secrets:
            refusal = broker_cleartext_refusal(spec)
            if refusal is not None:
                raise TopicBuildError("CleartextCredentials", refusal)
        handoff = spec.delivery.handoff if spec.delivery else "persistent"
        attributes = {
            **common,
            PUSH_ENDPOINT: ingest_url,
            "persistent": _bool(handoff == "persistent"),
        }
        if handoff == "persistent" and release is not None and release.queues_act_on_limits:
            # The gateway's queue only holds events on their way to our ingest; the Topic's
            # own timeToLive and maxRetries are the delivery service's, with dead letters.
            # Without these, a gateway-wide rgw_topic_persistency_* default would drop them.
            attributes.update(QUEUE_WITHOUT_LIMITS)
        return attributes

    endpoint = spec.endpoint
    if endpoint.ca_ref() is not None:
        raise TopicBuildError(
            "Unsupported",
            "caRef needs persistent: true: the gateway reads CA files only from its own disk",
        )
    if endpoint.http is not None:
        if endpoint.http.cloud_events and release is not None and not release.sends_cloud_events:
            raise TopicBuildError(
                "Unsupported",
                f"this gateway runs Ceph {release.name}: {CLOUD_EVENTS_NEED_PERSISTENT}",
            )
        kind_attributes = {
            PUSH_ENDPOINT: endpoint.http.url,
            "verify-ssl": _bool(endpoint.http.verify_ssl),
            "cloudevents": _bool(endpoint.http.cloud_events),
        }
    elif endpoint.amqp is not None:
        if (
            endpoint.amqp.ack_level != "none"
            and release is not None
            and release.aborts_on_amqp_confirms
        ):
            raise TopicBuildError(
                "Unsupported",
                f"this gateway runs Ceph {release.name}: {AMQP_CONFIRMS_NEED_PERSISTENT}",
            )
        kind_attributes = _amqp(endpoint.amqp, credentials, allow_cleartext_secrets)
    else:
        assert endpoint.kafka is not None  # the schema requires exactly one endpoint
        kind_attributes = _kafka(endpoint.kafka, credentials, allow_cleartext_secrets)
    _refuse_cleartext_to_gateway(credentials, gateway_endpoint, allow_cleartext_secrets)
    return {**common, **kind_attributes, "persistent": "false"}


def differences(
    desired: dict[str, str], endpoint_address: str, endpoint_args: dict[str, str]
) -> list[str]:
    """Names of the attributes the gateway holds differently from ``desired``."""
    changed = []
    for key, value in desired.items():
        actual = endpoint_address if key == PUSH_ENDPOINT else endpoint_args.get(key)
        if actual != value:
            changed.append(key)
    return changed
