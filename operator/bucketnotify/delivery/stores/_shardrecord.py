"""The record in each shard's lock file: the shard's last batch time, and its entries and
bytes while the record is *clean* (see the store's "Costs"): marked dirty before the names
change and clean after, naming the queue's incarnation and the machine's boot id, so that a
writer that died in between, a reboot or a queue made again is never trusted."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BOOT_ID",
    "INCARNATION",
    "Counts",
    "Record",
    "read_record",
    "write_record",
]


INCARNATION = re.compile(r"[0-9a-f]{32}")
_UNKNOWN_INCARNATION = "0" * 32
_BOOT_ID_FORMAT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_RECORD = re.compile(
    rb"(?P<stamp>\d{20}) (?P<entries>\d{12}) (?P<bytes>\d{20}) (?P<state>[cd]) "
    rb"(?P<incarnation>[0-9a-f]{32}) (?P<boot>[0-9a-f-]{36}) (?P<again>\d{20})\n"
)


def _boot_id() -> str | None:
    """This boot of the machine (Linux); None elsewhere, and then no record is trusted."""
    try:
        found = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return found if _BOOT_ID_FORMAT.fullmatch(found) else None


BOOT_ID = _boot_id()


@dataclass(frozen=True)
class Counts:
    entries: int
    bytes: int

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.entries + other.entries, self.bytes + other.bytes)


@dataclass(frozen=True)
class Record:
    """What a shard's lock file holds: the last batch time, and the counts if clean."""

    stamp: int
    counts: Counts | None = None
    incarnation: str = ""
    boot: str = ""

    def counts_for(self, incarnation: str | None) -> Counts | None:
        """The counts, if they describe the names of ``incarnation`` on this boot."""
        if (
            self.counts is None
            or incarnation is None
            or incarnation == _UNKNOWN_INCARNATION
            or self.incarnation != incarnation
            or BOOT_ID is None
            or self.boot != BOOT_ID
        ):
            return None
        return self.counts


def read_record(lock: int) -> Record:
    data = os.pread(lock, 256, 0)
    # A new lock file has no record yet, a damaged one no whole record: the stamp at its
    # start, if there is one, and the counts read from the names.
    stamp = int(data[:20]) if data[:20].isdigit() else 0
    match = _RECORD.fullmatch(data)
    # The stamp twice, at both ends: a record whose two stamps differ was not written
    # whole, and must not pass as clean.
    if match is None or match["state"] != b"c" or match["again"] != match["stamp"]:
        return Record(stamp)
    counts = Counts(int(match["entries"]), int(match["bytes"]))
    return Record(stamp, counts, match["incarnation"].decode(), match["boot"].decode())


def write_record(lock: int, stamp: int, counts: Counts | None, incarnation: str | None) -> None:
    """Clean with ``counts``, or dirty (None: the names are changing, or are not known).

    Fixed length, so one pwrite replaces the whole record (an older stamp-only one too).
    """
    clean = counts is not None and incarnation is not None and BOOT_ID is not None
    entries, size = (counts.entries, counts.bytes) if counts is not None else (0, 0)
    record = (
        f"{stamp:020d} {entries:012d} {size:020d} {'c' if clean else 'd'} "
        f"{incarnation or _UNKNOWN_INCARNATION} {BOOT_ID or '0' * 36} {stamp:020d}\n"
    )
    os.pwrite(lock, record.encode(), 0)
