"""The HTML report opens in a real browser (headless Chromium from Debian)."""

from __future__ import annotations

import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image, ImageChops
from pyspark.sql import SparkSession

from bucketnotify_report.job import JobConfig, JobResult, run
from bucketnotify_report.report import count
from tests.localservices import LOCAL
from tests.recordfiles import LocalFiles
from tests.spark.dataset import DAY, write_late, write_main

# A few Spark runs per test; on a shared two-core machine one run can take minutes.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser's path; deploy/local/chromium.sh installs it when missing."""
    result = subprocess.run(
        ["bash", str(LOCAL / "chromium.sh"), "path"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"Chromium could not be installed:\n{result.stderr[-3000:]}", pytrace=False)
    return result.stdout.strip()


@pytest.fixture(scope="module")
def report(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    root = tmp_path_factory.mktemp("browser")
    data = write_main(LocalFiles(root / "records"))
    write_late(data)
    return run(spark, JobConfig(str(root / "records"), str(root / "out"), DAY, DAY))


def browse(chromium: str, *args: str) -> subprocess.CompletedProcess[str]:
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


class Page(HTMLParser):
    """What the DOM Chromium built shows: the (value, label) of each card of the totals, the
    rows of each table (cell texts) by table id, and the shapes drawn in each inline SVG."""

    def __init__(self) -> None:
        super().__init__()
        self.cards: list[tuple[str, str]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.svgs: list[int] = []
        self._value: str | None = None
        self._text: list[str] | None = None
        self._field: str | None = None
        self._table: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "div" and attributes.get("class") in ("v", "k"):
            self._field, self._text = attributes["class"], []
        elif tag == "table":
            self._table = attributes.get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._field, self._text = "cell", []
        elif tag == "svg":
            self.svgs.append(0)
        elif tag == "path" and self.svgs and attributes.get("d"):
            self.svgs[-1] += 1

    def handle_endtag(self, tag: str) -> None:
        if self._text is None or tag not in ("div", "td", "th"):
            if tag == "table":
                self._table = None
            return
        text = " ".join("".join(self._text).split())
        if self._field == "v":
            self._value = text
        elif self._field == "k" and self._value is not None:
            self.cards.append((self._value, text))
        elif self._field == "cell" and self._table is not None:
            self.tables[self._table][-1].append(text)
        self._field = self._text = None

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)


def test_chromium_renders_the_tables_and_plots(chromium: str, report: JobResult) -> None:
    """The page Chromium builds shows the job's figures: the totals cards carry the summary's
    counts, the worst-topics table ranks the topics as the summary does, every topic has its
    row, both plots are drawn, and the bad files are named."""
    shown = browse(chromium, "--dump-dom", f"file://{report.report_path}")
    assert shown.returncode == 0, shown.stderr
    page = Page()
    page.feed(shown.stdout)
    totals = report.summary["totals"]
    cards = {label: value for value, label in page.cards}
    assert cards["events triggered"] == count(totals["triggered"])
    assert cards["delivered"] == count(totals["delivered"])
    lost = f"lost (expired {count(totals['expired'])}, rejected {count(totals['rejected'])})"
    assert cards[lost] == count(totals["lost"])
    assert cards[
        f"duplicates delivered ({count(totals['duplicates_suppressed'])} suppressed)"
    ] == count(totals["duplicates_delivered"])
    # The dataset has something in each of these, so a zero page would not pass.
    assert totals["lost"] and totals["duplicates_delivered"] and totals["failed_attempts"]

    worst = [row[0] for row in page.tables["worst-topics"][1:]]
    assert worst == [f"{t['namespace']}/{t['topic']}" for t in report.summary["worst_topics"]]
    by_topic = {row[0]: row for row in page.tables["topics"][2:]}
    assert set(by_topic) == {"ns-a/orders", "ns-a/images", "ns-b/orders"}
    for figures in report.summary["topics"]:
        row = by_topic[f"{figures['namespace']}/{figures['topic']}"]
        assert row[1:4] == [count(figures[k]) for k in ("triggered", "delivered", "lost")]

    bad = [row[0] for row in page.tables["bad-files"][1:]]
    assert any(path.endswith("r3-1763000300000-junk.jsonl.gz") for path in bad), bad
    assert len(page.svgs) == 2, "the hourly plot and the latency plot"
    for drawn in page.svgs:
        # Bars, lines, axes and (as paths) the glyphs of the labels.
        assert drawn > 50, page.svgs


def test_chromium_takes_a_screenshot(chromium: str, report: JobResult, tmp_path: Path) -> None:
    """A full-width screenshot shows the report: text, tables and plots drawn down the page,
    not a blank or an error page."""
    png = tmp_path / "report.png"
    shown = browse(
        chromium, f"--screenshot={png}", "--window-size=1280,2400", f"file://{report.report_path}"
    )
    assert shown.returncode == 0, shown.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 2400)
    with Image.open(png) as shot:
        image = shot.convert("RGB")
    colours = image.getcolors(maxcolors=width * height) or []
    assert len(colours) > 50, "plots and tables are drawn in many colours; a blank page in one"
    drawn = ImageChops.difference(image, Image.new("RGB", image.size, (255, 255, 255))).getbbox()
    assert drawn is not None
    left, top, right, bottom = drawn
    assert right - left > width // 2 and bottom - top > 600, f"content only in {drawn}"
    dark = sum(n for n, (r, g, b) in colours if r + g + b < 200)
    assert dark > 2000, "text"
