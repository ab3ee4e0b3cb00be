"""Finding, checking and parsing record files; every file and line is accounted for.

Spark's own gzip reader fails the whole job on one truncated file, and
``spark.sql.files.ignoreCorruptFiles`` would drop such a file without a trace. So every file
is checked first (decompressed once on the executors, in Python's zlib); good files are then
read by Spark, a damaged one contributes the complete lines before the damage, and both are
reported. Lines that are not a record of schema version 1 are counted by reason.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bucketnotify_report.schema import OUTCOMES, RECORD_SCHEMA, REQUIRED, SCHEMA_VERSION
from bucketnotify_report.storage import FileEntry, list_files

__all__ = ["BadFile", "BadLines", "InputReport", "Inputs", "check_file", "read_records"]

SUFFIX: Final = ".jsonl.gz"
_CHUNK: Final = 1 << 16

# Why a line is not a record; the keys of InputReport.bad_lines.
MALFORMED: Final = "malformed"
"""Not a JSON object, a field of the wrong type, or a required field missing."""
WRONG_VERSION: Final = "wrong_schema_version"
UNKNOWN_OUTCOME: Final = "unknown_outcome"


@dataclass(frozen=True)
class BadFile:
    path: str
    reason: str
    lines_recovered: int
    """Complete lines read before the damage; they are parsed like any other line."""


@dataclass(frozen=True)
class BadLines:
    path: str
    reason: str
    count: int


@dataclass
class InputReport:
    """What was read, and everything that was not a usable record."""

    files: int = 0
    bytes: int = 0
    lines: int = 0
    records: int = 0
    """Valid records after dropping repeated record_ids."""
    duplicate_records: int = 0
    """Valid lines whose record_id was seen before (a batch uploaded twice)."""
    bad_files: list[BadFile] = field(default_factory=list)
    skipped_files: list[str] = field(default_factory=list)
    """Hidden or underscore files (a writer's temporary files, markers): not read."""
    bad_lines: dict[str, int] = field(default_factory=dict)
    bad_lines_by_file: list[BadLines] = field(default_factory=list)
    dates_without_files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Inputs:
    records: DataFrame
    """Valid, deduplicated records with the columns of RECORD_SCHEMA; not yet counted."""
    report: InputReport
    _parsed: DataFrame

    def counted(self, records: int) -> None:
        """Complete the report with the number of records once a later pass counted them
        (one pass fewer than counting here)."""
        self.report.records = records
        bad = sum(self.report.bad_lines.values())
        self.report.duplicate_records = self.report.lines - bad - records
        self._parsed.unpersist()


def check_file(item: tuple[str, bytes]) -> tuple[str, int, str | None, list[str]]:
    """``(path, bytes, why it is damaged or None, the complete lines of a damaged file)``.

    Runs on the executors. Concatenated gzip members are read like gzip(1) reads them.
    """
    path, data = item
    if not data:
        return path, 0, "empty file (0 bytes)", []
    out = bytearray()
    reason: str | None = None
    rest = bytes(data)
    try:
        while rest and reason is None:
            stream = zlib.decompressobj(wbits=31)
            for start in range(0, len(rest), _CHUNK):
                out += stream.decompress(rest[start : start + _CHUNK])
                if stream.eof:
                    break
            if not stream.eof:
                reason = "truncated: the gzip stream ends early"
            rest = stream.unused_data
    except zlib.error as exc:
        reason = f"not readable as gzip: {exc}"
    if reason is None:
        return path, len(data), None, []
    complete = bytes(out[: out.rfind(b"\n") + 1])
    lines = complete.decode("utf-8", errors="replace").splitlines()
    return path, len(data), reason, lines


def _is_hidden(path: str) -> bool:
    return path.rsplit("/", 1)[-1].startswith((".", "_"))


def _dates(first: dt.date, last: dt.date) -> Iterable[dt.date]:
    day = first
    while day <= last:
        yield day
        day += dt.timedelta(days=1)


def read_records(spark: SparkSession, root: str, first: dt.date, last: dt.date) -> Inputs:
    """The records under ``<root>/v1/date=D/`` for each day D from ``first`` to ``last``."""
    report = InputReport()
    candidates: list[FileEntry] = []
    for day in _dates(first, last):
        found = list_files(spark, f"{root.rstrip('/')}/v{SCHEMA_VERSION}/date={day:%Y-%m-%d}")
        if not found:
            report.dates_without_files.append(f"{day:%Y-%m-%d}")
        for entry in found:
            if _is_hidden(entry.path):
                report.skipped_files.append(entry.path)
            elif not entry.path.endswith(SUFFIX):
                report.bad_files.append(BadFile(entry.path, f"not a {SUFFIX} file", 0))
            else:
                candidates.append(entry)
    report.files = len(candidates)
    report.bytes = sum(entry.size for entry in candidates)
    lines = _lines(spark, candidates, report)
    return _parse(lines, report)


def _lines(spark: SparkSession, files: list[FileEntry], report: InputReport) -> DataFrame:
    schema = "value string, file string"
    if not files:
        return spark.createDataFrame([], schema)
    checked = (
        spark.sparkContext.binaryFiles(",".join(entry.path for entry in files))
        .map(check_file)
        .collect()
    )
    good = [path for path, _, reason, _ in checked if reason is None]
    recovered: list[tuple[str, str]] = []
    for path, _, reason, lines in checked:
        if reason is not None:
            report.bad_files.append(BadFile(path, reason, len(lines)))
            recovered.extend((line, path) for line in lines)
    frames = [spark.createDataFrame(recovered, schema)]
    if good:
        frames.append(
            spark.read.text(good).select("value", F.col("_metadata.file_path").alias("file"))
        )
    combined = frames[0]
    for frame in frames[1:]:
        combined = combined.unionByName(frame)
    return combined.filter(F.trim("value") != "")


def _problem(parsed: Column) -> Column:
    missing = [parsed[name].isNull() for name in REQUIRED]
    any_missing = missing[0]
    for condition in missing[1:]:
        any_missing = any_missing | condition
    return (
        F.when(parsed.isNull() | parsed["schema_version"].isNull(), F.lit(MALFORMED))
        .when(parsed["schema_version"] != SCHEMA_VERSION, F.lit(WRONG_VERSION))
        .when(any_missing, F.lit(MALFORMED))
        .when(~parsed["outcome"].isin(*OUTCOMES), F.lit(UNKNOWN_OUTCOME))
    )


def _parse(lines: DataFrame, report: InputReport) -> Inputs:
    parsed = lines.select(
        "file", F.from_json("value", RECORD_SCHEMA, {"mode": "PERMISSIVE"}).alias("r")
    ).withColumn("problem", _problem(F.col("r")))
    parsed = parsed.persist()
    tally = parsed.groupBy("file", "problem").count().collect()
    for row in tally:
        report.lines += row["count"]
        if row["problem"] is not None:
            report.bad_lines[row["problem"]] = (
                report.bad_lines.get(row["problem"], 0) + row["count"]
            )
            report.bad_lines_by_file.append(BadLines(row["file"], row["problem"], row["count"]))
    report.bad_lines_by_file.sort(key=lambda bad: (bad.path, bad.reason))
    valid = parsed.filter(F.col("problem").isNull()).select("r.*")
    return Inputs(records=valid.dropDuplicates(["record_id"]), report=report, _parsed=parsed)
