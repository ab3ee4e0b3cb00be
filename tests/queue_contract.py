"""The behaviour every QueueStore keeps; each store's test module subclasses the contract.

A subclass provides three fixtures:

- ``store``: a store on fresh, empty storage;
- ``reopen``: makes another instance on the same storage, as another process would;
- ``raw``: reads and writes the store's batch objects by name, to set up what a crash in
  the middle of a rewrite leaves behind.

Times are given through the ``now`` arguments: nothing here sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

import pytest

from bucketnotify.delivery.model.dead_letters import dead_letter_queue
from bucketnotify.delivery.model.queue import (
    Entry,
    QueueFull,
    QueueLimits,
    QueueName,
    QueueNotFound,
    QueueStore,
    Reservation,
    ShardStats,
)

QUEUE = QueueName("team-a", "orders")
OTHER = QueueName("team-b", "invoices")
NOW = 1_700_000_000.0
LIMITS = QueueLimits(max_entries=1000, max_bytes=1_000_000, reservation_timeout_s=30.0)


class Raw(Protocol):
    """Direct access to a store's batch objects (names as in stores/_format.py)."""

    def names(self, queue: QueueName, shard: int) -> list[str]: ...

    def read(self, queue: QueueName, shard: int, name: str) -> bytes: ...

    def write(self, queue: QueueName, shard: int, name: str, data: bytes) -> None: ...


Reopen = Callable[[], QueueStore]


async def put(
    store: QueueStore,
    shard: int,
    *bodies: bytes,
    queue: QueueName = QUEUE,
    now: float = NOW,
) -> list[Entry]:
    """Reserve exactly what the events need and commit them; event ids are the bodies."""
    reservation = await store.reserve(queue, shard, len(bodies), sum(map(len, bodies)), now)
    return await store.commit(reservation, [(f"ev-{b.hex()}", b) for b in bodies], now)


def bodies(entries: Sequence[Entry]) -> list[bytes]:
    return [e.body for e in entries]


class QueueStoreContract:
    @pytest.fixture(autouse=True)
    async def _queues(self, store: QueueStore) -> None:
        await store.create(QUEUE, 4, LIMITS)

    # Writing and reading

    async def test_commit_appends_in_commit_order(self, store: QueueStore) -> None:
        first = await put(store, 0, b"a1", b"a2", b"a3", now=NOW)
        second = await put(store, 0, b"b1", now=NOW + 1)
        third = await put(store, 0, b"c1", b"c2", now=NOW + 2)

        listed = await store.list(QUEUE, 0)
        assert listed == first + second + third
        assert bodies(listed) == [b"a1", b"a2", b"a3", b"b1", b"c1", b"c2"]
        assert [e.id for e in listed] == sorted(e.id for e in listed)
        assert len({e.id for e in listed}) == 6
        assert listed[0].event_id == f"ev-{b'a1'.hex()}"
        assert [e.ingest_time for e in listed] == [NOW] * 3 + [NOW + 1] + [NOW + 2] * 2
        assert all(e.attempts == 0 and e.not_before == 0.0 for e in listed)

    async def test_bodies_come_back_byte_for_byte(self, store: QueueStore) -> None:
        odd = [b'{"k": "\xc3\xa9t\xc3\xa9"}', b"\xff\xfe\x00\xed\xa0\x80", b"", b"line\nbreak\r\n"]
        await put(store, 1, *odd)
        assert bodies(await store.list(QUEUE, 1)) == odd

    async def test_list_gives_the_oldest_max_entries(self, store: QueueStore) -> None:
        await put(store, 0, b"1", b"2", b"3")
        await put(store, 0, b"4", b"5")
        assert bodies(await store.list(QUEUE, 0, max_entries=2)) == [b"1", b"2"]
        assert bodies(await store.list(QUEUE, 0, max_entries=4)) == [b"1", b"2", b"3", b"4"]
        assert len(await store.list(QUEUE, 0, max_entries=100)) == 5

    async def test_shards_are_isolated(self, store: QueueStore) -> None:
        zero = await put(store, 0, b"z1", b"z2")
        one = await put(store, 1, b"o1")
        assert await store.list(QUEUE, 0) == zero
        assert await store.list(QUEUE, 1) == one
        assert await store.list(QUEUE, 2) == []

        await store.remove(QUEUE, 1, [zero[0].id])  # an id of another shard: ignored
        await store.update(QUEUE, 1, [replace(zero[1], attempts=5)])
        assert await store.list(QUEUE, 0) == zero

    async def test_queues_are_isolated(self, store: QueueStore) -> None:
        await store.create(OTHER, 4, LIMITS)
        mine = await put(store, 0, b"mine")
        await put(store, 0, b"theirs", queue=OTHER)
        assert await store.list(QUEUE, 0) == mine
        assert bodies(await store.list(OTHER, 0)) == [b"theirs"]

    # Reservations and limits

    async def test_abort_releases_the_room(self, store: QueueStore) -> None:
        await store.create(QUEUE, 4, QueueLimits(max_entries=3, max_bytes=1000))
        held = await store.reserve(QUEUE, 0, 3, 10, NOW)
        with pytest.raises(QueueFull):
            await store.reserve(QUEUE, 1, 1, 1, NOW)
        await store.abort(held)
        await store.abort(held)  # twice is fine
        await store.reserve(QUEUE, 1, 1, 1, NOW)

    async def test_entry_limit_counts_entries_and_other_writers_reservations(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        await store.create(QUEUE, 4, QueueLimits(max_entries=5, max_bytes=1000))
        other = reopen()
        await put(store, 0, b"1", b"2")
        await other.reserve(QUEUE, 1, 2, 2, NOW)  # another writer's open reservation
        await store.reserve(QUEUE, 2, 1, 1, NOW)  # 5 of 5
        for writer in (store, other):
            with pytest.raises(QueueFull):
                await writer.reserve(QUEUE, 3, 1, 1, NOW)

    async def test_byte_limit_counts_bytes_and_other_writers_reservations(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        await store.create(QUEUE, 4, QueueLimits(max_entries=100, max_bytes=100))
        other = reopen()
        await put(store, 0, b"x" * 40)
        await other.reserve(QUEUE, 1, 1, 50, NOW)
        await store.reserve(QUEUE, 2, 1, 10, NOW)  # exactly 100
        for writer in (store, other):
            with pytest.raises(QueueFull):
                await writer.reserve(QUEUE, 3, 1, 1, NOW)

    async def test_a_reservation_larger_than_the_queue_never_fits(self, store: QueueStore) -> None:
        await store.create(QUEUE, 4, QueueLimits(max_entries=10, max_bytes=100))
        with pytest.raises(QueueFull):
            await store.reserve(QUEUE, 0, 11, 1, NOW)
        with pytest.raises(QueueFull):
            await store.reserve(QUEUE, 0, 1, 101, NOW)

    async def test_committing_turns_the_reservation_into_entries(self, store: QueueStore) -> None:
        await store.create(QUEUE, 4, QueueLimits(max_entries=3, max_bytes=1000))
        reservation = await store.reserve(QUEUE, 0, 3, 3, NOW)
        # Fewer than reserved is fine; the rest of the room is released with it.
        await store.commit(reservation, [("e1", b"1")], NOW)
        stats = await store.stats(QUEUE, NOW)
        assert (stats.entries, stats.reservations) == (1, 0)
        await store.reserve(QUEUE, 0, 2, 2, NOW)

    async def test_a_commit_beyond_its_reservation_is_refused(self, store: QueueStore) -> None:
        reservation = await store.reserve(QUEUE, 0, 1, 2, NOW)
        with pytest.raises(ValueError, match="exceeds"):
            await store.commit(reservation, [("e1", b"1"), ("e2", b"2")], NOW)
        with pytest.raises(ValueError, match="exceeds"):
            await store.commit(reservation, [("e1", b"123")], NOW)
        assert await store.list(QUEUE, 0) == []

    async def test_an_empty_commit_releases_the_reservation(self, store: QueueStore) -> None:
        reservation = await store.reserve(QUEUE, 0, 1, 1, NOW)
        assert await store.commit(reservation, [], NOW) == []
        assert (await store.stats(QUEUE, NOW)).reservations == 0

    async def test_an_expired_reservation_stops_counting_and_is_reclaimed(
        self, store: QueueStore
    ) -> None:
        await store.create(QUEUE, 4, QueueLimits(max_entries=2, max_bytes=100))
        stale = await store.reserve(QUEUE, 0, 2, 2, NOW)
        assert stale.expires_at == pytest.approx(NOW + 30.0)
        with pytest.raises(QueueFull):
            await store.reserve(QUEUE, 1, 1, 1, NOW + 29.9)
        assert (await store.stats(QUEUE, NOW + 29.9)).reservations == 1
        assert (await store.stats(QUEUE, NOW + 30.0)).reservations == 0

        assert await store.reclaim(QUEUE, NOW + 29.9) == 0
        fresh = await store.reserve(QUEUE, 1, 2, 2, NOW + 30.0)  # the stale one is ignored
        assert await store.reclaim(QUEUE, NOW + 31.0) == 1
        assert await store.reclaim(QUEUE, NOW + 31.0) == 0
        # The live one stays, and counts.
        assert (await store.stats(QUEUE, NOW + 31.0)).reservations == 1
        assert fresh.expires_at == pytest.approx(NOW + 60.0)

    async def test_a_commit_after_expiry_still_lands(self, store: QueueStore) -> None:
        # The writer was slow, not dead: its events matter more than the bound.
        reservation = await store.reserve(QUEUE, 0, 1, 4, NOW)
        await store.reclaim(QUEUE, NOW + 60)
        await store.commit(reservation, [("late", b"late")], NOW + 60)
        assert bodies(await store.list(QUEUE, 0)) == [b"late"]

    async def test_reserve_checks_the_shard_and_the_request(self, store: QueueStore) -> None:
        for shard, entries, size in [(4, 1, 1), (-1, 1, 1), (0, 0, 1), (0, 1, -1)]:
            with pytest.raises(ValueError):
                await store.reserve(QUEUE, shard, entries, size, NOW)

    # Removing and updating

    async def test_remove_takes_exactly_the_given_entries(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        first = await put(store, 0, b"a0", b"a1", b"a2", b"a3", b"a4")
        second = await put(store, 0, b"b0", b"b1", b"b2")
        third = await put(store, 0, b"c0")
        await store.list(QUEUE, 0)
        gone = [first[1].id, first[3].id, second[0].id, "not-an-id", first[0].id + "9"]
        await store.remove(QUEUE, 0, gone)

        kept = [first[0], first[2], first[4], second[1], second[2], third[0]]
        assert await store.list(QUEUE, 0) == kept
        assert await reopen().list(QUEUE, 0) == kept
        stats = await store.stats(QUEUE, NOW)
        assert (stats.entries, stats.bytes) == (6, 12)

        await store.remove(QUEUE, 0, [e.id for e in kept[:3]])  # all that is left of first
        await store.remove(QUEUE, 0, [first[1].id])  # already removed: ignored
        assert await store.list(QUEUE, 0) == kept[3:]
        assert await reopen().list(QUEUE, 0) == kept[3:]

    async def test_remove_without_a_list_first(self, store: QueueStore, reopen: Reopen) -> None:
        entries = await put(store, 2, b"1", b"2", b"3")
        other = reopen()
        await other.remove(QUEUE, 2, [entries[1].id])
        assert await store.list(QUEUE, 2) == [entries[0], entries[2]]

    async def test_remove_everything(self, store: QueueStore) -> None:
        entries = await put(store, 3, b"1", b"2") + await put(store, 3, b"3")
        await store.list(QUEUE, 3)
        await store.remove(QUEUE, 3, [e.id for e in entries])
        assert await store.list(QUEUE, 3) == []
        assert (await store.stats(QUEUE, NOW)).entries == 0

    async def test_update_persists_attempts_and_not_before_in_place(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        entries = await put(store, 0, b"1", b"2", b"3") + await put(store, 0, b"4")
        await store.list(QUEUE, 0)
        changed = [
            replace(entries[1], attempts=2, not_before=NOW + 10),
            # Only the delivery state is kept: the body stays as committed.
            replace(entries[3], attempts=1, not_before=NOW + 5, body=b"other"),
        ]
        await store.update(QUEUE, 0, changed)

        expected = [entries[0], changed[0], entries[2], replace(changed[1], body=b"4")]
        assert await store.list(QUEUE, 0) == expected
        assert await reopen().list(QUEUE, 0) == expected
        stats = await store.stats(QUEUE, NOW)
        assert (stats.entries, stats.bytes) == (4, 4)

        # Updating a removed entry does nothing; a later removal keeps the others' state.
        await store.remove(QUEUE, 0, [entries[0].id])
        await store.update(QUEUE, 0, [replace(entries[0], attempts=9)])
        assert await store.list(QUEUE, 0) == expected[1:]

    async def test_a_crash_in_the_middle_of_a_rewrite_loses_nothing_and_resurrects_nothing(
        self, store: QueueStore, reopen: Reopen, raw: Raw
    ) -> None:
        entries = await put(store, 1, b"1", b"2", b"3", b"4")
        later = await put(store, 1, b"5")
        (original,) = [n for n in raw.names(QUEUE, 1) if ".n000004." in n]
        saved = raw.read(QUEUE, 1, original)
        await store.list(QUEUE, 1)
        await store.remove(QUEUE, 1, [entries[0].id])
        # As if the old object's delete never happened: both versions of the batch exist.
        raw.write(QUEUE, 1, original, saved)
        assert len(raw.names(QUEUE, 1)) == 3

        for reader in (store, reopen()):
            assert await reader.list(QUEUE, 1) == entries[1:] + later
            stats = await reader.stats(QUEUE, NOW)
            assert (stats.entries, stats.bytes) == (4, 4)

        fresh = reopen()
        await fresh.remove(QUEUE, 1, [entries[2].id])
        assert await store.list(QUEUE, 1) == [entries[1], entries[3], *later]
        await fresh.remove(QUEUE, 1, [entries[1].id, entries[3].id])
        assert await store.list(QUEUE, 1) == later
        assert len(raw.names(QUEUE, 1)) == 1  # the stale version went with the batch

    # Stats, queues, durability

    async def test_stats_are_exact_per_shard(self, store: QueueStore, reopen: Reopen) -> None:
        await put(store, 0, b"12", b"345")
        await put(store, 2, b"6789")
        await store.reserve(QUEUE, 2, 3, 30, NOW)
        await reopen().reserve(QUEUE, 3, 1, 1, NOW)
        stats = await store.stats(QUEUE, NOW)
        assert stats.shards == {
            0: ShardStats(entries=2, bytes=5, reservations=0),
            1: ShardStats(entries=0, bytes=0, reservations=0),
            2: ShardStats(entries=1, bytes=4, reservations=1),
            3: ShardStats(entries=0, bytes=0, reservations=1),
        }
        assert (stats.entries, stats.bytes, stats.reservations) == (3, 9, 2)
        assert await reopen().stats(QUEUE, NOW) == stats

    async def test_glance_many_answers_every_queue_asked_as_its_own_glance(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        """The survey's look at many queues at once: each queue asked (of two namespaces, a
        dead-letter queue and a missing one among them) gets what a glance of it says, its
        entries, bytes, live and expired reservations; a queue not asked gets no answer."""
        many = [QueueName(QUEUE.namespace, f"q{i}") for i in range(5)]
        kept = dead_letter_queue(QUEUE)
        for queue in [*many, OTHER, kept]:
            await store.create(queue, 2, LIMITS)
        await put(store, 0, b"not asked")
        await put(store, 1, b"6789", queue=many[1])
        await store.save_delivered(many[1], 0, ["ev-1"])  # identities are not entries
        await put(store, 0, b"a", queue=many[3])
        await put(store, 1, b"bc", queue=many[3])
        await reopen().reserve(many[4], 0, 1, 1, NOW)
        await store.reserve(OTHER, 1, 2, 2, NOW - 60)  # its writer died a minute ago
        await put(store, 0, b"dead", queue=kept)
        missing = QueueName(QUEUE.namespace, "missing")
        asked = [*many, OTHER, kept, missing]

        reader = reopen()
        glanced = await reader.glance_many(asked, NOW)
        assert sorted(glanced) == sorted(asked)
        for queue in asked:
            assert glanced[queue] == await reader.glance(queue, NOW), queue
        held = {q: (s.entries, s.bytes, s.reservations, s.expired) for q, s in glanced.items()}
        assert held == {
            many[0]: (0, 0, 0, 0),
            many[1]: (1, 4, 0, 0),
            many[2]: (0, 0, 0, 0),
            many[3]: (2, 3, 0, 0),
            many[4]: (0, 0, 1, 0),
            OTHER: (0, 0, 0, 1),
            kept: (1, 4, 0, 0),
            missing: (0, 0, 0, 0),
        }
        assert {s for s, h in glanced[many[3]].shards.items() if h.entries} == {0, 1}

    async def test_create_is_idempotent_and_updates_shards_and_limits(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        entries = await put(store, 0, b"1")
        await store.create(QUEUE, 4, QueueLimits(max_entries=1, max_bytes=100))
        assert await store.list(QUEUE, 0) == entries
        with pytest.raises(QueueFull):
            await store.reserve(QUEUE, 0, 1, 1, NOW)
        other = reopen()
        await other.stats(QUEUE, NOW)  # another writer that knows the old shard count
        await store.create(QUEUE, 6, QueueLimits(max_entries=2, max_bytes=100))
        await store.reserve(QUEUE, 5, 1, 1, NOW)
        with pytest.raises(QueueFull):
            await other.reserve(QUEUE, 4, 1, 1, NOW)  # the new shard, and the new limit
        assert sorted((await reopen().stats(QUEUE, NOW)).shards) == [0, 1, 2, 3, 4, 5]

    async def test_queues_lists_the_created_queues(self, store: QueueStore, reopen: Reopen) -> None:
        await store.create(OTHER, 1, LIMITS)
        assert sorted(await store.queues()) == [QUEUE, OTHER]
        assert sorted(await reopen().queues()) == [QUEUE, OTHER]

    async def test_a_dead_letter_queue_is_a_queue_of_its_own_beside_its_topics(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        kept = dead_letter_queue(QUEUE)
        await store.create(kept, 2, LIMITS)
        await put(store, 0, b"queued")
        await put(store, 0, b"dead", queue=kept)
        assert sorted(await reopen().queues()) == sorted([QUEUE, kept])
        assert bodies(await store.list(QUEUE, 0)) == [b"queued"]
        assert bodies(await store.list(kept, 0)) == [b"dead"]
        await store.delete(QUEUE)
        assert bodies(await reopen().list(kept, 0)) == [b"dead"]

    async def test_update_keeps_an_entrys_failures(self, store: QueueStore, reopen: Reopen) -> None:
        (entry,) = await put(store, 2, b"1")
        failed = replace(
            entry,
            attempts=1,
            not_before=NOW + 1,
            first_failure=NOW,
            last_failure=NOW,
            last_error="503 Service Unavailable",
        )
        await store.update(QUEUE, 2, [failed])
        again = replace(failed, attempts=2, last_failure=NOW + 5, last_error="timeout")
        await store.update(QUEUE, 2, [again])
        assert await reopen().list(QUEUE, 2) == [again]

    async def test_delete_removes_the_queue_and_everything_in_it(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        await store.create(OTHER, 2, LIMITS)
        await put(store, 0, b"1", b"2")
        await put(store, 1, b"3", queue=OTHER)
        await store.reserve(QUEUE, 1, 1, 1, NOW)
        await store.delete(QUEUE)
        await store.delete(QUEUE)  # a missing queue is fine

        for reader in (store, reopen()):
            assert await reader.queues() == [OTHER]
            assert await reader.list(QUEUE, 0) == []
            with pytest.raises(QueueNotFound):
                await reader.stats(QUEUE, NOW)
            with pytest.raises(QueueNotFound):
                await reader.reserve(QUEUE, 0, 1, 1, NOW)
        assert bodies(await store.list(OTHER, 1)) == [b"3"]

        await store.create(QUEUE, 4, LIMITS)
        assert (await store.stats(QUEUE, NOW)).entries == 0

    async def test_delivered_identities_are_kept_per_shard_for_the_next_owner(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        """What one owner saves, the next (another instance) loads; a save replaces the
        last; the identities are not entries; a deleted queue keeps none and gets none."""
        assert await store.load_delivered(QUEUE, 0) == []
        await store.save_delivered(QUEUE, 0, ["ev-1", "ev-2"])
        await store.save_delivered(QUEUE, 1, ["ev-3"])
        assert await reopen().load_delivered(QUEUE, 0) == ["ev-1", "ev-2"]
        await store.save_delivered(QUEUE, 0, ["ev-2", "ev-4"])
        assert await reopen().load_delivered(QUEUE, 0) == ["ev-2", "ev-4"]
        assert await reopen().load_delivered(QUEUE, 1) == ["ev-3"]
        assert (await store.stats(QUEUE, NOW)).entries == 0
        assert await store.list(QUEUE, 0) == []
        assert await store.queues() == [QUEUE]

        await store.delete(QUEUE)
        await store.save_delivered(QUEUE, 0, ["ev-5"])
        assert await store.queues() == []
        await store.create(QUEUE, 4, LIMITS)
        assert await store.load_delivered(QUEUE, 0) == []
        assert await store.load_delivered(QUEUE, 1) == []

    async def test_a_missing_queue_reads_as_empty(self, store: QueueStore) -> None:
        missing = QueueName("nobody", "nothing")
        assert await store.list(missing, 0) == []
        await store.remove(missing, 0, ["x"])
        await store.update(missing, 0, [])
        assert await store.reclaim(missing, NOW) == 0
        with pytest.raises(QueueNotFound):
            await store.reserve(missing, 0, 1, 1, NOW)
        with pytest.raises(QueueNotFound):
            await store.stats(missing, NOW)

    async def test_everything_survives_into_another_instance(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        entries = await put(store, 0, b"1", b"2", b"3")
        pending: Reservation = await store.reserve(QUEUE, 1, 1, 1, NOW)
        other = reopen()
        assert await other.list(QUEUE, 0) == entries
        assert await other.queues() == [QUEUE]
        assert (await other.stats(QUEUE, NOW)).reservations == 1
        await other.commit(pending, [("e", b"x")], NOW)  # a reservation is plain data
        assert bodies(await store.list(QUEUE, 1)) == [b"x"]

        # Ownership moves back and forth: each side reads what the other wrote.
        await other.remove(QUEUE, 0, [entries[0].id])
        assert await store.list(QUEUE, 0) == entries[1:]
        await store.update(QUEUE, 0, [replace(entries[1], attempts=1)])
        assert (await other.list(QUEUE, 0))[0].attempts == 1

    async def test_concurrent_commits_all_land_once_in_one_order(
        self, store: QueueStore, reopen: Reopen
    ) -> None:
        writers = [store, reopen()]
        payloads = [f"event-{n:02d}".encode() for n in range(50)]

        async def write(n: int) -> list[Entry]:
            return await put(writers[n % 2], 0, payloads[n])

        committed = await asyncio.gather(*(write(n) for n in range(50)))
        listed = await store.list(QUEUE, 0)
        assert sorted(bodies(listed)) == payloads
        assert [e.id for e in listed] == sorted({e.id for e in listed})
        assert sorted(e.id for c in committed for e in c) == [e.id for e in listed]
        stats = await store.stats(QUEUE, NOW)
        assert (stats.entries, stats.reservations) == (50, 0)
