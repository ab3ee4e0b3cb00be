"""Settings of the report job: where Spark runs and how it reaches the gateway's S3 API.

Loaded from the environment (``BUCKETNOTIFY_REPORT_*``) like the operator's settings, so the
same variables work for ``make report`` and inside a SparkApplication (from a Secret).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["S3Settings", "SessionSettings"]


class SessionSettings(BaseSettings):
    """The Spark session the job creates when it is not started by ``spark-submit``."""

    model_config = SettingsConfigDict(env_prefix="BUCKETNOTIFY_REPORT_")

    master: str = "local[*]"
    """Spark master for a local run; ignored under spark-submit, which sets its own."""
    shuffle_partitions: int = Field(default=8, ge=1)
    """Partitions after a shuffle. The hourly figures are small: Spark's 200 would only add
    task overhead on a laptop or a two-core CI machine."""
    driver_memory: str = "2g"
    """Heap of the local driver (which is also the executor in local mode). 2 GB holds the
    exact latency percentiles of about 10 million records a day."""
    ivy_dir: Path = Path.home() / ".cache" / "bucketnotify" / "ivy"
    """Where spark.jars.packages caches hadoop-aws and the AWS SDK bundle (about 690 MB,
    downloaded from Maven Central once) so a second run starts in seconds."""


def _env(name: str) -> AliasChoices:
    # The report's own variable first, then the gateway Secret's variable that the Helm
    # chart already gives the operator and the delivery service.
    return AliasChoices(f"BUCKETNOTIFY_REPORT_S3_{name}", f"BUCKETNOTIFY_GATEWAY_{name}")


class S3Settings(BaseSettings):
    """The S3 API of the gateway for ``s3a://`` inputs and outputs.

    ``BUCKETNOTIFY_REPORT_S3_<FIELD>``, or else ``BUCKETNOTIFY_GATEWAY_<FIELD>``.
    """

    model_config = SettingsConfigDict(populate_by_name=True)

    endpoint: str | None = Field(default=None, validation_alias=_env("ENDPOINT"))
    """e.g. ``http://rgw.example:8080``; None means AWS S3 itself."""
    access_key: str | None = Field(default=None, validation_alias=_env("ACCESS_KEY"))
    """None: the AWS SDK's default chain (``AWS_ACCESS_KEY_ID``, web identity, instance role)."""
    secret_key: SecretStr | None = Field(default=None, validation_alias=_env("SECRET_KEY"))
    region: str = Field(default="us-east-1", validation_alias=_env("REGION"))
    """RGW ignores the region, but the AWS SDK v2 that s3a uses refuses to start without one."""
    path_style: bool = Field(default=True, validation_alias=_env("PATH_STYLE"))
    """RGW is usually reached by one host name, without a wildcard DNS name per bucket."""
    signing_algorithm: str | None = Field(
        default=None, validation_alias=AliasChoices("BUCKETNOTIFY_REPORT_S3_SIGNING_ALGORITHM")
    )
    """s3a's ``fs.s3a.signing-algorithm``. None: ``AWS4UnsignedPayloadSignerType`` for an
    ``http://`` endpoint, the AWS SDK's own choice otherwise. Over plain HTTP the SDK signs
    each body as an ``aws-chunked`` stream, which Ceph 16.2 refuses for the empty objects
    Spark writes (directory markers, ``_SUCCESS``: ``XAmzContentSHA256Mismatch``); that
    signer signs the request but not the body, which plain HTTP does not protect anyway."""
