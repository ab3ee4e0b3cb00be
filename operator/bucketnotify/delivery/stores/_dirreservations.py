"""Room in the directory store's queues: reservations checked against the limits under the
queue's lock (one empty marker file each), and this process's headroom (``_headroom``), in
which a reserve takes no lock (see the store's "Reserving without a scan")."""

from __future__ import annotations

import os
import uuid
from collections.abc import Hashable
from pathlib import Path

from bucketnotify.delivery.model.queue import (
    QueueLimits,
    QueueName,
    QueueNotFound,
    QueueStats,
    Reservation,
)
from bucketnotify.delivery.stores._dirfiles import (
    create_marker,
    flock,
    in_queue_dir,
    lock_path,
    names,
    queue_dir,
    read_file,
    replace_durably,
)
from bucketnotify.delivery.stores._dirshards import ShardFiles
from bucketnotify.delivery.stores._format import (
    COVER_SUFFIX,
    check_request,
    check_room,
    decode_meta,
    held,
    new_reservation,
    parse_marker,
    reservation_name,
    usage_of_counts,
)
from bucketnotify.delivery.stores._headroom import Headroom, Headrooms

__all__ = ["DirReservations"]


class DirReservations:
    """The reservations of the queues under ``root``, whose shards are ``shards``."""

    def __init__(self, root: Path, shards: ShardFiles, writers: int = 0) -> None:
        self.root = root
        self.shards = shards
        self.writers = writers
        self.headrooms = Headrooms()
        self._metas: dict[QueueName, tuple[Hashable, int, QueueLimits]] = {}

    def forget(self, queue: QueueName) -> None:
        """A deleted queue: its cover went with it."""
        self.headrooms.pop(queue)
        self._metas.pop(queue, None)

    def meta(self, queue: QueueName) -> tuple[Hashable, int, QueueLimits]:
        """The queue's identity as its meta file's (a new file whenever the shards or
        limits change, or the queue is made again), its shards and its limits; decoded
        only when the file changed, so a reserve from the headroom costs one stat."""
        path = in_queue_dir(self.root, queue, "meta.json")
        try:
            found = os.stat(path)
            basis = (found.st_ino, found.st_mtime_ns, found.st_size)
            cached = self._metas.get(queue)
            if cached is not None and cached[0] == basis:
                return cached
            # Read after the stat: a file replaced in between is read anew next time.
            meta = (basis, *decode_meta(read_file(path)))
        except FileNotFoundError:
            self._metas.pop(queue, None)
            raise QueueNotFound(f"queue {queue} does not exist") from None
        self._metas[queue] = meta
        return meta

    def markers(self, queue: QueueName) -> tuple[list[Reservation], list[Reservation]]:
        """The reservation markers and the headroom covers."""
        reservations: list[Reservation] = []
        covers: list[Reservation] = []
        for name in names(queue_dir(self.root, queue) / "reservations"):
            if (marker := parse_marker(queue, name)) is not None:
                (covers if marker[1] else reservations).append(marker[0])
        return reservations, covers

    def marker_path(self, reservation: Reservation) -> Path:
        directory = queue_dir(self.root, reservation.queue) / "reservations"
        return directory / reservation_name(reservation)

    def cover_path(self, cover: Reservation) -> Path:
        directory = queue_dir(self.root, cover.queue) / "reservations"
        return directory / (reservation_name(cover) + COVER_SUFFIX)

    def retire(self, room: Headroom) -> None:
        """A headroom replaced or dropped: its cover goes once its last grant is done."""
        if Headrooms.retire(room):
            self.cover_path(room.cover).unlink(missing_ok=True)

    def ensure_incarnation(self, queue: QueueName) -> str:
        """The incarnation, made if missing; under the queue's lock (create, reserve)."""
        found = self.shards.incarnation(queue)
        if found is None:
            found = uuid.uuid4().hex
            replace_durably(queue_dir(self.root, queue) / "incarnation", found.encode())
        return found

    def usage(
        self, queue: QueueName, shards: int, now: float, incarnation: str | None
    ) -> tuple[QueueStats, list[Reservation], list[Reservation]]:
        """Stats (without the covers), the reservation markers and the covers."""
        # Reservations first: a commit renames its batch in and counts it before it drops
        # its reservation, so one not seen here is in the counts that follow.
        reservations, covers = self.markers(queue)
        counts = {}
        for name in names(queue_dir(self.root, queue)):
            if name.startswith("shard-") and name[6:].isdigit():
                shard = int(name[6:])
                found = self.shards.counts(queue, shard, incarnation)
                counts[shard] = (found.entries, found.bytes)
        return usage_of_counts(shards, counts, reservations, now), reservations, covers

    def stats(self, queue: QueueName, now: float) -> QueueStats:
        _, shards, _ = self.meta(queue)
        # None for a queue without its incarnation file (counted from its names until
        # reserve, under the queue's lock, makes one).
        stats, _, _ = self.usage(queue, shards, now, self.shards.incarnation(queue))
        return stats

    def reserve(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation:
        if self.headrooms.fits(queue, entries, size, now):
            try:
                basis, shards, limits = self.meta(queue)
            except QueueNotFound:
                self.headrooms.pop(queue)  # its cover went with the queue
                raise
            granted, stale = self.headrooms.grant(
                queue, shard, entries, size, now, shards, limits, basis
            )
            if stale is not None:
                self.retire(stale)
            if granted is not None:
                return granted
        with flock(lock_path(self.root, queue, "queue")):
            basis, shards, limits = self.meta(queue)
            check_request(shards, shard, entries, size)
            incarnation = self.ensure_incarnation(queue)
            stats, reservations, covers = self.usage(queue, shards, now, incarnation)
            counted = self.headrooms.counted(queue, reservations, covers)
            check_room(stats, counted, limits, entries, size, now)
            reservation = new_reservation(queue, shard, entries, size, now, limits)
            create_marker(self.marker_path(reservation))
            cover = self._new_cover(queue, limits, stats, reservations, counted, reservation, now)
            if cover is not None:
                try:
                    create_marker(self.cover_path(cover))
                except OSError:
                    cover = None  # no headroom this time; the reserve itself holds
            if (stale := self.headrooms.replace(queue, limits, cover, basis)) is not None:
                self.retire(stale)
        return reservation

    def _new_cover(
        self,
        queue: QueueName,
        limits: QueueLimits,
        stats: QueueStats,
        reservations: list[Reservation],
        counted: list[Reservation],
        reservation: Reservation,
        now: float,
    ) -> Reservation | None:
        """The cover of the headroom a scan leaves, or None (see Headrooms.new_cover)."""
        writers = self.writers
        not_covers = [*self.headrooms.counted(queue, reservations, []), reservation]
        cover = Headrooms.new_cover(queue, limits, *held(stats, not_covers, now), now, writers)
        if cover is None:
            return None
        # Under the queue's lock nobody reserves meanwhile, so the cover is checked like a
        # reservation, against everything including the other writers' covers: the limits
        # hold even with ``writers`` too low.
        entries, size = held(stats, [*counted, reservation], now)
        if entries + cover.entries > limits.max_entries or size + cover.bytes > limits.max_bytes:
            return None
        return cover

    def release(self, reservation: Reservation) -> None:
        if self.headrooms.granted(reservation):
            if (room := self.headrooms.done(reservation)) is not None:
                self.cover_path(room.cover).unlink(missing_ok=True)
            return
        self.marker_path(reservation).unlink(missing_ok=True)

    def reclaim(self, queue: QueueName, now: float) -> int:
        """Expired reservation markers removed (and expired covers, not counted: a writer
        that died with a headroom; they are not reservations in the stats either)."""
        reclaimed = 0
        reservations, covers = self.markers(queue)
        for reservation in reservations:
            if reservation.expires_at <= now:
                try:
                    self.marker_path(reservation).unlink()
                except FileNotFoundError:
                    continue
                reclaimed += 1
        for cover in covers:
            if cover.expires_at <= now:
                self.cover_path(cover).unlink(missing_ok=True)
        return reclaimed
