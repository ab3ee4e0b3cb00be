"""Wake-ups between replicas: the ingest tells a shard's owner that it has new entries.

A shard whose last round found it empty does not poll the store again: it waits until
something says there is work (S3 LISTs of hundreds of idle shards every second would cost
the gateway more than the traffic). When the ingest commits to a shard this replica owns,
it wakes the shard's task directly; when another replica owns it, this module sends that
replica ``POST /v1/wake`` with ``{"shards": [[namespace, topic, shard], ...]}``, to the
address its member Lease advertises (``Ownership.owner_address``).

Without direct delivery, sending never delays the ingest's answer: a wake-up goes out in
the background (``send``), and the wake-ups for one replica that arrive while a request to
it is under way go together in the next request. With it, the ingest waits for its
wake-up (``tell``, at most ``TELL_TIMEOUT_S``) before it answers: the owner then marks the
shard not empty, and pushes no later event of its objects directly ahead of the committed
ones (``delivery.rounds.direct``).

A wake-up sent to the previous holder of a shard that has just moved is made up for by the
new holder, which polls the shard for a while after taking it. One lost otherwise (the
owner restarted, the network) only delays delivery: the owner of each queue's shard 0
surveys the queue every ``stats_interval_s`` and wakes every shard that holds entries, and
each replica looks at its own shards less often too, for when the replicas cannot reach
each other at all.

A wake-up carries no event and no secret, and answering one costs at most a LIST of the
shard per processing round: a flood of them costs what polling every shard each round
would. That is why the endpoint needs no token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp

from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.metrics import DeliveryMetrics

__all__ = ["MAX_WAKE_SHARDS", "WakeUps", "parse_wake"]

log = logging.getLogger(__name__)

WAKE_PATH = "/v1/wake"
MAX_WAKE_SHARDS = 10_000
"""Shards one request may name: a larger body is refused (400)."""
SEND_TIMEOUT_S = 2.0
TELL_TIMEOUT_S = 1.0
"""How long a wake-up the gateway's answer waits for (``tell``) may take."""
WARN_EVERY_S = 60.0
"""At most one warning this often per peer that cannot be reached."""

Shard = tuple[str, str, int]


def parse_wake(body: Any) -> list[tuple[QueueName, int]] | None:
    """The shards a wake-up names; None when the body is not what ``WakeUps`` sends."""
    shards = body.get("shards") if isinstance(body, dict) else None
    if not isinstance(shards, list) or len(shards) > MAX_WAKE_SHARDS:
        return None
    found = []
    for item in shards:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not all(isinstance(part, str) and part for part in item[:2])
            or not isinstance(item[2], int)
            or isinstance(item[2], bool)
            or item[2] < 0
        ):
            return None
        found.append((QueueName(item[0], item[1]), item[2]))
    return found


class WakeUps:
    """Sends wake-ups to the replicas that own shards this one committed to."""

    def __init__(
        self,
        address_of: Callable[[QueueName, int], str | None],
        metrics: DeliveryMetrics,
        *,
        timeout_s: float = SEND_TIMEOUT_S,
    ) -> None:
        self._address_of = address_of
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._client: aiohttp.ClientSession | None = None
        self._pending: dict[str, set[Shard]] = {}
        self._sending: dict[str, asyncio.Task[None]] = {}
        self._warned: dict[str, float] = {}

    def send(self, queue: QueueName, shard: int) -> None:
        """Tell the shard's owner, if that is another replica that can be reached."""
        address = self._address_of(queue, shard)
        if address is None:
            return
        self._pending.setdefault(address, set()).add((queue.namespace, queue.topic, shard))
        if address not in self._sending:
            self._sending[address] = asyncio.create_task(
                self._flush(address), name=f"wake-ups to {address}"
            )

    async def tell(self, queue: QueueName, shards: list[int]) -> None:
        """Tell the shards' owner now, and return once it has the news (or could not be
        reached): a replica that committed to a shard another owns does so before the
        gateway gets its answer, so that the owner pushes no later event of an object
        directly ahead of the committed one (``delivery.rounds.direct``). Even to an owner whose
        hand-over just failed: a slow owner is not a gone one."""
        by_address: dict[str, list[Shard]] = {}
        for shard in shards:
            if (address := self._address_of(queue, shard)) is not None:
                by_address.setdefault(address, []).append((queue.namespace, queue.topic, shard))
        for address, named in by_address.items():
            outcome = await self._post(address, named, TELL_TIMEOUT_S)
            self._metrics.wakeups_sent.labels(outcome).inc(len(named))

    async def _post(self, address: str, shards: Iterable[Shard], timeout_s: float = 0.0) -> str:
        """One wake-up request; its outcome (ok, refused or failed)."""
        if self._client is None:
            # Plain HTTP inside the cluster: a wake-up carries nothing worth protecting.
            # aiohttp rather than httpx: cheaper per request (docs/performance-notes.md), and a
            # wake-up goes out for most commits of a replica that owns half the shards.
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s), trust_env=False
            )
        body = {"shards": [list(s) for s in sorted(shards)]}
        try:
            async with self._client.post(
                f"http://{address}{WAKE_PATH}",
                json=body,
                timeout=aiohttp.ClientTimeout(total=timeout_s or self._timeout_s),
            ) as response:
                return "ok" if response.status == 204 else "refused"
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Expected while a peer restarts; the survey catches what this missed.
            # Failing for long means the replicas cannot reach each other: say so.
            self._warn(address, exc)
            return "failed"

    async def _flush(self, address: str) -> None:
        try:
            while shards := self._pending.pop(address, None):
                outcome = await self._post(address, shards)
                self._metrics.wakeups_sent.labels(outcome).inc(len(shards))
        finally:
            del self._sending[address]

    def _warn(self, address: str, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._warned.get(address, -WARN_EVERY_S) < WARN_EVERY_S:
            return
        self._warned[address] = now
        log.warning(
            "wake-ups to the replica at %s fail (%s): its events wait for a queue survey"
            " instead; check that delivery pods reach each other on the ingest port",
            address,
            type(exc).__name__,
        )

    async def aclose(self) -> None:
        tasks = list(self._sending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pending.clear()
        if self._client is not None:
            await self._client.close()
