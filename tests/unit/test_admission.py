"""The admission webhook's answers: refused with what to fix, warned about references that
are missing, and served over TLS with a certificate that can be rotated in place."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bucketnotify import admission
from bucketnotify.admission import PATH, review, serve_admission
from devstack.programs import free_port
from tests.tls import issue_server_certificate, make_ca

NS = "team-a"


class Objects:
    """The objects that exist, by (kind, namespace, name): what the API server would say."""

    def __init__(self, *present: tuple[str, str]) -> None:
        self.present = {(kind, NS, name) for kind, name in present}
        self.asked: list[tuple[str, str, str]] = []

    async def __call__(self, kind: str, namespace: str, name: str) -> bool:
        self.asked.append((kind, namespace, name))
        return (kind, namespace, name) in self.present


def notification(**spec: Any) -> dict[str, Any]:
    return {"bucket": "photos", "topicRef": {"name": "orders"}, **spec}


async def test_a_regex_the_gateway_cannot_compile_is_refused_with_its_position() -> None:
    verdict = await review(
        "BucketNotification",
        NS,
        notification(filter={"key": {"regex": "logs/a{,3}"}}),
        Objects(("Topic", "orders")),
    )
    assert not verdict.allowed
    assert verdict.message is not None
    assert verdict.message.startswith("spec.filter.key.regex is outside the gateway's regex")
    assert "position 6" in verdict.message


async def test_a_regex_both_engines_read_alike_is_allowed_without_warnings() -> None:
    verdict = await review(
        "BucketNotification",
        NS,
        notification(filter={"key": {"regex": r"^logs/[0-9]{4}/.*\.gz$"}}),
        Objects(("Topic", "orders")),
    )
    assert verdict.allowed and verdict.message is None and verdict.warnings == []


async def test_missing_references_are_warnings_naming_the_field_and_the_object() -> None:
    objects = Objects()
    verdict = await review(
        "BucketNotification", NS, notification(gatewayRef={"secretName": "rgw"}), objects
    )
    assert verdict.allowed
    assert verdict.warnings == [
        f"spec.topicRef: Topic {NS}/orders does not exist (yet); the object is not Ready until"
        " it does",
        f"spec.gatewayRef: Secret {NS}/rgw does not exist (yet); the object is not Ready until"
        " it does",
    ]
    assert objects.asked == [("Topic", NS, "orders"), ("Secret", NS, "rgw")]


async def test_a_topics_secrets_configmaps_and_dead_letter_topic_are_looked_up() -> None:
    spec = {
        "endpoint": {
            "kafka": {
                "url": "kafka://kafka.example:9093",
                "useSSL": True,
                "caRef": {"name": "kafka-ca"},
                "sasl": {"mechanism": "SCRAM-SHA-512", "credentialsRef": {"secretName": "kc"}},
            }
        },
        "persistent": True,
        "delivery": {"deadLetterTopic": "dead"},
    }
    verdict = await review("Topic", NS, spec, Objects(("Secret", "kc"), ("Topic", "dead")))
    assert verdict.allowed
    assert [w.split(":")[0] for w in verdict.warnings] == ["spec.endpoint.kafka.caRef"]
    assert f"ConfigMap {NS}/kafka-ca does not exist" in verdict.warnings[0]


async def test_a_spec_the_operator_cannot_read_is_refused_naming_the_fields() -> None:
    verdict = await review("BucketNotification", NS, {"bucket": "photos", "events": 3}, Objects())
    assert not verdict.allowed
    assert verdict.message == "spec is invalid at: events"


@pytest.fixture()
def cert_dir(tmp_path: Path) -> Path:
    ca = make_ca(tmp_path / "ca-1", "webhook-ca-1")
    issue_server_certificate(ca, tmp_path / "served", "tls")
    return tmp_path / "served"


async def post_review(port: int, ca: Path, body: dict[str, Any]) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(ca))
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"https://127.0.0.1:{port}{PATH}", json=body, ssl=context) as response,
    ):
        assert response.status == 200
        answer: dict[str, Any] = await response.json()
        return answer


def admission_review(uid: str, spec: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {
                "group": "bucketnotify.io",
                "version": "v1alpha1",
                "kind": "BucketNotification",
            },
            "namespace": NS,
            "operation": operation,
            "object": {"metadata": {"name": "n", "namespace": NS}, "spec": spec},
        },
    }


async def test_the_server_answers_admission_reviews_and_takes_a_rotated_certificate(
    cert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "CERT_POLL_SECONDS", 0.2)
    port = free_port()
    server = await serve_admission(port, str(cert_dir), Objects(("Topic", "orders")))
    try:
        refused = await post_review(
            port,
            tmp_path / "ca-1" / "webhook-ca-1.crt",
            admission_review("u-1", notification(filter={"key": {"regex": "(?>a)"}})),
        )
        assert refused["response"]["uid"] == "u-1"
        assert refused["response"]["allowed"] is False
        assert refused["response"]["status"]["code"] == 422
        assert "regex" in refused["response"]["status"]["message"]

        # A new CA and certificate written over the files (as a Secret volume updates).
        ca_2 = make_ca(tmp_path / "ca-2", "webhook-ca-2")
        issue_server_certificate(ca_2, tmp_path / "next", "tls")
        for name in ("tls.crt", "tls.key"):
            shutil.copy(tmp_path / "next" / name, cert_dir / name)
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            try:
                allowed = await post_review(
                    port, ca_2.cert, admission_review("u-2", notification(), "UPDATE")
                )
                break
            except aiohttp.ClientConnectorCertificateError:
                assert asyncio.get_running_loop().time() < deadline, "never reloaded"
                await asyncio.sleep(0.1)
        assert allowed["response"] == {"uid": "u-2", "allowed": True}
    finally:
        await server.stop()


async def test_what_is_not_an_admission_review_is_a_400(cert_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    server = await serve_admission(port, str(cert_dir), Objects())
    context = ssl.create_default_context(cafile=str(tmp_path / "ca-1" / "webhook-ca-1.crt"))
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"https://127.0.0.1:{port}{PATH}", data=json.dumps({"x": 1}), ssl=context
            ) as response,
        ):
            assert response.status == 400
    finally:
        await server.stop()


async def test_a_metadata_only_update_of_an_object_stored_before_the_webhook_is_allowed(
    cert_dir: Path, tmp_path: Path
) -> None:
    """The operator removes its finalizer from a BucketNotification whose regex the webhook
    would refuse (stored before the webhook was installed): allowed, or it could never be
    deleted. A change of that spec is still judged."""
    port = free_port()
    server = await serve_admission(port, str(cert_dir), Objects(("Topic", "orders")))
    bad = notification(filter={"key": {"regex": "a{"}})
    ca = tmp_path / "ca-1" / "webhook-ca-1.crt"
    try:
        finalizer_removed = admission_review("u-3", bad, "UPDATE")
        finalizer_removed["request"]["oldObject"] = {"metadata": {"name": "n"}, "spec": bad}
        answer = await post_review(port, ca, finalizer_removed)
        assert answer["response"] == {"uid": "u-3", "allowed": True}

        changed = admission_review("u-4", {**bad, "bucket": "other"}, "UPDATE")
        changed["request"]["oldObject"] = {"metadata": {"name": "n"}, "spec": bad}
        answer = await post_review(port, ca, changed)
        assert answer["response"]["allowed"] is False
    finally:
        await server.stop()
