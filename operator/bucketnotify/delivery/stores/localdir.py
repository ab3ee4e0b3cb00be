"""Queues in a local directory: the embedded store of a single replica, and of tests.

Layout under ``root`` (names as in ``_format``: a listing is all ``stats`` needs)::

    <namespace>/<topic>/meta.json                  shards and limits
    <namespace>/<topic>/incarnation                random id of this queue's life
    <namespace>/<topic>/shard-<n>/<batch name>     one file per committed batch, JSON lines
    <namespace>/<topic>/reservations/<name>        one empty file per open reservation
    <namespace>/<topic>/reservations/<name>.cover  one per writer's headroom
    <namespace>/<topic>/delivered-<n>              identities recently delivered from
                                                   shard n, one per line
    <namespace>/<topic>/.tmp/                      files being written
    .locks/<namespace>/<topic>/queue.lock          flock: reserve, create, delete
    .locks/<namespace>/<topic>/shard-<n>.lock      flock: commit, list, remove, update;
                                                   holds the shard's last batch time and
                                                   its entries and bytes (see Costs)
    .trash/                                        deleted queues on their way out

Durability: a file is written in ``.tmp``, fsynced, renamed into place and the directory
fsynced before ``commit`` returns. Rewrites (``remove``, ``update``) go the same way, and
a rewrite that shrinks a batch renames the new file in before it unlinks the old one, so
a crash leaves the old superset beside it (ignored: see ``_format``), never neither.
Reservations are not fsynced: a machine crash takes their writers with them. Nor are the
delivered identities (``save_delivered``): a hint, whose loss costs duplicates.

Several processes: ``reserve`` checks and writes under the queue's lock, so on one machine
the limits hold exactly. Batch ids are chosen under the shard's lock from the time stored
in its lock file, so they increase in the order batches become visible, whatever the
processes' clocks say, and a lister never sees an entry appear before one it saw already.
Lock files live outside the queue directory so that ``delete`` (an atomic rename into
``.trash``) does not pull them from under a waiting process. flock works on local file
systems; a network file system is not supported.

Reserving without a scan: with ``writers`` set (as the delivery service does), a reserve
under the queue's lock also leaves this process a headroom (``_headroom``), held by a
cover file every other writer counts in full. A reserve that fits in it takes no lock,
reads no record and creates no marker: it stats the meta file (a change of limits, or a
queue made again, ends the headroom) and is granted. A cover is checked like a
reservation, so the limits hold exactly even with ``writers`` too low.

Costs: ``reserve`` and ``stats`` read one small record per shard, whatever the backlog:
each shard's lock file keeps its entries and bytes, changed under the shard's exclusive
lock by every commit and rewrite together with the names, so a reader under the shared
lock sees the numbers a listing would give. The record is trusted only while it is
*clean*: it is marked dirty before the names change and clean again after, and it names
the queue's incarnation and the machine's boot id. A writer that died in between (dirty),
a reboot (lock files are not fsynced, so the record may be older than the names), a queue
deleted and created again (another incarnation), a lock file of an older release (no
record), a commit by an older release still running (it rewrites only the batch time,
which the record repeats at its end): the next reader counts the shard from its names
once, under the exclusive lock, and writes the record back. ``list`` reads only the
files it returns; ``remove`` and ``update`` list the shard's names. A ``remove`` of whole
batches the last ``list`` read (what an owner does after a push) of a shard that keeps up
(at most ``INLINE_FILES`` batches) reads no batch file: the ids that list saw under each
name say what the batch holds. Commits of one shard take turns only for the rename; the
write and fsync of the file happen outside the lock.

Threads: a ``commit`` writes and fsyncs through the kernel's ring (``_ring``: io_uring
or Linux AIO, else threads) and renames under the shard's lock on the loop, in a thread
only when that lock is held by someone else; so does a ``remove`` of whole listed batches
(unlinks under the lock, the directory's fsync through the ring after it), and so do small
reads. The rest of what fsyncs (the rewrite of a partial ``remove`` and of ``update``,
``create``, ``delete``, ``save_delivered``) and what may touch many files (``reclaim``,
``queues``, a ``list`` or a read of more than ``INLINE_FILES`` batch files) runs in the
store's own threads (``_threads``), not in the event loop's shared default executor.
The rest runs on the event loop: ``reserve``, ``abort``, ``stats``, ``load_delivered``
and small reads make many short system calls and no fsync (but for the one that gives a
queue of an older release its incarnation, once), and in a thread each of those calls
gives up the GIL and must win it back from the busy event loop, which cost more CPU per
event than the calls themselves (docs/performance-notes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import re
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from bucketnotify.delivery.queue import (
    Entry,
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
    reservation_name,
    updated,
    usage_of_counts,
)
from bucketnotify.delivery.stores._headroom import Headroom, Headrooms
from bucketnotify.delivery.stores._ring import Ring, write_all_blocking
from bucketnotify.delivery.stores._threads import IOThreads

__all__ = ["LocalDirStore"]

TMP_MAX_AGE_S = 3600.0
"""A temporary file this old belongs to a writer that died; ``reclaim`` removes it."""

IO_THREADS = 8
"""Blocking calls at once: enough for the fsyncs of concurrent commits to overlap (the file
system journals them together), few enough to leave the two cores to the event loop."""

INLINE_FILES = 4
"""A ``list`` or a read of at most this many batch files runs on the event loop: the files
of a shard that keeps up are few and small. A backlog's reads (up to a thousand files,
perhaps not cached after a restart) go to a thread."""


@raises_store_errors
class LocalDirStore:
    """A ``QueueStore`` in the directory ``root`` (created when missing)."""

    def __init__(
        self,
        root: Path,
        *,
        io_threads: int = IO_THREADS,
        ring: bool = True,
        writers: Callable[[], int] | None = None,
    ) -> None:
        """``writers``: how many processes may write to these queues now, at most (0 while
        unknown); it sizes the headroom, and without it every reserve scans (see "Reserving
        without a scan")."""
        self.root = Path(root)
        self._threads = IOThreads("localdir-store", io_threads)
        self._ring = Ring(self._threads, enabled=ring)
        self.writers = writers
        self._headrooms = Headrooms()
        self._metas: dict[QueueName, tuple[Hashable, int, QueueLimits]] = {}
        # Per shard, the entry ids of each batch name the last ``list`` read (see remove).
        self._listed: dict[tuple[QueueName, int], dict[str, frozenset[str]]] = {}

    @property
    def commit_io(self) -> str:
        """How commits write and fsync on the running loop: ``io_uring``, ``linux-aio`` or
        ``threads``."""
        return self._ring.kind

    async def create(self, queue: QueueName, shards: int, limits: QueueLimits) -> None:
        await self._threads.run(self._create, queue, shards, limits)
        if (room := self._headrooms.pop(queue)) is not None:
            self._retire(room)

    async def delete(self, queue: QueueName) -> None:
        await self._threads.run(self._delete, queue)
        self._headrooms.pop(queue)  # its cover went with the queue
        self._metas.pop(queue, None)
        for key in [k for k in self._listed if k[0] == queue]:
            del self._listed[key]

    async def reserve(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation:
        return self._reserve(queue, shard, entries, size, now)

    async def commit(
        self, reservation: Reservation, events: Sequence[tuple[str, bytes]], now: float
    ) -> list[Entry]:
        events = list(events)
        tmp = await self._prepare(reservation, events, now)
        return await self._finish(reservation, events, now, tmp)

    async def commit_together(
        self, commits: Sequence[tuple[Reservation, Sequence[tuple[str, bytes]]]], now: float
    ) -> list[list[Entry] | BaseException]:
        """``commit`` to several shards (one ingest request's), all or none as far as the
        disk goes: every batch is written and fsynced before any is placed, so a write that
        fails (a full disk) fails them all and none is queued. The outcomes in order, as
        ``gather(..., return_exceptions=True)`` gives them; a reservation whose commit
        failed is not released (``abort`` it)."""
        batches = [(reservation, list(events)) for reservation, events in commits]
        writes = await asyncio.gather(
            *(self._prepare(r, events, now) for r, events in batches), return_exceptions=True
        )
        failure = next((w for w in writes if isinstance(w, BaseException)), None)
        if failure is not None:
            for written in writes:
                if isinstance(written, str):
                    _unlink(written)
            return [w if isinstance(w, BaseException) else failure for w in writes]
        return await asyncio.gather(
            *(
                self._finish(r, events, now, cast(str | None, tmp))
                for (r, events), tmp in zip(batches, writes, strict=True)
            ),
            return_exceptions=True,
        )

    async def _prepare(
        self, reservation: Reservation, events: list[tuple[str, bytes]], now: float
    ) -> str | None:
        """The batch of ``events`` written and fsynced aside; None for no events."""
        check_commit(reservation, events)
        if not events:
            return None
        # The body does not depend on the batch id, so the slow part (write and fsync) needs
        # no lock; only choosing the id and the rename do.
        return await self._write_durably(
            reservation.queue, encode_batch(new_entries("", events, now))
        )

    async def _finish(
        self, reservation: Reservation, events: list[tuple[str, bytes]], now: float, tmp: str | None
    ) -> list[Entry]:
        """The prepared batch placed in its shard, durably; the reservation released."""
        if tmp is None:
            self._release(reservation)
            return []
        queue, shard = reservation.queue, reservation.shard
        directory = self._shard_dir(queue, shard)
        try:
            try:
                entries = self._place(reservation, events, now, tmp, wait=False)
            except _LockBusy:
                # A rewrite or a long read holds the shard: wait for it in a thread, not
                # with the event loop.
                entries = await self._threads.run(
                    self._place, reservation, events, now, tmp, wait=True
                )
        except FileNotFoundError:
            _unlink(tmp)
            raise QueueNotFound(f"queue {queue} has no shard {shard} (any more)") from None
        # The batch is in: its reservation goes whatever happens to the fsync (cancelled,
        # failed), or it would count twice until it expired.
        try:
            try:
                dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                raise QueueNotFound(f"queue {queue} was deleted meanwhile") from None
            try:
                await self._ring.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        finally:
            self._release(reservation)
        return entries

    async def _write_durably(self, queue: QueueName, data: bytes) -> str:
        """A new file in the queue's ``.tmp`` holding ``data``, written and fsynced."""
        try:
            fd, name = _new_tmp(os.fspath(_in_queue_dir(self.root, queue, ".tmp")))
        except FileNotFoundError:
            raise QueueNotFound(f"queue {queue} does not exist") from None
        try:
            try:
                await self._ring.write_all(fd, data)
                await self._ring.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            _unlink(name)
            raise
        return name

    async def abort(self, reservation: Reservation) -> None:
        self._release(reservation)

    async def remove(self, queue: QueueName, shard: int, entry_ids: Sequence[str]) -> None:
        removed = set(entry_ids)
        if await self._remove_listed(queue, shard, removed):
            return
        await self._change(
            queue, shard, removed, lambda entries: [e for e in entries if e.id not in removed]
        )

    async def _remove_listed(self, queue: QueueName, shard: int, removed: set[str]) -> bool:
        """Remove what the owner does nearly always remove: whole batches its last ``list``
        read. On the loop, without reading a batch file: under the shard's lock the names
        say which batches are there, and each one's ids are known from that list (a name
        stands for one set of ids: a rewrite that drops entries changes the count in the
        name, one that updates them keeps the ids). Then the directory fsync through the
        ring, outside the lock. False, having changed nothing, when a batch is only partly
        removed or was not read by that list, or the lock is held: ``_change`` does it."""
        wanted = {b for b in map(batch_of, removed) if b is not None}
        if not wanted:
            return True  # no id a store of ours made: nothing to remove
        listed = self._listed.get((queue, shard))
        if listed is None:
            return False
        directory = self._shard_dir(queue, shard)
        try:
            with _flock(self._lock(queue, f"shard-{shard}"), wait=False) as lock:
                # The incarnation before the names: see _rewrite.
                incarnation = self._incarnation(queue)
                stamp = _read_record(lock).stamp
                present = list(batches(_names(directory)))
                going = [b for b in present if b.current.batch in wanted]
                for batch in going:
                    ids = listed.get(str(batch.current))
                    if ids is None or not ids <= removed:
                        return False
                path = os.fspath(directory)
                if going:
                    _write_record(lock, stamp, None, incarnation)
                    for batch in going:
                        # Stale supersets first: until the current one goes, it still wins.
                        for name in (*batch.stale, batch.current):
                            _unlink(f"{path}/{name}")
                        listed.pop(str(batch.current), None)
                    kept = [b.current for b in present if b.current.batch not in wanted]
                    total = _Counts(sum(n.count for n in kept), sum(n.bytes for n in kept))
                    _write_record(lock, stamp, total, incarnation)
                # Opened under the lock: the directory the names went from, even if the
                # queue is deleted before the fsync. Fsynced also when nothing was there,
                # so that a remove retried after a failed fsync is durable when it returns.
                dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except _LockBusy:
            return False
        except FileNotFoundError:
            return True  # the queue was deleted: its entries went with it
        try:
            await self._ring.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return True

    async def update(self, queue: QueueName, shard: int, entries: Sequence[Entry]) -> None:
        by_id = {e.id: e for e in entries}
        await self._change(
            queue, shard, by_id, lambda found: [updated(e, by_id.get(e.id)) for e in found]
        )

    async def _change(
        self,
        queue: QueueName,
        shard: int,
        entry_ids: Iterable[str],
        change: Callable[[list[Entry]], list[Entry]],
    ) -> None:
        """Rewrite the batches holding ``entry_ids`` whose entries ``change`` alters."""
        wanted = {b for b in map(batch_of, entry_ids) if b is not None}
        changes: dict[str, list[Entry] | None] = {}
        for batch_id, found in (await self._read_batches(queue, shard, wanted)).items():
            new = change(found)
            if new != found:
                changes[batch_id] = new
        # Read, then rewrite under a second lock: only the shard's owner removes or updates,
        # so nothing else changes these batches in between (commits only add new ones).
        if changes:
            await self._threads.run(self._rewrite, queue, shard, changes)

    async def stats(self, queue: QueueName, now: float) -> QueueStats:
        return self._stats(queue, now)

    async def glance(self, queue: QueueName, now: float) -> QueueStats:
        # Directory listings cost no requests: the consistent answer is cheap enough.
        try:
            return await self.stats(queue, now)
        except QueueNotFound:
            return QueueStats({})

    async def reclaim(self, queue: QueueName, now: float) -> int:
        return await self._threads.run(self._reclaim, queue, now)

    async def queues(self) -> Queues:
        return await self._threads.run(self._queues)

    async def save_delivered(self, queue: QueueName, shard: int, event_ids: Sequence[str]) -> None:
        await self._threads.run(self._save_delivered, queue, shard, list(event_ids))

    async def load_delivered(self, queue: QueueName, shard: int) -> list[str]:
        return self._load_delivered(queue, shard)

    async def aclose(self) -> None:
        # Files are opened and closed per call; the ring and the threads serve any loop.
        return None

    async def _read_batches(
        self, queue: QueueName, shard: int, batch_ids: set[str]
    ) -> dict[str, list[Entry]]:
        if len(batch_ids) <= INLINE_FILES:
            with contextlib.suppress(_LockBusy):
                return self._read(queue, shard, batch_ids, wait=False)
        return await self._threads.run(self._read, queue, shard, batch_ids)

    # Paths

    # Made once and remembered: a reserve looks up every shard's lock, and building the
    # paths anew showed in the store's profile (docs/performance-notes.md).

    def _dir(self, queue: QueueName) -> Path:
        return _queue_dir(self.root, queue)

    def _shard_dir(self, queue: QueueName, shard: int) -> Path:
        return _in_queue_dir(self.root, queue, f"shard-{shard}")

    def _lock(self, queue: QueueName, name: str) -> Path:
        return _lock_path(self.root, queue, name)

    # The blocking work, one worker thread per call

    def _create(self, queue: QueueName, shards: int, limits: QueueLimits) -> None:
        if shards < 1:
            raise ValueError(f"a queue needs at least one shard, not {shards}")
        directory = self._dir(queue)
        with _flock(self._lock(queue, "queue")):
            for sub in [".tmp", "reservations", *(f"shard-{n}" for n in range(shards))]:
                (directory / sub).mkdir(parents=True, exist_ok=True)
            self._ensure_incarnation(queue)
            _replace_durably(directory / "meta.json", encode_meta(shards, limits))
            # The new directories' own entries must survive a crash too.
            for path in (directory.parent, self.root):
                _fsync_dir(path)

    def _save_delivered(self, queue: QueueName, shard: int, event_ids: list[str]) -> None:
        directory = self._dir(queue)
        try:
            # Not fsynced: a hint (a lost or torn one costs duplicates, never a loss), saved
            # whenever a shard runs empty; the rename alone survives the process.
            written = _write_tmp(directory / ".tmp", "\n".join(event_ids).encode(), sync=False)
        except FileNotFoundError:
            return  # the queue is gone
        # The rename under the queue's lock: a delete cannot take the directory between the
        # check and the rename, so a deleted queue gets nothing back.
        with _flock(self._lock(queue, "queue")):
            if (directory / "meta.json").exists():
                written.rename(directory / f"delivered-{shard}")
                return
        written.unlink(missing_ok=True)

    def _load_delivered(self, queue: QueueName, shard: int) -> list[str]:
        try:
            return _read_file(self._dir(queue) / f"delivered-{shard}").decode().split()
        except (FileNotFoundError, UnicodeError):
            return []  # none, or torn by a machine crash

    def _delete(self, queue: QueueName) -> None:
        directory = self._dir(queue)
        trash = self.root / ".trash" / uuid.uuid4().hex
        with _flock(self._lock(queue, "queue")):
            trash.parent.mkdir(parents=True, exist_ok=True)
            try:
                directory.rename(trash)
            except FileNotFoundError:
                return
            _fsync_dir(directory.parent)
        shutil.rmtree(trash, ignore_errors=True)

    def _meta(self, queue: QueueName) -> tuple[Hashable, int, QueueLimits]:
        """The queue's identity as its meta file's (a new file whenever the shards or
        limits change, or the queue is made again), its shards and its limits; decoded
        only when the file changed, so a reserve from the headroom costs one stat."""
        path = _in_queue_dir(self.root, queue, "meta.json")
        try:
            found = os.stat(path)
            basis = (found.st_ino, found.st_mtime_ns, found.st_size)
            cached = self._metas.get(queue)
            if cached is not None and cached[0] == basis:
                return cached
            # Read after the stat: a file replaced in between is read anew next time.
            meta = (basis, *decode_meta(_read_file(path)))
        except FileNotFoundError:
            self._metas.pop(queue, None)
            raise QueueNotFound(f"queue {queue} does not exist") from None
        self._metas[queue] = meta
        return meta

    def _markers(self, queue: QueueName) -> tuple[list[Reservation], list[Reservation]]:
        """The reservation markers and the headroom covers."""
        reservations: list[Reservation] = []
        covers: list[Reservation] = []
        for name in _names(self._dir(queue) / "reservations"):
            if (marker := parse_marker(queue, name)) is not None:
                (covers if marker[1] else reservations).append(marker[0])
        return reservations, covers

    def _cover_path(self, cover: Reservation) -> Path:
        return self._dir(cover.queue) / "reservations" / (reservation_name(cover) + COVER_SUFFIX)

    def _retire(self, room: Headroom) -> None:
        """A headroom replaced or dropped: its cover goes once its last grant is done."""
        if Headrooms.retire(room):
            self._cover_path(room.cover).unlink(missing_ok=True)

    def _incarnation(self, queue: QueueName) -> str | None:
        """The id of the queue's current life; None for a queue an older release made."""
        try:
            found = _read_file(_in_queue_dir(self.root, queue, "incarnation")).decode().strip()
        except FileNotFoundError:
            return None
        return found if _INCARNATION.fullmatch(found) else None

    def _ensure_incarnation(self, queue: QueueName) -> str:
        """The incarnation, made if missing; under the queue's lock (create, reserve)."""
        found = self._incarnation(queue)
        if found is None:
            found = uuid.uuid4().hex
            _replace_durably(self._dir(queue) / "incarnation", found.encode())
        return found

    def _count(self, queue: QueueName, shard: int) -> _Counts:
        found = list(batches(_names(self._shard_dir(queue, shard))))
        return _Counts(sum(b.current.count for b in found), sum(b.current.bytes for b in found))

    def _shard_counts(self, queue: QueueName, shard: int, incarnation: str | None) -> _Counts:
        """The shard's entries and bytes, from its record, or counted when that is unknown."""
        lock = self._lock(queue, f"shard-{shard}")
        # Shared lock: commits and rewrites change names and record under the exclusive one.
        with _flock(lock, shared=True) as fd:
            counts = _read_record(fd).counts_for(incarnation)
        if counts is not None:
            return counts
        with _flock(lock) as fd:
            record = _read_record(fd)
            counts = record.counts_for(incarnation)
            if counts is None:
                counts = self._count(queue, shard)
                _write_record(fd, record.stamp, counts, incarnation)
            return counts

    def _usage(
        self, queue: QueueName, shards: int, now: float, incarnation: str | None
    ) -> tuple[QueueStats, list[Reservation], list[Reservation]]:
        """Stats (without the covers), the reservation markers and the covers."""
        # Reservations first: a commit renames its batch in and counts it before it drops
        # its reservation, so one not seen here is in the counts that follow.
        reservations, covers = self._markers(queue)
        counts = {}
        for name in _names(self._dir(queue)):
            if name.startswith("shard-") and name[6:].isdigit():
                shard = int(name[6:])
                found = self._shard_counts(queue, shard, incarnation)
                counts[shard] = (found.entries, found.bytes)
        return usage_of_counts(shards, counts, reservations, now), reservations, covers

    def _reserve(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation:
        if self._headrooms.fits(queue, entries, size, now):
            try:
                basis, shards, limits = self._meta(queue)
            except QueueNotFound:
                self._headrooms.pop(queue)  # its cover went with the queue
                raise
            granted, stale = self._headrooms.grant(
                queue, shard, entries, size, now, shards, limits, basis
            )
            if stale is not None:
                self._retire(stale)
            if granted is not None:
                return granted
        with _flock(self._lock(queue, "queue")):
            basis, shards, limits = self._meta(queue)
            check_request(shards, shard, entries, size)
            incarnation = self._ensure_incarnation(queue)
            stats, reservations, covers = self._usage(queue, shards, now, incarnation)
            counted = self._headrooms.counted(queue, reservations, covers)
            check_room(stats, counted, limits, entries, size, now)
            reservation = new_reservation(queue, shard, entries, size, now, limits)
            _create_marker(self._dir(queue) / "reservations" / reservation_name(reservation))
            cover = self._new_cover(queue, limits, stats, reservations, counted, reservation, now)
            if cover is not None:
                try:
                    _create_marker(self._cover_path(cover))
                except OSError:
                    cover = None  # no headroom this time; the reserve itself holds
            if (stale := self._headrooms.replace(queue, limits, cover, basis)) is not None:
                self._retire(stale)
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
        writers = self.writers() if self.writers is not None else 0
        not_covers = [*self._headrooms.counted(queue, reservations, []), reservation]
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

    def _place(
        self,
        reservation: Reservation,
        events: list[tuple[str, bytes]],
        now: float,
        tmp: str,
        *,
        wait: bool,
    ) -> list[Entry]:
        """Rename the written batch ``tmp`` into the shard under the shard's lock, with the
        next batch id, and count it; raises ``_LockBusy`` if the lock is held and not
        ``wait``."""
        queue, shard = reservation.queue, reservation.shard
        with _flock(self._lock(queue, f"shard-{shard}"), wait=wait) as lock:
            # The incarnation before the names: see _rewrite.
            incarnation = self._incarnation(queue)
            record = _read_record(lock)
            batch, stamp = new_batch_id(record.stamp)
            # Dirty until the batch is in and counted: a crash in between makes the next
            # reader count the names.
            _write_record(lock, stamp, None, incarnation)
            entries = new_entries(batch, events, now)
            os.rename(
                tmp, f"{os.fspath(self._shard_dir(queue, shard))}/{BatchName.of(batch, entries)}"
            )
            counts = record.counts_for(incarnation)
            if counts is not None:
                added = _Counts(len(entries), sum(len(e.body) for e in entries))
                _write_record(lock, stamp, counts + added, incarnation)
        return entries

    def _release(self, reservation: Reservation) -> None:
        if self._headrooms.granted(reservation):
            if (room := self._headrooms.done(reservation)) is not None:
                self._cover_path(room.cover).unlink(missing_ok=True)
            return
        path = self._dir(reservation.queue) / "reservations" / reservation_name(reservation)
        path.unlink(missing_ok=True)

    def _list(
        self, queue: QueueName, shard: int, max_entries: int, *, wait: bool = True
    ) -> list[Entry]:
        directory = self._shard_dir(queue, shard)
        entries: list[Entry] = []
        listed: dict[str, frozenset[str]] = {}
        # Replaced, not added to: it holds the ids of one list, and only of a shard that
        # keeps up (a backlog's thousand ids per shard would stay in memory while its
        # endpoint is down; its removals read their batches).
        self._listed[queue, shard] = listed
        lock = self._lock(queue, f"shard-{shard}")
        with _flock(lock, shared=True, wait=wait), _deleted_queue():
            found_batches = list(batches(_names(directory)))
            few = len(found_batches) <= INLINE_FILES
            if not wait and not few:
                raise _TooManyFiles(f"{len(found_batches)} batches in {directory}")
            for batch in found_batches:
                if len(entries) >= max_entries:
                    break
                name = str(batch.current)
                found = decode_batch(batch.current.batch, _read_file(directory / name))
                if few:
                    listed[name] = frozenset(e.id for e in found)
                entries += found
            return entries[:max_entries]
        return []

    def _rewrite(
        self, queue: QueueName, shard: int, changes: dict[str, list[Entry] | None]
    ) -> None:
        """Replace each named batch with these entries (None or []: delete it), crash-safely.

        Changes to batches that are not there any more are ignored.
        """
        directory = self._shard_dir(queue, shard)
        with _flock(self._lock(queue, f"shard-{shard}")) as lock, _deleted_queue():
            # Read before the names: a queue deleted and made again in between then leaves
            # a record of the old incarnation, which nobody trusts, never the other way.
            incarnation = self._incarnation(queue)
            stamp = _read_record(lock).stamp
            present = {b.current.batch: b for b in batches(_names(directory))}
            counts = {b: (p.current.count, p.current.bytes) for b, p in present.items()}
            if any(b in present for b in changes):
                _write_record(lock, stamp, None, incarnation)
            unlink: list[str] = []
            renamed = False
            for batch_id, entries in changes.items():
                batch = present.get(batch_id)
                if batch is None:
                    continue
                counts[batch_id] = (len(entries or []), sum(len(e.body) for e in entries or []))
                if entries:
                    name = BatchName.of(batch_id, entries)
                    tmp = _write_tmp(self._dir(queue) / ".tmp", encode_batch(entries))
                    tmp.rename(directory / str(name))
                    renamed = True
                    unlink += [str(n) for n in (batch.current, *batch.stale) if n != name]
                else:
                    # Stale supersets first: until the current one goes, it still wins.
                    unlink += [str(n) for n in (*batch.stale, batch.current)]
            # The renames must be durable before the names they supersede disappear.
            if renamed:
                _fsync_dir(directory)
            for old in unlink:
                (directory / old).unlink(missing_ok=True)
            _fsync_dir(directory)
            total = _Counts(sum(n for n, _ in counts.values()), sum(b for _, b in counts.values()))
            _write_record(lock, stamp, total, incarnation)

    def _read(
        self, queue: QueueName, shard: int, batch_ids: set[str], *, wait: bool = True
    ) -> dict[str, list[Entry]]:
        directory = self._shard_dir(queue, shard)
        found: dict[str, list[Entry]] = {}
        lock = self._lock(queue, f"shard-{shard}")
        with _flock(lock, shared=True, wait=wait), _deleted_queue():
            for batch in batches(_names(directory)):
                if batch.current.batch in batch_ids:
                    data = _read_file(directory / str(batch.current))
                    found[batch.current.batch] = decode_batch(batch.current.batch, data)
            return found
        return {}

    def _stats(self, queue: QueueName, now: float) -> QueueStats:
        _, shards, _ = self._meta(queue)
        # None for a queue of an older release (counted from its names until reserve, under
        # the queue's lock, gives it an incarnation).
        stats, _, _ = self._usage(queue, shards, now, self._incarnation(queue))
        return stats

    def _reclaim(self, queue: QueueName, now: float) -> int:
        directory = self._dir(queue)
        reclaimed = 0
        reservations, covers = self._markers(queue)
        for reservation in reservations:
            if reservation.expires_at <= now:
                path = directory / "reservations" / reservation_name(reservation)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    reclaimed += 1
        # Expired covers too (a writer that died with a headroom), not counted: they are
        # not reservations in the stats either.
        for cover in covers:
            if cover.expires_at <= now:
                self._cover_path(cover).unlink(missing_ok=True)
        # Leftovers of writers that died mid-write; real time, as the files' mtimes are.
        for name in _names(directory / ".tmp"):
            path = directory / ".tmp" / name
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < time.time() - TMP_MAX_AGE_S:
                    path.unlink()
        return reclaimed

    def _queues(self) -> Queues:
        found = []
        for namespace in _names(self.root):
            if namespace.startswith("."):
                continue
            for topic in _names(self.root / namespace):
                if (self.root / namespace / topic / "meta.json").exists():
                    found.append(QueueName(namespace, topic))
        return found

    # Last in the class: below this, `list` would name the method, not the builtin.
    async def list(self, queue: QueueName, shard: int, max_entries: int = 1024) -> list[Entry]:
        # On the loop unless the shard holds more than INLINE_FILES batches or a writer
        # (another process's rewrite or count) holds its lock: then in a thread.
        with contextlib.suppress(_LockBusy, _TooManyFiles):
            return self._list(queue, shard, max_entries, wait=False)
        return await self._threads.run(self._list, queue, shard, max_entries)


@functools.lru_cache(maxsize=1024)
def _queue_dir(root: Path, queue: QueueName) -> Path:
    check_queue_name(queue)
    return root / queue.namespace / queue.topic


@functools.lru_cache(maxsize=16384)
def _in_queue_dir(root: Path, queue: QueueName, name: str) -> Path:
    return _queue_dir(root, queue) / name


@functools.lru_cache(maxsize=16384)
def _lock_path(root: Path, queue: QueueName, name: str) -> Path:
    check_queue_name(queue)
    return root / ".locks" / queue.namespace / queue.topic / f"{name}.lock"


def _create_marker(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


def _names(directory: Path) -> list[str]:
    """Sorted names in a directory; none when it does not exist (a deleted queue)."""
    try:
        return sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


class _LockBusy(Exception):
    """The lock is held by another open file (``_flock(..., wait=False)``)."""


class _TooManyFiles(Exception):
    """More batch files than a read on the event loop may take (``INLINE_FILES``)."""


@contextlib.contextmanager
def _flock(path: Path, *, shared: bool = False, wait: bool = True) -> Iterator[int]:
    """An flock on ``path``; the descriptor is opened per use, so threads of one process
    exclude each other too (flock locks belong to the open file, not the process)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:  # the queue's first lock
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, operation if wait else operation | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _LockBusy(str(path)) from None
        yield fd
    finally:
        os.close(fd)  # releases the lock


def _deleted_queue() -> contextlib.suppress:
    """A queue deleted under a reader or the owner: its files vanish mid-way (``delete``
    moves the whole directory), and what was being read or rewritten is gone with it."""
    return contextlib.suppress(FileNotFoundError)


_INCARNATION = re.compile(r"[0-9a-f]{32}")
_UNKNOWN_INCARNATION = "0" * 32
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_RECORD = re.compile(
    rb"(?P<stamp>\d{20}) (?P<entries>\d{12}) (?P<bytes>\d{20}) (?P<state>[cd]) "
    rb"(?P<incarnation>[0-9a-f]{32}) (?P<boot>[0-9a-f-]{36}) (?P<again>\d{20})\n"
)


def _boot_id() -> str | None:
    """This boot of the machine (Linux); None elsewhere, and then no record is trusted."""
    try:
        found = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return found if _BOOT_ID.fullmatch(found) else None


BOOT_ID = _boot_id()


@dataclass(frozen=True)
class _Counts:
    entries: int
    bytes: int

    def __add__(self, other: _Counts) -> _Counts:
        return _Counts(self.entries + other.entries, self.bytes + other.bytes)


@dataclass(frozen=True)
class _Record:
    """What a shard's lock file holds: the last batch time, and the counts if clean."""

    stamp: int
    counts: _Counts | None = None
    incarnation: str = ""
    boot: str = ""

    def counts_for(self, incarnation: str | None) -> _Counts | None:
        """The counts, if they describe the names of ``incarnation`` on this boot."""
        if (
            self.counts is None
            or incarnation is None
            or incarnation == _UNKNOWN_INCARNATION
            or self.incarnation != incarnation
            or BOOT_ID is None
            or self.boot != BOOT_ID
        ):
            return None
        return self.counts


def _read_record(lock: int) -> _Record:
    data = os.pread(lock, 256, 0)
    # The stamp alone is what releases before the counts wrote.
    stamp = int(data[:20]) if data[:20].isdigit() else 0
    match = _RECORD.fullmatch(data)
    # The stamp twice: an older release still running on the directory rewrites only the
    # first 20 bytes when it commits (and counts nothing), which must not pass as clean.
    if match is None or match["state"] != b"c" or match["again"] != match["stamp"]:
        return _Record(stamp)
    counts = _Counts(int(match["entries"]), int(match["bytes"]))
    return _Record(stamp, counts, match["incarnation"].decode(), match["boot"].decode())


def _write_record(lock: int, stamp: int, counts: _Counts | None, incarnation: str | None) -> None:
    """Clean with ``counts``, or dirty (None: the names are changing, or are not known).

    Fixed length, so one pwrite replaces the whole record (an older stamp-only one too).
    """
    clean = counts is not None and incarnation is not None and BOOT_ID is not None
    entries, size = (counts.entries, counts.bytes) if counts is not None else (0, 0)
    record = (
        f"{stamp:020d} {entries:012d} {size:020d} {'c' if clean else 'd'} "
        f"{incarnation or _UNKNOWN_INCARNATION} {BOOT_ID or '0' * 36} {stamp:020d}\n"
    )
    os.pwrite(lock, record.encode(), 0)


# Plain descriptors, not Python file objects: a file object costs an fstat, an lseek and an
# isatty ioctl besides, and each system call in a store thread contends for the GIL.


def _read_file(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        chunks = [os.read(fd, size + 1)]
        # A read of a regular file is short only at its end: one read, unless it grew.
        if len(chunks[0]) > size:
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _new_tmp(directory: str) -> tuple[int, str]:
    """A new file of a name of its own in ``directory``, open for writing: ``mkstemp`` with
    less of its machinery (a commit makes one for every batch)."""
    while True:
        name = f"{directory}/w-{secrets.token_hex(8)}"
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), name
        except FileExistsError:
            continue


def _write_tmp(directory: Path, data: bytes, *, sync: bool = True) -> Path:
    fd, name = tempfile.mkstemp(dir=directory, prefix="w-")
    try:
        try:
            write_all_blocking(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _replace_durably(path: Path, data: bytes) -> None:
    _write_tmp(path.parent / ".tmp", data).rename(path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
