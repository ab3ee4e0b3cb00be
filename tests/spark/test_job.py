"""The Spark job on real local Spark gets exactly the hand-counted figures of dataset.py."""

from __future__ import annotations

import html as html_text
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bucketnotify_report.job import JobConfig, JobResult, run
from tests.recordfiles import LocalFiles
from tests.spark import expected
from tests.spark.dataset import DAY, Written, write_late, write_main

FLOAT = pytest.approx  # percentiles interpolate: equal up to the last bit or two

# A few Spark runs per test; on a shared two-core machine one run can take minutes.
pytestmark = pytest.mark.timeout(1800)


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


def assert_outputs(result: JobResult) -> None:
    """The summary file is the summary, naming its outputs; the HTML embeds it verbatim."""
    text = Path(result.summary_path).read_text()
    assert json.loads(text) == json.loads(json.dumps(result.summary))
    assert result.summary["outputs"]["report"] == result.report_path
    page = Path(result.report_path).read_text()
    assert "<svg" in page and "ns-b/orders" in page
    assert text.strip() in html_text.unescape(page)


def test_figures_late_records_and_rerun(spark: SparkSession, tmp_path: Path) -> None:
    """Exact figures for every outcome story; a late batch is picked up by a rerun of the
    day, which replaces that day's partition (never adds to it); a rerun of the same input
    writes the same summary; other days' partitions stay."""
    records, out = tmp_path / "records", tmp_path / "out"
    data = write_main(LocalFiles(records))
    config = JobConfig(str(records), str(out), DAY, DAY)

    early = run(spark, config)
    got = hourly(spark, early.parquet, str(DAY))
    assert_figures(
        got[("2026-11-20T10:00Z", "ns-a", "orders", "orders", "ObjectCreated:Put")],
        expected.BEFORE_LATE,
    )

    write_late(data)
    complete = run(spark, config)
    assert_day(complete, spark, data.written)
    assert_outputs(complete)

    previous_day = JobConfig(str(records), str(out), DAY.replace(day=19), DAY.replace(day=19))
    before = run(spark, previous_day)
    assert before.summary["totals"]["delivered"] == 1  # e15
    again = run(spark, config)
    assert Path(again.summary_path).read_text() == Path(complete.summary_path).read_text()
    assert Path(again.report_path).read_text() == Path(complete.report_path).read_text()
    assert_day(again, spark, data.written)
    assert len(hourly(spark, again.parquet, "2026-11-19")) == 1
    days = sorted(p.name for p in (out / "hourly").iterdir() if p.name.startswith("date="))
    assert days == ["date=2026-11-19", "date=2026-11-20"]
    assert len(list((out / "hourly" / "date=2026-11-20").glob("*.parquet"))) == 1


def test_a_day_without_records(spark: SparkSession, tmp_path: Path) -> None:
    """A day with no record files is a report of zeros that says the files are missing,
    not a crash."""
    result = run(spark, JobConfig(str(tmp_path / "none"), str(tmp_path / "out"), DAY, DAY))
    summary = result.summary
    assert summary["input"]["dates_without_files"] == [str(DAY)]
    assert summary["totals"]["triggered"] == summary["totals"]["delivered"] == 0
    assert summary["totals"]["latency_p50"] is None
    assert summary["topics"] == summary["hours"] == []
    assert "no files at all for 2026-11-20" in Path(result.report_path).read_text()
