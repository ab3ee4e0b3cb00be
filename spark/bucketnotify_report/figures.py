"""The derived figures of ``docs/records.md``, per any grouping of the records.

An event is identified by (namespace, topic, event_id). It counts as triggered in the hour of
its first ``ingested`` record and as delivered in the hour of its first ``delivered`` record;
a later ``delivered`` record of the same event is a duplicate delivery. Latency, queue lag and
retries come from the first delivery. Every other outcome counts in the hour it happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from bucketnotify.records import Outcome

__all__ = [
    "COUNTS",
    "GROUP",
    "PERCENTILES",
    "aggregate",
    "figures_of",
    "no_figures",
    "with_event_flags",
]

GROUP: Final = ("namespace", "topic", "bucket", "event_name")
PERCENTILES: Final = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
COUNTS: Final = (
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
)


def _is(outcome: Outcome) -> Column:
    return F.col("outcome") == outcome.value


def with_event_flags(records: DataFrame) -> DataFrame:
    """Records with ``hour``, ``date``, ``first_ingest``, ``first_delivery``, ``e2e`` and ``lag``.

    Feed it the look-back days too, so that an event first ingested or delivered the day
    before is not counted again today.
    """
    firsts = Window.partitionBy("namespace", "topic", "event_id", "outcome").orderBy(
        "outcome_time", "record_id"
    )
    counted = _is(Outcome.INGESTED) | _is(Outcome.DELIVERED)
    flagged = (
        records.withColumn("_rank", F.when(counted, F.row_number().over(firsts)))
        .withColumn("first_ingest", _is(Outcome.INGESTED) & (F.col("_rank") == 1))
        .withColumn("first_delivery", _is(Outcome.DELIVERED) & (F.col("_rank") == 1))
        .withColumn("hour", F.timestamp_seconds(F.floor(F.col("outcome_time") / 3600) * 3600))
        .withColumn("date", F.to_date("hour"))
    )
    on_first = F.col("first_delivery")
    return flagged.select(
        *GROUP,
        "hour",
        "date",
        "outcome",
        "first_ingest",
        "first_delivery",
        F.when(on_first, F.col("attempts") - 1).alias("retries"),
        F.when(on_first, F.col("outcome_time") - F.col("event_time")).alias("e2e"),
        F.when(on_first, F.col("outcome_time") - F.col("ingest_time")).alias("lag"),
    )


def aggregate(flagged: DataFrame, groupings: Sequence[tuple[str, ...]]) -> DataFrame:
    """The figures of the issue per each grouping (``()``: one row of totals), in one pass.

    Column ``grouping`` is the index of the row's grouping in ``groupings``; the key columns
    of the other groupings are null in its rows (see ``figures_of``).
    """
    keys = list(dict.fromkeys(key for grouping in groupings for key in grouping))
    delivered = F.count_if("first_delivery")
    expired = F.count_if(_is(Outcome.EXPIRED))
    rejected = F.count_if(_is(Outcome.REJECTED))
    retries = F.coalesce(F.sum("retries"), F.lit(0))
    columns = [
        F.count_if("first_ingest").alias("triggered"),
        delivered.alias("delivered"),
        F.count_if(_is(Outcome.FAILED)).alias("failed_attempts"),
        expired.alias("expired"),
        rejected.alias("rejected"),
        F.count_if(_is(Outcome.DEAD_LETTERED)).alias("dead_lettered"),
        (expired + rejected).alias("lost"),
        F.count_if(_is(Outcome.DUPLICATE)).alias("duplicates_suppressed"),
        F.count_if(_is(Outcome.DELIVERED) & ~F.col("first_delivery")).alias("duplicates_delivered"),
        retries.alias("retries"),
        F.when(delivered > 0, retries / delivered).alias("retries_per_event"),
        F.max("retries").alias("retries_max"),
    ]
    for measure, name in (("e2e", "latency"), ("lag", "queue_lag")):
        values = F.percentile(measure, [share for _, share in PERCENTILES])
        columns.append(values.alias(f"_{measure}"))
        columns.append(F.max(measure).alias(f"{name}_max"))
    # grouping_id() sets bit (n - 1 - i) when keys[i] is aggregated away.
    ids = [
        sum(1 << (len(keys) - 1 - i) for i, key in enumerate(keys) if key not in grouping)
        for grouping in groupings
    ]
    which = F.lit(None).cast("int")
    for index, grouping_id in reversed(list(enumerate(ids))):
        which = F.when(F.grouping_id() == grouping_id, F.lit(index)).otherwise(which)
    grouped = flagged.groupingSets([list(g) for g in groupings], *keys).agg(
        *columns, which.alias("grouping")
    )
    figures = [F.col(name) for name in ("grouping", *keys, *COUNTS)]
    figures += [F.col("retries_per_event"), F.col("retries_max")]
    for measure, name in (("e2e", "latency"), ("lag", "queue_lag")):
        for index, (label, _) in enumerate(PERCENTILES):
            figures.append(F.col(f"_{measure}")[index].alias(f"{name}_{label}"))
        figures.append(F.col(f"{name}_max"))
    return grouped.select(*figures)


def figures_of(
    aggregated: DataFrame, groupings: Sequence[tuple[str, ...]], index: int
) -> DataFrame:
    """The rows of ``groupings[index]`` with its own key columns only."""
    others = {key for grouping in groupings for key in grouping} - set(groupings[index])
    rows = aggregated.filter(F.col("grouping") == index)
    return rows.drop("grouping", *others)


def no_figures() -> dict[str, object]:
    """The figures of no records at all."""
    figures: dict[str, object] = dict.fromkeys(COUNTS, 0)
    figures["retries_per_event"] = figures["retries_max"] = None
    for name in ("latency", "queue_lag"):
        for label in (*(label for label, _ in PERCENTILES), "max"):
            figures[f"{name}_{label}"] = None
    return figures
