"""The figures of ``dataset.py``, counted by hand from its stories (docs/records.md rules)."""

from __future__ import annotations

from typing import Any, Final

NONE_DELIVERED: Final = {
    "retries_per_event": None,
    "retries_max": None,
    **{f"{m}_{p}": None for m in ("latency", "queue_lag") for p in ("p50", "p95", "p99", "max")},
}


def _figures(**given: Any) -> dict[str, Any]:
    counts = dict.fromkeys(
        (
            "triggered",
            "delivered",
            "failed_attempts",
            "expired",
            "rejected",
            "dead_lettered",
            "lost",
            "duplicates_suppressed",
            "duplicates_delivered",
            "retries",
        ),
        0,
    )
    return {**counts, **given}


def _latency(prefix: str, p50: float, p95: float, p99: float, top: float) -> dict[str, float]:
    return {f"{prefix}_p50": p50, f"{prefix}_p95": p95, f"{prefix}_p99": p99, f"{prefix}_max": top}


# Spark's exact percentile interpolates linearly between ranks: position p * (n - 1).
HOURLY: Final[dict[tuple[str, str, str, str, str], dict[str, Any]]] = {
    # e1..e9 triggered; e1, e2 (late batch), e3, e4, e5, e7, e8 delivered; e5 failed twice
    # (once in the late batch), e6 three times then expired; e7 delivered twice; e8's copy
    # suppressed. Latencies 1, 2, 3, 4, 5, 6, 10 s; queue lags 0.5 s less each.
    ("2026-11-20T10:00Z", "ns-a", "orders", "orders", "ObjectCreated:Put"): _figures(
        triggered=9,
        delivered=7,
        failed_attempts=5,
        expired=1,
        lost=1,
        duplicates_suppressed=1,
        duplicates_delivered=1,
        retries=2,
        retries_per_event=2 / 7,
        retries_max=2,
        **_latency("latency", 4.0, 6 + 0.7 * 4, 6 + 0.94 * 4, 10.0),
        **_latency("queue_lag", 3.5, 5.5 + 0.7 * 4, 5.5 + 0.94 * 4, 9.5),
    ),
    # e9, triggered at 10:59:58, delivered at 11:00:01.5.
    ("2026-11-20T11:00Z", "ns-a", "orders", "orders", "ObjectCreated:Put"): _figures(
        delivered=1,
        retries_per_event=0.0,
        retries_max=0,
        **_latency("latency", 4.0, 4.0, 4.0, 4.0),
        **_latency("queue_lag", 3.5, 3.5, 3.5, 3.5),
    ),
    # e10 rejected, e11 failed once then dead-lettered (its record among bad lines).
    ("2026-11-20T10:00Z", "ns-a", "orders", "orders", "ObjectRemoved:Delete"): {
        **_figures(triggered=2, failed_attempts=1, rejected=1, dead_lettered=1, lost=1),
        **NONE_DELIVERED,
    },
    # e12, read from the truncated file.
    ("2026-11-20T10:00Z", "ns-a", "images", "images", "ObjectCreated:Put"): _figures(
        triggered=1,
        delivered=1,
        retries_per_event=0.0,
        retries_max=0,
        **_latency("latency", 1.5, 1.5, 1.5, 1.5),
        **_latency("queue_lag", 1.0, 1.0, 1.0, 1.0),
    ),
    # e13 (first ingested the day before, its re-send suppressed) and e14: latencies 3.5 and
    # 2 s, queue lags 3 and 1.5 s. Only e14 was triggered today.
    ("2026-11-20T00:00Z", "ns-b", "orders", "orders-b", "ObjectCreated:Put"): _figures(
        triggered=1,
        delivered=2,
        duplicates_suppressed=1,
        retries_per_event=0.0,
        retries_max=0,
        **_latency("latency", 2.75, 2 + 0.95 * 1.5, 2 + 0.99 * 1.5, 3.5),
        **_latency("queue_lag", 2.25, 1.5 + 0.95 * 1.5, 1.5 + 0.99 * 1.5, 3.0),
    ),
}

# All of D: latencies 1, 1.5, 2, 2, 3, 3.5, 4, 4, 5, 6, 10 (n = 11).
TOTALS: Final = _figures(
    triggered=13,
    delivered=11,
    failed_attempts=6,
    expired=1,
    rejected=1,
    dead_lettered=1,
    lost=2,
    duplicates_suppressed=2,
    duplicates_delivered=1,
    retries=2,
    retries_per_event=2 / 11,
    retries_max=2,
    latency_p50=3.5,
    latency_p95=6 + 0.5 * 4,
    latency_p99=6 + 0.9 * 4,
    latency_max=10.0,
)

# Before the late batch: e2 not delivered yet, e5 failed once.
BEFORE_LATE: Final = {"triggered": 9, "delivered": 6, "failed_attempts": 4, "retries": 2}

BAD_LINES: Final = {"malformed": 4, "wrong_schema_version": 1, "unknown_outcome": 1}
WORST_TOPICS: Final = [("ns-a", "orders"), ("ns-b", "orders"), ("ns-a", "images")]
