"""The HTML report opens in a real browser (headless Chromium from Debian)."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
from PIL import Image, ImageChops
from pyspark.sql import SparkSession

from bucketnotify_report.job import JobConfig, JobResult, run
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


def test_chromium_renders_the_tables_and_plots(chromium: str, report: JobResult) -> None:
    """The DOM Chromium builds from the page has the plots, the topic tables with every
    topic, and the bad files named."""
    shown = browse(chromium, "--dump-dom", f"file://{report.report_path}")
    assert shown.returncode == 0, shown.stderr
    dom = shown.stdout
    for table in ('id="totals"', 'id="worst-topics"', 'id="topics"', 'id="bad-files"'):
        assert table in dom, table
    assert dom.count("<svg") == 2
    for topic in ("ns-a/orders", "ns-a/images", "ns-b/orders"):
        assert f">{topic}</td>" in dom, topic
    assert "r3-1763000300000-junk.jsonl.gz" in dom


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
