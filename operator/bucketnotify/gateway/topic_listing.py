"""Drift checks of Topics from one ListTopics per gateway and interval.

A drift check of a Topic reads its gateway topic. One GetTopicAttributes per Topic and drift
interval is a request per Topic and minute, and on Ceph 16 each one reads the tenant's whole
topics object, so its cost grows with the number of topics: at 5,000 Topics the checks alone
kept the gateway busy (83 requests/s, radosgw at 144 % CPU) and new notifications waited
behind them. ListTopics answers every topic with its attributes in one request.

A check is decided on the gateway's last listing when it is younger than ``reuse_s`` (the
drift interval): drift made by someone else is seen at most one interval later than with a
read of its own. A topic the listing lacks is read on its own before it is called missing
(it may have been made after the listing), and a topic the operator writes is read on its
own until the next listing. When the gateway refuses the listing (Ceph 16 does over plain
HTTP once any topic holds a secret), checks read their topic one by one until ``reuse_s``
has passed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from bucketnotify.gateway.errors import GatewayError
from bucketnotify.gateway.topics import GatewayTopic

__all__ = ["TopicListing"]

log = logging.getLogger(__name__)

Lister = Callable[[], Awaitable[dict[str, GatewayTopic]]]
Getter = Callable[[str], Awaitable[GatewayTopic | None]]


class TopicListing:
    """The last listing of one gateway connection's topics, shared by its drift checks."""

    def __init__(self, list_all: Lister, get: Getter, reuse_s: float) -> None:
        self._list_all = list_all
        self._get = get
        self._reuse_s = reuse_s
        self._topics: dict[str, GatewayTopic] | None = None
        self._taken = 0.0
        self._refused_until = 0.0
        self._written: set[str] = set()
        self._lock = asyncio.Lock()

    async def find(self, name: str, arn: str) -> GatewayTopic | None:
        """The topic named ``name`` (ARN ``arn``), or None when the gateway has none."""
        topics = await self._recent()
        if topics is not None and name in topics:
            return topics[name]
        return await self._get(arn)

    def forget(self, name: str) -> None:
        """The topic ``name`` was written: the listing no longer says what it is."""
        if self._topics is not None:
            self._topics.pop(name, None)
        self._written.add(name)  # a listing under way may predate the write

    async def _recent(self) -> dict[str, GatewayTopic] | None:
        if self._fresh():
            return self._topics
        async with self._lock:  # checks due together wait for one listing
            if self._fresh() or time.monotonic() < self._refused_until:
                return self._topics
            self._written.clear()
            try:
                topics = await self._list_all()
            except GatewayError as exc:
                # Read one by one for a while; a real outage fails those reads too.
                log.info("listing the gateway's topics failed (%s): reading them one by one", exc)
                self._refused_until = time.monotonic() + self._reuse_s
                self._topics = None  # an older listing must not answer meanwhile
                return None
            for name in self._written:
                topics.pop(name, None)
            self._topics, self._taken = topics, time.monotonic()
            return topics

    def _fresh(self) -> bool:
        return self._topics is not None and time.monotonic() - self._taken < self._reuse_s
