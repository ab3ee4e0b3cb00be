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

Costs: ``reserve`` and ``stats`` read one small record per shard, whatever the backlog: each
shard's lock file keeps its entries and bytes, changed under the shard's exclusive lock by
every commit and rewrite together with the names, so a reader under the shared lock sees the
numbers a listing would give. The record is trusted only while it is *clean*: it is marked
dirty before the names change and clean again after, and it names the queue's incarnation
and the machine's boot id. A writer that died in between (dirty), a reboot (lock files are
not fsynced, so the record may be older than the names), a queue deleted and created again
(another incarnation), a new or damaged lock file (no whole record; the record repeats its
batch time at its end to tell): the next reader counts the shard from its names once, under
the exclusive lock, and writes the record back. ``list`` reads only the files it returns;
``remove`` and ``update`` list the shard's names. A ``remove`` of whole batches the last
``list`` read (what an owner does after a push) of a shard that keeps up (at most
``INLINE_FILES`` batches) reads no batch file: the ids that list saw under each name say
what the batch holds. Commits of one shard take turns only for the rename; the write and
fsync of the file happen outside the lock.

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
queue whose ``create`` did not finish its incarnation, once), and in a thread each of those calls
gives up the GIL and must win it back from the busy event loop, which cost more CPU per
event than the calls themselves (docs/performance-notes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import cast

from bucketnotify.delivery.model.queue import (
    Entry,
    QueueLimits,
    QueueName,
    QueueNotFound,
    Queues,
    QueueStats,
    Reservation,
)
from bucketnotify.delivery.stores._dirfiles import (
    LockBusy,
    TooManyFiles,
    flock,
    fsync_dir,
    in_queue_dir,
    lock_path,
    names,
    new_tmp,
    queue_dir,
    read_file,
    replace_durably,
    unlink,
    write_tmp,
)
from bucketnotify.delivery.stores._dirreservations import DirReservations
from bucketnotify.delivery.stores._dirshards import INLINE_FILES, ShardFiles
from bucketnotify.delivery.stores._errors import raises_store_errors
from bucketnotify.delivery.stores._format import (
    batch_of,
    check_commit,
    encode_batch,
    encode_meta,
    new_entries,
    updated,
)
from bucketnotify.delivery.stores._ring import Ring
from bucketnotify.delivery.stores._threads import IOThreads

__all__ = ["INLINE_FILES", "LocalDirStore"]

TMP_MAX_AGE_S = 3600.0
"""A temporary file this old belongs to a writer that died; ``reclaim`` removes it."""

IO_THREADS = 8
"""Blocking calls at once: enough for the fsyncs of concurrent commits to overlap (the file
system journals them together), few enough to leave the two cores to the event loop."""


@raises_store_errors
class LocalDirStore:
    """A ``QueueStore`` in the directory ``root`` (created when missing): the async face of
    its shards' files (``_dirshards``) and its reservations (``_dirreservations``), which
    decides what runs on the event loop and what in the store's threads."""

    def __init__(
        self,
        root: Path,
        *,
        io_threads: int = IO_THREADS,
        ring: bool = True,
        writers: int = 0,
    ) -> None:
        """``writers``: how many processes may write to these queues now, at most (0 while
        unknown; the delivery service keeps it up to date); it sizes the headroom, and
        without it every reserve scans (see "Reserving without a scan")."""
        self.root = Path(root)
        self._threads = IOThreads("localdir-store", io_threads)
        self._ring = Ring(self._threads, enabled=ring)
        self._shards = ShardFiles(self.root)
        self._reservations = DirReservations(self.root, self._shards, writers)

    @property
    def writers(self) -> int:
        return self._reservations.writers

    @writers.setter
    def writers(self, writers: int) -> None:
        self._reservations.writers = writers

    @property
    def commit_io(self) -> str:
        """How commits write and fsync on the running loop: ``io_uring``, ``linux-aio`` or
        ``threads``."""
        return self._ring.kind

    async def create(self, queue: QueueName, shards: int, limits: QueueLimits) -> None:
        await self._threads.run(self._create, queue, shards, limits)
        if (room := self._reservations.headrooms.pop(queue)) is not None:
            self._reservations.retire(room)

    async def delete(self, queue: QueueName) -> None:
        await self._threads.run(self._delete, queue)
        self._reservations.forget(queue)
        self._shards.forget(queue)

    async def reserve(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation:
        return self._reservations.reserve(queue, shard, entries, size, now)

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
                    unlink(written)
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
            self._reservations.release(reservation)
            return []
        queue, shard = reservation.queue, reservation.shard
        directory = self._shards.directory(queue, shard)
        try:
            try:
                entries = self._shards.place(reservation, events, now, tmp, wait=False)
            except LockBusy:
                # A rewrite or a long read holds the shard: wait for it in a thread, not
                # with the event loop.
                entries = await self._threads.run(
                    self._shards.place, reservation, events, now, tmp, wait=True
                )
        except FileNotFoundError:
            unlink(tmp)
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
            self._reservations.release(reservation)
        return entries

    async def _write_durably(self, queue: QueueName, data: bytes) -> str:
        """A new file in the queue's ``.tmp`` holding ``data``, written and fsynced."""
        try:
            fd, name = new_tmp(os.fspath(in_queue_dir(self.root, queue, ".tmp")))
        except FileNotFoundError:
            raise QueueNotFound(f"queue {queue} does not exist") from None
        try:
            try:
                await self._ring.write_all(fd, data)
                await self._ring.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            unlink(name)
            raise
        return name

    async def abort(self, reservation: Reservation) -> None:
        self._reservations.release(reservation)

    async def remove(self, queue: QueueName, shard: int, entry_ids: Sequence[str]) -> None:
        removed = set(entry_ids)
        if await self._remove_listed(queue, shard, removed):
            return
        await self._change(
            queue, shard, removed, lambda entries: [e for e in entries if e.id not in removed]
        )

    async def _remove_listed(self, queue: QueueName, shard: int, removed: set[str]) -> bool:
        """Remove what the owner does nearly always remove: whole batches its last ``list``
        read, on the loop, without reading a batch file (``ShardFiles.remove_listed``);
        then the directory fsync through the ring, outside the lock. False, having changed
        nothing, when a batch is only partly removed or was not read by that list, or the
        lock is held: ``_change`` does it."""
        wanted = {b for b in map(batch_of, removed) if b is not None}
        if not wanted:
            return True  # no id a store of ours made: nothing to remove
        try:
            dir_fd = self._shards.remove_listed(queue, shard, wanted, removed)
        except LockBusy:
            return False
        except FileNotFoundError:
            return True  # the queue was deleted: its entries went with it
        if dir_fd is None:
            return False
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
            await self._threads.run(self._shards.rewrite, queue, shard, changes)

    async def stats(self, queue: QueueName, now: float) -> QueueStats:
        return self._reservations.stats(queue, now)

    async def glance(self, queue: QueueName, now: float) -> QueueStats:
        # Directory listings cost no requests: the consistent answer is cheap enough.
        try:
            return await self.stats(queue, now)
        except QueueNotFound:
            return QueueStats({})

    async def glance_many(
        self, queues: Sequence[QueueName], now: float
    ) -> dict[QueueName, QueueStats]:
        return {queue: await self.glance(queue, now) for queue in queues}

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
            with contextlib.suppress(LockBusy):
                return self._shards.read(queue, shard, batch_ids, wait=False)
        return await self._threads.run(self._shards.read, queue, shard, batch_ids)

    # The blocking work of the queue as a whole, one worker thread per call

    def _create(self, queue: QueueName, shards: int, limits: QueueLimits) -> None:
        if shards < 1:
            raise ValueError(f"a queue needs at least one shard, not {shards}")
        directory = queue_dir(self.root, queue)
        with flock(lock_path(self.root, queue, "queue")):
            for sub in [".tmp", "reservations", *(f"shard-{n}" for n in range(shards))]:
                (directory / sub).mkdir(parents=True, exist_ok=True)
            self._reservations.ensure_incarnation(queue)
            replace_durably(directory / "meta.json", encode_meta(shards, limits))
            # The new directories' own entries must survive a crash too.
            for path in (directory.parent, self.root):
                fsync_dir(path)

    def _save_delivered(self, queue: QueueName, shard: int, event_ids: list[str]) -> None:
        directory = queue_dir(self.root, queue)
        try:
            # Not fsynced: a hint (a lost or torn one costs duplicates, never a loss), saved
            # whenever a shard runs empty; the rename alone survives the process.
            written = write_tmp(directory / ".tmp", "\n".join(event_ids).encode(), sync=False)
        except FileNotFoundError:
            return  # the queue is gone
        # The rename under the queue's lock: a delete cannot take the directory between the
        # check and the rename, so a deleted queue gets nothing back.
        with flock(lock_path(self.root, queue, "queue")):
            if (directory / "meta.json").exists():
                written.rename(directory / f"delivered-{shard}")
                return
        written.unlink(missing_ok=True)

    def _load_delivered(self, queue: QueueName, shard: int) -> list[str]:
        try:
            return read_file(queue_dir(self.root, queue) / f"delivered-{shard}").decode().split()
        except (FileNotFoundError, UnicodeError):
            return []  # none, or torn by a machine crash

    def _delete(self, queue: QueueName) -> None:
        directory = queue_dir(self.root, queue)
        trash = self.root / ".trash" / uuid.uuid4().hex
        with flock(lock_path(self.root, queue, "queue")):
            trash.parent.mkdir(parents=True, exist_ok=True)
            try:
                directory.rename(trash)
            except FileNotFoundError:
                return
            fsync_dir(directory.parent)
        shutil.rmtree(trash, ignore_errors=True)

    def _reclaim(self, queue: QueueName, now: float) -> int:
        directory = queue_dir(self.root, queue)
        reclaimed = self._reservations.reclaim(queue, now)
        # Leftovers of writers that died mid-write; real time, as the files' mtimes are.
        for name in names(directory / ".tmp"):
            path = directory / ".tmp" / name
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < time.time() - TMP_MAX_AGE_S:
                    path.unlink()
        return reclaimed

    def _queues(self) -> Queues:
        found = []
        for namespace in names(self.root):
            if namespace.startswith("."):
                continue
            for topic in names(self.root / namespace):
                if (self.root / namespace / topic / "meta.json").exists():
                    found.append(QueueName(namespace, topic))
        return found

    # Last in the class: below this, `list` would name the method, not the builtin.
    async def list(self, queue: QueueName, shard: int, max_entries: int = 1024) -> list[Entry]:
        # On the loop unless the shard holds more than INLINE_FILES batches or a writer
        # (another process's rewrite or count) holds its lock: then in a thread.
        with contextlib.suppress(LockBusy, TooManyFiles):
            return self._shards.list(queue, shard, max_entries, wait=False)
        return await self._threads.run(self._shards.list, queue, shard, max_entries)
