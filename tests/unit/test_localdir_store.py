"""LocalDirStore keeps the queue contract, also across processes sharing one directory."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import multiprocessing
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bucketnotify.delivery.model.queue import (
    QueueFull,
    QueueLimits,
    QueueName,
    QueueStore,
    Reservation,
    ShardStats,
    StoreFull,
)
from bucketnotify.delivery.stores._dirfiles import in_queue_dir
from bucketnotify.delivery.stores.localdir import INLINE_FILES, TMP_MAX_AGE_S, LocalDirStore
from tests.queue_contract import NOW, QUEUE, QueueStoreContract, Reopen, bodies, put


class DirectoryRaw:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, queue: QueueName, shard: int) -> Path:
        return self.root / queue.namespace / queue.topic / f"shard-{shard}"

    def names(self, queue: QueueName, shard: int) -> list[str]:
        return sorted(os.listdir(self._dir(queue, shard)))

    def read(self, queue: QueueName, shard: int, name: str) -> bytes:
        return (self._dir(queue, shard) / name).read_bytes()

    def write(self, queue: QueueName, shard: int, name: str, data: bytes) -> None:
        (self._dir(queue, shard) / name).write_bytes(data)


class TestLocalDirStore(QueueStoreContract):
    # Commits write and fsync through the kernel's ring where it has one, through threads
    # where it has none (a container's seccomp profile may refuse io_uring): both keep it.
    @pytest.fixture(params=[True, False], ids=["ring", "threads"])
    def ring(self, request: pytest.FixtureRequest) -> bool:
        return bool(request.param)

    @pytest.fixture()
    def writers(self) -> int:
        return 0  # unknown: every reserve scans

    @pytest.fixture()
    def store(self, tmp_path: Path, ring: bool, writers: int) -> LocalDirStore:
        return LocalDirStore(tmp_path / "queues", ring=ring, writers=writers)

    @pytest.fixture()
    def reopen(self, tmp_path: Path, ring: bool, writers: int) -> Reopen:
        return lambda: LocalDirStore(tmp_path / "queues", ring=ring, writers=writers)

    @pytest.fixture()
    def raw(self, tmp_path: Path) -> DirectoryRaw:
        return DirectoryRaw(tmp_path / "queues")


class TestLocalDirStoreWithHeadroom(TestLocalDirStore):
    """The contract again with the writers known, as the delivery service runs the store:
    most reserves come from a headroom, without the queue's lock or a marker."""

    @pytest.fixture()
    def writers(self) -> int:
        return 1

    # Two properties read differently under a headroom: a reserve granted from it has no
    # marker, so the stats do not count it as a reservation; its cover (never in the
    # stats) holds its room for every other writer instead.

    async def test_stats_are_exact_per_shard(self, store: QueueStore, reopen: Reopen) -> None:
        await put(store, 0, b"12", b"345")  # scans: a marker, then a cover
        await put(store, 2, b"6789")
        await store.reserve(QUEUE, 2, 3, 30, NOW)  # from the headroom
        await reopen().reserve(QUEUE, 3, 1, 1, NOW)  # another writer scans: a marker
        stats = await store.stats(QUEUE, NOW)
        assert stats.shards == {
            0: ShardStats(entries=2, bytes=5, reservations=0),
            1: ShardStats(entries=0, bytes=0, reservations=0),
            2: ShardStats(entries=1, bytes=4, reservations=0),
            3: ShardStats(entries=0, bytes=0, reservations=1),
        }
        assert (stats.entries, stats.bytes, stats.reservations) == (3, 9, 1)
        assert await reopen().stats(QUEUE, NOW) == stats

    async def test_everything_survives_into_another_instance(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        entries = await put(store, 0, b"1", b"2", b"3")
        pending: Reservation = await store.reserve(QUEUE, 1, 1, 1, NOW)
        other = reopen()
        assert await other.list(QUEUE, 0) == entries
        assert await other.queues() == [QUEUE]
        # Not a reservation in the stats, but its room is held by the cover: of the 1000
        # entries, 3 are committed and the cover holds 1000 / 2 - 3 = 497.
        assert (await other.stats(QUEUE, NOW)).reservations == 0
        with pytest.raises(QueueFull):
            await other.reserve(QUEUE, 2, 501, 501, NOW)
        await other.abort(await other.reserve(QUEUE, 2, 500, 500, NOW))
        await other.commit(pending, [("e", b"x")], NOW)  # a reservation is plain data
        assert bodies(await store.list(QUEUE, 1)) == [b"x"]

        await other.remove(QUEUE, 0, [entries[0].id])
        assert await store.list(QUEUE, 0) == entries[1:]
        await store.update(QUEUE, 0, [replace(entries[1], attempts=1)])
        assert (await other.list(QUEUE, 0))[0].attempts == 1


def _count_scans(store: LocalDirStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often ``store`` scans its queue (counts every shard under the queue's lock)."""
    scans: list[int] = []
    real = store._reservations.usage

    def counting(*args: Any, **kwargs: Any) -> Any:
        scans.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(store._reservations, "usage", counting)
    return scans


def _markers(root: Path) -> list[str]:
    return sorted(os.listdir(root / QUEUE.namespace / QUEUE.topic / "reservations"))


def _covers(root: Path) -> list[str]:
    return [m for m in _markers(root) if m.endswith(".cover")]


async def test_far_below_its_limits_a_reserve_neither_scans_nor_leaves_a_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalDirStore(tmp_path, writers=1)
    await store.create(QUEUE, 2, QueueLimits())
    await put(store, 0, b"first")  # scans, leaves a headroom and its cover
    [cover] = _markers(tmp_path)
    assert cover.endswith(".cover")
    scans = _count_scans(store, monkeypatch)
    pending = await store.reserve(QUEUE, 1, 2, 20, NOW)
    assert scans == [] and _markers(tmp_path) == [cover]
    await store.commit(pending, [("a", b"second"), ("b", b"third")], NOW)
    for n in range(20):
        await put(store, n % 2, f"more-{n}".encode())
    assert scans == []
    listed = await store.list(QUEUE, 0) + await store.list(QUEUE, 1)
    assert len(listed) == 23
    stats = await store.stats(QUEUE, NOW)
    assert (stats.entries, stats.reservations) == (23, 0)


async def test_a_headroom_counts_for_another_writer_until_it_is_used_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's headroom (40 / (2 x 2) = 10 minus the 1 committed: 9) is granted without a
    scan, so B must count it before A uses it; A itself does not count it twice."""
    a, b = (LocalDirStore(tmp_path, writers=2) for _ in range(2))
    await a.create(QUEUE, 2, QueueLimits(max_entries=40, max_bytes=10_000))
    await put(a, 0, b"first")
    with pytest.raises(QueueFull):
        await b.reserve(QUEUE, 1, 31, 31, NOW)  # 1 + 9 + 31 > 40
    mine = await b.reserve(QUEUE, 1, 20, 20, NOW)
    await b.commit(mine, [(f"b{n}", b"x") for n in range(20)], NOW)
    scans = _count_scans(a, monkeypatch)
    for n in range(9):
        await put(a, 0, f"a{n}".encode())
    assert scans == [], "all nine from the headroom"
    # 30 held: the next reserve scans, and the used-up cover must not count again.
    await put(a, 0, *(f"c{n}".encode() for n in range(10)))
    assert scans == [1]
    assert (await a.stats(QUEUE, NOW)).entries == 40
    for store in (a, b):
        with pytest.raises(QueueFull):
            await put(store, 0, b"one more")
    # The used-up cover went with the scan that replaced it; B's scan left none (full).
    assert _covers(tmp_path) == []


async def test_writers_said_too_few_still_cannot_take_the_queue_past_its_limit(
    tmp_path: Path,
) -> None:
    """Three writers each told it is the only one: each would take half the limit as its
    headroom, and three halves are more than the queue holds. A cover is checked like a
    reservation, so the third gets none, and together they commit at most the limit."""
    writers = [LocalDirStore(tmp_path, writers=1) for _ in range(3)]
    await writers[0].create(QUEUE, 1, QueueLimits(max_entries=100, max_bytes=100_000))
    committed = 0
    for n in range(80):
        for index, store in enumerate(writers):
            try:
                await put(store, 0, f"w{index}-{n}".encode())
            except QueueFull:
                continue
            committed += 1
    assert committed == (await writers[0].stats(QUEUE, NOW)).entries
    assert committed <= 100


async def test_new_limits_end_the_headroom(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path, writers=1)
    await store.create(QUEUE, 1, QueueLimits(max_entries=100, max_bytes=100_000))
    await put(store, 0, b"first")  # a headroom of 100 / 2 - 1 = 49
    # Another process lowers the limit: the meta file changes, and the next reserve sees it.
    await LocalDirStore(tmp_path).create(QUEUE, 1, QueueLimits(max_entries=2, max_bytes=100_000))
    await put(store, 0, b"second")
    with pytest.raises(QueueFull):
        await put(store, 0, b"third")
    assert _covers(tmp_path) == []


async def test_an_expired_cover_is_reclaimed_and_not_counted_as_a_reservation(
    tmp_path: Path,
) -> None:
    crashed = LocalDirStore(tmp_path, writers=1)
    await crashed.create(QUEUE, 1, QueueLimits(max_entries=10, max_bytes=100_000))
    await put(crashed, 0, b"first")  # leaves a cover of 4, then its writer dies
    survivor = LocalDirStore(tmp_path)
    with pytest.raises(QueueFull):
        await survivor.reserve(QUEUE, 0, 6, 6, NOW)  # 1 + 4 + 6 > 10
    later = NOW + QueueLimits().reservation_timeout_s + 1
    assert await survivor.reclaim(QUEUE, later) == 0  # not a reservation
    assert _markers(tmp_path) == []
    await survivor.abort(await survivor.reserve(QUEUE, 0, 9, 9, later))


@pytest.mark.parametrize(
    "queue",
    [QueueName("", "t"), QueueName("a/b", "t"), QueueName("ns", ".."), QueueName("ns", ".x")],
)
async def test_names_that_could_escape_the_root_are_refused(
    tmp_path: Path, queue: QueueName
) -> None:
    with pytest.raises(ValueError, match="cannot be stored"):
        await LocalDirStore(tmp_path).create(queue, 1, QueueLimits())


async def test_reclaim_removes_what_dead_writers_left_in_tmp(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    tmp = tmp_path / QUEUE.namespace / QUEUE.topic / ".tmp"
    old, young = tmp / "w-old", tmp / "w-young"
    old.write_bytes(b"half")
    young.write_bytes(b"being written")
    long_ago = time.time() - TMP_MAX_AGE_S - 60
    os.utime(old, (long_ago, long_ago))
    await store.reclaim(QUEUE, NOW)
    assert sorted(os.listdir(tmp)) == ["w-young"]


async def test_a_commit_to_a_deleted_queue_is_refused(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    reservation = await store.reserve(QUEUE, 0, 1, 1, NOW)
    await store.delete(QUEUE)
    with pytest.raises(LookupError):
        await store.commit(reservation, [("e", b"x")], NOW)
    await store.create(QUEUE, 1, QueueLimits())
    assert await store.list(QUEUE, 0) == []


def _writer(root: str, writer: int, count: int) -> tuple[int, int]:
    """One process: ``count`` single-event commits; returns (committed, refused)."""

    async def run() -> tuple[int, int]:
        store = LocalDirStore(Path(root))
        committed = refused = 0
        for n in range(count):
            try:
                await put(store, 0, f"w{writer}-{n:03d}".encode())
                committed += 1
            except QueueFull:
                refused += 1
        return committed, refused

    return asyncio.run(run())


async def test_processes_sharing_the_directory_keep_the_limit_and_one_order(
    tmp_path: Path,
) -> None:
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits(max_entries=100, max_bytes=1_000_000))
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        results = await asyncio.to_thread(
            pool.starmap, _writer, [(str(tmp_path), w, 40) for w in range(4)]
        )
    assert sum(c for c, _ in results) == 100
    assert sum(r for _, r in results) == 60

    listed = await store.list(QUEUE, 0, max_entries=1000)
    assert len(listed) == len(set(bodies(listed))) == 100
    assert [e.id for e in listed] == sorted(e.id for e in listed)
    # Each process's own events in the order it wrote them.
    for w in range(4):
        mine = [b for b in bodies(listed) if b.startswith(f"w{w}-".encode())]
        assert mine == sorted(mine)


def _lock_file(root: Path, shard: int) -> Path:
    return root / ".locks" / QUEUE.namespace / QUEUE.topic / f"shard-{shard}.lock"


class HeldLock:
    """A shard's lock held by another open file (a rewrite, a long read, another process).

    The test releases it once the event loop has run beside the waiting call; a thread
    releases it after ``BACKSTOP_S`` only so that a call blocking the loop on the lock ends
    the test rather than hanging it. Who released it says whether the loop ran meanwhile:
    an order, not a duration a busy machine could stretch."""

    BACKSTOP_S = 30.0

    def __init__(self, root: Path, shard: int) -> None:
        self._fd = os.open(_lock_file(root, shard), os.O_RDWR)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._guard = threading.Lock()
        self.released_by: str | None = None
        self._backstop = threading.Timer(self.BACKSTOP_S, self.release, ["the backstop"])
        self._backstop.start()

    def release(self, by: str) -> None:
        with self._guard:
            if self.released_by is None:
                self.released_by = by
                os.close(self._fd)

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self._backstop.cancel()
        self.release("the end of the test")
        self._backstop.join()


async def _loop_runs_beside(task: asyncio.Task[Any], lock: HeldLock) -> None:
    """Let the event loop run a few turns while ``task`` waits for ``lock``, then release it
    from the loop."""
    for _ in range(10):
        await asyncio.sleep(0.01)
    # Released by the backstop before these turns ran: the call blocked the loop on the lock.
    assert lock.released_by is None, "the event loop waited for the lock"
    assert not task.done(), "it did not wait for the held lock"
    lock.release("the event loop")


def _sneak_in_batch(root: Path, shard: int, body: bytes) -> None:
    """A batch renamed into place behind the store's back, as a commit does just before
    it counts it."""
    name = f"{time.time_ns():020d}-{'a' * 12}.n000001.b{len(body)}"
    line = {"i": 0, "event_id": "sneaked", "ingest_time": 0, "attempts": 0, "not_before": 0}
    line["body"] = body.decode()
    directory = root / QUEUE.namespace / QUEUE.topic / f"shard-{shard}"
    (directory / name).write_text(json.dumps(line) + "\n")


async def test_reserve_does_not_trust_the_counts_of_a_writer_that_died_mid_commit(
    tmp_path: Path,
) -> None:
    """A commit marks its shard's counts dirty before the rename and clean after; dying in
    between must make the next reader count the names, or the limit would drift."""
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 2, QueueLimits(max_entries=3, max_bytes=1000))
    await put(store, 0, b"1", b"2")
    lock = _lock_file(tmp_path, 0)
    record = lock.read_bytes()
    assert b" c " in record  # clean after a finished commit
    lock.write_bytes(record.replace(b" c ", b" d "))
    _sneak_in_batch(tmp_path, 0, b"3")

    assert (await store.stats(QUEUE, NOW)).entries == 3
    with pytest.raises(QueueFull):
        await store.reserve(QUEUE, 1, 1, 1, NOW)


async def test_counts_from_before_a_reboot_are_not_trusted(tmp_path: Path) -> None:
    """Lock files are not fsynced: after a reboot their counts may be older than the names."""
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits(max_entries=3, max_bytes=1000))
    await put(store, 0, b"1", b"2")
    lock = _lock_file(tmp_path, 0)
    record = lock.read_bytes()
    boot = record.split(b" ")[-2]
    lock.write_bytes(record.replace(boot, b"00000000-0000-0000-0000-000000000000"))
    _sneak_in_batch(tmp_path, 0, b"3")

    with pytest.raises(QueueFull):
        await store.reserve(QUEUE, 0, 1, 1, NOW)
    assert (await store.stats(QUEUE, NOW)).entries == 3
    assert boot in lock.read_bytes()  # counted, and written back for this boot


async def test_a_queue_without_incarnation_or_records_is_counted_from_its_names(
    tmp_path: Path,
) -> None:
    """No incarnation file (a ``create`` that did not finish), lock files holding only the
    batch time (records not whole): counted from the names, nothing lost."""
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits(max_entries=4, max_bytes=1000))
    first = await put(store, 0, b"1", b"2")
    (tmp_path / QUEUE.namespace / QUEUE.topic / "incarnation").unlink()
    lock = _lock_file(tmp_path, 0)
    lock.write_bytes(lock.read_bytes()[:20])

    assert (await store.stats(QUEUE, NOW)).entries == 2
    second = await put(store, 0, b"3", b"4")
    with pytest.raises(QueueFull):
        await store.reserve(QUEUE, 0, 1, 1, NOW)
    listed = await store.list(QUEUE, 0)
    assert listed == first + second  # batch ids still after the stored batch time


async def test_a_record_not_written_whole_makes_the_counts_untrusted(tmp_path: Path) -> None:
    """Its first stamp (the batch time, 20 bytes) rewritten and the rest not: the two stamps
    differ, so the counts are read from the names."""
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits(max_entries=3, max_bytes=1000))
    await put(store, 0, b"1", b"2")
    lock = _lock_file(tmp_path, 0)
    with lock.open("r+b") as file:
        file.write(f"{time.time_ns():020d}".encode())
    _sneak_in_batch(tmp_path, 0, b"3")

    with pytest.raises(QueueFull):
        await store.reserve(QUEUE, 0, 1, 1, NOW)


async def test_commits_go_through_the_kernels_ring_on_linux(tmp_path: Path) -> None:
    """Linux has io_uring or at least AIO: were both refused, commits would quietly take the
    store's threads, the slower way, and the ring variant above would test nothing new."""
    assert LocalDirStore(tmp_path).commit_io in ("io_uring", "linux-aio")
    assert LocalDirStore(tmp_path, ring=False).commit_io == "threads"


async def test_a_commit_waits_for_a_held_shard_lock_without_holding_up_the_event_loop(
    tmp_path: Path,
) -> None:
    """A commit renames under the shard's lock on the event loop only when the lock is free;
    held by someone else (a rewrite, a long read, another process), it waits in a thread."""
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    reservation = await store.reserve(QUEUE, 0, 1, 1, NOW)
    with HeldLock(tmp_path, 0) as lock:
        commit = asyncio.create_task(store.commit(reservation, [("e1", b"1")], NOW))
        await _loop_runs_beside(commit, lock)
        entries = await asyncio.wait_for(commit, 60)
    assert await store.list(QUEUE, 0) == entries
    assert (await store.stats(QUEUE, NOW)).reservations == 0


def _batch_reads(store: LocalDirStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times ``remove`` fell back to reading the batches it changes."""
    reads = [0]
    read = store._read_batches

    async def counted(*args: Any) -> Any:
        reads[0] += 1
        return await read(*args)

    monkeypatch.setattr(store, "_read_batches", counted)
    return reads


async def test_removing_whole_listed_batches_reads_no_batch_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's usual remove (all of what it just listed) deletes the batches from the
    ids that list read, and leaves the shard's counts exact and trusted."""
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    await put(store, 0, b"a", b"b")
    kept = await put(store, 0, b"c")
    reads = _batch_reads(store, monkeypatch)
    listed = await store.list(QUEUE, 0)
    await store.remove(QUEUE, 0, [e.id for e in listed[:2]])
    assert reads == [0]
    assert await store.list(QUEUE, 0) == kept
    counted = [0]
    count = store._shards.count

    def counting(*args: Any) -> Any:
        counted[0] += 1
        return count(*args)

    monkeypatch.setattr(store._shards, "count", counting)
    assert (await store.stats(QUEUE, NOW)).shards[0] == ShardStats(1, 1, 0)
    assert counted == [0], "the shard was counted from its names: its record was not clean"
    assert (await LocalDirStore(tmp_path).stats(QUEUE, NOW)).shards[0] == ShardStats(1, 1, 0)


async def test_a_batch_only_partly_removed_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    await put(store, 0, b"a", b"b", b"c")
    reads = _batch_reads(store, monkeypatch)
    listed = await store.list(QUEUE, 0)
    await store.remove(QUEUE, 0, [listed[0].id, listed[2].id])
    assert reads == [1]
    assert bodies(await store.list(QUEUE, 0)) == [b"b"]
    assert (await store.stats(QUEUE, NOW)).shards[0] == ShardStats(1, 1, 0)


async def test_a_batch_another_instance_shrank_after_the_list_is_read_again(
    tmp_path: Path,
) -> None:
    """The ids a list read are trusted only for the name it read them under: another
    instance that removed an entry since then renamed the batch, and the rest of a
    remove of the old ids must still leave what nobody removed."""
    store, other = LocalDirStore(tmp_path), LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    await put(store, 0, b"a", b"b", b"c")
    listed = await store.list(QUEUE, 0)
    await other.remove(QUEUE, 0, [listed[0].id])
    # The shard changed hands and back: the old ids now name a batch of two.
    await store.remove(QUEUE, 0, [listed[0].id, listed[1].id])
    assert bodies(await store.list(QUEUE, 0)) == [b"c"]


async def test_a_remove_waits_for_a_held_shard_lock_without_holding_up_the_event_loop(
    tmp_path: Path,
) -> None:
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    await put(store, 0, b"a")
    listed = await store.list(QUEUE, 0)
    with HeldLock(tmp_path, 0) as lock:
        remove = asyncio.create_task(store.remove(QUEUE, 0, [e.id for e in listed]))
        await _loop_runs_beside(remove, lock)
        await asyncio.wait_for(remove, 60)
    assert await store.list(QUEUE, 0) == []
    assert (await store.stats(QUEUE, NOW)).shards[0] == ShardStats(0, 0, 0)


async def test_a_removed_batch_goes_with_the_stale_superset_a_crash_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    await put(store, 0, b"a", b"b")
    entries = await store.list(QUEUE, 0)
    raw = DirectoryRaw(tmp_path)
    (superset,) = raw.names(QUEUE, 0)
    # A rewrite that crashed after its rename: the superset stays beside the new batch.
    data = raw.read(QUEUE, 0, superset)
    await store.remove(QUEUE, 0, [entries[0].id])
    raw.write(QUEUE, 0, superset, data)
    assert len(raw.names(QUEUE, 0)) == 2
    assert bodies(await store.list(QUEUE, 0)) == [b"b"]
    reads = _batch_reads(store, monkeypatch)
    await store.remove(QUEUE, 0, [entries[1].id])
    assert reads == [0]
    assert raw.names(QUEUE, 0) == []


async def test_a_list_waits_for_a_held_shard_lock_without_holding_up_the_event_loop(
    tmp_path: Path,
) -> None:
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    entries = await put(store, 0, b"a")
    with HeldLock(tmp_path, 0) as lock:
        listing = asyncio.create_task(store.list(QUEUE, 0))
        await _loop_runs_beside(listing, lock)
        assert await asyncio.wait_for(listing, 60) == entries


async def test_a_list_of_many_batch_files_reads_them_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog's files (perhaps not cached after a restart) are read off the event loop;
    the few of a shard that keeps up are read on it."""
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits())
    in_threads: list[str] = []
    run = store._threads.run

    async def counted(call: Any, *args: Any, **kwargs: Any) -> Any:
        in_threads.append(call.__name__)
        return await run(call, *args, **kwargs)

    monkeypatch.setattr(store._threads, "run", counted)
    few = [await put(store, 0, str(n).encode()) for n in range(INLINE_FILES)]
    assert bodies(await store.list(QUEUE, 0)) == [str(n).encode() for n in range(INLINE_FILES)]
    assert "list" not in in_threads
    more = await put(store, 0, b"more")
    listed = await store.list(QUEUE, 0)
    assert listed == [*(e for f in few for e in f), *more]
    assert "list" in in_threads
    # A backlog's ids are not kept: its removal reads the batches (in a thread).
    await store.remove(QUEUE, 0, [e.id for e in listed])
    assert "read" in in_threads
    assert await store.list(QUEUE, 0) == []


async def test_a_request_whose_write_fails_in_one_shard_is_queued_in_none(tmp_path: Path) -> None:
    """A full disk mid-request: the batch that fits is not placed either (all shards or
    none), nothing is left behind, and the request's reservations give their room back."""
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 2, QueueLimits())
    real = store._ring.write_all

    async def write_all(fd: int, data: bytes) -> None:
        if b"no-room" in data:
            raise OSError(errno.ENOSPC, "No space left on device")
        await real(fd, data)

    store._ring.write_all = write_all  # type: ignore[method-assign]
    fits = await store.reserve(QUEUE, 0, 1, 100, NOW)
    full = await store.reserve(QUEUE, 1, 1, 100, NOW)
    outcomes = await store.commit_together(
        [(fits, [("a", b'{"k":"fits"}')]), (full, [("b", b'{"k":"no-room"}')])], NOW
    )
    # The full disk is the contract's StoreFull, the driver's error its cause.
    assert [type(o) for o in outcomes] == [StoreFull, StoreFull]
    assert all(isinstance(o, StoreFull) and isinstance(o.__cause__, OSError) for o in outcomes)
    for reservation in (fits, full):
        await store.abort(reservation)
    assert await store.list(QUEUE, 0) == [] and await store.list(QUEUE, 1) == []
    stats = await store.stats(QUEUE, NOW)
    assert (stats.entries, stats.reservations) == (0, 0)
    assert list(in_queue_dir(tmp_path, QUEUE, ".tmp").iterdir()) == []

    both = [await store.reserve(QUEUE, shard, 1, 100, NOW) for shard in (0, 1)]
    outcomes = await store.commit_together(
        [(both[0], [("a", b'{"k":"fits"}')]), (both[1], [("c", b'{"k":"fits too"}')])], NOW
    )
    assert [[e.event_id for e in o] for o in outcomes if isinstance(o, list)] == [["a"], ["c"]]
    assert (await store.stats(QUEUE, NOW)).entries == 2
