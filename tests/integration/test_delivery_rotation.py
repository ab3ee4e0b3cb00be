"""A rotated broker password reaches a running delivery replica: no restart, nothing lost.

The replica runs as a real process against the real apiserver and RabbitMQ, with a user of
the test's own; the test plays the gateway (it POSTs to the ingest with the Topic's token)
and the operator (it creates the token Secret).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aio_pika
import pytest

from bucketnotify.api.topic import ClientCertificate
from devstack.servers.recording import RecordingHttpServer
from devstack.servers.tcpproxy import TcpProxy
from tests.delivery import push_records, wait_ready
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.processes import Program, free_port
from tests.resources import apply, token_secret
from tests.tls import issue_client_certificate, issue_server_certificate, make_ca
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

REFRESH_S = 2
"""The replica's SECRET_REFRESH_SECONDS here (30 by default)."""


def broker_password() -> str:
    # Never with a leading '-', which rabbitmqctl would read as an option (a CI run failed
    # on `change_password <user> -xww3...`, exit 64).
    return f"pw{secrets.token_urlsafe(12)}"


def ctl(rabbitmq: LocalService, *args: str) -> str:
    return subprocess.run(
        [rabbitmq["RABBITMQCTL"], *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


@pytest.fixture()
def broker_user(rabbitmq: LocalService) -> Iterator[str]:
    """A RabbitMQ user of this test's own, so rotating its password touches nobody else."""
    user = f"rot-{uuid.uuid4().hex[:8]}"
    ctl(rabbitmq, "add_user", user, broker_password())
    ctl(rabbitmq, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
    yield user
    ctl(rabbitmq, "delete_user", user)


@pytest.fixture()
async def consumed(rabbitmq: LocalService) -> AsyncIterator[tuple[str, list[str]]]:
    """An exchange of the test's own and the object keys of every message routed through it."""
    exchange_name = f"rot-{uuid.uuid4().hex[:8]}"
    keys: list[str] = []
    connection = await aio_pika.connect_robust(rabbitmq["AMQP_URL"])
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.TOPIC)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, routing_key="#")

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                body = json.loads(message.body)
                keys.extend(r["s3"]["object"]["key"] for r in body["Records"])

        await queue.consume(take)
        yield exchange_name, keys
        await exchange.delete()


StartReplica = Callable[[], tuple[int, Program]]


@pytest.fixture()
def start_replica(kube: LocalService, namespace: str, tmp_path: Path) -> StartReplica:
    """One delivery replica (the Secrets read again every REFRESH_S), Ready; the test stops
    it."""

    def start() -> tuple[int, Program]:
        port = free_port()
        replica = Program(
            ["delivery"],
            {
                "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
                "BUCKETNOTIFY_DELIVERY_STORE": f"dir://{tmp_path / 'queues'}",
                "BUCKETNOTIFY_DELIVERY_LISTEN_PORT": str(port),
                "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": namespace,
                "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([namespace]),
                "BUCKETNOTIFY_DELIVERY_IDENTITY": "replica-rot",
                "BUCKETNOTIFY_DELIVERY_SECRET_REFRESH_SECONDS": str(REFRESH_S),
                # The local RabbitMQ has no TLS listener.
                "BUCKETNOTIFY_DELIVERY_ALLOW_CLEARTEXT_SECRETS": "true",
            },
        )
        wait_ready(port, replica)
        return port, replica

    return start


def close_connections_of(rabbitmq: LocalService, user: str) -> int:
    listed = ctl(rabbitmq, "list_connections", "pid", "user", "--no-table-headers", "-q")
    pids = [line.split("\t")[0] for line in listed.splitlines() if line.endswith(f"\t{user}")]
    for pid in pids:
        ctl(rabbitmq, "close_connection", pid, "password rotated")
    return len(pids)


async def test_a_rotated_broker_password_is_used_without_a_restart_and_nothing_is_lost(
    kubectl: Kubectl,
    namespace: str,
    rabbitmq: LocalService,
    broker_user: str,
    consumed: tuple[str, list[str]],
    start_replica: StartReplica,
) -> None:
    """The broker's password changes and its connections are closed: pushes fail (the events
    wait in the queue) until the Secret holds the new password, which the replica reads
    within SECRET_REFRESH_SECONDS and uses on a new connection; every event arrives once."""
    exchange, keys = consumed
    old_password = broker_password()
    ctl(rabbitmq, "change_password", broker_user, old_password)
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "mq-rot", "namespace": namespace},
            "stringData": {"username": broker_user, "password": old_password},
        }
    )
    apply(
        kubectl,
        namespace,
        "Topic",
        "mq",
        {
            "endpoint": {
                "amqp": {
                    "url": f"amqp://{rabbitmq['AMQP_HOST']}:{rabbitmq['AMQP_PORT']}",
                    "exchange": exchange,
                    "credentialsRef": {"secretName": "mq-rot"},
                }
            },
            "persistent": True,
            "delivery": {"shards": 1},
        },
    )
    token = token_secret(kubectl, namespace, "mq")
    port, replica = start_replica()
    try:
        before = [f"before-{i}" for i in range(5)]
        assert push_records(port, namespace, "mq", token, before) == 200
        await async_wait(lambda: sorted(keys) == before, 30, "the events before the rotation")

        new_password = broker_password()
        ctl(rabbitmq, "change_password", broker_user, new_password)
        assert close_connections_of(rabbitmq, broker_user) >= 1
        during = [f"during-{i}" for i in range(5)]
        assert push_records(port, namespace, "mq", token, during) == 200
        # Refused by the broker for as long as the Secret holds the old password.
        await asyncio.sleep(2 * REFRESH_S + 1)
        assert sorted(keys) == before

        kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "mq-rot", "namespace": namespace},
                "stringData": {"username": broker_user, "password": new_password},
            }
        )
        await async_wait(
            lambda: sorted(keys) == before + during, 30 + 2 * REFRESH_S, "the waiting events"
        )
        after = [f"after-{i}" for i in range(5)]
        assert push_records(port, namespace, "mq", token, after) == 200
        await async_wait(
            lambda: sorted(keys) == sorted(before + during + after), 30, "the events after it"
        )
        assert replica.process.poll() is None, "the replica kept running"
    finally:
        replica.stop()
        log = replica.log()
        print(f"--- delivery log ---\n{log[-4000:]}")
    for password in (old_password, new_password):
        assert password not in log


async def async_wait(done: Callable[[], bool], seconds: float, what: str) -> None:
    """``wait_until`` for a condition that the event loop of this test makes true (the
    consumer runs on it, so a blocking wait would starve it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not done():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {what}")
        await asyncio.sleep(0.2)


def test_a_rotated_ca_bundle_is_used_without_a_restart_and_nothing_is_lost(
    kubectl: Kubectl, namespace: str, start_replica: StartReplica, tmp_path: Path
) -> None:
    """The HTTPS endpoint's certificate is replaced by one of another CA: pushes fail (the
    events wait) until the Topic's CA ConfigMap holds the new CA, which the replica reads
    within SECRET_REFRESH_SECONDS; every event arrives once."""
    ca_one, ca_two = make_ca(tmp_path / "pki1", "ca-one"), make_ca(tmp_path / "pki2", "ca-two")
    cert_one = issue_server_certificate(ca_one, tmp_path / "one", "one")
    cert_two = issue_server_certificate(ca_two, tmp_path / "two", "two")
    with (
        RecordingHttpServer(ssl_context=cert_one.server_context()) as one,
        RecordingHttpServer(ssl_context=cert_two.server_context()) as two,
    ):
        # One address for the endpoint, whichever server is behind it.
        proxy = TcpProxy("127.0.0.1", port_of(one))
        proxy.start()
        ca_config_map(kubectl, namespace, ca_one.pem)
        apply(
            kubectl,
            namespace,
            "Topic",
            "hook",
            {
                "endpoint": {
                    "http": {
                        "url": f"https://127.0.0.1:{proxy.port}/hook",
                        "caRef": {"kind": "ConfigMap", "name": "ca-rot"},
                    }
                },
                "persistent": True,
                "delivery": {"shards": 1},
            },
        )
        token = token_secret(kubectl, namespace, "hook")
        port, replica = start_replica()
        try:
            before = [f"before-{i}" for i in range(5)]
            assert push_records(port, namespace, "hook", token, before) == 200
            at_one: list[str] = []
            at_two: list[str] = []
            wait_until(lambda: collect(one, at_one), lambda k: sorted(k) == before, 30, "before")

            # The certificate changes (open connections close, as when a server restarts).
            proxy.stop()
            proxy.point_at("127.0.0.1", port_of(two))
            proxy.start()
            during = [f"during-{i}" for i in range(5)]
            assert push_records(port, namespace, "hook", token, during) == 200
            time.sleep(2 * REFRESH_S + 1)
            # Refused by the replica's TLS check for as long as the bundle holds the old CA.
            # A round's pushes go out side by side, so arrival order is not the key order.
            assert sorted(collect(one, at_one)) == before and collect(two, at_two) == []

            ca_config_map(kubectl, namespace, ca_two.pem)
            wait_until(
                lambda: collect(two, at_two), lambda k: sorted(k) == during, 30, "the waiting"
            )
            after = [f"after-{i}" for i in range(5)]
            assert push_records(port, namespace, "hook", token, after) == 200
            wait_until(
                lambda: collect(two, at_two),
                lambda k: sorted(k) == sorted(during + after),
                30,
                "after",
            )
            assert sorted(at_one) == before  # each once, at the server it was pushed to
            assert replica.process.poll() is None, "the replica kept running"
        finally:
            proxy.stop()
            replica.stop()
            print(f"--- delivery log ---\n{replica.log()[-4000:]}")


def port_of(server: RecordingHttpServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def collect(server: RecordingHttpServer, keys: list[str]) -> list[str]:
    """``keys`` with the object keys of the requests the server took since the last call."""
    keys.extend(
        record["s3"]["object"]["key"]
        for request in server.received()
        for record in json.loads(request.body)["Records"]
    )
    return keys


def ca_config_map(kubectl: Kubectl, namespace: str, pem: str) -> None:
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "ca-rot", "namespace": namespace},
            "data": {"ca.crt": pem},
        }
    )


def test_a_rotated_client_certificate_is_used_without_a_restart_and_nothing_is_lost(
    kubectl: Kubectl, namespace: str, start_replica: StartReplica, tmp_path: Path
) -> None:
    """The receiver requires a client certificate of its CA; the Topic's Secret holds one of
    another CA, so pushes are refused (the events wait, the reason is the receiver's) until
    the Secret holds the right one, which the replica reads within SECRET_REFRESH_SECONDS:
    every event arrives once, the key never in the log."""
    trusted, other = make_ca(tmp_path / "t", "trusted-ca"), make_ca(tmp_path / "o", "other-ca")
    server = issue_server_certificate(trusted, tmp_path / "srv", "receiver")
    context = server.server_context()
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(trusted.cert)
    wrong = issue_client_certificate(other, tmp_path / "wrong", "delivery")
    right = issue_client_certificate(trusted, tmp_path / "right", "delivery", password="pw-tls")
    with RecordingHttpServer(ssl_context=context) as receiver:
        ca_config_map(kubectl, namespace, trusted.pem)
        tls_secret(kubectl, namespace, wrong)
        apply(
            kubectl,
            namespace,
            "Topic",
            "mtls",
            {
                "endpoint": {
                    "http": {
                        "url": f"{receiver.url}/hook",
                        "caRef": {"kind": "ConfigMap", "name": "ca-rot"},
                        "clientCertificateRef": {
                            "secretName": "client-tls",
                            "keyPasswordKey": "password",
                        },
                    }
                },
                "persistent": True,
                "retrySleepDuration": 1,
                "delivery": {"shards": 1},
            },
        )
        token = token_secret(kubectl, namespace, "mtls")
        port, replica = start_replica()
        try:
            waiting = [f"waiting-{i}" for i in range(5)]
            assert push_records(port, namespace, "mtls", token, waiting) == 200
            time.sleep(2 * REFRESH_S + 1)
            got: list[str] = []
            assert collect(receiver, got) == [], "refused without the right certificate"

            tls_secret(kubectl, namespace, right)
            wait_until(lambda: collect(receiver, got), lambda k: sorted(k) == waiting, 30, "all")
            assert sorted(got) == waiting
            assert replica.process.poll() is None, "the replica kept running"
            log = replica.log()
            for secret in (wrong.private_key, right.private_key, "pw-tls"):
                assert secret not in log
        finally:
            replica.stop()
            print(f"--- delivery log ---\n{replica.log()[-4000:]}")


def tls_secret(kubectl: Kubectl, namespace: str, client: ClientCertificate) -> None:
    """The Secret ``client-tls`` of type kubernetes.io/tls (as cert-manager writes one)."""
    data = {"tls.crt": client.certificate, "tls.key": client.private_key}
    if client.password is not None:
        data["password"] = client.password
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": "client-tls", "namespace": namespace},
            "stringData": data,
        }
    )
