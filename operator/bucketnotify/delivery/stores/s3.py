"""Queues in an S3 bucket on the gateway itself: the cluster default, shared by all replicas.

As the gateway keeps its own queues as objects in its log pool, we keep ours as objects in
a bucket. Layout (names as in ``_format``: a LIST answers ``stats`` and ``reserve``)::

    <prefix>meta/<namespace>/<topic>                          shards and limits (JSON)
    <prefix>data/<namespace>/<topic>/reservations/<name>      one marker per reservation
    <prefix>data/<namespace>/<topic>/reservations/<name>.cover
                                                              one per replica's headroom
    <prefix>data/<namespace>/<topic>/shard-<n>/<batch name>   one object per commit,
                                                              JSON lines
    <prefix>data/<namespace>/<topic>/delivered/shard-<n>      identities recently
                                                              delivered, one per line

Meta objects have a prefix of their own so that ``queues`` is one LIST, whatever the queues
hold, and no namespace name can collide with it.

Requests (PUT, GET, DELETE and LIST are sent on the event loop by ``gateway.objects``,
cheaper than boto3 per request; only ``ensure_bucket`` goes through boto3):

- ``reserve``: LIST of the reservations, LIST of the shards (one per 1000 batch objects in
  the queue), PUT of the marker, then the same two LISTs again (see "Reservations across
  replicas"); the meta object is cached for ``meta_cache_s``. Reserves of one queue that
  wait for each other share the scans: the first in turn checks every waiting one against
  one scan, counting those it granted before, and PUTs their markers together. So a group
  commit touching K shards costs 4 + 3K requests (4 LISTs, K marker PUTs, K batch PUTs, K
  marker DELETEs), not 7K, plus two LISTs per 1000 objects of backlog. Far below the
  limits most reserves skip all of it ("Reserving without a scan").
- ``commit`` of N events: one PUT of the batch and one DELETE of the marker, whatever N is,
  so the ingest's group commit makes the cost per event small.
- ``list``: one LIST per 1000 batch objects up to ``max_entries`` (shared by the shards that
  list at once, see "One LIST for the shards listing at once"), and a GET per batch object,
  in parallel, except for batches this replica wrote itself lately and nobody rewrote since
  (the LIST's ETag is the one its PUT got): those it still holds (``_Written``). The owner
  of a shard is often the replica that took its events. ``remove``: a DELETE per batch
  object emptied, or a PUT and a DELETE for one that keeps entries. ``update``: one PUT per
  batch object. Both use what ``list`` read (the owner's cache) and otherwise LIST and GET
  the batch first. So a delivered batch object costs a GET (none when its writer owns the
  shard) and a DELETE, and 1/1000 of a LIST.
- ``glance``: one LIST of everything under the queue (its reservations, batch objects and
  delivered identities), so surveying an idle queue costs one request.
- ``stats``: LIST of the reservations and of the shards; a queue of B batch objects costs
  1 + ceil(B / 1000) LISTs. That is the price of ``reserve`` too, so it grows with the
  backlog: a full queue whose events came in one at a time is slow to reserve in. As the
  reserves of one queue take turns in a process, a replica runs one such scan per queue
  at a time, which bounds the LIST load the ingest puts on the gateway.

Crash safety: a batch becomes visible in one PUT, complete or not at all. Shrinking a batch
PUTs the rest under a new name before it deletes the old one; emptying one deletes any
stale names first and the current last; updating PUTs over the same key, which S3 replaces
atomically. A crash between two steps leaves a stale superset that the smallest-count rule
of ``_format`` ignores: a crash never loses an entry, and never brings back one whose
removal returned. The cache assumes the contract's single owner per shard. If another
replica changed a batch while this one still cached it, a rewrite from the cache holds
entries the other removed: duplicates, never losses.

Reservations across replicas: ``reserve`` LISTs the markers, then the batches, checks,
PUTs its marker, and LISTs both again; if the queue is then over a limit, another writer
reserved in the same instant, and this one deletes its marker and steps back (tries again
after a short random pause, at most ``COLLISION_ATTEMPTS`` times, then refuses). Every
writer PUTs before its second scan, so of two that overlap at least the later one sees
both: the limits hold exactly, at the price of both stepping back now and then when they
collide on the last room. Within a process the reserves of one queue take turns (a turn
may serve several, counting each against the ones before it). A commit cannot hide from a
check either: it PUTs its batch before it deletes its marker, and the markers are listed
first (in a LIST of their own: one LIST of both would not do, since the gateway reads its
bucket index shards one after another). A commit after its reservation expired is still
written (the events matter more than the bound); that overshoots by its size.

``list`` orders by batch id, which is the commit's start time: commits that overlap may
appear out of that order (one with an earlier id lands later). Events of one object are
ordered whenever their commits do not overlap, and nothing that lands late is skipped,
because every ``list`` starts from the oldest entry.

One LIST for the shards listing at once: one group commit wakes the owners of several
shards of a queue at once, and each would LIST its own shard. Instead, the first to ask
waits ``list_gather_s`` for the others and one LIST of all the queue's shards (at most
``SHARED_LIST_KEYS`` keys) serves them all, each taking its own names. Once sent, a LIST
serves nobody else: a shard asking later may have been woken by a commit that landed after
it, so it waits for the next. A LIST cut short before the end of a shard's names means a
backlog somewhere in the queue; that shard lists on its own, as does every shard of the
queue for ``CROWDED_S`` (one LIST of everything would read more than each shard needs).

Reserving without a scan: while a queue is far below its limits, a reserve needs neither
the LISTs nor a marker, so a commit is one PUT. With ``writers`` set (an upper bound of the
replicas that write to the store), each scan also gives this replica a *headroom*
(``_headroom``: the books, shared with the local store): what it may still reserve without
another scan, ``limit / (2 * writers)`` minus what the scan found held besides the other
replicas' covers. Its *cover* marker (``<name>.cover``) is PUT and re-checked with the
turn's markers, and every other writer counts it in full until it goes. A queue of default
limits (a million entries, 128 MiB) is thus scanned about once per ``limit / (2 *
writers)`` of commits, a small one (``maxQueueEntries: 2``) on every reserve, as before.
The headroom lives as long as the cached meta's limits: a change of limits (seen within
``meta_cache_s``) drops it.

The bucket must never get a notification configuration: Ceph 16 aborts radosgw on a
multi-object delete in a bucket with one, and our own writes would notify themselves.
This store sends single DeleteObject calls only, to be safe even so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from botocore.exceptions import ClientError

from bucketnotify.delivery.queue import (
    Entry,
    QueueFull,
    QueueLimits,
    QueueName,
    QueueNotFound,
    Queues,
    QueueStats,
    Reservation,
)
from bucketnotify.delivery.stores._errors import raises_store_errors
from bucketnotify.delivery.stores._format import (
    COVER_SUFFIX,
    Batch,
    BatchName,
    batch_of,
    batches,
    check_commit,
    check_queue_name,
    check_request,
    check_room,
    decode_batch,
    decode_meta,
    encode_batch,
    encode_meta,
    held,
    new_batch_id,
    new_entries,
    new_reservation,
    parse_marker,
    parse_reservation,
    reservation_name,
    updated,
    usage,
)
from bucketnotify.delivery.stores._headroom import Headroom, Headrooms
from bucketnotify.delivery.stores._threads import IOThreads
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.errors import GatewayError, GatewayUnreachable, mapped_errors
from bucketnotify.gateway.objects import ObjectClient

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3Store"]

T = TypeVar("T")
_Page = tuple[list[tuple[str, str]], str | None]
"""One LIST page: (key, ETag) in key order, and the token of the next page or None."""

_log = logging.getLogger(__name__)

LIST_PAGE = 1000
COLLISION_ATTEMPTS = 3
"""How often a turn that collided with another writer's reserves tries again."""
SHARED_LIST_KEYS = 100
"""At most this many keys in a LIST shared by the shards of a queue: more means a backlog,
where a LIST per shard reads less (see "One LIST for the shards listing at once")."""
CROWDED_S = 1.0
"""How long a queue whose shared LIST was cut short lists per shard instead."""


@dataclass
class _Cached:
    """A batch as the owner last read or wrote it."""

    batch: Batch
    entries: list[Entry]


@dataclass
class _Wanted:
    """A reserve waiting for its queue's turn."""

    shard: int
    entries: int
    size: int
    now: float
    granted: asyncio.Future[Reservation] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@raises_store_errors
class S3Store:
    """A ``QueueStore`` in ``bucket`` under ``prefix``; call ``ensure_bucket`` once first."""

    def __init__(
        self,
        connection: GatewayConnection,
        bucket: str,
        prefix: str = "queues/",
        *,
        meta_cache_s: float = 5.0,
        max_requests: int = 10,
        writers: Callable[[], int] | None = None,
        list_gather_s: float = 0.002,
    ) -> None:
        """``meta_cache_s``: how long a queue's shards and limits are reused, so a change
        made through another replica applies here that much later. ``max_requests``: at
        most this many requests in flight, each on a connection of its own.
        ``writers``: how many replicas may write to these queues now, at most (0 while
        unknown); it sizes the headroom, and without it every reserve scans (see
        "Reserving without a scan"). ``list_gather_s``: how long the first shard of a
        queue to list waits for others to share its LIST."""
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.bucket = bucket
        self.prefix = prefix
        self._s3: S3Client = connection.s3()
        self._objects = ObjectClient(connection, bucket, max_requests)
        self._meta_cache_s = meta_cache_s
        self._requests = asyncio.Semaphore(max_requests)
        self._threads = IOThreads("s3-store", 1)
        self._wanted: dict[QueueName, list[_Wanted]] = {}
        self._meta: dict[QueueName, tuple[float, int, QueueLimits]] = {}
        self._reserving: dict[QueueName, asyncio.Lock] = {}
        self._owning: dict[tuple[QueueName, int], asyncio.Lock] = {}
        self._cache: dict[tuple[QueueName, int], dict[str, _Cached]] = {}
        self._written = _Written()
        self.writers = writers
        self._headrooms = Headrooms()
        self._list_gather_s = list_gather_s
        self._listings: dict[QueueName, asyncio.Future[_Page]] = {}
        """The shared LIST of each queue's shards still gathering shards, not yet sent."""
        self._crowded: dict[QueueName, float] = {}
        self._listing_tasks: set[asyncio.Task[None]] = set()

    async def ensure_bucket(self) -> None:
        """Create the bucket unless it exists; idempotent."""
        operation = f"CreateBucket {self.bucket}"

        def ensure() -> None:
            with mapped_errors(operation):
                self._ensure_bucket()

        await self._call(operation, lambda: self._threads.run(ensure))

    async def aclose(self) -> None:
        """Closes the connections to the gateway; a later call opens new ones."""
        # A shared LIST still gathering is sent and answered first: its shards wait for it.
        if self._listing_tasks:
            await asyncio.gather(*self._listing_tasks, return_exceptions=True)
        await self._objects.aclose()

    def _ensure_bucket(self) -> None:
        try:
            self._s3.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 404:
                raise
        try:
            self._s3.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            # Another replica won the race.
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise

    # Keys

    def _meta_key(self, queue: QueueName) -> str:
        check_queue_name(queue)
        return f"{self.prefix}meta/{queue.namespace}/{queue.topic}"

    def _data(self, queue: QueueName) -> str:
        check_queue_name(queue)
        return f"{self.prefix}data/{queue.namespace}/{queue.topic}/"

    def _marker(self, reservation: Reservation, *, cover: bool = False) -> str:
        name = reservation_name(reservation) + (COVER_SUFFIX if cover else "")
        return f"{self._data(reservation.queue)}reservations/{name}"

    def _shard(self, queue: QueueName, shard: int) -> str:
        return f"{self._data(queue)}shard-{shard}/"

    def _delivered(self, queue: QueueName, shard: int) -> str:
        return f"{self._data(queue)}delivered/shard-{shard}"

    # Queues

    async def create(self, queue: QueueName, shards: int, limits: QueueLimits) -> None:
        if shards < 1:
            raise ValueError(f"a queue needs at least one shard, not {shards}")
        await self._put(self._meta_key(queue), encode_meta(shards, limits), "application/json")
        self._meta[queue] = (time.monotonic(), shards, limits)
        if (room := self._headrooms.pop(queue)) is not None:
            await self._retire(room)

    async def delete(self, queue: QueueName) -> None:
        # The meta object first: from then on the queue is not listed and takes no
        # reservations; then everything under it, until a LIST finds nothing. A commit
        # racing with this can still land afterwards (reserved through a replica's cached
        # meta): it stays until the queue is created and deleted again.
        await self._delete_key(self._meta_key(queue))
        self._meta.pop(queue, None)
        self._headrooms.pop(queue)
        self._crowded.pop(queue, None)
        for key in list(self._cache):
            if key[0] == queue:
                del self._cache[key]
        while keys := await self._list_keys(self._data(queue)):
            await _all(*(self._delete_key(k) for k in keys))

    async def save_delivered(self, queue: QueueName, shard: int, event_ids: Sequence[str]) -> None:
        # A queue deleted meanwhile must not get an object that outlives it. The meta is
        # cached: a save racing a delete by another replica can still leave the object,
        # until the queue's next delete (a stale hint, harmless).
        if await self._get_meta_or_none(queue) is None:
            return
        await self._put(self._delivered(queue, shard), "\n".join(event_ids).encode(), "text/plain")

    async def load_delivered(self, queue: QueueName, shard: int) -> list[str]:
        found = await self._get(self._delivered(queue, shard))
        return found.decode().split() if found else []

    async def _get_meta_or_none(self, queue: QueueName) -> tuple[int, QueueLimits] | None:
        try:
            return await self._get_meta(queue)
        except QueueNotFound:
            return None

    async def queues(self) -> Queues:
        start = f"{self.prefix}meta/"
        found = []
        for key in await self._list_keys(start):
            namespace, _, topic = key[len(start) :].partition("/")
            if namespace and topic and "/" not in topic:
                found.append(QueueName(namespace, topic))
        return found

    async def _get_meta(self, queue: QueueName, *, fresh: bool = False) -> tuple[int, QueueLimits]:
        cached = self._meta.get(queue)
        if cached and not fresh and time.monotonic() - cached[0] < self._meta_cache_s:
            return cached[1], cached[2]
        data = await self._get(self._meta_key(queue))
        if data is None:
            self._meta.pop(queue, None)
            raise QueueNotFound(f"queue {queue} does not exist")
        shards, limits = decode_meta(data)
        self._meta[queue] = (time.monotonic(), shards, limits)
        return shards, limits

    # Writing

    async def reserve(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation:
        granted = await self._from_headroom(queue, shard, entries, size, now)
        if granted is not None:
            return granted
        wanted = _Wanted(shard, entries, size, now)
        self._wanted.setdefault(queue, []).append(wanted)
        try:
            async with self._reserving.setdefault(queue, asyncio.Lock()):
                if not wanted.granted.done():
                    await self._reserve_waiting(queue)
        except asyncio.CancelledError:
            wanted.granted.cancel()  # a turn still to come skips it
            raise
        return wanted.granted.result()

    async def _from_headroom(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation | None:
        """A reservation without scan or marker, or None when it takes the usual turn."""
        if not self._headrooms.fits(queue, entries, size, now):
            return None
        # The cached meta: a deleted queue is refused as in a turn, new limits end the room.
        shards, limits = await self._get_meta(queue)
        granted, stale = self._headrooms.grant(queue, shard, entries, size, now, shards, limits)
        if stale is not None:
            await self._retire(stale)
        return granted

    async def _retire(self, room: Headroom) -> None:
        """A headroom replaced or dropped: its cover goes once its last grant is done."""
        if Headrooms.retire(room):
            await self._drop_cover(room)

    async def _drop_cover(self, room: Headroom) -> None:
        try:
            await self._delete_key(self._marker(room.cover, cover=True))
        except GatewayError as exc:
            # It only counts for longer than needed, until it expires and is reclaimed.
            _log.info("could not delete a headroom cover of %s: %s", room.cover.queue, exc)

    async def _reserve_waiting(self, queue: QueueName) -> None:
        """One turn: every reserve of ``queue`` waiting now, checked against one scan."""
        waiting = self._wanted.pop(queue, [])
        try:
            for attempt in range(COLLISION_ATTEMPTS):
                if not await self._attempt(queue, waiting, last=attempt == COLLISION_ATTEMPTS - 1):
                    return
                # Two writers that collide both step back: wait apart, then try again.
                await asyncio.sleep(random.uniform(0.005, 0.05) * (attempt + 1))  # noqa: S311
        except asyncio.CancelledError:
            # The turn's own caller went away: the next in turn serves the rest (a marker
            # already PUT for one of them expires unused).
            self._wanted.setdefault(queue, [])[:0] = [w for w in waiting if not w.granted.done()]
            raise
        except Exception as exc:
            for w in waiting:
                if not w.granted.done():
                    w.granted.set_exception(exc)

    async def _attempt(self, queue: QueueName, waiting: list[_Wanted], *, last: bool) -> bool:
        """Checks, places and re-checks the reserves still waiting; True when it collided
        with another writer and stepped back (on the ``last`` attempt it refuses them)."""
        shards, limits = await self._get_meta(queue)
        if any(w.shard >= shards for w in waiting):  # more shards since it was cached?
            shards, limits = await self._get_meta(queue, fresh=True)
        found, reservations, covers = await self._scan(queue)
        # Each one granted is counted against the ones after it.
        counted = self._headrooms.counted(queue, reservations, covers)
        granted: list[tuple[_Wanted, Reservation]] = []
        for w in waiting:
            if w.granted.done():
                continue
            try:
                check_request(shards, w.shard, w.entries, w.size)
                stats = usage(shards, found, counted, w.now)
                check_room(stats, counted, limits, w.entries, w.size, w.now)
            except (ValueError, QueueFull) as exc:
                w.granted.set_exception(exc)
                continue
            reservation = new_reservation(queue, w.shard, w.entries, w.size, w.now, limits)
            counted = [*counted, reservation]
            granted.append((w, reservation))
        now = max(w.now for w in waiting)
        # Without the other replicas' covers: see Headrooms.new_cover (with them, the second
        # replica never got a headroom and scanned on every reserve: 772 scans in 2,000
        # events).
        not_covers = [*self._headrooms.counted(queue, reservations, []), *(r for _, r in granted)]
        writers = self.writers() if self.writers is not None else 0
        cover = Headrooms.new_cover(
            queue,
            limits,
            *held(usage(shards, found, not_covers, now), not_covers, now),
            now,
            writers,
        )
        markers = [self._put_marker(r) for _, r in granted]
        if cover is not None:
            markers.append(self._put_marker(cover, cover=True))
        written = await asyncio.gather(*markers, return_exceptions=True)
        cover_error = written.pop() if cover is not None else None
        if isinstance(cover_error, BaseException):
            cover = None  # no headroom this time; a failed PUT may still have landed
        placed = [(w, r) for (w, r), error in zip(granted, written, strict=True) if error is None]
        for (w, _), error in zip(granted, written, strict=True):
            if isinstance(error, BaseException) and not w.granted.done():
                w.granted.set_exception(error)
        if (placed or cover is not None) and not await self._fits_after(queue, shards, limits, now):
            # Another writer reserved in the same instant. Each PUT its markers before its
            # second scan, so at least the later of the two sees both; this one steps back.
            await _all(
                *(self._delete_key(self._marker(r)) for _, r in placed),
                *([self._delete_key(self._marker(cover, cover=True))] if cover else []),
            )
            if last:
                for w, _ in placed:
                    if not w.granted.done():
                        w.granted.set_exception(
                            QueueFull("no room: other replicas reserved the rest meanwhile")
                        )
            return True
        if (replaced := self._headrooms.replace(queue, limits, cover)) is not None:
            await self._retire(replaced)
        for w, reservation in placed:
            if not w.granted.done():  # else its caller went away; the marker expires
                w.granted.set_result(reservation)
        return False

    async def _fits_after(
        self, queue: QueueName, shards: int, limits: QueueLimits, now: float
    ) -> bool:
        """Whether the queue is within its limits once this turn's markers are in place.

        Each writer PUTs its markers before it scans again, so of two writers reserving at
        once at least the later scan sees both."""
        found, reservations, covers = await self._scan(queue)
        counted = self._headrooms.counted(queue, reservations, covers)
        entries, size = held(usage(shards, found, counted, now), counted, now)
        return entries <= limits.max_entries and size <= limits.max_bytes

    async def _put_marker(self, reservation: Reservation, *, cover: bool = False) -> None:
        # The name says it all; the body is for people looking at the bucket.
        body = json.dumps(
            {
                "shard": reservation.shard,
                "entries": reservation.entries,
                "bytes": reservation.bytes,
                "expires_at": reservation.expires_at,
            }
        )
        await self._put(self._marker(reservation, cover=cover), body.encode(), "application/json")

    async def commit(
        self, reservation: Reservation, events: Sequence[tuple[str, bytes]], now: float
    ) -> list[Entry]:
        check_commit(reservation, events)
        if events:
            batch, _ = new_batch_id()
            entries = new_entries(batch, events, now)
            key = self._shard(reservation.queue, reservation.shard) + str(
                BatchName.of(batch, entries)
            )
            body = encode_batch(entries)
            etag = await self._put(key, body, "application/x-ndjson")
            self._written.add(key, etag, entries, len(body))
        else:
            entries = []
        # After the batch, never before: see "Reservations across replicas" above.
        if self._headrooms.granted(reservation):
            await self._granted_done(reservation)
        else:
            await self._delete_key(self._marker(reservation))
        return entries

    async def abort(self, reservation: Reservation) -> None:
        if self._headrooms.granted(reservation):
            await self._granted_done(reservation)
            return
        await self._delete_key(self._marker(reservation))

    async def _granted_done(self, reservation: Reservation) -> None:
        if (room := self._headrooms.done(reservation)) is not None:
            await self._drop_cover(room)

    async def reclaim(self, queue: QueueName, now: float) -> int:
        # Counts what it found expired: two replicas reclaiming at once both count a marker.
        reservations, covers = await self._reservations(queue)
        expired = [r for r in reservations if r.expires_at <= now]
        await _all(
            *(self._delete_key(self._marker(r)) for r in expired),
            *(self._delete_key(self._marker(c, cover=True)) for c in covers if c.expires_at <= now),
        )
        return len(expired)

    async def stats(self, queue: QueueName, now: float) -> QueueStats:
        shards, _ = await self._get_meta(queue)
        stats, _ = await self._usage(queue, shards, now)
        return stats

    async def glance(self, queue: QueueName, now: float) -> QueueStats:
        # One LIST of everything under the queue (reservations sort before the shards) and
        # no meta read: the shard count only adds empty shards to the answer.
        start = self._data(queue)
        reservations: list[Reservation] = []
        names: dict[int, list[str]] = {}
        for key in await self._list_keys(start):
            kind, _, name = key[len(start) :].partition("/")
            if kind == "reservations":
                if (reservation := parse_reservation(queue, name)) is not None:
                    reservations.append(reservation)
            elif kind.startswith("shard-") and kind[6:].isdigit():
                names.setdefault(int(kind[6:]), []).append(name)
        cached = self._meta.get(queue)
        found = {shard: list(batches(sorted(n))) for shard, n in names.items()}
        return usage(cached[1] if cached else 0, found, reservations, now)

    async def _reservations(self, queue: QueueName) -> tuple[list[Reservation], list[Reservation]]:
        """The reservation markers and the headroom covers."""
        start = f"{self._data(queue)}reservations/"
        reservations: list[Reservation] = []
        covers: list[Reservation] = []
        for key in await self._list_keys(start):
            if (marker := parse_marker(queue, key[len(start) :])) is not None:
                (covers if marker[1] else reservations).append(marker[0])
        return reservations, covers

    async def _usage(
        self, queue: QueueName, shards: int, now: float
    ) -> tuple[QueueStats, list[Reservation]]:
        found, reservations, _ = await self._scan(queue)
        return usage(shards, found, reservations, now), reservations

    async def _scan(
        self, queue: QueueName
    ) -> tuple[dict[int, list[Batch]], list[Reservation], list[Reservation]]:
        """The batches of every shard, the reservation markers and the covers: two LISTs."""
        # Markers first, in a LIST of their own: a commit PUTs its batch before it deletes
        # its marker, so a marker missing here means the batch is in the LIST that follows.
        reservations, covers = await self._reservations(queue)
        start = f"{self._data(queue)}shard-"
        names: dict[int, list[str]] = {}
        for key in await self._list_keys(start):
            shard, _, name = key[len(start) :].partition("/")
            if shard.isdigit():
                names.setdefault(int(shard), []).append(name)
        found = {shard: list(batches(sorted(n))) for shard, n in names.items()}
        return found, reservations, covers

    # Reading, by the shard's owner

    async def remove(self, queue: QueueName, shard: int, entry_ids: Sequence[str]) -> None:
        removed = set(entry_ids)
        async with self._owner(queue, shard):
            wanted = {b for b in map(batch_of, removed) if b is not None}
            current = await self._cached(queue, shard, wanted)
            changes = {}
            for batch_id, cached in current.items():
                kept = [e for e in cached.entries if e.id not in removed]
                if len(kept) < len(cached.entries):
                    changes[batch_id] = kept
            await self._rewrite(queue, shard, changes)

    async def update(self, queue: QueueName, shard: int, entries: Sequence[Entry]) -> None:
        by_id = {e.id: e for e in entries}
        async with self._owner(queue, shard):
            wanted = {b for b in map(batch_of, by_id) if b is not None}
            current = await self._cached(queue, shard, wanted)
            changes = {}
            for batch_id, cached in current.items():
                new = [updated(e, by_id.get(e.id)) for e in cached.entries]
                if new != cached.entries:
                    changes[batch_id] = new
            await self._rewrite(queue, shard, changes)

    def _owner(self, queue: QueueName, shard: int) -> asyncio.Lock:
        """Turns for list, remove and update of one shard: each reads what the last wrote."""
        return self._owning.setdefault((queue, shard), asyncio.Lock())

    async def _cached(self, queue: QueueName, shard: int, wanted: set[str]) -> dict[str, _Cached]:
        """These batches as they are now: from the cache, or LIST and GET the rest."""
        cache = self._cache.setdefault((queue, shard), {})
        missing = [b for b in wanted if b not in cache]
        loaded = await _all(*(self._load(queue, shard, b) for b in missing))
        for batch_id, cached in zip(missing, loaded, strict=True):
            if cached is not None:
                cache[batch_id] = cached
        return {b: cache[b] for b in wanted if b in cache}

    async def _load(self, queue: QueueName, shard: int, batch_id: str) -> _Cached | None:
        start = self._shard(queue, shard)
        names = [k[len(start) :] for k in await self._list_keys(f"{start}{batch_id}.")]
        for batch in batches(names):
            data = await self._get(start + str(batch.current))
            if data is not None:
                return _Cached(batch, decode_batch(batch_id, data))
        return None

    async def _rewrite(self, queue: QueueName, shard: int, changes: dict[str, list[Entry]]) -> None:
        cache = self._cache.setdefault((queue, shard), {})
        start = self._shard(queue, shard)

        async def one(batch_id: str, entries: list[Entry]) -> None:
            old = cache[batch_id].batch
            if entries:
                name = BatchName.of(batch_id, entries)
                await self._put(start + str(name), encode_batch(entries), "application/x-ndjson")
                # The old names stay known until they are gone: a stale name forgotten here
                # would outlive the batch's last removal and bring its entries back.
                drop = tuple(n for n in (old.current, *old.stale) if n != name)
                cache[batch_id] = _Cached(Batch(name, drop), entries)
                await _all(*(self._delete_key(start + str(n)) for n in drop))
                cache[batch_id] = _Cached(Batch(name), entries)
            else:
                # Stale supersets first: until the current name goes, it is the one that wins.
                await _all(*(self._delete_key(start + str(n)) for n in old.stale))
                await self._delete_key(start + str(old.current))
                cache.pop(batch_id, None)

        await _all(*(one(b, e) for b, e in changes.items()))

    # Requests: the four hot ones on the loop (``ObjectClient``), the bucket's creation
    # through boto3 in a thread; a bounded number in flight

    async def _call(self, operation: str, request: Callable[[], Awaitable[T]]) -> T:
        """``operation``: ``<S3 operation> <key or prefix>``, what the tests count requests by."""
        async with self._requests:
            return await request()

    async def _put(self, key: str, body: bytes, content_type: str) -> str:
        """Writes the object; returns its ETag."""
        return await self._call(
            f"PutObject {key}", lambda: self._objects.put(key, body, content_type)
        )

    async def _get(self, key: str) -> bytes | None:
        """The object's body; None when there is no such key."""
        return await self._call(f"GetObject {key}", lambda: self._objects.get(key))

    async def _delete_key(self, key: str) -> None:
        # DeleteObject of a missing key succeeds, so a second try or a lost race is fine.
        await self._call(f"DeleteObject {key}", lambda: self._objects.delete(key))

    async def _list_page(self, prefix: str, token: str | None, max_keys: int = 0) -> _Page:
        """One page of (key, ETag) under ``prefix``, in key order, and the token of the next;
        ``max_keys``: at most this many keys (``LIST_PAGE`` when 0)."""
        size = max_keys or LIST_PAGE
        return await self._call(
            f"ListObjectsV2 {prefix}", lambda: self._objects.list_page(prefix, size, token)
        )

    async def _list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        token: str | None = None
        while True:
            page, token = await self._list_page(prefix, token)
            keys += [key for key, _ in page]
            if token is None:
                return keys

    async def _oldest(
        self, queue: QueueName, shard: int, max_entries: int
    ) -> tuple[list[Batch], dict[str, str]]:
        """The oldest batches holding ``max_entries``, each with all its names, and the
        ETags of the names.

        Paging stops only past the last batch's names: a stale name that stayed unknown
        would outlive the current one and bring its removed entries back.
        """
        start = self._shard(queue, shard)
        chosen: list[Batch] = []
        etags: dict[str, str] = {}
        held = 0
        shared = await self._shared_keys(queue, shard)
        token: str | None = None
        while True:
            if shared is not None:
                keys, shared = shared, None  # all the shard holds: no page follows
            else:
                keys, token = await self._list_page(start, token)
            for key, etag in keys:
                name = key[len(start) :]
                etags[name] = etag
                parsed = BatchName.parse(name)
                if parsed is None:
                    continue
                if chosen and parsed.batch == chosen[-1].current.batch:
                    last = chosen[-1]
                    chosen[-1] = Batch(last.current, (*last.stale, parsed))
                    continue
                if held >= max_entries:
                    return chosen, etags
                chosen.append(Batch(parsed))
                held += parsed.count
            if token is None:
                return chosen, etags

    async def _shared_keys(self, queue: QueueName, shard: int) -> list[tuple[str, str]] | None:
        """The shard's keys and ETags from a LIST of all the queue's shards, shared with the
        shards of the queue listing at about the same time; None when the queue holds too
        much for one (the caller lists the shard on its own)."""
        if time.monotonic() < self._crowded.get(queue, 0.0):
            return None
        shared = self._listings.get(queue)
        if shared is None:
            shared = asyncio.get_running_loop().create_future()
            self._listings[queue] = shared
            task = asyncio.create_task(self._list_shared(queue, shared))
            self._listing_tasks.add(task)
            task.add_done_callback(self._listing_tasks.discard)
        # Shielded: a caller that goes away must not cancel the LIST the others wait for.
        page, token = await asyncio.shield(shared)
        prefix = self._shard(queue, shard)
        if token is not None and (
            not page or page[-1][0] <= prefix or page[-1][0].startswith(prefix)
        ):
            # Cut short before the end of this shard's names: a backlog somewhere in the
            # queue. Per shard for a while, rather than a shared LIST wasted every round.
            self._crowded[queue] = time.monotonic() + CROWDED_S
            return None
        return [(key, etag) for key, etag in page if key.startswith(prefix)]

    async def _list_shared(self, queue: QueueName, shared: asyncio.Future[_Page]) -> None:
        try:
            try:
                await asyncio.sleep(self._list_gather_s)
            finally:
                # Sent from now on: a shard asking later may have been woken by a commit
                # this LIST would miss, so it waits for the next one.
                if self._listings.get(queue) is shared:
                    del self._listings[queue]
            page = await self._list_page(
                f"{self._data(queue)}shard-", None, min(LIST_PAGE, SHARED_LIST_KEYS)
            )
        except asyncio.CancelledError:
            # Only the loop's end cancels it: the shards waiting see a failed round, not a
            # cancellation of their own.
            shared.set_exception(GatewayUnreachable("ListObjectsV2: cancelled"))
            raise
        except Exception as exc:
            shared.set_exception(exc)
            return
        shared.set_result(page)

    # Last in the class: below this, `list` would name the method, not the builtin.
    async def list(self, queue: QueueName, shard: int, max_entries: int = 1024) -> list[Entry]:
        async with self._owner(queue, shard):
            start = self._shard(queue, shard)
            chosen, etags = await self._oldest(queue, shard, max_entries)
            # A batch this replica wrote, unchanged since (same ETag), is not read back.
            known = [
                self._written.take(start + str(b.current), etags[str(b.current)]) for b in chosen
            ]
            bodies = await _all(
                *(
                    _none() if written is not None else self._get(start + str(b.current))
                    for b, written in zip(chosen, known, strict=True)
                )
            )
            cache: dict[str, _Cached] = {}
            entries: list[Entry] = []
            for batch, written, data in zip(chosen, known, bodies, strict=True):
                if written is not None:
                    found = written
                elif data is None:
                    # Gone since the LIST (the queue was deleted, or another owner removed
                    # it): its entries are not listed now, and not lost.
                    continue
                else:
                    found = decode_batch(batch.current.batch, data)
                cache[batch.current.batch] = _Cached(batch, found)
                entries += found
            self._cache[(queue, shard)] = cache
            return entries[:max_entries]


async def _none() -> None:
    return None


class _Written:
    """The entries of batches this replica wrote lately, by key and ETag: the shard's owner
    is most often the replica that took the events, and listing them then needs no GET.
    An ETag that differs (the batch was rewritten since) means the stored one is read.
    Bounded; batches of shards another replica owns are never asked for and age out."""

    def __init__(self, max_batches: int = 1024, max_bytes: int = 4 * 1024 * 1024) -> None:
        self._batches: OrderedDict[str, tuple[str, list[Entry], int]] = OrderedDict()
        self._bytes = 0
        self._max_batches = max_batches
        self._max_bytes = max_bytes

    def add(self, key: str, etag: str, entries: list[Entry], size: int) -> None:
        if not etag or size > self._max_bytes:
            return
        self.take(key, None)
        self._batches[key] = (etag, entries, size)
        self._bytes += size
        while len(self._batches) > self._max_batches or self._bytes > self._max_bytes:
            _, (_, _, dropped) = self._batches.popitem(last=False)
            self._bytes -= dropped

    def take(self, key: str, etag: str | None) -> list[Entry] | None:
        """The entries written under ``key``, forgotten here; None unless ``etag`` is theirs."""
        found = self._batches.pop(key, None)
        if found is None:
            return None
        self._bytes -= found[2]
        return found[1] if etag is not None and found[0] == etag else None


async def _all(*calls: Awaitable[T]) -> list[T]:
    """Like gather, but every call has ended when it returns or raises: none runs on
    unseen after a failure (and into the next owner's turn), and the error is the first
    call's own, not an ExceptionGroup."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]
