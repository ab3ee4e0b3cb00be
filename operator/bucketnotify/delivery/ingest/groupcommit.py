"""Group commit: concurrent ingest requests of one queue share one store write per shard.

Each request hands in its events by shard and waits. While a queue has fewer than
``max_writes`` writes under way, a request starts one at once, with everything waiting;
once that many are under way, requests wait for one of them to end and then go together
in the next. So under load a write carries what arrived while the others ran (one batch
file and fsync, or one object, per shard for several requests, and for the S3 store one
scan for all their reservations), while a request under light load waits for nobody.
Several writes at once, not one: the shards of a queue are written in parallel anyway, and
with a single write a request arriving just after it started would wait for all of it.

Guarantees, the same as one write per request:

- A request's answer comes only after the write holding its events returned, i.e. they are
  durable; a failed write fails every request in it (the gateway sends them again).
- All shards or none: the group is reserved in every shard before it is committed to any.
  When the group does not fit (the queue is full), each request is tried on its own, so one
  large request cannot make smaller ones that fit fail.
- Order: a request's events keep their order, and the group's events of one shard are
  those of its requests one after another. An event acknowledged before another was sent
  is committed first: its write had ended before the other's began. (Requests in flight
  together were never ordered: the gateway does not wait for one before sending the next.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bucketnotify.delivery.model.queue import QueueFull, QueueName

__all__ = ["Events", "GroupCommit"]

Events = dict[int, list[tuple[str, bytes]]]
"""(event_id, body) pairs by shard, in order."""

Write = Callable[[QueueName, Events], Awaitable[float]]
"""Reserves and commits the events, all shards or none; returns their ingest time."""

MAX_WRITES = 4
"""Writes of one queue at once before requests start to wait and group."""
MAX_GROUP_EVENTS = 10_000
MAX_GROUP_BYTES = 8 * 1024 * 1024
"""A write takes requests until it holds this much (always at least one request): the
bound of one batch file or object, and of what one failure sends back to the gateway."""


@dataclass
class _Request:
    events: Events
    size: tuple[int, int]
    done: asyncio.Future[float] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class GroupCommit:
    def __init__(
        self,
        write: Write,
        *,
        max_writes: int = MAX_WRITES,
        max_events: int = MAX_GROUP_EVENTS,
        max_bytes: int = MAX_GROUP_BYTES,
    ) -> None:
        self._write = write
        self._max_writes = max_writes
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._waiting: dict[QueueName, list[_Request]] = {}
        self._writers: dict[QueueName, set[asyncio.Task[None]]] = {}

    async def commit(self, queue: QueueName, events: Events) -> float:
        """Durably commit ``events`` together with whatever else is waiting; returns the
        ingest time they got (epoch seconds). Raises what the write raised."""
        size = (
            sum(len(e) for e in events.values()),
            sum(len(b) for e in events.values() for _, b in e),
        )
        request = _Request(events, size)
        # Retrieved even when its caller went away, so asyncio does not log it as lost.
        request.done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._waiting.setdefault(queue, []).append(request)
        writers = self._writers.setdefault(queue, set())
        if len(writers) < self._max_writes:
            # A task of its own: a request whose client goes away must not take the write
            # of the others with it.
            writer = asyncio.create_task(self._drain(queue), name=f"group-commit {queue}")
            writers.add(writer)
        return await asyncio.shield(request.done)

    async def aclose(self) -> None:
        """Wait for the writes under way (and what waits for them) to end."""
        while self._writers:
            tasks = [t for writers in self._writers.values() for t in writers]
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _drain(self, queue: QueueName) -> None:
        group: list[_Request] = []
        try:
            while waiting := self._waiting.get(queue):
                group = self._take(waiting)
                if not waiting:
                    del self._waiting[queue]
                await self._commit_group(queue, group)
        except BaseException as exc:
            # Cancelled (the process is stopping): no request may wait for ever. Those of
            # the group may have been written; the gateway's retry makes a duplicate then.
            for request in group + self._waiting.pop(queue, []):
                _settle(request, exc)
            raise
        finally:
            writers = self._writers[queue]
            writers.discard(asyncio.current_task())  # type: ignore[arg-type,unused-ignore]
            if not writers:
                del self._writers[queue]

    def _take(self, waiting: list[_Request]) -> list[_Request]:
        """The oldest requests up to the group's bounds (at least one), taken from the list."""
        events = size = taken = 0
        for request in waiting:
            if taken and (
                events + request.size[0] > self._max_events
                or size + request.size[1] > self._max_bytes
            ):
                break
            events += request.size[0]
            size += request.size[1]
            taken += 1
        group = waiting[:taken]
        del waiting[:taken]
        return group

    async def _commit_group(self, queue: QueueName, group: list[_Request]) -> None:
        merged: Events = {}
        for request in group:
            for shard, events in request.events.items():
                merged.setdefault(shard, []).extend(events)
        try:
            committed_at = await self._write(queue, merged)
        except QueueFull as exc:
            if len(group) == 1:
                _settle(group[0], exc)
                return
            # Nothing of the group was written: try each request on its own.
            for request in group:
                try:
                    _settle(request, await self._write(queue, request.events))
                except Exception as alone:
                    _settle(request, alone)
        except Exception as exc:
            for request in group:
                _settle(request, exc)
        else:
            for request in group:
                _settle(request, committed_at)


def _settle(request: _Request, outcome: float | BaseException) -> None:
    if request.done.done():
        return
    if isinstance(outcome, asyncio.CancelledError):
        request.done.cancel()
    elif isinstance(outcome, BaseException):
        request.done.set_exception(outcome)
    else:
        request.done.set_result(outcome)
