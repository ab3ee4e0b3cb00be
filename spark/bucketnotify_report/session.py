"""The SparkSession of the job: UTC, dynamic partition overwrite, s3a when an URI needs it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pyspark
from pyspark.sql import SparkSession

from bucketnotify_report.settings import S3Settings, SessionSettings

__all__ = ["configure_s3", "hadoop_aws_package", "session"]

UNSIGNED_PAYLOAD_SIGNER = "AWS4UnsignedPayloadSignerType"
"""The signer s3a uses for plain-HTTP endpoints (see ``S3Settings.signing_algorithm``)."""


def hadoop_aws_package() -> str:
    """The Maven coordinate of the hadoop-aws release that matches Spark's Hadoop jars.

    hadoop-aws must be exactly the version of the Hadoop client on the classpath; its POM
    then brings the AWS SDK bundle it was built against, so only one version is chosen here.
    """
    homes = [Path(os.environ["SPARK_HOME"])] if "SPARK_HOME" in os.environ else []
    homes.append(Path(pyspark.__file__).parent)
    for home in homes:
        for jar in sorted((home / "jars").glob("hadoop-client-api-*.jar")):
            match = re.fullmatch(r"hadoop-client-api-(\d+\.\d+\.\d+)\.jar", jar.name)
            if match:
                return f"org.apache.hadoop:hadoop-aws:{match.group(1)}"
    raise RuntimeError(
        f"no hadoop-client-api jar under {', '.join(str(h / 'jars') for h in homes)}: "
        "cannot tell which hadoop-aws matches this Spark; set SPARK_HOME to the Spark "
        "distribution in use"
    )


def session(settings: SessionSettings | None = None, *, s3a: bool = False) -> SparkSession:
    """The active session, or a new local one; with hadoop-aws on the classpath when ``s3a``.

    Under spark-submit (a SparkApplication) the session already exists and its own
    configuration (master, packages) wins; the SQL settings below are applied either way.
    """
    settings = settings or SessionSettings()
    builder: Any = SparkSession.builder.appName("bucketnotify-report")
    if SparkSession.getActiveSession() is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # The local Python workers must see the packages of the interpreter running us, not
        # whatever `python3` is first on PATH (the SparkContext reads only this variable).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (
            builder.master(settings.master)
            .config("spark.driver.memory", settings.driver_memory)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            # On a starved machine (a shared CI runner) the local executor's heartbeat can
            # miss the default 10 s/120 s; Spark 4 then fails re-registering it and the job
            # hangs. Local mode has no executor to lose, so wait longer.
            .config("spark.executor.heartbeatInterval", "60s")
            .config("spark.network.timeout", "600s")
        )
        if s3a:
            builder = builder.config("spark.jars.packages", hadoop_aws_package()).config(
                "spark.jars.ivy", str(settings.ivy_dir)
            )
    spark: SparkSession = builder.getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    # A rerun of a day replaces that day's partition and leaves the other days alone.
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    spark.conf.set("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
    return spark


def configure_s3(spark: SparkSession, settings: S3Settings | None = None) -> None:
    """Point s3a at the gateway.

    Set on the Hadoop configuration, not in SparkConf, so the keys never show up in the
    Spark UI's environment page or an event log.
    """
    settings = settings or S3Settings()
    conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
    if settings.endpoint:
        conf.set("fs.s3a.endpoint", settings.endpoint)
        conf.set(
            "fs.s3a.connection.ssl.enabled", str(settings.endpoint.startswith("https:")).lower()
        )
    algorithm = settings.signing_algorithm
    if algorithm is None and settings.endpoint and settings.endpoint.startswith("http:"):
        algorithm = UNSIGNED_PAYLOAD_SIGNER
    if algorithm:
        conf.set("fs.s3a.signing-algorithm", algorithm)
    else:
        conf.unset("fs.s3a.signing-algorithm")
    conf.set("fs.s3a.endpoint.region", settings.region)
    conf.set("fs.s3a.path.style.access", str(settings.path_style).lower())
    if settings.access_key and settings.secret_key:
        conf.set("fs.s3a.access.key", settings.access_key)
        conf.set("fs.s3a.secret.key", settings.secret_key.get_secret_value())
