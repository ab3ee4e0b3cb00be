"""No test secret appears anywhere a run leaves traces a person or a scraper can read.

A real operator and delivery replica carry persistent Topics with broker credentials (right
and wrong ones, AMQP and Kafka SASL) and a non-persistent Topic whose credentials go to the
gateway; a second operator, not allowed cleartext secrets, refuses the same Topics. Then
everything the run produced is scanned for the secrets: the processes' logs, Kubernetes
Events, the Topics' status, both /metrics pages and the admin CLI's topic list/get/stats/dump.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.parse
import urllib.request
import uuid
from typing import Any

import pytest

from tests.delivery import StartCluster, post_events
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import StartOperator
from tests.processes import free_port, run_cli
from tests.resources import apply, condition
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

WRONG_AMQP = f"wrong-amqp-{uuid.uuid4().hex}"
WRONG_KAFKA = f"wrong-kafka-{uuid.uuid4().hex}"
FORGED_TOKEN = f"forged-{uuid.uuid4().hex}"


def secret(kubectl: Kubectl, namespace: str, name: str, **data: str) -> None:
    kubectl.run(
        "create",
        "secret",
        "generic",
        name,
        "-n",
        namespace,
        *(f"--from-literal={k}={v}" for k, v in data.items()),
    )


def forms(value: str) -> set[str]:
    """The ways a secret could be written down: as is, URL-encoded, base64."""
    return {
        value,
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote_plus(value),
        base64.b64encode(value.encode()).decode(),
    }


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback URL
        text: str = answer.read().decode()
        return text


def test_no_secret_in_logs_events_status_metrics_or_cli_output(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rabbitmq: LocalService,
    kafka: LocalService,
    rgw: LocalService,
    kube: LocalService,
) -> None:
    strict = f"t-{uuid.uuid4().hex[:10]}"
    kubectl.run("create", "namespace", strict)
    cluster = delivery_cluster("dir")
    # The local brokers have no TLS: the replica, like the lenient operator, may send the
    # credentials in the clear (and must still never log them).
    replica = cluster.start("leaky", stats_interval_seconds="0.5", allow_cleartext_secrets="true")
    port = cluster.ports["leaky"]
    operator_port = free_port()
    lenient = start_operator(
        ingest_url=f"http://127.0.0.1:{port}",
        metrics_port=str(operator_port),
        allow_cleartext_secrets="true",
    )
    refusing = start_operator(
        namespaces=json.dumps([strict]),
        leader_election_namespace=strict,
        ingest_url=f"http://127.0.0.1:{port}",
    )

    amqp_url = f"amqp://{rabbitmq['AMQP_HOST']}:{rabbitmq['AMQP_PORT']}"
    kafka_url = f"kafka://{kafka['KAFKA_SASL_BOOTSTRAP']}"
    credentials = {
        "amqp-good": (rabbitmq["AMQP_USER"], rabbitmq["AMQP_PASSWORD"]),
        "amqp-bad": (rabbitmq["AMQP_USER"], WRONG_AMQP),
        "kafka-good": (kafka["KAFKA_SCRAM_USER"], kafka["KAFKA_SCRAM_PASSWORD"]),
        "kafka-bad": (kafka["KAFKA_SCRAM_USER"], WRONG_KAFKA),
    }
    for ns in (namespace, strict):
        for name, (user, password) in credentials.items():
            secret(kubectl, ns, name, username=user, password=password)

    def amqp(creds: str) -> dict[str, Any]:
        return {
            "amqp": {
                "url": amqp_url,
                "exchange": "amq.topic",
                "credentialsRef": {"secretName": creds},
            }
        }

    def kafka_endpoint(creds: str) -> dict[str, Any]:
        return {
            "kafka": {
                "url": kafka_url,
                "sasl": {"mechanism": "SCRAM-SHA-512", "credentialsRef": {"secretName": creds}},
            }
        }

    persistent = {"persistent": True, "delivery": {"handoff": "sync"}}
    delivering = {
        "mq-good": {"endpoint": amqp("amqp-good"), **persistent},
        "mq-bad": {"endpoint": amqp("amqp-bad"), **persistent},
        "kafka-good": {"endpoint": kafka_endpoint("kafka-good"), **persistent},
        "kafka-bad": {"endpoint": kafka_endpoint("kafka-bad"), **persistent},
    }
    # Its credentials go to the gateway inside the push-endpoint (over plain HTTP here).
    direct = {"mq-direct": {"endpoint": amqp("amqp-good")}}
    for name, spec in {**delivering, **direct}.items():
        apply(kubectl, namespace, "Topic", name, spec)
    tls_broker = {
        "amqp": {
            "url": f"amqps://{rabbitmq['AMQP_HOST']}:5671",
            "exchange": "amq.topic",
            "credentialsRef": {"secretName": "amqp-good"},
        }
    }
    refused = {
        "mq-good": ({"endpoint": amqp("amqp-good"), **persistent}, "an amqps:// url"),
        "kafka-good": ({"endpoint": kafka_endpoint("kafka-good"), **persistent}, "useSSL: true"),
        "direct-tls-broker": ({"endpoint": tls_broker}, "is not HTTPS"),
    }
    for name, (spec, _) in refused.items():
        apply(kubectl, strict, "Topic", name, spec)

    for name in delivering:
        condition(kubectl, namespace, "topic", name)
    # Ready, or refused by the gateway: either way it was sent the credentials.
    wait_until(
        lambda: (kubectl.get("topic", "mq-direct", namespace).get("status") or {}).get(
            "conditions"
        ),
        bool,
        40,
        "the direct topic reconciled",
    )
    for name, (_, words) in refused.items():
        status = condition(kubectl, strict, "topic", name, "False", "CleartextCredentials")
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert words in ready["message"], ready["message"]
        assert "arn" not in status

    tokens = {
        name: base64.b64decode(
            kubectl.get("secret", f"{name}-ingest-token", namespace)["data"]["token"]
        ).decode()
        for name in delivering
    }
    for name, token in tokens.items():
        url = f"http://127.0.0.1:{port}/v1/topics/{namespace}/{name}/{token}"
        wait_until(
            lambda url=url: post_events(url, [f"k-{uuid.uuid4().hex[:6]}"]),
            lambda status: status == 200,
            30,
            f"{name} takes events",
        )
        for i in range(3):
            assert post_events(url, [f"key-{i}"]) == 200
    forged = f"http://127.0.0.1:{port}/v1/topics/{namespace}/mq-good/{FORGED_TOKEN}"
    assert post_events(forged, ["x"]) == 403

    metrics_url = f"http://127.0.0.1:{port}/metrics"

    def attempted() -> dict[str, float]:
        text = fetch(metrics_url)
        return {
            name: sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(("pubsub_push_ok_total{", "pubsub_push_failed_total{"))
                and f'topic="{name}"' in line
            )
            for name in delivering
        }

    wait_until(attempted, lambda seen: all(seen.values()), 90, "every topic tried its broker")

    # Everything the run produced.
    produced: dict[str, str] = {
        "delivery log": replica.log(),
        "delivery metrics": fetch(metrics_url),
        "operator metrics": fetch(f"http://127.0.0.1:{operator_port}/metrics"),
    }
    for ns in (namespace, strict):
        produced[f"events {ns}"] = kubectl.run("get", "events", "-n", ns, "-o", "json").stdout
        produced[f"resources {ns}"] = kubectl.run(
            "get", "topics,bucketnotifications", "-n", ns, "-o", "json"
        ).stdout
    cli_env = {
        "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
        **{k: v for k, v in cluster.env.items() if k.startswith("BUCKETNOTIFY_DELIVERY_")},
    }
    commands = [("topic", "list", "-A"), ("topic", "list", "-n", namespace, "-o", "json")]
    for name in {**delivering, **direct}:
        commands.append(("topic", "get", name, "-n", namespace, "-o", "yaml"))
    for name in delivering:
        commands.append(("topic", "stats", name, "-n", namespace, "-o", "json"))
        commands.append(("topic", "dump", name, "-n", namespace))
    for command in commands:
        result = asyncio.run(run_cli(cli_env, *command))
        assert result.code == 0, (command, result.err)
        produced[f"cli {' '.join(command)}"] = result.out + result.err
    lenient.stop()
    refusing.stop()
    produced["operator log"] = lenient.log()
    produced["refusing operator log"] = refusing.log()

    secrets = {
        "AMQP password": rabbitmq["AMQP_PASSWORD"],
        "wrong AMQP password": WRONG_AMQP,
        "Kafka password": kafka["KAFKA_SCRAM_PASSWORD"],
        "wrong Kafka password": WRONG_KAFKA,
        "gateway secret key": rgw["RGW_SECRET_KEY"],
        "forged ingest token": FORGED_TOKEN,
        **{f"ingest token of {name}": token for name, token in tokens.items()},
    }
    leaks = [
        f"{what} in {where}"
        for what, value in secrets.items()
        for where, text in produced.items()
        if any(form in text for form in forms(value))
    ]
    sizes = {where: len(text) for where, text in produced.items()}
    print(f"\nscanned {sum(sizes.values())} characters from {len(produced)} sources: {sizes}")
    assert not leaks, leaks
    # The scan saw real output: the delivery service did report its brokers' refusals.
    assert "mq-bad" in produced["delivery log"] and "kafka-bad" in produced["delivery log"]
