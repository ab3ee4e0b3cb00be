"""Delivery records: made from the ingest's commits and the worker's rounds, buffered, written.

``Recorder`` turns what happened into ``DeliveryRecord``s (schema: ``bucketnotify.records``,
docs/records.md) and hands them to a ``RecordWriter``, which keeps them in memory and
writes them in batches to a ``RecordTarget`` (``record_targets``: a local directory or a
bucket on the gateway).

Records are observability, not the queue, so nothing here may hold up or fail a delivery:

- ``Recorder`` methods never raise (a bug here is logged, the round goes on);
- ``RecordWriter.add`` only appends to a bounded buffer; when the buffer is full the oldest
  records are dropped and counted (``bucketnotify_records_dropped_total``);
- encoding, compression and writing run in a worker thread, in a task of their own, every
  ``flush_interval_s`` or as soon as ``batch_size`` records are waiting;
- a batch whose write failed keeps its file name and is written again at the next flush
  (the same name: a write that succeeded without our hearing of it is replaced, not
  doubled), after the interval, so a store that is down is not hammered;
- ``aclose`` (the graceful stop) writes what is left, within ``stop_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import re
import secrets
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self

from bucketnotify import compact_json
from bucketnotify.delivery.model.event import shard_of
from bucketnotify.delivery.model.outcomes import RoundResult
from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.model.timings import setting_default
from bucketnotify.metrics import DeliveryMetrics
from bucketnotify.records import FIELDS, SCHEMA_VERSION, DeliveryRecord, Outcome, partition_of

__all__ = ["RecordTarget", "RecordWriter", "Recorder", "batch_path", "encode_batch"]

log = logging.getLogger(__name__)


class RecordTarget(Protocol):
    """Where batches of records go. ``write`` is atomic: a reader sees the whole file or
    nothing; writing the same path again replaces it."""

    async def write(self, path: str, body: bytes) -> None:
        """Store ``body`` at ``path`` (relative: ``v1/date=.../hour=../<name>``) or raise."""
        ...

    def __str__(self) -> str:
        """Where it writes, for log lines (never credentials)."""
        ...


def batch_path(partition: str, replica: str, now: float) -> str:
    """``v<version>/<partition>/<replica>-<millis>-<random>.jsonl.gz``.

    The replica's name is kept to file-name-safe characters; the random part keeps two
    batches of one millisecond apart."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", replica) or "replica"
    name = f"{safe}-{int(now * 1000)}-{secrets.token_hex(4)}.jsonl.gz"
    return f"v{SCHEMA_VERSION}/{partition}/{name}"


_NAMES = tuple(f.name for f in FIELDS)


def encode_batch(records: Iterable[DeliveryRecord]) -> bytes:
    """gzip-compressed JSON lines, one record per line, with exactly the fields of FIELDS.

    The same JSON as ``DeliveryRecord.to_json``, without ``asdict``'s deep copy, which
    takes most of the time of encoding a batch."""
    text = b"".join(compact_json.dumps({n: getattr(r, n) for n in _NAMES}) + b"\n" for r in records)
    return gzip.compress(text, compresslevel=6, mtime=0)


@dataclass
class _Batch:
    path: str
    records: deque[DeliveryRecord] = field(default_factory=deque)


class RecordWriter:
    """A bounded buffer of records, written in batches by a task of its own.

    Use as ``async with RecordWriter(...)``: entering starts the flushing task, leaving
    writes what is left. ``add`` may be called before, during and after.
    """

    def __init__(
        self,
        target: RecordTarget,
        *,
        replica: str,
        metrics: DeliveryMetrics | None = None,
        flush_interval_s: float = setting_default("records_flush_seconds"),
        batch_size: int = setting_default("records_batch_size"),
        max_buffered: int = setting_default("records_buffer_max"),
        stop_timeout_s: float = 10.0,
    ) -> None:
        if batch_size < 1 or max_buffered < batch_size:
            raise ValueError("need 1 <= batch_size <= max_buffered")
        self.target = target
        self.replica = replica
        self.metrics = metrics if metrics is not None else DeliveryMetrics()
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.max_buffered = max_buffered
        self.stop_timeout_s = stop_timeout_s
        self._fresh: deque[DeliveryRecord] = deque()
        """Records not in a batch yet, oldest first."""
        self._pending: deque[_Batch] = deque()
        """Batches named but not written yet (a failed write keeps its batch here)."""
        self._buffered = 0
        """Records in ``_fresh`` and ``_pending`` (the one batch being written excluded)."""
        self._due = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.metrics.records_buffered.set_function(lambda: self._buffered)

    @property
    def buffered(self) -> int:
        return self._buffered

    def add(self, record: DeliveryRecord) -> None:
        """Buffer ``record``; never blocks, never raises for a full buffer."""
        self._fresh.append(record)
        self._buffered += 1
        if self._buffered > self.max_buffered:
            self._drop_oldest()
        if len(self._fresh) >= self.batch_size:
            self._due.set()

    def _drop_oldest(self) -> None:
        # The oldest are in the batches that could not be written; a store that is down
        # for long loses its oldest records, and what happens now is still recorded.
        while self._buffered > self.max_buffered:
            if self._pending:
                oldest = self._pending[0]
                oldest.records.popleft()
                if not oldest.records:
                    self._pending.popleft()
            else:
                self._fresh.popleft()
            self._buffered -= 1
            self.metrics.records_dropped.inc()

    # --- flushing ---------------------------------------------------------------------------

    def _cut(self) -> None:
        """Move the fresh records into batches: one per partition, at most batch_size each."""
        by_partition: dict[str, list[DeliveryRecord]] = {}
        while self._fresh:
            record = self._fresh.popleft()
            by_partition.setdefault(partition_of(record.outcome_time), []).append(record)
        now = time.time()
        for partition, records in by_partition.items():
            for start in range(0, len(records), self.batch_size):
                chunk = records[start : start + self.batch_size]
                self._pending.append(_Batch(batch_path(partition, self.replica, now), deque(chunk)))

    async def flush(self) -> bool:
        """Write every buffered record; False if a write failed (its batch and the later
        ones stay for the next flush)."""
        self._cut()
        while self._pending:
            batch = self._pending.popleft()
            records = list(batch.records)
            self._buffered -= len(records)
            try:
                body = await asyncio.to_thread(encode_batch, records)
                await self.target.write(batch.path, body)
            except asyncio.CancelledError:
                self._requeue(batch)
                raise
            except Exception as exc:
                self._requeue(batch)
                self.metrics.records_write_failures.inc()
                log.warning(
                    "delivery records: writing %d records to %s failed (kept for the next "
                    "try, %d buffered): %s",
                    len(records),
                    self.target,
                    self._buffered,
                    exc,
                )
                return False
            self.metrics.records_written.inc(len(records))
        return True

    def _requeue(self, batch: _Batch) -> None:
        self._pending.appendleft(batch)
        self._buffered += len(batch.records)
        if self._buffered > self.max_buffered:
            self._drop_oldest()

    async def _run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._due.wait(), self.flush_interval_s)
            self._due.clear()
            if self._stopping:
                return
            try:
                if not await self.flush():
                    # The target is failing: try again after the interval, not at the next
                    # full batch.
                    await asyncio.sleep(self.flush_interval_s)
            except Exception:
                log.exception("delivery records: flushing failed")

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="delivery records")

    async def aclose(self) -> None:
        """Stop the task and write what is left, giving up after ``stop_timeout_s``."""
        self._stopping = True
        self._due.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        written = False
        try:
            async with asyncio.timeout(self.stop_timeout_s):
                written = await self.flush()
        except TimeoutError:
            pass
        except Exception:
            log.exception("delivery records: the last flush failed")
        if not written and self._buffered:
            log.error(
                "delivery records: stopping with %d records not written to %s",
                self._buffered,
                self.target,
            )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Recorder:
    """Makes the records of one replica; its methods never raise.

    ``error`` is the push outcome's (``endpoints.base.outcome_of`` has redacted the
    endpoint's credentials from it, and HTTP endpoints name only scheme, host and port) or
    the worker's reason for a drop, which holds no data of the Topic's Secrets."""

    def __init__(self, writer: RecordWriter, replica: str) -> None:
        self.writer = writer
        self.replica = replica

    def ingested(
        self,
        queue: QueueName,
        events: Sequence[tuple[dict[str, Any], str]],
        shards: int,
        ingest_time: float,
    ) -> None:
        """``events`` (record, event id) were committed to ``queue`` at ``ingest_time``."""
        try:
            for event, event_id in events:
                s3 = event["s3"]
                self.writer.add(
                    DeliveryRecord.of_event(
                        event,
                        outcome=Outcome.INGESTED,
                        namespace=queue.namespace,
                        topic=queue.topic,
                        event_id=event_id,
                        ingest_time=ingest_time,
                        attempts=0,
                        endpoint_kind=None,
                        shard=shard_of(s3["bucket"]["name"], s3["object"]["key"], shards),
                        replica=self.replica,
                        outcome_time=ingest_time,
                    )
                )
        except Exception:
            log.exception("delivery records: recording an ingest of %s failed", queue)

    def round(
        self, queue: QueueName, shard: int, endpoint_kind: str | None, result: RoundResult
    ) -> None:
        """The outcomes of one round of ``queue``'s ``shard``."""
        try:
            for o in result.outcomes:
                self.writer.add(
                    DeliveryRecord.of_event(
                        o.record,
                        outcome=o.outcome,
                        namespace=queue.namespace,
                        topic=queue.topic,
                        event_id=o.entry.event_id,
                        ingest_time=o.entry.ingest_time,
                        attempts=o.attempts,
                        endpoint_kind=endpoint_kind,
                        shard=shard,
                        replica=self.replica,
                        error=o.error,
                        outcome_time=o.at,
                    )
                )
        except Exception:
            log.exception("delivery records: recording a round of %s#%d failed", queue, shard)
