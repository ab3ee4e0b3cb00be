"""Direct delivery: an event for an empty shard goes to its endpoint before the ingest answers.

The queued path writes every event durably, lists it back, pushes it and removes it: on the
``dir://`` store three fsyncs and a dozen file operations per batch, most of a replica's
CPU; on the ``s3://`` store four gateway requests per event. Yet while the endpoint keeps
up, a shard is empty nearly all the time, and the event the ingest holds is the only one of
its shard. So when this replica owns the shard (other replicas hand it the requests for its
shards, ``delivery.peers.forwarding``, and tell it before answering when they committed to one
instead), the ingest pushes the event itself and answers the gateway once the endpoint has
acknowledged it; only when
the push fails is the event committed to the queue, still within the same request, and the
shard's rounds retry it (an event the endpoint refuses for good is dropped at once, as a
round would drop it). Either way the gateway's 2xx means the event is delivered or durable,
as before: nothing acknowledged is lost.

Order per object stays, as ``ShardGate`` keeps three things apart on each shard:

- a direct push goes only when the shard's last round left it empty, no commit to it has
  begun since, and no round is under way; one waits for the direct push under way on the
  shard, if any, and goes after it if the shard is still empty then, unless the wait
  would be long (``WAIT_BUDGET_S``): then it is committed (after that push, see below);
- a commit to the shard first marks it as not empty (no direct push starts after that),
  then waits for a direct push under way to end (the pushing request's own commit of a
  failed event does not wait: it holds the shard, so that event is queued before any
  later one of its object); another replica's commit marks it too, by the wake-up that
  replica sends before it answers the gateway (``committed_elsewhere``);
- a round waits for a direct push under way, and the shard counts as empty again only
  when a round has left nothing and no commit began or ended during it.

Requests in flight together were never ordered (the gateway does not wait for one before
sending the next); requests that wait for the shard are answered in their own time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from bucketnotify.delivery.model.queue import QueueName

__all__ = ["WAIT_BUDGET_S", "DirectDelivery", "ShardGate"]

Unit = tuple[QueueName, int]

WAIT_BUDGET_S = 0.05
"""The longest a request expects to wait for the direct pushes ahead of it on its shard
before it commits its event instead. Waiting is cheaper than a commit while the endpoint
is quick (a few ms a push: the line rarely gets longer than this); behind a slow endpoint
the waits would add up push after push, each request answered later than the one before,
while a commit waits only for the push under way and leaves the rest to the rounds, which
push different objects' events together."""

_PUSH_TIME_WEIGHT = 0.25
"""Weight of the latest direct push in a shard's push time (a moving average: one slow
push makes the next requests commit, a few quick ones let them wait again)."""


@dataclass
class _Shard:
    empty: bool = False
    """The last round left nothing, and no commit has begun since."""
    commits: int = 0
    """Commits under way."""
    committed: int = 0
    """Commits ended, ever: a round that saw it change cannot call the shard empty."""
    round: bool = False
    pushing: asyncio.Future[None] | None = None
    """Set while a direct push (and the commit of its event, if it failed) is under way."""
    holder: asyncio.Task[Any] | None = None
    started: float = 0.0
    """When the push under way began (monotonic)."""
    waiting: int = 0
    """Requests waiting for the push under way to go after it."""
    push_s: float = 0.0
    """Recent time a direct push held the shard (moving average; 0 before the first)."""


class ShardGate:
    """Order between direct pushes, commits and rounds, per shard (see the module)."""

    def __init__(self, wait_budget_s: float = WAIT_BUDGET_S) -> None:
        self._shards: dict[Unit, _Shard] = {}
        self.wait_budget_s = wait_budget_s

    def _of(self, unit: Unit) -> _Shard:
        shard = self._shards.get(unit)
        if shard is None:
            shard = self._shards[unit] = _Shard()
        return shard

    def is_empty(self, unit: Unit) -> bool:
        """Whether a direct push could take the shard now."""
        shard = self._shards.get(unit)
        return shard is not None and shard.empty

    async def take(self, unit: Unit) -> bool:
        """Hold the empty shard for a direct push, after the one under way if there is one
        and it should end soon (the shard stays empty while it succeeds: a short wait costs
        less than a commit, and events of one object are then pushed one after another);
        False once the shard is not empty or the wait would be long. ``give_back`` ends
        it."""
        shard = self._shards.get(unit)
        while shard is not None and shard.empty and shard.pushing is not None:
            if not self._worth_waiting(shard):
                return False
            shard.waiting += 1
            try:
                await asyncio.shield(shard.pushing)
            finally:
                shard.waiting -= 1
            shard = self._shards.get(unit)
        # A commit under way has made the shard not empty (``committing``).
        if shard is None or not shard.empty or shard.round:
            return False
        shard.pushing = asyncio.get_running_loop().create_future()
        shard.holder = asyncio.current_task()
        shard.started = time.monotonic()
        return True

    def _worth_waiting(self, shard: _Shard) -> bool:
        """Whether the pushes ahead (the one under way, and one for each request already
        waiting) should end within the budget. A push under way longer than the budget
        says the endpoint is slow now, whatever it was before."""
        age = time.monotonic() - shard.started
        ahead = max(shard.push_s - age, 0.0) + shard.waiting * shard.push_s
        return age < self.wait_budget_s and ahead < self.wait_budget_s

    def give_back(self, unit: Unit) -> None:
        shard = self._shards[unit]
        if shard.pushing is not None:
            took = time.monotonic() - shard.started
            shard.push_s = (
                took
                if not shard.push_s
                else shard.push_s + _PUSH_TIME_WEIGHT * (took - shard.push_s)
            )
            shard.pushing.set_result(None)
        shard.pushing = shard.holder = None

    async def _pushed(self, shard: _Shard) -> None:
        while shard.pushing is not None and shard.holder is not asyncio.current_task():
            await asyncio.shield(shard.pushing)

    @asynccontextmanager
    async def committing(self, units: Iterable[Unit]) -> AsyncIterator[None]:
        """Around a commit to the shards ``units``."""
        shards = [self._of(unit) for unit in units]
        for shard in shards:
            shard.empty = False
            shard.commits += 1
        try:
            for shard in shards:
                await self._pushed(shard)
            yield
        finally:
            for shard in shards:
                shard.commits -= 1
                shard.committed += 1

    def committed_elsewhere(self, unit: Unit) -> None:
        """Another replica committed to the shard (its wake-up says so): not empty until a
        round has taken what it wrote, one under way now included."""
        shard = self._shards.get(unit)
        if shard is not None:
            shard.empty = False
            shard.committed += 1

    async def round_starts(self, unit: Unit) -> int:
        """Before a round: waits for a direct push under way; gives what ``round_ended``
        needs back."""
        shard = self._of(unit)
        shard.round = True
        shard.empty = False
        await self._pushed(shard)
        return shard.committed

    def round_ended(self, unit: Unit, mark: int, left_empty: bool) -> None:
        shard = self._of(unit)
        shard.round = False
        shard.empty = left_empty and not shard.commits and shard.committed == mark

    def forget(self, unit: Unit) -> None:
        """The shard's loop ended (moved away, Topic changed, stopping): not empty until a
        new loop's round says so."""
        shard = self._shards.get(unit)
        if shard is not None:
            shard.empty = False
            if shard.pushing is None and not shard.commits and not shard.round:
                del self._shards[unit]


class DirectDelivery(Protocol):
    """What the ingest needs to push events itself (the delivery service provides it)."""

    gate: ShardGate

    def allowed(self, queue: QueueName, shard: int) -> bool:
        """This replica owns the shard, and any other replica that commits to it tells it
        first (every replica can reach every other)."""
        ...

    async def push(
        self,
        queue: QueueName,
        shard: int,
        record: dict[str, Any],
        event_id: str,
        body: bytes,
        ingest_time: float,
    ) -> bool:
        """Push one event (or recognise it as delivered already); True once it needs
        nothing more, False when it must be queued. Counts and records the outcome."""
        ...

    async def queued(self, queue: QueueName, shard: int, event_id: str, committed: bool) -> None:
        """After the commit of an event whose direct push failed (the shard still held):
        when ``committed``, count that push as its first attempt in the queue, and record
        it. Never raises."""
        ...
