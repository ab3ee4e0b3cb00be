"""The persistent queue of a topic: the contract every queue store keeps.

One queue per persistent Topic, split into shards (``shard_of``: the events of one object
always land in one shard, so they stay in order). Writing is a two-phase commit as in the
gateway's 2pc queue: ``reserve`` room (bounded by entries and bytes per queue, counting
other writers' open reservations), then ``commit`` the events or ``abort``. A reservation
that is neither committed nor aborted (its writer crashed) stops counting once it expires
and is removed by ``reclaim``. Reading is done by the shard's single owner: ``list`` in
commit order, ``remove`` what the endpoint acknowledged, ``update`` what must be retried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from bucketnotify.delivery.model.timings import setting_default

__all__ = [
    "CommitsTogether",
    "Entry",
    "EventIds",
    "QueueFull",
    "QueueLimits",
    "QueueName",
    "QueueNotFound",
    "QueueStats",
    "QueueStore",
    "Reservation",
    "ShardStats",
    "StoreFull",
    "StoreRefused",
    "StoreUnavailable",
]


@dataclass(frozen=True, order=True)
class QueueName:
    """The queue of Topic ``namespace/topic``."""

    namespace: str
    topic: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.topic}"


@dataclass(frozen=True)
class QueueLimits:
    """Bounds of one queue (all shards together)."""

    max_entries: int = 1_000_000
    max_bytes: int = 128 * 1024 * 1024
    """The gateway's own default per persistent queue."""
    reservation_timeout_s: float = setting_default("reservation_timeout_seconds")
    """A reservation older than this no longer counts and is reclaimed."""


@dataclass(frozen=True)
class Reservation:
    id: str
    queue: QueueName
    shard: int
    entries: int
    bytes: int
    expires_at: float
    """Epoch seconds."""


@dataclass(frozen=True)
class Entry:
    """One committed event."""

    id: str
    """Store-assigned; sorts in commit order within a shard."""
    event_id: str
    """Identity of the event (request id, key, configuration id, event name, sequencer):
    the same event sent twice by the gateway has the same event_id."""
    body: bytes = field(repr=False)
    """The event record as JSON."""
    ingest_time: float
    """Epoch seconds when it was committed."""
    attempts: int = 0
    """Delivery attempts made so far."""
    not_before: float = 0.0
    """Epoch seconds before which it must not be retried."""
    first_failure: float = 0.0
    """Epoch seconds of its first failed push a round saw; 0 while none failed."""
    last_failure: float = 0.0
    """Epoch seconds of its last failed push; 0 while none failed."""
    last_error: str = ""
    """What its last failed push said (redacted by the endpoint), for its dead letter."""


@dataclass(frozen=True)
class ShardStats:
    entries: int
    bytes: int
    reservations: int


@dataclass(frozen=True)
class QueueStats:
    shards: dict[int, ShardStats]
    expired: int = 0
    """Reservations past their expiry still held (their writer died): ``reclaim`` drops
    them."""

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.shards.values())

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards.values())

    @property
    def reservations(self) -> int:
        return sum(s.reservations for s in self.shards.values())


class QueueFull(Exception):
    """No room for the reservation: the ingest answers 503 and the gateway retries."""


class StoreUnavailable(Exception):
    """The queue store could not be reached or failed on its side (its message says how,
    never holding a credential): the next try may succeed. Nothing the caller was told
    about was written."""


class StoreRefused(Exception):
    """The queue store refused the request (access denied, its bucket missing): it will
    not get better by itself, a person has to look. Nothing was written."""


class StoreFull(Exception):
    """The queue store's disk or quota is full (``ENOSPC``, ``EDQUOT``): nothing more can be
    written until room is made; what is queued can still be read and removed."""


class QueueNotFound(LookupError):
    """The queue was never created or has been deleted.

    ``reserve`` and ``stats`` raise it, and ``commit`` may (a queue deleted since its
    reservation: the events go with the queue, as the gateway's go with a deleted topic).
    Reading treats a missing queue as empty: ``list`` gives nothing, ``remove``, ``update``
    and ``reclaim`` do nothing.
    """


Queues = list[QueueName]  # `list` is also a method name of QueueStore
EventIds = list[str]


class QueueStore(Protocol):
    """Durable storage of queues. Every method is safe to call from several processes, and
    raises the store's own exceptions, never its driver's: ``QueueFull``, ``QueueNotFound``,
    ``StoreUnavailable``, ``StoreRefused``, ``StoreFull``."""

    writers: int
    """How many processes may write to these queues now, at most; 0 while unknown (every
    reserve then scans). The delivery service sets it from its member Leases: a store never
    asks the replicas."""

    async def create(self, queue: QueueName, shards: int, limits: QueueLimits) -> None:
        """Create the queue, or update its shard count and limits; idempotent."""

    async def delete(self, queue: QueueName) -> None:
        """Remove the queue and everything in it; a missing queue is fine."""

    async def reserve(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation:
        """Room for ``entries`` events of ``size`` bytes in all; raises QueueFull."""

    async def commit(
        self, reservation: Reservation, events: Sequence[tuple[str, bytes]], now: float
    ) -> list[Entry]:
        """Durably append (event_id, body) pairs and release the reservation. Durable means:
        once this returns, a crash of any process loses none of them.

        The events must fit the reservation (ValueError otherwise: more would break the
        bound every other writer relies on); fewer is fine. A reservation that expired or
        was reclaimed meanwhile is still committed: the events matter more than the bound.
        """

    async def abort(self, reservation: Reservation) -> None:
        """Release the reservation without writing anything."""

    async def list(self, queue: QueueName, shard: int, max_entries: int = 1024) -> list[Entry]:
        """The oldest ``max_entries`` entries of the shard, in commit order.

        Commit order is the order of entry ids. Commits that overlap in time may become
        visible out of that order: a later ``list`` can show an entry before one an earlier
        ``list`` returned (never skip one).
        """

    async def remove(self, queue: QueueName, shard: int, entry_ids: Sequence[str]) -> None:
        """Remove these entries (delivered or dropped); unknown ids are ignored."""

    async def update(self, queue: QueueName, shard: int, entries: Sequence[Entry]) -> None:
        """Persist the delivery state of these entries (``attempts``, ``not_before`` and the
        failures), kept in place, in order."""

    async def stats(self, queue: QueueName, now: float) -> QueueStats:
        """Entries, bytes and live reservations per shard."""

    async def glance(self, queue: QueueName, now: float) -> QueueStats:
        """What ``stats`` says, in as few requests as the store can (one LIST of the queue
        for the S3 store), but not a consistent picture: a commit under way may show in
        neither its reservation nor its shard. For gauges and for finding the shards that
        hold entries, never for deciding that a queue is empty. An unknown queue is empty."""

    async def glance_many(
        self, queues: Sequence[QueueName], now: float
    ) -> dict[QueueName, QueueStats]:
        """``glance`` of each of ``queues`` (an answer for every one), in fewer requests
        than one ``glance`` each where the store can (the S3 store: one listing per
        namespace). The surveys of thousands of idle queues rest on it."""

    async def reclaim(self, queue: QueueName, now: float) -> int:
        """Drop expired reservations; returns how many."""

    async def queues(self) -> Queues:
        """Every queue in the store."""

    async def save_delivered(self, queue: QueueName, shard: int, event_ids: Sequence[str]) -> None:
        """Keep the identities of events recently delivered from the shard (replacing what
        was kept), for its next owner; nothing when the queue is gone. A hint only: what is
        lost or stale costs a duplicate, never a loss."""

    async def load_delivered(self, queue: QueueName, shard: int) -> EventIds:
        """What ``save_delivered`` kept last; empty when nothing was."""

    async def aclose(self) -> None:
        """Let go of connections and the like; a store used again afterwards reopens them."""


@runtime_checkable
class CommitsTogether(Protocol):
    """A store that can commit one request's events to several shards all or none, as far
    as its own failures go (the local-dir store: a full disk fails every batch before any
    is placed). Without it, a commit that fails after another succeeded leaves those
    events queued."""

    async def commit_together(
        self, commits: Sequence[tuple[Reservation, Sequence[tuple[str, bytes]]]], now: float
    ) -> list[list[Entry] | BaseException]:
        """``commit`` of each; the outcomes in order, failures as exceptions."""
        ...
