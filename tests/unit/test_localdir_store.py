"""LocalDirStore keeps the queue contract, also across processes sharing one directory."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from bucketnotify.delivery.queue import QueueFull, QueueLimits, QueueName
from bucketnotify.delivery.stores.localdir import TMP_MAX_AGE_S, LocalDirStore
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
    @pytest.fixture()
    def store(self, tmp_path: Path) -> LocalDirStore:
        return LocalDirStore(tmp_path / "queues")

    @pytest.fixture()
    def reopen(self, tmp_path: Path) -> Reopen:
        return lambda: LocalDirStore(tmp_path / "queues")

    @pytest.fixture()
    def raw(self, tmp_path: Path) -> DirectoryRaw:
        return DirectoryRaw(tmp_path / "queues")


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
