"""The batch files of each shard of the directory store, under the shard's lock: placing a
committed batch, listing, reading, rewriting and removing batches, and counting them in the
lock file's record (``_shardrecord``). Blocking: the store decides what runs on the event
loop (``wait=False``, which raises ``LockBusy`` rather than wait) and what in a thread."""

from __future__ import annotations

import os
from pathlib import Path

from bucketnotify.delivery.model.queue import Entry, QueueName, Reservation
from bucketnotify.delivery.stores._dirfiles import (
    TooManyFiles,
    deleted_queue,
    flock,
    fsync_dir,
    in_queue_dir,
    lock_path,
    names,
    read_file,
    unlink,
    write_tmp,
)
from bucketnotify.delivery.stores._format import (
    BatchName,
    batches,
    decode_batch,
    encode_batch,
    new_batch_id,
    new_entries,
)
from bucketnotify.delivery.stores._shardrecord import (
    INCARNATION,
    Counts,
    read_record,
    write_record,
)

__all__ = ["INLINE_FILES", "ShardFiles"]

INLINE_FILES = 4
"""A ``list`` or a read of at most this many batch files runs on the event loop: the files
of a shard that keeps up are few and small. A backlog's reads (up to a thousand files,
perhaps not cached after a restart) go to a thread."""


class ShardFiles:
    """The shards of the queues under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.listed: dict[tuple[QueueName, int], dict[str, frozenset[str]]] = {}
        """Per shard, the entry ids of each batch name the last ``list`` read (see
        ``remove_listed``)."""

    def directory(self, queue: QueueName, shard: int) -> Path:
        return in_queue_dir(self.root, queue, f"shard-{shard}")

    def lock(self, queue: QueueName, shard: int) -> Path:
        return lock_path(self.root, queue, f"shard-{shard}")

    def forget(self, queue: QueueName) -> None:
        """A deleted queue's listings."""
        for key in [k for k in self.listed if k[0] == queue]:
            del self.listed[key]

    def incarnation(self, queue: QueueName) -> str | None:
        """The id of the queue's current life; None while its file is missing or damaged (a
        ``create`` that did not finish; the next reserve makes one)."""
        try:
            found = read_file(in_queue_dir(self.root, queue, "incarnation")).decode().strip()
        except FileNotFoundError:
            return None
        return found if INCARNATION.fullmatch(found) else None

    def count(self, queue: QueueName, shard: int) -> Counts:
        found = list(batches(names(self.directory(queue, shard))))
        return Counts(sum(b.current.count for b in found), sum(b.current.bytes for b in found))

    def counts(self, queue: QueueName, shard: int, incarnation: str | None) -> Counts:
        """The shard's entries and bytes, from its record, or counted when that is unknown."""
        lock = self.lock(queue, shard)
        # Shared lock: commits and rewrites change names and record under the exclusive one.
        with flock(lock, shared=True) as fd:
            counts = read_record(fd).counts_for(incarnation)
        if counts is not None:
            return counts
        with flock(lock) as fd:
            record = read_record(fd)
            counts = record.counts_for(incarnation)
            if counts is None:
                counts = self.count(queue, shard)
                write_record(fd, record.stamp, counts, incarnation)
            return counts

    def place(
        self,
        reservation: Reservation,
        events: list[tuple[str, bytes]],
        now: float,
        tmp: str,
        *,
        wait: bool,
    ) -> list[Entry]:
        """Rename the written batch ``tmp`` into the shard under the shard's lock, with the
        next batch id, and count it; raises ``LockBusy`` if the lock is held and not
        ``wait``."""
        queue, shard = reservation.queue, reservation.shard
        with flock(self.lock(queue, shard), wait=wait) as lock:
            # The incarnation before the names: see rewrite.
            incarnation = self.incarnation(queue)
            record = read_record(lock)
            batch, stamp = new_batch_id(record.stamp)
            # Dirty until the batch is in and counted: a crash in between makes the next
            # reader count the names.
            write_record(lock, stamp, None, incarnation)
            entries = new_entries(batch, events, now)
            os.rename(
                tmp, f"{os.fspath(self.directory(queue, shard))}/{BatchName.of(batch, entries)}"
            )
            counts = record.counts_for(incarnation)
            if counts is not None:
                added = Counts(len(entries), sum(len(e.body) for e in entries))
                write_record(lock, stamp, counts + added, incarnation)
        return entries

    def remove_listed(
        self, queue: QueueName, shard: int, wanted: set[str], removed: set[str]
    ) -> int | None:
        """Remove the batches ``wanted`` if the last ``list`` read each of them whole and
        all its ids are ``removed``: under the shard's lock (never waited for), without
        reading a batch file (a name stands for one set of ids: a rewrite that drops entries
        changes the count in the name, one that updates them keeps the ids). The open
        shard directory to fsync (the caller's to close), or None, having changed nothing,
        when it cannot be done so. Raises ``LockBusy`` and ``FileNotFoundError`` (the queue
        was deleted)."""
        listed = self.listed.get((queue, shard))
        if listed is None:
            return None
        directory = self.directory(queue, shard)
        with flock(self.lock(queue, shard), wait=False) as lock:
            # The incarnation before the names: see rewrite.
            incarnation = self.incarnation(queue)
            stamp = read_record(lock).stamp
            present = list(batches(names(directory)))
            going = [b for b in present if b.current.batch in wanted]
            for batch in going:
                ids = listed.get(str(batch.current))
                if ids is None or not ids <= removed:
                    return None
            path = os.fspath(directory)
            if going:
                write_record(lock, stamp, None, incarnation)
                for batch in going:
                    # Stale supersets first: until the current one goes, it still wins.
                    for name in (*batch.stale, batch.current):
                        unlink(f"{path}/{name}")
                    listed.pop(str(batch.current), None)
                kept = [b.current for b in present if b.current.batch not in wanted]
                total = Counts(sum(n.count for n in kept), sum(n.bytes for n in kept))
                write_record(lock, stamp, total, incarnation)
            # Opened under the lock: the directory the names went from, even if the queue
            # is deleted before the fsync. Fsynced also when nothing was there, so that a
            # remove retried after a failed fsync is durable when it returns.
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY)

    def rewrite(self, queue: QueueName, shard: int, changes: dict[str, list[Entry] | None]) -> None:
        """Replace each named batch with these entries (None or []: delete it), crash-safely.

        Changes to batches that are not there any more are ignored.
        """
        directory = self.directory(queue, shard)
        with flock(self.lock(queue, shard)) as lock, deleted_queue():
            # Read before the names: a queue deleted and made again in between then leaves
            # a record of the old incarnation, which nobody trusts, never the other way.
            incarnation = self.incarnation(queue)
            stamp = read_record(lock).stamp
            present = {b.current.batch: b for b in batches(names(directory))}
            counts = {b: (p.current.count, p.current.bytes) for b, p in present.items()}
            if any(b in present for b in changes):
                write_record(lock, stamp, None, incarnation)
            unlinked: list[str] = []
            renamed = False
            for batch_id, entries in changes.items():
                batch = present.get(batch_id)
                if batch is None:
                    continue
                counts[batch_id] = (len(entries or []), sum(len(e.body) for e in entries or []))
                if entries:
                    name = BatchName.of(batch_id, entries)
                    tmp = write_tmp(in_queue_dir(self.root, queue, ".tmp"), encode_batch(entries))
                    tmp.rename(directory / str(name))
                    renamed = True
                    unlinked += [str(n) for n in (batch.current, *batch.stale) if n != name]
                else:
                    # Stale supersets first: until the current one goes, it still wins.
                    unlinked += [str(n) for n in (*batch.stale, batch.current)]
            # The renames must be durable before the names they supersede disappear.
            if renamed:
                fsync_dir(directory)
            for old in unlinked:
                (directory / old).unlink(missing_ok=True)
            fsync_dir(directory)
            total = Counts(sum(n for n, _ in counts.values()), sum(b for _, b in counts.values()))
            write_record(lock, stamp, total, incarnation)

    def read(
        self, queue: QueueName, shard: int, batch_ids: set[str], *, wait: bool = True
    ) -> dict[str, list[Entry]]:
        directory = self.directory(queue, shard)
        found: dict[str, list[Entry]] = {}
        with flock(self.lock(queue, shard), shared=True, wait=wait), deleted_queue():
            for batch in batches(names(directory)):
                if batch.current.batch in batch_ids:
                    data = read_file(directory / str(batch.current))
                    found[batch.current.batch] = decode_batch(batch.current.batch, data)
            return found
        return {}

    # Last in the class: below this, `list` would name the method, not the builtin.
    def list(
        self, queue: QueueName, shard: int, max_entries: int, *, wait: bool = True
    ) -> list[Entry]:
        directory = self.directory(queue, shard)
        entries: list[Entry] = []
        listed: dict[str, frozenset[str]] = {}
        # Replaced, not added to: it holds the ids of one list, and only of a shard that
        # keeps up (a backlog's thousand ids per shard would stay in memory while its
        # endpoint is down; its removals read their batches).
        self.listed[queue, shard] = listed
        with flock(self.lock(queue, shard), shared=True, wait=wait), deleted_queue():
            found_batches = list(batches(names(directory)))
            few = len(found_batches) <= INLINE_FILES
            if not wait and not few:
                raise TooManyFiles(f"{len(found_batches)} batches in {directory}")
            for batch in found_batches:
                if len(entries) >= max_entries:
                    break
                name = str(batch.current)
                found = decode_batch(batch.current.batch, read_file(directory / name))
                if few:
                    listed[name] = frozenset(e.id for e in found)
                entries += found
            return entries[:max_entries]
        return []
