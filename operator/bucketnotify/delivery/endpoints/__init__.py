"""Push endpoints (HTTP, AMQP 0.9.1, Kafka) behind one interface.

Adapters: the only code that talks to the receivers and brokers. One module per kind
(``http``, ``amqp``, ``kafka``) implements ``Endpoint`` (``base``): ``send(batch)`` returns
one ``PushOutcome`` per ``Delivery`` and never raises for a failed push; ``open_endpoint``
picks the kind from a Topic's ``spec.endpoint``. Driver exceptions are mapped at the edge to
our own tree (``errors``). ``testing.MockEndpoint`` stands in for an endpoint in unit tests.

May import ``bucketnotify.api``; nothing from the controller or the delivery worker.
"""

from bucketnotify.api.topic import Credentials
from bucketnotify.delivery.endpoints.base import Endpoint, EndpointSettings, InFlightLimit
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
from bucketnotify.delivery.endpoints.factory import open_endpoint
from bucketnotify.delivery.model.push import Delivery, PushOutcome

__all__ = [
    "AuthenticationError",
    "ConfigurationError",
    "ConnectError",
    "Credentials",
    "Delivery",
    "DestinationNotFound",
    "Endpoint",
    "EndpointError",
    "EndpointSettings",
    "InFlightLimit",
    "PushOutcome",
    "PushTimeout",
    "RejectedError",
    "TransportError",
    "UndeliverableError",
    "open_endpoint",
]
