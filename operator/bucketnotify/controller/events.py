"""Which Kubernetes Events a change handler posts: a pure function of what it found.

- Ready: ``Created`` (first sync of a Topic's gateway topic) or ``Applied`` (first write of a
  BucketNotification's Id), ``Updated`` after a spec change, ``Synced`` on a resume; plus
  ``Recovered`` when the object was not Ready before.
- Not Ready: a Warning with the condition's reason and message (they say what to fix), but
  not again on kopf's retries of the same failure: a gateway down for an hour would
  otherwise post a Warning per object every retry. The condition and the metrics keep
  counting; a different failure, a spec change or an operator restart posts again.

The drift timer: ``DriftRepaired`` (Warning) when the gateway differed and was rewritten,
``Created``/``Applied`` when it wrote the gateway object for the first time (a change that
failed and was picked up by the timer before kopf's retry), ``Recovered`` after a failure,
and a failure only when the object was Ready before. Deletion's Events (``Deleted``,
``OrphanedOnGateway``) are posted by ``handlers._bounded_delete``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Event", "change_events", "drift_events"]


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def change_events(
    *,
    kind: Literal["topic", "notification"],
    cause: str,
    previous: dict[str, Any] | None,
    existed: bool,
    ready: bool,
    reason: str,
    message: str,
    retry: int,
) -> list[Event]:
    """The Events of one change handler run.

    ``cause``: kopf's (create, update, resume); ``previous``: the Ready condition before the
    run; ``existed``: the gateway object had been written before (``status.arn`` or
    ``status.applied``); ``retry``: kopf's retry count of this change (0 on its first run).
    """
    if ready:
        events = _recovered(previous)
        if not existed:
            action = "Created" if kind == "topic" else "Applied"
        else:
            action = "Updated" if cause == "update" else "Synced"
        events.append(Event("Normal", action, message))
        return events
    repeated = (
        retry > 0
        and previous is not None
        and (previous.get("status"), previous.get("reason"), previous.get("message"))
        == ("False", reason, message)
    )
    return [] if repeated else [Event("Warning", reason, message)]


def drift_events(
    *,
    kind: Literal["topic", "notification"],
    previous: dict[str, Any] | None,
    existed: bool,
    ready: bool,
    reason: str,
    message: str,
    repaired: list[str],
) -> list[Event]:
    """The Events of one drift check (see the module docstring)."""
    events = []
    if repaired:
        events.append(
            Event(
                "Warning",
                "DriftRepaired",
                "the gateway differed from the spec and was rewritten: " + ", ".join(repaired),
            )
        )
    if ready:
        events += _recovered(previous)
        if not existed:
            events.append(Event("Normal", "Created" if kind == "topic" else "Applied", message))
    elif previous is not None and previous.get("status") == "True":
        events.append(Event("Warning", reason, message))
    return events


def _recovered(previous: dict[str, Any] | None) -> list[Event]:
    if previous is None or previous.get("status") != "False":
        return []
    return [Event("Normal", "Recovered", f"Ready again after {previous.get('reason')}")]
