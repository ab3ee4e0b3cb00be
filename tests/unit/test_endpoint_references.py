"""What an endpoint refers to is said in one place, the API model: each kind's credentials
and CA references, and where in the spec they are (for the admission webhook's warnings);
and nothing else in the package reads those fields of the endpoint kinds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bucketnotify.api.topic import ENDPOINT_KINDS, Endpoint

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "bucketnotify"

CA_SECRET = {"kind": "Secret", "name": "ca-secret"}
CA_MAP = {"kind": "ConfigMap", "name": "ca-map"}


@pytest.mark.parametrize(
    ("endpoint", "credentials", "ca", "secrets"),
    [
        ({"http": {"url": "http://h/"}}, None, None, set()),
        (
            {"http": {"url": "https://h/", "caRef": CA_SECRET}},
            None,
            ("ca-secret", "spec.endpoint.http.caRef"),
            {"ca-secret"},
        ),
        (
            {
                "amqp": {
                    "url": "amqps://b/",
                    "exchange": "x",
                    "credentialsRef": {"secretName": "mq"},
                    "caRef": CA_MAP,
                }
            },
            ("mq", "spec.endpoint.amqp.credentialsRef"),
            ("ca-map", "spec.endpoint.amqp.caRef"),
            {"mq"},
        ),
        (
            {
                "kafka": {
                    "url": "kafka://b",
                    "useSSL": True,
                    "sasl": {"credentialsRef": {"secretName": "k"}},
                    "caRef": CA_SECRET,
                }
            },
            ("k", "spec.endpoint.kafka.sasl.credentialsRef"),
            ("ca-secret", "spec.endpoint.kafka.caRef"),
            {"k", "ca-secret"},
        ),
    ],
    ids=["http", "https-ca", "amqps", "kafka-sasl"],
)
def test_each_kind_says_which_secrets_and_ca_it_uses_and_where(
    endpoint: dict[str, object],
    credentials: tuple[str, str] | None,
    ca: tuple[str, str] | None,
    secrets: set[str],
) -> None:
    model = Endpoint.model_validate(endpoint)
    found = model.credentials_ref()
    assert (found and (found[0].secret_name, found[1])) == credentials
    found_ca = model.ca_ref()
    assert (found_ca and (found_ca[0].name, found_ca[1])) == ca
    assert model.secret_names() == secrets
    assert model.kind in ENDPOINT_KINDS


def test_no_module_but_the_api_model_reads_an_endpoints_references() -> None:
    # `.credentials_ref` or `.ca_ref` as attributes of an endpoint kind (a call of the
    # model's methods has parentheses).
    reads = re.compile(r"\.(?:credentials_ref|ca_ref)\b(?!\()")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        if "api" not in path.relative_to(PACKAGE).parts
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if reads.search(line)
    ]
    assert not found, f"endpoint references worked out outside api/topic.py: {found}"
