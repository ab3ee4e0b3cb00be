"""One processing round of one queue shard: list, push, remove what was acknowledged.

Decisions are made here; the store and the endpoint are adapters behind their interfaces.

- Order: entries of one object (bucket and key) go out one after another; a key whose entry
  failed sends nothing more this round, so a later event never overtakes an earlier one.
  Different keys go out together, bounded by the endpoint's own in-flight limit.
- What a push, an expiry or a drop makes of an event is decided in ``outcomes``; here is
  when: a failed entry is written back with ``attempts`` + 1 and is not retried before
  its retry delay has passed; dropped entries (expired or undeliverable) are handed to
  the ``dead_letter`` sink, if there is one, before they are removed; if it fails they
  stay and are offered again next round.
- Duplicates: an entry whose event identity was already delivered (the gateway re-sends
  some events) is removed without being pushed.
- Fencing: nothing is removed or updated once this replica no longer owns the shard; the
  new owner sends those entries again (a duplicate, never a loss).
- Outcomes: ``RoundResult.outcomes`` names what became of each event this round, one
  ``EventOutcome`` per delivery record (``bucketnotify.records``); it holds only what the
  counters of the round count too, so records and metrics add up to the same numbers.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from bucketnotify import compact_json
from bucketnotify.delivery.endpoints.base import Endpoint
from bucketnotify.delivery.model.delivered_ids import DeliveredCache
from bucketnotify.delivery.model.event import object_of
from bucketnotify.delivery.model.outcomes import (
    DeliveryPolicy,
    EventOutcome,
    RoundResult,
    dropped,
    expiry,
    judge,
    not_dropped,
)
from bucketnotify.delivery.model.push import Delivery, PushOutcome
from bucketnotify.delivery.model.queue import Entry, QueueName, QueueStore
from bucketnotify.records import Outcome

__all__ = [
    "DeadLetterSink",
    "RoundCutShort",
    "process_shard",
]

DeadLetterSink = Callable[[Sequence[EventOutcome]], Awaitable[set[str]]]
"""Takes drops durably (another Topic's queue, the Topic's dead-letter queue) or raises
(then it took none); answers the entry ids it had no room for, which are lost."""

LIST_BATCH = 1024
# A round has at most this many pushes started (the endpoints' default in-flight bound), and
# each one beyond the first window asks whether the shard is still ours when it starts: a
# replica paused past its Lease that resumes mid-round sends at most the pushes already
# under way, not the rest of a batch the next owner now delivers.
FENCE_WINDOW = 64
# A round longer than this (a backlog after a takeover, a slow endpoint) removes what it has
# delivered so far before it pushes more: a replica killed mid-round then leaves at most
# this long of acknowledged pushes (plus those in flight) for the next owner to repeat,
# not the whole round. Short rounds still make one removal at their end.
PROGRESS_S = 0.5
ERROR_KEPT = 200
"""Characters of a failed push's error kept in its entry (for its dead letter)."""


class RoundCutShort(Exception):
    """The queue store failed at a round's end; ``result`` holds what did happen.

    Failing to remove (``result.cut_short``), only the pushes happened (delivered, failed,
    refused as failed attempts), as in a fenced round: the entries stay queued, and the next
    round removes the delivered ones without a push and without counting them again, and
    decides the drops anew. Failing to write back the failed pushes, the removals and drops
    stand and only ``retried`` is 0."""

    def __init__(self, result: RoundResult, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.result = result
        self.cause = cause


async def process_shard(
    *,
    store: QueueStore,
    queue: QueueName,
    shard: int,
    endpoint: Endpoint,
    policy: DeliveryPolicy,
    delivered: DeliveredCache,
    still_owned: Callable[[], bool],
    now: float,
    dead_letter: DeadLetterSink | None = None,
) -> RoundResult:
    """One round of ``queue``'s ``shard``: list, push in waves, drop, remove, write back."""
    round_ = _Round(store, queue, shard, endpoint, policy, delivered, still_owned, now)
    entries = await store.list(queue, shard, LIST_BATCH)
    round_.result.listed = len(entries)
    round_.sort(entries)
    await round_.push_waves()
    if not round_.owned():
        round_.result.fenced = True
        _pushes_only(round_.result, round_.refusals)
        return round_.result
    try:
        await round_.drop(dead_letter)
        await round_.remove()
        await round_.write_back()
    finally:
        # Also of a round cut short (``RoundCutShort`` carries this result): what it could
        # not remove is still there.
        left = [e.ingest_time for e in entries if e.id not in round_.gone]
        round_.result.left = len(left)
        round_.result.oldest_left = min(left, default=None)
    return round_.result


class _Round:
    """The state of one round and its steps (``process_shard``)."""

    def __init__(
        self,
        store: QueueStore,
        queue: QueueName,
        shard: int,
        endpoint: Endpoint,
        policy: DeliveryPolicy,
        delivered: DeliveredCache,
        still_owned: Callable[[], bool],
        now: float,
    ) -> None:
        self.store, self.queue, self.shard = store, queue, shard
        self.endpoint, self.policy, self.delivered = endpoint, policy, delivered
        self.still_owned, self.now = still_owned, now
        self.result = RoundResult()
        self.fenced = False
        self.window = asyncio.Semaphore(FENCE_WINDOW)
        self.started = 0
        self.dropped: list[Entry] = []
        self.drops: dict[str, EventOutcome] = {}
        """Outcomes that stand only once the round's removals do (dropped, duplicates)."""
        self.refusals: dict[str, EventOutcome] = {}
        """Pushes refused for good this round, by entry (dropped, unless the drops fail)."""
        self.removing: list[str] = []
        self.gone: set[str] = set()
        """Entries removed by the round (what it leaves is the rest of its listing)."""
        self.retry: list[Entry] = []
        self.chains: OrderedDict[tuple[str, str], list[tuple[Entry, dict[str, Any]]]] = (
            OrderedDict()
        )
        self.blocked: set[tuple[str, str]] = set()

    def owned(self) -> bool:
        # Once lost, lost for the whole round: a partition taken back later must start from
        # a fresh listing, not from this round's stale one.
        self.fenced = self.fenced or not self.still_owned()
        return not self.fenced

    def sort(self, entries: list[Entry]) -> None:
        """What is removed (delivered before), dropped (expired), waits (its retry time, or
        an earlier event of its object waits) or is pushed, in chains per object."""
        result, now = self.result, self.now
        for entry in entries:
            if entry.id in self.delivered.unremoved:
                self.removing.append(entry.id)  # delivered and counted by a round cut short
                continue
            record: dict[str, Any] = compact_json.loads(entry.body)
            obj = object_of(record)
            if entry.event_id in self.delivered:
                result.duplicates += 1
                self.removing.append(entry.id)
                self.drops[entry.id] = EventOutcome(
                    Outcome.DUPLICATE, entry, record, entry.attempts, now
                )
            elif reason := expiry(entry, self.policy, now):
                result.expired += 1
                self.dropped.append(entry)
                self.drops[entry.id] = EventOutcome(
                    Outcome.EXPIRED, entry, record, entry.attempts, now, reason
                )
            elif entry.not_before > now or obj in self.blocked:
                # Waiting for its retry time, and everything after it for the same object
                # waits too.
                self.blocked.add(obj)
            else:
                self.chains.setdefault(obj, []).append((entry, record))

    async def _remove_delivered(self) -> None:
        # Delivered and duplicate entries only: drops wait for the round's end (a drop to
        # the dead-letter topic is committed there first). Never on a shard no longer ours.
        if not self.removing or not self.owned():
            return
        taken = self.removing[:]
        del self.removing[:]
        try:
            await self.store.remove(self.queue, self.shard, taken)
            self.gone.update(taken)
        except Exception:
            # The round's own removal at its end tries them again, and fails the round if
            # the store still refuses: the pushes must not fail over it.
            self.removing[:0] = taken

    async def push_waves(self) -> None:
        """Wave i sends the i-th pending entry of every object whose earlier entries
        succeeded; a long round removes what it delivered every ``PROGRESS_S``."""
        progress = _Progress(self._remove_delivered)
        wave = 0
        if self.chains:  # no timer for a round with nothing to push (an idle poll)
            progress.start(PROGRESS_S)
        try:
            while True:
                batch = [chain[wave] for chain in self.chains.values() if len(chain) > wave]
                batch = [(e, r) for e, r in batch if object_of(r) not in self.blocked]
                if not batch:
                    break
                await self._wave(batch)
                wave += 1
        finally:
            await progress.stop()

    async def _wave(self, batch: list[tuple[Entry, dict[str, Any]]]) -> None:
        seen_in_wave: dict[str, Entry] = {}
        deliveries: list[Delivery] = []
        for entry, record in batch:
            if entry.event_id in self.delivered or entry.event_id in seen_in_wave:
                self.result.duplicates += 1
                self.removing.append(entry.id)
                self.drops[entry.id] = EventOutcome(
                    Outcome.DUPLICATE, entry, record, entry.attempts, self.now
                )
                continue
            seen_in_wave[entry.event_id] = entry
            deliveries.append(Delivery(entry.id, record, entry.body))
        by_id = {e.id: (e, r) for e, r in batch}
        if len(deliveries) == 1:
            await self._push(deliveries[0], by_id)  # no task for the usual lone event
        else:
            await asyncio.gather(*(self._push(d, by_id) for d in deliveries))

    async def _push(
        self, delivery: Delivery, by_id: dict[str, tuple[Entry, dict[str, Any]]]
    ) -> None:
        async with self.window:
            # The caller starts a round only on a shard it owns: the first window goes
            # out on that; every later push asks again when it gets its turn.
            if self.started >= FENCE_WINDOW and not self.owned():
                return  # stays queued, unpushed, for the next owner
            self.started += 1
            (outcome,) = await self.endpoint.send([delivery])
        self._account(outcome, by_id)

    def _account(
        self, outcome: PushOutcome, by_id: dict[str, tuple[Entry, dict[str, Any]]]
    ) -> None:
        entry, record = by_id[outcome.id]
        result = self.result
        verdict = judge(entry, record, outcome, time.time())
        if verdict.error:
            result.errors.append(verdict.error)
        if verdict.outcome is Outcome.DELIVERED:
            result.delivered += 1
            result.latencies.append(max(0.0, verdict.at - entry.ingest_time))
            self.removing.append(entry.id)
            self.delivered.add(entry.event_id)
            result.outcomes.append(verdict)
        elif verdict.outcome is Outcome.REJECTED:
            # Dropped at the round's end; the object's later events wait for it no longer.
            result.expired += 1
            result.rejected += 1
            self.dropped.append(entry)
            self.drops[entry.id] = self.refusals[entry.id] = verdict
        else:
            result.failed += 1
            result.outcomes.append(verdict)
            self.blocked.add(object_of(record))
            self.retry.append(
                replace(
                    entry,
                    attempts=entry.attempts + 1,
                    not_before=self.now + self.policy.retry_delay(entry.attempts + 1),
                    first_failure=entry.first_failure or verdict.at,
                    last_failure=verdict.at,
                    last_error=(verdict.error or "")[:ERROR_KEPT],
                )
            )

    async def drop(self, dead_letter: DeadLetterSink | None) -> None:
        """Hand what is dropped to the dead-letter sink, if there is one; when it refuses,
        nothing is dropped (refused pushes count as failed attempts and stay queued); what
        it had no room for is dropped and lost."""
        result = self.result
        if not self.dropped or dead_letter is None:
            return
        result.expired -= len(self.dropped)
        try:
            lost = await dead_letter([self.drops[e.id] for e in self.dropped])
        except Exception as exc:
            result.errors.append(f"the dead letters refused {len(self.dropped)} events: {exc}")
            for entry in self.dropped:
                if (kept := not_dropped(self.drops.pop(entry.id))) is not None:
                    result.outcomes.append(kept)
            self.dropped = []
            return
        result.expired += len(lost)
        result.dead_lettered = len(self.dropped) - len(lost)
        for entry in self.dropped:
            if entry.id not in lost:
                self.drops[entry.id] = dropped(self.drops[entry.id], dead_lettered=True)

    async def remove(self) -> None:
        """Remove what was delivered, repeated or dropped; the drops stand from then on."""
        result, delivered = self.result, self.delivered
        remove = self.removing + [e.id for e in self.dropped]
        try:
            if remove:
                await self.store.remove(self.queue, self.shard, remove)
        except Exception as exc:
            result.cut_short = True
            result.dead_lettered = 0  # handed over, but counted by the round that removes them
            delivered.unremoved.update(
                o.entry.id for o in result.outcomes if o.outcome is Outcome.DELIVERED
            )
            _pushes_only(result, self.refusals)
            raise RoundCutShort(result, exc) from exc
        delivered.unremoved.difference_update(remove)
        self.gone.update(remove)
        if result.listed < LIST_BATCH:
            delivered.unremoved.clear()  # every entry was listed: the others are gone
        # A drop happens when its removal (or its dead-letter commit) is done.
        removed_at = time.time()
        result.outcomes += [replace(o, at=removed_at) for o in self.drops.values()]

    async def write_back(self) -> None:
        """The failed pushes go back with one more attempt and their retry time."""
        if not self.retry:
            return
        try:
            await self.store.update(self.queue, self.shard, self.retry)
        except Exception as exc:
            # The removals stand and so do the drops: counted. The failed pushes are tried
            # again with these attempts uncounted.
            raise RoundCutShort(self.result, exc) from exc
        self.result.retried = len(self.retry)


def _pushes_only(result: RoundResult, refusals: dict[str, EventOutcome]) -> None:
    """``result`` as its pushes left it: its drops did not happen, and a refused push is
    one more failed attempt of an event that stays queued."""
    result.outcomes += [o for o in map(not_dropped, refusals.values()) if o is not None]


class _Progress:
    """Removals of a long round's delivered entries every so often while it goes on.

    A timer, not a task per round: most rounds end within milliseconds, long before the
    first removal is due, and a task each would cost them more than the rest of their
    bookkeeping."""

    def __init__(self, save: Callable[[], Awaitable[None]]) -> None:
        self._save = save
        self._timer: asyncio.TimerHandle | None = None
        self._saving: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()

        def due() -> None:
            self._timer = None
            self._saving = loop.create_task(self._save_and_again(seconds))

        self._timer = loop.call_later(seconds, due)

    async def _save_and_again(self, seconds: float) -> None:
        await self._save()
        if not self._stopped:
            self.start(seconds)

    async def stop(self) -> None:
        """Let a removal under way finish (never cut one short), then no more."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        if self._saving is not None:
            await self._saving
