"""HTTP(S) endpoint: POST of the event JSON; any 2xx is an acknowledgement.

As the gateway does it: ``Content-Type: application/json``, no redirects followed, a
connect timeout and a message timeout (5 s and 10 s by default), ``verifySSL`` and a CA
bundle that replaces the system CAs, and with ``cloudEvents`` the CloudEvents binary-mode
headers the gateway adds (``cloud_event_headers``). Anything but a 2xx, and any timeout, is a
failure to retry; only a 413 (the event is too large for the receiver) is final.
Connections are kept alive and reused, up to ``EndpointSettings.max_in_flight`` per endpoint.
``HTTP(S)_PROXY`` and ``NO_PROXY`` are honoured (read when the endpoint is opened).

The client is aiohttp's, not httpx's: httpcore's pool checks every idle connection's
socket on each request, so a push through httpx costs more the more are in flight
(docs/performance-notes.md).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import string
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import aiohttp
import httpx
from yarl import URL

from bucketnotify.api.topic import ClientCertificate, HttpEndpoint
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
from bucketnotify.proxies import env_proxy

__all__ = [
    "EndpointError",
    "HttpPusher",
    "cloud_event_headers",
    "header_value",
    "post_body",
    "post_json",
]

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
        client: ClientCertificate | None = None,
    ) -> None:
        super().__init__(settings=settings, in_flight=in_flight)
        parsed = _parse_url(spec.url)
        self._url = _request_url(parsed)
        self._where = _where(parsed)
        self._cloud_events = spec.cloud_events
        self._ssl: ssl.SSLContext | bool = True
        if parsed.scheme == "https":
            self._ssl = client_context(verify=spec.verify_ssl, ca_pem=ca_pem, client=client)
        self._proxy = env_proxy(self._url)
        self._session: aiohttp.ClientSession | None = None

    async def _connect(self) -> None:
        # The pool opens (and reopens) connections per request; the session needs a loop.
        if self._session is None:
            self._session = _session(
                aiohttp.TCPConnector(
                    limit=self._settings.max_in_flight,
                    keepalive_timeout=self._settings.keepalive_expiry_s,
                    ssl=self._ssl,
                ),
                # The message timeout bounds the whole push (BaseEndpoint._send_one).
                aiohttp.ClientTimeout(total=None, connect=self._settings.connect_timeout_s),
                self._proxy,
            )

    async def _push(self, body: bytes, record: dict[str, Any]) -> None:
        assert self._session is not None, "_connect() comes first"
        headers = [("Content-Type", "application/json")]
        if self._cloud_events:
            headers += cloud_event_headers(record)
        await post_body(self._session, self._url, body, headers, self._where)

    async def _close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def post_json(
    url: str, body: dict[str, Any], *, verify: bool = True, timeout_s: float = 10.0
) -> None:
    """One POST of ``body`` on a connection of its own (the operator's test event).

    Raises an ``EndpointError`` when the endpoint does not answer 2xx.
    """
    parsed = _parse_url(url)
    where = _where(parsed)
    data = json.dumps(body).encode()
    # The gateway's own defaults: 5 s to connect, 10 s for the whole exchange.
    timeouts = aiohttp.ClientTimeout(total=timeout_s, connect=min(5.0, timeout_s))
    session = _session(aiohttp.TCPConnector(ssl=verify), timeouts, env_proxy(str(parsed)))
    async with session:
        try:
            await post_body(
                session, _request_url(parsed), data, [("Content-Type", "application/json")], where
            )
        except TimeoutError as exc:
            raise PushTimeout(f"{where} did not answer within {timeout_s:g} s") from exc


MAX_ANSWER_BYTES = 64 * 1024
"""Of an endpoint's answer body, read at most this much: it is ignored, and reading it
lets the connection carry the next push. A longer answer closes the connection instead."""


def _session(
    connector: aiohttp.TCPConnector, timeout: aiohttp.ClientTimeout, proxy: str | None
) -> aiohttp.ClientSession:
    # The proxy looked up once (bucketnotify.proxies), not per request.
    return aiohttp.ClientSession(connector=connector, timeout=timeout, proxy=proxy, trust_env=False)


async def post_body(
    session: aiohttp.ClientSession,
    url: URL,
    body: bytes,
    headers: list[tuple[str, str]],
    where: str,
) -> None:
    with map_client_errors(where):
        async with session.post(url, data=body, headers=headers, allow_redirects=False) as answer:
            read = 0
            while read <= MAX_ANSWER_BYTES and (chunk := await answer.content.readany()):
                read += len(chunk)
            if not answer.content.at_eof():
                answer.close()
    check_status(answer.status, answer.reason, where)


def check_status(status: int, reason: str | None, where: str) -> None:
    """Nothing for a 2xx; otherwise the error that says what the endpoint answered."""
    if 200 <= status < 300:
        return
    answer = f"{status} {reason or ''}".strip()
    if status == 413:
        raise UndeliverableError(f"{where} answered {answer}: the event is too large for it")
    raise RejectedError(f"{where} answered {answer}")


@contextlib.contextmanager
def map_client_errors(where: str) -> Iterator[None]:
    """aiohttp's exceptions as ours."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise ConnectError(f"could not connect to {where} within the connect timeout") from exc
    except aiohttp.ServerTimeoutError as exc:
        raise PushTimeout(f"{where} did not answer in time ({type(exc).__name__})") from exc
    except aiohttp.ClientConnectorError as exc:
        # aiohttp's own certificate error is an SSLError without the details: the one it
        # wraps has them.
        tls = describe_tls_failure(exc.__cause__) if exc.__cause__ is not None else None
        reason = tls or exc.strerror or str(exc.os_error) or type(exc).__name__
        raise ConnectError(f"could not connect to {where}: {reason}") from exc
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        reason = str(exc) or type(exc).__name__
        raise ConnectError(f"the connection to {where} failed: {reason}") from exc
    except aiohttp.ClientResponseError as exc:
        # The answer's head was not HTTP (or not one aiohttp takes).
        raise ConnectError(f"{where} answered something that is not HTTP: {exc.message}") from exc
    except aiohttp.ClientError as exc:
        raise EndpointError(f"POST to {where} failed: {type(exc).__name__}") from exc
    except ValueError as exc:
        # aiohttp refused what we asked it to send (a header value it cannot carry): our
        # defect, never the endpoint's refusal.
        raise RequestNotFormed(f"the request could not be formed: {exc}") from exc


def _parse_url(url: str) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigurationError(f"invalid url: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigurationError("the url must be http[s]://<host>[:<port>][/<path>]")
    return parsed


def _request_url(url: httpx.URL) -> URL:
    # Already percent-encoded by httpx.URL: sent as it is, not re-quoted.
    return URL(str(url), encoded=True)


def _where(url: httpx.URL) -> str:
    """scheme://host:port: the path and query may hold tokens, so messages never show them."""
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.scheme}://{url.host}:{port}"
