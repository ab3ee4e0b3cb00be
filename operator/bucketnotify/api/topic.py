"""The Topic custom resource: one gateway topic and where its notifications go.

Every attribute of the gateway's CreateTopic has a field here; ``build`` code elsewhere
maps them to the gateway's attribute names. Validation that the API server can do lives in
the schema (OpenAPI and CEL rules), so a bad object is refused at apply time.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal, NamedTuple, get_args

from pydantic import Field

from bucketnotify.api.common import (
    CARef,
    ClientCertificateRef,
    Condition,
    CredentialsRef,
    GatewayRef,
    Model,
    cel_rules,
    conditions_field,
)

__all__ = [
    "ENDPOINT_KINDS",
    "AmqpEndpoint",
    "ClientCertificate",
    "Credentials",
    "DeadLetterSettings",
    "DeliverySettings",
    "Endpoint",
    "HttpEndpoint",
    "KafkaEndpoint",
    "KafkaSasl",
    "Topic",
    "TopicSpec",
    "TopicStatus",
]

BROKER_PATTERN = r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$"

# CEL cost estimation needs bounded strings; URLs of any endpoint fit comfortably.
URL_MAX = 2048

NO_USERINFO = {
    "rule": "!self.url.matches('^[a-zA-Z][a-zA-Z0-9+.-]*://[^/]*@')",
    "message": "url must not contain user:password@; put credentials in credentialsRef (a Secret)",
}


def scheme_rule(*schemes: str) -> dict[str, str]:
    allowed = " || ".join(f"self.url.startsWith('{s}://')" for s in schemes)
    names = " or ".join(f"{s}://" for s in schemes)
    return {"rule": allowed, "message": f"url must start with {names}"}


EndpointKind = Literal["http", "amqp", "kafka"]
"""The endpoint kinds, each a field of ``Endpoint`` of that name."""
ENDPOINT_KINDS: tuple[EndpointKind, ...] = get_args(EndpointKind)


class HttpEndpoint(Model):
    """Push with HTTP POST of the event JSON."""

    model_config = cel_rules(
        scheme_rule("http", "https"),
        NO_USERINFO,
        {
            "rule": "!has(self.caRef) || self.url.startsWith('https://')",
            "message": "caRef needs an https:// url",
        },
        {
            "rule": "!has(self.clientCertificateRef) || self.url.startsWith('https://')",
            "message": "clientCertificateRef needs an https:// url",
        },
    )

    url: str = Field(max_length=URL_MAX)
    """http[s]://<fqdn>[:<port>][/<path>]; port defaults to 80 or 443."""
    verify_ssl: bool = Field(default=True, alias="verifySSL")
    """Validate the server certificate (gateway attribute verify-ssl)."""
    ca_ref: CARef | None = None
    """CA bundle that authenticates the server instead of the system CAs."""
    client_certificate_ref: ClientCertificateRef | None = None
    """Client certificate presented to the server (mutual TLS); persistent Topics only."""
    cloud_events: bool = False
    """Add CloudEvents binary-mode headers (gateway attribute cloudevents)."""


class AmqpEndpoint(Model):
    """Publish to an AMQP 0.9.1 exchange; the routing key is the endpoint topic."""

    model_config = cel_rules(
        scheme_rule("amqp", "amqps"),
        NO_USERINFO,
        {
            "rule": "!has(self.caRef) || self.url.startsWith('amqps://')",
            "message": "caRef needs an amqps:// url",
        },
        {
            "rule": "!has(self.clientCertificateRef) || self.url.startsWith('amqps://')",
            "message": "clientCertificateRef needs an amqps:// url",
        },
        {
            "rule": "!has(self.vhost) || !self.url.matches('^amqps?://[^/]+/.+')",
            "message": "set the vhost either in the url path or in vhost, not both",
        },
    )

    url: str = Field(max_length=URL_MAX)
    """amqp[s]://<fqdn>[:<port>][/<vhost>]; port defaults to 5672 or 5671."""
    exchange: str = Field(min_length=1, max_length=255)
    """Existing exchange that routes by topic (gateway attribute amqp-exchange)."""
    ack_level: Literal["none", "broker", "routable"] = "broker"
    """none: sent is delivered; broker: publisher confirm; routable: the broker could route it."""
    vhost: str | None = Field(default=None, min_length=1, max_length=255)
    """Virtual host; defaults to / (or the url's path)."""
    verify_ssl: bool = Field(default=True, alias="verifySSL")
    """Validate the broker certificate (amqps only)."""
    ca_ref: CARef | None = None
    """CA bundle that authenticates the broker instead of the system CAs."""
    client_certificate_ref: ClientCertificateRef | None = None
    """Client certificate presented to the broker (mutual TLS); persistent Topics only."""
    credentials_ref: CredentialsRef | None = None
    """User and password; the broker's default is guest/guest."""


SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"]


class KafkaSasl(Model):
    """SASL authentication towards the Kafka brokers."""

    mechanism: SaslMechanism = "PLAIN"
    """SASL mechanism (gateway attribute mechanism)."""
    credentials_ref: CredentialsRef
    """User and password (gateway attributes user-name and password)."""


class KafkaEndpoint(Model):
    """Produce to a Kafka topic named by the endpoint topic."""

    model_config = cel_rules(
        scheme_rule("kafka"),
        NO_USERINFO,
        {
            "rule": "!has(self.caRef) || self.useSSL",
            "message": "caRef needs useSSL: true",
        },
        {
            "rule": "!has(self.clientCertificateRef) || self.useSSL",
            "message": "clientCertificateRef needs useSSL: true",
        },
    )

    url: str = Field(max_length=URL_MAX)
    """kafka://<fqdn>[:<port>]; port defaults to 9092."""
    brokers: list[Annotated[str, Field(max_length=261, pattern=BROKER_PATTERN)]] = Field(
        default_factory=list, max_length=64
    )
    """More brokers of the same cluster, as host:port (gateway attribute kafka-brokers)."""
    use_ssl: bool = Field(default=False, alias="useSSL")
    """Connect with TLS (gateway attribute use-ssl)."""
    verify_ssl: bool = Field(default=True, alias="verifySSL")
    """Validate the broker certificate when useSSL is true."""
    ca_ref: CARef | None = None
    """CA bundle that authenticates the brokers instead of the system CAs."""
    client_certificate_ref: ClientCertificateRef | None = None
    """Client certificate presented to the brokers (mutual TLS); persistent Topics only."""
    ack_level: Literal["none", "broker"] = "broker"
    """none: sent is delivered; broker: wait for the broker's acknowledgement."""
    sasl: KafkaSasl | None = None
    """SASL authentication; omit for none."""


class Endpoint(Model):
    """Exactly one of http, amqp or kafka."""

    model_config = cel_rules(
        {
            "rule": "(has(self.http) ? 1 : 0) + (has(self.amqp) ? 1 : 0)"
            " + (has(self.kafka) ? 1 : 0) == 1",
            "message": "set exactly one endpoint: http, amqp or kafka",
        }
    )

    http: HttpEndpoint | None = None
    amqp: AmqpEndpoint | None = None
    kafka: KafkaEndpoint | None = None

    @property
    def kind(self) -> EndpointKind:
        if self.http is not None:
            return "http"
        if self.amqp is not None:
            return "amqp"
        return "kafka"

    def credentials_ref(self) -> tuple[CredentialsRef, str] | None:
        """The Secret holding the endpoint's user name and password, and where the spec
        names it; None when the endpoint takes none. The one place this is worked out, for
        the operator, the delivery service, the admission webhook and the CLI."""
        if self.amqp is not None and self.amqp.credentials_ref is not None:
            return self.amqp.credentials_ref, "spec.endpoint.amqp.credentialsRef"
        if self.kafka is not None and self.kafka.sasl is not None:
            return self.kafka.sasl.credentials_ref, "spec.endpoint.kafka.sasl.credentialsRef"
        return None

    def ca_ref(self) -> tuple[CARef, str] | None:
        """The ConfigMap or Secret holding the CA bundle the endpoint's server is verified
        with, and where the spec names it; None for the system's CAs."""
        chosen = self.http or self.amqp or self.kafka
        if chosen is None or chosen.ca_ref is None:
            return None
        return chosen.ca_ref, f"spec.endpoint.{self.kind}.caRef"

    def client_certificate_ref(self) -> tuple[ClientCertificateRef, str] | None:
        """The Secret holding the client certificate the endpoint presents, and where the
        spec names it; None when it presents none."""
        chosen = self.http or self.amqp or self.kafka
        if chosen is None or chosen.client_certificate_ref is None:
            return None
        return chosen.client_certificate_ref, f"spec.endpoint.{self.kind}.clientCertificateRef"

    def secret_names(self) -> set[str]:
        """The Secrets (in the Topic's namespace) the endpoint reads."""
        names = set()
        if (credentials := self.credentials_ref()) is not None:
            names.add(credentials[0].secret_name)
        if (ca := self.ca_ref()) is not None and ca[0].kind == "Secret":
            names.add(ca[0].name)
        if (client := self.client_certificate_ref()) is not None:
            names.add(client[0].secret_name)
        return names


class Credentials(NamedTuple):
    """What a ``credentialsRef`` holds: user name and password; the password never shows in
    a repr."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password='***')"


class ClientCertificate(NamedTuple):
    """What a ``clientCertificateRef`` holds: the PEM certificate chain, the PEM private key
    and the key's password; neither of the last two shows in a repr."""

    certificate: str
    private_key: str
    password: str | None = None

    def __repr__(self) -> str:
        return "ClientCertificate(certificate=..., private_key='***', password='***')"


class DeadLetterSettings(Model):
    """Dead letters kept in the queue store: listed, shown, redriven and purged with
    ``bucketnotify dead-letters``."""

    keep: bool = False
    """Keep the events this Topic drops (past timeToLive or maxRetries, or refused for good
    by the endpoint) in the queue store, beside or instead of a deadLetterTopic."""
    max_entries: int = Field(default=10_000, ge=1, le=1_000_000)
    """Dead letters kept at most; past it (or maxBytes) further drops are discarded, counted
    (bucketnotify_dead_letters_discarded_total), logged once and shown in
    status.delivery.deadLettersDiscardedTime."""
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    """Bytes of dead letters kept at most."""


class DeliverySettings(Model):
    """How the delivery service takes persistent topics over from the gateway."""

    handoff: Literal["sync", "persistent"] = "persistent"
    """sync: the S3 request waits for our durable commit (lowest latency, an event is lost
    when no delivery replica answers); persistent: the gateway queues and retries towards us
    (no loss while the delivery service is down)."""
    shards: int = Field(default=11, ge=1, le=1024)
    """Queue shards; events of one object always land in the same shard, in order."""
    max_queue_bytes: int = Field(default=128 * 1024 * 1024, ge=1024)
    """Bytes a topic's queue may hold before the ingest answers 503."""
    max_queue_entries: int = Field(default=1_000_000, ge=1)
    """Entries a topic's queue may hold before the ingest answers 503."""
    dead_letter_topic: str | None = Field(default=None, min_length=1, max_length=253)
    """Topic (same namespace) that receives events dropped by timeToLive or maxRetries."""
    dead_letters: DeadLetterSettings | None = None
    """Keep dropped events in the queue store, to list and redrive them."""
    retry_backoff: Literal["fixed", "exponential"] = "fixed"
    """The pause before an event's next attempt. fixed: retrySleepDuration every time, as
    the gateway does. exponential: retrySleepDuration (1 s when unset or 0) doubled with
    each retry, up to maxRetrySleepDuration, each pause drawn at random between half and
    all of that (jitter: events that failed together do not all come back together)."""
    max_retry_sleep_duration: int = Field(default=300, ge=1, le=86400)
    """Seconds: the longest pause of ``retryBackoff: exponential`` (before its jitter)."""
    failing_after: int = Field(default=60, ge=1, le=86400)
    """Seconds without a successful push, while pushes fail, before the Delivering condition
    turns False (reason EndpointFailing): one refused push must not flap it."""
    max_pending_age: int = Field(default=900, ge=1, le=30 * 86400)
    """Seconds the oldest pending event may wait before the Delivering condition turns False
    (reason BacklogTooOld)."""


AMQP_CONFIRMS_NEED_PERSISTENT = (
    "ackLevel broker or routable on a non-persistent Topic makes this gateway wait for the"
    " broker's confirm in its own AMQP client, which aborts the radosgw process (every S3"
    " request in flight fails; seen on a multipart upload's completion); set persistent:"
    " true (the delivery service waits for the confirm instead) or ackLevel: none"
)

CLOUD_EVENTS_NEED_PERSISTENT = (
    "cloudEvents on a non-persistent Topic needs a gateway of Ceph 18 or later: such a Topic"
    " is pushed by the gateway itself, and Ceph 16 and 17 accept the setting but send no"
    " ce-* headers; set persistent: true and the delivery service sends them"
    " (delivery.handoff: sync keeps each S3 request waiting for the hand-off, as the"
    " gateway's own push does)"
)


CLIENT_CERTIFICATE_NEEDS_PERSISTENT = (
    "clientCertificateRef needs persistent: true: a Topic the gateway pushes itself can"
    " present only a certificate kept in files on the gateway's own hosts (Ceph 20.2.3 and"
    " later, for Kafka only), which a Topic cannot name; with persistent: true the delivery"
    " service presents the Secret's certificate, on HTTP, AMQP and Kafka alike"
)


INGEST_TOKEN_SUFFIX = "-ingest-token"  # noqa: S105 - a Secret name suffix
"""A persistent Topic's ingest token is the Secret ``<name>-ingest-token``."""
PERSISTENT_NAME_MAX = 253 - len(INGEST_TOKEN_SUFFIX)
PERSISTENT_NAME_MESSAGE = (
    f"a persistent Topic's name is at most {PERSISTENT_NAME_MAX} characters: its ingest token"
    f" is the Secret <name>{INGEST_TOKEN_SUFFIX}, and a Secret's name at most 253; choose a"
    " shorter metadata.name (spec.name sets the gateway topic's name apart from it)"
)


class TopicSpec(Model):
    """Desired state of one gateway topic."""

    model_config = cel_rules(
        {
            "rule": "self.persistent || (!has(self.timeToLive) && !has(self.maxRetries)"
            " && !has(self.retrySleepDuration) && !has(self.delivery))",
            "message": "timeToLive, maxRetries, retrySleepDuration and delivery apply"
            " only to persistent topics; set persistent: true or remove them",
        },
        {
            "rule": "self.persistent || !(has(self.endpoint.http)"
            " && has(self.endpoint.http.clientCertificateRef) || has(self.endpoint.amqp)"
            " && has(self.endpoint.amqp.clientCertificateRef) || has(self.endpoint.kafka)"
            " && has(self.endpoint.kafka.clientCertificateRef))",
            "message": CLIENT_CERTIFICATE_NEEDS_PERSISTENT,
        },
        {
            "rule": "self.persistent || !has(self.endpointTopic)",
            "message": "endpointTopic needs persistent: true; without it the gateway uses the"
            " topic name (spec.name) as routing key or Kafka topic",
        },
        {
            "rule": "!has(oldSelf.name) || (has(self.name) && self.name == oldSelf.name)",
            "message": "name is immutable: create a new Topic to use another gateway name",
        },
    )

    name: str | None = Field(
        default=None, min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.-]+$"
    )
    """Topic name on the gateway; defaults to metadata.name. Immutable."""
    endpoint: Endpoint
    """Where notifications are pushed."""
    endpoint_topic: str | None = Field(default=None, min_length=1, max_length=255)
    """AMQP routing key or Kafka topic; defaults to the gateway topic name."""
    persistent: bool = False
    """Deliver asynchronously through the delivery service's persistent queues."""
    time_to_live: int | None = Field(default=None, ge=0)
    """Seconds an undelivered event is kept; 0 means forever (gateway time_to_live)."""
    max_retries: int | None = Field(default=None, ge=0)
    """Retries after the first delivery attempt before an event is dropped and counted lost
    (1 + maxRetries attempts in all); 0 means unlimited (gateway max_retries)."""
    retry_sleep_duration: int | None = Field(default=None, ge=0)
    """Seconds between retries of one event; 0 means no delay (retry_sleep_duration)."""
    opaque_data: str | None = Field(default=None, max_length=1024)
    """Copied into every event's opaqueData (gateway attribute OpaqueData)."""
    policy: dict[str, Any] | None = None
    """Topic access policy, a JSON document like a bucket policy (gateway attribute Policy)."""
    gateway_ref: GatewayRef | None = None
    """Gateway connection; defaults to the operator's."""
    delivery: DeliverySettings | None = None
    """Delivery service settings (persistent topics only)."""


class DeliveryStatus(Model):
    """How delivery goes, from the delivery replicas' reports (persistent Topics only)."""

    backlog_events: int | None = Field(default=None, ge=0)
    """Events in the queue at the last survey (two significant digits are kept up to date)."""
    backlog_bytes: int | None = Field(default=None, ge=0)
    """Bytes of those events."""
    oldest_pending_time: dt.datetime | None = None
    """Commit time of the oldest event still queued."""
    retrying: int | None = Field(default=None, ge=0)
    """Events the last rounds left queued: failed, waiting for their retry time, or behind
    such an event of their object (up to 1,024 counted per shard)."""
    last_success_time: dt.datetime | None = None
    """The last acknowledged push (kept to the minute)."""
    last_failure_time: dt.datetime | None = None
    """The last failed push."""
    last_failure_reason: str | None = Field(default=None, max_length=256)
    """The endpoint's answer or the error class of the last failure (never a credential)."""
    failing_since: dt.datetime | None = None
    """Pushes fail, none has succeeded since this time."""
    unserved_shards: list[int] | None = Field(default=None, max_length=1024)
    """Shards no delivery replica serves."""
    dead_letters: int | None = Field(default=None, ge=0)
    """Dead letters kept in the queue store (spec.delivery.deadLetters.keep)."""
    dead_letters_discarded_time: dt.datetime | None = None
    """The last time a dead letter was discarded because the kept ones reached
    spec.delivery.deadLetters.maxEntries or maxBytes."""


class TopicStatus(Model):
    """Observed state of the gateway topic."""

    observed_generation: int | None = None
    """The metadata.generation last reconciled."""
    conditions: list[Condition] = conditions_field()
    """Ready and the specific conditions."""
    arn: str | None = None
    """ARN of the gateway topic."""
    endpoint_kind: EndpointKind | None = None
    """Kind of the endpoint, for printing."""
    gateway_release: str | None = Field(default=None, max_length=32)
    """The Ceph release the gateway runs (``tentacle``, ``reef``, ``pacific``...), as the
    operator learned it; what the Topic may ask of the gateway depends on it."""
    delivery: DeliveryStatus | None = None
    """Delivery health (persistent Topics): see the Delivering condition."""
    last_handled_configuration: str | None = None
    """The spec, labels and annotations the operator last reconciled, as JSON: its change
    handlers diff the next version against it (kopf's diff base; in the status, so that
    recording it is part of the status write rather than another write of the object)."""


class Topic(Model):
    """A gateway topic."""

    spec: TopicSpec
    status: TopicStatus | None = None


# --- rules of a Topic both the operator and the delivery service apply --------------------

INGEST_TOKEN_KEY = "token"  # noqa: S105 - the key name in the Secret, not a secret
PREVIOUS_TOKEN_KEY = "previous-token"  # noqa: S105 - a key name, as above
"""Also taken by the ingest while the Secret holds it: set by whoever rotates the token, for
pushes the gateway queued with the old push-endpoint (docs/operator.md, token rotation)."""


def ingest_token_secret(name: str) -> str:
    """The Secret holding the ingest token of persistent Topic ``name``."""
    return f"{name}{INGEST_TOKEN_SUFFIX}"


def endpoint_topic_name(metadata_name: str, spec: TopicSpec) -> str:
    """The AMQP routing key or Kafka topic our delivery service uses for a persistent Topic.

    Deliberately not namespace-qualified: it names something on the user's own broker, and
    changing it would silently route existing Topics' events elsewhere."""
    return spec.endpoint_topic or spec.name or metadata_name


def broker_cleartext_refusal(spec: TopicSpec) -> str | None:
    """Why broker credentials of ``spec`` would cross a transport without TLS, or None.

    Shared by the operator (it refuses the Topic) and the delivery service (it refuses to
    connect): a Topic edited to a plain URL after the operator accepted it must not make
    the delivery service send the password in the clear before the operator reacts."""
    endpoint = spec.endpoint
    if endpoint.amqp is not None and not endpoint.amqp.url.startswith("amqps://"):
        kind = "AMQP"
    elif endpoint.kafka is not None and not endpoint.kafka.use_ssl:
        kind = "Kafka"
    else:
        return None
    return (
        f"{kind} credentials would cross a transport without TLS: use "
        + ("an amqps:// url" if kind == "AMQP" else "useSSL: true")
        + " or ask the operator's admin to allow cleartext secrets"
    )
