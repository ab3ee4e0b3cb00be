"""One version for the package, the chart and the images; the chart's Artifact Hub
annotations say what the repository holds (its CRDs, its samples, its license, its icon)."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

from bucketnotify import __version__
from bucketnotify.api.notification import BucketNotificationSpec
from bucketnotify.api.topic import TopicSpec

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "bucketnotify"


def chart() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return loaded


def annotation(name: str) -> Any:
    return yaml.safe_load(chart()["annotations"][f"artifacthub.io/{name}"])


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_one_version_for_the_package_the_chart_and_the_images() -> None:
    package = pyproject()["version"]
    meta = chart()
    assert meta["version"] == meta["appVersion"] == package
    assert version("bucketnotify") == __version__ == package, "reinstall: make install"
    images = {i["name"]: i["image"] for i in annotation("images")}
    assert images == {"bucketnotify": f"bucketnotify/bucketnotify:{package}"}
    overlay = yaml.safe_load((REPO / "deploy/overlays/example/kustomization.yaml").read_text())
    assert {i["newTag"] for i in overlay["images"]} == {package}
    for manifest in ("sparkapplication.yaml", "scheduledsparkapplication.yaml"):
        text = (REPO / "deploy/spark" / manifest).read_text()
        assert f"image: bucketnotify-spark:{package}" in text, manifest


def test_the_crds_annotation_names_every_crd_of_crds() -> None:
    installed = set()
    for path in (REPO / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for served in crd["spec"]["versions"]:
            installed.add((crd["spec"]["names"]["kind"], served["name"], crd["metadata"]["name"]))
    announced = {(c["kind"], c["version"], c["name"]) for c in annotation("crds")}
    assert announced == installed


def test_the_crd_examples_are_the_samples_and_valid() -> None:
    samples = {
        (doc["kind"], doc["metadata"]["name"]): doc
        for path in (REPO / "deploy/samples").glob("*.yaml")
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("apiVersion", "").startswith("bucketnotify.io/")
    }
    examples = annotation("crdsExamples")
    assert {e["kind"] for e in examples} == {"Topic", "BucketNotification"}
    for example in examples:
        assert example == samples[example["kind"], example["metadata"]["name"]]
        spec = TopicSpec if example["kind"] == "Topic" else BucketNotificationSpec
        spec.model_validate(example["spec"])


def test_license_links_and_icon() -> None:
    meta = chart()
    assert meta["annotations"]["artifacthub.io/license"] == pyproject()["license"]["text"]
    prefix = "https://raw.githubusercontent.com/bucketnotify/bucketnotify/main/"
    assert meta["icon"].startswith(prefix)
    assert (REPO / meta["icon"].removeprefix(prefix)).is_file()
    assert all(link["url"].startswith("https://") for link in annotation("links"))
