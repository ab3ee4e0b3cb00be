"""HTTP(S) endpoint: POST of the event JSON; any 2xx is an acknowledgement.

As the gateway does it: ``Content-Type: application/json``, no redirects followed, a
connect timeout and a message timeout (5 s and 10 s by default), ``verifySSL`` and a CA
bundle that replaces the system CAs, and with ``cloudEvents`` the CloudEvents binary-mode
headers the gateway adds (``cloud_event_headers``). Anything but a 2xx, and any timeout, is a
failure to retry; only a 413 (the event is too large for the receiver) is final.
Connections are kept alive and reused, up to ``EndpointSettings.max_in_flight`` per endpoint.
"""

from __future__ import annotations

import contextlib
import ssl
import string
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx

from bucketnotify.api.topic import HttpEndpoint
from bucketnotify.delivery.endpoints.base import BaseEndpoint, EndpointSettings, InFlightLimit
from bucketnotify.delivery.endpoints.errors import (
    ConfigurationError,
    ConnectError,
    EndpointError,
    PushTimeout,
    RejectedError,
    RequestNotFormed,
    UndeliverableError,
)
from bucketnotify.delivery.endpoints.tls import client_context, describe_tls_failure

__all__ = ["EndpointError", "HttpPusher", "cloud_event_headers", "header_value", "post_json"]

# CloudEvents HTTP binding 1.0.2, 3.1.3.2: printable ASCII (U+0021..U+007E) stays as it is,
# except '"' and '%'; space, control characters and every non-ASCII byte of the UTF-8
# encoding are percent-encoded. quote() never encodes letters, digits and "_.-~".
_HEADER_SAFE = "".join(c for c in string.punctuation if c not in '"%')


def cloud_event_headers(record: dict[str, Any]) -> list[tuple[str, str]]:
    """The CloudEvents 1.0 binary-mode headers the gateway sends with an event record.

    Exactly the gateway's (rgw_pubsub_push.cc): ``ce-type`` is ``com.amazonaws.`` plus the
    event name, ``ce-id`` is ``<x-amz-request-id>.<x-amz-id-2>``, ``ce-source`` is
    ``<eventSource>.<awsRegion>.<bucket>`` (``ceph:s3.<region>.<bucket>``), ``ce-time`` the
    event time as the record has it and ``ce-subject`` the object key. Every value is
    percent-encoded as the binding asks (``header_value``): an S3 key may hold any character,
    a newline included, and an HTTP header may not.
    """
    response = record.get("responseElements") or {}
    s3 = record.get("s3") or {}
    bucket = (s3.get("bucket") or {}).get("name", "")
    key = (s3.get("object") or {}).get("key", "")
    source = record.get("eventSource", "ceph:s3")
    headers = [
        ("ce-specversion", "1.0"),
        ("ce-type", f"com.amazonaws.{record.get('eventName', '')}"),
        ("ce-time", str(record.get("eventTime", ""))),
        ("ce-id", f"{response.get('x-amz-request-id', '')}.{response.get('x-amz-id-2', '')}"),
        ("ce-source", f"{source}.{record.get('awsRegion', '')}.{bucket}"),
        ("ce-subject", str(key)),
    ]
    return [(name, header_value(value)) for name, value in headers]


def header_value(value: str) -> str:
    """``value`` percent-encoded for a CloudEvents HTTP header (binding 1.0.2, 3.1.3.2);
    a receiver gets the original back with ``urllib.parse.unquote``."""
    return quote(value, safe=_HEADER_SAFE)


class HttpPusher(BaseEndpoint):
    """POSTs each event to one URL over a pool of keep-alive connections."""

    kind = "http"

    def __init__(
        self,
        spec: HttpEndpoint,
        *,
        ca_pem: str | None,
        settings: EndpointSettings,
        in_flight: InFlightLimit | None = None,
    ) -> None:
        super().__init__(settings=settings, in_flight=in_flight)
        self._url = _parse_url(spec.url)
        self._where = _where(self._url)
        self._cloud_events = spec.cloud_events
        verify: ssl.SSLContext | bool = True
        if self._url.scheme == "https":
            verify = client_context(verify=spec.verify_ssl, ca_pem=ca_pem)
        self._client = httpx.AsyncClient(
            verify=verify,
            timeout=httpx.Timeout(settings.message_timeout_s, connect=settings.connect_timeout_s),
            limits=httpx.Limits(
                max_connections=settings.max_in_flight,
                max_keepalive_connections=settings.max_in_flight,
                keepalive_expiry=settings.keepalive_expiry_s,
            ),
            follow_redirects=False,
        )

    async def _connect(self) -> None:
        # httpx opens (and reopens) pooled connections per request.
        pass

    async def _push(self, body: bytes, record: dict[str, Any]) -> None:
        headers = [(b"Content-Type", b"application/json")]
        if self._cloud_events:
            headers += [(k.encode(), v.encode()) for k, v in cloud_event_headers(record)]
        with map_httpx_errors(self._where):
            response = await self._client.post(self._url, content=body, headers=headers)
        check_status(response, self._where)

    async def _close(self) -> None:
        await self._client.aclose()


async def post_json(
    url: str, body: dict[str, Any], *, verify: bool = True, timeout_s: float = 10.0
) -> None:
    """One POST of ``body`` on a connection of its own (the operator's test event).

    Raises an ``EndpointError`` when the endpoint does not answer 2xx.
    """
    parsed = _parse_url(url)
    where = _where(parsed)
    # The gateway's own defaults: 5 s to connect, 10 s for the whole exchange.
    timeouts = httpx.Timeout(timeout_s, connect=min(5.0, timeout_s))
    async with httpx.AsyncClient(verify=verify, timeout=timeouts) as client:
        with map_httpx_errors(where):
            response = await client.post(parsed, json=body)
    check_status(response, where)


def check_status(response: httpx.Response, where: str) -> None:
    """Nothing for a 2xx; otherwise the error that says what the endpoint answered."""
    if response.is_success:
        return
    answer = f"{response.status_code} {response.reason_phrase}".strip()
    if response.status_code == httpx.codes.REQUEST_ENTITY_TOO_LARGE:
        raise UndeliverableError(f"{where} answered {answer}: the event is too large for it")
    raise RejectedError(f"{where} answered {answer}")


@contextlib.contextmanager
def map_httpx_errors(where: str) -> Iterator[None]:
    """httpx's exceptions as ours (the shape of httpx's own map_httpcore_exceptions)."""
    try:
        yield
    except httpx.ConnectTimeout as exc:
        raise ConnectError(f"could not connect to {where} within the connect timeout") from exc
    except httpx.TimeoutException as exc:
        raise PushTimeout(f"{where} did not answer in time ({type(exc).__name__})") from exc
    except httpx.ConnectError as exc:
        tls = describe_tls_failure(exc)
        reason = tls or str(exc) or type(exc).__name__
        raise ConnectError(f"could not connect to {where}: {reason}") from exc
    except httpx.LocalProtocolError as exc:
        # h11 refused what we asked it to send: our defect, never the endpoint's refusal.
        raise RequestNotFormed(f"the request could not be formed: {exc}") from exc
    except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
        reason = str(exc) or type(exc).__name__
        raise ConnectError(f"the connection to {where} failed: {reason}") from exc
    except httpx.HTTPError as exc:
        raise EndpointError(f"POST to {where} failed: {type(exc).__name__}") from exc


def _parse_url(url: str) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigurationError(f"invalid url: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigurationError("the url must be http[s]://<host>[:<port>][/<path>]")
    return parsed


def _where(url: httpx.URL) -> str:
    """scheme://host:port: the path and query may hold tokens, so messages never show them."""
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.scheme}://{url.host}:{port}"
