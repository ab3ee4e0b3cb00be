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
  delivered identities), so surveying an idle queue costs one request. ``glance_many``:
  one listing of everything under a namespace's queues, at most one page per queue asked
  (a page holds 1000 keys): surveying thousands of idle queues costs a few LISTs. The
  queues its pages did not reach (a backlog of many batch objects before them) get a
  ``glance`` each, so it never costs more than twice the LISTs of a ``glance`` per queue.
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

from collections.abc import Sequence
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from bucketnotify.delivery.model.queue import (
    Entry,
    QueueLimits,
    QueueName,
    Queues,
    QueueStats,
    Reservation,
)
from bucketnotify.delivery.stores._errors import raises_store_errors
from bucketnotify.delivery.stores._format import (
    BatchName,
    batches,
    check_commit,
    encode_batch,
    encode_meta,
    new_batch_id,
    new_entries,
    parse_reservation,
    usage,
)
from bucketnotify.delivery.stores._s3objects import BucketObjects, all_of
from bucketnotify.delivery.stores._s3reservations import S3Reservations
from bucketnotify.delivery.stores._s3shards import S3Shards
from bucketnotify.delivery.stores._threads import IOThreads
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.errors import mapped_errors

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3Store"]


@raises_store_errors
class S3Store:
    """A ``QueueStore`` in ``bucket`` under ``prefix``; call ``ensure_bucket`` once first.

    Wires its parts: the objects and requests (``_s3objects``), the reservations and meta
    (``_s3reservations``) and the owner's side of the shards (``_s3shards``)."""

    def __init__(
        self,
        connection: GatewayConnection,
        bucket: str,
        prefix: str = "queues/",
        *,
        meta_cache_s: float = 5.0,
        max_requests: int = 10,
        writers: int = 0,
        list_gather_s: float = 0.002,
    ) -> None:
        """``meta_cache_s``: how long a queue's shards and limits are reused, so a change
        made through another replica applies here that much later. ``max_requests``: at
        most this many requests in flight, each on a connection of its own.
        ``writers``: how many replicas may write to these queues now, at most (0 while
        unknown; the delivery service keeps it up to date); it sizes the headroom, and
        without it every reserve scans (see "Reserving without a scan").
        ``list_gather_s``: how long the first shard of a queue to list waits for others to
        share its LIST."""
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.bucket = bucket
        self.prefix = prefix
        self._s3: S3Client = connection.s3()
        self._io = BucketObjects(connection, bucket, prefix, max_requests)
        self._threads = IOThreads("s3-store", 1)
        self._reservations = S3Reservations(self._io, meta_cache_s, writers)
        self._shards = S3Shards(self._io, list_gather_s)

    @property
    def writers(self) -> int:
        return self._reservations.writers

    @writers.setter
    def writers(self, writers: int) -> None:
        self._reservations.writers = writers

    async def ensure_bucket(self) -> None:
        """Create the bucket unless it exists; idempotent."""
        operation = f"CreateBucket {self.bucket}"

        def ensure() -> None:
            with mapped_errors(operation):
                self._ensure_bucket()

        await self._io.call(operation, lambda: self._threads.run(ensure))

    async def aclose(self) -> None:
        """Closes the connections to the gateway; a later call opens new ones."""
        await self._shards.aclose()
        await self._io.aclose()

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

    # Queues

    async def create(self, queue: QueueName, shards: int, limits: QueueLimits) -> None:
        if shards < 1:
            raise ValueError(f"a queue needs at least one shard, not {shards}")
        meta = encode_meta(shards, limits)
        await self._io.put(self._io.meta_key(queue), meta, "application/json")
        self._reservations.remember(queue, shards, limits)
        if (room := self._reservations.headrooms.pop(queue)) is not None:
            await self._reservations.retire(room)

    async def delete(self, queue: QueueName) -> None:
        # The meta object first: from then on the queue is not listed and takes no
        # reservations; then everything under it, until a LIST finds nothing. A commit
        # racing with this can still land afterwards (reserved through a replica's cached
        # meta): it stays until the queue is created and deleted again.
        await self._io.delete(self._io.meta_key(queue))
        self._reservations.forget(queue)
        self._shards.forget(queue)
        while keys := await self._io.list_keys(self._io.data(queue)):
            await all_of(*(self._io.delete(k) for k in keys))

    async def save_delivered(self, queue: QueueName, shard: int, event_ids: Sequence[str]) -> None:
        # A queue deleted meanwhile must not get an object that outlives it. The meta is
        # cached: a save racing a delete by another replica can still leave the object,
        # until the queue's next delete (a stale hint, harmless).
        if await self._reservations.meta_or_none(queue) is None:
            return
        body = "\n".join(event_ids).encode()
        await self._io.put(self._io.delivered(queue, shard), body, "text/plain")

    async def load_delivered(self, queue: QueueName, shard: int) -> list[str]:
        found = await self._io.get(self._io.delivered(queue, shard))
        return found.decode().split() if found else []

    async def queues(self) -> Queues:
        start = f"{self.prefix}meta/"
        found = []
        for key in await self._io.list_keys(start):
            namespace, _, topic = key[len(start) :].partition("/")
            if namespace and topic and "/" not in topic:
                found.append(QueueName(namespace, topic))
        return found

    # Writing

    async def reserve(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation:
        return await self._reservations.reserve(queue, shard, entries, size, now)

    async def commit(
        self, reservation: Reservation, events: Sequence[tuple[str, bytes]], now: float
    ) -> list[Entry]:
        check_commit(reservation, events)
        if events:
            batch, _ = new_batch_id()
            entries = new_entries(batch, events, now)
            key = self._io.shard(reservation.queue, reservation.shard) + str(
                BatchName.of(batch, entries)
            )
            body = encode_batch(entries)
            etag = await self._io.put(key, body, "application/x-ndjson")
            self._shards.written.add(key, etag, entries, len(body))
        else:
            entries = []
        # After the batch, never before: see "Reservations across replicas" above.
        await self._reservations.release(reservation)
        return entries

    async def abort(self, reservation: Reservation) -> None:
        await self._reservations.release(reservation)

    async def reclaim(self, queue: QueueName, now: float) -> int:
        return await self._reservations.reclaim(queue, now)

    async def stats(self, queue: QueueName, now: float) -> QueueStats:
        return await self._reservations.stats(queue, now)

    async def glance(self, queue: QueueName, now: float) -> QueueStats:
        # One LIST of everything under the queue (reservations sort before the shards) and
        # no meta read: the shard count only adds empty shards to the answer.
        start = self._io.data(queue)
        return self._glanced(queue, [k[len(start) :] for k in await self._io.list_keys(start)], now)

    async def glance_many(
        self, queues: Sequence[QueueName], now: float
    ) -> dict[QueueName, QueueStats]:
        # One listing of each namespace's data, its pages bounded by the number of queues it
        # answers: a survey of thousands of idle queues costs a few LISTs, and a listing
        # that meets a backlog never costs more than a LIST per queue would have.
        wanted: dict[str, set[str]] = {}
        for queue in queues:
            self._io.data(queue)  # refuses a name that cannot be stored, as ``glance`` does
            wanted.setdefault(queue.namespace, set()).add(queue.topic)
        found: dict[QueueName, QueueStats] = {}
        for namespace, topics in wanted.items():
            found.update(await self._glance_namespace(namespace, topics, now))
        return found

    async def _glance_namespace(
        self, namespace: str, topics: set[str], now: float
    ) -> dict[QueueName, QueueStats]:
        start = self._io.namespace_data(namespace)
        keys: dict[str, list[str]] = {topic: [] for topic in topics}
        token: str | None = None
        last = ""
        for _ in range(len(topics)):
            page, token = await self._io.list_page(start, token)
            for key, _etag in page:
                topic, _, rest = key[len(start) :].partition("/")
                if topic in keys:
                    keys[topic].append(rest)
            last = page[-1][0] if page else last
            if token is None:
                break
        found: dict[QueueName, QueueStats] = {}
        for topic in topics:
            queue = QueueName(namespace, topic)
            within = f"{start}{topic}/"
            # A queue is answered once the listing went past all of its keys (they sort
            # together); one it stopped short of, or in, gets a LIST of its own.
            if token is None or (last > within and not last.startswith(within)):
                found[queue] = self._glanced(queue, keys[topic], now)
            else:
                found[queue] = await self.glance(queue, now)
        return found

    def _glanced(self, queue: QueueName, keys: Sequence[str], now: float) -> QueueStats:
        """``glance``'s answer from the keys under the queue's data (relative to it)."""
        reservations: list[Reservation] = []
        names: dict[int, list[str]] = {}
        for key in keys:
            kind, _, name = key.partition("/")
            if kind == "reservations":
                if (reservation := parse_reservation(queue, name)) is not None:
                    reservations.append(reservation)
            elif kind.startswith("shard-") and kind[6:].isdigit():
                names.setdefault(int(kind[6:]), []).append(name)
        found = {shard: list(batches(sorted(n))) for shard, n in names.items()}
        return usage(self._reservations.cached_shards(queue), found, reservations, now)

    # Reading, by the shard's owner

    async def remove(self, queue: QueueName, shard: int, entry_ids: Sequence[str]) -> None:
        await self._shards.remove(queue, shard, entry_ids)

    async def update(self, queue: QueueName, shard: int, entries: Sequence[Entry]) -> None:
        await self._shards.update(queue, shard, entries)

    # Last in the class: below this, `list` would name the method, not the builtin.
    async def list(self, queue: QueueName, shard: int, max_entries: int = 1024) -> list[Entry]:
        return await self._shards.list(queue, shard, max_entries)
