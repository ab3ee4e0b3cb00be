"""Open the endpoint a Topic names: one kind per module, chosen by which field is set."""

from __future__ import annotations

from bucketnotify.api.topic import ClientCertificate
from bucketnotify.api.topic import Endpoint as EndpointSpec
from bucketnotify.delivery.endpoints.amqp import AmqpPusher
from bucketnotify.delivery.endpoints.base import Endpoint, EndpointSettings, InFlightLimit
from bucketnotify.delivery.endpoints.errors import ConfigurationError
from bucketnotify.delivery.endpoints.http import HttpPusher
from bucketnotify.delivery.endpoints.kafka import KafkaPusher

__all__ = ["open_endpoint"]

DEFAULT_SETTINGS = EndpointSettings()


def open_endpoint(
    endpoint: EndpointSpec,
    *,
    endpoint_topic: str,
    credentials: tuple[str, str] | None,
    ca_pem: str | None,
    settings: EndpointSettings = DEFAULT_SETTINGS,
    in_flight: InFlightLimit | None = None,
    client: ClientCertificate | None = None,
) -> Endpoint:
    """The endpoint of ``endpoint`` (a Topic's ``spec.endpoint``), not yet connected.

    ``endpoint_topic`` is the AMQP routing key or the Kafka topic (the Topic's
    ``endpointTopic``, else its ``spec.name``, else its ``metadata.name``); ``credentials``
    the (username, password) read from the ``credentialsRef`` Secret; ``ca_pem`` the bundle
    ``caRef`` names; ``client`` the certificate ``clientCertificateRef`` names, presented
    over TLS. Nothing connects here: the first ``send`` does, so a broker that is down fails
    pushes, not this call. Raises ``ConfigurationError`` (with a message for the Topic's
    status) when the endpoint cannot be used as specified, e.g. SASL GSSAPI or a CA bundle
    that is not PEM. ``in_flight`` bounds the pushes of every endpoint opened with it.
    """
    if endpoint.http is not None:
        return HttpPusher(
            endpoint.http, ca_pem=ca_pem, settings=settings, in_flight=in_flight, client=client
        )
    if endpoint.amqp is not None:
        return AmqpPusher(
            endpoint.amqp,
            endpoint_topic=endpoint_topic,
            credentials=credentials,
            ca_pem=ca_pem,
            settings=settings,
            in_flight=in_flight,
            client=client,
        )
    if endpoint.kafka is not None:
        return KafkaPusher(
            endpoint.kafka,
            endpoint_topic=endpoint_topic,
            credentials=credentials,
            ca_pem=ca_pem,
            settings=settings,
            in_flight=in_flight,
            client=client,
        )
    raise ConfigurationError("the endpoint sets none of http, amqp and kafka")
