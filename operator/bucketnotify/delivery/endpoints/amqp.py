"""AMQP 0.9.1 endpoint: publish to an existing exchange, routing key = the endpoint topic.

As the gateway does it: ``amqp[s]://host[:port][/vhost]`` (5672 or 5671), user and password
from a Secret (guest/guest by default), ``verifySSL`` and a CA bundle for amqps. The
exchange must exist: it is declared passively, and a missing one fails every push with a
``DestinationNotFound`` naming it (retryable: creating the exchange lets the events flow).

Ack levels:

- ``none``: no publisher confirms; an event written to the connection is delivered.
- ``broker``: publisher confirms; the broker's ack is the acknowledgement, a nack a failure.
  Persistent messages (delivery mode 2), as the gateway publishes them with confirms.
- ``routable``: publisher confirms and ``mandatory``: a message the exchange cannot route to
  any queue comes back (basic.return) and is a failure to retry. The gateway accepts the
  ack of such a message; we do not.

One connection and one channel per endpoint, opened on the first ``send`` and reopened by
a later ``send`` once the broker closed either (restart, connection killed, channel error):
while the broker is down every push fails with a ``ConnectError``, nothing raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from pamqp.commands import Basic

from bucketnotify.api.topic import AmqpEndpoint, ClientCertificate, Credentials
from bucketnotify.delivery.endpoints.base import BaseEndpoint, EndpointSettings, InFlightLimit
from bucketnotify.delivery.endpoints.errors import (
    AuthenticationError,
    ConfigurationError,
    ConnectError,
    DestinationNotFound,
    EndpointError,
    RejectedError,
    TransportError,
    UndeliverableError,
)
from bucketnotify.delivery.endpoints.tls import client_context, describe_tls_failure

__all__ = ["AmqpPusher", "AmqpTarget", "parse_amqp_url"]

DEFAULT_CREDENTIALS = Credentials("guest", "guest")


@dataclass(frozen=True)
class AmqpTarget:
    """Where to connect: host, port, vhost and whether with TLS."""

    host: str
    port: int
    vhost: str
    tls: bool

    def __repr__(self) -> str:
        scheme = "amqps" if self.tls else "amqp"
        return f"{scheme}://{self.host}:{self.port} vhost {self.vhost!r}"


def parse_amqp_url(url: str, vhost: str | None) -> AmqpTarget:
    """Host, port (5672, or 5671 for amqps) and vhost (``vhost``, else the URL's path, else
    ``/``; ``%2f`` in the path is ``/``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise ConfigurationError("the url must be amqp[s]://<host>[:<port>][/<vhost>]")
    if parts.username or parts.password:
        raise ConfigurationError("the url must not carry credentials; use credentialsRef")
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError("the url has an invalid port") from None
    tls = parts.scheme == "amqps"
    path_vhost = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    return AmqpTarget(
        host=parts.hostname,
        port=port or (5671 if tls else 5672),
        vhost=vhost or path_vhost or "/",
        tls=tls,
    )


class AmqpPusher(BaseEndpoint):
    """Publishes each event to one exchange over one pooled connection and channel."""

    kind = "amqp"

    def __init__(
        self,
        spec: AmqpEndpoint,
        *,
        endpoint_topic: str,
        credentials: tuple[str, str] | None,
        ca_pem: str | None,
        settings: EndpointSettings,
        in_flight: InFlightLimit | None = None,
        client: ClientCertificate | None = None,
    ) -> None:
        login, password = credentials or DEFAULT_CREDENTIALS
        super().__init__(settings=settings, in_flight=in_flight, secrets=(login, password))
        self._target = parse_amqp_url(spec.url, spec.vhost)
        self._credentials = Credentials(login, password)
        self._exchange_name = spec.exchange
        self._routing_key = endpoint_topic
        self._ack_level = spec.ack_level
        self._ssl_context: ssl.SSLContext | None = None
        if self._target.tls:
            self._ssl_context = client_context(verify=spec.verify_ssl, ca_pem=ca_pem, client=client)
        self._lock = asyncio.Lock()
        self._connection: AbstractConnection | None = None
        self._connection_lost = False
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None

    async def _connect(self) -> None:
        async with self._lock:
            if self._usable():
                return
            with self._map_errors("connecting"):
                async with asyncio.timeout(self._settings.connect_timeout_s):
                    await self._open()

    def _connection_open(self) -> bool:
        # aio-pika's is_closed turns true only on close(); a connection the broker or the
        # network dropped is reported through close_callbacks (_on_connection_closed).
        return (
            self._connection is not None
            and not self._connection.is_closed
            and not self._connection_lost
        )

    def _on_connection_closed(self, sender: object, *args: object) -> None:
        if sender is self._connection:
            self._connection_lost = True

    def _usable(self) -> bool:
        return (
            self._connection_open()
            and self._channel is not None
            and not self._channel.is_closed
            and self._exchange is not None
        )

    async def _open(self) -> None:
        if self._connection is None or not self._connection_open():
            await self._drop_connection()
            self._connection_lost = False
            self._connection = await self._new_connection()
            self._connection.close_callbacks.add(self._on_connection_closed)
        self._exchange = None
        confirms = self._ack_level != "none"
        self._channel = await self._connection.channel(
            publisher_confirms=confirms, on_return_raises=self._ack_level == "routable"
        )
        try:
            self._exchange = await self._channel.get_exchange(self._exchange_name, ensure=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise DestinationNotFound(self._missing_exchange()) from None

    async def _new_connection(self) -> AbstractConnection:
        # aio_pika.connect in two steps: it drops a connection whose connect failed (refused,
        # login refused, timed out) without closing it, and the garbage collector then
        # closes it only on the event loop's thread; elsewhere its socket stays open.
        target = self._target
        connection = aio_pika.Connection(
            aio_pika.connection.make_url(
                host=target.host,
                port=target.port,
                login=self._credentials.username,
                password=self._credentials.password,
                virtualhost=target.vhost,
                ssl=target.tls,
            ),
            ssl_context=self._ssl_context,
            client_properties={"connection_name": f"bucketnotify {self._exchange_name}"},
        )
        try:
            await connection.connect(timeout=self._settings.connect_timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.close()
            raise
        return connection

    async def _push(self, body: bytes, record: dict[str, Any]) -> None:
        exchange = self._exchange
        if exchange is None or not self._usable():
            # Lost between _connect and this push (another push saw the channel close).
            raise TransportError(
                f"the channel to {self._target!r} closed; the next batch reopens it"
            )
        confirms = self._ack_level != "none"
        message = aio_pika.Message(
            body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT if confirms else None
        )
        with self._map_errors("publishing"):
            await exchange.publish(
                message, routing_key=self._routing_key, mandatory=self._ack_level == "routable"
            )

    async def _close(self) -> None:
        async with self._lock:
            await self._drop_connection()

    async def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        self._channel = self._exchange = None
        if connection is not None and not connection.is_closed:
            connection.close_callbacks.discard(self._on_connection_closed)
            with contextlib.suppress(Exception):
                await connection.close()

    def _missing_exchange(self) -> str:
        return (
            f"exchange {self._exchange_name!r} does not exist in vhost "
            f"{self._target.vhost!r}; create it (a topic exchange) on the broker"
        )

    @contextlib.contextmanager
    def _map_errors(self, doing: str) -> Iterator[None]:
        """aio-pika's and aiormq's exceptions as ours."""
        where = repr(self._target)
        try:
            yield
        except EndpointError:
            raise
        except aiormq.exceptions.PublishError as exc:
            # basic.return of a mandatory message: nothing is bound for the routing key.
            raise RejectedError(
                f"unroutable: exchange {self._exchange_name!r} has no queue bound for"
                f" routing key {self._routing_key!r} ({_return_text(exc)})"
            ) from exc
        except aiormq.exceptions.DeliveryError as exc:
            frame = exc.frame
            if isinstance(frame, Basic.Return):
                raise RejectedError(f"returned by the broker ({_return_text(exc)})") from exc
            raise RejectedError(f"the broker refused the message ({frame.name})") from exc
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise DestinationNotFound(self._missing_exchange()) from exc
        except aiormq.exceptions.ChannelAccessRefused as exc:
            raise RejectedError(f"access refused while {doing}: {_reply(exc)}") from exc
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            text = _reply(exc)
            if "larger than" in text or "max size" in text:
                raise UndeliverableError(f"the broker refused the message: {text}") from exc
            raise RejectedError(f"precondition failed while {doing}: {text}") from exc
        except (
            aiormq.exceptions.ProbableAuthenticationError,
            aiormq.exceptions.AuthenticationError,
        ) as exc:
            raise AuthenticationError(
                f"{where} refused the credentials from the Secret ({_reply(exc)})"
            ) from exc
        except aiormq.exceptions.ConnectionNotAllowed as exc:
            raise AuthenticationError(f"{where} refused access: {_reply(exc)}") from exc
        except (aiormq.exceptions.ChannelClosed, aiormq.exceptions.ChannelInvalidStateError) as exc:
            raise TransportError(f"the channel closed while {doing}: {_reply(exc)}") from exc
        except TimeoutError as exc:
            self._connection_lost = True
            raise ConnectError(f"timed out {doing} ({where})") from exc
        except RuntimeError as exc:
            # aio-pika's "connection closed" on a connection that was already lost.
            self._connection_lost = True
            raise ConnectError(f"the connection to {where} was lost (while {doing})") from exc
        except (aiormq.exceptions.AMQPError, OSError, ConnectionError) as exc:
            self._connection_lost = True
            reason = describe_tls_failure(exc) or _reply(exc)
            raise ConnectError(f"{where}: {reason} (while {doing})") from exc


def _reply(exc: BaseException) -> str:
    """The broker's reply text of an aiormq exception, else a short description."""
    for arg in exc.args:
        if isinstance(arg, str) and arg:
            return arg
        if isinstance(arg, BaseException):
            return _reply(arg)
        reply_text = getattr(arg, "reply_text", None)
        if isinstance(reply_text, str) and reply_text:
            return reply_text
    return str(exc) or type(exc).__name__


def _return_text(exc: aiormq.exceptions.DeliveryError) -> str:
    frame = exc.frame
    if isinstance(frame, Basic.Return):
        return f"{frame.reply_code} {frame.reply_text}"
    message = exc.message
    delivery = getattr(message, "delivery", None)
    if isinstance(delivery, Basic.Return):
        return f"{delivery.reply_code} {delivery.reply_text}"
    return frame.name
