"""The HTML report: one self-contained page rendered from the JSON summary alone."""

from __future__ import annotations

import datetime as dt
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from bucketnotify_report import plots

__all__ = ["render"]

NONE = "\u2013"
"""What a figure that does not exist (no deliveries, so no latency) shows: an en dash."""

_environment = Environment(
    loader=PackageLoader("bucketnotify_report", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def count(value: int | None) -> str:
    return NONE if value is None else f"{value:,}".replace(",", "\u202f")


def seconds(value: float | None) -> str:
    """A duration a person reads at a glance: 850 ms, 4.2 s, 3.5 min, 2.1 h."""
    if value is None:
        return NONE
    size = abs(value)
    if size < 1:
        return f"{value * 1000:.0f} ms"
    if size < 120:
        return f"{value:.1f} s"
    if size < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def share(value: float | None) -> str:
    return NONE if value is None else f"{value * 100:.1f} %"


def ratio(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}"


_environment.filters.update(count=count, seconds=seconds, share=share, ratio=ratio)


def render(summary: dict[str, Any], *, summary_json: str) -> str:
    first = dt.date.fromisoformat(summary["range"]["first"])
    last = dt.date.fromisoformat(summary["range"]["last"])
    latency = plots.latency_svg(summary["topics"])
    by_name = {(t["namespace"], t["topic"]): t for t in summary["topics"]}
    worst = [by_name[(w["namespace"], w["topic"])] for w in summary["worst_topics"]]
    found = summary["input"]
    problems = bool(found["bad_files"] or found["bad_lines"] or found["dates_without_files"])
    return _environment.get_template("report.html.j2").render(
        s=summary,
        totals=summary["totals"],
        found=found,
        problems=problems,
        worst=worst,
        hourly_svg=Markup(plots.hourly_svg(summary["hours"], first, last)),  # noqa: S704
        latency_svg=Markup(latency) if latency else None,  # noqa: S704
        summary_json=summary_json,
    )
