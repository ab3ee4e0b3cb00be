"""The Spark job on real local Spark gets exactly the hand-counted figures of dataset.py."""

from __future__ import annotations

import html as html_text
import json
import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bucketnotify_report.job import JobConfig, JobResult, run
from tests.recordfiles import LocalFiles
from tests.spark import expected
from tests.spark.checks import assert_day, assert_figures, hourly
from tests.spark.dataset import DAY, write_late, write_main

# A few Spark runs per test; on a shared two-core machine one run can take minutes.
pytestmark = pytest.mark.timeout(1800)


def assert_outputs(result: JobResult) -> None:
    """The summary file is the summary, naming its outputs; the HTML embeds it verbatim."""
    text = Path(result.summary_path).read_text()
    assert json.loads(text) == json.loads(json.dumps(result.summary))
    assert result.summary["outputs"]["report"] == result.report_path
    page = Path(result.report_path).read_text()
    assert "<svg" in page and "ns-b/orders" in page
    # Self-contained: nothing to run and nothing to fetch when the page is opened.
    lowered = page.lower()
    assert not [
        tag for tag in ("<script", "<link", "<iframe", "@import", "@font-face") if tag in lowered
    ]
    assert not re.search(r"""src\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//""", lowered)
    assert text.strip() in html_text.unescape(page)


def test_figures_late_records_and_rerun(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Exact figures for every outcome story; a late batch is picked up by a rerun of the
    day, which replaces that day's partition (never adds to it); a rerun of the same input
    writes the same summary; other days' partitions stay, also through a run for a day
    without files, which writes none; each bad file is a WARNING of its own."""
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
    caplog.clear()
    again = run(spark, config)
    assert Path(again.summary_path).read_text() == Path(complete.summary_path).read_text()
    assert Path(again.report_path).read_text() == Path(complete.report_path).read_text()
    assert_day(again, spark, data.written)
    assert len(hourly(spark, again.parquet, "2026-11-19")) == 1
    days = sorted(p.name for p in (out / "hourly").iterdir() if p.name.startswith("date="))
    assert days == ["date=2026-11-19", "date=2026-11-20"]
    assert len(list((out / "hourly" / "date=2026-11-20").glob("*.parquet"))) == 1

    bad_files = again.summary["input"]["bad_files"]
    assert bad_files
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    for bad in bad_files:
        line = f"bad record file {bad['path']}: {bad['reason']}"
        assert sum(w.startswith(line) for w in warnings) == 1, line
    assert sum(w.startswith("bad record file ") for w in warnings) == len(bad_files)

    kept = sorted(p.name for p in (out / "hourly" / "date=2026-11-20").iterdir())
    # The 21st holds e16 (the day after the range), so the first day without files is the
    # 22nd; its run reads the 21st as its look-back day, which must not make a partition.
    empty_day = DAY.replace(day=22)
    none = run(spark, JobConfig(str(records), str(out), empty_day, empty_day))
    assert none.summary["input"]["dates_without_files"] == [str(empty_day)]
    days = sorted(p.name for p in (out / "hourly").iterdir() if p.name.startswith("date="))
    assert days == ["date=2026-11-19", "date=2026-11-20"], "no partition for the empty day"
    assert sorted(p.name for p in (out / "hourly" / "date=2026-11-20").iterdir()) == kept


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
