"""Session fixtures: the real services every integration test talks to."""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests import localservices
from tests.install.manifests import helm_binary
from tests.kubectl import Kubectl
from tests.localservices import LocalService

# The operator fixtures live beside the helpers they use.
pytest_plugins = ["tests.operator", "tests.delivery"]


def _service(name: str) -> Iterator[LocalService]:
    service = localservices.start(name)
    try:
        yield service
    finally:
        localservices.stop(service)


def gateway_abort(rgw: LocalService) -> str | None:
    """What the gateway's log says of its end when its process is gone, else None."""
    log = Path(rgw["CEPH_LOG"])
    try:
        os.kill(int((log.parent / "rgw.pid").read_text()), 0)
        return None
    except (OSError, ValueError):
        pass
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    start = next((i for i, line in enumerate(lines) if "Caught signal" in line), len(lines))
    return "\n".join(lines[max(start - 3, 0) : start + 12]) or "(its log says nothing)"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that failed because the gateway died says so, with the gateway's own words:
    the next tests only see a refused connection, and a restart wipes the log."""
    report = yield
    rgw = getattr(item, "funcargs", {}).get("rgw")
    if report.failed and rgw is not None:
        abort = gateway_abort(rgw)
        if abort is not None:
            report.sections.append(("the gateway's process is gone", abort))
    return report


@pytest.fixture(scope="session")
def kube() -> Iterator[LocalService]:
    """etcd + kube-apiserver with RBAC; ``KUBECONFIG_ADMIN`` and ``KUBECONFIG_NOBODY``."""
    yield from _service("kube")


@pytest.fixture(scope="session")
def rgw() -> Iterator[LocalService]:
    """A one-mon, one-OSD Ceph cluster with radosgw; ``RGW_ENDPOINT`` and the test keys."""
    yield from _service("ceph")


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[LocalService]:
    """A RabbitMQ node on loopback; ``AMQP_URL``."""
    yield from _service("rabbitmq")


@pytest.fixture(scope="session")
def rabbitmq_mtls() -> Iterator[LocalService]:
    """A second RabbitMQ node whose AMQPS listener (``AMQPS_PORT``, CA ``AMQP_CA_PEM``)
    requires a client certificate: ``AMQP_CLIENT_CERT``, ``AMQP_CLIENT_KEY``,
    ``AMQP_CLIENT_ENCRYPTED_KEY`` and ``AMQP_CLIENT_KEY_PASSWORD`` (files) hold one."""
    yield from _service("rabbitmq-mtls")


@pytest.fixture(scope="session")
def kafka() -> Iterator[LocalService]:
    """A single KRaft Kafka broker; ``KAFKA_BOOTSTRAP`` (PLAINTEXT), ``KAFKA_SASL_BOOTSTRAP``
    (SASL_PLAINTEXT: ``KAFKA_SCRAM_USER``/``KAFKA_SCRAM_PASSWORD``), ``KAFKA_SSL_BOOTSTRAP``
    (SSL, its CA in the file ``KAFKA_CA_PEM``), ``KAFKA_MTLS_BOOTSTRAP`` (SSL that requires
    a client certificate: ``KAFKA_CLIENT_CERT``, ``KAFKA_CLIENT_KEY``, ... files)."""
    yield from _service("kafka")


@pytest.fixture(scope="session")
def kubectl(kube: LocalService) -> Kubectl:
    """kubectl as the cluster admin."""
    return Kubectl.admin(kube)


@pytest.fixture(scope="session")
def crds(kubectl: Kubectl) -> None:
    """The CRDs of crds/ installed and Established, as `kubectl apply -f crds/` does."""
    kubectl.install_crds()


@pytest.fixture()
def namespace(kubectl: Kubectl) -> str:
    """A fresh namespace (never deleted: the local control plane has no namespace controller)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl.run("create", "namespace", name)
    return name


@pytest.fixture(scope="session")
def helm_bin() -> str:
    """helm from its Go module (deploy/local/helm.sh); a build that fails fails the test,
    it never skips."""
    try:
        return helm_binary()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
