"""The objects the demo writes to bucket ``uploads``, and which endpoint each must reach.

Each sample notification gets objects its filter matches and objects it must leave out
(wrong prefix, wrong suffix, a key the regex does not match, metadata without the tag,
the tag without the metadata, another department). One object matches two notifications,
so its event reaches two endpoints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OBJECTS", "Expected", "Op", "expected_events", "perform"]

FINANCE = {"department": "finance"}
CONFIDENTIAL = "classification=confidential"


@dataclass(frozen=True)
class Op:
    """One S3 request and the endpoints whose filter it matches ("" for none)."""

    key: str
    endpoints: tuple[str, ...]
    metadata: dict[str, str] = field(default_factory=dict)
    tagging: str = ""
    delete: bool = False
    why: str = ""

    @property
    def event_name(self) -> str:
        return "ObjectRemoved:Delete" if self.delete else "ObjectCreated:Put"


OBJECTS: tuple[Op, ...] = (
    # Left out by every filter; written first, so a wrongly delivered one would arrive early.
    Op("images/cat-01.png", (), why="images/ but not .jpg"),
    Op("thumbnails/cat-01.jpg", (), why=".jpg but not under images/"),
    Op("reports/2026-11.csv.bak", (), why="the regex must match the whole key"),
    Op("reports/summary.csv", (), why="no YYYY-MM"),
    Op("ledger/draft.xlsx", (), metadata=FINANCE, why="finance metadata, no tag"),
    Op("ledger/public.xlsx", (), tagging=CONFIDENTIAL, why="tag, no finance metadata"),
    Op(
        "ledger/sales.xlsx",
        (),
        metadata={"department": "sales"},
        tagging=CONFIDENTIAL,
        why="another department",
    ),
    # Matched.
    *(
        Op(f"images/cat-{n:02d}.jpg", ("http",), why="prefix images/, suffix .jpg")
        for n in range(1, 6)
    ),
    Op("reports/2026-10.csv", ("amqp",), why="regex reports/YYYY-MM.csv"),
    Op("reports/2026-11.csv", ("amqp",), why="regex reports/YYYY-MM.csv"),
    Op("reports/2026-10.csv", ("amqp",), delete=True, why="regex; ObjectRemoved:Delete"),
    Op(
        "ledger/q4-results.xlsx",
        ("kafka",),
        metadata=FINANCE,
        tagging=CONFIDENTIAL,
        why="finance metadata and confidential tag",
    ),
    Op(
        "images/payroll-scan.jpg",
        ("http", "kafka"),
        metadata=FINANCE,
        tagging=CONFIDENTIAL,
        why="matches two notifications",
    ),
)

Expected = dict[str, Counter[tuple[str, str]]]
"""Per endpoint kind: (event name, key) and how often it must arrive (once)."""


def expected_events(ops: tuple[Op, ...] = OBJECTS) -> Expected:
    expected: Expected = {"http": Counter(), "amqp": Counter(), "kafka": Counter()}
    for op in ops:
        for endpoint in op.endpoints:
            expected[endpoint][op.event_name, op.key] += 1
    return expected


def perform(s3: Any, bucket: str, op: Op) -> None:
    if op.delete:
        # A single-object delete: Ceph 16.2 aborts on a multi-object delete in a notified
        # bucket (docs/operator.md).
        s3.delete_object(Bucket=bucket, Key=op.key)
        return
    extra: dict[str, Any] = {}
    if op.metadata:
        extra["Metadata"] = op.metadata
    if op.tagging:
        extra["Tagging"] = op.tagging
    s3.put_object(Bucket=bucket, Key=op.key, Body=f"demo object {op.key}\n".encode(), **extra)
