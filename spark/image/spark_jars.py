"""The jars s3a needs beside Spark's own, for the report image (stdlib only: it runs in the
image build, before the project's virtual environment is copied in).

    python3 spark_jars.py fetch DIR GROUP:ARTIFACT:VERSION...   download, checked by SHA-1
    python3 spark_jars.py link DIR SPARK_JARS                    link them into Spark's jars

Spark's pyspark wheel carries Hadoop's client jars but not hadoop-aws, whose release must be
the one of those jars; the pods of a SparkApplication reach no repository, so the jars are in
the image instead of `spark.jars.packages`.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import urllib.request
from pathlib import Path

REPOSITORY = os.environ.get("MAVEN_REPOSITORY", "https://repo1.maven.org/maven2").rstrip("/")
if not REPOSITORY.startswith(("https://", "http://")):
    sys.exit(f"MAVEN_REPOSITORY must be an http(s) URL, not {REPOSITORY!r}")


def fetch(target: Path, coordinates: list[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for coordinate in coordinates:
        group, artifact, version = coordinate.split(":")
        name = f"{artifact}-{version}.jar"
        url = f"{REPOSITORY}/{group.replace('.', '/')}/{artifact}/{version}/{name}"
        # The scheme is checked above: http(s) only.
        with urllib.request.urlopen(f"{url}.sha1", timeout=60) as answer:  # noqa: S310
            want = answer.read().decode().split()[0].strip()
        digest = hashlib.sha1()  # noqa: S324 - the checksum Maven Central publishes
        part = target / f"{group}_{name}.part"
        with urllib.request.urlopen(url, timeout=60) as answer, part.open("wb") as out:  # noqa: S310
            while chunk := answer.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != want:
            part.unlink()
            sys.exit(f"{url}: SHA-1 {digest.hexdigest()} is not the published {want}")
        part.rename(target / f"{group}_{name}")
        print(f"{coordinate}: {(target / f'{group}_{name}').stat().st_size} bytes", flush=True)


def link(source: Path, spark_jars: Path) -> None:
    if not spark_jars.is_dir():
        sys.exit(f"no Spark at {spark_jars}: build the report image with --build-arg EXTRAS=report")
    hadoop = sorted(spark_jars.glob("hadoop-client-api-*.jar"))
    aws = sorted(source.glob("org.apache.hadoop_hadoop-aws-*.jar"))
    if len(hadoop) != 1 or len(aws) != 1:
        sys.exit(f"expected one hadoop-client-api jar in {spark_jars}, one hadoop-aws in {source}")
    spark_version = re.sub(r"^hadoop-client-api-|\.jar$", "", hadoop[0].name)
    aws_version = re.sub(r"^org\.apache\.hadoop_hadoop-aws-|\.jar$", "", aws[0].name)
    if spark_version != aws_version:
        sys.exit(
            f"Spark's Hadoop is {spark_version} but hadoop-aws is {aws_version}: set the build "
            f"argument S3A_JARS to hadoop-aws {spark_version} and the AWS SDK bundle its POM names"
        )
    for jar in sorted(source.glob("*.jar")):
        (spark_jars / jar.name).symlink_to(jar)


def main(argv: list[str]) -> None:
    if len(argv) >= 3 and argv[0] == "fetch":
        fetch(Path(argv[1]), argv[2:])
    elif len(argv) == 3 and argv[0] == "link":
        link(Path(argv[1]), Path(argv[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
