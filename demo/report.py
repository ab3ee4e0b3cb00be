"""The Spark report of the demo's delivery records: wait until both replicas have written
their records, copy them from the gateway, run the job (``make report``'s command) with
progress lines while Spark starts, and print the page's path and a few figures."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from demo.console import DemoError, Ticker, info
from demo.processes import STATE_DIR
from devstack.programs import BIN
from devstack.services import REPO

__all__ = ["clear_records", "copy_records", "run_report", "wait_records_written"]

RECORDS_PREFIX = "records/"
STAGE = re.compile(r"\[Stage (\d+):[=> ]*\(\d+ \+ \d+\) / (\d+)\]")
# The demo's records are a few dozen: one shuffle partition instead of the job's 8 spares
# Spark most of its task start-ups on a two-core machine.
REPORT_ENV = {"BUCKETNOTIFY_REPORT_SHUFFLE_PARTITIONS": "1"}
SPARK_TIMEOUT_S = 600


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def wait_records_written(ports: list[int], at_least: int, timeout: float = 90) -> int:
    """Until the replicas have written ``at_least`` records between them and hold none
    back; the number written."""
    ticker = Ticker("waiting for the replicas to write their records")
    deadline = time.monotonic() + timeout
    written = buffered = 0.0
    while time.monotonic() < deadline:
        scraped = [_scrape(port) for port in ports]
        written = sum(s.get("bucketnotify_records_written_total", 0.0) for s in scraped)
        buffered = sum(s.get("bucketnotify_records_buffered", 0.0) for s in scraped)
        if written >= at_least and buffered == 0:
            return int(written)
        ticker.tick(f"{written:.0f} written, {buffered:.0f} buffered")
        time.sleep(0.5)
    raise DemoError(
        f"the replicas wrote {written:.0f} delivery records in {timeout:.0f} s (expected at"
        f" least {at_least}, {buffered:.0f} still buffered); see their logs in {STATE_DIR}"
    )


def clear_records(s3: Any, bucket: str) -> int:
    """Removes earlier runs' records, so the report is about this run (the bucket is the
    demo's own). Single-object deletes: the bucket has no notification, but keep one way."""
    removed = 0
    for key in _keys(s3, bucket, RECORDS_PREFIX):
        s3.delete_object(Bucket=bucket, Key=key)
        removed += 1
    return removed


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    with_bucket = s3.exceptions.NoSuchBucket
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [item["Key"] for item in page.get("Contents", [])]
    except with_bucket:
        return []
    return keys


def copy_records(s3: Any, bucket: str, into: Path) -> int:
    """The records under ``s3://bucket/records/`` copied to ``into`` (same layout)."""
    count = 0
    for key in _keys(s3, bucket, RECORDS_PREFIX + "v1/"):
        target = into / key.removeprefix(RECORDS_PREFIX)
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(target))
        count += 1
    return count


def run_report(records: Path, output: Path, first: dt.date, last: dt.date) -> dict[str, Any]:
    """``python -m bucketnotify_report`` on ``records``; its summary."""
    log = STATE_DIR / "report.log"
    days = ["--date", f"{first}"] if first == last else ["--from", f"{first}", "--to", f"{last}"]
    command = [
        str(BIN / "python"),
        "-m",
        "bucketnotify_report",
        "--input",
        str(records),
        "--output",
        str(output),
        *days,
    ]
    info("$ .venv/bin/python " + " ".join(command[1:]))
    ticker = Ticker("Spark is working", every=10)
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, **REPORT_ENV},
        )
        assert process.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=_follow, args=(process.stdout, out, lines), daemon=True)
        reader.start()
        while process.poll() is None:
            if ticker.elapsed > SPARK_TIMEOUT_S:
                process.kill()
                raise DemoError(f"the Spark job took over {SPARK_TIMEOUT_S} s; see {log}")
            ticker.tick(lines[-1] if lines else "starting the JVM")
            time.sleep(0.5)
        reader.join(timeout=10)
    if process.returncode != 0:
        tail = "\n".join(lines[-20:])
        raise DemoError(f"the Spark job failed ({process.returncode}); {log}:\n{tail}")
    info(f"the Spark job took {ticker.elapsed:.0f} s (log: {log})")
    name = f"{first}" if first == last else f"{first}_{last}"
    summary: dict[str, Any] = json.loads((output / "summary" / f"{name}.json").read_text())
    return summary


def _follow(stream: Any, out: Any, lines: list[str]) -> None:
    """Copies the job's output to its log and shows its progress: the job's own log lines
    and each Spark stage as it starts (Spark redraws its progress bar with carriage
    returns, hence the split on both line ends)."""
    stage = None
    for chunk in iter(lambda: stream.read1(4096), b""):
        text = chunk.decode(errors="replace")
        out.write(text)
        out.flush()
        for line in re.split(r"[\r\n]+", text):
            if " bucketnotify_report: " in line:
                message = line.split(" bucketnotify_report: ", 1)[1]
                lines.append(message)
                info("spark: " + message)
            found = STAGE.search(line)
            if found and found.group(1) != stage:
                stage = found.group(1)
                lines.append(f"Spark stage {stage}, {found.group(2)} tasks")
