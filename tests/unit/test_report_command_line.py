"""The report job's command line as docs/report.md gives it: ``make report`` and
``python -m bucketnotify_report`` with their options, the variables that stand in for them,
and the gateway settings taken from ``BUCKETNOTIFY_REPORT_S3_*``, else the operator's
``BUCKETNOTIFY_GATEWAY_*``. (A run itself needs Spark: tests/spark.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bucketnotify_report.settings import S3Settings

ROOT = Path(__file__).resolve().parents[2]


def report(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BUCKETNOTIFY_")}
    return subprocess.run(
        [sys.executable, "-m", "bucketnotify_report", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
        check=False,
    )


def test_make_report_runs_the_module_with_the_records_the_output_and_the_day() -> None:
    shown = subprocess.run(
        ["make", "-n", "report", "RECORDS=/r", "DATE=2026-11-20", "REPORT_OUT=/o"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert '-m bucketnotify_report --input "/r" --output "/o" --date 2026-11-20' in shown.stdout


def test_the_options_and_the_variables_that_stand_in_for_them() -> None:
    missing = report("--output", "/o")
    assert missing.returncode == 2
    assert "--input and --output are required" in missing.stderr
    # The variables give input and output: what is refused next is the days.
    env = {"BUCKETNOTIFY_REPORT_INPUT": "/r", "BUCKETNOTIFY_REPORT_OUTPUT": "/o"}
    both = report("--date", "2026-11-20", "--from", "2026-11-19", **env)
    assert both.returncode == 2 and "give either --date or --from/--to" in both.stderr
    backwards = report("--from", "2026-11-20", "--to", "2026-11-19", **env)
    assert backwards.returncode == 2
    assert "the last day 2026-11-19 is before the first day 2026-11-20" in backwards.stderr
    not_a_day = report("--date", "20.11.2026", **env)
    assert not_a_day.returncode == 2 and "is not a day as YYYY-MM-DD" in not_a_day.stderr
    negative = report("--date", "2026-11-20", "--lookback-days", "-1", **env)
    assert negative.returncode == 2 and "lookback_days must be 0 or more" in negative.stderr


def test_the_gateway_comes_from_report_s3_variables_else_the_operators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "ENDPOINT": "http://rgw:8080",
        "ACCESS_KEY": "gw-access",
        "SECRET_KEY": "gw-secret",
        "REGION": "zone-a",
        "PATH_STYLE": "false",
    }.items():
        monkeypatch.setenv(f"BUCKETNOTIFY_GATEWAY_{name}", value)
    fallback = S3Settings()
    assert (fallback.endpoint, fallback.access_key, fallback.region, fallback.path_style) == (
        "http://rgw:8080", "gw-access", "zone-a", False,
    )  # fmt: skip
    assert fallback.secret_key is not None
    assert fallback.secret_key.get_secret_value() == "gw-secret"

    monkeypatch.setenv("BUCKETNOTIFY_REPORT_S3_ENDPOINT", "http://other:7480")
    monkeypatch.setenv("BUCKETNOTIFY_REPORT_S3_SECRET_KEY", "report-secret")
    own = S3Settings()
    assert (own.endpoint, own.access_key) == ("http://other:7480", "gw-access")
    assert own.secret_key is not None
    assert own.secret_key.get_secret_value() == "report-secret"
