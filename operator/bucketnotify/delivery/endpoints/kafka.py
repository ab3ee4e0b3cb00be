"""Kafka endpoint: produce to the topic named by the endpoint topic.

As the gateway does it: brokers from ``kafka://host[:port]`` (9092) plus the extra broker
list, ``useSSL`` with ``verifySSL`` and a CA bundle that replaces the system CAs, SASL with
credentials from a Secret. Ack levels: ``none`` is ``acks=0`` (sent is delivered) and
``broker`` is ``acks=all`` (the partition leader acknowledges once every in-sync replica has
the event). The message key is ``<bucket>/<key>``, so one object's events land on one
partition, in order.

SASL mechanisms:

- PLAIN, SCRAM-SHA-256, SCRAM-SHA-512: the Secret's user name and password.
- OAUTHBEARER: the Secret's password is the bearer token, sent as it is (aiokafka needs no
  extra package for it); the user name is not used. A token that expires must be renewed in
  the Secret (the endpoint is reopened with it).
- GSSAPI: refused by ``open_endpoint`` with a ``ConfigurationError``: Kerberos needs a
  keytab or ticket cache and the ``gssapi`` package with the system's Kerberos libraries,
  none of which a user name and password from a Secret provide.

One producer per endpoint (aiokafka keeps a connection per broker and reconnects by itself),
started on the first ``send`` and restarted by a later one when starting failed. While the
brokers are down pushes fail (``ConnectError`` or a timeout), nothing raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.abc import AbstractTokenProvider
from aiokafka.conn import create_conn

from bucketnotify.api.topic import ClientCertificate, KafkaEndpoint
from bucketnotify.delivery.endpoints.base import BaseEndpoint, EndpointSettings, InFlightLimit
from bucketnotify.delivery.endpoints.errors import (
    AuthenticationError,
    ConfigurationError,
    ConnectError,
    DestinationNotFound,
    EndpointError,
    PushTimeout,
    RejectedError,
    TransportError,
    UndeliverableError,
)
from bucketnotify.delivery.endpoints.tls import client_context, describe_tls_failure

__all__ = ["SUPPORTED_MECHANISMS", "KafkaPusher", "bootstrap_servers", "message_key"]

DEFAULT_PORT = 9092
SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
CLIENT_ID = "bucketnotify"
MAX_UNFINISHED = 10_000
# Errors after which an idempotent producer never sends again.
_PRODUCER_STATE_LOST = (
    kafka_errors.OutOfOrderSequenceNumber,
    kafka_errors.UnknownProducerId,
    kafka_errors.InvalidProducerEpoch,
    kafka_errors.InvalidProducerIdMapping,
    kafka_errors.ProducerFenced,
)
"""Timed-out pushes remembered per endpoint (each holds its event's body)."""


def bootstrap_servers(url: str, brokers: list[str]) -> list[tuple[str, int]]:
    """The URL's broker followed by the extra ones, without repeats; port 9092 by default."""
    parts = urlsplit(url)
    if parts.scheme != "kafka" or not parts.hostname:
        raise ConfigurationError("the url must be kafka://<host>[:<port>]")
    if parts.username or parts.password:
        raise ConfigurationError("the url must not carry credentials; use sasl.credentialsRef")
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError("the url has an invalid port") from None
    result = [(parts.hostname, port or DEFAULT_PORT)]
    for broker in brokers:
        entry = _host_port(broker)
        if entry not in result:
            result.append(entry)
    return result


def _host_port(broker: str) -> tuple[str, int]:
    host, colon, port = broker.rpartition(":")
    if not colon:
        host, port = broker, ""
    try:
        number = int(port) if port else DEFAULT_PORT
    except ValueError:
        number = -1
    if not host or not 0 < number < 65536:
        raise ConfigurationError(f"invalid broker {broker!r}: expected host[:port]")
    return host, number


def message_key(record: dict[str, Any]) -> bytes:
    """``<bucket>/<key>``: the events of one object share a partition, so stay in order."""
    s3 = record.get("s3") or {}
    bucket = (s3.get("bucket") or {}).get("name", "")
    key = (s3.get("object") or {}).get("key", "")
    return f"{bucket}/{key}".encode()


class _StaticToken(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka is untyped
    """OAUTHBEARER: the bearer token kept in the Secret's password key."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def token(self) -> str:
        return self._token


class KafkaPusher(BaseEndpoint):
    """Produces each event to one topic through one pooled producer."""

    kind = "kafka"

    def __init__(
        self,
        spec: KafkaEndpoint,
        *,
        endpoint_topic: str,
        credentials: tuple[str, str] | None,
        ca_pem: str | None,
        settings: EndpointSettings,
        in_flight: InFlightLimit | None = None,
        client: ClientCertificate | None = None,
    ) -> None:
        sasl = spec.sasl
        secrets: tuple[str, ...] = tuple(credentials) if credentials and sasl else ()
        super().__init__(settings=settings, in_flight=in_flight, secrets=secrets)
        self._servers = bootstrap_servers(spec.url, list(spec.brokers))
        self._where = ",".join(f"{h}:{p}" for h, p in self._servers)
        self._topic = endpoint_topic
        self._acks: int | str = 0 if spec.ack_level == "none" else "all"
        self._ssl_context: ssl.SSLContext | None = None
        if spec.use_ssl:
            self._ssl_context = client_context(verify=spec.verify_ssl, ca_pem=ca_pem, client=client)
        # What both the producer and a diagnosing connection use to reach a broker.
        self._conn_options: dict[str, Any] = {
            "client_id": CLIENT_ID,
            "request_timeout_ms": int(settings.message_timeout_s * 1000),
            "ssl_context": self._ssl_context,
        }
        if sasl is None:
            self._conn_options["security_protocol"] = "SSL" if spec.use_ssl else "PLAINTEXT"
        else:
            self._conn_options.update(self._sasl_options(sasl.mechanism, credentials))
            self._conn_options["security_protocol"] = (
                "SASL_SSL" if spec.use_ssl else "SASL_PLAINTEXT"
            )
        self._lock = asyncio.Lock()
        self._producer: Any = None  # AIOKafkaProducer, started
        self._stopping: set[asyncio.Task[None]] = set()  # discarded producers being stopped
        self._unfinished: OrderedDict[bytes, tuple[Any, asyncio.Future[Any]]] = OrderedDict()
        """Pushes whose wait timed out, by body, with the producer that has them: the next
        attempt of the event awaits that send instead of producing the event again (a new
        producer never finishes the old one's sends, so they are made again)."""

    @staticmethod
    def _sasl_options(mechanism: str, credentials: tuple[str, str] | None) -> dict[str, Any]:
        supported = ", ".join(SUPPORTED_MECHANISMS)
        if mechanism == "GSSAPI":
            raise ConfigurationError(
                "SASL mechanism GSSAPI is not supported by the delivery service: it needs"
                " Kerberos (a keytab or ticket cache and the gssapi package with the system's"
                " Kerberos libraries), which a user name and password from a Secret do not"
                f" provide; use one of {supported}"
            )
        if mechanism not in SUPPORTED_MECHANISMS:
            raise ConfigurationError(
                f"unknown SASL mechanism {mechanism!r}; use one of {supported}"
            )
        if credentials is None:
            raise ConfigurationError(f"SASL {mechanism} needs credentials (sasl.credentialsRef)")
        username, password = credentials
        if mechanism == "OAUTHBEARER":
            if not password:
                raise ConfigurationError("SASL OAUTHBEARER needs the bearer token as password")
            token = _StaticToken(password)
            return {"sasl_mechanism": mechanism, "sasl_oauth_token_provider": token}
        return {
            "sasl_mechanism": mechanism,
            "sasl_plain_username": username,
            "sasl_plain_password": password,
        }

    async def _connect(self) -> None:
        async with self._lock:
            if self._producer is not None:
                return
            producer = AIOKafkaProducer(
                bootstrap_servers=[f"{h}:{p}" for h, p in self._servers],
                acks=self._acks,
                linger_ms=0,
                # A produce request that timed out is sent again by the producer itself, and
                # the broker may have written the first one: only the idempotent producer
                # (which needs acks=all) lets the broker drop the second copy.
                enable_idempotence=self._acks == "all",
                **self._conn_options,
            )
            try:
                with self._map_errors("connecting"):
                    async with asyncio.timeout(self._settings.connect_timeout_s):
                        await producer.start()
            except BaseException as exc:
                await self._stop(producer)
                if isinstance(exc, ConnectError) and isinstance(
                    exc.__cause__, kafka_errors.KafkaConnectionError
                ):
                    # aiokafka logs why each broker failed and raises "Unable to bootstrap";
                    # one connection of our own finds the reason (refused, TLS, credentials).
                    raise await self._diagnose() from None
                raise
            self._producer = producer

    async def _diagnose(self) -> EndpointError:
        last: EndpointError = ConnectError(f"could not bootstrap from {self._where}")
        for host, port in self._servers:
            try:
                with self._map_errors("connecting"):
                    async with asyncio.timeout(self._settings.connect_timeout_s):
                        conn = await create_conn(host, port, **self._conn_options)
            except EndpointError as exc:
                if isinstance(exc, AuthenticationError):
                    return exc
                last = exc
            else:
                conn.close()
        return last

    async def _push(self, body: bytes, record: dict[str, Any]) -> None:
        producer = self._producer
        if producer is None:
            raise ConnectError(f"the producer for {self._where} is not running")
        with self._map_errors("producing", producer):
            made_by, earlier = self._unfinished.pop(body, (None, None))
            if (
                earlier is not None
                and made_by is producer
                and not (earlier.done() and (earlier.cancelled() or earlier.exception()))
            ):
                # The event's last push outlived our wait and is still in this producer, or
                # was acknowledged after the wait: sending it again would deliver it twice.
                future = earlier
            else:
                future = await producer.send(self._topic, body, key=message_key(record))
                # Only our wait ends at the message timeout; the producer finishes or
                # expires the batch by itself, so its future must not be cancelled under it.
                future.add_done_callback(_consume_result)
            self._unfinished[body] = (producer, future)
            while len(self._unfinished) > MAX_UNFINISHED:
                # An event not retried here (expired, or its shard moved to another replica)
                # must not hold its body forever.
                self._unfinished.popitem(last=False)
            await asyncio.shield(future)
            self._unfinished.pop(body, None)

    def _timeout_error(self, timeout_s: float) -> EndpointError:
        producer = self._producer
        if producer is not None and self._topic not in producer.client.cluster.topics():
            return PushTimeout(
                f"no metadata for topic {self._topic!r} within {timeout_s:g} s: it does not"
                f" exist (and the cluster does not create topics) or no broker of"
                f" {self._where} is reachable"
            )
        return PushTimeout(f"no acknowledgement from {self._where} within {timeout_s:g} s")

    async def _close(self) -> None:
        async with self._lock:
            producer, self._producer = self._producer, None
            if producer is not None:
                await self._stop(producer)

    def _discard_producer(self, producer: Any) -> None:
        """Forget ``producer`` if it is still the running one (the next push starts a new
        one) and stop it in the background: its stop() waits for its pending batches, at
        most the message timeout. A late failure of an older producer changes nothing."""
        if producer is not None and producer is self._producer:
            self._producer = None
            task = asyncio.get_running_loop().create_task(self._stop(producer))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def _stop(self, producer: Any) -> None:
        # stop() flushes what is pending; with the brokers down that waits for the batches
        # to expire, so it is bounded here.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._settings.message_timeout_s):
                await producer.stop()

    @contextlib.contextmanager
    def _map_errors(self, doing: str, producer: Any = None) -> Iterator[None]:
        """aiokafka's exceptions as ours; ``producer`` is the one doing it."""
        where = self._where
        try:
            yield
        except EndpointError:
            raise
        except (
            kafka_errors.SaslAuthenticationFailed,
            kafka_errors.AuthenticationFailedError,
        ) as exc:
            raise AuthenticationError(
                f"{where} refused the credentials from the Secret"
                f" (SASL {self._conn_options.get('sasl_mechanism')})"
            ) from exc
        except (
            kafka_errors.UnsupportedSaslMechanismError,
            kafka_errors.AuthenticationMethodNotSupported,
            kafka_errors.IllegalSaslStateError,
        ) as exc:
            raise AuthenticationError(f"SASL failed with {where}: {exc}") from exc
        except kafka_errors.TopicAuthorizationFailedError as exc:
            raise RejectedError(f"not authorized to write to topic {self._topic!r}") from exc
        except kafka_errors.UnknownTopicOrPartitionError as exc:
            raise DestinationNotFound(f"topic {self._topic!r} does not exist") from exc
        except kafka_errors.InvalidTopicError as exc:
            raise RejectedError(f"{self._topic!r} is not a valid Kafka topic name") from exc
        except (
            kafka_errors.MessageSizeTooLargeError,
            kafka_errors.RecordTooLargeError,
            kafka_errors.RecordListTooLargeError,
        ) as exc:
            raise UndeliverableError(f"the event is too large for Kafka: {exc}") from exc
        except (kafka_errors.KafkaTimeoutError, kafka_errors.RequestTimedOutError) as exc:
            raise PushTimeout(f"timed out {doing} ({where}): {exc}") from exc
        except TimeoutError as exc:
            raise ConnectError(f"could not connect to {where} in time") from exc
        except (kafka_errors.ProducerClosed, kafka_errors.IllegalStateError) as exc:
            self._discard_producer(producer)  # start a new one with the next batch
            raise TransportError(f"the producer stopped ({type(exc).__name__})") from exc
        except _PRODUCER_STATE_LOST as exc:
            # The broker lost the idempotent producer's sequence state (a broker killed and
            # started again): aiokafka's sender stops for good and every later send fails
            # the same way, so the events would wait forever. A new producer gets a new
            # producer id; what the old one had not written is produced again.
            self._discard_producer(producer)
            raise TransportError(
                f"{where} lost this producer's state ({type(exc).__name__}); starting a new one"
            ) from exc
        except kafka_errors.KafkaConnectionError as exc:
            reason = describe_tls_failure(exc) or str(exc) or type(exc).__name__
            raise ConnectError(f"{where}: {reason}") from exc
        except kafka_errors.KafkaError as exc:
            raise RejectedError(f"{type(exc).__name__} while {doing}: {exc}") from exc
        except (OSError, ssl.SSLError) as exc:
            reason = describe_tls_failure(exc) or str(exc) or type(exc).__name__
            raise ConnectError(f"{where}: {reason}") from exc


def _consume_result(future: asyncio.Future[Any]) -> None:
    # A future whose waiter timed out would otherwise log "exception was never retrieved".
    if not future.cancelled():
        future.exception()
