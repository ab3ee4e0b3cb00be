"""The operator's way to its gateways: one set of clients per connection, writes one at a time.

Ceph 16 keeps every topic of a tenant, and the copy of a topic it makes for each bucket
notification, in one RADOS object, which CreateTopic, DeleteTopic and a PUT or DELETE of
``?notification`` each read, change and write back with a version check. Two such writes at
once and one fails with 500 (measured: 470 of them when the operator reconciled 200 Topics
and 200 BucketNotifications at once, each then waiting out kopf's retry delay). The operator
is the one writer it can order, so it sends its writes to a gateway one at a time, reads
still in parallel; other clients of the same tenant still collide with it, so a 5xx is tried
again after a short random pause a few times before it is reported.

The lock is per gateway endpoint, not per user: the object is the tenant's, and which tenant
a key belongs to is the gateway's secret. Writes to one gateway are tens of milliseconds
each, so a thousand objects take well under a minute of serial writes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.errors import GatewayServerError
from bucketnotify.gateway.notifications import NotificationClient
from bucketnotify.gateway.release import GatewayRelease, asked_release, release_named
from bucketnotify.gateway.topic_listing import TopicListing
from bucketnotify.gateway.topics import TopicClient

__all__ = ["Gateway", "GatewayPool", "WriteRetry"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class WriteRetry:
    """How a write the gateway answered with a 5xx is tried again before it is reported
    (the caller's own, slower retry takes over from there)."""

    attempts: int = 8
    """Tries in all. Eight ride out a few seconds of other clients writing to the same
    tenant at once; a gateway that is really failing is reported about 4 s later."""
    first_pause_s: float = 0.05
    """Longest pause after the first failure: a conflicting write takes tens of ms."""
    max_pause_s: float = 1.0
    """Longest pause between two tries; the bound doubles from ``first_pause_s`` up to it."""

    def pause(self, failures: int, draw: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``failures``-th failure: "full jitter", so that writers
        that failed together do not try again together. ``draw``: a number in [0, 1)."""
        bound: float = min(self.max_pause_s, self.first_pause_s * 2.0 ** (failures - 1))
        return draw() * bound


class Gateway:
    """The clients of one connection, shared by every reconcile, and its gateway's write lock.

    ``read`` and ``write`` run a blocking client call in a worker thread; ``write`` holds the
    lock for the call and tries a 5xx again as ``retry`` says, without the lock in between.
    ``listing`` serves drift checks of topics (a listing younger than ``listing_reuse_s``).
    """

    def __init__(
        self,
        connection: GatewayConnection,
        lock: asyncio.Lock,
        retry: WriteRetry,
        listing_reuse_s: float = 0.0,
        counted: Callable[[str], None] | None = None,
    ):
        self.connection = connection
        self.topics = TopicClient(connection)
        self.notifications = NotificationClient(connection, topics=self.topics)
        if counted is not None:
            self.topics.count_requests(counted)
            self.notifications.count_requests(counted)
        self.listing = TopicListing(
            lambda: self.read(self.topics.list_all),
            lambda arn: self.read(self.topics.get, arn),
            listing_reuse_s,
        )
        self._lock = lock
        self._retry = retry

    async def read(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.to_thread(call, *args, **kwargs)

    async def write(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        started = time.monotonic()
        failures = 0
        while True:
            try:
                async with self._lock:
                    return await asyncio.to_thread(call, *args, **kwargs)
            except GatewayServerError as exc:
                failures += 1
                if failures >= self._retry.attempts:
                    raise GatewayServerError(
                        f"{exc} (tried {failures} times in"
                        f" {time.monotonic() - started:.1f} s; Ceph answers 500 while another"
                        " client writes the same tenant's topics)"
                    ) from None
                pause = self._retry.pause(failures)
                log.debug("%s; trying again in %.2f s", exc, pause)
                await asyncio.sleep(pause)

    def close(self) -> None:
        self.notifications.close()
        self.topics.close()


class GatewayPool:
    """The ``Gateway`` of each connection in use. Holds the ``size`` most recently used;
    the write locks, one per endpoint, are kept for good (one per gateway is few).
    ``listing_reuse_s``: how old a topic listing a drift check may use (0: none);
    ``release``: the Ceph release of every gateway, when a setting names it;
    ``learned(endpoint, release)``: called once per gateway when its release is known;
    ``counted(operation)``: called for every request sent to a gateway."""

    def __init__(
        self,
        retry: WriteRetry | None = None,
        size: int = 32,
        listing_reuse_s: float = 0.0,
        release: str | None = None,
        learned: Callable[[str, GatewayRelease], None] | None = None,
        counted: Callable[[str], None] | None = None,
    ) -> None:
        self._retry = retry or WriteRetry()
        self._learned = learned
        self._counted = counted
        # Per endpoint, like the locks: a release is the gateway's, whichever user asks.
        self._set_release = release_named(release) if release else None
        self._releases: dict[str, GatewayRelease] = {}
        self._detecting: dict[str, asyncio.Lock] = {}
        self._size = size
        self._listing_reuse_s = listing_reuse_s
        self._gateways: OrderedDict[GatewayConnection, Gateway] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._building = asyncio.Lock()

    async def get(self, connection: GatewayConnection) -> Gateway:
        gateway = self._gateways.get(connection)
        if gateway is None:
            async with self._building:  # two reconciles of one new connection build it once
                gateway = self._gateways.get(connection)
                if gateway is None:
                    lock = self._locks.setdefault(connection.endpoint, asyncio.Lock())
                    # Off the event loop: a TLS context and a boto3 client take a while.
                    gateway = await asyncio.to_thread(
                        Gateway,
                        connection,
                        lock,
                        self._retry,
                        self._listing_reuse_s,
                        self._counted,
                    )
                    self._gateways[connection] = gateway
        self._gateways.move_to_end(connection)
        while len(self._gateways) > self._size:
            # Not closed: a reconcile may still use it; its sockets close with it.
            self._gateways.popitem(last=False)
        return gateway

    async def release(self, connection: GatewayConnection) -> GatewayRelease:
        """The Ceph release of the gateway at ``connection.endpoint``: the setting's, else
        asked once per endpoint (again after an unreachable answer), announced once."""
        endpoint = connection.endpoint
        known = self._releases.get(endpoint)
        if known is not None:
            return known
        async with self._detecting.setdefault(endpoint, asyncio.Lock()):
            known = self._releases.get(endpoint)  # a reconcile before this one found it
            if known is not None:
                return known
            found = self._set_release
            if found is None:
                found = await asyncio.to_thread(asked_release, connection)
                if found.learned_from == "unreachable":
                    return found
            self._releases[endpoint] = found
        log.info("gateway %s runs Ceph %s (from its %s)", endpoint, found.name, found.learned_from)
        if self._learned is not None:
            self._learned(endpoint, found)
        return found

    def close(self) -> None:
        for gateway in self._gateways.values():
            gateway.close()
        self._gateways.clear()
