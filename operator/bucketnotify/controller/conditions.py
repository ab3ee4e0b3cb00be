"""Status conditions the Kubernetes way: keyed by type, transition time kept when unchanged."""

from __future__ import annotations

import datetime as dt
from typing import Any

__all__ = ["ready_condition", "set_condition"]


def set_condition(
    conditions: list[dict[str, Any]],
    *,
    type: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: dt.datetime,
) -> list[dict[str, Any]]:
    """Return ``conditions`` with the one of ``type`` replaced by the given state."""
    previous = next((c for c in conditions if c.get("type") == type), None)
    transition = now.isoformat().replace("+00:00", "Z")
    if previous is not None and previous.get("status") == status:
        transition = previous.get("lastTransitionTime", transition)
    updated = {
        "type": type,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": transition,
    }
    return [c for c in conditions if c.get("type") != type] + [updated]


def ready_condition(conditions: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == "Ready"), None)
