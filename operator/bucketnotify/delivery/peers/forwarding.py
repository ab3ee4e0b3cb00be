"""Forwarding: a request for a shard another replica owns is handed to that owner.

Replicas sharing a store (``s3://``) receive every Topic's requests, through the Service,
whichever replica owns the shard. Committing such an event costs the store a PUT of its
batch, and the owner a LIST to find it, a GET to read it and a DELETE once delivered: four
gateway requests per event besides the upload, where the gateway's own paths need none. The
owner, though, can push an event for an empty shard itself (``delivery.rounds.direct``) and
queue nothing. So a replica that gets a request whose one shard another live replica owns
sends the request on to it, as it came (the Topic's token in the path, the body as is), and
answers the gateway with the owner's 200. Any other outcome (no answer within
``timeout_s``, a refusal, the owner gone) makes it handle the request itself, exactly as
without forwarding: commit, then tell the owner (``WakeUps.tell``) before answering.

Nothing acknowledged is lost: the gateway gets a 2xx only from a replica that delivered or
committed the events. An owner that answers too late for its sender (frozen, or behind a
slow endpoint) may have delivered what the sender then commits: the owner's delivered
identities (``worker.DeliveredCache``) recognise it when the round lists it. A forwarded
request carries the time it was sent and the sender's timeout, and an owner that only
reads it after that (it was paused) refuses it unseen: the sender has committed the events
by then (wall clocks, which agree across replicas as the Leases already need). A sender
whose hand-over to an owner failed handles that owner's requests itself for ``timeout_s``
rather than wait each time.

A forwarded request is never forwarded again, and is counted where the gateway's request
was (``bucketnotify_ingest_requests_total`` on the replica the gateway reached), with its
outcome in ``bucketnotify_ingest_forwarded_total``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import aiohttp
from aiohttp import web

from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.metrics import DeliveryMetrics

__all__ = ["FORWARDED_HEADER", "FORWARD_TIMEOUT_S", "Forwarder", "forward_expired"]

log = logging.getLogger(__name__)

FORWARDED_HEADER = "Bucketnotify-Forwarded"
"""``<sent at, epoch seconds> <timeout seconds>``: on a request one replica sent another."""
FORWARD_TIMEOUT_S = 5.0
"""How long a sender waits for the owner before it commits the events itself: longer than
a direct push to a quick endpoint takes by far, and short of the gateway's own patience."""
WARN_EVERY_S = 60.0


def forward_expired(header: str, now: float | None = None) -> bool:
    """Whether the sender of a forwarded request has given up on it (or the header is not
    ours: then nothing is done either)."""
    try:
        sent, timeout = (float(part) for part in header.split())
    except ValueError:
        return True
    return (time.time() if now is None else now) > sent + timeout


class Forwarder:
    """Sends requests on to the owner of their shard."""

    def __init__(
        self,
        address_of: Callable[[QueueName, int], str | None],
        metrics: DeliveryMetrics,
        *,
        timeout_s: float = FORWARD_TIMEOUT_S,
    ) -> None:
        self.address_of = address_of
        """Where the shard's owner listens when it is another live replica; else None."""
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._client: aiohttp.ClientSession | None = None
        self._warned: dict[str, float] = {}
        self._failing_until: dict[str, float] = {}

    def failing(self, address: str) -> bool:
        """Whether a request to ``address`` failed within the last ``timeout_s``: the
        requests of that while are handled here at once, not each after a timeout."""
        until = self._failing_until.get(address)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._failing_until[address]
        return False

    async def send(
        self, address: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> web.Response | None:
        """The owner's answer when it is a 200; None when this replica must handle the
        request itself."""
        if self._client is None:
            # Plain HTTP, as the gateway's own push to the ingest; aiohttp rather than httpx
            # for its lower cost per request (docs/performance-notes.md).
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                trust_env=False,
                auto_decompress=False,
            )
        sent = {
            "Content-Type": headers.get("Content-Type", "application/json"),
            FORWARDED_HEADER: f"{time.time():.3f} {self._timeout_s:g}",
        }
        try:
            async with self._client.post(f"http://{address}{path}", data=body, headers=sent) as r:
                answer = await r.read()
                status = r.status
                content_type = r.content_type
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Never the exception's text: it may name the URL, and the path holds the token.
            self._failing_until[address] = time.monotonic() + self._timeout_s
            self._warn(address, type(exc).__name__)
            self._metrics.ingest_forwarded.labels("failed").inc()
            return None
        if status != 200:
            self._metrics.ingest_forwarded.labels("refused").inc()
            return None
        self._metrics.ingest_forwarded.labels("ok").inc()
        return web.Response(body=answer, status=200, content_type=content_type)

    def _warn(self, address: str, reason: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(address, -WARN_EVERY_S) < WARN_EVERY_S:
            return
        self._warned[address] = now
        log.warning(
            "requests forwarded to the replica at %s fail (%s): this replica commits their"
            " events itself meanwhile; check that delivery pods reach each other on the"
            " ingest port",
            address,
            reason,
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
