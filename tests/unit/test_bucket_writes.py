"""Group commit of a bucket's notification writes (controller.bucket_writes.Batches)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from bucketnotify.controller.bucket_writes import AGAIN, Batches


def batches() -> Batches[str, str]:
    locks: defaultdict[object, asyncio.Lock] = defaultdict(asyncio.Lock)
    return Batches(locks.__getitem__)


async def held(b: Batches[str, str], key: str) -> tuple[asyncio.Task[str], asyncio.Event]:
    """A batch of ``key`` under way until the event is set: what comes meanwhile waits."""
    started, release = asyncio.Event(), asyncio.Event()

    async def blocking(items: list[str]) -> list[str | BaseException | object]:
        started.set()
        await release.wait()
        return items

    task = asyncio.create_task(b.submit(key, "blocker", blocking))
    await started.wait()
    return task, release


async def test_requests_that_wait_for_a_batch_go_in_the_next_one_together() -> None:
    seen: list[list[str]] = []
    first_started = asyncio.Event()
    release = asyncio.Event()

    async def process(items: list[str]) -> list[str | BaseException | object]:
        seen.append(items)
        if len(seen) == 1:
            first_started.set()
            await release.wait()
        return [item.upper() for item in items]

    b = batches()
    first = asyncio.create_task(b.submit("bucket", "a", process))
    await first_started.wait()
    rest = [asyncio.create_task(b.submit("bucket", x, process)) for x in "bcdefghij"]
    other = asyncio.create_task(b.submit("another", "z", process))
    await asyncio.sleep(0.01)
    release.set()
    assert await first == "A"
    assert await asyncio.gather(*rest) == list("BCDEFGHIJ")
    assert await other == "Z"
    # One batch for the lone first request, one for the nine that waited behind it, and the
    # other bucket's on its own.
    assert sorted(seen, key=len) == [["a"], ["z"], list("bcdefghij")]


async def test_each_request_gets_its_own_answer_and_again_goes_to_the_next_batch() -> None:
    seen: list[list[str]] = []

    async def process(items: list[str]) -> list[str | BaseException | object]:
        seen.append(items)
        answers: list[str | BaseException | object] = []
        taken: set[str] = set()
        for item in items:
            if item in taken:
                answers.append(AGAIN)
            elif item == "bad":
                answers.append(ValueError("bad item"))
            else:
                taken.add(item)
                answers.append(f"wrote {item}")
        return answers

    b = batches()
    blocker, release = await held(b, "k")
    waiting = asyncio.gather(
        b.submit("k", "x", process),
        b.submit("k", "x", process),
        b.submit("k", "bad", process),
        b.submit("k", "y", process),
        return_exceptions=True,
    )
    await asyncio.sleep(0.01)
    release.set()
    results = await waiting
    assert await blocker == "blocker"
    assert results[0] == results[1] == "wrote x"
    assert isinstance(results[2], ValueError) and str(results[2]) == "bad item"
    assert results[3] == "wrote y"
    assert seen == [["x", "x", "bad", "y"], ["x"]]


async def test_a_failing_batch_fails_each_of_its_requests_and_not_the_next() -> None:
    calls = 0

    async def process(items: list[str]) -> list[str | BaseException | object]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("gateway down")
        return items

    b = batches()
    blocker, release = await held(b, "k")
    waiting = asyncio.gather(
        b.submit("k", "a", process), b.submit("k", "b", process), return_exceptions=True
    )
    await asyncio.sleep(0.01)
    release.set()
    results = await waiting
    assert await blocker == "blocker"
    assert [type(r) for r in results] == [ConnectionError, ConnectionError]
    assert await b.submit("k", "c", process) == "c"


async def test_a_cancelled_request_is_not_processed_and_a_cancelled_batch_is_taken_again() -> None:
    seen: list[list[str]] = []
    started = asyncio.Event()

    async def slow(items: list[str]) -> list[str | BaseException | object]:
        seen.append(items)
        started.set()
        await asyncio.sleep(3600)
        return items

    async def fast(items: list[str]) -> list[str | BaseException | object]:
        seen.append(items)
        return items

    b = batches()
    holder = asyncio.create_task(b.submit("k", "a", slow))
    await started.wait()
    gone = asyncio.create_task(b.submit("k", "gone", fast))
    kept = asyncio.create_task(b.submit("k", "kept", fast))
    await asyncio.sleep(0.01)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    # The batch under way is cancelled: its request is answered by the next batch.
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert await kept == "kept"
    assert seen == [["a"], ["kept"]]
