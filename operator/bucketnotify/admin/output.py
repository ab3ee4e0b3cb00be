"""Printing: aligned columns for people, JSON or YAML documents for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import yaml

__all__ = ["Format", "document", "table"]

Format = Literal["json", "yaml"]


def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns three spaces apart, as kubectl prints them."""
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    lines = [columns, *rows]
    return "".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in lines
    )


def document(value: Any, fmt: Format) -> str:
    if fmt == "json":
        return json.dumps(value, indent=2, ensure_ascii=False) + "\n"
    text: str = yaml.safe_dump(value, sort_keys=False, allow_unicode=True)
    return text
