"""Rook's CephBucketTopic and CephBucketNotification as our Topic and BucketNotification:
``bucketnotify import rook``, for a platform team moving from Rook's notification CRDs.

Pure: documents in (as ``kubectl get -o yaml`` prints them, Lists included), documents and
problems out. Field by field as Rook's ``ceph.rook.io/v1`` types define them; what has no
counterpart, or needs a person's choice, is a problem naming the object and the field,
and that object is left out rather than half converted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bucketnotify.api.common import API_VERSION

__all__ = ["Conversion", "convert"]

ROOK_API = "ceph.rook.io/v1"
CLAIM = ("objectbucket.io/v1alpha1", "ObjectBucketClaim")
NOTIFICATION_LABEL = "bucket-notification-"
"""Rook binds a CephBucketNotification to the bucket of every ObjectBucketClaim labelled
``bucket-notification-<name>: <name>``."""


@dataclass
class Conversion:
    objects: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """One line each: the Rook object, and what to do about it."""


def convert(documents: Iterable[Any], gateway_secret: str | None = None) -> Conversion:
    """Our objects for Rook's among ``documents``; a Topic gets ``gatewayRef`` to
    ``gateway_secret`` (a CephObjectStoreUser's Secret of the store) if given."""
    items = [d for d in _flatten(documents) if isinstance(d, dict)]
    done = Conversion()
    claims = [i for i in items if (i.get("apiVersion"), i.get("kind")) == CLAIM]
    for item in items:
        if item.get("apiVersion") != ROOK_API:
            continue
        if item.get("kind") == "CephBucketTopic":
            _topic(item, gateway_secret, done)
        elif item.get("kind") == "CephBucketNotification":
            _notifications(item, claims, done)
    if not done.objects and not done.problems:
        done.problems.append(
            "no CephBucketTopic or CephBucketNotification in the input"
            " (kubectl get cephbuckettopics,cephbucketnotifications,obc -o yaml)"
        )
    return done


def _flatten(documents: Iterable[Any]) -> Iterable[Any]:
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == "List":
            yield from _flatten(document.get("items") or [])
        else:
            yield document


def _meta(item: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    meta = item.get("metadata") or {}
    out = {"name": name or meta.get("name")}
    if meta.get("namespace"):
        out["namespace"] = meta["namespace"]
    return out


def _where(item: dict[str, Any]) -> str:
    meta = item.get("metadata") or {}
    namespace = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{item.get('kind')} {namespace}{meta.get('name', '?')}"


def _topic(item: dict[str, Any], gateway_secret: str | None, done: Conversion) -> None:
    spec = item.get("spec") or {}
    endpoint = spec.get("endpoint") or {}
    where = _where(item)
    ours: dict[str, Any] = {}
    if "http" in endpoint:
        http = endpoint["http"] or {}
        ours = {"http": {"url": http.get("uri")}}
        if http.get("disableVerifySSL"):
            ours["http"]["verifySSL"] = False
        if http.get("sendCloudEvents"):
            ours["http"]["cloudEvents"] = True
    elif "amqp" in endpoint:
        amqp = endpoint["amqp"] or {}
        url, has_credentials = _without_credentials(amqp.get("uri", ""))
        if has_credentials:
            done.problems.append(
                f"{where}: spec.endpoint.amqp.uri carries a user and password; put them in a"
                " Secret (keys username, password) and name it in the Topic's"
                " endpoint.amqp.credentialsRef.secretName: left out"
            )
            return
        ours = {"amqp": {"url": url, "exchange": amqp.get("exchange")}}
        if amqp.get("disableVerifySSL"):
            ours["amqp"]["verifySSL"] = False
        if amqp.get("ackLevel"):
            # Rook's enum spells it "routeable", its sample "routable": ours is the latter.
            level = "routable" if amqp["ackLevel"] == "routeable" else amqp["ackLevel"]
            ours["amqp"]["ackLevel"] = level
    elif "kafka" in endpoint:
        kafka = endpoint["kafka"] or {}
        url, has_credentials = _without_credentials(kafka.get("uri", ""))
        if has_credentials or kafka.get("userSecretRef") or kafka.get("passwordSecretRef"):
            done.problems.append(
                f"{where}: Kafka credentials (in the URI or userSecretRef/passwordSecretRef)"
                " go in one Secret named by the Topic's endpoint.kafka.sasl.credentialsRef,"
                " with sasl.mechanism: left out"
            )
            return
        ours = {"kafka": {"url": url}}
        for key in ("useSSL", "ackLevel"):
            if key in kafka:
                ours["kafka"][key] = kafka[key]
        if kafka.get("disableVerifySSL"):
            ours["kafka"]["verifySSL"] = False
    else:
        done.problems.append(f"{where}: spec.endpoint has no http, amqp or kafka: left out")
        return
    topic: dict[str, Any] = {"endpoint": ours}
    for key in ("persistent", "opaqueData"):
        if spec.get(key):
            topic[key] = spec[key]
    if gateway_secret:
        topic["gatewayRef"] = {"secretName": gateway_secret}
    done.objects.append(
        {"apiVersion": API_VERSION, "kind": "Topic", "metadata": _meta(item), "spec": topic}
    )


def _without_credentials(uri: str) -> tuple[str, bool]:
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri, False
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc)), True


def _notifications(item: dict[str, Any], claims: list[dict[str, Any]], done: Conversion) -> None:
    """One BucketNotification per bucket Rook binds ``item`` to: the buckets of the claims
    in its namespace labelled for it."""
    spec = item.get("spec") or {}
    meta = item.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    where = _where(item)
    ours: dict[str, Any] = {"topicRef": {"name": spec.get("topic")}}
    if spec.get("events"):
        ours["events"] = list(spec["events"])
    rook_filter = spec.get("filter") or {}
    filter_: dict[str, Any] = {}
    key: dict[str, str] = {}
    for rule in rook_filter.get("keyFilters") or []:
        if rule.get("name") in key:
            done.problems.append(f"{where}: two {rule['name']} key filters: left out")
            return
        key[rule.get("name")] = rule.get("value")
    if key:
        filter_["key"] = key
    for theirs, mine in (("metadataFilters", "metadata"), ("tagFilters", "tags")):
        rules = rook_filter.get(theirs) or []
        if rules:
            filter_[mine] = [{"name": r.get("name"), "value": r.get("value")} for r in rules]
    if filter_:
        ours["filter"] = filter_
    bound = [
        c
        for c in claims
        if (c.get("metadata") or {}).get("namespace") == namespace
        and ((c.get("metadata") or {}).get("labels") or {}).get(f"{NOTIFICATION_LABEL}{name}")
        == name
    ]
    if not bound:
        done.problems.append(
            f"{where}: no ObjectBucketClaim in the input is labelled"
            f" {NOTIFICATION_LABEL}{name}={name}: pass the claims too (kubectl get obc -o yaml)"
            " or write spec.bucket or spec.bucketRef yourself: left out"
        )
        return
    for claim in bound:
        claim_name = (claim.get("metadata") or {}).get("name")
        one = len(bound) == 1
        # The claim, not its bucket's name: the notification follows it (a claim bound
        # later, a bucket name the provisioner generated), as Rook's binding does.
        done.objects.append(
            {
                "apiVersion": API_VERSION,
                "kind": "BucketNotification",
                "metadata": _meta(item, name if one else f"{name}-{claim_name}"),
                "spec": {"bucketRef": {"objectBucketClaim": claim_name}, **ours},
            }
        )
