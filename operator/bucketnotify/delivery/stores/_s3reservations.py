"""Room in the S3 store's queues: reservations checked against the limits by LISTs of the
markers and batches, taken in turns per queue within a process and re-checked across
replicas, and this replica's headroom (see the store's "Reservations across replicas" and
"Reserving without a scan"). Also the queues' cached meta (shards and limits)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass, field

from bucketnotify.delivery.model.queue import (
    QueueFull,
    QueueLimits,
    QueueName,
    QueueNotFound,
    QueueStats,
    Reservation,
)
from bucketnotify.delivery.stores._format import (
    Batch,
    batches,
    check_request,
    check_room,
    decode_meta,
    held,
    new_reservation,
    parse_marker,
    usage,
)
from bucketnotify.delivery.stores._headroom import Headroom, Headrooms
from bucketnotify.delivery.stores._s3objects import BucketObjects, all_of
from bucketnotify.gateway.errors import GatewayError

__all__ = ["S3Reservations"]

# The store's logger: its lines came from there before its reservations had a module.
_log = logging.getLogger("bucketnotify.delivery.stores.s3")

COLLISION_ATTEMPTS = 3
"""How often a turn that collided with another writer's reserves tries again."""


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


class S3Reservations:
    """The reservations and cached meta of the queues ``io`` reaches."""

    def __init__(
        self,
        io: BucketObjects,
        meta_cache_s: float,
        writers: int = 0,
    ) -> None:
        self._io = io
        self._meta_cache_s = meta_cache_s
        self.writers = writers
        self.headrooms = Headrooms()
        self._wanted: dict[QueueName, list[_Wanted]] = {}
        self._meta: dict[QueueName, tuple[float, int, QueueLimits]] = {}
        self._reserving: dict[QueueName, asyncio.Lock] = {}

    def remember(self, queue: QueueName, shards: int, limits: QueueLimits) -> None:
        """The meta of a queue just made here."""
        self._meta[queue] = (time.monotonic(), shards, limits)

    def cached_shards(self, queue: QueueName) -> int:
        """The shard count last read, without a request (0 when none was)."""
        cached = self._meta.get(queue)
        return cached[1] if cached else 0

    def forget(self, queue: QueueName) -> None:
        """A deleted queue."""
        self._meta.pop(queue, None)
        self.headrooms.pop(queue)

    async def release(self, reservation: Reservation) -> None:
        """A reservation done with: committed (after its batch, never before: see
        "Reservations across replicas") or aborted."""
        if self.headrooms.granted(reservation):
            await self._granted_done(reservation)
            return
        await self._io.delete(self._io.marker(reservation))

    async def meta_or_none(self, queue: QueueName) -> tuple[int, QueueLimits] | None:
        try:
            return await self.meta(queue)
        except QueueNotFound:
            return None

    async def meta(self, queue: QueueName, *, fresh: bool = False) -> tuple[int, QueueLimits]:
        cached = self._meta.get(queue)
        if cached and not fresh and time.monotonic() - cached[0] < self._meta_cache_s:
            return cached[1], cached[2]
        data = await self._io.get(self._io.meta_key(queue))
        if data is None:
            self._meta.pop(queue, None)
            raise QueueNotFound(f"queue {queue} does not exist")
        shards, limits = decode_meta(data)
        self._meta[queue] = (time.monotonic(), shards, limits)
        return shards, limits

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
        if not self.headrooms.fits(queue, entries, size, now):
            return None
        # The cached meta: a deleted queue is refused as in a turn, new limits end the room.
        shards, limits = await self.meta(queue)
        granted, stale = self.headrooms.grant(queue, shard, entries, size, now, shards, limits)
        if stale is not None:
            await self.retire(stale)
        return granted

    async def retire(self, room: Headroom) -> None:
        """A headroom replaced or dropped: its cover goes once its last grant is done."""
        if Headrooms.retire(room):
            await self._drop_cover(room)

    async def _drop_cover(self, room: Headroom) -> None:
        try:
            await self._io.delete(self._io.marker(room.cover, cover=True))
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
        shards, limits = await self.meta(queue)
        if any(w.shard >= shards for w in waiting):  # more shards since it was cached?
            shards, limits = await self.meta(queue, fresh=True)
        found, reservations, covers = await self.scan(queue)
        # Each one granted is counted against the ones after it.
        counted = self.headrooms.counted(queue, reservations, covers)
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
        not_covers = [*self.headrooms.counted(queue, reservations, []), *(r for _, r in granted)]
        writers = self.writers
        cover = Headrooms.new_cover(
            queue,
            limits,
            *held(usage(shards, found, not_covers, now), not_covers, now),
            now,
            writers,
        )
        markers = [self.put_marker(r) for _, r in granted]
        if cover is not None:
            markers.append(self.put_marker(cover, cover=True))
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
            await all_of(
                *(self._io.delete(self._io.marker(r)) for _, r in placed),
                *([self._io.delete(self._io.marker(cover, cover=True))] if cover else []),
            )
            if last:
                for w, _ in placed:
                    if not w.granted.done():
                        w.granted.set_exception(
                            QueueFull("no room: other replicas reserved the rest meanwhile")
                        )
            return True
        if (replaced := self.headrooms.replace(queue, limits, cover)) is not None:
            await self.retire(replaced)
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
        found, reservations, covers = await self.scan(queue)
        counted = self.headrooms.counted(queue, reservations, covers)
        entries, size = held(usage(shards, found, counted, now), counted, now)
        return entries <= limits.max_entries and size <= limits.max_bytes

    async def put_marker(self, reservation: Reservation, *, cover: bool = False) -> None:
        # The name says it all; the body is for people looking at the bucket.
        body = json.dumps(
            {
                "shard": reservation.shard,
                "entries": reservation.entries,
                "bytes": reservation.bytes,
                "expires_at": reservation.expires_at,
            }
        )
        await self._io.put(
            self._io.marker(reservation, cover=cover), body.encode(), "application/json"
        )

    async def _granted_done(self, reservation: Reservation) -> None:
        if (room := self.headrooms.done(reservation)) is not None:
            await self._drop_cover(room)

    async def reclaim(self, queue: QueueName, now: float) -> int:
        # Counts what it found expired: two replicas reclaiming at once both count a marker.
        reservations, covers = await self.markers(queue)
        expired = [r for r in reservations if r.expires_at <= now]
        await all_of(
            *(self._io.delete(self._io.marker(r)) for r in expired),
            *(
                self._io.delete(self._io.marker(c, cover=True))
                for c in covers
                if c.expires_at <= now
            ),
        )
        return len(expired)

    async def stats(self, queue: QueueName, now: float) -> QueueStats:
        shards, _ = await self.meta(queue)
        stats, _ = await self._usage(queue, shards, now)
        return stats

    async def markers(self, queue: QueueName) -> tuple[list[Reservation], list[Reservation]]:
        """The reservation markers and the headroom covers."""
        start = f"{self._io.data(queue)}reservations/"
        reservations: list[Reservation] = []
        covers: list[Reservation] = []
        for key in await self._io.list_keys(start):
            if (marker := parse_marker(queue, key[len(start) :])) is not None:
                (covers if marker[1] else reservations).append(marker[0])
        return reservations, covers

    async def _usage(
        self, queue: QueueName, shards: int, now: float
    ) -> tuple[QueueStats, list[Reservation]]:
        found, reservations, _ = await self.scan(queue)
        return usage(shards, found, reservations, now), reservations

    async def scan(
        self, queue: QueueName
    ) -> tuple[dict[int, list[Batch]], list[Reservation], list[Reservation]]:
        """The batches of every shard, the reservation markers and the covers: two LISTs."""
        # Markers first, in a LIST of their own: a commit PUTs its batch before it deletes
        # its marker, so a marker missing here means the batch is in the LIST that follows.
        reservations, covers = await self.markers(queue)
        start = f"{self._io.data(queue)}shard-"
        names: dict[int, list[str]] = {}
        for key in await self._io.list_keys(start):
            shard, _, name = key[len(start) :].partition("/")
            if shard.isdigit():
                names.setdefault(int(shard), []).append(name)
        found = {shard: list(batches(sorted(n))) for shard, n in names.items()}
        return found, reservations, covers
