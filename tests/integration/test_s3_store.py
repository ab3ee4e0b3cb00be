"""S3Store keeps the queue contract on the real gateway; one bucket for the module.

Every test gets a prefix of its own in the bucket. The contract runs twice: with the
gateway's page size and with pages of three keys, so that paging (and a batch's names
split over two pages) is exercised without writing thousands of objects.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from bucketnotify.delivery.model.queue import (
    Entry,
    QueueFull,
    QueueLimits,
    QueueName,
    Reservation,
    StoreRefused,
    StoreUnavailable,
)
from bucketnotify.delivery.stores import _s3objects, _s3shards
from bucketnotify.delivery.stores.s3 import S3Store
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.errors import GatewayNotFound, GatewayUnreachable
from devstack.programs import free_port
from tests.localservices import LocalService
from tests.queue_contract import NOW, QUEUE, QueueStoreContract, Reopen, bodies, put
from tests.s3 import connection

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bucket(rgw: LocalService) -> Iterator[str]:
    name = f"queues-{uuid.uuid4().hex[:10]}"
    s3 = connection(rgw).s3()
    s3.create_bucket(Bucket=name)
    yield name
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=name, Key=obj["Key"])
    s3.delete_bucket(Bucket=name)


@pytest.fixture()
async def stores(rgw: LocalService) -> AsyncIterator[Callable[..., S3Store]]:
    """``stores(bucket, prefix, via=connection, **options)``: S3Store instances of the test
    user (or of ``via``), closed after the test."""
    opened: list[S3Store] = []

    def open_store(
        bucket: str, *args: Any, via: GatewayConnection | None = None, **options: Any
    ) -> S3Store:
        opened.append(S3Store(via or connection(rgw), bucket, *args, **options))
        return opened[-1]

    yield open_store
    for store in opened:
        await store.aclose()


def count_calls(store: S3Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The S3 operations the store sends from now on, by name, in order."""
    calls: list[str] = []
    real = store._io.call

    async def counted(operation: str, request: Any) -> Any:
        calls.append(operation.split()[0])
        return await real(operation, request)

    monkeypatch.setattr(store._io, "call", counted)
    return calls


class BucketRaw:
    def __init__(self, s3: Any, bucket: str, prefix: str) -> None:
        self.s3, self.bucket, self.prefix = s3, bucket, prefix

    def _start(self, queue: QueueName, shard: int) -> str:
        return f"{self.prefix}data/{queue.namespace}/{queue.topic}/shard-{shard}/"

    def names(self, queue: QueueName, shard: int) -> list[str]:
        start = self._start(queue, shard)
        response = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=start)
        return [o["Key"][len(start) :] for o in response.get("Contents", [])]

    def read(self, queue: QueueName, shard: int, name: str) -> bytes:
        key = self._start(queue, shard) + name
        data: bytes = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return data

    def write(self, queue: QueueName, shard: int, name: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self._start(queue, shard) + name, Body=data)


class TestS3Store(QueueStoreContract):
    @pytest.fixture(params=[1000, 3], ids=["pages-1000", "pages-3"])
    def page(self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
        monkeypatch.setattr(_s3objects, "LIST_PAGE", request.param)
        return int(request.param)

    @pytest.fixture()
    def prefix(self, page: int) -> str:
        return f"t-{uuid.uuid4().hex[:10]}/"

    @pytest.fixture()
    async def store(self, stores: Callable[..., S3Store], bucket: str, prefix: str) -> S3Store:
        store = stores(bucket, prefix)
        await store.ensure_bucket()
        return store

    @pytest.fixture()
    def reopen(self, stores: Callable[..., S3Store], bucket: str, prefix: str) -> Reopen:
        return lambda: stores(bucket, prefix)

    @pytest.fixture()
    def raw(self, rgw: LocalService, bucket: str, prefix: str) -> BucketRaw:
        return BucketRaw(connection(rgw).s3(), bucket, prefix)


async def test_ensure_bucket_is_idempotent(
    rgw: LocalService, stores: Callable[..., S3Store]
) -> None:
    name = f"queues-{uuid.uuid4().hex[:10]}"
    store = stores(name)
    with pytest.raises(StoreRefused) as missing:
        await store.queues()  # no bucket yet: an error, not an empty store
    assert isinstance(missing.value.__cause__, GatewayNotFound)
    try:
        await store.ensure_bucket()
        await store.ensure_bucket()
        assert await stores(name).queues() == []
    finally:
        connection(rgw).s3().delete_bucket(Bucket=name)


async def test_commit_is_one_put_and_one_delete(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stores(bucket, f"t-{uuid.uuid4().hex[:10]}/")
    await store.create(QUEUE, 2, QueueLimits())
    reservation = await store.reserve(QUEUE, 0, 100, 100 * 20, NOW)
    calls = count_calls(store, monkeypatch)
    events = [(f"e{n}", f"body-{n:03d}".encode()) for n in range(100)]
    await store.commit(reservation, events, NOW)
    assert calls == ["PutObject", "DeleteObject"]

    calls.clear()
    listed = await store.list(QUEUE, 0)
    assert bodies(listed) == [b for _, b in events]
    assert calls == ["ListObjectsV2"]  # its own batch: not read back

    calls.clear()
    await store.remove(QUEUE, 0, [e.id for e in listed[:50]])
    assert calls == ["PutObject", "DeleteObject"]
    calls.clear()
    await store.remove(QUEUE, 0, [e.id for e in listed[50:]])
    assert calls == ["DeleteObject"]
    assert await store.list(QUEUE, 0) == []


async def test_reserves_waiting_for_their_turn_share_one_scan_and_keep_the_limit(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ingest's group commit reserves every shard it touches at once: the reserves
    that queue up behind one scan are checked together against the next, one by one."""
    store = stores(bucket, f"t-{uuid.uuid4().hex[:10]}/")
    await store.create(QUEUE, 8, QueueLimits(max_entries=4, max_bytes=1000))
    await put(store, 0, b"committed")
    calls = count_calls(store, monkeypatch)
    results = await asyncio.gather(
        *(store.reserve(QUEUE, shard, 1, 1, NOW) for shard in range(1, 7)),
        return_exceptions=True,
    )
    granted = [r for r in results if isinstance(r, Reservation)]
    assert [r.shard for r in granted] == [1, 2, 3]  # 1 committed + 3 reserved = 4 of 4
    assert all(isinstance(r, QueueFull) for r in results[3:])
    # The first alone (the others were not waiting yet), then the other five together;
    # each turn scans twice (two LISTs each): before its markers and after them.
    assert calls.count("ListObjectsV2") == 8
    assert calls.count("PutObject") == 3
    assert (await store.stats(QUEUE, NOW)).reservations == 3


async def test_a_rewrite_cut_short_is_finished_by_the_next_removal(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stores(bucket, f"t-{uuid.uuid4().hex[:10]}/")
    await store.create(QUEUE, 1, QueueLimits())
    entries = await put(store, 0, b"1", b"2", b"3")
    await store.list(QUEUE, 0)

    async def unreachable(key: str) -> None:
        raise GatewayUnreachable("DeleteObject: the gateway did not answer")

    # The rest is written under its new name, the old name's delete fails.
    monkeypatch.setattr(store._io, "delete", unreachable)
    with pytest.raises(StoreUnavailable):
        await store.remove(QUEUE, 0, [entries[0].id])
    monkeypatch.undo()

    # Straight on, without a list: the old name must go with the batch, or it comes back.
    await store.remove(QUEUE, 0, [entries[1].id, entries[2].id])
    assert await store.list(QUEUE, 0) == []
    assert await stores(bucket, store.prefix).list(QUEUE, 0) == []


def record_lists(store: S3Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The prefixes of the LISTs the store sends from now on, relative to the queue's data."""
    prefixes: list[str] = []
    real = store._io.call
    data = f"{store.prefix}data/{QUEUE.namespace}/{QUEUE.topic}/"

    async def recorded(operation: str, request: Any) -> Any:
        name, _, prefix = operation.partition(" ")
        if name == "ListObjectsV2":
            prefixes.append(prefix.removeprefix(data))
        return await real(operation, request)

    monkeypatch.setattr(store._io, "call", recorded)
    return prefixes


async def test_shards_listing_at_once_share_one_list(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's shards of a queue woken together (by one group commit) list with one
    LIST of all the queue's shards, each reading only its own batches from it."""
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    writer, owner = stores(bucket, prefix), stores(bucket, prefix)
    await writer.create(QUEUE, 4, QueueLimits())
    written = [await put(writer, shard, f"s{shard}".encode()) for shard in range(4)]
    lists = record_lists(owner, monkeypatch)
    calls = count_calls(owner, monkeypatch)
    listed = await asyncio.gather(*(owner.list(QUEUE, shard) for shard in range(4)))
    assert listed == written
    assert lists == ["shard-"]
    assert sorted(calls) == ["GetObject"] * 4 + ["ListObjectsV2"]


async def test_a_list_asked_for_after_a_commit_finds_it_while_other_shards_share_lists(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared LIST serves only the shards that asked before it was sent: a shard woken
    by a commit after that must get a LIST of its own, or the commit waits unseen."""
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    writer = stores(bucket, prefix, writers=1)  # commits of one PUT: they land fast
    owner = stores(bucket, prefix)
    await writer.create(QUEUE, 4, QueueLimits())
    lists = record_lists(owner, monkeypatch)
    real_page = owner._io.client.list_page

    async def slow_answers(prefix: str, max_keys: int, token: str | None) -> Any:
        # Answers that take long to arrive: a LIST in flight, sent before a commit landed.
        page = await real_page(prefix, max_keys, token)
        await asyncio.sleep(0.02)
        return page

    monkeypatch.setattr(owner._io.client, "list_page", slow_answers)

    async def shard_owner(shard: int) -> None:
        for n in range(10):
            await asyncio.sleep(0.003 * ((n * 7 + shard * 3) % 5))
            committed = await put(writer, shard, f"s{shard}-{n}".encode())
            listed = await owner.list(QUEUE, shard)
            assert listed == committed, f"shard {shard} round {n}"
            await owner.remove(QUEUE, shard, [e.id for e in listed])

    await asyncio.gather(*(shard_owner(shard) for shard in range(4)))
    assert set(lists) == {"shard-"}


async def test_a_queue_holding_more_than_a_shared_list_is_listed_shard_by_shard(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog does not fit one shared LIST: shards whose batches it cut off list on
    their own, and the queue lists per shard for a while instead of wasting shared LISTs."""
    monkeypatch.setattr(_s3shards, "SHARED_LIST_KEYS", 4)
    monkeypatch.setattr(_s3shards, "CROWDED_S", 600.0)  # a slow machine stays within it
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    store = stores(bucket, prefix)
    await store.create(QUEUE, 3, QueueLimits())
    written: dict[int, list[Entry]] = {shard: [] for shard in range(3)}
    for n in range(3):
        for shard in range(3):
            written[shard] += await put(store, shard, f"s{shard}-{n}".encode())
    lists = record_lists(store, monkeypatch)
    listed = await asyncio.gather(*(store.list(QUEUE, shard) for shard in range(3)))
    assert listed == [written[shard] for shard in range(3)]
    # The shared page holds shard 0's three batches and one of shard 1's: shard 0 is
    # served from it, the other two list on their own.
    assert sorted(lists) == ["shard-", "shard-1/", "shard-2/"]
    lists.clear()
    listed = await asyncio.gather(*(store.list(QUEUE, shard) for shard in range(3)))
    assert listed == [written[shard] for shard in range(3)]
    assert sorted(lists) == ["shard-0/", "shard-1/", "shard-2/"]


async def test_the_bucket_holds_the_documented_layout(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str
) -> None:
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    store = stores(bucket, prefix)
    await store.create(QUEUE, 2, QueueLimits())
    (entry,) = await put(store, 1, b"{}")
    reservation = await store.reserve(QUEUE, 0, 1, 1, NOW)
    s3 = connection(rgw).s3()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    batch = entry.id.rpartition(".")[0]
    assert sorted(keys) == [
        f"{prefix}data/team-a/orders/reservations/{reservation.id}.s0.n1.b1"
        f".e{round(reservation.expires_at * 1000)}",
        f"{prefix}data/team-a/orders/shard-1/{batch}.n000001.b2",
        f"{prefix}meta/team-a/orders",
    ]


async def test_far_below_its_limits_a_commit_is_one_put(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the writers known, the first reserve scans and leaves headroom; reserves within
    it need neither the LISTs nor a marker, so reserve and commit are one PUT together."""
    store = stores(bucket, f"t-{uuid.uuid4().hex[:10]}/", writers=2)
    await store.create(QUEUE, 2, QueueLimits())
    await put(store, 0, b"first")  # scans, sets the headroom
    calls = count_calls(store, monkeypatch)
    reservation = await store.reserve(QUEUE, 1, 2, 20, NOW)
    assert calls == [], "no LIST, no marker"
    await store.commit(reservation, [("a", b"second"), ("b", b"third")], NOW)
    assert calls == ["PutObject"]
    assert bodies(await store.list(QUEUE, 0)) + bodies(await store.list(QUEUE, 1)) == [
        b"first",
        b"second",
        b"third",
    ]
    stats = await store.stats(QUEUE, NOW)
    assert (stats.entries, stats.reservations) == (3, 0)


async def test_every_replica_has_a_headroom_of_its_own_at_once(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other replica's cover does not use up this one's share: after one scan each,
    both commit with one PUT, and the limits still hold exactly (both covers counted)."""
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    a, b = (stores(bucket, prefix, writers=2) for _ in range(2))
    await a.create(QUEUE, 2, QueueLimits(max_entries=40, max_bytes=10_000))
    await put(a, 0, b"a0")  # scans; A's cover: 40 / (2 x 2) - 1 = 9
    await put(b, 1, b"b0")  # scans; B's cover: 10 - 2 = 8 (A's cover not subtracted)
    calls = {store: count_calls(store, monkeypatch) for store in (a, b)}
    for n in range(1, 8):
        await put(a, 0, f"a{n}".encode())
        await put(b, 1, f"b{n}".encode())
    assert calls[a] == calls[b] == ["PutObject"] * 7, "from their headrooms"
    # 16 committed; A's scan counts B's cover (8) in full and its own by its grants (none
    # in flight): room for 16 more, not 17.
    with pytest.raises(QueueFull):
        await a.reserve(QUEUE, 1, 17, 17, NOW)
    await a.abort(await a.reserve(QUEUE, 1, 16, 16, NOW))


async def test_a_batch_its_writer_lists_is_not_read_back_unless_rewritten_since(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replica that committed a batch lists it with the LIST alone (no GET). Once
    another replica has rewritten it (an update after a failed push: same name, new
    content), the writer reads the stored batch, not what it wrote."""
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    writer, other = (stores(bucket, prefix) for _ in range(2))
    await writer.create(QUEUE, 2, QueueLimits())
    written = await put(writer, 0, b"first", b"second")
    calls = count_calls(writer, monkeypatch)
    assert await writer.list(QUEUE, 0) == written
    assert calls == ["ListObjectsV2"]

    await put(writer, 1, b"third")
    [listed] = await other.list(QUEUE, 1)
    retried = replace(listed, attempts=1, not_before=NOW + 60)
    await other.update(QUEUE, 1, [retried])
    calls.clear()
    assert await writer.list(QUEUE, 1) == [retried]
    assert calls == ["ListObjectsV2", "GetObject"]


async def test_a_survey_of_idle_queues_is_a_list_per_namespace_and_a_backlog_a_list_per_queue(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``glance_many`` of 30 idle queues in two namespaces: two LISTs, not 30. With pages
    of three keys and a queue of ten batch objects first in the namespace, the listing
    stops after as many pages as queues asked (3) and those it did not get past are
    glanced on their own: 3 + 4 + 1 + 1 LISTs, the same answers as a glance each."""
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    store = stores(bucket, prefix)
    idle = [QueueName("idle", f"q{i:02}") for i in range(29)] + [QueueName("other", "q")]
    for queue in idle:
        await store.create(queue, 2, QueueLimits())
    calls = count_calls(store, monkeypatch)
    glanced = await store.glance_many(idle, NOW)
    assert calls == ["ListObjectsV2"] * 2
    assert all(stats.entries == 0 for stats in glanced.values())

    monkeypatch.setattr(_s3objects, "LIST_PAGE", 3)
    crowded = [QueueName("crowded", name) for name in ("a", "b", "c")]
    for queue in crowded:
        await store.create(queue, 1, QueueLimits())
    for n in range(10):
        await put(store, 0, str(n).encode(), queue=crowded[0])
    await put(store, 0, b"b", queue=crowded[1])
    await put(store, 0, b"c", queue=crowded[2])
    calls.clear()
    glanced = await store.glance_many(crowded, NOW)
    assert calls == ["ListObjectsV2"] * (3 + 4 + 1 + 1)
    assert [glanced[q].entries for q in crowded] == [10, 1, 1]
    for queue in crowded:
        assert glanced[queue] == await store.glance(queue, NOW)


async def test_reserves_from_the_headroom_never_take_two_writers_past_the_limit(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str
) -> None:
    """Two replicas writing one queue of 40 entries as fast as they can: together they
    commit exactly 40, then both are refused, though most reserves skipped the scan.
    Reserves of the two that collide on the last entries may both step back: a replica
    refused while the queue still has room tries again (the gateway would)."""
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    replicas = [stores(bucket, prefix, writers=2) for _ in range(2)]
    await replicas[0].create(QUEUE, 4, QueueLimits(max_entries=40, max_bytes=10_000))
    committed = [0, 0]

    async def fill(index: int) -> None:
        store = replicas[index]
        for n in range(100):
            try:
                await put(store, n % 4, f"r{index}-{n}".encode())
            except QueueFull:
                if (await store.stats(QUEUE, NOW)).entries >= 40:
                    return
                continue
            committed[index] += 1

    await asyncio.gather(fill(0), fill(1))
    assert sum(committed) == 40, committed
    assert (await replicas[0].stats(QUEUE, NOW)).entries == 40
    for store in replicas:
        with pytest.raises(QueueFull):
            await put(store, 0, b"one more")


async def test_two_replicas_reserving_the_last_room_at_the_same_instant_do_not_both_get_it(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both scan before either has PUT its marker, so both first see room for one more:
    the scan after the PUTs shows each the other's marker, and the limit holds."""
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    replicas = [stores(bucket, prefix) for _ in range(2)]
    await replicas[0].create(QUEUE, 2, QueueLimits(max_entries=2, max_bytes=1000))
    await put(replicas[0], 0, b"committed")
    both_scanned = asyncio.Barrier(2)
    held_back: set[int] = set()
    for index, store in enumerate(replicas):
        real = store._reservations.put_marker

        async def after_both_scans(
            reservation: Reservation, real: Any = real, index: int = index, **kwargs: Any
        ) -> None:
            # Only each one's first marker: a retry may find the other already done.
            if index not in held_back:
                held_back.add(index)
                await both_scanned.wait()
            await real(reservation, **kwargs)

        monkeypatch.setattr(store._reservations, "put_marker", after_both_scans)
    results = await asyncio.gather(
        *(store.reserve(QUEUE, 1, 1, 1, NOW) for store in replicas), return_exceptions=True
    )
    granted = [r for r in results if isinstance(r, Reservation)]
    assert len(granted) <= 1, results
    assert all(isinstance(r, QueueFull) for r in results if not isinstance(r, Reservation))
    stats = await replicas[0].stats(QUEUE, NOW)
    assert stats.entries + stats.reservations <= 2
    monkeypatch.undo()
    # Stepping back left no marker behind: what the limit allows can still be reserved.
    if not granted:
        await put(replicas[1], 1, b"2")
    else:
        await replicas[0].commit(granted[0], [("e2", b"2")], NOW)
    assert (await replicas[0].stats(QUEUE, NOW)).entries == 2
    with pytest.raises(QueueFull):
        await put(replicas[1], 1, b"third")


async def test_a_headroom_counts_for_the_other_replicas_until_it_is_used_up(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's headroom (limit / (2 x 2) = 10 minus the 1 committed: 9) is granted without any
    request, so B must count it before A uses it; A itself does not count it twice."""
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    a, b = (stores(bucket, prefix, writers=2) for _ in range(2))
    await a.create(QUEUE, 2, QueueLimits(max_entries=40, max_bytes=10_000))
    await put(a, 0, b"first")  # scans; headroom and its cover: 9 entries
    with pytest.raises(QueueFull):
        await b.reserve(QUEUE, 1, 31, 31, NOW)  # 1 + 9 + 31 > 40
    mine = await b.reserve(QUEUE, 1, 20, 20, NOW)
    await b.commit(mine, [(f"b{n}", b"x") for n in range(20)], NOW)
    calls = count_calls(a, monkeypatch)
    for n in range(9):
        await put(a, 0, f"a{n}".encode())
    assert calls == ["PutObject"] * 9, "all nine from the headroom"
    # 30 held: the next reserve scans, and the used-up cover must not count again.
    await put(a, 0, *(f"c{n}".encode() for n in range(10)))
    assert (await a.stats(QUEUE, NOW)).entries == 40
    for store in (a, b):
        with pytest.raises(QueueFull):
            await put(store, 0, b"one more")
    s3 = connection(rgw).s3()
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}data/")
    assert [o["Key"] for o in listed["Contents"] if "/reservations/" in o["Key"]] == []


async def test_refusals_and_silence_of_the_gateway_are_our_errors_without_the_secret(
    rgw: LocalService, stores: Callable[..., S3Store], bucket: str
) -> None:
    """Each of the four requests the store sends itself (LIST, PUT, GET, DELETE): wrong keys
    are access denied, and no message holds the secret; a port nothing listens on is
    unreachable (the ingest answers 503 to that, which the gateway retries)."""
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    wrong_secret = "not-the-secret-0123456789abcdef0123456789"
    refused = stores(bucket, prefix, via=connection(rgw, secret=wrong_secret))
    nobody = replace(connection(rgw), endpoint=f"http://127.0.0.1:{free_port()}")
    silent = stores(bucket, prefix, via=nobody)
    failures: tuple[tuple[S3Store, type[Exception]], ...] = (
        (refused, StoreRefused),
        (silent, StoreUnavailable),
    )
    for store, error in failures:
        calls = {
            "ListObjectsV2": store.queues(),
            "PutObject": store.create(QUEUE, 1, QueueLimits()),
            "GetObject": store.load_delivered(QUEUE, 0),
            "DeleteObject": store.delete(QUEUE),
        }
        for operation, call in calls.items():
            with pytest.raises(error) as raised:
                await call
            assert str(raised.value).startswith(operation), raised.value
            assert wrong_secret not in str(raised.value)


async def test_a_gateway_with_a_private_ca_is_reached_over_https_with_aws_ca_bundle(
    rgw: LocalService,
    stores: Callable[..., S3Store],
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store verifies the gateway with the CA boto3 would use (``AWS_CA_BUNDLE``, what
    the chart's ``gateway.caConfigMap`` sets); without it the private CA is refused."""
    prefix = f"t-{uuid.uuid4().hex[:10]}/"
    tls = replace(connection(rgw), endpoint=rgw["RGW_TLS_ENDPOINT"])
    monkeypatch.setenv("AWS_CA_BUNDLE", rgw["RGW_CA_PEM"])
    writer = stores(bucket, prefix, via=tls)
    await writer.create(QUEUE, 1, QueueLimits())
    await put(writer, 0, b"over tls")
    reader = stores(bucket, prefix, via=tls)  # reads the batch back: GET over TLS
    [entry] = await reader.list(QUEUE, 0)
    assert entry.body == b"over tls"
    await reader.remove(QUEUE, 0, [entry.id])
    assert await writer.queues() == [QUEUE]
    monkeypatch.delenv("AWS_CA_BUNDLE")
    with pytest.raises(StoreUnavailable):
        await stores(bucket, prefix, via=tls).queues()
