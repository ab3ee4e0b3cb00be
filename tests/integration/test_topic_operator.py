"""The operator keeps gateway topics equal to Topic objects (real apiserver, real RGW)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bucketnotify.api.topic import ingest_token_secret
from bucketnotify.controller.finalizers import FINALIZER, OLD_FINALIZER
from bucketnotify.gateway.errors import GatewayAccessDenied
from bucketnotify.gateway.topics import GatewayTopic, TopicClient
from bucketnotify.kube import leadership
from bucketnotify.kube.apiserver import lease_path
from bucketnotify.settings import OperatorSettings
from devstack.servers.tcpproxy import TcpProxy
from tests.kubeapi import api_client
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import DRIFT_INTERVAL_S, StartOperator
from tests.processes import Program, free_port
from tests.resources import condition, credentials_secret, gateway_secret, rook_user_secret
from tests.s3 import connection, release_of
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

API = "bucketnotify.io/v1alpha1"


@pytest.fixture(scope="module")
def gateway(rgw: LocalService) -> TopicClient:
    return TopicClient(connection(rgw))


def topic(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "Topic", "metadata": {"name": name}, "spec": spec}


def ready(kubectl: Kubectl, namespace: str, name: str, status: str = "True") -> dict[str, Any]:
    def observe() -> dict[str, Any]:
        obj = kubectl.get("topic", name, namespace)
        return obj.get("status") or {}

    def done(st: dict[str, Any]) -> bool:
        conditions = {c["type"]: c for c in st.get("conditions", [])}
        return conditions.get("Ready", {}).get("status") == status

    return wait_until(observe, done, 30, f"topic {name} Ready={status}")


def ready_message(status: dict[str, Any]) -> str:
    message: str = {c["type"]: c for c in status["conditions"]}["Ready"]["message"]
    return message


def proxied_gateway(kubectl: Kubectl, namespace: str, secret: str, rgw: LocalService) -> TcpProxy:
    """A gateway Secret whose endpoint is a TCP proxy to the real gateway (not started):
    the test takes the gateway away and brings it back with the proxy."""
    target = urlsplit(rgw["RGW_ENDPOINT"])
    assert target.hostname is not None and target.port is not None
    proxy = TcpProxy(target.hostname, target.port)
    gateway_secret(
        kubectl, namespace, secret, proxy.url, rgw["RGW_ACCESS_KEY"], rgw["RGW_SECRET_KEY"]
    )
    return proxy


SASL_KAFKA: dict[str, Any] = {
    "endpoint": {
        "kafka": {
            "url": "kafka://127.0.0.1:9093",
            "useSSL": True,
            "sasl": {
                "mechanism": "SCRAM-SHA-512",
                "credentialsRef": {"secretName": "kafka-creds"},
            },
        }
    }
}
"""A non-persistent Kafka Topic whose credentials the gateway must hold (the Secret
``kafka-creds``)."""


def patch_secret_data(kubectl: Kubectl, namespace: str, name: str, **data: str) -> None:
    """Change keys of a Secret's data, as a user rotating it would."""
    patch = json.dumps({"stringData": data})
    kubectl.run("patch", "secret", name, "-n", namespace, "--type=merge", "-p", patch)


def events(kubectl: Kubectl, namespace: str) -> str:
    return kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout


def gateway_topic(gateway: TopicClient, arn: str) -> GatewayTopic:
    got = gateway.get(arn)
    assert got is not None, f"the gateway has no topic {arn}"
    return got


def test_each_endpoint_kind_reaches_the_gateway(
    kubectl: Kubectl, namespace: str, operator: Program, gateway: TopicClient, rgw: LocalService
) -> None:
    """Applied Topics become gateway topics with the reference's attributes, and go Ready."""
    # Where the gateway's own AMQP client aborts on confirms, the operator refuses them
    # (tests/integration/test_release_behaviour.py).
    ack = "none" if release_of(rgw).aborts_on_amqp_confirms else "routable"
    specs = {
        f"{namespace}-web": {
            "endpoint": {"http": {"url": "http://127.0.0.1:9/hook"}},
            "opaqueData": "team=web",
            "policy": {"Version": "2012-10-17", "Statement": []},
        },
        f"{namespace}-mq": {
            "endpoint": {
                "amqp": {
                    "url": "amqp://127.0.0.1:5672",
                    "exchange": "events",
                    "ackLevel": ack,
                    "vhost": "prod",
                }
            }
        },
        f"{namespace}-log": {
            "endpoint": {
                "kafka": {
                    "url": "kafka://127.0.0.1:9092",
                    "brokers": ["127.0.0.2:9092"],
                    "ackLevel": "none",
                }
            }
        },
    }
    for name, spec in specs.items():
        kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    kubectl.run(
        "wait", "--for=condition=Ready", "--timeout=30s", "topics", "--all", "-n", namespace
    )

    arns = {name: ready(kubectl, namespace, name)["arn"] for name in specs}
    web = gateway_topic(gateway, arns[f"{namespace}-web"])
    assert web.endpoint_address == "http://127.0.0.1:9/hook"
    assert web.persistent is False
    assert web.opaque_data == "team=web"
    assert web.endpoint_args["cloudevents"] == "false"
    assert web.endpoint_args["verify-ssl"] == "true"
    assert json.loads(web.policy) == {"Statement": [], "Version": "2012-10-17"}

    mq = gateway_topic(gateway, arns[f"{namespace}-mq"])
    assert mq.endpoint_address == "amqp://127.0.0.1:5672/prod"
    assert mq.endpoint_args["amqp-exchange"] == "events"
    assert mq.endpoint_args["amqp-ack-level"] == ack

    log = gateway_topic(gateway, arns[f"{namespace}-log"])
    assert log.endpoint_address == "kafka://127.0.0.1:9092"
    assert log.endpoint_args["kafka-ack-level"] == "none"
    assert log.endpoint_args["kafka-brokers"] == "127.0.0.2:9092"
    assert log.endpoint_args["use-ssl"] == "false"

    listing = kubectl.run("get", "bntopic", "-n", namespace).stdout
    assert arns[f"{namespace}-mq"] in listing
    assert "kafka" in listing


def test_tls_and_sasl_settings_reach_the_gateway(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator, gateway: TopicClient
) -> None:
    """verify-ssl=false and use-ssl=true read back from the gateway; SASL credentials sent
    to a gateway over plain HTTP are refused by it, and the condition says why."""
    # The operator may send them in the clear here; the gateway decides for itself.
    operator = start_operator(allow_cleartext_secrets="true")
    password = "not-shown-anywhere"
    credentials_secret(kubectl, namespace, "kafka-creds", "alice", password)
    specs = {
        f"{namespace}-insecure": {
            "endpoint": {"http": {"url": "https://127.0.0.1:9/hook", "verifySSL": False}}
        },
        f"{namespace}-tls": {
            "endpoint": {"kafka": {"url": "kafka://127.0.0.1:9093", "useSSL": True}}
        },
        f"{namespace}-sasl": SASL_KAFKA,
    }
    for name, spec in specs.items():
        kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    insecure = gateway_topic(gateway, ready(kubectl, namespace, f"{namespace}-insecure")["arn"])
    assert insecure.endpoint_address == "https://127.0.0.1:9/hook"
    assert insecure.endpoint_args["verify-ssl"] == "false"

    tls = gateway_topic(gateway, ready(kubectl, namespace, f"{namespace}-tls")["arn"])
    assert tls.endpoint_address == "kafka://127.0.0.1:9093"
    assert tls.endpoint_args["use-ssl"] == "true"
    assert not tls.has_stored_secret

    status = ready(kubectl, namespace, f"{namespace}-sasl", status="False")
    condition = status["conditions"][0]
    assert condition["reason"] == "GatewayRefused", condition
    assert "the gateway answered 400" in condition["message"]
    assert "carries broker credentials" in condition["message"]
    assert "not HTTPS" in condition["message"]
    assert "arn" not in status
    assert all(not t.endswith(f":{namespace}_{namespace}-sasl") for t in gateway.list_arns())
    seen = json.dumps(kubectl.get("topic", f"{namespace}-sasl", namespace)) + events(
        kubectl, namespace
    )
    assert password not in seen
    assert password not in operator.log()


def test_sasl_settings_reach_a_gateway_over_https(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    rgw: LocalService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over HTTPS (its own CA, given to the operator by ``AWS_CA_BUNDLE``) the gateway takes
    the broker credentials: ``mechanism`` and ``use-ssl`` read back, the credentials kept as
    a stored secret, and the password in none of our status, Events or logs."""
    operator = start_operator(
        gateway_endpoint=rgw["RGW_TLS_ENDPOINT"], extra_env={"AWS_CA_BUNDLE": rgw["RGW_CA_PEM"]}
    )
    # The gateway shows a topic holding credentials only over HTTPS too (403 over HTTP).
    monkeypatch.setenv("AWS_CA_BUNDLE", rgw["RGW_CA_PEM"])
    gateway = TopicClient(replace(connection(rgw), endpoint=rgw["RGW_TLS_ENDPOINT"]))
    password = "not-shown-over-https"
    credentials_secret(kubectl, namespace, "kafka-creds", "alice", password)
    name = f"{namespace}-sasl-tls"
    kubectl.apply({**topic(name, SASL_KAFKA), "metadata": {"name": name, "namespace": namespace}})
    try:
        arn = ready(kubectl, namespace, name)["arn"]
        sasl = gateway_topic(gateway, arn)
        with pytest.raises(GatewayAccessDenied):
            TopicClient(connection(rgw)).get(arn)
        assert sasl.endpoint_args["mechanism"] == "SCRAM-SHA-512"
        assert sasl.endpoint_args["use-ssl"] == "true"
        assert sasl.has_stored_secret
        seen = json.dumps(kubectl.get("topic", name, namespace)) + events(kubectl, namespace)
        assert password not in seen
        assert password not in operator.log()
    finally:
        # While a topic of the tenant holds credentials, Ceph 16.2 refuses ListTopics over
        # plain HTTP (403) to every user of the tenant: the other tests list over HTTP.
        kubectl.run("delete", "topic", name, "-n", namespace, "--timeout=30s")
    assert gateway.get(arn) is None
    assert arn not in TopicClient(connection(rgw)).list_arns()


def test_edit_updates_and_delete_removes_the_gateway_topic(
    kubectl: Kubectl, namespace: str, operator: Program, gateway: TopicClient
) -> None:
    name = f"{namespace}-edit"
    spec: dict[str, Any] = {"endpoint": {"http": {"url": "http://127.0.0.1:9/a"}}}
    obj = {**topic(name, spec), "metadata": {"name": name, "namespace": namespace}}
    kubectl.apply(obj)
    arn = ready(kubectl, namespace, name)["arn"]
    assert gateway_topic(gateway, arn).opaque_data == ""

    spec["opaqueData"] = "v2"
    spec["endpoint"]["http"]["url"] = "http://127.0.0.1:9/b"
    kubectl.apply(obj)
    wait_until(
        lambda: gateway_topic(gateway, arn),
        lambda t: t.opaque_data == "v2" and t.endpoint_address == "http://127.0.0.1:9/b",
        30,
        "the gateway topic to follow the edit",
    )
    status = ready(kubectl, namespace, name)
    generation = kubectl.get("topic", name, namespace)["metadata"]["generation"]
    wait_until(
        lambda: kubectl.get("topic", name, namespace)["status"]["observedGeneration"],
        lambda seen: seen == generation,
        30,
        "observedGeneration to follow the edit",
    )
    assert status["endpointKind"] == "http"

    kubectl.run("delete", "topic", name, "-n", namespace, "--timeout=30s")
    assert gateway.get(arn) is None


def test_the_finalizer_of_an_earlier_release_moves_to_ours_and_deleting_under_it_works(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator, gateway: TopicClient
) -> None:
    """Objects of releases before 0.1.0 carry kopf's default finalizer. One the operator
    finds so gets ours and loses the old one; one deleted while no operator ran, under the
    old finalizer alone (no finalizer can be added to it any more), has its gateway topic
    deleted by the drift check, then goes."""

    def finalizers(name: str) -> list[str]:
        got: list[str] = kubectl.get("topic", name, namespace)["metadata"].get("finalizers", [])
        return got

    spec = {"endpoint": {"http": {"url": "http://127.0.0.1:9/old"}}}
    earlier = {
        **topic("earlier", spec),
        "metadata": {"name": "earlier", "namespace": namespace, "finalizers": [OLD_FINALIZER]},
    }
    kubectl.apply(earlier)
    operator = start_operator()
    ready(kubectl, namespace, "earlier")
    wait_until(
        lambda: finalizers("earlier"),
        lambda found: found == [FINALIZER],
        10 * DRIFT_INTERVAL_S,
        "ours instead of the old finalizer",
    )
    kubectl.apply(
        {**topic("deleted", spec), "metadata": {"name": "deleted", "namespace": namespace}}
    )
    arn = ready(kubectl, namespace, "deleted")["arn"]
    assert finalizers("deleted") == [FINALIZER]
    operator.stop()
    # As an earlier release left it: its finalizer alone, deleted while no operator ran.
    replace_ours = [{"op": "replace", "path": "/metadata/finalizers/0", "value": OLD_FINALIZER}]
    kubectl.run(
        "patch", "topic", "deleted", "-n", namespace, "--type=json", "-p", json.dumps(replace_ours)
    )
    kubectl.run("delete", "topic", "deleted", "-n", namespace, "--wait=false")
    assert finalizers("deleted") == [OLD_FINALIZER]
    assert gateway.get(arn) is not None

    start_operator()
    wait_until(
        lambda: kubectl.run("get", "topic", "deleted", "-n", namespace, check=False).returncode,
        lambda code: code != 0,
        10 * DRIFT_INTERVAL_S,
        "the Topic deleted under the old finalizer gone",
    )
    assert gateway.get(arn) is None, "its gateway topic deleted first"
    kubectl.run("delete", "topic", "earlier", "-n", namespace, "--timeout=30s")


def test_drift_on_the_gateway_is_repaired(
    kubectl: Kubectl, namespace: str, operator: Program, gateway: TopicClient
) -> None:
    """A topic deleted or changed behind the operator's back comes back within the interval."""
    name = f"{namespace}-drift"
    spec = {"endpoint": {"http": {"url": "http://127.0.0.1:9/d"}}, "opaqueData": "mine"}
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    arn = ready(kubectl, namespace, name)["arn"]

    gateway.delete(arn)
    wait_until(
        lambda: gateway.get(arn),
        lambda t: t is not None,
        5 * DRIFT_INTERVAL_S,
        "the deleted gateway topic to be re-created",
    )

    gateway.upsert(
        f"{namespace}_{name}", {"push-endpoint": "http://127.0.0.1:9/evil", "OpaqueData": "theirs"}
    )
    repaired = wait_until(
        lambda: gateway_topic(gateway, arn),
        lambda t: t.endpoint_address == "http://127.0.0.1:9/d",
        5 * DRIFT_INTERVAL_S,
        "the changed gateway topic to be rewritten",
    )
    assert repaired.opaque_data == "mine"
    assert "DriftRepaired" in events(kubectl, namespace)


def test_cleartext_credentials_are_refused_without_leaking_them(
    kubectl: Kubectl, namespace: str, operator: Program, gateway: TopicClient
) -> None:
    password = "s3cr3t-do-not-leak"
    credentials_secret(kubectl, namespace, "kafka-creds", "alice", password)
    name = f"{namespace}-sasl"
    spec = {
        "endpoint": {
            "kafka": {
                "url": "kafka://127.0.0.1:9092",
                "sasl": {
                    "mechanism": "SCRAM-SHA-256",
                    "credentialsRef": {"secretName": "kafka-creds"},
                },
            }
        }
    }
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    status = ready(kubectl, namespace, name, status="False")
    condition = status["conditions"][0]
    assert condition["reason"] == "CleartextCredentials"
    assert "useSSL: true" in condition["message"]
    assert "arn" not in status
    assert all(not t.endswith(f":{namespace}_{name}") for t in gateway.list_arns())

    seen = json.dumps(kubectl.get("topic", name, namespace)) + events(kubectl, namespace)
    assert password not in seen
    assert password not in operator.log()


def test_missing_secret_then_created_resyncs_without_waiting(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    rgw: LocalService,
    gateway: TopicClient,
) -> None:
    """Creating or rotating a referenced Secret re-syncs its Topic at once, not at drift time."""
    start_operator(drift_interval_seconds="600")
    kubectl.run(
        "create",
        "secret",
        "generic",
        "gw",
        "-n",
        namespace,
        f"--from-literal=endpoint={rgw['RGW_ENDPOINT']}",
        f"--from-literal=accessKey={rgw['RGW_ACCESS_KEY']}",
    )
    name = f"{namespace}-ref"
    spec = {
        "endpoint": {"http": {"url": "http://127.0.0.1:9/r"}},
        "gatewayRef": {"secretName": "gw"},
    }
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    status = ready(kubectl, namespace, name, status="False")
    assert status["conditions"][0]["reason"] == "SecretNotFound"
    assert "lacks secretKey" in status["conditions"][0]["message"]

    patch_secret_data(kubectl, namespace, "gw", secretKey=rgw["RGW_SECRET_KEY"])
    arn = ready(kubectl, namespace, name)["arn"]
    assert gateway_topic(gateway, arn).endpoint_address == "http://127.0.0.1:9/r"


def test_a_gateway_secret_as_rook_makes_it_or_with_mapped_keys_is_read_as_it_is(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    rgw: LocalService,
    gateway: TopicClient,
) -> None:
    """A Secret exactly as Rook makes it for a CephObjectStoreUser (its type, labels and
    keys ``Endpoint``, ``AccessKey``, ``SecretKey``) is a gatewayRef as it is; a Secret with
    other key names is one once ``keys`` maps them; a Secret with neither says what it
    lacks."""
    start_operator()
    rook_user_secret(
        kubectl, namespace, rgw["RGW_ENDPOINT"], rgw["RGW_ACCESS_KEY"], rgw["RGW_SECRET_KEY"]
    )
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "keys-of-its-own", "namespace": namespace},
            "stringData": {
                "url": rgw["RGW_ENDPOINT"],
                "id": rgw["RGW_ACCESS_KEY"],
                "key": rgw["RGW_SECRET_KEY"],
            },
        }
    )
    refs = {
        "rook": {"secretName": "rook-ceph-object-user-my-store-team"},
        "mapped": {
            "secretName": "keys-of-its-own",
            "keys": {"endpoint": "url", "accessKey": "id", "secretKey": "key"},
        },
        "unmapped": {"secretName": "keys-of-its-own"},
    }
    for name, ref in refs.items():
        spec = {"endpoint": {"http": {"url": f"http://127.0.0.1:9/{name}"}}, "gatewayRef": ref}
        kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    for name in ("rook", "mapped"):
        arn = ready(kubectl, namespace, name)["arn"]
        assert gateway_topic(gateway, arn).endpoint_address == f"http://127.0.0.1:9/{name}"
    (condition,) = ready(kubectl, namespace, "unmapped", status="False")["conditions"]
    assert condition["reason"] == "SecretNotFound"
    assert condition["message"] == (
        f"gateway Secret {namespace}/keys-of-its-own lacks endpoint, accessKey, secretKey"
        " (or Rook's Endpoint, AccessKey, SecretKey)"
    )


def test_a_secret_created_after_its_topic_is_read_labelled_and_then_watched(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    rgw: LocalService,
    gateway: TopicClient,
) -> None:
    """The operator watches only Secrets labelled bucketnotify.io/watched=true. A Secret made
    after its Topic carries no label: the Topic's retry reads it and labels it, and from
    then on its changes re-sync the Topic at once (the drift check is 10 minutes away)."""
    start_operator(drift_interval_seconds="600")
    name = f"{namespace}-late"
    spec = {
        "endpoint": {"http": {"url": "http://127.0.0.1:9/late"}},
        "gatewayRef": {"secretName": "gw-late"},
    }
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    status = ready(kubectl, namespace, name, status="False")
    assert status["conditions"][0]["reason"] == "SecretNotFound"

    gateway_secret(
        kubectl,
        namespace,
        "gw-late",
        rgw["RGW_ENDPOINT"],
        rgw["RGW_ACCESS_KEY"],
        rgw["RGW_SECRET_KEY"],
    )
    arn = ready(kubectl, namespace, name)["arn"]  # within the 15 s retry
    labels = kubectl.get("secret", "gw-late", namespace)["metadata"]["labels"]
    assert labels == {"bucketnotify.io/watched": "true"}
    # The label's own watch event (within a second) re-syncs nothing: the Topic just read
    # that very data.
    time.sleep(3)
    annotations = kubectl.get("topic", name, namespace)["metadata"].get("annotations") or {}
    assert "bucketnotify.io/secret-resync" not in annotations

    patch_secret_data(kubectl, namespace, "gw-late", region="default")
    version = kubectl.get("secret", "gw-late", namespace)["metadata"]["resourceVersion"]
    wait_until(
        lambda: kubectl.get("topic", name, namespace)["metadata"].get("annotations") or {},
        lambda annotations: (
            annotations.get("bucketnotify.io/secret-resync") == f"gw-late@{version}"
        ),
        30,
        "the labelled Secret's change re-syncs the Topic",
    )
    assert gateway_topic(gateway, arn).endpoint_address == "http://127.0.0.1:9/late"


def test_the_gateway_kind_of_a_gateway_secret_decides_whether_topics_can_be_made(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    rgw: LocalService,
    gateway: TopicClient,
) -> None:
    """kind: obs (Huawei OBS, no SNS API) refuses a Topic with what to use instead and makes
    nothing; an unknown kind names the Secret and the kinds there are; kind: ceph is RGW."""
    start_operator(drift_interval_seconds="600")
    gateway_secret(
        kubectl, namespace, "gw", rgw["RGW_ENDPOINT"], rgw["RGW_ACCESS_KEY"],
        rgw["RGW_SECRET_KEY"], kind="obs",
    )  # fmt: skip
    name = f"{namespace}-kind"
    spec = {
        "endpoint": {"http": {"url": "http://127.0.0.1:9/k"}},
        "gatewayRef": {"secretName": "gw"},
    }
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    status = condition(kubectl, namespace, "topic", name, "False", "Unsupported")
    message = ready_message(status)
    assert "Huawei OBS" in message and "topicARN (urn:smn:" in message
    assert "arn" not in status, "nothing made on the gateway"

    def set_kind(kind: str) -> None:
        patch = json.dumps({"stringData": {"kind": kind}})
        kubectl.run("patch", "secret", "gw", "-n", namespace, "--type=merge", "-p", patch)

    set_kind("minio")
    status = condition(kubectl, namespace, "topic", name, "False", "InvalidGatewaySecret")
    assert ready_message(status) == (
        f"gateway Secret {namespace}/gw: kind must be one of ceph, obs, not 'minio'"
    )
    set_kind("ceph")
    arn = ready(kubectl, namespace, name)["arn"]
    assert gateway_topic(gateway, arn).endpoint_address == "http://127.0.0.1:9/k"


def test_unreachable_gateway_shows_on_the_topic_and_recovers(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    rgw: LocalService,
    gateway: TopicClient,
) -> None:
    proxy = proxied_gateway(kubectl, namespace, "gw-proxy", rgw)
    name = f"{namespace}-far"
    spec = {
        "endpoint": {"http": {"url": "http://127.0.0.1:9/f"}},
        "gatewayRef": {"secretName": "gw-proxy"},
    }
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    status = ready(kubectl, namespace, name, status="False")
    assert status["conditions"][0]["reason"] == "GatewayUnreachable"

    proxy.start()
    try:
        arn = ready(kubectl, namespace, name)["arn"]
        assert gateway.get(arn) is not None
    finally:
        proxy.stop()


def test_keys_the_gateway_refuses_show_on_the_topic_and_recover_once_fixed(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    rgw: LocalService,
    gateway: TopicClient,
) -> None:
    """A gatewayRef Secret with a wrong secret key: the gateway refuses the signature, the
    Topic says GatewayAccessDenied (never the key), counted by that reason, and the right
    key makes it Ready."""
    port = free_port()
    start_operator(metrics_port=str(port))
    wrong = "not-the-secret-key-of-this-user"
    endpoint, access_key = rgw["RGW_ENDPOINT"], rgw["RGW_ACCESS_KEY"]
    gateway_secret(kubectl, namespace, "gw-keys", endpoint, access_key, wrong)
    name = f"{namespace}-denied"
    spec = {
        "endpoint": {"http": {"url": "http://127.0.0.1:9/d"}},
        "gatewayRef": {"secretName": "gw-keys"},
    }
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    status = ready(kubectl, namespace, name, status="False")
    assert status["conditions"][0]["reason"] == "GatewayAccessDenied"
    assert wrong not in json.dumps(status)
    errors = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    counted = [
        s.value
        for family in text_string_to_metric_families(errors)
        for s in family.samples
        if s.name == "bucketnotify_reconcile_errors_total"
        and s.labels == {"kind": "topic", "reason": "GatewayAccessDenied"}
    ]
    assert counted and counted[0] >= 1
    kubectl.run("delete", "secret", "gw-keys", "-n", namespace)
    gateway_secret(kubectl, namespace, "gw-keys", endpoint, access_key, rgw["RGW_SECRET_KEY"])
    arn = ready(kubectl, namespace, name)["arn"]
    assert gateway.get(arn) is not None


def test_delete_is_bounded_when_the_gateway_is_gone_for_good(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    rgw: LocalService,
    gateway: TopicClient,
) -> None:
    """A deletion retries, then releases the object with a Warning naming the orphan."""
    start_operator(delete_give_up_after_seconds="4")
    proxy = proxied_gateway(kubectl, namespace, "gw-gone", rgw)
    name = f"{namespace}-gone"
    spec = {
        "endpoint": {"http": {"url": "http://127.0.0.1:9/g"}},
        "gatewayRef": {"secretName": "gw-gone"},
    }
    proxy.start()
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    arn = ready(kubectl, namespace, name)["arn"]
    proxy.stop()

    kubectl.run("delete", "topic", name, "-n", namespace, "--timeout=60s")
    recorded = events(kubectl, namespace)
    assert "OrphanedOnGateway" in recorded
    assert "radosgw-admin topic rm" in recorded
    assert gateway.get(arn) is not None  # the gateway was unreachable: the topic is left
    gateway.delete(arn)


def scraped(port: int) -> dict[str, float]:
    """The operator's /metrics: each metric's samples summed over their labels (a counter
    no handler run has touched yet has none: 0)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == family.name or sample.name == f"{family.name}_total":
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return {
        "bucketnotify_reconcile_total": 0.0,
        "bucketnotify_reconcile_errors_total": 0.0,
        **totals,
    }


def test_only_the_lease_holder_reconciles_and_a_successor_takes_over(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    gateway: TopicClient,
) -> None:
    fast = {
        "lease_duration_seconds": "4",
        "renew_deadline_seconds": "3",
        "retry_period_seconds": "1",
    }
    ports = free_port(), free_port()
    first = start_operator(**fast, metrics_port=str(ports[0]))
    wait_until(first.log, lambda log: "acquired the leader Lease" in log, 30, "a leader")
    second = start_operator(**fast, metrics_port=str(ports[1]))
    # Up and standing by (its probe server comes before the election): until then it could
    # neither reconcile nor answer a scrape, and the assertions on it below would say nothing.
    wait_until(
        second.log, lambda log: "waiting for the leader Lease" in log, 30, "a standing-by second"
    )

    name = f"{namespace}-one"
    spec = {"endpoint": {"http": {"url": "http://127.0.0.1:9/one"}}}
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    ready(kubectl, namespace, name)
    assert "Handler 'topic_changed' succeeded" in first.log()
    assert "Handler 'topic_changed'" not in second.log()
    assert "acquired the leader Lease" not in second.log()
    # The follower serves its metrics too, with nothing counted and not leading.
    leader, follower = (scraped(port) for port in ports)
    assert leader["bucketnotify_operator_leader"] == 1
    assert leader["bucketnotify_reconcile_total"] >= 1
    assert follower["bucketnotify_operator_leader"] == 0
    assert follower["bucketnotify_reconcile_total"] == 0
    assert follower["bucketnotify_reconcile_errors_total"] == 0

    first.stop()
    wait_until(second.log, lambda log: "acquired the leader Lease" in log, 30, "a successor")
    assert scraped(ports[1])["bucketnotify_operator_leader"] == 1
    name2 = f"{namespace}-two"
    spec2 = {"endpoint": {"http": {"url": "http://127.0.0.1:9/two"}}}
    kubectl.apply({**topic(name2, spec2), "metadata": {"name": name2, "namespace": namespace}})
    arn = ready(kubectl, namespace, name2)["arn"]
    assert gateway.get(arn) is not None


def test_an_operator_whose_user_has_no_name_leads_reconciles_and_answers_its_probes(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
) -> None:
    """Our image runs as uid 65532, which has no passwd entry. kopf names itself after the
    user (getpass.getuser()) unless given an identity: the leader's kopf then died with
    KeyError 'getpwuid(): uid not found' while the process went on and later exited 0."""
    port = free_port()
    identity = f"operator-{namespace}"
    operator = start_operator(user=65532, identity=identity, metrics_port=str(port))
    wait_until(operator.log, lambda log: "acquired the leader Lease" in log, 30, "leading")
    holder = kubectl.get("lease", "bucketnotify-operator", namespace)
    assert holder["spec"]["holderIdentity"] == identity

    name = f"{namespace}-nouser"
    spec = {"endpoint": {"http": {"url": "http://127.0.0.1:9/nouser"}}}
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    ready(kubectl, namespace, name)
    assert operator.process.poll() is None
    assert "getpwuid" not in operator.log()

    base = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{base}/healthz", timeout=5).json() == {"alive": True}
    assert httpx.get(f"{base}/readyz", timeout=5).json() == {"ready": True}
    metrics = httpx.get(f"{base}/metrics", timeout=5)
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "bucketnotify_" in metrics.text


async def test_a_leader_whose_operator_fails_ends_with_a_non_zero_status(
    kube: LocalService, namespace: str
) -> None:
    """The leader election runs the operator as a task nobody awaits; a failure there must
    end the process with status 1, not 0 (the Lease is handed back first)."""
    settings = OperatorSettings(
        leader_election_namespace=namespace,
        lease_duration_seconds=4,
        renew_deadline_seconds=3,
        retry_period_seconds=1,
    )

    async def failing_operator() -> None:
        raise RuntimeError("kopf stand-in failed")

    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        # Awaited in this task (no wait_for): asyncio lets a SystemExit raised in another
        # task escape the event loop instead of reaching the awaiter.
        with pytest.raises(SystemExit) as ended:
            async with asyncio.timeout(30):
                await leadership.lead(api, settings, "failing", failing_operator(), asyncio.Event())
        assert ended.value.code == 1
        lease = await api.get(lease_path(namespace, settings.leader_election_lease))
        assert lease["spec"].get("holderIdentity") in ("", None)


def test_a_persistent_topics_token_secret_is_owned_by_the_topic(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """The operator makes the ingest token Secret with the Topic as its owner, so deleting
    the Topic lets Kubernetes' garbage collector take the Secret (this apiserver runs no
    controller manager: the reference is what is asserted). Making it is no change of the
    Secret to re-sync the Topic for: the Topic is reconciled once (one Created Event, no
    Updated), not once more at the Secret's own watch event."""
    start_operator(ingest_url="http://127.0.0.1:9")  # nothing is pushed here
    name = f"{namespace}-queued"
    spec = {"endpoint": {"http": {"url": "http://127.0.0.1:9/q"}}, "persistent": True}
    kubectl.apply({**topic(name, spec), "metadata": {"name": name, "namespace": namespace}})
    ready(kubectl, namespace, name)
    owner = kubectl.get("topic", name, namespace)
    secret = kubectl.get("secret", ingest_token_secret(name), namespace)
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": owner["apiVersion"],
            "kind": "Topic",
            "name": name,
            "uid": owner["metadata"]["uid"],
        }
    ]
    assert secret["data"]["token"]

    def reasons() -> list[str]:
        items = json.loads(events(kubectl, namespace))["items"]
        return [e["reason"] for e in items if e["involvedObject"]["name"] == name]

    wait_until(reasons, lambda found: "Created" in found, 30, "the Topic's Created Event")
    time.sleep(3)  # the Secret's watch event came within milliseconds of its creation
    # (Its Delivering condition has Events of its own: no replica runs here.)
    assert [r for r in reasons() if r in ("Created", "Updated")] == ["Created"]
