"""The interface every endpoint kind implements, its settings, and the shared push loop.

An endpoint takes a batch of deliveries and returns one ``PushOutcome`` per delivery, in
order; it never raises for a failed push. Each kind (``http``, ``amqp``, ``kafka``) keeps
one pooled connection per endpoint, opens it on the first ``send`` (so a broker that is
down fails the pushes, not ``open_endpoint``), and reopens it on a later ``send`` after it
was lost.

``BaseEndpoint`` is the one place where a push becomes an outcome: kinds implement
``_connect`` and ``_push`` and raise our errors (``errors.py``); the bounds, the message
timeout and the translation into ``PushOutcome`` happen here.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self

from bucketnotify.api.topic import Credentials
from bucketnotify.delivery.endpoints.errors import (
    EndpointError,
    PushTimeout,
    RequestNotFormed,
    redact,
)
from bucketnotify.delivery.model.event import object_of
from bucketnotify.delivery.model.push import Delivery, PushOutcome

__all__ = [
    "BaseEndpoint",
    "Credentials",
    "Endpoint",
    "EndpointSettings",
    "InFlightLimit",
    "outcome_of",
]

logger = logging.getLogger(__name__)


class Endpoint(Protocol):
    """Where a topic's events are pushed."""

    async def send(self, batch: Sequence[Delivery]) -> list[PushOutcome]:
        """Push every delivery; one outcome per delivery, in order. Never raises for a
        failed push (only for misuse, such as sending on a closed endpoint)."""
        ...

    async def aclose(self) -> None:
        """Close pooled connections; pushes still running fail."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@dataclass(frozen=True)
class EndpointSettings:
    """How every endpoint pushes; the defaults are the gateway's where it has one."""

    connect_timeout_s: float = 5.0
    """Seconds to open a connection, TLS and broker handshake and authentication included
    (the gateway's rgw_http_notif_connection_timeout). A batch whose endpoint cannot connect
    this fast fails at once, so the queue retries it later instead of holding it."""
    message_timeout_s: float = 10.0
    """Seconds from the start of one push to its acknowledgement (the gateway's
    rgw_http_notif_message_timeout). Beyond it the push counts as failed and is retried; it
    may still arrive, as delivery is at least once."""
    max_in_flight: int = 64
    """Pushes to one endpoint at once; the rest of a batch waits for a free slot (the
    message timeout starts only then). For HTTP each push needs its own connection (HTTP/1.1
    has no pipelining), so this is also the size of the endpoint's keep-alive pool; the
    brokers carry all of them over one connection."""
    keepalive_expiry_s: float = 30.0
    """Seconds an idle pooled HTTP connection is kept. Servers and proxies commonly drop
    idle connections after 60 s; reusing one close to that risks a reset mid-request."""

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "message_timeout_s", "keepalive_expiry_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")


class InFlightLimit:
    """A bound on pushes in flight shared by every endpoint opened with it.

    The gateway bounds HTTP pushes globally (rgw_http_notif_max_inflight, 8192); one of
    these, passed to ``open_endpoint`` for every endpoint of a process, does the same for
    ours. A push waits for a slot before its message timeout starts.
    """

    def __init__(self, limit: int = 8192) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._slots = asyncio.Semaphore(limit)
        self._used = 0

    @property
    def in_flight(self) -> int:
        return self._used

    async def __aenter__(self) -> None:
        await self._slots.acquire()
        self._used += 1

    async def __aexit__(self, *exc: object) -> None:
        self._used -= 1
        self._slots.release()


def outcome_of(
    delivery_id: str, error: EndpointError | None, secrets: Sequence[str] = ()
) -> PushOutcome:
    """The outcome of one push: acknowledged when ``error`` is None."""
    if error is None:
        return PushOutcome(id=delivery_id, ok=True, retryable=False, error=None)
    message = redact(str(error), secrets) or type(error).__name__
    return PushOutcome(id=delivery_id, ok=False, retryable=error.retryable, error=message)


class BaseEndpoint(abc.ABC):
    """Bounds, timeouts and outcomes around one kind's ``_connect`` and ``_push``."""

    kind: str = "endpoint"

    def __init__(
        self,
        *,
        settings: EndpointSettings,
        in_flight: InFlightLimit | None = None,
        secrets: Sequence[str] = (),
    ) -> None:
        self._settings = settings
        self._slots = asyncio.Semaphore(settings.max_in_flight)
        self._in_flight = in_flight
        self._secrets = tuple(s for s in secrets if s)
        self._closed = False

    # --- what each kind implements -------------------------------------------------------

    @abc.abstractmethod
    async def _connect(self) -> None:
        """Make sure the pooled connection is usable (open or reopen it); raise our errors.

        Called once per batch. It must finish within the connect timeout.
        """

    @abc.abstractmethod
    async def _push(self, body: bytes, record: dict[str, Any]) -> None:
        """Push one event and wait for its acknowledgement; raise our errors."""

    @abc.abstractmethod
    async def _close(self) -> None:
        """Close the pooled connection."""

    def _timeout_error(self, timeout_s: float) -> EndpointError:
        """The error of a push that got no acknowledgement in time; a kind may say more."""
        return PushTimeout(f"no acknowledgement within {timeout_s:g} s")

    # --- the interface ---------------------------------------------------------------------

    async def send(self, batch: Sequence[Delivery]) -> list[PushOutcome]:
        if self._closed:
            raise RuntimeError(f"send() on a closed {self.kind} endpoint")
        if not batch:
            return []
        try:
            await self._connect()
        except Exception as exc:
            error = self._as_endpoint_error(exc, "connecting")
            return [outcome_of(d.id, error, self._secrets) for d in batch]
        if len(batch) == 1:
            return [await self._send_one(batch[0])]  # no task for the usual lone event
        return list(await asyncio.gather(*(self._send_one(d) for d in batch)))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- internals --------------------------------------------------------------------------

    async def _send_one(self, delivery: Delivery) -> PushOutcome:
        timeout = self._settings.message_timeout_s
        error: EndpointError | None = None
        async with self._slots, self._in_flight or contextlib.nullcontext():
            try:
                async with asyncio.timeout(timeout):
                    await self._push(delivery.body, delivery.record)
            except TimeoutError:
                error = self._timeout_error(timeout)
            except Exception as exc:
                error = self._as_endpoint_error(exc, "pushing")
        if isinstance(error, RequestNotFormed):
            bucket, key = object_of(delivery.record)
            logger.error(
                "could not form the %s push of the event of bucket %r key %r, a defect of"
                " bucketnotify (please report it); the event stays queued: %s",
                self.kind,
                bucket,
                key,
                redact(str(error), self._secrets),
            )
        return outcome_of(delivery.id, error, self._secrets)

    def _as_endpoint_error(self, exc: Exception, doing: str) -> EndpointError:
        if isinstance(exc, EndpointError):
            return exc
        if isinstance(exc, TimeoutError):
            return PushTimeout(f"timed out {doing}")
        # A bug or a driver exception the kind's mapping does not know yet: still an outcome
        # (the queue retries), but loud in the log.
        name = type(exc).__name__
        logger.error(
            "unexpected %s while %s (%s endpoint): %s",
            name,
            doing,
            self.kind,
            redact(str(exc), self._secrets),
        )
        trace = "".join(traceback.format_exception(exc))
        logger.debug("traceback of the unexpected %s: %s", name, redact(trace, self._secrets))
        return EndpointError(f"unexpected error while {doing}: {name}")
