"""deploy/samples as a user would apply them (``kubectl kustomize``), pointed at this machine:
the HTTP Topic at the demo's receiver, the AMQP and Kafka Topics at the local brokers
(no TLS there), the credentials Secrets at the local brokers' users."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

import yaml

from demo.console import DemoError
from devstack.services import REPO, Service

SAMPLES = REPO / "deploy" / "samples"
BUCKET = "uploads"
HTTP_TOPIC = "webhook"
AMQP_TOPIC = "orders-amqp"
KAFKA_TOPIC = "audit-kafka"
TOPICS = (HTTP_TOPIC, AMQP_TOPIC, KAFKA_TOPIC)

Obj = dict[str, Any]


@dataclass(frozen=True)
class Brokers:
    """Where the rewritten samples deliver, and what the demo listens on."""

    receiver_url: str
    rabbitmq: Service
    kafka: Service

    @property
    def amqp_url(self) -> str:
        return f"amqp://{self.rabbitmq['AMQP_HOST']}:{self.rabbitmq['AMQP_PORT']}"

    @property
    def kafka_sasl(self) -> str:
        return self.kafka["KAFKA_SASL_BOOTSTRAP"]


def render(kubectl_binary: str) -> list[Obj]:
    result = subprocess.run(
        [kubectl_binary, "kustomize", str(SAMPLES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise DemoError(f"kubectl kustomize {SAMPLES} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def for_this_machine(objs: list[Obj], brokers: Brokers, namespace: str) -> list[Obj]:
    """The samples with their cluster addresses replaced by the local ones; everything else
    (filters, delivery settings, routing key, Kafka topic, SASL mechanism) as shipped."""
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    expected = {
        ("Topic", HTTP_TOPIC),
        ("Topic", AMQP_TOPIC),
        ("Topic", KAFKA_TOPIC),
        ("Secret", "amqp-credentials"),
        ("Secret", "kafka-credentials"),
    }
    missing = expected - by_name.keys()
    if missing:
        raise DemoError(f"deploy/samples no longer has {sorted(missing)}: update demo/samples.py")
    for obj in objs:
        obj["metadata"]["namespace"] = namespace

    http = by_name["Topic", HTTP_TOPIC]["spec"]["endpoint"]["http"]
    http["url"] = brokers.receiver_url

    amqp = by_name["Topic", AMQP_TOPIC]["spec"]["endpoint"]["amqp"]
    amqp["url"] = brokers.amqp_url
    # RabbitMQ here has vhosts "/" and "bucketnotify"; the sample's "events" is not one.
    amqp["vhost"] = "/"
    amqp.pop("caRef", None)
    by_name["Secret", "amqp-credentials"]["stringData"] = {
        "username": brokers.rabbitmq["AMQP_USER"],
        "password": brokers.rabbitmq["AMQP_PASSWORD"],
    }

    kafka = by_name["Topic", KAFKA_TOPIC]["spec"]["endpoint"]["kafka"]
    kafka["url"] = f"kafka://{brokers.kafka_sasl}"
    kafka["brokers"] = [brokers.kafka_sasl]
    kafka["useSSL"] = False  # the SASL_PLAINTEXT listener: SCRAM without TLS
    kafka.pop("caRef", None)
    by_name["Secret", "kafka-credentials"]["stringData"] = {
        "username": brokers.kafka["KAFKA_SCRAM_USER"],
        "password": brokers.kafka["KAFKA_SCRAM_PASSWORD"],
    }

    buckets = {o["spec"]["bucket"] for o in objs if o["kind"] == "BucketNotification"}
    if buckets != {BUCKET}:
        raise DemoError(f"deploy/samples' notifications are on {sorted(buckets)}, not {BUCKET}")
    return objs


def exchange_of(objs: list[Obj]) -> tuple[str, str]:
    """The AMQP Topic's exchange and routing key (its endpointTopic)."""
    topic = next(o for o in objs if o["kind"] == "Topic" and o["metadata"]["name"] == AMQP_TOPIC)
    return topic["spec"]["endpoint"]["amqp"]["exchange"], topic["spec"]["endpointTopic"]


def kafka_topic_of(objs: list[Obj]) -> str:
    topic = next(o for o in objs if o["kind"] == "Topic" and o["metadata"]["name"] == KAFKA_TOPIC)
    name: str = topic["spec"]["endpointTopic"]
    return name


def describe(obj: Obj) -> str:
    """One line a person reads: what the object is, never a Secret's data."""
    kind, name, spec = obj["kind"], obj["metadata"]["name"], obj.get("spec", {})
    if kind == "Secret":
        return f"secret {name} (the local broker's user; its value is not printed)"
    if kind == "Topic":
        endpoint = spec["endpoint"]
        which = next(iter(endpoint))
        handoff = (spec.get("delivery") or {}).get("handoff", "persistent")
        extra = ""
        if which == "amqp":
            extra = f", exchange {endpoint['amqp']['exchange']}, key {spec['endpointTopic']}"
        if which == "kafka":
            sasl = endpoint["kafka"].get("sasl") or {}
            extra = f", topic {spec['endpointTopic']}, SASL {sasl.get('mechanism', '-')}"
        return f"topic {name}: {which} {endpoint[which]['url']}{extra} (handoff {handoff})"
    if kind == "BucketNotification":
        flt = spec.get("filter") or {}
        parts = [f"{k} {v}" for k, v in (flt.get("key") or {}).items()]
        parts += [f"{m['name']}={m['value']}" for m in flt.get("metadata") or []]
        parts += [f"tag {t['name']}={t['value']}" for t in flt.get("tags") or []]
        events = ",".join(spec.get("events") or ["every Created/Removed"])
        return (
            f"bucketnotification {name}: bucket {spec['bucket']} -> {spec['topicRef']['name']}"
            f" [{events}] {'; '.join(parts)}"
        )
    return f"{kind.lower()} {name}"
