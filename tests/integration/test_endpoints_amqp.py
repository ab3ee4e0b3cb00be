"""The AMQP 0.9.1 endpoint against the real RabbitMQ: ack levels, a missing exchange,
credentials and vhosts, amqps to the broker's TLS listener, and recovery from lost connections.

The shared broker is never restarted: a broker-side close of our own connection
(``rabbitmqctl close_connection``) and an outage of a TCP proxy in front of the broker stand
in for a restart, which is what a client sees of one.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

from bucketnotify.api.topic import Endpoint as EndpointSpec
from bucketnotify.delivery.endpoints import (
    Delivery,
    Endpoint,
    EndpointSettings,
    PushOutcome,
    open_endpoint,
)
from bucketnotify.delivery.model.push import event_body
from devstack.programs import free_port
from devstack.servers.tcpproxy import TcpProxy
from tests.localservices import LocalService
from tests.records import s3_record
from tests.tls import make_ca


@pytest.fixture()
async def channel(rabbitmq: LocalService) -> AsyncIterator[AbstractChannel]:
    connection = await aio_pika.connect(rabbitmq["AMQP_URL"])
    async with connection:
        yield await connection.channel()


@pytest.fixture()
async def exchange(channel: AbstractChannel) -> AsyncIterator[AbstractExchange]:
    """A topic exchange of this test's own, with no queue bound yet."""
    declared = await channel.declare_exchange(
        f"bn-ep-{uuid.uuid4().hex[:8]}", aio_pika.ExchangeType.TOPIC, auto_delete=False
    )
    yield declared
    await declared.delete()


async def bound_queue(
    channel: AbstractChannel, exchange: AbstractExchange, key: str
) -> AbstractQueue:
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(exchange, routing_key=key)
    return queue


async def drain(queue: AbstractQueue, count: int, timeout_s: float = 10) -> list[Any]:
    messages = []
    for _ in range(count):
        message = await queue.get(timeout=timeout_s, fail=True)
        assert message is not None
        await message.ack()
        messages.append(message)
    return messages


def amqp_endpoint(
    url: str,
    exchange: str,
    *,
    topic: str = "events",
    credentials: tuple[str, str] | None = None,
    ca_pem: str | None = None,
    settings: EndpointSettings | None = None,
    **fields: Any,
) -> Endpoint:
    spec = EndpointSpec.model_validate({"amqp": {"url": url, "exchange": exchange, **fields}})
    return open_endpoint(
        spec,
        endpoint_topic=topic,
        credentials=credentials,
        ca_pem=ca_pem,
        settings=settings or EndpointSettings(),
    )


def broker_url(rabbitmq: LocalService, path: str = "") -> str:
    return f"amqp://{rabbitmq['AMQP_HOST']}:{rabbitmq['AMQP_PORT']}{path}"


def deliveries(n: int, prefix: str = "e") -> list[Delivery]:
    return [Delivery(f"{prefix}{i}", s3_record(key=f"obj-{prefix}{i}")) for i in range(n)]


@pytest.mark.parametrize("ack_level", ["none", "broker", "routable"])
async def test_every_ack_level_publishes_the_gateway_body_by_endpoint_topic(
    rabbitmq: LocalService,
    channel: AbstractChannel,
    exchange: AbstractExchange,
    ack_level: str,
) -> None:
    """The body is {"Records":[record]}, the routing key the endpoint topic; with confirms
    the message is persistent, as the gateway publishes it."""
    queue = await bound_queue(channel, exchange, "my-endpoint-topic")
    batch = deliveries(3)
    async with amqp_endpoint(
        broker_url(rabbitmq), exchange.name, topic="my-endpoint-topic", ackLevel=ack_level
    ) as endpoint:
        outcomes = await endpoint.send(batch)
    assert [(o.id, o.ok) for o in outcomes] == [(d.id, True) for d in batch], outcomes
    messages = await drain(queue, 3)
    assert sorted(m.body for m in messages) == sorted(event_body(d.record) for d in batch)
    assert json.loads(messages[0].body)["Records"][0]["s3"]["bucket"]["name"] == "mybucket1"
    assert {m.routing_key for m in messages} == {"my-endpoint-topic"}
    persistent = aio_pika.DeliveryMode.PERSISTENT
    assert {m.delivery_mode == persistent for m in messages} == {ack_level != "none"}


async def test_routable_is_retried_until_a_queue_is_bound(
    rabbitmq: LocalService, channel: AbstractChannel, exchange: AbstractExchange
) -> None:
    """routable: a message no queue is bound for comes back and is retried; once a queue is
    bound the retry is delivered. broker acks the same unroutable message (as the gateway)."""
    async with amqp_endpoint(broker_url(rabbitmq), exchange.name, ackLevel="routable") as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", s3_record())])
        assert not outcome.ok and outcome.retryable
        assert outcome.error is not None
        assert "unroutable" in outcome.error and "NO_ROUTE" in outcome.error
        assert repr(exchange.name) in outcome.error and "'events'" in outcome.error

        queue = await bound_queue(channel, exchange, "events")
        [retry] = await endpoint.send([Delivery("e1", s3_record(key="retried"))])
        assert retry.ok, retry
    [message] = await drain(queue, 1)
    assert json.loads(message.body)["Records"][0]["s3"]["object"]["key"] == "retried"

    async with amqp_endpoint(broker_url(rabbitmq), exchange.name, topic="nobody") as endpoint:
        [outcome] = await endpoint.send([Delivery("e2", s3_record())])
    assert outcome.ok, "ack level broker takes the broker's ack, routed or not"


async def test_a_missing_exchange_is_reported_and_recovers_once_created(
    rabbitmq: LocalService, channel: AbstractChannel
) -> None:
    """The exchange is declared passively: a missing one is a retryable error naming it and
    the vhost, every time; after it is created the next batch is delivered."""
    name = f"bn-missing-{uuid.uuid4().hex[:8]}"
    async with amqp_endpoint(broker_url(rabbitmq), name) as endpoint:
        for _ in range(2):
            outcomes = await endpoint.send(deliveries(2))
            assert [(o.ok, o.retryable) for o in outcomes] == [(False, True)] * 2
            assert outcomes[0].error == (
                f"exchange {name!r} does not exist in vhost '/'; create it (a topic exchange)"
                " on the broker"
            )
        created = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC)
        try:
            queue = await bound_queue(channel, created, "events")
            outcomes = await endpoint.send(deliveries(2))
            assert all(o.ok for o in outcomes), outcomes
            await drain(queue, 2)
        finally:
            await created.delete()


async def test_credentials_and_vhost_from_the_topic(
    rabbitmq: LocalService, rabbitmq_vhost_exchange: tuple[AbstractExchange, AbstractQueue]
) -> None:
    """User and password from the Secret and the vhost from either the field or the URL."""
    exchange, queue = rabbitmq_vhost_exchange
    credentials = (rabbitmq["AMQP_USER"], rabbitmq["AMQP_PASSWORD"])
    for url, vhost in (
        (broker_url(rabbitmq), "bucketnotify"),
        (broker_url(rabbitmq, "/bucketnotify"), None),
    ):
        fields: dict[str, Any] = {"vhost": vhost} if vhost else {}
        async with amqp_endpoint(url, exchange.name, credentials=credentials, **fields) as endpoint:
            [outcome] = await endpoint.send([Delivery("e1", s3_record())])
        assert outcome.ok, outcome
    await drain(queue, 2)


@pytest.fixture()
async def rabbitmq_vhost_exchange(
    rabbitmq: LocalService,
) -> AsyncIterator[tuple[AbstractExchange, AbstractQueue]]:
    """An exchange and a bound queue on the vhost "bucketnotify", as the test user."""
    url = (
        f"amqp://{rabbitmq['AMQP_USER']}:{rabbitmq['AMQP_PASSWORD']}@{rabbitmq['AMQP_HOST']}"
        f":{rabbitmq['AMQP_PORT']}/bucketnotify"
    )
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(
            f"bn-vhost-{uuid.uuid4().hex[:8]}", aio_pika.ExchangeType.TOPIC
        )
        queue = await bound_queue(channel, exchange, "events")
        yield exchange, queue
        await exchange.delete()


def open_connections() -> set[int]:
    """aio-pika connections not closed. One dropped unclosed closes itself from ``__del__``
    only if the collection runs on its event loop's thread; elsewhere its socket stays open
    and Python warns that ``Connection.close`` was never awaited."""
    gc.collect()
    return {
        id(o) for o in gc.get_objects() if isinstance(o, aio_pika.Connection) and not o.is_closed
    }


async def test_wrong_credentials_are_reported_without_printing_them(
    rabbitmq: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused login is a retryable authentication error. The outcome shows neither the
    user name nor the password, no log line (DEBUG included) the password. The failed
    connection is closed, not left to the garbage collector."""
    user, password = "bn-nobody-7f3a", "Wr0ng-p4ssw0rd-e1b9"
    caplog.set_level(logging.DEBUG)
    before = open_connections()
    async with amqp_endpoint(
        broker_url(rabbitmq, "/bucketnotify"), "amq.topic", credentials=(user, password)
    ) as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", s3_record())])
        assert open_connections() <= before
    assert not outcome.ok and outcome.retryable
    assert outcome.error is not None and "refused the credentials" in outcome.error
    for text in (outcome.error, repr(outcome)):
        assert password not in text
        assert user not in text
    assert password not in caplog.text


async def test_an_unreachable_broker_fails_pushes_retryably() -> None:
    """Nothing listens: the whole batch fails at once with a retryable connect error, and
    the failed connection is closed."""
    port = free_port()
    before = open_connections()
    async with amqp_endpoint(f"amqp://127.0.0.1:{port}", "x") as endpoint:
        outcomes = await endpoint.send(deliveries(3))
        assert open_connections() <= before
    assert [(o.ok, o.retryable) for o in outcomes] == [(False, True)] * 3
    assert outcomes[0].error is not None and f"amqp://127.0.0.1:{port}" in outcomes[0].error


def close_connection_from_the_broker(rabbitmq: LocalService, connection_name: str) -> None:
    """rabbitmqctl close_connection for the one connection of this name (no one else's)."""
    ctl = rabbitmq["RABBITMQCTL"]
    listed = subprocess.run(
        [ctl, "list_connections", "pid", "client_properties", "--no-table-headers", "-q"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    pids = [
        line.split("\t", 1)[0]
        for line in listed.splitlines()
        if f'{{"connection_name","{connection_name}"}}' in line
    ]
    assert len(pids) == 1, listed
    subprocess.run(
        [ctl, "close_connection", pids[0], "bucketnotify endpoint test"],
        capture_output=True,
        check=True,
        timeout=60,
    )


async def test_a_connection_closed_by_the_broker_is_reopened(
    rabbitmq: LocalService, channel: AbstractChannel, exchange: AbstractExchange
) -> None:
    """After the broker closes the pooled connection, the next batch connects again."""
    queue = await bound_queue(channel, exchange, "events")
    async with amqp_endpoint(broker_url(rabbitmq), exchange.name) as endpoint:
        assert all(o.ok for o in await endpoint.send(deliveries(2, "before")))
        close_connection_from_the_broker(rabbitmq, f"bucketnotify {exchange.name}")
        outcomes = await send_until_acked(endpoint, deliveries(2, "after"), within_s=15)
    assert all(o.ok for o in outcomes)
    bodies = {
        json.loads(m.body)["Records"][0]["s3"]["object"]["key"] for m in await drain(queue, 4)
    }
    assert bodies == {"obj-before0", "obj-before1", "obj-after0", "obj-after1"}


async def send_until_acked(
    endpoint: Endpoint, batch: list[Delivery], *, within_s: float
) -> list[PushOutcome]:
    """What the delivery worker does: resend what was not acknowledged until all is."""
    deadline = asyncio.get_running_loop().time() + within_s
    pending = {d.id: d for d in batch}
    acked: dict[str, PushOutcome] = {}
    while pending:
        for outcome in await endpoint.send(list(pending.values())):
            assert outcome.ok or outcome.retryable, outcome
            if outcome.ok:
                acked[outcome.id] = outcome
                del pending[outcome.id]
        if pending:
            assert asyncio.get_running_loop().time() < deadline, f"still failing: {pending}"
            await asyncio.sleep(0.2)
    return [acked[d.id] for d in batch]


async def test_batches_share_one_pooled_connection(
    rabbitmq: LocalService, channel: AbstractChannel, exchange: AbstractExchange
) -> None:
    """One connection per endpoint, reused by every batch."""
    queue = await bound_queue(channel, exchange, "events")
    proxy = TcpProxy(rabbitmq["AMQP_HOST"], int(rabbitmq["AMQP_PORT"]))
    proxy.start()
    try:
        async with amqp_endpoint(f"amqp://127.0.0.1:{proxy.port}", exchange.name) as endpoint:
            for n in range(3):
                assert all(o.ok for o in await endpoint.send(deliveries(4, f"b{n}-")))
    finally:
        proxy.stop()
    assert proxy.accepted == 1
    await drain(queue, 12)


async def test_an_outage_under_a_steady_stream_loses_nothing(
    rabbitmq: LocalService, channel: AbstractChannel, exchange: AbstractExchange
) -> None:
    """The broker becomes unreachable (every connection cut, connects refused) in the middle
    of a stream and comes back: pushes fail retryably meanwhile, nothing raises, and with
    the worker's retries every event arrives."""
    queue = await bound_queue(channel, exchange, "events")
    proxy = TcpProxy(rabbitmq["AMQP_HOST"], int(rabbitmq["AMQP_PORT"]))
    proxy.start()
    failures: list[PushOutcome] = []
    settings = EndpointSettings(connect_timeout_s=1, message_timeout_s=2)
    async with amqp_endpoint(
        f"amqp://127.0.0.1:{proxy.port}", exchange.name, settings=settings
    ) as endpoint:
        # The outage starts at a fixed point of the stream, not after a sleep: on a busy
        # machine a timed outage can miss the stream altogether.
        for n in range(30):
            batch = deliveries(5, f"s{n}-")
            if n == 10:
                proxy.stop()
            first = await endpoint.send(batch)
            failures.extend(o for o in first if not o.ok)
            if n == 10:
                await asyncio.sleep(1.0)
                proxy.start()
            await send_until_acked(endpoint, batch, within_s=30)
    proxy.stop()
    assert failures, "the outage did not hit the stream"
    assert all(o.retryable for o in failures)
    # At least once: a push whose confirmation the outage swallowed was sent again.
    expected = {f"obj-s{n}-{i}" for n in range(30) for i in range(5)}
    seen: set[str] = set()
    while not expected <= seen:
        [message] = await drain(queue, 1)
        seen.add(json.loads(message.body)["Records"][0]["s3"]["object"]["key"])
    assert seen == expected
    assert proxy.accepted >= 2, "the endpoint never reconnected"


async def test_amqps_verifies_the_broker_with_the_topics_ca(
    rabbitmq: LocalService,
    channel: AbstractChannel,
    exchange: AbstractExchange,
    tmp_path: Path,
) -> None:
    """amqps to the broker's own TLS listener: its CA connects and publishes with the
    Secret's user, another CA is refused (retryably) with the reason, verifySSL: false
    connects anyway, and only the accepted pushes reach the queue."""
    broker_ca = await asyncio.to_thread(Path(rabbitmq["AMQP_CA_PEM"]).read_text)
    other = make_ca(tmp_path, "not-the-brokers-ca")
    queue = await bound_queue(channel, exchange, "events")
    url = f"amqps://{rabbitmq['AMQP_HOST']}:{rabbitmq['AMQPS_PORT']}"
    user = (rabbitmq["AMQP_USER"], rabbitmq["AMQP_PASSWORD"])

    async with amqp_endpoint(url, exchange.name, credentials=user, ca_pem=broker_ca) as endpoint:
        [outcome] = await endpoint.send([Delivery("right-ca", s3_record(key="right-ca"))])
    assert outcome.ok, outcome

    async with amqp_endpoint(url, exchange.name, credentials=user, ca_pem=other.pem) as endpoint:
        [outcome] = await endpoint.send([Delivery("wrong-ca", s3_record(key="wrong-ca"))])
    assert not outcome.ok and outcome.retryable
    assert outcome.error is not None and "certificate verification failed" in outcome.error

    async with amqp_endpoint(
        url, exchange.name, credentials=user, ca_pem=other.pem, verifySSL=False
    ) as endpoint:
        [outcome] = await endpoint.send([Delivery("no-verify", s3_record(key="no-verify"))])
    assert outcome.ok, outcome

    keys = [json.loads(m.body)["Records"][0]["s3"]["object"]["key"] for m in await drain(queue, 2)]
    assert sorted(keys) == ["no-verify", "right-ca"]
    assert await queue.get(timeout=1, fail=False) is None
