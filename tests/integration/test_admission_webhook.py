"""The admission webhook between kubectl and the real API server: the operator process
serves it on loopback with its certificate, and the chart's webhook configuration (its
rules, pointed at that address) makes the API server ask it.

What a user sees: a BucketNotification whose key regex the gateway cannot compile is
refused by ``kubectl apply`` with the position to fix (create and update alike, the stored
object unchanged), and a reference to something that does not exist yet is applied with a
``Warning:`` line.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.programs import free_port, wait_for_port
from tests.install.manifests import template
from tests.kubectl import Kubectl
from tests.operator import StartOperator
from tests.resources import API
from tests.tls import issue_server_certificate, make_ca
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

BAD_REGEX = "logs/a{,3}"


@pytest.fixture()
def webhook(
    helm_bin: str,
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    tmp_path: Path,
) -> Iterator[None]:
    ca = make_ca(tmp_path / "ca", "webhook-ca")
    issue_server_certificate(ca, tmp_path / "served", "tls")
    port = free_port()
    operator = start_operator(webhook_port=str(port), webhook_cert_dir=str(tmp_path / "served"))
    wait_for_port(port, 120, operator)
    rendered = template(
        helm_bin, release="r", namespace=namespace, sets=[f'watchNamespaces=["{namespace}"]']
    )
    (config,) = [o for o in rendered if o["kind"] == "ValidatingWebhookConfiguration"]
    config["metadata"] = {"name": f"bucketnotify-test-{uuid.uuid4().hex[:8]}"}
    for hook in config["webhooks"]:
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}/validate",
            "caBundle": base64.b64encode(ca.cert.read_bytes()).decode(),
        }
    kubectl.apply(config)
    try:
        # The API server picks a new configuration up within a moment: until it refuses.
        wait_until(
            lambda: apply_notification(kubectl, namespace, "probe", BAD_REGEX).returncode,
            lambda code: code != 0,
            30,
            "the API server to call the webhook",
        )
        yield
    finally:
        kubectl.run(
            "delete", "validatingwebhookconfiguration", config["metadata"]["name"], check=False
        )


def notification(namespace: str, name: str, regex: str, topic: str = "orders") -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "BucketNotification",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "bucket": "photos",
            "topicRef": {"name": topic},
            "filter": {"key": {"regex": regex}},
        },
    }


def apply_notification(kubectl: Kubectl, namespace: str, name: str, regex: str) -> Any:
    return kubectl.apply(notification(namespace, name, regex), check=False)


def exists(kubectl: Kubectl, kind: str, namespace: str, name: str) -> bool:
    got = kubectl.run("get", kind, name, "-n", namespace, "--ignore-not-found", "-o", "name")
    return bool(got.stdout.strip())


@pytest.mark.usefixtures("webhook")
def test_kubectl_apply_refuses_a_regex_the_gateway_cannot_compile(
    kubectl: Kubectl, namespace: str
) -> None:
    refused = apply_notification(kubectl, namespace, "bad", BAD_REGEX)
    assert refused.returncode != 0
    assert 'admission webhook "validate.bucketnotify.io" denied the request' in refused.stderr
    assert "spec.filter.key.regex is outside the gateway's regex dialect" in refused.stderr
    assert "'{' not followed by a count (write \\{ for the character) at position 6" in (
        refused.stderr
    )
    assert not exists(kubectl, "bucketnotification", namespace, "bad")


@pytest.mark.usefixtures("webhook")
def test_an_update_to_a_bad_regex_is_refused_and_the_object_stays_as_it_was(
    kubectl: Kubectl, namespace: str
) -> None:
    # The Topic exists, so the first apply has nothing to warn about.
    kubectl.apply(
        {
            "apiVersion": API,
            "kind": "Topic",
            "metadata": {"name": "orders", "namespace": namespace},
            "spec": {"endpoint": {"http": {"url": "http://receiver.example:8080/"}}},
        }
    )
    created = apply_notification(kubectl, namespace, "logs", r"^logs/[0-9]+\.gz$")
    assert created.returncode == 0, created.stderr
    assert "Warning" not in created.stderr
    refused = apply_notification(kubectl, namespace, "logs", "(?>logs)")
    assert refused.returncode != 0
    assert "a group kind the gateway's ECMAScript regex lacks" in refused.stderr
    assert "at position 0" in refused.stderr
    stored = kubectl.get("bucketnotification", "logs", namespace)
    assert stored["spec"]["filter"]["key"]["regex"] == r"^logs/[0-9]+\.gz$"


@pytest.mark.usefixtures("webhook")
def test_missing_references_are_applied_with_a_warning(kubectl: Kubectl, namespace: str) -> None:
    applied = kubectl.apply(notification(namespace, "early", "^x", topic="not-yet"), check=False)
    assert applied.returncode == 0, applied.stderr
    assert (
        f"Warning: spec.topicRef: Topic {namespace}/not-yet does not exist (yet)" in applied.stderr
    )
    assert exists(kubectl, "bucketnotification", namespace, "early")

    mq = {
        "apiVersion": API,
        "kind": "Topic",
        "metadata": {"name": "mq", "namespace": namespace},
        "spec": {
            "endpoint": {
                "amqp": {
                    "url": "amqps://rabbit.example:5671",
                    "exchange": "ex",
                    "credentialsRef": {"secretName": "mq-creds"},
                }
            }
        },
    }
    topic = kubectl.apply(mq, check=False)
    assert topic.returncode == 0, topic.stderr
    assert (
        f"Warning: spec.endpoint.amqp.credentialsRef: Secret {namespace}/mq-creds does not exist"
        in topic.stderr
    )
    # Once the Secret is there, the same apply is quiet.
    kubectl.run(
        "create", "secret", "generic", "mq-creds", "-n", namespace,
        "--from-literal=username=u", "--from-literal=password=p",
    )  # fmt: skip
    mq["spec"]["endpoint"]["amqp"]["exchange"] = "ex2"  # a change, so the webhook is asked
    again = kubectl.apply(mq, check=False)
    assert again.returncode == 0, again.stderr
    assert "Warning" not in again.stderr
