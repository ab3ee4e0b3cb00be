"""Our own small error tree; each endpoint module maps its driver's exceptions onto it.

::

    EndpointError                 the endpoint did not take the message (retryable)
    ├── ConfigurationError        the endpoint cannot be used as specified (not retryable;
    │                             raised by open_endpoint, never per message)
    ├── TransportError            no answer from the endpoint
    │   ├── ConnectError          could not connect (refused, DNS, TLS verification) or lost
    │   │                         the connection
    │   ├── AuthenticationError   the broker refused the credentials
    │   └── PushTimeout           no acknowledgement within the message timeout
    ├── RejectedError             the endpoint answered, but did not take the message
    │   │                         (HTTP non-2xx, broker nack, returned as unroutable)
    │   └── DestinationNotFound   the AMQP exchange or the Kafka topic does not exist
    ├── UndeliverableError        this message can never be taken (too large, malformed):
    │                             not retryable
    └── RequestNotFormed          *we* could not turn the event into a request: our defect,
                                  not the endpoint's answer, so the event stays queued
                                  (retryable) and the push is logged as an error

``retryable`` is False only where retrying cannot help; a wrong password or a missing
exchange is retryable, because fixing the Secret or creating the exchange makes the queued
events flow again. Messages are short, meant for a Topic condition or a log line, and never
contain credentials (``redact``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

__all__ = [
    "AuthenticationError",
    "ConfigurationError",
    "ConnectError",
    "DestinationNotFound",
    "EndpointError",
    "PushTimeout",
    "RejectedError",
    "RequestNotFormed",
    "TransportError",
    "UndeliverableError",
    "redact",
]


class EndpointError(Exception):
    """The endpoint did not acknowledge; the message names the cause, never credentials."""

    retryable: ClassVar[bool] = True


class ConfigurationError(EndpointError):
    """The endpoint cannot be used as specified (e.g. an unsupported SASL mechanism)."""

    retryable = False


class TransportError(EndpointError):
    """No answer from the endpoint."""


class ConnectError(TransportError):
    """Could not connect (refused, unresolvable, TLS verification failed) or lost the
    connection."""


class AuthenticationError(TransportError):
    """The broker refused the credentials."""


class PushTimeout(TransportError):
    """No acknowledgement within the message timeout (the message may still arrive)."""


class RejectedError(EndpointError):
    """The endpoint answered but did not take the message."""


class DestinationNotFound(RejectedError):
    """The AMQP exchange or the Kafka topic does not exist."""


class UndeliverableError(EndpointError):
    """This message can never be taken, however often it is retried."""

    retryable = False


class RequestNotFormed(EndpointError):
    """The client library refused to form the request from this event (a header value it
    rejects, say). A defect of ours: dropping the event would lose it for our mistake, so it
    stays queued, subject to the Topic's maxRetries and timeToLive like any failure."""


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***``.

    A safety net for driver messages we pass on: none of ours is built from credentials.
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
