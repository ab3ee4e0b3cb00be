"""One processing round of one queue shard: list, push, remove what was acknowledged.

Decisions are made here; the store and the endpoint are adapters behind their interfaces.

- Order: entries of one object (bucket and key) go out one after another; a key whose entry
  failed sends nothing more this round, so a later event never overtakes an earlier one.
  Different keys go out together, bounded by the endpoint's own in-flight limit.
- Retries: a failed entry is kept with ``attempts`` + 1 and is not retried before
  ``retry_sleep_s`` has passed.
- Expiry: ``max_retries`` counts retries, so an entry gets 1 + max_retries attempts in all
  (the gateway's check drops it one attempt early); ``time_to_live_s`` counts from the
  ingest. 0 means unlimited for both, as in the reference. Expired entries are removed and
  counted lost.
- Undeliverable: an outcome that retrying cannot change is dropped and counted lost.
- Dead letters: with a ``dead_letter`` sink, dropped entries (expired or undeliverable) are
  handed to it before they are removed; if it fails they stay and are offered again next
  round, so a dead-letter queue that is full or away never loses them silently.
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
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

from bucketnotify import compact_json
from bucketnotify.delivery.endpoints.base import Delivery, Endpoint, PushOutcome, object_of
from bucketnotify.delivery.queue import Entry, QueueName, QueueStore
from bucketnotify.records import Outcome

__all__ = [
    "DeadLetterSink",
    "DeliveredCache",
    "DeliveryPolicy",
    "EventOutcome",
    "RoundCutShort",
    "RoundResult",
    "expiry",
    "judge",
    "process_shard",
]

DeadLetterSink = Callable[[Sequence[Entry]], Awaitable[None]]
"""Takes dropped entries durably (another Topic's queue) or raises."""

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


@dataclass(frozen=True)
class DeliveryPolicy:
    time_to_live_s: int = 0
    max_retries: int = 0
    retry_sleep_s: int = 0


@dataclass(frozen=True)
class EventOutcome:
    """What became of one queue entry in a round: the stuff of one delivery record."""

    outcome: Outcome
    entry: Entry
    record: dict[str, Any]
    """The event as the gateway sent it."""
    attempts: int
    """Push attempts made, counting this round's push of it if there was one."""
    at: float
    """Epoch seconds of the outcome."""
    error: str | None = None


@dataclass
class RoundResult:
    listed: int = 0
    delivered: int = 0
    failed: int = 0
    """Failed pushes that will be retried."""
    rejected: int = 0
    """Failed pushes that retrying cannot help (also counted in ``expired`` or
    ``dead_lettered``)."""
    retried: int = 0
    """Entries written back for another attempt (``failed`` unless fenced)."""
    expired: int = 0
    """Dropped (expired or undeliverable) and lost."""
    dead_lettered: int = 0
    """Dropped and handed to the dead-letter topic."""
    duplicates: int = 0
    fenced: bool = False
    cut_short: bool = False
    """The queue store failed to remove what the round pushed and dropped: its pushes
    happened, its drops and removals did not (``RoundCutShort``)."""
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    """Seconds from the ingest to the acknowledgement of each delivered entry."""
    outcomes: list[EventOutcome] = field(default_factory=list)

    @property
    def drops_stand(self) -> bool:
        """Its drops (expired, dead-lettered, duplicates) and write-backs happened: neither
        fenced nor cut short."""
        return not (self.fenced or self.cut_short)


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


class DeliveredCache:
    """Event identities recently delivered from one shard (bounded, oldest forgotten)."""

    def __init__(self, size: int = 100_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._size = size
        self.added = 0
        """Identities added so far: a saver compares it with what it saved."""
        self.unremoved: set[str] = set()
        """Queue entries (ids, not event identities) a round cut short delivered and
        counted: the next round removes them without a push, as no duplicate."""

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def add(self, event_id: str) -> None:
        self._ids[event_id] = None
        self._ids.move_to_end(event_id)
        self.added += 1
        while len(self._ids) > self._size:
            self._ids.popitem(last=False)

    def recent(self, count: int) -> list[str]:
        """The ``count`` identities added last, oldest first."""
        return list(islice(reversed(self._ids), count))[::-1]


def judge(entry: Entry, record: dict[str, Any], outcome: PushOutcome, at: float) -> EventOutcome:
    """What one push made of its event: the one decision of the rounds and of the direct
    path. DELIVERED; FAILED when another attempt may succeed (the entry waits for it);
    REJECTED when retrying cannot help (e.g. too large for the broker), which the caller
    drops at once: to the dead-letter topic if it takes it, else lost."""
    if outcome.ok:
        return EventOutcome(Outcome.DELIVERED, entry, record, entry.attempts + 1, at)
    kind = Outcome.FAILED if outcome.retryable else Outcome.REJECTED
    return EventOutcome(kind, entry, record, entry.attempts + 1, at, outcome.error)


def expiry(entry: Entry, policy: DeliveryPolicy, now: float) -> str | None:
    """Why ``entry`` has expired, or None while it has not."""
    if policy.time_to_live_s and now - entry.ingest_time > policy.time_to_live_s:
        return f"timeToLive of {policy.time_to_live_s} s passed"
    if policy.max_retries and entry.attempts > policy.max_retries:
        return f"maxRetries {policy.max_retries} used up after {entry.attempts} attempts"
    return None


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
    result = RoundResult()
    fenced = False
    window = asyncio.Semaphore(FENCE_WINDOW)
    started = 0

    def owned() -> bool:
        # Once lost, lost for the whole round: a partition taken back later must start from
        # a fresh listing, not from this round's stale one.
        nonlocal fenced
        fenced = fenced or not still_owned()
        return not fenced

    dropped: list[Entry] = []
    # Outcomes that stand only once the round's removals do (dropped, duplicates), by entry.
    drops: dict[str, EventOutcome] = {}
    refusals: dict[str, EventOutcome] = {}
    """Pushes refused for good this round, by entry (dropped, unless the drops fail)."""
    entries = await store.list(queue, shard, LIST_BATCH)
    result.listed = len(entries)
    remove: list[str] = []

    async def remove_delivered() -> None:
        # Delivered and duplicate entries only: drops wait for the round's end (a drop to
        # the dead-letter topic is committed there first). Never on a shard no longer ours.
        if not remove or not owned():
            return
        taken = remove[:]
        del remove[:]
        try:
            await store.remove(queue, shard, taken)
        except Exception:
            # The round's own removal at its end tries them again, and fails the round if
            # the store still refuses: the pushes must not fail over it.
            remove[:0] = taken

    progress = _Progress(remove_delivered)
    retry: list[Entry] = []
    chains: OrderedDict[tuple[str, str], list[tuple[Entry, dict[str, Any]]]] = OrderedDict()
    blocked: set[tuple[str, str]] = set()

    for entry in entries:
        if entry.id in delivered.unremoved:
            remove.append(entry.id)  # delivered and counted by a round cut short
            continue
        record: dict[str, Any] = compact_json.loads(entry.body)
        obj = object_of(record)
        if entry.event_id in delivered:
            result.duplicates += 1
            remove.append(entry.id)
            drops[entry.id] = EventOutcome(Outcome.DUPLICATE, entry, record, entry.attempts, now)
        elif reason := expiry(entry, policy, now):
            result.expired += 1
            dropped.append(entry)
            drops[entry.id] = EventOutcome(
                Outcome.EXPIRED, entry, record, entry.attempts, now, reason
            )
        elif entry.not_before > now or obj in blocked:
            # Waiting for its retry time, and everything after it for the same object waits too.
            blocked.add(obj)
        else:
            chains.setdefault(obj, []).append((entry, record))

    async def push(delivery: Delivery, by_id: dict[str, tuple[Entry, dict[str, Any]]]) -> None:
        nonlocal started
        async with window:
            # The caller starts a round only on a shard it owns: the first window goes
            # out on that; every later push asks again when it gets its turn.
            if started >= FENCE_WINDOW and not owned():
                return  # stays queued, unpushed, for the next owner
            started += 1
            (outcome,) = await endpoint.send([delivery])
        account(outcome, by_id)

    def account(outcome: PushOutcome, by_id: dict[str, tuple[Entry, dict[str, Any]]]) -> None:
        entry, record = by_id[outcome.id]
        verdict = judge(entry, record, outcome, time.time())
        if verdict.error:
            result.errors.append(verdict.error)
        if verdict.outcome is Outcome.DELIVERED:
            result.delivered += 1
            result.latencies.append(max(0.0, verdict.at - entry.ingest_time))
            remove.append(entry.id)
            delivered.add(entry.event_id)
            result.outcomes.append(verdict)
        elif verdict.outcome is Outcome.REJECTED:
            # Dropped at the round's end; the object's later events wait for it no longer.
            result.expired += 1
            result.rejected += 1
            dropped.append(entry)
            drops[entry.id] = refusals[entry.id] = verdict
        else:
            result.failed += 1
            result.outcomes.append(verdict)
            blocked.add(object_of(record))
            retry.append(
                Entry(
                    id=entry.id,
                    event_id=entry.event_id,
                    body=entry.body,
                    ingest_time=entry.ingest_time,
                    attempts=entry.attempts + 1,
                    not_before=now + policy.retry_sleep_s,
                )
            )

    # Wave i sends the i-th pending entry of every object whose earlier entries succeeded.
    wave = 0
    if chains:  # no timer for a round with nothing to push (an idle poll)
        progress.start(PROGRESS_S)
    try:
        while True:
            batch = [
                (chain[wave][0], chain[wave][1]) for chain in chains.values() if len(chain) > wave
            ]
            batch = [(e, r) for e, r in batch if object_of(r) not in blocked]
            if not batch:
                break
            seen_in_wave: dict[str, Entry] = {}
            deliveries: list[Delivery] = []
            for entry, record in batch:
                if entry.event_id in delivered or entry.event_id in seen_in_wave:
                    result.duplicates += 1
                    remove.append(entry.id)
                    drops[entry.id] = EventOutcome(
                        Outcome.DUPLICATE, entry, record, entry.attempts, now
                    )
                    continue
                seen_in_wave[entry.event_id] = entry
                deliveries.append(Delivery(entry.id, record, entry.body))

            by_id = {e.id: (e, r) for e, r in batch}
            if len(deliveries) == 1:
                await push(deliveries[0], by_id)  # no task for the usual lone event
            else:
                await asyncio.gather(*(push(d, by_id) for d in deliveries))
            wave += 1
    finally:
        await progress.stop()

    if not owned():
        result.fenced = True
        _pushes_only(result, refusals)
        return result
    if dropped and dead_letter is not None:
        result.expired -= len(dropped)
        try:
            await dead_letter(dropped)
            result.dead_lettered = len(dropped)
            for entry in dropped:
                drops[entry.id] = replace(drops[entry.id], outcome=Outcome.DEAD_LETTERED)
        except Exception as exc:
            result.errors.append(f"dead-letter topic refused {len(dropped)} events: {exc}")
            for entry in dropped:
                kept = drops.pop(entry.id)
                if kept.outcome is Outcome.REJECTED:
                    result.outcomes.append(_refused(kept))
            dropped = []
    remove += [e.id for e in dropped]
    try:
        if remove:
            await store.remove(queue, shard, remove)
    except Exception as exc:
        result.cut_short = True
        result.dead_lettered = 0  # handed over, but counted by the round that removes them
        delivered.unremoved.update(
            o.entry.id for o in result.outcomes if o.outcome is Outcome.DELIVERED
        )
        _pushes_only(result, refusals)
        raise RoundCutShort(result, exc) from exc
    delivered.unremoved.difference_update(remove)
    if result.listed < LIST_BATCH:
        delivered.unremoved.clear()  # every entry was listed: the others are gone
    # A drop happens when its removal (or its dead-letter commit) is done.
    removed_at = time.time()
    result.outcomes += [replace(o, at=removed_at) for o in drops.values()]
    if retry:
        try:
            await store.update(queue, shard, retry)
        except Exception as exc:
            # The removals stand and so do the drops: counted. The failed pushes are tried
            # again with these attempts uncounted.
            raise RoundCutShort(result, exc) from exc
        result.retried = len(retry)
    return result


def _pushes_only(result: RoundResult, refusals: dict[str, EventOutcome]) -> None:
    """``result`` as its pushes left it: its drops did not happen, and a refused push is
    one more failed attempt of an event that stays queued."""
    result.outcomes += [_refused(o) for o in refusals.values()]


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


def _refused(outcome: EventOutcome) -> EventOutcome:
    """A refused push whose event was not dropped after all: a failed attempt."""
    return replace(outcome, outcome=Outcome.FAILED)
