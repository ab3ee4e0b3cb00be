"""PromQL that dashboards and alerts ask: its parse, and the series our processes export."""

from __future__ import annotations

import promql_parser
from prometheus_client import CollectorRegistry

from bucketnotify.metrics import DeliveryMetrics, OperatorMetrics


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry exposes, from its metric families' types."""
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
    }
    return {
        family.name + suffix for family in registry.collect() for suffix in suffixes[family.type]
    }


def metric_names(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node: promql_parser.Expr, *_: object) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def our_series() -> set[str]:
    """Every series name the delivery service and the operator expose."""
    return exported_names(DeliveryMetrics().registry) | exported_names(OperatorMetrics().registry)
