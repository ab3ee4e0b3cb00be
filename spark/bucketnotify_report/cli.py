"""``python -m bucketnotify_report``: one run of the job from the command line.

The same entry point serves ``make report`` (a local Spark) and the SparkApplication
(``spark-submit`` of ``__main__.py``), so arguments fall back to environment variables that
a pod spec can set from a ConfigMap or Secret.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys

from bucketnotify_report import session
from bucketnotify_report.job import JobConfig, run

__all__ = ["main"]


def _day(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day as YYYY-MM-DD") from None


def _parser() -> argparse.ArgumentParser:
    yesterday = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)
    parser = argparse.ArgumentParser(
        prog="python -m bucketnotify_report",
        description="Aggregate delivery records into hourly Parquet, a JSON summary and an "
        "HTML report.",
    )
    parser.add_argument(
        "--input",
        default=os.environ.get("BUCKETNOTIFY_REPORT_INPUT"),
        help="records prefix holding v1/ (a directory or s3a://bucket/prefix); "
        "env BUCKETNOTIFY_REPORT_INPUT",
    )
    parser.add_argument(
        "--output",
        default=os.environ.get("BUCKETNOTIFY_REPORT_OUTPUT"),
        help="where hourly/, summary/ and report/ are written; env BUCKETNOTIFY_REPORT_OUTPUT",
    )
    parser.add_argument("--date", type=_day, help="the one day to report (UTC); default: yesterday")
    parser.add_argument("--from", dest="first", type=_day, help="first day of a range")
    parser.add_argument("--to", dest="last", type=_day, help="last day of a range")
    parser.add_argument(
        "--lookback-days",
        type=int,
        default=1,
        help="days before the range read to recognise events first seen there (default 1)",
    )
    parser.set_defaults(yesterday=yesterday)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.input or not args.output:
        parser.error("--input and --output are required (or BUCKETNOTIFY_REPORT_INPUT/OUTPUT)")
    if args.date and (args.first or args.last):
        parser.error("give either --date or --from/--to")
    first = args.date or args.first or args.last or args.yesterday
    last = args.date or args.last or first
    try:
        config = JobConfig(args.input, args.output, first, last, args.lookback_days)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    s3a = any(uri.startswith("s3a://") for uri in (config.input, config.output))
    spark = session.session(s3a=s3a)
    if s3a:
        session.configure_s3(spark)
    result = run(spark, config)
    found = result.summary["input"]
    print(f"hourly figures: {result.parquet}")
    print(f"summary:        {result.summary_path}")
    print(f"report:         {result.report_path}")
    bad_lines = sum(found["bad_lines"].values())
    if found["bad_files"] or bad_lines:
        print(
            f"bad input: {len(found['bad_files'])} files, {bad_lines} lines "
            "(named in the summary and the report)",
            file=sys.stderr,
        )
    return 0
