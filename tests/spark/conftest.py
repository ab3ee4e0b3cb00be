"""One local SparkSession for every Spark test (a JVM start costs seconds on two cores)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from bucketnotify_report.session import session
from bucketnotify_report.settings import SessionSettings

# Before any test module imports it: its asserts then show their values.
pytest.register_assert_rewrite("tests.spark.checks")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """Real local Spark with hadoop-aws (from Maven Central, cached under ~/.cache) for s3a."""
    spark = session(SessionSettings(master="local[2]", shuffle_partitions=2), s3a=True)
    yield spark
    spark.stop()
