"""Status conditions the Kubernetes way: keyed by type, transition time kept when unchanged."""

from __future__ import annotations

import datetime as dt
from typing import Any

__all__ = ["find_condition", "ready_condition", "ready_status", "set_condition"]


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
    """Return ``conditions`` with the one of ``type`` replaced in place by the given state
    (appended when there is none). In place, as Kubernetes' ``SetStatusCondition``: the
    Ready condition and the Delivering one have writers of their own, and moving each to
    the end on every write made the other writer's unchanged list differ from the stored
    one, a status write per Topic for nothing."""
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
    if previous is None:
        return [*conditions, updated]
    return [updated if c is previous else c for c in conditions]


def find_condition(conditions: list[dict[str, Any]], type: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type), None)


def ready_condition(conditions: list[dict[str, Any]]) -> dict[str, Any] | None:
    return find_condition(conditions, "Ready")


def ready_status(
    current: dict[str, Any],
    *,
    generation: int | None,
    ready: bool,
    reason: str,
    message: str,
    **fields: Any,
) -> dict[str, Any]:
    """A status with the Ready condition set and ``fields`` (those not None) beside it."""
    conditions = set_condition(
        list(current.get("conditions") or []),
        type="Ready",
        status="True" if ready else "False",
        reason=reason,
        message=message,
        generation=generation,
        now=dt.datetime.now(dt.UTC),
    )
    status: dict[str, Any] = {"observedGeneration": generation, "conditions": conditions}
    status.update({k: v for k, v in fields.items() if v is not None})
    return status
