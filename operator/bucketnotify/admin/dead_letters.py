"""The dead letters a Topic keeps (``spec.delivery.deadLetters.keep``): choose, redrive,
purge. What the ``bucketnotify dead-letters`` commands do to the queue store.

A redrive *moves*: a chunk of dead letters is committed to the Topic's queue, each into the
shard of its object, with its identity and its bytes unchanged, and only then removed from
the dead-letter queue. Killed in between, the chunk is in both; run again, it is committed
again, and the rounds remove the second copy of each event unsent (its identity was
delivered). So nothing is lost, and an event is pushed twice only if the replica that
delivered the first copy also died before it saved the identities it delivered (counted in
``bucketnotify_duplicates_suppressed`` otherwise). ``--rate`` makes the chunks one event
each.

After each chunk redriven or purged, a tally entry goes to the dead-letter queue's second
shard: the owner of the Topic's shard 0 counts it into
``bucketnotify_dead_letters_redriven_total`` / ``_purged_total`` and removes it (this
process is not scraped).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bucketnotify.delivery.model.dead_letters import (
    DEAD_LETTERS_SHARD,
    TALLY_SHARD,
    DeadLetter,
    append,
    tally,
)
from bucketnotify.delivery.model.event import event_shard, object_of
from bucketnotify.delivery.model.queue import Entry, QueueFull, QueueName, QueueStore

__all__ = ["Chosen", "Selection", "Stopped", "choose", "purge", "redrive"]

CHUNK = 100
"""Dead letters moved per commit and removal when no ``--rate`` is given."""


@dataclass(frozen=True)
class Selection:
    """Which dead letters a command takes: all of them by default."""

    prefix: str | None = None
    """Object keys starting with this."""
    since: float | None = None
    """Dropped at or after (epoch seconds)."""
    until: float | None = None
    """Dropped before."""
    count: int | None = None
    """At most this many, oldest first."""
    ids: tuple[str, ...] = ()
    """These entry ids only."""

    def takes(self, letter: DeadLetter, entry: Entry) -> bool:
        if self.ids and entry.id not in self.ids:
            return False
        if self.since is not None and letter.dropped_at < self.since:
            return False
        if self.until is not None and letter.dropped_at >= self.until:
            return False
        if self.prefix is not None:
            record = letter.record()
            key = object_of(record)[1] if record is not None else ""
            if not key.startswith(self.prefix):
                return False
        return True

    @property
    def everything(self) -> bool:
        return not (self.prefix or self.ids) and self.since is None and self.until is None


@dataclass(frozen=True)
class Chosen:
    entry: Entry
    letter: DeadLetter
    copies: tuple[Entry, ...] = ()
    """Later dead letters of the same event: a replica killed between keeping a drop and
    removing it from the Topic's queue keeps it again at the next round. Redriven and
    purged with it, never listed apart."""

    @property
    def entry_ids(self) -> list[str]:
        return [self.entry.id, *(c.id for c in self.copies)]


async def choose(store: QueueStore, queue: QueueName, selection: Selection) -> list[Chosen]:
    """The dead letters of ``queue`` (a dead-letter queue) ``selection`` takes, oldest
    first. Entries that are no dead letter (someone else's write) are left alone."""
    # A dead-letter queue is bounded (maxEntries), so one listing holds all of it.
    entries = await store.list(queue, DEAD_LETTERS_SHARD, 10**9)
    first: dict[str, tuple[Entry, DeadLetter]] = {}
    copies: dict[str, list[Entry]] = {}
    for entry in entries:
        try:
            letter = DeadLetter.decode(entry)
        except ValueError:
            continue
        if letter.event_id in first:
            copies.setdefault(letter.event_id, []).append(entry)
        else:
            first[letter.event_id] = (entry, letter)
    chosen: list[Chosen] = []
    for event_id, (entry, letter) in first.items():
        if selection.takes(letter, entry):
            chosen.append(Chosen(entry, letter, tuple(copies.get(event_id, ()))))
            if selection.count is not None and len(chosen) >= selection.count:
                break
    return chosen


async def redrive(
    store: QueueStore,
    *,
    kept: QueueName,
    into: QueueName,
    shards: int,
    letters: Sequence[Chosen],
    rate: float | None,
) -> int:
    """Move ``letters`` from dead-letter queue ``kept`` into Topic queue ``into`` (of
    ``shards`` shards), at most ``rate`` per second; how many moved. Raises ``Stopped``
    (saying how many moved) when the Topic's queue has no room."""
    chunk = 1 if rate is not None else CHUNK
    moved = 0
    started = time.monotonic()
    for at in range(0, len(letters), chunk):
        part = letters[at : at + chunk]
        by_shard: dict[int, list[tuple[str, bytes]]] = {}
        for chosen in part:
            record = chosen.letter.record() or {}
            shard = event_shard(record, shards)
            by_shard.setdefault(shard, []).append((chosen.letter.event_id, chosen.letter.body))
        try:
            for shard, events in by_shard.items():
                await append(store, into, shard, events)
        except QueueFull as exc:
            raise Stopped(moved, exc) from exc
        await store.remove(kept, DEAD_LETTERS_SHARD, [i for c in part for i in c.entry_ids])
        moved += len(part)
        await _count(store, kept, "redriven", len(part))
        if rate is not None:
            # Paced from the start, not per event: a slow store does not slow it twice.
            await asyncio.sleep(max(0.0, started + moved / rate - time.monotonic()))
    return moved


async def purge(store: QueueStore, *, kept: QueueName, letters: Sequence[Chosen]) -> int:
    """Remove ``letters`` for good; how many."""
    removed = 0
    for at in range(0, len(letters), CHUNK):
        part = letters[at : at + CHUNK]
        await store.remove(kept, DEAD_LETTERS_SHARD, [i for c in part for i in c.entry_ids])
        removed += len(part)
        await _count(store, kept, "purged", len(part))
    return removed


class Stopped(Exception):
    """A redrive that stopped before its end: ``moved`` had moved."""

    def __init__(self, moved: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.moved = moved


async def _count(store: QueueStore, kept: QueueName, what: str, amount: int) -> None:
    """The tally the replicas export; a tally that finds no room is not worth a failed
    command (the events moved): the metric undercounts, nothing else."""
    body = tally(what, amount)
    with contextlib.suppress(QueueFull):
        await append(store, kept, TALLY_SHARD, [(f"tally-{time.time_ns()}", body)])


def parse_time(text: str, now: float) -> float:
    """An RFC 3339 time, or a duration before ``now``: 90s, 30m, 2h, 1d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return now - float(text[:-1]) * units[text[-1]]
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an RFC 3339 time (2026-12-07T10:00:00Z) nor a duration"
            " before now (90s, 30m, 2h, 1d)"
        ) from None
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone: add Z or an offset")
    return when.timestamp()


def describe(chosen: Chosen) -> dict[str, object]:
    """One dead letter as a document (``show``, ``-o json``)."""
    letter = chosen.letter
    record = letter.record()
    document: dict[str, object] = {
        "id": chosen.entry.id,
        "eventId": letter.event_id,
        "outcome": letter.outcome,
        "reason": letter.reason,
        "attempts": letter.attempts,
        "ingestTime": _stamp(letter.ingest_time),
        "firstFailureTime": _stamp(letter.first_failure),
        "lastFailureTime": _stamp(letter.last_failure),
        "lastError": letter.last_error,
        "droppedTime": _stamp(letter.dropped_at),
    }
    if record is not None:
        document["event"] = record
    else:
        document["body"] = letter.body.decode("utf-8", "replace")
    return document


def _stamp(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return (
        dt.datetime.fromtimestamp(epoch, dt.UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z")
    )
