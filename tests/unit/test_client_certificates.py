"""Client certificates (mutual TLS): the context an endpoint opens with loads the
certificate and its key from the Secret's PEM, encrypted or not, and a certificate that
cannot be used is a configuration error that names what is wrong and never the key."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from bucketnotify.api.topic import ClientCertificate, TopicSpec
from bucketnotify.delivery.endpoints.errors import ConfigurationError
from bucketnotify.delivery.endpoints.tls import client_context
from tests.tls import issue_client_certificate, make_ca


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pki")


def test_a_plain_and_an_encrypted_key_load(pki: Path) -> None:
    ca = make_ca(pki, "client-ca")
    plain = issue_client_certificate(ca, pki / "plain", "delivery")
    context = client_context(verify=True, ca_pem=ca.pem, client=plain)
    assert context.verify_mode is ssl.CERT_REQUIRED
    encrypted = issue_client_certificate(ca, pki / "encrypted", "delivery", password="s3cret-pw")
    assert "ENCRYPTED" in encrypted.private_key
    client_context(verify=True, ca_pem=None, client=encrypted)


def test_what_cannot_be_used_is_named_and_the_key_never_shown(pki: Path) -> None:
    ca = make_ca(pki, "other-ca")
    good = issue_client_certificate(ca, pki / "a", "a")
    other = issue_client_certificate(ca, pki / "b", "b")
    encrypted = issue_client_certificate(ca, pki / "c", "c", password="right-password")
    cases = {
        "does not belong to its certificate": ClientCertificate(
            good.certificate, other.private_key
        ),
        "password is wrong": encrypted._replace(password="wrong-password"),
        "is encrypted: set keyPasswordKey": encrypted._replace(password=None),
        "holds no PEM certificate": good._replace(certificate="not a certificate"),
        "is not a PEM key": good._replace(private_key="not a key"),
    }
    for said, client in cases.items():
        with pytest.raises(ConfigurationError) as refused:
            client_context(verify=True, ca_pem=None, client=client)
        assert said in str(refused.value), (said, str(refused.value))
        assert client.private_key not in str(refused.value)
        assert "right-password" not in str(refused.value)
    assert "right-password" not in repr(encrypted)
    assert encrypted.private_key not in repr(encrypted)


def test_a_topic_the_gateway_pushes_cannot_name_one() -> None:
    """The CRD's rule (checked by the apiserver in tests/integration/test_topic_crd.py); here
    that the models take the field on every endpoint kind."""
    for kind, url in (
        ("http", "https://receiver"),
        ("amqp", "amqps://broker"),
        ("kafka", "kafka://broker:9093"),
    ):
        endpoint: dict[str, object] = {"url": url, "clientCertificateRef": {"secretName": "c"}}
        if kind == "amqp":
            endpoint["exchange"] = "x"
        if kind == "kafka":
            endpoint["useSSL"] = True
        spec = TopicSpec.model_validate({"endpoint": {kind: endpoint}, "persistent": True})
        found = spec.endpoint.client_certificate_ref()
        assert found is not None and found[0].secret_name == "c"
        assert found[1] == f"spec.endpoint.{kind}.clientCertificateRef"
        assert "c" in spec.endpoint.secret_names()
