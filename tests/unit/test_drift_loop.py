"""The drift loop: every object once per interval, spread over it, never two reconciles of
one object at once (issue: kopf's per-object timers kept every body in memory)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Hashable
from typing import Any

import kopf
import pytest

from bucketnotify.controller.drift_loop import DriftLoop, ObjectLocks
from bucketnotify.controller.handlers import PENDING, _snapshot
from bucketnotify.kube.apiserver import ApiError

INTERVAL = 0.4


async def run_for(loop: DriftLoop, seconds: float) -> None:
    task = asyncio.create_task(loop.run())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_each_target_is_checked_once_per_interval_spread_over_it() -> None:
    clock = asyncio.get_running_loop().time
    started = clock()
    seen: list[tuple[Hashable, float]] = []

    async def check(key: Hashable) -> None:
        seen.append((key, clock() - started))

    keys = ["a", "b", "c", "d"]
    # Two full rounds (the first one interval after the start) and part of a third.
    await run_for(DriftLoop(INTERVAL, lambda: keys, check), 3.5 * INTERVAL)
    first, second = seen[:4], seen[4:8]
    assert [k for k, _ in first] == keys and [k for k, _ in second] == keys
    offsets = [t for _, t in first]
    assert offsets[0] >= INTERVAL
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    # A check every interval / 4, not all at once.
    assert all(gap >= INTERVAL / 4 * 0.8 for gap in gaps), gaps
    assert second[0][1] - first[0][1] == pytest.approx(INTERVAL, abs=0.1)


async def test_targets_are_read_anew_each_round() -> None:
    keys: list[str] = ["a"]
    seen: list[Hashable] = []

    async def check(key: Hashable) -> None:
        seen.append(key)
        if key == "a" and "b" not in keys:
            keys.append("b")
            keys.remove("a")

    await run_for(DriftLoop(INTERVAL, lambda: list(keys), check), 2.5 * INTERVAL)
    assert seen == ["a", "b"]


async def test_a_failing_check_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[Hashable] = []

    async def check(key: Hashable) -> None:
        seen.append(key)
        if key == "bad":
            raise RuntimeError("gateway exploded")

    await run_for(DriftLoop(INTERVAL, lambda: ["bad", "good"], check), 2.8 * INTERVAL)
    assert seen == ["bad", "good", "bad", "good"]
    assert "drift check of bad failed" in caplog.text
    assert "gateway exploded" in caplog.text


async def test_slow_checks_overlap_up_to_the_bound_and_are_cancelled_with_the_loop() -> None:
    inside, most, cancelled = 0, 0, 0

    async def check(_key: Hashable) -> None:
        nonlocal inside, most, cancelled
        inside += 1
        most = max(most, inside)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled += 1
            raise
        finally:
            inside -= 1

    keys = [str(i) for i in range(10)]
    await run_for(DriftLoop(INTERVAL, lambda: keys, check, concurrency=3), 2.5 * INTERVAL)
    assert most == 3
    assert cancelled == 3 and inside == 0


async def test_one_lock_per_object_while_anyone_holds_it() -> None:
    locks = ObjectLocks()
    first = locks(("topics", "ns", "a"))
    assert locks(("topics", "ns", "a")) is first
    assert locks(("topics", "ns", "b")) is not first
    order: list[str] = []

    async def reconcile(what: str) -> None:
        async with locks(("topics", "ns", "a")):
            order.append(f"{what} in")
            await asyncio.sleep(0.05)
            order.append(f"{what} out")

    await asyncio.gather(reconcile("change"), reconcile("drift"))
    assert order == ["change in", "change out", "drift in", "drift out"]
    del first
    # Nobody holds or waits for it: dropped, the map does not grow with every object.
    assert len(locks._locks) == 0


KEPT_METADATA = {
    "name": "t",
    "namespace": "ns",
    "uid": "u-1",
    "generation": 3,
    "resourceVersion": "42",
    "creationTimestamp": "2026-11-26T10:00:00Z",
}


TOPIC_STATUS = {"arn": "arn:aws:sns:default::ns.t", "observedGeneration": 3}


def body(annotations: dict[str, str], status: dict[str, Any] = TOPIC_STATUS) -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": "bucketnotify.io/v1alpha1",
            "kind": "Topic",
            "metadata": {
                **KEPT_METADATA,
                "annotations": annotations,
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {"endpoint": {"http": {"url": "http://127.0.0.1:9/x"}}},
            "status": status,
        }
    )


def test_a_snapshot_keeps_what_a_check_needs_and_not_kopfs_bookkeeping() -> None:
    # The diff base as the development builds before 0.1.0.dev0 left it (an annotation) and
    # as kopf writes it now.
    last_handled = {"kopf.bucketnotify.io/last-handled-configuration": "{" + "x" * 4000 + "}"}
    diff_base = {"lastHandledConfiguration": "{" + "x" * 4000 + "}"}
    snapshot = _snapshot(body(last_handled, {**TOPIC_STATUS, **diff_base}))
    assert snapshot["metadata"] == KEPT_METADATA
    assert snapshot["spec"] == {"endpoint": {"http": {"url": "http://127.0.0.1:9/x"}}}
    assert snapshot["status"] == TOPIC_STATUS
    assert snapshot["kind"] == "Topic" and not snapshot[PENDING]
    # A change handler with a retry due (kopf's progress annotation): no drift check.
    retrying = {**last_handled, "kopf.bucketnotify.io/topic_changed": '{"retries": 1}'}
    assert _snapshot(body(retrying))[PENDING]
    assert not _snapshot(body({"bucketnotify.io/secret-resync": "s@1"}))[PENDING]
    # A generation its change handler has not handled yet (no status at all when new).
    for status in ({}, {**TOPIC_STATUS, "observedGeneration": 2}):
        assert _snapshot(body(last_handled, status))[PENDING]


class TwoRecords(logging.Handler):
    """Keeps what the drift loop logs; ``two`` is set once it logged twice."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.two = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if len(self.records) >= 2:
            self.two.set()


async def test_a_check_the_api_server_throttles_is_a_warning_without_traceback() -> None:
    """A check refused for now (the handler's kopf.TemporaryError; a 429 itself) is tried
    again at the next interval: one WARNING line each, no traceback, no ERROR."""

    async def check(key: Hashable) -> None:
        if key == "waits":
            raise kopf.TemporaryError("the API server did not take a request now: 429", delay=5)
        raise ApiError(429, "Too Many Requests", '{"kind":"Status","code":429}')

    logger = logging.getLogger("bucketnotify.controller.drift_loop")
    handler = TwoRecords()
    logger.addHandler(handler)
    task = asyncio.create_task(DriftLoop(INTERVAL, lambda: ["waits", "throttled"], check).run())
    try:
        async with asyncio.timeout(30):  # a wait for the first round's two checks
            await handler.two.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        logger.removeHandler(handler)
    said = handler.records[:2]
    assert [r.levelno for r in said] == [logging.WARNING, logging.WARNING]
    assert all(r.exc_info is None for r in said)
    assert "drift check of waits not done now" in said[0].getMessage()
    assert "drift check of throttled failed, trying again later: 429" in said[1].getMessage()
