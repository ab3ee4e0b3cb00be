"""One run of the job: records of a range of days in, Parquet, summary and report out."""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bucketnotify_report import figures, inputs, summary
from bucketnotify_report.report import render
from bucketnotify_report.storage import write_text

__all__ = ["JobConfig", "JobResult", "run"]

log = logging.getLogger("bucketnotify_report")

GROUPINGS = (("date", "hour", *figures.GROUP), ("namespace", "topic"), ("hour",), ())
"""Hourly figures (the Parquet), per topic, per hour and totals (the summary)."""


@dataclass(frozen=True)
class JobConfig:
    input: str
    """The records prefix: the directory or ``s3a://bucket/prefix`` that holds ``v1/``."""
    output: str
    """Where ``hourly/`` (Parquet), ``summary/`` and ``report/`` go."""
    first: dt.date
    last: dt.date
    lookback_days: int = 1
    """Days before ``first`` that are read, not reported: an event first ingested or
    delivered then is not counted again in ``first``. One day covers any retry schedule
    shorter than a day."""

    def __post_init__(self) -> None:
        if self.last < self.first:
            raise ValueError(f"the last day {self.last} is before the first day {self.first}")
        if self.lookback_days < 0:
            raise ValueError(f"lookback_days must be 0 or more, not {self.lookback_days}")

    @property
    def name(self) -> str:
        if self.first == self.last:
            return f"{self.first:%Y-%m-%d}"
        return f"{self.first:%Y-%m-%d}_{self.last:%Y-%m-%d}"


@dataclass(frozen=True)
class JobResult:
    summary: dict[str, Any]
    parquet: str
    summary_path: str
    report_path: str


def run(spark: SparkSession, config: JobConfig) -> JobResult:
    out = config.output.rstrip("/")
    parquet = f"{out}/hourly"
    summary_path = f"{out}/summary/{config.name}.json"
    report_path = f"{out}/report/{config.name}.html"
    read_from = config.first - dt.timedelta(days=config.lookback_days)
    found = inputs.read_records(spark, config.input, read_from, config.last)
    found.report.dates_without_files = [
        day for day in found.report.dates_without_files if day >= f"{config.first:%Y-%m-%d}"
    ]
    flagged = figures.with_event_flags(found.records).persist()
    found.counted(flagged.count())
    in_range = flagged.filter(F.col("date").between(config.first, config.last))
    # One pass over the records for every grouping; the result is small.
    aggregated = figures.aggregate(in_range, GROUPINGS).persist()
    try:
        hourly = figures.figures_of(aggregated, GROUPINGS, 0)
        (
            hourly.repartition("date")
            .sortWithinPartitions("hour", *figures.GROUP)
            .write.mode("overwrite")
            .partitionBy("date")
            .parquet(parquet)
        )
        totals = figures.figures_of(aggregated, GROUPINGS, 3).collect()
        topics = figures.figures_of(aggregated, GROUPINGS, 1).collect()
        # The hour as text in the session's zone (UTC): a collected timestamp would come
        # back in the Python process's local zone.
        hours = (
            figures.figures_of(aggregated, GROUPINGS, 2)
            .withColumn("hour", F.date_format("hour", "yyyy-MM-dd'T'HH:mm'Z'"))
            .collect()
        )
    finally:
        aggregated.unpersist()
        flagged.unpersist()
    # A grouping set of no rows has no row, not even the totals' one.
    total = totals[0].asDict() if totals else figures.no_figures()
    result = summary.build(
        first=f"{config.first:%Y-%m-%d}",
        last=f"{config.last:%Y-%m-%d}",
        lookback_days=config.lookback_days,
        inputs=found.report,
        totals=total,
        topics=topics,
        hours=hours,
        outputs={"parquet": parquet, "summary": summary_path, "report": report_path},
    )
    text = json.dumps(result, indent=2, sort_keys=True)
    write_text(spark, summary_path, text + "\n")
    write_text(spark, report_path, render(result, summary_json=text))
    _log_input(found.report)
    return JobResult(result, parquet, summary_path, report_path)


def _log_input(found: inputs.InputReport) -> None:
    log.info(
        "read %d files, %d lines, %d records (%d repeated record_ids dropped)",
        found.files,
        found.lines,
        found.records,
        found.duplicate_records,
    )
    for bad in found.bad_files:
        log.warning(
            "bad record file %s: %s (%d lines recovered)", bad.path, bad.reason, bad.lines_recovered
        )
    for lines in found.bad_lines_by_file:
        log.warning("%d %s lines in %s", lines.count, lines.reason, lines.path)
    for day in found.dates_without_files:
        log.warning("no record files for %s", day)
