"""The example queries of docs/metrics.md are PromQL that asks for series we export."""

from __future__ import annotations

import re
from pathlib import Path

import promql_parser

from tests.promql import metric_names, our_series

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def example_queries() -> list[str]:
    """Each query of the "Example queries" block: its lines up to the next comment."""
    section = METRICS_DOC.read_text().split("## Example queries", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None
    queries, current = [], []
    for line in block.group(1).splitlines():
        if line.startswith("#"):
            if current:
                queries.append("\n".join(current))
            current = []
        elif line.strip():
            current.append(line)
    queries.append("\n".join(current))
    return queries


def test_the_example_queries_parse_and_ask_only_series_we_export() -> None:
    queries = example_queries()
    assert len(queries) == 4
    for query in queries:
        promql_parser.parse(query)  # raises ValueError on a syntax error
        asked = metric_names(query)
        assert asked, query
        assert asked <= our_series(), query
