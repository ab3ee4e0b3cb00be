"""The names and bodies both stores write, and the accounting they share.

Everything ``stats`` and ``reserve`` need is in the *names*, so that a directory listing or
an S3 LIST answers them without reading a single body:

- a batch (the events of one commit) is ``<batch-id>.n<count:06d>.b<bytes>``: its entries
  and their body bytes. The batch id ``<time_ns:020d>-<12 hex>`` sorts in commit order.
- a reservation is ``<id>.s<shard>.n<entries>.b<bytes>.e<expiry in epoch ms>``.

Removing some entries of a batch writes the rest under a new name with the same batch id
and a smaller count, then deletes the old name. A crash in between leaves both; the one
with the smallest count is the current one (removal only ever shrinks a batch, and updates
keep the name), and the zero-padded count makes it the first of its batch id in sorted
order. The others are stale supersets: ignored, and deleted with the batch. So a crash can
never lose an entry, nor bring back one whose removal returned.

A batch body is JSON lines, one entry each, in order. The entry's id is
``<batch-id>.<index:06d>``: the index is kept in the line and the batch id comes from the
name, so a body can be written before the id is chosen. Bodies are bytes: UTF-8 (every
event the ingest takes) is kept as a JSON string, anything else goes through
``surrogateescape`` and ASCII-only JSON, so any bytes come back unchanged and an event that
is JSON (all of them) stays readable to someone looking at the queue. Lines written
ASCII-only throughout (as this store once wrote every line) read the same.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace

from bucketnotify import compact_json
from bucketnotify.delivery.model.queue import (
    Entry,
    QueueFull,
    QueueLimits,
    QueueName,
    QueueStats,
    Reservation,
    ShardStats,
)

MAX_BATCH_ENTRIES = 999_999
"""What the six digits of a batch's count and an entry's index can say."""

_BATCH_NAME = re.compile(r"^(?P<batch>\d{20}-[0-9a-f]{12})\.n(?P<count>\d{6})\.b(?P<bytes>\d+)$")
_RESERVATION_NAME = re.compile(
    r"^(?P<id>[0-9a-f]{32})\.s(?P<shard>\d+)\.n(?P<entries>\d+)\.b(?P<bytes>\d+)\.e(?P<ms>\d+)$"
)
_ENTRY_ID = re.compile(r"^(?P<batch>\d{20}-[0-9a-f]{12})\.(?P<index>\d{6})$")

_clock_lock = threading.Lock()
_last_ns = 0


def check_queue_name(queue: QueueName) -> None:
    """Names become path segments and key parts: nothing that could escape or collide."""
    for part in (queue.namespace, queue.topic):
        if not part or "/" in part or "\x00" in part or part.startswith("."):
            raise ValueError(f"queue name {queue} cannot be stored (empty, '/' or leading '.')")


def new_batch_id(after_ns: int = 0) -> tuple[str, int]:
    """A batch id later than any this process made before, and than ``after_ns``.

    Time first, so ids sort in commit order across processes as far as their clocks agree;
    a clock that is behind files its commits earlier, where they are still listed first
    and delivered (reordered, never lost). The random part keeps two writers apart.
    """
    global _last_ns
    with _clock_lock:
        stamp = max(time.time_ns(), _last_ns + 1, after_ns + 1)
        _last_ns = stamp
    return f"{stamp:020d}-{secrets.token_hex(6)}", stamp


def entry_id(batch: str, index: int) -> str:
    return f"{batch}.{index:06d}"


def batch_of(entry: str) -> str | None:
    """The batch an entry id belongs to; None for an id no store of ours made."""
    match = _ENTRY_ID.match(entry)
    return match["batch"] if match else None


@dataclass(frozen=True)
class BatchName:
    batch: str
    count: int
    bytes: int

    def __str__(self) -> str:
        return f"{self.batch}.n{self.count:06d}.b{self.bytes}"

    @classmethod
    def parse(cls, name: str) -> BatchName | None:
        match = _BATCH_NAME.match(name)
        if match is None:
            return None
        return cls(match["batch"], int(match["count"]), int(match["bytes"]))

    @classmethod
    def of(cls, batch: str, entries: Sequence[Entry]) -> BatchName:
        return cls(batch, len(entries), sum(len(e.body) for e in entries))


@dataclass(frozen=True)
class Batch:
    """One batch id's objects: the current name and the stale ones a crash left behind."""

    current: BatchName
    stale: tuple[BatchName, ...] = ()


def batches(names: Iterable[str]) -> Iterator[Batch]:
    """Group sorted names by batch id; the first name of each id is the current one."""
    group: list[BatchName] = []
    for name in names:
        parsed = BatchName.parse(name)
        if parsed is None:
            continue  # not ours: a temporary file, a stray upload
        if group and parsed.batch != group[0].batch:
            yield Batch(group[0], tuple(group[1:]))
            group = []
        group.append(parsed)
    if group:
        yield Batch(group[0], tuple(group[1:]))


def encode_batch(entries: Sequence[Entry]) -> bytes:
    lines = []
    for entry in entries:
        _, _, index = entry.id.rpartition(".")
        line = {
            "i": int(index),
            "event_id": entry.event_id,
            "ingest_time": entry.ingest_time,
            "attempts": entry.attempts,
            "not_before": entry.not_before,
        }
        if entry.first_failure:  # written only once a push failed: most entries never do
            line["first_failure"] = entry.first_failure
            line["last_failure"] = entry.last_failure
            line["last_error"] = entry.last_error
        try:
            line["body"] = entry.body.decode("utf-8")
            lines.append(compact_json.dumps(line) + b"\n")
        except UnicodeError:  # a body (or an identity) that is not UTF-8
            line["body"] = entry.body.decode("utf-8", "surrogateescape")
            text = json.dumps(line, ensure_ascii=True, separators=(",", ":"))
            lines.append(text.encode("ascii") + b"\n")
    return b"".join(lines)


def decode_batch(batch: str, data: bytes) -> list[Entry]:
    entries = []
    for line in data.splitlines():
        if not line.strip():
            continue
        row = compact_json.loads(line)
        entries.append(
            Entry(
                id=entry_id(batch, int(row["i"])),
                event_id=str(row["event_id"]),
                body=str(row["body"]).encode("utf-8", "surrogateescape"),
                ingest_time=float(row["ingest_time"]),
                attempts=int(row["attempts"]),
                not_before=float(row["not_before"]),
                first_failure=float(row.get("first_failure", 0.0)),
                last_failure=float(row.get("last_failure", 0.0)),
                last_error=str(row.get("last_error", "")),
            )
        )
    return sorted(entries, key=lambda e: e.id)


def new_entries(batch: str, events: Sequence[tuple[str, bytes]], now: float) -> list[Entry]:
    return [
        Entry(id=entry_id(batch, index), event_id=event_id, body=body, ingest_time=now)
        for index, (event_id, body) in enumerate(events)
    ]


def updated(entry: Entry, update: Entry | None) -> Entry:
    """``entry`` with the delivery state of ``update``; all else stays as committed."""
    if update is None:
        return entry
    return replace(
        entry,
        attempts=update.attempts,
        not_before=update.not_before,
        first_failure=update.first_failure,
        last_failure=update.last_failure,
        last_error=update.last_error,
    )


def encode_meta(shards: int, limits: QueueLimits) -> bytes:
    return json.dumps({"shards": shards, "limits": asdict(limits)}, indent=1).encode()


def decode_meta(data: bytes) -> tuple[int, QueueLimits]:
    meta = json.loads(data)
    # Limits a later release adds are dropped here, not fatal: old readers keep working.
    known = {f.name for f in fields(QueueLimits)}
    limits = QueueLimits(**{k: v for k, v in meta.get("limits", {}).items() if k in known})
    return int(meta["shards"]), limits


def reservation_name(reservation: Reservation) -> str:
    ms = round(reservation.expires_at * 1000)
    return (
        f"{reservation.id}.s{reservation.shard}.n{reservation.entries}.b{reservation.bytes}.e{ms}"
    )


def parse_reservation(queue: QueueName, name: str) -> Reservation | None:
    match = _RESERVATION_NAME.match(name)
    if match is None:
        return None
    return Reservation(
        id=match["id"],
        queue=queue,
        shard=int(match["shard"]),
        entries=int(match["entries"]),
        bytes=int(match["bytes"]),
        expires_at=int(match["ms"]) / 1000,
    )


COVER_SUFFIX = ".cover"
"""Marks a reservation marker that covers a replica's headroom (the S3 store's docstring):
it counts against the bounds like any reservation, but is not one in a queue's stats."""


def parse_marker(queue: QueueName, name: str) -> tuple[Reservation, bool] | None:
    """A marker's reservation and whether it is a cover; None for a foreign name."""
    cover = name.endswith(COVER_SUFFIX)
    reservation = parse_reservation(queue, name.removesuffix(COVER_SUFFIX))
    return None if reservation is None else (reservation, cover)


def new_reservation(
    queue: QueueName,
    shard: int,
    entries: int,
    size: int,
    now: float,
    limits: QueueLimits,
) -> Reservation:
    # Whole milliseconds, rounded up, so that the name says exactly what the object holds.
    ms = math.ceil((now + limits.reservation_timeout_s) * 1000)
    return Reservation(
        id=secrets.token_hex(16),
        queue=queue,
        shard=shard,
        entries=entries,
        bytes=size,
        expires_at=ms / 1000,
    )


def check_request(shards: int, shard: int, entries: int, size: int) -> None:
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is not one of the queue's {shards}")
    if not 0 < entries <= MAX_BATCH_ENTRIES:
        raise ValueError(f"a reservation holds 1 to {MAX_BATCH_ENTRIES} entries, not {entries}")
    if size < 0:
        raise ValueError(f"size {size} is negative")


def check_commit(reservation: Reservation, events: Sequence[tuple[str, bytes]]) -> None:
    """More than was reserved would break the bounds every other writer relies on."""
    size = sum(len(body) for _, body in events)
    if len(events) > reservation.entries or size > reservation.bytes:
        raise ValueError(
            f"commit of {len(events)} entries, {size} bytes exceeds its reservation of "
            f"{reservation.entries} entries, {reservation.bytes} bytes"
        )


def usage(
    shards: int,
    batches_by_shard: dict[int, list[Batch]],
    reservations: Iterable[Reservation],
    now: float,
) -> QueueStats:
    """Stats from names alone; shards past ``shards`` still holding entries are included."""
    counts = {
        shard: (sum(b.current.count for b in found), sum(b.current.bytes for b in found))
        for shard, found in batches_by_shard.items()
    }
    return usage_of_counts(shards, counts, reservations, now)


def usage_of_counts(
    shards: int,
    counts_by_shard: dict[int, tuple[int, int]],
    reservations: Iterable[Reservation],
    now: float,
) -> QueueStats:
    """Stats from (entries, bytes) per shard; shards past ``shards`` count while not empty."""
    numbers = {n: [0, 0, 0] for n in range(shards)}
    for shard, (entries, size) in counts_by_shard.items():
        if entries or shard in numbers:
            held = numbers.setdefault(shard, [0, 0, 0])
            held[0] += entries
            held[1] += size
    expired = 0
    for reservation in reservations:
        if reservation.expires_at > now:
            numbers.setdefault(reservation.shard, [0, 0, 0])[2] += 1
        else:
            expired += 1
    return QueueStats(
        {shard: ShardStats(*counts) for shard, counts in sorted(numbers.items())}, expired
    )


def held(stats: QueueStats, reservations: Iterable[Reservation], now: float) -> tuple[int, int]:
    """Entries and bytes a queue holds: committed, and reserved by live reservations."""
    live = [r for r in reservations if r.expires_at > now]
    return stats.entries + sum(r.entries for r in live), stats.bytes + sum(r.bytes for r in live)


def check_room(
    stats: QueueStats,
    reservations: Iterable[Reservation],
    limits: QueueLimits,
    entries: int,
    size: int,
    now: float,
) -> None:
    held_entries, held_bytes = held(stats, reservations, now)
    if held_entries + entries > limits.max_entries or held_bytes + size > limits.max_bytes:
        raise QueueFull(
            f"no room for {entries} entries, {size} bytes: {held_entries} entries, "
            f"{held_bytes} bytes held (committed or reserved) of {limits.max_entries}, "
            f"{limits.max_bytes}"
        )
