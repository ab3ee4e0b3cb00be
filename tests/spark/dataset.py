"""A small set of delivery record files whose figures are known by hand (see EXPECTED).

Day D is 2026-11-20. The files cover the day before (read as look-back), D, and the day
after (outside the range, never read). Every story of docs/records.md appears once: first
try deliveries, retries, an expired and a rejected event, a dead letter, a failover
duplicate delivery, a gateway re-send suppressed, an event that crosses an hour and one that
crosses midnight, a batch uploaded twice, a late batch, a truncated file, a file that is not
gzip, an empty file, a file with a wrong name, a writer's hidden temporary file, and lines
that are not records for four different reasons.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from dataclasses import dataclass, field
from typing import Final, Protocol

from bucketnotify.records import DeliveryRecord, Outcome, partition_of
from tests.recordfiles import batch_key, encode, encode_records

DAY: Final = dt.date(2026, 11, 20)
MIDNIGHT: Final = dt.datetime(2026, 11, 20, tzinfo=dt.UTC).timestamp()


def at(hour: int, minute: int = 0, second: float = 0.0, day: int = 0) -> float:
    """Epoch seconds of hh:mm:ss on D (+ ``day``). Fractions are multiples of 1/4 so that
    every difference below is exact in binary floating point."""
    return MIDNIGHT + day * 86400 + hour * 3600 + minute * 60 + second


class Sink(Protocol):
    def put(self, key: str, data: bytes) -> str: ...


@dataclass(frozen=True)
class Event:
    namespace: str
    topic: str
    bucket: str
    event_name: str
    event_id: str
    event_time: float
    ingest_time: float

    def record(
        self, outcome: Outcome, when: float, attempts: int = 0, replica: str = "r1"
    ) -> DeliveryRecord:
        return DeliveryRecord(
            outcome=outcome,
            namespace=self.namespace,
            topic=self.topic,
            bucket=self.bucket,
            key=f"objects/{self.event_id}",
            event_name=self.event_name,
            configuration_id="notif-1",
            event_id=self.event_id,
            event_time=self.event_time,
            ingest_time=self.ingest_time,
            outcome_time=when,
            attempts=attempts,
            endpoint_kind=None if outcome is Outcome.INGESTED else "http",
            shard=0,
            replica=replica,
            error="HTTP 503" if outcome is Outcome.FAILED else None,
        )

    def ingested(self, when: float | None = None) -> DeliveryRecord:
        return self.record(Outcome.INGESTED, self.ingest_time if when is None else when)


def orders(event_id: str, event_time: float, name: str = "ObjectCreated:Put") -> Event:
    return Event("ns-a", "orders", "orders", name, event_id, event_time, event_time + 0.5)


PUT: Final = "ObjectCreated:Put"
DELETE: Final = "ObjectRemoved:Delete"


@dataclass
class Written:
    """What was written, for the assertions on the input report."""

    files: list[str] = field(default_factory=list)
    """``.jsonl.gz`` files in the read range (look-back day and D)."""
    lines: int = 0
    """Non-blank lines in them (recovered lines of the truncated file included)."""
    valid_lines: int = 0
    record_ids: set[str] = field(default_factory=set)
    bad_files: dict[str, str] = field(default_factory=dict)
    """path -> the start of the reason the job must give."""
    skipped: list[str] = field(default_factory=list)


@dataclass
class Dataset:
    sink: Sink
    written: Written = field(default_factory=Written)
    _millis: int = 1_763_000_000_000

    def _put(self, key: str, data: bytes) -> str:
        path = self.sink.put(key, data)
        if key.endswith(".jsonl.gz") and not key.rsplit("/", 1)[-1].startswith("."):
            in_range = f"date={DAY - dt.timedelta(days=1)}" in key or f"date={DAY}" in key
            if in_range:
                self.written.files.append(path)
        return path

    def batch(self, *records: DeliveryRecord, replica: str = "r1", copies: int = 1) -> None:
        self._millis += 1000
        data = encode_records(records)
        for _ in range(copies):
            self._put(batch_key(list(records), replica, self._millis), data)
            if records[0].outcome_time >= at(0, day=-1) and records[0].outcome_time < at(24):
                self.written.lines += len(records)
                self.written.valid_lines += len(records)
                self.written.record_ids.update(r.record_id for r in records)

    def raw(self, key: str, data: bytes, *, bad: str | None = None, lines: int = 0) -> str:
        path = self._put(key, data)
        if bad is not None:
            self.written.bad_files[path] = bad
        self.written.lines += lines
        return path


def hour_key(hour: int, name: str) -> str:
    return f"v1/{partition_of(at(hour))}/{name}"


def write_main(sink: Sink) -> Dataset:
    """Everything but the late batch (see ``write_late``)."""
    data = Dataset(sink)
    # Group ns-a/orders/orders/Put, hour 10.
    e = {i: orders(f"e{i}", at(10, i - 1)) for i in range(1, 9)}
    # e1: delivered at once, e2e 1 s; its batch is uploaded twice (a retried upload).
    data.batch(e[1].ingested(), e[1].record(Outcome.DELIVERED, at(10, 0, 1), 1), copies=2)
    # e2's delivery is in the late batch; e3, e4: delivered at once, e2e 3 s and 4 s.
    data.batch(e[2].ingested(), e[3].ingested(), e[4].ingested())
    data.batch(
        e[3].record(Outcome.DELIVERED, at(10, 2, 3), 1),
        e[4].record(Outcome.DELIVERED, at(10, 3, 4), 1),
    )
    # e5: two failed attempts (the second is in the late batch), delivered at the third.
    data.batch(e[5].ingested(), e[5].record(Outcome.FAILED, at(10, 4, 2), 1))
    data.batch(e[5].record(Outcome.DELIVERED, at(10, 4, 10), 3))
    # e6: three failed attempts, then expired: lost.
    data.batch(
        e[6].ingested(),
        e[6].record(Outcome.FAILED, at(10, 5, 1), 1),
        e[6].record(Outcome.FAILED, at(10, 5, 2), 2),
        e[6].record(Outcome.FAILED, at(10, 5, 3), 3),
        e[6].record(Outcome.EXPIRED, at(10, 5, 3.25), 3),
    )
    # e7: delivered, then delivered again by another replica after a failover.
    data.batch(e[7].ingested(), e[7].record(Outcome.DELIVERED, at(10, 6, 5), 1))
    data.batch(e[7].record(Outcome.DELIVERED, at(10, 6, 20), 1, replica="r2"), replica="r2")
    # e8: the gateway sent it twice; the copy is suppressed.
    data.batch(
        e[8].ingested(),
        e[8].ingested(at(10, 7, 3)),
        e[8].record(Outcome.DELIVERED, at(10, 7, 6), 1),
        e[8].record(Outcome.DUPLICATE, at(10, 7, 7), 0),
    )
    # e9: triggered at 10:59:58, delivered at 11:00:02 (e2e 4 s): it counts in both hours.
    e9 = orders("e9", at(10, 59, 57.5))
    data.batch(e9.ingested())
    data.batch(e9.record(Outcome.DELIVERED, at(11, 0, 1.5), 1))
    # Group ns-a/orders/orders/Delete, hour 10: one rejected, one dead-lettered.
    e10 = orders("e10", at(10, 10), DELETE)
    e11 = orders("e11", at(10, 11), DELETE)
    data.batch(
        e10.ingested(),
        e10.record(Outcome.REJECTED, at(10, 10, 1), 1),
        e11.ingested(),
        e11.record(Outcome.FAILED, at(10, 11, 1), 1),
    )
    # e11's dead letter sits in a file between lines that are not records.
    dead = e11.record(Outcome.DEAD_LETTERED, at(10, 11, 2), 2)
    good = json.loads(dead.to_json())
    bad_lines = [
        "this is not json",
        json.dumps({**good, "record_id": "v2-record", "schema_version": 2}),
        json.dumps({k: v for k, v in good.items() if k != "record_id"}),
        json.dumps({**good, "record_id": "boom", "outcome": "exploded"}),
        "[1, 2, 3]",
        json.dumps({**good, "record_id": "typed", "attempts": "three"}),
        "",
        dead.to_json(),
    ]
    data.raw(hour_key(10, "r1-1763000100000-badlines.jsonl.gz"), encode(bad_lines), lines=7)
    data.written.valid_lines += 1
    data.written.record_ids.add(dead.record_id)
    # Group ns-a/images: its two records survive only in a truncated file.
    e12 = Event("ns-a", "images", "images", PUT, "e12", at(10, 20), at(10, 20, 0.5))
    whole = encode_records([e12.ingested(), e12.record(Outcome.DELIVERED, at(10, 20, 1.5), 1)])
    data.raw(
        hour_key(10, "r1-1763000200000-cut.jsonl.gz"),
        whole[:-8],  # without the gzip trailer (CRC and size): an upload cut short
        bad="truncated",
        lines=2,
    )
    data.written.valid_lines += 2
    data.written.record_ids.update(
        json.loads(x)["record_id"] for x in gzip.decompress(whole).decode().splitlines()
    )
    data.raw(
        hour_key(10, "r3-1763000300000-junk.jsonl.gz"),
        b"this is not gzip",
        bad="not readable as gzip",
    )
    data.raw(hour_key(10, "r3-1763000400000-empty.jsonl.gz"), b"", bad="empty file")
    data.raw(hour_key(10, "notes.txt"), b"hello", bad="not a .jsonl.gz file")
    data.written.skipped.append(
        data.raw(hour_key(10, ".r1-1763000500000-tmp.jsonl.gz"), encode(["partial"]))
    )
    # Group ns-b/orders: e13 ingested just before midnight (look-back day) and delivered
    # just after; the gateway re-sends it after midnight; e14 is an ordinary delivery; e15
    # lives on the look-back day only; e16 on the day after the range.
    e13 = Event("ns-b", "orders", "orders-b", PUT, "e13", at(23, 59, 57.5, -1), at(23, 59, 58, -1))
    data.batch(e13.ingested())
    e15 = Event("ns-b", "orders", "orders-b", PUT, "e15", at(23, 10, 0, -1), at(23, 10, 1, -1))
    data.batch(e15.ingested(), e15.record(Outcome.DELIVERED, at(23, 10, 2, -1), 1))
    e14 = Event("ns-b", "orders", "orders-b", PUT, "e14", at(0, 30), at(0, 30, 0.5))
    data.batch(
        e13.record(Outcome.DELIVERED, at(0, 0, 1), 1),
        e13.ingested(at(0, 0, 3)),
        e13.record(Outcome.DUPLICATE, at(0, 0, 4), 0),
        e14.ingested(),
        e14.record(Outcome.DELIVERED, at(0, 30, 2), 1),
    )
    e16 = Event("ns-b", "orders", "orders-b", PUT, "e16", at(0, 10, 0, 1), at(0, 10, 1, 1))
    data.batch(e16.ingested(), e16.record(Outcome.DELIVERED, at(0, 10, 2, 1), 1))
    return data


def write_late(data: Dataset) -> None:
    """The late batch: hour 10 records written at 13:00 (a replica that was slow to flush)."""
    e2 = orders("e2", at(10, 1))
    e5 = orders("e5", at(10, 4))
    data._millis = int(at(13) * 1000)
    data.batch(
        e2.record(Outcome.DELIVERED, at(10, 1, 2), 1),
        e5.record(Outcome.FAILED, at(10, 4, 5), 2),
    )
