"""The report's plots as inline SVG strings (matplotlib, no display, no pyplot state).

Text is drawn as paths and the SVG ids are salted with a constant, so the page needs no
fonts and a rerun produces the same bytes.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Sequence
from typing import Any, Final

import matplotlib
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, DateFormatter, HourLocator
from matplotlib.figure import Figure

__all__ = ["hourly_svg", "latency_svg"]

matplotlib.rcParams.update(
    {
        "svg.hashsalt": "bucketnotify-report",
        "svg.fonttype": "path",
        "font.size": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
    }
)

DELIVERED: Final = "#2b8a3e"
TRIGGERED: Final = "#1c7ed6"
FAILED: Final = "#f08c00"
LOST: Final = "#c92a2a"
DUPLICATE: Final = "#7048e8"
PERCENTILE_COLOURS: Final = ("#a5d8ff", "#4dabf7", "#1864ab")


def _svg(figure: Figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    # Inline <svg> only: the XML prolog and DOCTYPE are not allowed inside HTML.
    return text[text.index("<svg") :]


def _hour(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%MZ").replace(tzinfo=dt.UTC)


def hourly_svg(hours: Sequence[dict[str, Any]], first: dt.date, last: dt.date) -> str:
    """Events per hour (triggered, delivered) above problems per hour (failed, lost, dups)."""
    start = dt.datetime.combine(first, dt.time(), dt.UTC)
    count = ((last - first).days + 1) * 24
    slots = [start + dt.timedelta(hours=i) for i in range(count)]
    by_hour = {_hour(h["hour"]): h for h in hours}

    def series(name: str) -> list[int]:
        return [int(by_hour[s][name]) if s in by_hour else 0 for s in slots]

    # A step drawn "post" needs the end of the last hour to draw that hour too.
    edges = [*slots, slots[-1] + dt.timedelta(hours=1)]

    def steps(name: str) -> list[int]:
        values = series(name)
        return [*values, values[-1]]

    width = 1 / 24 * 0.8
    figure = Figure(figsize=(10, 5.2), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    top.bar(
        slots, series("delivered"), width=width, align="edge", color=DELIVERED, label="delivered"
    )
    top.step(
        edges, steps("triggered"), where="post", color=TRIGGERED, linewidth=1.5, label="triggered"
    )
    top.set_ylabel("events per hour")
    top.legend(loc="upper left", frameon=False, ncols=2)
    bottom.bar(
        slots,
        series("failed_attempts"),
        width=width,
        align="edge",
        color=FAILED,
        label="failed attempts",
    )
    # Lost events are few beside failed attempts but matter most: a line of their own.
    bottom.step(edges, steps("lost"), where="post", color=LOST, linewidth=1.8, label="lost")
    bottom.step(
        edges,
        steps("duplicates_delivered"),
        where="post",
        color=DUPLICATE,
        linewidth=1.2,
        label="duplicates delivered",
    )
    bottom.set_ylabel("problems per hour")
    bottom.legend(loc="upper left", frameon=False, ncols=3)
    for axes in (top, bottom):
        axes.set_ylim(bottom=0)
        axes.set_xlim(edges[0], edges[-1])
    if count == 24:
        # matplotlib.dates has no annotations for its locators and formatters.
        ticks = HourLocator(byhour=range(0, 24, 3), tz=dt.UTC)  # type: ignore[no-untyped-call]
        bottom.xaxis.set_major_locator(ticks)
        bottom.xaxis.set_major_formatter(
            DateFormatter("%H:%M", tz=dt.UTC)  # type: ignore[no-untyped-call]
        )
        bottom.set_xlabel(f"hour of {first:%Y-%m-%d} (UTC)")
    else:
        locator = AutoDateLocator(tz=dt.UTC)  # type: ignore[no-untyped-call]
        bottom.xaxis.set_major_locator(locator)
        bottom.xaxis.set_major_formatter(
            ConciseDateFormatter(locator, tz=dt.UTC, show_offset=False)  # type: ignore[no-untyped-call]
        )
        bottom.set_xlabel("hour (UTC)")
    return _svg(figure)


def latency_svg(topics: Sequence[dict[str, Any]]) -> str | None:
    """End-to-end latency p50/p95/p99 per topic; None when nothing was delivered."""
    measured = [t for t in topics if t["latency_p50"] is not None]
    if not measured:
        return None
    labels = [f"{t['namespace']}/{t['topic']}" for t in measured]
    height = max(1.8, 0.4 * len(measured) + 1.0)
    figure = Figure(figsize=(10, height), layout="constrained")
    axes = figure.subplots()
    bar = 0.8 / 3
    for offset, ((label, key), colour) in enumerate(
        zip(
            (("p50", "latency_p50"), ("p95", "latency_p95"), ("p99", "latency_p99")),
            PERCENTILE_COLOURS,
            strict=True,
        )
    ):
        positions = [i + (offset - 1) * bar for i in range(len(measured))]
        axes.barh(positions, [t[key] for t in measured], height=bar, color=colour, label=label)
    axes.set_yticks(range(len(measured)), labels)
    axes.invert_yaxis()
    axes.set_xlabel("end-to-end latency, seconds (eventTime to endpoint acknowledgement)")
    axes.legend(loc="lower right", frameon=False, ncols=3)
    axes.grid(axis="y", visible=False)
    return _svg(figure)
