"""The Spark job that turns delivery records into hourly figures, a JSON summary and a report.

Reads the delivery records of ``bucketnotify.records`` (``docs/records.md``) from a local
directory or ``s3a://`` on the gateway; writes Parquet partitioned by date, a JSON summary
and one self-contained HTML page. Runs with ``python -m bucketnotify_report`` (``make
report``) or as a SparkApplication (``deploy/spark/``).

Of bucketnotify it imports only ``bucketnotify.records``: the driver needs the record schema,
never the operator or the delivery service.
"""

from bucketnotify_report.job import JobConfig, JobResult, run

__all__ = ["JobConfig", "JobResult", "run"]
