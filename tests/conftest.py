"""Session fixtures: the real services every integration test talks to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import localservices
from tests.localservices import LocalService


def _service(name: str) -> Iterator[LocalService]:
    service = localservices.start(name)
    try:
        yield service
    finally:
        localservices.stop(service)


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
def kafka() -> Iterator[LocalService]:
    """A single KRaft Kafka broker; ``KAFKA_BOOTSTRAP``."""
    yield from _service("kafka")
