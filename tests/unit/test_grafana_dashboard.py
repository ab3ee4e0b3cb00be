"""deploy/grafana/bucketnotify-dashboard.json loads as a Grafana dashboard, its PromQL
parses, and every metric it queries is one the services export.

Schema: the Grafana Foundation SDK's dashboard models (generated from Grafana's dashboard
kind): decoding and encoding again must give back the file unchanged, so a key the schema
does not know (a typo, a field of another version) is caught, and panel options and queries
are decoded by their plugin's models (timeseries, stat, prometheus).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel

from bucketnotify.metrics import DeliveryMetrics, OperatorMetrics
from tests.promql import exported_names, metric_names

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "bucketnotify-dashboard.json"
COLUMNS = 24
# What Grafana puts in for its variables before it sends a query.
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$namespace": "team-a|team-b",
    "$topic": ".*",
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(dashboard) for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def not_kept(given: Any, encoded: Any, path: str = "") -> list[str]:
    """Paths of ``given`` that ``encoded`` lacks or holds differently."""
    if isinstance(given, dict):
        if not isinstance(encoded, dict):
            return [path]
        return [
            lost
            for key, value in given.items()
            for lost in (
                not_kept(value, encoded[key], f"{path}/{key}")
                if key in encoded
                else [f"{path}/{key} (not in the schema)"]
            )
        ]
    if isinstance(given, list):
        if not isinstance(encoded, list) or len(given) != len(encoded):
            return [path]
        return [
            lost
            for i, (a, b) in enumerate(zip(given, encoded, strict=True))
            for lost in not_kept(a, b, f"{path}[{i}]")
        ]
    return [] if given == encoded else [f"{path}: {given!r} became {encoded!r}"]


def substituted(expr: str) -> str:
    # label_values(...) is Grafana's variable query, not PromQL: check what it wraps.
    expr = re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", expr)
    for variable, value in SUBSTITUTIONS.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a variable the dashboard does not define: {expr}"
    return expr


def test_the_dashboard_decodes_and_encodes_unchanged_with_the_schema_models(
    dashboard: dict[str, Any],
) -> None:
    register_default_plugins()
    decoded = Dashboard.from_json(dashboard)
    encoded = json.loads(json.dumps(decoded, cls=JSONEncoder))
    # The models add the schema's defaults; everything in the file must come back as it is.
    assert not_kept(dashboard, encoded) == []
    kinds = {type(p) for p in decoded.panels or []}
    assert kinds == {Panel, RowPanel}


def test_layout_ids_and_datasources(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= COLUMNS, panel["title"]
        covered = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"])
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_variables_datasource_namespace_and_topic(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "topic"}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "topic"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        assert variables[name]["multi"] and variables[name]["includeAll"]


def test_every_query_parses_as_promql(dashboard: dict[str, Any]) -> None:
    for expr in queries(dashboard):
        promql_parser.parse(substituted(expr))  # raises ValueError on a syntax error


def test_every_metric_queried_is_exported_and_every_metric_is_shown(
    dashboard: dict[str, Any],
) -> None:
    exported = exported_names(DeliveryMetrics().registry) | exported_names(
        OperatorMetrics().registry
    )
    used = set().union(*(metric_names(substituted(e)) for e in queries(dashboard)))
    assert used <= exported, f"not exported by the services: {sorted(used - exported)}"
    shown_families = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in used}
    families = {
        f.name
        for r in (DeliveryMetrics().registry, OperatorMetrics().registry)
        for f in r.collect()
    }
    assert families <= shown_families, f"not on the dashboard: {sorted(families - shown_families)}"


def test_latency_panels_show_p50_and_p99_of_every_histogram(dashboard: dict[str, Any]) -> None:
    exprs = queries(dashboard)
    for family in (
        "bucketnotify_delivery_latency_seconds",
        "bucketnotify_push_seconds",
        "bucketnotify_ingest_commit_seconds",
        "bucketnotify_reconcile_seconds",
    ):
        for quantile in ("0.5", "0.99"):
            assert any(
                e.startswith(f"histogram_quantile({quantile},") and f"{family}_bucket" in e
                for e in exprs
            ), f"p{quantile} of {family}"
