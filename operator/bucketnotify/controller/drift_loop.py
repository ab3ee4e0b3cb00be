"""One loop of drift checks for every object, spread evenly over the drift interval.

kopf's timers are one task per object, each keeping the object's last body (a few KiB to
tens of KiB with managedFields and kopf's annotations) and its timer state for as long as
the object lives: at 2,000 objects that was about 38 MiB of the operator's memory. This loop
takes the objects from kopf indices that keep only what a check needs of each, and starts
one check every ``interval / objects`` seconds, so a thousand objects never fire together.

A check and a change handler of the same object never run at once (``ObjectLocks``): a check
that read the old spec must not write the gateway after the change handler wrote the new.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Hashable, Iterable

import kopf

from bucketnotify.kube.apiserver import log_retried

__all__ = ["DriftLoop", "ObjectLocks"]

log = logging.getLogger(__name__)


class ObjectLocks:
    """One lock per object key, held by whoever reconciles the object; a lock nobody holds
    or waits for is dropped (weak values), so the map follows the work under way."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[Hashable, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def __call__(self, key: Hashable) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        return lock


class DriftLoop:
    """Calls ``check(key)`` once per ``interval_s`` for every key ``targets()`` gives (read
    anew each round: objects come and go), at most ``concurrency`` checks at once.

    A check that fails is logged and the loop goes on; a round that takes longer than the
    interval (checks slower than their share of it) starts the next one at once.
    """

    def __init__(
        self,
        interval_s: float,
        targets: Callable[[], Iterable[Hashable]],
        check: Callable[[Hashable], Awaitable[None]],
        concurrency: int = 8,
    ) -> None:
        self._interval_s = interval_s
        self._targets = targets
        self._check = check
        self._slots = asyncio.Semaphore(concurrency)
        self._running: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Round after round until cancelled; the first round one interval after the start
        (the change handlers of a starting operator have just synced everything)."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(self._interval_s)
            while True:
                started = loop.time()
                keys = list(self._targets())
                if keys:
                    await self._round(keys, started, self._interval_s / len(keys))
                rest = started + self._interval_s - loop.time()
                if rest > 0:
                    await asyncio.sleep(rest)
        finally:
            for task in list(self._running):
                task.cancel()
            await asyncio.gather(*self._running, return_exceptions=True)

    async def _round(self, keys: list[Hashable], started: float, step: float) -> None:
        loop = asyncio.get_running_loop()
        for i, key in enumerate(keys):
            delay = started + i * step - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._slots.acquire()
            task = asyncio.create_task(self._one(key))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _one(self, key: Hashable) -> None:
        try:
            await self._check(key)
        except asyncio.CancelledError:
            raise
        except kopf.TemporaryError as exc:
            # A wait (the API server throttling, a Topic not Ready): the next interval
            # checks again. A traceback each time would bury what needs a person.
            log.warning("drift check of %s not done now, trying again later: %s", key, exc)
        except Exception as exc:
            log_retried(log, f"drift check of {key} failed", exc)
        finally:
            self._slots.release()
