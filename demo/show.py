"""What the demo shows once the events arrived: the admin CLI's queue stats, excerpts of
the metrics, and the figures of the Spark report's summary."""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any

from bucketnotify import cli
from demo.console import indent, info
from demo.stack import NAMESPACE, Stack, metric_lines

__all__ = ["metrics", "report_summary", "topic_stats"]

# The metric families worth a first look; docs/metrics.md explains them all.
DELIVERY_METRICS = (
    "pubsub_event_triggered_total",
    "pubsub_push_ok_total",
    "pubsub_push_failed_total",
    "pubsub_event_lost_total",
    "bucketnotify_delivery_latency_seconds_count",
    "bucketnotify_lease_partitions_owned",
    "bucketnotify_records_written_total",
)
OPERATOR_METRICS = ("bucketnotify_reconcile_total",)


def topic_stats(topics: list[str], stack: Stack) -> None:
    """``bucketnotify topic stats`` of each Topic, run in this process through the CLI's own
    entry point (the same output; three Python start-ups cost tens of seconds on a busy
    two-core machine)."""
    saved = dict(os.environ)
    os.environ.update(stack.delivery_env)
    try:
        for name in topics:
            argv = ["topic", "stats", name, "-n", NAMESPACE]
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = cli.main(argv)
            info(f"$ bucketnotify {' '.join(argv)}" + (f"  (exit {code})" if code else ""))
            print(indent(out.getvalue()), flush=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def metrics(stack: Stack) -> None:
    for proc in stack.replicas:
        info(f"{proc['name']}: http://127.0.0.1:{proc['port']}/metrics")
        print(indent(_excerpt(proc["port"], DELIVERY_METRICS)), flush=True)
    port = stack.operator["port"]
    info(f"operator: http://127.0.0.1:{port}/metrics")
    print(indent(_excerpt(port, OPERATOR_METRICS)), flush=True)


def _excerpt(port: int, families: tuple[str, ...]) -> str:
    lines = [
        line
        for line in metric_lines(port, families)
        if "namespace=" not in line or f'namespace="{NAMESPACE}"' in line
    ]
    return "\n".join(lines) or "(none yet)"


def report_summary(summary: dict[str, Any]) -> None:
    outputs = summary["outputs"]
    totals = summary["totals"]
    info(f"report (HTML): {outputs['report']}")
    info(f"summary:       {outputs['summary']}")
    info(f"hourly:        {outputs['parquet']}")
    info(
        f"totals: {totals['triggered']} triggered, {totals['delivered']} delivered,"
        f" {totals['failed_attempts']} failed attempts, {totals['lost']} lost,"
        f" {totals['duplicates_delivered']} duplicates delivered"
    )
    for topic in summary["topics"]:
        info(
            f"  {topic['topic']:<12} delivered {topic['delivered']:>3}"
            f"  latency p50 {_seconds(topic['latency_p50'])}"
            f"  p99 {_seconds(topic['latency_p99'])}"
            f"  queue lag p50 {_seconds(topic['queue_lag_p50'])}"
        )
    info("latency: from the S3 request to the endpoint; queue lag: from our ingest's commit")
    found = summary["input"]
    if found["bad_files"] or sum(found["bad_lines"].values()):
        info(f"bad input: {len(found['bad_files'])} files; see the summary")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
