"""The JSON summary: plain data built from the collected figures, and the worst topics."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Final

from pyspark.sql import Row

from bucketnotify_report.inputs import InputReport

__all__ = ["WORST_TOPICS", "build", "worst_topics"]

WORST_TOPICS: Final = 5


def _plain(row: Row | dict[str, Any]) -> dict[str, Any]:
    values = row.asDict() if isinstance(row, Row) else row
    return {key: value for key, value in values.items() if key != "date"}


def failure_ratio(figures: dict[str, Any]) -> float | None:
    """Share of push attempts that failed (a failed attempt, or one that delivered)."""
    pushes = figures["failed_attempts"] + figures["delivered"] + figures["duplicates_delivered"]
    return figures["failed_attempts"] / pushes if pushes else None


def worst_topics(topics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Topics ranked by lost events, then failed share of pushes, then p99 latency."""

    def badness(topic: dict[str, Any]) -> tuple[float, float, float]:
        return (
            topic["lost"],
            topic["failure_ratio"] or 0.0,
            topic["latency_p99"] if topic["latency_p99"] is not None else 0.0,
        )

    ranked = sorted(topics, key=lambda t: (badness(t), t["namespace"], t["topic"]), reverse=True)
    return ranked[:WORST_TOPICS]


def build(
    *,
    first: str,
    last: str,
    lookback_days: int,
    inputs: InputReport,
    totals: dict[str, Any],
    topics: list[Row],
    hours: list[Row],
    outputs: dict[str, str],
) -> dict[str, Any]:
    """The summary; sorted and free of run timestamps, so a rerun writes the same bytes."""
    topic_figures = []
    for row in sorted(topics, key=lambda r: (r["namespace"], r["topic"])):
        figures = _plain(row)
        figures["failure_ratio"] = failure_ratio(figures)
        topic_figures.append(figures)
    total = _plain(totals)
    total["failure_ratio"] = failure_ratio(total)
    report = asdict(inputs)
    report["bad_files"].sort(key=lambda bad: bad["path"])
    report["skipped_files"].sort()
    return {
        "range": {"first": first, "last": last, "lookback_days": lookback_days},
        "input": report,
        "totals": total,
        "topics": topic_figures,
        "worst_topics": [
            {"namespace": t["namespace"], "topic": t["topic"]} for t in worst_topics(topic_figures)
        ],
        "hours": [_plain(row) for row in sorted(hours, key=lambda r: r["hour"])],
        "outputs": outputs,
    }
