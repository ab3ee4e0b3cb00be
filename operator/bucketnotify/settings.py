"""Operator settings: read from BUCKETNOTIFY_* environment variables (or a .env file)."""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DeliveryServiceSettings", "LogSettings", "OperatorSettings"]


class OperatorSettings(BaseSettings):
    """Everything the operator needs to know that is not in a custom resource."""

    model_config = SettingsConfigDict(
        env_prefix="BUCKETNOTIFY_", use_attribute_docstrings=True, frozen=True
    )

    gateway_endpoint: str | None = None
    """Default gateway URL for objects without gatewayRef (Helm: gateway.endpoint)."""
    gateway_access_key: str | None = None
    """Access key of the default gateway user."""
    gateway_secret_key: SecretStr | None = None
    """Secret key of the default gateway user."""
    gateway_region: str = "default"
    """Zonegroup name of the default gateway; RGW signs requests for it."""
    gateway_kind: Literal["ceph", "obs"] = "ceph"
    """Whose API the default gateway speaks: ``ceph`` (RGW) or ``obs`` (Huawei OBS:
    notifications to existing SMN topics by topicARN only; no Topics, no queue store)."""
    gateway_release: Literal["pacific", "quincy", "reef", "squid", "tentacle"] | None = None
    """The Ceph release of every gateway, for gateways behind a proxy that hides it; unset,
    the operator asks each gateway (its ``Server`` header, else what it answers)."""

    namespaces: list[str] = Field(default_factory=list)
    """Namespaces to watch (JSON list); empty watches the whole cluster."""

    drift_interval_seconds: float = Field(default=60.0, gt=0)
    """How often the gateway is compared with the spec and repaired. A minute keeps the
    gateway calls of a thousand Topics below twenty a second."""
    delivery_namespace: str = "default"
    """Namespace of the delivery service (its Leases and health reports: the delivery
    replicas' ``BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE``)."""
    delivery_status_interval_seconds: float = Field(default=30.0, gt=0)
    """How often each persistent Topic's ``status.delivery`` and ``Delivering`` condition
    are brought up to date from the replicas' reports (written only when they changed)."""
    allow_cleartext_secrets: bool = False
    """Allow broker credentials over a transport without TLS. A gateway has its own rule
    for credentials in a CreateTopic it gets over plain HTTP (Ceph 16.2 refuses them)."""
    delete_give_up_after_seconds: float = Field(default=300.0, gt=0)
    """How long a deletion retries against an unreachable gateway before it releases the
    object and leaves the gateway topic behind (with a Warning event naming it)."""
    ingest_url: str | None = None
    """Base URL of the delivery service's ingest, for persistent topics."""
    owner_id: str = Field(default="", max_length=128, pattern=r"^[!-~]*$")
    """Who owns what this operator writes on a gateway, recorded in every gateway topic it
    makes (attribute ``bucketnotify-owner``): a notification Id whose entry names a topic of
    another owner is never taken. Unset: the UID of the cluster's kube-system namespace,
    which differs between clusters and outlives reinstalls. Set it when two operators of
    one cluster (two releases) share a gateway."""

    leader_election: bool = True
    """Only the replica holding the Lease reconciles."""
    leader_election_namespace: str = "default"
    """Namespace of the leader-election Lease."""
    leader_election_lease: str = "bucketnotify-operator"
    """Name of the leader-election Lease."""
    leader_election_owner: str | None = Field(default=None, min_length=1, max_length=253)
    """The operator's Deployment (in ``leader_election_namespace``): the leader Lease names
    it as its owner, so deleting it (``helm uninstall``) deletes the Lease. Unset: it stays."""
    lease_duration_seconds: int = Field(default=15, ge=2)
    """A leader that stops renewing is replaced after this long."""
    renew_deadline_seconds: int = Field(default=10, ge=2)
    """A leader that could not renew for this long stops reconciling (before its Lease
    can expire, so two leaders never act at once)."""
    retry_period_seconds: int = Field(default=2, ge=1)
    """Interval of renewals and of attempts to take the Lease."""
    metrics_port: int = Field(default=9090, ge=0, le=65535)
    """Port of the operator's HTTP server (all addresses): ``GET /metrics`` (Prometheus),
    ``GET /healthz`` and ``GET /readyz``; 0 turns it off. Followers serve it too (their
    counters stay at 0)."""
    webhook_port: int = Field(default=0, ge=0, le=65535)
    """Port of the validating admission webhook (HTTPS, all addresses, ``POST /validate``);
    0 turns it off. Every replica serves it, leader or not."""
    webhook_cert_dir: str = "/var/run/bucketnotify/webhook"
    """Directory with the webhook's ``tls.crt`` and ``tls.key``; re-read when they change."""
    identity: str | None = None
    """This replica's name in the leader Lease and in kopf; defaults to host name and
    process id (the chart sets the pod name). Set, nothing asks the user database, which a
    container's numeric user may not be in."""


class DeliveryServiceSettings(BaseSettings):
    """Settings of one delivery replica (BUCKETNOTIFY_DELIVERY_* environment variables)."""

    model_config = SettingsConfigDict(
        env_prefix="BUCKETNOTIFY_DELIVERY_", use_attribute_docstrings=True, frozen=True
    )

    listen_host: str = "127.0.0.1"
    """Address of the ingest server (0.0.0.0 in a pod)."""
    listen_port: int = Field(default=8085, ge=1, le=65535)
    """Port of the ingest server."""
    advertise_host: str | None = None
    """Where the other replicas reach this one's ingest port (the pod IP in a pod), put on
    its member Lease: they send wake-ups there when they commit to a shard this one owns.
    Defaults to ``listen_host`` unless that is a wildcard; without any, this replica polls
    its empty shards every ``idle_poll_max_seconds`` instead of waiting to be woken."""
    identity: str | None = None
    """Replica name in Leases; defaults to host name and process id (set it to the pod name)."""
    store: str = "dir:///var/lib/bucketnotify/queues"
    """Queue store: dir://<absolute path> (one replica) or s3://<bucket> on the default
    gateway (BUCKETNOTIFY_GATEWAY_*), shared by all replicas."""
    direct_delivery: bool = True
    """An event for an empty shard is pushed to its endpoint by the shard's owner before the
    ingest answers (another replica hands it the request), and queued only if that push
    fails (docs/operator.md, "Direct delivery"). Off on one replica, the others queue every
    event too (its member Lease says it commits to their shards without telling them)."""
    lease_namespace: str = "default"
    """Namespace of the ownership Leases."""
    lease_owner: str | None = Field(default=None, min_length=1, max_length=253)
    """The replicas' Deployment (in ``lease_namespace``): every ownership Lease names it as
    its owner, so deleting it (``helm uninstall``) deletes them. Unset: the Leases stay."""
    partitions: int = Field(default=32, ge=1, le=1024)
    """Ownership units (see delivery/peers/ownership.py)."""
    lease_duration_seconds: int = Field(default=12, ge=2)
    """A dead replica's Leases expire this long after its last renewal; the survivors take
    them at their next renewal, so failover takes at most lease duration + renew interval
    (15 s with the defaults; the gateway's cls locks: 90 s)."""
    renew_interval_seconds: float = Field(default=3.0, gt=0)
    """Lease renewal and rebalancing interval. Cluster-wide Lease writes per second:
    (partitions + replicas) / interval, about 12/s with the defaults and 3 replicas,
    whatever the number of Topics."""
    renew_deadline_seconds: float = Field(default=8.0, gt=0)
    """Processing stops this long after the last successful renewal: between the renew
    interval and the lease duration, so a replica that cannot renew stops before anyone may
    take its partitions."""
    namespaces: list[str] = Field(default_factory=list)
    """Namespaces whose persistent Topics to serve (JSON list); empty: all."""
    refresh_interval_seconds: float = Field(default=3.0, gt=0)
    """How often the Topics are listed (new ones are also looked up on their first event)."""
    secret_refresh_seconds: float = Field(default=30.0, gt=0)
    """How often the Secrets of an unchanged Topic (token, credentials, CA) are read again:
    a rotated Secret takes effect within this long (a push with an ingest token the replica
    does not know reads the token Secret at once)."""
    token_overlap_seconds: float = Field(default=600.0, ge=0)
    """How long a replaced ingest token is still taken, so the gateway's pushes made before
    the operator rewrote its topic are not refused."""
    idle_poll_max_seconds: float = Field(default=1.0, gt=0)
    """Longest poll interval of a shard whose entries all wait for their retry time (and of
    an empty shard when no ``advertise_host`` is known). Empty shards are not polled: a
    commit wakes them, on this replica directly, on another by a wake-up request."""
    sweep_interval_seconds: float = Field(default=30.0, gt=0)
    """How often deleted Topics' queues and drained queues are removed."""
    reservation_timeout_seconds: float = Field(default=30.0, gt=0)
    """A reservation not committed within this long (its writer died) stops counting
    against the queue's bounds and is reclaimed by the next survey (stats_interval)."""
    allow_cleartext_secrets: bool = False
    """Connect with broker credentials over plain AMQP or Kafka without TLS. Keep it equal
    to the operator's ``ALLOW_CLEARTEXT_SECRETS``: the operator refuses such Topics, this
    refuses to connect for a Topic edited after the operator accepted it."""
    stats_interval_seconds: float = Field(default=30.0, gt=0)
    """How often the owner of each queue's shard 0 surveys the queue (one LIST on the S3
    store): the persistent_topic_len and _size gauges (served on the ingest port, ``GET
    /metrics``), reclaiming abandoned reservations, and waking shards that hold entries,
    which bounds the delay of an event whose wake-up was lost."""
    health_report_interval_seconds: float = Field(default=30.0, gt=0)
    """How often each replica writes its delivery health report, the ConfigMap
    ``<group>-health-<hash of identity>`` in ``lease_namespace`` the operator makes each
    persistent Topic's ``status.delivery`` and ``Delivering`` condition of (also written
    when the partitions it owns change). A replica's report older than two intervals (and
    15 s) counts as gone."""
    records: str = "auto"
    """Where delivery records go (docs/records.md): ``auto`` next to the queue store
    (``s3://<bucket>/records`` or the directory ``records`` beside a dir:// store), ``off``,
    ``dir://<absolute path>`` or ``s3://<bucket>[/<prefix>]`` on the default gateway. On by
    default: the reports of the Spark job are made from them."""
    records_flush_seconds: float = Field(default=5.0, gt=0)
    """How often buffered records are written: one object per partition hour and flush,
    so a replica writes about 720 small objects an hour at most while busy."""
    records_batch_size: int = Field(default=5000, ge=1)
    """Records per file at most; this many waiting are written at once, before the flush
    interval is up."""
    records_buffer_max: int = Field(default=50_000, ge=1)
    """Records held in memory at most (about 0.5 KiB each) while the records store cannot
    be written; beyond it the oldest are dropped and counted. At least the batch size."""

    @model_validator(mode="after")
    def _deadline_between_renewal_and_expiry(self) -> DeliveryServiceSettings:
        if not (
            self.renew_interval_seconds < self.renew_deadline_seconds < self.lease_duration_seconds
        ):
            raise ValueError(
                "need RENEW_INTERVAL_SECONDS < RENEW_DEADLINE_SECONDS < LEASE_DURATION_SECONDS"
                f" (got {self.renew_interval_seconds}, {self.renew_deadline_seconds},"
                f" {self.lease_duration_seconds}): a replica must stop before its Lease expires"
            )
        return self

    @property
    def advertised_address(self) -> str | None:
        """``host:port`` for the member Lease, or None when no reachable host is known."""
        host = self.advertise_host
        if host is None and not _wildcard(self.listen_host):
            host = self.listen_host
        if not host:
            return None
        return f"[{host}]:{self.listen_port}" if ":" in host else f"{host}:{self.listen_port}"

    @model_validator(mode="after")
    def _records_batch_fits_the_buffer(self) -> DeliveryServiceSettings:
        if self.records_batch_size > self.records_buffer_max:
            raise ValueError(
                f"RECORDS_BATCH_SIZE ({self.records_batch_size}) must not exceed"
                f" RECORDS_BUFFER_MAX ({self.records_buffer_max})"
            )
        return self


def _wildcard(host: str) -> bool:
    """All addresses of the machine (0.0.0.0, ::): nobody can reach it under that name."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return not host


class LogSettings(BaseSettings):
    """Logging of the operator and the delivery service (BUCKETNOTIFY_LOG_* variables; the
    commands' --log-format and --log-level win)."""

    model_config = SettingsConfigDict(
        env_prefix="BUCKETNOTIFY_LOG_", use_attribute_docstrings=True, frozen=True
    )

    format: Literal["auto", "json", "plain"] = "auto"
    """json: one JSON object per line (kopf's field names), for log collectors; plain: for
    people; auto: plain on a terminal, JSON otherwise (so JSON in a pod)."""
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Lowest level written. Secrets are redacted at every level."""


def default_identity() -> str:
    """A process's name in Leases and Events when none is set: host name and process id."""
    return f"{socket.gethostname()}-{os.getpid()}"
