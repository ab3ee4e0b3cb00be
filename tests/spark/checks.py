"""How the Spark job's output is checked against the hand-counted figures of expected.py.

Registered for pytest's assertion rewriting (tests/spark/conftest.py): a failing check
shows its values as a test's own assert does.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bucketnotify_report.job import JobResult
from tests.spark import expected
from tests.spark.dataset import DAY, Written

FLOAT = pytest.approx  # percentiles interpolate: equal up to the last bit or two


def hourly(spark: SparkSession, parquet: str, day: str) -> dict[tuple[str, ...], dict[str, Any]]:
    rows = (
        spark.read.parquet(parquet)
        .filter(F.col("date") == day)
        .withColumn("hour", F.date_format("hour", "yyyy-MM-dd'T'HH:mm'Z'"))
        .collect()
    )
    found = {}
    for row in rows:
        figures = row.asDict()
        key = tuple(figures.pop(k) for k in ("hour", "namespace", "topic", "bucket", "event_name"))
        figures.pop("date")
        found[key] = figures
    return found


def assert_figures(got: dict[str, Any], want: dict[str, Any]) -> None:
    for name, value in want.items():
        if isinstance(value, float):
            assert got[name] == FLOAT(value, rel=1e-12, abs=1e-12), name
        else:
            assert got[name] == value, name


def assert_day(result: JobResult, spark: SparkSession, written: Written) -> None:
    got = hourly(spark, result.parquet, str(DAY))
    assert sorted(got) == sorted(expected.HOURLY)
    for key, want in expected.HOURLY.items():
        assert set(got[key]) == set(want), key
        assert_figures(got[key], want)
    summary = result.summary
    assert_figures(summary["totals"], expected.TOTALS)
    worst = [(t["namespace"], t["topic"]) for t in summary["worst_topics"]]
    assert worst == expected.WORST_TOPICS
    assert_input(summary["input"], written)


def name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def assert_input(found: dict[str, Any], written: Written) -> None:
    assert found["files"] == len(written.files)
    assert found["lines"] == written.lines
    assert found["records"] == len(written.record_ids)
    assert found["duplicate_records"] == written.valid_lines - len(written.record_ids) == 2
    assert found["bad_lines"] == expected.BAD_LINES
    bad = {name(b["path"]): b for b in found["bad_files"]}
    assert set(bad) == {name(path) for path in written.bad_files}
    for path, reason in written.bad_files.items():
        assert bad[name(path)]["reason"].startswith(reason), bad[name(path)]
    assert bad["r1-1763000200000-cut.jsonl.gz"]["lines_recovered"] == 2
    assert {name(p) for p in found["skipped_files"]} == {name(p) for p in written.skipped}
    assert found["dates_without_files"] == []
