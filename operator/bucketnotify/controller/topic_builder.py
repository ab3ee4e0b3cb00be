"""What to send to the gateway for a Topic: a pure function of the spec and its Secrets.

The attribute names are the reference's CreateTopic attributes. A non-persistent Topic is a
gateway topic pushing to the user's endpoint; a persistent one pushes to our delivery
service's ingest, which then owns retries, TTL and the endpoint's credentials.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit, urlunsplit

from bucketnotify.api.topic import AmqpEndpoint, KafkaEndpoint, TopicSpec

__all__ = [
    "Credentials",
    "TopicBuildError",
    "differences",
    "gateway_attributes",
    "gateway_topic_name",
    "ingest_endpoint",
    "ingest_token_secret",
    "referenced_secrets",
]

# The attributes we set and later compare with what the gateway reports.
PUSH_ENDPOINT = "push-endpoint"


@dataclass(frozen=True)
class Credentials:
    """A user name and password read from a Secret."""

    username: str
    password: str = field(repr=False)


class TopicBuildError(Exception):
    """The spec cannot be turned into a gateway topic; ``reason`` goes to the condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def gateway_topic_name(metadata_name: str, spec: TopicSpec) -> str:
    return spec.name or metadata_name


def referenced_secrets(spec: TopicSpec) -> set[str]:
    """Names of the Secrets (same namespace) whose change must re-sync the Topic."""
    names: set[str] = set()
    if spec.gateway_ref is not None:
        names.add(spec.gateway_ref.secret_name)
    endpoint = spec.endpoint
    if endpoint.amqp is not None and endpoint.amqp.credentials_ref is not None:
        names.add(endpoint.amqp.credentials_ref.secret_name)
    if endpoint.kafka is not None and endpoint.kafka.sasl is not None:
        names.add(endpoint.kafka.sasl.credentials_ref.secret_name)
    for ca in (
        endpoint.http and endpoint.http.ca_ref,
        endpoint.amqp and endpoint.amqp.ca_ref,
        endpoint.kafka and endpoint.kafka.ca_ref,
    ):
        if ca and ca.kind == "Secret":
            names.add(ca.name)
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


INGEST_TOKEN_KEY = "token"  # noqa: S105 - the key name in the Secret, not a secret


def ingest_token_secret(name: str) -> str:
    """The Secret holding the ingest token of persistent Topic ``name``."""
    return f"{name}-ingest-token"


def ingest_endpoint(ingest_url: str, namespace: str, name: str, token: str) -> str:
    """The delivery service's ingest URL of one persistent Topic (the token is its last
    path segment: the gateway keeps the push-endpoint URL whole, query strings included)."""
    base = ingest_url.rstrip("/")
    return f"{base}/v1/topics/{quote(namespace, safe='')}/{quote(name, safe='')}/{token}"


def gateway_attributes(
    spec: TopicSpec,
    *,
    credentials: Credentials | None,
    allow_cleartext_secrets: bool,
    ingest_url: str | None,
) -> dict[str, str]:
    """The CreateTopic attributes for ``spec``; ``ingest_url`` is the Topic's own ingest."""
    common: dict[str, str] = {}
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
        handoff = spec.delivery.handoff if spec.delivery else "persistent"
        return {
            **common,
            PUSH_ENDPOINT: ingest_url,
            "persistent": _bool(handoff == "persistent"),
        }

    endpoint = spec.endpoint
    chosen = endpoint.http or endpoint.amqp or endpoint.kafka
    if chosen is not None and chosen.ca_ref is not None:
        raise TopicBuildError(
            "Unsupported",
            "caRef needs persistent: true: the gateway reads CA files only from its own disk",
        )
    if endpoint.http is not None:
        kind_attributes = {
            PUSH_ENDPOINT: endpoint.http.url,
            "verify-ssl": _bool(endpoint.http.verify_ssl),
            "cloudevents": _bool(endpoint.http.cloud_events),
        }
    elif endpoint.amqp is not None:
        kind_attributes = _amqp(endpoint.amqp, credentials, allow_cleartext_secrets)
    else:
        assert endpoint.kafka is not None  # the schema requires exactly one endpoint
        kind_attributes = _kafka(endpoint.kafka, credentials, allow_cleartext_secrets)
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
