"""Reserving without a scan: a writer's headroom in a queue, and the reserves granted from it.

A reserve normally scans the queue (what it holds, every open reservation) and leaves a
marker. Far below the limits that is wasted work, so each scan may also give the writer a
*headroom*: room it may grant from without scanning, for entries and bytes alike. The
headroom is itself a marker, a *cover* (``<name>.cover``), which every other writer counts
in full until it goes, so what is granted from it needs no marker of its own. A writer
counts its own covers by the grants still in flight instead, as its committed grants are
in the queue already (``counted``).

A cover is at most ``limit / (2 * writers)`` minus what the scan found held besides the
other writers' covers (``new_cover``): with ``writers`` an upper bound of the processes
writing the queue, each can have one at once and all of them together stay under half the
limit, leaving the other half to what the queue holds and to reserves with a scan. The
checks count every cover in full, so the limits hold exactly whatever ``writers`` says; a
``writers`` too low only makes covers large enough to refuse others early.

A reserve that does not fit the headroom scans, which replaces the headroom; the old
cover is dropped once the last reserve granted from it has committed or aborted
(``retire``, ``done``). Grants stop half a reservation timeout before the cover expires,
so their commits land while it still counts. A headroom lives as long as the queue's
limits (and the store's ``basis``, what it knows the queue by) stay what they were when
it was made.

The stores do the I/O (scans, markers); this module only keeps the books, on the event
loop: no locks.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from bucketnotify.delivery.model.queue import QueueLimits, QueueName, Reservation
from bucketnotify.delivery.stores._format import new_reservation

__all__ = ["Headroom", "Headrooms"]


@dataclass
class Headroom:
    """What a writer may still reserve in a queue without a scan, and its cover."""

    limits: QueueLimits
    entries: int
    bytes: int
    cover: Reservation
    usable_until: float
    """Epoch seconds: grants stop half a reservation timeout before the cover expires, so
    their commits land while it still counts."""
    basis: Hashable = None
    """What the store knew the queue by when it made the headroom (the local store: its
    meta file's identity); another basis ends the headroom as other limits do."""
    outstanding: int = 0
    """Grants neither committed nor aborted: the cover stays until they are."""
    superseded: bool = False


class Headrooms:
    """The headrooms of one writer (a store instance), by queue, and their grants."""

    def __init__(self) -> None:
        self._rooms: dict[QueueName, Headroom] = {}
        self._granted: dict[str, tuple[Reservation, Headroom]] = {}
        """Reservations granted from a headroom, by id: no marker of their own."""

    def fits(self, queue: QueueName, entries: int, size: int, now: float) -> bool:
        """Whether a reserve may come from the headroom, as far as it is known without the
        queue's current limits."""
        room = self._rooms.get(queue)
        return not (
            room is None or entries > room.entries or size > room.bytes or now > room.usable_until
        )

    def grant(
        self,
        queue: QueueName,
        shard: int,
        entries: int,
        size: int,
        now: float,
        shards: int,
        limits: QueueLimits,
        basis: Hashable = None,
    ) -> tuple[Reservation | None, Headroom | None]:
        """A reservation from the headroom (None: the caller scans), and a headroom to
        ``retire``: the queue's, when its limits or basis are no longer the queue's."""
        room = self._rooms.get(queue)
        if room is None or not self.fits(queue, entries, size, now):
            return None, None
        if limits != room.limits or basis != room.basis:
            del self._rooms[queue]
            return None, room
        if not 0 <= shard < shards or entries < 1 or size < 0:
            return None, None  # the scan's checks say what is wrong with it
        room.entries -= entries
        room.bytes -= size
        room.outstanding += 1
        reservation = new_reservation(queue, shard, entries, size, now, limits)
        self._granted[reservation.id] = (reservation, room)
        return reservation, None

    def granted(self, reservation: Reservation) -> bool:
        """Whether the reservation came from a headroom (it has no marker)."""
        return reservation.id in self._granted

    def done(self, reservation: Reservation) -> Headroom | None:
        """A grant committed or aborted (its room is not given back: a headroom only ever
        errs on the safe side). Returns its headroom when that was retired and this was
        its last grant: the cover can go now."""
        _, room = self._granted.pop(reservation.id)
        room.outstanding -= 1
        return room if room.superseded and room.outstanding == 0 else None

    def counted(
        self, queue: QueueName, reservations: Iterable[Reservation], covers: Iterable[Reservation]
    ) -> list[Reservation]:
        """What a check counts besides the queue's entries: every marker but this writer's
        own covers, which would count its committed grants twice; its grants still in
        flight stand in for them."""
        own = {room.cover.id for _, room in self._granted.values()}
        if (current := self._rooms.get(queue)) is not None:
            own.add(current.cover.id)
        in_flight = [r for r, _ in self._granted.values() if r.queue == queue]
        return [*reservations, *(c for c in covers if c.id not in own), *in_flight]

    @staticmethod
    def new_cover(
        queue: QueueName,
        limits: QueueLimits,
        held_entries: int,
        held_bytes: int,
        now: float,
        writers: int,
    ) -> Reservation | None:
        """The cover of a new headroom, or None when the queue is too full for one (or the
        writers are unknown: 0).

        ``held``: the queue's entries and bytes and every reservation, but the other
        writers' covers. (Subtracting the others' covers too let only one writer have a
        headroom at a time.)"""
        if writers < 1:
            return None
        entries = limits.max_entries // (2 * writers) - held_entries
        size = limits.max_bytes // (2 * writers) - held_bytes
        if entries < 1 or size < 1:
            return None
        return new_reservation(queue, 0, entries, size, now, limits)

    def replace(
        self,
        queue: QueueName,
        limits: QueueLimits,
        cover: Reservation | None,
        basis: Hashable = None,
    ) -> Headroom | None:
        """Make ``cover`` (its marker in place) the queue's headroom, or leave it none;
        returns the headroom it replaces, to ``retire``."""
        old = self._rooms.pop(queue, None)
        if cover is not None:
            self._rooms[queue] = Headroom(
                limits,
                cover.entries,
                cover.bytes,
                cover,
                cover.expires_at - limits.reservation_timeout_s / 2,
                basis,
            )
        return old

    def pop(self, queue: QueueName) -> Headroom | None:
        """The queue's headroom, taken away (its limits change, or the queue goes); retire
        it unless the queue went with its cover."""
        return self._rooms.pop(queue, None)

    @staticmethod
    def retire(room: Headroom) -> bool:
        """A headroom replaced or dropped grants no more; True when its cover can go now
        (no grant of it in flight), else ``done`` says when."""
        room.superseded = True
        room.entries = room.bytes = 0
        return room.outstanding == 0
