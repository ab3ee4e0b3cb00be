"""Writes of one bucket's notification configuration: one at a time, and batched.

Each BucketNotification would read its bucket's whole configuration and write it back on its
own: ten Ids on a bucket, ten read-merge-writes of a growing document, each waiting its turn
in the one queue of writes the operator keeps per gateway (see ``GatewayPool``). Instead the
requests for one bucket that arrive while that bucket's previous batch is under way are
taken together, as a group commit: one read, each request decided on that read, one write of
every Id that needs it. A batch is never larger than what was waiting, so a lone request
costs what it did before.

Drift checks read the bucket too: a thousand BucketNotifications on a hundred buckets, each
checked every drift interval, would read each bucket ten times a minute to learn the same
thing. A batch made only of drift checks is decided on the bucket's last read if that is
younger than ``reuse_s`` (``BucketLocks.recent``); every write forgets it. So a bucket is
read about once per drift interval however many notifications it holds, and drift made by
someone else is seen at most ``reuse_s`` later than otherwise.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.metrics import OperatorMetrics

__all__ = ["AGAIN", "Batches", "BucketLocks"]

T = TypeVar("T")
R = TypeVar("R")


class _Again:
    def __repr__(self) -> str:
        return "AGAIN"


AGAIN = _Again()
"""A batch's answer for a request it could not take (another of the batch wants the same
thing): the request goes into the next batch."""

Process = Callable[[list[T]], Awaitable[list["R | BaseException | _Again"]]]


class Batches(Generic[T, R]):
    """Group commit per key: ``submit`` returns the result ``process`` gave its item in the
    batch that took it, or raises the exception it gave.

    ``process`` gets the items waiting for a key, in the order they came, and answers each
    with a result, an exception or ``AGAIN``; it runs under the key's lock, one batch of a
    key at a time. Should ``process`` itself raise, every item of the batch gets that.
    """

    def __init__(self, lock: Callable[[Hashable], asyncio.Lock]) -> None:
        self._lock = lock
        self._waiting: defaultdict[Hashable, list[tuple[T, asyncio.Future[R]]]] = defaultdict(list)

    async def submit(self, key: Hashable, item: T, process: Process[T, R]) -> R:
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting[key].append((item, done))
        try:
            while not done.done():
                async with self._lock(key):
                    if not done.done():  # else an earlier holder of the lock took it
                        await self._run(key, process)
        except asyncio.CancelledError:
            if key in self._waiting:
                self._waiting[key] = [p for p in self._waiting[key] if p[1] is not done]
            done.cancel()
            raise
        return done.result()

    async def _run(self, key: Hashable, process: Process[T, R]) -> None:
        batch = self._waiting.pop(key, [])
        try:
            answers = await process([item for item, _ in batch])
            if len(answers) != len(batch):
                raise RuntimeError(f"{len(answers)} answers to {len(batch)} items")
        except asyncio.CancelledError:
            # The others' requests go to the next holder of the lock (a write that went
            # through is written again: the same configuration).
            self._waiting[key][:0] = [(i, f) for i, f in batch if not f.done()]
            raise
        except Exception as exc:
            for _, future in batch:
                future.set_exception(exc)
            return
        for (item, future), answer in zip(batch, answers, strict=True):
            if isinstance(answer, _Again):
                self._waiting[key].append((item, future))
            elif isinstance(answer, BaseException):
                future.set_exception(answer)
            else:
                future.set_result(answer)


class BucketLocks:
    """One asyncio lock per (gateway, bucket), and the batches of writes under it.

    A batch is written with one user's keys, so its key names the user too: two users
    writing one bucket share the lock, not a batch."""

    def __init__(self, metrics: OperatorMetrics | None = None, *, reuse_s: float = 0.0) -> None:
        self._locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self.batches: Batches[Any, Any] = Batches(self._batch_lock)
        self._metrics = metrics
        self._reuse_s = reuse_s
        self._reads: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        """batch key -> (monotonic time, configuration) of the last read, oldest first"""

    def recent(self, key: Hashable) -> Any | None:
        """The bucket's configuration as read less than ``reuse_s`` ago, else None."""
        found = self._reads.get(key)
        if found is None or time.monotonic() - found[0] >= self._reuse_s:
            return None
        return found[1]

    def remember(self, key: Hashable, configuration: Any) -> None:
        if self._reuse_s <= 0:
            return
        now = time.monotonic()
        self._reads.pop(key, None)
        self._reads[key] = (now, configuration)
        # Only reads young enough to be reused are kept: the memory follows the buckets
        # read within ``reuse_s``, not every bucket ever read.
        while self._reads and now - next(iter(self._reads.values()))[0] >= self._reuse_s:
            self._reads.popitem(last=False)

    def forget(self, key: Hashable) -> None:
        """The bucket was written (or a write was tried): its last read is stale."""
        self._reads.pop(key, None)

    def wrote(self, notifications: int) -> None:
        """One write of a bucket's configuration, with this many notifications in it."""
        if self._metrics is not None:
            self._metrics.bucket_writes.inc()
            self._metrics.bucket_write_notifications.inc(notifications)

    def __call__(self, connection: GatewayConnection, bucket: str) -> asyncio.Lock:
        return self._locks[(connection.endpoint, bucket)]

    def _batch_lock(self, key: Hashable) -> asyncio.Lock:
        assert isinstance(key, tuple), key  # a key() of this class
        return self._locks[(str(key[0]), str(key[1]))]

    @staticmethod
    def key(connection: GatewayConnection, bucket: str) -> tuple[str, str, str]:
        """The batch key of a bucket for the user of ``connection``."""
        return (connection.endpoint, bucket, connection.access_key)
