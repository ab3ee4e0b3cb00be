"""Queues in a local directory: the embedded store of a single replica, and of tests.

Layout under ``root`` (names as in ``_format``: a listing is all ``stats`` needs)::

    <namespace>/<topic>/meta.json                  shards and limits
    <namespace>/<topic>/shard-<n>/<batch name>     one file per committed batch, JSON lines
    <namespace>/<topic>/reservations/<name>        one empty file per open reservation
    <namespace>/<topic>/.tmp/                      files being written
    .locks/<namespace>/<topic>/queue.lock          flock: reserve, create, delete
    .locks/<namespace>/<topic>/shard-<n>.lock      flock: commit, list, remove, update;
                                                   holds the shard's last batch time
    .trash/                                        deleted queues on their way out

Durability: a file is written in ``.tmp``, fsynced, renamed into place and the directory
fsynced before ``commit`` returns. Rewrites (``remove``, ``update``) go the same way, and
a rewrite that shrinks a batch renames the new file in before it unlinks the old one, so
a crash leaves the old superset beside it (ignored: see ``_format``), never neither.
Reservations are not fsynced: a machine crash takes their writers with them.

Several processes: ``reserve`` checks and writes under the queue's lock, so on one machine
the limits hold exactly. Batch ids are chosen under the shard's lock from the time stored
in its lock file, so they increase in the order batches become visible, whatever the
processes' clocks say, and a lister never sees an entry appear before one it saw already.
Lock files live outside the queue directory so that ``delete`` (an atomic rename into
``.trash``) does not pull them from under a waiting process. flock works on local file
systems; a network file system is not supported.

Costs: ``reserve`` and ``stats`` read the names in every shard directory, so they grow
with the backlog (batch files, not entries); ``list`` reads only the files it returns.
Commits of one shard take turns only for the rename; the write and fsync of the file
happen outside the lock. Blocking I/O runs in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from bucketnotify.delivery.queue import (
    Entry,
    QueueLimits,
    QueueName,
    QueueNotFound,
    Queues,
    QueueStats,
    Reservation,
)
from bucketnotify.delivery.stores._format import (
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
    new_batch_id,
    new_entries,
    new_reservation,
    parse_reservation,
    reservation_name,
    updated,
    usage,
)

__all__ = ["LocalDirStore"]

TMP_MAX_AGE_S = 3600.0
"""A temporary file this old belongs to a writer that died; ``reclaim`` removes it."""


class LocalDirStore:
    """A ``QueueStore`` in the directory ``root`` (created when missing)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    async def create(self, queue: QueueName, shards: int, limits: QueueLimits) -> None:
        await asyncio.to_thread(self._create, queue, shards, limits)

    async def delete(self, queue: QueueName) -> None:
        await asyncio.to_thread(self._delete, queue)

    async def reserve(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation:
        return await asyncio.to_thread(self._reserve, queue, shard, entries, size, now)

    async def commit(
        self, reservation: Reservation, events: Sequence[tuple[str, bytes]], now: float
    ) -> list[Entry]:
        return await asyncio.to_thread(self._commit, reservation, list(events), now)

    async def abort(self, reservation: Reservation) -> None:
        await asyncio.to_thread(self._release, reservation)

    async def remove(self, queue: QueueName, shard: int, entry_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self._remove, queue, shard, set(entry_ids))

    async def update(self, queue: QueueName, shard: int, entries: Sequence[Entry]) -> None:
        await asyncio.to_thread(self._update, queue, shard, list(entries))

    async def stats(self, queue: QueueName, now: float) -> QueueStats:
        return await asyncio.to_thread(self._stats, queue, now)

    async def reclaim(self, queue: QueueName, now: float) -> int:
        return await asyncio.to_thread(self._reclaim, queue, now)

    async def queues(self) -> Queues:
        return await asyncio.to_thread(self._queues)

    # Paths

    def _dir(self, queue: QueueName) -> Path:
        check_queue_name(queue)
        return self.root / queue.namespace / queue.topic

    def _shard_dir(self, queue: QueueName, shard: int) -> Path:
        return self._dir(queue) / f"shard-{shard}"

    def _lock(self, queue: QueueName, name: str) -> Path:
        return self.root / ".locks" / queue.namespace / queue.topic / f"{name}.lock"

    # The blocking work, one worker thread per call

    def _create(self, queue: QueueName, shards: int, limits: QueueLimits) -> None:
        if shards < 1:
            raise ValueError(f"a queue needs at least one shard, not {shards}")
        directory = self._dir(queue)
        with _flock(self._lock(queue, "queue")):
            for sub in [".tmp", "reservations", *(f"shard-{n}" for n in range(shards))]:
                (directory / sub).mkdir(parents=True, exist_ok=True)
            _replace_durably(directory / "meta.json", encode_meta(shards, limits))
            # The new directories' own entries must survive a crash too.
            for path in (directory.parent, self.root):
                _fsync_dir(path)

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

    def _meta(self, queue: QueueName) -> tuple[int, QueueLimits]:
        try:
            return decode_meta((self._dir(queue) / "meta.json").read_bytes())
        except FileNotFoundError:
            raise QueueNotFound(f"queue {queue} does not exist") from None

    def _reservations(self, queue: QueueName) -> list[Reservation]:
        found = (parse_reservation(queue, n) for n in _names(self._dir(queue) / "reservations"))
        return [r for r in found if r is not None]

    def _batches(self, queue: QueueName) -> dict[int, list[Batch]]:
        found: dict[int, list[Batch]] = {}
        for name in _names(self._dir(queue)):
            if name.startswith("shard-") and name[6:].isdigit():
                shard = int(name[6:])
                # Shared lock: a rewrite renames and unlinks under the exclusive one, and a
                # listing that overlapped it could miss the batch altogether.
                with _flock(self._lock(queue, name), shared=True):
                    found[shard] = list(batches(_names(self._shard_dir(queue, shard))))
        return found

    def _usage(
        self, queue: QueueName, shards: int, now: float
    ) -> tuple[QueueStats, list[Reservation]]:
        # Reservations first: a commit renames its batch in before it drops its reservation,
        # so one not seen here is in the listing of batches that follows.
        reservations = self._reservations(queue)
        return usage(shards, self._batches(queue), reservations, now), reservations

    def _reserve(
        self, queue: QueueName, shard: int, entries: int, size: int, now: float
    ) -> Reservation:
        with _flock(self._lock(queue, "queue")):
            shards, limits = self._meta(queue)
            check_request(shards, shard, entries, size)
            stats, reservations = self._usage(queue, shards, now)
            check_room(stats, reservations, limits, entries, size, now)
            reservation = new_reservation(queue, shard, entries, size, now, limits)
            path = self._dir(queue) / "reservations" / reservation_name(reservation)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return reservation

    def _commit(
        self, reservation: Reservation, events: list[tuple[str, bytes]], now: float
    ) -> list[Entry]:
        check_commit(reservation, events)
        if not events:
            self._release(reservation)
            return []
        queue, shard = reservation.queue, reservation.shard
        directory = self._shard_dir(queue, shard)
        # The body does not depend on the batch id, so the slow part (write and fsync) needs
        # no lock; only choosing the id and the rename do.
        entries = new_entries("", events, now)
        try:
            tmp = _write_tmp(self._dir(queue) / ".tmp", encode_batch(entries))
        except FileNotFoundError:
            raise QueueNotFound(f"queue {queue} does not exist") from None
        try:
            with _flock(self._lock(queue, f"shard-{shard}")) as lock:
                batch, stamp = new_batch_id(_read_stamp(lock))
                os.pwrite(lock, f"{stamp:020d}".encode(), 0)
                entries = new_entries(batch, events, now)
                tmp.rename(directory / str(BatchName.of(batch, entries)))
            _fsync_dir(directory)
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            raise QueueNotFound(f"queue {queue} has no shard {shard} (any more)") from None
        self._release(reservation)
        return entries

    def _release(self, reservation: Reservation) -> None:
        path = self._dir(reservation.queue) / "reservations" / reservation_name(reservation)
        path.unlink(missing_ok=True)

    def _list(self, queue: QueueName, shard: int, max_entries: int) -> list[Entry]:
        directory = self._shard_dir(queue, shard)
        entries: list[Entry] = []
        with _flock(self._lock(queue, f"shard-{shard}"), shared=True), _deleted_queue():
            for batch in batches(_names(directory)):
                if len(entries) >= max_entries:
                    break
                data = (directory / str(batch.current)).read_bytes()
                entries += decode_batch(batch.current.batch, data)
            return entries[:max_entries]
        return []

    def _rewrite(
        self, queue: QueueName, shard: int, changes: dict[str, list[Entry] | None]
    ) -> None:
        """Replace each named batch with these entries (None or []: delete it), crash-safely.

        Changes to batches that are not there any more are ignored.
        """
        directory = self._shard_dir(queue, shard)
        with _flock(self._lock(queue, f"shard-{shard}")), _deleted_queue():
            present = {b.current.batch: b for b in batches(_names(directory))}
            unlink: list[str] = []
            for batch_id, entries in changes.items():
                batch = present.get(batch_id)
                if batch is None:
                    continue
                if entries:
                    name = BatchName.of(batch_id, entries)
                    tmp = _write_tmp(self._dir(queue) / ".tmp", encode_batch(entries))
                    tmp.rename(directory / str(name))
                    unlink += [str(n) for n in (batch.current, *batch.stale) if n != name]
                else:
                    # Stale supersets first: until the current one goes, it still wins.
                    unlink += [str(n) for n in (*batch.stale, batch.current)]
            # The renames must be durable before the names they supersede disappear.
            _fsync_dir(directory)
            for old in unlink:
                (directory / old).unlink(missing_ok=True)
            _fsync_dir(directory)

    def _read(self, queue: QueueName, shard: int, batch_ids: set[str]) -> dict[str, list[Entry]]:
        directory = self._shard_dir(queue, shard)
        found: dict[str, list[Entry]] = {}
        with _flock(self._lock(queue, f"shard-{shard}"), shared=True), _deleted_queue():
            for batch in batches(_names(directory)):
                if batch.current.batch in batch_ids:
                    data = (directory / str(batch.current)).read_bytes()
                    found[batch.current.batch] = decode_batch(batch.current.batch, data)
            return found
        return {}

    def _remove(self, queue: QueueName, shard: int, entry_ids: set[str]) -> None:
        wanted = {b for b in map(batch_of, entry_ids) if b is not None}
        changes: dict[str, list[Entry] | None] = {}
        for batch_id, entries in self._read(queue, shard, wanted).items():
            kept = [e for e in entries if e.id not in entry_ids]
            if len(kept) < len(entries):
                changes[batch_id] = kept
        # Read, then rewrite under a second lock: only the shard's owner removes or updates,
        # so nothing else changes these batches in between (commits only add new ones).
        if changes:
            self._rewrite(queue, shard, changes)

    def _update(self, queue: QueueName, shard: int, updates: list[Entry]) -> None:
        by_id = {e.id: e for e in updates}
        wanted = {b for b in map(batch_of, by_id) if b is not None}
        changes: dict[str, list[Entry] | None] = {}
        for batch_id, entries in self._read(queue, shard, wanted).items():
            new = [updated(e, by_id.get(e.id)) for e in entries]
            if new != entries:
                changes[batch_id] = new
        if changes:
            self._rewrite(queue, shard, changes)

    def _stats(self, queue: QueueName, now: float) -> QueueStats:
        shards, _ = self._meta(queue)
        stats, _ = self._usage(queue, shards, now)
        return stats

    def _reclaim(self, queue: QueueName, now: float) -> int:
        directory = self._dir(queue)
        reclaimed = 0
        for reservation in self._reservations(queue):
            if reservation.expires_at <= now:
                path = directory / "reservations" / reservation_name(reservation)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    reclaimed += 1
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
        return await asyncio.to_thread(self._list, queue, shard, max_entries)


def _names(directory: Path) -> list[str]:
    """Sorted names in a directory; none when it does not exist (a deleted queue)."""
    try:
        return sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


@contextlib.contextmanager
def _flock(path: Path, *, shared: bool = False) -> Iterator[int]:
    """An flock on ``path``; the descriptor is opened per use, so threads of one process
    exclude each other too (flock locks belong to the open file, not the process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # releases the lock


def _deleted_queue() -> contextlib.suppress:
    """A queue deleted under a reader or the owner: its files vanish mid-way (``delete``
    moves the whole directory), and what was being read or rewritten is gone with it."""
    return contextlib.suppress(FileNotFoundError)


def _read_stamp(lock: int) -> int:
    data = os.pread(lock, 20, 0)
    return int(data) if data.isdigit() else 0


def _write_tmp(directory: Path, data: bytes) -> Path:
    fd, name = tempfile.mkstemp(dir=directory, prefix="w-")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def _replace_durably(path: Path, data: bytes) -> None:
    _write_tmp(path.parent / ".tmp", data).rename(path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
