"""Files through Hadoop's FileSystem API, so ``file:``, plain paths and ``s3a://`` behave alike.

The driver lists and writes files through the JVM (py4j): boto3 would need its own copy of
the S3 settings and would not see what s3a sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

__all__ = ["FileEntry", "list_files", "write_text"]


@dataclass(frozen=True)
class FileEntry:
    path: str
    """Fully qualified, as Spark reports it back (``file:/...``, ``s3a://...``)."""
    size: int


def _filesystem(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    jvm: Any = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def list_files(spark: SparkSession, uri: str) -> list[FileEntry]:
    """Every file under ``uri``, recursively; empty when ``uri`` does not exist."""
    fs, path = _filesystem(spark, uri)
    if not fs.exists(path):
        return []
    found = []
    listing = fs.listFiles(path, True)
    while listing.hasNext():
        status = listing.next()
        found.append(FileEntry(path=status.getPath().toString(), size=int(status.getLen())))
    return sorted(found, key=lambda entry: entry.path)


def write_text(spark: SparkSession, uri: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``uri``, replacing it."""
    fs, path = _filesystem(spark, uri)
    # No ".<name>.crc" beside a local file: nothing reads these files back through Hadoop.
    fs.setWriteChecksum(False)
    stream = fs.create(path, True)
    try:
        stream.write(text.encode())
    finally:
        stream.close()
