"""The identities of the events each shard delivered last, kept in the queue store for the
shard's next owner: what the gateway sends again after a shard moved (or after a replica
died) is then recognised as a duplicate and removed, not pushed again.

A busy shard saves them every ``DELIVERED_SAVE_S``; an idle one before it goes to sleep,
and a shard whose events go directly (``delivery.rounds.direct``, its loop asleep) within
``DELIVERED_SAVE_S`` of its last direct delivery. Reading or saving them is a hint: when
it fails, duplicates are possible, never losses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from bucketnotify.delivery.model.delivered_ids import DeliveredCache
from bucketnotify.delivery.model.queue import QueueName, QueueStore
from bucketnotify.delivery.topics.table import TopicRuntime

__all__ = ["DELIVERED_KEPT", "DELIVERED_SAVE_S", "DeliveredIds", "woken"]

log = logging.getLogger(__name__)

DELIVERED_KEPT = 2048
"""Identities of the events a shard delivered last, kept in the store for its next owner:
what the gateway sends again after a shard moved is then recognised (a duplicate removed,
not pushed)."""
DELIVERED_SAVE_S = 2.0
"""How often a busy shard saves them (and when its loop ends): a replica that dies loses
at most this long of them."""


class DeliveredIds:
    """Loads and saves the shards' ``DeliveredCache`` in the queue store."""

    def __init__(self, store: QueueStore) -> None:
        self._store = store
        self._timers: dict[tuple[QueueName, int], asyncio.TimerHandle] = {}
        """Shards whose directly delivered identities are to be saved (``save_soon``)."""
        self._saving: set[asyncio.Task[None]] = set()

    def save_soon(self, runtime: TopicRuntime, shard: int, delivered: DeliveredCache) -> None:
        """Save the shard's delivered identities within ``DELIVERED_SAVE_S``: its loop,
        asleep while events go directly, would not until its next round."""
        unit = (runtime.queue, shard)
        if unit in self._timers:
            return

        def due() -> None:
            del self._timers[unit]
            task = asyncio.create_task(self.save(runtime, shard, delivered, final=True))
            self._saving.add(task)
            task.add_done_callback(self._saving.discard)

        self._timers[unit] = asyncio.get_running_loop().call_later(DELIVERED_SAVE_S, due)

    async def idle(
        self, runtime: TopicRuntime, shard: int, delivered: DeliveredCache, wake: asyncio.Event
    ) -> None:
        """Wait to be woken. What the shard delivered is saved first, once the periodic
        save is due: there may be no round to do it for a long time, and a replica killed
        meanwhile would leave its successor to push again what the gateway re-sends. Not at
        once: under light load a shard goes idle after nearly every event."""
        saved, at = runtime.delivered_saved.get(shard, (0, 0.0))
        if delivered.added != saved:
            due = max(0.0, DELIVERED_SAVE_S - (time.monotonic() - at))
            if await woken(wake, due):
                return
            await self.save(runtime, shard, delivered, final=True)
        await wake.wait()

    async def load(self, runtime: TopicRuntime, shard: int, delivered: DeliveredCache) -> None:
        """What the shard's previous owner (or this replica, before) delivered last."""
        try:
            found = await self._store.load_delivered(runtime.queue, shard)
        except Exception as exc:  # a hint: without it, duplicates are possible, not losses
            log.warning("%s shard %d: delivered identities not read: %s", runtime.queue, shard, exc)
            return
        for event_id in found:
            if event_id not in delivered:
                delivered.add(event_id)
        runtime.delivered_saved[shard] = (delivered.added, time.monotonic())

    async def save(
        self, runtime: TopicRuntime, shard: int, delivered: DeliveredCache, final: bool = False
    ) -> None:
        saved, at = runtime.delivered_saved.get(shard, (0, 0.0))
        if delivered.added == saved:
            return
        if not final and time.monotonic() - at < DELIVERED_SAVE_S:
            return
        runtime.delivered_saved[shard] = (delivered.added, time.monotonic())
        try:
            await self._store.save_delivered(runtime.queue, shard, delivered.recent(DELIVERED_KEPT))
        except Exception as exc:
            log.warning(
                "%s shard %d: delivered identities not saved: %s", runtime.queue, shard, exc
            )

    async def aclose(self) -> None:
        """Saves still due are dropped (the loops' last saves covered them); those under way
        finish."""
        for timer in self._timers.values():
            timer.cancel()
        if self._saving:
            await asyncio.wait(self._saving)


async def woken(wake: asyncio.Event, timeout_s: float) -> bool:
    """Wait for ``wake`` at most ``timeout_s``; whether it was set. (``asyncio.wait_for``
    would make a task of every wait: one per round of every shard.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await wake.wait()
    return wake.is_set()
