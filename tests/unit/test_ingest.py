"""The ingest answers 2xx only after a durable commit and enqueues nothing for bad input."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bucketnotify.delivery.ingest.handler import MAX_BODY_BYTES, Ingest
from bucketnotify.delivery.model.event import event_id, shard_of
from bucketnotify.delivery.model.queue import QueueLimits, QueueName
from bucketnotify.delivery.service import build_app
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.stores.s3 import S3Store
from bucketnotify.delivery.topics.ingest_tokens import IngestTopic
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.kube.apiserver import ApiClient, ApiError
from devstack.programs import free_port
from tests.delivery import lone_service
from tests.kubeapi import unreachable_api
from tests.records import event

TopicKeyT = tuple[str, str]
QUEUE = QueueName("team-a", "orders")
TOKEN = "t0ken-0123456789"
URL = f"/v1/topics/team-a/orders/{TOKEN}"


@pytest.fixture()
async def setup(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], LocalDirStore]]:
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 4, QueueLimits(max_entries=10, max_bytes=1_000_000))
    ingest = Ingest(store, {("team-a", "orders"): IngestTopic(QUEUE, TOKEN, 4)})
    async with TestClient(TestServer(build_app(ingest))) as client:
        yield client, store


async def pending(store: LocalDirStore) -> int:
    return (await store.stats(QUEUE, 0)).entries


async def test_records_are_committed_to_their_shard_before_the_answer(
    setup: tuple[TestClient[Any, Any], LocalDirStore],
) -> None:
    client, store = setup
    body = {"Records": [event("a"), event("b"), event("c")]}
    response = await client.post(URL, json=body)
    assert response.status == 200
    for rec in body["Records"]:
        shard = shard_of("b", rec["s3"]["object"]["key"], 4)
        entries = await store.list(QUEUE, shard)
        assert event_id(rec) in {e.event_id for e in entries}
        stored = next(e for e in entries if e.event_id == event_id(rec))
        assert json.loads(stored.body) == rec


@pytest.mark.parametrize(
    ("path", "payload", "status"),
    [
        (URL, b"not json", 400),
        (URL, b'{"records": []}', 400),
        (URL, b'{"Records": [{"s3": {}}]}', 400),
        (URL, b'{"Records": "x"}', 400),
        (URL, b"\xff\xfe", 400),
        (
            "/v1/topics/team-a/orders/wrong-token",
            json.dumps({"Records": [event("a")]}).encode(),
            403,
        ),
        (f"/v1/topics/team-b/orders/{TOKEN}", json.dumps({"Records": [event("a")]}).encode(), 404),
        (URL, b"x" * (MAX_BODY_BYTES + 1), 413),
        (URL, json.dumps({"Records": [event("a", n="N")]}).replace('"N"', "1e400").encode(), 400),
        (URL, json.dumps({"Records": [event("a", n="N")]}).replace('"N"', "NaN").encode(), 400),
    ],
    ids=[
        "not-json",
        "no-Records",
        "no-key",
        "Records-not-list",
        "not-utf8",
        "bad-token",
        "unknown-topic",
        "too-large",
        "number-beyond-a-float",
        "NaN",
    ],
)
async def test_bad_requests_enqueue_nothing(
    setup: tuple[TestClient[Any, Any], LocalDirStore], path: str, payload: bytes, status: int
) -> None:
    client, store = setup
    response = await client.post(path, data=payload, headers={"Content-Type": "application/json"})
    assert response.status == status
    assert await pending(store) == 0


async def test_a_record_is_queued_as_sent_to_its_last_digit(
    setup: tuple[TestClient[Any, Any], LocalDirStore],
) -> None:
    """Numbers the faster JSON reader would round (beyond 64 bits) and text beyond ASCII
    are queued exactly, in the gateway's key order, as compact UTF-8 JSON."""
    client, store = setup
    record = event("ключ-€", size=123456789012345678901234, opaqueData="✓ 0.1")
    response = await client.post(URL, data=json.dumps({"Records": [record]}).encode())
    assert response.status == 200
    assert await response.json() == {"committed": 1}
    [stored] = await store.list(QUEUE, shard_of("b", "ключ-€", 4))
    assert stored.body == json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()


async def test_a_full_queue_answers_503_and_keeps_what_it_had(
    setup: tuple[TestClient[Any, Any], LocalDirStore],
) -> None:
    client, store = setup
    # One at a time: concurrent commits may count a batch twice for a moment (a committed
    # batch before its reservation is gone), which is conservative but not exact.
    for i in range(8):
        assert (await client.post(URL, json={"Records": [event(f"k{i}")]})).status == 200
    overflow = await client.post(URL, json={"Records": [event(f"x{i}") for i in range(5)]})
    assert overflow.status == 503
    assert await pending(store) == 8


async def test_concurrent_requests_all_land_exactly_once(
    setup: tuple[TestClient[Any, Any], LocalDirStore],
) -> None:
    client, store = setup
    await store.create(QUEUE, 4, QueueLimits(max_entries=1000, max_bytes=10_000_000))
    responses = await asyncio.gather(
        *(client.post(URL, json={"Records": [event(f"key{i}")]}) for i in range(40))
    )
    assert [r.status for r in responses] == [200] * 40
    ids = []
    for shard in range(4):
        ids += [e.event_id for e in await store.list(QUEUE, shard)]
    assert sorted(ids) == sorted(event_id(event(f"key{i}")) for i in range(40))


async def test_readyz_answers_503_with_the_reason_until_ready(tmp_path: Path) -> None:
    reason: list[str | None] = ["the Topics were not read yet"]
    ingest = Ingest(LocalDirStore(tmp_path), {})
    async with TestClient(TestServer(build_app(ingest, lambda: reason[0]))) as client:
        response = await client.get("/readyz")
        assert response.status == 503
        assert await response.json() == {"ready": False, "reason": "the Topics were not read yet"}
        reason[0] = None
        response = await client.get("/readyz")
        assert response.status == 200
        assert await response.json() == {"ready": True}


async def test_healthz_answers_while_the_replica_is_not_ready(tmp_path: Path) -> None:
    ingest = Ingest(LocalDirStore(tmp_path), {})
    app = build_app(ingest, lambda: "the Topics were not read yet")
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/healthz")
        assert response.status == 200
        assert await response.json() == {"alive": True}
        assert (await client.get("/readyz")).status == 503


async def test_a_queue_over_max_bytes_answers_503_and_enqueues_nothing(tmp_path: Path) -> None:
    """maxQueueBytes through the ingest: a request that would pass the byte bound is refused
    whole (503, which the gateway retries), and what was queued stays."""
    store = LocalDirStore(tmp_path)
    size = len(json.dumps(event("k00")).encode())
    # Room for three records of this size, not four; entries are not the bound here.
    await store.create(QUEUE, 1, QueueLimits(max_entries=1000, max_bytes=size * 3 + size // 2))
    ingest = Ingest(store, {("team-a", "orders"): IngestTopic(QUEUE, TOKEN, 1)})
    async with TestClient(TestServer(build_app(ingest))) as client:
        for i in range(3):
            assert (await client.post(URL, json={"Records": [event(f"k{i:02d}")]})).status == 200
        refused = await client.post(URL, json={"Records": [event("k03"), event("k04")]})
        assert refused.status == 503
        stats = await store.stats(QUEUE, 0)
        assert stats.entries == 3
        assert stats.bytes <= size * 3 + size // 2
        keys = sorted(json.loads(e.body)["s3"]["object"]["key"] for e in await store.list(QUEUE, 0))
        assert keys == ["k00", "k01", "k02"]


async def test_a_token_the_replica_does_not_hold_is_checked_against_the_secret_once(
    tmp_path: Path,
) -> None:
    """A push with an unknown token asks for the Topic again (the token Secret may have been
    rotated): the new token is then taken, the replaced one until its overlap ends, the
    ``previous-token`` as long as it is set, and anything else is 403."""
    store = LocalDirStore(tmp_path)
    await store.create(QUEUE, 1, QueueLimits(max_entries=100, max_bytes=1_000_000))
    topics = {("team-a", "orders"): IngestTopic(QUEUE, TOKEN, 1)}
    asked: list[tuple[str, str]] = []
    rotated = IngestTopic(QUEUE, "new-token-0123456789", 1, previous="prev-token-0123456789")

    async def recheck(namespace: str, name: str, since: float) -> IngestTopic | None:
        assert since <= time.monotonic()  # the push's arrival
        asked.append((namespace, name))
        topics[(namespace, name)] = rotated
        return rotated

    ingest = Ingest(store, topics, recheck=recheck)
    body = {"Records": [event("k")]}
    async with TestClient(TestServer(build_app(ingest))) as client:
        assert (await client.post(URL, json=body)).status == 200
        assert asked == []  # the token it holds: no question asked
        new = await client.post("/v1/topics/team-a/orders/new-token-0123456789", json=body)
        assert new.status == 200
        assert asked == [("team-a", "orders")]
        assert (await client.post(URL, json=body)).status == 403  # replaced, no overlap given
        prev = await client.post("/v1/topics/team-a/orders/prev-token-0123456789", json=body)
        assert prev.status == 200
        assert (await client.post("/v1/topics/team-a/orders/guess", json=body)).status == 403
    assert (await store.stats(QUEUE, 0)).entries == 3


def test_a_replaced_token_is_taken_until_its_overlap_ends() -> None:
    now = time.monotonic()
    topic = IngestTopic(QUEUE, "new", 1, replaced="old", replaced_until=now + 60)
    assert topic.accepts("new") and topic.accepts("old") and not topic.accepts("other")
    expired = IngestTopic(QUEUE, "new", 1, replaced="old", replaced_until=now - 1)
    assert expired.accepts("new") and not expired.accepts("old")


@pytest.fixture()
async def api() -> AsyncIterator[ApiClient]:
    """A client that never reaches an API server (the reads in question are stubbed)."""
    async with unreachable_api() as api:
        yield api


async def test_pushes_during_a_token_reread_wait_for_it_and_one_read_serves_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: ApiClient
) -> None:
    """After a rotation the gateway sends many pushes with the new token at once: the first
    makes the replica read the token Secret, the others wait for that read (none refused),
    and a second read comes no sooner than a second after the first began."""
    service = lone_service(api, LocalDirStore(tmp_path))
    key = ("team-a", "orders")
    service.ingest_topics[key] = IngestTopic(QUEUE, TOKEN, 1)
    reads: list[float] = []

    async def read_tokens(topic: TopicKeyT) -> dict[str, str]:
        assert topic == key
        reads.append(time.monotonic())
        await asyncio.sleep(0.2)  # an API server round trip
        return {"token": "rotated-0123456789"}

    monkeypatch.setattr(service.table.tokens, "read", read_tokens)
    answers = await asyncio.gather(*(service.recheck_token(*key) for _ in range(20)))
    assert len(reads) == 1
    assert all(a is not None and a.accepts("rotated-0123456789") for a in answers)
    assert all(a is not None and a.accepts(TOKEN) for a in answers)  # the overlap
    # Pushes within the second after it: one more read for all of them, a second after the
    # first began, never sooner.
    again = await asyncio.gather(*(service.recheck_token(*key) for _ in range(20)))
    assert len(reads) == 2 and reads[1] - reads[0] >= 1.0
    assert all(a is service.ingest_topics[key] for a in again)


async def test_a_token_made_within_a_second_of_the_last_read_is_taken_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: ApiClient
) -> None:
    """The replica read the Secret a moment ago (its refresh, or another push's recheck),
    then the token changed and the gateway pushes with it at once: that push waits for the
    next read and is taken. Refusing it until the second is over lost the events of a
    deleted and remade token Secret with hand-off sync."""
    service = lone_service(api, LocalDirStore(tmp_path))
    key = ("team-a", "orders")
    service.ingest_topics[key] = IngestTopic(QUEUE, TOKEN, 1, read_at=time.monotonic())
    secret = {"token": "remade-0123456789"}

    async def read_tokens(topic: TopicKeyT) -> dict[str, str]:
        return dict(secret)

    monkeypatch.setattr(service.table.tokens, "read", read_tokens)
    found = await service.recheck_token(*key)
    assert found is not None and found.accepts("remade-0123456789")


async def test_a_read_begun_before_the_push_came_does_not_answer_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: ApiClient
) -> None:
    """A read under way when the push came may have missed its token: the push waits for a
    read begun after it came."""
    service = lone_service(api, LocalDirStore(tmp_path))
    key = ("team-a", "orders")
    service.ingest_topics[key] = IngestTopic(QUEUE, TOKEN, 1)
    tokens = iter(["stale-0123456789", "fresh-0123456789"])

    async def read_tokens(topic: TopicKeyT) -> dict[str, str]:
        token = next(tokens)
        await asyncio.sleep(0.3)
        return {"token": token}

    monkeypatch.setattr(service.table.tokens, "read", read_tokens)
    first = asyncio.ensure_future(service.recheck_token(*key))
    await asyncio.sleep(0.1)  # the first read is under way
    found = await service.recheck_token(*key)
    assert found is not None and found.accepts("fresh-0123456789")
    assert (await first) is not None


async def test_a_deleted_token_secret_keeps_the_token_held_until_a_new_one_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: ApiClient
) -> None:
    """Between a token Secret's deletion and the operator making it again, the gateway still
    pushes with the token it has: a read finding no Secret keeps that token, and the remade
    one is taken once it is there (the held one for the overlap)."""
    service = lone_service(api, LocalDirStore(tmp_path))
    key = ("team-a", "orders")
    service.ingest_topics[key] = IngestTopic(QUEUE, TOKEN, 1)
    secret: dict[str, str] = {}

    async def read_tokens(topic: TopicKeyT) -> dict[str, str]:
        return dict(secret)

    monkeypatch.setattr(service.table.tokens, "read", read_tokens)
    missing = await service.recheck_token(*key)
    assert missing is not None and missing.accepts(TOKEN)
    secret["token"] = "remade-0123456789"
    remade = await service.recheck_token(*key)
    assert remade is not None and remade.accepts("remade-0123456789") and remade.accepts(TOKEN)


SECRET = "s3cr3t-never-logged"
REQUESTS = "bucketnotify_ingest_requests_total"


async def test_a_queue_store_that_does_not_answer_gets_503_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An S3 store whose gateway refuses connections (a port nothing listens on): every
    push is answered 503, which the gateway retries, never 500 with a traceback; the
    refusals are counted and logged once per STORE_WARNING_S, not once per request."""
    port = free_port()
    store = S3Store(GatewayConnection(f"http://127.0.0.1:{port}", "ak", SECRET, "zg"), "queues")
    ingest = Ingest(store, {("team-a", "orders"): IngestTopic(QUEUE, TOKEN, 4)})
    async with TestClient(TestServer(build_app(ingest))) as http:
        statuses = [
            (await http.post(URL, json={"Records": [event(f"k{i}")]})).status for i in range(5)
        ]
        answer = await (await http.post(URL, json={"Records": [event("k9")]})).json()
    assert statuses == [503] * 5
    assert answer == {"error": "queue store unavailable"}
    registry = ingest.metrics.registry
    assert registry.get_sample_value(REQUESTS, {"code": "503"}) == 6
    assert registry.get_sample_value(REQUESTS, {"code": "500"}) is None
    warnings = [r for r in caplog.records if "queue store is unavailable" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert SECRET not in caplog.text
    await store.aclose()


async def test_a_topic_the_api_server_will_not_tell_about_gets_503_and_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A push for a Topic the replica does not know yet, while the API server throttles
    (429): the lookup is asked again for a while, then the push is answered 503 (which
    the gateway retries), never 500 with a traceback; one warning, not one per push."""
    asked: list[float] = []

    async def throttled(namespace: str, name: str) -> IngestTopic | None:
        asked.append(time.monotonic())
        raise ApiError(429, "Too Many Requests", '{"kind":"Status","code":429}')

    store = LocalDirStore(tmp_path)
    ingest = Ingest(store, {}, resolve=throttled)
    async with TestClient(TestServer(build_app(ingest))) as http:
        answers = [await http.post(URL, json={"Records": [event(f"k{i}")]}) for i in range(3)]
        bodies = [await answer.json() for answer in answers]
    assert [a.status for a in answers] == [503] * 3
    assert bodies == [{"error": "the topic cannot be looked up now"}] * 3
    assert len(asked) == 3
    registry = ingest.metrics.registry
    assert registry.get_sample_value(REQUESTS, {"code": "500"}) is None
    warnings = [r for r in caplog.records if "not looked up" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None
    assert "429" in warnings[0].getMessage()
