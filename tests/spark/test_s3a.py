"""The job reads its records from the real gateway and writes its outputs back there
through s3a, over plain HTTP.

Ceph 16.2 refuses the 0-byte objects (directory markers, _SUCCESS) that s3a sends with its
default signer over plain HTTP (an aws-chunked signed body: XAmzContentSHA256Mismatch);
the job signs such requests without the body (docs/report.md), and this test fails without
that.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr
from pyspark.sql import SparkSession

from bucketnotify_report.job import JobConfig, run
from bucketnotify_report.session import configure_s3
from bucketnotify_report.settings import S3Settings
from bucketnotify_report.storage import write_text
from tests.localservices import LocalService
from tests.recordfiles import S3Files
from tests.s3 import s3_client
from tests.spark.checks import assert_day
from tests.spark.dataset import DAY, write_late, write_main

# A few Spark runs per test; on a shared two-core machine one run can take minutes.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


@pytest.fixture()
def s3(rgw: LocalService) -> Any:
    return s3_client(rgw)


@pytest.fixture()
def bucket(s3: Any) -> Iterator[str]:
    name = f"records-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=name)
    yield name
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=name, Key=obj["Key"])
    s3.delete_bucket(Bucket=name)


def test_records_on_the_gateway(
    spark: SparkSession, rgw: LocalService, s3: Any, bucket: str
) -> None:
    """The same files as the local test, uploaded to RGW, give the same figures through
    s3a (hadoop-aws and the AWS SDK bundle from Maven Central)."""
    data = write_main(S3Files(s3, bucket, "records"))
    write_late(data)
    configure_s3(
        spark,
        S3Settings(
            endpoint=rgw["RGW_ENDPOINT"],
            access_key=rgw["RGW_ACCESS_KEY"],
            secret_key=SecretStr(rgw["RGW_SECRET_KEY"]),
        ),
    )
    # The keys are on the Hadoop configuration only: SparkConf shows in the Spark UI and
    # event logs.
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    assert hadoop.get("fs.s3a.secret.key") == rgw["RGW_SECRET_KEY"]
    spark_conf = spark.sparkContext.getConf().getAll()
    assert not [k for k, v in spark_conf if rgw["RGW_SECRET_KEY"] in v or "secret.key" in k]
    config = JobConfig(f"s3a://{bucket}/records", f"s3a://{bucket}/out", DAY, DAY)
    result = run(spark, config)
    # Read back from the gateway: the Parquet files, the summary and the report it holds.
    assert_day(result, spark, data.written)
    assert all(bad["path"].startswith("s3a://") for bad in result.summary["input"]["bad_files"])
    stored = {
        obj["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="out/")
        for obj in page.get("Contents", [])
    }
    assert any(k.startswith("out/hourly/date=") and k.endswith(".parquet") for k in stored)
    summary = s3.get_object(Bucket=bucket, Key=f"out/summary/{config.name}.json")["Body"].read()
    assert json.loads(summary) == result.summary
    report = s3.get_object(Bucket=bucket, Key=f"out/report/{config.name}.html")["Body"].read()
    assert report.decode().lstrip().lower().startswith("<!doctype html>")


def test_text_outputs_to_the_gateway(
    spark: SparkSession, rgw: LocalService, s3: Any, bucket: str
) -> None:
    """The summary and the report are written through s3a as they are to a directory."""
    configure_s3(
        spark,
        S3Settings(
            endpoint=rgw["RGW_ENDPOINT"],
            access_key=rgw["RGW_ACCESS_KEY"],
            secret_key=SecretStr(rgw["RGW_SECRET_KEY"]),
        ),
    )
    text = json.dumps({"figures": [1, 2, 3]})
    write_text(spark, f"s3a://{bucket}/reports/summary/x.json", text)
    stored = s3.get_object(Bucket=bucket, Key="reports/summary/x.json")["Body"].read()
    assert stored.decode() == text
