"""The delivery records writer on a real directory: files, partitions, gzip, atomic writes,
the bounded buffer, retries of failed writes, and the records of the ingest and a round."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bucketnotify.delivery.model.event import shard_of
from bucketnotify.delivery.model.outcomes import EventOutcome, RoundResult
from bucketnotify.delivery.model.queue import Entry, QueueName
from bucketnotify.delivery.recorded.delivery_records import Recorder, RecordWriter, batch_path
from bucketnotify.delivery.recorded.record_targets import DirTarget, S3Target, records_target_for
from bucketnotify.delivery.stores.open import StoreConfigError
from bucketnotify.metrics import DeliveryMetrics
from bucketnotify.records import FIELDS, DeliveryRecord, Outcome
from bucketnotify.settings import DeliveryServiceSettings, OperatorSettings

# 2026-11-22 06:30:00 UTC and an hour later.
HOUR_6 = 1_795_329_000.0
HOUR_7 = HOUR_6 + 3600
QUEUE = QueueName("ns", "topic")


def rec(n: int, at: float = HOUR_6, outcome: Outcome = Outcome.DELIVERED) -> DeliveryRecord:
    return DeliveryRecord(
        outcome=outcome,
        namespace="ns",
        topic="topic",
        bucket="b",
        key=f"k{n}",
        event_name="ObjectCreated:Put",
        configuration_id="c",
        event_id=f"e{n}",
        event_time=at - 1,
        ingest_time=at - 0.5,
        outcome_time=at,
        attempts=1,
        endpoint_kind="http",
        shard=0,
        replica="r-1",
    )


def files(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Relative path → the JSON objects of every records file under ``root/v1``."""
    found = {}
    for path in sorted((root / "v1").rglob("*")):
        if path.is_file():
            lines = gzip.decompress(path.read_bytes()).decode().splitlines()
            found[str(path.relative_to(root))] = [json.loads(line) for line in lines]
    return found


def keys(found: dict[str, list[dict[str, Any]]]) -> list[str]:
    return sorted(
        (r["key"] for records in found.values() for r in records), key=lambda k: int(k[1:])
    )


def value(metrics: DeliveryMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


def writer(root: Path, metrics: DeliveryMetrics, **kwargs: Any) -> RecordWriter:
    kwargs.setdefault("flush_interval_s", 3600)
    return RecordWriter(DirTarget(root), replica="r-1", metrics=metrics, **kwargs)


async def test_a_flush_writes_one_gzip_json_lines_file_per_partition_hour(tmp_path: Path) -> None:
    metrics = DeliveryMetrics()
    w = writer(tmp_path, metrics)
    sent = [rec(0, HOUR_6), rec(1, HOUR_7), rec(2, HOUR_6 + 1)]
    for r in sent:
        w.add(r)
    assert await w.flush()
    found = files(tmp_path)
    assert sorted(p.rsplit("/", 1)[0] for p in found) == [
        "v1/date=2026-11-22/hour=06",
        "v1/date=2026-11-22/hour=07",
    ]
    for path, records in found.items():
        name = path.rsplit("/", 1)[1]
        assert name.startswith("r-1-") and name.endswith(".jsonl.gz"), name
        for record in records:
            assert set(record) == {f.name for f in FIELDS}
    by_id = {r.record_id: r for r in sent}
    got = [r for records in found.values() for r in records]
    assert sorted(r["record_id"] for r in got) == sorted(by_id)
    assert all(json.loads(by_id[r["record_id"]].to_json()) == r for r in got)
    assert value(metrics, "bucketnotify_records_written_total") == 3
    assert value(metrics, "bucketnotify_records_buffered") == 0


async def test_batch_size_bounds_a_file_and_a_full_batch_is_written_before_the_interval(
    tmp_path: Path,
) -> None:
    metrics = DeliveryMetrics()
    async with writer(tmp_path, metrics, batch_size=5, max_buffered=50) as w:
        for n in range(12):
            w.add(rec(n))
        # The interval is an hour: only the full batches can have triggered this.
        for _ in range(200):
            if value(metrics, "bucketnotify_records_written_total") == 12:
                break
            await asyncio.sleep(0.05)
        found = files(tmp_path)
    assert sorted(len(r) for r in found.values()) == [2, 5, 5]
    assert keys(found) == [f"k{n}" for n in range(12)]


async def test_records_are_written_every_flush_interval(tmp_path: Path) -> None:
    metrics = DeliveryMetrics()
    async with writer(tmp_path, metrics, flush_interval_s=0.2) as w:
        w.add(rec(0))
        for _ in range(200):
            if files(tmp_path) if (tmp_path / "v1").exists() else None:
                break
            await asyncio.sleep(0.05)
        assert keys(files(tmp_path)) == ["k0"]
        w.add(rec(1))
        for _ in range(200):
            if len(files(tmp_path)) == 2:
                break
            await asyncio.sleep(0.05)
    assert keys(files(tmp_path)) == ["k0", "k1"]


async def test_closing_writes_what_is_buffered(tmp_path: Path) -> None:
    """The graceful stop (SIGTERM) writes the buffer; nothing waits for the interval."""
    metrics = DeliveryMetrics()
    async with writer(tmp_path, metrics) as w:
        for n in range(3):
            w.add(rec(n))
        assert not (tmp_path / "v1").exists()
    assert keys(files(tmp_path)) == ["k0", "k1", "k2"]


async def test_a_failed_write_keeps_the_batch_under_its_name_for_the_next_flush(
    tmp_path: Path,
) -> None:
    metrics = DeliveryMetrics()
    w = writer(tmp_path, metrics)
    (tmp_path / "v1").write_text("not a directory")  # every write fails
    for n in range(3):
        w.add(rec(n))
    assert not await w.flush()
    assert value(metrics, "bucketnotify_records_write_failures_total") == 1
    assert value(metrics, "bucketnotify_records_written_total") == 0
    assert w.buffered == 3
    w.add(rec(3))
    (tmp_path / "v1").unlink()
    assert await w.flush()
    found = files(tmp_path)
    assert keys(found) == ["k0", "k1", "k2", "k3"]
    assert sorted(len(r) for r in found.values()) == [1, 3], "the failed batch kept as it was"
    assert value(metrics, "bucketnotify_records_written_total") == 4
    assert value(metrics, "bucketnotify_records_dropped_total") == 0


async def test_a_full_buffer_drops_the_oldest_and_counts_them(tmp_path: Path) -> None:
    metrics = DeliveryMetrics()
    w = writer(tmp_path, metrics, batch_size=5, max_buffered=10)
    (tmp_path / "v1").write_text("not a directory")
    for n in range(8):
        w.add(rec(n))
    assert not await w.flush()  # k0-k4 and k5-k7 now wait in failed batches
    for n in range(8, 13):
        w.add(rec(n))
    assert w.buffered == 10
    assert value(metrics, "bucketnotify_records_dropped_total") == 3
    assert value(metrics, "bucketnotify_records_buffered") == 10
    (tmp_path / "v1").unlink()
    assert await w.flush()
    assert keys(files(tmp_path)) == [f"k{n}" for n in range(3, 13)], "the oldest dropped"
    assert value(metrics, "bucketnotify_records_written_total") == 10


async def test_records_added_during_a_slow_write_are_written_too(tmp_path: Path) -> None:
    """A target that takes its time holds up only the flushing task: ``add`` goes on, and
    what it added meanwhile is written next (here by the stop)."""

    class Slow(DirTarget):
        async def write(self, path: str, body: bytes) -> None:
            await asyncio.sleep(0.5)
            await super().write(path, body)

    metrics = DeliveryMetrics()
    w = RecordWriter(Slow(tmp_path), replica="r", metrics=metrics, flush_interval_s=0.05)
    async with w:
        w.add(rec(0))
        await asyncio.sleep(0.2)  # the flush of k0 is under way
        started = time.perf_counter()
        for n in range(1, 1001):
            w.add(rec(n))
        took = time.perf_counter() - started
        assert value(metrics, "bucketnotify_records_written_total") == 0
    print(f"\n1000 adds during a slow write: {took * 1000:.1f} ms")
    assert keys(files(tmp_path)) == [f"k{n}" for n in range(1001)]


def test_a_reader_never_sees_part_of_a_file(tmp_path: Path) -> None:
    """Files appear whole (written aside, fsynced, renamed): a reader polling while large
    batches are written decompresses every file it finds completely."""
    target = DirTarget(tmp_path)
    bodies = [
        gzip.compress(os.urandom(1_000_000) + b"\n") for _ in range(6)
    ]  # incompressible: several MB to write each
    done = threading.Event()
    seen: dict[str, int] = {}
    broken: list[str] = []

    def read() -> None:
        while not done.is_set():
            for path in (tmp_path / "v1").rglob("*.jsonl.gz") if (tmp_path / "v1").exists() else []:
                try:
                    seen[path.name] = len(gzip.decompress(path.read_bytes()))
                except (EOFError, gzip.BadGzipFile, OSError) as exc:
                    broken.append(f"{path.name}: {exc!r}")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i, body in enumerate(bodies):
            asyncio.run(target.write(batch_path("date=2026-11-22/hour=06", f"r{i}", HOUR_6), body))
    finally:
        done.set()
        reader.join()
    assert broken == []
    assert seen, "the reader looked while files were written"
    assert len(list((tmp_path / "v1").rglob("*.jsonl.gz"))) == 6
    assert set(seen.values()) <= {1_000_001}
    assert list((tmp_path / ".tmp").iterdir()) == [], "nothing left aside"


def test_opening_a_dir_target_removes_old_leftovers_only(tmp_path: Path) -> None:
    tmp = tmp_path / ".tmp"
    tmp.mkdir()
    (tmp / "old.tmp").write_bytes(b"x")
    os.utime(tmp / "old.tmp", (time.time() - 7200, time.time() - 7200))
    (tmp / "new.tmp").write_bytes(b"x")
    DirTarget(tmp_path)
    assert [p.name for p in tmp.iterdir()] == ["new.tmp"]


def test_batch_path_keeps_the_replica_name_to_safe_characters() -> None:
    path = batch_path("date=2026-11-22/hour=06", "pod/../x y", HOUR_6)
    directory, name = path.rsplit("/", 1)
    assert directory == "v1/date=2026-11-22/hour=06"
    assert name.startswith(f"pod_.._x_y-{int(HOUR_6 * 1000)}-") and name.endswith(".jsonl.gz")


def operator_settings() -> OperatorSettings:
    return OperatorSettings(
        gateway_endpoint="http://127.0.0.1:1",
        gateway_access_key="AK",
        gateway_secret_key="very-secret-key",  # type: ignore[arg-type]
    )


def test_records_setting_auto_puts_records_beside_the_queues(tmp_path: Path) -> None:
    ops = operator_settings()
    s3 = records_target_for("auto", "s3://queues-bucket", ops)
    assert isinstance(s3, S3Target) and str(s3) == "s3://queues-bucket/records/"
    local = records_target_for("", f"dir://{tmp_path}/queues", ops)
    assert isinstance(local, DirTarget) and local.root == tmp_path / "records"
    assert records_target_for("off", "s3://queues-bucket", ops) is None
    other = records_target_for("s3://reports/delivery/records/", "s3://q", ops)
    assert isinstance(other, S3Target) and str(other) == "s3://reports/delivery/records/"
    plain = records_target_for("s3://reports", "s3://q", ops)
    assert isinstance(plain, S3Target) and str(plain) == "s3://reports/"


@pytest.mark.parametrize(
    "url", ["dir://relative/secret", "http://user:secret@x", "s3://", "s3:///secret", "on"]
)
def test_a_bad_records_setting_says_what_to_use_without_echoing_it(url: str) -> None:
    with pytest.raises(StoreConfigError) as raised:
        records_target_for(url, "s3://q", operator_settings())
    message = str(raised.value)
    assert "use auto, off, dir:///absolute/path or s3://bucket[/prefix]" in message
    assert "secret" not in message


def test_s3_records_need_the_gateway_settings() -> None:
    with pytest.raises(StoreConfigError, match="BUCKETNOTIFY_GATEWAY_ENDPOINT"):
        records_target_for("s3://reports", "dir:///q", OperatorSettings())


def test_the_batch_may_not_exceed_the_buffer() -> None:
    with pytest.raises(ValueError, match="RECORDS_BATCH_SIZE"):
        DeliveryServiceSettings(records_batch_size=10, records_buffer_max=5)
    assert DeliveryServiceSettings().records == "auto"


async def test_the_recorder_makes_ingested_and_round_records(tmp_path: Path) -> None:
    metrics = DeliveryMetrics()
    w = writer(tmp_path, metrics)
    recorder = Recorder(w, "r-1")
    event = {
        "eventName": "ObjectCreated:Put",
        "eventTime": "2026-11-22T06:30:00.000Z",
        "s3": {"configurationId": "c", "bucket": {"name": "b"}, "object": {"key": "k"}},
    }
    recorder.ingested(QUEUE, [(event, "e1")], 11, HOUR_6)
    entry = Entry(id="1", event_id="e1", body=json.dumps(event).encode(), ingest_time=HOUR_6)
    result = RoundResult(
        outcomes=[
            EventOutcome(Outcome.FAILED, entry, event, 1, HOUR_6 + 1, "503"),
            EventOutcome(Outcome.DELIVERED, entry, event, 2, HOUR_6 + 2),
        ]
    )
    recorder.round(QUEUE, shard_of("b", "k", 11), "http", result)
    recorder.round(QUEUE, 0, "http", RoundResult(outcomes=[object()]))  # type: ignore[list-item]
    assert await w.flush()
    got = sorted(
        (r for records in files(tmp_path).values() for r in records),
        key=lambda r: r["outcome_time"],
    )
    common = {
        "schema_version": 1,
        "namespace": "ns",
        "topic": "topic",
        "bucket": "b",
        "key": "k",
        "event_name": "ObjectCreated:Put",
        "configuration_id": "c",
        "event_id": "e1",
        "event_time": HOUR_6,
        "ingest_time": HOUR_6,
        "shard": shard_of("b", "k", 11),
        "replica": "r-1",
    }
    assert [{k: v for k, v in r.items() if k != "record_id"} for r in got] == [
        {
            **common,
            "outcome": "ingested",
            "outcome_time": HOUR_6,
            "attempts": 0,
            "endpoint_kind": None,
            "error": None,
        },
        {
            **common,
            "outcome": "failed",
            "outcome_time": HOUR_6 + 1,
            "attempts": 1,
            "endpoint_kind": "http",
            "error": "503",
        },
        {
            **common,
            "outcome": "delivered",
            "outcome_time": HOUR_6 + 2,
            "attempts": 2,
            "endpoint_kind": "http",
            "error": None,
        },
    ]


@pytest.mark.parametrize("event_time", ["yesterday", "", 17, None], ids=repr)
async def test_an_event_time_that_does_not_parse_is_recorded_as_null(
    tmp_path: Path, event_time: object
) -> None:
    """A record is still written for an event whose ``eventTime`` is not a time: the
    outcome is what counts, and a made-up time would skew the report's latencies."""
    w = writer(tmp_path, DeliveryMetrics())
    event = {
        "eventName": "ObjectCreated:Put",
        "eventTime": event_time,
        "s3": {"configurationId": "c", "bucket": {"name": "b"}, "object": {"key": "k"}},
    }
    Recorder(w, "r-1").ingested(QUEUE, [(event, "e1")], 11, HOUR_6)
    assert await w.flush()
    (record,) = [r for records in files(tmp_path).values() for r in records]
    assert record["event_time"] is None
    assert (record["outcome"], record["key"], record["ingest_time"]) == ("ingested", "k", HOUR_6)


async def test_the_final_write_gives_up_after_10_s_and_logs_how_many_records_it_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A target that never answers (a gateway gone at the stop) holds the stop for the
    writer's default 10 s, not longer: then one ERROR line names the records not written."""

    class Hung(DirTarget):
        async def write(self, path: str, body: bytes) -> None:
            await asyncio.Event().wait()

    w = RecordWriter(Hung(tmp_path), replica="r", metrics=DeliveryMetrics(), flush_interval_s=3600)
    await w.start()
    for n in range(3):
        w.add(rec(n))
    started = time.monotonic()
    await asyncio.wait_for(w.aclose(), 30)
    took = time.monotonic() - started
    assert 10 <= took < 30, took
    (error,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert error.getMessage().startswith("delivery records: stopping with 3 records not written")
