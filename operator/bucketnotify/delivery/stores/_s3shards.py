"""The S3 store's shards, as their owner reads and changes them: listing the oldest batches
(one LIST shared by the shards of a queue listing at once), reading them (not those this
replica wrote lately and nobody rewrote), and removing or updating entries from what the
last list read (see the store's "Requests", "Crash safety" and "One LIST for the shards
listing at once")."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from bucketnotify.delivery.model.queue import Entry, QueueName
from bucketnotify.delivery.stores._format import (
    Batch,
    BatchName,
    batch_of,
    batches,
    decode_batch,
    encode_batch,
    updated,
)
from bucketnotify.delivery.stores._s3objects import BucketObjects, Page, all_of
from bucketnotify.gateway.errors import GatewayUnreachable

__all__ = ["S3Shards"]

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


class S3Shards:
    """The shards of the queues ``io`` reaches, for their owner."""

    def __init__(self, io: BucketObjects, list_gather_s: float) -> None:
        self._io = io
        self._list_gather_s = list_gather_s
        self._owning: dict[tuple[QueueName, int], asyncio.Lock] = {}
        self._cache: dict[tuple[QueueName, int], dict[str, _Cached]] = {}
        self.written = _Written()
        self._listings: dict[QueueName, asyncio.Future[Page]] = {}
        """The shared LIST of each queue's shards still gathering shards, not yet sent."""
        self._crowded: dict[QueueName, float] = {}
        self._listing_tasks: set[asyncio.Task[None]] = set()

    def forget(self, queue: QueueName) -> None:
        """A deleted queue."""
        self._crowded.pop(queue, None)
        for key in list(self._cache):
            if key[0] == queue:
                del self._cache[key]

    async def aclose(self) -> None:
        # A shared LIST still gathering is sent and answered first: its shards wait for it.
        if self._listing_tasks:
            await asyncio.gather(*self._listing_tasks, return_exceptions=True)

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
        loaded = await all_of(*(self._load(queue, shard, b) for b in missing))
        for batch_id, cached in zip(missing, loaded, strict=True):
            if cached is not None:
                cache[batch_id] = cached
        return {b: cache[b] for b in wanted if b in cache}

    async def _load(self, queue: QueueName, shard: int, batch_id: str) -> _Cached | None:
        start = self._io.shard(queue, shard)
        names = [k[len(start) :] for k in await self._io.list_keys(f"{start}{batch_id}.")]
        for batch in batches(names):
            data = await self._io.get(start + str(batch.current))
            if data is not None:
                return _Cached(batch, decode_batch(batch_id, data))
        return None

    async def _rewrite(self, queue: QueueName, shard: int, changes: dict[str, list[Entry]]) -> None:
        cache = self._cache.setdefault((queue, shard), {})
        start = self._io.shard(queue, shard)

        async def one(batch_id: str, entries: list[Entry]) -> None:
            old = cache[batch_id].batch
            if entries:
                name = BatchName.of(batch_id, entries)
                await self._io.put(start + str(name), encode_batch(entries), "application/x-ndjson")
                # The old names stay known until they are gone: a stale name forgotten here
                # would outlive the batch's last removal and bring its entries back.
                drop = tuple(n for n in (old.current, *old.stale) if n != name)
                cache[batch_id] = _Cached(Batch(name, drop), entries)
                await all_of(*(self._io.delete(start + str(n)) for n in drop))
                cache[batch_id] = _Cached(Batch(name), entries)
            else:
                # Stale supersets first: until the current name goes, it is the one that wins.
                await all_of(*(self._io.delete(start + str(n)) for n in old.stale))
                await self._io.delete(start + str(old.current))
                cache.pop(batch_id, None)

        await all_of(*(one(b, e) for b, e in changes.items()))

    async def _oldest(
        self, queue: QueueName, shard: int, max_entries: int
    ) -> tuple[list[Batch], dict[str, str]]:
        """The oldest batches holding ``max_entries``, each with all its names, and the
        ETags of the names.

        Paging stops only past the last batch's names: a stale name that stayed unknown
        would outlive the current one and bring its removed entries back.
        """
        start = self._io.shard(queue, shard)
        chosen: list[Batch] = []
        etags: dict[str, str] = {}
        held = 0
        shared = await self._shared_keys(queue, shard)
        token: str | None = None
        while True:
            if shared is not None:
                keys, shared = shared, None  # all the shard holds: no page follows
            else:
                keys, token = await self._io.list_page(start, token)
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
        prefix = self._io.shard(queue, shard)
        if token is not None and (
            not page or page[-1][0] <= prefix or page[-1][0].startswith(prefix)
        ):
            # Cut short before the end of this shard's names: a backlog somewhere in the
            # queue. Per shard for a while, rather than a shared LIST wasted every round.
            self._crowded[queue] = time.monotonic() + CROWDED_S
            return None
        return [(key, etag) for key, etag in page if key.startswith(prefix)]

    async def _list_shared(self, queue: QueueName, shared: asyncio.Future[Page]) -> None:
        try:
            try:
                await asyncio.sleep(self._list_gather_s)
            finally:
                # Sent from now on: a shard asking later may have been woken by a commit
                # this LIST would miss, so it waits for the next one.
                if self._listings.get(queue) is shared:
                    del self._listings[queue]
            page = await self._io.list_page(f"{self._io.data(queue)}shard-", None, SHARED_LIST_KEYS)
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
            start = self._io.shard(queue, shard)
            chosen, etags = await self._oldest(queue, shard, max_entries)
            # A batch this replica wrote, unchanged since (same ETag), is not read back.
            known = [
                self.written.take(start + str(b.current), etags[str(b.current)]) for b in chosen
            ]
            bodies = await all_of(
                *(
                    _none() if written is not None else self._io.get(start + str(b.current))
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
